/*
 * Stage 3 of the scheduler: run the splits in order. For each split:
 *   - if the previous split ran on another backend, this backend waits for it (an event
 *     wait on the device when both have events, a host wait otherwise): splits hand data
 *     to each other, and backends sharing a buffer type share memory the allocator reuses;
 *   - each input is copied into the split's copy of it. User inputs (INPUT flag) are copied
 *     at once, synchronously, after this backend is done with the copy slot, so the caller
 *     may overwrite them as soon as compute returns. Intermediates are copied after the
 *     producing backend's event, asynchronously where the backends allow; the producing
 *     backend then waits (on the device) for the copies before it may overwrite its
 *     source, since an asynchronous copy can run on the destination's stream. An expert
 *     tensor in host memory read only by MUL_MAT_IDs of this split moves only the experts
 *     the batch selected, in runs of consecutive experts, each with tail padding;
 *   - the split runs (or, with an eval callback, runs in pieces around observed nodes),
 *     then records this backend's event for the current copy.
 */
#include <stdio.h>
#include <string.h>

#include "sched/sched-impl.h"

#define LOOM_SCHED_EXPERT_PAD 512 /* bytes copied past a run, so padding holds no NaNs */

typedef struct expert_cache {
    const loom_tensor *ids; /* the ids tensor read last in this compute call */
    int64_t n_expert;
    uint8_t *used; /* [n_expert] */
    int64_t cap;
} expert_cache;

static inline loom_event_t event_of(const loom_sched *s, int b) {
    return s->events[b][s->cur_copy];
}

/* Makes backend b wait until everything issued so far on backend a is done. */
static void wait_for(loom_sched *s, int b, int a) {
    loom_event_t ev = event_of(s, a);
    if (ev && event_of(s, b) && s->backends[b]->iface->event_wait) {
        loom_event_wait(s->backends[b], ev);
    } else if (ev) {
        loom_event_synchronize(ev);
    } else {
        loom__sched_sync(s, a);
    }
}

/* Waits on the host until backend b no longer reads the current copy slot. */
static void host_wait(loom_sched *s, int b) {
    loom_event_t ev = event_of(s, b);
    if (ev) {
        loom_event_synchronize(ev);
    } else {
        loom__sched_sync(s, b);
    }
}

/* Waits on the host until nothing may still read the memory of backend b, which the host
 * is about to write (an eager user-input copy into bytes the allocator may have handed
 * over from a dead tensor): b's work, the work of every backend sharing its buffer type,
 * and every asynchronous copy out of that memory, which runs on the *reading* backend's
 * stream and so is not ordered by b's event. */
static void host_wait_writable(loom_sched *s, int b) {
    uint32_t mem = 0; /* backends whose memory is b's */
    for (int a = 0; a < s->n_backends; a++) {
        if (s->bufts[a] == s->bufts[b]) mem |= 1u << a;
    }
    for (int x = 0; x < s->n_backends; x++) {
        if (mem & (1u << x)) host_wait(s, x);
        if (!(s->pending_reads[x] & mem)) continue;
        if (s->copies_done[x]) {
            loom_event_synchronize(s->copies_done[x]); /* its latest copies: all of them */
            s->pending_reads[x] = 0;
        } else {
            loom__sched_sync(s, x);
        }
    }
}

/* Before the memory of backend b (and of every backend sharing its buffer type) is
 * written again: the host waits for the copies out of it that it deferred (host_waits). */
static void settle_host_waits(loom_sched *s, int b) {
    for (int a = 0; a < s->n_backends; a++) {
        if (s->bufts[a] != s->bufts[b]) continue;
        for (int x = 0; x < s->n_backends && s->host_waits[a]; x++) {
            if (!(s->host_waits[a] & (1u << x))) continue;
            loom_event_synchronize(s->copies_done[x]);
            s->host_waits[a] &= ~(1u << x);
        }
    }
}

/* The split input whose copy (on the split's backend) is t, or NULL. */
static loom_tensor *original_of(const loom_sched *s, const loom__split *sp, const loom_tensor *t) {
    for (int j = 0; j < sp->n_inputs; j++) {
        int id = loom__sched_id(s, sp->inputs[j]);
        for (int c = 0; c < s->n_copies; c++) {
            if (loom__sched_copy_get(s, id, sp->backend_id, c) == t) return sp->inputs[j];
        }
    }
    return NULL;
}

static bool produced_in_split(const loom__split *sp, const loom_tensor *t) {
    const loom_tensor *root = t->view_src ? t->view_src : t;
    for (int i = 0; i < sp->graph->n_nodes; i++) {
        const loom_tensor *n = sp->graph->nodes[i];
        if (n == t || n == root || (n->view_src && n->view_src == root)) return true;
    }
    return false;
}

/* Whether the copy `cpy` of expert tensor `input` is read only by MUL_MAT_IDs of this
 * split whose ids come from outside it (so they can be read before the split runs). */
