/*
 * loom's logits on GGUF files quantised by llama.cpp's quantiser against that engine's own
 * logits for the same files (expected_logits.txt; oracle, commit and procedure in README.md).
 *
 * The files themselves are the oracle's output and are not committed: the test reads them
 * from $LOOM_ORACLE_DIR (oracle-<type>.gguf, made from gen_model's F32 model) and skips when
 * they are absent. What it proves when they are there: loom decodes every block layout
 * exactly as llama.cpp's quantiser wrote it, and its quantised-activation dots agree.
 *
 * Tolerance: max |loom - oracle| <= 2e-3 * max |oracle logit| per type. The F32 file sets the
 * floor: both engines then compute the same function from the same weights, and differ only
 * by float summation order (matmul, softmax, norms) and their own expf/rope code, ~1e-5
 * relative here. The quantised files add the activation rounding of the integer dots,
 * which both engines do the same way (Q8_K per 256 / Q8_0 / Q8_1 per 32, d = amax / 127)
 * but with their own float rounding of the block scale (1/d vs. x/d) that can move a
 * quantised activation by one step where x/d lands within an ulp of .5: a few such steps
 * per row move a logit by ~1e-4 relative. 2e-3 covers that with margin, and is ~50x below
 * what a wrong scale, nibble or sub-block order costs (the ops suite's mutations: >3e-2).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/model.h"
#include "model/run-simple.h"
#include "tests/shim/loom_test.h"

loom_synth_params loom_quant_oracle_params(void);

#define MAX_V 320

typedef struct expected {
    char type[16];
    float logits[MAX_V];
} expected;

static int32_t g_tokens[64];
static int g_n_tokens;

/* Reads the committed expected values: "tokens: a b c ...", then "<type> v0 .. v319". */
static int read_expected(expected *out, int max) {
    char path[4096];
    const char *root = loom_test_source_root();
    if (!root) return -1;
    snprintf(path, sizeof path, "%s/tests/quant_oracle/expected_logits.txt", root);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        if (line[0] == '#' || line[0] == '\n') continue;
        if (strncmp(line, "tokens:", 7) == 0) {
            char *p = line + 7, *end;
            g_n_tokens = 0;
            for (long v = strtol(p, &end, 10); end != p && g_n_tokens < 64;
                 v = strtol(p, &end, 10)) {
                g_tokens[g_n_tokens++] = (int32_t)v;
                p = end;
            }
            continue;
        }
        if (n >= max) break;
        char *p = line, *end;
        int k = 0;
        while (*p && *p != ' ' && k < 15)
            out[n].type[k++] = *p++;
        out[n].type[k] = 0;
        int v = 0;
        for (; v < MAX_V; v++) {
            float x = strtof(p, &end);
            if (end == p) break;
            out[n].logits[v] = x;
            p = end;
        }
        if (v == MAX_V) n++;
    }
    free(line);
    fclose(f);
    return n;
}

