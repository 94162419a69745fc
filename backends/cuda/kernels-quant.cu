/*
 * The dequantisation kernel of the block types (kernels-quant.cuh has the per-type decode):
 * MUL_MAT's dequantise-once path converts a panel of weight rows to F32 for cuBLAS here, one
 * thread per 32 values (a K-quant super-block is 8 threads, adjacent threads read adjacent
 * bytes), bit-identical to core's reference dequantisers. GET_ROWS, CPY to F32 and the dot
 * kernels decode through the same functions (cu_load_f, cu_dequant32).
 */
#include "backends/cuda/kernels-common.cuh"

/* out[k + (m - m0) K] = a[k, m, i2, i3] for m in [m0, m0 + mc): chunk c is values
 * 32 (c % (K / 32)) .. + 31 of row m0 + c / (K / 32). */
static __global__ void k_dequantize_f32(loom_cu_t a, int64_t i2, int64_t i3, int64_t m0, int64_t mc,
                                        float *out) {
    const int64_t K = a.ne[0], cpr = K / 32;
    const int nq = cu_qk(a.type) / 32;
    CU_FOR(c, cpr * mc) {
        const int64_t ch = c % cpr, m = c / cpr;
        float v[32];
        cu_dequant32(a.type, cu_at(a, ch / nq, m0 + m, i2, i3), (int)(ch % nq) * 32, v);
        float *o = out + m * K + ch * 32;
#pragma unroll
        for (int l = 0; l < 32; l++)
            o[l] = v[l];
    }
}

extern "C" cudaError_t loom__cu_dequantize_f32(loom_cu_t a, int64_t i2, int64_t i3, int64_t m0,
                                               int64_t mc, float *out, cudaStream_t s) {
    const int64_t n = a.ne[0] / 32 * mc;
    if (n == 0) return cudaSuccess;
    k_dequantize_f32<<<cu_blocks(n), CU_BLOCK, 0, s>>>(a, i2, i3, m0, mc, out);
    return cu_launched();
}
