/*
 * CUDA kernels for every op except the matrix products and attention (kernels-mm.cu):
 * copies with type conversion, elementwise arithmetic with broadcasting, the one-input
 * maps, GLU, FILL, per-row reductions (sum, mean, argmax, norms, softmax), argsort/top-k
 * (in the CPU backend's order, NaN included), rope, row gathers and scatters, concat, and
 * the communicator's helpers (BF16 conversion, the one-shot peer sum).
 *
 * Each kernel is written for clarity: one thread per output element (or block, for
 * quantised rows), or one block per row for reductions, every element reached through
 * ne/nb, 64-bit indices, grid-stride loops so any size fits one launch. Accumulations that
 * the CPU backend does in double are done in double here too, so results stay within the
 * CPU oracle's rounding.
 */
#include "backends/cuda/kernels-common.cuh"

static int cu_type_size(int type) {
    switch (type) {
    case LOOM_CU_F32:
    case LOOM_CU_I32:
        return 4;
    case LOOM_CU_F16:
    case LOOM_CU_BF16:
    case LOOM_CU_I16:
        return 2;
    case LOOM_CU_I8:
        return 1;
    case LOOM_CU_I64:
        return 8;
    default:
        return cu_qbytes(type); /* block types: bytes per block; 0 for none */
    }
}

static __device__ __forceinline__ void cu_copy_bytes(char *d, const char *p, int es) {
    switch (es) {
    case 1:
        *d = *p;
        break;
    case 2:
        *(uint16_t *)d = *(const uint16_t *)p;
        break;
    case 4:
        *(uint32_t *)d = *(const uint32_t *)p;
        break;
    case 8:
        *(uint64_t *)d = *(const uint64_t *)p;
        break;
    default:
        for (int k = 0; k < es; k++)
            d[k] = p[k];
        break;
    }
}

/* 32 values quantised into a block of a quantised result type (those supports_op lets
 * through: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL). */
static __device__ __forceinline__ void cu_quantize32(int type, const float *v, char *out) {
    switch (type) {
    case LOOM_CU_Q8_0:
        cu_quantize_q8_0(v, out);
        break;
    case LOOM_CU_Q4_0:
        cu_quantize_q4_0(v, out);
        break;
    case LOOM_CU_Q4_1:
        cu_quantize_q_1(v, out, 15);
        break;
    case LOOM_CU_Q5_1:
        cu_quantize_q_1(v, out, 31);
        break;
    case LOOM_CU_Q5_0:
        cu_quantize_q5_0(v, out);
        break;
    case LOOM_CU_IQ4_NL:
        cu_quantize_iq4_nl(v, out);
        break;
    default:
        break;
    }
}

static __device__ __forceinline__ float cu_silu(float x) {
    return x / (1.0f + expf(-x));
}

