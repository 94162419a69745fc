/*
 * synth_model: writes a random-weight llama GGUF of a given shape and weight type with
 * loom's own synthesiser (loom_model_synth), for `loom bench` tables (bench/README.md).
 * The default shape is TinyLlama-1.1B's: 22 layers, n_embd 2048, 32 heads over 4 KV heads
 * (head_dim 64), n_ff 5632, vocab 32000.
 *
 *   synth_model OUT.gguf [--type NAME] [--layers N] [--vocab N] [--seed S]
 *   synth_model --small     (CI: synthesise a 1-layer, 256-wide model in memory only)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/gguf.h"
#include "loom/loom.h"
#include "loom/model.h"

static bool type_by_name(const char *name, loom_type *out) {
    for (int t = 0; t < LOOM_TYPE_COUNT; t++) {
        const char *n = loom_type_name((loom_type)t);
        if (n && !strcmp(n, name)) {
            *out = (loom_type)t;
            return true;
        }
    }
    return false;
}

static void usage(FILE *f) {
    fprintf(f, "usage: synth_model OUT.gguf [--type NAME] [--layers N] [--vocab N] [--seed S]\n"
               "  TinyLlama-1.1B shape (2048 embd, 32/4 heads, 5632 ff); defaults: --type f32\n"
               "  --layers 22 --vocab 32000. NAME as loom prints it (f32, f16, q8_0, q4_K, ...)\n");
}

int main(int argc, char **argv) {
    const char *out = NULL;
    bool small = false;
    loom_synth_params p = loom_synth_params_default();
    p.arch = "llama";
    p.n_embd = 2048;
    p.n_layer = 22;
    p.n_head = 32;
    p.n_head_kv = 4;
    p.n_ff = 5632;
    p.n_vocab = 32000;
    p.n_ctx = 4096;
    p.wtype = LOOM_TYPE_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--small")) {
            small = true;
        } else if (!strcmp(a, "--type") && v) {
            if (!type_by_name(v, &p.wtype)) {
                fprintf(stderr, "synth_model: unknown type '%s'\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--layers") && v) {
            p.n_layer = atoll(v);
            i++;
        } else if (!strcmp(a, "--vocab") && v) {
            p.n_vocab = atoll(v);
            i++;
        } else if (!strcmp(a, "--seed") && v) {
            p.seed = strtoull(v, NULL, 10);
            i++;
        } else if (a[0] != '-' && !out) {
            out = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (small) {
        p.n_embd = 256;
        p.n_layer = 1;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.n_ff = 512;
        p.n_vocab = 512;
        p.n_ctx = 256;
    }
    if (!out && !small) {
        usage(stderr);
        return 2;
    }
    loom_gguf_writer *w = NULL;
    if (loom_model_synth(&p, &w) != LOOM_OK || (out && loom_gguf_write_file(w, out) != LOOM_OK)) {
        fprintf(stderr, "synth_model: %s\n", loom_last_error());
        loom_gguf_writer_free(w);
        return 1;
    }
    loom_gguf_writer_free(w);
    printf("synth_model: %s %s (%s, %lld layers, vocab %lld)\n",
           out ? "wrote" : "synthesised (not written)", out ? out : "", loom_type_name(p.wtype),
           (long long)p.n_layer, (long long)p.n_vocab);
    return 0;
}
