/*
 * Tests of the backend wrappers (backends/backend.c): defaults of optional hooks, buffers
 * and tensor placement, loom_alloc_ctx_tensors (alignment, views, clean failure under
 * device OOM and injected host OOM), synchronous tensor access and its bounds assert,
 * loom_tensor_copy on each of its paths (host memcpy, direct, staged), the async copy
 * fallback, and loom_op_batch_size.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/backend-impl.h"
#include "loom/cpu.h"
#include "loom/sim.h"
#include "tests/shim/loom_test.h"

static loom_ctx *new_ctx(int n_tensors) {
    loom_ctx_params p = {
        .mem_size = (size_t)n_tensors * loom_tensor_overhead() +
                    loom_graph_overhead(LOOM_DEFAULT_GRAPH_SIZE),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    return loom_ctx_new(p);
}

static void fill_pattern(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
}

/* ---------------------------------------------------------------- a minimal fake backend */

/* A device and buffer type that implement only the required hooks, to observe defaults. */
static uint8_t fake_mem[16384];
static const char *fake_name(loom_buft_t b) {
    (void)b;
    return "FAKE";
}
static void *fake_base(loom_buffer_t b) {
    (void)b;
    return fake_mem;
}
static void fake_memset(loom_buffer_t b, loom_tensor *t, uint8_t v, size_t o, size_t n) {
    (void)b;
    memset((char *)t->data + o, v, n);
}
static void fake_set(loom_buffer_t b, loom_tensor *t, const void *d, size_t o, size_t n) {
    (void)b;
    memcpy((char *)t->data + o, d, n);
}
static void fake_get(loom_buffer_t b, const loom_tensor *t, void *d, size_t o, size_t n) {
    (void)b;
    memcpy(d, (const char *)t->data + o, n);
}
static void fake_clear(loom_buffer_t b, uint8_t v) {
    memset(fake_mem, v, b->size);
}
static int fake_init_calls, fake_init_fail_at = -1;
static loom_status fake_init_tensor(loom_buffer_t b, loom_tensor *t) {
    (void)b, (void)t;
    if (fake_init_calls++ == fake_init_fail_at) {
        return loom_error(LOOM_ERR_DEVICE, "fake: init_tensor refused");
    }
    return LOOM_OK;
}
static const struct loom_buffer_i fake_buffer_i = {
    .get_base = fake_base,
    .init_tensor = fake_init_tensor,
    .memset_tensor = fake_memset,
    .set_tensor = fake_set,
    .get_tensor = fake_get,
    .clear = fake_clear,
};
static struct loom_buft fake_buft;
static loom_buffer_t fake_alloc(loom_buft_t buft, size_t size) {
    if (size > sizeof fake_mem) {
        loom_error(LOOM_ERR_DEVICE_OOM, "fake: %zu bytes is too much", size);
        return NULL;
    }
    return loom_buffer_init(buft, &fake_buffer_i, NULL, size);
}
static const struct loom_buft_i fake_buft_i = {.get_name = fake_name, .alloc_buffer = fake_alloc};

static const char *fake_dev_name(loom_dev_t d) {
    (void)d;
    return "FAKEDEV";
}
static void fake_dev_mem(loom_dev_t d, size_t *f, size_t *t) {
    (void)d;
    *f = 1;
    *t = 2;
}
static loom_dev_type fake_dev_type(loom_dev_t d) {
    (void)d;
    return LOOM_DEV_TYPE_ACCEL;
}
static void fake_dev_props(loom_dev_t d, loom_dev_props *p) {
    (void)d;
    p->name = "FAKEDEV";
}
static void fake_backend_free(loom_backend_t b) {
    loom_free(b);
}
static loom_status fake_compute(loom_backend_t b, loom_graph *g) {
    (void)b, (void)g;
    return LOOM_ERR_UNSUPPORTED; /* records no message: the wrapper must add one */
}
static const struct loom_backend_i fake_backend_i = {.free = fake_backend_free,
                                                     .graph_compute = fake_compute};
