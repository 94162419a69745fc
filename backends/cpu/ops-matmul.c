/*
 * MUL_MAT and MUL_MAT_ID: dst[m, n] = sum_k a[k, m] * b[k, n] (a: weights of any matmul
 * type, b: f32 activations), with batch broadcasting of a over b.
 *
 * Six paths, chosen from the shapes alone (so scratch sizing and the kernel agree):
 *   QGEMM quantised weights, N >= the table's qgemm_min_n (and >= MM_QGEMM_MIN_N_Q8 for
 *         Q8_0/Q4_0), a SIMD table with an int8 kernel for the type: b is
 *         quantised once to Q8 blocks and packed into u8 panels (shared), each thread
 *         unpacks MC x KC blocks of a into canonical int8 panels and runs the int8
 *         micro-kernel (qgemm.h), in the GEMM's loop order and work units.
 *   GEMM  N >= MM_GEMM_MIN_N (MM_QGEMM_MIN_N for quantised weights) on a SIMD table with
 *         a micro-kernel: b is packed once into NR-wide panels ([k][NR], shared), each
 *         thread packs MC x KC blocks of a into MR-wide panels ([k][MR], converted or
 *         dequantised to f32) and runs the register-tiled micro-kernel over them (BLIS
 *         loop order: KC, then B panels kept in L1, then A panels from L2).
 *   QUANT Q8_0/Q4_0 weights, smaller N: b is quantised to Q8 activations once (shared),
 *         then integer dot products, each weight row against up to 4 activation rows.
 *   QDOT  the other block types, smaller N: b quantised to the type's vec_dot_type rows,
 *         then the type's integer dot (quants-dot.h).
 *   BGEMM BF16 weights where GEMM would run, on the AVX-512 table of a CPU with
 *         AVX512_BF16: b rounded to bf16 once, vdpbf16ps micro-kernel (gemm-bf16.c).
 *   BDOT  BF16 weights with fewer columns, on the same tables: b rounded to bf16 once
 *         (shared), then vdpbf16ps dots, each weight row against up to 4 rows of b.
 *   DOT   everything else (one-token matmuls, small N, the portable table): float dot
 *         products, each weight row against up to 4 rows of b.
 * DOT and QUANT split (batch, weight row) pairs across threads, so a one-row matmul is
 * split by output columns; b is walked in blocks that fit L2 so every weight row is read
 * from memory once per block.
 */
#include <stdlib.h>

#include "backends/cpu/qgemm.h"
#include "backends/cpu/quants-dot.h"
#include "backends/cpu/repack.h"

enum {
    MM_GEMM_MIN_N = 8,      /* columns (rows of b) from which the tiled GEMM pays */
    MM_QGEMM_MIN_N = 32,    /* the same for quantised weights (dequantised while packing) */
    MM_QGEMM_MIN_N_Q8 = 24, /* the int8 GEMM of Q8_0/Q4_0 (else their QUANT dots) */
    MM_KC = 256,            /* k block of the GEMM (a multiple of the quant block) */
    MM_MC = 256,            /* rows of a per GEMM unit (a multiple of every MR) */
    MM_NBLK_BYTES = 256 * 1024,
};

typedef enum mm_path { MM_DOT, MM_QUANT, MM_QDOT, MM_GEMM, MM_QGEMM, MM_BGEMM, MM_BDOT } mm_path;

static size_t align64_size(size_t n) {
    return (n + 63) & ~(size_t)63;
}

/* Q8_0/Q4_0: the Q8 activation layout of cpu-impl.h and the SIMD table's dots */
static bool is_quant(loom_type t) {
    return t == LOOM_TYPE_Q8_0 || t == LOOM_TYPE_Q4_0;
}

/* every other block type: activations in the type's vec_dot_type blocks (quants-dot.h) */
static bool is_qdot(loom_type t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    return tr && tr->is_quantized && !is_quant(t);
}

/* Bytes of one activation row of K elements in a's vec_dot_type. */
static size_t qdot_row_bytes(loom_type t, int64_t K) {
    return align64_size(loom_row_size(loom_type_traits_get((int)t)->vec_dot_type, K));
}

/* LOOM_CPU_QGEMM=0 sends quantised weights to the F32 GEMM instead of the int8 one (to
 * compare the two); read on every call, like LOOM_CPU_SIMD. */
static bool qgemm_enabled(void) {
    const char *e = getenv("LOOM_CPU_QGEMM");
    return !(e && e[0] == '0');
}

static mm_path choose_path(const loom_tensor *dst, const loom__cpu_simd *simd) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const bool q = is_quant(a->type) || is_qdot(a->type);
    const int64_t min_n = q ? MM_QGEMM_MIN_N : MM_GEMM_MIN_N;
    const bool dst_ok = dst->nb[0] == sizeof(float) && dst->nb[1] % sizeof(float) == 0;
    const loom__qg_type *qt = q ? loom__qg_type_get(a->type) : NULL;
    if (qt && simd->qgemm_tile && qt->qmax <= simd->qgemm_qmax && dst_ok &&
        a->nb[0] == loom_type_size(a->type) && qgemm_enabled()) {
        /* the int8 GEMM beats the QUANT dots (Q8_0/Q4_0) from MM_QGEMM_MIN_N_Q8 columns,
         * the slower QDOT ones from the table's own threshold (matmul_bench --tokens) */
        const int64_t qmin = is_quant(a->type) && simd->qgemm_min_n < MM_QGEMM_MIN_N_Q8
                                 ? MM_QGEMM_MIN_N_Q8
                                 : simd->qgemm_min_n;
        if (b->ne[1] >= qmin) return MM_QGEMM;
    }
    if (simd->gemm_tile && b->ne[1] >= min_n && dst_ok)
        return loom__cpu_bgemm_usable(dst, simd) ? MM_BGEMM : MM_GEMM;
    if (loom__cpu_bgemm_usable(dst, simd)) return MM_BDOT;
    return is_quant(a->type) ? MM_QUANT : is_qdot(a->type) ? MM_QDOT : MM_DOT;
}

/* b rows are usable in place by the dot kernels (contiguous along k, float-aligned rows). */
static bool b_in_place(const loom_tensor *b) {
    return b->nb[0] == sizeof(float) && b->nb[1] % sizeof(float) == 0;
}

/* a rows are readable in place by the typed dot kernels. */
static bool a_in_place(const loom_tensor *a) {
    return a->nb[0] == loom_type_size(a->type);
}

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

/* Rows of b per block, so a block stays in L2 (a multiple of 4, at least 4). */
static int64_t nblk_rows(size_t row_bytes, int64_t n) {
    int64_t r = (int64_t)(MM_NBLK_BYTES / (row_bytes ? row_bytes : 1));
    r = r < 4 ? 4 : r & ~(int64_t)3;
    return r < n ? r : n;
}

/* ---------------------------------------------------------------- dot products */

/* What the dot loop reads: typed weight rows and b rows (f32 or Q8 activations) at a
 * constant stride `ldb` between consecutive columns (floats for f32 rows, bytes for Q8
 * activation rows). */
typedef struct mm_dot_args {
    const loom_tensor *a;
    loom_type atype;
    int64_t K;
    size_t ldb;
    size_t b_row_bytes;
    const loom__cpu_simd *simd;
    float *a_tmp;           /* K floats when a rows must be converted first, else NULL */
    loom__cpu_qdot_fn qdot; /* the dot of a's block type against its vec_dot_type rows */
    bool bf16_b;            /* BDOT: b rows are bf16 (ldb in elements) */
} mm_dot_args;

