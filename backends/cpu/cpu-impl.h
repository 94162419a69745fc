/*
 * CPU backend internals, shared by the kernel files of backends/cpu/ only.
 *
 * The graph executor (graph.c) runs every node on every thread of a pool; each op kernel
 * takes its share of the work from loom__cpu_params (thread index, scratch memory, SIMD
 * table) and may synchronise with loom__cpu_barrier. Scratch is sized before the run by
 * loom__cpu_op_work (per op), so kernels never allocate. Kernels report data errors (an
 * out-of-range row index) through loom__cpu_fail; the executor raises them on the caller's
 * thread afterwards.
 *
 * SIMD: the hot inner loops live behind loom__cpu_simd, a table with a portable-C version
 * (simd.c) and AVX2+FMA / AVX-512 versions (simd-avx2.c, simd-avx512.c) compiled with
 * target attributes and chosen at run time (LOOM_CPU_SIMD caps the choice).
 */
#ifndef LOOM_CPU_IMPL_H
#define LOOM_CPU_IMPL_H

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "loom/core.h"
#include "loom/cpu.h"

/* ---------------------------------------------------------------- activations as Q8 */

/* A row of activations quantised as Q8_0 for the integer dot products of quantised
 * matmuls: the same values as loom_block_q8_0 (d = max|x| / 127, q = round(x / d)), laid
 * out as arrays so the SIMD dots load several blocks' scales at once:
 *   float d[nblk]; float s[nblk] (s = d * sum(q), for the Q4_0 offset);
 *   int8_t qs[nblk][32]; padded to 64 bytes. */
/* Software prefetch of the weight stream of the matrix-vector dots: each step of a dot's
 * main loop asks for the cache lines LOOM__CPU_PF_AHEAD bytes ahead of the `bytes` it reads
 * (rows are consecutive, so near a row's end that is the start of the next one). With work
 * per byte (Q4_0, Q8_0) the hardware prefetcher alone leaves the stream 15-25% under the
 * read bandwidth; 16 KiB ahead closes most of it (bench/matmul_bench N = 1; 1 KiB ahead was
 * slower, 4-16 KiB faster). A prefetch never faults: past the last row it does nothing. */
#define LOOM__CPU_PF_AHEAD 16384
static inline __attribute__((always_inline)) void loom__cpu_prefetch_ahead(const void *p,
                                                                          int bytes) {
    const uintptr_t at = (uintptr_t)p + LOOM__CPU_PF_AHEAD;
    for (int off = 0; off < bytes; off += 64)
        __builtin_prefetch((const void *)(at + (uintptr_t)off), 0, 3);
}

static inline size_t loom__q8a_row_bytes(int64_t nblk) {
    return ((size_t)nblk * (2 * sizeof(float) + 32) + 63) & ~(size_t)63;
}
static inline float *loom__q8a_d(void *row) {
    return (float *)row;
}
static inline float *loom__q8a_s(void *row, int64_t nblk) {
    return (float *)row + nblk;
}
static inline int8_t *loom__q8a_qs(void *row, int64_t nblk) {
    return (int8_t *)((float *)row + 2 * nblk);
}

/* ---------------------------------------------------------------- SIMD table */

/* Register tile of the F32 GEMM micro-kernel: MR output rows (of a) by NR columns (rows of
 * b); see ops-matmul.c for the packed layouts. */
typedef void (*loom__gemm_tile_fn)(int64_t kc, const float *ap, const float *bp, float *c,
                                   size_t ldc, int first, int mvalid, int nvalid);
/* Packs rows [0, rows) (rows <= MR) of kc floats each, lda floats apart, into one MR-wide
 * panel panel[k * MR + i]; rows past `rows` are zero. panel is 64-byte aligned. */
typedef void (*loom__gemm_pack_fn)(const float *a, size_t lda, int64_t kc, int rows, float *panel);
/* Lays mr unpacked weight rows (q[i * 32 nblk ..], d and mn [i * 2 nblk + H b + h]) out as
 * one canonical A panel of nblk blocks with H = halves scales per block (qgemm.h). */
typedef void (*loom__qgemm_scatter_fn)(const int8_t *q, const float *d, const float *mn, int mr,
                                       int halves, int64_t nblk, void *panel);
/* n blocks of 16 packed nibble bytes, block i at qs + i * stride, through the 16-entry
 * table lut: q[32 i + l] = lut[qs[l] & 15], q[32 i + 16 + l] = lut[qs[l] >> 4] (l < 16). */
