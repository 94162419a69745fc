/*
 * Repacked matmul weights (repack.h): the copies, their registry and the readers of the
 * layout. One process-wide list under a mutex; it is walked only before a run (once per
 * MUL_MAT of a repackable type) and by the buffer hooks, never by the kernels, which read
 * the record the pre-pass stored in src0->extra.
 */
#define _GNU_SOURCE /* MADV_PAGEOUT */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backends/cpu/repack.h"

/* bytes of the original repacked between two advice calls */
#define RP_PIECE ((size_t)1 << 20)

static pthread_mutex_t rp_mu = PTHREAD_MUTEX_INITIALIZER;
static loom__cpu_repack *rp_list;

static bool rp_type(loom_type t) {
    return t == LOOM_TYPE_IQ4_NL || t == LOOM_TYPE_Q4_K || t == LOOM_TYPE_Q4_0;
}

static bool rp_enabled(void) {
    const char *e = getenv("LOOM_CPU_REPACK");
    return !(e && e[0] == '0');
}

/* Bytes of the copy: the groups, then the tail rows as they are. */
static size_t rp_bytes(const loom__cpu_repack *rp) {
    return loom__cpu_repack_bytes(rp->type, rp->K, rp->rows);
}

/* Bytes of the original. */
static size_t rp_orig_bytes(const loom__cpu_repack *rp) {
    return (size_t)rp->rows * rp->row_bytes;
}

size_t loom__cpu_repack_gblk_bytes(loom_type t) {
    return t == LOOM_TYPE_Q4_K ? LOOM__RP_Q4K_GBLK : LOOM__RP_ROWS * loom_type_size(t);
}

size_t loom__cpu_repack_bytes(loom_type t, int64_t K, int64_t rows) {
    const int64_t nblk = K / loom_blck_size(t), groups = rows / LOOM__RP_ROWS;
    return (size_t)(groups * nblk) * loom__cpu_repack_gblk_bytes(t) +
           (size_t)(rows - groups * LOOM__RP_ROWS) * loom_row_size(t, K);
}

/* a can be repacked on this table (the copy itself may already exist). */
static bool rp_eligible(const loom_tensor *a, const loom__cpu_simd *simd) {
    return rp_type(a->type) && loom__cpu_qdot4_get(a->type, simd) && a->buffer && a->data &&
           !a->view_src && loom__cpu_buffer_is_caller(a->buffer) &&
           loom_buffer_get_usage(a->buffer) == LOOM_BUFFER_USAGE_WEIGHTS && a->ne[2] == 1 &&
           a->ne[3] == 1 && a->ne[1] >= LOOM__RP_ROWS && loom_is_contiguous(a) &&
           a->ne[0] % loom_blck_size(a->type) == 0;
}

static bool rp_matches(const loom__cpu_repack *rp, const loom_tensor *a) {
    return rp->orig == a->data && rp->buffer == a->buffer && rp->type == a->type &&
           rp->K == a->ne[0] && rp->rows == a->ne[1];
}

/* Q4_K's 6-bit scales and mins of a block's 12 bytes q (as its to_float reads them) */
static void q4k_unpack_scales(const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 0x0f) | ((q[j] >> 6) << 4));
        mn[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

/* ... and back (the inverse: every 6-bit pair gives the same 12 bytes) */
static void q4k_pack_scales(const uint8_t *sc, const uint8_t *mn, uint8_t *q) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4));
    }
}

/* Block b of row l (0..3) of the group at g, from (put) or to (get) an original block. */
static void rp_put(loom_type type, char *g, int64_t b, int l, const char *src) {
    char *gb = g + (size_t)b * loom__cpu_repack_gblk_bytes(type);
    if (type == LOOM_TYPE_IQ4_NL || type == LOOM_TYPE_Q4_0) { /* both: fp16 d, 16 nibble bytes */
        memcpy(gb + 2 * l, src, 2);
        memcpy(gb + 2 * LOOM__RP_ROWS + 16 * l, src + 2, 16);
        return;
    }
    const loom_block_q4_K *x = (const loom_block_q4_K *)src;
    uint8_t sc[8], mn[8];
    q4k_unpack_scales(x->scales, sc, mn);
    memcpy(gb + 2 * l, &x->d, 2);
    memcpy(gb + 8 + 2 * l, &x->dmin, 2);
    for (int s = 0; s < 8; s++) {
        gb[16 + 4 * s + l] = (char)sc[s];
        gb[48 + 4 * s + l] = (char)mn[s];
    }
    for (int c = 0; c < 4; c++)
        for (int h = 0; h < 2; h++)
            memcpy(gb + 80 + 128 * c + 64 * h + 16 * l, x->qs + 32 * c + 16 * h, 16);
}