static loom_backend_t fake_dev_init(loom_dev_t d, const char *params) {
    (void)params;
    loom_backend_t b = loom_malloc(sizeof *b);
    b->iface = &fake_backend_i;
    b->device = d;
    b->context = NULL;
    return b;
}
static loom_buft_t fake_dev_buft(loom_dev_t d) {
    (void)d;
    return &fake_buft;
}
static bool fake_supports_op(loom_dev_t d, const loom_tensor *t) {
    (void)d, (void)t;
    return true;
}
static bool fake_supports_buft(loom_dev_t d, loom_buft_t b) {
    (void)d;
    return b == &fake_buft;
}
static const struct loom_dev_i fake_dev_i = {
    .get_name = fake_dev_name,
    .get_memory = fake_dev_mem,
    .get_type = fake_dev_type,
    .get_props = fake_dev_props,
    .init_backend = fake_dev_init,
    .get_buffer_type = fake_dev_buft,
    .supports_op = fake_supports_op,
    .supports_buft = fake_supports_buft,
};
static struct loom_dev fake_dev = {.iface = &fake_dev_i};
static struct loom_buft fake_buft = {.iface = &fake_buft_i, .device = &fake_dev};

LOOM_TEST(backend, defaults_of_optional_hooks) {
    LOOM_CHECK_EQ_INT(loom_buft_alignment(&fake_buft), 64);
    LOOM_CHECK(loom_buft_max_size(&fake_buft) == SIZE_MAX);
    LOOM_CHECK(!loom_buft_is_host(&fake_buft));
    LOOM_CHECK(loom_buft_device(&fake_buft) == &fake_dev);
    LOOM_CHECK(strcmp(loom_dev_description(&fake_dev), "FAKEDEV") == 0);
    LOOM_CHECK(loom_dev_host_buffer_type(&fake_dev) == NULL);
    LOOM_CHECK(loom_event_new(&fake_dev) == NULL);

    loom_ctx *ctx = new_ctx(8);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *t = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 10, 3);
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK_EQ_INT(loom_buft_alloc_size(&fake_buft, t), loom_nbytes(t));
    LOOM_CHECK(!loom_dev_offload_op(&fake_dev, t));

    loom_backend_t b = loom_dev_init(&fake_dev, NULL);
    LOOM_REQUIRE(b != NULL);
    LOOM_CHECK(strcmp(loom_backend_name(b), "FAKEDEV") == 0);
    LOOM_CHECK(loom_backend_default_buft(b) == &fake_buft);
    LOOM_CHECK(loom_backend_supports_buft(b, &fake_buft));
    LOOM_CHECK(!loom_backend_supports_buft(b, loom_cpu_buffer_type()));
    LOOM_CHECK(!loom_backend_offload_op(b, t));
    loom_backend_synchronize(b); /* no hook: nothing happens */
    loom_graph *g = loom_graph_new(ctx, 16);
    LOOM_REQUIRE(g != NULL);
    LOOM_CHECK_EQ_INT(loom_backend_graph_compute(b, g), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "FAKEDEV: graph compute failed");

    /* Sync set/get through a backend without async hooks. */
    loom_buffer_t buf = loom_backend_alloc_buffer(b, 256);
    LOOM_REQUIRE(buf != NULL);
    LOOM_CHECK_EQ_INT(loom_buffer_get_usage(buf), LOOM_BUFFER_USAGE_ANY);
    loom_buffer_set_usage(buf, LOOM_BUFFER_USAGE_WEIGHTS);
    LOOM_CHECK_EQ_INT(loom_buffer_get_usage(buf), LOOM_BUFFER_USAGE_WEIGHTS);
    LOOM_CHECK(strcmp(loom_buffer_name(buf), "FAKE") == 0);
    LOOM_CHECK_EQ_INT(loom_buffer_alloc_tensor(buf, t, 16), LOOM_OK);
    LOOM_CHECK(t->data == fake_mem + 16);
    float in[30], out[30];
    for (int i = 0; i < 30; i++)
        in[i] = (float)i * 0.5f;
    loom_backend_tensor_set_async(b, t, in, 0, sizeof in);
    memset(out, 0, sizeof out);
    loom_backend_tensor_get_async(b, t, out, 0, sizeof out);
    LOOM_CHECK(memcmp(in, out, sizeof in) == 0);
    loom_buffer_clear(buf, 0);
    loom_tensor_get(t, out, 0, sizeof out);
    LOOM_CHECK(out[7] == 0.0f);
    loom_buffer_free(buf);
    loom_backend_free(b);
    loom_backend_free(NULL);
    loom_buffer_free(NULL);
    loom_event_free(NULL);
    loom_ctx_free(ctx);
}

