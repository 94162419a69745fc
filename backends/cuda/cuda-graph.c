/*
 * CUDA graph compute: checks a graph (supported ops, shapes, memory this device owns,
 * alignment) before anything is queued, sizes the backend's scratch, then enqueues one
 * kernel launch (or a few cuBLAS calls) per node on the backend's stream.
 *
 * MUL_MAT: few columns (N <= 8), or shapes cuBLAS cannot take, go to the dot-product
 * kernel for every weight type (one kernel per type). Larger products go to cuBLAS: weights
 * (tensors of a weights buffer) of a 16-bit or block type on the tensor cores (BF16
 * inputs, FP32 accumulation), the
 * weight converted to BF16 once and cached per weight tensor (wcache_prepare: tensors of
 * a weights buffer, converted again when its buffer's version moved) or per call into the
 * scratch, the activations rounded to BF16 per call: |error| <= 2^-8 sum_k |a_k b_k|
 * against the CPU (backends/cuda/README.md). F32 weights, and the rest
 * (LOOM_CUDA_LEGACY_KERNELS=1, or a BF16 copy that fits neither the cache nor the panel
 * budget), in F32 (FP32 compute, never TF32): weights that are not contiguous F32 are
 * converted exactly to F32 once per call into the backend's reusable scratch: every batch
 * of the weight at once when it fits the panel budget (64 MiB, or LOOM_CUDA_PANEL_BYTES),
 * else in panels of rows. The batches then go to cuBLAS as one strided batched GEMM per i3
 * (cublasSgemmStridedBatched; the broadcast weight batch has stride 0), not one call per
 * batch.
 *
 * CUDA graphs: a graph is identified by a key holding, per node, the tensor and source
 * pointers, data addresses, types, shapes, strides and op params: everything a launch's
 * arguments are made of. The first compute of a key runs eagerly; the second captures the
 * launches into a CUDA graph and replays it; later computes only replay it. The cache of
 * keys (graph-cache.c: LRU, growing while keys evicted earlier come back, 64 to 4096
 * entries) serves the meta device, which alternates 2L+1 small graphs per token.
 * LOOM_CUDA_GRAPHS=0 disables capture; a capture that fails falls back to eager launches.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda-impl.h"

#define LOOM_CUDA_MMV_MAX_N 8       /* columns up to which the dot kernel runs */
#define LOOM_CUDA_GRAPH_MIN_NODES 4 /* smaller graphs are not worth capturing */

static const char *tname(const loom_tensor *t) {
    return t->name[0] ? t->name : "(unnamed)";
}

_Static_assert(sizeof(loom_block_q8_0) == LOOM_CU_Q8_0_BYTES, "Q8_0 block layout");
_Static_assert(sizeof(loom_block_q4_0) == LOOM_CU_Q4_0_BYTES, "Q4_0 block layout");
_Static_assert(LOOM_QK8_0 == LOOM_CU_QK && LOOM_QK4_0 == LOOM_CU_QK, "block length");
_Static_assert(sizeof(loom_block_q4_1) == LOOM_CU_Q4_1_BYTES, "Q4_1 block layout");
_Static_assert(sizeof(loom_block_q5_0) == LOOM_CU_Q5_0_BYTES, "Q5_0 block layout");
_Static_assert(sizeof(loom_block_q5_1) == LOOM_CU_Q5_1_BYTES, "Q5_1 block layout");
_Static_assert(sizeof(loom_block_iq4_nl) == LOOM_CU_IQ4_NL_BYTES, "IQ4_NL block layout");
_Static_assert(sizeof(loom_block_mxfp4) == LOOM_CU_MXFP4_BYTES, "MXFP4 block layout");
_Static_assert(sizeof(loom_block_q2_K) == LOOM_CU_Q2_K_BYTES, "Q2_K block layout");
_Static_assert(sizeof(loom_block_q3_K) == LOOM_CU_Q3_K_BYTES, "Q3_K block layout");
_Static_assert(sizeof(loom_block_q4_K) == LOOM_CU_Q4_K_BYTES, "Q4_K block layout");
_Static_assert(sizeof(loom_block_q5_K) == LOOM_CU_Q5_K_BYTES, "Q5_K block layout");
_Static_assert(sizeof(loom_block_q6_K) == LOOM_CU_Q6_K_BYTES, "Q6_K block layout");
_Static_assert(sizeof(loom_block_iq4_xs) == LOOM_CU_IQ4_XS_BYTES, "IQ4_XS block layout");
_Static_assert(LOOM_QK4_1 == LOOM_CU_QK && LOOM_QK5_0 == LOOM_CU_QK && LOOM_QK5_1 == LOOM_CU_QK &&
                   LOOM_QK4_NL == LOOM_CU_QK && LOOM_QK_MXFP4 == LOOM_CU_QK &&
                   LOOM_QK_K == LOOM_CU_QK_K,
               "block lengths");

/* The kernels' name of a storage type (-1: none; supports_op never lets one through). */
static int32_t cu_type_of(loom_type t) {
    switch (t) {
    case LOOM_TYPE_F32:
        return LOOM_CU_F32;
    case LOOM_TYPE_F16:
        return LOOM_CU_F16;
    case LOOM_TYPE_BF16:
        return LOOM_CU_BF16;
    case LOOM_TYPE_Q8_0:
        return LOOM_CU_Q8_0;
    case LOOM_TYPE_Q4_0:
        return LOOM_CU_Q4_0;
    case LOOM_TYPE_I8:
        return LOOM_CU_I8;
    case LOOM_TYPE_I16:
        return LOOM_CU_I16;
    case LOOM_TYPE_I32:
        return LOOM_CU_I32;
    case LOOM_TYPE_I64:
        return LOOM_CU_I64;
    case LOOM_TYPE_Q4_1:
        return LOOM_CU_Q4_1;
    case LOOM_TYPE_Q5_0:
        return LOOM_CU_Q5_0;
    case LOOM_TYPE_Q5_1:
        return LOOM_CU_Q5_1;
    case LOOM_TYPE_IQ4_NL:
        return LOOM_CU_IQ4_NL;
    case LOOM_TYPE_MXFP4:
        return LOOM_CU_MXFP4;
    case LOOM_TYPE_Q2_K:
        return LOOM_CU_Q2_K;
    case LOOM_TYPE_Q3_K:
        return LOOM_CU_Q3_K;
    case LOOM_TYPE_Q4_K:
        return LOOM_CU_Q4_K;
    case LOOM_TYPE_Q5_K:
        return LOOM_CU_Q5_K;
    case LOOM_TYPE_Q6_K:
        return LOOM_CU_Q6_K;
    case LOOM_TYPE_IQ4_XS:
        return LOOM_CU_IQ4_XS;
    default:
        return -1;
    }
}

static loom_cu_t loom__cu(const loom_tensor *t) {
    loom_cu_t d;
    memset(&d, 0, sizeof d);
    if (!t) return d;
    d.data = t->data;
    for (int i = 0; i < 4; i++) {
        d.ne[i] = t->ne[i];
        d.nb[i] = (int64_t)t->nb[i];
    }
    d.type = cu_type_of(t->type);
    return d;
}

