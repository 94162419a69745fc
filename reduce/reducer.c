/*
 * The reducer object: creation (argument checks, LOOM_ALLREDUCE, events, the p2p probe,
 * the native communicator looked up through the reg), the ladder that picks an algorithm
 * per call, the plan cache, the dispatch, and statistics. The algorithms themselves live
 * in plan.c (ring, butterfly) and host.c (host-staged).
 *
 * The butterfly/ring threshold was measured on sim devices on the project's 2-core build
 * machine with bench:allreduce_bench (see reduce/README.md for the table):
 * the butterfly's log2(N) steps of the whole tensor beat the ring's 2(N-1) steps of
 * 1/N of it while the per-step cost (event, copy and graph dispatch to a device thread)
 * dominates, i.e. for small tensors; the ring wins once bandwidth dominates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "reduce/reduce-impl.h"

/* ---------------------------------------------------------------- names */

static const char *const rd_algo_names[LOOM_ALLREDUCE_COUNT] = {
    [LOOM_ALLREDUCE_AUTO] = "auto", [LOOM_ALLREDUCE_NATIVE] = "native",
    [LOOM_ALLREDUCE_RING] = "ring", [LOOM_ALLREDUCE_BUTTERFLY] = "butterfly",
    [LOOM_ALLREDUCE_HOST] = "host",
};

const char *loom_allreduce_algo_name(loom_allreduce_algo algo) {
    if ((int)algo < 0 || algo >= LOOM_ALLREDUCE_COUNT) return "?";
    return rd_algo_names[algo];
}

loom_status loom_allreduce_algo_parse(const char *s, loom_allreduce_algo *out) {
    LOOM_ASSERT(out != NULL);
    for (int a = 0; s && a < LOOM_ALLREDUCE_COUNT; a++) {
        if (strcasecmp(s, rd_algo_names[a]) == 0) {
            *out = (loom_allreduce_algo)a;
            return LOOM_OK;
        }
    }
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "unknown allreduce algorithm '%s' (expected auto, ring, butterfly, host "
                      "or native)",
                      s ? s : "(null)");
}

/* ---------------------------------------------------------------- thresholds */

/* Largest tensor (bytes) given to the butterfly, by device count: the crossover measured
 * on sim devices with //bench:allreduce_bench --algos ring,butterfly --reps 5
 * (best of 5 per point; 256 KiB, 1, 4 and 16 MiB measured in two runs, 512 KiB, 2 and
 * 8 MiB in one; the 2-core build machine under a load average of 15-17 from other builds;
 * reduce/README.md). Butterfly time / ring time, one figure per run (< 1: butterfly faster):
 *   n  256K       512K  1M         2M    4M         8M    16M        butterfly up to
 *   2  0.10/0.69  0.80  1.51/1.59  2.54  0.55/2.52  1.03  1.39/1.43  512 KiB
 *   3  1.09/0.43  1.36  0.17/0.83  0.75  1.46/0.64  1.23  1.55/1.51  4 MiB
 *   4  0.46/0.57  0.42  0.90/0.54  0.56  0.80/1.82  1.51  3.39/1.85  2 MiB
 *   5  0.34/0.51  0.49  0.75/0.62  0.61  0.97/0.73  1.43  3.26/1.17  4 MiB
 *   6  0.18/0.32  0.27  0.43/0.49  0.77  0.92/0.92  1.29  2.00/1.08  4 MiB
 *   7  0.23/0.22  0.29  2.13/0.37  0.51  0.79/1.01  1.64  1.26/1.02  4 MiB
 *   8  0.40/0.24  0.32  0.49/0.60  1.80  0.94/1.43  2.78  2.82/2.59  1 MiB
 * Per step the sim pays a thread hand-off for each event, copy and add, so the butterfly's
 * few steps win until the ring's smaller volume (2(n-1)/n of the tensor per device instead
 * of log2(n) times it; on 2 cores the total work counts) takes over. Two devices cross early: their
 * ring does half the work per device in just two steps. Beyond 8 devices the 8-device value is
 * used. */