static __device__ __forceinline__ float cu_gelu(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* ---------------------------------------------------------------- copies */

/* Element e of dst (row-major) = element e of src, converted; es > 0: same type, raw. */
static __global__ void k_cpy_elem(loom_cu_t dst, loom_cu_t src, int64_t n, int es) {
    CU_FOR(e, n) {
        int64_t i[4], j[4];
        cu_unravel(dst.ne, e, i);
        cu_unravel(src.ne, e, j);
        char *d = cu_at(dst, i[0], i[1], i[2], i[3]);
        if (es > 0)
            cu_copy_bytes(d, cu_at(src, j[0], j[1], j[2], j[3]), es);
        else
            cu_store_f(d, dst.type, cu_load_f(src, j[0], j[1], j[2], j[3]));
    }
}

/* Block b of a quantised dst: a raw block of the same type (any block type, qk values), or
 * 32 values quantised (cu_quantize32). */
static __global__ void k_cpy_to_quant(loom_cu_t dst, loom_cu_t src, int64_t nblk, int bs, int qk) {
    CU_FOR(b, nblk) {
        const int64_t e0 = b * qk;
        int64_t i[4], j[4];
        cu_unravel(dst.ne, e0, i);
        char *out = cu_at(dst, i[0] / qk, i[1], i[2], i[3]);
        if (src.type == dst.type) {
            cu_unravel(src.ne, e0, j);
            const char *in = cu_at(src, j[0] / qk, j[1], j[2], j[3]);
            for (int k = 0; k < bs; k++)
                out[k] = in[k];
            continue;
        }
        float v[LOOM_CU_QK];
        for (int l = 0; l < LOOM_CU_QK; l++) {
            cu_unravel(src.ne, e0 + l, j);
            v[l] = cu_load_f(src, j[0], j[1], j[2], j[3]);
        }
        cu_quantize32(dst.type, v, out);
    }
}

extern "C" cudaError_t loom__cu_cpy(loom_cu_t dst, loom_cu_t src, cudaStream_t s) {
    const int64_t n = cu_nelements(dst);
    if (n == 0) return cudaSuccess;
    if (cu_is_quant(dst.type)) {
        const int qk = cu_qk(dst.type);
        const int64_t nblk = n / qk;
        k_cpy_to_quant<<<cu_blocks(nblk), CU_BLOCK, 0, s>>>(dst, src, nblk, cu_type_size(dst.type),
                                                            qk);
    } else {
        const int es = src.type == dst.type ? cu_type_size(dst.type) : 0;
        k_cpy_elem<<<cu_blocks(n), CU_BLOCK, 0, s>>>(dst, src, n, es);
    }
    return cu_launched();
}

/* ---------------------------------------------------------------- elementwise */

static __global__ void k_binary(int op, loom_cu_t dst, loom_cu_t a, loom_cu_t b, int64_t n) {
    CU_FOR(e, n) {
        int64_t i[4];
        cu_unravel(dst.ne, e, i);
        const float x = *(const float *)cu_at(a, i[0], i[1], i[2], i[3]);
        const float y = *(const float *)cu_at(b, i[0] % b.ne[0], i[1] % b.ne[1], i[2] % b.ne[2],
                                              i[3] % b.ne[3]);
        float r;
        switch (op) {
        case LOOM_CU_ADD:
            r = x + y;
            break;
        case LOOM_CU_SUB:
            r = x - y;
            break;
        case LOOM_CU_MUL:
            r = x * y;
            break;
        default:
            r = x / y;
            break;
        }
        *(float *)cu_at(dst, i[0], i[1], i[2], i[3]) = r;
    }
}

extern "C" cudaError_t loom__cu_binary(int op, loom_cu_t dst, loom_cu_t a, loom_cu_t b,
                                       cudaStream_t s) {
    const int64_t n = cu_nelements(dst);
    if (n == 0) return cudaSuccess;
    k_binary<<<cu_blocks(n), CU_BLOCK, 0, s>>>(op, dst, a, b, n);
    return cu_launched();
}

/* r[:, u, t] = a[:, u, t] + b[:, ids[u, t]]; a bad id leaves its row untouched. */
static __global__ void k_add_id(loom_cu_t dst, loom_cu_t a, loom_cu_t b, loom_cu_t ids, int64_t n,
                                loom_cu_err *err, long long node) {
    CU_FOR(e, n) {
        int64_t i[4];
        cu_unravel(dst.ne, e, i);
        const int32_t id = *(const int32_t *)cu_at(ids, i[1], i[2], 0, 0);
        if (id < 0 || id >= b.ne[1]) {
            cu_report(err, LOOM_CU_ERR_ADD_ID, node, id, b.ne[1]);
            continue;
        }
        const float x = *(const float *)cu_at(a, i[0], i[1], i[2], i[3]);
        const float y = *(const float *)cu_at(b, i[0], id, 0, 0);
        *(float *)cu_at(dst, i[0], i[1], i[2], i[3]) = x + y;
    }
}

extern "C" cudaError_t loom__cu_add_id(loom_cu_t dst, loom_cu_t a, loom_cu_t b, loom_cu_t ids,
                                       loom_cu_err *err, long long node, cudaStream_t s) {
    const int64_t n = cu_nelements(dst);
    if (n == 0) return cudaSuccess;
    k_add_id<<<cu_blocks(n), CU_BLOCK, 0, s>>>(dst, a, b, ids, n, err, node);
    return cu_launched();
}

static __global__ void k_map(int op, float f0, float f1, loom_cu_t dst, loom_cu_t a, int64_t n) {
    CU_FOR(e, n) {
        int64_t i[4];
        cu_unravel(dst.ne, e, i);
        const float x = *(const float *)cu_at(a, i[0], i[1], i[2], i[3]);
        float r;
        switch (op) {
        case LOOM_CU_SCALE:
            r = x * f0 + f1;
            break;
        case LOOM_CU_SQR:
            r = x * x;
            break;
        case LOOM_CU_SQRT:
            r = sqrtf(x);
            break;
        case LOOM_CU_CLAMP:
            r = fminf(fmaxf(x, f0), f1);
            break;
        case LOOM_CU_SILU:
            r = cu_silu(x);
            break;
        case LOOM_CU_GELU:
            r = cu_gelu(x);
            break;
        default:
            r = x > 0.0f ? x : 0.0f;
            break;
        }
        *(float *)cu_at(dst, i[0], i[1], i[2], i[3]) = r;
    }
}

extern "C" cudaError_t loom__cu_map(int op, float f0, float f1, loom_cu_t dst, loom_cu_t a,
                                    cudaStream_t s) {
    const int64_t n = cu_nelements(dst);
    if (n == 0) return cudaSuccess;
    k_map<<<cu_blocks(n), CU_BLOCK, 0, s>>>(op, f0, f1, dst, a, n);
    return cu_launched();
}

static __global__ void k_glu(int op, int swapped, loom_cu_t dst, loom_cu_t a, loom_cu_t b,
                             int64_t n) {
    const bool split = b.data != NULL;
    CU_FOR(e, n) {
        int64_t i[4];
        cu_unravel(dst.ne, e, i);
        float x, g;
        if (split) {
            const float va = *(const float *)cu_at(a, i[0], i[1], i[2], i[3]);
            const float vb = *(const float *)cu_at(b, i[0], i[1], i[2], i[3]);
            x = swapped ? vb : va;
            g = swapped ? va : vb;
        } else {
            const float lo = *(const float *)cu_at(a, i[0], i[1], i[2], i[3]);
            const float hi = *(const float *)cu_at(a, i[0] + dst.ne[0], i[1], i[2], i[3]);
            x = swapped ? hi : lo;
            g = swapped ? lo : hi;
        }
        const float act = op == LOOM_CU_SWIGLU ? cu_silu(x) : cu_gelu(x);
        *(float *)cu_at(dst, i[0], i[1], i[2], i[3]) = act * g;
    }
}

extern "C" cudaError_t loom__cu_glu(int op, int swapped, loom_cu_t dst, loom_cu_t a, loom_cu_t b,
                                    cudaStream_t s) {
    const int64_t n = cu_nelements(dst);
    if (n == 0) return cudaSuccess;
    k_glu<<<cu_blocks(n), CU_BLOCK, 0, s>>>(op, swapped, dst, a, b, n);
    return cu_launched();
}

static __global__ void k_fill(float v, loom_cu_t dst, int64_t n) {
    CU_FOR(e, n) {
        int64_t i[4];
        cu_unravel(dst.ne, e, i);
        *(float *)cu_at(dst, i[0], i[1], i[2], i[3]) = v;
    }
}

extern "C" cudaError_t loom__cu_fill(float v, loom_cu_t dst, cudaStream_t s) {
    const int64_t n = cu_nelements(dst);
    if (n == 0) return cudaSuccess;
    k_fill<<<cu_blocks(n), CU_BLOCK, 0, s>>>(v, dst, n);
    return cu_launched();
}

/* ---------------------------------------------------------------- row reductions */

static __device__ __forceinline__ void cu_row_index(const loom_cu_t &t, int64_t r, int64_t *i1,
                                                    int64_t *i2, int64_t *i3) {
    *i1 = r % t.ne[1];
    *i2 = (r / t.ne[1]) % t.ne[2];
    *i3 = r / (t.ne[1] * t.ne[2]);
}

static __global__ void k_reduce_rows(int mean, loom_cu_t dst, loom_cu_t a, int64_t nrows) {
    __shared__ double sh[32];
    const int64_t n = a.ne[0];
    CU_FOR_BLOCK(r, nrows) {
        int64_t i1, i2, i3;
        cu_row_index(a, r, &i1, &i2, &i3);
        const char *x = cu_at(a, 0, i1, i2, i3);
        double sum = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            sum += (double)*(const float *)(x + i * a.nb[0]);
        sum = cu_block_sum(sum, sh);
        if (threadIdx.x == 0) {
            if (mean) sum /= (double)n;
            *(float *)cu_at(dst, 0, i1, i2, i3) = (float)sum;
        }
    }
}

extern "C" cudaError_t loom__cu_reduce_rows(int mean, loom_cu_t dst, loom_cu_t a, cudaStream_t s) {
    const int64_t nrows = cu_nrows(a);
    if (nrows == 0 || cu_nelements(dst) == 0) return cudaSuccess;
    k_reduce_rows<<<cu_blocks(nrows, 1), CU_BLOCK, 0, s>>>(mean, dst, a, nrows);
    return cu_launched();
}

/* (value, index) of the larger; a NaN never wins over a number; ties: lower index. An
 * index < 0 is "nothing yet". */
static __device__ __forceinline__ void cu_argmax_merge(float *bv, int64_t *bi, float v, int64_t i) {
    if (i < 0) return;
    if (*bi < 0) {
        *bv = v;
        *bi = i;
        return;
    }
    const bool bn = *bv != *bv, vn = v != v;
    bool take;
    if (bn && vn)
        take = i < *bi;
    else if (bn || vn)
        take = bn;
    else
        take = v > *bv || (v == *bv && i < *bi);
    if (take) {
        *bv = v;
        *bi = i;
    }
}

static __global__ void k_argmax(loom_cu_t dst, loom_cu_t a, int64_t nrows) {
    __shared__ float shv[32];
    __shared__ long long shi[32];
    const int64_t n = a.ne[0];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    CU_FOR_BLOCK(r, nrows) {
        int64_t i1, i2, i3;
        cu_row_index(a, r, &i1, &i2, &i3);
        const char *x = cu_at(a, 0, i1, i2, i3);
        float bv = 0.0f;
        int64_t bi = -1;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            cu_argmax_merge(&bv, &bi, *(const float *)(x + i * a.nb[0]), i);
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(CU_FULL_MASK, bv, o);
            long long oi = __shfl_xor_sync(CU_FULL_MASK, (long long)bi, o);
            cu_argmax_merge(&bv, &bi, ov, oi);
        }
        __syncthreads();
        if (lane == 0) {
            shv[wid] = bv;
            shi[wid] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < nw; w++)
                cu_argmax_merge(&bv, &bi, shv[w], shi[w]);
            int64_t o[4];
            cu_unravel(dst.ne, r, o);
            *(int32_t *)cu_at(dst, o[0], o[1], o[2], o[3]) = (int32_t)(bi < 0 ? 0 : bi);
        }
    }
}