static size_t align_up(size_t n) {
    return (n + LOOM_CUDA_ALIGNMENT - 1) / LOOM_CUDA_ALIGNMENT * LOOM_CUDA_ALIGNMENT;
}

static bool fits_int(int64_t v) {
    return v > 0 && v <= INT_MAX;
}

/* ---------------------------------------------------------------- matmul plan */

static loom_status kernel_status(loom__cuda_backend *cb, const loom_tensor *node, int index,
                                 cudaError_t e) {
    if (e == cudaSuccess) return LOOM_OK;
    char call[128];
    snprintf(call, sizeof call, "the %s kernel launch (node %d '%s')", loom_op_name(node->op),
             index, tname(node));
    return loom__cuda_check(e, call, cb->name, __FILE__, __LINE__);
}

typedef struct mm_plan {
    bool blas;     /* cuBLAS; otherwise the dot kernel */
    bool tc;       /* cuBLAS with BF16 inputs and FP32 accumulation (tensor cores) */
    bool a_cached; /* tc: a's BF16 values from the weight cache */
    bool a_direct; /* a is contiguous F32 rows cuBLAS reads in place */
    bool a_all;    /* a converted whole: every batch, [K, M] each, one after another */
    bool b_direct;
    bool c_direct;
    int64_t mc; /* weight rows per panel (M when a_direct or a_all) */
    size_t off_a, off_b, off_c, total;
} mm_plan;

/* The buffer holding t's bytes (its view source's for a view). */
static loom_buffer_t storage_of(const loom_tensor *t) {
    return t->view_src && t->view_src->buffer ? t->view_src->buffer : t->buffer;
}

/* Whether a MUL_MAT through cuBLAS takes the tensor-core path: a is a weight (a tensor of a
 * LOOM_BUFFER_USAGE_WEIGHTS buffer: a KV cache or an activation as a stays exact F32, the
 * rounding of attention scores to BF16 inputs being another matter than that of a weight
 * product) of a 16-bit or block type (F32 weights keep the exact F32 SGEMM: nothing to save
 * by converting them), F32 activations, not LOOM_CUDA_LEGACY_KERNELS. */
static bool mm_tc_eligible(const loom__cuda_backend *cb, const loom_tensor *node) {
    const loom_tensor *a = node->src[0], *b = node->src[1];
    loom_buffer_t abuf = storage_of(a);
    return !cb->legacy_kernels && abuf &&
           loom_buffer_get_usage(abuf) == LOOM_BUFFER_USAGE_WEIGHTS && a->type != LOOM_TYPE_F32 &&
           b->type == LOOM_TYPE_F32 && cu_type_of(a->type) >= 0 && a->type != LOOM_TYPE_I8 &&
           a->type != LOOM_TYPE_I16 && a->type != LOOM_TYPE_I32 && a->type != LOOM_TYPE_I64;
}

/* The path of a MUL_MAT and the scratch it needs (graph_compute sizes the scratch from
 * the same function, for both values of cached, so the two always agree). cached: a's
 * BF16 values are in the weight cache. */
static mm_plan mm_plan_of(const loom__cuda_backend *cb, const loom_tensor *node, bool cached) {
    const loom_tensor *a = node->src[0], *b = node->src[1];
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int64_t B2 = b->ne[2], B3 = b->ne[3];
    mm_plan p;
    memset(&p, 0, sizeof p);
    p.blas = N > LOOM_CUDA_MMV_MAX_N && fits_int(K) && fits_int(M) && fits_int(N);
    if (!p.blas) return p;
    p.c_direct = node->nb[0] == sizeof(float) && node->nb[1] % sizeof(float) == 0 &&
                 (int64_t)(node->nb[1] / sizeof(float)) >= M &&
                 fits_int((int64_t)(node->nb[1] / sizeof(float)));
    const size_t whole_h =
        (size_t)K * (size_t)M * (size_t)a->ne[2] * (size_t)a->ne[3] * sizeof(uint16_t);
    if (mm_tc_eligible(cb, node) && (cached || whole_h <= cb->panel_bytes)) {
        /* BF16: a (cached, or converted whole), b as a contiguous BF16 copy */
        p.tc = true;
        p.a_cached = cached;
        p.a_all = true;
        p.mc = M;
        size_t off = 0;
        if (!cached) {
            p.off_a = off;
            off += align_up(whole_h);
        }
        p.off_b = off;
        off += align_up((size_t)(K * N * B2 * B3) * sizeof(uint16_t));
        if (!p.c_direct) {
            p.off_c = off;
            off += align_up((size_t)(M * N * B2 * B3) * sizeof(float));
        }
        p.total = off;
        return p;
    }
    p.a_direct = a->type == LOOM_TYPE_F32 && a->nb[0] == sizeof(float) &&
                 a->nb[1] % sizeof(float) == 0 && (int64_t)(a->nb[1] / sizeof(float)) >= K &&
                 fits_int((int64_t)(a->nb[1] / sizeof(float)));
    p.b_direct = b->nb[0] == sizeof(float) && b->nb[1] % sizeof(float) == 0 &&
                 (int64_t)(b->nb[1] / sizeof(float)) >= K &&
                 fits_int((int64_t)(b->nb[1] / sizeof(float)));
    int64_t mc = M;
    const size_t whole =
        (size_t)K * (size_t)M * (size_t)a->ne[2] * (size_t)a->ne[3] * sizeof(float);
    if (!p.a_direct && whole <= cb->panel_bytes) {
        p.a_all = true;
    } else if (!p.a_direct) {
        mc = (int64_t)(cb->panel_bytes / ((size_t)K * sizeof(float)));
        if (mc < 1) mc = 1;
        if (mc > M) mc = M;
    }
    p.mc = mc;
    size_t off = 0;
    if (!p.a_direct) {
        p.off_a = off;
        off += align_up(p.a_all ? whole : (size_t)K * (size_t)mc * sizeof(float));
    }
    if (!p.b_direct) {
        p.off_b = off;
        off += align_up((size_t)(K * N * B2 * B3) * sizeof(float));
    }
    if (!p.c_direct) {
        p.off_c = off;
        off += align_up((size_t)(M * N * B2 * B3) * sizeof(float));
    }
    p.total = off;
    return p;
}

/* ---------------------------------------------------------------- BF16 weight cache */

/* The cache entry of weight a (same address, type, shape and strides), or NULL. */
static loom__cuda_wentry *wcache_find(loom__cuda_backend *cb, const loom_tensor *a) {
    for (int i = 0; i < cb->wcache_n; i++) {
        loom__cuda_wentry *e = &cb->wcache[i];
        if (e->data == a->data && e->type == (int32_t)a->type &&
            memcmp(e->ne, a->ne, sizeof e->ne) == 0 && memcmp(e->nb, a->nb, sizeof e->nb) == 0)
            return e;
    }
    return NULL;
}