size_t loom_reducer_butterfly_max_bytes(int n) {
    static const size_t measured[9] = {
        0,
        0,
        (size_t)512 << 10, /* 2 */
        (size_t)4 << 20,   /* 3 */
        (size_t)2 << 20,   /* 4 */
        (size_t)4 << 20,   /* 5 */
        (size_t)4 << 20,   /* 6 */
        (size_t)4 << 20,   /* 7 */
        (size_t)1 << 20,   /* 8 */
    };
    if (n < 2) return 0;
    return measured[n > 8 ? 8 : n];
}

/* ---------------------------------------------------------------- helpers */

void loom__rd_sync(loom_reducer *r, int j) {
    loom_backend_synchronize_keep(r->backends[j], &r->sync_status, r->sync_msg, sizeof r->sync_msg);
}

void loom__rd_sync_all(loom_reducer *r) {
    for (int j = 0; j < r->n; j++)
        loom__rd_sync(r, j);
}

loom_status loom__rd_trace_push(loom_reducer *r, uint64_t max_bytes) {
    if (r->trace_len == r->trace_cap) {
        size_t cap = r->trace_cap ? 2 * r->trace_cap : 64;
        uint64_t *t = loom_realloc(r->trace, cap * sizeof *t);
        if (!t) return loom_error(LOOM_ERR_NOMEM, "allreduce: out of host memory (trace)");
        r->trace = t;
        r->trace_cap = cap;
    }
    r->trace[r->trace_len++] = max_bytes;
    return LOOM_OK;
}

loom_reducer_params loom_reducer_params_default(void) {
    loom_reducer_params p;
    memset(&p, 0, sizeof p);
    p.algorithm = LOOM_ALLREDUCE_AUTO;
    p.p2p = LOOM_REDUCE_P2P_PROBE;
    return p;
}

/* Events on every device, or on none (then every "record" synchronises). */
static void rd_events_init(loom_reducer *r) {
    bool ok = true;
    for (int j = 0; j < r->n && ok; j++) {
        loom_backend_t b = r->backends[j];
        ok = b->iface->event_record && b->iface->event_wait;
        if (ok) r->ready[j] = loom_event_new(loom_backend_device(b));
        if (ok) r->done[j] = loom_event_new(loom_backend_device(b));
        ok = ok && r->ready[j] && r->done[j];
    }
    if (ok) return;
    for (int j = 0; j < r->n; j++) {
        loom_event_free(r->ready[j]);
        loom_event_free(r->done[j]);
        r->ready[j] = r->done[j] = NULL;
    }
    LOOM_LOG_DEBUG("allreduce: devices without events: steps synchronise instead");
}

/* Whether every device can copy from every other directly: one 64-byte copy per ordered
 * pair through the destination backend's async copy hook (a NULL hook or a refusal means
 * the wrapper would stage through host memory). */
static loom_status rd_probe_p2p(loom_reducer *r, bool *p2p) {
    const int N = r->n;
    *p2p = true;
    if (N == 1) return LOOM_OK;
    for (int j = 0; j < N; j++) {
        if (!r->backends[j]->iface->cpy_tensor_async) {
            *p2p = false;
            return LOOM_OK;
        }
    }
    loom_ctx_params cp = {.mem_size = (size_t)(2 * N + 4) * loom_tensor_overhead(),
                          .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(cp);
    if (!ctx) return loom_error(LOOM_ERR_NOMEM, "allreduce: out of host memory (p2p probe)");
    loom_buffer_t buf[LOOM_REDUCE_MAX_DEVICES] = {0};
    loom_tensor *src[LOOM_REDUCE_MAX_DEVICES], *dst[LOOM_REDUCE_MAX_DEVICES];
    loom_status s = LOOM_OK;
    for (int j = 0; j < N && s == LOOM_OK; j++) {
        size_t align = loom_buft_alignment(loom_backend_default_buft(r->backends[j]));
        size_t slot = (64 + align - 1) / align * align;
        buf[j] = loom_backend_alloc_buffer(r->backends[j], 2 * slot);
        if (!buf[j]) {
            s = loom_last_status() != LOOM_OK ? loom_last_status() : LOOM_ERR_DEVICE_OOM;
            loom_error(s, "allreduce: cannot allocate the p2p probe on %s: %s",
                       loom_backend_name(r->backends[j]), loom_last_error());
            break;
        }
        loom_buffer_clear(buf[j], 0);
        src[j] = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 16);
        dst[j] = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 16);
        if (!src[j] || !dst[j]) {
            s = loom_last_status();
            break;
        }
        s = loom_buffer_alloc_tensor(buf[j], src[j], 0);
        if (s == LOOM_OK) s = loom_buffer_alloc_tensor(buf[j], dst[j], slot);
    }
    for (int i = 0; i < N && s == LOOM_OK && *p2p; i++) {
        for (int j = 0; j < N && *p2p; j++) {
            if (i == j) continue;
            loom_backend_t bd = r->backends[j];
            *p2p = bd->iface->cpy_tensor_async(r->backends[i], bd, src[i], dst[j]);
        }
    }
    loom__rd_sync_all(r);
    for (int j = 0; j < N; j++)
        loom_buffer_free(buf[j]);
    loom_ctx_free(ctx);
    return s;
}

