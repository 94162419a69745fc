/*
 * sim command streams (backends) and events.
 *
 * Each backend owns a worker thread and a FIFO of commands (set, get, copy, graph compute,
 * event record, event wait), so the devices of a reg really compute concurrently and a
 * caller only blocks in synchronize. Graphs run with loom_cpu_graph_compute on the
 * backend's own thread pool. An event counts records issued and completed: record
 * enqueues "complete record #n", wait enqueues "block until record #n (the latest issued
 * at wait time) completes", synchronize blocks the caller the same way. A direct copy
 * between two devices of one reg records an internal event on the source stream and makes
 * the destination stream wait for it, so it sees all the source's work issued so far.
 * Events are reference counted (user + each pending command), so freeing one with
 * commands still queued is safe.
 *
 * If a command cannot be allocated (host out of memory), the stream is drained and the
 * command runs on the calling thread: same result, only not asynchronous.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r, pthread */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backends/sim/sim-impl.h"
#include "loom/cpu.h"

/* ---------------------------------------------------------------- events */

static void loom__sim_release(const void *stream); /* held streams, below */

typedef struct loom__sim_event {
    struct loom_event ev; /* ev.context = this */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t issued;    /* records issued */
    uint64_t completed; /* highest record completed */
    int refs;
    const void *stream; /* the backend the latest record was issued on (compared only) */
} loom__sim_event;

static loom__sim_event *loom__sim_event_alloc(loom_dev_t dev) {
    loom__sim_event *se = loom_calloc(1, sizeof *se);
    if (!se) return NULL;
    if (pthread_mutex_init(&se->mu, NULL) != 0) {
        loom_free(se);
        return NULL;
    }
    if (pthread_cond_init(&se->cv, NULL) != 0) {
        pthread_mutex_destroy(&se->mu);
        loom_free(se);
        return NULL;
    }
    se->ev.device = dev;
    se->ev.context = se;
    se->refs = 1;
    return se;
}

static void loom__sim_event_ref(loom__sim_event *se) {
    pthread_mutex_lock(&se->mu);
    se->refs++;
    pthread_mutex_unlock(&se->mu);
}

static void loom__sim_event_unref(loom__sim_event *se) {
    pthread_mutex_lock(&se->mu);
    bool last = --se->refs == 0;
    pthread_mutex_unlock(&se->mu);
    if (!last) return;
    pthread_cond_destroy(&se->cv);
    pthread_mutex_destroy(&se->mu);
    loom_free(se);
}

/* Issues a new record; returns its number. */
static uint64_t loom__sim_event_issue(loom__sim_event *se) {
    pthread_mutex_lock(&se->mu);
    uint64_t n = ++se->issued;
    pthread_mutex_unlock(&se->mu);
    return n;
}

static uint64_t loom__sim_event_latest(loom__sim_event *se) {
    pthread_mutex_lock(&se->mu);
    uint64_t n = se->issued;
    pthread_mutex_unlock(&se->mu);
    return n;
}

static void loom__sim_event_complete(loom__sim_event *se, uint64_t n) {
    pthread_mutex_lock(&se->mu);
    if (se->completed < n) se->completed = n;
    pthread_cond_broadcast(&se->cv);
    pthread_mutex_unlock(&se->mu);
}

static void loom__sim_event_block(loom__sim_event *se, uint64_t n) {
    pthread_mutex_lock(&se->mu);
    while (se->completed < n)
        pthread_cond_wait(&se->cv, &se->mu);
    pthread_mutex_unlock(&se->mu);
}

static loom__sim_event *loom__sim_event_of(loom_event_t ev) {
    LOOM_ASSERT(ev != NULL && loom__sim_dev_of(ev->device) != NULL); /* not a sim event */
    return ev->context;
}

loom_event_t loom__sim_event_new(loom_dev_t dev) {
    loom__sim_event *se = loom__sim_event_alloc(dev);
    if (!se) {
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory for an event", loom_dev_name(dev));
        return NULL;
    }
    return &se->ev;
}

void loom__sim_event_free(loom_dev_t dev, loom_event_t ev) {
    (void)dev;
    loom__sim_event_unref(loom__sim_event_of(ev));
}

void loom__sim_event_synchronize(loom_dev_t dev, loom_event_t ev) {
    (void)dev;
    loom__sim_event *se = loom__sim_event_of(ev);
    pthread_mutex_lock(&se->mu);
    const void *stream = se->stream;
    pthread_mutex_unlock(&se->mu);
    if (stream) loom__sim_release(stream); /* the host waits for it */
    loom__sim_event_block(se, loom__sim_event_latest(se));
}

/* ---------------------------------------------------------------- commands */

typedef enum {
    LOOM__SIM_SET,
    LOOM__SIM_GET,
    LOOM__SIM_COPY, /* after ev reaches n (if ev), src -> dst */
    LOOM__SIM_COMPUTE,
    LOOM__SIM_RECORD,
    LOOM__SIM_WAIT,
    LOOM__SIM_ALLREDUCE, /* rank n of the native communicator's AllReduce rdv */
} loom__sim_cmd_kind;