/* a's entry when the matmul being run may read it: the graph writes no weights, and the
 * entry holds the values of a's buffer as it is now. */
static const loom__cuda_wentry *wcache_current(loom__cuda_backend *cb, const loom_tensor *a) {
    if (!cb->wcache_graph_ok) return NULL;
    const loom__cuda_wentry *e = wcache_find(cb, a);
    return e && e->version == loom__cuda_buffer_version(storage_of(a)) ? e : NULL;
}

/* Before g runs (eagerly, captured, or replayed): the BF16 copy of every weight its
 * tensor-core matmuls read, converted on the stream when it is new or its buffer was
 * written since (the same memory, so a captured graph reads the new values). Weights are
 * tensors of a LOOM_BUFFER_USAGE_WEIGHTS buffer; a graph that writes into such a buffer
 * uses no cached weight (and the buffers it writes move to a new version). A weight that
 * does not fit the budget, or whose memory cannot be had, is converted per call. */
static loom_status wcache_prepare(loom__cuda_backend *cb, const loom_graph *g) {
    cb->wcache_graph_ok = !cb->legacy_kernels && cb->wcache_budget > 0;
    for (int i = 0; i < g->n_nodes && cb->wcache_graph_ok; i++) {
        const loom_tensor *t = g->nodes[i];
        if (loom_op_is_view(t->op) || loom_nelements(t) == 0) continue;
        loom_buffer_t buf = storage_of(t);
        if (buf && loom_buffer_get_usage(buf) == LOOM_BUFFER_USAGE_WEIGHTS) {
            loom__cuda_buffer_touch(buf);
            cb->wcache_graph_ok = false;
        }
    }
    if (!cb->wcache_graph_ok) return LOOM_OK;
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        if (t->op != LOOM_OP_MUL_MAT || loom_nelements(t) == 0) continue;
        const loom_tensor *a = t->src[0];
        loom_buffer_t buf = storage_of(a);
        if (!buf || loom_buffer_get_usage(buf) != LOOM_BUFFER_USAGE_WEIGHTS ||
            !mm_plan_of(cb, t, true).tc)
            continue;
        loom__cuda_wentry *e = wcache_find(cb, a);
        if (!e) {
            const size_t bytes = (size_t)loom_nelements(a) * sizeof(uint16_t);
            if (bytes > cb->wcache_budget - cb->wcache_bytes) continue;
            if (cb->wcache_n == cb->wcache_cap) {
                const int cap = cb->wcache_cap ? 2 * cb->wcache_cap : 64;
                loom__cuda_wentry *grown = loom_realloc(cb->wcache, (size_t)cap * sizeof *grown);
                if (!grown) continue;
                cb->wcache = grown;
                cb->wcache_cap = cap;
            }
            void *mem = NULL;
            if (cudaMalloc(&mem, bytes) != cudaSuccess) {
                (void)cudaGetLastError();
                LOOM_LOG_DEBUG("%s: no memory to cache weight '%s' in BF16; converted per call",
                               cb->name, tname(a));
                continue;
            }
            e = &cb->wcache[cb->wcache_n++];
            memset(e, 0, sizeof *e);
            e->data = a->data;
            e->type = (int32_t)a->type;
            memcpy(e->ne, a->ne, sizeof e->ne);
            memcpy(e->nb, a->nb, sizeof e->nb);
            e->bf16 = mem;
            e->bytes = bytes;
            e->version = 0; /* no buffer has version 0: filled below */
            cb->wcache_bytes += bytes;
        }
        const uint64_t v = loom__cuda_buffer_version(buf);
        if (e->version == v) continue;
        loom_status s =
            kernel_status(cb, t, i, loom__cu_weights_to_bf16(loom__cu(a), e->bf16, cb->stream));
        if (s != LOOM_OK) return s;
        e->version = v;
        cb->stats.wcache_fills++;
    }
    return LOOM_OK;
}

/* A contiguous F32 descriptor of shape ne at p. */
static loom_cu_t contiguous_f32(void *p, const int64_t *ne) {
    loom_cu_t d;
    memset(&d, 0, sizeof d);
    d.data = p;
    d.type = LOOM_CU_F32;
    size_t nb = sizeof(float);
    for (int i = 0; i < 4; i++) {
        d.ne[i] = ne[i];
        d.nb[i] = (int64_t)nb;
        nb *= (size_t)ne[i];
    }
    return d;
}

/* C = A^T B for every batch through the tensor cores: A the BF16 weights ([K, M] per batch,
 * batches one after another), b converted to contiguous BF16 here, C in place or a
 * temporary. One strided batched GEMM per i3 (per weight batch when both broadcast). */
