/*
 * The CPU graph executor: which op/type combinations the kernels implement
 * (loom_cpu_supports_op), validation of a graph before it runs, scratch sizing, and the
 * threaded run itself.
 *
 * One loom_threadpool_run covers the whole graph: every thread walks the nodes in the
 * order plan_phases gives them, does its share of each (rows, or output columns for a
 * one-row matmul) and meets the others at a barrier only between phases, where a node
 * needs bytes another thread wrote or may overwrite (README.md, Phases). View ops compute
 * nothing and get no barrier.
 * All scratch is sized up front from every node's needs and allocated once (loom_malloc),
 * so an allocation failure is reported before anything runs and kernels never allocate.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/repack.h"

/* ---------------------------------------------------------------- errors, barrier */

void loom__cpu_barrier(const loom__cpu_params *p) {
    if (p->nth == 1) return;
    loom_threadpool_barrier(p->state->tp);
    ++*p->epoch;
}

void loom__cpu_fail(const loom__cpu_params *p, loom_status s, const char *fmt, ...) {
    int expected = LOOM__CPU_NO_FAIL;
    if (!atomic_compare_exchange_strong(&p->state->fail_epoch, &expected, *p->epoch)) return;
    p->state->status = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->state->message, sizeof p->state->message, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- supported ops */

/* Exactly the contract of docs/ops.md (backends/op-types.c). */
/* K/V types the CPU flash attention reads: floats directly, the KV-cache block types
 * (what SET_ROWS writes) dequantised row by row. */
static bool cpu_fa_kv_type(loom_type t) {
    return t == LOOM_TYPE_F32 || t == LOOM_TYPE_F16 || t == LOOM_TYPE_BF16 || t == LOOM_TYPE_Q8_0 ||
           t == LOOM_TYPE_Q4_0 || t == LOOM_TYPE_Q4_1 || t == LOOM_TYPE_Q5_0 ||
           t == LOOM_TYPE_Q5_1 || t == LOOM_TYPE_IQ4_NL;
}

bool loom_cpu_supports_op(const loom_tensor *op) {
    if (op->op == LOOM_OP_FLASH_ATTN_EXT && op->src[0] && op->src[1] && op->src[2]) {
        /* the shared table takes f32/f16 K/V only (what every backend reads); the CPU
         * also reads a quantised cache, in whole blocks per row */
        const loom_tensor *k = op->src[1], *v = op->src[2], *mask = op->src[3], *sinks = op->src[4];
        return op->src[0]->type == LOOM_TYPE_F32 && op->type == LOOM_TYPE_F32 &&
               cpu_fa_kv_type(k->type) && cpu_fa_kv_type(v->type) &&
               k->ne[0] % loom_blck_size(k->type) == 0 && v->ne[0] % loom_blck_size(v->type) == 0 &&
               (!mask || mask->type == LOOM_TYPE_F32 || mask->type == LOOM_TYPE_F16) &&
               (!sinks || sinks->type == LOOM_TYPE_F32);
    }
    return loom__op_types_ok(op);
}

/* ---------------------------------------------------------------- validation */

static const char *tname(const loom_tensor *t) {
    return t->name[0] ? t->name : "(unnamed)";
}

static loom_status unsupported(const loom_tensor *t) {
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
                      "CPU backend: op %s (tensor '%s') is not implemented for sources (%s) -> %s",
                      (unsigned)t->op < LOOM_OP_COUNT ? loom_op_name(t->op) : "?", tname(t), types,
                      loom_type_is_valid((int)t->type) ? loom_type_name(t->type) : "?");
}

static loom_status bad_shape(const loom_tensor *t, const char *what) {
    return loom_error(LOOM_ERR_SHAPE, "CPU backend: op %s (tensor '%s'): %s", loom_op_name(t->op),
                      tname(t), what);
}

static bool same_ne(const loom_tensor *a, const loom_tensor *b) {
    return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2] &&
           a->ne[3] == b->ne[3];
}

/* Shape rules whose violation would make a kernel read or write out of bounds (the
 * builders enforce them; a hand-made node might not). */