typedef struct loom__sim_rdv loom__sim_rdv;

typedef struct loom__sim_cmd {
    struct loom__sim_cmd *next;
    loom__sim_cmd_kind kind;
    loom_tensor *dst;
    const loom_tensor *src;
    const void *in; /* SET: host source */
    void *out;      /* GET: host destination */
    size_t offset, size;
    loom_graph *graph;
    loom__sim_event *ev; /* holds a reference while queued */
    uint64_t n;
    loom__sim_rdv *rdv; /* ALLREDUCE: holds a reference while queued */
} loom__sim_cmd;

typedef struct loom__sim_backend {
    struct loom_backend backend; /* backend.context = this */
    loom__sim_dev *sd;
    char name[48];
    loom_threadpool *tp;
    pthread_t thread;
    pthread_mutex_t mu; /* guards the queue, counters and the sticky error */
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    loom__sim_cmd *head, *tail;
    uint64_t n_issued, n_done;
    bool stop;
    bool busy;     /* a command is executing (on the worker or on a draining thread) */
    int drainers;  /* threads in loom__sim_drain: the worker leaves the queue to them */
    loom_affinity pin; /* the policy the worker is bound by (NONE: unbound); a bound worker
                        * runs its own queue */
    int done_waiters; /* threads waiting on cv_done */
    int64_t spin_ns;  /* how long an idle worker or a rendezvous spins before sleeping */
    atomic_uint_fast64_t n_queued; /* n_issued, readable without mu (the idle spin) */
    loom_status async_status; /* first failure of an asynchronous graph */
    bool async_reported;      /* ... returned by synchronize: the next graph starts clean */
    char async_msg[256];
    bool held; /* test hook: run nothing until something waits on it */
} loom__sim_backend;

static loom__sim_backend *loom__sim_backend_of(loom_backend_t b);

/* How long an idle device thread spins (for its next command, or for its peers at an
 * AllReduce) before it sleeps, when the reg's device threads all have a core: longer than
 * a token's host work between two graphs, far shorter than a scheduler time slice. */
#define LOOM__SIM_SPIN_NS 200000

/* ---------------------------------------------------------------- held streams (tests) */

/* Streams held by loom_sim_backend_hold: they run nothing until the host waits for them,
 * which makes "a device as late as it may legally be" a deterministic test adversary. */
#define LOOM__SIM_MAX_HELD 16
static pthread_mutex_t g_held_mu = PTHREAD_MUTEX_INITIALIZER;
static loom__sim_backend *g_held[LOOM__SIM_MAX_HELD];
static int g_n_held;

static void loom__sim_release_locked(int k) {
    loom__sim_backend *sb = g_held[k];
    g_held[k] = g_held[--g_n_held];
    pthread_mutex_lock(&sb->mu);
    sb->held = false;
    pthread_cond_signal(&sb->cv_work);
    pthread_mutex_unlock(&sb->mu);
}

/* Releases `stream` if it is held (any held stream when stream is NULL). */
static void loom__sim_release(const void *stream) {
    pthread_mutex_lock(&g_held_mu);
    for (int k = g_n_held - 1; k >= 0; k--) {
        if (!stream || g_held[k] == stream) loom__sim_release_locked(k);
    }
    pthread_mutex_unlock(&g_held_mu);
}

static void loom__sim_allreduce_rank(loom__sim_rdv *r, int rank);

