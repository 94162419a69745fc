/*
 * quants-k.c: the scalar reference quantisers and dequantisers of the 256-element
 * super-block types: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K (activations) and IQ4_XS. Layouts
 * are GGUF's (include/loom/core.h); element e of a super-block lives at:
 *   Q2_K/Q3_K  2-bit q in qs[(e / 128) * 32 + e % 32] >> 2 * ((e % 128) / 32); sub-block e/16;
 *              Q3_K's third bit is hmask[e % 32] bit e / 32
 *   Q4_K/Q5_K  nibble in qs[(e / 64) * 32 + e % 32] (high when e % 64 >= 32); sub-block e/32;
 *              Q5_K's fifth bit is qh[e % 32] bit e / 32
 *   Q6_K       low nibble in ql[(e/128)*64 + e%32 + 32*(g&1)] (high when g >= 2, g = e%128/32),
 *              2 high bits in qh[(e/128)*32 + e%32] >> 2g; sub-block e/16
 *   IQ4_XS     as IQ4_NL per sub-block of 32.
 * The quantisers are loom's own: per sub-block scale (and min) on the value range, then the
 * sub-block scales quantised against the super-block scale, then the values re-quantised
 * with the scales as stored.
 */
#include "core/core-impl.h"

static int nearest_int(float x) {
    return (int)lrintf(x);
}

static int clampi(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, m = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            m = x[j];
        }
    }
    return m;
}

/* Sub-block of n values as x = scale * q - min, q in [0, qmax], min >= 0 (the range is
 * widened to include 0 so the min is never negative, as the K-quants store it). */
static void range_scale_min(const float *x, int n, int qmax, float *scale, float *min) {
    float mn = 0.0f, mx = 0.0f;
    for (int j = 0; j < n; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
    }
    *scale = (mx - mn) / (float)qmax;
    *min = -mn;
}

/* ---------------------------------------------------------------- Q8_K */

/* d = max / -127 for the x of largest |x|, q = round(x / d) capped at 127 (so the largest
 * magnitude maps to -127 exactly); bsums per 16. */
void loom__quantize_row_q8_K(const float *x, loom_block_q8_K *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        if (loom__any_nonfinite(x, LOOM_QK_K)) { /* NaN scale: every dot reading it is NaN */
            memset(&y[b], 0, sizeof y[b]);
            y[b].d = NAN;
            continue;
        }
        const float m = signed_absmax(x, LOOM_QK_K);
        if (m == 0.0f || !isfinite(127.0f / m)) { /* zero, or 1 / scale overflows: zero */
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / m;
        for (int j = 0; j < LOOM_QK_K; j++) {
            int v = nearest_int(iscale * x[j]);
            y[b].qs[j] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
        }
        for (int j = 0; j < LOOM_QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += y[b].qs[16 * j + l];
            y[b].bsums[j] = (int16_t)s;
        }
        y[b].d = 1.0f / iscale;
    }
}

void loom__dequantize_row_q8_K(const loom_block_q8_K *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, y += LOOM_QK_K)
        for (int j = 0; j < LOOM_QK_K; j++)
            y[j] = x[b].d * (float)x[b].qs[j];
}

/* ---------------------------------------------------------------- Q2_K */

static void q2_put(uint8_t *qs, int e, int q) {
    qs[(e / 128) * 32 + e % 32] |= (uint8_t)(q << (2 * ((e % 128) / 32)));
}