/* out[j] = a_row . b_rows[j] for j < nb. */
static void dot_rows(const mm_dot_args *x, const void *arow, const void *brows, int nb,
                     float *out) {
    const loom__cpu_simd *s = x->simd;
    if (x->a_tmp) {
        loom__cpu_row_to_f32(x->a->type, arow, x->a->nb[0], 0, x->K, x->a_tmp);
        s->dot_f32(x->K, x->a_tmp, brows, x->ldb, nb, out);
        return;
    }
    switch (x->atype) {
    case LOOM_TYPE_F32:
        s->dot_f32(x->K, arow, brows, x->ldb, nb, out);
        break;
    case LOOM_TYPE_F16:
        s->dot_f16(x->K, arow, brows, x->ldb, nb, out);
        break;
    case LOOM_TYPE_BF16:
        if (x->bf16_b)
            loom__cpu_bdot(x->K, arow, brows, x->ldb, nb, out);
        else
            s->dot_bf16(x->K, arow, brows, x->ldb, nb, out);
        break;
    case LOOM_TYPE_Q8_0:
        s->dot_q8_0(x->K / LOOM_QK8_0, arow, brows, x->ldb, nb, out);
        break;
    case LOOM_TYPE_Q4_0:
        s->dot_q4_0(x->K / LOOM_QK4_0, arow, brows, x->ldb, nb, out);
        break;
    default:
        LOOM_ASSERT(x->qdot != NULL);
        for (int j = 0; j < nb; j++)
            out[j] = x->qdot(x->K, arow, (const char *)brows + (size_t)j * x->ldb);
    }
}

/* ---------------------------------------------------------------- mul_mat */

typedef struct mm_shape {
    int64_t K, M, N, B2, B3, r2, r3;
} mm_shape;

static mm_shape shape_of(const loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    mm_shape s = {
        .K = a->ne[0],
        .M = a->ne[1],
        .N = b->ne[1],
        .B2 = b->ne[2],
        .B3 = b->ne[3],
        .r2 = b->ne[2] / a->ne[2],
        .r3 = b->ne[3] / a->ne[3],
    };
    return s;
}

/* Per-thread scratch of the int8 GEMM: A panels of one MM_MC x MM_KC block, the unpack
 * buffer of one row's k-block, one Q8 activation row and one f32 row of b. */
typedef struct qg_thread_layout {
    size_t off_tmp, off_q8, off_f32, off_stage, total;
} qg_thread_layout;

/* Bytes of MR rows of one MM_KC k-block in a's own layout: where the A packer reads the
 * rows of a repacked weight (repack.h) once they are put back in file order. */
static size_t qg_stage_bytes(const loom__cpu_simd *simd, loom_type t) {
    return (size_t)simd->qgemm_mr * loom_row_size(t, MM_KC);
}

static qg_thread_layout qg_thread_layout_of(const loom__cpu_simd *simd, int64_t K, loom_type t) {
    const int mr = simd->qgemm_mr;
    const size_t ablk = loom__qg_ablk_bytes(mr, 2); /* the larger, two-halves block */
    qg_thread_layout l;
    l.off_tmp = align64_size((size_t)ceil_div(MM_MC, mr) * (MM_KC / LOOM_QG_BLK) * ablk);
    l.off_q8 = l.off_tmp + align64_size(loom__qg_tmp_bytes(mr, MM_KC / LOOM_QG_BLK));
    l.off_f32 = l.off_q8 + align64_size(loom__q8a_row_bytes(K / LOOM_QG_BLK));
    l.off_stage = l.off_f32 + align64_size((size_t)K * sizeof(float));
    l.total = l.off_stage + align64_size(qg_stage_bytes(simd, t));
    return l;
}

/* QUANT, QDOT and BDOT with at most this many rows of b (a token's matmul): every thread
 * converts all of b into its own scratch instead of its share into the shared one, so the
 * node needs no barrier between the conversion and the dots, and uses no shared scratch
 * (graph.c can then run it in one phase with independent nodes, e.g. Q, K and V). */
#define MM_LOCAL_B_ROWS 4

static bool b_local(const mm_shape *s) {
    return s->N * s->B2 * s->B3 <= MM_LOCAL_B_ROWS;
}

/* Where a thread's converted rows of b start in its scratch, after K floats of staging. */
static size_t b_local_off(const mm_shape *s) {
    return align64_size((size_t)s->K * sizeof(float));
}

loom__cpu_work loom__cpu_mul_mat_work(const loom_tensor *dst, int nth, const loom__cpu_simd *simd) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    mm_shape s = shape_of(dst);
    loom__cpu_work w = {0, 0};
    const size_t brows = (size_t)(s.N * s.B2 * s.B3);
    (void)nth;
    switch (choose_path(dst, simd)) {
    case MM_QUANT:
    case MM_QDOT: {
        const size_t rb = is_quant(a->type) ? loom__q8a_row_bytes(s.K / LOOM_QK8_0)
                                            : qdot_row_bytes(a->type, s.K);
        if (b_local(&s)) {
            w.per_thread = b_local_off(&s) + brows * rb;
        } else {
            w.shared = brows * rb;
            w.per_thread = (size_t)s.K * sizeof(float);
        }
        break;
    }
    case MM_DOT:
        if (!b_in_place(b)) w.shared = brows * (size_t)s.K * sizeof(float);
        if (!a_in_place(a)) w.per_thread = (size_t)s.K * sizeof(float);
        break;
    case MM_GEMM: {
        const int64_t npan = ceil_div(s.N, simd->gemm_nr);
        w.shared =
            (size_t)(npan * s.B2 * s.B3) * (size_t)s.K * (size_t)simd->gemm_nr * sizeof(float);
        w.per_thread = align64((size_t)MM_MC * MM_KC * sizeof(float)) +
                       (size_t)simd->gemm_mr * MM_KC * sizeof(float) + 64;
        break;
    }
    case MM_BGEMM:
        w = loom__cpu_bgemm_work(dst);
        break;
    case MM_BDOT:
        if (b_local(&s))
            w.per_thread = brows * loom__cpu_bdot_row_elems(s.K) * sizeof(uint16_t);
        else
            w.shared = brows * loom__cpu_bdot_row_elems(s.K) * sizeof(uint16_t);
        break;
    case MM_QGEMM: {
        const int64_t npan = ceil_div(s.N, simd->qgemm_nr);
        w.shared = (size_t)(npan * s.B2 * s.B3) * (size_t)(s.K / LOOM_QG_BLK) *
                   loom__qg_bblk_bytes(simd->qgemm_nr);
        w.per_thread = qg_thread_layout_of(simd, s.K, a->type).total;
        break;
    }
    }
    return w;
}

static float *dst_at(const loom_tensor *dst, int64_t m, int64_t n, int64_t i2, int64_t i3) {
    return loom__at(dst, m, n, i2, i3);
}

