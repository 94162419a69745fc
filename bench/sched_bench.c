/*
 * sched_bench: how long the scheduler takes to split and allocate a 32-layer, 7B-shaped
 * llama graph (d = 4096, 32 heads, FFN 11008, KV cache of 512, flash attention) on
 * [SIM0, SIM1, CPU] with layers 0-15 on SIM0, 16-31 and the output head on SIM1 and the
 * token embeddings on the CPU. Compute buffers are reserved once (the worst case, a
 * 512-token batch); each timed round is what a decode loop pays per graph: reset, then
 * loom_sched_alloc_graph (split + allocate) on a freshly built graph. Graph building is not
 * timed. Weights are metadata only (their tensors point into one small buffer per device,
 * flagged WEIGHTS): nothing is computed, so no 7B of memory is needed.
 *
 * Prints microseconds per graph and per 1,000 nodes (median of the rounds; wall time and
 * this thread's CPU time, which a busy machine does not inflate), for a prompt batch (512)
 * and a generation batch (1). Usage: sched_bench [rounds]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/cpu.h"
#include "loom/sched.h"
#include "loom/sim.h"

enum {
    N_LAYER = 32,
    D = 4096,
    N_HEAD = 32,
    HD = D / N_HEAD,
    N_FF = 11008,
    N_VOCAB = 32000,
    N_CTX = 512
};

typedef struct layer {
    loom_tensor *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w2, *w3, *k_cache, *v_cache;
} layer;

typedef struct model {
    layer l[N_LAYER];
    loom_tensor *tok_embd, *out_norm, *out;
    loom_ctx *wctx;
    loom_ctx *kvctx[2];
    loom_buffer_t kvbuf[2];
    loom_buffer_t phantom[3]; /* per device: the one small buffer weights point into */
} model;

static void die(const char *what) {
    fprintf(stderr, "sched_bench: %s: %s\n", what, loom_last_error());
    exit(1);
}

static loom_tensor *w2d(loom_ctx *ctx, const char *name, int il, loom_type type, int64_t ne0,
                        int64_t ne1) {
    loom_tensor *t =
        ne1 ? loom_new_tensor_2d(ctx, type, ne0, ne1) : loom_new_tensor_1d(ctx, type, ne0);
    if (!t) die("weight");
    if (il >= 0) {
        loom_format_name(t, "blk.%d.%s", il, name);
    } else {
        loom_set_name(t, name);
    }
    return t;
}

/* Points t at the device's phantom buffer (shape kept; no storage behind it). */
static void place(loom_tensor *t, loom_buffer_t buf) {
    t->buffer = buf;
    t->data = loom_buffer_base(buf);
}

static void model_init(model *m, loom_backend_t *be) {
    memset(m, 0, sizeof(*m));
    loom_ctx_params p = {.mem_size = 16 * N_LAYER * loom_tensor_overhead() + 65536,
                         .no_alloc = true};
    m->wctx = loom_ctx_new(p);
    if (!m->wctx) die("weights context");
    for (int d = 0; d < 3; d++) {
        m->phantom[d] = loom_buft_alloc_buffer(loom_backend_default_buft(be[d]), 4096);
        if (!m->phantom[d]) die("phantom buffer");
        loom_buffer_set_usage(m->phantom[d], LOOM_BUFFER_USAGE_WEIGHTS);
    }
    m->tok_embd = w2d(m->wctx, "token_embd.weight", -1, LOOM_TYPE_Q4_0, D, N_VOCAB);
    place(m->tok_embd, m->phantom[2]);
    m->out_norm = w2d(m->wctx, "output_norm.weight", -1, LOOM_TYPE_F32, D, 0);
    m->out = w2d(m->wctx, "output.weight", -1, LOOM_TYPE_Q4_0, D, N_VOCAB);
    place(m->out_norm, m->phantom[1]);
    place(m->out, m->phantom[1]);
    for (int d = 0; d < 2; d++) {
        loom_ctx_params kp = {.mem_size = 4 * N_LAYER * loom_tensor_overhead() + 4096,
                              .no_alloc = true};
        m->kvctx[d] = loom_ctx_new(kp);
        if (!m->kvctx[d]) die("kv context");
    }
    for (int il = 0; il < N_LAYER; il++) {
        layer *l = &m->l[il];
        int dev = il < N_LAYER / 2 ? 0 : 1;
        l->attn_norm = w2d(m->wctx, "attn_norm.weight", il, LOOM_TYPE_F32, D, 0);
        l->wq = w2d(m->wctx, "attn_q.weight", il, LOOM_TYPE_Q4_0, D, D);
        l->wk = w2d(m->wctx, "attn_k.weight", il, LOOM_TYPE_Q4_0, D, D);
        l->wv = w2d(m->wctx, "attn_v.weight", il, LOOM_TYPE_Q4_0, D, D);
        l->wo = w2d(m->wctx, "attn_output.weight", il, LOOM_TYPE_Q4_0, D, D);
        l->ffn_norm = w2d(m->wctx, "ffn_norm.weight", il, LOOM_TYPE_F32, D, 0);
        l->w1 = w2d(m->wctx, "ffn_gate.weight", il, LOOM_TYPE_Q4_0, D, N_FF);
        l->w3 = w2d(m->wctx, "ffn_up.weight", il, LOOM_TYPE_Q4_0, D, N_FF);
        l->w2 = w2d(m->wctx, "ffn_down.weight", il, LOOM_TYPE_Q4_0, N_FF, D);
        loom_tensor *ws[] = {l->attn_norm, l->wq, l->wk, l->wv, l->wo,
                             l->ffn_norm,  l->w1, l->w2, l->w3};
        for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++)
            place(ws[k], m->phantom[dev]);
        l->k_cache = w2d(m->kvctx[dev], "cache_k", il, LOOM_TYPE_F16, D, N_CTX);
        l->v_cache = w2d(m->kvctx[dev], "cache_v", il, LOOM_TYPE_F16, D, N_CTX);
    }
    for (int d = 0; d < 2; d++) {
        m->kvbuf[d] = loom_alloc_ctx_tensors(m->kvctx[d], loom_backend_default_buft(be[d]));
        if (!m->kvbuf[d]) die("kv cache");
    }
}