LOOM_TEST(backend, zero_size_buffer_is_valid) {
    loom_buffer_t buf = loom_buft_alloc_buffer(loom_cpu_buffer_type(), 0);
    LOOM_REQUIRE(buf != NULL);
    LOOM_CHECK_EQ_INT(loom_buffer_size(buf), 0);
    LOOM_CHECK(loom_buffer_buft(buf) == loom_cpu_buffer_type());
    LOOM_CHECK(loom_buffer_is_host(buf));
    loom_buffer_clear(buf, 7);
    loom_buffer_free(buf);

    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1,mem=1KiB", &reg) == LOOM_OK);
    loom_dev_t dev = loom_reg_dev_get(reg, 0);
    buf = loom_buft_alloc_buffer(loom_dev_buffer_type(dev), 0);
    LOOM_REQUIRE(buf != NULL);
    size_t free_mem = 0, total = 0;
    loom_dev_memory(dev, &free_mem, &total);
    LOOM_CHECK_EQ_INT(free_mem, 1024); /* an empty buffer costs nothing */
    loom_buffer_free(buf);
    loom_sim_reg_free(reg);
}

LOOM_TEST(backend, alloc_tensor_errors) {
    loom_ctx *ctx = new_ctx(8);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 16); /* 64 bytes */
    loom_set_name(a, "a");
    loom_tensor *v = loom_view_1d(ctx, a, 4, 8);
    LOOM_REQUIRE(a && v);
    loom_buffer_t buf = loom_buft_alloc_buffer(loom_cpu_buffer_type(), 100);
    LOOM_REQUIRE(buf != NULL);
    LOOM_CHECK_EQ_INT(loom_buffer_alloc_tensor(buf, a, 40), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "tensor 'a' (64 bytes at offset 40) does not fit");
    LOOM_CHECK(a->buffer == NULL && a->data == NULL);
    LOOM_CHECK_EQ_INT(loom_buffer_init_view(v), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "is not allocated");
    LOOM_CHECK_EQ_INT(loom_buffer_alloc_tensor(buf, v, 0), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "is a view");
    LOOM_CHECK_EQ_INT(loom_buffer_alloc_tensor(buf, a, 36), LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_buffer_alloc_tensor(buf, a, 0), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "already allocated");
    LOOM_CHECK_EQ_INT(loom_buffer_init_view(v), LOOM_OK);
    LOOM_CHECK(v->buffer == buf);
    LOOM_CHECK((char *)v->data == (char *)a->data + 8);
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
}

LOOM_TEST(backend, alloc_ctx_tensors_places_aligned_and_views) {
    loom_ctx *ctx = new_ctx(16);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 3);      /* 12 bytes */
    loom_tensor *b = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, 5, 7);   /* 70 bytes */
    loom_tensor *q = loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, 64, 2); /* 136 bytes */
    loom_tensor *vb = loom_view_1d(ctx, b, 5, 2 * 10);
    loom_tensor *c = loom_add(ctx, a, a);
    LOOM_REQUIRE(a && b && q && vb && c);

    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1", &reg) == LOOM_OK);
    loom_buft_t buft = loom_dev_buffer_type(loom_reg_dev_get(reg, 0));
    size_t align = loom_buft_alignment(buft);
    LOOM_CHECK(align >= 64);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, buft);
    LOOM_REQUIRE(buf != NULL);
    /* Independent expectation: each non-view tensor rounded up to the alignment. */
    size_t expect = 0;
    loom_tensor *plain[] = {a, b, q, c};
    for (int i = 0; i < 4; i++)
        expect += (loom_nbytes(plain[i]) + align - 1) / align * align;
    LOOM_CHECK_EQ_INT(loom_buffer_size(buf), expect);
    char *base = loom_buffer_base(buf);
    for (int i = 0; i < 4; i++) {
        LOOM_CHECK(plain[i]->buffer == buf);
        size_t off = (size_t)((char *)plain[i]->data - base);
        LOOM_CHECK_EQ_INT(off % align, 0);
        LOOM_CHECK(off + loom_nbytes(plain[i]) <= loom_buffer_size(buf));
        for (int j = 0; j < i; j++)
            LOOM_CHECK(plain[i]->data != plain[j]->data);
    }
    LOOM_CHECK(vb->buffer == buf);
    LOOM_CHECK((char *)vb->data == (char *)b->data + 20);

    /* Tensors that already have data are skipped: a second call allocates nothing. */
    loom_buffer_t again = loom_alloc_ctx_tensors(ctx, buft);
    LOOM_REQUIRE(again != NULL);
    LOOM_CHECK_EQ_INT(loom_buffer_size(again), 0);
    loom_buffer_free(again);

    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    loom_sim_reg_free(reg);
}

