/*
 * Whole transformer blocks through the rule table: a llama block (RMS norm, q/k/v column
 * parallel, rope, KV-cache writes, flash attention with GQA, output row parallel, residual,
 * FFN up/gate column parallel, SwiGLU, down row parallel, residual), the same with
 * soft_max + mask attention, a fused QKV weight, Q4_0 FFN weights and a MoE FFN. The
 * expected state of every node is written down from the tensor-parallel plan (which heads
 * and FFN columns each device owns), and exactly the row-parallel outputs are PARTIAL.
 */
#include "tests/splitstate/split_test_util.h"

#define F32 LOOM_TYPE_F32
#define I32 LOOM_TYPE_I32
#define M(n) st_kind(LOOM_SPLIT_MIRRORED, n)
#define P(n) st_kind(LOOM_SPLIT_PARTIAL, n)

typedef struct plan {
    int n;             /* devices */
    int64_t D, H, Hkv; /* head dim, query heads, KV heads */
    int64_t n_ff, T, n_kv;
    int64_t ff_gran;                     /* FFN granularity */
    int rotation;                        /* the layer's rotation */
    int64_t kvh[LOOM_SPLIT_MAX_DEVICES]; /* KV heads per device */
    int64_t qh[LOOM_SPLIT_MAX_DEVICES];  /* query heads per device */
    int64_t ff[LOOM_SPLIT_MAX_DEVICES];  /* FFN columns per device */
} plan;

/* The plan, computed here from first principles (not with the library's helpers): the
 * remainder units go to devices rotation, rotation+1, ...; query heads follow KV heads. */
static void make_plan(plan *p) {
    const int n = p->n;
    const int64_t units_ff = p->n_ff / p->ff_gran;
    for (int j = 0; j < n; j++) {
        int k = (j - p->rotation + n) % n; /* j's rank in rotated order */
        p->kvh[j] = p->Hkv / n + (k < p->Hkv % n ? 1 : 0);
        p->qh[j] = p->kvh[j] * (p->H / p->Hkv);
        p->ff[j] = (units_ff / n + (k < units_ff % n ? 1 : 0)) * p->ff_gran;
    }
}

static loom_split_state scaled(int axis, int n, const int64_t *c, int64_t mul) {
    int64_t x[LOOM_SPLIT_MAX_DEVICES];
    for (int j = 0; j < n; j++)
        x[j] = c[j] * mul;
    return st_ax_arr(axis, n, x);
}

typedef struct expect {
    const loom_tensor *t;
    loom_split_state s;
} expect;

typedef struct block {
    expect e[64];
    int n_e;
    loom_tensor *out;
} block;

static loom_tensor *node(block *b, loom_tensor *t, const char *name, loom_split_state s) {
    if (!t) return NULL;
    loom_set_name(t, name);
    b->e[b->n_e].t = t;
    b->e[b->n_e].s = s;
    b->n_e++;
    return t;
}

