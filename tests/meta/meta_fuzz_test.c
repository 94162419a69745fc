/*
 * A differential fuzzer of the meta device (issue 29, item 7). Each case is a random
 * transformer-like graph (column- then row-parallel matmuls, GQA attention with flash
 * attention or soft_max + mask, rope, norms, GLU, MoE routing with expert biases and the
 * expert sum, MIRRORED and PARTIAL biases, residuals, views, permutes, concatenations,
 * SET_ROWS into a cache, GET_ROWS) over random shapes (sizes below N and not divisible by
 * it), on Meta(sim:N) for N = 1..8 with uneven and empty slices, random member refusals
 * (sim refuse=), every AllReduce algorithm, repeated evaluation and NaN-filled memory, alone
 * and under a scheduler over [Meta, CPU]; the CPU backend on the same graph is the oracle.
 *
 * Leaf states follow the rule tables' patterns ("rules" cases) or are drawn at random from
 * every state ("wild" cases). The verdicts:
 *   - a wrong output is always a failure;
 *   - on the meta backend alone an error is a clean refusal (counted);
 *   - under the scheduler a "rules" case must be exact (the scheduler falls back to the CPU
 *     for what the devices refuse); a "wild" case may be refused only with a message.
 * The seed list is fixed, plus LOOM_META_FUZZ_FRESH fresh seeds (default 500; 2,000 fixed) drawn
 * from the clock (or LOOM_META_FUZZ_SEED for one case); every failure prints its seed, so
 *   LOOM_META_FUZZ_SEED=<seed> bazel test //tests/meta:meta_fuzz_test
 * reproduces it, and each one found becomes a case of meta_round3_test.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/meta/meta_diff.h"
#include "tests/shim/loom_test.h"

/* ---------------------------------------------------------------- states */

/* Per-device counts of `units` units (each `unit` elements): even, weighted (uneven, some
 * devices empty) or all on one device. */
static void random_counts(md_builder *b, int64_t units, int64_t unit, int64_t *counts) {
    int n = b->n, kind = (int)md_rand_range(b, 0, 2);
    float w[LOOM_SPLIT_MAX_DEVICES];
    for (int j = 0; j < n; j++)
        w[j] = kind == 1 ? (float)md_rand_range(b, 0, 3) : 1.0f;
    if (kind == 2)
        for (int j = 0; j < n; j++)
            w[j] = j == (int)(md_rand(b) % (uint64_t)n) ? 1.0f : 0.0f;
    float sum = 0;
    for (int j = 0; j < n; j++)
        sum += w[j];
    if (sum == 0) w[0] = 1;
    int rot = (int)md_rand_range(b, 0, n - 1);
    if (loom_split_counts(units, 1, n, rot, kind == 0 ? NULL : w, counts) != LOOM_OK)
        for (int j = 0; j < n; j++)
            counts[j] = j == 0 ? units : 0;
    for (int j = 0; j < n; j++)
        counts[j] *= unit;
}

typedef struct fz {
    bool wild; /* leaf states drawn from everything, not the rule tables' patterns */
} fz;

static loom_split_state state_counts(md_builder *b, loom_split_axis axis, const int64_t *counts) {
    loom_split_state s;
    loom_split_state_init(&s, axis, b->n);
    if (loom_split_state_add_segment(&s, counts, 1) != LOOM_OK)
        loom_split_state_init(&s, LOOM_SPLIT_MIRRORED, b->n);
    return s;
}

/* A wild state for a tensor of shape ne: any axis (random counts), MIRRORED or PARTIAL. */
static loom_split_state wild_state(md_builder *b, const int64_t ne[4], bool partial_ok) {
    loom_split_state s;
    int pick = (int)md_rand_range(b, 0, 5);
    if (pick <= 1 || (pick == 2 && !partial_ok)) {
        loom_split_state_init(&s, LOOM_SPLIT_MIRRORED, b->n);
        return s;
    }
    if (pick == 2) {
        loom_split_state_init(&s, LOOM_SPLIT_PARTIAL, b->n);
        return s;
    }
    int axis = (int)md_rand_range(b, 0, 2);
    int64_t counts[LOOM_SPLIT_MAX_DEVICES];
    random_counts(b, ne[axis], 1, counts);
    return state_counts(b, (loom_split_axis)axis, counts);
}