static loom_status check_shapes(const loom_tensor *t) {
    const loom_tensor *a = t->src[0], *b = t->src[1], *c = t->src[2];
    switch (t->op) {
    case LOOM_OP_DUP:
    case LOOM_OP_CONT:
    case LOOM_OP_CPY:
        if (loom_nelements(a) != loom_nelements(t)) return bad_shape(t, "element counts differ");
        break;
    case LOOM_OP_ADD:
    case LOOM_OP_SUB:
    case LOOM_OP_MUL:
    case LOOM_OP_DIV:
        if (!same_ne(a, t) || !loom_can_repeat(b, a))
            return bad_shape(t, "b does not repeat into a");
        break;
    case LOOM_OP_ADD_ID:
        if (!same_ne(a, t) || b->ne[0] != a->ne[0] || c->ne[0] != a->ne[1] || c->ne[1] != a->ne[2])
            return bad_shape(t, "expected a [n,U,T], b [n,E], ids [U,T]");
        break;
    case LOOM_OP_MUL_MAT:
        if (a->ne[0] != b->ne[0] || t->ne[0] != a->ne[1] || t->ne[1] != b->ne[1] ||
            t->ne[2] != b->ne[2] || t->ne[3] != b->ne[3] || a->ne[2] <= 0 || a->ne[3] <= 0 ||
            b->ne[2] % a->ne[2] != 0 || b->ne[3] % a->ne[3] != 0)
            return bad_shape(t, "expected a [K,M,A2,A3] x b [K,N,B2,B3] -> [M,N,B2,B3]");
        break;
    case LOOM_OP_MUL_MAT_ID:
        if (a->ne[0] != b->ne[0] || t->ne[0] != a->ne[1] || c->ne[0] != t->ne[1] ||
            c->ne[1] != t->ne[2] || b->ne[2] != t->ne[2] || b->ne[1] <= 0 ||
            (b->ne[1] != 1 && b->ne[1] != c->ne[0]))
            return bad_shape(t, "expected as [K,M,E], b [K,U or 1,T], ids [U,T] -> [M,U,T]");
        break;
    case LOOM_OP_GET_ROWS:
        if (t->ne[0] != a->ne[0] || t->ne[1] != b->ne[0] || t->ne[2] != b->ne[1] ||
            t->ne[3] != b->ne[2] || b->ne[1] % a->ne[2] != 0 || b->ne[2] % a->ne[3] != 0)
            return bad_shape(t, "expected a [n,R,A2,A3], ids [X,B1,B2] -> [n,X,B1,B2]");
        break;
    case LOOM_OP_SET_ROWS:
        if (t->ne[0] != a->ne[0] || b->ne[0] != a->ne[1] || b->ne[1] != a->ne[2] ||
            b->ne[2] != a->ne[3] || t->ne[2] % a->ne[2] != 0 || t->ne[3] % a->ne[3] != 0)
            return bad_shape(t, "expected dst [n,R,D2,D3], b [n,X,B2,B3], ids [X,B2,B3]");
        break;
    case LOOM_OP_SOFT_MAX:
        if (!same_ne(a, t)) return bad_shape(t, "result shape differs from a");
        if (b && (b->ne[0] != a->ne[0] || b->ne[1] < a->ne[1] || a->ne[2] % b->ne[2] != 0 ||
                  a->ne[3] % b->ne[3] != 0))
            return bad_shape(t, "mask must be [ne0, >= ne1, ne2 or 1, ne3 or 1]");
        if (c && loom_nelements(c) < a->ne[2]) return bad_shape(t, "sinks need ne2 values");
        break;
    case LOOM_OP_ROPE: {
        int n_dims = loom_get_op_params_i32(t, 0);
        if (!same_ne(a, t) || b->ne[0] < a->ne[2] || n_dims < 0 || n_dims % 2 || n_dims > a->ne[0])
            return bad_shape(t, "expected a [D,H,T], pos [T], even n_dims <= D");
        if (c && loom_nelements(c) < n_dims / 2)
            return bad_shape(t, "freq_factors need n_dims/2 values");
        break;
    }
    case LOOM_OP_FLASH_ATTN_EXT: {
        const loom_tensor *k = b, *v = c, *mask = t->src[3], *sinks = t->src[4];
        if (k->ne[0] != a->ne[0] || v->ne[1] != k->ne[1] || k->ne[2] <= 0 ||
            a->ne[2] % k->ne[2] != 0 || v->ne[2] != k->ne[2] || k->ne[3] != a->ne[3] ||
            v->ne[3] != a->ne[3] || t->ne[0] != v->ne[0] || t->ne[1] != a->ne[2] ||
            t->ne[2] != a->ne[1] || t->ne[3] != a->ne[3])
            return bad_shape(t, "expected q [D,Nq,H,S], k [D,Nkv,Hk,S], v [Dv,Nkv,Hk,S]");
        if (mask && (mask->ne[0] < k->ne[1] || mask->ne[1] < a->ne[1] ||
                     a->ne[2] % mask->ne[2] != 0 || a->ne[3] % mask->ne[3] != 0))
            return bad_shape(t, "mask must be [Nkv, >= Nq, 1, 1]");
        if (sinks && loom_nelements(sinks) < a->ne[2]) return bad_shape(t, "sinks need H values");
        break;
    }
    case LOOM_OP_CONCAT: {
        int dim = loom_get_op_params_i32(t, 0);
        if (dim < 0 || dim >= LOOM_MAX_DIMS) return bad_shape(t, "bad concat dim");
        for (int d = 0; d < LOOM_MAX_DIMS; d++) {
            int64_t want = d == dim ? a->ne[d] + b->ne[d] : a->ne[d];
            if (t->ne[d] != want || (d != dim && b->ne[d] != a->ne[d]))
                return bad_shape(t, "a and b must agree except along dim");
        }
        break;
    }
    case LOOM_OP_GLU:
        if (b && (!same_ne(a, b) || !same_ne(a, t)))
            return bad_shape(t, "split GLU needs equal shapes");
        if (!b && (a->ne[0] != 2 * t->ne[0] || a->ne[1] != t->ne[1] || a->ne[2] != t->ne[2] ||
                   a->ne[3] != t->ne[3]))
            return bad_shape(t, "fused GLU needs a [2n, ...] -> [n, ...]");
        break;
    case LOOM_OP_TOP_K: {
        if (t->ne[0] < 1 || t->ne[0] > a->ne[0] || t->ne[1] != a->ne[1] || t->ne[2] != a->ne[2] ||
            t->ne[3] != a->ne[3])
            return bad_shape(t, "need 1 <= k <= ne0");
        break;
    }
    case LOOM_OP_ARGMAX:
        if (loom_nelements(t) != loom_nrows(a))
            return bad_shape(t, "result needs one value per row");
        break;
    case LOOM_OP_SUM_ROWS:
    case LOOM_OP_MEAN:
        if (t->ne[0] != 1 || t->ne[1] != a->ne[1] || t->ne[2] != a->ne[2] || t->ne[3] != a->ne[3])
            return bad_shape(t, "result must be [1, ne1, ne2, ne3]");
        break;
    case LOOM_OP_FILL:
        break;
    default:
        if (a && !same_ne(a, t)) return bad_shape(t, "result shape differs from a");
        break;
    }
    return LOOM_OK;
}