extern "C" cudaError_t loom__cu_argmax(loom_cu_t dst, loom_cu_t a, cudaStream_t s) {
    const int64_t nrows = cu_nrows(a);
    if (nrows == 0 || cu_nelements(dst) == 0) return cudaSuccess;
    k_argmax<<<cu_blocks(nrows, 1), CU_BLOCK, 0, s>>>(dst, a, nrows);
    return cu_launched();
}

static __global__ void k_norm(int rms, float eps, loom_cu_t dst, loom_cu_t a, int64_t nrows) {
    __shared__ double sh[32];
    const int64_t n = a.ne[0];
    CU_FOR_BLOCK(r, nrows) {
        int64_t i1, i2, i3;
        cu_row_index(a, r, &i1, &i2, &i3);
        const char *x = cu_at(a, 0, i1, i2, i3);
        char *y = cu_at(dst, 0, i1, i2, i3);
        if (rms) {
            double ss = 0.0;
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
                const double v = *(const float *)(x + i * a.nb[0]);
                ss += v * v;
            }
            ss = cu_block_sum(ss, sh);
            const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                *(float *)(y + i * dst.nb[0]) = *(const float *)(x + i * a.nb[0]) * scale;
        } else {
            double sum = 0.0;
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                sum += (double)*(const float *)(x + i * a.nb[0]);
            const double mean = cu_block_sum(sum, sh) / (double)n;
            double var = 0.0;
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
                const double d = (double)*(const float *)(x + i * a.nb[0]) - mean;
                var += d * d;
            }
            var = cu_block_sum(var, sh);
            const double scale = 1.0 / sqrt(var / (double)n + (double)eps);
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                *(float *)(y + i * dst.nb[0]) =
                    (float)(((double)*(const float *)(x + i * a.nb[0]) - mean) * scale);
        }
        __syncthreads(); /* in place: every read of this row is done before the next row */
    }
}