static void model_free(model *m) {
    for (int d = 0; d < 2; d++) {
        loom_buffer_free(m->kvbuf[d]);
        loom_ctx_free(m->kvctx[d]);
    }
    for (int d = 0; d < 3; d++)
        loom_buffer_free(m->phantom[d]);
    loom_ctx_free(m->wctx);
}

/* The forward graph for T tokens attending to N_CTX cache slots. */
static loom_graph *build(loom_ctx *ctx, const model *m, int T) {
    loom_tensor *tokens = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, T);
    loom_tensor *pos = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, T);
    loom_tensor *slots = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, T);
    loom_tensor *mask = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, N_CTX, T);
    loom_set_name(tokens, "inp_tokens");
    loom_set_name(pos, "inp_pos");
    loom_set_name(slots, "kv_slots");
    loom_set_name(mask, "kq_mask");
    loom_set_input(tokens);
    loom_set_input(pos);
    loom_set_input(slots);
    loom_set_input(mask);
    loom_tensor *x = loom_get_rows(ctx, m->tok_embd, tokens);
    for (int il = 0; il < N_LAYER; il++) {
        const layer *l = &m->l[il];
        loom_tensor *h = loom_mul(ctx, loom_rms_norm(ctx, x, 1e-5f), l->attn_norm);
        loom_tensor *q = loom_reshape_3d(ctx, loom_mul_mat(ctx, l->wq, h), HD, N_HEAD, T);
        loom_tensor *k = loom_reshape_3d(ctx, loom_mul_mat(ctx, l->wk, h), HD, N_HEAD, T);
        loom_tensor *v = loom_mul_mat(ctx, l->wv, h);
        q = loom_rope_ext(ctx, q, pos, NULL, HD, LOOM_ROPE_TYPE_NORMAL, 10000.0f, 1.0f);
        k = loom_rope_ext(ctx, k, pos, NULL, HD, LOOM_ROPE_TYPE_NORMAL, 10000.0f, 1.0f);
        loom_tensor *ks = loom_set_rows(ctx, l->k_cache, loom_reshape_2d(ctx, k, D, T), slots);
        loom_tensor *vs = loom_set_rows(ctx, l->v_cache, v, slots);
        size_t row = l->k_cache->nb[1], head = (size_t)HD * loom_type_size(LOOM_TYPE_F16);
        loom_tensor *kv = loom_view_3d(ctx, ks, HD, N_CTX, N_HEAD, row, head, 0);
        loom_tensor *vv = loom_view_3d(ctx, vs, HD, N_CTX, N_HEAD, row, head, 0);
        loom_tensor *a = loom_flash_attn_ext(ctx, loom_permute(ctx, q, 0, 2, 1, 3), kv, vv, mask,
                                             NULL, 0.088f, 0.0f, 0.0f);
        a = loom_mul_mat(ctx, l->wo, loom_reshape_2d(ctx, a, D, T));
        x = loom_add(ctx, x, a);
        loom_tensor *f = loom_mul(ctx, loom_rms_norm(ctx, x, 1e-5f), l->ffn_norm);
        loom_tensor *g =
            loom_swiglu_split(ctx, loom_mul_mat(ctx, l->w1, f), loom_mul_mat(ctx, l->w3, f));
        x = loom_add(ctx, x, loom_mul_mat(ctx, l->w2, g));
    }
    loom_tensor *out =
        loom_mul_mat(ctx, m->out, loom_mul(ctx, loom_rms_norm(ctx, x, 1e-5f), m->out_norm));
    if (!out) die("building the graph");
    loom_set_output(out);
    loom_graph *g = loom_graph_new(ctx, 4096);
    if (!g || loom_graph_build_forward(g, out) != LOOM_OK) die("graph");
    return g;
}