static loom__cpu_kernel_fn kernel_for(const loom_tensor *t) {
    switch (t->op) {
    case LOOM_OP_DUP:
    case LOOM_OP_CONT:
    case LOOM_OP_CPY:
        return loom__cpu_op_dup;
    case LOOM_OP_ADD:
    case LOOM_OP_SUB:
    case LOOM_OP_MUL:
    case LOOM_OP_DIV:
        return loom__cpu_op_binary;
    case LOOM_OP_ADD_ID:
        return loom__cpu_op_add_id;
    case LOOM_OP_SCALE:
    case LOOM_OP_SQR:
    case LOOM_OP_SQRT:
    case LOOM_OP_UNARY:
    case LOOM_OP_CLAMP:
        return loom__cpu_op_unary_map;
    case LOOM_OP_GLU:
        return loom__cpu_op_glu;
    case LOOM_OP_FILL:
        return loom__cpu_op_fill;
    case LOOM_OP_SUM_ROWS:
    case LOOM_OP_MEAN:
        return loom__cpu_op_reduce_rows;
    case LOOM_OP_ARGMAX:
        return loom__cpu_op_argmax;
    case LOOM_OP_NORM:
    case LOOM_OP_RMS_NORM:
        return loom__cpu_op_norm;
    case LOOM_OP_SOFT_MAX:
        return loom__cpu_op_soft_max;
    case LOOM_OP_ARGSORT:
    case LOOM_OP_TOP_K:
        return loom__cpu_op_argsort;
    case LOOM_OP_MUL_MAT:
        return loom__cpu_op_mul_mat;
    case LOOM_OP_MUL_MAT_ID:
        return loom__cpu_op_mul_mat_id;
    case LOOM_OP_GET_ROWS:
        return loom__cpu_op_get_rows;
    case LOOM_OP_SET_ROWS:
        return loom__cpu_op_set_rows;
    case LOOM_OP_ROPE:
        return loom__cpu_op_rope;
    case LOOM_OP_FLASH_ATTN_EXT:
        return loom__cpu_op_flash_attn;
    case LOOM_OP_CONCAT:
        return loom__cpu_op_concat;
    default:
        return NULL;
    }
}

