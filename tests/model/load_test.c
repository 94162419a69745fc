/*
 * Weight loading: CPU weights used in place from the model's mapping of the file; the read
 * fallback (an injected mmap failure, or no_mmap) giving the same logits; device weights
 * streamed in bounded chunks, each device receiving only its own tensors, with the host
 * memory the load allocates (counted through the allocator hook) bounded by one chunk.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/model.h"
#include "loom/session.h"
#include "loom/sim.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/stories.h"

#define LOOM_REQUIRE_MSG(cond, ...)                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            loom_test_fail(__FILE__, __LINE__, __VA_ARGS__);                                       \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* ---------------------------------------------------------------- a counting allocator */

/* Installed for the whole process (before main), so every block it frees is one it made;
 * sim devices allocate from their own threads, hence the atomics. */
static size_t LIVE, PEAK;

#define HDR 16 /* keeps the size in front of each block, 16-byte aligned */

static void grow(size_t n) {
    size_t now = __atomic_add_fetch(&LIVE, n, __ATOMIC_SEQ_CST);
    size_t peak = __atomic_load_n(&PEAK, __ATOMIC_SEQ_CST);
    while (now > peak && !__atomic_compare_exchange_n(&PEAK, &peak, now, false, __ATOMIC_SEQ_CST,
                                                      __ATOMIC_SEQ_CST)) {
    }
}

static void *c_malloc(size_t n, void *ud) {
    (void)ud;
    char *p = malloc(n + HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    grow(n);
    return p + HDR;
}

static void c_free(void *q, void *ud) {
    (void)ud;
    if (!q) return;
    char *p = (char *)q - HDR;
    size_t n;
    memcpy(&n, p, sizeof n);
    __atomic_sub_fetch(&LIVE, n, __ATOMIC_SEQ_CST);
    free(p);
}

static void *c_realloc(void *q, size_t n, void *ud) {
    if (!q) return c_malloc(n, ud);
    char *p = (char *)q - HDR;
    size_t old;
    memcpy(&old, p, sizeof old);
    char *r = realloc(p, n + HDR);
    if (!r) return NULL;
    memcpy(r, &n, sizeof n);
    __atomic_sub_fetch(&LIVE, old, __ATOMIC_SEQ_CST);
    grow(n);
    return r + HDR;
}

static const loom_allocator COUNTING = {c_malloc, c_realloc, c_free, NULL};

__attribute__((constructor)) static void install_counting(void) {
    loom_allocator_set(&COUNTING);
}

/* ---------------------------------------------------------------- CPU: in place */

static bool inside(const void *p, size_t n, const void *base, size_t size) {
    return (const char *)p >= (const char *)base &&
           (const char *)p + n <= (const char *)base + size;
}

LOOM_TEST(load, cpu_weights_alias_the_mapping) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open(path, &g) == LOOM_OK);
    LOOM_CHECK(loom_gguf_is_mapped(g));
    loom_model *m = NULL;
    LOOM_REQUIRE_MSG(loom_model_load(g, NULL, &m) == LOOM_OK, "%s", loom_last_error());
    LOOM_REQUIRE(m->map != NULL);
    /* every weight of the file lies inside the model's mapping, holding the file's bytes */
    size_t n_checked = 0;
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
        const char *name = loom_gguf_tensor_name(g, i);
        const loom_tensor *t = loom_ctx_get_tensor(m->ctx, name);
        LOOM_REQUIRE_MSG(t != NULL, "%s", name);
        size_t n = loom_gguf_tensor_size(g, i);
        LOOM_CHECK_MSG(inside(t->data, n, m->map, m->map_size), "'%s' is not in the mapping", name);
        LOOM_CHECK_MSG((const char *)t->data - (const char *)m->map ==
                           (ptrdiff_t)(loom_gguf_data_offset(g) + loom_gguf_tensor_offset(g, i)),
                       "'%s' is at the wrong offset", name);
        LOOM_CHECK(memcmp(t->data, loom_gguf_tensor_data(g, i), n) == 0);
        n_checked++;
    }
    LOOM_CHECK(n_checked > 10);
    LOOM_CHECK_EQ_INT((long long)m->n_mapped_bytes, (long long)m->n_bytes);
    /* the model owns its mapping: the gguf can go first */
    float head[16];
    memcpy(head, loom_gguf_tensor_data(g, loom_gguf_find_tensor(g, "token_embd.weight")),
           sizeof head);
    loom_gguf_free(g);
    LOOM_CHECK(memcmp(m->tok_embd->data, head, sizeof head) == 0);
    loom_model_free(m);
}

