/*
 * The boundary between the CUDA backend's host code (C, compiled by the C compiler) and its
 * kernels (CUDA C++, compiled by nvcc): plain tensor descriptors passed by value, and one
 * launcher per kernel family. Every launcher only enqueues work on the given stream and
 * returns the launch status (cudaGetLastError after the launch); it never synchronises,
 * never allocates and never reads device memory from the host, so a sequence of launches
 * can be recorded into a CUDA graph unchanged.
 *
 * Semantics are exactly those of docs/ops.md (the CPU backend is the oracle): every
 * element is reached through ne/nb, so any source may be a strided view. Optional tensors
 * (a mask, sinks, frequency factors, the second GLU operand) are passed with data == NULL.
 * Kernels that follow indices (get_rows, set_rows, add_id, mul_mat_id) never read or write
 * out of range: a bad index is recorded in the loom_cu_err the backend passes (first one
 * wins) and that row is left untouched (or written as zeros, for results).
 */
#ifndef LOOM_CUDA_KERNELS_H
#define LOOM_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backends/cuda/kernels-math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor as the kernels see it: element (i0, i1, i2, i3) is at data + i0 nb0 + i1 nb1 +
 * i2 nb2 + i3 nb3 (for block types, i0 counts blocks in that formula). */
typedef struct loom_cu_t {
    char *data;
    int64_t ne[4];
    int64_t nb[4];
    int32_t type; /* enum loom_cu_type */
} loom_cu_t;

/* An error record in device memory, written by kernels that meet an out-of-range index:
 * code (enum loom_cu_err_code) says which kernel, node is the graph node index, value the
 * bad index, limit the bound it broke. code 0: no error. The first failing thread of a
 * launch wins (atomicCAS on code). */
typedef struct loom_cu_err {
    unsigned long long code;
    long long node;
    long long value;
    long long limit;
} loom_cu_err;

#define LOOM_CU_MAX_PEERS 16

/* The kernels' own names for storage types and operations (the kernel files include no
 * loom header; the host code maps loom_type / loom_op to these). */
enum loom_cu_type {
    LOOM_CU_F32 = 0,
    LOOM_CU_F16,
    LOOM_CU_BF16,
    LOOM_CU_Q8_0, /* blocks of 32: fp16 d, 32 x int8 */
    LOOM_CU_Q4_0, /* blocks of 32: fp16 d, 16 bytes of nibbles (low: x[j], high: x[j+16]) */
    LOOM_CU_I8,
    LOOM_CU_I16,
    LOOM_CU_I32,
    LOOM_CU_I64,
    /* The other GGUF block types (layouts in include/loom/core.h; kernels-quant.cuh). */
    LOOM_CU_Q4_1,   /* 32 values, 20 bytes */
    LOOM_CU_Q5_0,   /* 32 values, 22 bytes */
    LOOM_CU_Q5_1,   /* 32 values, 24 bytes */
    LOOM_CU_IQ4_NL, /* 32 values, 18 bytes */
    LOOM_CU_MXFP4,  /* 32 values, 17 bytes */
    LOOM_CU_Q2_K,   /* 256 values, 84 bytes */
    LOOM_CU_Q3_K,   /* 256 values, 110 bytes */
    LOOM_CU_Q4_K,   /* 256 values, 144 bytes */
    LOOM_CU_Q5_K,   /* 256 values, 176 bytes */
    LOOM_CU_Q6_K,   /* 256 values, 210 bytes */
    LOOM_CU_IQ4_XS, /* 256 values, 136 bytes */
    LOOM_CU_TYPE_COUNT
};
#define LOOM_CU_QK 32         /* values per Q8_0/Q4_0 block (and every 32-value type) */
#define LOOM_CU_QK_K 256      /* values per K-quant / IQ4_XS super-block */
#define LOOM_CU_Q8_0_BYTES 34 /* bytes per Q8_0 block */
#define LOOM_CU_Q4_0_BYTES 18 /* bytes per Q4_0 block */
#define LOOM_CU_Q4_1_BYTES 20
#define LOOM_CU_Q5_0_BYTES 22
#define LOOM_CU_Q5_1_BYTES 24
#define LOOM_CU_IQ4_NL_BYTES 18
#define LOOM_CU_MXFP4_BYTES 17
#define LOOM_CU_Q2_K_BYTES 84
#define LOOM_CU_Q3_K_BYTES 110
#define LOOM_CU_Q4_K_BYTES 144
#define LOOM_CU_Q5_K_BYTES 176
#define LOOM_CU_Q6_K_BYTES 210
#define LOOM_CU_IQ4_XS_BYTES 136

