/*
 * CUDA kernels for the matrix products and attention: MUL_MAT by warp dot products (any
 * weight type, one kernel per type chosen on the host, block types decoded one value per
 * lane in registers, any strides, batch broadcasting), MUL_MAT_ID (routed tokens bucketed
 * by expert first, then one warp per weight row and expert over that expert's bucket), the
 * conversion of weights to a contiguous F32 panel or to BF16 for cuBLAS, and
 * FLASH_ATTN_EXT (tiled: blocks of queries sharing a KV head stage keys and values through
 * shared memory, with an online softmax per query, tiles the mask hides skipped, the KV
 * split across blocks and combined when the blocks are few; head sizes above 256 use one
 * warp per output row). The earlier matvec and MUL_MAT_ID kernels stay (legacy != 0).
 *
 * The large products go to cuBLAS from the host code (cuda-graph.c); these kernels are the
 * simple, always-correct path: the CPU oracle's sums in another order, never a lower
 * precision (b is never rounded to 16 bits or quantised).
 */
#include "backends/cuda/kernels-common.cuh"

#define MMV_COLS LOOM_CU_MMV_COLS   /* columns of b per warp */
#define MMV_WARPS LOOM_CU_MMV_WARPS /* warps per block */
/* Blocks per SM the per-type kernels are built for: 8 blocks of 4 warps (1024 threads) at
 * 64 registers each fill an SM's 64 Ki registers, so ptxas keeps them at <= 64 registers
 * (figures with -Xptxas -v in backends/cuda/README.md). */
#define MMV_MIN_BLOCKS 8
#define FA_WARPS 4

static __device__ __forceinline__ float cu_mm_b(const char *bcol, const loom_cu_t &b, int64_t k,
                                                int c) {
    return *(const float *)(bcol + k * b.nb[0] + c * b.nb[1]);
}

/* acc[c] += a_row . b[:, n0 + c] for c < nc (this lane's share of k). */
static __device__ __forceinline__ void cu_mm_dot(const loom_cu_t &a, const char *arow,
                                                 const loom_cu_t &b, const char *bcol, int nc,
                                                 float *acc) {
    const int lane = threadIdx.x & 31;
    const int64_t K = a.ne[0];
    if (cu_is_quant(a.type)) { /* lane by lane over chunks of 32 values */
        const int nq = cu_qk(a.type) / 32;
        for (int64_t ch = lane; ch < K / 32; ch += 32) {
            float v[32];
            cu_dequant32(a.type, arow + (ch / nq) * a.nb[0], (int)(ch % nq) * 32, v);
#pragma unroll
            for (int l = 0; l < 32; l++) {
                const int64_t k = ch * 32 + l;
#pragma unroll
                for (int c = 0; c < MMV_COLS; c++)
                    if (c < nc) acc[c] += v[l] * cu_mm_b(bcol, b, k, c);
            }
        }
        return;
    }
    for (int64_t k = lane; k < K; k += 32) {
        const float av = cu_load_f_ptr(arow + k * a.nb[0], a.type);
#pragma unroll
        for (int c = 0; c < MMV_COLS; c++)
            if (c < nc) acc[c] += av * cu_mm_b(bcol, b, k, c);
    }
}

/* Work item w: weight row m, column group cg (MMV_COLS columns of b), batch (i2, i3). */
static __global__ void k_mul_mat_vec(loom_cu_t dst, loom_cu_t a, loom_cu_t b, int64_t n_items) {
    const int lane = threadIdx.x & 31;
    const int64_t M = a.ne[1], N = b.ne[1], B2 = b.ne[2];
    const int64_t ncg = (N + MMV_COLS - 1) / MMV_COLS;
    const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
    const int64_t nwarps = (int64_t)gridDim.x * MMV_WARPS;
    for (int64_t w = (int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5); w < n_items;
         w += nwarps) {
        const int64_t m = w % M;
        int64_t rest = w / M;
        const int64_t cg = rest % ncg;
        rest /= ncg;
        const int64_t i2 = rest % B2, i3 = rest / B2;
        const int64_t n0 = cg * MMV_COLS;
        const int nc = N - n0 < MMV_COLS ? (int)(N - n0) : MMV_COLS;
        float acc[MMV_COLS];
#pragma unroll
        for (int c = 0; c < MMV_COLS; c++)
            acc[c] = 0.0f;
        cu_mm_dot(a, cu_at(a, 0, m, i2 / r2, i3 / r3), b, cu_at(b, 0, n0, i2, i3), nc, acc);
#pragma unroll
        for (int c = 0; c < MMV_COLS; c++)
            acc[c] = cu_warp_sum(acc[c]);
        if (lane == 0) {
            for (int c = 0; c < nc; c++)
                *(float *)cu_at(dst, m, n0 + c, i2, i3) = acc[c];
        }
    }
}

/* ---------------------------------------------------------------- per-type matvec */

/* The weight types as compile-time constants: whether T is a block type, and its values
 * per block (1 for F32/F16/BF16). */
template <int T> struct cu_wt {
    static constexpr bool quant =
        T == LOOM_CU_Q8_0 || T == LOOM_CU_Q4_0 || (T >= LOOM_CU_Q4_1 && T <= LOOM_CU_IQ4_XS);
    static constexpr int qk =
        (T >= LOOM_CU_Q2_K && T <= LOOM_CU_IQ4_XS) ? LOOM_CU_QK_K : (quant ? LOOM_CU_QK : 1);
};

