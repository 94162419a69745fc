/*
 * Attention kernels: ROPE (normal and neox, optional frequency factors) and
 * FLASH_ATTN_EXT (F32/F16 K and V, optional F32/F16 mask with ALiBi slopes, softcap,
 * sinks, grouped-query heads).
 *
 * Flash attention takes up to 16 query rows of the heads sharing one KV head at a time
 * (GQA-aware), so each K/V row is loaded once for all of them: per row an online softmax
 * (running max M, sum S, accumulator V) over tiles of 64 keys, each K/V tile converted to
 * f32 once (F16/BF16/Q8_0/Q4_0 by the SIMD table in one call; F32 read in place), scores
 * and weighted values by the SIMD table's tile kernels with a vectorised exp between them,
 * skipping masked (-INF) keys, then the sink logit folded into the normalisation. A NaN score of an
 * unmasked key (NaN in q, k, the mask, softcap), NaN in v or a NaN sink makes that query's whole
 * output NaN: NaN in, NaN out, as every other op. Threads split the (row block, KV head, sequence)
 * items.
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

/* Rows [i0, i0 + n) of K or V (head hk, sequence s) as f32 rows: in place when contiguous
 * F32 (*ld = the row stride in floats), else converted into buf (*ld = ne0): F32/F16/BF16/
 * Q8_0/Q4_0 with contiguous rows through the SIMD table in one call, anything else row by row. */
static const float *tile_f32(const loom_tensor *t, int64_t i0, int n, int64_t hk, int64_t s,
                             float *buf, size_t *ld, const loom__cpu_simd *simd) {
    const int64_t ne0 = t->ne[0];
    const char *row = loom__at(t, 0, i0, hk, s);
    if (t->type == LOOM_TYPE_F32 && t->nb[0] == sizeof(float) && t->nb[1] % sizeof(float) == 0) {
        *ld = t->nb[1] / sizeof(float);
        return (const float *)row;
    }
    *ld = (size_t)ne0;
    if (t->nb[0] == loom_type_size(t->type) &&
        simd->rows_to_f32(t->type, row, t->nb[1], n, ne0, buf, (size_t)ne0))
        return buf;
    for (int i = 0; i < n; i++)
        loom__cpu_row_to_f32(t->type, row + (size_t)i * t->nb[1], t->nb[0], 0, ne0,
                             buf + (size_t)i * (size_t)ne0);
    return buf;
}

/* Asks for rows [i0, i0 + n) of K or V (head hk, sequence s) to be brought into cache: the
 * rows of one head are a cache row apart (other heads in between), too far apart for the
 * hardware prefetcher, and the weights streamed since the last token evicted them. */
static void prefetch_rows(const loom_tensor *t, int64_t i0, int n, int64_t hk, int64_t s) {
#if defined(__GNUC__)
    if (n <= 0 || t->nb[0] != loom_type_size(t->type)) return;
    const size_t bytes = loom_row_size(t->type, t->ne[0]);
    const char *row = loom__at(t, 0, i0, hk, s);
    for (int i = 0; i < n; i++, row += t->nb[1]) {
        for (size_t off = 0; off < bytes; off += 64)
            __builtin_prefetch(row + off);
        __builtin_prefetch(row + bytes - 1);
    }
#else
    (void)t, (void)i0, (void)n, (void)hk, (void)s;
#endif
}

/* Rows of one item: query rows (query j, head h) of the heads sharing one KV head, j-major,
 * so a decode step (Nq = 1) takes every query head of a KV group at once and each K/V row
 * is read once per group. Keys are taken FA_KT at a time (trimmed to the keys some row
 * uses): the K and V tiles converted to f32 once for all rows (in place when F32), then
 * the SIMD table's tile kernels: fa_kq (scores of every row against 16 keys at a time, the
 * mask, ALiBi slope and NaN check applied, the tile max), per row one rescale of the
 * accumulator and a vectorised exp over the tile (vec_exp_sum), then fa_pv (the weighted
 * value rows into up to 4 rows' register-held accumulators at a time). Per row the
 * arithmetic does not depend on how rows are blocked or threaded. */
enum { FA_RB = 16, FA_KT = 64 };