/* An F32 leaf: state s in a rules case, a wild state in a wild case (1 in 3 leafs). */
static loom_tensor *leaf(md_builder *b, const fz *f, const char *name, int64_t ne0, int64_t ne1,
                         int64_t ne2, loom_split_state s) {
    const int64_t ne[4] = {ne0, ne1, ne2, 1};
    if (f->wild && md_rand_range(b, 0, 2) == 0) s = wild_state(b, ne, true);
    return md_leaf_new(b, name, LOOM_TYPE_F32, ne, &s, MD_FILL_FLOAT, 0);
}

static loom_split_state st(md_builder *b, loom_split_axis axis) {
    loom_split_state s;
    loom_split_state_init(&s, axis, b->n);
    return s;
}

/* ---------------------------------------------------------------- the graph */

#define CK(t, what) md_check(b, (t), (what))
#define NAME(buf, l, s) (snprintf((buf), sizeof(buf), "l%d.%s", (l), (s)), (buf))

typedef struct dims {
    int64_t D, T, hd, Hkv, G, F, E, U, Fe, V, n_ctx;
} dims;

static loom_tensor *bias_of(md_builder *b, const fz *f, loom_tensor *o, const char *name) {
    int kind = (int)md_rand_range(b, 0, 2);
    if (kind == 0 || !o) return o;
    loom_tensor *bias = leaf(b, f, name, o->ne[0], 1, 1,
                             st(b, kind == 1 ? LOOM_SPLIT_MIRRORED : LOOM_SPLIT_PARTIAL));
    return bias ? CK(loom_add(b->ctx, o, bias), name) : NULL;
}

