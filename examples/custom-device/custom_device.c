/*
 * custom-device: a device implemented outside loom through the public device interface
 * (loom/backend-impl.h), N of them wrapped in a meta device, checked against the CPU.
 *
 * The toy device keeps its memory in host allocations behind its own buffer type (not
 * marked host-visible, so loom treats it like device memory and copies through its
 * set/get hooks), computes with loom's CPU kernels (loom_cpu_graph_compute) and refuses one
 * op, softmax, so the scheduler runs that op on the CPU and copies across.
 *
 * The graph: y = W2 * softmax(W1 * x). Both weights are split by rows across the toy
 * devices (each device computes whole output rows with the same kernels as the CPU), so the
 * result must equal the CPU's bit for bit.
 *
 * Usage: custom-device [N_DEVICES (default 3)]. Exit status 0 when the results are equal
 * and the softmax ran on the CPU.
 */
#include <loom/backend-impl.h>
#include <loom/loom.h>
#include <loom/meta.h>
#include <loom/sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOYS 8

/* ---------------------------------------------------------------- the toy device */

typedef struct toy_dev {
    char name[16];
    struct loom_dev dev;
    struct loom_buft buft;
    size_t used; /* bytes allocated now */
} toy_dev;

typedef struct toy_reg {
    struct loom_reg reg;
    toy_dev devs[MAX_TOYS];
    int n;
} toy_reg;

/* buffer: one aligned host allocation */
static void toy_buffer_free(loom_buffer_t buf) {
    toy_dev *d = buf->buft->context;
    d->used -= buf->size;
    loom_aligned_free(buf->context);
}
static void *toy_buffer_base(loom_buffer_t buf) {
    return buf->context;
}
static void toy_buffer_memset(loom_buffer_t buf, loom_tensor *t, uint8_t v, size_t off, size_t n) {
    (void)buf;
    memset((char *)t->data + off, v, n);
}
static void toy_buffer_set(loom_buffer_t buf, loom_tensor *t, const void *data, size_t off,
                           size_t n) {
    (void)buf;
    memcpy((char *)t->data + off, data, n);
}
static void toy_buffer_get(loom_buffer_t buf, const loom_tensor *t, void *data, size_t off,
                           size_t n) {
    (void)buf;
    memcpy(data, (const char *)t->data + off, n);
}
static void toy_buffer_clear(loom_buffer_t buf, uint8_t v) {
    memset(buf->context, v, buf->size);
}

static const struct loom_buffer_i toy_buffer_i = {
    .free_buffer = toy_buffer_free,
    .get_base = toy_buffer_base,
    .memset_tensor = toy_buffer_memset,
    .set_tensor = toy_buffer_set,
    .get_tensor = toy_buffer_get,
    .clear = toy_buffer_clear,
};

/* buffer type: the device's memory */
static const char *toy_buft_name(loom_buft_t buft) {
    return ((toy_dev *)buft->context)->name;
}
static loom_buffer_t toy_buft_alloc(loom_buft_t buft, size_t size) {
    toy_dev *d = buft->context;
    void *mem = loom_aligned_alloc(64, size ? size : 64);
    if (!mem) {
        loom_error(LOOM_ERR_DEVICE_OOM, "%s: cannot allocate %zu bytes", d->name, size);
        return NULL;
    }
    loom_buffer_t buf = loom_buffer_init(buft, &toy_buffer_i, mem, size);
    if (!buf) {
        loom_aligned_free(mem);
        return NULL;
    }
    d->used += size;
    return buf;
}
static const struct loom_buft_i toy_buft_i = {
    .get_name = toy_buft_name,
    .alloc_buffer = toy_buft_alloc,
};

/* backend: synchronous, computes on the CPU kernels */
static void toy_backend_free(loom_backend_t be) {
    free(be);
}
static loom_status toy_backend_compute(loom_backend_t be, loom_graph *g) {
    (void)be;
    return loom_cpu_graph_compute(g, NULL);
}
static const struct loom_backend_i toy_backend_i = {
    .free = toy_backend_free,
    .graph_compute = toy_backend_compute,
};