/* Scratch a node needs (see each kernel for the layout). */
static loom__cpu_work node_work(const loom_tensor *t, int nth, const loom__cpu_simd *simd) {
    loom__cpu_work w = {0, 0};
    const loom_tensor *a = t->src[0];
    switch (t->op) {
    case LOOM_OP_DUP:
    case LOOM_OP_CONT:
    case LOOM_OP_CPY:
    case LOOM_OP_GET_ROWS:
    case LOOM_OP_SET_ROWS:
        w.per_thread = ((size_t)t->ne[0] + LOOM_QK8_0) * sizeof(float) * 2;
        break;
    case LOOM_OP_SOFT_MAX:
        w.per_thread = ((size_t)a->ne[0] + 16) * sizeof(float);
        break;
    case LOOM_OP_ARGSORT:
    case LOOM_OP_TOP_K:
        w.per_thread = ((size_t)a->ne[0] + 16) * sizeof(int32_t) * 2;
        break;
    case LOOM_OP_ROPE:
        w.per_thread = ((size_t)a->ne[0] + 16) * sizeof(float);
        break;
    case LOOM_OP_FLASH_ATTN_EXT:
        w = loom__cpu_flash_attn_work(t); /* ops-attn.c */
        break;
    case LOOM_OP_MUL_MAT:
        w = loom__cpu_mul_mat_work(t, nth, simd);
        break;
    case LOOM_OP_MUL_MAT_ID:
        w = loom__cpu_mul_mat_id_work(t, nth, simd);
        break;
    default:
        break;
    }
    return w;
}

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

/* ---------------------------------------------------------------- run */

typedef struct exec_ctx {
    loom_graph *g;
    const int32_t *order; /* [n_steps]: the nodes in the order they run (plan_phases);
                           * NULL: one thread, every node in graph order */
    const uint8_t *flags; /* [n_steps]: EXEC_* of each step */
    int n_steps;
    loom__cpu_state *state;
    char *work;
    size_t shared_size;     /* aligned */
    size_t per_thread_size; /* aligned */
    const loom__cpu_simd *simd;
    char *claims; /* [n_steps] chunk counters, EXEC_CLAIM_STRIDE apart, zeroed before the run */
    bool timed;              /* each thread adds the CPU time it spent in the run to cpu_ns */
    _Atomic int64_t cpu_ns;
    _Atomic bool untimed; /* a thread's clock could not be read: the run is not judged */
} exec_ctx;

/* One cache line per step's chunk counter: the nodes of a phase claim at once. */
#define EXEC_CLAIM_STRIDE 64

/* Nodes cheaper than this (about a few microseconds of one core: multiply-adds of a matmul
 * or attention, elements of anything else) run on one thread alone when the pool has more
 * (thread 0, or the last to arrive at the barrier before them): splitting them costs more
 * in barriers than it saves. */
#define LOOM__CPU_SOLO_COST 32768

static bool node_solo(const loom_tensor *t) {
    const int64_t n = loom_nelements(t);
    int64_t cost = n;
    switch (t->op) {
    case LOOM_OP_MUL_MAT:
    case LOOM_OP_MUL_MAT_ID:
        cost = n * t->src[0]->ne[0];
        break;
    case LOOM_OP_FLASH_ATTN_EXT:
        cost = loom_nelements(t->src[0]) * t->src[1]->ne[1] * 2;
        break;
    default:
        break;
    }
    return cost < LOOM__CPU_SOLO_COST;
}

/* ---------------------------------------------------------------- phases */

/* Per step of the plan: the node runs (always set), on one thread alone (solo), after a
 * barrier, inside the barrier before it (serial: by the last thread to arrive). */
enum { EXEC_RUN = 1, EXEC_SOLO = 2, EXEC_BARRIER = 4, EXEC_SERIAL = 8 };

/* A phase is a run of nodes between two barriers. Two nodes may share one when no thread
 * can see another thread's half-done work: the bytes each writes overlap nothing the other
 * reads or writes (the kernels' shared scratch counts as read and written by each node
 * that uses it), or both run on thread 0 alone (solo), in order. Byte ranges are each
 * tensor's whole extent from its data pointer (loom_nbytes): conservative for strided
 * views, and the allocator's reuse of a buffer shows as an overlap. */