static void rp_get(loom_type type, const char *g, int64_t b, int l, char *dst) {
    const char *gb = g + (size_t)b * loom__cpu_repack_gblk_bytes(type);
    if (type == LOOM_TYPE_IQ4_NL || type == LOOM_TYPE_Q4_0) { /* both: fp16 d, 16 nibble bytes */
        memcpy(dst, gb + 2 * l, 2);
        memcpy(dst + 2, gb + 2 * LOOM__RP_ROWS + 16 * l, 16);
        return;
    }
    loom_block_q4_K *x = (loom_block_q4_K *)dst;
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; s++) {
        sc[s] = (uint8_t)gb[16 + 4 * s + l];
        mn[s] = (uint8_t)gb[48 + 4 * s + l];
    }
    memcpy(&x->d, gb + 2 * l, 2);
    memcpy(&x->dmin, gb + 8 + 2 * l, 2);
    q4k_pack_scales(sc, mn, x->scales);
    for (int c = 0; c < 4; c++)
        for (int h = 0; h < 2; h++)
            memcpy(x->qs + 32 * c + 16 * h, gb + 80 + 128 * c + 64 * h + 16 * l, 16);
}

void loom__cpu_repack_rows(loom_type type, int64_t K, int64_t rows, const void *src, void *dst) {
    const size_t rb = loom_row_size(type, K), bb = loom_type_size(type);
    const int64_t nblk = K / loom_blck_size(type), groups = rows / LOOM__RP_ROWS;
    const size_t gbytes = (size_t)nblk * loom__cpu_repack_gblk_bytes(type);
    for (int64_t g = 0; g < groups; g++) {
        char *gdst = (char *)dst + (size_t)g * gbytes;
        for (int l = 0; l < LOOM__RP_ROWS; l++) {
            const char *row = (const char *)src + (size_t)(g * LOOM__RP_ROWS + l) * rb;
            for (int64_t b = 0; b < nblk; b++)
                rp_put(type, gdst, b, l, row + (size_t)b * bb);
        }
    }
    memcpy((char *)dst + (size_t)groups * gbytes,
           (const char *)src + (size_t)groups * LOOM__RP_ROWS * rb,
           (size_t)(rows - groups * LOOM__RP_ROWS) * rb);
}

void loom__cpu_repack_read(const loom__cpu_repack *rp, int64_t r, int64_t b0, int64_t nb,
                           void *out) {
    char *o = out;
    if (r >= rp->groups * LOOM__RP_ROWS) {
        memcpy(o, loom__cpu_repack_row(rp, r) + (size_t)b0 * rp->blk_bytes,
               (size_t)nb * rp->blk_bytes);
        return;
    }
    const char *g = loom__cpu_repack_group(rp, r / LOOM__RP_ROWS);
    for (int64_t b = b0; b < b0 + nb; b++, o += rp->blk_bytes)
        rp_get(rp->type, g, b, (int)(r % LOOM__RP_ROWS), o);
}

/* The pages wholly inside the original are advised out: it is read again only by the
 * readers that do not use the copy. */
