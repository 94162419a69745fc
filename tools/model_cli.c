#define _GNU_SOURCE
/*
 * Shared options of the model subcommands, the built-in default model (a synthetic llama
 * written with the GGUF writer, so `loom run` works with no file at all), and the
 * per-device memory report.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "loom/cpu.h"
#include "tools/cli.h"
#include "tools/model_cli.h"

void loom_model_opts_init(loom_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->sp = loom_session_params_default();
    o->n_batch = 2048; /* llama.cpp's defaults: -b 2048, -ub 512 */
    o->n_ubatch = 512;
    o->flash_attn = -1;
    o->prev_log_level = (int)loom_log_get_level();
}

void loom_model_opts_free(loom_model_opts *o) {
    loom_gguf_free(o->gguf);
    loom_free(o->synth_data);
    o->gguf = NULL;
    o->synth_data = NULL;
    if (o->verbose) loom_log_set_level((loom_log_level)o->prev_log_level);
    o->verbose = false;
    if (o->set_affinity) loom_cpu_set_affinity(LOOM_AFFINITY_DEFAULT);
    o->set_affinity = false;
}

const char *const loom_model_opts_names[] = {"-m",
                                             "--model",
                                             "-dev",
                                             "--device",
                                             "--devices",
                                             "-sm",
                                             "--split-mode",
                                             "-ngl",
                                             "--n-gpu-layers",
                                             "-t",
                                             "--threads",
                                             "-c",
                                             "--ctx-size",
                                             "-b",
                                             "--batch-size",
                                             "-ub",
                                             "--ubatch-size",
                                             "-ctk",
                                             "--cache-type-k",
                                             "-ctv",
                                             "--cache-type-v",
                                             "-fa",
                                             "--flash-attn",
                                             "-ts",
                                             "--tensor-split",
                                             "-mg",
                                             "--main-gpu",
                                             "-nkvo",
                                             "--no-kv-offload",
                                             "--no-op-offload",
                                             "--swa-full",
                                             "--no-mmap",
                                             "--split-rules",
                                             "--cpu-affinity",
                                             "-v",
                                             "--verbose",
                                             "--log-disable",
                                             NULL};

const char *loom_model_opts_help(void) {
    return "model and devices (llama.cpp names):\n"
           "  -m, --model FILE          GGUF model (default: a built-in synthetic llama with\n"
           "                            random weights); a bare name not found here is\n"
           "                            looked for in $LOOM_MODELS_DIR\n"
           "  -dev, --device, --devices SPEC\n"
           "                            cpu (default), sim:N[,opts], cuda:0,1, cuda; also\n"
           "                            llama.cpp's CUDA0,CUDA1 and none (= cpu)\n"
           "  -sm, --split-mode MODE    none | layer | tensor (default: tensor with >1 device);\n"
           "                            llama.cpp's row is refused (see the message)\n"
           "  -ts, --tensor-split LIST  per-device proportions, e.g. 3,1: heads, KV heads, FFN\n"
           "                            blocks (-sm tensor) or layers (-sm layer) in whole\n"
           "                            units by them; 0 leaves a device empty\n"
           "  -mg, --main-gpu I         the device of -sm none (only 0: the first listed)\n"
           "  -ngl, --n-gpu-layers N    layers on the devices (default: all; -1, all or auto =\n"
           "                            all; n_layer + 1 also puts the output layer there)\n"
           "  -t, --threads N           CPU threads (default: all cores)\n"
           "  --cpu-affinity P          none | compact | spread | numa: how CPU and NUMA\n"
           "                            device threads are pinned (default per topology)\n"
           "  -c, --ctx-size N          context (KV cache) length (default: min(train, 2048);\n"
           "                            0 = the model's training context, as llama.cpp's)\n"
           "  -b, --batch-size N        logical batch (default 2048)\n"
           "  -ub, --ubatch-size N      physical batch: tokens per graph (default 512); the\n"
           "                            graph batch is min(-b, -ub)\n"
           "  -ctk, --cache-type-k T    K cache type: f16 (default, as llama.cpp's), f32, bf16,\n"
           "                            q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (blocks: n_head_kv\n"
           "                            x head_dim whole blocks; with -sm tensor, head_dim too)\n"
           "  -ctv, --cache-type-v T    V cache type, the same types (--kv-type T sets both)\n"
           "  -fa, --flash-attn on|off|auto\n"
           "                            fused flash attention (auto = on) or mul_mat+soft_max\n"
           "  -nkvo, --no-kv-offload    keep the KV cache in host memory\n"
           "  --no-op-offload           never offload host-weight matmuls to a device\n"
           "  --swa-full                full-context caches for sliding-window layers\n"
           "                            (default: a ring of the window plus a batch)\n"
           "  --no-mmap                 read the weights into memory instead of using CPU\n"
           "                            weights in place from a mapping of the file\n"
           "  --split-rules FILE        split rules that override/extend the built-in table\n"
           "  -v, --verbose             library log at debug level on stderr\n"
           "  --log-disable             nothing but the output and errors: no library log,\n"
           "                            statistics, memory tables or warnings on stderr\n";
}