static loom_status mul_mat_tc(loom__cuda_backend *cb, const loom_tensor *node, int index,
                              const mm_plan *p, const uint16_t *A) {
    const loom_tensor *a = node->src[0], *b = node->src[1];
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int64_t A2 = a->ne[2], B2 = b->ne[2], B3 = b->ne[3];
    const int64_t r2 = B2 / A2, r3 = B3 / a->ne[3];
    char *scratch = cb->scratch;
    loom_cu_t bh = contiguous_f32(scratch + p->off_b, b->ne);
    bh.type = LOOM_CU_BF16;
    for (int i = 0; i < 4; i++)
        bh.nb[i] /= 2;
    loom_status s = kernel_status(cb, node, index, loom__cu_cpy(bh, loom__cu(b), cb->stream));
    if (s != LOOM_OK) return s;
    char *cbase = node->data;
    size_t cnb1 = node->nb[1], cnb2 = node->nb[2], cnb3 = node->nb[3];
    loom_cu_t ctmp;
    if (!p->c_direct) {
        ctmp = contiguous_f32(scratch + p->off_c, node->ne);
        cbase = ctmp.data;
        cnb1 = (size_t)ctmp.nb[1];
        cnb2 = (size_t)ctmp.nb[2];
        cnb3 = (size_t)ctmp.nb[3];
    }
    const float one = 1.0f, zero = 0.0f;
    const int64_t KM = K * M, KN = K * N;
    const long long sc = (long long)(cnb2 / sizeof(float));
    const int ldc = (int)(cnb1 / sizeof(float));
    const uint16_t *Bh = (const uint16_t *)bh.data;
    for (int64_t i3 = 0; i3 < B3 && s == LOOM_OK; i3++) {
        const int64_t i3a = i3 / r3;
        const int64_t groups = (r2 == 1 || A2 == 1) ? 1 : A2;
        const int64_t per = groups == 1 ? B2 : r2;
        for (int64_t gi = 0; gi < groups && s == LOOM_OK; gi++) {
            const uint16_t *Ag = A + (i3a * A2 + gi) * KM;
            const long long stride_a = (groups == 1 && r2 == 1) ? (long long)KM : 0;
            const uint16_t *Bg = Bh + (i3 * B2 + gi * per) * KN;
            float *C = (float *)(cbase + gi * per * (int64_t)cnb2 + i3 * (int64_t)cnb3);
            s = LOOM_CUBLAS_CHECK(cb->name,
                                  cublasGemmStridedBatchedEx(
                                      cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)N, (int)K,
                                      &one, Ag, CUDA_R_16BF, (int)K, stride_a, Bg, CUDA_R_16BF,
                                      (int)K, (long long)KN, &zero, C, CUDA_R_32F, ldc, sc,
                                      (int)per, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            cb->stats.cublas_calls++;
            cb->stats.tc_gemms++;
        }
    }
    if (s == LOOM_OK && !p->c_direct)
        s = kernel_status(cb, node, index, loom__cu_cpy(loom__cu(node), ctmp, cb->stream));
    return s;
}

static loom_status mul_mat(loom__cuda_backend *cb, const loom_tensor *node, int index) {
    const loom_tensor *a = node->src[0], *b = node->src[1];
    const loom__cuda_wentry *we = wcache_current(cb, a);
    const mm_plan p = mm_plan_of(cb, node, we != NULL);
    if (!p.blas)
        return kernel_status(cb, node, index,
                             loom__cu_mul_mat_vec(loom__cu(node), loom__cu(a), loom__cu(b),
                                                  cb->legacy_kernels, cb->stream));
    if (p.tc) {
        const uint16_t *A = NULL;
        if (p.a_cached) {
            A = we->bf16;
            cb->stats.wcache_hits++;
        } else {
            uint16_t *conv = (uint16_t *)((char *)cb->scratch + p.off_a);
            loom_status s = kernel_status(cb, node, index,
                                          loom__cu_weights_to_bf16(loom__cu(a), conv, cb->stream));
            if (s != LOOM_OK) return s;
            A = conv;
        }
        return mul_mat_tc(cb, node, index, &p, A);
    }
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int64_t A2 = a->ne[2], A3 = a->ne[3];
    const int64_t r2 = b->ne[2] / A2, r3 = b->ne[3] / A3;
    char *scratch = cb->scratch;
    loom_status s = LOOM_OK;

    /* b: in place, or a contiguous copy */
    const char *bbase = b->data;
    size_t bnb1 = b->nb[1], bnb2 = b->nb[2], bnb3 = b->nb[3];
    if (!p.b_direct) {
        loom_cu_t bc = contiguous_f32(scratch + p.off_b, b->ne);
        s = kernel_status(cb, node, index, loom__cu_cpy(bc, loom__cu(b), cb->stream));
        if (s != LOOM_OK) return s;
        bbase = bc.data;
        bnb1 = (size_t)bc.nb[1];
        bnb2 = (size_t)bc.nb[2];
        bnb3 = (size_t)bc.nb[3];
    }
    /* the result: in place, or a contiguous temporary copied out at the end */
    char *cbase = node->data;
    size_t cnb1 = node->nb[1], cnb2 = node->nb[2], cnb3 = node->nb[3];
    loom_cu_t ctmp;
    if (!p.c_direct) {
        ctmp = contiguous_f32(scratch + p.off_c, node->ne);
        cbase = ctmp.data;
        cnb1 = (size_t)ctmp.nb[1];
        cnb2 = (size_t)ctmp.nb[2];
        cnb3 = (size_t)ctmp.nb[3];
    }
    const float one = 1.0f, zero = 0.0f;
    const int ldb = (int)(bnb1 / sizeof(float)), ldc = (int)(cnb1 / sizeof(float));
    if (p.a_direct || p.a_all) {
        /* every weight batch readable at once: one strided batched GEMM per i3 (or per
         * (i3, weight batch) when both broadcast) */
        float *conv = (float *)(scratch + p.off_a);
        const int64_t KM = K * M;
        for (int64_t i3a = 0; p.a_all && i3a < A3 && s == LOOM_OK; i3a++)
            for (int64_t i2a = 0; i2a < A2 && s == LOOM_OK; i2a++)
                s = kernel_status(cb, node, index,
                                  loom__cu_weights_to_f32(loom__cu(a), i2a, i3a, 0, M,
                                                          conv + (i3a * A2 + i2a) * KM,
                                                          cb->stream));
        const int lda = p.a_direct ? (int)(a->nb[1] / sizeof(float)) : (int)K;
        const long long sa = p.a_direct ? (long long)(a->nb[2] / sizeof(float)) : (long long)KM;
        const long long sb = (long long)(bnb2 / sizeof(float)),
                        sc = (long long)(cnb2 / sizeof(float));
        const int64_t B2 = b->ne[2], B3 = b->ne[3];
        for (int64_t i3 = 0; i3 < B3 && s == LOOM_OK; i3++) {
            const int64_t i3a = i3 / r3;
            /* r2 == 1: batch i2 reads weight batch i2; A2 == 1: all read batch 0 */
            const int64_t groups = (r2 == 1 || A2 == 1) ? 1 : A2;
            const int64_t per = groups == 1 ? B2 : r2;
            for (int64_t gi = 0; gi < groups && s == LOOM_OK; gi++) {
                const float *A =
                    p.a_direct ? (const float *)((const char *)a->data + gi * (int64_t)a->nb[2] +
                                                 i3a * (int64_t)a->nb[3])
                               : conv + (i3a * A2 + gi) * KM;
                const long long stride_a = (groups == 1 && r2 == 1) ? sa : 0;
                const float *B =
                    (const float *)(bbase + gi * per * (int64_t)bnb2 + i3 * (int64_t)bnb3);
                float *C = (float *)(cbase + gi * per * (int64_t)cnb2 + i3 * (int64_t)cnb3);
                s = LOOM_CUBLAS_CHECK(cb->name, cublasSgemmStridedBatched(
                                                    cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M,
                                                    (int)N, (int)K, &one, A, lda, stride_a, B, ldb,
                                                    sb, &zero, C, ldc, sc, (int)per));
                cb->stats.cublas_calls++;
            }
        }
        if (s == LOOM_OK && !p.c_direct)
            s = kernel_status(cb, node, index, loom__cu_cpy(loom__cu(node), ctmp, cb->stream));
        return s;
    }
    /* weights too large to convert whole: panels of rows, one GEMM per batch and panel */
    for (int64_t i3a = 0; i3a < A3 && s == LOOM_OK; i3a++) {
        for (int64_t i2a = 0; i2a < A2 && s == LOOM_OK; i2a++) {
            for (int64_t m0 = 0; m0 < M && s == LOOM_OK; m0 += p.mc) {
                const int64_t mcur = M - m0 < p.mc ? M - m0 : p.mc;
                const float *A;
                int lda;
                if (p.a_direct) {
                    A = (const float *)((const char *)a->data + i2a * (int64_t)a->nb[2] +
                                        i3a * (int64_t)a->nb[3] + m0 * (int64_t)a->nb[1]);
                    lda = (int)(a->nb[1] / sizeof(float));
                } else {
                    float *panel = (float *)(scratch + p.off_a);
                    s = kernel_status(cb, node, index,
                                      loom__cu_weights_to_f32(loom__cu(a), i2a, i3a, m0, mcur,
                                                              panel, cb->stream));
                    A = panel;
                    lda = (int)K;
                }
                for (int64_t i3 = i3a * r3; i3 < (i3a + 1) * r3 && s == LOOM_OK; i3++) {
                    for (int64_t i2 = i2a * r2; i2 < (i2a + 1) * r2 && s == LOOM_OK; i2++) {
                        const float *B =
                            (const float *)(bbase + i2 * (int64_t)bnb2 + i3 * (int64_t)bnb3);
                        float *C = (float *)(cbase + i2 * (int64_t)cnb2 + i3 * (int64_t)cnb3) + m0;
                        /* C[m, n] = sum_k A[k, m] B[k, n]: A is K x mcur column-major */
                        s = LOOM_CUBLAS_CHECK(cb->name,
                                              cublasSgemm(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N,
                                                          (int)mcur, (int)N, (int)K, &one, A, lda,
                                                          B, ldb, &zero, C, ldc));
                        cb->stats.cublas_calls++;
                    }
                }
            }
        }
    }
    if (s == LOOM_OK && !p.c_direct)
        s = kernel_status(cb, node, index, loom__cu_cpy(loom__cu(node), ctmp, cb->stream));
    return s;
}

/* ---------------------------------------------------------------- one node */

static loom_status run_node(loom__cuda_backend *cb, loom_tensor *t, int index) {
    const loom_tensor *a = t->src[0], *b = t->src[1], *c = t->src[2];
    cudaStream_t st = cb->stream;
    loom_cu_err *err = cb->err_dev;
    cudaError_t e = cudaSuccess;
    switch (t->op) {
    case LOOM_OP_DUP:
    case LOOM_OP_CONT:
    case LOOM_OP_CPY:
        e = loom__cu_cpy(loom__cu(t), loom__cu(a), st);
        break;
    case LOOM_OP_ADD:
    case LOOM_OP_SUB:
    case LOOM_OP_MUL:
    case LOOM_OP_DIV: {
        const int op = t->op == LOOM_OP_ADD   ? LOOM_CU_ADD
                       : t->op == LOOM_OP_SUB ? LOOM_CU_SUB
                       : t->op == LOOM_OP_MUL ? LOOM_CU_MUL
                                              : LOOM_CU_DIV;
        e = loom__cu_binary(op, loom__cu(t), loom__cu(a), loom__cu(b), st);
        break;
    }
    case LOOM_OP_ADD_ID:
        e = loom__cu_add_id(loom__cu(t), loom__cu(a), loom__cu(b), loom__cu(c), err, index, st);
        break;
    case LOOM_OP_SCALE:
        e = loom__cu_map(LOOM_CU_SCALE, loom_get_op_params_f32(t, 0), loom_get_op_params_f32(t, 1),
                         loom__cu(t), loom__cu(a), st);
        break;
    case LOOM_OP_CLAMP:
        e = loom__cu_map(LOOM_CU_CLAMP, loom_get_op_params_f32(t, 0), loom_get_op_params_f32(t, 1),
                         loom__cu(t), loom__cu(a), st);
        break;
    case LOOM_OP_SQR:
        e = loom__cu_map(LOOM_CU_SQR, 0.0f, 0.0f, loom__cu(t), loom__cu(a), st);
        break;
    case LOOM_OP_SQRT:
        e = loom__cu_map(LOOM_CU_SQRT, 0.0f, 0.0f, loom__cu(t), loom__cu(a), st);
        break;
    case LOOM_OP_UNARY: {
        const int u = loom_get_op_params_i32(t, 0);
        const int op = u == LOOM_UNARY_SILU   ? LOOM_CU_SILU
                       : u == LOOM_UNARY_GELU ? LOOM_CU_GELU
                                              : LOOM_CU_RELU;
        e = loom__cu_map(op, 0.0f, 0.0f, loom__cu(t), loom__cu(a), st);
        break;
    }
    case LOOM_OP_GLU:
        e = loom__cu_glu(
            loom_get_op_params_i32(t, 0) == LOOM_GLU_SWIGLU ? LOOM_CU_SWIGLU : LOOM_CU_GEGLU,
            loom_get_op_params_i32(t, 1) != 0, loom__cu(t), loom__cu(a), loom__cu(b), st);
        break;
    case LOOM_OP_FILL:
        e = loom__cu_fill(loom_get_op_params_f32(t, 0), loom__cu(t), st);
        break;
    case LOOM_OP_SUM_ROWS:
    case LOOM_OP_MEAN:
        e = loom__cu_reduce_rows(t->op == LOOM_OP_MEAN, loom__cu(t), loom__cu(a), st);
        break;
    case LOOM_OP_ARGMAX:
        e = loom__cu_argmax(loom__cu(t), loom__cu(a), st);
        break;
    case LOOM_OP_NORM:
    case LOOM_OP_RMS_NORM:
        e = loom__cu_norm(t->op == LOOM_OP_RMS_NORM, loom_get_op_params_f32(t, 0), loom__cu(t),
                          loom__cu(a), st);
        break;
    case LOOM_OP_SOFT_MAX:
        e = loom__cu_soft_max(loom_get_op_params_f32(t, 0), loom_get_op_params_f32(t, 1),
                              loom__cu(t), loom__cu(a), loom__cu(b), loom__cu(c), st);
        break;
    case LOOM_OP_ARGSORT:
        e = loom__cu_argsort(loom_get_op_params_i32(t, 0) == LOOM_SORT_DESC, a->ne[0], loom__cu(t),
                             loom__cu(a), cb->scratch, cb->scratch_size, st);
        break;
    case LOOM_OP_TOP_K:
        e = loom__cu_argsort(1, t->ne[0], loom__cu(t), loom__cu(a), cb->scratch, cb->scratch_size,
                             st);
        break;
    case LOOM_OP_ROPE:
        e = loom__cu_rope(loom_get_op_params_i32(t, 0),
                          loom_get_op_params_i32(t, 1) == LOOM_ROPE_TYPE_NEOX,
                          loom_get_op_params_f32(t, 2), loom_get_op_params_f32(t, 3), loom__cu(t),
                          loom__cu(a), loom__cu(b), loom__cu(c), st);
        break;
    case LOOM_OP_GET_ROWS:
        e = loom__cu_get_rows(loom__cu(t), loom__cu(a), loom__cu(b), err, index, st);
        break;
    case LOOM_OP_SET_ROWS:
        e = loom__cu_set_rows(loom__cu(t), loom__cu(a), loom__cu(b), err, index, st);
        break;
    case LOOM_OP_CONCAT:
        e = loom__cu_concat(loom_get_op_params_i32(t, 0), loom__cu(t), loom__cu(a), loom__cu(b),
                            st);
        break;
    case LOOM_OP_MUL_MAT:
        return mul_mat(cb, t, index);
    case LOOM_OP_MUL_MAT_ID:
        e = loom__cu_mul_mat_id(loom__cu(t), loom__cu(a), loom__cu(b), loom__cu(c), cb->scratch,
                                err, index, cb->legacy_kernels, st);
        break;
    case LOOM_OP_FLASH_ATTN_EXT: {
        const size_t need = loom__cu_flash_attn_scratch(a->ne, b->ne, c->ne, cb->legacy_kernels);
        if (need > 0 && need <= cb->scratch_size) cb->stats.fa_split_launches++;
        e = loom__cu_flash_attn(loom_get_op_params_f32(t, 0), loom_get_op_params_f32(t, 1),
                                loom_get_op_params_f32(t, 2), loom__cu(t), loom__cu(a), loom__cu(b),
                                loom__cu(c), loom__cu(t->src[3]), loom__cu(t->src[4]),
                                (float *)cb->scratch, cb->scratch_size, cb->legacy_kernels, st);
        break;
    }
    default:
        return LOOM_OK; /* views: nothing to compute */
    }
    return kernel_status(cb, t, index, e);
}

static loom_status run_nodes(loom__cuda_backend *cb, loom_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        loom_tensor *t = g->nodes[i];
        if (loom_op_is_view(t->op) || loom_nelements(t) == 0) continue;
        loom_status s = run_node(cb, t, i);
        if (s != LOOM_OK) return s;
    }
    return LOOM_OK;
}