LOOM_TEST(backend, alloc_ctx_tensors_rejects_alloc_ctx) {
    loom_ctx_params p = {.mem_size = 4096, .mem_buffer = NULL, .no_alloc = false};
    loom_ctx *ctx = loom_ctx_new(p);
    LOOM_REQUIRE(ctx != NULL);
    LOOM_CHECK(loom_alloc_ctx_tensors(ctx, loom_cpu_buffer_type()) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "no_alloc");
    loom_ctx_free(ctx);
}

LOOM_TEST(backend, alloc_ctx_tensors_fails_cleanly) {
    loom_ctx *ctx = new_ctx(8);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 1000);
    loom_tensor *b = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 1000);
    loom_tensor *v = loom_view_1d(ctx, b, 10, 0);
    LOOM_REQUIRE(a && b && v);

    /* Device OOM: the sim cap is smaller than the two tensors. */
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1,mem=6000", &reg) == LOOM_OK);
    loom_dev_t dev = loom_reg_dev_get(reg, 0);
    LOOM_CHECK(loom_alloc_ctx_tensors(ctx, loom_dev_buffer_type(dev)) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_DEVICE_OOM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "out of memory allocating");
    LOOM_CHECK(a->buffer == NULL && a->data == NULL && b->data == NULL && v->buffer == NULL);
    loom_sim_stats st;
    loom_sim_dev_stats(dev, &st);
    LOOM_CHECK_EQ_INT(st.mem_used, 0);
    loom_sim_reg_free(reg);

    /* init_tensor refuses the second tensor: everything is rolled back. */
    fake_init_calls = 0;
    fake_init_fail_at = 1;
    LOOM_CHECK(loom_alloc_ctx_tensors(ctx, &fake_buft) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_DEVICE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "init_tensor refused");
    LOOM_CHECK(a->buffer == NULL && a->data == NULL && b->buffer == NULL && v->data == NULL);
    fake_init_fail_at = -1;
    loom_buffer_t ok = loom_alloc_ctx_tensors(ctx, &fake_buft);
    LOOM_CHECK(ok != NULL && a->buffer == ok && v->buffer == ok);
    loom_buffer_free(ok);
    loom_ctx_free(ctx);
}

/* An allocator that fails the Nth allocation (counting malloc and realloc). */
static atomic_int oom_countdown;
static void *oom_malloc(size_t n, void *ud) {
    (void)ud;
    if (atomic_fetch_sub(&oom_countdown, 1) == 0) return NULL;
    return malloc(n);
}
static void *oom_realloc(void *p, size_t n, void *ud) {
    (void)ud;
    if (atomic_fetch_sub(&oom_countdown, 1) == 0) return NULL;
    return realloc(p, n);
}
static void oom_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

LOOM_TEST(backend, alloc_ctx_tensors_survives_host_oom) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1", &reg) == LOOM_OK);
    loom_dev_t dev = loom_reg_dev_get(reg, 0);
    loom_buft_t bufts[] = {loom_dev_buffer_type(dev), loom_cpu_buffer_type()};
    for (int k = 0; k < 2; k++) {
        int failures = 0;
        for (int n = 0; n < 50; n++) {
            loom_ctx *ctx = new_ctx(8);
            LOOM_REQUIRE(ctx != NULL);
            loom_tensor *a = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 4);
            loom_tensor *v = loom_view_1d(ctx, a, 8, 64);
            LOOM_REQUIRE(a && v);
            loom_allocator al = {oom_malloc, oom_realloc, oom_free, NULL};
            atomic_store(&oom_countdown, n);
            loom_allocator_set(&al);
            loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, bufts[k]);
            loom_allocator_set(NULL);
            if (!buf) {
                failures++;
                LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
                LOOM_CHECK(a->buffer == NULL && a->data == NULL && v->buffer == NULL);
            } else {
                LOOM_CHECK(a->buffer == buf && v->data == (char *)a->data + 64);
                loom_buffer_free(buf);
                loom_ctx_free(ctx);
                break;
            }
            loom_ctx_free(ctx);
        }
        LOOM_CHECK(failures >= 1); /* at least one injected failure was exercised */
    }
    loom_sim_stats st;
    loom_sim_dev_stats(dev, &st);
    LOOM_CHECK_EQ_INT(st.mem_used, 0);
    loom_sim_reg_free(reg); /* asserts no buffer of it is left */
}

