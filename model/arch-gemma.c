/*
 * The gemma family: gemma2 and gemma3. Recipe per layer (graph.c):
 *   x = token_embd[tokens] * sqrt(n_embd)
 *   x += post_attention_norm(attn(attn_norm(x)))        (gemma3: q/k per-head norms)
 *   x += post_ffw_norm(W_down (gelu(W_gate h) * W_up h)), h = ffn_norm(x)
 *   logits = token_embd x output_norm(x)                 (gemma2: 30 tanh(logits / 30))
 * Sliding-window layers (positions p - j < n_swa) interleave with global ones: gemma2
 * every other layer (even ones slide), gemma3 five of every six (rope base 10000 there,
 * rope.freq_base and its scaling on the global layers). gemma2 also caps the attention
 * logits (attention.logit_softcapping). q is scaled by 1/sqrt(head_dim), or by
 * 1/sqrt(n_embd / n_head) for the 27B models (46 and 62 layers), as the reference does.
 */
#include <math.h>

#include "model/arch-impl.h"

static const char *const GEMMA2_KEYS[] = {"attention.sliding_window", "attention.logit_softcapping",
                                          "final_logit_softcapping", NULL};
static const char *const GEMMA3_KEYS[] = {"attention.sliding_window",
                                          "attention.sliding_window_pattern", NULL};

/* the window: gemma2's defaults to 4096 (as the reference's), gemma3's is required */
static loom_status common(const loom_gguf *g, loom_hparams *hp, int64_t pattern, int64_t n_27b,
                          bool window_required) {
    loom_status st;
    if ((st = loom__key_int(g, hp->arch, "attention.sliding_window", window_required, 4096,
                            &hp->n_swa)))
        return st;
    if (hp->n_swa < 0)
        return loom_error(LOOM_ERR_FORMAT, "model: %s.attention.sliding_window %lld", hp->arch,
                          (long long)hp->n_swa);
    if ((st = loom__key_int(g, hp->arch, "attention.sliding_window_pattern", false, pattern,
                            &pattern)))
        return st;
    if (pattern <= 0)
        return loom_error(LOOM_ERR_FORMAT, "model: %s.attention.sliding_window_pattern %lld",
                          hp->arch, (long long)pattern);
    /* layers il with il % pattern < pattern - 1 slide (pattern 1: all global) */
    for (int64_t il = 0; il < hp->n_layer; il++)
        hp->swa_layer[il] = hp->n_swa > 0 && il % pattern < pattern - 1;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->ffn_glu = LOOM_GLU_GEGLU;
    hp->post_norms = true;
    hp->attn_scale =
        1.0f / sqrtf((float)(hp->n_layer == n_27b ? hp->n_embd / hp->n_head : hp->head_dim));
    return LOOM_OK;
}

static loom_status check_softcap(const char *arch, const char *key, double f) {
    if (f >= 0 && f <= 3.4e38) return LOOM_OK;
    return loom_error(LOOM_ERR_FORMAT, "model: %s.%s = %g (must be finite and >= 0, 0: none)", arch,
                      key, f);
}

static loom_status read_gemma2(const loom_gguf *g, loom_hparams *hp) {
    loom_status st;
    double f;
    if ((st = common(g, hp, 2, 46, false))) return st;
    /* a cap of 0 means none (the graph caps only when > 0); NaN, a negative cap and Inf
     * would be dropped the same way without a word, so they are refused */
    if ((st = loom__key_float(g, hp->arch, "attention.logit_softcapping", 50.0, &f)) ||
        (st = check_softcap(hp->arch, "attention.logit_softcapping", f)))
        return st;
    hp->attn_softcap = (float)f;
    if ((st = loom__key_float(g, hp->arch, "final_logit_softcapping", 30.0, &f)) ||
        (st = check_softcap(hp->arch, "final_logit_softcapping", f)))
        return st;
    hp->final_softcap = (float)f;
    hp->rope_freq_base_swa = hp->rope_freq_base;
    hp->rope_freq_scale_swa = hp->rope_freq_scale;
    return LOOM_OK;
}

static loom_status read_gemma3(const loom_gguf *g, loom_hparams *hp) {
    loom_status st;
    if ((st = common(g, hp, 6, 62, true))) return st;
    hp->qk_norm = true;
    hp->rope_freq_base_swa = 10000.0f;
    hp->rope_freq_scale_swa = 1.0f;
    return LOOM_OK;
}

const loom__arch loom__arch_gemma2 = {
    .name = "gemma2", .rope_type = LOOM_ROPE_TYPE_NEOX, .keys = GEMMA2_KEYS, .read = read_gemma2};
const loom__arch loom__arch_gemma3 = {
    .name = "gemma3", .rope_type = LOOM_ROPE_TYPE_NEOX, .keys = GEMMA3_KEYS, .read = read_gemma3};