extern "C" cudaError_t loom__cu_norm(int rms, float eps, loom_cu_t dst, loom_cu_t a,
                                     cudaStream_t s) {
    const int64_t nrows = cu_nrows(a);
    if (nrows == 0 || a.ne[0] == 0) return cudaSuccess;
    k_norm<<<cu_blocks(nrows, 1), CU_BLOCK, 0, s>>>(rms, eps, dst, a, nrows);
    return cu_launched();
}

/* ---------------------------------------------------------------- soft_max */

/* z_i = a_i * scale + slope * mask_i (the CPU's two roundings). */
static __device__ __forceinline__ float cu_sm_logit(const char *x, size_t xs, const char *mrow,
                                                    size_t ms, int mtype, float scale, float slope,
                                                    int64_t i) {
    float v = __fmul_rn(*(const float *)(x + i * xs), scale);
    if (mrow) v = __fadd_rn(v, __fmul_rn(slope, cu_load_f_ptr(mrow + i * ms, mtype)));
    return v;
}

static __global__ void k_soft_max(float scale, float max_bias, loom_cu_t dst, loom_cu_t a,
                                  loom_cu_t mask, loom_cu_t sinks, int64_t nrows) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    const int64_t n = a.ne[0];
    const bool has_mask = mask.data != NULL, has_sinks = sinks.data != NULL;
    CU_FOR_BLOCK(r, nrows) {
        int64_t i1, i2, i3;
        cu_row_index(a, r, &i1, &i2, &i3);
        const char *x = cu_at(a, 0, i1, i2, i3);
        char *y = cu_at(dst, 0, i1, i2, i3);
        const float slope = cu_alibi_slope(max_bias, a.ne[2], i2);
        const char *mrow = has_mask ? cu_at(mask, 0, i1, i2 % mask.ne[2], i3 % mask.ne[3]) : NULL;
        /* a NaN logit makes max NaN, so the whole row is NaN (NaN in, NaN out) */
        float max = -INFINITY;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            max = cu_fmax_nan(
                max, cu_sm_logit(x, a.nb[0], mrow, mask.nb[0], mask.type, scale, slope, i));
        max = cu_block_max_nan(max, shf);
        float sink = -INFINITY;
        if (has_sinks) {
            int64_t s4[4];
            cu_unravel(sinks.ne, i2, s4);
            sink = *(const float *)cu_at(sinks, s4[0], s4[1], s4[2], s4[3]);
            max = cu_fmax_nan(max, sink);
        }
        if (max == -INFINITY) { /* every logit masked, no sink */
            __syncthreads();
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                *(float *)(y + i * dst.nb[0]) = 0.0f;
            __syncthreads();
            continue;
        }
        double sum = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            sum += (double)expf(
                cu_sm_logit(x, a.nb[0], mrow, mask.nb[0], mask.type, scale, slope, i) - max);
        sum = cu_block_sum(sum, shd);
        if (has_sinks) sum += exp((double)sink - (double)max);
        const float inv = (float)(1.0 / sum);
        __syncthreads(); /* in place: every read above is done before the writes */
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const float z = cu_sm_logit(x, a.nb[0], mrow, mask.nb[0], mask.type, scale, slope, i);
            *(float *)(y + i * dst.nb[0]) = __fmul_rn(expf(z - max), inv);
        }
        __syncthreads();
    }
}

extern "C" cudaError_t loom__cu_soft_max(float scale, float max_bias, loom_cu_t dst, loom_cu_t a,
                                         loom_cu_t mask, loom_cu_t sinks, cudaStream_t s) {
    const int64_t nrows = cu_nrows(a);
    if (nrows == 0 || a.ne[0] == 0) return cudaSuccess;
    k_soft_max<<<cu_blocks(nrows, 1), CU_BLOCK, 0, s>>>(scale, max_bias, dst, a, mask, sinks,
                                                        nrows);
    return cu_launched();
}

/* ---------------------------------------------------------------- argsort, top_k */

#define CU_SORT_CHUNK LOOM_CU_SORT_CHUNK /* sorted in shared memory (48 KiB) by one block */
#define CU_BITONIC_THREADS 512

/* The CPU's order (backends/cpu/ops-rows.c): a bottom-up stable merge sort of widths 1, 2,
 * 4, ... whose merge takes the right run's head only when it comes strictly before the
 * left's. Without NaN that order is unique (value, then lower index), so any algorithm that
 * finds it agrees with the CPU: a bitonic network in shared memory per chunk, then merge
 * passes by binary search. A NaN compares neither way, so with one the result is defined
 * by the CPU's steps alone: a chunk or row holding a NaN replays them (still a permutation,
 * and exactly the CPU's). */