static loom_tensor *attention(md_builder *b, const fz *f, const dims *d, int l, loom_tensor *h,
                              loom_tensor *pos) {
    char nm[64];
    const int64_t H = d->Hkv * d->G, hd = d->hd;
    int64_t kvc[LOOM_SPLIT_MAX_DEVICES], qc[LOOM_SPLIT_MAX_DEVICES], kc[LOOM_SPLIT_MAX_DEVICES];
    random_counts(b, d->Hkv, 1, kvc);
    for (int j = 0; j < b->n; j++) {
        qc[j] = kvc[j] * d->G * hd;
        kc[j] = kvc[j] * hd;
    }
    loom_tensor *wq =
        leaf(b, f, NAME(nm, l, "wq"), d->D, H * hd, 1, state_counts(b, LOOM_SPLIT_AXIS_1, qc));
    loom_tensor *wk =
        leaf(b, f, NAME(nm, l, "wk"), d->D, d->Hkv * hd, 1, state_counts(b, LOOM_SPLIT_AXIS_1, kc));
    loom_tensor *wv =
        leaf(b, f, NAME(nm, l, "wv"), d->D, d->Hkv * hd, 1, state_counts(b, LOOM_SPLIT_AXIS_1, kc));
    loom_tensor *wo =
        leaf(b, f, NAME(nm, l, "wo"), H * hd, d->D, 1, state_counts(b, LOOM_SPLIT_AXIS_0, qc));
    if (b->failed) return NULL;
    loom_tensor *q =
        CK(loom_reshape_3d(b->ctx, CK(loom_mul_mat(b->ctx, wq, h), "q"), hd, H, d->T), "q3");
    loom_tensor *k =
        CK(loom_reshape_3d(b->ctx, CK(loom_mul_mat(b->ctx, wk, h), "k"), hd, d->Hkv, d->T), "k3");
    loom_tensor *v =
        CK(loom_reshape_3d(b->ctx, CK(loom_mul_mat(b->ctx, wv, h), "v"), hd, d->Hkv, d->T), "v3");
    if (b->failed) return NULL;
    if (pos && hd % 2 == 0 && md_rand_range(b, 0, 1)) {
        q = CK(loom_rope_ext(b->ctx, q, pos, NULL, (int)hd, 0, 10000.0f, 1.0f), "rope q");
        k = CK(loom_rope_ext(b->ctx, k, pos, NULL, (int)hd, 0, 10000.0f, 1.0f), "rope k");
        if (b->failed) return NULL;
    }
    int64_t nkv = d->T;
    if (md_rand_range(b, 0, 1)) { /* through a cache: SET_ROWS, then read all of it */
        const int64_t ne_c[4] = {d->Hkv * hd, d->n_ctx, 1, 1}, ne_r[4] = {d->T, 1, 1, 1};
        loom_split_state cs = state_counts(b, LOOM_SPLIT_AXIS_0, kc);
        loom_tensor *kcache =
            md_leaf_new(b, NAME(nm, l, "kcache"), LOOM_TYPE_F32, ne_c, &cs, MD_FILL_FLOAT, 0);
        loom_tensor *vcache =
            md_leaf_new(b, NAME(nm, l, "vcache"), LOOM_TYPE_F32, ne_c, &cs, MD_FILL_FLOAT, 0);
        loom_tensor *rows =
            md_leaf_new(b, NAME(nm, l, "rows"), LOOM_TYPE_I32, ne_r, NULL, MD_FILL_ROWS, d->n_ctx);
        if (b->failed) return NULL;
        loom_tensor *kw =
            CK(loom_set_rows(
                   b->ctx, kcache,
                   CK(loom_reshape_2d(b->ctx, CK(loom_cont(b->ctx, k), "kc"), d->Hkv * hd, d->T),
                      "k2"),
                   rows),
               "set k");
        loom_tensor *vw =
            CK(loom_set_rows(b->ctx, vcache,
                             CK(loom_reshape_2d(b->ctx, v, d->Hkv * hd, d->T), "v2"), rows),
               "set v");
        if (b->failed) return NULL;
        k = CK(loom_reshape_3d(b->ctx, kw, hd, d->Hkv, d->n_ctx), "kall");
        v = CK(loom_reshape_3d(b->ctx, vw, hd, d->Hkv, d->n_ctx), "vall");
        nkv = d->n_ctx;
        if (b->failed) return NULL;
    }
    if (nkv == d->T && md_rand_range(b, 0, 2) == 0) {
        /* CPY of v into a leaf laid out as the rules would (split on heads), whole, or
         * following its writer (NONE), then read back through the copy */
        const int64_t ne_c[4] = {hd, d->Hkv, d->T, 1};
        int kind = (int)md_rand_range(b, 0, 2);
        loom_split_state cs;
        if (kind == 0) {
            cs = state_counts(b, LOOM_SPLIT_AXIS_1, kvc);
        } else {
            loom_split_state_init(&cs, kind == 1 ? LOOM_SPLIT_MIRRORED : LOOM_SPLIT_NONE, b->n);
        }
        loom_tensor *vc = md_leaf_new(b, NAME(nm, l, "vcopy"), LOOM_TYPE_F32, ne_c, &cs, MD_FILL_FLOAT, 0);
        if (b->failed) return NULL;
        v = CK(loom_cpy(b->ctx, CK(loom_cont(b->ctx, v), "vcont"), vc), "cpy v");
        if (b->failed) return NULL;
    }
    loom_tensor *mask = NULL;
    if (md_rand_range(b, 0, 1))
        mask = leaf(b, f, NAME(nm, l, "mask"), nkv, d->T, 1, st(b, LOOM_SPLIT_MIRRORED));
    loom_tensor *qp = CK(loom_permute(b->ctx, q, 0, 2, 1, 3), "qp"); /* [hd, T, H] */
    loom_tensor *kp = CK(loom_permute(b->ctx, k, 0, 2, 1, 3), "kp"); /* [hd, nkv, Hkv] */
    loom_tensor *vp = CK(loom_permute(b->ctx, v, 0, 2, 1, 3), "vp");
    if (b->failed) return NULL;
    const float scale = 0.5f;
    loom_tensor *attn;
    if (md_rand_range(b, 0, 1)) {
        attn = CK(loom_flash_attn_ext(b->ctx, qp, kp, vp, mask, NULL, scale, 0.0f, 0.0f),
                  "fa"); /* [hd, H, T] */
        if (attn) attn = CK(loom_reshape_2d(b->ctx, attn, hd * H, d->T), "fa2");
    } else {
        loom_tensor *kq = CK(loom_mul_mat(b->ctx, kp, qp), "kq"); /* [nkv, T, H] */
        if (kq) kq = CK(loom_soft_max_ext(b->ctx, kq, mask, NULL, scale, 0.0f), "softmax");
        loom_tensor *vt =
            CK(loom_cont(b->ctx, CK(loom_transpose(b->ctx, vp), "vt")), "vtc"); /* [nkv, hd, Hkv] */
        if (b->failed) return NULL;
        loom_tensor *kqv = CK(loom_mul_mat(b->ctx, vt, kq), "kqv"); /* [hd, T, H] */
        if (kqv)
            kqv = CK(loom_cont(b->ctx, CK(loom_permute(b->ctx, kqv, 0, 2, 1, 3), "kqvp")), "kqvc");
        attn = kqv ? CK(loom_reshape_2d(b->ctx, kqv, hd * H, d->T), "attn") : NULL;
    }
    if (!attn) return NULL;
    loom_tensor *o = CK(loom_mul_mat(b->ctx, wo, attn), "o");
    return bias_of(b, f, o, NAME(nm, l, "bo"));
}

