/*
 * The bridge's reg, devices and backends, and its entry points (ggml_backend_init,
 * ggml_backend_score): what ggml's loader calls after dlopen of libggml-loom.so.
 *
 * Environment:
 *   LOOM_GGML_DEVICES      device specs separated by ';' ("sim:4", "cuda:0,1", "numa", any
 *                          spec loom_devices_from_spec takes); each is one ggml device LOOMk,
 *                          a loom meta device over that spec's devices. Unset: every CUDA
 *                          device as one LOOM0, or no device (one line says why).
 *   LOOM_GGML_MEMBERS=1    also every member as its own device LOOMk.j
 *   LOOM_GGML_SPLIT_RULES  a split-rules file (the format of `loom run --split-rules`) put in
 *                          front of the model's built-in table
 *   LOOM_GGML_DEBUG=1      say why supports_op refuses each op it refuses
 *   LOOM_GGML_MODEL        the GGUF file whose architecture and heads the split tables need;
 *                          by default the engine's own -m/--model argument
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml/bridge.h"
#include "loom/gguf.h"
#include "loom/meta.h"
#include "loom/model.h"
#include "loom/rules.h"

_Static_assert(offsetof(struct ggml_backend_buffer_type, device) == 0x40, "ggml 0.27 buft");
_Static_assert(offsetof(struct ggml_backend_buffer, buft) == 0x58, "ggml 0.27 buffer");
_Static_assert(offsetof(struct ggml_backend_buffer, size) == 0x68, "ggml 0.27 buffer");
_Static_assert(offsetof(struct ggml_backend, device) == 0x88, "ggml 0.27 backend");
_Static_assert(offsetof(struct ggml_backend_device, reg) == 0x78, "ggml 0.27 device");
_Static_assert(offsetof(struct ggml_backend_reg, context) == 0x28, "ggml 0.27 reg");

static struct {
    pthread_once_t once;
    struct ggml_backend_reg reg;
    lg_device *devs[LG_MAX_DEVICES];
    size_t n_devs;
    /* the split tables, made when the first weight asks (the model is known by then) */
    pthread_mutex_t split_lock;
    bool split_tried;
    loom_rules *rules;
    loom_hparams hp;
    loom_gguf *model; /* its header: the shapes weights must arrive in */
    char rules_path[4096];
} g = {.once = PTHREAD_ONCE_INIT, .split_lock = PTHREAD_MUTEX_INITIALIZER};

void lg_log(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "loom-ggml: %s\n", line);
}

/* ---------------------------------------------------------------- split tables */

/* The engine's -m/--model argument (llama.cpp's tools), from /proc/self/cmdline. */
static bool model_from_cmdline(char *out, size_t size) {
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return false;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    bool next = false;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
        const char *a = buf + i;
        if (next) {
            snprintf(out, size, "%s", a);
            return true;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) next = true;
        else if (!strncmp(a, "--model=", 8)) {
            snprintf(out, size, "%s", a + 8);
            return true;
        }
    }
    return false;
}

/* Whether path starts with the magic of ggml's legacy model files (whisper.cpp's models):
 * the uint32 0x67676d6c, "lmgg" on disk. */
