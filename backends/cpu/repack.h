/*
 * Repacked matmul weights: IQ4_NL, Q4_K and Q4_0 weights of a mapped model file, rows
 * interleaved in groups of LOOM__RP_ROWS so one pass of the AVX-512 dot computes that many
 * output rows against one activation row (its loads, sums and reductions shared).
 *
 * Which weights: a MUL_MAT's src0 of those types, 2-D, contiguous, not a view, with at
 * least LOOM__RP_ROWS rows, in a CPU buffer over caller memory (loom_cpu_buffer_from_ptr:
 * the model's mapping of its file) marked LOOM_BUFFER_USAGE_WEIGHTS, when the AVX-512
 * table runs and LOOM_CPU_REPACK is not "0". The copy is made once, the first time a graph
 * using the weight is computed (single-threaded, before the run), and the original's pages
 * are then advised out (MADV_PAGEOUT: a file page is dropped and read back if touched; an
 * anonymous one keeps its content), so the memory figure stays that of the file.
 *
 * The original stays valid and every other reader uses it: GET_ROWS of a tied embedding,
 * the DOT/GEMM paths, another SIMD table (LOOM_CPU_SIMD), views. Only the QDOT (QUANT for
 * Q4_0) dots and the int8 GEMM's A packer read the copy (loom__cpu_repack_of). A write into the buffer
 * (set/memset/copy/clear) drops the copies it overlaps; freeing the buffer frees them.
 *
 * Layout of the copy: rows [0, 4G) in G groups of 4, group g at byte g * group_bytes, its
 * k-block b at + b * gblk bytes, then the last rows % 4 rows in the original layout:
 *   IQ4_NL, Q4_0 (gblk 72, as the original): the 4 rows' fp16 d (8 bytes), then their 16
 *     nibble bytes each (64 bytes: one zmm, 128-bit lane l = row l);
 *   Q4_K (gblk 592, the original 576 + 2.8%): fp16 d[4], dmin[4] (16 bytes), the 6-bit
 *     scales and mins unpacked to bytes sc[8][4], mn[8][4] (sub-block, row: 64 bytes), then
 *     per 64-element chunk c and half h the 4 rows' nibble bytes qs[32 c + 16 h ..] (16
 *     each, 8 x 64 bytes): sub-block 2c in the low nibbles, 2c + 1 in the high ones.
 */
#ifndef LOOM_CPU_REPACK_H
#define LOOM_CPU_REPACK_H

#include "backends/cpu/cpu-impl.h"

enum { LOOM__RP_ROWS = 4, LOOM__RP_Q4K_GBLK = 592 };

typedef struct loom__cpu_repack {
    const void *orig;  /* the weight's data */
    loom_buffer_t buffer;
    loom_type type;
    int64_t K, rows, groups; /* groups = rows / LOOM__RP_ROWS */
    size_t row_bytes, blk_bytes, group_bytes;
    char *data; /* rows * row_bytes, 64-byte aligned */
    struct loom__cpu_repack *next;
} loom__cpu_repack;

/* Before a run: every MUL_MAT whose weight can be repacked gets its copy (made now if
 * missing); a stale or foreign src0->extra of those types is cleared. A copy that cannot be
 * allocated is skipped (the original is used). */
void loom__cpu_repack_graph(const loom_graph *g, const loom__cpu_simd *simd);

/* The copy of a's data the dots may read in this run (set by loom__cpu_repack_graph), or
 * NULL. */
const loom__cpu_repack *loom__cpu_repack_of(const loom_tensor *a, const loom__cpu_simd *simd);

/* rows x K weights of a repackable type at src, in the layout above, into dst
 * (loom__cpu_repack_bytes). */
void loom__cpu_repack_rows(loom_type type, int64_t K, int64_t rows, const void *src, void *dst);

/* Row r's type blocks [b0, b0 + nb) in the original layout, into out. */
void loom__cpu_repack_read(const loom__cpu_repack *rp, int64_t r, int64_t b0, int64_t nb,
                           void *out);

/* Bytes of a group's k-block, and of the copy of rows x K weights of type t. */
size_t loom__cpu_repack_gblk_bytes(loom_type t);
size_t loom__cpu_repack_bytes(loom_type t, int64_t K, int64_t rows);

/* Group g (rows 4g .. 4g + 3) of the copy. */
static inline const char *loom__cpu_repack_group(const loom__cpu_repack *rp, int64_t g) {
    return rp->data + (size_t)g * rp->group_bytes;
}

/* Tail row r (r >= 4 groups) of the copy, in the original layout. */
static inline const char *loom__cpu_repack_row(const loom__cpu_repack *rp, int64_t r) {
    return rp->data + (size_t)rp->groups * rp->group_bytes +
           (size_t)(r - rp->groups * LOOM__RP_ROWS) * rp->row_bytes;
}

/* Buffer hooks (cpu-backend.c, caller-memory buffers): drop the copies of `buf` whose
 * original overlaps [p, p + n) (n == SIZE_MAX: all of them). */
void loom__cpu_repack_drop(loom_buffer_t buf, const void *p, size_t n);

/* buf is a CPU buffer over caller memory (cpu-backend.c). */
bool loom__cpu_buffer_is_caller(loom_buffer_t buf);

/* Copies held now, and their bytes (tests, logs). */
size_t loom__cpu_repack_count(size_t *bytes);

/* Out of the copy of a repackable weight: 4 dot products of the group's rows with one
 * activation row (the type's vec_dot_type; for Q4_0 a Q8 activation row of cpu-impl.h);
 * NULL if the table has none for the type. */
typedef void (*loom__cpu_qdot4_fn)(int64_t K, const void *group, const void *y, float *out);
loom__cpu_qdot4_fn loom__cpu_qdot4_get(loom_type t, const loom__cpu_simd *simd);
void loom__cpu_qdot4_avx512(loom__cpu_qdot4_fn *iq4_nl, loom__cpu_qdot4_fn *q4_K,
                            loom__cpu_qdot4_fn *q4_0);

#endif /* LOOM_CPU_REPACK_H */