static loom_tensor *ffn(md_builder *b, const fz *f, const dims *d, int l, loom_tensor *h) {
    char nm[64];
    int64_t fc[LOOM_SPLIT_MAX_DEVICES];
    random_counts(b, d->F, 1, fc);
    loom_tensor *wg =
        leaf(b, f, NAME(nm, l, "wg"), d->D, d->F, 1, state_counts(b, LOOM_SPLIT_AXIS_1, fc));
    loom_tensor *wu =
        leaf(b, f, NAME(nm, l, "wu"), d->D, d->F, 1, state_counts(b, LOOM_SPLIT_AXIS_1, fc));
    loom_tensor *wd =
        leaf(b, f, NAME(nm, l, "wd"), d->F, d->D, 1, state_counts(b, LOOM_SPLIT_AXIS_0, fc));
    if (b->failed) return NULL;
    loom_tensor *g = CK(loom_mul_mat(b->ctx, wg, h), "gate"),
                *u = CK(loom_mul_mat(b->ctx, wu, h), "up");
    if (b->failed) return NULL;
    loom_tensor *a;
    switch (md_rand_range(b, 0, 2)) {
    case 0:
        a = CK(loom_swiglu_split(b->ctx, g, u), "swiglu");
        break;
    case 1:
        a = CK(loom_mul(b->ctx, CK(loom_gelu(b->ctx, g), "gelu"), u), "gelu*up");
        break;
    default:
        a = CK(loom_relu(b->ctx, g), "relu");
        break;
    }
    if (!a) return NULL;
    loom_tensor *o = CK(loom_mul_mat(b->ctx, wd, a), "down");
    o = bias_of(b, f, o, NAME(nm, l, "bd"));
    if (o && md_rand_range(b, 0, 2) == 0) { /* a product with a mirrored gate */
        loom_tensor *gate =
            leaf(b, f, NAME(nm, l, "gmul"), d->D, d->T, 1, st(b, LOOM_SPLIT_MIRRORED));
        o = gate ? CK(loom_mul(b->ctx, o, gate), "o*gate") : NULL;
    }
    return o;
}