typedef void (*loom__qgemm_lut16_fn)(const uint8_t *qs, size_t stride, int64_t n,
                                     const int8_t *lut, int8_t *q);
/* Register tile of the int8 GEMM of quantised weights (qgemm.h: canonical A and B panels
 * of nblk 32-element blocks): c[j * ldc + i] (+)= the tile, i < mvalid, j < nvalid;
 * has_min adds the weights' min terms; halves (1 or 2) is the A blocks' scales per block. */
typedef void (*loom__qgemm_tile_fn)(int64_t nblk, const void *ap, const void *bp, float *c,
                                    size_t ldc, int first, int has_min, int halves, int mvalid,
                                    int nvalid);

typedef struct loom__cpu_simd {
    const char *name; /* "scalar", "avx2", "avx512" */

    /* out[j] = dot(a[0:k], b + j * ldb) for j < nb (1 <= nb <= 4); a typed as named. */
    void (*dot_f32)(int64_t k, const float *a, const float *b, size_t ldb, int nb, float *out);
    void (*dot_f16)(int64_t k, const uint16_t *a, const float *b, size_t ldb, int nb, float *out);
    void (*dot_bf16)(int64_t k, const uint16_t *a, const float *b, size_t ldb, int nb, float *out);
    /* nblk blocks of a against nb Q8 activation rows (see loom__q8a_row_bytes), ldb
     * bytes apart. */
    void (*dot_q8_0)(int64_t nblk, const loom_block_q8_0 *a, const void *b, size_t ldb, int nb,
                     float *out);
    void (*dot_q4_0)(int64_t nblk, const loom_block_q4_0 *a, const void *b, size_t ldb, int nb,
                     float *out);
    /* x[0:k] -> one Q8 activation row; k a multiple of 32. */
    void (*quantize_q8a)(const float *x, void *row, int64_t k);

    /* F32 GEMM micro-kernel (NULL: the portable path uses dot products only). */
    loom__gemm_tile_fn gemm_tile;
    loom__gemm_pack_fn gemm_pack_a;
    int gemm_mr, gemm_nr;
    /* int8 GEMM micro-kernel of quantised weights (NULL: they take the F32 GEMM), its
     * A-panel scatter (NULL: the portable one) and the table unpack of the 16-value types
     * (set wherever qgemm_tile is). */
    loom__qgemm_tile_fn qgemm_tile;
    loom__qgemm_scatter_fn qgemm_scatter;
    loom__qgemm_lut16_fn qgemm_lut16;
    int qgemm_qmax;  /* largest |weight integer| the kernel takes (AVX2: 64, no saturation) */
    int qgemm_min_n; /* columns from which the int8 GEMM beats the integer dots */
    int qgemm_mr, qgemm_nr;

    /* Elementwise hot paths over contiguous rows (z may alias x). */
    void (*vec_add)(int64_t n, float *z, const float *x, const float *y);
    void (*vec_mul)(int64_t n, float *z, const float *x, const float *y);
    void (*vec_scale)(int64_t n, float *y, const float *x, float s, float b);
    void (*vec_silu)(int64_t n, float *y, const float *x);
    void (*vec_swiglu)(int64_t n, float *y, const float *x, const float *g);
    /* y[i] = exp(x[i] - max); returns the sum (exp(-INF) = 0). */
    double (*vec_exp_sum)(int64_t n, float *y, const float *x, float max);
    /* y += x * s */
    void (*vec_mad_f32)(int64_t n, float *y, const float *x, float s);
    /* nblk whole blocks -> 32 * nblk floats */
    void (*dequant_q8_0)(const loom_block_q8_0 *x, float *y, int64_t nblk);
    void (*dequant_q4_0)(const loom_block_q4_0 *x, float *y, int64_t nblk);
    void (*f16_to_f32)(const uint16_t *x, float *y, int64_t n);
    void (*f32_to_f16)(const float *x, uint16_t *y, int64_t n);

    /* Flash attention over a tile of nt keys (ops-attn.c), nr query rows of D floats in q:
     * fa_kq turns z (on entry the mask, 0 without one; -INF: key unused by that row) into
     * scores: z[r*ldz+t] = dot(q_r, k_t) * scale + slope[r] * z[r*ldz+t], -INF where the
     * mask was -INF; a NaN score becomes -INF and sets nan[r]; zmax[r] = max over t.
     * fa_pv: acc[r*Dv:] += sum_t w[r*ldz+t] * v_t over the keys with z[r*ldz+t] != -INF.
     * k_t = k + t * ldk, v_t = v + t * ldv (floats). */
    void (*fa_kq)(int64_t D, const float *q, int nr, const float *k, size_t ldk, int nt,
                  float scale, const float *slope, float *z, size_t ldz, float *zmax, bool *nan);
    void (*fa_pv)(int64_t Dv, const float *w, const float *z, size_t ldz, int nr, const float *v,
                  size_t ldv, int nt, float *acc);
    /* nrows rows of n values of type t, ldx bytes apart -> y, ldy floats apart; F32, F16,
     * BF16, Q8_0 and Q4_0 (n whole blocks) only: false (nothing written) for other types. */
    bool (*rows_to_f32)(loom_type t, const void *x, size_t ldx, int nrows, int64_t n, float *y,
                        size_t ldy);
} loom__cpu_simd;