#define EXEC_STACK_NODES 512           /* plans of graphs up to this size live on the stack */
#define EXEC_PHASE_MAX 16              /* unplaced nodes looked at per phase, in graph order */
#define EXEC_RANGES (LOOM_MAX_SRC + 1) /* reads of one node: its sources and the scratch */

typedef struct byte_range {
    uintptr_t lo, hi; /* [lo, hi), empty when lo == hi */
} byte_range;

typedef struct node_ranges {
    byte_range w;              /* the node's own bytes */
    byte_range r[EXEC_RANGES]; /* sources, then the shared scratch */
    int nr;
    bool scratch; /* uses the shared scratch: counts as written too */
    bool solo;
} node_ranges;

static byte_range range_of(const loom_tensor *t) {
    byte_range r = {0, 0};
    if (t && t->data) {
        r.lo = (uintptr_t)t->data;
        r.hi = r.lo + loom_nbytes(t);
    }
    return r;
}

static bool overlap(byte_range a, byte_range b) {
    return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

static bool overlaps_any(byte_range a, const byte_range *rs, int n) {
    for (int i = 0; i < n; i++)
        if (overlap(a, rs[i])) return true;
    return false;
}

static void node_ranges_of(const loom_tensor *t, bool solo, byte_range scratch, node_ranges *nr) {
    nr->w = range_of(t);
    nr->nr = 0;
    nr->solo = solo;
    for (int s = 0; s < LOOM_MAX_SRC; s++)
        if (t->src[s] && t->op != LOOM_OP_FILL) nr->r[nr->nr++] = range_of(t->src[s]);
    nr->scratch = scratch.lo < scratch.hi;
    if (nr->scratch) nr->r[nr->nr++] = scratch;
}

/* Whether nodes a and b may run in either order or at once on different threads: neither
 * writes bytes the other reads or writes (the shared scratch counts as written by both).
 * same_phase: b joins a phase holding a (b runs after a on each thread), so two solo nodes
 * (both on thread 0, in that order) are always compatible. */
static bool independent(const node_ranges *a, const node_ranges *b, byte_range scratch,
                        bool same_phase) {
    if (same_phase && a->solo && b->solo) return true;
    if (a->scratch && b->scratch) return false;
    if (overlap(b->w, a->w) || overlaps_any(b->w, a->r, a->nr) || overlaps_any(a->w, b->r, b->nr))
        return false;
    /* the scratch a writes against what b reads, and the reverse */
    if (a->scratch && (overlap(scratch, b->w) || overlaps_any(scratch, b->r, b->nr))) return false;
    if (b->scratch && (overlap(scratch, a->w) || overlaps_any(scratch, a->r, a->nr))) return false;
    return true;
}

/* A node waiting to be placed in a phase. */
typedef struct pending_node {
    int node;
    node_ranges nr;
} pending_node;

/* Orders the nodes that run into phases: fills order[] (node indices) and flags[] (EXEC_*)
 * per step, returns the steps. Each phase looks at the next EXEC_PHASE_MAX nodes not yet
 * placed, in graph order; a node may pass over others only when compatible with each
 * (they keep their order relative to it). Behind each barrier first come the solo nodes
 * that can go there (EXEC_SERIAL: the last thread to arrive runs them before it releases
 * the others, so serial work between two parallel phases costs one barrier), then every
 * node compatible with the phase so far. E.g. a token's ROPE and cache writes run inside
 * the barrier after their projection, its residual add and norms inside the barrier after
 * the output projection, and the gate and up projections share one phase. */
static int plan_phases(const loom_graph *g, int nth, const loom__cpu_simd *simd,
                       const void *scratch_base, size_t scratch_size, int32_t *order,
                       uint8_t *flags) {
    const byte_range scratch = {(uintptr_t)scratch_base, (uintptr_t)scratch_base + scratch_size};
    pending_node pend[EXEC_PHASE_MAX];
    int np = 0, next = 0, steps = 0;
    for (;;) {
        for (; np < EXEC_PHASE_MAX && next < g->n_nodes; next++) {
            const loom_tensor *t = g->nodes[next];
            if (!kernel_for(t) || loom_nelements(t) == 0) continue;
            const bool solo = nth > 1 && node_solo(t);
            const bool uses_scratch = nth > 1 && node_work(t, nth, simd).shared > 0;
            pend[np].node = next;
            node_ranges_of(t, solo, uses_scratch ? scratch : (byte_range){0, 0}, &pend[np].nr);
            np++;
        }
        if (np == 0) return steps;
        const bool behind_barrier = steps > 0;
        bool serial[EXEC_PHASE_MAX] = {false}, in_phase[EXEC_PHASE_MAX] = {false};
        int first = steps;
        for (int pass = behind_barrier ? 0 : 1; pass < 2; pass++) {
            for (int k = 0; k < np; k++) {
                if (serial[k] || in_phase[k] || (pass == 0 && !pend[k].nr.solo)) continue;
                bool ok = true;
                for (int j = 0; ok && j < np; j++) {
                    if (j == k || serial[j]) continue; /* done before the phase */
                    if (in_phase[j])
                        ok = independent(&pend[j].nr, &pend[k].nr, scratch, true);
                    else if (j < k) /* passed over */
                        ok = independent(&pend[j].nr, &pend[k].nr, scratch, false);
                }
                if (!ok) continue;
                (pass == 0 ? serial : in_phase)[k] = true;
                order[steps] = pend[k].node;
                flags[steps] = (uint8_t)(EXEC_RUN | (pend[k].nr.solo ? EXEC_SOLO : 0) |
                                         (pass == 0 ? EXEC_SERIAL : 0) |
                                         (steps == first && behind_barrier ? EXEC_BARRIER : 0));
                steps++;
            }
        }
        int keep = 0;
        for (int k = 0; k < np; k++)
            if (!serial[k] && !in_phase[k]) pend[keep++] = pend[k];
        np = keep;
    }
}

/* The solo nodes behind a barrier, run by the last thread to arrive (loom_threadpool_barrier_last).
 */
typedef struct serial_run {
    const exec_ctx *x;
    loom__cpu_params solo; /* the arriving thread's scratch, as thread 0 of 1 */
    int s0, s1;            /* steps */
} serial_run;

static void run_serial(void *arg) {
    serial_run *r = arg;
    for (int i = r->s0; i < r->s1 && !loom__cpu_failed(&r->solo); i++) {
        loom_tensor *t = r->x->g->nodes[r->x->order[i]];
        kernel_for(t)(&r->solo, t);
    }
}

static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void exec_steps(int ith, int nth, exec_ctx *x);

/* A thread's part of the run; when timed, the CPU time it got for it (its own clock: exact,
 * where the process clock sees another running thread's time only at its next tick). */
static void exec_worker(int ith, int nth, void *user_data) {
    exec_ctx *x = user_data;
    if (!x->timed) {
        exec_steps(ith, nth, x);
        return;
    }
    const int64_t c0 = thread_cpu_ns();
    exec_steps(ith, nth, x);
    const int64_t c1 = thread_cpu_ns();
    if (c0 < 0 || c1 < 0)
        atomic_store_explicit(&x->untimed, true, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&x->cpu_ns, c1 - c0, memory_order_relaxed);
}

static void exec_steps(int ith, int nth, exec_ctx *x) {
    int epoch = 0;
    loom__cpu_params p = {
        .ith = ith,
        .nth = nth,
        .wshared = x->work,
        .wshared_size = x->shared_size,
        .wthread = x->work ? x->work + x->shared_size + (size_t)ith * x->per_thread_size : NULL,
        .wthread_size = x->per_thread_size,
        .simd = x->simd,
        .state = x->state,
        .epoch = &epoch,
    };
    loom__cpu_params solo = p;
    solo.ith = 0;
    solo.nth = 1;
    if (!x->order) { /* one thread: graph order */
        for (int i = 0; i < x->g->n_nodes && !loom__cpu_failed(&p); i++) {
            loom_tensor *t = x->g->nodes[i];
            if (kernel_for(t) && loom_nelements(t) > 0) kernel_for(t)(&p, t);
        }
        return;
    }
    for (int i = 0; i < x->n_steps; i++) {
        const uint8_t f = x->flags[i];
        loom_tensor *t = x->g->nodes[x->order[i]];
        if (f & EXEC_BARRIER) {
            serial_run r = {.x = x, .solo = solo, .s0 = i, .s1 = i};
            while (r.s1 < x->n_steps && (x->flags[r.s1] & EXEC_SERIAL))
                r.s1++;
            loom_threadpool_barrier_last(x->state->tp, r.s1 > i ? run_serial : NULL, &r);
            ++epoch;
            if (loom__cpu_failed(&p)) return;
            if (r.s1 > i) {
                i = r.s1 - 1;
                continue;
            }
        }
        if (f & EXEC_SOLO) {
            /* after a failure thread 0 skips the rest of the run; all stop at a barrier */
            if (ith == 0 && !loom__cpu_failed(&solo)) kernel_for(t)(&solo, t);
            continue;
        }
        p.claim = (_Atomic int64_t *)(x->claims + (size_t)i * EXEC_CLAIM_STRIDE);
        kernel_for(t)(&p, t);
    }
    /* the caller reads results after loom_threadpool_run returns: no barrier needed here */
}

static loom_status check_node(const loom_tensor *t) {
    if (!loom_cpu_supports_op(t)) return unsupported(t);
    if (loom_op_is_view(t->op) || loom_nelements(t) == 0) return LOOM_OK;
    if (!t->data)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "CPU backend: tensor '%s' (op %s) has no data (not allocated)", tname(t),
                          loom_op_name(t->op));
    for (int s = 0; s < LOOM_MAX_SRC; s++) {
        const loom_tensor *src = t->src[s];
        if (!src || t->op == LOOM_OP_FILL) continue;
        if (!src->data && loom_nelements(src) > 0)
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "CPU backend: source %d '%s' of %s '%s' has no data (not allocated)",
                              s, tname(src), loom_op_name(t->op), tname(t));
    }
    return check_shapes(t);
}