static loom_tensor *moe(md_builder *b, const fz *f, const dims *d, int l, loom_tensor *h) {
    char nm[64];
    int64_t ec[LOOM_SPLIT_MAX_DEVICES];
    random_counts(b, d->Fe, 1, ec);
    loom_tensor *wr = leaf(b, f, NAME(nm, l, "router"), d->D, d->E, 1, st(b, LOOM_SPLIT_MIRRORED));
    loom_tensor *wu =
        leaf(b, f, NAME(nm, l, "eup"), d->D, d->Fe, d->E, state_counts(b, LOOM_SPLIT_AXIS_1, ec));
    loom_tensor *wd =
        leaf(b, f, NAME(nm, l, "edown"), d->Fe, d->D, d->E, state_counts(b, LOOM_SPLIT_AXIS_0, ec));
    if (b->failed) return NULL;
    loom_tensor *logits = CK(loom_mul_mat(b->ctx, wr, h), "logits"); /* [E, T] */
    if (!logits) return NULL;
    loom_tensor *sel = CK(loom_top_k(b->ctx, logits, (int)d->U), "top_k"); /* [U, T] */
    loom_tensor *probs = CK(loom_soft_max(b->ctx, logits), "probs");
    if (b->failed) return NULL;
    loom_tensor *w =
        CK(loom_get_rows(b->ctx, CK(loom_reshape_3d(b->ctx, probs, 1, d->E, d->T), "p3"), sel),
           "weights"); /* [1, U, T] */
    loom_tensor *h3 = CK(loom_reshape_3d(b->ctx, h, d->D, 1, d->T), "h3");
    if (b->failed) return NULL;
    loom_tensor *up = CK(loom_mul_mat_id(b->ctx, wu, h3, sel), "eup"); /* [Fe, U, T] */
    if (!up) return NULL;
    loom_tensor *act = CK(loom_silu(b->ctx, up), "esilu");
    loom_tensor *down =
        act ? CK(loom_mul_mat_id(b->ctx, wd, act, sel), "edown") : NULL; /* [D, U, T] */
    if (!down) return NULL;
    int kind = (int)md_rand_range(b, 0, 2);
    if (kind) {
        loom_tensor *eb = leaf(b, f, NAME(nm, l, "ebias"), d->D, d->E, 1,
                               st(b, kind == 1 ? LOOM_SPLIT_MIRRORED : LOOM_SPLIT_PARTIAL));
        down = eb ? CK(loom_add_id(b->ctx, down, eb, sel), "add_id") : NULL;
        if (!down) return NULL;
    }
    down = CK(loom_mul(b->ctx, down, w), "weighted");
    if (!down) return NULL;
    loom_tensor *sum = NULL;
    for (int64_t u = 0; u < d->U && !b->failed; u++) {
        loom_tensor *view = CK(
            loom_view_2d(b->ctx, down, d->D, d->T, down->nb[2], (size_t)u * down->nb[1]), "slot");
        sum = sum ? CK(loom_add(b->ctx, sum, view), "esum") : view;
    }
    if (sum && d->U == 1) sum = CK(loom_cont(b->ctx, sum), "esum1");
    return sum;
}

