/*
 * The llama family: llama 1/2/3/3.1+ (rope_freqs.weight factors, linear rope scaling, tied
 * embeddings when output.weight is absent), mistral, mixtral (and llama with experts).
 * Recipe per layer (graph.c): x += attn(rms_norm(x)); x += ffn_or_moe(rms_norm(x)).
 * Every key they use is common (llama.c), so the descriptors are only names and rope.
 */
#include "model/arch-impl.h"

const loom__arch loom__arch_llama = {.name = "llama", .rope_type = LOOM_ROPE_TYPE_NORMAL};
const loom__arch loom__arch_mistral = {.name = "mistral", .rope_type = LOOM_ROPE_TYPE_NORMAL};
const loom__arch loom__arch_mixtral = {.name = "mixtral", .rope_type = LOOM_ROPE_TYPE_NORMAL};