LOOM_TEST(quant_oracle, logits_match_llama_cpp_quantised_files) {
    static expected exp[32];
    int n = read_expected(exp, 32);
    LOOM_CHECK_MSG(n > 0, "cannot read tests/quant_oracle/expected_logits.txt");
    LOOM_REQUIRE(n > 0);
    LOOM_REQUIRE(g_n_tokens > 0);
    const char *dir = getenv("LOOM_ORACLE_DIR");
    loom_backend_t cpu = loom_cpu_backend_new(2);
    LOOM_REQUIRE(cpu != NULL);
    int checked = 0, skipped = 0;
    for (int i = 0; i < n; i++) {
        loom_gguf *g = NULL;
        void *synth = NULL;
        if (strcmp(exp[i].type, "f32") == 0) {
            /* gen_model's F32 file, rebuilt in memory: this check needs no oracle files */
            loom_synth_params sp = loom_quant_oracle_params();
            loom_gguf_writer *w = NULL;
            size_t size = 0;
            LOOM_REQUIRE(loom_model_synth(&sp, &w) == LOOM_OK);
            LOOM_REQUIRE(loom_gguf_write_memory(w, &synth, &size) == LOOM_OK);
            loom_gguf_writer_free(w);
            LOOM_REQUIRE(loom_gguf_open_memory(synth, size, &g) == LOOM_OK);
        } else if (!dir) {
            skipped++;
            continue;
        }
        char path[4096];
        if (!g && snprintf(path, sizeof path, "%s/oracle-%s.gguf", dir, exp[i].type) >=
                      (int)sizeof path) {
            loom_test_fail(__FILE__, __LINE__, "LOOM_ORACLE_DIR is too long");
            break;
        }
        if (!g && loom_gguf_open(path, &g) != LOOM_OK) {
            loom_test_fail(__FILE__, __LINE__, "%s: %s", path, loom_last_error());
            continue;
        }
        loom_model *m = NULL;
        loom_kv_cache *kv = NULL;
        float logits[MAX_V];
        loom_status st = loom_model_load(g, NULL, &m);
        if (!st) st = loom_kv_cache_new(m, 64, LOOM_TYPE_F16, NULL, &kv); /* as the oracle's */
        if (!st && m->hp.n_vocab != MAX_V)
            st = loom_error(LOOM_ERR_SHAPE, "vocab %lld", (long long)m->hp.n_vocab);
        if (!st) st = loom_model_eval_simple(m, kv, cpu, g_tokens, g_n_tokens, 0, false, logits);
        if (LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s", exp[i].type, loom_last_error())) {
            double worst = 0, scale = 0;
            for (int v = 0; v < MAX_V; v++) {
                worst = fmax(worst, fabs((double)logits[v] - exp[i].logits[v]));
                scale = fmax(scale, fabs((double)exp[i].logits[v]));
            }
            fprintf(stderr, "%-8s max |loom - oracle| = %.3g (logit scale %.3g, %.2g relative)\n",
                    exp[i].type, worst, scale, worst / scale);
            LOOM_CHECK_MSG(worst <= 2e-3 * scale, "%s: max |diff| %g > 2e-3 x %g", exp[i].type,
                           worst, scale);
            checked++;
        }
        loom_kv_cache_free(kv);
        loom_model_free(m);
        loom_gguf_free(g);
        loom_free(synth);
    }
    loom_backend_free(cpu);
    LOOM_CHECK(checked + skipped == n);
    if (skipped)
        fprintf(stderr, "%d quantised files not checked: LOOM_ORACLE_DIR not set (README.md)\n",
                skipped);
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Blocks written by the oracle's own quantisers decode in loom to exactly the floats the
 * oracle decodes them to (block_vectors.txt): the GGUF layouts bit for bit, every type. */
LOOM_TEST(quant_oracle, blocks_decode_as_llama_cpp) {
    char path[4096];
    const char *root = loom_test_source_root();
    LOOM_REQUIRE(root != NULL);
    snprintf(path, sizeof path, "%s/tests/quant_oracle/block_vectors.txt", root);
    FILE *f = fopen(path, "r");
    LOOM_CHECK_MSG(f != NULL, "%s", path);
    LOOM_REQUIRE(f != NULL);
    char *line = NULL;
    size_t cap = 0;
    int types = 0;
    static unsigned char q[8192];
    static float want[1024], got[1024];
    while (getline(&line, &cap, f) > 0) {
        if (line[0] == '#') continue;
        char *p = line, *end;
        const int type = (int)strtol(p, &end, 10);
        const int n = (int)strtol(end, &p, 10);
        const loom_type_traits *tr = loom_type_traits_get(type);
        if (!LOOM_CHECK_MSG(tr && tr->to_float && n > 0 && n <= 1024, "type %d n %d", type, n))
            continue;
        while (*p == ' ')
            p++;
        size_t nb = 0;
        while (hexval(p[0]) >= 0 && hexval(p[1]) >= 0 && nb < sizeof q) {
            q[nb++] = (unsigned char)(hexval(p[0]) << 4 | hexval(p[1]));
            p += 2;
        }
        LOOM_CHECK_EQ_INT(nb, loom_row_size((loom_type)type, n));
        for (int j = 0; j < n; j++) {
            want[j] = strtof(p, &end);
            p = end;
        }
        tr->to_float(q, got, n);
        int bad = 0;
        for (int j = 0; j < n; j++)
            if (got[j] != want[j] && bad++ < 3)
                loom_test_fail(__FILE__, __LINE__, "%s element %d: loom %.9g, oracle %.9g",
                               tr->name, j, got[j], want[j]);
        types++;
    }
    free(line);
    fclose(f);
    LOOM_CHECK_EQ_INT(types, 13);
}
