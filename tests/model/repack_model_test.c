/*
 * Repacked weights in a whole model (backends/cpu/repack.h): a 2-layer synthetic llama of
 * IQ4_NL, Q4_K and Q4_0 weights with a tied embedding (token_embd in the weight type, read
 * by GET_ROWS for the prompt and by the output matmul), vocab 515 (3 tail rows), loaded from
 * a file (mapped) on the CPU device: the logits with LOOM_CPU_REPACK=0 (the file's layout)
 * and with repacking (AVX-512 table only) agree up to float summation order (oracle: the
 * unrepacked run, itself covered by the CPU kernels' tests), the copies exist while the
 * session does and are freed with it.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkstemp */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/repack.h"
#include "loom/gguf.h"
#include "loom/model.h"
#include "loom/session.h"
#include "tests/shim/loom_test.h"

static float *logits(const char *path, bool repack, int64_t *V, size_t *copies) {
    if (repack)
        unsetenv("LOOM_CPU_REPACK");
    else
        setenv("LOOM_CPU_REPACK", "0", 1);
    loom_session_params p = loom_session_params_default();
    p.devices = "cpu";
    p.n_ctx = 64;
    p.threads = 2;
    loom_session *s = NULL;
    if (loom_session_new(path, NULL, &p, &s) != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "session: %s", loom_last_error());
        return NULL;
    }
    *V = loom_session_model(s)->hp.n_vocab;
    const int32_t ids[5] = {1, 15, 290, 300, 514};
    float *out = malloc(sizeof(float) * (size_t)*V);
    if (loom_session_eval(s, ids, 5, false, out) != LOOM_OK)
        loom_test_fail(__FILE__, __LINE__, "eval: %s", loom_last_error());
    *copies = loom__cpu_repack_count(NULL);
    loom_session_free(s);
    unsetenv("LOOM_CPU_REPACK");
    return out;
}

static void check_type(loom_type t) {
    loom_synth_params sp = loom_synth_params_default();
    sp.n_vocab = 515;
    sp.n_embd = 256;
    sp.n_ff = 512;
    sp.n_layer = 2;
    sp.n_head = 4;
    sp.n_head_kv = 2;
    sp.n_ctx = 64;
    sp.wtype = t;
    sp.embd_type = t;
    sp.tied = true;
    loom_gguf_writer *w = NULL;
    LOOM_REQUIRE(loom_model_synth(&sp, &w) == LOOM_OK);
    const char *dir = getenv("TEST_TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/repack-XXXXXX", dir ? dir : "/tmp");
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    close(fd);
    LOOM_REQUIRE(loom_gguf_write_file(w, path) == LOOM_OK);
    loom_gguf_writer_free(w);

    int64_t V0 = 0, V1 = 0;
    size_t c0 = 0, c1 = 0;
    float *ref = logits(path, false, &V0, &c0);
    float *got = logits(path, true, &V1, &c1);
    LOOM_REQUIRE(ref && got);
    LOOM_CHECK_EQ_INT(V0, V1);
    LOOM_CHECK_EQ_INT(c0, 0);
    /* 7 matrices per layer and the tied output, on the AVX-512 table */
    if (loom__cpu_has_avx512()) LOOM_CHECK_EQ_INT(c1, 2 * 7 + 1);
    LOOM_CHECK_EQ_INT(loom__cpu_repack_count(NULL), 0);
    double amax = 0, dmax = 0;
    for (int64_t i = 0; i < V0; i++) {
        amax = fmax(amax, fabs(ref[i]));
        dmax = fmax(dmax, fabs((double)got[i] - ref[i]));
    }
    LOOM_CHECK(amax > 0);
    LOOM_CHECK_MSG(dmax <= 1e-4 * amax, "%s: logits differ by %.3g (largest |logit| %.3g)",
                   loom_type_name(t), dmax, amax);
    free(ref);
    free(got);
    unlink(path);
}

LOOM_TEST(repack_model, iq4_nl_tied_logits_match) {
    check_type(LOOM_TYPE_IQ4_NL);
}

LOOM_TEST(repack_model, q4_K_tied_logits_match) {
    check_type(LOOM_TYPE_Q4_K);
}

LOOM_TEST(repack_model, q4_0_tied_logits_match) {
    check_type(LOOM_TYPE_Q4_0);
}
