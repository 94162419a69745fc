/*
 * gen_model: writes the F32 model the quant-oracle comparison starts from (loom's synthetic
 * llama: n_embd 256, n_ff 512, 2 layers, 8 heads over 2 KV heads, vocab 320, seed 1234), so
 * that an external quantiser can make one file per type from exactly these weights.
 *
 *   gen_model OUT.gguf
 *
 * See README.md here for how the expected values in expected_logits.txt were produced.
 */
#include <stdio.h>

#include "loom/core.h"
#include "loom/gguf.h"
#include "loom/model.h"

loom_synth_params loom_quant_oracle_params(void);

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_model OUT.gguf\n");
        return 2;
    }
    loom_synth_params p = loom_quant_oracle_params();
    loom_gguf_writer *w = NULL;
    if (loom_model_synth(&p, &w) || loom_gguf_write_file(w, argv[1])) {
        fprintf(stderr, "gen_model: %s\n", loom_last_error());
        loom_gguf_writer_free(w);
        return 1;
    }
    loom_gguf_writer_free(w);
    return 0;
}
