/*
 * Out-of-memory injection over a whole op pipeline (SQLite style): with an allocator that
 * fails on the Nth host allocation, for N = 1, 2, 3, ... until the pipeline succeeds,
 * every step (context, graph, backend, buffer, compute) either succeeds or returns a
 * clear error, nothing crashes, and no allocation is left behind. Two policies: only the
 * Nth call fails (a transient failure), and every call from the Nth on fails (cleanup
 * must not need memory). The graph is a small transformer-like chain (rms_norm, mul_mat
 * with Q8_0 and F16 weights, rope, soft_max, glu, add), checked against the reference
 * once it succeeds.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/cpu.h"
#include "tests/ops/ref.h"
#include "tests/shim/loom_test.h"

/* ---------------------------------------------------------------- the failing allocator */

typedef struct fault_state {
    atomic_long calls;  /* allocation calls seen (malloc and realloc) */
    atomic_long live;   /* successful allocations not yet freed */
    long fail_at;       /* 0: never fail */
    bool persistent;    /* fail every call >= fail_at */
    atomic_long failed; /* failures injected */
} fault_state;

static fault_state g_fault;

static bool fault_should_fail(void) {
    long n = atomic_fetch_add(&g_fault.calls, 1) + 1;
    if (g_fault.fail_at <= 0) return false;
    bool f = g_fault.persistent ? n >= g_fault.fail_at : n == g_fault.fail_at;
    if (f) atomic_fetch_add(&g_fault.failed, 1);
    return f;
}

static void *fault_malloc(size_t size, void *ud) {
    (void)ud;
    if (fault_should_fail()) return NULL;
    void *p = malloc(size ? size : 1);
    if (p) atomic_fetch_add(&g_fault.live, 1);
    return p;
}

static void *fault_realloc(void *p, size_t size, void *ud) {
    (void)ud;
    if (fault_should_fail()) return NULL;
    void *q = realloc(p, size ? size : 1);
    if (q && !p) atomic_fetch_add(&g_fault.live, 1);
    return q;
}

static void fault_free(void *p, void *ud) {
    (void)ud;
    if (!p) return;
    atomic_fetch_sub(&g_fault.live, 1);
    free(p);
}

static const loom_allocator k_fault_allocator = {
    .malloc_fn = fault_malloc,
    .realloc_fn = fault_realloc,
    .free_fn = fault_free,
    .user_data = NULL,
};

/* ---------------------------------------------------------------- the pipeline */

enum { K = 64, M = 48, T = 5, H = 4, D = 12 }; /* M = H * D */
#define SM_SCALE 0.1f

typedef struct inputs {
    float x[K * T];                /* activations [K, T] */
    uint8_t wq[M * (K / 32) * 34]; /* Q8_0 weights [K, M] */
    uint16_t wo[M * M];            /* F16 weights [M, M] */
    int32_t pos[T];
    float bias[M];
} inputs;

typedef enum step {
    STEP_CTX,
    STEP_BUILD,
    STEP_GRAPH,
    STEP_BACKEND,
    STEP_ALLOC,
    STEP_COMPUTE,
    STEP_DONE
} step;

static const char *k_step_names[] = {"ctx_new", "build",   "graph", "backend_new",
                                     "alloc",   "compute", "done"};

typedef struct run_result {
    step reached;       /* first step that failed, or STEP_DONE */
    loom_status status; /* its status */
    char message[256];  /* loom_last_error() at the failure */
    float out[M * T];   /* the result when STEP_DONE */
} run_result;

static void record_failure(run_result *r, step s, loom_status st) {
    r->reached = s;
    r->status = st;
    snprintf(r->message, sizeof r->message, "%s", loom_last_error());
}