static void loom__sim_execute(loom__sim_backend *sb, loom__sim_cmd *c) {
    loom__sim_dev *sd = sb->sd;
    const bool sync =
        c->kind == LOOM__SIM_WAIT || c->kind == LOOM__SIM_COPY || c->kind == LOOM__SIM_ALLREDUCE;
    const int64_t t0 = sync || c->kind == LOOM__SIM_COMPUTE ? loom_time_ns() : 0;
    switch (c->kind) {
    case LOOM__SIM_SET:
        if (!sd->sreg->cfg.virtual_memory) memcpy((char *)c->dst->data + c->offset, c->in, c->size);
        loom__sim_account(NULL, loom__sim_buffer_dev(c->dst->buffer), c->size);
        break;
    case LOOM__SIM_GET:
        if (!sd->sreg->cfg.virtual_memory)
            memcpy(c->out, (const char *)c->src->data + c->offset, c->size);
        loom__sim_account(loom__sim_buffer_dev(c->src->buffer), NULL, c->size);
        break;
    case LOOM__SIM_COPY: {
        if (c->ev) loom__sim_event_block(c->ev, c->n);
        size_t n = loom_nbytes(c->src);
        if (!sd->sreg->cfg.virtual_memory) memmove(c->dst->data, c->src->data, n);
        loom__sim_dev *from = loom__sim_buffer_dev(c->src->buffer);
        loom__sim_dev *to = loom__sim_buffer_dev(c->dst->buffer);
        if (from != to) loom__sim_account(from, to, n);
        break;
    }
    case LOOM__SIM_COMPUTE: {
        /* virtual=1 computes nothing; a profile accounts each op's time either way */
        loom_status s =
            sd->sreg->cfg.virtual_memory ? LOOM_OK : loom_cpu_graph_compute(c->graph, sb->tp);
        double t = 0;
        uint64_t ops = 0;
        for (int i = 0; sd->sreg->profile && i < c->graph->n_nodes; i++) {
            const loom_tensor *node = c->graph->nodes[i];
            if (node->op == LOOM_OP_NONE || loom_op_is_view(node->op)) continue;
            t += loom_sim_op_time_us(sd->sreg->profile, node);
            ops++;
        }
        pthread_mutex_lock(&sd->mu);
        sd->stats.graphs++;
        sd->stats.nodes += (uint64_t)c->graph->n_nodes;
        sd->stats.compute_time_us += t;
        sd->stats.ops += ops;
        pthread_mutex_unlock(&sd->mu);
        if (s != LOOM_OK) {
            LOOM_LOG_ERROR("%s: graph compute failed: %s", sb->name, loom_last_error());
            pthread_mutex_lock(&sb->mu);
            if (sb->async_status == LOOM_OK) {
                sb->async_status = s;
                snprintf(sb->async_msg, sizeof sb->async_msg, "%s", loom_last_error());
            }
            pthread_mutex_unlock(&sb->mu);
        }
        break;
    }
    case LOOM__SIM_RECORD:
        loom__sim_event_complete(c->ev, c->n);
        break;
    case LOOM__SIM_WAIT:
        loom__sim_event_block(c->ev, c->n);
        break;
    case LOOM__SIM_ALLREDUCE:
        loom__sim_allreduce_rank(c->rdv, (int)c->n);
        break;
    }
    if (t0) {
        const uint64_t dt = (uint64_t)(loom_time_ns() - t0);
        pthread_mutex_lock(&sd->mu);
        if (sync)
            sd->stats.host_sync_ns += dt;
        else
            sd->stats.host_compute_ns += dt;
        pthread_mutex_unlock(&sd->mu);
    }
    if (c->ev) loom__sim_event_unref(c->ev);
}

static void loom__sim_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Spins for at most `ns` nanoseconds until `*done` returns true (checked between pauses,
 * the clock read every 64). */
static bool loom__sim_spin(int64_t ns, bool (*done)(const void *), const void *arg) {
    if (ns <= 0) return done(arg);
    const int64_t t_end = loom_time_ns() + ns;
    for (unsigned i = 1;; i++) {
        if (done(arg)) return true;
        loom__sim_relax();
        if ((i & 63) == 0 && loom_time_ns() > t_end) return done(arg);
    }
}

typedef struct loom__sim_issued_arg {
    const loom__sim_backend *sb;
    uint64_t seen;
} loom__sim_issued_arg;

static bool loom__sim_issued_since(const void *arg) {
    const loom__sim_issued_arg *a = arg;
    return atomic_load_explicit(&a->sb->n_queued, memory_order_acquire) != a->seen;
}

/* An idle worker spins a while (sb->spin_ns) for the next command before it sleeps, so the
 * next token's work does not wait for a thread wake-up; 0 (seen unknown) skips it. */
static void loom__sim_spin_until_issued(loom__sim_backend *sb, uint64_t seen) {
    if (seen == 0 || sb->spin_ns <= 0) return;
    loom__sim_issued_arg a = {sb, seen};
    loom__sim_spin(sb->spin_ns, loom__sim_issued_since, &a);
}

/* Takes the head command and executes it with sb->mu released; called and returns with
 * sb->mu held, the queue non-empty and no command executing. */
static void loom__sim_run_one(loom__sim_backend *sb) {
    loom__sim_cmd *c = sb->head;
    sb->head = c->next;
    if (!sb->head) sb->tail = NULL;
    sb->busy = true;
    pthread_mutex_unlock(&sb->mu);

    loom__sim_execute(sb, c);
    loom_free(c);

    pthread_mutex_lock(&sb->mu);
    sb->busy = false;
    sb->n_done++;
    if (sb->done_waiters > 0) pthread_cond_broadcast(&sb->cv_done);
}

static void *loom__sim_worker(void *arg) {
    loom__sim_backend *sb = arg;
    /* the device's host thread, placed by the process's CPU affinity policy (a GPU's driving
     * thread would sit on the cores nearest its GPU): device k of N as thread k of N. Not
     * bound under `none` (the default on one NUMA node); a binding that cannot be done is
     * logged once and skipped by loom_topo_bind_thread. */
    if (sb->pin != LOOM_AFFINITY_NONE)
        loom_topo_bind_thread(loom_topo_get(), sb->pin, -1, sb->sd->index,
                              sb->sd->sreg->cfg.n_devices);
    uint64_t seen = 0; /* commands issued when the worker last found its queue empty */
    for (;;) {
        loom__sim_spin_until_issued(sb, seen);
        pthread_mutex_lock(&sb->mu);
        while (!sb->stop &&
               (!sb->head || sb->held || sb->busy || (sb->pin == LOOM_AFFINITY_NONE && sb->drainers > 0))) {
            seen = sb->n_issued;
            pthread_cond_wait(&sb->cv_work, &sb->mu);
        }
        if (sb->stop) { /* free drained the stream first: nothing is left */
            pthread_mutex_unlock(&sb->mu);
            break;
        }
        loom__sim_run_one(sb);
        seen = sb->head ? 0 : sb->n_issued;
        pthread_mutex_unlock(&sb->mu);
    }
    return NULL;
}

