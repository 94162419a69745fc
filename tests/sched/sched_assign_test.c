/*
 * The five assignment passes, one cause code at a time, on small graphs over sim devices
 * (private memory, host memory, op refusals) and the CPU; the seed's invariant that the
 * CPU never spreads between GPU ops, checked on random chains against a rule written here
 * from the seed's text; user pins; and the errors (a pre-allocated tensor no backend can
 * run, construction mistakes).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "tests/sched/testutil.h"
#include "tests/shim/loom_test.h"

typedef struct fixture {
    tu_devs d;
    loom_ctx *wctx; /* weights */
    loom_buffer_t wbuf;
    loom_ctx *ctx; /* graph */
    loom_sched *s;
} fixture;

static bool fx_open(fixture *f, const char *spec) {
    memset(f, 0, sizeof(*f));
    const char *specs[] = {spec};
    if (!tu_devs_open(&f->d, specs, 1, 1)) return false;
    f->ctx = tu_ctx(256, true);
    return f->ctx != NULL;
}

/* A weight [ne0, ne1] in backend i's memory (usage WEIGHTS). One weight context per call. */
static loom_tensor *fx_weight(fixture *f, int backend, const char *name, int64_t ne0, int64_t ne1,
                              loom_ctx **ctx_out, loom_buffer_t *buf_out) {
    loom_ctx *ctx = tu_ctx(4, true);
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, ne0, ne1);
    loom_set_name(w, name);
    loom_buft_t buft = backend < 0 ? loom_cpu_buffer_type() : tu_buft(&f->d, backend);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, buft);
    loom_buffer_set_usage(buf, LOOM_BUFFER_USAGE_WEIGHTS);
    tu_fill(w, 1, 0.1f);
    *ctx_out = ctx;
    *buf_out = buf;
    return w;
}

static loom_tensor *fx_input(fixture *f, const char *name, int64_t ne0, int64_t ne1) {
    loom_tensor *t = loom_new_tensor_2d(f->ctx, LOOM_TYPE_F32, ne0, ne1);
    loom_set_name(t, name);
    loom_set_input(t);
    return t;
}

static loom_tensor *named(loom_tensor *t, const char *name) {
    if (t) loom_set_name(t, name);
    return t;
}

#define MAX_W 8
typedef struct weights {
    loom_ctx *ctx[MAX_W];
    loom_buffer_t buf[MAX_W];
    int n;
} weights;

static loom_tensor *W(fixture *f, weights *w, int backend, const char *name, int64_t ne0,
                      int64_t ne1) {
    loom_tensor *t = fx_weight(f, backend, name, ne0, ne1, &w->ctx[w->n], &w->buf[w->n]);
    w->n++;
    return t;
}

static void weights_free(weights *w) {
    for (int i = 0; i < w->n; i++) {
        loom_buffer_free(w->buf[i]);
        loom_ctx_free(w->ctx[i]);
    }
    w->n = 0;
}

static void fx_close(fixture *f) {
    loom_sched_free(f->s);
    loom_ctx_free(f->ctx);
    tu_devs_close(&f->d);
}

#define CHECK_PLACED(s, t, backend, cause)                                                         \
    do {                                                                                           \
        loom_backend_t b_ = loom_sched_get_tensor_backend(s, t);                                   \
        LOOM_CHECK_MSG(b_ == (backend), "%s: on %s, want %s", (t)->name,                           \
                       b_ ? loom_backend_name(b_) : "none", loom_backend_name(backend));           \
        LOOM_CHECK_STR_CONTAINS(loom_sched_get_tensor_cause(s, t), cause);                         \
    } while (0)

/* Pass 1: buffers, inputs, weights (and which source), and ROPE / FLASH_ATTN_EXT
 * abstaining from the weight rule. */
