/*
 * core-impl.h: loom core internals that other loom packages (backends, scheduler, meta)
 * may use, but an engine linking loom never sees. Holds the inline fp16/bf16 converters and
 * the fp16 lookup table for kernels, the Q8_0/Q4_0 row (de)quantisers, the ALiBi slope of
 * docs/ops.md, and the tensor constructors the op builders are made of.
 *
 * Conventions kept by every core object:
 * - a view's view_src is always the storage owner (never another view), view_offs is the
 *   byte offset into it, and data = view_src->data + view_offs once the owner has data;
 * - a tensor created by an op builder has op, op_params and src[] set, everything else
 *   zero (no buffer, no flags) unless it is a view.
 */
#ifndef LOOM_CORE_IMPL_H
#define LOOM_CORE_IMPL_H

#include <math.h>
#include <string.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arena alignment of tensor data and of every arena object (bytes). */
#define LOOM__MEM_ALIGN 64

static inline size_t loom__align_up(size_t x, size_t a) {
    return (x + a - 1) & ~(a - 1);
}

/* ---------------------------------------------------------------- fp16 / bf16 */

static inline uint32_t loom__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float loom__f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE binary16 -> binary32, exact (subnormals, inf and NaN payloads included). */
static inline float loom__fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return loom__f32_from_bits(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return loom__f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) return loom__f32_from_bits(sign);
    /* subnormal: mant * 2^-24, exact in binary32 */
    float v = (float)mant * (1.0f / 16777216.0f);
    return sign ? -v : v;
}

/* binary32 -> binary16, round to nearest even; overflow -> inf; NaN stays a (quiet) NaN
 * with its sign and top payload bits. */