/* ---------------------------------------------------------------- contention */

/* A threaded run is judged when it took at least this long (shorter ones are noise), and
 * counts as contended when its threads together got fewer cores than this over it (each
 * thread's own CPU clock: the process clock sees another running thread's time only at its
 * next tick, which made 2 ms runs on a quiet machine look like one core); this many
 * contended runs in a row start a solo stretch of LOOM__CPU_ADAPT_STRETCH runs, doubled
 * (up to LOOM__CPU_ADAPT_STRETCH_MAX) each time the threaded run after one is contended
 * again. So a quiet machine never leaves its threads (its runs hold ~nth cores), and with
 * one busy process on a 2-core machine a token's graph runs on one thread: its two threads
 * got one core between them and paid a context switch at most barriers for it. */
#define LOOM__CPU_ADAPT_MIN_NS 500000LL
#define LOOM__CPU_ADAPT_MIN_CORES 1.25
#define LOOM__CPU_ADAPT_RUNS 3
#define LOOM__CPU_ADAPT_STRETCH 16
#define LOOM__CPU_ADAPT_STRETCH_MAX 256

static bool adapt_enabled(void) {
    const char *e = getenv("LOOM_CPU_ADAPT");
    return !(e && e[0] == '0' && e[1] == 0);
}

/* After a threaded run of wall_ns in which its threads got cpu_ns of CPU time (< 0: not
 * known, no judgement). */