LOOM_TEST(sched_assign, pass1_dst_vsrc_inp_wgt) {
    fixture f;
    LOOM_REQUIRE(fx_open(&f, "sim:1"));
    weights w = {0};
    loom_backend_t sim = f.d.backends[0], cpu = f.d.cpu;
    loom_tensor *wq = W(&f, &w, 0, "wq", 16, 16);    /* on SIM0 */
    loom_tensor *norm = W(&f, &w, 0, "norm", 16, 1); /* on SIM0 */
    loom_tensor *freq = W(&f, &w, 0, "freq", 4, 1);  /* rope factors on SIM0 */
    loom_tensor *x = fx_input(&f, "x", 16, 4);
    loom_tensor *a = named(loom_mul_mat(f.ctx, wq, x), "a"); /* weight at src 0 */
    loom_tensor *b = named(loom_mul(f.ctx, a, norm), "b");   /* weight at src 1 */
    loom_tensor *v =
        named(loom_view_2d(f.ctx, wq, 16, 4, wq->nb[1], 0), "wview"); /* view of a weight */
    loom_tensor *c = named(loom_add(f.ctx, b, v), "c");
    loom_tensor *q = loom_reshape_3d(f.ctx, c, 8, 2, 4);
    loom_tensor *pos = loom_new_tensor_1d(f.ctx, LOOM_TYPE_I32, 4);
    loom_set_name(pos, "pos");
    loom_set_input(pos);
    loom_tensor *r = named(loom_rope_ext(f.ctx, q, pos, loom_reshape_1d(f.ctx, freq, 4), 8,
                                         LOOM_ROPE_TYPE_NEOX, 10000.0f, 1.0f),
                           "rope");
    loom_graph *g = tu_graph(f.ctx, r);
    LOOM_REQUIRE(g != NULL);
    f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, false);
    LOOM_REQUIRE(loom_sched_split_graph(f.s, g) == LOOM_OK);
    CHECK_PLACED(f.s, wq, sim, "1.dst");
    CHECK_PLACED(f.s, x, cpu, "1.inp");
    CHECK_PLACED(f.s, pos, cpu, "1.inp");
    CHECK_PLACED(f.s, a, sim, "1.wgt0");
    CHECK_PLACED(f.s, b, sim, "1.wgt1");
    CHECK_PLACED(f.s, v, sim, "1.vsrc");
    /* rope's only weight is the tiny freq tensor: not placed by it in pass 1 */
    const char *rc = loom_sched_get_tensor_cause(f.s, r);
    LOOM_CHECK_MSG(strncmp(rc, "1.", 2) != 0, "rope placed in pass 1 (%s)", rc);
    LOOM_CHECK(loom_sched_get_tensor_backend(f.s, r) == sim);
    weights_free(&w);
    fx_close(&f);
}

LOOM_TEST(sched_assign, flash_attn_abstains_from_the_weight_rule) {
    /* sinks on SIM1, everything else runs on the CPU: attention must stay on the CPU */
    fixture f;
    LOOM_REQUIRE(fx_open(&f, "sim:1"));
    weights w = {0};
    loom_tensor *sinks = W(&f, &w, 0, "sinks", 2, 1);
    loom_tensor *wq = W(&f, &w, -1, "wq_host", 16, 16);
    loom_tensor *x = fx_input(&f, "x", 16, 4);
    loom_tensor *h = named(loom_mul_mat(f.ctx, wq, x), "h"); /* CPU weight: CPU */
    loom_tensor *q = loom_permute(f.ctx, loom_reshape_3d(f.ctx, h, 8, 2, 4), 0, 2, 1, 3);
    loom_tensor *fa = named(loom_flash_attn_ext(f.ctx, q, q, q, NULL,
                                                loom_reshape_1d(f.ctx, sinks, 2), 0.3f, 0.0f, 0.0f),
                            "fa");
    loom_tensor *out = named(loom_mul_mat(f.ctx, wq, loom_reshape_2d(f.ctx, fa, 16, 4)), "o");
    loom_graph *g = tu_graph(f.ctx, out);
    LOOM_REQUIRE(g != NULL);
    f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, false);
    LOOM_REQUIRE(loom_sched_split_graph(f.s, g) == LOOM_OK);
    CHECK_PLACED(f.s, h, f.d.cpu, "1.wgt0");
    CHECK_PLACED(f.s, out, f.d.cpu, "1.wgt0");
    LOOM_CHECK(loom_sched_get_tensor_backend(f.s, fa) == f.d.cpu);
    LOOM_CHECK(strncmp(loom_sched_get_tensor_cause(f.s, fa), "1.", 2) != 0);
    weights_free(&w);
    fx_close(&f);
}