static int q2_get(const uint8_t *qs, int e) {
    return (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

void loom__quantize_row_q2_K(const float *x, loom_block_q2_K *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        float sc[16], mn[16], maxsc = 0.0f, maxmn = 0.0f;
        for (int s = 0; s < 16; s++) {
            range_scale_min(x + 16 * s, 16, 3, &sc[s], &mn[s]);
            maxsc = fmaxf(maxsc, sc[s]);
            maxmn = fmaxf(maxmn, mn[s]);
        }
        loom_block_q2_K *o = &y[b];
        memset(o, 0, sizeof *o);
        o->d = loom__fp32_to_fp16(maxsc / 15.0f);
        o->dmin = loom__fp32_to_fp16(maxmn / 15.0f);
        const float d = loom__fp16_to_fp32(o->d), dmin = loom__fp16_to_fp32(o->dmin);
        for (int s = 0; s < 16; s++) {
            int ls = d ? clampi(nearest_int(sc[s] / d), 0, 15) : 0;
            int lm = dmin ? clampi(nearest_int(mn[s] / dmin), 0, 15) : 0;
            o->scales[s] = (uint8_t)(ls | (lm << 4));
            const float dl = d * (float)ls, ml = dmin * (float)lm;
            for (int l = 0; l < 16; l++) {
                int e = 16 * s + l;
                int q = dl ? clampi(nearest_int((x[e] + ml) / dl), 0, 3) : 0;
                q2_put(o->qs, e, q);
            }
        }
    }
}

void loom__dequantize_row_q2_K(const loom_block_q2_K *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, y += LOOM_QK_K) {
        const float d = loom__fp16_to_fp32(x[b].d), dmin = loom__fp16_to_fp32(x[b].dmin);
        for (int e = 0; e < LOOM_QK_K; e++) {
            const uint8_t s = x[b].scales[e / 16];
            y[e] = d * (float)(s & 0x0f) * (float)q2_get(x[b].qs, e) - dmin * (float)(s >> 4);
        }
    }
}

/* ---------------------------------------------------------------- Q3_K */

/* 16 six-bit values in 12 bytes: low nibbles of 0..7 in bytes 0..7, of 8..15 in the high
 * nibbles of bytes 0..7; the 2 high bits of value j in byte 8 + j % 4 at bit 2 * (j / 4). */
