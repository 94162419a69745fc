/*
 * A minimal single-backend evaluator: builds the batch graph, places every intermediate in
 * one fresh buffer of the backend's buffer type, computes, and reads the logits. It is the
 * reference path that the scheduler and the meta device are compared against (and what
 * tests use on the CPU), not the fast path: it reallocates per call.
 */
#include <string.h>

#include "loom/model.h"
#include "model/run-simple.h"

loom_status loom_model_eval_simple(const loom_model *m, const loom_kv_cache *kv,
                                   loom_backend_t backend, const int32_t *tokens,
                                   int64_t n_tokens, int64_t n_past, bool all_logits,
                                   float *logits_out) {
    loom_ctx *ctx = loom_ctx_new(
        (loom_ctx_params){.mem_size = loom_model_graph_ctx_size(m), .no_alloc = true});
    if (!ctx) return loom_last_status();
    loom_batch_graph bg;
    loom_status st = loom_model_build_graph(m, kv, ctx, n_tokens, n_past, all_logits, &bg);
    loom_buffer_t buf = NULL;
    if (st == LOOM_OK) {
        buf = loom_alloc_ctx_tensors(ctx, loom_backend_default_buft(backend));
        if (!buf) st = loom_last_status() ? loom_last_status() : LOOM_ERR_NOMEM;
    }
    /* views of tensors that live elsewhere (the KV cache) */
    for (loom_tensor *t = loom_ctx_first_tensor(ctx); st == LOOM_OK && t;
         t = loom_ctx_next_tensor(ctx, t))
        if (t->view_src && !t->buffer && t->view_src->buffer) st = loom_buffer_init_view(t);
    if (st == LOOM_OK) st = loom_batch_set_inputs(&bg, tokens);
    if (st == LOOM_OK) st = loom_backend_graph_compute(backend, bg.graph);
    if (st == LOOM_OK)
        loom_tensor_get(bg.logits, logits_out, 0, loom_nbytes(bg.logits));
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    return st;
}