static __device__ __forceinline__ bool cu_merge_takes_right(int desc, float vl, float vr) {
    return desc ? vr > vl : vr < vl;
}

static __device__ __forceinline__ float cu_sort_x(const char *x, int64_t nb0, int64_t i) {
    return *(const float *)(x + i * nb0);
}

/* The stable order of argsort without NaN: value (larger first when desc), ties by lower
 * index; the padding (index >= n) after everything. */
static __device__ __forceinline__ bool cu_sort_before(int desc, float va, int ia, float vb, int ib,
                                                      int n) {
    if (ia >= n) return false;
    if (ib >= n) return true;
    if (va == vb) return ia < ib;
    return desc ? va > vb : va < vb;
}

/* Where a sorted chunk or merged run goes: rows of one chunk straight to dst (its first keep
 * positions), longer rows into their scratch buffer. */
static __device__ __forceinline__ void cu_sort_put(bool to_dst, int64_t keep, const loom_cu_t &dst,
                                                   int64_t i1, int64_t i2, int64_t i3, int32_t *buf,
                                                   int64_t pos, int32_t idx) {
    if (!to_dst)
        buf[pos] = idx;
    else if (pos < keep)
        *(int32_t *)cu_at(dst, pos, i1, i2, i3) = idx;
}

/* One CPU merge of runs [lo, mid) and [mid, hi) of src (indices base + k into x) into
 * positions [lo, hi). */
template <typename Put>
static __device__ __forceinline__ void cu_merge_seq(int desc, const float *kv, const char *x,
                                                    int64_t nb0, const int32_t *src, int64_t lo,
                                                    int64_t mid, int64_t hi, Put put) {
    int64_t i = lo, j = mid, k = lo;
    while (i < mid && j < hi) {
        const float vi = kv ? kv[src[i]] : cu_sort_x(x, nb0, src[i]);
        const float vj = kv ? kv[src[j]] : cu_sort_x(x, nb0, src[j]);
        put(k++, cu_merge_takes_right(desc, vi, vj) ? src[j++] : src[i++]);
    }
    while (i < mid)
        put(k++, src[i++]);
    while (j < hi)
        put(k++, src[j++]);
}

/* One block per (row, chunk of CU_SORT_CHUNK elements) of rows r0 .. r0 + nrows - 1: the
 * chunk's indices in the CPU's order (a bitonic network without NaN, the CPU's merge sort
 * replayed in shared memory with one). Rows of one chunk write their first keep positions
 * to dst; longer rows write the chunk's sorted row indices to their first scratch buffer
 * (ws + 2 n rr) and a chunk with a NaN sets its row's flag (ws + 2 n nrows + rr). */
static __global__ void k_argsort_chunk(int desc, int64_t keep, loom_cu_t dst, loom_cu_t a,
                                       int64_t r0, int64_t nrows, int32_t *ws) {
    __shared__ float kv[CU_SORT_CHUNK];
    __shared__ int32_t ki[CU_SORT_CHUNK];
    __shared__ int32_t kt[CU_SORT_CHUNK];
    const int64_t n = a.ne[0], nch = (n + CU_SORT_CHUNK - 1) / CU_SORT_CHUNK;
    const bool to_dst = nch == 1;
    CU_FOR_BLOCK(bi, nrows * nch) {
        const int64_t rr = bi / nch, c0 = bi % nch * CU_SORT_CHUNK;
        int64_t i1, i2, i3;
        cu_row_index(a, r0 + rr, &i1, &i2, &i3);
        const char *x = cu_at(a, c0, i1, i2, i3);
        const int len = (int)(n - c0 < CU_SORT_CHUNK ? n - c0 : CU_SORT_CHUNK);
        int P = 1;
        while (P < len)
            P <<= 1;
        __syncthreads(); /* the previous chunk's results are written */
        int nan = 0;
        for (int i = threadIdx.x; i < P; i += blockDim.x) {
            const float v = i < len ? cu_sort_x(x, a.nb[0], i) : 0.0f;
            nan |= v != v;
            kv[i] = v;
            ki[i] = i;
        }
        nan = __syncthreads_or(nan); /* block-uniform */
        const int32_t *res = ki;
        if (!nan) {
            for (int k = 2; k <= P; k <<= 1) {
                for (int j = k >> 1; j > 0; j >>= 1) {
                    for (int i = threadIdx.x; i < P; i += blockDim.x) {
                        const int l = i ^ j;
                        if (l <= i) continue;
                        /* blocks with (i & k) == 0 sort in the order, the others reversed */
                        const bool wrong =
                            (i & k) == 0 ? cu_sort_before(desc, kv[l], ki[l], kv[i], ki[i], len)
                                         : cu_sort_before(desc, kv[i], ki[i], kv[l], ki[l], len);
                        if (wrong) {
                            const float tv = kv[i];
                            kv[i] = kv[l];
                            kv[l] = tv;
                            const int32_t ti = ki[i];
                            ki[i] = ki[l];
                            ki[l] = ti;
                        }
                    }
                    __syncthreads();
                }
            }
        } else { /* the CPU's passes; kv stays in index order */
            int32_t *src = ki, *out = kt;
            for (int w = 1; w < len; w <<= 1) {
                for (int lo = threadIdx.x * 2 * w; lo < len; lo += blockDim.x * 2 * w) {
                    const int mid = lo + w < len ? lo + w : len;
                    const int hi = lo + 2 * w < len ? lo + 2 * w : len;
                    cu_merge_seq(desc, kv, x, a.nb[0], src, lo, mid, hi,
                                 [out](int64_t k, int32_t v) { out[k] = v; });
                }
                __syncthreads();
                int32_t *t = src;
                src = out;
                out = t;
            }
            res = src;
        }
        int32_t *buf = to_dst ? (int32_t *)NULL : ws + 2 * n * rr + c0;
        for (int i = threadIdx.x; i < len; i += blockDim.x)
            cu_sort_put(to_dst, keep, dst, i1, i2, i3, buf, i, (int32_t)c0 + res[i]);
        if (!to_dst && nan && threadIdx.x == 0) atomicOr(ws + 2 * n * nrows + rr, 1);
    }
}

