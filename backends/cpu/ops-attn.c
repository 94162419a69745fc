/*
 * Attention kernels: ROPE (normal and neox, optional frequency factors) and
 * FLASH_ATTN_EXT (F32/F16 K and V, optional F32/F16 mask with ALiBi slopes, softcap,
 * sinks, grouped-query heads).
 *
 * Flash attention takes up to 4 queries of one head at a time, so each key row is loaded
 * once for all of them: per query an online softmax (running max M, sum S, accumulator V)
 * over the keys, skipping masked (-INF) keys, then the sink logit folded into the
 * normalisation. A NaN score of an unmasked key (NaN in q, k, the mask, softcap), NaN in v
 * or a NaN sink makes that query's whole output NaN: NaN in, NaN out, as every other op.
 * Threads split the (query block, head, sequence) items.
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

/* A row of K or V as either its own contiguous f32/f16 data or an f32 copy in buf
 * (gathered when strided; dequantised for bf16 and the block types of a quantised cache,
 * whose rows are whole blocks). Returns the pointer; *is_f16 says how to read it. */
static const void *row_view(const loom_tensor *t, const void *row, int64_t n, float *buf,
                            bool *is_f16) {
    size_t es = loom_type_size(t->type);
    if ((t->type == LOOM_TYPE_F32 || t->type == LOOM_TYPE_F16) && t->nb[0] == es) {
        *is_f16 = t->type == LOOM_TYPE_F16;
        return row;
    }
    loom__cpu_row_to_f32(t->type, row, t->nb[0], 0, n, buf);
    *is_f16 = false;
    return buf;
}

enum { FA_QB = 4 }; /* queries processed together against each key */

void loom__cpu_op_flash_attn(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    const loom_tensor *mask = dst->src[3], *sinks = dst->src[4];
    const float scale = loom_get_op_params_f32(dst, 0);
    const float max_bias = loom_get_op_params_f32(dst, 1);
    const float softcap = loom_get_op_params_f32(dst, 2);
    const int64_t D = q->ne[0], Nq = q->ne[1], H = q->ne[2];
    const int64_t Nkv = k->ne[1], Hk = k->ne[2], Dv = v->ne[0];
    const int64_t group = H / Hk;
    const int64_t nqb = (Nq + FA_QB - 1) / FA_QB;
    const loom__cpu_simd *simd = p->simd;
    const bool q_in_place = q->nb[0] == sizeof(float) && q->nb[1] % sizeof(float) == 0;

    float *qbuf = p->wthread;       /* FA_QB * D: queries gathered when strided */
    float *kbuf = qbuf + FA_QB * D; /* D */
    float *vbuf = kbuf + D;         /* Dv */
    float *acc = vbuf + Dv;         /* FA_QB * Dv */

    int64_t r0, r1;
    loom__range(nqb * H * q->ne[3], p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        /* item (query block, head, seq) */
        const int64_t jb = r % nqb, h = (r / nqb) % H, s = r / (nqb * H);
        const int64_t j0 = jb * FA_QB;
        const int nq = Nq - j0 < FA_QB ? (int)(Nq - j0) : FA_QB;
        const int64_t hk = h / group;
        const float slope = alibi_slope(max_bias, H, h);

        const float *qr = qbuf;
        size_t ldq = (size_t)D;
        if (q_in_place) {
            qr = loom__at(q, 0, j0, h, s);
            ldq = q->nb[1] / sizeof(float);
        } else {
            for (int jj = 0; jj < nq; jj++)
                loom__cpu_row_to_f32(LOOM_TYPE_F32, loom__at(q, 0, j0 + jj, h, s), q->nb[0], 0, D,
                                     qbuf + jj * D);
        }
        const char *mrow[FA_QB];
        float M[FA_QB], S[FA_QB];
        bool nan[FA_QB]; /* a NaN score was seen: the output is NaN */
        for (int jj = 0; jj < nq; jj++) {
            nan[jj] = false;
            mrow[jj] = mask ? loom__at(mask, 0, j0 + jj, h % mask->ne[2], s % mask->ne[3]) : NULL;
            M[jj] = -INFINITY;
            S[jj] = 0.0f;
        }
        memset(acc, 0, (size_t)(nq * Dv) * sizeof *acc);

        for (int64_t i = 0; i < Nkv; i++) {
            float mv[FA_QB];
            bool any = false;
            for (int jj = 0; jj < nq; jj++) {
                mv[jj] = mrow[jj] ? read_mask(mask, mrow[jj], i) : 0.0f;
                any |= mv[jj] != -INFINITY;
            }
            if (!any) continue;
            bool kf16, vf16;
            const void *kr = row_view(k, loom__at(k, 0, i, hk, s), D, kbuf, &kf16);
            float z[FA_QB];
            if (kf16)
                simd->dot_f16(D, kr, qr, ldq, nq, z);
            else
                simd->dot_f32(D, kr, qr, ldq, nq, z);
            const void *vr = row_view(v, loom__at(v, 0, i, hk, s), Dv, vbuf, &vf16);
            for (int jj = 0; jj < nq; jj++) {
                if (mv[jj] == -INFINITY) continue;
                float zj = z[jj] * scale;
                if (softcap > 0.0f) zj = softcap * tanhf(zj / softcap);
                zj += slope * mv[jj];
                if (zj != zj) {
                    nan[jj] = true;
                    continue;
                }
                if (zj == -INFINITY) continue;
                float *aj = acc + jj * Dv;
                float vs;
                if (zj > M[jj]) {
                    float ms = expf(M[jj] - zj); /* 0 on the first key */
                    if (ms != 1.0f) simd->vec_scale(Dv, aj, aj, ms, 0.0f);
                    S[jj] *= ms;
                    M[jj] = zj;
                    vs = 1.0f;
                } else {
                    vs = expf(zj - M[jj]);
                }
                if (vf16)
                    simd->vec_mad_f16(Dv, aj, vr, vs);
                else
                    simd->vec_mad_f32(Dv, aj, vr, vs);
                S[jj] += vs;
            }
        }
        for (int jj = 0; jj < nq; jj++) {
            float *aj = acc + jj * Dv;
            if (sinks) {
                float sk;
                memcpy(&sk, (const char *)sinks->data + h * (int64_t)sinks->nb[0], sizeof sk);
                if (sk > M[jj]) {
                    float ms = expf(M[jj] - sk);
                    simd->vec_scale(Dv, aj, aj, ms, 0.0f);
                    S[jj] = S[jj] * ms + 1.0f;
                    M[jj] = sk;
                } else {
                    S[jj] += expf(sk - M[jj]);
                }
            }
            char *y = loom__at(dst, 0, h, j0 + jj, s);
            /* S is NaN when a sink or an exp of v-weights was NaN; NaN in v reaches aj */
            const bool poisoned = nan[jj] || S[jj] != S[jj];
            const float inv = S[jj] > 0.0f ? 1.0f / S[jj] : 0.0f;
            for (int64_t d = 0; d < Dv; d++) {
                float o = poisoned ? NAN : aj[d] * inv;
                memcpy(y + d * (int64_t)dst->nb[0], &o, sizeof o);
            }
        }
    }
}