/* DOT / QUANT: (batch, m) pairs split across threads; b walked in L2-sized blocks. */
static void mm_dot_loop(const loom__cpu_params *p, loom_tensor *dst, const mm_shape *s,
                        const mm_dot_args *x, const char *bbase, size_t bstride_n, size_t bstride2,
                        size_t bstride3) {
    const loom_tensor *a = dst->src[0];
    const int64_t items = s->B2 * s->B3 * s->M;
    const int64_t nblk = nblk_rows(x->b_row_bytes, s->N);
    /* b in one block (a token's matmul): the items in claimed chunks, n0 staying 0 while
     * each pass takes the next; else each thread its share of every block */
    const bool one_block = nblk >= s->N;
    loom__cpu_chunks ch = loom__cpu_chunks_of(p, items, 16);
    int64_t t0 = 0, t1 = 0;
    if (!one_block) loom__range(items, p->ith, p->nth, &t0, &t1);
    float out[4];
    for (int64_t n0 = 0; n0 < s->N; n0 += one_block ? 0 : nblk) {
        if (one_block && !loom__cpu_chunks_next(p, &ch, &t0, &t1)) break;
        const int64_t n1 = n0 + nblk < s->N ? n0 + nblk : s->N;
        /* (batch, m) walked incrementally: the divisions only when the batch changes */
        int64_t m = t0 % s->M, batch = t0 / s->M;
        const char *a0 = NULL, *bb = NULL;
        char *d0 = NULL;
        for (int64_t it = t0; it < t1; it++, m++) {
            if (m == s->M) m = 0, batch++;
            if (it == t0 || m == 0) {
                const int64_t i2 = batch % s->B2, i3 = batch / s->B2;
                a0 = loom__at(a, 0, 0, i2 / s->r2, i3 / s->r3);
                bb = bbase + i2 * (int64_t)bstride2 + i3 * (int64_t)bstride3;
                d0 = (char *)dst_at(dst, 0, 0, i2, i3);
            }
            const void *arow = a0 + m * (int64_t)a->nb[1];
            float *dm = (float *)(d0 + m * (int64_t)dst->nb[0]);
            for (int64_t n = n0; n < n1; n += 4) {
                int nb = n1 - n < 4 ? (int)(n1 - n) : 4;
                dot_rows(x, arow, bb + n * bstride_n, nb, out);
                for (int j = 0; j < nb; j++)
                    *(float *)((char *)dm + (n + j) * (int64_t)dst->nb[1]) = out[j];
            }
        }
    }
}

/* Row r of b, flat over (n, i2, i3). */
static const void *b_row_at(const loom_tensor *b, int64_t r) {
    const int64_t N = b->ne[1], B2 = b->ne[2];
    return loom__at(b, 0, r % N, (r / N) % B2, r / (N * B2));
}

/* Rows [r0, r1) of b (flat over n, i2, i3) -> contiguous f32 rows of K in out. */
static void pack_b_rows(const loom_tensor *b, int64_t r0, int64_t r1, float *out) {
    const int64_t K = b->ne[0];
    for (int64_t r = r0; r < r1; r++)
        loom__cpu_row_to_f32(LOOM_TYPE_F32, b_row_at(b, r), b->nb[0], 0, K, out + r * K);
}

static void mm_path_dot(const loom__cpu_params *p, loom_tensor *dst, const mm_shape *s) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    mm_dot_args x = {
        .a = a,
        .atype = a->type,
        .K = s->K,
        .simd = p->simd,
        .a_tmp = a_in_place(a) ? NULL : p->wthread,
        .b_row_bytes = (size_t)s->K * sizeof(float),
    };
    if (b_in_place(b)) {
        x.ldb = b->nb[1] / sizeof(float);
        mm_dot_loop(p, dst, s, &x, b->data, b->nb[1], b->nb[2], b->nb[3]);
        return;
    }
    float *packed = p->wshared;
    int64_t r0, r1;
    loom__range(s->N * s->B2 * s->B3, p->ith, p->nth, &r0, &r1);
    pack_b_rows(b, r0, r1, packed);
    loom__cpu_barrier(p);
    x.ldb = (size_t)s->K;
    const size_t rb = (size_t)s->K * sizeof(float);
    mm_dot_loop(p, dst, s, &x, (const char *)packed, rb, rb * (size_t)s->N,
                rb * (size_t)(s->N * s->B2));
}

/* The rows of b (flat over n, i2, i3) this thread converts: all of them when local, else
 * its share. */
static void b_rows_of(const loom__cpu_params *p, const mm_shape *s, bool local, int64_t *r0,
                      int64_t *r1) {
    if (local) {
        *r0 = 0;
        *r1 = s->N * s->B2 * s->B3;
    } else {
        loom__range(s->N * s->B2 * s->B3, p->ith, p->nth, r0, r1);
    }
}

/* BF16 weights, few columns: b rounded to bf16 rows once (shared), then vdpbf16ps dots. */
static void mm_path_bdot(const loom__cpu_params *p, loom_tensor *dst, const mm_shape *s) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const size_t re = loom__cpu_bdot_row_elems(s->K), rb = re * sizeof(uint16_t);
    const bool local = b_local(s);
    uint16_t *bb = local ? p->wthread : p->wshared;
    int64_t r0, r1;
    b_rows_of(p, s, local, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        loom__cpu_bdot_round_row(b_row_at(b, r), b->nb[0], s->K, bb + r * (int64_t)re);
    if (!local) loom__cpu_barrier(p);
    mm_dot_args x = {
        .a = a,
        .atype = a->type,
        .K = s->K,
        .ldb = re,
        .b_row_bytes = rb,
        .simd = p->simd,
        .bf16_b = true,
    };
    mm_dot_loop(p, dst, s, &x, (const char *)bb, rb, rb * (size_t)s->N,
                rb * (size_t)(s->N * s->B2));
}

/* Quantises rows [r0, r1) of b (flat over n, i2, i3) with quant into rows of rb bytes at
 * out (a strided row is made contiguous in this thread's scratch first). */
static void quantize_b_rows(const loom__cpu_params *p, const loom_tensor *b, int64_t r0, int64_t r1,
                            loom__cpu_qact_fn quant, size_t rb, char *out) {
    const int64_t K = b->ne[0];
    float *tmp = p->wthread;
    for (int64_t r = r0; r < r1; r++) {
        const float *row = b_row_at(b, r);
        if (b->nb[0] != sizeof(float)) {
            loom__cpu_row_to_f32(LOOM_TYPE_F32, row, b->nb[0], 0, K, tmp);
            row = tmp;
        }
        quant(row, out + r * (int64_t)rb, K);
    }
}

/* b quantised for the dots: rows of rb bytes, either all of them in this thread's scratch
 * (b_local: no barrier) or this thread's share in the shared scratch, then a barrier. */
static const char *quantize_b(const loom__cpu_params *p, const loom_tensor *b, const mm_shape *s,
                              loom__cpu_qact_fn quant, size_t rb) {
    const bool local = b_local(s);
    char *qb = local ? (char *)p->wthread + b_local_off(s) : p->wshared;
    int64_t r0, r1;
    b_rows_of(p, s, local, &r0, &r1);
    quantize_b_rows(p, b, r0, r1, quant, rb, qb);
    if (!local) loom__cpu_barrier(p);
    return qb;
}

/* QDOT (QUANT for Q4_0) over a repacked weight (repack.h), one batch: units are the groups of 4 rows, then
 * the tail rows, split across threads; each group's 4 rows against every activation row
 * (the group stays in L1 across them). */