void loom__q3k_scales_unpack(const uint8_t in[12], int out[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? in[j] & 0x0f : in[j - 8] >> 4;
        int hi = (in[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = lo | (hi << 4);
    }
}

static void q3k_scales_pack(const int v[16], uint8_t out[12]) {
    memset(out, 0, 12);
    for (int j = 0; j < 16; j++) {
        if (j < 8)
            out[j] |= (uint8_t)(v[j] & 0x0f);
        else
            out[j - 8] |= (uint8_t)((v[j] & 0x0f) << 4);
        out[8 + j % 4] |= (uint8_t)(((v[j] >> 4) & 3) << (2 * (j / 4)));
    }
}

void loom__quantize_row_q3_K(const float *x, loom_block_q3_K *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        float sc[16];
        for (int s = 0; s < 16; s++) /* q in [-4, 3]: the largest |x| maps to -4 */
            sc[s] = signed_absmax(x + 16 * s, 16) / -4.0f;
        const float msc = signed_absmax(sc, 16);
        loom_block_q3_K *o = &y[b];
        memset(o, 0, sizeof *o);
        o->d = loom__fp32_to_fp16(msc / -32.0f);
        const float d = loom__fp16_to_fp32(o->d);
        int ls[16];
        for (int s = 0; s < 16; s++)
            ls[s] = d ? clampi(nearest_int(sc[s] / d), -32, 31) + 32 : 32;
        q3k_scales_pack(ls, o->scales);
        for (int e = 0; e < LOOM_QK_K; e++) {
            const float dl = d * (float)(ls[e / 16] - 32);
            int q = dl ? clampi(nearest_int(x[e] / dl), -4, 3) : 0;
            q += 4; /* 0..7: low 2 bits in qs, bit 2 in hmask */
            q2_put(o->qs, e, q & 3);
            if (q & 4) o->hmask[e % 32] |= (uint8_t)(1u << (e / 32));
        }
    }
}

void loom__dequantize_row_q3_K(const loom_block_q3_K *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, y += LOOM_QK_K) {
        const float d = loom__fp16_to_fp32(x[b].d);
        int ls[16];
        loom__q3k_scales_unpack(x[b].scales, ls);
        for (int e = 0; e < LOOM_QK_K; e++) {
            int q = q2_get(x[b].qs, e) - ((x[b].hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
            y[e] = d * (float)(ls[e / 16] - 32) * (float)q;
        }
    }
}

/* ---------------------------------------------------------------- Q4_K / Q5_K */

/* Scale and min of sub-block j (0..7) from the 12 packed bytes. */
void loom__k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void k4_scales_pack(const int sc[8], const int m[8], uint8_t q[12]) {
    memset(q, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] |= (uint8_t)sc[j];
            q[j + 4] |= (uint8_t)m[j];
        } else {
            q[j + 4] = (uint8_t)((sc[j] & 0x0f) | ((m[j] & 0x0f) << 4));
            q[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            q[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

static int k4_qs_index(int e) {
    return (e / 64) * 32 + e % 32;
}

static int k4_qs_shift(int e) {
    return e % 64 >= 32 ? 4 : 0;
}

/* Q4_K (bits 4) and Q5_K (bits 5) share their scales and value order. */
static void quantize_k45(const float *x, int bits, uint16_t *dp, uint16_t *dminp,
                         uint8_t scales[12], int q[LOOM_QK_K]) {
    const int qmax = (1 << bits) - 1;
    float sc[8], mn[8], maxsc = 0.0f, maxmn = 0.0f;
    for (int s = 0; s < 8; s++) {
        range_scale_min(x + 32 * s, 32, qmax, &sc[s], &mn[s]);
        maxsc = fmaxf(maxsc, sc[s]);
        maxmn = fmaxf(maxmn, mn[s]);
    }
    *dp = loom__fp32_to_fp16(maxsc / 63.0f);
    *dminp = loom__fp32_to_fp16(maxmn / 63.0f);
    const float d = loom__fp16_to_fp32(*dp), dmin = loom__fp16_to_fp32(*dminp);
    int ls[8], lm[8];
    for (int s = 0; s < 8; s++) {
        ls[s] = d ? clampi(nearest_int(sc[s] / d), 0, 63) : 0;
        lm[s] = dmin ? clampi(nearest_int(mn[s] / dmin), 0, 63) : 0;
    }
    k4_scales_pack(ls, lm, scales);
    for (int e = 0; e < LOOM_QK_K; e++) {
        const float dl = d * (float)ls[e / 32], ml = dmin * (float)lm[e / 32];
        q[e] = dl ? clampi(nearest_int((x[e] + ml) / dl), 0, qmax) : 0;
    }
}

void loom__quantize_row_q4_K(const float *x, loom_block_q4_K *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        int q[LOOM_QK_K];
        loom_block_q4_K *o = &y[b];
        memset(o, 0, sizeof *o);
        quantize_k45(x, 4, &o->d, &o->dmin, o->scales, q);
        for (int e = 0; e < LOOM_QK_K; e++)
            o->qs[k4_qs_index(e)] |= (uint8_t)(q[e] << k4_qs_shift(e));
    }
}

void loom__dequantize_row_q4_K(const loom_block_q4_K *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, y += LOOM_QK_K) {
        const float d = loom__fp16_to_fp32(x[b].d), dmin = loom__fp16_to_fp32(x[b].dmin);
        for (int s = 0; s < 8; s++) {
            int sc, m;
            loom__k4_scale_min(s, x[b].scales, &sc, &m);
            for (int l = 0; l < 32; l++) {
                int e = 32 * s + l;
                int q = (x[b].qs[k4_qs_index(e)] >> k4_qs_shift(e)) & 0x0f;
                y[e] = d * (float)sc * (float)q - dmin * (float)m;
            }
        }
    }
}

void loom__quantize_row_q5_K(const float *x, loom_block_q5_K *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        int q[LOOM_QK_K];
        loom_block_q5_K *o = &y[b];
        memset(o, 0, sizeof *o);
        quantize_k45(x, 5, &o->d, &o->dmin, o->scales, q);
        for (int e = 0; e < LOOM_QK_K; e++) {
            o->qs[k4_qs_index(e)] |= (uint8_t)((q[e] & 0x0f) << k4_qs_shift(e));
            if (q[e] & 0x10) o->qh[e % 32] |= (uint8_t)(1u << (e / 32));
        }
    }
}

void loom__dequantize_row_q5_K(const loom_block_q5_K *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, y += LOOM_QK_K) {
        const float d = loom__fp16_to_fp32(x[b].d), dmin = loom__fp16_to_fp32(x[b].dmin);
        for (int s = 0; s < 8; s++) {
            int sc, m;
            loom__k4_scale_min(s, x[b].scales, &sc, &m);
            for (int l = 0; l < 32; l++) {
                int e = 32 * s + l;
                int q = ((x[b].qs[k4_qs_index(e)] >> k4_qs_shift(e)) & 0x0f) |
                        (((x[b].qh[e % 32] >> (e / 32)) & 1) << 4);
                y[e] = d * (float)sc * (float)q - dmin * (float)m;
            }
        }
    }
}

/* ---------------------------------------------------------------- Q6_K */

static void q6_index(int e, int *il, int *ish, int *ih, int *hsh) {
    const int n = e / 128, w = e % 128, g = w / 32, l = w % 32;
    *il = n * 64 + l + 32 * (g & 1);
    *ish = g >= 2 ? 4 : 0;
    *ih = n * 32 + l;
    *hsh = 2 * g;
}

void loom__quantize_row_q6_K(const float *x, loom_block_q6_K *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        float sc[16];
        for (int s = 0; s < 16; s++) /* q - 32 in [-32, 31]: the largest |x| maps to -32 */
            sc[s] = signed_absmax(x + 16 * s, 16) / -32.0f;
        const float msc = signed_absmax(sc, 16);
        loom_block_q6_K *o = &y[b];
        memset(o, 0, sizeof *o);
        o->d = loom__fp32_to_fp16(msc / -128.0f);
        const float d = loom__fp16_to_fp32(o->d);
        for (int s = 0; s < 16; s++)
            o->scales[s] = (int8_t)(d ? clampi(nearest_int(sc[s] / d), -128, 127) : 0);
        for (int e = 0; e < LOOM_QK_K; e++) {
            const float dl = d * (float)o->scales[e / 16];
            int q = (dl ? clampi(nearest_int(x[e] / dl), -32, 31) : 0) + 32;
            int il, ish, ih, hsh;
            q6_index(e, &il, &ish, &ih, &hsh);
            o->ql[il] |= (uint8_t)((q & 0x0f) << ish);
            o->qh[ih] |= (uint8_t)((q >> 4) << hsh);
        }
    }
}