/* Builds the block over the plan; every node's expected state is recorded with it. */
static bool build_llama(fixture *f, const plan *p, bool use_fa, block *b) {
    const int n = p->n;
    const int64_t D = p->D, H = p->H, Hkv = p->Hkv, E = D * H, Ekv = D * Hkv, T = p->T;
    memset(b, 0, sizeof *b);
    const loom_split_state q_rows = scaled(0, n, p->qh, D), kv_rows = scaled(0, n, p->kvh, D);
    const loom_split_state q_heads1 = scaled(1, n, p->qh, 1), kv_heads1 = scaled(1, n, p->kvh, 1);
    const loom_split_state q_heads2 = scaled(2, n, p->qh, 1), kv_heads2 = scaled(2, n, p->kvh, 1);
    const loom_split_state ff_rows = scaled(0, n, p->ff, 1);

    loom_tensor *inp = leaf_t(f, "inp_embd", F32, M(n), E, T, 1, 1);
    loom_tensor *pos = leaf_t(f, "inp_pos", I32, M(n), T, 1, 1, 1);
    loom_tensor *idx = leaf_t(f, "kv_idxs", I32, M(n), T, 1, 1, 1);
    loom_tensor *mask = leaf_t(f, "kq_mask", F32, M(n), p->n_kv, T, 1, 1);
    loom_tensor *attn_nw = leaf_t(f, "blk.1.attn_norm.weight", F32, M(n), E, 1, 1, 1);
    loom_tensor *wq = leaf_t(f, "blk.1.attn_q.weight", F32, scaled(1, n, p->qh, D), E, E, 1, 1);
    loom_tensor *wk = leaf_t(f, "blk.1.attn_k.weight", F32, scaled(1, n, p->kvh, D), E, Ekv, 1, 1);
    loom_tensor *wv = leaf_t(f, "blk.1.attn_v.weight", F32, scaled(1, n, p->kvh, D), E, Ekv, 1, 1);
    loom_tensor *wo = leaf_t(f, "blk.1.attn_output.weight", F32, q_rows, E, E, 1, 1);
    loom_tensor *ck = leaf_t(f, "cache_k_l1", F32, kv_rows, Ekv, p->n_kv, 1, 1);
    loom_tensor *cv = leaf_t(f, "cache_v_l1", F32, kv_rows, Ekv, p->n_kv, 1, 1);
    loom_tensor *ffn_nw = leaf_t(f, "blk.1.ffn_norm.weight", F32, M(n), E, 1, 1, 1);
    loom_tensor *wup =
        leaf_t(f, "blk.1.ffn_up.weight", F32, scaled(1, n, p->ff, 1), E, p->n_ff, 1, 1);
    loom_tensor *wgate =
        leaf_t(f, "blk.1.ffn_gate.weight", F32, scaled(1, n, p->ff, 1), E, p->n_ff, 1, 1);
    loom_tensor *wdown = leaf_t(f, "blk.1.ffn_down.weight", F32, ff_rows, p->n_ff, E, 1, 1);

    loom_ctx *c = f->ctx;
    loom_tensor *cur = node(b, loom_rms_norm(c, inp, 1e-5f), "attn_norm-1", M(n));
    cur = node(b, loom_mul(c, cur, attn_nw), "attn_normed-1", M(n));
    loom_tensor *q = node(b, loom_mul_mat(c, wq, cur), "Qcur-1", q_rows);
    loom_tensor *k = node(b, loom_mul_mat(c, wk, cur), "Kcur-1", kv_rows);
    loom_tensor *v = node(b, loom_mul_mat(c, wv, cur), "Vcur-1", kv_rows);
    q = node(b, loom_reshape_3d(c, q, D, H, T), "Qcur3-1", q_heads1);
    k = node(b, loom_reshape_3d(c, k, D, Hkv, T), "Kcur3-1", kv_heads1);
    q = node(b, loom_rope_ext(c, q, pos, NULL, (int)D, LOOM_ROPE_TYPE_NEOX, 1e4f, 1.0f), "Qrope-1",
             q_heads1);
    k = node(b, loom_rope_ext(c, k, pos, NULL, (int)D, LOOM_ROPE_TYPE_NEOX, 1e4f, 1.0f), "Krope-1",
             kv_heads1);
    loom_tensor *k2 = node(b, loom_reshape_2d(c, k, Ekv, T), "Kstore-1", kv_rows);
    loom_tensor *ks = node(b, loom_set_rows(c, ck, k2, idx), "k_stored-1", kv_rows);
    loom_tensor *vs = node(b, loom_set_rows(c, cv, v, idx), "v_stored-1", kv_rows);
    loom_tensor *kview =
        node(b, loom_view_3d(c, ks, D, Hkv, p->n_kv, D * sizeof(float), ck->nb[1], 0), "k_view-1",
             kv_heads1);
    loom_tensor *vview =
        node(b, loom_view_3d(c, vs, D, Hkv, p->n_kv, D * sizeof(float), cv->nb[1], 0), "v_view-1",
             kv_heads1);
    loom_tensor *qp = node(b, loom_permute(c, q, 0, 2, 1, 3), "q_perm-1", q_heads2);
    loom_tensor *kp = node(b, loom_permute(c, kview, 0, 2, 1, 3), "k_perm-1", kv_heads2);
    loom_tensor *vp = node(b, loom_permute(c, vview, 0, 2, 1, 3), "v_perm-1", kv_heads2);
    loom_tensor *attn;
    if (use_fa) {
        loom_tensor *fa = node(b, loom_flash_attn_ext(c, qp, kp, vp, mask, NULL, 0.35f, 0, 0),
                               "fattn-1", q_heads1); /* [Dv, H, T]: heads on axis 1 */
        attn = node(b, loom_reshape_2d(c, fa, E, T), "attn_2d-1", q_rows);
    } else {
        loom_tensor *kq = node(b, loom_mul_mat(c, kp, qp), "kq-1", q_heads2); /* [n_kv, T, H] */
        kq = node(b, loom_soft_max_ext(c, kq, mask, NULL, 0.35f, 0.0f), "kq_soft_max-1", q_heads2);
        loom_tensor *vt = node(b, loom_transpose(c, vp), "v_t-1", kv_heads2); /* [n_kv, D, Hkv] */
        vt = node(b, loom_cont(c, vt), "v_t_cont-1", kv_heads2);
        loom_tensor *kqv = node(b, loom_mul_mat(c, vt, kq), "kqv-1", q_heads2); /* [D, T, H] */
        kqv = node(b, loom_permute(c, kqv, 0, 2, 1, 3), "kqv_perm-1", q_heads1);
        attn = node(b, loom_cont_4d(c, kqv, E, T, 1, 1), "kqv_out-1", q_rows);
    }
    loom_tensor *o = node(b, loom_mul_mat(c, wo, attn), "attn_out-1", P(n));
    loom_tensor *res = node(b, loom_add(c, o, inp), "ffn_inp-1", M(n));
    cur = node(b, loom_rms_norm(c, res, 1e-5f), "ffn_norm-1", M(n));
    cur = node(b, loom_mul(c, cur, ffn_nw), "ffn_normed-1", M(n));
    loom_tensor *up = node(b, loom_mul_mat(c, wup, cur), "ffn_up-1", ff_rows);
    loom_tensor *gate = node(b, loom_mul_mat(c, wgate, cur), "ffn_gate-1", ff_rows);
    loom_tensor *act = node(b, loom_swiglu_split(c, gate, up), "ffn_swiglu-1", ff_rows);
    loom_tensor *down = node(b, loom_mul_mat(c, wdown, act), "ffn_down-1", P(n));
    b->out = node(b, loom_add(c, down, res), "l_out-1", M(n));
    return b->out != NULL;
}