/* Waits until everything issued so far has run. The waiting thread runs the stream's
 * commands itself while it waits (the worker leaves the queue to it), so a host that
 * synchronizes a device does that device's work instead of sleeping beside its worker:
 * one runnable thread per device, not one more, and no wake-up per command. Not when the
 * affinity policy pins the worker: then the device's work stays on its cores. */
static void loom__sim_drain(loom__sim_backend *sb) {
    /* a held stream may be what this one waits for (device-side): the host waits now */
    loom__sim_release(NULL);
    pthread_mutex_lock(&sb->mu);
    uint64_t target = sb->n_issued;
    sb->drainers++;
    while (sb->n_done < target) {
        if (sb->head && !sb->busy && !sb->held && sb->pin == LOOM_AFFINITY_NONE) {
            loom__sim_run_one(sb);
            continue;
        }
        sb->done_waiters++;
        pthread_cond_wait(&sb->cv_done, &sb->mu);
        sb->done_waiters--;
    }
    sb->drainers--;
    if (sb->head && sb->drainers == 0) pthread_cond_signal(&sb->cv_work);
    pthread_mutex_unlock(&sb->mu);
}

static void loom__sim_enqueue(loom__sim_backend *sb, loom__sim_cmd *q);

/* Queues a copy of *c (taking over its event reference); runs it inline when the queue
 * entry cannot be allocated. */
static void loom__sim_submit(loom__sim_backend *sb, const loom__sim_cmd *c) {
    loom__sim_cmd *q = loom_malloc(sizeof *q);
    if (!q) {
        LOOM_LOG_WARN("%s: out of host memory for a command; running it synchronously", sb->name);
        loom__sim_drain(sb);
        loom__sim_cmd tmp = *c;
        loom__sim_execute(sb, &tmp);
        return;
    }
    *q = *c;
    loom__sim_enqueue(sb, q);
}

/* Appends the allocated command q to the stream. */
static void loom__sim_enqueue(loom__sim_backend *sb, loom__sim_cmd *q) {
    q->next = NULL;
    pthread_mutex_lock(&sb->mu);
    if (sb->tail) {
        sb->tail->next = q;
    } else {
        sb->head = q;
    }
    sb->tail = q;
    sb->n_issued++;
    atomic_store_explicit(&sb->n_queued, sb->n_issued, memory_order_release);
    pthread_cond_signal(&sb->cv_work);
    pthread_mutex_unlock(&sb->mu);
}

/* ---------------------------------------------------------------- backend methods */

static const char *loom__sim_backend_name(loom_backend_t backend) {
    return loom__sim_backend_of(backend)->name;
}

static void loom__sim_backend_free(loom_backend_t backend) {
    loom__sim_backend *sb = loom__sim_backend_of(backend);
    loom__sim_drain(sb);
    pthread_mutex_lock(&sb->mu);
    sb->stop = true;
    pthread_cond_signal(&sb->cv_work);
    pthread_mutex_unlock(&sb->mu);
    pthread_join(sb->thread, NULL);
    pthread_cond_destroy(&sb->cv_done);
    pthread_cond_destroy(&sb->cv_work);
    pthread_mutex_destroy(&sb->mu);
    loom_threadpool_free(sb->tp);
    pthread_mutex_lock(&sb->sd->mu);
    sb->sd->n_backends--;
    pthread_mutex_unlock(&sb->sd->mu);
    loom_free(sb);
}

static void loom__sim_check_buffer(loom__sim_backend *sb, const loom_tensor *t) {
    LOOM_ASSERT(t->buffer != NULL);
    /* A stream reaches only memory its device can use. */
    LOOM_ASSERT(loom__sim_dev_supports_buft(sb->sd, t->buffer->buft));
}

static void loom__sim_set_async(loom_backend_t backend, loom_tensor *t, const void *data,
                                size_t offset, size_t size) {
    loom__sim_backend *sb = loom__sim_backend_of(backend);
    loom__sim_check_buffer(sb, t);
    loom__sim_cmd c = {.kind = LOOM__SIM_SET, .dst = t, .in = data, .offset = offset, .size = size};
    loom__sim_submit(sb, &c);
}