void loom__dequantize_row_q6_K(const loom_block_q6_K *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, y += LOOM_QK_K) {
        const float d = loom__fp16_to_fp32(x[b].d);
        for (int e = 0; e < LOOM_QK_K; e++) {
            int il, ish, ih, hsh;
            q6_index(e, &il, &ish, &ih, &hsh);
            int q = ((x[b].ql[il] >> ish) & 0x0f) | (((x[b].qh[ih] >> hsh) & 3) << 4);
            y[e] = d * (float)x[b].scales[e / 16] * (float)(q - 32);
        }
    }
}

/* ---------------------------------------------------------------- IQ4_XS */

void loom__quantize_row_iq4_xs(const float *x, loom_block_iq4_xs *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, x += LOOM_QK_K) {
        float sc[8];
        int q[32];
        for (int s = 0; s < 8; s++)
            sc[s] = loom__quantize_iq4nl_group(x + 32 * s, 32, q);
        const float msc = signed_absmax(sc, 8);
        loom_block_iq4_xs *o = &y[b];
        memset(o, 0, sizeof *o);
        o->d = loom__fp32_to_fp16(msc / -32.0f);
        const float d = loom__fp16_to_fp32(o->d);
        for (int s = 0; s < 8; s++) {
            const int ls = d ? clampi(nearest_int(sc[s] / d), -32, 31) + 32 : 32;
            o->scales_l[s / 2] |= (uint8_t)((ls & 0x0f) << (4 * (s % 2)));
            o->scales_h |= (uint16_t)((ls >> 4) << (2 * s));
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 32; j++)
                q[j] = loom__grid_nearest(loom_iq4nl_values, 16, dl ? x[32 * s + j] / dl : 0.0f);
            for (int j = 0; j < 16; j++)
                o->qs[16 * s + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
        }
    }
}

int loom__iq4xs_scale(const loom_block_iq4_xs *x, int s) {
    return (((x->scales_l[s / 2] >> (4 * (s % 2))) & 0x0f) |
            (((x->scales_h >> (2 * s)) & 3) << 4)) -
           32;
}

void loom__dequantize_row_iq4_xs(const loom_block_iq4_xs *x, float *y, int64_t n) {
    LOOM_ASSERT(n % LOOM_QK_K == 0);
    for (int64_t b = 0; b < n / LOOM_QK_K; b++, y += LOOM_QK_K) {
        const float d = loom__fp16_to_fp32(x[b].d);
        for (int s = 0; s < 8; s++) {
            const float dl = d * (float)loom__iq4xs_scale(&x[b], s);
            const uint8_t *qs = x[b].qs + 16 * s;
            for (int j = 0; j < 16; j++) {
                y[32 * s + j] = dl * (float)loom_iq4nl_values[qs[j] & 0x0f];
                y[32 * s + j + 16] = dl * (float)loom_iq4nl_values[qs[j] >> 4];
            }
        }
    }
}