static bool is(const char *a, const char *x, const char *y, const char *z) {
    return !strcmp(a, x) || (y && !strcmp(a, y)) || (z && !strcmp(a, z));
}

/* llama.cpp's device lists ("CUDA0,CUDA1", "none") as loom specs; others unchanged. */
static const char *device_spec(loom_model_opts *o, const char *v) {
    if (!strcasecmp(v, "none")) return "cpu";
    if (strncasecmp(v, "cuda", 4) || !isdigit((unsigned char)v[4])) return v;
    size_t n = (size_t)snprintf(o->dev_buf, sizeof o->dev_buf, "cuda:");
    for (const char *p = v; *p && n < sizeof o->dev_buf - 8;) {
        if (strncasecmp(p, "cuda", 4)) return v;
        p += 4;
        if (!isdigit((unsigned char)*p)) return v;
        while (isdigit((unsigned char)*p))
            o->dev_buf[n++] = *p++;
        if (*p == ',')
            o->dev_buf[n++] = *p++;
        else if (*p)
            return v;
    }
    o->dev_buf[n] = 0;
    return o->dev_buf;
}

int loom_model_opts_parse(loom_model_opts *o, const char *cmd, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    int x;
#define TAKE() (*i += 1)
    if (is(a, "-m", "--model", NULL)) {
        if (!v) goto missing;
        o->model = loom_cli_path(v, o->model_buf, sizeof o->model_buf);
        if (!o->model) goto too_long;
        /* a bare file name that is not here: from $LOOM_MODELS_DIR, as the tests find them */
        const char *dir = getenv("LOOM_MODELS_DIR");
        if (!strchr(v, '/') && access(o->model, F_OK) != 0 && dir && dir[0]) {
            if (snprintf(o->model_buf, sizeof o->model_buf, "%s/%s", dir, v) >=
                (int)sizeof o->model_buf)
                goto too_long;
            o->model = o->model_buf;
        }
        TAKE();
    } else if (is(a, "--devices", "-dev", "--device")) {
        if (!v) goto missing;
        if (!v[0]) {
            fprintf(stderr, "loom %s: %s is empty (cpu, sim:N, cuda:0,1, ...)\n", cmd, a);
            return -1;
        }
        o->sp.devices = device_spec(o, v);
        TAKE();
    } else if (is(a, "--split-mode", "-sm", NULL)) {
        if (!v) goto missing;
        if (!strcmp(v, "row")) {
            fprintf(stderr,
                    "loom %s: %s row is llama.cpp's split of matrix rows with the rest on the "
                    "main GPU; loom has no such mode: use tensor (every weight and the KV cache "
                    "split over the devices) or layer\n",
                    cmd, a);
            return -1;
        }
        if (loom_split_mode_parse(v, &o->sp.split_mode)) {
            fprintf(stderr, "loom %s: %s\n", cmd, loom_last_error());
            return -1;
        }
        TAKE();
    } else if (is(a, "-ngl", "--n-gpu-layers", "--gpu-layers")) {
        if (v && (!strcmp(v, "auto") || !strcmp(v, "all")))
            x = -1; /* llama.cpp's words: every layer (auto: as many as fit, here all) */
        else if (!loom_cli_parse_int(cmd, a, v, -1, 100000, &x))
            return -1;
        o->sp.n_gpu_layers = (int)x;
        o->ngl_given = x >= 0;
        TAKE();
    } else if (is(a, "--cpu-affinity", NULL, NULL)) {
        if (!v) goto missing;
        loom_affinity aff;
        if (loom_affinity_parse(v, &aff)) {
            fprintf(stderr, "loom %s: --cpu-affinity: %s\n", cmd, loom_last_error());
            return -1;
        }
        loom_cpu_set_affinity(aff);
        o->set_affinity = true;
        TAKE();
    } else if (is(a, "--threads", "-t", NULL)) {
        if (!loom_cli_parse_int(cmd, a, v, 1, 1024, &x)) return -1;
        o->sp.threads = (int)x;
        TAKE();
    } else if (is(a, "--ctx", "-c", "--ctx-size")) {
        if (!loom_cli_parse_int(cmd, a, v, 0, 1 << 24, &x)) return -1;
        o->sp.n_ctx = x ? x : -1; /* 0: the training context (loom_session_params.n_ctx < 0) */
        o->n_ctx_given = x;
        TAKE();
    } else if (is(a, "--batch", "-b", "--batch-size")) {
        if (!loom_cli_parse_int(cmd, a, v, 1, 1 << 20, &x)) return -1;
        o->n_batch = x;
        TAKE();
    } else if (is(a, "-ub", "--ubatch-size", NULL)) {
        if (!loom_cli_parse_int(cmd, a, v, 1, 1 << 20, &x)) return -1;
        o->n_ubatch = x;
        TAKE();
    } else if (is(a, "--kv-type", NULL, NULL)) {
        if (!v) goto missing;
        o->ctk = o->ctv = v;
        TAKE();
    } else if (is(a, "-ctk", "--cache-type-k", NULL)) {
        if (!v) goto missing;
        o->ctk = v;
        TAKE();
    } else if (is(a, "-ctv", "--cache-type-v", NULL)) {
        if (!v) goto missing;
        o->ctv = v;
        TAKE();
    } else if (is(a, "-fa", "--flash-attn", NULL)) {
        if (!v) goto missing;
        if (!strcmp(v, "on") || !strcmp(v, "1"))
            o->flash_attn = 1;
        else if (!strcmp(v, "off") || !strcmp(v, "0"))
            o->flash_attn = 0;
        else if (!strcmp(v, "auto"))
            o->flash_attn = -1;
        else {
            fprintf(stderr, "loom %s: %s '%s' (on, off or auto)\n", cmd, a, v);
            return -1;
        }
        TAKE();
    } else if (is(a, "-ts", "--tensor-split", NULL)) {
        if (!v) goto missing;
        o->tensor_split = v;
        TAKE();
    } else if (is(a, "-mg", "--main-gpu", NULL)) {
        if (!loom_cli_parse_int(cmd, a, v, 0, 1023, &x)) return -1;
        o->main_gpu = (int)x;
        TAKE();
    } else if (is(a, "--no-kv-offload", "-nkvo", NULL)) {
        o->sp.no_kv_offload = true;
    } else if (is(a, "--no-op-offload", NULL, NULL)) {
        o->sp.no_op_offload = true;
    } else if (is(a, "--swa-full", NULL, NULL)) {
        o->sp.swa_full = true;
    } else if (is(a, "--no-mmap", NULL, NULL)) {
        o->sp.no_mmap = true;
    } else if (is(a, "--split-rules", NULL, NULL)) {
        if (!v) goto missing;
        o->sp.split_rules = loom_cli_path(v, o->rules_buf, sizeof o->rules_buf);
        if (!o->sp.split_rules) goto too_long;
        TAKE();
    } else if (is(a, "-v", "--verbose", "--log-verbose") || is(a, "--log-disable", NULL, NULL)) {
        if (!o->verbose) o->prev_log_level = (int)loom_log_get_level(); /* restored at free */
        o->verbose = true;
        o->log_disable = !strcmp(a, "--log-disable");
        loom_log_set_level(strcmp(a, "--log-disable") ? LOOM_LOG_DEBUG : LOOM_LOG_NONE);
    } else {
        return 0;
    }
#undef TAKE
    return 1;
missing:
    fprintf(stderr, "loom %s: %s needs a value\n", cmd, a);
    return -1;
too_long:
    fprintf(stderr, "loom %s: %s: the path is too long\n", cmd, a);
    return -1;
}