/* The whole pipeline; every step checks its result and unwinds what it made. */
static void run_pipeline(const inputs *in, run_result *r) {
    memset(r, 0, sizeof *r);
    loom_clear_error();
    loom_ctx_params p = {.mem_size = 64 * loom_tensor_overhead() + loom_graph_overhead(128),
                         .mem_buffer = NULL,
                         .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(p);
    if (!ctx) {
        record_failure(r, STEP_CTX, loom_last_status());
        return;
    }
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, T);
    loom_tensor *wq = loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, K, M);
    loom_tensor *wo = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, M, M);
    loom_tensor *pos = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, T);
    loom_tensor *bias = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, M);
    loom_tensor *h = loom_rms_norm(ctx, x, 1e-5f);
    h = loom_mul_mat(ctx, wq, h); /* [M, T] */
    h = loom_reshape_3d(ctx, h, D, H, T);
    h = loom_rope_ext(ctx, h, pos, NULL, D, LOOM_ROPE_TYPE_NEOX, 10000.0f, 1.0f);
    h = loom_reshape_2d(ctx, h, M, T);
    h = loom_soft_max_ext(ctx, h, NULL, NULL, SM_SCALE, 0.0f);
    h = loom_mul_mat(ctx, wo, h); /* [M, T] */
    h = loom_add(ctx, h, bias);
    loom_tensor *out = h;
    if (!out) {
        record_failure(r, STEP_BUILD, loom_last_status());
        loom_ctx_free(ctx);
        return;
    }
    loom_graph *g = loom_graph_new(ctx, 128);
    loom_status st = g ? loom_graph_build_forward(g, out) : loom_last_status();
    if (!g || st != LOOM_OK) {
        record_failure(r, STEP_GRAPH, st);
        loom_ctx_free(ctx);
        return;
    }
    loom_backend_t be = loom_cpu_backend_new(2);
    if (!be) {
        record_failure(r, STEP_BACKEND, loom_last_status());
        loom_ctx_free(ctx);
        return;
    }
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_cpu_buffer_type());
    if (!buf) {
        record_failure(r, STEP_ALLOC, loom_last_status());
        loom_backend_free(be);
        loom_ctx_free(ctx);
        return;
    }
    loom_tensor_set(x, in->x, 0, sizeof in->x);
    loom_tensor_set(wq, in->wq, 0, sizeof in->wq);
    loom_tensor_set(wo, in->wo, 0, sizeof in->wo);
    loom_tensor_set(pos, in->pos, 0, sizeof in->pos);
    loom_tensor_set(bias, in->bias, 0, sizeof in->bias);
    st = loom_backend_graph_compute(be, g);
    if (st != LOOM_OK) {
        record_failure(r, STEP_COMPUTE, st);
    } else {
        loom_tensor_get(out, r->out, 0, sizeof r->out);
        r->reached = STEP_DONE;
    }
    loom_buffer_free(buf);
    loom_backend_free(be);
    loom_ctx_free(ctx);
}

/* The same chain through the scalar reference (inputs are already host tensors), with a
 * tolerance per result: the first matmul may quantise its activations to Q8_0 (docs), which
 * moves h1 by at most q8_err; rope mixes two such errors; softmax logits move by
 * SM_SCALE times that, its probabilities by a factor of at most exp(2 dz); the second
 * matmul (|wo| <= 1) of probabilities that sum to 1 then moves by exp(2 dz) - 1. */
static void reference(const inputs *in, double *out, double *tol) {
    int64_t ne_x[4] = {K, T, 1, 1}, ne_wq[4] = {K, M, 1, 1}, ne_wo[4] = {M, M, 1, 1};
    int64_t ne_p[4] = {T, 1, 1, 1}, ne_b[4] = {M, 1, 1, 1}, ne_h[4] = {M, T, 1, 1};
    int64_t ne_r[4] = {D, H, T, 1};
    ref_tensor x = ref_contiguous(LOOM_TYPE_F32, ne_x, (void *)in->x);
    ref_tensor wq = ref_contiguous(LOOM_TYPE_Q8_0, ne_wq, (void *)in->wq);
    ref_tensor wo = ref_contiguous(LOOM_TYPE_F16, ne_wo, (void *)in->wo);
    ref_tensor pos = ref_contiguous(LOOM_TYPE_I32, ne_p, (void *)in->pos);
    ref_tensor bias = ref_contiguous(LOOM_TYPE_F32, ne_b, (void *)in->bias);
    float *b0 = calloc(K * T, sizeof(float)), *b1 = calloc(M * T, sizeof(float));
    float *b2 = calloc(M * T, sizeof(float));
    ref_tensor n = ref_contiguous(LOOM_TYPE_F32, ne_x, b0);
    ref_rms_norm(&x, 1e-5, &n);
    ref_tensor h1 = ref_contiguous(LOOM_TYPE_F32, ne_h, b1);
    double q8[M * T];
    ref_mul_mat(&wq, &n, &h1, NULL, q8);
    for (int t = 0; t < T; t++) {
        double e1 = 0;
        for (int m = 0; m < M; m++)
            e1 = fmax(e1, q8[m + M * t]);
        double dz = SM_SCALE * 2 * e1;
        for (int m = 0; m < M; m++)
            tol[m + M * t] = expm1(2 * dz) + 1e-4;
    }
    ref_tensor h1r = ref_contiguous(LOOM_TYPE_F32, ne_r, b1);
    ref_tensor h2r = ref_contiguous(LOOM_TYPE_F32, ne_r, b2);
    ref_rope(&h1r, &pos, NULL, D, LOOM_ROPE_TYPE_NEOX, 10000.0, 1.0, &h2r);
    ref_tensor h2 = ref_contiguous(LOOM_TYPE_F32, ne_h, b2);
    ref_soft_max(&h2, NULL, NULL, SM_SCALE, 0.0f, &h1, NULL);
    ref_mul_mat(&wo, &h1, &h2, NULL, NULL);
    ref_binary(REF_ADD, &h2, &bias, &h1);
    for (int i = 0; i < M * T; i++)
        out[i] = b1[i];
    free(b0);
    free(b1);
    free(b2);
}