/* Value k of a weight row of type T starting at row (nb0: bytes per element, or per block
 * for a block type), decoded as the CPU's reference does (kernels-quant.cuh). */
template <int T>
static __device__ __forceinline__ float cu_wval(const char *row, int64_t nb0, int64_t k) {
    if constexpr (T == LOOM_CU_F32) {
        return *(const float *)(row + k * nb0);
    } else if constexpr (T == LOOM_CU_F16) {
        return cu_fp16_to_f32(*(const uint16_t *)(row + k * nb0));
    } else if constexpr (T == LOOM_CU_BF16) {
        return cu_bf16_to_f32(*(const uint16_t *)(row + k * nb0));
    } else {
        int64_t blk;
        int e;
        loom__cu_mmv_pos(k, cu_wt<T>::qk, &blk, &e);
        return cu_qval(T, row + blk * nb0, e);
    }
}

/* acc[c] += a_row . b column c for c < nc (nc <= NC), where column c's element k is at
 * cols[c] + k bnb0. Lane l takes k = l, l + 32, ...: a warp reads 32 consecutive values of
 * the row (one 32-value block, or a 32-value slice of a super-block: contiguous bytes) and
 * of each column per step; the weights are decoded one value per lane, so nothing but the
 * accumulators and the column pointers stays live across steps. NC == 1 (one column, the
 * decode of a token) unrolls four steps to keep more loads in flight; NC == MMV_COLS keeps
 * one step's loads (eight columns already give eight). */
template <int T, int NC>
static __device__ __forceinline__ void cu_mmv_dot(const char *arow, int64_t anb0, int64_t K,
                                                  const char *const *cols, int64_t bnb0, int nc,
                                                  float *acc) {
    if constexpr (NC == 1) {
        (void)nc;
        const char *col = cols[0];
#pragma unroll 4
        for (int64_t k = threadIdx.x & 31; k < K; k += 32)
            acc[0] += cu_wval<T>(arow, anb0, k) * *(const float *)(col + k * bnb0);
    } else {
#pragma unroll 1
        for (int64_t k = threadIdx.x & 31; k < K; k += 32) {
            const float w = cu_wval<T>(arow, anb0, k);
            const int64_t off = k * bnb0;
#pragma unroll
            for (int c = 0; c < NC; c++)
                if (c < nc) acc[c] += w * *(const float *)(cols[c] + off);
        }
    }
}

/* k_mul_mat_vec for weights of type T (one instantiation per type, chosen on the host) and
 * up to NC columns per warp (1: b has one column; else MMV_COLS): the same work items and
 * the same per-lane order of the products as the legacy kernel's float path. */
template <int T, int NC>
static __global__ void __launch_bounds__(32 * MMV_WARPS, MMV_MIN_BLOCKS)
    k_mmv(loom_cu_t dst, loom_cu_t a, loom_cu_t b, int64_t n_items) {
    const int lane = threadIdx.x & 31;
    const int64_t M = a.ne[1], N = b.ne[1], B2 = b.ne[2];
    const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
    const int64_t nwarps = (int64_t)gridDim.x * MMV_WARPS;
    for (int64_t w = (int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5); w < n_items;
         w += nwarps) {
        const loom__cu_mmv_item it = loom__cu_mmv_item_of(w, M, N, B2);
        const char *bcol = cu_at(b, 0, it.n0, it.i2, it.i3);
        const char *cols[NC];
        float acc[NC];
#pragma unroll
        for (int c = 0; c < NC; c++) {
            acc[c] = 0.0f;
            cols[c] = bcol + c * b.nb[1];
        }
        cu_mmv_dot<T, NC>(cu_at(a, 0, it.m, it.i2 / r2, it.i3 / r3), a.nb[0], a.ne[0], cols,
                          b.nb[0], it.nc, acc);
#pragma unroll
        for (int c = 0; c < NC; c++)
            acc[c] = cu_warp_sum(acc[c]);
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < NC; c++) /* unrolled: acc stays in registers */
                if (c < it.nc) *(float *)cu_at(dst, it.m, it.n0 + c, it.i2, it.i3) = acc[c];
        }
    }
}

/* Every weight type the matmul kernels take, for the host's switch. */
#define CU_MM_TYPES(X)                                                                             \
    X(LOOM_CU_F32)                                                                                 \
    X(LOOM_CU_F16)                                                                                 \
    X(LOOM_CU_BF16)                                                                                \
    X(LOOM_CU_Q8_0)                                                                                \
    X(LOOM_CU_Q4_0)                                                                                \
    X(LOOM_CU_Q4_1)                                                                                \
    X(LOOM_CU_Q5_0)                                                                                \
    X(LOOM_CU_Q5_1)                                                                                \
    X(LOOM_CU_IQ4_NL)                                                                              \
    X(LOOM_CU_MXFP4)                                                                               \
    X(LOOM_CU_Q2_K)                                                                                \
    X(LOOM_CU_Q3_K)                                                                                \
    X(LOOM_CU_Q4_K)                                                                                \
    X(LOOM_CU_Q5_K)                                                                                \
    X(LOOM_CU_Q6_K)                                                                                \
    X(LOOM_CU_IQ4_XS)