int loom_model_opts_parse_only(loom_model_opts *o, const char *cmd, const char *const *names,
                               int argc, char **argv, int *i) {
    for (const char *const *n = names; *n; n++)
        if (!strcmp(argv[*i], *n)) return loom_model_opts_parse(o, cmd, argc, argv, i);
    return 0;
}

bool loom_model_cli_kv_type(const char *cmd, const char *opt, const char *v, loom_type *out) {
    static const struct {
        const char *name;
        loom_type t;
    } known[] = {{"f32", LOOM_TYPE_F32},   {"f16", LOOM_TYPE_F16},   {"bf16", LOOM_TYPE_BF16},
                 {"q8_0", LOOM_TYPE_Q8_0}, {"q4_0", LOOM_TYPE_Q4_0}, {"q4_1", LOOM_TYPE_Q4_1},
                 {"q5_0", LOOM_TYPE_Q5_0}, {"q5_1", LOOM_TYPE_Q5_1}, {"iq4_nl", LOOM_TYPE_IQ4_NL}};
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
        if (!strcasecmp(v, known[k].name)) {
            *out = known[k].t;
            return true;
        }
    fprintf(stderr,
            "loom %s: %s '%s' is not a cache type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
            "iq4_nl)\n",
            cmd, opt, v);
    return false;
}