/* The native communicator: the caller's table, or the reg's when every device shares
 * one reg that exports all three procs. */
static void rd_comm_init(loom_reducer *r, const loom_reducer_params *p) {
    if (p->no_comm || r->n < 2) return;
    loom_comm_iface ci = {0};
    if (p->comm) {
        ci = *p->comm;
    } else {
        loom_reg_t reg = loom_dev_reg(loom_backend_device(r->backends[0]));
        for (int j = 1; j < r->n; j++) {
            if (loom_dev_reg(loom_backend_device(r->backends[j])) != reg) return;
        }
        if (!reg) return;
        ci.init = (loom_comm_init_fn)loom_reg_get_proc_address(reg, LOOM_PROC_COMM_INIT);
        ci.allreduce_tensor =
            (loom_comm_allreduce_tensor_fn)loom_reg_get_proc_address(reg, LOOM_PROC_COMM_ALLREDUCE);
        ci.free = (loom_comm_free_fn)loom_reg_get_proc_address(reg, LOOM_PROC_COMM_FREE);
    }
    if (!ci.init || !ci.allreduce_tensor) return;
    r->comm = ci.init(r->backends, (size_t)r->n);
    if (!r->comm) {
        LOOM_LOG_INFO("allreduce: the native communicator did not initialise; using loom's "
                      "own algorithms");
        return;
    }
    r->comm_iface = ci;
}

/* ---------------------------------------------------------------- lifecycle */

loom_reducer *loom_reducer_new(loom_backend_t *backends, int n, const loom_reducer_params *params) {
    loom_reducer_params p = params ? *params : loom_reducer_params_default();
    if (n < 1 || n > LOOM_REDUCE_MAX_DEVICES) {
        loom_error(LOOM_ERR_INVALID_ARG, "allreduce: %d devices (expected 1..%d)", n,
                   LOOM_REDUCE_MAX_DEVICES);
        return NULL;
    }
    if (!backends) {
        loom_error(LOOM_ERR_INVALID_ARG, "allreduce: NULL backend array");
        return NULL;
    }
    for (int j = 0; j < n; j++) {
        if (!backends[j]) {
            loom_error(LOOM_ERR_INVALID_ARG, "allreduce: backend %d is NULL", j);
            return NULL;
        }
        for (int i = 0; i < j; i++) {
            if (backends[i] == backends[j]) {
                loom_error(LOOM_ERR_INVALID_ARG, "allreduce: backend %d (%s) is also backend %d", j,
                           loom_backend_name(backends[j]), i);
                return NULL;
            }
        }
    }
    if ((int)p.algorithm < 0 || p.algorithm >= LOOM_ALLREDUCE_COUNT) {
        loom_error(LOOM_ERR_INVALID_ARG, "allreduce: bad algorithm %d", (int)p.algorithm);
        return NULL;
    }
    if (p.algorithm == LOOM_ALLREDUCE_AUTO) {
        const char *env = getenv("LOOM_ALLREDUCE");
        if (env && env[0]) {
            loom_allreduce_algo a;
            if (loom_allreduce_algo_parse(env, &a) != LOOM_OK || a == LOOM_ALLREDUCE_NATIVE) {
                loom_error(LOOM_ERR_INVALID_ARG,
                           "LOOM_ALLREDUCE=%s is not an allreduce algorithm (expected auto, "
                           "ring, butterfly or host)",
                           env);
                return NULL;
            }
            p.algorithm = a;
        }
    }

    loom_reducer *r = loom_calloc(1, sizeof *r);
    if (!r) {
        loom_error(LOOM_ERR_NOMEM, "allreduce: out of host memory");
        return NULL;
    }
    r->n = n;
    memcpy(r->backends, backends, (size_t)n * sizeof *backends);
    r->algo = p.algorithm;
    r->butterfly_max =
        p.butterfly_max_bytes ? p.butterfly_max_bytes : loom_reducer_butterfly_max_bytes(n);
    rd_events_init(r);
    if (p.p2p == LOOM_REDUCE_P2P_PROBE) {
        if (rd_probe_p2p(r, &r->p2p) != LOOM_OK) {
            loom_reducer_free(r);
            return NULL;
        }
    } else {
        r->p2p = p.p2p == LOOM_REDUCE_P2P_YES;
    }
    rd_comm_init(r, &p);
    LOOM_LOG_DEBUG("allreduce: %d devices, p2p %s, communicator %s, algorithm %s, butterfly up "
                   "to %zu bytes",
                   n, r->p2p ? "yes" : "no", r->comm ? "yes" : "no",
                   loom_allreduce_algo_name(r->algo), r->butterfly_max);
    return r;
}