static void mm_qdot_repacked(const loom__cpu_params *p, loom_tensor *dst, const mm_shape *s,
                             const loom__cpu_repack *rp, const char *qb, size_t rb) {
    const loom__cpu_qdot4_fn dot4 = loom__cpu_qdot4_get(rp->type, p->simd);
    const loom__cpu_qdot_fn dot1 = loom__cpu_qdot_get(rp->type, p->simd);
    const int64_t G = rp->groups, units = G + (s->M - G * LOOM__RP_ROWS);
    loom__cpu_chunks ch = loom__cpu_chunks_of(p, units, 4);
    float out[LOOM__RP_ROWS];
    for (int64_t u; loom__cpu_chunks_item(p, &ch, &u);) {
        if (u < G) {
            const char *grp = loom__cpu_repack_group(rp, u);
            for (int64_t n = 0; n < s->N; n++) {
                dot4(s->K, grp, qb + (size_t)n * rb, out);
                for (int l = 0; l < LOOM__RP_ROWS; l++)
                    *dst_at(dst, u * LOOM__RP_ROWS + l, n, 0, 0) = out[l];
            }
        } else {
            const int64_t m = G * LOOM__RP_ROWS + (u - G);
            const char *row = loom__cpu_repack_row(rp, m);
            for (int64_t n = 0; n < s->N; n++) {
                float o;
                if (rp->type == LOOM_TYPE_Q4_0)
                    p->simd->dot_q4_0(s->K / LOOM_QK4_0, (const loom_block_q4_0 *)row,
                                      qb + (size_t)n * rb, 0, 1, &o);
                else
                    o = dot1(s->K, row, qb + (size_t)n * rb);
                *dst_at(dst, m, n, 0, 0) = o;
            }
        }
    }
}

static void mm_path_quant(const loom__cpu_params *p, loom_tensor *dst, const mm_shape *s) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t nblk = s->K / LOOM_QK8_0;
    const char *qb = quantize_b(p, b, s, p->simd->quantize_q8a, loom__q8a_row_bytes(nblk));
    mm_dot_args x = {
        .a = a,
        .atype = a->type,
        .K = s->K,
        .ldb = loom__q8a_row_bytes(nblk),
        .b_row_bytes = loom__q8a_row_bytes(nblk),
        .simd = p->simd,
    };
    const size_t rb = loom__q8a_row_bytes(nblk);
    const loom__cpu_repack *rp = loom__cpu_repack_of(a, p->simd);
    if (rp && s->B2 * s->B3 == 1) {
        mm_qdot_repacked(p, dst, s, rp, qb, rb);
        return;
    }
    mm_dot_loop(p, dst, s, &x, (const char *)qb, rb, rb * (size_t)s->N,
                rb * (size_t)(s->N * s->B2));
}

/* Other block types: b quantised once to a's vec_dot_type rows (shared), then the type's
 * integer dots. */
static void mm_path_qdot(const loom__cpu_params *p, loom_tensor *dst, const mm_shape *s) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const loom__cpu_qact_fn quant =
        loom__cpu_qact_get(loom_type_traits_get((int)a->type)->vec_dot_type, p->simd);
    const size_t rb = qdot_row_bytes(a->type, s->K);
    const char *qb = quantize_b(p, b, s, quant, rb);
    const loom__cpu_repack *rp = loom__cpu_repack_of(a, p->simd);
    if (rp && s->B2 * s->B3 == 1) {
        mm_qdot_repacked(p, dst, s, rp, qb, rb);
        return;
    }
    mm_dot_args x = {
        .a = a,
        .atype = a->type,
        .K = s->K,
        .ldb = rb,
        .b_row_bytes = rb,
        .simd = p->simd,
        .qdot = loom__cpu_qdot_get(a->type, p->simd),
    };
    mm_dot_loop(p, dst, s, &x, (const char *)qb, rb, rb * (size_t)s->N,
                rb * (size_t)(s->N * s->B2));
}

/* ---------------------------------------------------------------- GEMM */

/* Panels [p0, p1) of b (flat over batch, panel) -> [k][NR] f32, zero past N. */
static void gemm_pack_b(const loom_tensor *b, const mm_shape *s, int nr, int64_t p0, int64_t p1,
                        float *bp) {
    const int64_t npan = ceil_div(s->N, nr);
    for (int64_t pi = p0; pi < p1; pi++) {
        const int64_t batch = pi / npan, pn = pi % npan;
        const int64_t i2 = batch % s->B2, i3 = batch / s->B2;
        float *dstp = bp + pi * s->K * nr;
        for (int j = 0; j < nr; j++) {
            const int64_t n = pn * nr + j;
            if (n >= s->N) {
                for (int64_t k = 0; k < s->K; k++)
                    dstp[k * nr + j] = 0.0f;
                continue;
            }
            const char *row = loom__at(b, 0, n, i2, i3);
            if (b->nb[0] == sizeof(float)) {
                const float *r = (const float *)row;
                for (int64_t k = 0; k < s->K; k++)
                    dstp[k * nr + j] = r[k];
            } else {
                for (int64_t k = 0; k < s->K; k++)
                    memcpy(&dstp[k * nr + j], row + k * (int64_t)b->nb[0], sizeof(float));
            }
        }
    }
}

/* Rows [m0, m0 + mlen) of a, k in [k0, k0 + kc) -> MR-wide panels [k][MR], zero past M.
 * F32 rows are packed straight from a; other types are converted to f32 lines first. */
static void gemm_pack_a(const loom__cpu_params *p, const loom_tensor *a, int64_t i2a, int64_t i3a,
                        int64_t m0, int64_t mlen, int64_t k0, int64_t kc, int mr, float *ap,
                        float *lines) {
    const int64_t mpan = ceil_div(mlen, mr);
    const bool direct =
        a->type == LOOM_TYPE_F32 && a->nb[0] == sizeof(float) && a->nb[1] % sizeof(float) == 0;
    for (int64_t mp = 0; mp < mpan; mp++) {
        const int rows = mlen - mp * mr < mr ? (int)(mlen - mp * mr) : mr;
        const float *src = lines;
        size_t lda = (size_t)kc;
        if (direct) {
            src = loom__at(a, k0, m0 + mp * mr, i2a, i3a);
            lda = a->nb[1] / sizeof(float);
        } else {
            for (int i = 0; i < rows; i++) {
                const char *row = loom__at(a, 0, m0 + mp * mr + i, i2a, i3a);
                if (a->type == LOOM_TYPE_F16 && a->nb[0] == sizeof(uint16_t))
                    p->simd->f16_to_f32((const uint16_t *)row + k0, lines + i * kc, kc);
                else if (a->type == LOOM_TYPE_Q8_0) /* k0, kc: whole blocks */
                    p->simd->dequant_q8_0((const loom_block_q8_0 *)row + k0 / LOOM_QK8_0,
                                          lines + i * kc, kc / LOOM_QK8_0);
                else if (a->type == LOOM_TYPE_Q4_0)
                    p->simd->dequant_q4_0((const loom_block_q4_0 *)row + k0 / LOOM_QK4_0,
                                          lines + i * kc, kc / LOOM_QK4_0);
                else
                    loom__cpu_row_to_f32(a->type, row, a->nb[0], k0, kc, lines + i * kc);
            }
        }
        p->simd->gemm_pack_a(src, lda, kc, rows, ap + mp * kc * mr);
    }
}

