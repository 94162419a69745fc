/*
 * gpt-oss (openai-moe): llama's recipe with attention biases, one learned sink logit per
 * head (attn_sinks, taking part in the softmax without a value), sliding-window layers
 * alternating with global ones (even layers slide), YaRN rope (rope.scaling.*), and MoE
 * with a router bias, routing weights = softmax over the chosen experts' logits, expert
 * biases added per chosen expert (ADD_ID) and the clamped SwiGLU
 *   min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1).
 * Its pre-FFN norm is called post_attention_norm. The real files' experts are MXFP4.
 */
#include "model/arch-impl.h"

static const char *const GPTOSS_KEYS[] = {"attention.sliding_window", NULL};

static loom_status read_gptoss(const loom_gguf *g, loom_hparams *hp) {
    loom_status st = loom__key_int(g, hp->arch, "attention.sliding_window", false, 0, &hp->n_swa);
    if (st) return st;
    if (hp->n_swa < 0)
        return loom_error(LOOM_ERR_FORMAT, "model: gpt-oss.attention.sliding_window %lld",
                          (long long)hp->n_swa);
    for (int64_t il = 0; il < hp->n_layer; il++)
        hp->swa_layer[il] = hp->n_swa > 0 && il % 2 == 0;
    hp->rope_freq_base_swa = hp->rope_freq_base;
    hp->rope_freq_scale_swa = hp->rope_freq_scale;
    hp->moe_softmax_selected = true;
    hp->norm_topk = false;
    hp->swiglu_alpha = 1.702f;
    hp->swiglu_limit = 7.0f;
    return LOOM_OK;
}

const loom__arch loom__arch_gptoss = {
    .name = "gpt-oss", .rope_type = LOOM_ROPE_TYPE_NEOX, .keys = GPTOSS_KEYS, .read = read_gptoss};