/* A merge pass of width w (>= CU_SORT_CHUNK) over the rows without NaN: the element at
 * position p of a run goes to p plus the number of the other run's elements the CPU's
 * merge takes before it (a binary search: the runs are sorted in a total order). From
 * buffer sb to the other one, or to dst on the last pass. */
static __global__ void k_argsort_merge(int desc, int64_t keep, loom_cu_t dst, loom_cu_t a,
                                       int64_t r0, int64_t nrows, int32_t *ws, int64_t w, int sb,
                                       int last) {
    const int64_t n = a.ne[0];
    const int32_t *flags = ws + 2 * n * nrows;
    CU_FOR(e, nrows * n) {
        const int64_t rr = e / n, p = e % n;
        if (flags[rr]) continue;
        int64_t i1, i2, i3;
        cu_row_index(a, r0 + rr, &i1, &i2, &i3);
        const char *x = cu_at(a, 0, i1, i2, i3);
        const int32_t *src = ws + 2 * n * rr + sb * n;
        const int64_t lo = p / (2 * w) * (2 * w);
        const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
        const int32_t idx = src[p];
        const float v = cu_sort_x(x, a.nb[0], idx);
        const bool left = p < mid;
        /* left: the right run's elements that come strictly before v; right: the left
         * run's elements that do not come after v. Either is a prefix of the other run. */
        int64_t b = left ? mid : lo, cnt = left ? hi - mid : mid - lo;
        int64_t found = 0;
        while (cnt > 0) {
            const int64_t half = cnt / 2;
            const float u = cu_sort_x(x, a.nb[0], src[b + half]);
            const bool before =
                left ? cu_merge_takes_right(desc, v, u) : !cu_merge_takes_right(desc, u, v);
            if (before) {
                b += half + 1;
                found += half + 1;
                cnt -= half + 1;
            } else {
                cnt = half;
            }
        }
        const int64_t pos = left ? p + found : lo + (p - mid) + found;
        cu_sort_put(last, keep, dst, i1, i2, i3, ws + 2 * n * rr + (1 - sb) * n, pos, idx);
    }
}

/* The same pass over the rows with a NaN: one thread per pair of runs replays the CPU's
 * merge. */
static __global__ void k_argsort_merge_nan(int desc, int64_t keep, loom_cu_t dst, loom_cu_t a,
                                           int64_t r0, int64_t nrows, int32_t *ws, int64_t w,
                                           int sb, int last) {
    const int64_t n = a.ne[0], npairs = (n + 2 * w - 1) / (2 * w);
    const int32_t *flags = ws + 2 * n * nrows;
    CU_FOR(e, nrows * npairs) {
        const int64_t rr = e / npairs, lo = e % npairs * 2 * w;
        if (!flags[rr]) continue;
        int64_t i1, i2, i3;
        cu_row_index(a, r0 + rr, &i1, &i2, &i3);
        const char *x = cu_at(a, 0, i1, i2, i3);
        const int32_t *src = ws + 2 * n * rr + sb * n;
        int32_t *out = ws + 2 * n * rr + (1 - sb) * n;
        const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
        const bool to_dst = last != 0;
        cu_merge_seq(
            desc, (const float *)NULL, x, a.nb[0], src, lo, mid, hi,
            [&](int64_t k, int32_t v) { cu_sort_put(to_dst, keep, dst, i1, i2, i3, out, k, v); });
    }
}

extern "C" cudaError_t loom__cu_argsort(int desc, int64_t keep, loom_cu_t dst, loom_cu_t a,
                                        int32_t *ws, size_t ws_bytes, cudaStream_t s) {
    const int64_t nrows = cu_nrows(a), n = a.ne[0];
    if (nrows == 0 || n == 0 || keep == 0) return cudaSuccess;
    if (n <= CU_SORT_CHUNK) {
        k_argsort_chunk<<<cu_blocks(nrows, 1), CU_BITONIC_THREADS, 0, s>>>(desc, keep, dst, a, 0,
                                                                           nrows, NULL);
        return cu_launched();
    }
    /* longer rows, a group of g at a time (as many as ws holds): sorted chunks, then
     * log2(n / CU_SORT_CHUNK) merge passes between the row's two buffers: O(n log^2 n) */
    const size_t per_row = sizeof(int32_t) * (size_t)(2 * n + 1);
    int64_t g = (int64_t)(ws_bytes / per_row);
    if (g < 1) return cudaErrorInvalidValue; /* the caller sized ws too small */
    if (g > nrows) g = nrows;
    const int64_t nch = (n + CU_SORT_CHUNK - 1) / CU_SORT_CHUNK;
    for (int64_t r0 = 0; r0 < nrows; r0 += g) {
        const int64_t m = nrows - r0 < g ? nrows - r0 : g;
        cudaError_t e = cudaMemsetAsync(ws + 2 * n * m, 0, sizeof(int32_t) * (size_t)m, s);
        if (e != cudaSuccess) return e;
        k_argsort_chunk<<<cu_blocks(m * nch, 1), CU_BITONIC_THREADS, 0, s>>>(desc, keep, dst, a, r0,
                                                                             m, ws);
        if ((e = cu_launched()) != cudaSuccess) return e;
        int sb = 0;
        for (int64_t w = CU_SORT_CHUNK; w < n; w *= 2, sb ^= 1) {
            const int last = 2 * w >= n;
            k_argsort_merge<<<cu_blocks(m * n), CU_BLOCK, 0, s>>>(desc, keep, dst, a, r0, m, ws, w,
                                                                  sb, last);
            if ((e = cu_launched()) != cudaSuccess) return e;
            const int64_t npairs = (n + 2 * w - 1) / (2 * w);
            k_argsort_merge_nan<<<cu_blocks(m * npairs, 32), 32, 0, s>>>(desc, keep, dst, a, r0, m,
                                                                         ws, w, sb, last);
            if ((e = cu_launched()) != cudaSuccess) return e;
        }
    }
    return cudaSuccess;
}