bool loom_model_cli_tensor_split(const char *cmd, const char *opt, const char *v, float *ts,
                                 int cap, int *n_out) {
    /* proportions: numbers >= 0, ',' or '/' separated, one per listed device (missing
     * ones are 0); heads, FFN blocks and layers are shared out by them */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    int n = 0;
    double sum = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",/", &save); t; t = strtok_r(NULL, ",/", &save), n++) {
        char *end = NULL;
        errno = 0;
        double x = strtod(t, &end);
        if (*end || errno || !(x >= 0) || x > 1e9) {
            fprintf(stderr, "loom %s: %s '%s': '%s' is not a proportion\n", cmd, opt, v, t);
            return false;
        }
        if (n >= cap) {
            fprintf(stderr, "loom %s: %s '%s': more than %d proportions\n", cmd, opt, v, cap);
            return false;
        }
        ts[n] = (float)x;
        sum += x;
    }
    if (n == 0 || !(sum > 0)) {
        fprintf(stderr, "loom %s: %s '%s' has no positive proportion\n", cmd, opt, v);
        return false;
    }
    *n_out = n;
    return true;
}

bool loom_model_opts_finish(loom_model_opts *o, const char *cmd) {
    loom_type tk = LOOM_TYPE_F16, tv = LOOM_TYPE_F16; /* llama.cpp's defaults */
    if (o->ctk && !loom_model_cli_kv_type(cmd, "-ctk", o->ctk, &tk)) return false;
    if (o->ctv && !loom_model_cli_kv_type(cmd, "-ctv", o->ctv, &tv)) return false;
    /* each defaults to f16, as llama.cpp's; one given alone sets only its own */
    o->sp.kv_type = tk;
    o->sp.kv_type_v_set = true;
    o->sp.kv_type_v = tv;
    o->sp.n_batch = o->n_batch < o->n_ubatch ? o->n_batch : o->n_ubatch;
    if (o->tensor_split) {
        int n = 0;
        if (!loom_model_cli_tensor_split(cmd, "-ts", o->tensor_split, o->ts,
                                         (int)(sizeof o->ts / sizeof o->ts[0]), &n))
            return false;
        o->sp.tensor_split = o->ts;
        o->sp.n_tensor_split = n;
    }
    if (o->main_gpu != 0) {
        fprintf(stderr,
                "loom %s: -mg %d: loom's split mode none uses the first listed device; list the "
                "device you want first instead (e.g. --devices cuda:%d)\n",
                cmd, o->main_gpu, o->main_gpu);
        return false;
    }
    return true;
}