void loom_reducer_free(loom_reducer *r) {
    if (!r) return;
    loom__rd_sync_all(r);
    if (r->comm && r->comm_iface.free) r->comm_iface.free(r->comm);
    for (int i = 0; i < LOOM__RD_N_PLANS; i++)
        loom__rd_plan_free(r->plans[i]);
    for (int j = 0; j < r->n; j++) {
        loom_buffer_free(r->scratch[j]);
        loom_event_free(r->ready[j]);
        loom_event_free(r->done[j]);
    }
    loom__rd_host_free(r);
    loom_free(r->trace);
    loom_free(r);
}

int loom_reducer_n_devices(const loom_reducer *r) {
    return r->n;
}
bool loom_reducer_p2p(const loom_reducer *r) {
    return r->p2p;
}
bool loom_reducer_has_comm(const loom_reducer *r) {
    return r->comm != NULL;
}
loom_allreduce_algo loom_reducer_get_algorithm(const loom_reducer *r) {
    return r->algo;
}

void loom_reducer_set_algorithm(loom_reducer *r, loom_allreduce_algo algo) {
    LOOM_ASSERT((int)algo >= 0 && algo < LOOM_ALLREDUCE_COUNT);
    r->algo = algo;
}

loom_allreduce_algo loom_reducer_choose(const loom_reducer *r, size_t nbytes) {
    if (r->n == 1 || nbytes == 0) return LOOM_ALLREDUCE_AUTO;
    if (r->algo != LOOM_ALLREDUCE_AUTO) return r->algo;
    if (r->comm) return LOOM_ALLREDUCE_NATIVE;
    if (!r->p2p) return LOOM_ALLREDUCE_HOST;
    return nbytes <= r->butterfly_max ? LOOM_ALLREDUCE_BUTTERFLY : LOOM_ALLREDUCE_RING;
}

loom_status loom_reducer_synchronize(loom_reducer *r) {
    loom_status first = LOOM_OK;
    char msg[sizeof r->sync_msg] = "";
    for (int j = 0; j < r->n; j++)
        loom_backend_synchronize_keep(r->backends[j], &first, msg, sizeof msg);
    if (first != LOOM_OK) return loom_error(first, "allreduce: a device failed: %s", msg);
    return LOOM_OK;
}

void loom_reducer_get_stats(const loom_reducer *r, loom_reducer_stats *out) {
    *out = r->stats;
}

void loom_reducer_reset_stats(loom_reducer *r) {
    memset(&r->stats, 0, sizeof r->stats);
}

size_t loom_reducer_last_steps(const loom_reducer *r, uint64_t *max_bytes, size_t cap) {
    for (size_t i = 0; i < r->trace_len && i < cap; i++)
        max_bytes[i] = r->trace[i];
    return r->trace_len;
}

/* ---------------------------------------------------------------- the call */