enum loom_cu_binary { LOOM_CU_ADD, LOOM_CU_SUB, LOOM_CU_MUL, LOOM_CU_DIV };
enum loom_cu_map {
    LOOM_CU_SCALE, /* x f0 + f1 */
    LOOM_CU_SQR,
    LOOM_CU_SQRT,
    LOOM_CU_CLAMP, /* min(max(x, f0), f1) */
    LOOM_CU_SILU,
    LOOM_CU_GELU, /* tanh approximation */
    LOOM_CU_RELU
};
enum loom_cu_glu { LOOM_CU_SWIGLU, LOOM_CU_GEGLU };
/* loom_cu_err.code: which kernel met a bad index. */
enum loom_cu_err_code {
    LOOM_CU_ERR_NONE = 0,
    LOOM_CU_ERR_GET_ROWS,
    LOOM_CU_ERR_SET_ROWS,
    LOOM_CU_ERR_ADD_ID,
    LOOM_CU_ERR_MUL_MAT_ID
};

/* Device pointers of up to LOOM_CU_MAX_PEERS peers, passed by value to a kernel. */
typedef struct loom_cu_ptrs {
    const float *p[LOOM_CU_MAX_PEERS];
} loom_cu_ptrs;

/* ---------------------------------------------------------------- kernels-basic.cu */

/* DUP / CONT / CPY: dst = src in row-major element order, converted to dst's type
 * (F32<->F16/BF16, F32->Q8_0/Q4_0, Q8_0/Q4_0->F32, or any type to itself; quantised rows
 * hold whole blocks). */
cudaError_t loom__cu_cpy(loom_cu_t dst, loom_cu_t src, cudaStream_t s);
/* ADD / SUB / MUL / DIV (op: enum loom_cu_binary) with b broadcast over a. */
cudaError_t loom__cu_binary(int op, loom_cu_t dst, loom_cu_t a, loom_cu_t b, cudaStream_t s);
cudaError_t loom__cu_add_id(loom_cu_t dst, loom_cu_t a, loom_cu_t b, loom_cu_t ids,
                            loom_cu_err *err, long long node, cudaStream_t s);
/* One-input maps (op: enum loom_cu_map). */
cudaError_t loom__cu_map(int op, float f0, float f1, loom_cu_t dst, loom_cu_t a, cudaStream_t s);
/* GLU (op: enum loom_cu_glu): split (b.data != NULL) or fused. */
cudaError_t loom__cu_glu(int op, int swapped, loom_cu_t dst, loom_cu_t a, loom_cu_t b,
                         cudaStream_t s);
cudaError_t loom__cu_fill(float v, loom_cu_t dst, cudaStream_t s);
/* SUM_ROWS (mean = 0) / MEAN (mean = 1). */
cudaError_t loom__cu_reduce_rows(int mean, loom_cu_t dst, loom_cu_t a, cudaStream_t s);
cudaError_t loom__cu_argmax(loom_cu_t dst, loom_cu_t a, cudaStream_t s);
/* NORM (rms = 0) / RMS_NORM (rms = 1). */
cudaError_t loom__cu_norm(int rms, float eps, loom_cu_t dst, loom_cu_t a, cudaStream_t s);
cudaError_t loom__cu_soft_max(float scale, float max_bias, loom_cu_t dst, loom_cu_t a,
                              loom_cu_t mask, loom_cu_t sinks, cudaStream_t s);
/* ARGSORT (keep = ne0) / TOP_K (keep = k, desc = 1), in the CPU's order, NaN included
 * (kernels-basic.cu). Rows of up to LOOM_CU_SORT_CHUNK sort in shared memory; longer rows
 * sort their chunks, then merge them through ws (device scratch of ws_bytes, at least
 * loom__cu_argsort_scratch(ne0, 1)), as many rows at a time as it holds. */