/* ---------------------------------------------------------------- validation */

static loom_status unsupported(const loom__cuda_backend *cb, const loom_tensor *t, int index) {
    char types[160];
    int n = 0;
    types[0] = 0;
    for (int i = 0; i < LOOM_MAX_SRC && n < (int)sizeof types - 16; i++) {
        if (!t->src[i]) continue;
        n += snprintf(types + n, sizeof types - (size_t)n, "%s%s", n ? ", " : "",
                      loom_type_is_valid((int)t->src[i]->type) ? loom_type_name(t->src[i]->type)
                                                               : "?");
    }
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "%s: op %s (node %d '%s') is not supported for sources (%s) -> %s", cb->name,
                      (unsigned)t->op < LOOM_OP_COUNT ? loom_op_name(t->op) : "?", index, tname(t),
                      types, loom_type_is_valid((int)t->type) ? loom_type_name(t->type) : "?");
}

static loom_status bad_shape(const loom__cuda_backend *cb, const loom_tensor *t, const char *what) {
    return loom_error(LOOM_ERR_SHAPE, "%s: op %s (tensor '%s'): %s", cb->name, loom_op_name(t->op),
                      tname(t), what);
}

static bool same_ne(const loom_tensor *a, const loom_tensor *b) {
    return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2] &&
           a->ne[3] == b->ne[3];
}