static void adapt_judge(loom__cpu_adapt *a, int64_t wall_ns, int64_t cpu_ns) {
    if (wall_ns < LOOM__CPU_ADAPT_MIN_NS || cpu_ns < 0) return;
    if ((double)cpu_ns >= LOOM__CPU_ADAPT_MIN_CORES * (double)wall_ns) {
        a->contended = 0;
        a->stretch = LOOM__CPU_ADAPT_STRETCH;
        return;
    }
    if (++a->contended < LOOM__CPU_ADAPT_RUNS) return;
    if (a->stretch < LOOM__CPU_ADAPT_STRETCH) a->stretch = LOOM__CPU_ADAPT_STRETCH;
    a->solo_left = a->stretch;
    a->stretch = a->stretch * 2 < LOOM__CPU_ADAPT_STRETCH_MAX ? a->stretch * 2
                                                               : LOOM__CPU_ADAPT_STRETCH_MAX;
    /* the probe after this stretch decides alone: one more contended run, a longer one */
    a->contended = LOOM__CPU_ADAPT_RUNS - 1;
}

loom_status loom__cpu_graph_compute(loom_graph *g, loom_threadpool *tp, void **work,
                                    size_t *work_size, loom__cpu_adapt *adapt) {
    if (!g) return loom_error(LOOM_ERR_INVALID_ARG, "CPU backend: graph is NULL");
    int nth = tp ? loom_threadpool_size(tp) : 1;
    if (nth < 1) nth = 1;
    const loom__cpu_simd *simd = loom__cpu_simd_get();

    /* a graph of solo nodes only (a token's embedding row, a scheduler's small split) runs
     * on the caller alone: the pool's threads would only be woken to wait at no barrier */
    bool all_solo = true;
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        if (!t) return loom_error(LOOM_ERR_INVALID_ARG, "CPU backend: graph node %d is NULL", i);
        loom_status s = check_node(t);
        if (s != LOOM_OK) return s;
        if (loom_op_is_view(t->op) || loom_nelements(t) == 0 || !kernel_for(t)) continue;
        all_solo = all_solo && node_solo(t);
    }
    if (all_solo) nth = 1;
    if (nth == 1 || (adapt && !adapt_enabled())) adapt = NULL;
    if (adapt && adapt->solo_left > 0) { /* a solo stretch: nothing to judge */
        adapt->solo_left--;
        nth = 1;
        adapt = NULL;
    }
    loom__cpu_repack_graph(g, simd);

    size_t shared = 0, per_thread = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        if (loom_op_is_view(t->op) || loom_nelements(t) == 0) continue;
        loom__cpu_work w = node_work(t, nth, simd);
        if (w.shared > shared) shared = w.shared;
        if (w.per_thread > per_thread) per_thread = w.per_thread;
    }
    shared = align64(shared);
    per_thread = align64(per_thread);
    /* the plan: on the stack for graphs up to EXEC_STACK_NODES nodes, else ahead of the
     * scratch (a graph that needs no scratch allocates nothing) */
    int32_t stack_order[EXEC_STACK_NODES];
    uint8_t stack_flags[EXEC_STACK_NODES];
    const bool plan_in_work = nth > 1 && g->n_nodes > EXEC_STACK_NODES;
    const size_t order_size = align64((size_t)g->n_nodes * sizeof(int32_t));
    const size_t claims_size = nth > 1 ? (size_t)g->n_nodes * EXEC_CLAIM_STRIDE : 0;
    const size_t plan_size =
        (plan_in_work ? order_size + align64((size_t)g->n_nodes) : 0) + claims_size;
    size_t need = plan_size + shared + per_thread * (size_t)nth;
    if (need > *work_size) {
        void *p = loom_malloc(need + 64);
        if (!p)
            return loom_error(LOOM_ERR_NOMEM, "CPU backend: cannot allocate %zu bytes of scratch",
                              need + 64);
        loom_free(*work);
        *work = p;
        *work_size = need;
    }
    /* 64-byte alignment for the packed matmul panels */
    char *base = *work ? (char *)(((uintptr_t)*work + 63) & ~(uintptr_t)63) : NULL;
    char *scratch = base ? base + plan_size : NULL;
    int32_t *order = NULL;
    uint8_t *flags = NULL;
    int n_steps = 0;
    if (nth > 1) {
        order = plan_in_work ? (int32_t *)base : stack_order;
        flags = plan_in_work ? (uint8_t *)base + order_size : stack_flags;
        n_steps = plan_phases(g, nth, simd, scratch, shared, order, flags);
    }
    char *claims = nth > 1 ? scratch - claims_size : NULL; /* just before the scratch */
    if (claims) memset(claims, 0, (size_t)n_steps * EXEC_CLAIM_STRIDE);

    loom__cpu_state state = {.tp = tp, .nth = nth};
    atomic_init(&state.fail_epoch, LOOM__CPU_NO_FAIL);
    exec_ctx x = {
        .g = g,
        .order = order,
        .flags = flags,
        .n_steps = n_steps,
        .state = &state,
        .work = scratch,
        .shared_size = shared,
        .per_thread_size = per_thread,
        .simd = simd,
        .claims = claims,
        .timed = adapt != NULL,
    };
    atomic_init(&x.cpu_ns, 0);
    atomic_init(&x.untimed, false);
    if (nth > 1) {
        const int64_t w0 = adapt ? loom_time_ns() : 0;
        loom_threadpool_run(tp, exec_worker, &x);
        if (adapt)
            adapt_judge(adapt, loom_time_ns() - w0,
                        atomic_load(&x.untimed) ? -1 : atomic_load(&x.cpu_ns));
    } else {
        exec_worker(0, 1, &x);
    }
    if (atomic_load(&state.fail_epoch) != LOOM__CPU_NO_FAIL)
        return loom_error(state.status, "%s", state.message);
    return LOOM_OK;
}

loom_status loom_cpu_graph_compute(loom_graph *g, loom_threadpool *tp) {
    void *work = NULL;
    size_t work_size = 0;
    loom_status s = loom__cpu_graph_compute(g, tp, &work, &work_size, NULL);
    loom_free(work);
    return s;
}