/* ---------------------------------------------------------------- fallback: same logits */

static float *eval_logits(const char *path, const loom_session_params *p, int64_t *V) {
    loom_session *s = NULL;
    loom_status st = loom_session_new(path, NULL, p, &s);
    if (st) {
        loom_test_fail(__FILE__, __LINE__, "%s: %s", p->devices, loom_last_error());
        return NULL;
    }
    *V = loom_session_model(s)->hp.n_vocab;
    const int32_t ids[6] = {1, 15, 290, 300, 270, 99};
    float *out = malloc(sizeof(float) * (size_t)*V);
    st = loom_session_eval(s, ids, 6, false, out);
    if (st) loom_test_fail(__FILE__, __LINE__, "%s: %s", p->devices, loom_last_error());
    loom_session_free(s);
    return out;
}

static loom_session_params params(const char *devices) {
    loom_session_params p = loom_session_params_default();
    p.devices = devices;
    p.n_ctx = 64;
    p.threads = 2;
    return p;
}

LOOM_TEST(load, mmap_failure_falls_back_to_read_with_identical_logits) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_session_params p = params("cpu");
    int64_t V = 0, V2 = 0;
    float *ref = eval_logits(path, &p, &V);
    LOOM_REQUIRE(ref != NULL);

    /* the file cannot be mapped at all: open reads it, the model copies its weights */
    loom_gguf_test_fail_mmap(1);
    loom_gguf *g = NULL;
    LOOM_REQUIRE_MSG(loom_gguf_open(path, &g) == LOOM_OK, "%s", loom_last_error());
    LOOM_CHECK(!loom_gguf_is_mapped(g));
    loom_gguf_test_fail_mmap(1);
    loom_model *m = NULL;
    LOOM_REQUIRE_MSG(loom_model_load(g, NULL, &m) == LOOM_OK, "%s", loom_last_error());
    loom_gguf_test_fail_mmap(0);
    LOOM_CHECK(m->map == NULL);
    LOOM_CHECK_EQ_INT((long long)m->n_mapped_bytes, 0);
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
        const loom_tensor *t = loom_ctx_get_tensor(m->ctx, loom_gguf_tensor_name(g, i));
        LOOM_REQUIRE(t != NULL);
        LOOM_CHECK(memcmp(t->data, loom_gguf_tensor_data(g, i), loom_gguf_tensor_size(g, i)) == 0);
    }
    loom_model_free(m);
    loom_gguf_free(g);

    /* a whole session on an unmappable file, and one that reads by choice (no_mmap) */
    for (int k = 0; k < 2; k++) {
        loom_session_params q = params("cpu");
        if (k == 0)
            loom_gguf_test_fail_mmap(2); /* the open, then the model's mapping */
        else
            q.no_mmap = true;
        float *got = eval_logits(path, &q, &V2);
        loom_gguf_test_fail_mmap(0);
        LOOM_REQUIRE(got != NULL);
        LOOM_CHECK_EQ_INT((long long)V2, (long long)V);
        LOOM_CHECK_MSG(memcmp(got, ref, sizeof(float) * (size_t)V) == 0,
                       "%s: logits differ from the mapped load", k ? "no_mmap" : "mmap failure");
        free(got);
    }
    free(ref);
}

/* ---------------------------------------------------------------- devices: streamed */

typedef struct two_devs {
    loom_buft_t buft[2];
} two_devs;

/* globals and even layers on the first device, odd layers on the second */
static loom_buft_t by_layer(const char *name, int layer, void *ud) {
    (void)name;
    two_devs *d = ud;
    return d->buft[layer < 0 ? 0 : layer % 2];
}

typedef struct dev_bytes {
    size_t bytes[2];
} dev_bytes;

static void count_weight(loom_tensor *t, int layer, void *ud) {
    dev_bytes *b = ud;
    b->bytes[layer < 0 ? 0 : layer % 2] += loom_nbytes(t);
}