/* Derives every node of the graph of b->out; checks each against its expectation (every
 * node must have one) and returns the number of PARTIAL nodes. */
static int check_block(fixture *f, block *b) {
    loom_graph *g = loom_graph_new(f->ctx, 256);
    if (!g || loom_graph_build_forward(g, b->out) != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "graph: %s", loom_last_error());
        return -1;
    }
    int partial = 0, checked = 0;
    loom_split_ctx_begin(f->sc);
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        const expect *e = NULL;
        for (int k = 0; k < b->n_e; k++)
            if (b->e[k].t == t) e = &b->e[k];
        LOOM_CHECK_MSG(e != NULL, "node '%s' has no expectation", t->name);
        loom_split_state s;
        loom_status st = loom_split_ctx_get(f->sc, t, false, &s);
        LOOM_CHECK_MSG(st == LOOM_OK, "node '%s': %s", t->name, loom_last_error());
        if (st != LOOM_OK || !e) continue;
        LOOM_CHECK_MSG(loom_split_state_equal(&s, &e->s), "node '%s' (%s): %s, expected %s",
                       t->name, loom_op_name(t->op), st_str(&s), st_str(&e->s));
        LOOM_CHECK_MSG(loom_split_ctx_can_split(f->sc, t), "can_split '%s': %s", t->name,
                       loom_last_error());
        if (s.axis == LOOM_SPLIT_PARTIAL) partial++;
        checked++;
    }
    loom_split_ctx_end(f->sc);
    LOOM_CHECK_EQ_INT(checked, b->n_e);
    return partial;
}

