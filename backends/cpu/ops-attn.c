/*
 * Attention kernels: ROPE (normal and neox, optional frequency factors) and
 * FLASH_ATTN_EXT (F32/F16 K and V, optional F32/F16 mask with ALiBi slopes, softcap,
 * sinks, grouped-query heads).
 *
 * Flash attention takes up to 16 query rows of the heads sharing one KV head at a time
 * (GQA-aware), so each K/V row is loaded once for all of them: per row an online softmax
 * (running max M, sum S, accumulator V) over tiles of keys with a vectorised exp, skipping
 * masked (-INF) keys, then the sink logit folded into the normalisation. A NaN score of an unmasked
 * key (NaN in q, k, the mask, softcap), NaN in v or a NaN sink makes that query's whole output NaN:
 * NaN in, NaN out, as every other op. Threads split the (row block, KV head, sequence) items.
 */
#include "backends/cpu/cpu-impl.h"

/* ---------------------------------------------------------------- rope */

void loom__cpu_op_rope(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *pos = dst->src[1], *ff = dst->src[2];
    const int n_dims = loom_get_op_params_i32(dst, 0);
    const int mode = loom_get_op_params_i32(dst, 1);
    const double freq_base = loom_get_op_params_f32(dst, 2);
    const double freq_scale = loom_get_op_params_f32(dst, 3);
    const int64_t D = a->ne[0], H = a->ne[1], T = a->ne[2];
    const int half = n_dims / 2;
    float *cs = p->wthread; /* cos, sin of each pair for the current position */
    int64_t cached_t = -1;

    int64_t r0, r1;
    loom__range(loom_nrows(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t h = r % H, t = (r / H) % T, i3 = r / (H * T);
        if (t != cached_t) {
            int32_t pv;
            memcpy(&pv, loom__at(pos, t, 0, 0, 0), sizeof pv);
            for (int i = 0; i < half; i++) {
                double theta = (double)pv * freq_scale * pow(freq_base, -2.0 * i / n_dims);
                if (ff) {
                    float f;
                    memcpy(&f, (const char *)ff->data + i * (int64_t)ff->nb[0], sizeof f);
                    theta /= (double)f;
                }
                cs[2 * i] = (float)cos(theta);
                cs[2 * i + 1] = (float)sin(theta);
            }
            cached_t = t;
        }
        const char *x = loom__at(a, 0, h, t, i3);
        char *y = loom__at(dst, 0, h, t, i3);
        const int64_t xs = (int64_t)a->nb[0], ys = (int64_t)dst->nb[0];
        for (int i = 0; i < half; i++) {
            int64_t j0 = mode == LOOM_ROPE_TYPE_NEOX ? i : 2 * i;
            int64_t j1 = mode == LOOM_ROPE_TYPE_NEOX ? i + half : 2 * i + 1;
            float x0, x1;
            memcpy(&x0, x + j0 * xs, sizeof x0);
            memcpy(&x1, x + j1 * xs, sizeof x1);
            float c = cs[2 * i], s = cs[2 * i + 1];
            float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
            memcpy(y + j0 * ys, &y0, sizeof y0);
            memcpy(y + j1 * ys, &y1, sizeof y1);
        }
        if (x != y || xs != ys)
            for (int64_t i = n_dims; i < D; i++)
                memcpy(y + i * ys, x + i * xs, sizeof(float));
    }
}

/* ---------------------------------------------------------------- flash attention */

static float alibi_slope(float max_bias, int64_t n_head, int64_t h) {
    if (max_bias <= 0.0f) return 1.0f;
    const int64_t n_head_log2 = (int64_t)1 << (int)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -max_bias / (float)n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);
    return h < n_head_log2 ? powf(m0, (float)(h + 1))
                           : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

static float read_mask(const loom_tensor *mask, const char *row, int64_t i) {
    const char *q = row + i * (int64_t)mask->nb[0];
    if (mask->type == LOOM_TYPE_F16) {
        uint16_t h;
        memcpy(&h, q, sizeof h);
        return loom__fp16_to_fp32(h);
    }
    float v;
    memcpy(&v, q, sizeof v);
    return v;
}

/* A row of n elements of an F32/F16 tensor as f32: in place when contiguous F32, else
 * converted into buf (contiguous F16 through the SIMD table's F16C conversion). */
static const float *row_f32(const loom_tensor *t, const char *row, int64_t n, float *buf,
                            const loom__cpu_simd *simd) {
    if (t->type == LOOM_TYPE_F32 && t->nb[0] == sizeof(float)) return (const float *)row;
    if (t->type == LOOM_TYPE_F16 && t->nb[0] == sizeof(uint16_t))
        simd->f16_to_f32((const uint16_t *)row, buf, n);
    else
        loom__cpu_row_to_f32(t->type, row, t->nb[0], 0, n, buf);
    return buf;
}

/* Rows of one item: query rows (query j, head h) of the heads sharing one KV head, j-major,
 * so a decode step (Nq = 1) takes every query head of a KV group at once and each K/V row
 * is read once per group. Keys are taken FA_KT at a time: scores for every row (dots of
 * one key row against up to 4 query rows at a time), then per row one max, one rescale of
 * the accumulator and a vectorised exp over the tile (vec_exp_sum), then each value row
 * added into every row's accumulator while it is in L1. Per row the arithmetic does not
 * depend on how rows are blocked or threaded. */
enum { FA_RB = 16, FA_KT = 64 };

void loom__cpu_op_flash_attn(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    const loom_tensor *mask = dst->src[3], *sinks = dst->src[4];
    const float scale = loom_get_op_params_f32(dst, 0);
    const float max_bias = loom_get_op_params_f32(dst, 1);
    const float softcap = loom_get_op_params_f32(dst, 2);
    const int64_t D = q->ne[0], Nq = q->ne[1], H = q->ne[2], S4 = q->ne[3];
    const int64_t Nkv = k->ne[1], Hk = k->ne[2], Dv = v->ne[0];
    const int64_t group = H / Hk;
    const int64_t grows = group * Nq; /* rows per KV head and sequence */
    const loom__cpu_simd *simd = p->simd;

    /* rows per item: at most FA_RB, fewer when that leaves threads idle */
    int64_t nblk = (grows + FA_RB - 1) / FA_RB;
    const int64_t want = ((int64_t)p->nth + Hk * S4 - 1) / (Hk * S4);
    if (nblk < want) nblk = want < grows ? want : grows;
    const int64_t rb = (grows + nblk - 1) / nblk;
    nblk = (grows + rb - 1) / rb;

    float *qbuf = p->wthread;       /* FA_RB * D: the item's query rows */
    float *kbuf = qbuf + FA_RB * D; /* D: a key row as f32 */
    float *vbuf = kbuf + D;         /* Dv: a value row as f32 */
    float *acc = vbuf + Dv;         /* FA_RB * Dv */
    float *z = acc + FA_RB * Dv;    /* FA_RB * FA_KT scores (-INF: key not used) */
    float *pw = z + FA_RB * FA_KT;  /* FA_RB * FA_KT weights */

    int64_t r0, r1;
    loom__range(nblk * Hk * S4, p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t b = r % nblk, hk = (r / nblk) % Hk, s = r / (nblk * Hk);
        const int64_t g0 = b * rb;
        const int nr = grows - g0 < rb ? (int)(grows - g0) : (int)rb;
        const char *mrow[FA_RB];
        int64_t hrow[FA_RB], jrow[FA_RB];
        float slope[FA_RB], M[FA_RB], S[FA_RB];
        bool nan[FA_RB];  /* a NaN score was seen: the output is NaN */
        bool live[FA_KT]; /* a key of the tile some row uses */
        for (int rr = 0; rr < nr; rr++) {
            const int64_t g = g0 + rr, j = g / group, h = hk * group + g % group;
            hrow[rr] = h;
            jrow[rr] = j;
            loom__cpu_row_to_f32(LOOM_TYPE_F32, loom__at(q, 0, j, h, s), q->nb[0], 0, D,
                                 qbuf + rr * D);
            mrow[rr] = mask ? loom__at(mask, 0, j, h % mask->ne[2], s % mask->ne[3]) : NULL;
            slope[rr] = alibi_slope(max_bias, H, h);
            M[rr] = -INFINITY;
            S[rr] = 0.0f;
            nan[rr] = false;
        }
        memset(acc, 0, (size_t)nr * (size_t)Dv * sizeof *acc);

        for (int64_t i0 = 0; i0 < Nkv; i0 += FA_KT) {
            const int nt = Nkv - i0 < FA_KT ? (int)(Nkv - i0) : FA_KT;
            /* the mask of the tile per row (rows of one query share it), 0 without one */
            for (int rr = 0; rr < nr; rr++) {
                float *zr = z + rr * FA_KT;
                if (!mrow[rr])
                    memset(zr, 0, (size_t)nt * sizeof *zr);
                else if (rr > 0 && mrow[rr] == mrow[rr - 1])
                    memcpy(zr, zr - FA_KT, (size_t)nt * sizeof *zr);
                else if (mask->type == LOOM_TYPE_F16 && mask->nb[0] == sizeof(uint16_t))
                    simd->f16_to_f32((const uint16_t *)mrow[rr] + i0, zr, nt);
                else
                    for (int t = 0; t < nt; t++)
                        zr[t] = read_mask(mask, mrow[rr], i0 + t);
            }
            bool tile_any = false;
            for (int t = 0; t < nt; t++) {
                const int64_t i = i0 + t;
                bool any = false;
                for (int rr = 0; rr < nr; rr++)
                    any |= z[rr * FA_KT + t] != -INFINITY;
                live[t] = any;
                if (!any) continue;
                tile_any = true;
                /* the key row as f32, converted once for all rows */
                const float *kr = row_f32(k, loom__at(k, 0, i, hk, s), D, kbuf, simd);
                for (int c0 = 0; c0 < nr; c0 += 4) {
                    const int nc = nr - c0 < 4 ? nr - c0 : 4;
                    float d4[4];
                    simd->dot_f32(D, kr, qbuf + c0 * D, (size_t)D, nc, d4);
                    for (int cc = 0; cc < nc; cc++) {
                        float *zp = &z[(c0 + cc) * FA_KT + t];
                        const float mv = *zp;
                        if (mv == -INFINITY) continue;
                        float zj = d4[cc] * scale;
                        if (softcap > 0.0f) zj = softcap * tanhf(zj / softcap);
                        zj += slope[c0 + cc] * mv;
                        if (zj != zj) {
                            nan[c0 + cc] = true;
                            zj = -INFINITY;
                        }
                        *zp = zj;
                    }
                }
            }
            if (!tile_any) continue;
            for (int rr = 0; rr < nr; rr++) {
                float *zr = z + rr * FA_KT, *pr = pw + rr * FA_KT;
                float mt = -INFINITY;
                for (int t = 0; t < nt; t++)
                    mt = zr[t] > mt ? zr[t] : mt;
                if (mt == -INFINITY) continue; /* nothing live in this tile: pr unused */
                if (mt > M[rr]) {
                    if (M[rr] != -INFINITY) {
                        const float ms = expf(M[rr] - mt);
                        simd->vec_scale(Dv, acc + rr * Dv, acc + rr * Dv, ms, 0.0f);
                        S[rr] *= ms;
                    }
                    M[rr] = mt;
                }
                S[rr] += (float)simd->vec_exp_sum(nt, pr, zr, M[rr]);
            }
            for (int t = 0; t < nt; t++) {
                if (!live[t]) continue;
                /* the value row as f32, converted once for all rows */
                const float *vr = row_f32(v, loom__at(v, 0, i0 + t, hk, s), Dv, vbuf, simd);
                for (int rr = 0; rr < nr; rr++)
                    if (z[rr * FA_KT + t] != -INFINITY)
                        simd->vec_mad_f32(Dv, acc + rr * Dv, vr, pw[rr * FA_KT + t]);
            }
        }
        for (int rr = 0; rr < nr; rr++) {
            float *aj = acc + rr * Dv;
            if (sinks) {
                float sk;
                memcpy(&sk, (const char *)sinks->data + hrow[rr] * (int64_t)sinks->nb[0],
                       sizeof sk);
                if (sk > M[rr]) {
                    float ms = expf(M[rr] - sk);
                    simd->vec_scale(Dv, aj, aj, ms, 0.0f);
                    S[rr] = S[rr] * ms + 1.0f;
                    M[rr] = sk;
                } else {
                    S[rr] += expf(sk - M[rr]);
                }
            }
            char *y = loom__at(dst, 0, hrow[rr], jrow[rr], s);
            /* S is NaN when a sink was NaN; NaN in v reaches aj */
            const bool poisoned = nan[rr] || S[rr] != S[rr];
            const float inv = S[rr] > 0.0f ? 1.0f / S[rr] : 0.0f;
            for (int64_t d = 0; d < Dv; d++) {
                float o = poisoned ? NAN : aj[d] * inv;
                memcpy(y + d * (int64_t)dst->nb[0], &o, sizeof o);
            }
        }
    }
}