FILE *loom_model_opts_info(const loom_model_opts *o) {
    return o->log_disable ? NULL : stderr;
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
        if (isatty(2) && !o->log_disable) {
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
    char why[256];
    loom_affinity aff = loom_cpu_affinity(why, sizeof why);
    bool numa = o->sp.devices && strstr(o->sp.devices, "numa") != NULL;
    FILE *info = loom_model_opts_info(o);
    if (info && (aff != LOOM_AFFINITY_NONE || o->set_affinity || numa))
        fprintf(info, "loom %s: cpu affinity %s (%s)%s\n", cmd, loom_affinity_name(aff), why,
                numa && loom_cpu_affinity_is_default() ? "; NUMA devices: numa" : "");
    if (loom_session_new(NULL, o->gguf, &o->sp, &s)) {
        fprintf(stderr, "loom %s: %s\n", cmd, loom_last_error());
        return NULL;
    }
    const loom_hparams *hp = &loom_session_model(s)->hp;
    if (info && o->n_ctx_given > hp->n_ctx_train && hp->n_ctx_train > 0) /* llama.cpp's warning */
        fprintf(info,
                "loom %s: warning: -c %lld exceeds the model's training context (%lld): the "
                "output may degrade past it\n",
                cmd, (long long)o->n_ctx_given, (long long)hp->n_ctx_train);
    if (info && o->ngl_given) {
        int on = o->sp.n_gpu_layers > hp->n_layer ? (int)hp->n_layer : o->sp.n_gpu_layers;
        fprintf(info, "loom %s: %s-ngl %d: %d/%lld layers on the devices%s\n", cmd,
                o->sp.n_gpu_layers > hp->n_layer + 1 ? "warning: " : "", o->sp.n_gpu_layers, on,
                (long long)hp->n_layer,
                o->sp.n_gpu_layers > hp->n_layer + 1 ? " (the model has no more)"
                : o->sp.n_gpu_layers > hp->n_layer   ? ", and the output layer"
                                                     : "");
    }
    const char *sp = o->sp.devices ? o->sp.devices : "";
    if (info && (!strcasecmp(sp, "numa") || !strcasecmp(sp, "cuda")) &&
        loom_devices_last_order()[0])
        fprintf(info, "loom %s: device order %s\n", cmd, loom_devices_last_order());
    /* -fa off: the graph is rebuilt on every eval, so the model's switch applies from the
     * next one (the same switch the meta model tests use) */
    ((loom_model *)loom_session_model(s))->no_flash_attn = o->flash_attn == 0;
    return s;
}

/* ---------------------------------------------------------------- memory report */

static bool is_numa(loom_dev_t dev) {
    loom_reg_t reg = dev ? loom_dev_reg(dev) : NULL;
    return reg && strcmp(loom_reg_name(reg), "NUMA") == 0;
}

static int mem_row(loom_cli_mem_row *rows, int *n, int cap, loom_dev_t dev) {
    /* host memory, except NUMA devices: each node's memory is its own row */
    if (dev && loom_dev_get_type(dev) == LOOM_DEV_TYPE_CPU && !is_numa(dev)) dev = NULL;
    for (int i = 0; i < *n; i++)
        if (rows[i].dev == dev) return i;
    if (*n >= cap) return -1;
    loom_cli_mem_row *r = &rows[(*n)++];
    memset(r, 0, sizeof *r);
    r->dev = dev;
    if (dev) {
        snprintf(r->name, sizeof r->name, "%s", loom_dev_name(dev));
        loom_dev_memory(dev, &r->free, &r->total);
    } else {
        snprintf(r->name, sizeof r->name, "host");
        long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES),
             psz = sysconf(_SC_PAGESIZE);
        if (pages > 0 && avail > 0 && psz > 0) {
            r->total = (size_t)pages * (size_t)psz;
            r->free = (size_t)avail * (size_t)psz;
        }
    }
    return *n - 1;
}

