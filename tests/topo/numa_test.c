/*
 * numa_test.c: NUMA devices under a two-node synthetic topology (LOOM_TOPOLOGY, set before
 * anything loads the topology): the "numa" and "numa:I,..." specs, one CPU-kind device and
 * a distinct host buffer type per node, and stories260K over them with --split-mode tensor
 * and layer: the same greedy tokens as the CPU alone ("Lily"), and logits that match the
 * CPU's (the CPU backend is the oracle).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/session.h"
#include "loom/tokenizer.h"
#include "loom/topo.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/stories.h"

#define TWO_NODES "synthetic:pack:2 [numa(memory=1GB)] core:2 pu:1"

__attribute__((constructor)) static void two_nodes(void) {
    setenv("LOOM_TOPOLOGY", TWO_NODES, 1);
}

LOOM_TEST(numa, specs_make_one_device_per_node) {
    loom_dev_t devs[8];
    size_t n = 0;
    LOOM_REQUIRE(loom_devices_from_spec("numa", devs, 8, &n) == LOOM_OK);
    LOOM_REQUIRE(n == 2);
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(name, sizeof name, "NUMA%d", i);
        LOOM_CHECK(strcmp(loom_dev_name(devs[i]), name) == 0);
        LOOM_CHECK(loom_dev_get_type(devs[i]) == LOOM_DEV_TYPE_CPU);
        loom_buft_t bt = loom_dev_buffer_type(devs[i]);
        LOOM_REQUIRE(bt);
        LOOM_CHECK(strcmp(loom_buft_name(bt), name) == 0);
        LOOM_CHECK(loom_buft_is_host(bt));
        LOOM_CHECK(bt != loom_cpu_buffer_type());
        size_t fr = 0, tot = 0;
        loom_dev_memory(devs[i], &fr, &tot);
        LOOM_CHECK_EQ_INT(tot, 1000000000ULL); /* the synthetic node's 1GB */
        /* a buffer on the node works like host memory */
        loom_buffer_t b = loom_buft_alloc_buffer(bt, 1000);
        LOOM_REQUIRE(b);
        LOOM_CHECK(loom_buffer_is_host(b));
        char *base = loom_buffer_base(b);
        LOOM_CHECK_EQ_INT((uintptr_t)base % loom_buft_alignment(bt), 0);
        memset(base, i + 1, 1000);
        LOOM_CHECK_EQ_INT(base[999], i + 1);
        loom_buffer_free(b);
    }
    LOOM_CHECK(loom_dev_supports_buft(devs[0], loom_dev_buffer_type(devs[0])));
    LOOM_CHECK(!loom_dev_supports_buft(devs[0], loom_dev_buffer_type(devs[1])));
    LOOM_CHECK(loom_dev_supports_buft(devs[1], loom_cpu_buffer_type()));
    /* an explicit list keeps its order */
    LOOM_REQUIRE(loom_devices_from_spec("numa:1,0", devs, 8, &n) == LOOM_OK);
    LOOM_REQUIRE(n == 2);
    LOOM_CHECK(strcmp(loom_dev_name(devs[0]), "NUMA1") == 0);
    LOOM_CHECK(strcmp(loom_dev_name(devs[1]), "NUMA0") == 0);
    LOOM_CHECK(loom_devices_from_spec("numa:2", devs, 8, &n) == LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "NUMA device 2 does not exist (2 devices)");
    LOOM_CHECK(loom_devices_from_spec("numa:x", devs, 8, &n) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'x' is not a device index");
    /* bad backend params are refused by name */
    LOOM_CHECK(loom_dev_init(devs[0], "threads=-3") == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "threads must be an integer");
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy tokens after "Once upon a time" and the logits of the prompt's last position. */
static int greedy(const char *path, const char *devices, loom_split_mode mode, int32_t *out,
                  float *logits0, char *text, size_t text_size, int *gen_splits) {
    loom_session_params p = loom_session_params_default();
    p.devices = devices;
    p.split_mode = mode;
    p.threads = 1;
    loom_session *s = NULL;
    if (loom_session_new(path, NULL, &p, &s) != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "%s: %s", devices, loom_last_error());
        return -1;
    }
    const loom_tokenizer *tok = loom_session_tokenizer(s);
    int32_t ids[64];
    size_t n;
    int n_out = 0;
    float logits[512];
    loom_status st = loom_tokenize(tok, "Once upon a time", 16, true, ids, 64, &n);
    if (st == LOOM_OK) st = loom_session_eval(s, ids, (int64_t)n, false, logits);
    if (st == LOOM_OK) memcpy(logits0, logits, sizeof logits);
    for (int step = 0; st == LOOM_OK && step < 30; step++) {
        int32_t next = argmax(logits, 512);
        out[n_out++] = next;
        if (next == loom_tokenizer_eos(tok)) break;
        st = loom_session_eval(s, &next, 1, false, logits);
    }
    if (st != LOOM_OK) loom_test_fail(__FILE__, __LINE__, "%s: %s", devices, loom_last_error());
    size_t tl = 0;
    for (int i = 0; i < n_out; i++)
        tl += loom_token_to_piece(tok, out[i], text + tl, text_size - tl - 1);
    text[tl] = 0;
    loom_session_stats ss;
    loom_session_get_stats(s, &ss);
    *gen_splits = ss.gen_splits;
    loom_session_free(s);
    return st == LOOM_OK ? n_out : -1;
}

LOOM_TEST(numa, stories_tensor_and_layer_split_match_the_cpu) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    int32_t ref[32], got[32];
    float ref_logits[512], got_logits[512];
    char ref_text[1024], text[1024];
    int splits = 0;
    int n_ref = greedy(path, "cpu", LOOM_SPLIT_MODE_NONE, ref, ref_logits, ref_text,
                       sizeof ref_text, &splits);
    LOOM_REQUIRE(n_ref > 0);
    LOOM_CHECK_STR_CONTAINS(ref_text, "Lily");
    const loom_split_mode modes[] = {LOOM_SPLIT_MODE_TENSOR, LOOM_SPLIT_MODE_LAYER};
    for (int m = 0; m < 2; m++) {
        int n = greedy(path, "numa", modes[m], got, got_logits, text, sizeof text, &splits);
        LOOM_REQUIRE(n > 0);
        /* layer split really uses both nodes: the token graph crosses from NUMA0 to NUMA1
         * (tensor split: the meta device, then the CPU for the rest) */
        LOOM_CHECK_MSG(splits >= 2, "numa %s: %d splits", loom_split_mode_name(modes[m]), splits);
        LOOM_CHECK_MSG(n == n_ref && memcmp(got, ref, sizeof(int32_t) * (size_t)n) == 0,
                       "numa %s: '%s' vs '%s'", loom_split_mode_name(modes[m]), text, ref_text);
        double worst = 0;
        for (int i = 0; i < 512; i++)
            worst = fmax(worst, fabs((double)got_logits[i] - ref_logits[i]));
        LOOM_CHECK_MSG(worst <= 1e-4, "numa %s: logits differ by %g",
                       loom_split_mode_name(modes[m]), worst);
    }
}