static void loom__sim_get_async(loom_backend_t backend, const loom_tensor *t, void *data,
                                size_t offset, size_t size) {
    loom__sim_backend *sb = loom__sim_backend_of(backend);
    loom__sim_check_buffer(sb, t);
    loom__sim_cmd c = {
        .kind = LOOM__SIM_GET, .src = t, .out = data, .offset = offset, .size = size};
    loom__sim_submit(sb, &c);
}

/* Device-to-device copy of the same reg with p2p: ordered after the source stream's
 * work issued so far. Anything else: false (the caller stages through host memory). */
static bool loom__sim_cpy_async(loom_backend_t backend_src, loom_backend_t backend_dst,
                                const loom_tensor *src, loom_tensor *dst) {
    loom__sim_backend *bd = loom__sim_backend_of(backend_dst);
    if (backend_src->iface != backend_dst->iface) return false;
    loom__sim_backend *bs = loom__sim_backend_of(backend_src);
    loom__sim_dev *sdev = loom__sim_buffer_dev(src->buffer);
    loom__sim_dev *ddev = loom__sim_buffer_dev(dst->buffer);
    if (sdev != bs->sd || ddev != bd->sd) return false;
    if (sdev->sreg != ddev->sreg || (sdev != ddev && !ddev->sreg->cfg.p2p)) return false;
    loom__sim_cmd c = {.kind = LOOM__SIM_COPY, .src = src, .dst = dst};
    if (bs == bd) {
        loom__sim_submit(bd, &c);
        return true;
    }
    loom__sim_event *marker = loom__sim_event_alloc(&sdev->dev);
    if (!marker) return false;
    uint64_t n = loom__sim_event_issue(marker);
    loom__sim_event_ref(marker);
    loom__sim_cmd rec = {.kind = LOOM__SIM_RECORD, .ev = marker, .n = n};
    loom__sim_submit(bs, &rec);
    loom__sim_event_ref(marker);
    c.ev = marker;
    c.n = n;
    loom__sim_submit(bd, &c);
    loom__sim_event_unref(marker);
    return true;
}

static void loom__sim_synchronize(loom_backend_t backend) {
    loom__sim_drain(loom__sim_backend_of(backend));
}

/* After synchronize: the failure of a graph that ran on the worker. */
static loom_status loom__sim_get_status(loom_backend_t backend) {
    loom__sim_backend *sb = loom__sim_backend_of(backend);
    pthread_mutex_lock(&sb->mu);
    loom_status s = sb->async_status;
    char msg[sizeof sb->async_msg];
    memcpy(msg, sb->async_msg, sizeof msg);
    if (s != LOOM_OK) sb->async_reported = true;
    pthread_mutex_unlock(&sb->mu);
    if (s != LOOM_OK) return loom_error(s, "%s: graph compute failed: %s", sb->name, msg);
    return LOOM_OK;
}

/* Checks a graph before queueing it, so misuse fails synchronously with a clear message:
 * every op supported, every tensor allocated in memory this device can use. */
static loom_status loom__sim_validate(loom__sim_backend *sb, const loom_graph *g) {
    loom__sim_dev *sd = sb->sd;
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *node = g->nodes[i];
        /* view ops are metadata: a scheduler keeps them inside a split whatever backend
         * their storage belongs to; only nodes that compute must be readable here */
        if (loom_op_is_view(node->op)) continue;
        if (!loom__sim_dev_supports_op(sd, node)) {
            return loom_error(LOOM_ERR_UNSUPPORTED, "%s: op %s (node %d '%s') is not supported",
                              sd->name, loom_op_name(node->op), i, node->name);
        }
        for (int j = -1; j < LOOM_MAX_SRC; j++) {
            const loom_tensor *t = j < 0 ? node : node->src[j];
            if (!t) continue;
            if (!t->data) {
                return loom_error(LOOM_ERR_INVALID_ARG,
                                  "%s: tensor '%s' (used by node %d) is "
                                  "not allocated",
                                  sd->name, t->name, i);
            }
            bool ok = t->buffer ? loom__sim_dev_supports_buft(sd, t->buffer->buft)
                                : sd->sreg->cfg.host_memory;
            if (!ok) {
                return loom_error(LOOM_ERR_INVALID_ARG,
                                  "%s: tensor '%s' (used by node %d) is in %s, which this "
                                  "device cannot read",
                                  sd->name, t->name, i,
                                  t->buffer ? loom_buffer_name(t->buffer) : "unmanaged memory");
            }
        }
    }
    return LOOM_OK;
}

/* A failure synchronize reported belongs to the work it waited for: the next graph starts
 * clean. One nobody waited for yet is returned by the next graph_compute instead. */