extern "C" cudaError_t loom__cu_mul_mat_vec(loom_cu_t dst, loom_cu_t a, loom_cu_t b, int legacy,
                                            cudaStream_t s) {
    const int64_t M = a.ne[1], N = b.ne[1];
    const int64_t n_items = M * ((N + MMV_COLS - 1) / MMV_COLS) * b.ne[2] * b.ne[3];
    if (n_items == 0) return cudaSuccess;
    const unsigned grid = cu_blocks(n_items, MMV_WARPS);
    if (!legacy) {
        switch (a.type) {
#define CU_MMV_CASE(T)                                                                             \
    case T:                                                                                        \
        if (N == 1)                                                                                \
            k_mmv<T, 1><<<grid, 32 * MMV_WARPS, 0, s>>>(dst, a, b, n_items);                       \
        else                                                                                       \
            k_mmv<T, MMV_COLS><<<grid, 32 * MMV_WARPS, 0, s>>>(dst, a, b, n_items);                \
        return cu_launched();
            CU_MM_TYPES(CU_MMV_CASE)
#undef CU_MMV_CASE
        default:
            break; /* any other type: the legacy kernel's rules */
        }
    }
    k_mul_mat_vec<<<grid, 32 * MMV_WARPS, 0, s>>>(dst, a, b, n_items);
    return cu_launched();
}

/* acc[c] += a_row . b column c (cols[c] points at its first element) for c < nc. */
static __device__ __forceinline__ void cu_mm_dot_cols(const loom_cu_t &a, const char *arow,
                                                      const loom_cu_t &b, const char *const *cols,
                                                      int nc, float *acc) {
    const int lane = threadIdx.x & 31;
    const int64_t K = a.ne[0];
    if (cu_is_quant(a.type)) { /* lane by lane over chunks of 32 values */
        const int nq = cu_qk(a.type) / 32;
        for (int64_t ch = lane; ch < K / 32; ch += 32) {
            float v[32];
            cu_dequant32(a.type, arow + (ch / nq) * a.nb[0], (int)(ch % nq) * 32, v);
#pragma unroll
            for (int l = 0; l < 32; l++) {
                const int64_t k = ch * 32 + l;
#pragma unroll
                for (int c = 0; c < MMV_COLS; c++)
                    if (c < nc) acc[c] += v[l] * *(const float *)(cols[c] + k * b.nb[0]);
            }
        }
        return;
    }
    for (int64_t k = lane; k < K; k += 32) {
        const float av = cu_load_f_ptr(arow + k * a.nb[0], a.type);
#pragma unroll
        for (int c = 0; c < MMV_COLS; c++)
            if (c < nc) acc[c] += av * *(const float *)(cols[c] + k * b.nb[0]);
    }
}

/* out[m, u, t] for the np pairs p = u + U t in pend: one pass over weight row arow. */
static __device__ __forceinline__ void cu_mmid_flush(const loom_cu_t &dst, const loom_cu_t &as,
                                                     const loom_cu_t &b, const char *arow,
                                                     int64_t m, int64_t U, const int64_t *pend,
                                                     int np) {
    const int lane = threadIdx.x & 31;
    const char *cols[MMV_COLS];
    float acc[MMV_COLS];
#pragma unroll
    for (int c = 0; c < MMV_COLS; c++) {
        acc[c] = 0.0f;
        cols[c] =
            c < np ? cu_at(b, 0, (pend[c] % U) % b.ne[1], pend[c] / U, 0) : (const char *)NULL;
    }
    cu_mm_dot_cols(as, arow, b, cols, np, acc);
#pragma unroll
    for (int c = 0; c < MMV_COLS; c++)
        acc[c] = cu_warp_sum(acc[c]);
    if (lane == 0)
        for (int c = 0; c < np; c++)
            *(float *)cu_at(dst, m, pend[c] % U, pend[c] / U, 0) = acc[c];
}

/* The routing of MUL_MAT_ID bucketed by expert, in one block: ws[0..E] the first slot of
 * each expert's pairs (ws[E] = the number of routed pairs), ws[E+1..2E] a cursor per
 * expert, ws[2E+1] the number of experts with pairs, then those experts in increasing order
 * (min(E, P) slots), then the pairs p = u + U t of each expert, expert after expert (P
 * slots; their order within an expert does not matter: every output is one warp's dot
 * product whichever columns share its pass). A pair with an id outside [0, E) is reported,
 * its outputs zeroed, and it joins no bucket. */
static __global__ void k_mul_mat_id_bucket(loom_cu_t dst, loom_cu_t ids, int64_t E, int32_t *ws,
                                           loom_cu_err *err, long long node) {
    const int64_t M = dst.ne[0], U = dst.ne[1], P = dst.ne[1] * dst.ne[2];
    int32_t *first = ws, *cur = ws + E + 1, *n_act = ws + 2 * E + 1, *act = n_act + 1;
    int32_t *pairs = act + (E < P ? E : P);
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
        cur[e] = 0;
    __syncthreads();
    for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
        const int32_t id = *(const int32_t *)cu_at(ids, p % U, p / U, 0, 0);
        if (id >= 0 && id < E) {
            atomicAdd(&cur[id], 1);
        } else {
            cu_report(err, LOOM_CU_ERR_MUL_MAT_ID, node, id, E);
            for (int64_t m = 0; m < M; m++)
                *(float *)cu_at(dst, m, p % U, p / U, 0) = 0.0f;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* E is the number of experts: a short serial scan */
        int32_t off = 0, na = 0;
        for (int64_t e = 0; e < E; e++) {
            const int32_t c = cur[e];
            first[e] = off;
            cur[e] = off;
            if (c > 0) act[na++] = (int32_t)e;
            off += c;
        }
        first[E] = off;
        *n_act = na;
    }
    __syncthreads();
    for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
        const int32_t id = *(const int32_t *)cu_at(ids, p % U, p / U, 0, 0);
        if (id >= 0 && id < E) pairs[atomicAdd(&cur[id], 1)] = (int32_t)p;
    }
}