static void rp_release(const void *p, size_t n) {
#ifdef MADV_PAGEOUT
    long ps = sysconf(_SC_PAGESIZE);
    const size_t pg = ps > 0 ? (size_t)ps : 4096;
    uintptr_t lo = ((uintptr_t)p + pg - 1) & ~(uintptr_t)(pg - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(uintptr_t)(pg - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_PAGEOUT);
#else
    (void)p;
    (void)n;
#endif
}

static loom__cpu_repack *rp_make(const loom_tensor *a) {
    loom__cpu_repack *rp = loom_calloc(1, sizeof *rp);
    if (!rp) return NULL;
    rp->orig = a->data;
    rp->buffer = a->buffer;
    rp->type = a->type;
    rp->K = a->ne[0];
    rp->rows = a->ne[1];
    rp->groups = a->ne[1] / LOOM__RP_ROWS;
    rp->row_bytes = a->nb[1];
    rp->blk_bytes = loom_type_size(a->type);
    rp->group_bytes = (size_t)(rp->K / loom_blck_size(rp->type)) * loom__cpu_repack_gblk_bytes(rp->type);
    rp->data = loom_aligned_alloc(64, (rp_bytes(rp) + 63) & ~(size_t)63);
    if (!rp->data) {
        loom_free(rp);
        return NULL;
    }
    /* in pieces of about RP_PIECE bytes, each piece's original advised out once copied, so
     * the peak is the copy plus one piece, not plus the whole weight */
    const int64_t step = LOOM__RP_ROWS * (int64_t)(RP_PIECE / (LOOM__RP_ROWS * rp->row_bytes) + 1);
    for (int64_t r0 = 0; r0 < rp->groups * LOOM__RP_ROWS; r0 += step) {
        const int64_t n = rp->groups * LOOM__RP_ROWS - r0 < step ? rp->groups * LOOM__RP_ROWS - r0
                                                                 : step;
        const char *src = (const char *)a->data + (size_t)r0 * rp->row_bytes;
        loom__cpu_repack_rows(rp->type, rp->K, n, src,
                              rp->data + (size_t)(r0 / LOOM__RP_ROWS) * rp->group_bytes);
        rp_release(src, (size_t)n * rp->row_bytes);
    }
    const int64_t tail = rp->rows - rp->groups * LOOM__RP_ROWS;
    memcpy((char *)loom__cpu_repack_row(rp, rp->groups * LOOM__RP_ROWS),
           (const char *)a->data + (size_t)(rp->groups * LOOM__RP_ROWS) * rp->row_bytes,
           (size_t)tail * rp->row_bytes);
    rp_release(a->data, rp_orig_bytes(rp));
    return rp;
}

void loom__cpu_repack_graph(const loom_graph *g, const loom__cpu_simd *simd) {
    bool locked = false;
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        if (t->op != LOOM_OP_MUL_MAT || !t->src[0] || !rp_type(t->src[0]->type)) continue;
        loom_tensor *a = t->src[0];
        if (!a->buffer || !loom__cpu_buffer_is_caller(a->buffer)) continue; /* extra not ours */
        if (!locked) {
            pthread_mutex_lock(&rp_mu);
            locked = true;
        }
        loom__cpu_repack *found = NULL;
        if (rp_eligible(a, simd) && rp_enabled()) {
            for (loom__cpu_repack *rp = rp_list; rp && !found; rp = rp->next)
                if (rp_matches(rp, a)) found = rp;
            if (!found && (found = rp_make(a))) {
                found->next = rp_list;
                rp_list = found;
            }
        }
        __atomic_store_n(&a->extra, (void *)found, __ATOMIC_RELEASE);
    }
    if (locked) pthread_mutex_unlock(&rp_mu);
}

const loom__cpu_repack *loom__cpu_repack_of(const loom_tensor *a, const loom__cpu_simd *simd) {
    if (!rp_type(a->type) || !loom__cpu_qdot4_get(a->type, simd) || !a->buffer ||
        !loom__cpu_buffer_is_caller(a->buffer))
        return NULL;
    const loom__cpu_repack *rp = __atomic_load_n(&a->extra, __ATOMIC_ACQUIRE);
    return rp && rp->orig == a->data && rp->type == a->type && rp->rows == a->ne[1] ? rp : NULL;
}

void loom__cpu_repack_drop(loom_buffer_t buf, const void *p, size_t n) {
    pthread_mutex_lock(&rp_mu);
    for (loom__cpu_repack **pp = &rp_list; *pp;) {
        loom__cpu_repack *rp = *pp;
        const uintptr_t lo = (uintptr_t)rp->orig, hi = lo + rp_orig_bytes(rp);
        const bool hit = rp->buffer == buf &&
                         (n == SIZE_MAX || ((uintptr_t)p < hi && (uintptr_t)p + n > lo));
        if (hit) {
            *pp = rp->next;
            loom_aligned_free(rp->data);
            loom_free(rp);
        } else {
            pp = &rp->next;
        }
    }
    pthread_mutex_unlock(&rp_mu);
}

size_t loom__cpu_repack_count(size_t *bytes) {
    size_t n = 0, b = 0;
    pthread_mutex_lock(&rp_mu);
    for (const loom__cpu_repack *rp = rp_list; rp; rp = rp->next) {
        n++;
        b += rp_bytes(rp);
    }
    pthread_mutex_unlock(&rp_mu);
    if (bytes) *bytes = b;
    return n;
}

static loom__cpu_qdot4_fn qdot4_iq4_nl, qdot4_q4_K, qdot4_q4_0;
static pthread_once_t qdot4_once = PTHREAD_ONCE_INIT;

static void qdot4_init(void) {
    loom__cpu_qdot4_avx512(&qdot4_iq4_nl, &qdot4_q4_K, &qdot4_q4_0);
}

loom__cpu_qdot4_fn loom__cpu_qdot4_get(loom_type t, const loom__cpu_simd *simd) {
    if (simd != &loom__cpu_simd_avx512) return NULL;
    pthread_once(&qdot4_once, qdot4_init);
    switch (t) {
    case LOOM_TYPE_IQ4_NL:
        return qdot4_iq4_nl;
    case LOOM_TYPE_Q4_K:
        return qdot4_q4_K;
    case LOOM_TYPE_Q4_0:
        return qdot4_q4_0;
    default:
        return NULL;
    }
}