static bool legacy_ggml_file(const char *path) {
    unsigned char m[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    const bool ok = fread(m, 1, 4, f) == 4 && !memcmp(m, "lmgg", 4);
    fclose(f);
    return ok;
}

static void split_tables_load(void) {
    char path[4096] = "";
    const char *env = getenv("LOOM_GGML_MODEL");
    if (env && *env) snprintf(path, sizeof path, "%s", env);
    else if (!model_from_cmdline(path, sizeof path)) {
        lg_log("no model file known (set LOOM_GGML_MODEL=FILE.gguf): every tensor is kept whole "
               "on every member (no tensor parallelism)");
        return;
    }
    if (legacy_ggml_file(path)) {
        lg_log("%s is a legacy ggml model file (whisper.cpp's format), not a GGUF: no split "
               "table; every tensor is kept whole on every member (no tensor parallelism)",
               path);
        return;
    }
    loom_gguf *f = NULL;
    loom_status st = loom_gguf_open_header(path, &f);
    if (!st) st = loom_hparams_from_gguf(f, &g.hp);
    if (!st) g.model = f;
    else loom_gguf_free(f);
    if (!st) st = loom_rules_builtin(g.hp.arch, g.hp.n_expert > 0, &g.rules);
    if (!st && g.rules_path[0]) {
        loom_rules *user = NULL;
        st = loom_rules_load_file(g.rules_path, &user);
        if (!st) st = loom_rules_prepend(g.rules, user);
    }
    if (st) {
        lg_log("split tables for %s: %s; every tensor is kept whole on every member (no tensor "
               "parallelism)",
               path, loom_last_error());
        loom_rules_free(g.rules);
        g.rules = NULL;
    }
}

static void split_tables_once(void) {
    pthread_mutex_lock(&g.split_lock);
    if (!g.split_tried) {
        g.split_tried = true;
        split_tables_load();
    }
    pthread_mutex_unlock(&g.split_lock);
}

bool lg_weight_sliced(lg_device *d, const struct ggml_tensor *t) {
    split_tables_once();
    if (!g.model || !t->name[0]) return false;
    const int64_t i = loom_gguf_find_tensor(g.model, t->name);
    if (i < 0) return false;
    int64_t ne[LOOM_MAX_DIMS];
    loom_gguf_tensor_ne(g.model, i, ne);
    for (int k = 0; k < LOOM_MAX_DIMS; k++) {
        if (ne[k] != t->ne[k]) {
            if (!d->wrapped) {
                lg_log("%s receives '%s' with %lld x %lld where the model file holds %lld x %lld: "
                       "ggml's own tensor split (-sm tensor) is wrapping %s, which splits "
                       "already. %s refuses every op (all runs on the CPU): use -dev %s with "
                       "-sm layer or none, or -sm tensor over its members (LOOM_GGML_MEMBERS=1)",
                       d->name, t->name, (long long)t->ne[0], (long long)t->ne[1],
                       (long long)ne[0], (long long)ne[1], d->name, d->name, d->name);
            }
            d->wrapped = true;
            return true;
        }
    }
    return false;
}

loom_status lg_leaf_state(const loom_tensor *t, loom_split_state *out, void *user_data) {
    lg_device *d = user_data;
    if (!t->name[0]) return LOOM_OK;
    split_tables_once();
    if (!g.rules || !loom_rules_match(g.rules, t->name)) return LOOM_OK;
    const int n = loom_meta_n_devices(d->dev);
    loom_status st = loom_rules_split_state(g.rules, &g.hp, t, n, out, NULL);
    if (st) {
        lg_log("%s: %s; '%s' is kept whole on every member", d->name, loom_last_error(), t->name);
        loom_split_state_init(out, LOOM_SPLIT_MIRRORED, n);
    }
    if (d->debug) lg_log("%s: '%s' split state axis %d", d->name, t->name, (int)out->axis);
    return LOOM_OK;
}

/* ---------------------------------------------------------------- backend */

typedef struct lg_backend {
    lg_device *d;
    loom_backend_t lb;
    loom_graph *graph;
    loom_ctx *graph_ctx;
} lg_backend;

static ggml_guid_t lg_guid(void) {
    static ggml_guid guid = {0x6c, 0x6f, 0x6f, 0x6d, 0x2d, 0x67, 0x67, 0x6d,
                             0x6c, 0x2d, 0x62, 0x72, 0x69, 0x64, 0x67, 0x65};
    return &guid;
}

static const char *be_name(ggml_backend_t backend) {
    return ((lg_backend *)backend->context)->d->name;
}

static void be_free(ggml_backend_t backend) {
    lg_backend *b = backend->context;
    const char *st = getenv("LOOM_GGML_STATS");
    if (st && *st && strcmp(st, "0") != 0 && loom_backend_is_meta(b->lb)) {
        loom_meta_stats ms;
        loom_meta_backend_get_stats(b->lb, &ms);
        lg_log("%s stats: %llu graphs, %llu plans built, %llu subgraphs, %llu allreduces "
               "(%llu bytes, %llu delayed)",
               b->d->name, (unsigned long long)ms.graphs, (unsigned long long)ms.plans_built,
               (unsigned long long)ms.subgraphs, (unsigned long long)ms.reductions,
               (unsigned long long)ms.bytes_reduced, (unsigned long long)ms.delayed);
    }
    if (st && *st && strcmp(st, "0") != 0) lg_log_op_stats(b->d);
    loom_backend_free(b->lb);
    loom_ctx_free(b->graph_ctx);
    free(b);
    free(backend);
}

static void be_synchronize(ggml_backend_t backend) {
    lg_backend *b = backend->context;
    if (loom_backend_synchronize(b->lb) != LOOM_OK)
        lg_log("%s: synchronize: %s", b->d->name, loom_last_error());
}

static enum ggml_status be_graph_compute(ggml_backend_t backend, struct ggml_cgraph *cg) {
    lg_backend *b = backend->context;
    return lg_graph_compute(b->d, b->lb, cg, &b->graph, &b->graph_ctx);
}

static const struct ggml_backend_i lg_backend_iface = {
    .get_name = be_name,
    .free = be_free,
    .synchronize = be_synchronize,
    .graph_compute = be_graph_compute,
};

/* ---------------------------------------------------------------- device */

static const char *dev_name(ggml_backend_dev_t dev) {
    return ((lg_device *)dev->context)->name;
}

static const char *dev_description(ggml_backend_dev_t dev) {
    return ((lg_device *)dev->context)->desc;
}

static void dev_memory(ggml_backend_dev_t dev, size_t *free_b, size_t *total) {
    loom_dev_memory(((lg_device *)dev->context)->dev, free_b, total);
}

static enum ggml_backend_dev_type dev_type(ggml_backend_dev_t dev) {
    (void)dev;
    return GGML_BACKEND_DEVICE_TYPE_GPU;
}

static void dev_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props *props) {
    props->name = dev_name(dev);
    props->description = dev_description(dev);
    dev_memory(dev, &props->memory_free, &props->memory_total);
    props->type = dev_type(dev);
    props->device_id = NULL;
    props->caps.async = false;
    props->caps.host_buffer = false;
    props->caps.buffer_from_host_ptr = false;
    props->caps.events = false;
}