/* Op offload: host weights, a device that wants batches >= its threshold. */
LOOM_TEST(sched_assign, op_offload_by_batch_threshold) {
    for (int variant = 0; variant < 4; variant++) {
        /* 0: default threshold 32; 1: offload=8; 2: op_offload off; 3: offload=0 (never) */
        const char *spec = variant == 1   ? "sim:1,offload=8"
                           : variant == 3 ? "sim:1,offload=0"
                                          : "sim:1";
        int threshold = variant == 1 ? 8 : 32;
        bool op_offload = variant != 2;
        fixture f;
        LOOM_REQUIRE(fx_open(&f, spec));
        weights w = {0};
        loom_tensor *wh = W(&f, &w, -1, "w_host", 32, 32);
        loom_tensor *xs = fx_input(&f, "x_small", 32, threshold - 1);
        loom_tensor *xb = fx_input(&f, "x_big", 32, threshold);
        loom_tensor *ms = named(loom_mul_mat(f.ctx, wh, xs), "mm_small");
        loom_tensor *mb = named(loom_mul_mat(f.ctx, wh, xb), "mm_big");
        loom_tensor *both = loom_concat(f.ctx, ms, mb, 1);
        loom_graph *g = tu_graph(f.ctx, both);
        LOOM_REQUIRE(g != NULL);
        f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, op_offload);
        LOOM_REQUIRE(loom_sched_split_graph(f.s, g) == LOOM_OK);
        CHECK_PLACED(f.s, ms, f.d.cpu, "1.wgt0");
        if (variant <= 1) {
            CHECK_PLACED(f.s, mb, f.d.backends[0], "1.off");
        } else {
            CHECK_PLACED(f.s, mb, f.d.cpu, "1.wgt0");
        }
        weights_free(&w);
        fx_close(&f);
    }
}

/* Pass 2: each of the four sweeps, seen through its cause code. */
LOOM_TEST(sched_assign, pass2_four_sweeps) {
    fixture f;
    LOOM_REQUIRE(fx_open(&f, "sim:1"));
    weights w = {0};
    loom_backend_t sim = f.d.backends[0], cpu = f.d.cpu;
    loom_tensor *wg = W(&f, &w, 0, "w_gpu", 16, 16);
    loom_tensor *wc = W(&f, &w, -1, "w_cpu", 16, 16);
    loom_tensor *x = fx_input(&f, "x", 16, 4);
    loom_tensor *up = named(loom_sqr(f.ctx, x), "up");          /* before a GPU op */
    loom_tensor *g1 = named(loom_mul_mat(f.ctx, wg, up), "g1"); /* GPU anchor */
    loom_tensor *dn = named(loom_sqrt(f.ctx, g1), "dn");        /* after a GPU op */
    loom_tensor *c1 = named(loom_mul_mat(f.ctx, wc, dn), "c1"); /* CPU anchor */
    loom_tensor *rd = named(loom_scale(f.ctx, c1, 2.0f), "rd"); /* after the CPU, no GPU after */
    loom_tensor *y = fx_input(&f, "y", 16, 4);
    loom_tensor *ru = named(loom_sqr(f.ctx, y), "ru"); /* only a CPU op after it */
    loom_tensor *c2 = named(loom_mul_mat(f.ctx, wc, ru), "c2");
    loom_tensor *out = named(loom_add(f.ctx, rd, c2), "out");
    loom_graph *g = tu_graph(f.ctx, out);
    LOOM_REQUIRE(g != NULL);
    /* node order matters for the sweeps: rd must come before ru/c2, so check it */
    int i_rd = -1, i_ru = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i] == rd) i_rd = i;
        if (g->nodes[i] == ru) i_ru = i;
    }
    LOOM_REQUIRE(i_rd >= 0 && i_ru > i_rd);
    f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, false);
    LOOM_REQUIRE(loom_sched_split_graph(f.s, g) == LOOM_OK);
    CHECK_PLACED(f.s, g1, sim, "1.wgt0");
    CHECK_PLACED(f.s, c1, cpu, "1.wgt0");
    CHECK_PLACED(f.s, dn, sim, "2.gpu-dn");
    CHECK_PLACED(f.s, up, sim, "2.gpu-up");
    CHECK_PLACED(f.s, rd, cpu, "2.any-dn");
    /* ru follows rd (CPU) going down before the up sweep gets a chance */
    CHECK_PLACED(f.s, ru, cpu, "2.any-dn");
    CHECK_PLACED(f.s, out, cpu, "2.any-dn");
    weights_free(&w);
    fx_close(&f);

    /* 2.any-up: the first nodes of a CPU-only graph see only a CPU node after them */
    LOOM_REQUIRE(fx_open(&f, "sim:1"));
    loom_tensor *wc2 = W(&f, &w, -1, "w_cpu", 16, 16);
    loom_tensor *x2 = fx_input(&f, "x", 16, 4);
    loom_tensor *first = named(loom_sqr(f.ctx, x2), "first");
    loom_tensor *last = named(loom_mul_mat(f.ctx, wc2, first), "last");
    g = tu_graph(f.ctx, last);
    f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, false);
    LOOM_REQUIRE(loom_sched_split_graph(f.s, g) == LOOM_OK);
    CHECK_PLACED(f.s, first, f.d.cpu, "2.any-up");
    weights_free(&w);
    fx_close(&f);
}

