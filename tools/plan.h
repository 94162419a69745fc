/*
 * `loom plan`'s engine: one candidate configuration (split mode, device count, context)
 * planned from a GGUF header alone. It builds the real session on sim devices with
 * virtual=1 memory (address space only, nothing copied or computed) and the weights placed
 * without their data, runs a prompt batch and one generated token through the scheduler
 * (so the compute buffers are the ones a real run reserves), then reads every buffer's
 * size per device and each device's virtual time under the profile's timing model.
 */
#ifndef LOOM_TOOLS_PLAN_H
#define LOOM_TOOLS_PLAN_H

#include "loom/session.h"
#include "loom/sim.h"

typedef struct loom_plan_opts {
    const char *spec_opts; /* the sim options after "sim:N," ("profile=rtx-3090,link=pcie4") */
    size_t dev_mem;        /* each device's memory (the profile's, or mem=) */
    bool p2p;              /* the link's p2p (for the report) */
    int64_t n_batch;       /* tokens per prompt graph */
    loom_type kv_type;
    const char *split_rules; /* or NULL */
} loom_plan_opts;

typedef struct loom_plan_candidate {
    loom_split_mode mode;
    int n_devices;
    int64_t n_ctx;
    bool ok; /* planned; else err says why */
    char err[256];
    /* bytes on the fullest device (the one that decides whether it fits) */
    double weights, kv, compute;
    double host;          /* host memory (token embeddings, ...) */
    double dev_total[16]; /* weights + kv + compute per device */
    bool fits;
    double pp_tps, tg_tps; /* projected: prompt of n_batch tokens, then one token */
    double pp_us, tg_us;
} loom_plan_candidate;

/* Plans one candidate (g opened with loom_gguf_open_header or loom_gguf_open). Fills *out
 * (out->ok false with out->err on a refusal such as a split the rules cannot make). */
void loom_plan_candidate_eval(const loom_gguf *g, const loom_plan_opts *o, loom_split_mode mode,
                              int n_devices, int64_t n_ctx, loom_plan_candidate *out);

/* The bytes of a session on sim devices: each device's allocation counter (dev_total),
 * the fullest device's weights and KV cache (as loom_cli_session_memory counts them) and
 * its compute (the rest: scheduler buffers and the meta device's scratch), and the
 * host's total. */
void loom_plan_session_bytes(loom_session *s, double *weights, double *kv, double *compute,
                             double *host, double *dev_total, int cap);

/* The projected time (us) of the work the session's sim devices did since the last call
 * (then resets their counters): tensor parallelism, the slowest device's op time plus the
 * link time it waited for; a layer split, the devices' op times added plus the longest
 * wait. 0 when the devices have no profile (or are not sim devices). */
double loom_plan_session_time_us(loom_session *s);

#endif