LOOM_TEST(splitllama, block_flash_attn_gqa_fewer_kv_heads_than_devices) {
    /* 4 devices, 6 query heads over 2 KV heads: devices 0 and 3 hold no heads at all;
     * n_ff 44 in units of 4 over 4 devices is uneven, and layer 1 rotates the remainder */
    plan p = {.n = 4,
              .D = 8,
              .H = 6,
              .Hkv = 2,
              .n_ff = 44,
              .T = 5,
              .n_kv = 8,
              .ff_gran = 4,
              .rotation = 1};
    make_plan(&p);
    LOOM_CHECK(p.kvh[0] == 0 && p.kvh[1] == 1 && p.kvh[2] == 1 && p.kvh[3] == 0);
    LOOM_CHECK(p.ff[0] == 8 && p.ff[1] == 12 && p.ff[2] == 12 && p.ff[3] == 12);
    fixture f;
    LOOM_REQUIRE(fx_init(&f, p.n));
    block b;
    LOOM_REQUIRE(build_llama(&f, &p, true, &b));
    LOOM_CHECK_EQ_INT(check_block(&f, &b), 2); /* attn_out and ffn_down */
    fx_free(&f);
}

LOOM_TEST(splitllama, block_soft_max_with_mask) {
    for (int n = 1; n <= 8; n++) {
        plan p = {.n = n,
                  .D = 4,
                  .H = 8,
                  .Hkv = 4,
                  .n_ff = 24,
                  .T = 3,
                  .n_kv = 6,
                  .ff_gran = 1,
                  .rotation = 0};
        make_plan(&p);
        fixture f;
        LOOM_REQUIRE(fx_init(&f, p.n));
        block b;
        LOOM_REQUIRE(build_llama(&f, &p, false, &b));
        LOOM_CHECK_EQ_INT(check_block(&f, &b), 2);
        block b2; /* and the flash-attention path at the same sizes */
        fixture f2;
        LOOM_REQUIRE(fx_init(&f2, p.n));
        LOOM_REQUIRE(build_llama(&f2, &p, true, &b2));
        LOOM_CHECK_EQ_INT(check_block(&f2, &b2), 2);
        fx_free(&f2);
        fx_free(&f);
    }
}