extern const loom__cpu_simd loom__cpu_simd_scalar;
extern const loom__cpu_simd loom__cpu_simd_avx2;
extern const loom__cpu_simd loom__cpu_simd_avx512;
void loom__qgemm_tile_avx512(int64_t nblk, const void *ap, const void *bp, float *c, size_t ldc,
                             int first, int has_min, int halves, int mvalid, int nvalid);
void loom__qgemm_tile_avx2(int64_t nblk, const void *ap, const void *bp, float *c, size_t ldc,
                           int first, int has_min, int halves, int mvalid, int nvalid);
void loom__qgemm_scatter_avx512(const int8_t *q, const float *d, const float *mn, int mr,
                                int halves, int64_t nblk, void *panel);
void loom__qgemm_lut16_avx2(const uint8_t *qs, size_t stride, int64_t n, const int8_t *lut,
                            int8_t *q);
/* The best table this processor runs, capped by LOOM_CPU_SIMD (re-read on every call, so
 * a test can switch paths with setenv between graph computes). */
const loom__cpu_simd *loom__cpu_simd_get(void);
bool loom__cpu_has_avx2(void);
bool loom__cpu_has_avx512(void);

/* ---------------------------------------------------------------- execution */

/* No failure yet (loom__cpu_state.fail_epoch). */
#define LOOM__CPU_NO_FAIL INT_MAX

typedef struct loom__cpu_state {
    loom_threadpool *tp; /* NULL when single-threaded */
    int nth;
    /* The barriers the first failing thread had passed when it failed (LOOM__CPU_NO_FAIL:
     * none failed yet). Every thread stops after the next barrier (loom__cpu_failed), so
     * all stop at the same one. */
    _Atomic int fail_epoch;
    loom_status status;
    char message[256];
} loom__cpu_state;

typedef struct loom__cpu_params {
    int ith, nth;
    void *wshared; /* scratch shared by all threads for this node */
    size_t wshared_size;
    void *wthread; /* this thread's private scratch */
    size_t wthread_size;
    const loom__cpu_simd *simd;
    loom__cpu_state *state;
    int *epoch; /* barriers this thread has passed in this run (loom__cpu_barrier counts) */
    /* This node's chunk counter (loom__cpu_chunks_next): set by the executor for a node
     * that runs on several threads, zero when the run starts; NULL elsewhere. */
    _Atomic int64_t *claim;
} loom__cpu_params;

/* Scratch bytes a node needs: shared by all threads, and private per thread. */
typedef struct loom__cpu_work {
    size_t shared;
    size_t per_thread;
} loom__cpu_work;

void loom__cpu_barrier(const loom__cpu_params *p);
/* Records a data error for the whole graph compute (first one wins). */
void loom__cpu_fail(const loom__cpu_params *p, loom_status s, const char *fmt, ...)
    LOOM_PRINTF(3, 4);
/* Whether this thread must stop: single-threaded, after any failure; with several
 * threads, once a barrier after the failure is passed, so every thread stops at the same
 * barrier (a thread that only saw the failure earlier would leave the others waiting). */
static inline bool loom__cpu_failed(const loom__cpu_params *p) {
    const int f = atomic_load_explicit(&p->state->fail_epoch, memory_order_acquire);
    return f != LOOM__CPU_NO_FAIL && (p->nth == 1 || f < *p->epoch);
}