/* Adds a buffer's bytes to its device's row (each member of a meta buffer to its member). */
static void add_buffer(loom_cli_mem_row *rows, int *n, int cap, loom_buffer_t buf, int field) {
    if (!buf) return;
    loom_dev_t dev = loom_buft_device(loom_buffer_buft(buf));
    if (dev && loom_dev_is_meta(dev)) {
        for (int j = 0; j < loom_meta_n_devices(dev); j++)
            add_buffer(rows, n, cap, loom_meta_buffer_member(buf, j), field);
        return;
    }
    int i = mem_row(rows, n, cap, loom_buffer_is_host(buf) && !is_numa(dev) ? NULL : dev);
    if (i < 0) return;
    double b = (double)loom_buffer_size(buf);
    if (field == 0)
        rows[i].weights += b;
    else if (field == 1)
        rows[i].kv += b;
    else
        rows[i].compute += b;
}

int loom_cli_session_memory(loom_session *s, loom_cli_mem_row *rows, int cap) {
    int n = 0;
    /* the session's devices first, in order, even when they hold nothing (idle shows) */
    for (int d = 0; d < loom_session_n_devices(s); d++)
        mem_row(rows, &n, cap, loom_session_device(s, d));
    mem_row(rows, &n, cap, NULL);
    const loom_model *m = loom_session_model(s);
    for (int b = 0; b < m->n_buffers; b++)
        add_buffer(rows, &n, cap, m->buffers[b], 0);
    const loom_kv_cache *kv = loom_session_kv(s);
    for (int b = 0; kv && b < kv->n_buffers; b++)
        add_buffer(rows, &n, cap, kv->buffers[b], 1);
    loom_sched *sc = loom_session_sched(s);
    for (int b = 0; b < loom_sched_get_n_backends(sc); b++) {
        loom_backend_t be = loom_sched_get_backend(sc, b);
        double size = (double)loom_sched_get_buffer_size(sc, be);
        loom_dev_t dev = loom_backend_device(be);
        if (loom_backend_is_meta(be)) {
            /* a meta buffer allocates its size on every member */
            for (int j = 0; j < loom_meta_n_devices(dev); j++) {
                int i = mem_row(rows, &n, cap, loom_meta_member(dev, j));
                if (i >= 0) rows[i].compute += size;
            }
        } else {
            int i = mem_row(rows, &n, cap, dev);
            if (i >= 0) rows[i].compute += size;
        }
    }
    return n;
}

int loom_cli_print_memory(FILE *f, const char *title, const loom_cli_mem_row *rows, int n) {
    int over = 0;
    fprintf(f, "%s\n  %-16s %11s %11s %11s %11s %11s %11s\n", title, "device", "weights",
            "KV cache", "compute", "total", "free", "of");
    for (int i = 0; i < n; i++) {
        const loom_cli_mem_row *r = &rows[i];
        char w[32], kv[32], c[32], t[32], fr[32], tot[32];
        double total = r->weights + r->kv + r->compute;
        loom_cli_format_bytes(w, sizeof w, r->weights);
        loom_cli_format_bytes(kv, sizeof kv, r->kv);
        loom_cli_format_bytes(c, sizeof c, r->compute);
        loom_cli_format_bytes(t, sizeof t, total);
        if (r->total) {
            loom_cli_format_bytes(fr, sizeof fr, (double)r->free);
            loom_cli_format_bytes(tot, sizeof tot, (double)r->total);
        } else {
            snprintf(fr, sizeof fr, "?");
            snprintf(tot, sizeof tot, "?");
        }
        bool no_fit = r->total && total > (double)r->free && r->dev;
        over += no_fit;
        fprintf(f, "  %-16s %11s %11s %11s %11s %11s %11s%s\n", r->name, w, kv, c, t, fr, tot,
                no_fit ? "  DOES NOT FIT" : "");
    }
    return over;
}