LOOM_TEST(splitllama, fused_qkv_weight) {
    /* wqkv [n_embd 16, q 16 + k 8 + v 8] split per part; views pick each part per device */
    const int n = 2;
    const int64_t D = 4, H = 4, Hkv = 2, E = 16, Ekv = 8, T = 3;
    fixture f;
    LOOM_REQUIRE(fx_init(&f, n));
    loom_split_state sw;
    loom_split_state_init(&sw, LOOM_SPLIT_AXIS_1, n);
    ST_ADD(&sw, 1, 8, 8);
    ST_ADD(&sw, 1, 4, 4);
    ST_ADD(&sw, 1, 4, 4);
    loom_tensor *x = leaf_t(&f, "x", F32, M(n), E, T, 1, 1);
    loom_tensor *wqkv = leaf_t(&f, "blk.0.attn_qkv.weight", F32, sw, E, E + 2 * Ekv, 1, 1);
    loom_tensor *mask = leaf_t(&f, "mask", F32, M(n), T, T, 1, 1);
    loom_tensor *qkv = named(loom_mul_mat(f.ctx, wqkv, x), "qkv");
    loom_split_state want = sw;
    want.axis = LOOM_SPLIT_AXIS_0;
    CHECK_DERIVED(&f, qkv, want);
    const size_t es = sizeof(float);
    loom_tensor *q = loom_view_3d(f.ctx, qkv, D, H, T, D * es, qkv->nb[1], 0);
    loom_tensor *k = loom_view_3d(f.ctx, qkv, D, Hkv, T, D * es, qkv->nb[1], E * es);
    loom_tensor *v = loom_view_3d(f.ctx, qkv, D, Hkv, T, D * es, qkv->nb[1], (E + Ekv) * es);
    CHECK_DERIVED(&f, q, ST_AX(1, n, 2, 2));
    CHECK_DERIVED(&f, k, ST_AX(1, n, 1, 1));
    CHECK_DERIVED(&f, v, ST_AX(1, n, 1, 1));
    loom_tensor *fa = loom_flash_attn_ext(
        f.ctx, loom_permute(f.ctx, q, 0, 2, 1, 3), loom_permute(f.ctx, k, 0, 2, 1, 3),
        loom_permute(f.ctx, v, 0, 2, 1, 3), mask, NULL, 0.5f, 0, 0);
    CHECK_DERIVED(&f, fa, ST_AX(1, n, 2, 2));
    /* a fused weight split as one even segment puts all of q on device 0: refused at the
     * views, with the reason */
    fixture g;
    LOOM_REQUIRE(fx_init(&g, n));
    loom_tensor *x2 = leaf_t(&g, "x", F32, M(n), E, T, 1, 1);
    loom_tensor *w2 = leaf_t(&g, "wqkv_even", F32, ST_AX(1, n, 16, 16), E, E + 2 * Ekv, 1, 1);
    loom_tensor *qkv2 = loom_mul_mat(g.ctx, w2, x2);
    loom_tensor *q2 = named(loom_view_3d(g.ctx, qkv2, D, H, T, D * es, qkv2->nb[1], 0), "q_view");
    CHECK_DERIVED(&g, q2, ST_AX(1, n, 4, 0)); /* legal, but device 1 has no q heads */
    loom_tensor *k2 = loom_view_3d(g.ctx, qkv2, D, Hkv, T, D * es, qkv2->nb[1], E * es);
    CHECK_DERIVED(&g, k2, ST_AX(1, n, 0, 2));
    loom_tensor *fa2 =
        named(loom_flash_attn_ext(g.ctx, loom_permute(g.ctx, q2, 0, 2, 1, 3),
                                  loom_permute(g.ctx, k2, 0, 2, 1, 3),
                                  loom_permute(g.ctx, k2, 0, 2, 1, 3), NULL, NULL, 0.5f, 0, 0),
              "fa_even");
    CHECK_REFUSED(&g, fa2, "split the heads inconsistently");
    fx_free(&g);
    fx_free(&f);
}

LOOM_TEST(splitllama, q4_0_ffn_splits_at_block_boundaries) {
    const int n = 2;
    const int64_t E = 64, n_ff = 96, T = 2;
    fixture f;
    LOOM_REQUIRE(fx_init(&f, n));
    loom_split_state ff;
    LOOM_REQUIRE(loom_split_state_even(&ff, LOOM_SPLIT_AXIS_0, n, n_ff, 32, 0) == LOOM_OK);
    LOOM_CHECK(ff.ne[0][0] == 64 && ff.ne[0][1] == 32);
    loom_split_state ff1 = ff;
    ff1.axis = LOOM_SPLIT_AXIS_1;
    loom_tensor *x = leaf_t(&f, "x", F32, M(n), E, T, 1, 1);
    loom_tensor *up = leaf_t(&f, "ffn_up", LOOM_TYPE_Q4_0, ff1, E, n_ff, 1, 1);
    loom_tensor *down = leaf_t(&f, "ffn_down", LOOM_TYPE_Q4_0, ff, n_ff, E, 1, 1);
    loom_tensor *h = loom_relu(f.ctx, loom_mul_mat(f.ctx, up, x));
    CHECK_DERIVED(&f, h, ff);
    loom_tensor *o = named(loom_mul_mat(f.ctx, down, h), "ffn_out");
    CHECK_DERIVED(&f, o, P(n));
    /* the same FFN split at 48 columns: the Q4_0 down weight's rows cannot be cut there */
    leaf_set(&f.lt, "ffn_up", ST_AX(1, n, 48, 48));
    leaf_set(&f.lt, "ffn_down", ST_AX(0, n, 48, 48));
    loom_split_ctx_clear(f.sc);
    loom_split_state s;
    LOOM_CHECK_EQ_INT(loom_split_ctx_get(f.sc, o, false, &s), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "split state AXIS_0 [48,48] of 'ffn_down': device "
                                               "0 gets 48 elements, but a q4_0 row splits only at "
                                               "32-element block boundaries");
    fx_free(&f);
}

