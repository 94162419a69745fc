/*
 * Device helpers shared by the CUDA kernel files: element addressing through ne/nb, loads
 * and stores of every storage type as f32 (F16/BF16 conversions bit-identical to the CPU
 * backend's, Q8_0/Q4_0 dequantisation and quantisation exactly as docs/ops.md defines
 * them), row-major unravelling, warp and block reductions, and launch-size helpers.
 * Included only by the .cu files of backends/cuda/.
 */
#ifndef LOOM_CUDA_KERNELS_COMMON_CUH
#define LOOM_CUDA_KERNELS_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backends/cuda/kernels.h"

#define CU_BLOCK 256        /* threads per block of the elementwise and row kernels */
#define CU_MAX_GRID 65535LL /* blocks per launch; kernels loop (grid-stride) past it */
#define CU_FULL_MASK 0xffffffffu

/* Blocks for n work items of CU_BLOCK threads each (at least 1, at most CU_MAX_GRID). */
static inline unsigned cu_blocks(int64_t n, int64_t per_block = CU_BLOCK) {
    int64_t b = (n + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > CU_MAX_GRID) b = CU_MAX_GRID;
    return (unsigned)b;
}

/* Grid-stride loop over [0, n) by thread. */
#define CU_FOR(e, n)                                                                               \
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < (n);                      \
         e += (int64_t)gridDim.x * blockDim.x)

/* Grid-stride loop over [0, n) by block (rows). */
#define CU_FOR_BLOCK(r, n) for (int64_t r = blockIdx.x; r < (n); r += gridDim.x)

/* ---------------------------------------------------------------- addressing */

static __device__ __forceinline__ char *cu_at(const loom_cu_t &t, int64_t i0, int64_t i1,
                                              int64_t i2, int64_t i3) {
    return t.data + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/* Row-major (i0 fastest) index e -> (i0, i1, i2, i3) over ne. */
static __device__ __forceinline__ void cu_unravel(const int64_t *ne, int64_t e, int64_t *i) {
    i[0] = e % ne[0];
    e /= ne[0];
    i[1] = e % ne[1];
    e /= ne[1];
    i[2] = e % ne[2];
    i[3] = e / ne[2];
}

static inline int64_t cu_nelements(const loom_cu_t &t) {
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
}

static inline int64_t cu_nrows(const loom_cu_t &t) {
    return t.ne[1] * t.ne[2] * t.ne[3];
}

/* ---------------------------------------------------------------- conversions */

/* NaNs by bits (sign and payload kept, as the CPU's loom__fp16_to_fp32): the hardware
 * conversion may canonicalise them. */
static __device__ __forceinline__ float cu_fp16_to_f32(uint16_t h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u |
                               ((uint32_t)(h & 0x3ffu) << 13));
    return __half2float(__ushort_as_half(h));
}

/* Round to nearest even, overflow to infinity: as the CPU backend's loom__fp32_to_fp16,
 * NaN included (a quiet NaN with its sign and top payload bits, where __float2half_rn
 * would give the canonical 0x7fff). */
static __device__ __forceinline__ uint16_t cu_f32_to_fp16(float f) {
    const uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
    return __half_as_ushort(__float2half_rn(f));
}

