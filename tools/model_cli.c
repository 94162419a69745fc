#define _GNU_SOURCE
/*
 * Shared options of the model subcommands and the built-in default model (a synthetic
 * llama written with the GGUF writer, so `loom run` works with no file at all).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tools/model_cli.h"

void loom_model_opts_init(loom_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->sp = loom_session_params_default();
}

void loom_model_opts_free(loom_model_opts *o) {
    loom_gguf_free(o->gguf);
    loom_free(o->synth_data);
    o->gguf = NULL;
    o->synth_data = NULL;
}

const char *loom_model_opts_help(void) {
    return "  -m, --model FILE       GGUF model (default: a built-in synthetic llama)\n"
           "  --devices SPEC         cpu (default), sim:N[,opts], cuda:0,1, cuda\n"
           "  --split-mode MODE      none | layer | tensor (default: tensor with >1 device)\n"
           "  -ngl, --n-gpu-layers N layers on the devices (default: all)\n"
           "  --threads N            CPU threads (default: all cores)\n"
           "  --ctx N                context (KV cache) length (default: min(train, 2048))\n"
           "  --batch N              largest batch per graph (default 512)\n"
           "  --kv-type f32|f16      KV cache type (default f32)\n"
           "  --no-kv-offload        keep the KV cache in host memory\n"
           "  --no-op-offload        never offload host-weight matmuls to a device\n"
           "  --split-rules FILE     split rules that override/extend the built-in table\n";
}

static bool parse_long(const char *cmd, const char *opt, const char *v, long min, long max, long *out) {
    char *end = NULL;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !v[0] || *end || errno || x < min || x > max) {
        fprintf(stderr, "loom %s: %s needs an integer in %ld..%ld (got '%s')\n", cmd, opt, min, max, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

int loom_model_opts_parse(loom_model_opts *o, const char *cmd, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long x;
#define TAKE() (*i += 1)
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!v) goto missing;
        o->model = v;
        TAKE();
    } else if (!strcmp(a, "--devices")) {
        if (!v) goto missing;
        o->sp.devices = v;
        TAKE();
    } else if (!strcmp(a, "--split-mode") || !strcmp(a, "-sm")) {
        if (!v) goto missing;
        if (loom_split_mode_parse(v, &o->sp.split_mode)) {
            fprintf(stderr, "loom %s: %s\n", cmd, loom_last_error());
            return -1;
        }
        TAKE();
    } else if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers")) {
        if (!parse_long(cmd, a, v, -1, 100000, &x)) return -1;
        o->sp.n_gpu_layers = (int)x;
        TAKE();
    } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
        if (!parse_long(cmd, a, v, 1, 1024, &x)) return -1;
        o->sp.threads = (int)x;
        TAKE();
    } else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) {
        if (!parse_long(cmd, a, v, 1, 1 << 24, &x)) return -1;
        o->sp.n_ctx = x;
        TAKE();
    } else if (!strcmp(a, "--batch") || !strcmp(a, "-b")) {
        if (!parse_long(cmd, a, v, 1, 1 << 20, &x)) return -1;
        o->sp.n_batch = x;
        TAKE();
    } else if (!strcmp(a, "--kv-type")) {
        if (!v) goto missing;
        if (!strcasecmp(v, "f32")) o->sp.kv_type = LOOM_TYPE_F32;
        else if (!strcasecmp(v, "f16")) o->sp.kv_type = LOOM_TYPE_F16;
        else {
            fprintf(stderr, "loom %s: --kv-type '%s' (f32 or f16)\n", cmd, v);
            return -1;
        }
        TAKE();
    } else if (!strcmp(a, "--no-kv-offload")) {
        o->sp.no_kv_offload = true;
    } else if (!strcmp(a, "--no-op-offload")) {
        o->sp.no_op_offload = true;
    } else if (!strcmp(a, "--split-rules")) {
        if (!v) goto missing;
        o->sp.split_rules = v;
        TAKE();
    } else {
        return 0;
    }
#undef TAKE
    return 1;
missing:
    fprintf(stderr, "loom %s: %s needs a value\n", cmd, a);
    return -1;
}

static void progress(size_t done, size_t total, void *ud) {
    (void)ud;
    if (total < (64u << 20)) return; /* only files that take a moment */
    fprintf(stderr, "\rloading %3d%%", (int)(100.0 * (double)done / (double)total));
    if (done == total) fprintf(stderr, "\r            \r");
}

bool loom_model_opts_open(loom_model_opts *o, const char *cmd) {
    if (o->model) {
        if (loom_gguf_open(o->model, &o->gguf)) {
            fprintf(stderr, "loom %s: %s\n", cmd, loom_last_error());
            return false;
        }
        if (isatty(2)) {
            o->sp.progress = progress;
        }
        return true;
    }
    loom_synth_params p = loom_synth_params_default();
    loom_gguf_writer *w = NULL;
    if (loom_model_synth(&p, &w) || loom_gguf_write_memory(w, &o->synth_data, &o->synth_size) ||
        loom_gguf_open_memory(o->synth_data, o->synth_size, &o->gguf)) {
        fprintf(stderr, "loom %s: cannot build the default model: %s\n", cmd, loom_last_error());
        loom_gguf_writer_free(w);
        return false;
    }
    loom_gguf_writer_free(w);
    return true;
}

loom_session *loom_model_opts_session(loom_model_opts *o, const char *cmd) {
    loom_session *s = NULL;
    if (loom_session_new(NULL, o->gguf, &o->sp, &s)) {
        fprintf(stderr, "loom %s: %s\n", cmd, loom_last_error());
        return NULL;
    }
    return s;
}