/* Work item w = (m, k): weight row m of the k-th expert that has pairs (items beyond the
 * number of such experts do nothing) against that expert's bucket, up to MMV_COLS columns
 * of b per pass over the row, so a weight row is read once per MMV_COLS tokens that use it
 * and no warp scans the pairs of other experts. out[m, u, t] = as[:, m, ids[u, t]] .
 * b[:, u % B1, t]. */
static __global__ void k_mul_mat_id(loom_cu_t dst, loom_cu_t as, loom_cu_t b, const int32_t *ws,
                                    int64_t n_items) {
    const int64_t M = as.ne[1], E = as.ne[2], U = dst.ne[1], P = dst.ne[1] * dst.ne[2];
    const int32_t *first = ws, *n_act = ws + 2 * E + 1, *act = n_act + 1;
    const int32_t *pairs = act + (E < P ? E : P);
    const int64_t nwarps = (int64_t)gridDim.x * MMV_WARPS;
    for (int64_t w = (int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5); w < n_items;
         w += nwarps) {
        const int64_t m = w % M, k = w / M;
        if (k >= *n_act) continue; /* warp-uniform */
        const int32_t e = act[k];
        const char *arow = cu_at(as, 0, m, e, 0);
        const int32_t p1 = first[e + 1];
        for (int32_t p0 = first[e]; p0 < p1; p0 += MMV_COLS) {
            int64_t pend[MMV_COLS];
            const int np = p1 - p0 < MMV_COLS ? p1 - p0 : MMV_COLS;
#pragma unroll
            for (int c = 0; c < MMV_COLS; c++)
                pend[c] = c < np ? pairs[p0 + c] : 0;
            cu_mmid_flush(dst, as, b, arow, m, U, pend, np);
        }
    }
}

/* k_mul_mat_id for experts of type T (one instantiation per type, chosen on the host): the
 * same work items and bucket passes, the dot product of cu_mmv_dot. */
template <int T>
static __global__ void __launch_bounds__(32 * MMV_WARPS, MMV_MIN_BLOCKS)
    k_mmid(loom_cu_t dst, loom_cu_t as, loom_cu_t b, const int32_t *ws, int64_t n_items) {
    const int lane = threadIdx.x & 31;
    const int64_t M = as.ne[1], E = as.ne[2], U = dst.ne[1], P = dst.ne[1] * dst.ne[2];
    const int32_t *first = ws, *n_act = ws + 2 * E + 1, *act = n_act + 1;
    const int32_t *pairs = act + (E < P ? E : P);
    const int64_t nwarps = (int64_t)gridDim.x * MMV_WARPS;
    for (int64_t w = (int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5); w < n_items;
         w += nwarps) {
        const int64_t m = w % M, k = w / M;
        if (k >= *n_act) continue; /* warp-uniform */
        const int32_t e = act[k];
        const char *arow = cu_at(as, 0, m, e, 0);
        const int32_t p1 = first[e + 1];
        for (int32_t p0 = first[e]; p0 < p1; p0 += MMV_COLS) {
            const int np = p1 - p0 < MMV_COLS ? p1 - p0 : MMV_COLS;
            const char *cols[MMV_COLS];
            float acc[MMV_COLS];
#pragma unroll
            for (int c = 0; c < MMV_COLS; c++) {
                const int64_t p = pairs[p0 + (c < np ? c : 0)];
                acc[c] = 0.0f;
                cols[c] = cu_at(b, 0, (p % U) % b.ne[1], p / U, 0);
            }
            cu_mmv_dot<T, MMV_COLS>(arow, as.nb[0], as.ne[0], cols, b.nb[0], np, acc);
#pragma unroll
            for (int c = 0; c < MMV_COLS; c++)
                acc[c] = cu_warp_sum(acc[c]);
            if (lane == 0) {
#pragma unroll
                for (int c = 0; c < MMV_COLS; c++) {
                    if (c < np) {
                        const int64_t p = pairs[p0 + c];
                        *(float *)cu_at(dst, m, p % U, p / U, 0) = acc[c];
                    }
                }
            }
        }
    }
}

