/*
 * The pure arithmetic of the CUDA kernels' work split, in C that compiles for the host and
 * the device alike (LOOM_CU_HD is __host__ __device__ under nvcc, nothing in C), so that
 * //tests/gpu:kernel_math_host_test checks it on any machine against straightforward
 * references (a softmax over the whole row, every index visited once):
 *
 * - flash-decoding (FLASH_ATTN_EXT with few query blocks and a long KV): how many blocks
 *   the KV length is split across, the key range of each split, the online-softmax step
 *   every split runs, and the log-sum-exp merge of the splits' partial (max, sum,
 *   accumulator) that the combine kernel performs;
 * - the tiled kernel's skip of a key tile that the mask hides from every query of a block
 *   (causal prefill: the tiles past the diagonal);
 * - the per-type matrix-vector kernel's walk over a weight row: lane l of a warp takes
 *   values k = l, l + 32, ... (consecutive lanes read consecutive values, so a warp's loads
 *   of the row and of b are contiguous), value k lives in block k / qk at offset k % qk;
 *   and its work items (weight row, group of columns, batch).
 *
 * Only plain float operations and expf/fmaxf: no intrinsic, no fused multiply-add is
 * asked for (the kernels are compiled with nvcc's default contraction, so the device may
 * fuse a product and a sum the host rounds twice: the host test's tolerances allow that).
 */
#ifndef LOOM_CUDA_KERNELS_MATH_H
#define LOOM_CUDA_KERNELS_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LOOM_CU_HD __host__ __device__
#else
#define LOOM_CU_HD
#endif

/* ---------------------------------------------------------------- flash-decoding */

#define LOOM_CU_FA_TK 32            /* keys per shared-memory tile of the tiled kernel */
#define LOOM_CU_FA_TQ 8             /* query rows per block of the tiled kernel */
#define LOOM_CU_FA_TILED_MAX_D 256  /* head sizes the tiled kernel takes */
#define LOOM_CU_FA_SPLIT_TARGET 256 /* blocks a split launch aims for (about 2 per SM) */
#define LOOM_CU_FA_SPLIT_MIN_KV 128 /* keys per split at least (4 tiles) */
#define LOOM_CU_FA_MAX_SPLITS 64

/* Keys per split: the nkv keys' tiles shared out (rounded up), so a split never shares a
 * tile. */
static LOOM_CU_HD inline int64_t loom__cu_fa_split_len(int64_t nkv, int splits) {
    const int64_t tiles = (nkv + LOOM_CU_FA_TK - 1) / LOOM_CU_FA_TK;
    return (tiles + splits - 1) / splits * LOOM_CU_FA_TK;
}

/* Splits of the KV length for a launch of n_blocks blocks (query blocks x KV heads x
 * sequences) over nkv keys: 1 (no split) when the launch already fills the GPU or the KV
 * is short; else enough splits to reach about LOOM_CU_FA_SPLIT_TARGET blocks, each split
 * at least LOOM_CU_FA_SPLIT_MIN_KV keys, at most LOOM_CU_FA_MAX_SPLITS. */
static LOOM_CU_HD inline int loom__cu_fa_splits(int64_t n_blocks, int64_t nkv) {
    if (n_blocks <= 0 || nkv < 2 * LOOM_CU_FA_SPLIT_MIN_KV) return 1;
    if (n_blocks >= LOOM_CU_FA_SPLIT_TARGET / 2) return 1;
    int64_t want = (LOOM_CU_FA_SPLIT_TARGET + n_blocks - 1) / n_blocks;
    const int64_t most = nkv / LOOM_CU_FA_SPLIT_MIN_KV;
    if (want > most) want = most;
    if (want > LOOM_CU_FA_MAX_SPLITS) want = LOOM_CU_FA_MAX_SPLITS;
    if (want < 2) return 1;
    /* as many as the rounded-up tiles per split need: with t = ceil(tiles / s) tiles each,
     * splits 0 .. s - 2 hold (s - 1) t < tiles, so none is left empty */
    const int64_t tiles = (nkv + LOOM_CU_FA_TK - 1) / LOOM_CU_FA_TK;
    const int64_t per = (tiles + want - 1) / want;
    want = (tiles + per - 1) / per;
    return want < 2 ? 1 : (int)want;
}

/* Keys [*lo, *hi) of split i (never empty for the splits loom__cu_fa_splits gives). */
static LOOM_CU_HD inline void loom__cu_fa_split_range(int64_t nkv, int splits, int i, int64_t *lo,
                                                      int64_t *hi) {
    const int64_t len = loom__cu_fa_split_len(nkv, splits);
    int64_t a = (int64_t)i * len, b = a + len;
    if (a > nkv) a = nkv;
    if (b > nkv) b = nkv;
    *lo = a;
    *hi = b;
}

/* Floats of the partial results of a split launch: per (output row, split) the running max,
 * sum and NaN flag, then Dv accumulator values. */
static LOOM_CU_HD inline int64_t loom__cu_fa_part_floats(int64_t rows, int splits, int64_t dv) {
    return rows * (int64_t)splits * (3 + dv);
}

/* One tile of the online softmax: the tile's largest score zmax (-inf when all masked)
 * against the running max *M. Returns false (nothing to add) while every score so far is
 * masked; else sets *ms, the factor of the old sum and accumulator (0 on the first live
 * tile), and moves *M to the new max. Each score z of the tile then weighs expf(z - *M). */