/* Pass 3 (upgrade to a same-memory accelerator, best guess for refused nodes) and pass 4
 * (views follow their source, sources follow their consumer, first supporting backend). */
LOOM_TEST(sched_assign, pass3_upgrade_and_best_pass4_fill) {
    fixture f;
    /* an accelerator on host memory that cannot multiply matrices */
    LOOM_REQUIRE(fx_open(&f, "sim:1,hostmem=1,refuse=mul_mat"));
    weights w = {0};
    loom_backend_t acc = f.d.backends[0], cpu = f.d.cpu;
    loom_tensor *wh = W(&f, &w, -1, "w_host", 16, 16);
    loom_tensor *x = fx_input(&f, "x", 16, 4);
    loom_tensor *mm = named(loom_mul_mat(f.ctx, wh, x), "mm"); /* only the CPU can */
    loom_tensor *sq = named(loom_sqr(f.ctx, mm), "sq");        /* CPU by sweep, then upgraded */
    loom_tensor *rs = loom_reshape_1d(f.ctx, sq, 64);          /* a view: follows sq */
    loom_set_name(rs, "rs");
    loom_tensor *k = loom_new_tensor_1d(f.ctx, LOOM_TYPE_F32, 64); /* constant leaf, no buffer */
    loom_set_name(k, "k");
    loom_tensor *out = named(loom_add(f.ctx, rs, k), "out");
    loom_graph *g = tu_graph(f.ctx, out);
    f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, false);
    LOOM_REQUIRE(loom_sched_split_graph(f.s, g) == LOOM_OK);
    CHECK_PLACED(f.s, mm, cpu, "1.wgt0");
    CHECK_PLACED(f.s, sq, acc, "3.upg");
    CHECK_PLACED(f.s, rs, acc, "4.vsrc");
    /* k has no memory yet, so nothing proves the accelerator can read it: no upgrade */
    CHECK_PLACED(f.s, out, cpu, "2.any-dn");
    CHECK_PLACED(f.s, k, cpu, "4.cur");
    /* shared memory: the CPU -> accelerator handoff needs no copy */
    loom_sched_stats st;
    loom_sched_get_stats(f.s, &st);
    LOOM_CHECK_EQ_INT(st.n_inputs, 0);
    LOOM_CHECK(st.n_splits >= 2);
    weights_free(&w);
    fx_close(&f);

    /* 3.best: a GPU that refuses SQR between GPU ops; the sweeps leave it alone */
    LOOM_REQUIRE(fx_open(&f, "sim:1,refuse=sqr"));
    loom_tensor *wg = W(&f, &w, 0, "w_gpu", 16, 16);
    loom_tensor *x2 = fx_input(&f, "x", 16, 4);
    loom_tensor *a = named(loom_mul_mat(f.ctx, wg, x2), "a");
    loom_tensor *b = named(loom_sqr(f.ctx, a), "b");
    loom_tensor *c = named(loom_mul_mat(f.ctx, wg, b), "c");
    /* 4.sup: a view of a tensor nobody placed */
    loom_tensor *lonely = loom_new_tensor_1d(f.ctx, LOOM_TYPE_F32, 64);
    loom_set_name(lonely, "lonely");
    loom_tensor *lv = named(loom_view_1d(f.ctx, lonely, 64, 0), "lonely_view");
    loom_tensor *out2 = named(loom_add(f.ctx, loom_reshape_1d(f.ctx, c, 64), lv), "out2");
    g = tu_graph(f.ctx, out2);
    f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, false);
    LOOM_REQUIRE(loom_sched_split_graph(f.s, g) == LOOM_OK);
    CHECK_PLACED(f.s, b, f.d.cpu, "3.best");
    CHECK_PLACED(f.s, c, f.d.backends[0], "1.wgt0");
    CHECK_PLACED(f.s, lv, f.d.backends[0], "4.sup");
    CHECK_PLACED(f.s, lonely, f.d.backends[0], "4.cur");
    weights_free(&w);
    fx_close(&f);
}

