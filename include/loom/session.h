/*
 * A session: a GGUF model placed on devices, a KV cache, a scheduler, a tokenizer. This is
 * what `loom run`, `loom bench` and `loom explain` use, and what an engine embedding loom
 * would use to generate text.
 *
 * Placement (split modes):
 *   none    one device holds everything (the first listed, or the CPU);
 *   layer   layer i on device floor(i * N / n_layer) (with tensor_split: consecutive runs
 *           proportional to it); scheduler [dev0..devN-1, CPU];
 *   tensor  one meta device over all listed devices, every weight and the KV cache split
 *           by the architecture's rules (plus --split-rules); scheduler [Meta(...), CPU].
 * Token embeddings stay in host memory (their lookup runs on the CPU, as in llama.cpp).
 * With n_gpu_layers < n_layer, the remaining layers' weights stay in host memory: their
 * matmuls run on the CPU for small batches and are offloaded (weights staged) for large
 * ones unless op offload is off.
 */
#ifndef LOOM_SESSION_H
#define LOOM_SESSION_H

#include "loom/meta.h"
#include "loom/model.h"
#include "loom/rules.h"
#include "loom/sched.h"
#include "loom/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_split_mode {
    LOOM_SPLIT_MODE_DEFAULT = -1, /* tensor when several devices are listed, else none */
    LOOM_SPLIT_MODE_NONE = 0,
    LOOM_SPLIT_MODE_LAYER = 1,
    LOOM_SPLIT_MODE_TENSOR = 2,
} loom_split_mode;

LOOM_API const char *loom_split_mode_name(loom_split_mode m);
LOOM_API loom_status loom_split_mode_parse(const char *s, loom_split_mode *out);

typedef struct loom_session_params {
    const char *devices;        /* device spec: "cpu" (default), "sim:4", "cuda:0,1" */
    loom_split_mode split_mode;
    int n_gpu_layers;           /* layers on the devices; < 0: all */
    int threads;                /* CPU threads; <= 0: all cores */
    int64_t n_ctx;              /* KV cache positions; 0: min(train ctx, 2048); < 0: train */
    int64_t n_batch;            /* largest batch per graph; <= 0: 512 */
    loom_type kv_type;          /* K cache type (and V's unless kv_type_v_set): F32 (default),
                                 * F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL; a block
                                 * type needs n_head_kv x head_dim in whole blocks, and head_dim
                                 * in whole blocks when the cache is split by tensor */
    bool no_kv_offload;         /* keep the KV cache (and attention) in host memory */
    bool swa_full;              /* sliding-window layers keep n_ctx cells (default: a ring of
                                 * the window plus n_batch, loom_kv_cache_swa_cells) */
    bool no_op_offload;
    /* pipeline parallelism (4 copies of every tensor crossing devices, rotating per graph)
     * is used under llama.cpp's conditions: layer split over several devices, every layer
     * and the output offloaded, the KV cache offloaded, every device with async compute and
     * events; if its compute buffers do not fit it is dropped (logged). true: never. */
    bool no_pipeline;
    const char *split_rules;    /* a rules file that overrides/extends the built-in table */
    void (*progress)(size_t done, size_t total, void *user_data);
    void *progress_user_data;
    bool no_weight_data;        /* place the weights without copying them (planning only:
                                 * loom_model_params.no_data) */
    /* Explicit devices (borrowed; they outlive the session), used instead of `devices` when
     * n_devs > 0: e.g. the dist devices of include/loom/dist.h, one per MPI rank. */
    loom_dev_t *devs;
    int n_devs;
    bool kv_type_v_set;         /* V cache of kv_type_v (-ctv) instead of kv_type */
    loom_type kv_type_v;
    /* -ts: proportions of the first n_tensor_split listed devices (the others 0), e.g.
     * {3, 1}; NULL/0: even. Tensor mode: heads, KV heads, FFN blocks and experts in whole
     * units by these proportions (loom_rules_split_state_weighted); layer mode: consecutive
     * layers per device by them. Ignored by split mode none. */
    const float *tensor_split;
    int n_tensor_split;
    bool no_mmap;               /* read the weights instead of using CPU ones in place from a
                                 * mapping of the file (loom_model_params.no_mmap) */
    size_t load_chunk;          /* bytes per device-weight copy (loom_model_params.load_chunk) */
    /* Graph reuse (default on): a batch of the same shape class as the previous one (same
     * n_tokens, same KV bucket n_kv, same logits, same attention kind) computes the graph
     * and schedule it already has, with only its inputs (tokens, positions, masks) set
     * again. true: build and schedule every batch afresh. */
    bool no_graph_reuse;
} loom_session_params;

