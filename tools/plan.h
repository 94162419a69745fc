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
    const char *spec_opts;   /* the sim options after "sim:N," ("profile=rtx-3090,link=pcie4") */
    size_t dev_mem;          /* each device's memory (the profile's, or mem=) */
    bool p2p;                /* the link's p2p (for the report) */
    int64_t n_batch;         /* tokens per prompt graph */
    loom_type kv_type;       /* K cache (and V's unless kv_type_v_set) */
    const char *split_rules; /* or NULL */
    bool kv_type_v_set;      /* -ctv */
    loom_type kv_type_v;
    const float *tensor_split; /* -ts proportions of the first n_tensor_split devices */
    int n_tensor_split;
    int host_layers;           /* hybrid: the first host_layers layers (and the output) stay in
                                * host memory (-ngl n_layer - host_layers); 0: none */
    size_t host_mem;           /* the host's memory (the host profile's) for the hybrid's fit */
    double link_gbps, link_us; /* the device link (host <-> device copies of the hybrid) */
    const double *dev_growth;  /* hybrid: each device's growth at a first evaluation (the
                                * all-on-devices candidate's `growth`), added to its bytes */
} loom_plan_opts;

typedef struct loom_plan_candidate {
    loom_split_mode mode;
    int n_devices;
    int64_t n_ctx;
    bool ok; /* planned; else err says why */
    char err[256];
    /* bytes on the fullest device (the one that decides whether it fits) */
    double weights, kv, compute;
    double host;                                /* host memory (token embeddings, ...) */
    double host_weights, host_kv, host_compute; /* its parts */
    int host_layers;      /* hybrid: layers kept in host memory (0: not a hybrid) */
    double dev_total[16]; /* weights + kv + compute per device */
    bool fits;
    double pp_tps, tg_tps; /* projected: prompt of n_batch tokens, then one token */
    double pp_us, tg_us;
    int pp_nodes, tg_nodes; /* nodes of the prompt and generation graphs (0: not run) */
    /* bytes each device allocated while evaluating, beyond the session's reserve at its
     * creation: the reducer's scratch, sized by the batch's activations (not the layers) */
    double growth[16];
} loom_plan_candidate;

/* Plans one candidate (g opened with loom_gguf_open_header or loom_gguf_open). Fills *out
 * (out->ok false with out->err on a refusal such as a split the rules cannot make). */
void loom_plan_candidate_eval(const loom_gguf *g, const loom_plan_opts *o, loom_split_mode mode,
                              int n_devices, int64_t n_ctx, loom_plan_candidate *out);

/* The hybrid candidate over n_devices (tensor over them, or one device): the fewest host
 * layers (1..n_layer - 1) with which the devices' part fits o->dev_mem (n_layer - 1 when
 * none does: then it does not fit), planned like any candidate but with no evaluation at all:
 * the bytes are those the session reserves at creation (its worst case), and the times are
 * accounted from the model: the devices' share of `all_on_devices` (the same split with
 * every layer on the devices, already planned) by layer count, plus the host layers and
 * the output under the "host" profile (max of weight bytes over DDR bandwidth and FLOPs
 * over CPU throughput, over the efficiency, plus the profile's per-op overhead for the
 * host layers' share of the graph's nodes; a prompt batch of >= 32 tokens stages the host
 * weights over the link instead, as the scheduler's op offload does), plus the activation
 * copies between host and devices. No host layer is computed. */
void loom_plan_hybrid_eval(const loom_gguf *g, const loom_plan_opts *o, int n_devices,
                           int64_t n_ctx, const loom_plan_candidate *all_on_devices,
                           loom_plan_candidate *out);

/* The projected time (us) of the host part of a hybrid with host_layers layers and the
 * output in host memory: n tokens in one graph (see loom_plan_hybrid_eval). */
double loom_plan_host_time_us(const loom_gguf *g, const loom_plan_opts *o, int host_layers,
                              int64_t n_tokens, double n_ops);

/* The bytes of a session on sim devices: each device's allocation counter (dev_total),
 * the fullest device's weights and KV cache (as loom_cli_session_memory counts them) and
 * its compute (the rest: scheduler buffers and the meta device's scratch), and the
 * host's total. */
void loom_plan_session_bytes(loom_session *s, double *weights, double *kv, double *compute,
                             double *host, double *dev_total, int cap);
/* The host's row of the same report: weights, KV cache, compute buffers in host memory. */
void loom_plan_session_host_bytes(loom_session *s, double *weights, double *kv, double *compute);

/* The projected time (us) of the work the session's sim devices did since the last call
 * (then resets their counters): tensor parallelism, the slowest device's op time plus the
 * link time it waited for; a layer split, the devices' op times added plus the longest
 * wait. 0 when the devices have no profile (or are not sim devices). */
double loom_plan_session_time_us(loom_session *s);

#endif