/* Shape rules whose violation would make a kernel read or write out of bounds (the
 * builders enforce them; a hand-made node might not). The CPU oracle's rules. */
static loom_status check_shapes(const loom__cuda_backend *cb, const loom_tensor *t) {
    const loom_tensor *a = t->src[0], *b = t->src[1], *c = t->src[2];
    switch (t->op) {
    case LOOM_OP_DUP:
    case LOOM_OP_CONT:
    case LOOM_OP_CPY:
        if (loom_nelements(a) != loom_nelements(t))
            return bad_shape(cb, t, "element counts differ");
        break;
    case LOOM_OP_ADD:
    case LOOM_OP_SUB:
    case LOOM_OP_MUL:
    case LOOM_OP_DIV:
        if (!same_ne(a, t) || !loom_can_repeat(b, a))
            return bad_shape(cb, t, "b does not repeat into a");
        break;
    case LOOM_OP_ADD_ID:
        if (!same_ne(a, t) || b->ne[0] != a->ne[0] || c->ne[0] != a->ne[1] || c->ne[1] != a->ne[2])
            return bad_shape(cb, t, "expected a [n,U,T], b [n,E], ids [U,T]");
        break;
    case LOOM_OP_MUL_MAT:
        if (a->ne[0] != b->ne[0] || t->ne[0] != a->ne[1] || t->ne[1] != b->ne[1] ||
            t->ne[2] != b->ne[2] || t->ne[3] != b->ne[3] || a->ne[2] <= 0 || a->ne[3] <= 0 ||
            b->ne[2] % a->ne[2] != 0 || b->ne[3] % a->ne[3] != 0)
            return bad_shape(cb, t, "expected a [K,M,A2,A3] x b [K,N,B2,B3] -> [M,N,B2,B3]");
        break;
    case LOOM_OP_MUL_MAT_ID:
        if (a->ne[0] != b->ne[0] || t->ne[0] != a->ne[1] || c->ne[0] != t->ne[1] ||
            c->ne[1] != t->ne[2] || b->ne[2] != t->ne[2] || b->ne[1] <= 0 ||
            (b->ne[1] != 1 && b->ne[1] != c->ne[0]))
            return bad_shape(cb, t, "expected as [K,M,E], b [K,U or 1,T], ids [U,T] -> [M,U,T]");
        if (a->ne[2] >= INT32_MAX || t->ne[1] * t->ne[2] >= INT32_MAX) /* 32-bit buckets */
            return bad_shape(cb, t, "more than 2^31 - 1 experts or routed (u, t) pairs");
        break;
    case LOOM_OP_GET_ROWS:
        if (t->ne[0] != a->ne[0] || t->ne[1] != b->ne[0] || t->ne[2] != b->ne[1] ||
            t->ne[3] != b->ne[2] || a->ne[2] <= 0 || a->ne[3] <= 0 || b->ne[1] % a->ne[2] != 0 ||
            b->ne[2] % a->ne[3] != 0)
            return bad_shape(cb, t, "expected a [n,R,A2,A3], ids [X,B1,B2] -> [n,X,B1,B2]");
        break;
    case LOOM_OP_SET_ROWS:
        if (t->ne[0] != a->ne[0] || b->ne[0] != a->ne[1] || b->ne[1] != a->ne[2] ||
            b->ne[2] != a->ne[3] || a->ne[2] <= 0 || a->ne[3] <= 0 || t->ne[2] % a->ne[2] != 0 ||
            t->ne[3] % a->ne[3] != 0)
            return bad_shape(cb, t, "expected dst [n,R,D2,D3], b [n,X,B2,B3], ids [X,B2,B3]");
        break;
    case LOOM_OP_SOFT_MAX:
        if (!same_ne(a, t)) return bad_shape(cb, t, "result shape differs from a");
        if (b && (b->ne[0] != a->ne[0] || b->ne[1] < a->ne[1] || b->ne[2] <= 0 || b->ne[3] <= 0 ||
                  a->ne[2] % b->ne[2] != 0 || a->ne[3] % b->ne[3] != 0))
            return bad_shape(cb, t, "mask must be [ne0, >= ne1, ne2 or 1, ne3 or 1]");
        if (c && loom_nelements(c) < a->ne[2]) return bad_shape(cb, t, "sinks need ne2 values");
        break;
    case LOOM_OP_ROPE: {
        int n_dims = loom_get_op_params_i32(t, 0);
        if (!same_ne(a, t) || b->ne[0] < a->ne[2] || n_dims < 0 || n_dims % 2 || n_dims > a->ne[0])
            return bad_shape(cb, t, "expected a [D,H,T], pos [T], even n_dims <= D");
        if (c && loom_nelements(c) < n_dims / 2)
            return bad_shape(cb, t, "freq_factors need n_dims/2 values");
        break;
    }
    case LOOM_OP_FLASH_ATTN_EXT: {
        const loom_tensor *k = b, *v = c, *mask = t->src[3], *sinks = t->src[4];
        if (k->ne[0] != a->ne[0] || v->ne[1] != k->ne[1] || k->ne[2] <= 0 ||
            a->ne[2] % k->ne[2] != 0 || v->ne[2] != k->ne[2] || k->ne[3] != a->ne[3] ||
            v->ne[3] != a->ne[3] || t->ne[0] != v->ne[0] || t->ne[1] != a->ne[2] ||
            t->ne[2] != a->ne[1] || t->ne[3] != a->ne[3])
            return bad_shape(cb, t, "expected q [D,Nq,H,S], k [D,Nkv,Hk,S], v [Dv,Nkv,Hk,S]");
        if (mask &&
            (mask->ne[0] < k->ne[1] || mask->ne[1] < a->ne[1] || mask->ne[2] <= 0 ||
             mask->ne[3] <= 0 || a->ne[2] % mask->ne[2] != 0 || a->ne[3] % mask->ne[3] != 0))
            return bad_shape(cb, t, "mask must be [Nkv, >= Nq, 1, 1]");
        if (sinks && loom_nelements(sinks) < a->ne[2])
            return bad_shape(cb, t, "sinks need H values");
        break;
    }
    case LOOM_OP_CONCAT: {
        int dim = loom_get_op_params_i32(t, 0);
        if (dim < 0 || dim >= LOOM_MAX_DIMS) return bad_shape(cb, t, "bad concat dim");
        for (int d = 0; d < LOOM_MAX_DIMS; d++) {
            int64_t want = d == dim ? a->ne[d] + b->ne[d] : a->ne[d];
            if (t->ne[d] != want || (d != dim && b->ne[d] != a->ne[d]))
                return bad_shape(cb, t, "a and b must agree except along dim");
        }
        break;
    }
    case LOOM_OP_GLU:
        if (b && (!same_ne(a, b) || !same_ne(a, t)))
            return bad_shape(cb, t, "split GLU needs equal shapes");
        if (!b && (a->ne[0] != 2 * t->ne[0] || a->ne[1] != t->ne[1] || a->ne[2] != t->ne[2] ||
                   a->ne[3] != t->ne[3]))
            return bad_shape(cb, t, "fused GLU needs a [2n, ...] -> [n, ...]");
        break;
    case LOOM_OP_ARGSORT:
        if (!same_ne(a, t)) return bad_shape(cb, t, "result shape differs from a");
        break;
    case LOOM_OP_TOP_K:
        if (t->ne[0] < 1 || t->ne[0] > a->ne[0] || t->ne[1] != a->ne[1] || t->ne[2] != a->ne[2] ||
            t->ne[3] != a->ne[3])
            return bad_shape(cb, t, "need 1 <= k <= ne0");
        break;
    case LOOM_OP_ARGMAX:
        if (loom_nelements(t) != loom_nrows(a))
            return bad_shape(cb, t, "result needs one value per row");
        break;
    case LOOM_OP_SUM_ROWS:
    case LOOM_OP_MEAN:
        if (t->ne[0] != 1 || t->ne[1] != a->ne[1] || t->ne[2] != a->ne[2] || t->ne[3] != a->ne[3])
            return bad_shape(cb, t, "result must be [1, ne1, ne2, ne3]");
        break;
    case LOOM_OP_FILL:
        break;
    default:
        if (a && !same_ne(a, t)) return bad_shape(cb, t, "result shape differs from a");
        break;
    }
    return LOOM_OK;
}