LOOM_TEST(backend, tensor_set_get_memset_partial) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1", &reg) == LOOM_OK);
    loom_buft_t bufts[] = {loom_cpu_buffer_type(), loom_dev_buffer_type(loom_reg_dev_get(reg, 0))};
    for (int k = 0; k < 2; k++) {
        loom_ctx *ctx = new_ctx(4);
        LOOM_REQUIRE(ctx != NULL);
        loom_tensor *t = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 25, 4); /* 400 bytes */
        loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, bufts[k]);
        LOOM_REQUIRE(buf != NULL);
        uint8_t ref[400], got[400], part[100];
        fill_pattern(ref, sizeof ref, 1u + (uint32_t)k);
        loom_tensor_set(t, ref, 0, sizeof ref);
        fill_pattern(part, sizeof part, 99);
        loom_tensor_set(t, part, 150, sizeof part);
        memcpy(ref + 150, part, sizeof part);
        loom_tensor_memset(t, 0xAB, 390, 10);
        memset(ref + 390, 0xAB, 10);
        memset(got, 0, sizeof got);
        loom_tensor_get(t, got, 0, sizeof got);
        LOOM_CHECK(memcmp(got, ref, sizeof ref) == 0);
        uint8_t mid[7];
        loom_tensor_get(t, mid, 201, 7);
        LOOM_CHECK(memcmp(mid, ref + 201, 7) == 0);
        loom_tensor_set(t, NULL, 400, 0); /* empty span at the end is fine */
        loom_buffer_free(buf);
        loom_ctx_free(ctx);
    }
    loom_sim_reg_free(reg);
}

/* Out-of-range access is a bug: LOOM_ASSERT aborts, naming the condition. */
LOOM_TEST(backend, tensor_set_out_of_bounds_aborts) {
    loom_ctx *ctx = new_ctx(4);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *t = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 4);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_cpu_buffer_type());
    LOOM_REQUIRE(buf != NULL);
    int fds[2];
    LOOM_REQUIRE(pipe(fds) == 0);
    pid_t pid = fork();
    LOOM_REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        uint8_t junk[16] = {0};
        loom_tensor_set(t, junk, 12, 8); /* 20 > 16 bytes */
        _exit(0);                        /* not reached */
    }
    close(fds[1]);
    char msg[1024] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof msg - 1 && (r = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0) {
        got += (size_t)r;
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    LOOM_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    LOOM_CHECK_STR_CONTAINS(msg, "assertion failed");
    LOOM_CHECK_STR_CONTAINS(msg, "backend.c");
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
}

/* Fills t (any buffer) with a pattern and returns it in *out (loom_malloc'ed). */
static uint8_t *set_pattern(loom_tensor *t, uint32_t seed) {
    size_t n = loom_nbytes(t);
    uint8_t *p = loom_malloc(n);
    fill_pattern(p, n, seed);
    loom_tensor_set(t, p, 0, n);
    return p;
}

static bool tensor_equals(const loom_tensor *t, const uint8_t *ref) {
    size_t n = loom_nbytes(t);
    uint8_t *got = loom_malloc(n);
    loom_tensor_get(t, got, 0, n);
    bool eq = memcmp(got, ref, n) == 0;
    loom_free(got);
    return eq;
}

typedef struct {
    loom_ctx *ctx;
    loom_tensor *t;
    loom_buffer_t buf;
} placed;

static placed place(loom_buft_t buft, int64_t n) {
    placed p = {new_ctx(2), NULL, NULL};
    if (!p.ctx) return p;
    p.t = loom_new_tensor_1d(p.ctx, LOOM_TYPE_F32, n);
    p.buf = loom_alloc_ctx_tensors(p.ctx, buft);
    return p;
}