/* device */
static const char *toy_dev_name(loom_dev_t dev) {
    return ((toy_dev *)dev->context)->name;
}
static void toy_dev_memory(loom_dev_t dev, size_t *free_b, size_t *total) {
    toy_dev *d = dev->context;
    *total = (size_t)1 << 30;
    *free_b = *total - d->used;
}
static loom_dev_type toy_dev_type(loom_dev_t dev) {
    (void)dev;
    return LOOM_DEV_TYPE_GPU;
}
static void toy_dev_props(loom_dev_t dev, loom_dev_props *p) {
    memset(p, 0, sizeof *p);
    p->name = toy_dev_name(dev);
    p->description = "toy device (host memory, CPU kernels, no softmax)";
    toy_dev_memory(dev, &p->memory_free, &p->memory_total);
    p->type = LOOM_DEV_TYPE_GPU;
}
static loom_backend_t toy_dev_init_backend(loom_dev_t dev, const char *params) {
    (void)params;
    loom_backend_t be = calloc(1, sizeof *be);
    if (!be) {
        loom_error(LOOM_ERR_NOMEM, "%s: no memory for a backend", toy_dev_name(dev));
        return NULL;
    }
    be->iface = &toy_backend_i;
    be->device = dev;
    return be;
}
static loom_buft_t toy_dev_buft(loom_dev_t dev) {
    return &((toy_dev *)dev->context)->buft;
}
static bool toy_dev_supports_op(loom_dev_t dev, const loom_tensor *op) {
    (void)dev;
    return op->op != LOOM_OP_SOFT_MAX && loom_cpu_supports_op(op);
}
static bool toy_dev_supports_buft(loom_dev_t dev, loom_buft_t buft) {
    return buft == toy_dev_buft(dev);
}
static const struct loom_dev_i toy_dev_i = {
    .get_name = toy_dev_name,
    .get_memory = toy_dev_memory,
    .get_type = toy_dev_type,
    .get_props = toy_dev_props,
    .init_backend = toy_dev_init_backend,
    .get_buffer_type = toy_dev_buft,
    .supports_op = toy_dev_supports_op,
    .supports_buft = toy_dev_supports_buft,
};

/* reg: enumerates the toys */
static const char *toy_reg_name(loom_reg_t reg) {
    (void)reg;
    return "TOY";
}
static size_t toy_reg_count(loom_reg_t reg) {
    return (size_t)((toy_reg *)reg->context)->n;
}
static loom_dev_t toy_reg_get(loom_reg_t reg, size_t i) {
    toy_reg *r = reg->context;
    return i < (size_t)r->n ? &r->devs[i].dev : NULL;
}
static const struct loom_reg_i toy_reg_i = {
    .get_name = toy_reg_name,
    .get_device_count = toy_reg_count,
    .get_device = toy_reg_get,
};

static void toy_reg_init(toy_reg *r, int n) {
    memset(r, 0, sizeof *r);
    r->reg = (struct loom_reg){
        .api_version = LOOM_BACKEND_API_VERSION, .iface = &toy_reg_i, .context = r};
    r->n = n;
    for (int i = 0; i < n; i++) {
        toy_dev *d = &r->devs[i];
        snprintf(d->name, sizeof d->name, "TOY%d", i);
        d->dev = (struct loom_dev){.iface = &toy_dev_i, .reg = &r->reg, .context = d};
        d->buft = (struct loom_buft){.iface = &toy_buft_i, .device = &d->dev, .context = d};
    }
}

/* ---------------------------------------------------------------- the check */

enum { E = 48, F = 80, T = 3 };

static loom_status leaf(const loom_tensor *t, loom_split_state *out, void *ud) {
    int n = *(const int *)ud;
    if (strcmp(t->name, "w1") == 0 || strcmp(t->name, "w2") == 0)
        return loom_split_state_even(out, LOOM_SPLIT_AXIS_1, n, t->ne[1], 1, 0);
    return LOOM_OK; /* MIRRORED */
}

typedef struct {
    loom_ctx *wctx, *ctx;
    loom_tensor *w1, *w2, *x, *p, *y;
    loom_graph *g;
} block;

static bool build(block *b, bool own_weight_ctx) {
    loom_ctx_params cp = {.mem_size = 64 * loom_tensor_overhead() +
                                      loom_graph_overhead(LOOM_DEFAULT_GRAPH_SIZE),
                          .no_alloc = true};
    b->ctx = loom_ctx_new(cp);
    b->wctx = own_weight_ctx ? loom_ctx_new(cp) : b->ctx;
    if (!b->ctx || !b->wctx) return false;
    b->w1 = loom_new_tensor_2d(b->wctx, LOOM_TYPE_F32, E, F);
    b->w2 = loom_new_tensor_2d(b->wctx, LOOM_TYPE_F32, F, E);
    b->x = loom_new_tensor_2d(b->ctx, LOOM_TYPE_F32, E, T);
    loom_set_name(b->w1, "w1");
    loom_set_name(b->w2, "w2");
    loom_set_input(b->x);
    b->p = loom_soft_max(b->ctx, loom_mul_mat(b->ctx, b->w1, b->x)); /* [F, T] */
    b->y = loom_mul_mat(b->ctx, b->w2, b->p);                        /* [E, T] */
    if (!b->y) return false;
    loom_set_output(b->y);
    b->g = loom_graph_new(b->ctx, LOOM_DEFAULT_GRAPH_SIZE);
    return b->g && loom_graph_build_forward(b->g, b->y) == LOOM_OK;
}

static void block_free(block *b) {
    if (b->wctx != b->ctx) loom_ctx_free(b->wctx);
    loom_ctx_free(b->ctx);
}

static void fill(float *v, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)((seed >> 9) & 0xffff) / 32768.0f - 1.0f;
    }
}