static void build_random(md_builder *b, void *ud) {
    const fz *f = ud;
    dims d;
    d.D = md_rand_range(b, 1, 20);
    d.T = md_rand_range(b, 0, 15) == 0 ? 0 : md_rand_range(b, 1, 4); /* sometimes no tokens */
    d.hd = (int64_t[]){1, 2, 4}[md_rand_range(b, 0, 2)];
    d.Hkv = md_rand_range(b, 1, 3);
    d.G = md_rand_range(b, 1, 2);
    d.F = md_rand_range(b, 1, 24);
    d.E = md_rand_range(b, 2, 4);
    d.U = md_rand_range(b, 1, d.E < 3 ? d.E : 3);
    d.Fe = md_rand_range(b, 1, 12);
    d.V = md_rand_range(b, 1, 16);
    d.n_ctx = d.T + md_rand_range(b, 0, 3);
    char nm[64];
    loom_tensor *cur;
    if (md_rand_range(b, 0, 2) == 0) { /* from token ids through an embedding table */
        const int64_t ne_ids[4] = {d.T, 1, 1, 1};
        loom_tensor *emb = leaf(b, f, "tok_embd", d.D, d.V, 1, st(b, LOOM_SPLIT_MIRRORED));
        loom_tensor *ids = md_leaf_new(b, "tokens", LOOM_TYPE_I32, ne_ids, NULL, MD_FILL_IDS, d.V);
        if (b->failed) return;
        cur = CK(loom_get_rows(b->ctx, emb, ids), "embd");
    } else {
        cur = leaf(b, f, "x", d.D, d.T, 1, st(b, LOOM_SPLIT_MIRRORED));
    }
    const int64_t ne_pos[4] = {d.T, 1, 1, 1};
    loom_tensor *pos = md_leaf_new(b, "pos", LOOM_TYPE_I32, ne_pos, NULL, MD_FILL_IDS, 64);
    int layers = (int)md_rand_range(b, 1, 2);
    for (int l = 0; l < layers && cur && !b->failed; l++) {
        loom_tensor *nw = leaf(b, f, NAME(nm, l, "norm"), d.D, 1, 1, st(b, LOOM_SPLIT_MIRRORED));
        if (!nw) return;
        loom_tensor *h = CK(md_rand_range(b, 0, 1) ? loom_rms_norm(b->ctx, cur, 1e-5f)
                                                   : loom_norm(b->ctx, cur, 1e-5f),
                            "norm");
        h = h ? CK(loom_mul(b->ctx, h, nw), "normw") : NULL;
        if (!h) return;
        int blocks = (int)md_rand_range(b, 1, 7);
        if (d.T == 0) blocks = (blocks & 3) ? blocks & 3 : 1; /* no expert-slot views of nothing */
        if (blocks & 1) {
            loom_tensor *o = attention(b, f, &d, l, h, pos);
            cur = o ? CK(loom_add(b->ctx, cur, o), "res attn") : NULL;
        }
        if (cur && (blocks & 2)) {
            loom_tensor *o = ffn(b, f, &d, l, h);
            cur = o ? CK(loom_add(b->ctx, cur, o), "res ffn") : NULL;
        }
        if (cur && (blocks & 4)) {
            loom_tensor *o = moe(b, f, &d, l, h);
            cur = o ? CK(loom_add(b->ctx, cur, o), "res moe") : NULL;
        }
        if (cur && d.T > 0 && md_rand_range(b, 0, 3) == 0) { /* concat of two views along axis 0 */
            int64_t a = md_rand_range(b, 0, d.D);
            loom_tensor *c = CK(loom_cont(b->ctx, cur), "cc");
            if (!c) return;
            loom_tensor *lo = CK(loom_view_2d(b->ctx, c, a, d.T, c->nb[1], 0), "lo");
            loom_tensor *hi =
                CK(loom_view_2d(b->ctx, c, d.D - a, d.T, c->nb[1], (size_t)a * c->nb[0]), "hi");
            if (a > 0 && a < d.D && lo && hi) cur = CK(loom_concat(b->ctx, hi, lo, 0), "concat");
        }
        if (cur && md_rand_range(b, 0, 3) == 0) md_output(b, cur); /* an intermediate read */
    }
    if (!cur || b->failed) return;
    loom_tensor *nw = leaf(b, f, "out_norm", d.D, 1, 1, st(b, LOOM_SPLIT_MIRRORED));
    int64_t vc[LOOM_SPLIT_MAX_DEVICES];
    random_counts(b, d.V, 1, vc);
    loom_tensor *wout = leaf(b, f, "output", d.D, d.V, 1, state_counts(b, LOOM_SPLIT_AXIS_1, vc));
    if (b->failed) return;
    loom_tensor *h = CK(loom_rms_norm(b->ctx, cur, 1e-5f), "out norm");
    h = h ? CK(loom_mul(b->ctx, h, nw), "out normw") : NULL;
    md_output(b, h ? CK(loom_mul_mat(b->ctx, wout, h), "logits") : NULL);
}

/* ---------------------------------------------------------------- the cases */

static const char *const REFUSABLE[] = {
    "rms_norm", "norm",   "rope",           "soft_max", "glu",   "mul_mat_id", "get_rows",
    "add_id",   "concat", "flash_attn_ext", "top_k",    "unary", "set_rows"};