static ggml_backend_t dev_init_backend(ggml_backend_dev_t dev, const char *params) {
    (void)params;
    lg_device *d = dev->context;
    lg_backend *b = calloc(1, sizeof *b);
    ggml_backend_t out = calloc(1, sizeof *out);
    if (!b || !out) {
        free(b);
        free(out);
        lg_log("%s: no memory for a backend", d->name);
        return NULL;
    }
    b->d = d;
    b->lb = loom_dev_init(d->dev, NULL);
    if (!b->lb) {
        lg_log("%s: %s", d->name, loom_last_error());
        free(b);
        free(out);
        return NULL;
    }
    *out = (struct ggml_backend){.guid = lg_guid(), .iface = lg_backend_iface, .device = dev,
                                 .context = b};
    return out;
}

static ggml_backend_buffer_type_t dev_buft(ggml_backend_dev_t dev) {
    return &((lg_device *)dev->context)->gbuft;
}

static bool dev_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor *op) {
    return lg_supports_op(dev->context, op);
}

static bool dev_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
    return buft == &((lg_device *)dev->context)->gbuft;
}

static const struct ggml_backend_device_i lg_device_iface = {
    .get_name = dev_name,
    .get_description = dev_description,
    .get_memory = dev_memory,
    .get_type = dev_type,
    .get_props = dev_props,
    .init_backend = dev_init_backend,
    .get_buffer_type = dev_buft,
    .supports_op = dev_supports_op,
    .supports_buft = dev_supports_buft,
};

/* Fills d (zeroed) as the ggml device over ldev. */
static void device_init(lg_device *d, loom_dev_t ldev, bool owns_meta, const char *name,
                        const char *desc) {
    snprintf(d->name, sizeof d->name, "%s", name);
    snprintf(d->desc, sizeof d->desc, "%s", desc);
    d->dev = ldev;
    d->owns_meta = owns_meta;
    const char *dbg = getenv("LOOM_GGML_DEBUG");
    d->debug = dbg && *dbg && strcmp(dbg, "0") != 0;
    d->lbuft = loom_dev_buffer_type(ldev);
    pthread_mutexattr_t attr; /* supports_op asks itself about a source */
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&d->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    d->gdev = (struct ggml_backend_device){.iface = lg_device_iface, .reg = &g.reg, .context = d};
    lg_buft_init(d);
}

/* ---------------------------------------------------------------- reg */

static const char *reg_name(ggml_backend_reg_t reg) {
    (void)reg;
    return "LOOM";
}

static size_t reg_count(ggml_backend_reg_t reg) {
    (void)reg;
    return g.n_devs;
}

static ggml_backend_dev_t reg_device(ggml_backend_reg_t reg, size_t i) {
    (void)reg;
    return i < g.n_devs ? &g.devs[i]->gdev : NULL;
}

/* No extras: the ggml_backend_comm_* communicator that would let ggml's own meta device
 * (-sm tensor over LOOMk.j) reduce through loom's reducer was tried and gave wrong text under
 * ggml 0.27 although both members held the same sums (its contract is not in a public
 * header); ggml's generic reduction over the members is right, so it stays. */
static void *reg_proc(ggml_backend_reg_t reg, const char *name) {
    (void)reg;
    (void)name;
    return NULL;
}

static bool add_device(lg_device *d) {
    if (!d || g.n_devs == LG_MAX_DEVICES) {
        lg_log("too many devices (at most %d)", LG_MAX_DEVICES);
        free(d);
        return false;
    }
    g.devs[g.n_devs++] = d;
    return true;
}