#define LOOM_CU_SORT_CHUNK 4096
#define LOOM_CU_SORT_SCRATCH_MAX ((size_t)64 << 20) /* rows beyond it wait for a later group */
cudaError_t loom__cu_argsort(int desc, int64_t keep, loom_cu_t dst, loom_cu_t a, int32_t *ws,
                             size_t ws_bytes, cudaStream_t s);
/* The scratch bytes loom__cu_argsort takes for nrows rows of n: two index buffers and a
 * flag per row, for as many rows as fit in LOOM_CU_SORT_SCRATCH_MAX (at least one). */
static inline size_t loom__cu_argsort_scratch(int64_t n, int64_t nrows) {
    if (n <= LOOM_CU_SORT_CHUNK || nrows <= 0) return 0;
    const size_t per_row = sizeof(int32_t) * (size_t)(2 * n + 1);
    int64_t g = (int64_t)(LOOM_CU_SORT_SCRATCH_MAX / per_row);
    if (g < 1) g = 1;
    if (g > nrows) g = nrows;
    return per_row * (size_t)g;
}
/* ROPE: neox rotates halves, otherwise adjacent pairs. */
cudaError_t loom__cu_rope(int n_dims, int neox, float freq_base, float freq_scale, loom_cu_t dst,
                          loom_cu_t a, loom_cu_t pos, loom_cu_t ff, cudaStream_t s);
cudaError_t loom__cu_get_rows(loom_cu_t dst, loom_cu_t a, loom_cu_t ids, loom_cu_err *err,
                              long long node, cudaStream_t s);
/* SET_ROWS: dst is the result view (dst's storage); b the rows, ids I32/I64. */
cudaError_t loom__cu_set_rows(loom_cu_t dst, loom_cu_t b, loom_cu_t ids, loom_cu_err *err,
                              long long node, cudaStream_t s);
cudaError_t loom__cu_concat(int dim, loom_cu_t dst, loom_cu_t a, loom_cu_t b, cudaStream_t s);

/* Communicator helpers (contiguous arrays of n elements). */
cudaError_t loom__cu_f32_to_bf16(const float *x, uint16_t *y, int64_t n, cudaStream_t s);
cudaError_t loom__cu_bf16_to_f32(const uint16_t *x, float *y, int64_t n, cudaStream_t s);
/* dst[i] = sum over j < n_src of src.p[j][i], in the order j = 0, 1, ... (so every device
 * summing the same inputs gets bit-identical results). The sources may be peer memory. */
cudaError_t loom__cu_sum_peers(float *dst, loom_cu_ptrs src, int n_src, int64_t n, cudaStream_t s);

/* ---------------------------------------------------------------- kernels-mm.cu */

/* MUL_MAT by dot products: one warp per weight row and up to 8 columns of b, any weight
 * type (F32/F16/BF16 and every block type, decoded in registers as the CPU's reference
 * dequantisers do and multiplied with the F32 activations: b is never quantised), any
 * strides, batch broadcasting of a over b. The backend's path for few columns and for
 * layouts cuBLAS cannot take. One kernel per weight type (lane l of a warp takes values l,
 * l + 32, ... of the row); legacy != 0 (LOOM_CUDA_LEGACY_KERNELS=1) launches the earlier
 * kernel for every type instead (32 values per lane, the type switch in the kernel), so a
 * GPU run can compare the two. */
cudaError_t loom__cu_mul_mat_vec(loom_cu_t dst, loom_cu_t a, loom_cu_t b, int legacy,
                                 cudaStream_t s);
/* MUL_MAT_ID: the routed (u, t) pairs bucketed by expert into ws (device scratch of
 * loom__cu_mul_mat_id_scratch(E, U * T) bytes), then one warp per (weight row, expert with
 * pairs) over its bucket, up to 8 routed tokens per pass over the row; one kernel per
 * weight type unless legacy (as loom__cu_mul_mat_vec). */