static loom_status rd_check_tensors(const loom_reducer *r, loom_tensor *const *t) {
    if (!t) return loom_error(LOOM_ERR_INVALID_ARG, "allreduce: NULL tensor array");
    for (int j = 0; j < r->n; j++) {
        const loom_tensor *x = t[j];
        if (!x) return loom_error(LOOM_ERR_INVALID_ARG, "allreduce: tensor %d is NULL", j);
        if (x->type != LOOM_TYPE_F32) {
            return loom_error(LOOM_ERR_TYPE, "allreduce: tensor '%s' (device %d) is %s, not f32",
                              x->name, j, loom_type_name(x->type));
        }
        if (!loom_is_contiguous(x)) {
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "allreduce: tensor '%s' (device %d) is not contiguous", x->name, j);
        }
        if (!x->buffer || !x->data) {
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "allreduce: tensor '%s' (device %d) is not allocated", x->name, j);
        }
        for (int i = 0; i < j; i++) {
            const char *a = t[i]->data, *b = x->data;
            size_t na = loom_nbytes(t[i]), nb = loom_nbytes(x);
            if (t[i] == x || (t[i]->buffer == x->buffer && a < b + nb && b < a + na)) {
                return loom_error(LOOM_ERR_INVALID_ARG,
                                  "allreduce: tensors %d and %d overlap in memory", i, j);
            }
        }
        if (!loom_backend_supports_buft(r->backends[j], loom_buffer_buft(x->buffer))) {
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "allreduce: tensor '%s' lives in %s, which %s cannot use", x->name,
                              loom_buffer_name(x->buffer), loom_backend_name(r->backends[j]));
        }
        if (j > 0 && !loom_are_same_shape(x, t[0])) {
            char a[160], b[160];
            loom_tensor_describe(x, a, sizeof a);
            loom_tensor_describe(t[0], b, sizeof b);
            return loom_error(LOOM_ERR_SHAPE,
                              "allreduce: tensor %d (%s) differs from tensor 0 "
                              "(%s)",
                              j, a, b);
        }
    }
    return LOOM_OK;
}

/* A cached plan for these tensors, or a new one (evicting the least recently used). */
static loom__rd_plan *rd_get_plan(loom_reducer *r, loom_allreduce_algo algo, loom_tensor *const *t,
                                  int64_t n_elem) {
    int victim = 0;
    for (int i = 0; i < LOOM__RD_N_PLANS; i++) {
        loom__rd_plan *p = r->plans[i];
        if (!p) {
            victim = i;
            continue;
        }
        if (r->plans[victim] && p->last_use < r->plans[victim]->last_use) victim = i;
        bool hit = p->algo == algo && p->n_elem == n_elem;
        for (int j = 0; j < r->n && hit; j++) {
            hit = p->key_data[j] == t[j]->data && p->key_buf[j] == t[j]->buffer;
        }
        if (hit) {
            for (int j = 0; j < r->n; j++)
                p->key_t[j] = t[j];
            p->last_use = ++r->use_clock;
            return p;
        }
    }
    loom__rd_plan *p = loom__rd_plan_build(r, algo, t, n_elem);
    if (!p) return NULL;
    /* plan_build may have cleared the cache (scratch grew): find a free slot again */
    for (int i = 0; i < LOOM__RD_N_PLANS; i++) {
        if (!r->plans[i]) {
            victim = i;
            break;
        }
    }
    if (r->plans[victim]) { /* in flight maybe: wait before freeing it */
        loom__rd_sync_all(r);
        loom__rd_plan_free(r->plans[victim]);
    }
    r->plans[victim] = p;
    p->last_use = ++r->use_clock;
    return p;
}

static void rd_account(loom_reducer *r, loom_allreduce_algo algo, size_t nbytes, uint64_t moved) {
    r->stats.reductions++;
    r->stats.bytes_reduced += nbytes;
    r->stats.bytes_moved += moved;
    r->stats.by_algo[algo]++;
    r->stats.last_algo = algo;
}