/* One LOOMk over `spec`; false (and a line saying why) when the spec gives no device. */
static bool add_spec(const char *spec, int k, bool members) {
    loom_dev_t devs[LOOM_META_MAX_DEVICES];
    size_t n = 0;
    if (loom_devices_from_spec(spec, devs, LOOM_META_MAX_DEVICES, &n) != LOOM_OK) {
        lg_log("LOOM_GGML_DEVICES: '%s': %s (no device LOOM%d)", spec, loom_last_error(), k);
        return false;
    }
    if (n == 0) {
        lg_log("LOOM_GGML_DEVICES: '%s' has no device (no device LOOM%d)", spec, k);
        return false;
    }
    char name[32], desc[256] = "", list[200] = "";
    for (size_t j = 0; j < n; j++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", j ? "," : "", loom_dev_name(devs[j]));
    }
    lg_device *d = calloc(1, sizeof *d); /* also the split callback's user data */
    if (!d) return false;
    loom_dev_t meta = NULL;
    if (loom_meta_device_new(devs, (int)n, lg_leaf_state, d, &meta) != LOOM_OK) {
        lg_log("LOOM_GGML_DEVICES: '%s': %s (no device LOOM%d)", spec, loom_last_error(), k);
        free(d);
        return false;
    }
    snprintf(name, sizeof name, "LOOM%d", k);
    snprintf(desc, sizeof desc, "loom meta device over %s (%s)", list, spec);
    device_init(d, meta, true, name, desc);
    if (!add_device(d)) return false;
    if (members) {
        for (size_t j = 0; j < n; j++) {
            char mname[32], mdesc[256];
            snprintf(mname, sizeof mname, "LOOM%d.%zu", k, j);
            snprintf(mdesc, sizeof mdesc, "loom device %s (member %zu of LOOM%d)",
                     loom_dev_description(devs[j]), j, k);
            lg_device *md = calloc(1, sizeof *md);
            if (!md) return true;
            device_init(md, devs[j], false, mname, mdesc);
            add_device(md);
        }
    }
    return true;
}

static void reg_init(void) {
    g.reg = (struct ggml_backend_reg){
        .api_version = LOOM_GGML_BACKEND_API_VERSION,
        .iface = {.get_name = reg_name,
                  .get_device_count = reg_count,
                  .get_device = reg_device,
                  .get_proc_address = reg_proc},
        .context = NULL,
    };
    const char *rules = getenv("LOOM_GGML_SPLIT_RULES");
    if (rules && *rules) {
        loom_rules *r = NULL;
        if (loom_rules_load_file(rules, &r) != LOOM_OK) {
            lg_log("LOOM_GGML_SPLIT_RULES: %s (no LOOM device)", loom_last_error());
            return;
        }
        loom_rules_free(r);
        snprintf(g.rules_path, sizeof g.rules_path, "%s", rules);
    }
    /* a module that cannot load here (the CUDA one without a driver) is not news to an
     * engine's user: loom's warnings are shown when LOOM_LOG_LEVEL asks for them */
    const char *lvl = getenv("LOOM_LOG_LEVEL");
    const loom_log_level was = loom_log_get_level();
    if (!lvl || !*lvl) loom_log_set_level(LOOM_LOG_ERROR);
    loom_registry_load_all();
    loom_log_set_level(was);
    const char *m = getenv("LOOM_GGML_MEMBERS");
    const bool members = m && *m && strcmp(m, "0") != 0;
    const char *env = getenv("LOOM_GGML_DEVICES");
    if (!env || !*env) {
        loom_dev_t probe[1];
        size_t n = 0;
        if (loom_devices_from_spec("cuda", probe, 1, &n) != LOOM_OK || n == 0) {
            lg_log("no CUDA device and LOOM_GGML_DEVICES is unset: no LOOM device (set "
                   "LOOM_GGML_DEVICES=sim:2 for simulated GPUs, or cpu)");
            return;
        }
        add_spec("cuda", 0, members);
        return;
    }
    char *copy = strdup(env);
    if (!copy) return;
    int k = 0;
    char *save = NULL;
    for (char *spec = strtok_r(copy, ";", &save); spec; spec = strtok_r(NULL, ";", &save)) {
        while (*spec == ' ') spec++;
        if (!*spec) continue;
        add_spec(spec, k++, members);
    }
    free(copy);
}

__attribute__((visibility("default"))) ggml_backend_reg_t ggml_backend_init(void) {
    pthread_once(&g.once, reg_init);
    return &g.reg;
}

__attribute__((visibility("default"))) int ggml_backend_score(void) {
    return 1;
}