/* ---------------------------------------------------------------- rope */

/* Work item k of a row: k < n_dims/2 rotates pair k; beyond, dimension n_dims + (k - half)
 * passes through. */
static __global__ void k_rope(int n_dims, int neox, float freq_base, float freq_scale,
                              loom_cu_t dst, loom_cu_t a, loom_cu_t pos, loom_cu_t ff, int64_t n) {
    const int half = n_dims / 2;
    const int64_t D = a.ne[0], H = a.ne[1], T = a.ne[2];
    const int64_t per_row = half + (D - n_dims);
    CU_FOR(e, n) {
        const int64_t k = e % per_row, r = e / per_row;
        const int64_t h = r % H, t = (r / H) % T, i3 = r / (H * T);
        const char *x = cu_at(a, 0, h, t, i3);
        char *y = cu_at(dst, 0, h, t, i3);
        if (k >= half) {
            const int64_t i = n_dims + (k - half);
            *(float *)(y + i * dst.nb[0]) = *(const float *)(x + i * a.nb[0]);
            continue;
        }
        const int32_t pv = *(const int32_t *)cu_at(pos, t, 0, 0, 0);
        double theta = (double)pv * (double)freq_scale *
                       pow((double)freq_base, -2.0 * (double)k / (double)n_dims);
        if (ff.data) theta /= (double)*(const float *)(ff.data + k * ff.nb[0]);
        const float c = (float)cos(theta), sn = (float)sin(theta);
        const int64_t j0 = neox ? k : 2 * k;
        const int64_t j1 = neox ? k + half : 2 * k + 1;
        const float x0 = *(const float *)(x + j0 * a.nb[0]);
        const float x1 = *(const float *)(x + j1 * a.nb[0]);
        const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        const float y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
        *(float *)(y + j0 * dst.nb[0]) = y0;
        *(float *)(y + j1 * dst.nb[0]) = y1;
    }
}

extern "C" cudaError_t loom__cu_rope(int n_dims, int neox, float freq_base, float freq_scale,
                                     loom_cu_t dst, loom_cu_t a, loom_cu_t pos, loom_cu_t ff,
                                     cudaStream_t s) {
    const int64_t per_row = n_dims / 2 + (a.ne[0] - n_dims);
    const int64_t n = per_row * cu_nrows(a);
    if (n == 0) return cudaSuccess;
    k_rope<<<cu_blocks(n), CU_BLOCK, 0, s>>>(n_dims, neox, freq_base, freq_scale, dst, a, pos, ff,
                                             n);
    return cu_launched();
}

/* ---------------------------------------------------------------- rows */

static __device__ __forceinline__ int64_t cu_read_index(const loom_cu_t &ids, int64_t i0,
                                                        int64_t i1, int64_t i2) {
    const char *q = cu_at(ids, i0, i1, i2, 0);
    if (ids.type == LOOM_CU_I64) return *(const int64_t *)q;
    return *(const int32_t *)q;
}

/* r[i0, x, i1, i2] = a[i0, ids[x, i1, i2], i1 % A2, i2 % A3]; a bad index gives zeros. */
static __global__ void k_get_rows(loom_cu_t dst, loom_cu_t a, loom_cu_t ids, int64_t n,
                                  loom_cu_err *err, long long node) {
    CU_FOR(e, n) {
        int64_t i[4];
        cu_unravel(dst.ne, e, i);
        const int64_t row = cu_read_index(ids, i[1], i[2], i[3]);
        char *d = cu_at(dst, i[0], i[1], i[2], i[3]);
        if (row < 0 || row >= a.ne[1]) {
            cu_report(err, LOOM_CU_ERR_GET_ROWS, node, row, a.ne[1]);
            if (dst.type == LOOM_CU_I32)
                *(int32_t *)d = 0;
            else
                *(float *)d = 0.0f;
            continue;
        }
        if (a.type == LOOM_CU_I32) {
            *(int32_t *)d = *(const int32_t *)cu_at(a, i[0], row, i[2] % a.ne[2], i[3] % a.ne[3]);
            continue;
        }
        *(float *)d = cu_load_f(a, i[0], row, i[2] % a.ne[2], i[3] % a.ne[3]);
    }
}