LOOM_API loom_session_params loom_session_params_default(void);
/* The context a session over a model with hyperparameters hp takes for a requested n_ctx
 * (loom_session_params.n_ctx): n_ctx when > 0, the training context when < 0, else
 * min(the training context, 2048). */
LOOM_API int64_t loom_session_ctx_for(const loom_hparams *hp, int64_t n_ctx);

typedef struct loom_session loom_session;

/* Opens path (or uses g if path is NULL; g is then borrowed and must outlive the session),
 * places the model and prepares everything. Errors name the file, device or tensor. The
 * planned weights and KV cache are checked against each device's free memory (an even
 * share of each for a meta device, or its tensor_split share) and the host's available
 * memory before anything is allocated (LOOM_ERR_DEVICE_OOM / LOOM_ERR_NOMEM naming the
 * device and both sizes). The compute buffers are then reserved for the worst-case graphs
 * (a full prompt batch and one token, both attending over the whole context), so
 * evaluation at any position does not reallocate them (LOOM_SCHED_DEBUG_REALLOC=1 stays quiet). A session on a "sim:" spec
 * frees the sim reg it created. */
LOOM_API loom_status loom_session_new(const char *path, const loom_gguf *g,
                                      const loom_session_params *p, loom_session **out);
LOOM_API void loom_session_free(loom_session *s);

LOOM_API const loom_model *loom_session_model(const loom_session *s);
/* NULL when the file has no vocabulary (tokenizer.ggml.model "none"): the session runs ids. */
LOOM_API const loom_tokenizer *loom_session_tokenizer(const loom_session *s);
LOOM_API loom_sched *loom_session_sched(const loom_session *s);
/* The meta backend in tensor mode, else NULL. */
LOOM_API loom_backend_t loom_session_meta_backend(const loom_session *s);
LOOM_API int loom_session_n_devices(const loom_session *s);
LOOM_API loom_dev_t loom_session_device(const loom_session *s, int i);
LOOM_API loom_split_mode loom_session_split_mode(const loom_session *s);
/* The device (index in the spec) holding layer il's weights: 0 in mode none and tensor
 * (tensor: the meta device), its device in layer mode, -1 when the layer stays in host
 * memory (-ngl) or il is out of range. */
LOOM_API int loom_session_layer_device(const loom_session *s, int layer);
/* Whether pipeline parallelism is on (after the reserve: false if it did not fit). */
LOOM_API bool loom_session_pipeline(const loom_session *s);
LOOM_API int64_t loom_session_n_past(const loom_session *s);
LOOM_API int64_t loom_session_n_ctx(const loom_session *s);
/* The KV cache (its tensors and buffers, e.g. for a memory report). */
LOOM_API const loom_kv_cache *loom_session_kv(const loom_session *s);
/* Forgets the KV cache contents (the next eval starts at position 0). */
LOOM_API void loom_session_clear(loom_session *s);

/* Evaluates tokens (split into batches of n_batch) at the current position; writes the
 * logits of the last token (or of every token when all_logits: n x n_vocab) to out. */
LOOM_API loom_status loom_session_eval(loom_session *s, const int32_t *tokens, int64_t n,
                                       bool all_logits, float *out);

/* Builds, splits and allocates (but does not run) the graph of a batch of n tokens at the
 * current position, so a caller can inspect the scheduler and the meta device (`loom
 * explain`). The graph stays valid until the next call on the session. */
LOOM_API loom_status loom_session_plan(loom_session *s, int64_t n, loom_graph **out);

typedef struct loom_session_stats {
    int64_t load_us;
    /* the scheduler's view of the last prompt (n > 1) and generation (n == 1) graphs */
    int prompt_nodes, prompt_splits;
    int gen_nodes, gen_splits;
    /* meta device, the last eval: reductions and bytes per graph */
    int last_reductions;
    uint64_t last_bytes_reduced;
    int last_subgraphs;
    /* scheduler copies the last eval's graphs used (bit c: copy c): with pipeline
     * parallelism a prompt of several batches rotates through them */
    unsigned last_copy_mask;
    /* batches whose graph was built and scheduled, and batches that reused the previous
     * graph and schedule (loom_session_params.no_graph_reuse) */
    uint64_t graphs_built, graphs_reused;
    /* meta device, the last eval: host time issuing subgraphs and reductions
     * (loom_meta_stats.issue_ns, reduce_ns) */
    uint64_t last_issue_ns, last_reduce_ns;
} loom_session_stats;

LOOM_API void loom_session_get_stats(const loom_session *s, loom_session_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_SESSION_H */