static loom_status rd_allreduce(loom_reducer *r, loom_tensor *const *tensors, const bool *empty) {
    loom_status s = rd_check_tensors(r, tensors);
    if (s != LOOM_OK) return s;
    const int N = r->n;
    const int64_t n_elem = loom_nelements(tensors[0]);
    const size_t nbytes = (size_t)n_elem * sizeof(float);
    r->trace_len = 0;

    loom_allreduce_algo algo = loom_reducer_choose(r, nbytes);
    if (algo == LOOM_ALLREDUCE_AUTO) { /* one device, or nothing to sum */
        for (int j = 0; j < N && nbytes > 0; j++) {
            if (!empty || !empty[j]) continue;
            loom__rd_sync(r, j);
            loom_tensor_memset(tensors[j], 0, 0, nbytes);
        }
        rd_account(r, LOOM_ALLREDUCE_AUTO, nbytes, 0);
        return LOOM_OK;
    }

    if (algo == LOOM_ALLREDUCE_NATIVE) {
        if (!r->comm) {
            return loom_error(LOOM_ERR_UNSUPPORTED,
                              "allreduce: native algorithm forced but the devices have no "
                              "communicator");
        }
        loom__rd_plan *p = rd_get_plan(r, LOOM_ALLREDUCE_NATIVE, tensors, n_elem);
        if (!p) return loom_last_status();
        s = loom__rd_plan_fill(r, p, empty);
        if (s != LOOM_OK) goto fail;
        if (r->comm_iface.allreduce_tensor(r->comm, tensors, (size_t)N)) {
            uint64_t ring_volume = 2 * (uint64_t)(N - 1) * nbytes; /* all devices, estimate */
            rd_account(r, LOOM_ALLREDUCE_NATIVE, nbytes, ring_volume);
            return LOOM_OK;
        }
        LOOM_LOG_DEBUG("allreduce: the communicator declined %zu bytes; falling back", nbytes);
        empty = NULL; /* already zeroed */
        if (r->algo == LOOM_ALLREDUCE_NATIVE) {
            return loom_error(LOOM_ERR_UNSUPPORTED,
                              "allreduce: native algorithm forced but the communicator "
                              "declined the tensor");
        }
        algo = !r->p2p                      ? LOOM_ALLREDUCE_HOST
               : nbytes <= r->butterfly_max ? LOOM_ALLREDUCE_BUTTERFLY
                                            : LOOM_ALLREDUCE_RING;
    }

    if (algo == LOOM_ALLREDUCE_RING || algo == LOOM_ALLREDUCE_BUTTERFLY) {
        loom__rd_plan *p = rd_get_plan(r, algo, tensors, n_elem);
        if (!p && loom_last_status() == LOOM_ERR_UNSUPPORTED && r->algo == LOOM_ALLREDUCE_AUTO) {
            LOOM_LOG_DEBUG("allreduce: %s; using the host-staged path", loom_last_error());
            algo = LOOM_ALLREDUCE_HOST;
        } else if (!p) {
            return loom_last_status();
        } else {
            s = loom__rd_plan_fill(r, p, empty);
            if (s == LOOM_OK) s = loom__rd_plan_run(r, p);
            if (s != LOOM_OK) goto fail;
            rd_account(r, algo, nbytes, p->bytes_moved);
            return LOOM_OK;
        }
    }

    LOOM_ASSERT(algo == LOOM_ALLREDUCE_HOST);
    r->trace_len = 0;
    s = loom__rd_host_allreduce(r, tensors, n_elem, empty);
    if (s != LOOM_OK) goto fail;
    rd_account(r, LOOM_ALLREDUCE_HOST, nbytes, 0);
    return LOOM_OK;

fail:
    if (loom_last_status() == LOOM_OK) loom_error(s, "allreduce failed");
    loom__rd_sync_all(r);
    return s;
}

/* A member whose earlier work failed (seen by a synchronize inside the call) fails the
 * call: the caller must not read the sum as if it were right. */
loom_status loom_reducer_allreduce(loom_reducer *r, loom_tensor *const *tensors,
                                   const bool *empty) {
    LOOM_ASSERT(r != NULL);
    r->sync_status = LOOM_OK;
    loom_status s = rd_allreduce(r, tensors, empty);
    if (s == LOOM_OK && r->sync_status != LOOM_OK) {
        s = loom_error(r->sync_status, "allreduce: a device failed: %s", r->sync_msg);
    }
    return s;
}