/* The kernels load elements with their natural alignment (quantised blocks are read
 * bytewise: any address, so 17-byte MXFP4 rows need no padding). */
static bool aligned_ok(const loom_tensor *t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t->type);
    if (!tr) return false;
    const size_t al = tr->is_quantized ? 1 : tr->type_size;
    if (al <= 1) return true;
    if ((uintptr_t)t->data % al) return false;
    for (int i = 0; i < LOOM_MAX_DIMS; i++)
        if (t->ne[i] > 1 && t->nb[i] % al) return false;
    return true;
}

static loom_status check_tensor(const loom__cuda_backend *cb, const loom_tensor *t,
                                const loom_tensor *node, int index) {
    if (loom_nelements(t) == 0) return LOOM_OK;
    if (!t->data) {
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "%s: tensor '%s' (used by node %d '%s') is not allocated", cb->name,
                          tname(t), index, tname(node));
    }
    if (loom__cuda_buffer_dev(t->buffer) != cb->cd) {
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "%s: tensor '%s' (used by node %d '%s') is in %s, which this device "
                          "cannot compute on",
                          cb->name, tname(t), index, tname(node),
                          t->buffer ? loom_buffer_name(t->buffer) : "unmanaged memory");
    }
    if (!aligned_ok(t)) {
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "%s: tensor '%s' (used by node %d '%s') is not aligned to its %s "
                          "elements",
                          cb->name, tname(t), index, tname(node), loom_type_name(t->type));
    }
    return LOOM_OK;
}

/* Everything that can be known before queueing: a misuse fails synchronously, with nothing
 * queued. *scratch gets the scratch bytes the graph needs, *n_work its computing nodes. */
static loom_status validate(const loom__cuda_backend *cb, const loom_graph *g, size_t *scratch,
                            int *n_work) {
    *scratch = 0;
    *n_work = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        if (!t) return loom_error(LOOM_ERR_INVALID_ARG, "%s: graph node %d is NULL", cb->name, i);
        if (!loom__cuda_dev_supports_op(cb->cd, t)) return unsupported(cb, t, i);
        if (loom_op_is_view(t->op) || loom_nelements(t) == 0) continue;
        loom_status s = check_tensor(cb, t, t, i);
        for (int j = 0; j < LOOM_MAX_SRC && s == LOOM_OK; j++) {
            if (t->src[j] && t->op != LOOM_OP_FILL) s = check_tensor(cb, t->src[j], t, i);
        }
        if (s == LOOM_OK) s = check_shapes(cb, t);
        if (s != LOOM_OK) return s;
        (*n_work)++;
        size_t need = 0;
        if (t->op == LOOM_OP_MUL_MAT) { /* with the weight in the BF16 cache or not */
            const size_t n0 = mm_plan_of(cb, t, false).total, n1 = mm_plan_of(cb, t, true).total;
            need = n0 > n1 ? n0 : n1;
        } else if (t->op == LOOM_OP_FLASH_ATTN_EXT) { /* split partials (flash-decoding) */
            need = loom__cu_flash_attn_scratch(t->src[0]->ne, t->src[1]->ne, t->src[2]->ne,
                                               cb->legacy_kernels);
        } else if (t->op == LOOM_OP_MUL_MAT_ID) { /* the routing bucketed by expert */
            need = loom__cu_mul_mat_id_scratch(t->src[0]->ne[2], t->ne[1] * t->ne[2]);
        } else if (t->op == LOOM_OP_ARGSORT || t->op == LOOM_OP_TOP_K) { /* rows beyond a chunk */
            need = loom__cu_argsort_scratch(t->src[0]->ne[0], loom_nrows(t->src[0]));
        }
        if (need > *scratch) *scratch = need;
    }
    return LOOM_OK;
}