/* A backend's judgement of its threads across graph runs (graph.c, Contention): when its
 * threads together hold no more than about one core (another process takes the rest),
 * graphs run on the caller's thread alone for a stretch of runs, then the threads are
 * tried again. Zero-initialised; LOOM_CPU_ADAPT=0 turns it off. */
typedef struct loom__cpu_adapt {
    int contended; /* threaded runs in a row that held under LOOM__CPU_ADAPT_MIN_CORES */
    int solo_left; /* runs left on one thread */
    int stretch;   /* the next solo stretch, in runs (doubles while the contention lasts) */
} loom__cpu_adapt;

/* Runs a graph with a caller-provided work buffer cache (*work, *work_size grow with
 * loom_malloc/loom_free); the backend keeps one per backend, loom_cpu_graph_compute one
 * per call. adapt: the backend's contention state (NULL: always all threads). */
loom_status loom__cpu_graph_compute(loom_graph *g, loom_threadpool *tp, void **work,
                                    size_t *work_size, loom__cpu_adapt *adapt);

/* ---------------------------------------------------------------- kernels */

/* Every kernel: computes its share of `dst` (ith of nth). */
typedef void (*loom__cpu_kernel_fn)(const loom__cpu_params *p, loom_tensor *dst);

void loom__cpu_op_dup(const loom__cpu_params *p, loom_tensor *dst); /* DUP, CONT, CPY */
void loom__cpu_op_get_rows(const loom__cpu_params *p, loom_tensor *dst);
void loom__cpu_op_set_rows(const loom__cpu_params *p, loom_tensor *dst);
void loom__cpu_op_concat(const loom__cpu_params *p, loom_tensor *dst);

void loom__cpu_op_binary(const loom__cpu_params *p, loom_tensor *dst); /* ADD SUB MUL DIV */
void loom__cpu_op_add_id(const loom__cpu_params *p, loom_tensor *dst);
void loom__cpu_op_unary_map(const loom__cpu_params *p, loom_tensor *dst); /* SCALE SQR ... */
void loom__cpu_op_glu(const loom__cpu_params *p, loom_tensor *dst);
void loom__cpu_op_fill(const loom__cpu_params *p, loom_tensor *dst);

void loom__cpu_op_reduce_rows(const loom__cpu_params *p, loom_tensor *dst); /* SUM_ROWS MEAN */
void loom__cpu_op_argmax(const loom__cpu_params *p, loom_tensor *dst);
void loom__cpu_op_norm(const loom__cpu_params *p, loom_tensor *dst); /* NORM, RMS_NORM */
void loom__cpu_op_soft_max(const loom__cpu_params *p, loom_tensor *dst);
void loom__cpu_op_argsort(const loom__cpu_params *p, loom_tensor *dst); /* ARGSORT, TOP_K */

void loom__cpu_op_mul_mat(const loom__cpu_params *p, loom_tensor *dst);
void loom__cpu_op_mul_mat_id(const loom__cpu_params *p, loom_tensor *dst);
loom__cpu_work loom__cpu_mul_mat_work(const loom_tensor *dst, int nth, const loom__cpu_simd *simd);
loom__cpu_work loom__cpu_mul_mat_id_work(const loom_tensor *dst, int nth,
                                         const loom__cpu_simd *simd);

/* The path MUL_MAT takes for dst on this table: "dot", "quant", "qdot", "gemm", "qgemm"
 * (the int8 GEMM), "bgemm" (the BF16 GEMM) or "bdot" (BF16 dots with bf16 activations);
 * MUL_MAT_ID: "qgemm", "gemm" or "dot" (its dot paths); for tests. */
const char *loom__cpu_mul_mat_path(const loom_tensor *dst, const loom__cpu_simd *simd);

/* The BF16 GEMM (gemm-bf16.c) of BF16 weights with AVX512_BF16: usable for dst (BF16
 * weights with contiguous rows, the AVX-512 table, the CPU has AVX512_BF16, and
 * LOOM_CPU_BGEMM is not "0"; the caller checks N and dst's layout), its scratch and
 * kernel. */