static LOOM_CU_HD inline bool loom__cu_fa_tile_max(float *M, float zmax, float *ms) {
    const float Mn = fmaxf(*M, zmax);
    if (Mn == -INFINITY) return false;
    *ms = expf(*M - Mn);
    *M = Mn;
    return true;
}

/* The merge of split partials into one softmax: Mg the largest partial max (-inf: every
 * key of the row masked), then partial i weighs loom__cu_fa_part_scale(Mi, Mg): its sum and
 * accumulator are rescaled by it and summed. */
static LOOM_CU_HD inline float loom__cu_fa_part_scale(float Mi, float Mg) {
    return Mi == -INFINITY ? 0.0f : expf(Mi - Mg);
}

/* A row's merged softmax: output value d is the sum over the splits of accumulator d times
 * loom__cu_fa_part_scale(M_i, M), times f * inv; NaN (as the CPU) when a split met a NaN
 * score or the sum is NaN (a NaN sink). */
typedef struct loom__cu_fa_merged {
    float M;   /* the largest partial max (before the sink) */
    float f;   /* the sink's factor on the accumulator (1 without a sink or below M) */
    float inv; /* 1 / the total sum, 0 when it is 0 (every key masked, no sink) */
    bool nan;
} loom__cu_fa_merged;

/* Merges the partials pr[i * stride ..] (M, S, NaN flag, then the accumulator) of splits
 * splits; sink: the head's sink logit, or NULL. The sink is folded in as the single-pass
 * kernel does at the end of a row. */
static LOOM_CU_HD inline loom__cu_fa_merged loom__cu_fa_merge(const float *pr, int splits,
                                                              int64_t stride, const float *sink) {
    loom__cu_fa_merged r;
    r.M = -INFINITY;
    r.f = 1.0f;
    r.nan = false;
    for (int i = 0; i < splits; i++) {
        r.M = fmaxf(r.M, pr[i * stride]);
        r.nan = r.nan || pr[i * stride + 2] != 0.0f;
    }
    float S = 0.0f;
    for (int i = 0; i < splits; i++)
        S += pr[i * stride + 1] * loom__cu_fa_part_scale(pr[i * stride], r.M);
    if (sink) {
        const float sk = *sink;
        if (sk > r.M) {
            r.f = expf(r.M - sk);
            S = S * r.f + 1.0f;
        } else {
            S += expf(sk - r.M);
        }
    }
    if (S != S) r.nan = true;
    r.inv = S > 0.0f ? 1.0f / S : 0.0f;
    return r;
}

/* Output value d of a merged row. */
static LOOM_CU_HD inline float loom__cu_fa_merged_value(const float *pr, int splits, int64_t stride,
                                                        int64_t d, const loom__cu_fa_merged *r) {
    if (r->nan) return NAN;
    float a = 0.0f;
    for (int i = 0; i < splits; i++)
        a += pr[i * stride + 3 + d] * loom__cu_fa_part_scale(pr[i * stride], r->M);
    return a * r->f * r->inv;
}

/* A tile (keys [i0, i0 + nk)) is skipped by a block of the tiled kernel when its mask hides
 * every key from every query row of the block: mask values -inf (NaN or any other value
 * keeps the tile; rows without a mask keep every tile). v: the block's mask values, row
 * after row (rows of ld values). */
static LOOM_CU_HD inline bool loom__cu_fa_tile_hidden(const float *v, int rows, int nk, int ld) {
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < nk; k++)
            if (v[r * ld + k] != -INFINITY) return false;
    return true;
}

/* ---------------------------------------------------------------- per-type matvec */

#define LOOM_CU_MMV_COLS 8  /* columns of b per warp */
#define LOOM_CU_MMV_WARPS 4 /* warps per block */

/* Where value k of a weight row of a type with qk values per block lives: block k / qk,
 * value k % qk of it (qk 1 for F32/F16/BF16: one value per element). */
static LOOM_CU_HD inline void loom__cu_mmv_pos(int64_t k, int qk, int64_t *blk, int *e) {
    *blk = k / qk;
    *e = (int)(k % qk);
}

/* Work item w of the matvec kernel: weight row m, group of columns cg (LOOM_CU_MMV_COLS
 * columns of b from n0), batch (i2, i3) of b; nc columns in the group (the last may be
 * short). M rows, N columns, B2 batches in dim 2. */
typedef struct loom__cu_mmv_item {
    int64_t m, n0, i2, i3;
    int nc;
} loom__cu_mmv_item;

static LOOM_CU_HD inline loom__cu_mmv_item loom__cu_mmv_item_of(int64_t w, int64_t M, int64_t N,
                                                                int64_t B2) {
    loom__cu_mmv_item it;
    const int64_t ncg = (N + LOOM_CU_MMV_COLS - 1) / LOOM_CU_MMV_COLS;
    it.m = w % M;
    int64_t rest = w / M;
    const int64_t cg = rest % ncg;
    rest /= ncg;
    it.i2 = rest % B2;
    it.i3 = rest / B2;
    it.n0 = cg * LOOM_CU_MMV_COLS;
    it.nc = N - it.n0 < LOOM_CU_MMV_COLS ? (int)(N - it.n0) : LOOM_CU_MMV_COLS;
    return it;
}

#endif /* LOOM_CUDA_KERNELS_MATH_H */