/* ---------------------------------------------------------------- graph cache */

/* The cache's release callback (graph-cache.h): a captured graph of this backend. */
void loom__cuda_graph_exec_release(void *exec, void *ud) {
    const char *name = ud;
    (void)LOOM_CUDA_CHECK(name, cudaGraphExecDestroy((cudaGraphExec_t)exec));
}

/* Captures g's launches into a CUDA graph, instantiates and launches it. false (with
 * nothing launched and every error cleared) when the capture did not work out; the caller
 * then runs the graph eagerly. */
static bool capture_and_launch(loom__cuda_backend *cb, loom_graph *g, loom__cuda_gentry *e) {
    const char *fault = getenv("LOOM_CUDA_FAULT"); /* tests: "capture" fails every capture */
    if (fault && strcmp(fault, "capture") == 0) {
        LOOM_LOG_DEBUG("%s: CUDA graph capture failed (injected fault); running eagerly", cb->name);
        e->no_capture = true;
        return false;
    }
    /* begun and ended under the device's lock, with cb->capturing: loom__cuda_dev_order
     * (another host thread's buffer call) never records into this capture */
    pthread_mutex_lock(&cb->cd->mu);
    loom_status bs =
        LOOM_CUDA_CHECK(cb->name, cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeRelaxed));
    cb->capturing = bs == LOOM_OK;
    pthread_mutex_unlock(&cb->cd->mu);
    if (bs != LOOM_OK) {
        LOOM_LOG_DEBUG("%s: no CUDA graph capture: %s", cb->name, loom_last_error());
        return false;
    }
    loom_status rs = run_nodes(cb, g);
    char why[512] = "";
    if (rs != LOOM_OK) snprintf(why, sizeof why, "%s", loom_last_error());
    cudaGraph_t graph = NULL;
    pthread_mutex_lock(&cb->cd->mu);
    loom_status es = LOOM_CUDA_CHECK(cb->name, cudaStreamEndCapture(cb->stream, &graph));
    cb->capturing = false;
    pthread_mutex_unlock(&cb->cd->mu);
    if (es != LOOM_OK && !why[0]) snprintf(why, sizeof why, "%s", loom_last_error());
    cudaGraphExec_t exec = NULL;
    if (rs == LOOM_OK && es == LOOM_OK &&
        LOOM_CUDA_CHECK(cb->name, cudaGraphInstantiate(&exec, graph, 0)) != LOOM_OK) {
        snprintf(why, sizeof why, "%s", loom_last_error());
        exec = NULL;
    }
    if (graph) (void)LOOM_CUDA_CHECK(cb->name, cudaGraphDestroy(graph));
    (void)cudaGetLastError();
    if (!exec) {
        LOOM_LOG_DEBUG("%s: CUDA graph capture failed (%s); running this graph eagerly", cb->name,
                       why);
        e->no_capture = true;
        return false;
    }
    e->exec = exec;
    cb->stats.graph_captures++;
    return true;
}

/* ---------------------------------------------------------------- compute */

static loom_status ensure_scratch(loom__cuda_backend *cb, size_t need) {
    if (need <= cb->scratch_size) return LOOM_OK;
    /* Nothing may still use the old scratch; captured graphs hold its address. */
    loom_status s = LOOM_CUDA_CHECK(cb->name, cudaStreamSynchronize(cb->stream));
    loom__cuda_gcache_clear(cb->gcache);
    if (s == LOOM_OK && cb->scratch) s = LOOM_CUDA_CHECK(cb->name, cudaFree(cb->scratch));
    cb->scratch = NULL;
    cb->scratch_size = 0;
    if (s != LOOM_OK) return s;
    size_t grow = need + need / 4;
    void *p = NULL;
    if (cudaMalloc(&p, grow) != cudaSuccess) {
        (void)cudaGetLastError();
        grow = need;
        s = LOOM_CUDA_CHECK(cb->name, cudaMalloc(&p, grow));
        if (s != LOOM_OK) return s;
    }
    cb->scratch = p;
    cb->scratch_size = grow;
    return LOOM_OK;
}

loom_status loom__cuda_graph_compute(loom_backend_t backend, loom_graph *g) {
    loom__cuda_backend *cb = loom__cuda_backend_of(backend);
    LOOM_ASSERT(cb != NULL);
    if (cb->async_status != LOOM_OK) {
        loom_status pending = cb->async_status;
        const bool reported = cb->async_reported;
        cb->async_status = LOOM_OK;
        cb->async_reported = false;
        /* reported by get_status (the call that waited for it): start clean */
        if (!reported)
            return loom_error(pending, "%s: an earlier operation failed: %s", cb->name,
                              cb->async_msg);
    }
    size_t need = 0;
    int n_work = 0;
    loom_status s = validate(cb, g, &need, &n_work);
    if (s != LOOM_OK) return s;
    cb->stats.graphs++;
    if (n_work == 0) return LOOM_OK;
    cb->graph_seq++;
    {
        const loom_tensor *first = NULL, *last = NULL;
        for (int i = 0; i < g->n_nodes; i++) {
            if (loom_op_is_view(g->nodes[i]->op) || loom_nelements(g->nodes[i]) == 0) continue;
            if (!first) first = g->nodes[i];
            last = g->nodes[i];
        }
        snprintf(cb->last_graph, sizeof cb->last_graph, "graph #%llu (%d nodes, '%s' .. '%s')",
                 (unsigned long long)cb->graph_seq, g->n_nodes, tname(first), tname(last));
    }
    s = LOOM_CUDA_CHECK(cb->name, cudaSetDevice(cb->cd->cuda_id));
    if (s == LOOM_OK) s = ensure_scratch(cb, need);
    if (s == LOOM_OK) s = wcache_prepare(cb, g);
    if (s != LOOM_OK) return s;

    if (cb->graphs_enabled && n_work >= LOOM_CUDA_GRAPH_MIN_NODES) {
        /* seen once: eager now, captured next time; then replayed */
        loom__cuda_gentry *e = loom__cuda_gcache_lookup(cb->gcache, g);
        if (e && !e->exec && !e->no_capture) capture_and_launch(cb, g, e);
        if (e && e->exec) {
            s = LOOM_CUDA_CHECK(cb->name, cudaGraphLaunch((cudaGraphExec_t)e->exec, cb->stream));
            if (s == LOOM_OK) cb->stats.graph_launches++;
            return s;
        }
    }
    return run_nodes(cb, g);
}
