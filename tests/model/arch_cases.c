/* The architecture cases (see arch_cases.h). */
#include "tests/model/arch_cases.h"

#include <string.h>

const int32_t ARCH_IDS[ARCH_N_EVAL] = {1, 15, 290, 300, 270, 99, 311};

loom_synth_params arch_base_params(const char *arch) {
    loom_synth_params p = loom_synth_params_default();
    p.arch = arch;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 96;
    p.n_layer = 2;
    p.n_vocab = 320;
    p.n_ctx = 64;
    p.seed = 11;
    return p;
}

static void gemma3_rope(loom_gguf_writer *w) {
    loom_gguf_set_f32(w, "gemma3.rope.scaling.factor", 2.0f);
}

/* phi3 128k-style: trained on 32 positions, so the test's 64-position cache takes the long
 * factors */
static void phi3_longrope(loom_gguf_writer *w) {
    loom_gguf_set_f32(w, "phi3.rope.scaling.attn_factor", 1.19f);
    loom_gguf_set_u32(w, "phi3.rope.scaling.original_context_length", 32);
}

static void gptoss_yarn(loom_gguf_writer *w) {
    loom_gguf_set_str(w, "gpt-oss.rope.scaling.type", "yarn");
    loom_gguf_set_f32(w, "gpt-oss.rope.scaling.factor", 4.0f);
    loom_gguf_set_u32(w, "gpt-oss.rope.scaling.original_context_length", 256);
}

static arch_case CASES[16];
static int n_cases;

static arch_case *add(const char *name, const char *arch, int red) {
    arch_case *c = &CASES[n_cases++];
    *c = (arch_case){.name = name, .p = arch_base_params(arch), .reductions_per_layer = red};
    return c;
}

static void init(void) {
    if (n_cases) return;
    arch_case *c;
    add("llama", "llama", 2);
    c = add("llama31", "llama", 2); /* llama 3.1: rope_freqs factors, tied embeddings */
    c->p.rope_freqs = true;
    c->p.tied = true;
    c = add("llama-mqa", "llama", 2); /* one KV head: mirrored */
    c->p.n_head_kv = 1;
    c = add("mixtral", "llama", 2); /* the reference engines call mixtral files llama */
    c->p.n_expert = 4;
    c->p.n_expert_used = 2;
    c = add("qwen2", "qwen2", 2);
    c->p.attn_biases = true;
    c = add("qwen2moe", "qwen2moe", 2); /* attention; routed experts + shared expert, one sum */
    c->p.attn_biases = true;
    c->p.n_expert = 4;
    c->p.n_expert_used = 2;
    c->p.n_ff = 32;
    c->p.n_ff_shexp = 64;
    c = add("qwen3", "qwen3", 2);
    c->p.qk_norm = true;
    c->p.head_dim = 32;
    c = add("qwen3moe", "qwen3moe", 2);
    c->p.qk_norm = true;
    c->p.n_expert = 4;
    c->p.n_expert_used = 2;
    c->p.n_ff = 32;
    c = add("gemma2", "gemma2", 2);
    c->p.n_layer = 26; /* the reference engines know gemma2 by its layer counts (2B) */
    c->p.tied = true;
    c->p.n_swa = 3;
    c = add("gemma3", "gemma3", 2);
    c->p.n_layer = 6; /* five sliding-window layers, then a global one */
    c->p.tied = true;
    c->p.qk_norm = true;
    c->p.head_dim = 32;
    c->p.n_swa = 3;
    c->edit = gemma3_rope;
    c = add("phi3", "phi3", 2);
    c->p.fused_qkv = true;
    c->p.fused_gate_up = true;
    c->p.n_head_kv = 4;
    c->p.n_swa = 4;
    c = add("phi3-longrope", "phi3", 2);
    c->p.fused_qkv = true;
    c->p.fused_gate_up = true;
    c->p.n_head_kv = 4;
    c->p.n_swa = 4;
    c->p.longrope = true;
    c->edit = phi3_longrope;
    c = add("gpt-oss", "gpt-oss", 2);
    c->p.n_expert = 4;
    c->p.n_expert_used = 2;
    c->p.n_ff = 32;
    c->p.biases = true;
    c->p.n_swa = 3;
    c->edit = gptoss_yarn;
}

int arch_case_count(void) {
    init();
    return n_cases;
}

const arch_case *arch_case_get(int i) {
    init();
    return i >= 0 && i < n_cases ? &CASES[i] : NULL;
}

loom_status arch_case_write(const arch_case *c, void **data, size_t *size) {
    loom_gguf_writer *w = NULL;
    loom_status st = loom_model_synth(&c->p, &w);
    if (st) return st;
    if (c->edit) c->edit(w);
    st = loom_gguf_write_memory(w, data, size);
    loom_gguf_writer_free(w);
    return st;
}

loom_status arch_case_open(const arch_case *c, void **data, loom_gguf **g) {
    size_t size = 0;
    *data = NULL;
    *g = NULL;
    loom_status st = arch_case_write(c, data, &size);
    if (st == LOOM_OK) st = loom_gguf_open_memory(*data, size, g);
    if (st) {
        loom_free(*data);
        *data = NULL;
    }
    return st;
}