bool loom__cpu_has_avx512bf16(void);
bool loom__cpu_bgemm_usable(const loom_tensor *dst, const loom__cpu_simd *simd);
loom__cpu_work loom__cpu_bgemm_work(const loom_tensor *dst);
void loom__cpu_op_mul_mat_bgemm(const loom__cpu_params *p, loom_tensor *dst);
/* The BDOT path's pieces (gemm-bf16.c): bf16 activation rows of K elements padded to
 * loom__cpu_bdot_row_elems(K) with zeros (round to nearest even, as the GEMM's), and the
 * vdpbf16ps dot of one weight row with nb (1..4) such rows, ldb elements apart. */
size_t loom__cpu_bdot_row_elems(int64_t K);
void loom__cpu_bdot_round_row(const char *row, size_t nb0, int64_t K, uint16_t *out);
void loom__cpu_bdot(int64_t k, const uint16_t *a, const uint16_t *b, size_t ldb, int nb,
                    float *out);

void loom__cpu_op_rope(const loom__cpu_params *p, loom_tensor *dst);
void loom__cpu_op_flash_attn(const loom__cpu_params *p, loom_tensor *dst);
loom__cpu_work loom__cpu_flash_attn_work(const loom_tensor *dst);

/* ---------------------------------------------------------------- row conversion */

/* x (n values of `type` starting at element i0 of a row whose elements/blocks are nb0
 * bytes apart; quantised rows must be block-contiguous) -> y[0:n] as f32. */
void loom__cpu_row_to_f32(loom_type type, const void *row, size_t nb0, int64_t i0, int64_t n,
                          float *y);
/* x[0:n] f32 -> a row of `type` (elements nb0 bytes apart; quantised: n a multiple of 32,
 * blocks contiguous). */
void loom__cpu_row_from_f32(loom_type type, const float *x, void *row, size_t nb0, int64_t n);
void loom__cpu_quantize_row_q8_0(const float *x, loom_block_q8_0 *y, int64_t n);
void loom__cpu_quantize_row_q4_0(const float *x, loom_block_q4_0 *y, int64_t n);
void loom__cpu_dequantize_row_q8_0(const loom_block_q8_0 *x, float *y, int64_t n);
void loom__cpu_dequantize_row_q4_0(const loom_block_q4_0 *x, float *y, int64_t n);

/* ---------------------------------------------------------------- helpers */

/* A tensor's name for messages. */
static inline const char *loom__cpu_name(const loom_tensor *t) {
    return t->name[0] ? t->name : "(unnamed)";
}

static inline void loom__range(int64_t n, int ith, int nth, int64_t *i0, int64_t *i1) {
    int64_t per = (n + nth - 1) / nth;
    int64_t a = per * ith;
    int64_t b = a + per;
    *i0 = a < n ? a : n;
    *i1 = b < n ? b : n;
}

/* Work that threads claim in chunks as they go (loom__cpu_chunks_next), rather than each
 * taking a fixed share: a thread that loses its core (another process on a busy machine)
 * holds the others up at the next barrier by at most the chunk it is in, and the one that
 * kept its core does the rest. With a counter (p->claim) each chunk is a relaxed
 * fetch-add; without one (one thread, a serial step, a kernel called outside the
 * executor) each thread takes its static share (loom__range) once. A node claims from
 * one such loop only (one counter per node and run). */
#define LOOM__CPU_CHUNKS_PER_THREAD 4

typedef struct loom__cpu_chunks {
    int64_t n, size;
    int64_t cur, end; /* loom__cpu_chunks_item: the chunk being walked */
    bool done;        /* static share: taken */
} loom__cpu_chunks;

/* n items in chunks of at least min_size (about LOOM__CPU_CHUNKS_PER_THREAD per thread). */
static inline loom__cpu_chunks loom__cpu_chunks_of(const loom__cpu_params *p, int64_t n,
                                                   int64_t min_size) {
    const int64_t want = (int64_t)p->nth * LOOM__CPU_CHUNKS_PER_THREAD;
    int64_t size = (n + want - 1) / want;
    if (size < min_size) size = min_size;
    if (size < 1) size = 1;
    return (loom__cpu_chunks){.n = n, .size = size};
}

/* The next chunk [i0, i1) for this thread; false when none is left. */
static inline bool loom__cpu_chunks_next(const loom__cpu_params *p, loom__cpu_chunks *c,
                                         int64_t *i0, int64_t *i1) {
    if (!p->claim || p->nth == 1) {
        if (c->done) return false;
        c->done = true;
        loom__range(c->n, p->ith, p->nth, i0, i1);
        return *i0 < *i1;
    }
    const int64_t i = atomic_fetch_add_explicit(p->claim, c->size, memory_order_relaxed);
    if (i >= c->n) return false;
    *i0 = i;
    *i1 = i + c->size < c->n ? i + c->size : c->n;
    return true;
}

