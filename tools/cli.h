/*
 * The `loom` command-line tool's subcommands. Each takes the arguments after its name
 * (argv[0] is the subcommand), prints its report on stdout, one clear line on stderr on
 * failure, and returns the process exit status: 0 success, 1 failure, 2 bad usage.
 */
#ifndef LOOM_TOOLS_CLI_H
#define LOOM_TOOLS_CLI_H

#include <stddef.h>

#include "loom/loom.h"

/* `loom demo`: a llama-style block on the CPU and split by hand across devices. */
int loom_cli_demo(int argc, char **argv);
/* `loom devices`: registries, devices, memory and caps. */
int loom_cli_devices(int argc, char **argv);

/* `loom run`, `loom bench`, `loom explain`, `loom gguf`: the model subcommands
 * (cmd_run.c, cmd_bench.c, cmd_explain.c, cmd_gguf.c; shared options in model_cli.h). */
int loom_cli_run(int argc, char **argv);
int loom_cli_bench(int argc, char **argv);
int loom_cli_explain(int argc, char **argv);
int loom_cli_gguf(int argc, char **argv);
/* `loom tokenize`: a text's tokens under a GGUF vocabulary (cmd_tokenize.c). */
int loom_cli_tokenize(int argc, char **argv);
/* `loom plan`: bytes per device and projected speed per candidate (cmd_plan.c). */
int loom_cli_plan(int argc, char **argv);

/* Shared helpers. */
/* Parses a positive int option value; prints the error and returns false if it is not. */
bool loom_cli_parse_int(const char *cmd, const char *opt, const char *val, int min, int max,
                        int *out);
/* Resolves a device spec ("sim:2", "cpu", ...), loading the backend modules first
 * unless it is a sim spec. */
loom_status loom_cli_devices_from_spec(const char *spec, loom_dev_t *devs, size_t cap, size_t *n);
/* "1.5 MiB" */
void loom_cli_format_bytes(char *buf, size_t size, double bytes);
const char *loom_cli_dev_type_name(loom_dev_type t);

/* A path as the user meant it: under `bazel run`, a relative path is resolved against
 * BUILD_WORKING_DIRECTORY (the directory the user ran bazel from), not the runfiles tree.
 * Returns p itself when there is nothing to resolve, else buf; NULL if it does not fit. */
const char *loom_cli_path(const char *p, char *buf, size_t size);
/* Prints "loom CMD: unknown option 'ARG' (did you mean --X? see loom CMD --help)" with the
 * nearest of the names (NULL-terminated lists; `more` may be NULL). */
void loom_cli_unknown_option(const char *cmd, const char *arg, const char *const *names,
                             const char *const *more);
/* For an option the parser did not take: "loom CMD: ARG needs a value" when ARG is one of
 * the names (so it was the last argument), else as loom_cli_unknown_option. */
void loom_cli_bad_option(const char *cmd, const char *arg, const char *const *names,
                         const char *const *more);
/* Parses a float that must be finite and in [min, max]; prints the error if not. */
bool loom_cli_parse_float(const char *cmd, const char *opt, const char *val, double min, double max,
                          float *out);
/* llama.cpp's escapes in a prompt, in place: \n \r \t \' \" \\ and \xHH (two hex digits); any
 * other backslash stays as it is. Returns the new length (no NUL is written). */
size_t loom_cli_process_escapes(char *s, size_t n);

#endif /* LOOM_TOOLS_CLI_H */