extern "C" cudaError_t loom__cu_get_rows(loom_cu_t dst, loom_cu_t a, loom_cu_t ids,
                                         loom_cu_err *err, long long node, cudaStream_t s) {
    const int64_t n = cu_nelements(dst);
    if (n == 0) return cudaSuccess;
    k_get_rows<<<cu_blocks(n), CU_BLOCK, 0, s>>>(dst, a, ids, n, err, node);
    return cu_launched();
}

/* Item (u, x, i2, i3), u an element (float dst) or a block of 32 (quantised dst):
 * dst[u, ids[x, i2 % B2, i3 % B3], i2, i3] = b[u, x, i2 % B2, i3 % B3]. */
static __global__ void k_set_rows(loom_cu_t dst, loom_cu_t b, loom_cu_t ids, int64_t n,
                                  int64_t units, loom_cu_err *err, long long node) {
    const bool quant = cu_is_quant(dst.type);
    const int64_t X = b.ne[1];
    CU_FOR(e, n) {
        const int64_t u = e % units;
        int64_t r = e / units;
        const int64_t x = r % X;
        r /= X;
        const int64_t i2 = r % dst.ne[2], i3 = r / dst.ne[2];
        const int64_t b2 = i2 % b.ne[2], b3 = i3 % b.ne[3];
        const int64_t row = cu_read_index(ids, x, b2, b3);
        if (row < 0 || row >= dst.ne[1]) {
            cu_report(err, LOOM_CU_ERR_SET_ROWS, node, row, dst.ne[1]);
            continue;
        }
        if (!quant) {
            const float v = *(const float *)cu_at(b, u, x, b2, b3);
            cu_store_f(cu_at(dst, u, row, i2, i3), dst.type, v);
            continue;
        }
        float v[LOOM_CU_QK];
        for (int l = 0; l < LOOM_CU_QK; l++)
            v[l] = *(const float *)cu_at(b, u * LOOM_CU_QK + l, x, b2, b3);
        char *out = cu_at(dst, u, row, i2, i3);
        cu_quantize32(dst.type, v, out);
    }
}

extern "C" cudaError_t loom__cu_set_rows(loom_cu_t dst, loom_cu_t b, loom_cu_t ids,
                                         loom_cu_err *err, long long node, cudaStream_t s) {
    const int64_t units = cu_is_quant(dst.type) ? dst.ne[0] / LOOM_CU_QK : dst.ne[0];
    const int64_t n = units * b.ne[1] * dst.ne[2] * dst.ne[3];
    if (n == 0) return cudaSuccess;
    k_set_rows<<<cu_blocks(n), CU_BLOCK, 0, s>>>(dst, b, ids, n, units, err, node);
    return cu_launched();
}

static __global__ void k_concat(int dim, loom_cu_t dst, loom_cu_t a, loom_cu_t b, int64_t n,
                                int es) {
    CU_FOR(e, n) {
        int64_t i[4];
        cu_unravel(dst.ne, e, i);
        char *d = cu_at(dst, i[0], i[1], i[2], i[3]);
        const loom_cu_t *src = &a;
        if (i[dim] >= a.ne[dim]) {
            i[dim] -= a.ne[dim];
            src = &b;
        }
        cu_copy_bytes(d, cu_at(*src, i[0], i[1], i[2], i[3]), es);
    }
}

extern "C" cudaError_t loom__cu_concat(int dim, loom_cu_t dst, loom_cu_t a, loom_cu_t b,
                                       cudaStream_t s) {
    const int64_t n = cu_nelements(dst);
    if (n == 0) return cudaSuccess;
    k_concat<<<cu_blocks(n), CU_BLOCK, 0, s>>>(dim, dst, a, b, n, cu_type_size(dst.type));
    return cu_launched();
}

/* ---------------------------------------------------------------- communicator helpers */

static __global__ void k_f32_to_bf16(const float *x, uint16_t *y, int64_t n) {
    CU_FOR(i, n) y[i] = cu_f32_to_bf16(x[i]);
}

static __global__ void k_bf16_to_f32(const uint16_t *x, float *y, int64_t n) {
    CU_FOR(i, n) y[i] = cu_bf16_to_f32(x[i]);
}

static __global__ void k_sum_peers(float *dst, loom_cu_ptrs src, int n_src, int64_t n) {
    CU_FOR(i, n) {
        float acc = src.p[0][i];
        for (int j = 1; j < n_src; j++)
            acc = __fadd_rn(acc, src.p[j][i]);
        dst[i] = acc;
    }
}

extern "C" cudaError_t loom__cu_f32_to_bf16(const float *x, uint16_t *y, int64_t n,
                                            cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    k_f32_to_bf16<<<cu_blocks(n), CU_BLOCK, 0, s>>>(x, y, n);
    return cu_launched();
}

extern "C" cudaError_t loom__cu_bf16_to_f32(const uint16_t *x, float *y, int64_t n,
                                            cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    k_bf16_to_f32<<<cu_blocks(n), CU_BLOCK, 0, s>>>(x, y, n);
    return cu_launched();
}

extern "C" cudaError_t loom__cu_sum_peers(float *dst, loom_cu_ptrs src, int n_src, int64_t n,
                                          cudaStream_t s) {
    if (n == 0 || n_src < 1) return cudaSuccess;
    k_sum_peers<<<cu_blocks(n), CU_BLOCK, 0, s>>>(dst, src, n_src, n);
    return cu_launched();
}