/* The next item for this thread, chunk after chunk: for (int64_t i; loom__cpu_chunks_item(..., &i);) */
static inline bool loom__cpu_chunks_item(const loom__cpu_params *p, loom__cpu_chunks *c,
                                         int64_t *i) {
    if (c->cur >= c->end && !loom__cpu_chunks_next(p, c, &c->cur, &c->end)) return false;
    *i = c->cur++;
    return true;
}

/* The GEMM paths' work units (F32, int8 and BF16 GEMM): (batch, row block, chunk of B
 * panels). Row blocks of mc_max rows halve (not below mr) and the panels split into chunks
 * until every thread has about two units (small M, few batches). */
typedef struct loom__cpu_gemm_units {
    int64_t mc, mblocks, nchunks, chunk, npan, count;
} loom__cpu_gemm_units;

/* One unit: batch, rows [mc0, mc0 + mlen), panels [pn0, pn1) (empty when pn0 >= pn1). */
typedef struct loom__cpu_gemm_unit {
    int64_t batch, mc0, mlen, pn0, pn1;
} loom__cpu_gemm_unit;

static inline loom__cpu_gemm_units loom__cpu_gemm_units_of(int64_t batches, int64_t M, int64_t npan,
                                                           int64_t mc_max, int mr, int nth) {
    loom__cpu_gemm_units g = {.mc = mc_max, .nchunks = 1, .npan = npan};
    while (g.mc > mr && batches * ((M + g.mc - 1) / g.mc) < 2 * nth)
        g.mc /= 2;
    g.mblocks = (M + g.mc - 1) / g.mc;
    if (batches * g.mblocks < 2 * nth)
        g.nchunks = (2 * nth + batches * g.mblocks - 1) / (batches * g.mblocks);
    if (g.nchunks > npan) g.nchunks = npan;
    g.chunk = (npan + g.nchunks - 1) / g.nchunks;
    g.count = batches * g.mblocks * g.nchunks;
    return g;
}

static inline loom__cpu_gemm_unit loom__cpu_gemm_unit_at(const loom__cpu_gemm_units *g, int64_t u,
                                                         int64_t M) {
    const int64_t nc = u % g->nchunks, mb = (u / g->nchunks) % g->mblocks;
    loom__cpu_gemm_unit w = {.batch = u / (g->nchunks * g->mblocks), .mc0 = mb * g->mc};
    w.mlen = M - w.mc0 < g->mc ? M - w.mc0 : g->mc;
    w.pn0 = nc * g->chunk;
    w.pn1 = w.pn0 + g->chunk < g->npan ? w.pn0 + g->chunk : g->npan;
    return w;
}

/* Address of element (i0, i1, i2, i3) (for blocks, i0 counts blocks). */
static inline void *loom__at(const loom_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (char *)t->data + i0 * (int64_t)t->nb[0] + i1 * (int64_t)t->nb[1] +
           i2 * (int64_t)t->nb[2] + i3 * (int64_t)t->nb[3];
}

static inline float loom__f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t loom__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* True when one of the n floats is NaN or infinite (as core-impl.h's): the CPU's activation
 * quantisers give such a block a NaN scale and zero quants, so every dot reading it is NaN. */
static inline bool loom__any_nonfinite(const float *x, int64_t n) {
    float z = 0.0f;
    for (int64_t i = 0; i < n; i++)
        z += x[i] * 0.0f;
    return z != z;
}

/* IEEE half -> float, exact (denormals, infinities and NaNs included). */
static inline float loom__fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return loom__f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* zero or denormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return loom__f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

/* float -> IEEE half, round to nearest even (as F16C's vcvtps2ph with rounding mode 0). */
static inline uint16_t loom__fp32_to_fp16(float f) {
    uint32_t x = loom__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or NaN (NaN stays quiet NaN) */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {
        /* result denormal or zero: value = ax_float; half denormal unit 2^-24 */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (113 - e) - 1 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

static inline float loom__bf16_to_fp32(uint16_t h) {
    return loom__f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t loom__fp32_to_bf16(float f) {
    uint32_t x = loom__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif /* LOOM_CPU_IMPL_H */