extern "C" cudaError_t loom__cu_mul_mat_id(loom_cu_t dst, loom_cu_t as, loom_cu_t b, loom_cu_t ids,
                                           int32_t *ws, loom_cu_err *err, long long node,
                                           int legacy, cudaStream_t s) {
    const int64_t M = as.ne[1], E = as.ne[2], P = dst.ne[1] * dst.ne[2];
    if (P == 0 || E == 0) return cudaSuccess;
    k_mul_mat_id_bucket<<<1, 1024, 0, s>>>(dst, ids, E, ws, err, node);
    cudaError_t e = cu_launched();
    /* (weight row, expert with pairs): at most min(E, P) experts have any */
    const int64_t n_items = M * (E < P ? E : P);
    if (e != cudaSuccess || n_items == 0) return e;
    const unsigned grid = cu_blocks(n_items, MMV_WARPS);
    if (!legacy) {
        switch (as.type) {
#define CU_MMID_CASE(T)                                                                            \
    case T:                                                                                        \
        k_mmid<T><<<grid, 32 * MMV_WARPS, 0, s>>>(dst, as, b, ws, n_items);                        \
        return cu_launched();
            CU_MM_TYPES(CU_MMID_CASE)
#undef CU_MMID_CASE
        default:
            break;
        }
    }
    k_mul_mat_id<<<grid, 32 * MMV_WARPS, 0, s>>>(dst, as, b, ws, n_items);
    return cu_launched();
}

/* out[k + (m - m0) K] = a[k, m, i2, i3] for m in [m0, m0 + mc). */
static __global__ void k_weights_to_f32(loom_cu_t a, int64_t i2, int64_t i3, int64_t m0, int64_t mc,
                                        float *out) {
    const int64_t K = a.ne[0];
    CU_FOR(e, K * mc) {
        const int64_t k = e % K, m = e / K;
        out[e] = cu_load_f(a, k, m0 + m, i2, i3);
    }
}

extern "C" cudaError_t loom__cu_weights_to_f32(loom_cu_t a, int64_t i2, int64_t i3, int64_t m0,
                                               int64_t mc, float *out, cudaStream_t s) {
    const int64_t n = a.ne[0] * mc;
    if (n == 0) return cudaSuccess;
    if (cu_is_quant(a.type)) return loom__cu_dequantize_f32(a, i2, i3, m0, mc, out, s);
    k_weights_to_f32<<<cu_blocks(n), CU_BLOCK, 0, s>>>(a, i2, i3, m0, mc, out);
    return cu_launched();
}

/* out[k + K m + K M b] = a[k, m, batch b] rounded to BF16 (nearest even), b = i2 + A2 i3
 * over every batch: the tensor-core GEMM's A operand, decoded per type as cu_wval. */
template <int T> static __global__ void k_weights_to_bf16(loom_cu_t a, uint16_t *out) {
    const int64_t K = a.ne[0], M = a.ne[1], A2 = a.ne[2];
    CU_FOR(e, K * M * A2 * a.ne[3]) {
        const int64_t k = e % K, r = e / K, m = r % M, b = r / M;
        out[e] = cu_f32_to_bf16(cu_wval<T>(cu_at(a, 0, m, b % A2, b / A2), a.nb[0], k));
    }
}

extern "C" cudaError_t loom__cu_weights_to_bf16(loom_cu_t a, uint16_t *out, cudaStream_t s) {
    const int64_t n = a.ne[0] * a.ne[1] * a.ne[2] * a.ne[3];
    if (n == 0) return cudaSuccess;
    switch (a.type) {
#define CU_BF16_CASE(T)                                                                            \
    case T:                                                                                        \
        k_weights_to_bf16<T><<<cu_blocks(n), CU_BLOCK, 0, s>>>(a, out);                            \
        return cu_launched();
        CU_MM_TYPES(CU_BF16_CASE)
#undef CU_BF16_CASE
    default:
        return cudaErrorInvalidValue;
    }
}

/* ---------------------------------------------------------------- flash attention */

/* Row r = (h, j, s) of dst [Dv, H, Nq, S]. Each lane owns the dimensions d = lane mod 32
 * of the query (staged in shared memory) and of the accumulator, so no lane reads another
 * lane's data and the warp needs no synchronisation besides its shuffles. The sums of a
 * butterfly shuffle are bit-identical on every lane, so every branch is warp-uniform. */