typedef struct tally {
    int cases, exact, refused_alone, refused_sched, refused_prealloc, setup, wrong, sched_cases;
} tally;

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* One case from its seed: the device configuration and the graph. */
static void run_case(uint64_t seed, tally *t) {
    uint64_t r = mix64(seed);
    md_config c = {.seed = seed};
    c.n = 1 + (int)(r % 8);
    r = mix64(r);
    c.sched = r & 1;
    const char *mode = getenv("LOOM_META_FUZZ_MODE"); /* rerun a seed alone or scheduled */
    if (mode && *mode) c.sched = strcmp(mode, "sched") == 0;
    c.nan_fill = !c.sched;
    c.repeats = 1 + (int)((r >> 1) & 1) + (int)((r >> 9) & 1);
    static const loom_allreduce_algo algos[] = {LOOM_ALLREDUCE_AUTO, LOOM_ALLREDUCE_RING,
                                                LOOM_ALLREDUCE_BUTTERFLY, LOOM_ALLREDUCE_HOST};
    c.algo = algos[(r >> 2) % 4];
    fz f = {.wild = ((r >> 4) % 4) == 0};
    char opts[256] = "";
    if (c.sched && ((r >> 6) % 3) == 0) { /* members refuse some ops */
        size_t o = 0;
        uint64_t pick = mix64(r);
        for (size_t i = 0; i < sizeof REFUSABLE / sizeof *REFUSABLE; i++)
            if ((pick >> i) & (pick >> (i + 20)) & 1)
                o += (size_t)snprintf(opts + o, sizeof opts - o, "%s%s",
                                      o ? "+" : ",refuse=", REFUSABLE[i]);
    }
    c.sim_opts = opts;
    md_result res = md_run(&c, build_random, &f);
    t->cases++;
    t->sched_cases += c.sched;
    const char *where = c.sched ? "sched" : "alone";
    switch (res.verdict) {
    case MD_EXACT:
        t->exact++;
        break;
    case MD_SETUP:
        t->setup++;
        if (getenv("LOOM_META_FUZZ_VERBOSE"))
            printf("seed %llu setup: %s\n", (unsigned long long)seed, res.msg);
        break;
    case MD_REFUSED:
        if (!c.sched) {
            t->refused_alone++;
            if (getenv("LOOM_META_FUZZ_VERBOSE"))
                printf("seed %llu alone (%s): %s\n", (unsigned long long)seed,
                       f.wild ? "wild" : "rules", res.msg);
            break;
        }
        if (strstr(res.msg, "pre-allocated tensor") && strstr(opts, "set_rows")) {
            /* the devices refuse SET_ROWS, and the cache only they can write needs it */
            t->refused_prealloc++;
            break;
        }
        t->refused_sched++;
        if (getenv("LOOM_META_FUZZ_VERBOSE"))
            printf("seed %llu (%s): %s\n", (unsigned long long)seed, f.wild ? "wild" : "rules",
                   res.msg);
        if (!f.wild) {
            t->wrong++;
            loom_test_fail(__FILE__, __LINE__,
                           "seed %llu (N=%d, %s%s, %s, %d nodes): refused under the scheduler: %s",
                           (unsigned long long)seed, c.n, where, opts,
                           loom_allreduce_algo_name(c.algo), res.n_nodes, res.msg);
        }
        break;
    case MD_WRONG:
        t->wrong++;
        loom_test_fail(__FILE__, __LINE__, "seed %llu (N=%d, %s%s, %s, %s, %d nodes): %s",
                       (unsigned long long)seed, c.n, where, opts, f.wild ? "wild" : "rules",
                       loom_allreduce_algo_name(c.algo), res.n_nodes, res.msg);
        break;
    }
}

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

LOOM_TEST(meta_fuzz, random_graphs_match_the_cpu) {
    tally t = {0};
    const char *one = getenv("LOOM_META_FUZZ_SEED");
    if (one && *one) {
        run_case(strtoull(one, NULL, 10), &t);
    } else {
#ifdef NDEBUG
        const int scale = 1;
#else
        const int scale = 4; /* sanitizer builds: a quarter of the cases */
#endif
        const int fixed = env_int("LOOM_META_FUZZ_FIXED", 2000) / scale;
        const int fresh = env_int("LOOM_META_FUZZ_FRESH", 500) / scale;
        for (int i = 0; i < fixed; i++)
            run_case((uint64_t)i + 1, &t);
        uint64_t base = mix64((uint64_t)time(NULL) ^ ((uint64_t)clock() << 32));
        for (int i = 0; i < fresh; i++)
            run_case(base + (uint64_t)i, &t);
    }
    printf("meta_fuzz: %d cases (%d under the scheduler): %d exact, %d refused alone, %d refused "
           "under the scheduler (wild states), %d a cache only Meta can write, SET_ROWS refused, "
           "%d not built, %d wrong\n",
           t.cases, t.sched_cases, t.exact, t.refused_alone, t.refused_sched, t.refused_prealloc,
           t.setup, t.wrong);
    LOOM_CHECK(t.exact > 0);
}