LOOM_TEST(sched_assign, user_pins_survive_every_pass) {
    fixture f;
    LOOM_REQUIRE(fx_open(&f, "sim:1,hostmem=1"));
    weights w = {0};
    loom_tensor *wh = W(&f, &w, -1, "w_host", 16, 16);
    loom_tensor *x = fx_input(&f, "x", 16, 4);
    loom_tensor *a = named(loom_mul_mat(f.ctx, wh, x), "a"); /* would go to SIM0 (1.wgt0) */
    loom_tensor *b = named(loom_sqr(f.ctx, a), "b");         /* would be upgraded */
    loom_graph *g = tu_graph(f.ctx, b);
    f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, false);
    LOOM_REQUIRE(loom_sched_set_tensor_backend(f.s, a, f.d.cpu) == LOOM_OK);
    LOOM_REQUIRE(loom_sched_set_tensor_backend(f.s, b, f.d.cpu) == LOOM_OK);
    LOOM_CHECK(loom_sched_get_tensor_backend(f.s, a) == f.d.cpu); /* visible before split */
    LOOM_REQUIRE(loom_sched_split_graph(f.s, g) == LOOM_OK);
    CHECK_PLACED(f.s, a, f.d.cpu, "usr");
    CHECK_PLACED(f.s, b, f.d.cpu, "usr");
    /* after a reset they are gone */
    loom_sched_reset(f.s);
    LOOM_CHECK(loom_sched_get_tensor_backend(f.s, a) == NULL);
    /* pinning to a foreign backend is an error */
    loom_backend_t other = loom_cpu_backend_new(1);
    LOOM_CHECK(loom_sched_set_tensor_backend(f.s, a, other) == LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "not one of the scheduler's backends");
    loom_backend_free(other);
    weights_free(&w);
    fx_close(&f);
}

/* The seed's invariant, on random chains: "the CPU will never be used unless weights are
 * on the CPU, or there are no GPU ops between CPU ops". A free node (no weight) ends on the
 * GPU exactly when, walking the chain from it in either direction, a GPU-weight node comes
 * before any CPU-weight node. */