static __global__ void k_flash_attn(float scale, float max_bias, float softcap, loom_cu_t dst,
                                    loom_cu_t q, loom_cu_t k, loom_cu_t v, loom_cu_t mask,
                                    loom_cu_t sinks, int64_t nrows) {
    extern __shared__ float fa_sh[];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t D = q.ne[0], Nq = q.ne[1], H = q.ne[2];
    const int64_t Nkv = k.ne[1], Hk = k.ne[2], Dv = v.ne[0];
    const int64_t group = H / Hk;
    float *qs = fa_sh + wid * (D + Dv);
    float *acc = qs + D;
    for (int64_t r = (int64_t)blockIdx.x * FA_WARPS + wid; r < nrows;
         r += (int64_t)gridDim.x * FA_WARPS) {
        const int64_t h = r % H, j = (r / H) % Nq, s = r / (H * Nq);
        const int64_t hk = h / group;
        const float slope = cu_alibi_slope(max_bias, H, h);
        const char *qrow = cu_at(q, 0, j, h, s);
        for (int64_t d = lane; d < D; d += 32)
            qs[d] = *(const float *)(qrow + d * q.nb[0]);
        for (int64_t d = lane; d < Dv; d += 32)
            acc[d] = 0.0f;
        const char *mrow =
            mask.data ? cu_at(mask, 0, j, h % mask.ne[2], s % mask.ne[3]) : (const char *)NULL;
        float M = -INFINITY, S = 0.0f;
        bool nan = false; /* a NaN score makes the row NaN (NaN in, NaN out) */
        for (int64_t i = 0; i < Nkv; i++) {
            const float mv = mrow ? cu_load_f_ptr(mrow + i * mask.nb[0], mask.type) : 0.0f;
            if (mv == -INFINITY) continue;
            const char *krow = cu_at(k, 0, i, hk, s);
            float part = 0.0f;
            for (int64_t d = lane; d < D; d += 32)
                part += qs[d] * cu_load_f_ptr(krow + d * k.nb[0], k.type);
            float z = cu_warp_sum(part);
            z = __fmul_rn(z, scale);
            if (softcap > 0.0f) z = softcap * tanhf(z / softcap);
            z = __fadd_rn(z, __fmul_rn(slope, mv));
            if (z != z) nan = true;
            if (z == -INFINITY || z != z) continue;
            float vs;
            if (z > M) {
                const float ms = expf(M - z); /* 0 on the first key */
                if (ms != 1.0f) {
                    for (int64_t d = lane; d < Dv; d += 32)
                        acc[d] *= ms;
                }
                S *= ms;
                M = z;
                vs = 1.0f;
            } else {
                vs = expf(z - M);
            }
            const char *vrow = cu_at(v, 0, i, hk, s);
            for (int64_t d = lane; d < Dv; d += 32)
                acc[d] += vs * cu_load_f_ptr(vrow + d * v.nb[0], v.type);
            S += vs;
        }
        if (sinks.data) {
            const float sk = *(const float *)(sinks.data + h * sinks.nb[0]);
            if (sk > M) {
                const float ms = expf(M - sk);
                for (int64_t d = lane; d < Dv; d += 32)
                    acc[d] *= ms;
                S = S * ms + 1.0f;
                M = sk;
            } else {
                S += expf(sk - M);
            }
        }
        if (S != S) nan = true; /* a NaN sink: NaN, as the CPU (S > 0 alone would give 0) */
        const float inv = S > 0.0f ? 1.0f / S : 0.0f;
        char *y = cu_at(dst, 0, h, j, s);
        for (int64_t d = lane; d < Dv; d += 32)
            *(float *)(y + d * dst.nb[0]) = nan ? __int_as_float(0x7fc00000) : acc[d] * inv;
    }
}

#define FA_TQ LOOM_CU_FA_TQ /* query rows per block of the tiled kernel (one warp each) */
#define FA_TK LOOM_CU_FA_TK /* keys per shared-memory tile (one lane each for the scores) */
#define FA_TILED_MAX_D LOOM_CU_FA_TILED_MAX_D

/* The tiled kernel: a block takes FA_TQ query rows that share one KV head and sequence
 * (the heads of a GQA group and consecutive queries), stages FA_TK keys and values at a
 * time in shared memory (read from global memory once per block instead of once per
 * query), each lane scores one key of the tile against its warp's query, and the warp
 * folds the tile into its online softmax (running max M, sum S, accumulator rescaled by
 * exp(M_old - M_new)), each lane owning the output dimensions d = lane + 32 t.
 * Shared memory: K [FA_TK][ldk] (ldk odd: no bank conflicts), V [FA_TK][Dv], the queries
 * [FA_TQ][D] and the tile's weights [FA_TQ][FA_TK]. D, Dv <= FA_TILED_MAX_D.
 *
 * Flash-decoding (splits > 1): block bi also takes split bi % splits of the keys
 * (kernels-math.h: whole tiles per split) and writes its partial softmax (M, S, a NaN flag,
 * the unnormalised accumulator) to part instead of dst; k_flash_attn_combine merges them.
 * skip: a tile whose mask values are -inf for every query row of the block is not staged
 * nor scored (causal prefill: the tiles past the diagonal); its keys would add nothing
 * (their weights are 0). skip = 0 and splits = 1 is the earlier kernel, step for step. */