static bool expert_only(const loom__split *sp, const loom_tensor *input, const loom_tensor *cpy) {
    loom_buffer_t buf =
        input->view_src && input->view_src->buffer ? input->view_src->buffer : input->buffer;
    if (!buf || loom_buffer_get_usage(buf) != LOOM_BUFFER_USAGE_WEIGHTS ||
        !loom_buffer_is_host(buf) || input->ne[2] <= 1 || !input->data) {
        return false;
    }
    int n_users = 0;
    for (int i = 0; i < sp->graph->n_nodes; i++) {
        const loom_tensor *node = sp->graph->nodes[i];
        for (int j = 0; j < LOOM_MAX_SRC; j++) {
            if (node->src[j] != cpy) continue;
            if (node->op != LOOM_OP_MUL_MAT_ID || j != 0 || !node->src[2]) return false;
            if (produced_in_split(sp, node->src[2])) return false;
            n_users++;
        }
    }
    return n_users > 0;
}

/* Marks the experts the ids tensor selects. */
static loom_status read_ids(loom_sched *s, const loom__split *sp, const loom_tensor *ids_in,
                            int64_t n_expert, expert_cache *cache, uint8_t *used) {
    const loom_tensor *ids = original_of(s, sp, ids_in);
    if (!ids) ids = ids_in; /* produced earlier on this backend */
    if (cache->ids != ids || cache->n_expert != n_expert) {
        if (ids->type != LOOM_TYPE_I32) {
            return loom_error(LOOM_ERR_TYPE, "sched: MUL_MAT_ID ids %s must be I32", ids->name);
        }
        if (n_expert > cache->cap) {
            uint8_t *u = loom_realloc(cache->used, (size_t)n_expert);
            if (!u) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory (experts)");
            cache->used = u;
            cache->cap = n_expert;
        }
        memset(cache->used, 0, (size_t)n_expert);
        int b = loom__sched_backend_of(s, ids);
        if (b >= 0) loom__sched_sync(s, b);
        size_t nbytes = loom_nbytes(ids);
        char *host = loom_malloc(nbytes ? nbytes : 1);
        if (!host) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory (ids)");
        loom_tensor_get(ids, host, 0, nbytes);
        for (int64_t i3 = 0; i3 < ids->ne[3]; i3++) {
            for (int64_t i2 = 0; i2 < ids->ne[2]; i2++) {
                for (int64_t i1 = 0; i1 < ids->ne[1]; i1++) {
                    for (int64_t i0 = 0; i0 < ids->ne[0]; i0++) {
                        int32_t e;
                        memcpy(&e,
                               host + i0 * ids->nb[0] + i1 * ids->nb[1] + i2 * ids->nb[2] +
                                   i3 * ids->nb[3],
                               sizeof(e));
                        if (e < 0 || e >= n_expert) {
                            loom_free(host);
                            return loom_error(LOOM_ERR_INVALID_ARG,
                                              "sched: MUL_MAT_ID ids %s select expert %d, "
                                              "outside [0, %lld)",
                                              ids->name, (int)e, (long long)n_expert);
                        }
                        cache->used[e] = 1;
                    }
                }
            }
        }
        loom_free(host);
        cache->ids = ids;
        cache->n_expert = n_expert;
    }
    for (int64_t e = 0; e < n_expert; e++)
        used[e] |= cache->used[e];
    return LOOM_OK;
}

/* Copies only the experts the split's MUL_MAT_IDs select, grouped into runs. */
static loom_status copy_experts(loom_sched *s, const loom__split *sp, loom_tensor *input,
                                loom_tensor *cpy, expert_cache *cache) {
    const int64_t n_expert = input->ne[2];
    const size_t expert_size = input->nb[2];
    uint8_t *used = loom_calloc((size_t)n_expert, 1);
    if (!used) return loom_error(LOOM_ERR_NOMEM, "sched: out of host memory (experts)");
    loom_status st = LOOM_OK;
    for (int i = 0; i < sp->graph->n_nodes && st == LOOM_OK; i++) {
        const loom_tensor *node = sp->graph->nodes[i];
        if (node->op == LOOM_OP_MUL_MAT_ID && node->src[0] == cpy) {
            st = read_ids(s, sp, node->src[2], n_expert, cache, used);
        }
    }
    loom_backend_t be = s->backends[sp->backend_id];
    for (int64_t e = 0; e < n_expert && st == LOOM_OK;) {
        if (!used[e]) {
            e++;
            continue;
        }
        int64_t first = e;
        while (e < n_expert && used[e])
            e++;
        int64_t last = e - 1;
        size_t pad =
            last < n_expert - 1
                ? (expert_size < LOOM_SCHED_EXPERT_PAD ? expert_size : LOOM_SCHED_EXPERT_PAD)
                : 0;
        size_t offset = (size_t)first * expert_size;
        size_t size = (size_t)(last - first + 1) * expert_size + pad;
        loom_backend_tensor_set_async(be, cpy, (const char *)input->data + offset, offset, size);
    }
    loom_free(used);
    return st;
}

