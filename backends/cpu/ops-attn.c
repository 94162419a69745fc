/*
 * Attention kernels: ROPE (normal and neox, optional frequency factors) and
 * FLASH_ATTN_EXT (F32/F16 K and V, optional F32/F16 mask with ALiBi slopes, softcap,
 * sinks, grouped-query heads).
 *
 * Flash attention keeps one output row at a time: an online softmax (running max M, sum
 * S, accumulator V) over the keys of the row, skipping masked (-INF) keys, then the sink
 * logit folded into the normalisation. Threads split the output rows (query, head, seq).
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
            for (int64_t i = n_dims; i < D; i++) memcpy(y + i * ys, x + i * xs, sizeof(float));
    }
}

/* ---------------------------------------------------------------- flash attention */

static float alibi_slope(float max_bias, int64_t n_head, int64_t h) {
    if (max_bias <= 0.0f) return 1.0f;
    const int64_t n_head_log2 = (int64_t)1 << (int)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -max_bias / (float)n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);
    return h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
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

/* A row of an F32/F16 tensor as either its own contiguous f32/f16 data or a gathered f32
 * copy in buf. Returns the pointer; *is_f16 says how to read it. */
static const void *row_view(const loom_tensor *t, const void *row, int64_t n, float *buf,
                            bool *is_f16) {
    size_t es = loom_type_size(t->type);
    if (t->nb[0] == es) {
        *is_f16 = t->type == LOOM_TYPE_F16;
        return row;
    }
    loom__cpu_row_to_f32(t->type, row, t->nb[0], 0, n, buf);
    *is_f16 = false;
    return buf;
}

void loom__cpu_op_flash_attn(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    const loom_tensor *mask = dst->src[3], *sinks = dst->src[4];
    const float scale = loom_get_op_params_f32(dst, 0);
    const float max_bias = loom_get_op_params_f32(dst, 1);
    const float softcap = loom_get_op_params_f32(dst, 2);
    const int64_t D = q->ne[0], Nq = q->ne[1], H = q->ne[2];
    const int64_t Nkv = k->ne[1], Hk = k->ne[2], Dv = v->ne[0];
    const int64_t group = H / Hk;
    const loom__cpu_simd *simd = p->simd;

    float *qbuf = p->wthread;   /* D */
    float *kbuf = qbuf + D;     /* D */
    float *vbuf = kbuf + D;     /* Dv */
    float *acc = vbuf + Dv;     /* Dv */

    int64_t r0, r1;
    loom__range(loom_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        /* dst row (h, j, s) */
        int64_t h = r % H, j = (r / H) % Nq, s = r / (H * Nq);
        int64_t hk = h / group;
        const float slope = alibi_slope(max_bias, H, h);
        bool f16;
        const float *qr = row_view(q, loom__at(q, 0, j, h, s), D, qbuf, &f16);
        const char *mrow = mask ? loom__at(mask, 0, j, h % mask->ne[2], s % mask->ne[3]) : NULL;

        float M = -INFINITY, S = 0.0f;
        memset(acc, 0, (size_t)Dv * sizeof *acc);
        for (int64_t i = 0; i < Nkv; i++) {
            float mv = mrow ? read_mask(mask, mrow, i) : 0.0f;
            if (mv == -INFINITY) continue;
            bool kf16, vf16;
            const void *kr = row_view(k, loom__at(k, 0, i, hk, s), D, kbuf, &kf16);
            float z;
            if (kf16)
                simd->dot_f16(D, kr, qr, 0, 1, &z);
            else
                simd->dot_f32(D, kr, qr, 0, 1, &z);
            z *= scale;
            if (softcap > 0.0f) z = softcap * tanhf(z / softcap);
            z += slope * mv;
            if (z == -INFINITY || z != z) continue;
            float vs;
            if (z > M) {
                float ms = expf(M - z); /* 0 on the first key */
                if (ms != 1.0f) simd->vec_scale(Dv, acc, acc, ms, 0.0f);
                S *= ms;
                M = z;
                vs = 1.0f;
            } else {
                vs = expf(z - M);
            }
            const void *vr = row_view(v, loom__at(v, 0, i, hk, s), Dv, vbuf, &vf16);
            if (vf16)
                simd->vec_mad_f16(Dv, acc, vr, vs);
            else
                simd->vec_mad_f32(Dv, acc, vr, vs);
            S += vs;
        }
        if (sinks) {
            float sk;
            memcpy(&sk, (const char *)sinks->data + h * (int64_t)sinks->nb[0], sizeof sk);
            if (sk > M) {
                float ms = expf(M - sk);
                simd->vec_scale(Dv, acc, acc, ms, 0.0f);
                S = S * ms + 1.0f;
                M = sk;
            } else {
                S += expf(sk - M);
            }
        }
        char *y = loom__at(dst, 0, h, j, s);
        const float inv = S > 0.0f ? 1.0f / S : 0.0f;
        for (int64_t d = 0; d < Dv; d++) {
            float o = acc[d] * inv;
            memcpy(y + d * (int64_t)dst->nb[0], &o, sizeof o);
        }
    }
}
