/*
 * Architectures: each family file (arch-llama.c, arch-qwen.c, arch-gemma.c) describes its
 * members as data: the rope variant, the metadata keys it understands beyond the common
 * ones, and a hook that reads its own keys. llama.c reads the common keys, refuses any
 * "<arch>." key that no list names (so a key that changes the math is never silently
 * ignored), and graph.c builds every family's layers from the shared blocks.
 */
#ifndef LOOM_MODEL_ARCH_IMPL_H
#define LOOM_MODEL_ARCH_IMPL_H

#include "loom/model.h"

typedef struct loom__arch {
    const char *name;
    int rope_type;
    const char *const *keys; /* "<arch>." suffixes read by `read` (NULL-terminated), or NULL */
    /* reads the family's own keys after the common ones; NULL: none */
    loom_status (*read)(const loom_gguf *g, loom_hparams *hp);
} loom__arch;

extern const loom__arch loom__arch_llama, loom__arch_mistral, loom__arch_mixtral;
extern const loom__arch loom__arch_qwen2, loom__arch_qwen2moe, loom__arch_qwen3,
    loom__arch_qwen3moe;
extern const loom__arch loom__arch_gemma2, loom__arch_gemma3, loom__arch_phi3, loom__arch_gptoss;

/* Key helpers for the family hooks: "<hp->arch>.<suffix>" with a default when absent. */
loom_status loom__key_int(const loom_gguf *g, const char *arch, const char *suffix, bool required,
                          int64_t dflt, int64_t *out);
loom_status loom__key_float(const loom_gguf *g, const char *arch, const char *suffix, double dflt,
                            double *out);

/* loom_model_load with g's hyperparameters already read by loom_hparams_from_gguf (the
 * session reads them first, for its checks): hp is copied into the model, not read again. */
loom_status loom__model_load_hp(const loom_gguf *g, const loom_hparams *hp,
                                const loom_model_params *p, loom_model **out);

/* The KV positions a graph of n_tokens at n_past attends over (loom_batch_graph's n_kv):
 * n_past + n_tokens rounded up to LOOM_KV_PAD, at most n_ctx. The session compares it to
 * decide whether a built graph serves the next batch. */
int64_t loom__graph_n_kv(int64_t n_past, int64_t n_tokens, int64_t n_ctx);

#endif /* LOOM_MODEL_ARCH_IMPL_H */