static loom_status copy_inputs(loom_sched *s, loom__split *sp, expert_cache *cache) {
    const int b = sp->backend_id;
    bool read_from[LOOM_SCHED_MAX_BACKENDS] = {false};
    for (int j = 0; j < sp->n_inputs; j++) {
        loom_tensor *input = sp->inputs[j];
        int iid = loom__sched_id(s, input);
        int a = s->t_backend[iid];
        loom_tensor *cpy = loom__sched_copy_get(s, iid, b, s->cur_copy);
        loom_status st;
        if (input->flags & LOOM_TENSOR_FLAG_INPUT) {
            /* the caller may overwrite it as soon as compute returns: copy now */
            host_wait_writable(s, b);
            st = loom_tensor_copy(input, cpy);
        } else if (expert_only(sp, input, cpy)) {
            st = copy_experts(s, sp, input, cpy, cache);
        } else {
            wait_for(s, b, a);
            st = loom_backend_tensor_copy_async(s->backends[a], s->backends[b], input, cpy);
            read_from[a] = true;
        }
        if (st != LOOM_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", loom_last_error());
            return loom_error(st, "sched: copying %s from %s to %s failed: %s", input->name,
                              loom_backend_name(s->backends[a]), loom_backend_name(s->backends[b]),
                              why);
        }
    }
    /* A copy may still be queued on this backend when the source backend moves on (to the
     * next graph, with pipeline copies): it must not overwrite what is being copied. */
    loom_event_t done = s->copies_done[b];
    bool recorded = false;
    for (int a = 0; a < s->n_backends; a++) {
        if (!read_from[a] || a == b) continue;
        if (!done) {
            loom__sched_sync(s, b);
            break;
        }
        if (!recorded) {
            loom_event_record(done, s->backends[b]);
            recorded = true;
        }
        s->pending_reads[b] |= 1u << a;
        if (s->backends[a]->iface->event_wait) {
            loom_event_wait(s->backends[a], done);
        } else {
            s->host_waits[a] |= 1u << b; /* settled before a's memory is written again */
        }
    }
    return LOOM_OK;
}

/* Runs a split in pieces: nodes nobody observes are batched, each observed node is handed
 * to the callback after its piece ran. *stop is set when the callback asks to stop. */
static loom_status compute_observed(loom_sched *s, loom__split *sp, bool *stop) {
    loom_backend_t be = s->backends[sp->backend_id];
    int n = sp->graph->n_nodes;
    for (int j0 = 0; j0 < n; j0++) {
        loom_tensor *t = sp->graph->nodes[j0];
        bool need = s->eval_cb(t, be, true, s->eval_ud);
        int j1 = j0;
        while (!need && j1 < n - 1) {
            t = sp->graph->nodes[++j1];
            need = s->eval_cb(t, be, true, s->eval_ud);
        }
        loom_graph gv = loom_graph_view(sp->graph, j0, j1 + 1);
        loom_status st = loom_backend_graph_compute_async(be, &gv);
        if (st != LOOM_OK) return st;
        loom__sched_sync(s, sp->backend_id);
        if (s->async_status != LOOM_OK) return loom__sched_take_status(s);
        if (need && !s->eval_cb(t, be, false, s->eval_ud)) {
            *stop = true;
            return LOOM_OK;
        }
        j0 = j1;
    }
    return LOOM_OK;
}

loom_status loom__sched_compute_splits(loom_sched *s) {
    expert_cache cache = {0};
    loom_status st = LOOM_OK;
    int prev = -1;
    s->rounds[s->cur_copy].issued = true;
    for (int k = 0; k < s->n_splits && st == LOOM_OK; k++) {
        loom__split *sp = &s->splits[k];
        const int b = sp->backend_id;
        loom_backend_t be = s->backends[b];
        if (prev >= 0 && prev != b) wait_for(s, b, prev);
        settle_host_waits(s, b); /* the copies below and the split write b's memory */

        st = copy_inputs(s, sp, &cache);
        if (st != LOOM_OK) break;

        bool stop = false;
        if (s->eval_cb) {
            st = compute_observed(s, sp, &stop);
        } else if (sp->graph->n_nodes > 0) {
            st = loom_backend_graph_compute_async(be, sp->graph);
        }
        if (st != LOOM_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", loom_last_error());
            st = loom_error(st, "sched: split %d on %s failed: %s", k, loom_backend_name(be), why);
            break;
        }
        if (event_of(s, b)) loom_event_record(event_of(s, b), be);
        prev = b;
        if (stop) break;
    }
    loom_free(cache.used);
    return st;
}