static __device__ __forceinline__ float cu_bf16_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays a quiet NaN (the CPU backend's bit recipe). */
static __device__ __forceinline__ uint16_t cu_f32_to_bf16(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#include "backends/cuda/kernels-quant.cuh"

/* The fp16 scale at the start of a Q8_0/Q4_0 block (little-endian, read bytewise so a
 * block needs no alignment). */
static __device__ __forceinline__ float cu_block_d(const char *blk) {
    const unsigned char *u = (const unsigned char *)blk;
    return cu_fp16_to_f32((uint16_t)(u[0] | (u[1] << 8)));
}

/* Value l (0..31) of a Q8_0 block with scale d. */
static __device__ __forceinline__ float cu_q8_0_val(const char *blk, float d, int l) {
    return (float)(int8_t)blk[2 + l] * d;
}

/* Value l (0..31) of a Q4_0 block: qs[j] low nibble is x[j], high nibble x[j + 16]. */
static __device__ __forceinline__ float cu_q4_0_val(const char *blk, float d, int l) {
    unsigned char b = (unsigned char)blk[2 + (l & 15)];
    int q = l < 16 ? (b & 0x0f) : (b >> 4);
    return (float)(q - 8) * d;
}

/* Element (i0, i1, i2, i3) of t as f32: F32, F16, BF16, I32 and every block type (i0 counts
 * values; the block is i0 / cu_qk). */
static __device__ __forceinline__ float cu_load_f(const loom_cu_t &t, int64_t i0, int64_t i1,
                                                  int64_t i2, int64_t i3) {
    switch (t.type) {
    case LOOM_CU_F32:
        return *(const float *)cu_at(t, i0, i1, i2, i3);
    case LOOM_CU_F16:
        return cu_fp16_to_f32(*(const uint16_t *)cu_at(t, i0, i1, i2, i3));
    case LOOM_CU_BF16:
        return cu_bf16_to_f32(*(const uint16_t *)cu_at(t, i0, i1, i2, i3));
    case LOOM_CU_I32:
        return (float)*(const int32_t *)cu_at(t, i0, i1, i2, i3);
    case LOOM_CU_Q8_0: {
        const char *blk = cu_at(t, i0 / LOOM_CU_QK, i1, i2, i3);
        return cu_q8_0_val(blk, cu_block_d(blk), (int)(i0 % LOOM_CU_QK));
    }
    case LOOM_CU_Q4_0: {
        const char *blk = cu_at(t, i0 / LOOM_CU_QK, i1, i2, i3);
        return cu_q4_0_val(blk, cu_block_d(blk), (int)(i0 % LOOM_CU_QK));
    }
    default:
        if (cu_is_quant(t.type)) { /* the other block types (kernels-quant.cuh) */
            const int qk = cu_qk(t.type);
            return cu_qval(t.type, cu_at(t, i0 / qk, i1, i2, i3), (int)(i0 % qk));
        }
        return 0.0f;
    }
}

/* An F32/F16 element at p (masks, K and V rows). */
static __device__ __forceinline__ float cu_load_f_ptr(const char *p, int type) {
    if (type == LOOM_CU_F16) return cu_fp16_to_f32(*(const uint16_t *)p);
    if (type == LOOM_CU_BF16) return cu_bf16_to_f32(*(const uint16_t *)p);
    return *(const float *)p;
}

/* Stores v at p as F32, F16 or BF16. */
static __device__ __forceinline__ void cu_store_f(char *p, int type, float v) {
    if (type == LOOM_CU_F16)
        *(uint16_t *)p = cu_f32_to_fp16(v);
    else if (type == LOOM_CU_BF16)
        *(uint16_t *)p = cu_f32_to_bf16(v);
    else
        *(float *)p = v;
}

/* Quantises 32 values into the block at out (docs/ops.md; bit-identical to the CPU). */
static __device__ __forceinline__ void cu_quantize_q8_0(const float *v, char *out) {
    float amax = 0.0f;
    for (int l = 0; l < LOOM_CU_QK; l++)
        amax = fmaxf(amax, fabsf(v[l]));
    const float d = amax / 127.0f;
    const uint16_t h = cu_f32_to_fp16(d);
    out[0] = (char)(h & 0xff);
    out[1] = (char)(h >> 8);
    for (int l = 0; l < LOOM_CU_QK; l++)
        out[2 + l] = (char)(int8_t)(d != 0.0f ? roundf(__fdiv_rn(v[l], d)) : 0.0f);
}

static __device__ __forceinline__ void cu_quantize_q4_0(const float *v, char *out) {
    float amax = 0.0f, max = 0.0f;
    for (int l = 0; l < LOOM_CU_QK; l++) {
        if (fabsf(v[l]) > amax) {
            amax = fabsf(v[l]);
            max = v[l];
        }
    }
    const float d = __fdiv_rn(max, -8.0f);
    const uint16_t h = cu_f32_to_fp16(d);
    out[0] = (char)(h & 0xff);
    out[1] = (char)(h >> 8);
    for (int l = 0; l < LOOM_CU_QK / 2; l++) {
        int q0 = 8, q1 = 8;
        if (d != 0.0f) {
            q0 = (int)__fadd_rn(__fdiv_rn(v[l], d), 8.5f);
            q1 = (int)__fadd_rn(__fdiv_rn(v[l + LOOM_CU_QK / 2], d), 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
        }
        out[2 + l] = (char)(uint8_t)(q0 | (q1 << 4));
    }
}

/* ---------------------------------------------------------------- reductions */

template <typename T> static __device__ __forceinline__ T cu_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(CU_FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float cu_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(CU_FULL_MASK, v, o));
    return v;
}

/* Sum over the block (every thread gets it). blockDim.x a multiple of 32, <= 1024. */
template <typename T> static __device__ T cu_block_sum(T v, T *sh /* [32] shared */) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    T r = lane < nw ? sh[lane] : (T)0;
    r = cu_warp_sum(r);
    return r;
}

/* Max over the block (every thread gets it; NaN is ignored, as fmaxf does). */
static __device__ float cu_block_max(float v, float *sh /* [32] shared */) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    r = cu_warp_max(r);
    return r;
}

/* Max that propagates NaN (softmax and attention: NaN in, NaN out). */
static __device__ __forceinline__ float cu_fmax_nan(float a, float b) {
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

/* Max over the block that propagates NaN (every thread gets it). */
static __device__ float cu_block_max_nan(float v, float *sh /* [32] shared */) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v = cu_fmax_nan(v, __shfl_xor_sync(CU_FULL_MASK, v, o));
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1)
        r = cu_fmax_nan(r, __shfl_xor_sync(CU_FULL_MASK, r, o));
    return r;
}

/* ALiBi slope of head h (1 when max_bias <= 0), as docs/ops.md defines it. */
static __device__ __forceinline__ float cu_alibi_slope(float max_bias, int64_t n_head, int64_t h) {
    if (max_bias <= 0.0f) return 1.0f;
    const int64_t n_head_log2 = (int64_t)1 << (int)floor(log2((double)n_head));
    const float m0 = powf(2.0f, -max_bias / (float)n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n_head_log2);
    return h < n_head_log2 ? powf(m0, (float)(h + 1))
                           : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

/* Records the first out-of-range index of a launch (see loom_cu_err). */
static __device__ __forceinline__ void cu_report(loom_cu_err *err, int op, long long node,
                                                 long long value, long long limit) {
    if (!err) return;
    if (atomicCAS(&err->code, 0ull, (unsigned long long)op) == 0ull) {
        err->node = node;
        err->value = value;
        err->limit = limit;
    }
}

static inline cudaError_t cu_launched(void) {
    return cudaGetLastError();
}

#endif /* LOOM_CUDA_KERNELS_COMMON_CUH */
