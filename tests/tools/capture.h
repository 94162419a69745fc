/*
 * Runs a `loom` subcommand in-process with its stdout and stderr captured: the tests of the
 * CLI (tests/tools, tests/topo, tests/model) drive the tool this way.
 */
#ifndef LOOM_TESTS_TOOLS_CAPTURE_H
#define LOOM_TESTS_TOOLS_CAPTURE_H

typedef int (*loom_test_cmd_fn)(int argc, char **argv);

/* Runs fn(argc, argv) for a NULL-terminated argv; *out and *err get what it printed on
 * stdout and stderr (malloc'd, NUL-terminated, free them; err may be NULL to discard it).
 * Returns fn's exit code. */
int loom_test_capture(loom_test_cmd_fn fn, char **argv, char **out, char **err);

#endif
