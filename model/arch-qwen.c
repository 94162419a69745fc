/*
 * The qwen family: qwen2 (QKV biases, neox rope), qwen2moe (experts without renormalised
 * routing weights, plus a shared expert scaled by sigmoid(ffn_gate_inp_shexp . x)), qwen3
 * (per-head RMS norms attn_q_norm / attn_k_norm on q and k before rope), qwen3moe (qwen3's
 * attention, experts with renormalised routing weights). Recipe per layer as llama's.
 */
#include "model/arch-impl.h"

static const char *const QWEN2MOE_KEYS[] = {"expert_shared_feed_forward_length", NULL};

static loom_status read_qwen2moe(const loom_gguf *g, loom_hparams *hp) {
    hp->norm_topk = false;
    /* absent: the shared expert is as wide as the others (if the file has one) */
    return loom__key_int(g, hp->arch, "expert_shared_feed_forward_length", false, hp->n_ff,
                         &hp->n_ff_shexp);
}

static loom_status read_qwen3(const loom_gguf *g, loom_hparams *hp) {
    (void)g;
    hp->qk_norm = true;
    return LOOM_OK;
}

const loom__arch loom__arch_qwen2 = {.name = "qwen2", .rope_type = LOOM_ROPE_TYPE_NEOX};
const loom__arch loom__arch_qwen2moe = {.name = "qwen2moe",
                                        .rope_type = LOOM_ROPE_TYPE_NEOX,
                                        .keys = QWEN2MOE_KEYS,
                                        .read = read_qwen2moe};
const loom__arch loom__arch_qwen3 = {
    .name = "qwen3", .rope_type = LOOM_ROPE_TYPE_NEOX, .read = read_qwen3};
const loom__arch loom__arch_qwen3moe = {
    .name = "qwen3moe", .rope_type = LOOM_ROPE_TYPE_NEOX, .read = read_qwen3};