static void unplace(placed *p) {
    loom_buffer_free(p->buf);
    loom_ctx_free(p->ctx);
}

LOOM_TEST(backend, tensor_copy_every_path) {
    loom_reg_t ra = NULL, rb = NULL, rn = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2", &ra) == LOOM_OK);
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1", &rb) == LOOM_OK);
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2,p2p=0", &rn) == LOOM_OK);
    loom_dev_t a0 = loom_reg_dev_get(ra, 0), a1 = loom_reg_dev_get(ra, 1);
    loom_dev_t b0 = loom_reg_dev_get(rb, 0);
    loom_dev_t n0 = loom_reg_dev_get(rn, 0), n1 = loom_reg_dev_get(rn, 1);
    struct {
        loom_buft_t src, dst;
        loom_dev_t out_dev, in_dev; /* sim devices whose counters must move, or NULL */
        const char *what;
    } cases[] = {
        {loom_cpu_buffer_type(), loom_cpu_buffer_type(), NULL, NULL, "host->host"},
        {loom_cpu_buffer_type(), loom_dev_buffer_type(a0), NULL, a0, "host->sim"},
        {loom_dev_buffer_type(a0), loom_cpu_buffer_type(), a0, NULL, "sim->host"},
        {loom_dev_buffer_type(a0), loom_dev_buffer_type(a1), a0, a1, "sim->sim p2p"},
        {loom_dev_buffer_type(a1), loom_dev_buffer_type(b0), a1, b0, "sim->other reg"},
        {loom_dev_buffer_type(n0), loom_dev_buffer_type(n1), n0, n1, "sim->sim p2p=0"},
    };
    const size_t n_el = 300, bytes = n_el * sizeof(float);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        placed s = place(cases[k].src, n_el), d = place(cases[k].dst, n_el);
        LOOM_REQUIRE(s.buf && d.buf);
        uint8_t *ref = set_pattern(s.t, (uint32_t)k + 10);
        loom_tensor_memset(d.t, 0, 0, bytes);
        loom_dev_t devs[] = {a0, a1, b0, n0, n1};
        for (int i = 0; i < 5; i++)
            loom_sim_dev_reset_stats(devs[i]);
        LOOM_CHECK_EQ_INT(loom_tensor_copy(s.t, d.t), LOOM_OK);
        loom_sim_stats so, si;
        loom_sim_dev_stats(cases[k].out_dev, &so);
        loom_sim_dev_stats(cases[k].in_dev, &si);
        LOOM_CHECK_MSG(cases[k].out_dev == NULL || (so.bytes_out == bytes && so.copies == 1),
                       "%s: source device out %llu bytes, %llu copies", cases[k].what,
                       (unsigned long long)so.bytes_out, (unsigned long long)so.copies);
        LOOM_CHECK_MSG(cases[k].in_dev == NULL || (si.bytes_in == bytes && si.copies == 1),
                       "%s: destination device in %llu bytes", cases[k].what,
                       (unsigned long long)si.bytes_in);
        LOOM_CHECK_MSG(tensor_equals(d.t, ref), "%s: data differs", cases[k].what);
        loom_free(ref);
        unplace(&s);
        unplace(&d);
    }
    /* Layout mismatch is an error, not a crash. */
    placed s = place(loom_cpu_buffer_type(), 10), d = place(loom_cpu_buffer_type(), 11);
    loom_set_name(s.t, "src10");
    LOOM_CHECK_EQ_INT(loom_tensor_copy(s.t, d.t), LOOM_ERR_SHAPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'src10'");
    unplace(&s);
    unplace(&d);
    loom_sim_reg_free(ra);
    loom_sim_reg_free(rb);
    loom_sim_reg_free(rn);
}

