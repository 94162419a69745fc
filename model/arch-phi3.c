/*
 * phi3: llama's recipe with one fused attn_qkv weight (q, k, v rows in that order) and one
 * fused ffn_up weight [n_embd, 2 n_ff] (gate rows first: silu(gate) * up), neox rope, and
 * a sliding window on every layer when the file gives attention.sliding_window. (Current
 * llama.cpp ignores phi3's window; the older engines and the model's own code use it.)
 * The 128k variants (phi3 "longrope", Phi-3.5) carry rope_factors_long / rope_factors_short
 * (the long ones once the cache exceeds rope.scaling.original_context_length) and
 * rope.scaling.attn_factor; llama.c and graph.c handle both for every architecture.
 */
#include "model/arch-impl.h"

static const char *const PHI3_KEYS[] = {"attention.sliding_window", NULL};

static loom_status read_phi3(const loom_gguf *g, loom_hparams *hp) {
    loom_status st = loom__key_int(g, hp->arch, "attention.sliding_window", false, 0, &hp->n_swa);
    if (st) return st;
    if (hp->n_swa < 0)
        return loom_error(LOOM_ERR_FORMAT, "model: phi3.attention.sliding_window %lld",
                          (long long)hp->n_swa);
    for (int64_t il = 0; il < hp->n_layer; il++)
        hp->swa_layer[il] = hp->n_swa > 0;
    hp->rope_freq_base_swa = hp->rope_freq_base;
    hp->rope_freq_scale_swa = hp->rope_freq_scale;
    return LOOM_OK;
}

const loom__arch loom__arch_phi3 = {
    .name = "phi3", .rope_type = LOOM_ROPE_TYPE_NEOX, .keys = PHI3_KEYS, .read = read_phi3};