LOOM_TEST(sched_assign, cpu_never_spreads_between_gpu_ops) {
    fixture f;
    LOOM_REQUIRE(fx_open(&f, "sim:1"));
    weights w = {0};
    loom_tensor *wg = W(&f, &w, 0, "w_gpu", 16, 16);
    loom_tensor *wc = W(&f, &w, -1, "w_cpu", 16, 16);
    for (int trial = 0; trial < 50; trial++) {
        enum { N = 24 };
        int kind[N]; /* 0 free, 1 GPU weight, 2 CPU weight */
        loom_tensor *chain[N];
        loom_ctx_free(f.ctx);
        f.ctx = tu_ctx(256, true);
        loom_tensor *cur = fx_input(&f, "x", 16, 4);
        for (int i = 0; i < N; i++) {
            uint32_t r = loom_test_rand() % 10;
            kind[i] = r < 6 ? 0 : r < 8 ? 1 : 2;
            cur = kind[i] == 0 ? loom_scale(f.ctx, cur, 0.5f)
                               : loom_mul_mat(f.ctx, kind[i] == 1 ? wg : wc, cur);
            loom_format_name(cur, "n%d", i);
            chain[i] = cur;
        }
        loom_graph *g = tu_graph(f.ctx, cur);
        LOOM_REQUIRE(g != NULL && g->n_nodes == N);
        loom_sched_free(f.s);
        f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, false);
        LOOM_REQUIRE(loom_sched_split_graph(f.s, g) == LOOM_OK);
        for (int i = 0; i < N; i++) {
            bool gpu;
            if (kind[i] != 0) {
                gpu = kind[i] == 1;
            } else {
                int down = 0, up = 0; /* first anchor kind seen going each way */
                for (int j = i - 1; j >= 0 && !down; j--)
                    down = kind[j];
                for (int j = i + 1; j < N && !up; j++)
                    up = kind[j];
                gpu = down == 1 || up == 1;
            }
            loom_backend_t want = gpu ? f.d.backends[0] : f.d.cpu;
            LOOM_CHECK_MSG(loom_sched_get_tensor_backend(f.s, chain[i]) == want,
                           "trial %d node %d (%s): on %s", trial, i,
                           loom_sched_get_tensor_cause(f.s, chain[i]),
                           loom_backend_name(loom_sched_get_tensor_backend(f.s, chain[i])));
        }
    }
    weights_free(&w);
    fx_close(&f);
}

LOOM_TEST(sched_assign, preallocated_tensor_no_backend_can_run_is_an_error) {
    fixture f;
    LOOM_REQUIRE(fx_open(&f, "sim:1,refuse=sqr"));
    /* y = sqr(x) with y already in SIM0's memory: SIM0 refuses SQR, the CPU cannot read it */
    loom_ctx *pctx = tu_ctx(8, true);
    loom_tensor *x = loom_new_tensor_1d(pctx, LOOM_TYPE_F32, 64);
    loom_set_name(x, "x_dev");
    loom_tensor *y = loom_sqr(pctx, x);
    loom_set_name(y, "kv_write");
    loom_buffer_t buf = loom_alloc_ctx_tensors(pctx, tu_buft(&f.d, 0));
    LOOM_REQUIRE(buf != NULL);
    loom_graph *g = tu_graph(f.ctx, y);
    LOOM_REQUIRE(g != NULL);
    f.s = loom_sched_new(f.d.backends, NULL, f.d.n, 256, false, false);
    loom_status st = loom_sched_split_graph(f.s, g);
    LOOM_CHECK_EQ_INT(st, LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "kv_write");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "SQR");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "pre-allocated");
    /* and compute reports the same, without aborting */
    LOOM_CHECK_EQ_INT(loom_sched_graph_compute(f.s, g), LOOM_ERR_UNSUPPORTED);
    loom_buffer_free(buf);
    loom_ctx_free(pctx);
    fx_close(&f);
}

LOOM_TEST(sched_assign, construction_errors) {
    tu_devs d;
    const char *spec[] = {"sim:17"};
    LOOM_REQUIRE(tu_devs_open(&d, spec, 1, 1));
    LOOM_REQUIRE(d.n == 18);
    /* the CPU must be last */
    loom_backend_t wrong[2] = {d.cpu, d.backends[0]};
    LOOM_CHECK(loom_sched_new(wrong, NULL, 2, 64, false, false) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "last backend must be a CPU device");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "SIM0");
    /* at most 16 */
    loom_backend_t many[17];
    for (int i = 0; i < 16; i++)
        many[i] = d.backends[i];
    many[16] = d.cpu;
    LOOM_CHECK(loom_sched_new(many, NULL, 17, 64, false, false) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "at most 16 backends (got 17)");
    loom_sched *ok = loom_sched_new(many + 1, NULL, 16, 64, false, false);
    LOOM_CHECK(ok != NULL);
    loom_sched_free(ok);
    /* a buffer type the backend cannot use */
    loom_backend_t two[2] = {d.backends[0], d.cpu};
    loom_buft_t bufts[2] = {tu_buft(&d, 1), NULL};
    LOOM_CHECK(loom_sched_new(two, bufts, 2, 64, false, false) == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "does not support buffer type SIM1");
    LOOM_CHECK(loom_sched_new(two, NULL, 0, 64, false, false) == NULL);
    tu_devs_close(&d);
}