LOOM_TEST(splitllama, moe_block) {
    /* router (mirrored) -> top-k -> experts: up/gate split on rows with expert biases,
     * SwiGLU, down split on K -> one PARTIAL; weighting and the expert sum run mirrored */
    const int n = 2;
    const int64_t E = 8, X = 4, K = 2, F = 6, T = 3;
    fixture f;
    LOOM_REQUIRE(fx_init(&f, n));
    const loom_split_state rows = ST_AX(0, n, 4, 2);
    loom_split_state rows1 = rows;
    rows1.axis = LOOM_SPLIT_AXIS_1;
    loom_tensor *x = leaf_t(&f, "x", F32, M(n), E, T, 1, 1);
    loom_tensor *router = leaf_t(&f, "ffn_gate_inp", F32, M(n), E, X, 1, 1);
    loom_tensor *up = leaf_t(&f, "ffn_up_exps", F32, rows1, E, F, X, 1);
    loom_tensor *up_b = leaf_t(&f, "ffn_up_exps.bias", F32, rows, F, X, 1, 1);
    loom_tensor *gate = leaf_t(&f, "ffn_gate_exps", F32, rows1, E, F, X, 1);
    loom_tensor *down = leaf_t(&f, "ffn_down_exps", F32, rows, F, E, X, 1);
    block b;
    memset(&b, 0, sizeof b);
    loom_ctx *c = f.ctx;
    loom_tensor *logits = node(&b, loom_mul_mat(c, router, x), "logits", M(n));
    loom_tensor *probs = node(&b, loom_soft_max(c, logits), "probs", M(n));
    loom_tensor *sel = node(&b, loom_top_k(c, probs, (int)K), "selected", M(n));
    loom_tensor *p3 = node(&b, loom_reshape_3d(c, probs, 1, X, T), "probs3", M(n));
    loom_tensor *wts = node(&b, loom_get_rows(c, p3, sel), "weights", M(n));
    loom_tensor *x3 = node(&b, loom_reshape_3d(c, x, E, 1, T), "x3", M(n));
    loom_tensor *hu = node(&b, loom_mul_mat_id(c, up, x3, sel), "up", rows);
    hu = node(&b, loom_add_id(c, hu, up_b, sel), "up_biased", rows);
    loom_tensor *hg = node(&b, loom_mul_mat_id(c, gate, x3, sel), "gate", rows);
    loom_tensor *act = node(&b, loom_swiglu_split(c, hg, hu), "act", rows);
    loom_tensor *out = node(&b, loom_mul_mat_id(c, down, act, sel), "experts_out", P(n));
    out = node(&b, loom_mul(c, out, wts), "weighted", M(n));
    loom_tensor *sum = node(&b, loom_view_2d(c, out, E, T, out->nb[2], 0), "slot0", M(n));
    for (int64_t k = 1; k < K; k++) {
        loom_tensor *vk =
            node(&b, loom_view_2d(c, out, E, T, out->nb[2], (size_t)k * out->nb[1]), "slot1", M(n));
        sum = node(&b, loom_add(c, sum, vk), "moe_out", M(n));
    }
    b.out = sum;
    LOOM_CHECK_EQ_INT(check_block(&f, &b), 1);
    fx_free(&f);
}
