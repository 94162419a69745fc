/* The single-backend reference evaluator (model/run-simple.c). */
#ifndef LOOM_MODEL_RUN_SIMPLE_H
#define LOOM_MODEL_RUN_SIMPLE_H

#include "loom/model.h"

/* Evaluates n_tokens at n_past on one backend whose buffer type holds the weights' and the
 * cache's memory or can read it; writes [n_vocab x (all_logits ? n_tokens : 1)] floats. */
loom_status loom_model_eval_simple(const loom_model *m, const loom_kv_cache *kv,
                                   loom_backend_t backend, const int32_t *tokens,
                                   int64_t n_tokens, int64_t n_past, bool all_logits,
                                   float *logits_out);

#endif
