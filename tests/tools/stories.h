/*
 * The shared stories260K model the CLI tests (tests/tools, tests/topo) run, and a copy of it
 * cut right after its header for the `loom plan` tests.
 */
#ifndef LOOM_TESTS_TOOLS_STORIES_H
#define LOOM_TESTS_TOOLS_STORIES_H

/* <models dir>/stories260K.gguf, or NULL when the shared models are not found. */
const char *loom_test_stories(void);

/* A copy of stories260K cut right after its header (every tensor's data is absent), written
 * as `name` under $TEST_TMPDIR (else /tmp); its path (a static buffer), or NULL on failure. */
const char *loom_test_stories_header_only(const char *name);

#endif