static void make_inputs(inputs *in) {
    float w[K];
    for (int i = 0; i < K * T; i++)
        in->x[i] = loom_test_randf(-1, 1);
    for (int m = 0; m < M; m++) {
        for (int k = 0; k < K; k++)
            w[k] = loom_test_randf(-1, 1);
        loom_type_traits_get(LOOM_TYPE_Q8_0)->from_float(w, in->wq + (size_t)m * (K / 32) * 34, K);
    }
    for (int i = 0; i < M * M; i++)
        in->wo[i] = loom_fp32_to_fp16(loom_test_randf(-1, 1));
    for (int t = 0; t < T; t++)
        in->pos[t] = (int32_t)(loom_test_rand() % 64);
    for (int i = 0; i < M; i++)
        in->bias[i] = loom_test_randf(-1, 1);
}

/* A failure must say what went wrong: an out-of-memory status and a message. */
static void check_failure(const run_result *r, long n, bool persistent) {
    bool oom = r->status == LOOM_ERR_NOMEM || r->status == LOOM_ERR_DEVICE_OOM;
    LOOM_CHECK_MSG(oom, "fail_at=%ld%s: %s failed with status %d (%s), expected out of memory", n,
                   persistent ? "+" : "", k_step_names[r->reached], (int)r->status,
                   loom_status_str(r->status));
    LOOM_CHECK_MSG(r->message[0] != '\0', "fail_at=%ld%s: %s failed with an empty message", n,
                   persistent ? "+" : "", k_step_names[r->reached]);
}

static void fault_sweep(bool persistent) {
    static inputs in;
    static double expect[M * T], tol[M * T];
    static float clean[M * T];
    static run_result r;
    make_inputs(&in);
    reference(&in, expect, tol);

    loom_allocator_set(&k_fault_allocator);
    /* one clean run first: lazily created globals (tables, thread-locals) are made now,
     * so that every later run must return to the same number of live allocations */
    g_fault.fail_at = 0;
    run_pipeline(&in, &r);
    long baseline = atomic_load(&g_fault.live);
    LOOM_CHECK_MSG(r.reached == STEP_DONE, "clean run failed at %s: %s", k_step_names[r.reached],
                   r.message);
    if (r.reached == STEP_DONE)
        for (int i = 0; i < M * T; i++)
            LOOM_CHECK_NEAR(r.out[i], expect[i], tol[i]);
    memcpy(clean, r.out, sizeof clean);

    int counts[STEP_DONE + 1] = {0};
    long n = 1;
    for (; n <= 100000; n++) {
        atomic_store(&g_fault.calls, 0);
        atomic_store(&g_fault.failed, 0);
        g_fault.persistent = persistent;
        g_fault.fail_at = n;
        run_pipeline(&in, &r);
        g_fault.fail_at = 0;
        long injected = atomic_load(&g_fault.failed);
        long live = atomic_load(&g_fault.live);
        LOOM_CHECK_MSG(live == baseline, "fail_at=%ld%s (failed at %s): %ld allocations leaked", n,
                       persistent ? "+" : "", k_step_names[r.reached], live - baseline);
        if (live != baseline) atomic_store(&g_fault.live, baseline);
        counts[r.reached]++;
        if (r.reached == STEP_DONE) {
            /* surviving a failure must not change the result */
            for (int i = 0; i < M * T; i++)
                LOOM_CHECK_NEAR(r.out[i], clean[i], 1e-6);
            if (injected == 0) break; /* the pipeline needs fewer than n allocations */
            continue;                 /* it survived an injected failure (retry, fallback) */
        }
        LOOM_CHECK_MSG(injected > 0, "fail_at=%ld: %s failed although no failure was injected", n,
                       k_step_names[r.reached]);
        check_failure(&r, n, persistent);
        if (loom_test_failures() > 20) break;
    }
    loom_allocator_set(NULL);

    LOOM_CHECK(n > 1); /* the pipeline allocates through loom_malloc at all */
    LOOM_CHECK_MSG(n < 100000, "the sweep did not end");
    fprintf(stderr,
            "fault sweep (%s): %ld points; failures at ctx %d, build %d, graph %d, "
            "backend %d, alloc %d, compute %d; %d successes\n",
            persistent ? "persistent" : "once", n, counts[STEP_CTX], counts[STEP_BUILD],
            counts[STEP_GRAPH], counts[STEP_BACKEND], counts[STEP_ALLOC], counts[STEP_COMPUTE],
            counts[STEP_DONE]);
    LOOM_CHECK_MSG(r.reached == STEP_DONE, "the last run failed at %s: %s", k_step_names[r.reached],
                   r.message);
}

LOOM_TEST(ops_fault, oom_once_on_every_allocation) {
    fault_sweep(false);
}

LOOM_TEST(ops_fault, oom_from_every_allocation_on) {
    fault_sweep(true);
}