static inline uint16_t loom__fp32_to_fp16(float f) {
    uint32_t x = loom__f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 65536: inf */
    if (ax < 0x38800000u) {
        /* below 2^-14: the result is subnormal or zero. Adding 0.5f puts the value's
         * 2^-24 units in the low mantissa bits, rounded to nearest even by the FPU. */
        float v = loom__f32_from_bits(ax) + 0.5f;
        return (uint16_t)(sign | (loom__f32_bits(v) - 0x3f000000u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + odd;              /* rebias the exponent (-112 << 23) and round */
    return (uint16_t)(sign | (ax >> 13)); /* a carry into exponent 31 yields inf */
}

static inline float loom__bf16_to_fp32(uint16_t h) {
    return loom__f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t loom__fp32_to_bf16(float f) {
    uint32_t x = loom__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* True when one of the n floats is NaN or infinite. An activation block (Q8_0, Q8_1, Q8_K,
 * the CPU's Q8 rows) holding one quantises to a NaN scale with zero quants, so every dot
 * that reads it is NaN: a max that skips NaN would leave a silently finite result, and
 * converting NaN or Inf to an integer is undefined. (x * 0 is NaN exactly for NaN and Inf.) */
static inline bool loom__any_nonfinite(const float *x, int64_t n) {
    float z = 0.0f;
    for (int64_t i = 0; i < n; i++)
        z += x[i] * 0.0f;
    return z != z;
}

/* All 65536 fp16 values as floats (256 KiB, built once, thread-safe). */
const float *loom__fp16_table(void);

/* ---------------------------------------------------------------- quantisation */

/* Exactly docs/ops.md; n must be a multiple of 32. */
void loom__quantize_row_q8_0(const float *x, loom_block_q8_0 *y, int64_t n);
void loom__dequantize_row_q8_0(const loom_block_q8_0 *x, float *y, int64_t n);
void loom__quantize_row_q4_0(const float *x, loom_block_q4_0 *y, int64_t n);
void loom__dequantize_row_q4_0(const loom_block_q4_0 *x, float *y, int64_t n);

/* The other block types (quants-legacy.c, quants-k.c): GGUF layouts, loom's quantisers;
 * n a multiple of the block length. */
#define LOOM__QUANT_DECL(t)                                                                        \
    void loom__quantize_row_##t(const float *x, loom_block_##t *y, int64_t n);                     \
    void loom__dequantize_row_##t(const loom_block_##t *x, float *y, int64_t n);
LOOM__QUANT_DECL(q4_1)
LOOM__QUANT_DECL(q5_0)
LOOM__QUANT_DECL(q5_1)
LOOM__QUANT_DECL(q8_1)
LOOM__QUANT_DECL(iq4_nl)
LOOM__QUANT_DECL(mxfp4)
LOOM__QUANT_DECL(q2_K)
LOOM__QUANT_DECL(q3_K)
LOOM__QUANT_DECL(q4_K)
LOOM__QUANT_DECL(q5_K)
LOOM__QUANT_DECL(q6_K)
LOOM__QUANT_DECL(q8_K)
LOOM__QUANT_DECL(iq4_xs)
#undef LOOM__QUANT_DECL
int loom__grid_nearest(const int8_t *grid, int n, float v);
float loom__quantize_iq4nl_group(const float *x, int n, int *q);
float loom__e8m0_half(uint8_t e);
void loom__q3k_scales_unpack(const uint8_t in[12], int out[16]);
void loom__k4_scale_min(int j, const uint8_t *q, int *sc, int *m);
int loom__iq4xs_scale(const loom_block_iq4_xs *x, int s);

/* The ALiBi slope of head h among n_head heads (docs/ops.md, SOFT_MAX); 1 when
 * max_bias <= 0. */
float loom__alibi_slope(float max_bias, int64_t n_head, int64_t h);

/* ---------------------------------------------------------------- tensors */

/* Byte address of element (i0, i1, i2, i3) of a host-resident plain (non-block) tensor. */
static inline void *loom__elem_ptr(const loom_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                                   int64_t i3) {
    return (char *)t->data + i0 * (int64_t)t->nb[0] + i1 * (int64_t)t->nb[1] +
           i2 * (int64_t)t->nb[2] + i3 * (int64_t)t->nb[3];
}

/* Writes "[ne0, ne1, ne2, ne3]" into buf (at least 96 bytes is always enough). */
const char *loom__shape_str(const loom_tensor *t, char *buf, size_t size);

/* A new tensor of `type`/`ne` in ctx. With view_src it is a view at byte offset view_offs
 * (chained to view_src's own owner) with no data of its own and contiguous strides
 * (callers overwrite nb for strided views). NULL + loom_error (LOOM_ERR_FULL naming sizes,
 * LOOM_ERR_SHAPE/INVALID_ARG for bad shapes) on failure. */
loom_tensor *loom__new_tensor_impl(loom_ctx *ctx, loom_type type, int n_dims, const int64_t *ne,
                                   loom_tensor *view_src, size_t view_offs);

/* A new contiguous result tensor with op and the first n_src sources set (NULL entries
 * allowed). NULL + loom_error on failure. */
loom_tensor *loom__new_op_tensor(loom_ctx *ctx, loom_type type, const int64_t ne[LOOM_MAX_DIMS],
                                 loom_op op, int n_src, loom_tensor *const *srcs);

/* ---------------------------------------------------------------- core-internal */

/* Op builder checks (ops*.c). Each records an error naming the op, the operand (`what`,
 * e.g. "a") and its tensor name, and returns false:
 * - need: t is NULL. The error already recorded is kept (a failed builder upstream); if
 *   none is, LOOM_ERR_INVALID_ARG "<op>: <what> is NULL".
 * - need_type: t->type is not `type` (LOOM_ERR_TYPE).
 * - need_float: t->type is not F32/F16/BF16/Q8_0/Q4_0 (LOOM_ERR_TYPE). */
bool loom__op_need(const char *op, const char *what, const loom_tensor *t);
bool loom__op_need_type(const char *op, const char *what, const loom_tensor *t, loom_type type);
bool loom__op_need_float(const char *op, const char *what, const loom_tensor *t);
/* A view of a (its owner, at a's offset + offs) with shape ne and strides nb (NULL:
 * contiguous), op and src[0] = a. Checks it stays inside the owner (LOOM_ERR_SHAPE). */
loom_tensor *loom__new_view(loom_ctx *ctx, const char *opname, loom_tensor *a, loom_type type,
                            const int64_t ne[LOOM_MAX_DIMS], const size_t *nb, size_t offs,
                            loom_op op);

/* Core-internal (ctx.c for graph.c): reserves an arena object with `payload` bytes for a
 * graph; NULL when full, with the free bytes in *free_out. */
void *loom__ctx_alloc_graph(loom_ctx *ctx, size_t payload, size_t *free_out);
/* Arena bytes of an object with `payload` bytes. */
size_t loom__graph_obj_size(size_t payload);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_CORE_IMPL_H */
