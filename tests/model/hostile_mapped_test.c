/*
 * A model file truncated or rewritten while its weights are mapped (issue #29 item 8). CPU
 * weights are read in place from a private mapping of the file; truncating the file under
 * the mapping made the next token's read of a page past the new end raise SIGBUS (the process
 * died with no message), and writing the file in place silently changed the weights. The
 * behaviour chosen: the model keeps a descriptor of the file and its size and modification
 * time at load, and loom_model_check_file (which the session runs before every batch) refuses
 * a truncated or modified file with an error naming the sizes or times. The session stays
 * usable for being freed; a file truncated during a computation is not covered (documented).
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loom/session.h"
#include "tests/shim/loom_test.h"

static void tmp_name(char *path, size_t cap, const char *name) {
    const char *dir = getenv("TEST_TMPDIR");
    snprintf(path, cap, "%s/%s", dir ? dir : "/tmp", name);
}

/* Writes a small synthetic model to the temporary directory; its path (a static buffer). */
static const char *model_path(const char *name) {
    static char path[512];
    tmp_name(path, sizeof path, name);
    loom_synth_params p = loom_synth_params_default();
    p.n_vocab = 300;
    p.n_embd = 64;
    p.n_layer = 2;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ff = 128;
    p.n_ctx = 64;
    loom_gguf_writer *w = NULL;
    if (loom_model_synth(&p, &w)) return NULL;
    loom_status st = loom_gguf_write_file(w, path);
    loom_gguf_writer_free(w);
    return st ? NULL : path;
}

static loom_session *open_session(const char *path) {
    loom_session_params p = loom_session_params_default();
    p.n_ctx = 32;
    p.threads = 1;
    loom_session *s = NULL;
    if (loom_session_new(path, NULL, &p, &s)) return NULL;
    return s;
}

/* Truncated after load: the next token is refused with the sizes (was: SIGBUS). */
LOOM_TEST(hostile_mapped, truncated_after_load_refused_not_sigbus) {
    const char *path = model_path("trunc.gguf");
    LOOM_REQUIRE(path != NULL);
    struct stat sb;
    LOOM_REQUIRE(stat(path, &sb) == 0);
    loom_session *s = open_session(path);
    LOOM_REQUIRE(s != NULL);
    LOOM_REQUIRE(loom_session_model(s)->map != NULL); /* the weights are read in place */
    float logits[300];
    const int32_t tok = 5;
    LOOM_REQUIRE(loom_session_eval(s, &tok, 1, false, logits) == LOOM_OK);
    const off_t cut = sb.st_size / 3;
    LOOM_REQUIRE(truncate(path, cut) == 0);
    const loom_status st = loom_session_eval(s, &tok, 1, false, logits);
    LOOM_CHECK_EQ_INT(st, LOOM_ERR_IO);
    char want[128];
    snprintf(want, sizeof want,
             "the model file was truncated from %lld to %lld bytes after it was loaded",
             (long long)sb.st_size, (long long)cut);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), want);
    /* still refused (not a crash) on the next try, and freed cleanly */
    LOOM_CHECK_EQ_INT(loom_session_eval(s, &tok, 1, false, logits), LOOM_ERR_IO);
    loom_session_free(s);
    /* to zero bytes, too */
    path = model_path("trunc0.gguf");
    LOOM_REQUIRE(path != NULL);
    s = open_session(path);
    LOOM_REQUIRE(s != NULL);
    LOOM_REQUIRE(truncate(path, 0) == 0);
    LOOM_CHECK_EQ_INT(loom_session_eval(s, &tok, 1, false, logits), LOOM_ERR_IO);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "bytes after it was loaded");
    loom_session_free(s);
    unlink(path);
}

/* Rewritten in place (same size): refused as modified, naming both times. */
LOOM_TEST(hostile_mapped, rewritten_in_place_refused) {
    const char *path = model_path("rewrite.gguf");
    LOOM_REQUIRE(path != NULL);
    loom_session *s = open_session(path);
    LOOM_REQUIRE(s != NULL);
    float logits[300];
    const int32_t tok = 7;
    LOOM_REQUIRE(loom_session_eval(s, &tok, 1, false, logits) == LOOM_OK);
    /* the kernel's file times tick coarsely: step past one tick before writing */
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    struct stat sb;
    LOOM_REQUIRE(stat(path, &sb) == 0);
    const int fd = open(path, O_WRONLY);
    LOOM_REQUIRE(fd >= 0);
    const char junk[64] = {1, 2, 3};
    LOOM_CHECK(pwrite(fd, junk, sizeof junk, sb.st_size - (off_t)sizeof junk) ==
               (ssize_t)sizeof junk);
    close(fd);
    LOOM_CHECK_EQ_INT(loom_session_eval(s, &tok, 1, false, logits), LOOM_ERR_IO);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "the model file was modified after it was loaded");
    loom_session_free(s);
    /* replaced by rename (a new file): the mapping keeps the old one, and runs */
    s = open_session(path);
    LOOM_REQUIRE(s != NULL);
    const char *other = model_path("rewrite-new.gguf");
    LOOM_REQUIRE(other != NULL);
    char target[512];
    tmp_name(target, sizeof target, "rewrite.gguf");
    LOOM_REQUIRE(rename(other, target) == 0);
    const loom_status st = loom_session_eval(s, &tok, 1, false, logits);
    LOOM_CHECK_MSG(st == LOOM_OK, "status %d: %s", (int)st, loom_last_error());
    loom_session_free(s);
    unlink(target);
}