static __global__ void k_flash_attn_tiled(float scale, float max_bias, float softcap, loom_cu_t dst,
                                          loom_cu_t q, loom_cu_t k, loom_cu_t v, loom_cu_t mask,
                                          loom_cu_t sinks, int64_t n_blocks, int splits, int skip,
                                          float *part) {
    extern __shared__ float fa_sh[];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t D = q.ne[0], Nq = q.ne[1], H = q.ne[2];
    const int64_t Nkv = k.ne[1], Hk = k.ne[2], Dv = v.ne[0];
    const int64_t group = H / Hk, rows = group * Nq;
    const int64_t qblocks = (rows + FA_TQ - 1) / FA_TQ;
    const int64_t ldk = D % 2 ? D : D + 1;
    float *Ks = fa_sh;
    float *Vs = Ks + FA_TK * ldk;
    float *qs = Vs + FA_TK * Dv;
    float *ps = qs + FA_TQ * D;
    float *myq = qs + wid * D, *myp = ps + wid * FA_TK;
    for (int64_t bi = blockIdx.x; bi < n_blocks; bi += gridDim.x) {
        const int sp = (int)(bi % splits);
        const int64_t bq = bi / splits;
        const int64_t qb = bq % qblocks, hk = (bq / qblocks) % Hk, s = bq / (qblocks * Hk);
        const int64_t qi = qb * FA_TQ + wid;
        const bool active = qi < rows; /* warp-uniform */
        const int64_t h = hk * group + (active ? qi % group : 0), j = active ? qi / group : 0;
        const float slope = cu_alibi_slope(max_bias, H, h);
        int64_t lo, hi;
        loom__cu_fa_split_range(Nkv, splits, sp, &lo, &hi);
        __syncthreads(); /* the previous rows are done with shared memory */
        if (active) {
            const char *qrow = cu_at(q, 0, j, h, s);
            for (int64_t d = lane; d < D; d += 32)
                myq[d] = *(const float *)(qrow + d * q.nb[0]);
        }
        const char *mrow = active && mask.data ? cu_at(mask, 0, j, h % mask.ne[2], s % mask.ne[3])
                                               : (const char *)NULL;
        float acc[FA_TILED_MAX_D / 32];
#pragma unroll
        for (int t = 0; t < FA_TILED_MAX_D / 32; t++)
            acc[t] = 0.0f;
        float M = -INFINITY, S = 0.0f;
        bool nan = false;
        for (int64_t i0 = lo; i0 < hi; i0 += FA_TK) {
            const int nk = hi - i0 < FA_TK ? (int)(hi - i0) : FA_TK;
            /* this lane's key against its warp's query: masked out (-inf) or not */
            float mv = 0.0f;
            bool live = false;
            if (active && lane < nk) {
                mv = mrow ? cu_load_f_ptr(mrow + (i0 + lane) * mask.nb[0], mask.type) : 0.0f;
                live = mv != -INFINITY;
            }
            /* every warp is done with the previous tile; a tile hidden from every row of
             * the block is skipped by all its threads alike */
            if (skip) {
                if (!__syncthreads_or(live)) continue;
            } else {
                __syncthreads();
            }
            for (int64_t e = threadIdx.x; e < nk * D; e += blockDim.x) {
                const int64_t kk = e / D, d = e % D;
                Ks[kk * ldk + d] = cu_load_f_ptr(cu_at(k, 0, i0 + kk, hk, s) + d * k.nb[0], k.type);
            }
            for (int64_t e = threadIdx.x; e < nk * Dv; e += blockDim.x) {
                const int64_t kk = e / Dv, d = e % Dv;
                Vs[kk * Dv + d] = cu_load_f_ptr(cu_at(v, 0, i0 + kk, hk, s) + d * v.nb[0], v.type);
            }
            __syncthreads();
            if (!active) continue;
            float z = -INFINITY;
            if (live) {
                float dot = 0.0f;
                const float *kr = Ks + lane * ldk;
                for (int64_t d = 0; d < D; d++)
                    dot += myq[d] * kr[d];
                z = __fmul_rn(dot, scale);
                if (softcap > 0.0f) z = softcap * tanhf(z / softcap);
                z = __fadd_rn(z, __fmul_rn(slope, mv));
            }
            if (__any_sync(CU_FULL_MASK, z != z)) nan = true;
            float ms;
            if (!loom__cu_fa_tile_max(&M, cu_warp_max(z != z ? -INFINITY : z), &ms))
                continue; /* every key so far masked */
            const float pz = (z == -INFINITY || z != z) ? 0.0f : expf(z - M);
            myp[lane] = pz;
            __syncwarp();
            S = S * ms + cu_warp_sum(pz);
#pragma unroll
            for (int t = 0; t < FA_TILED_MAX_D / 32; t++) {
                const int64_t d = lane + 32 * t;
                if (d < Dv) {
                    float a = acc[t] * ms;
                    for (int kk = 0; kk < nk; kk++)
                        a += myp[kk] * Vs[kk * Dv + d];
                    acc[t] = a;
                }
            }
            __syncwarp(); /* myp is read before the next tile overwrites it */
        }
        if (!active) continue;
        if (part) { /* this split's partial: M, S, NaN flag, then the accumulator */
            float *pr = part + ((h + H * (j + Nq * s)) * splits + sp) * (3 + Dv);
            if (lane == 0) {
                pr[0] = M;
                pr[1] = S;
                pr[2] = nan ? 1.0f : 0.0f;
            }
#pragma unroll
            for (int t = 0; t < FA_TILED_MAX_D / 32; t++) {
                const int64_t d = lane + 32 * t;
                if (d < Dv) pr[3 + d] = acc[t];
            }
            continue;
        }
        if (sinks.data) {
            const float sk = *(const float *)(sinks.data + h * sinks.nb[0]);
            if (sk > M) {
                const float ms = expf(M - sk);
#pragma unroll
                for (int t = 0; t < FA_TILED_MAX_D / 32; t++)
                    acc[t] *= ms;
                S = S * ms + 1.0f;
                M = sk;
            } else {
                S += expf(sk - M);
            }
        }
        if (S != S) nan = true; /* a NaN sink: NaN, as the CPU (S > 0 alone would give 0) */
        const float inv = S > 0.0f ? 1.0f / S : 0.0f;
        char *y = cu_at(dst, 0, h, j, s);
#pragma unroll
        for (int t = 0; t < FA_TILED_MAX_D / 32; t++) {
            const int64_t d = lane + 32 * t;
            if (d < Dv)
                *(float *)(y + d * dst.nb[0]) = nan ? __int_as_float(0x7fc00000) : acc[t] * inv;
        }
    }
}

/* The second step of flash-decoding: one warp per output row r = (h, j, s) merges the
 * row's `splits` partials (kernels-math.h: each rescaled by exp(M_i - max M)), then adds
 * the sink and normalises exactly as the tiled kernel does for a whole row. */