cudaError_t loom__cu_mul_mat_id(loom_cu_t dst, loom_cu_t as, loom_cu_t b, loom_cu_t ids,
                                int32_t *ws, loom_cu_err *err, long long node, int legacy,
                                cudaStream_t s);
static inline size_t loom__cu_mul_mat_id_scratch(int64_t E, int64_t pairs) {
    return sizeof(int32_t) * (size_t)(2 * E + 2 + (E < pairs ? E : pairs) + pairs);
}
/* The M-rows [m0, m0 + mc) of weight batch (i2, i3) of a, as a contiguous F32 [K, mc]
 * matrix at out (cuBLAS's A operand; any weight type and layout). */
cudaError_t loom__cu_weights_to_f32(loom_cu_t a, int64_t i2, int64_t i3, int64_t m0, int64_t mc,
                                    float *out, cudaStream_t s);
/* Every batch of weight a (F32, F16, BF16 or a block type; any strides) as contiguous BF16
 * [K, M] matrices one after another (batch i2 + A2 i3), each value decoded as the CPU's
 * reference does, then rounded to nearest even: the tensor-core GEMM's A operand. */
cudaError_t loom__cu_weights_to_bf16(loom_cu_t a, uint16_t *out, cudaStream_t s);
/* ---------------------------------------------------------------- kernels-quant.cu */

/* The M-rows [m0, m0 + mc) of weight batch (i2, i3) of a block-quantised a (any
 * LOOM_CU_Q* type), dequantised into a contiguous F32 [K, mc] matrix at out: one thread per
 * 32 values, bit-identical to core's reference dequantisers. */
cudaError_t loom__cu_dequantize_f32(loom_cu_t a, int64_t i2, int64_t i3, int64_t m0, int64_t mc,
                                    float *out, cudaStream_t s);

/* FLASH_ATTN_EXT: D, Dv <= 256: blocks of 8 queries sharing a KV head, keys and values
 * staged through shared memory in tiles of 32, tiles the mask hides from every query of a
 * block skipped; when those blocks are too few for the GPU (decode) and the KV is long, the
 * keys are split across blocks (flash-decoding, kernels-math.h) whose partial softmaxes
 * go to ws (device scratch of loom__cu_flash_attn_scratch bytes; less, or NULL: no split)
 * and are merged by a second kernel. Larger heads (<= 1024): one warp per output row. A
 * NaN score or a NaN sink makes its output row NaN (as the CPU). legacy != 0
 * (LOOM_CUDA_LEGACY_KERNELS=1): no split and no skip, the earlier kernels. */
cudaError_t loom__cu_flash_attn(float scale, float max_bias, float softcap, loom_cu_t dst,
                                loom_cu_t q, loom_cu_t k, loom_cu_t v, loom_cu_t mask,
                                loom_cu_t sinks, float *ws, size_t ws_bytes, int legacy,
                                cudaStream_t s);
/* The scratch bytes of a split FLASH_ATTN_EXT with q [D, Nq, H, S], k [D, Nkv, Hk, S], v
 * [Dv, Nkv, Hk, S] (0: it does not split). */
static inline size_t loom__cu_flash_attn_scratch(const int64_t *qne, const int64_t *kne,
                                                 const int64_t *vne, int legacy) {
    if (legacy || qne[0] > LOOM_CU_FA_TILED_MAX_D || vne[0] > LOOM_CU_FA_TILED_MAX_D ||
        kne[1] <= 0 || kne[2] <= 0)
        return 0;
    const int64_t rows = (qne[2] / kne[2]) * qne[1];
    const int64_t n_blocks = (rows + LOOM_CU_FA_TQ - 1) / LOOM_CU_FA_TQ * kne[2] * qne[3];
    const int splits = loom__cu_fa_splits(n_blocks, kne[1]);
    if (splits < 2) return 0;
    return sizeof(float) *
           (size_t)loom__cu_fa_part_floats(qne[1] * qne[2] * qne[3], splits, vne[0]);
}

#define LOOM_CU_FA_MAX_D 1024

#ifdef __cplusplus
}
#endif

#endif /* LOOM_CUDA_KERNELS_H */
