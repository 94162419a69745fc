/* The synthetic model of the quant-oracle comparison (gen_model.c, quant_oracle_test.c). */
#include "loom/model.h"

loom_synth_params loom_quant_oracle_params(void);

loom_synth_params loom_quant_oracle_params(void) {
    loom_synth_params p = loom_synth_params_default();
    p.n_embd = 256;
    p.n_ff = 512;
    p.n_layer = 2;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.n_vocab = 320;
    p.n_ctx = 64;
    p.seed = 1234;
    return p;
}