static void mm_path_gemm(const loom__cpu_params *p, loom_tensor *dst, const mm_shape *s) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const int mr = p->simd->gemm_mr, nr = p->simd->gemm_nr;
    const int64_t npan = ceil_div(s->N, nr);
    const int64_t batches = s->B2 * s->B3;
    float *bp = p->wshared;
    int64_t p0, p1;
    loom__range(batches * npan, p->ith, p->nth, &p0, &p1);
    gemm_pack_b(b, s, nr, p0, p1, bp);
    loom__cpu_barrier(p);

    float *ap = p->wthread;
    float *lines = (float *)((char *)p->wthread + align64((size_t)MM_MC * MM_KC * sizeof(float)));
    const size_t ldc = dst->nb[1] / sizeof(float);

    const loom__cpu_gemm_units g = loom__cpu_gemm_units_of(batches, s->M, npan, MM_MC, mr, p->nth);
    loom__cpu_chunks ch = loom__cpu_chunks_of(p, g.count, 1);
    for (int64_t u; loom__cpu_chunks_item(p, &ch, &u);) {
        const loom__cpu_gemm_unit w = loom__cpu_gemm_unit_at(&g, u, s->M);
        const int64_t batch = w.batch, mc0 = w.mc0, mlen = w.mlen, pn0 = w.pn0, pn1 = w.pn1;
        const int64_t i2 = batch % s->B2, i3 = batch / s->B2;
        const int64_t mpan = ceil_div(mlen, mr);
        const float *bpan = bp + batch * npan * s->K * nr;
        if (pn0 >= pn1) continue;
        for (int64_t k0 = 0; k0 < s->K; k0 += MM_KC) {
            const int64_t kc = s->K - k0 < MM_KC ? s->K - k0 : MM_KC;
            gemm_pack_a(p, a, i2 / s->r2, i3 / s->r3, mc0, mlen, k0, kc, mr, ap, lines);
            for (int64_t pn = pn0; pn < pn1; pn++) {
                const float *bpk = bpan + pn * s->K * nr + k0 * nr;
                const int nvalid = s->N - pn * nr < nr ? (int)(s->N - pn * nr) : nr;
                for (int64_t mp = 0; mp < mpan; mp++) {
                    const int64_t m = mc0 + mp * mr;
                    const int mvalid = s->M - m < mr ? (int)(s->M - m) : mr;
                    p->simd->gemm_tile(kc, ap + mp * kc * mr, bpk, dst_at(dst, m, pn * nr, i2, i3),
                                       ldc, k0 == 0, mvalid, nvalid);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- int8 GEMM */

/* The int8 GEMM of quantised weights (qgemm.h): b quantised once into Q8 blocks and
 * packed into NR-wide u8 panels (shared), then per unit MM_MC x MM_KC blocks of a
 * unpacked into canonical MR-row int8 panels and the int8 micro-kernel over them; the
 * same units and loop order as the F32 GEMM. */
static void mm_path_qgemm(const loom__cpu_params *p, loom_tensor *dst, const mm_shape *s) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const loom__qg_type *qt = loom__qg_type_get(a->type);
    const int mr = p->simd->qgemm_mr, nr = p->simd->qgemm_nr;
    const int64_t nblk = s->K / LOOM_QG_BLK, npan = ceil_div(s->N, nr);
    const int64_t batches = s->B2 * s->B3;
    const size_t ablk = loom__qg_ablk_bytes(mr, qt->halves), bblk = loom__qg_bblk_bytes(nr);
    const size_t panel_bytes = (size_t)nblk * bblk;
    const qg_thread_layout tl = qg_thread_layout_of(p->simd, s->K, a->type);
    const loom__cpu_repack *rp = s->B2 * s->B3 == 1 ? loom__cpu_repack_of(a, p->simd) : NULL;
    char *bp = p->wshared, *wt = p->wthread;
    char *stage = wt + tl.off_stage;
    char *ap = wt, *tmp = wt + tl.off_tmp, *q8 = wt + tl.off_q8;
    float *f32 = (float *)(wt + tl.off_f32);

    /* b: panels (batch, panel) across threads, each column quantised once */
    int64_t p0, p1;
    loom__range(batches * npan, p->ith, p->nth, &p0, &p1);
    for (int64_t pi = p0; pi < p1; pi++) {
        const int64_t batch = pi / npan, pn = pi % npan;
        const int64_t i2 = batch % s->B2, i3 = batch / s->B2;
        for (int j = 0; j < nr; j++) {
            const int64_t n = pn * nr + j;
            if (n >= s->N) {
                loom__qg_pack_b_col(NULL, nblk, nr, j, bp + (size_t)pi * panel_bytes);
                continue;
            }
            const float *row = loom__at(b, 0, n, i2, i3);
            if (b->nb[0] != sizeof(float) || (uintptr_t)row % sizeof(float)) {
                loom__cpu_row_to_f32(LOOM_TYPE_F32, row, b->nb[0], 0, s->K, f32);
                row = f32;
            }
            p->simd->quantize_q8a(row, q8, s->K);
            loom__qg_pack_b_col(q8, nblk, nr, j, bp + (size_t)pi * panel_bytes);
        }
    }
    loom__cpu_barrier(p);

    const size_t ldc = dst->nb[1] / sizeof(float);
    const loom__cpu_gemm_units g = loom__cpu_gemm_units_of(batches, s->M, npan, MM_MC, mr, p->nth);
    loom__cpu_chunks ch = loom__cpu_chunks_of(p, g.count, 1);
    for (int64_t u; loom__cpu_chunks_item(p, &ch, &u);) {
        const loom__cpu_gemm_unit w = loom__cpu_gemm_unit_at(&g, u, s->M);
        const int64_t batch = w.batch, mc0 = w.mc0, mlen = w.mlen, pn0 = w.pn0, pn1 = w.pn1;
        const int64_t i2 = batch % s->B2, i3 = batch / s->B2;
        const int64_t mpan = ceil_div(mlen, mr);
        const char *bpan = bp + (size_t)(batch * npan) * panel_bytes;
        if (pn0 >= pn1) continue;
        for (int64_t k0 = 0; k0 < s->K; k0 += MM_KC) {
            const int64_t kb = (s->K - k0 < MM_KC ? s->K - k0 : MM_KC) / LOOM_QG_BLK;
            for (int64_t mp = 0; mp < mpan; mp++) {
                const int rows = mlen - mp * mr < mr ? (int)(mlen - mp * mr) : mr;
                if (rp) { /* the rows back in file order, this k-block only */
                    const int64_t bs = loom_blck_size(a->type);
                    const size_t srb = loom_row_size(a->type, kb * LOOM_QG_BLK);
                    for (int i = 0; i < rows; i++)
                        loom__cpu_repack_read(rp, mc0 + mp * mr + i, k0 / bs, kb * LOOM_QG_BLK / bs,
                                              stage + (size_t)i * srb);
                    loom__qg_pack_a(qt, stage, srb, rows, mr, 0, kb, ap + (size_t)(mp * kb) * ablk,
                                    tmp, p->simd);
                    continue;
                }
                loom__qg_pack_a(qt, loom__at(a, 0, mc0 + mp * mr, i2 / s->r2, i3 / s->r3), a->nb[1],
                                rows, mr, k0 / LOOM_QG_BLK, kb, ap + (size_t)(mp * kb) * ablk, tmp,
                                p->simd);
            }
            for (int64_t pn = pn0; pn < pn1; pn++) {
                const char *bpk =
                    bpan + (size_t)pn * panel_bytes + (size_t)(k0 / LOOM_QG_BLK) * bblk;
                const int nvalid = s->N - pn * nr < nr ? (int)(s->N - pn * nr) : nr;
                for (int64_t mp = 0; mp < mpan; mp++) {
                    const int64_t m = mc0 + mp * mr;
                    const int mvalid = s->M - m < mr ? (int)(s->M - m) : mr;
                    p->simd->qgemm_tile(kb, ap + (size_t)(mp * kb) * ablk, bpk,
                                        dst_at(dst, m, pn * nr, i2, i3), ldc, k0 == 0, qt->has_min,
                                        qt->halves, mvalid, nvalid);
                }
            }
        }
    }
}

static void zero_dst(const loom__cpu_params *p, loom_tensor *dst) {
    int64_t r0, r1;
    loom__range(loom_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1 = r % dst->ne[1], i2 = (r / dst->ne[1]) % dst->ne[2];
        int64_t i3 = r / (dst->ne[1] * dst->ne[2]);
        for (int64_t i = 0; i < dst->ne[0]; i++)
            *dst_at(dst, i, i1, i2, i3) = 0.0f;
    }
}

void loom__cpu_op_mul_mat(const loom__cpu_params *p, loom_tensor *dst) {
    mm_shape s = shape_of(dst);
    if (s.K == 0) {
        zero_dst(p, dst);
        return;
    }
    switch (choose_path(dst, p->simd)) {
    case MM_GEMM:
        mm_path_gemm(p, dst, &s);
        break;
    case MM_QGEMM:
        mm_path_qgemm(p, dst, &s);
        break;
    case MM_BGEMM:
        loom__cpu_op_mul_mat_bgemm(p, dst);
        break;
    case MM_QUANT:
        mm_path_quant(p, dst, &s);
        break;
    case MM_QDOT:
        mm_path_qdot(p, dst, &s);
        break;
    case MM_DOT:
        mm_path_dot(p, dst, &s);
        break;
    case MM_BDOT:
        mm_path_bdot(p, dst, &s);
        break;
    }
}

/* ---------------------------------------------------------------- mul_mat_id */

/* MUL_MAT_ID takes the batched (GEMM) path, from the shapes alone, when there are enough
 * (u, t) slots overall and per expert on average for the packed micro-kernel to pay. */
enum { MMID_GEMM_MIN_SLOTS = 64, MMID_GEMM_MIN_PER_EXPERT = 8 };

static bool mmid_use_gemm(const loom_tensor *dst, const loom__cpu_simd *simd) {
    const loom_tensor *as = dst->src[0], *ids = dst->src[2];
    const int64_t slots = ids->ne[0] * ids->ne[1], E = as->ne[2];
    return simd->gemm_tile && slots >= MMID_GEMM_MIN_SLOTS && slots >= MMID_GEMM_MIN_PER_EXPERT * E;
}

/* Shared scratch of MUL_MAT_ID: the (u, t) slots grouped by expert (counting sort), then
 * b's rows in that order, contiguous (f32, or Q8 activations for quantised experts on the
 * dot path); on the GEMM path the rows stay f32 and are packed into NR-wide panels per
 * expert (each expert's last panel zero-padded). */
typedef struct mmid_layout {
    size_t off_count, off_start, off_slots, off_rows, off_panels, total;
    size_t row_bytes;
    bool gemm;
    bool qgemm; /* the GEMM path through the int8 GEMM (quantised experts) */
} mmid_layout;

static mmid_layout mmid_layout_of(const loom_tensor *dst, const loom__cpu_simd *simd) {
    const loom_tensor *as = dst->src[0], *ids = dst->src[2];
    const int64_t K = as->ne[0], E = as->ne[2], slots = ids->ne[0] * ids->ne[1];
    mmid_layout l;
    l.gemm = mmid_use_gemm(dst, simd);
    const loom__qg_type *qt = loom__qg_type_get(as->type);
    l.qgemm = l.gemm && qt && simd->qgemm_tile && qt->qmax <= simd->qgemm_qmax &&
              as->nb[0] == loom_type_size(as->type) && qgemm_enabled();
    l.row_bytes = l.gemm               ? (size_t)K * sizeof(float)
                  : is_quant(as->type) ? loom__q8a_row_bytes(K / LOOM_QK8_0)
                  : is_qdot(as->type)  ? qdot_row_bytes(as->type, K)
                                       : (size_t)K * sizeof(float);
    l.off_count = 0;
    l.off_start = align64((size_t)E * sizeof(int64_t));
    l.off_slots = l.off_start + align64((size_t)(E + 1) * sizeof(int64_t));
    l.off_rows = l.off_slots + align64((size_t)slots * 2 * sizeof(int32_t));
    l.off_panels = l.off_rows + align64((size_t)slots * l.row_bytes);
    l.total = l.off_panels;
    if (l.qgemm) /* at most slots + E * (NR - 1) columns, in u8 panels of NR */
        l.total += (size_t)ceil_div(slots + E * simd->qgemm_nr, simd->qgemm_nr) *
                   (size_t)(K / LOOM_QG_BLK) * loom__qg_bblk_bytes(simd->qgemm_nr);
    else if (l.gemm) /* at most slots + E * (NR - 1) panel columns */
        l.total += (size_t)(slots + E * simd->gemm_nr) * (size_t)K * sizeof(float);
    return l;
}

/* Per-thread scratch of the GEMM path: A panels, converted A lines, then one unit's
 * results (MM_MC rows by up to every slot). */
static size_t mmid_gemm_lines_off(void) {
    return align64((size_t)MM_MC * MM_KC * sizeof(float));
}

static size_t mmid_gemm_cbuf_off(const loom__cpu_simd *simd) {
    return mmid_gemm_lines_off() + align64((size_t)simd->gemm_mr * MM_KC * sizeof(float));
}

const char *loom__cpu_mul_mat_path(const loom_tensor *dst, const loom__cpu_simd *simd) {
    static const char *const names[] = {"dot",   "quant", "qdot", "gemm",
                                        "qgemm", "bgemm", "bdot"};
    if (dst->op == LOOM_OP_MUL_MAT_ID) {
        const mmid_layout l = mmid_layout_of(dst, simd);
        return l.qgemm ? "qgemm" : l.gemm ? "gemm" : "dot";
    }
    return names[choose_path(dst, simd)];
}

loom__cpu_work loom__cpu_mul_mat_id_work(const loom_tensor *dst, int nth,
                                         const loom__cpu_simd *simd) {
    (void)nth;
    const mmid_layout l = mmid_layout_of(dst, simd);
    loom__cpu_work w = {l.total, (size_t)dst->src[0]->ne[0] * sizeof(float)};
    if (l.gemm) {
        const int64_t slots = dst->src[2]->ne[0] * dst->src[2]->ne[1];
        const size_t off = l.qgemm ? align64(qg_thread_layout_of(simd, dst->src[0]->ne[0], dst->src[0]->type).total)
                                   : mmid_gemm_cbuf_off(simd);
        const size_t g = off + (size_t)MM_MC * (size_t)slots * sizeof(float);
        if (g > w.per_thread) w.per_thread = g;
    }
    return w;
}

/* The panels of nr columns over the experts' slot groups, and the experts with slots. */
static void mmid_panels(const int64_t *start, int64_t E, int nr, int64_t *npanels,
                        int64_t *active) {
    *npanels = *active = 0;
    for (int64_t e = 0; e < E; e++) {
        *npanels += ceil_div(start[e + 1] - start[e], nr);
        *active += start[e + 1] > start[e];
    }
}

/* The expert of an (expert, row block) unit, walked forward over a thread's consecutive
 * units: e is the rank-th expert with slots, pan0 its first panel. */
typedef struct mmid_cursor {
    int64_t e, e_rank, pan0;
} mmid_cursor;

static void mmid_cursor_seek(mmid_cursor *c, int64_t rank, const int64_t *start, int nr) {
    while (c->e_rank < rank) {
        if (c->e >= 0) c->pan0 += ceil_div(start[c->e + 1] - start[c->e], nr);
        c->e++;
        if (start[c->e + 1] > start[c->e]) c->e_rank++;
    }
}

/* A work unit of the batched paths: expert e's row block [mc0, mc0 + mlen) (mpan panels
 * of mr rows) against its ne slots in np panels of nr, the first at panel pan0. */
typedef struct mmid_unit {
    int64_t e, pan0, ne, np, mc0, mlen, mpan;
} mmid_unit;

/* Unit u of `mblocks` row blocks per active expert; c walks the experts forward (units
 * in increasing order). */
static mmid_unit mmid_unit_at(mmid_cursor *c, int64_t u, int64_t mblocks, const int64_t *start,
                              int64_t M, int mr, int nr) {
    mmid_cursor_seek(c, u / mblocks, start, nr);
    mmid_unit w = {.e = c->e, .pan0 = c->pan0};
    w.ne = start[w.e + 1] - start[w.e];
    w.np = ceil_div(w.ne, nr);
    w.mc0 = (u % mblocks) * MM_MC;
    w.mlen = M - w.mc0 < MM_MC ? M - w.mc0 : MM_MC;
    w.mpan = ceil_div(w.mlen, mr);
    return w;
}

/* One unit's results (rows [mc0, mc0 + mlen) of expert e's slots, MM_MC apart) to dst. */
static void mmid_scatter(loom_tensor *dst, const int64_t *start, const int32_t *slot, int64_t e,
                         int64_t mc0, int64_t mlen, const float *cbuf) {
    for (int64_t j = 0; j < start[e + 1] - start[e]; j++) {
        const int64_t s = start[e] + j;
        for (int64_t i = 0; i < mlen; i++)
            *dst_at(dst, mc0 + i, slot[2 * s], slot[2 * s + 1], 0) = cbuf[j * MM_MC + i];
    }
}

/* The GEMM path over the slots grouped by expert: b's f32 rows packed into panels per
 * expert (shared), then (expert, row block) units across threads, each accumulating its
 * MM_MC x n_e block over K with the micro-kernel and scattering it to dst. */
static void mmid_gemm(const loom__cpu_params *p, loom_tensor *dst, const mmid_layout *l,
                      const int64_t *start, const int32_t *slot, const float *rows) {
    const loom_tensor *as = dst->src[0];
    const int64_t K = as->ne[0], M = as->ne[1], E = as->ne[2];
    const int mr = p->simd->gemm_mr, nr = p->simd->gemm_nr;
    float *bp = (float *)((char *)p->wshared + l->off_panels);
    int64_t npanels, active;
    mmid_panels(start, E, nr, &npanels, &active);
    int64_t p0, p1;
    loom__range(npanels, p->ith, p->nth, &p0, &p1);
    for (int64_t e = 0, gi = 0; e < E && gi < p1; e++) {
        const int64_t ne_ = start[e + 1] - start[e], np = ceil_div(ne_, nr);
        for (int64_t pn = 0; pn < np; pn++, gi++) {
            if (gi < p0 || gi >= p1) continue;
            float *dp = bp + gi * K * nr;
            for (int j = 0; j < nr; j++) {
                const int64_t col = pn * nr + j;
                const float *src = col < ne_ ? rows + (start[e] + col) * K : NULL;
                for (int64_t k = 0; k < K; k++)
                    dp[k * nr + j] = src ? src[k] : 0.0f;
            }
        }
    }
    loom__cpu_barrier(p);

    float *ap = p->wthread;
    float *lines = (float *)((char *)p->wthread + mmid_gemm_lines_off());
    float *cbuf = (float *)((char *)p->wthread + mmid_gemm_cbuf_off(p->simd));
    const int64_t mblocks = ceil_div(M, MM_MC);
    int64_t u0, u1;
    loom__range(active * mblocks, p->ith, p->nth, &u0, &u1);
    mmid_cursor c = {-1, -1, 0};
    for (int64_t u = u0; u < u1; u++) {
        const mmid_unit w = mmid_unit_at(&c, u, mblocks, start, M, mr, nr);
        const int64_t e = w.e, pan0 = w.pan0, ne_ = w.ne, np = w.np;
        const int64_t mc0 = w.mc0, mlen = w.mlen, mpan = w.mpan;
        for (int64_t k0 = 0; k0 < K; k0 += MM_KC) {
            const int64_t kc = K - k0 < MM_KC ? K - k0 : MM_KC;
            gemm_pack_a(p, as, e, 0, mc0, mlen, k0, kc, mr, ap, lines);
            for (int64_t pn = 0; pn < np; pn++) {
                const float *bpk = bp + (pan0 + pn) * K * nr + k0 * nr;
                const int nvalid = ne_ - pn * nr < nr ? (int)(ne_ - pn * nr) : nr;
                for (int64_t mp = 0; mp < mpan; mp++) {
                    const int mvalid = mlen - mp * mr < mr ? (int)(mlen - mp * mr) : mr;
                    p->simd->gemm_tile(kc, ap + mp * kc * mr, bpk, cbuf + pn * nr * MM_MC + mp * mr,
                                       MM_MC, k0 == 0, mvalid, nvalid);
                }
            }
        }
        mmid_scatter(dst, start, slot, e, mc0, mlen, cbuf);
    }
}

/* mmid_gemm through the int8 GEMM: b's rows quantised and packed into u8 panels per
 * expert (shared), then the same (expert, row block) units with the int8 micro-kernel. */
static void mmid_qgemm(const loom__cpu_params *p, loom_tensor *dst, const mmid_layout *l,
                       const int64_t *start, const int32_t *slot, const float *rows) {
    const loom_tensor *as = dst->src[0];
    const int64_t K = as->ne[0], M = as->ne[1], E = as->ne[2];
    const loom__qg_type *qt = loom__qg_type_get(as->type);
    const int mr = p->simd->qgemm_mr, nr = p->simd->qgemm_nr;
    const int64_t nblk = K / LOOM_QG_BLK;
    const size_t ablk = loom__qg_ablk_bytes(mr, qt->halves), bblk = loom__qg_bblk_bytes(nr);
    const size_t panel_bytes = (size_t)nblk * bblk;
    const qg_thread_layout tl = qg_thread_layout_of(p->simd, K, dst->src[0]->type);
    char *bp = (char *)p->wshared + l->off_panels, *wt = p->wthread;
    char *ap = wt, *tmp = wt + tl.off_tmp, *q8 = wt + tl.off_q8;
    float *cbuf = (float *)(wt + align64(tl.total));
    int64_t npanels, active;
    mmid_panels(start, E, nr, &npanels, &active);
    int64_t p0, p1;
    loom__range(npanels, p->ith, p->nth, &p0, &p1);
    for (int64_t e = 0, gi = 0; e < E && gi < p1; e++) {
        const int64_t ne_ = start[e + 1] - start[e], np = ceil_div(ne_, nr);
        for (int64_t pn = 0; pn < np; pn++, gi++) {
            if (gi < p0 || gi >= p1) continue;
            for (int j = 0; j < nr; j++) {
                const int64_t col = pn * nr + j;
                if (col < ne_) p->simd->quantize_q8a(rows + (start[e] + col) * K, q8, K);
                loom__qg_pack_b_col(col < ne_ ? q8 : NULL, nblk, nr, j,
                                    bp + (size_t)gi * panel_bytes);
            }
        }
    }
    loom__cpu_barrier(p);

    const int64_t mblocks = ceil_div(M, MM_MC);
    int64_t u0, u1;
    loom__range(active * mblocks, p->ith, p->nth, &u0, &u1);
    mmid_cursor c = {-1, -1, 0};
    for (int64_t u = u0; u < u1; u++) {
        const mmid_unit w = mmid_unit_at(&c, u, mblocks, start, M, mr, nr);
        const int64_t e = w.e, pan0 = w.pan0, ne_ = w.ne, np = w.np;
        const int64_t mc0 = w.mc0, mlen = w.mlen, mpan = w.mpan;
        for (int64_t k0 = 0; k0 < K; k0 += MM_KC) {
            const int64_t kb = (K - k0 < MM_KC ? K - k0 : MM_KC) / LOOM_QG_BLK;
            for (int64_t mp = 0; mp < mpan; mp++) {
                const int rws = mlen - mp * mr < mr ? (int)(mlen - mp * mr) : mr;
                loom__qg_pack_a(qt, loom__at(as, 0, mc0 + mp * mr, e, 0), as->nb[1], rws, mr,
                                k0 / LOOM_QG_BLK, kb, ap + (size_t)(mp * kb) * ablk, tmp,
                                p->simd);
            }
            for (int64_t pn = 0; pn < np; pn++) {
                const char *bpk =
                    bp + (size_t)(pan0 + pn) * panel_bytes + (size_t)(k0 / LOOM_QG_BLK) * bblk;
                const int nvalid = ne_ - pn * nr < nr ? (int)(ne_ - pn * nr) : nr;
                for (int64_t mp = 0; mp < mpan; mp++) {
                    const int mvalid = mlen - mp * mr < mr ? (int)(mlen - mp * mr) : mr;
                    p->simd->qgemm_tile(kb, ap + (size_t)(mp * kb) * ablk, bpk,
                                        cbuf + pn * nr * MM_MC + mp * mr, MM_MC, k0 == 0,
                                        qt->has_min, qt->halves, mvalid, nvalid);
                }
            }
        }
        mmid_scatter(dst, start, slot, e, mc0, mlen, cbuf);
    }
}

void loom__cpu_op_mul_mat_id(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *as = dst->src[0], *b = dst->src[1], *ids = dst->src[2];
    const int64_t K = as->ne[0], M = as->ne[1], E = as->ne[2];
    const int64_t U = ids->ne[0], T = ids->ne[1], B1 = b->ne[1];
    const int64_t slots = U * T;
    const mmid_layout l = mmid_layout_of(dst, p->simd);
    char *w = p->wshared;
    int64_t *count = (int64_t *)(w + l.off_count), *start = (int64_t *)(w + l.off_start);
    int32_t *slot = (int32_t *)(w + l.off_slots); /* (u, t) pairs by expert */
    char *rows = w + l.off_rows;

    if (p->ith == 0) {
        memset(count, 0, (size_t)E * sizeof *count);
        for (int64_t t = 0; t < T; t++) {
            for (int64_t u = 0; u < U; u++) {
                int32_t e;
                memcpy(&e, loom__at(ids, u, t, 0, 0), sizeof e);
                if (e < 0 || e >= E) {
                    loom__cpu_fail(p, LOOM_ERR_INVALID_ARG,
                                   "MUL_MAT_ID '%s': expert id %d (ids[%lld, %lld]) out of "
                                   "range [0, %lld)",
                                   loom__cpu_name(dst), e, (long long)u, (long long)t,
                                   (long long)E);
                    goto done;
                }
                count[e]++;
            }
        }
        start[0] = 0;
        for (int64_t e = 0; e < E; e++)
            start[e + 1] = start[e] + count[e];
        memset(count, 0, (size_t)E * sizeof *count);
        for (int64_t t = 0; t < T; t++) {
            for (int64_t u = 0; u < U; u++) {
                int32_t e;
                memcpy(&e, loom__at(ids, u, t, 0, 0), sizeof e);
                int64_t at = start[e] + count[e]++;
                slot[2 * at] = (int32_t)u;
                slot[2 * at + 1] = (int32_t)t;
            }
        }
    }
done:
    loom__cpu_barrier(p);
    if (loom__cpu_failed(p)) return;

    /* b's rows in expert order: converted (f32) or quantised */
    int64_t r0, r1;
    loom__range(slots, p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t u = slot[2 * r], t = slot[2 * r + 1];
        const char *row = loom__at(b, 0, u % B1, t, 0);
        float *tmp = p->wthread;
        loom__cpu_row_to_f32(LOOM_TYPE_F32, row, b->nb[0], 0, K, tmp);
        if (l.gemm)
            memcpy(rows + r * l.row_bytes, tmp, (size_t)K * sizeof(float));
        else if (is_quant(as->type))
            p->simd->quantize_q8a(tmp, rows + r * l.row_bytes, K);
        else if (is_qdot(as->type))
            loom__cpu_qact_get(loom_type_traits_get((int)as->type)->vec_dot_type,
                               p->simd)(tmp, rows + r * l.row_bytes, K);
        else
            memcpy(rows + r * l.row_bytes, tmp, (size_t)K * sizeof(float));
    }
    loom__cpu_barrier(p);
    if (l.qgemm) {
        mmid_qgemm(p, dst, &l, start, slot, (const float *)rows);
        return;
    }
    if (l.gemm) {
        mmid_gemm(p, dst, &l, start, slot, (const float *)rows);
        return;
    }

    /* (expert, m) pairs of the experts in use, split across threads */
    int64_t active = 0;
    for (int64_t e = 0; e < E; e++)
        active += start[e + 1] > start[e];
    mm_dot_args x = {
        .a = as,
        .atype = as->type,
        .K = K,
        .ldb = is_quant(as->type) || is_qdot(as->type) ? l.row_bytes : (size_t)K,
        .b_row_bytes = l.row_bytes,
        .simd = p->simd,
        .a_tmp = a_in_place(as) ? NULL : p->wthread,
        .qdot = loom__cpu_qdot_get(as->type, p->simd),
    };
    int64_t t0, t1;
    loom__range(active * M, p->ith, p->nth, &t0, &t1);
    int64_t e = -1, e_rank = -1;
    float out[4];
    for (int64_t it = t0; it < t1; it++) {
        const int64_t rank = it / M, m = it % M;
        while (e_rank < rank) { /* advance to the rank-th active expert */
            e++;
            if (start[e + 1] > start[e]) e_rank++;
        }
        const void *arow = loom__at(as, 0, m, e, 0);
        const int64_t s0 = start[e], s1 = start[e + 1];
        for (int64_t s = s0; s < s1; s += 4) {
            int nb = s1 - s < 4 ? (int)(s1 - s) : 4;
            dot_rows(&x, arow, rows + s * l.row_bytes, nb, out);
            for (int j = 0; j < nb; j++)
                *dst_at(dst, m, slot[2 * (s + j)], slot[2 * (s + j) + 1], 0) = out[j];
        }
    }
}