#define FAIL(what)                                                                                 \
    do {                                                                                           \
        fprintf(stderr, "custom-device: %s: %s\n", what, loom_last_error());                       \
        return 1;                                                                                  \
    } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3;
    if (n < 1 || n > MAX_TOYS) {
        fprintf(stderr, "usage: %s [N_DEVICES 1..%d]\n", argv[0], MAX_TOYS);
        return 2;
    }
    static float w1[E * F], w2[F * E], x[E * T], y_cpu[E * T], y_toy[E * T];
    fill(w1, E * F, 11);
    fill(w2, F * E, 12);
    fill(x, E * T, 13);

    /* The CPU oracle. */
    block c = {0};
    if (!build(&c, false)) FAIL("build (CPU)");
    loom_backend_t cpu = loom_cpu_backend_new(1);
    if (!cpu) FAIL("CPU backend");
    loom_buffer_t cbuf = loom_alloc_ctx_tensors(c.ctx, loom_cpu_buffer_type());
    if (!cbuf) FAIL("CPU buffer");
    loom_tensor_set(c.w1, w1, 0, sizeof w1);
    loom_tensor_set(c.w2, w2, 0, sizeof w2);
    loom_tensor_set(c.x, x, 0, sizeof x);
    if (loom_backend_graph_compute(cpu, c.g) != LOOM_OK) FAIL("CPU compute");
    loom_tensor_get(c.y, y_cpu, 0, sizeof y_cpu);

    /* N toy devices, registered like any backend, under one meta device. */
    static toy_reg toys;
    toy_reg_init(&toys, n);
    if (loom_registry_add(&toys.reg) != LOOM_OK) FAIL("register the toy devices");
    loom_dev_t devs[MAX_TOYS];
    for (int i = 0; i < n; i++)
        devs[i] = loom_reg_dev_get(&toys.reg, (size_t)i);
    loom_dev_t meta = NULL;
    if (loom_meta_device_new(devs, n, leaf, &n, &meta) != LOOM_OK) FAIL("meta device");

    block m = {0};
    if (!build(&m, true)) FAIL("build (meta)");
    loom_buffer_t wbuf = loom_alloc_ctx_tensors(m.wctx, loom_dev_buffer_type(meta));
    if (!wbuf) FAIL("weights on the meta device");
    loom_buffer_set_usage(wbuf, LOOM_BUFFER_USAGE_WEIGHTS);
    loom_tensor_set(m.w1, w1, 0, sizeof w1);
    loom_tensor_set(m.w2, w2, 0, sizeof w2);
    loom_backend_t be[2] = {loom_dev_init(meta, NULL), cpu};
    if (!be[0]) FAIL("meta backend");
    loom_sched *sched = loom_sched_new(be, NULL, 2, LOOM_DEFAULT_GRAPH_SIZE, false, true);
    if (!sched) FAIL("scheduler");
    if (loom_sched_alloc_graph(sched, m.g) != LOOM_OK) FAIL("schedule");
    loom_tensor_set(m.x, x, 0, sizeof x);
    if (loom_sched_graph_compute(sched, m.g) != LOOM_OK) FAIL("compute");
    loom_tensor_get(m.y, y_toy, 0, sizeof y_toy);

    loom_backend_t soft_on = loom_sched_get_tensor_backend(sched, m.p);
    loom_backend_t y_on = loom_sched_get_tensor_backend(sched, m.y);
    int n_diff = 0;
    for (int i = 0; i < E * T; i++)
        n_diff += memcmp(&y_toy[i], &y_cpu[i], sizeof(float)) != 0;
    printf("%s: softmax on %s, matmuls on %s, %d splits; %d of %d values differ from the CPU\n",
           loom_dev_name(meta), soft_on ? loom_backend_name(soft_on) : "?",
           y_on ? loom_backend_name(y_on) : "?", loom_sched_get_n_splits(sched), n_diff, E * T);
    int rc = 0;
    if (soft_on != cpu) {
        fprintf(stderr, "custom-device: the refused op did not fall back to the CPU\n");
        rc = 1;
    }
    if (y_on != be[0]) {
        fprintf(stderr, "custom-device: the matmul did not run on the toy devices\n");
        rc = 1;
    }
    if (n_diff != 0) {
        fprintf(stderr, "custom-device: results differ from the CPU\n");
        rc = 1;
    }

    loom_sched_free(sched);
    loom_backend_free(be[0]);
    loom_buffer_free(wbuf);
    block_free(&m);
    loom_meta_device_free(meta);
    loom_buffer_free(cbuf);
    loom_backend_free(cpu);
    block_free(&c);
    size_t leaked = 0;
    for (int i = 0; i < n; i++)
        leaked += toys.devs[i].used;
    loom_registry_reset();
    if (leaked) {
        fprintf(stderr, "custom-device: %zu bytes of toy memory not freed\n", leaked);
        rc = 1;
    }
    printf("%s\n", rc == 0 ? "custom-device: OK (exact)" : "custom-device: FAILED");
    return rc;
}