LOOM_TEST(load, sim2_streams_in_bounded_chunks) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open(path, &g) == LOOM_OK);
    size_t largest = 0;
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++)
        if (loom_gguf_tensor_size(g, i) > largest) largest = loom_gguf_tensor_size(g, i);
    const size_t chunk = 4096;
    LOOM_REQUIRE(largest > 8 * chunk); /* token_embd: the bound below means something */

    /* 0: read through the staging buffer (no_mmap); 1: copied from the mapping */
    for (int mode = 0; mode < 2; mode++) {
        loom_reg_t reg = NULL;
        LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2", &reg) == LOOM_OK);
        two_devs d;
        loom_dev_t dev[2];
        for (int j = 0; j < 2; j++) {
            dev[j] = loom_reg_dev_get(reg, (size_t)j);
            d.buft[j] = loom_dev_buffer_type(dev[j]);
            loom_sim_dev_reset_stats(dev[j]);
        }
        loom_model_params mp = {.placement = by_layer,
                                .placement_user_data = &d,
                                .no_mmap = mode == 0,
                                .load_chunk = chunk};
        loom_model *m = NULL;
        __atomic_store_n(&PEAK, __atomic_load_n(&LIVE, __ATOMIC_SEQ_CST), __ATOMIC_SEQ_CST);
        loom_status st = loom_model_load(g, &mp, &m);
        size_t after = __atomic_load_n(&LIVE, __ATOMIC_SEQ_CST);
        size_t peak = __atomic_load_n(&PEAK, __ATOMIC_SEQ_CST);
        LOOM_REQUIRE_MSG(st == LOOM_OK, "%s", loom_last_error());
        /* what the load held beyond what the model keeps: the staging buffer and the
         * loader's small table of tensors (a few KiB), never a whole tensor or file */
        size_t transient = peak - after;
        fprintf(stderr,
                "%s: peak host allocation beyond the model %zu bytes (chunk %zu, "
                "largest tensor %zu), staging %zu\n",
                mode ? "mmap" : "no_mmap", transient, chunk, largest, m->staging_bytes);
        LOOM_CHECK_MSG(transient <= chunk + 8192, "%zu bytes transient", transient);
        LOOM_CHECK(m->staging_bytes <= (mode ? 0 : chunk));
        LOOM_CHECK(mode == 1 || m->staging_bytes > 0);
        LOOM_CHECK(m->map == NULL); /* nothing aliases it: released after the copy */
        /* each device received exactly its own tensors, in many pieces */
        dev_bytes want = {{0, 0}};
        loom_model_foreach_weight(m, count_weight, &want);
        uint64_t copies = 0;
        for (int j = 0; j < 2; j++) {
            loom_sim_stats ss;
            loom_sim_dev_stats(dev[j], &ss);
            LOOM_CHECK_MSG(ss.bytes_in == want.bytes[j], "device %d: %llu bytes in, %zu placed", j,
                           (unsigned long long)ss.bytes_in, want.bytes[j]);
            copies += ss.copies;
        }
        LOOM_CHECK(copies >= (uint64_t)(largest / chunk));
        /* and the bytes are the file's */
        for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
            const loom_tensor *t = loom_ctx_get_tensor(m->ctx, loom_gguf_tensor_name(g, i));
            size_t n = loom_gguf_tensor_size(g, i);
            void *buf = malloc(n);
            loom_tensor_get(t, buf, 0, n);
            LOOM_CHECK_MSG(memcmp(buf, loom_gguf_tensor_data(g, i), n) == 0, "%s", t->name);
            free(buf);
        }
        loom_model_free(m);
        loom_sim_reg_free(reg);
    }
    loom_gguf_free(g);
}

/* A tensor-parallel session streamed through small chunks computes what the CPU does. */
LOOM_TEST(load, sim2_tensor_split_chunked_load_matches_cpu) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_session_params p = params("sim:2");
    int64_t V = 0, V2 = 0;
    float *ref = eval_logits(path, &p, &V);
    p.no_mmap = true;
    p.load_chunk = 1000; /* not a multiple of any row: whole rows are copied */
    float *got = eval_logits(path, &p, &V2);
    LOOM_REQUIRE(ref && got);
    LOOM_CHECK(memcmp(got, ref, sizeof(float) * (size_t)V) == 0);
    loom_session_params c = params("cpu");
    float *cpu = eval_logits(path, &c, &V2);
    LOOM_REQUIRE(cpu != NULL);
    double worst = 0;
    for (int64_t i = 0; i < V; i++) {
        double dlt = got[i] - cpu[i];
        if (dlt < 0) dlt = -dlt;
        if (dlt > worst) worst = dlt;
    }
    LOOM_CHECK_MSG(worst < 1e-3, "sim:2 vs cpu: max |d logit| %g", worst);
    free(ref);
    free(got);
    free(cpu);
}