static __global__ void k_flash_attn_combine(loom_cu_t dst, loom_cu_t sinks, const float *part,
                                            int splits, int64_t nrows) {
    const int lane = threadIdx.x & 31;
    const int64_t Dv = dst.ne[0], H = dst.ne[1], Nq = dst.ne[2];
    const int64_t stride = 3 + Dv;
    for (int64_t r = (int64_t)blockIdx.x * FA_WARPS + (threadIdx.x >> 5); r < nrows;
         r += (int64_t)gridDim.x * FA_WARPS) {
        const int64_t h = r % H, j = (r / H) % Nq, s = r / (H * Nq);
        const float *pr = part + r * splits * stride;
        const float *sink = sinks.data ? (const float *)(sinks.data + h * sinks.nb[0]) : NULL;
        const loom__cu_fa_merged mg = loom__cu_fa_merge(pr, splits, stride, sink);
        char *y = cu_at(dst, 0, h, j, s);
        for (int64_t d = lane; d < Dv; d += 32)
            *(float *)(y + d * dst.nb[0]) = loom__cu_fa_merged_value(pr, splits, stride, d, &mg);
    }
}

/* The tiled kernel's shared-memory opt-in beyond 48 KiB, once per device (not per launch):
 * the largest it can need (D = Dv = FA_TILED_MAX_D: 73 KiB, within every sm_80+ limit),
 * remembered per device ordinal; a device that refuses it gets this launch's size. */
#define FA_MAX_DEVICES 64
static int fa_smem_set[FA_MAX_DEVICES]; /* bytes opted in per device; 0 = not yet */

static cudaError_t fa_tiled_smem_opt_in(int smem) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const bool known = dev >= 0 && dev < FA_MAX_DEVICES;
    if (known && __atomic_load_n(&fa_smem_set[dev], __ATOMIC_ACQUIRE) >= smem) return cudaSuccess;
    const int most = (int)sizeof(float) * (FA_TK * (FA_TILED_MAX_D + 1) + FA_TK * FA_TILED_MAX_D +
                                           FA_TQ * FA_TILED_MAX_D + FA_TQ * FA_TK);
    int want = most > smem ? most : smem;
    e = cudaFuncSetAttribute(k_flash_attn_tiled, cudaFuncAttributeMaxDynamicSharedMemorySize, want);
    if (e != cudaSuccess && want != smem) {
        (void)cudaGetLastError();
        want = smem;
        e = cudaFuncSetAttribute(k_flash_attn_tiled, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 want);
    }
    if (e == cudaSuccess && known) __atomic_store_n(&fa_smem_set[dev], want, __ATOMIC_RELEASE);
    return e;
}

extern "C" cudaError_t loom__cu_flash_attn(float scale, float max_bias, float softcap,
                                           loom_cu_t dst, loom_cu_t q, loom_cu_t k, loom_cu_t v,
                                           loom_cu_t mask, loom_cu_t sinks, float *ws,
                                           size_t ws_bytes, int legacy, cudaStream_t s) {
    const int64_t nrows = dst.ne[1] * dst.ne[2] * dst.ne[3];
    if (nrows == 0 || dst.ne[0] == 0) return cudaSuccess;
    const int64_t D = q.ne[0], Dv = v.ne[0];
    if (D <= FA_TILED_MAX_D && Dv <= FA_TILED_MAX_D && k.ne[1] > 0) {
        const int64_t ldk = D % 2 ? D : D + 1;
        const size_t smem =
            sizeof(float) * (size_t)(FA_TK * ldk + FA_TK * Dv + FA_TQ * D + FA_TQ * FA_TK);
        if (smem > 48 * 1024) {
            cudaError_t e = fa_tiled_smem_opt_in((int)smem);
            if (e != cudaSuccess) return e;
        }
        const int64_t rows = (q.ne[2] / k.ne[2]) * q.ne[1];
        const int64_t n_blocks = (rows + FA_TQ - 1) / FA_TQ * k.ne[2] * q.ne[3];
        const size_t need = loom__cu_flash_attn_scratch(q.ne, k.ne, v.ne, legacy);
        const int splits =
            need > 0 && ws && ws_bytes >= need ? loom__cu_fa_splits(n_blocks, k.ne[1]) : 1;
        k_flash_attn_tiled<<<cu_blocks(n_blocks * splits, 1), 32 * FA_TQ, smem, s>>>(
            scale, max_bias, softcap, dst, q, k, v, mask, sinks, n_blocks * splits, splits, !legacy,
            splits > 1 ? ws : (float *)NULL);
        cudaError_t e = cu_launched();
        if (e != cudaSuccess || splits == 1) return e;
        k_flash_attn_combine<<<cu_blocks(nrows, FA_WARPS), 32 * FA_WARPS, 0, s>>>(dst, sinks, ws,
                                                                                  splits, nrows);
        return cu_launched();
    }
    const size_t smem = (size_t)FA_WARPS * (size_t)(q.ne[0] + v.ne[0]) * sizeof(float);
    k_flash_attn<<<cu_blocks(nrows, FA_WARPS), 32 * FA_WARPS, smem, s>>>(
        scale, max_bias, softcap, dst, q, k, v, mask, sinks, nrows);
    return cu_launched();
}