/* CPU time of this thread: unlike wall time, not inflated when the machine is busy. */
static int64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void run(loom_sched *s, const model *m, int T, int rounds, const char *label) {
    int64_t *t_split = malloc((size_t)rounds * sizeof(int64_t));
    int64_t *t_alloc = malloc((size_t)rounds * sizeof(int64_t));
    int64_t *c_split = malloc((size_t)rounds * sizeof(int64_t));
    int64_t *c_alloc = malloc((size_t)rounds * sizeof(int64_t));
    loom_ctx_params p = {.mem_size = 8192 * loom_tensor_overhead() + loom_graph_overhead(4096),
                         .no_alloc = true};
    int n_nodes = 0;
    loom_sched_stats st;
    for (int r = 0; r < rounds; r++) {
        /* split alone, then split + allocate, each on a fresh graph */
        loom_ctx *ctx = loom_ctx_new(p);
        loom_graph *g = build(ctx, m, T);
        n_nodes = g->n_nodes;
        loom_sched_reset(s);
        int64_t c0 = cpu_ns(), t0 = loom_time_ns();
        if (loom_sched_split_graph(s, g) != LOOM_OK) die("split");
        t_split[r] = loom_time_ns() - t0;
        c_split[r] = cpu_ns() - c0;
        loom_ctx_free(ctx);

        ctx = loom_ctx_new(p);
        g = build(ctx, m, T);
        c0 = cpu_ns();
        t0 = loom_time_ns();
        loom_sched_reset(s);
        if (loom_sched_alloc_graph(s, g) != LOOM_OK) die("alloc");
        t_alloc[r] = loom_time_ns() - t0;
        c_alloc[r] = cpu_ns() - c0;
        loom_sched_get_stats(s, &st);
        loom_sched_reset(s);
        loom_ctx_free(ctx);
    }
    int64_t *all[4] = {t_split, t_alloc, c_split, c_alloc};
    for (int k = 0; k < 4; k++)
        qsort(all[k], (size_t)rounds, sizeof(int64_t), cmp_i64);
    printf("%-22s T=%-4d graph nodes = %d / graph splits = %d, inputs = %d, reallocs = %d\n", label,
           T, n_nodes, st.n_splits, st.n_inputs, st.n_reallocs);
    const char *what[2] = {"split only      ", "split + allocate"};
    for (int k = 0; k < 2; k++) {
        double wall = all[k][rounds / 2] / 1e3, cpu = all[k + 2][rounds / 2] / 1e3;
        printf("  %s  wall %7.1f us/graph %6.1f us/1000 nodes | cpu %7.1f us/graph %6.1f "
               "us/1000 nodes (min %.1f)\n",
               what[k], wall, wall * 1000.0 / n_nodes, cpu, cpu * 1000.0 / n_nodes,
               all[k + 2][0] / 1e3);
    }
    for (int k = 0; k < 4; k++)
        free(all[k]);
}

int main(int argc, char **argv) {
    int rounds = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) {
            rounds = 20; /* CI: keeps the code path alive, figures are indicative only */
        } else if (atoi(argv[i]) > 0) {
            rounds = atoi(argv[i]);
        } else {
            fprintf(stderr, "usage: sched_bench [--small | ROUNDS]\n");
            return 2;
        }
    }
    if (rounds < 1) rounds = 1;
    loom_reg_t reg;
    if (loom_sim_reg_new_from_spec("sim:2,mem=64GiB", &reg) != LOOM_OK) die("sim");
    loom_backend_t be[3] = {loom_dev_init(loom_reg_dev_get(reg, 0), NULL),
                            loom_dev_init(loom_reg_dev_get(reg, 1), NULL), loom_cpu_backend_new(1)};
    if (!be[0] || !be[1] || !be[2]) die("backends");
    model m;
    model_init(&m, be);
    loom_sched *s = loom_sched_new(be, NULL, 3, 4096, false, false);
    if (!s) die("sched");

    loom_ctx_params p = {.mem_size = 8192 * loom_tensor_overhead() + loom_graph_overhead(4096),
                         .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(p);
    int64_t t0 = loom_time_ns();
    if (loom_sched_reserve(s, build(ctx, &m, 512)) != LOOM_OK) die("reserve");
    printf("sched_bench: 7B-shaped llama, %d layers, [SIM0, SIM1, CPU]\n", N_LAYER);
    printf(
        "reserve (T=512): %.1f ms; compute buffers: SIM0 %.1f MiB, SIM1 %.1f MiB, CPU %.1f MiB\n",
        (loom_time_ns() - t0) / 1e6, loom_sched_get_buffer_size(s, be[0]) / 1048576.0,
        loom_sched_get_buffer_size(s, be[1]) / 1048576.0,
        loom_sched_get_buffer_size(s, be[2]) / 1048576.0);
    loom_ctx_free(ctx);

    run(s, &m, 512, rounds, "prompt (reserved)");
    run(s, &m, 1, rounds, "generation (reserved)");

    loom_sched_free(s);
    model_free(&m);
    for (int i = 0; i < 3; i++)
        loom_backend_free(be[i]);
    loom_sim_reg_free(reg);
    return 0;
}