LOOM_TEST(backend, copy_async_falls_back_to_sync) {
    loom_reg_t ra = NULL, rb = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1", &ra) == LOOM_OK);
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1", &rb) == LOOM_OK);
    loom_backend_t ba = loom_dev_init(loom_reg_dev_get(ra, 0), NULL);
    loom_backend_t bb = loom_dev_init(loom_reg_dev_get(rb, 0), NULL);
    loom_backend_t bc = loom_dev_init(loom_cpu_dev(), NULL);
    LOOM_REQUIRE(ba && bb && bc);
    placed s = place(loom_backend_default_buft(ba), 257);
    placed d = place(loom_backend_default_buft(bb), 257);
    placed h = place(loom_cpu_buffer_type(), 257);
    LOOM_REQUIRE(s.buf && d.buf && h.buf);
    uint8_t *ref = set_pattern(s.t, 5);
    /* Two regs: no direct path, so the wrapper syncs both and stages through host. */
    LOOM_CHECK_EQ_INT(loom_backend_tensor_copy_async(ba, bb, s.t, d.t), LOOM_OK);
    loom_backend_synchronize(bb);
    LOOM_CHECK(tensor_equals(d.t, ref));
    /* CPU backend destination (no async copy hook). */
    LOOM_CHECK_EQ_INT(loom_backend_tensor_copy_async(bb, bc, d.t, h.t), LOOM_OK);
    LOOM_CHECK(tensor_equals(h.t, ref));
    loom_free(ref);
    unplace(&s);
    unplace(&d);
    unplace(&h);
    loom_backend_free(ba);
    loom_backend_free(bb);
    loom_backend_free(bc);
    loom_sim_reg_free(ra);
    loom_sim_reg_free(rb);
}

LOOM_TEST(backend, op_batch_size) {
    loom_ctx *ctx = new_ctx(32);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, 48);
    loom_tensor *x = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, 64, 5, 3);
    loom_tensor *mm = loom_mul_mat(ctx, w, x); /* [48, 5, 3] */
    LOOM_REQUIRE(mm != NULL);
    LOOM_CHECK_EQ_INT(loom_op_batch_size(mm), 5);

    loom_tensor *experts = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, 64, 16, 8);
    loom_tensor *xb = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, 64, 1, 9);
    loom_tensor *ids = loom_new_tensor_2d(ctx, LOOM_TYPE_I32, 2, 9);
    loom_tensor *mmid = loom_mul_mat_id(ctx, experts, xb, ids); /* [16, 2, 9] */
    LOOM_REQUIRE(mmid != NULL);
    LOOM_CHECK_EQ_INT(loom_op_batch_size(mmid), 9);

    loom_tensor *emb = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 32, 100);
    loom_tensor *tok = loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 40);
    loom_tensor *gr = loom_get_rows(ctx, emb, tok);
    LOOM_REQUIRE(gr != NULL);
    LOOM_CHECK_EQ_INT(loom_op_batch_size(gr), 0);

    loom_tensor *add = loom_add(ctx, x, x); /* rows: 5 * 3 */
    LOOM_REQUIRE(add != NULL);
    LOOM_CHECK_EQ_INT(loom_op_batch_size(add), 15);
    loom_ctx_free(ctx);
}

/* loom_backend_synchronize_keep: the first failure over several synchronizes is kept with
 * its message; later failures and successes leave it. */
static int g_sync_calls;
static loom_status failing_status(loom_backend_t b) {
    (void)b;
    g_sync_calls++;
    return g_sync_calls == 1   ? LOOM_OK
           : g_sync_calls == 2 ? loom_error(LOOM_ERR_DEVICE, "first failure")
                               : loom_error(LOOM_ERR_NOMEM, "second failure");
}
static const struct loom_backend_i failing_backend_i = {
    .free = fake_backend_free, .graph_compute = fake_compute, .get_status = failing_status};

LOOM_TEST(backend, synchronize_keep_keeps_the_first_failure) {
    loom_backend_t b = loom_malloc(sizeof *b);
    LOOM_REQUIRE(b != NULL);
    *b = (struct loom_backend){.iface = &failing_backend_i, .device = &fake_dev};
    loom_status first = LOOM_OK;
    char msg[64] = "";
    g_sync_calls = 0;
    LOOM_CHECK_EQ_INT(loom_backend_synchronize_keep(b, &first, msg, sizeof msg), LOOM_OK);
    LOOM_CHECK_EQ_INT(first, LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_backend_synchronize_keep(b, &first, msg, sizeof msg), LOOM_ERR_DEVICE);
    LOOM_CHECK_EQ_INT(loom_backend_synchronize_keep(b, &first, msg, sizeof msg), LOOM_ERR_NOMEM);
    LOOM_CHECK_EQ_INT(first, LOOM_ERR_DEVICE);
    LOOM_CHECK_STR_CONTAINS(msg, "first failure");
    loom_backend_free(b);
}
