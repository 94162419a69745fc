#include "tests/tools/stories.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "loom/gguf.h"
#include "tests/shim/loom_test.h"

const char *loom_test_stories(void) {
    static char path[4096];
    if (!loom_test_models_dir()) return NULL;
    snprintf(path, sizeof path, "%s/stories260K.gguf", loom_test_models_dir());
    return path;
}

const char *loom_test_stories_header_only(const char *name) {
    static char out[4096];
    loom_gguf *g = NULL;
    if (loom_gguf_open(loom_test_stories(), &g)) return NULL;
    size_t n = loom_gguf_data_offset(g);
    const char *dir = getenv("TEST_TMPDIR");
    snprintf(out, sizeof out, "%s/%s", dir ? dir : "/tmp", name);
    FILE *in = fopen(loom_test_stories(), "rb"), *f = fopen(out, "wb");
    char *buf = malloc(n);
    bool ok = in && f && buf && fread(buf, 1, n, in) == n && fwrite(buf, 1, n, f) == n;
    if (in) fclose(in);
    if (f) fclose(f);
    free(buf);
    loom_gguf_free(g);
    return ok ? out : NULL;
}