static loom_status loom__sim_graph_compute(loom_backend_t backend, loom_graph *g) {
    loom__sim_backend *sb = loom__sim_backend_of(backend);
    pthread_mutex_lock(&sb->mu);
    loom_status pending = sb->async_reported ? LOOM_OK : sb->async_status;
    char msg[sizeof sb->async_msg];
    memcpy(msg, sb->async_msg, sizeof msg);
    sb->async_status = LOOM_OK;
    sb->async_reported = false;
    pthread_mutex_unlock(&sb->mu);
    if (pending != LOOM_OK) {
        return loom_error(pending, "%s: an earlier graph failed: %s", sb->name, msg);
    }
    loom_status s = loom__sim_validate(sb, g);
    if (s != LOOM_OK) return s;
    loom__sim_cmd c = {.kind = LOOM__SIM_COMPUTE, .graph = g};
    loom__sim_submit(sb, &c);
    return LOOM_OK;
}

static void loom__sim_event_record(loom_backend_t backend, loom_event_t ev) {
    loom__sim_backend *sb = loom__sim_backend_of(backend);
    loom__sim_event *se = loom__sim_event_of(ev);
    uint64_t n = loom__sim_event_issue(se);
    pthread_mutex_lock(&se->mu);
    se->stream = sb;
    pthread_mutex_unlock(&se->mu);
    loom__sim_event_ref(se);
    loom__sim_cmd c = {.kind = LOOM__SIM_RECORD, .ev = se, .n = n};
    loom__sim_submit(sb, &c);
}

static void loom__sim_event_wait(loom_backend_t backend, loom_event_t ev) {
    loom__sim_backend *sb = loom__sim_backend_of(backend);
    if (!loom_dev_is_sim(ev->device)) { /* another kind's event (a meta device's): host wait */
        loom_event_synchronize(ev);
        return;
    }
    loom__sim_event *se = loom__sim_event_of(ev);
    uint64_t n = loom__sim_event_latest(se);
    if (n == 0) return; /* never recorded: nothing to wait for */
    loom__sim_event_ref(se);
    loom__sim_cmd c = {.kind = LOOM__SIM_WAIT, .ev = se, .n = n};
    loom__sim_submit(sb, &c);
}

static const struct loom_backend_i loom__sim_backend_i = {
    .get_name = loom__sim_backend_name,
    .free = loom__sim_backend_free,
    .set_tensor_async = loom__sim_set_async,
    .get_tensor_async = loom__sim_get_async,
    .cpy_tensor_async = loom__sim_cpy_async,
    .synchronize = loom__sim_synchronize,
    .graph_compute = loom__sim_graph_compute,
    .event_record = loom__sim_event_record,
    .event_wait = loom__sim_event_wait,
    .get_status = loom__sim_get_status,
};

static loom__sim_backend *loom__sim_backend_of(loom_backend_t b) {
    LOOM_ASSERT(b != NULL && b->iface == &loom__sim_backend_i);
    return b->context;
}

void loom_sim_backend_hold(loom_backend_t backend) {
    loom__sim_backend *sb = loom__sim_backend_of(backend);
    pthread_mutex_lock(&g_held_mu);
    bool listed = false;
    for (int k = 0; k < g_n_held; k++)
        listed |= g_held[k] == sb;
    if (!listed && g_n_held < LOOM__SIM_MAX_HELD) {
        g_held[g_n_held++] = sb;
        pthread_mutex_lock(&sb->mu);
        sb->held = true;
        pthread_mutex_unlock(&sb->mu);
    }
    pthread_mutex_unlock(&g_held_mu);
}

/* ---------------------------------------------------------------- native communicator */

/* What the reg exports as LOOM_PROC_COMM_INIT / _ALLREDUCE / _FREE (include/loom/reduce.h):
 * an AllReduce that is one command per stream instead of the reducer's dozen (events,
 * marker events, copies into scratch, add graphs), the way a GPU's one-shot kernel reads
 * its peers' memory. Rank j's command waits at a rendezvous until every rank's stream
 * has reached it (all partial sums final), sums chunk j of the tensor over every device
 * in device order 0..N-1 and writes it into every device's tensor (so every device holds
 * bit-identical sums), then waits until every rank has written its chunk. The chunks are
 * summed concurrently on the N device threads and nothing is copied into scratch. The link
 * model is charged what a ring moves: each rank receives N-1 partial chunks and sends its
 * summed chunk to N-1 peers.
 *
 * Offered (init returns non-NULL) only where it changes nothing but host time: devices of
 * one reg with p2p, private memory, no profile and not virtual (the timing model and
 * `loom plan` keep the reducer's calibrated steps), and comm=0 not given. */

typedef struct loom__sim_comm {
    int n;
    loom__sim_backend *sb[LOOM_SIM_MAX_DEVICES];
} loom__sim_comm;

struct loom__sim_rdv {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    atomic_int refs;
    atomic_int arrived[2]; /* ranks past the inputs-ready and the sums-written points */
    int64_t spin_ns;       /* spin before sleeping (0: LOOM__SIM_RDV_SPINS pauses) */
    int64_t n_elem;
    float *data[LOOM_SIM_MAX_DEVICES];
    loom__sim_dev *dev[LOOM_SIM_MAX_DEVICES];
};