loom__cpu_work loom__cpu_flash_attn_work(const loom_tensor *dst) {
    const int64_t D = dst->src[0]->ne[0], Dv = dst->src[2]->ne[0];
    loom__cpu_work w = {0, 0};
    /* the item's queries, the K and V tiles, the accumulators, 3 score/weight tiles */
    w.per_thread =
        ((size_t)(FA_RB + FA_KT) * (size_t)(D + Dv) + 3 * FA_RB * FA_KT + 64) * sizeof(float);
    return w;
}

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

    /* rows per item: at most FA_RB; when the items are few and do not divide evenly among
     * the threads (5 KV heads on 2 threads, 1 on 2), the rows of each KV head are split into
     * more blocks, so that every thread gets the same number of items */
    int64_t nblk = (grows + FA_RB - 1) / FA_RB;
    const int64_t heads = Hk * S4, nth = p->nth;
    if (nth > 1 && (nblk * heads) % nth != 0 && nblk * heads < 4 * nth) {
        int64_t a = heads, g = nth; /* gcd(heads, nth) */
        while (a) {
            const int64_t t = g % a;
            g = a;
            a = t;
        }
        const int64_t step = nth / g; /* nblk a multiple of step: items a multiple of nth */
        nblk = (nblk + step - 1) / step * step;
    }
    if (nblk > grows) nblk = grows;
    const int64_t rb = (grows + nblk - 1) / nblk;
    nblk = (grows + rb - 1) / rb;

    float *qbuf = p->wthread;         /* FA_RB * D: the item's query rows */
    float *kt = qbuf + FA_RB * D;     /* FA_KT * D: a key tile as f32 */
    float *vt = kt + FA_KT * D;       /* FA_KT * Dv: a value tile as f32 */
    float *acc = vt + FA_KT * Dv;     /* FA_RB * Dv */
    float *z = acc + FA_RB * Dv;      /* FA_RB * FA_KT scores (-INF: key not used) */
    float *pw = z + FA_RB * FA_KT;    /* FA_RB * FA_KT weights */
    float *zraw = pw + FA_RB * FA_KT; /* FA_RB * FA_KT raw dots (softcap only) */
    static const float zero_slope[FA_RB];

    loom__cpu_chunks ch = loom__cpu_chunks_of(p, nblk * Hk * S4, 1);
    for (int64_t r; loom__cpu_chunks_item(p, &ch, &r);) {
        const int64_t b = r % nblk, hk = (r / nblk) % Hk, s = r / (nblk * Hk);
        const int64_t g0 = b * rb;
        const int nr = grows - g0 < rb ? (int)(grows - g0) : (int)rb;
        const char *mrow[FA_RB];
        int64_t hrow[FA_RB], jrow[FA_RB];
        float slope[FA_RB], M[FA_RB], S[FA_RB], zmax[FA_RB];
        bool nan[FA_RB]; /* a NaN score was seen: the output is NaN */
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
            /* the mask of the tile per row (rows of one query share it), 0 without one;
             * [lo, hi): the keys some row uses */
            int lo = nt, hi = 0;
            for (int rr = 0; rr < nr; rr++) {
                float *zr = z + rr * FA_KT;
                if (!mrow[rr]) {
                    memset(zr, 0, (size_t)nt * sizeof *zr);
                    lo = 0, hi = nt;
                    continue;
                }
                if (rr > 0 && mrow[rr] == mrow[rr - 1]) {
                    memcpy(zr, zr - FA_KT, (size_t)nt * sizeof *zr);
                    continue;
                }
                if (mask->type == LOOM_TYPE_F16 && mask->nb[0] == sizeof(uint16_t))
                    simd->f16_to_f32((const uint16_t *)mrow[rr] + i0, zr, nt);
                else
                    for (int t = 0; t < nt; t++)
                        zr[t] = read_mask(mask, mrow[rr], i0 + t);
                int t = 0;
                while (t < lo && zr[t] == -INFINITY)
                    t++;
                if (t < lo) lo = t;
                t = nt;
                while (t > hi && zr[t - 1] == -INFINITY)
                    t--;
                if (t > hi) hi = t;
            }
            if (lo >= hi) continue; /* no row uses a key of this tile */
            const int n = hi - lo;
            if (i0 + FA_KT < Nkv) { /* the next tile's K and V while this one is computed */
                const int nn = Nkv - i0 - FA_KT < FA_KT ? (int)(Nkv - i0 - FA_KT) : FA_KT;
                prefetch_rows(k, i0 + FA_KT, nn, hk, s);
                prefetch_rows(v, i0 + FA_KT, nn, hk, s);
            }
            size_t ldk, ldv;
            const float *kb = tile_f32(k, i0 + lo, n, hk, s, kt, &ldk, simd);
            if (softcap > 0.0f) {
                /* raw dots (mask only marks unused keys), then the cap, slope and mask */
                for (int rr = 0; rr < nr; rr++)
                    for (int t = lo; t < hi; t++)
                        zraw[rr * FA_KT + t] = z[rr * FA_KT + t] == -INFINITY ? -INFINITY : 0.0f;
                bool nan_raw[FA_RB] = {false};
                simd->fa_kq(D, qbuf, nr, kb, ldk, n, 1.0f, zero_slope, zraw + lo, FA_KT, zmax,
                            nan_raw);
                for (int rr = 0; rr < nr; rr++) {
                    float mt = -INFINITY;
                    for (int t = lo; t < hi; t++) {
                        float *zp = &z[rr * FA_KT + t];
                        if (*zp == -INFINITY) continue;
                        float zj = softcap * tanhf(zraw[rr * FA_KT + t] * scale / softcap) +
                                   slope[rr] * *zp;
                        if (zj != zj) {
                            nan[rr] = true;
                            zj = -INFINITY;
                        }
                        *zp = zj;
                        mt = zj > mt ? zj : mt;
                    }
                    zmax[rr] = mt;
                    if (nan_raw[rr]) nan[rr] = true; /* a NaN dot: the whole row is NaN */
                }
            } else {
                simd->fa_kq(D, qbuf, nr, kb, ldk, n, scale, slope, z + lo, FA_KT, zmax, nan);
            }
            bool any = false;
            for (int rr = 0; rr < nr; rr++) {
                float *zr = z + rr * FA_KT + lo, *pr = pw + rr * FA_KT + lo;
                const float mt = zmax[rr];
                if (mt == -INFINITY) continue; /* nothing live in this tile: pr unused */
                any = true;
                if (mt > M[rr]) {
                    if (M[rr] != -INFINITY) {
                        const float ms = expf(M[rr] - mt);
                        simd->vec_scale(Dv, acc + rr * Dv, acc + rr * Dv, ms, 0.0f);
                        S[rr] *= ms;
                    }
                    M[rr] = mt;
                }
                S[rr] += (float)simd->vec_exp_sum(n, pr, zr, M[rr]);
            }
            if (!any) continue;
            const float *vb = tile_f32(v, i0 + lo, n, hk, s, vt, &ldv, simd);
            simd->fa_pv(Dv, pw + lo, z + lo, FA_KT, nr, vb, ldv, n, acc);
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