/* Spins before a rank sleeps at a rendezvous when the devices' threads do not all have a
 * core of their own: the peers are device threads of the same token's work, usually a few
 * microseconds apart. With a core each, a rank spins for its stream's spin_ns instead. */
#define LOOM__SIM_RDV_SPINS 256

static void loom__sim_rdv_unref(loom__sim_rdv *r) {
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    loom_free(r);
}

typedef struct loom__sim_phase_arg {
    loom__sim_rdv *r;
    int phase;
} loom__sim_phase_arg;

static bool loom__sim_all_arrived(const void *arg) {
    const loom__sim_phase_arg *a = arg;
    return atomic_load_explicit(&a->r->arrived[a->phase], memory_order_acquire) == a->r->n;
}

/* Arrives at point `phase` and returns once every rank has. The last to arrive wakes the
 * sleepers under the mutex, and a sleeper re-checks the count under it: no lost wake-up. */
static void loom__sim_rdv_arrive(loom__sim_rdv *r, int phase) {
    if (atomic_fetch_add(&r->arrived[phase], 1) + 1 == r->n) {
        pthread_mutex_lock(&r->mu);
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    if (r->spin_ns > 0) {
        loom__sim_phase_arg a = {r, phase};
        if (loom__sim_spin(r->spin_ns, loom__sim_all_arrived, &a)) return;
    } else {
        for (int i = 0; i < LOOM__SIM_RDV_SPINS; i++) {
            if (atomic_load_explicit(&r->arrived[phase], memory_order_acquire) == r->n) return;
            loom__sim_relax();
        }
    }
    pthread_mutex_lock(&r->mu);
    while (atomic_load(&r->arrived[phase]) < r->n)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static void loom__sim_allreduce_rank(loom__sim_rdv *r, int rank) {
    const int n = r->n;
    const int64_t lo = r->n_elem * rank / n, hi = r->n_elem * (rank + 1) / n;
    loom__sim_rdv_arrive(r, 0);
    enum { BLOCK = 256 };
    float acc[BLOCK];
    for (int64_t i0 = lo; i0 < hi; i0 += BLOCK) {
        const int64_t m = hi - i0 < BLOCK ? hi - i0 : BLOCK;
        memcpy(acc, r->data[0] + i0, (size_t)m * sizeof(float));
        for (int k = 1; k < n; k++) {
            const float *x = r->data[k] + i0;
            for (int64_t i = 0; i < m; i++)
                acc[i] += x[i];
        }
        for (int k = 0; k < n; k++)
            memcpy(r->data[k] + i0, acc, (size_t)m * sizeof(float));
    }
    const size_t bytes = (size_t)(hi - lo) * sizeof(float);
    for (int k = 0; k < n && bytes > 0; k++) {
        if (k == rank) continue;
        loom__sim_account(r->dev[k], r->dev[rank], bytes); /* k's partial chunk in */
        loom__sim_account(r->dev[rank], r->dev[k], bytes); /* the sum out to k */
    }
    loom__sim_rdv_arrive(r, 1);
    loom__sim_rdv_unref(r);
}

void *loom__sim_comm_init(loom_backend_t *backends, size_t n) {
    if (!backends || n < 2 || n > LOOM_SIM_MAX_DEVICES) return NULL;
    loom__sim_comm *c = loom_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->n = (int)n;
    for (size_t j = 0; j < n; j++) {
        loom_backend_t b = backends[j];
        bool ok = b && b->iface == &loom__sim_backend_i;
        loom__sim_backend *sb = ok ? b->context : NULL;
        const loom_sim_config *cfg = ok ? &sb->sd->sreg->cfg : NULL;
        ok = ok && sb->sd->sreg == ((loom__sim_backend *)backends[0]->context)->sd->sreg &&
             !cfg->no_comm && cfg->p2p && !cfg->host_memory && !cfg->virtual_memory &&
             !sb->sd->sreg->profile;
        for (size_t k = 0; ok && k < j; k++)
            ok = c->sb[k]->sd != sb->sd; /* distinct devices */
        if (!ok) {
            loom_free(c);
            return NULL;
        }
        c->sb[j] = sb;
    }
    return c;
}

/* Declines (false, nothing queued) tensors that are not contiguous F32 of one shape, each
 * in its own rank's device memory, or when the host is out of memory. */
bool loom__sim_comm_allreduce(void *comm, loom_tensor *const *t, size_t n) {
    loom__sim_comm *c = comm;
    if (!c || !t || (int)n != c->n) return false;
    const int64_t n_elem = t[0] ? loom_nelements(t[0]) : 0;
    for (int j = 0; j < c->n; j++) {
        const loom_tensor *x = t[j];
        if (!x || x->type != LOOM_TYPE_F32 || !loom_is_contiguous(x) || !x->buffer || !x->data ||
            loom_nelements(x) != n_elem || loom__sim_buffer_dev(x->buffer) != c->sb[j]->sd)
            return false;
    }
    if (n_elem == 0) return true;
    loom__sim_rdv *r = loom_calloc(1, sizeof *r);
    loom__sim_cmd *q[LOOM_SIM_MAX_DEVICES] = {0};
    bool ok = r != NULL;
    for (int j = 0; j < c->n && ok; j++)
        ok = (q[j] = loom_calloc(1, sizeof *q[j])) != NULL;
    if (ok && pthread_mutex_init(&r->mu, NULL) != 0) ok = false;
    if (ok && pthread_cond_init(&r->cv, NULL) != 0) {
        pthread_mutex_destroy(&r->mu);
        ok = false;
    }
    if (!ok) {
        for (int j = 0; j < c->n; j++)
            loom_free(q[j]);
        loom_free(r);
        return false;
    }
    r->n = c->n;
    r->n_elem = n_elem;
    r->spin_ns = c->sb[0]->spin_ns;
    atomic_init(&r->refs, c->n);
    atomic_init(&r->arrived[0], 0);
    atomic_init(&r->arrived[1], 0);
    for (int j = 0; j < c->n; j++) {
        r->data[j] = t[j]->data;
        r->dev[j] = c->sb[j]->sd;
    }
    /* every rank is queued before any may run alone: all or nothing */
    for (int j = 0; j < c->n; j++) {
        *q[j] = (loom__sim_cmd){.kind = LOOM__SIM_ALLREDUCE, .rdv = r, .n = (uint64_t)j};
        loom__sim_enqueue(c->sb[j], q[j]);
    }
    return true;
}

void loom__sim_comm_free(void *comm) {
    loom_free(comm);
}

/* ---------------------------------------------------------------- constructor */

/* params: "threads=N" (overrides the reg's threads). */
static loom_status loom__sim_backend_params(loom__sim_dev *sd, const char *params, int *threads) {
    if (!params || !params[0]) return LOOM_OK;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", params);
    char *save = NULL;
    for (char *opt = strtok_r(buf, ",", &save); opt; opt = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(opt, '=');
        if (eq && (size_t)(eq - opt) == 7 && strncasecmp(opt, "threads", 7) == 0) {
            char *end = NULL;
            long v = strtol(eq + 1, &end, 10);
            if (end != eq + 1 && !*end && v >= 1 && v <= 256) {
                *threads = (int)v;
                continue;
            }
            return loom_error(LOOM_ERR_FORMAT, "%s: backend params '%s': threads must be 1..256",
                              sd->name, params);
        }
        return loom_error(LOOM_ERR_FORMAT,
                          "%s: backend params '%s': unknown option '%s' (expected threads=N)",
                          sd->name, params, opt);
    }
    return LOOM_OK;
}

loom_backend_t loom__sim_backend_new(loom__sim_dev *sd, const char *params) {
    int threads = sd->sreg->cfg.threads;
    if (loom__sim_backend_params(sd, params, &threads) != LOOM_OK) return NULL;
    loom__sim_backend *sb = loom_calloc(1, sizeof *sb);
    if (!sb) {
        loom_error(LOOM_ERR_NOMEM, "%s: out of host memory for a backend", sd->name);
        return NULL;
    }
    sb->backend.iface = &loom__sim_backend_i;
    sb->backend.device = &sd->dev;
    sb->backend.context = sb;
    sb->sd = sd;
    snprintf(sb->name, sizeof sb->name, "%s", sd->name);
    /* spinning pays only when every device thread of the reg has a core of its own */
    const int64_t want = (int64_t)sd->sreg->cfg.n_devices * threads;
    sb->spin_ns = want <= loom_n_cpus() ? LOOM__SIM_SPIN_NS : 0;
    sb->pin = loom_cpu_affinity(NULL, 0);
    atomic_init(&sb->n_queued, 0);
    sb->tp = loom_threadpool_new(threads);
    if (!sb->tp) {
        loom_free(sb);
        loom_error(LOOM_ERR_NOMEM, "%s: cannot create a pool of %d threads", sd->name, threads);
        return NULL;
    }
    int stage = 0;
    if (pthread_mutex_init(&sb->mu, NULL) == 0) stage = 1;
    if (stage == 1 && pthread_cond_init(&sb->cv_work, NULL) == 0) stage = 2;
    if (stage == 2 && pthread_cond_init(&sb->cv_done, NULL) == 0) stage = 3;
    if (stage == 3 && pthread_create(&sb->thread, NULL, loom__sim_worker, sb) == 0) stage = 4;
    if (stage < 4) {
        if (stage >= 3) pthread_cond_destroy(&sb->cv_done);
        if (stage >= 2) pthread_cond_destroy(&sb->cv_work);
        if (stage >= 1) pthread_mutex_destroy(&sb->mu);
        loom_threadpool_free(sb->tp);
        loom_free(sb);
        loom_error(LOOM_ERR_DEVICE, "%s: cannot start the device worker thread", sd->name);
        return NULL;
    }
    pthread_mutex_lock(&sd->mu);
    sd->n_backends++;
    pthread_mutex_unlock(&sd->mu);
    return &sb->backend;
}
