/*
 * Tests of the registry (backends/registry.c) with real modules: this binary links no
 * backend, so the cpu and sim it uses are libloom-cpu.so and libloom-sim.so loaded with
 * dlopen (found in the runfiles). Covers loading by path, load_all through
 * LOOM_BACKEND_PATH, clear errors for a missing file, a non-ELF file, a module without
 * the entry point and one with a wrong API version, registering twice, concurrent
 * lookups, computing through module devices, and loom_devices_from_spec through the sim
 * module's proc address (including its error messages, imported from the module).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backends/backend-impl.h"
#include "loom/sim.h"
#include "tests/shim/loom_test.h"

static const char *runfile(const char *rel, char *buf, size_t size) {
    const char *srcdir = getenv("TEST_SRCDIR");
    const char *ws = getenv("TEST_WORKSPACE");
    snprintf(buf, size, "%s/%s/%s", srcdir ? srcdir : ".", ws ? ws : "loom", rel);
    return buf;
}

static void dir_of(const char *path, char *buf, size_t size) {
    snprintf(buf, size, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash) *slash = '\0';
}

static char cpu_so[4096], sim_so[4096], broken_so[4096], badver_so[4096], badreg_so[4096];

static void paths(void) {
    runfile("backends/cpu/libloom-cpu.so", cpu_so, sizeof cpu_so);
    runfile("backends/sim/libloom-sim.so", sim_so, sizeof sim_so);
    runfile("tests/backends/modules/libloom-broken.so", broken_so, sizeof broken_so);
    runfile("tests/backends/modules/libloom-badver.so", badver_so, sizeof badver_so);
    runfile("tests/backends/modules/libloom-badreg.so", badreg_so, sizeof badreg_so);
}

/* Log capture (the registry logs through this binary's core). */
static char log_text[16384];
static size_t log_len;
static int log_warns;
static void capture(loom_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (level >= LOOM_LOG_WARN) log_warns++;
    int n = snprintf(log_text + log_len, sizeof log_text - log_len, "%s\n", msg);
    if (n > 0 && log_len + (size_t)n < sizeof log_text) log_len += (size_t)n;
}
static void capture_start(void) {
    log_len = 0;
    log_text[0] = '\0';
    log_warns = 0;
    loom_log_set(capture, NULL);
}

/* c = a + b on a module device, checked against the sum computed here. */
static void add_on_device(loom_dev_t dev) {
    loom_ctx_params p = {.mem_size = 16 * loom_tensor_overhead() + loom_graph_overhead(64),
                         .mem_buffer = NULL,
                         .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(p);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *a = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 8);
    loom_tensor *b = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 8);
    loom_tensor *c = loom_add(ctx, a, b);
    loom_graph *g = loom_graph_new(ctx, 64);
    LOOM_REQUIRE(c && g && loom_graph_build_forward(g, c) == LOOM_OK);
    loom_backend_t be = loom_dev_init(dev, NULL);
    LOOM_REQUIRE(be != NULL);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_dev_buffer_type(dev));
    LOOM_REQUIRE(buf != NULL);
    float av[8], bv[8], cv[8];
    for (int i = 0; i < 8; i++)
        av[i] = (float)i * 1.25f, bv[i] = 10.0f - (float)i;
    loom_tensor_set(a, av, 0, sizeof av);
    loom_tensor_set(b, bv, 0, sizeof bv);
    LOOM_CHECK_EQ_INT(loom_backend_graph_compute(be, g), LOOM_OK);
    loom_tensor_get(c, cv, 0, sizeof cv);
    for (int i = 0; i < 8; i++)
        LOOM_CHECK_NEAR(cv[i], av[i] + bv[i], 0);
    loom_buffer_free(buf);
    loom_backend_free(be);
    loom_ctx_free(ctx);
}

LOOM_TEST(registry, load_modules_by_path) {
    paths();
    loom_registry_reset();
    unsetenv("LOOM_SIM_DEVICES");
    loom_reg_t cpu = NULL, sim = NULL, again = NULL;
    LOOM_REQUIRE(loom_registry_load(cpu_so, &cpu) == LOOM_OK);
    LOOM_REQUIRE(cpu != NULL);
    LOOM_CHECK(strcmp(loom_reg_name(cpu), "CPU") == 0);
    LOOM_CHECK_EQ_INT(loom_reg_dev_count(cpu), 1);
    LOOM_REQUIRE(loom_registry_load(sim_so, &sim) == LOOM_OK);
    LOOM_CHECK(strcmp(loom_reg_name(sim), "SIM") == 0);
    LOOM_CHECK_EQ_INT(loom_reg_dev_count(sim), 2); /* default "sim:2" */
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 2);
    LOOM_CHECK_EQ_INT(loom_registry_dev_count(), 3);
    LOOM_CHECK(loom_registry_reg_by_name("cpu") == cpu); /* case-insensitive */
    LOOM_CHECK(loom_registry_dev_by_name("sim1") == loom_reg_dev_get(sim, 1));
    LOOM_CHECK(loom_registry_dev_by_type(LOOM_DEV_TYPE_CPU) == loom_reg_dev_get(cpu, 0));
    LOOM_CHECK(loom_registry_dev_by_type(LOOM_DEV_TYPE_GPU) == loom_reg_dev_get(sim, 0));
    LOOM_CHECK(loom_registry_dev_by_type(LOOM_DEV_TYPE_META) == NULL);
    LOOM_CHECK(loom_registry_reg_get(2) == NULL && loom_registry_dev_get(3) == NULL);

    /* Loading the same module again is a no-op returning the same reg. */
    LOOM_CHECK_EQ_INT(loom_registry_load(sim_so, &again), LOOM_OK);
    LOOM_CHECK(again == sim);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 2);
    LOOM_CHECK_EQ_INT(loom_registry_add(sim), LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 2);

    /* The modules compute. */
    add_on_device(loom_reg_dev_get(cpu, 0));
    loom_dev_t s1 = loom_reg_dev_get(sim, 1);
    LOOM_CHECK_EQ_INT(loom_dev_get_type(s1), LOOM_DEV_TYPE_GPU);
    add_on_device(s1);
    /* The module's extras through its proc address: two 32-byte sets in, one get out. */
    void *p = loom_reg_get_proc_address(sim, "loom_sim_dev_stats");
    LOOM_REQUIRE(p != NULL);
    void (*stats)(loom_dev_t, loom_sim_stats *);
    memcpy(&stats, &p, sizeof stats);
    loom_sim_stats st;
    stats(s1, &st);
    LOOM_CHECK_EQ_INT(st.bytes_in, 64);
    LOOM_CHECK_EQ_INT(st.bytes_out, 32);
    LOOM_CHECK_EQ_INT(st.graphs, 1);
    LOOM_CHECK(loom_reg_get_proc_address(sim, "no_such_proc") == NULL);
    LOOM_CHECK(loom_reg_get_proc_address(cpu, "loom_sim_dev_stats") == NULL);
    loom_registry_reset();
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 0);
}

LOOM_TEST(registry, load_errors_name_the_path) {
    paths();
    loom_registry_reset();
    loom_reg_t reg = (loom_reg_t)1;

    LOOM_CHECK_EQ_INT(loom_registry_load("/nonexistent/dir/libloom-nope.so", &reg),
                      LOOM_ERR_NOT_FOUND);
    LOOM_CHECK(reg == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'/nonexistent/dir/libloom-nope.so'");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "No such file");

    LOOM_CHECK_EQ_INT(loom_registry_load(broken_so, &reg), LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), broken_so);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "no loom_backend_init symbol");

    /* Built for API version 7: refused from its version symbol, before its init runs
     * (that init aborts), naming both versions. */
    LOOM_CHECK_EQ_INT(loom_registry_load(badver_so, &reg), LOOM_ERR_FORMAT);
    LOOM_CHECK(reg == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), badver_so);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "built for backend API version 7");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "has backend API version 1");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), loom_version());

    /* No version symbol (an older module): its reg's api_version is checked instead. */
    LOOM_CHECK_EQ_INT(loom_registry_load(badreg_so, &reg), LOOM_ERR_FORMAT);
    LOOM_CHECK(reg == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), badreg_so);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "its reg has backend API version 7");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "has backend API version 1");

    /* A file that is not a shared object at all. */
    char text[4096];
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(text, sizeof text, "%s/libloom-text.so", tmp ? tmp : "/tmp");
    FILE *f = fopen(text, "w");
    LOOM_REQUIRE(f != NULL);
    fputs("this is not an ELF file\n", f);
    fclose(f);
    LOOM_CHECK_EQ_INT(loom_registry_load(text, &reg), LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), text);
    remove(text);

    LOOM_CHECK_EQ_INT(loom_registry_load("", &reg), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 0); /* nothing half-registered */
}

/* A reg defined here, to check add's own rules. */
static const char *fake_name(loom_reg_t r) {
    return (const char *)r->context;
}
static size_t fake_count(loom_reg_t r) {
    (void)r;
    return 0;
}
static loom_dev_t fake_get(loom_reg_t r, size_t i) {
    (void)r, (void)i;
    return NULL;
}
static const struct loom_reg_i fake_reg_i = {
    .get_name = fake_name, .get_device_count = fake_count, .get_device = fake_get};

LOOM_TEST(registry, add_twice_is_a_noop_and_version_is_checked) {
    loom_registry_reset();
    struct loom_reg r = {
        .api_version = LOOM_BACKEND_API_VERSION, .iface = &fake_reg_i, .context = (void *)"FAKE"};
    LOOM_CHECK_EQ_INT(loom_registry_add(&r), LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_registry_add(&r), LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 1);
    LOOM_CHECK(loom_registry_reg_by_name("fake") == &r);
    struct loom_reg v = {.api_version = 7, .iface = &fake_reg_i, .context = (void *)"V7"};
    LOOM_CHECK_EQ_INT(loom_registry_add(&v), LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "backend 'V7': backend API version 7");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "has backend API version 1");
    LOOM_CHECK_EQ_INT(loom_registry_add(NULL), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 1);
    loom_registry_reset();
}

LOOM_TEST(registry, load_all_through_backend_path) {
    paths();
    loom_registry_reset();
    char cpu_dir[4096], sim_dir[4096], test_dir[4096], env[16384];
    dir_of(cpu_so, cpu_dir, sizeof cpu_dir);
    dir_of(sim_so, sim_dir, sizeof sim_dir);
    dir_of(broken_so, test_dir, sizeof test_dir);
    snprintf(env, sizeof env, "%s:%s::/nonexistent/loom:%s", cpu_dir, sim_dir, test_dir);
    setenv("LOOM_BACKEND_PATH", env, 1);
    capture_start();
    size_t n = loom_registry_load_all();
    loom_log_set(NULL, NULL);
    LOOM_CHECK_EQ_INT(n, 2);
    LOOM_CHECK(loom_registry_reg_by_name("CPU") != NULL);
    LOOM_CHECK(loom_registry_reg_by_name("SIM") != NULL);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 2);
    /* The broken modules were logged (path and reason) and skipped. */
    LOOM_CHECK(log_warns >= 3);
    LOOM_CHECK_STR_CONTAINS(log_text, "libloom-broken.so': no loom_backend_init symbol");
    LOOM_CHECK_STR_CONTAINS(log_text, "libloom-badver.so': built for backend API version 7");
    LOOM_CHECK_STR_CONTAINS(log_text, "libloom-badreg.so': its reg has backend API version 7");

    /* Again: everything is known, nothing new is loaded. */
    capture_start();
    LOOM_CHECK_EQ_INT(loom_registry_load_all(), 0);
    loom_log_set(NULL, NULL);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 2);
    unsetenv("LOOM_BACKEND_PATH");
    loom_registry_reset();
}

typedef struct {
    int iters;
    int errors;
} lookup_job;

static void *lookup_thread(void *arg) {
    lookup_job *job = arg;
    for (int i = 0; i < job->iters; i++) {
        loom_dev_t cpu = loom_registry_dev_by_name("CPU");
        if (!cpu || strcmp(loom_dev_name(cpu), "CPU") != 0) job->errors++;
        loom_reg_t sim = loom_registry_reg_by_name("SIM");
        if (!sim || loom_reg_dev_count(sim) != 2) job->errors++;
        size_t n = loom_registry_dev_count();
        if (n < 3) job->errors++;
        loom_dev_t any = loom_registry_dev_get((size_t)i % n);
        if (!any) job->errors++;
        if (loom_registry_dev_by_type(LOOM_DEV_TYPE_GPU) == NULL) job->errors++;
        if (loom_registry_reg_get(0) == NULL) job->errors++;
    }
    return NULL;
}

static struct loom_reg extra_regs[64];
static char extra_names[64][24];

static void *adder_thread(void *arg) {
    int *errors = arg;
    for (int i = 0; i < 64; i++) {
        snprintf(extra_names[i], sizeof extra_names[i], "EXTRA%d", i);
        extra_regs[i] = (struct loom_reg){.api_version = LOOM_BACKEND_API_VERSION,
                                          .iface = &fake_reg_i,
                                          .context = extra_names[i]};
        if (loom_registry_add(&extra_regs[i]) != LOOM_OK) (*errors)++;
    }
    return NULL;
}

LOOM_TEST(registry, concurrent_lookups_are_safe) {
    paths();
    loom_registry_reset();
    LOOM_REQUIRE(loom_registry_load(cpu_so, NULL) == LOOM_OK);
    LOOM_REQUIRE(loom_registry_load(sim_so, NULL) == LOOM_OK);
    enum { N = 6 };
    pthread_t th[N], adder;
    lookup_job jobs[N];
    int add_errors = 0;
    for (int i = 0; i < N; i++) {
        jobs[i] = (lookup_job){.iters = 3000, .errors = 0};
        LOOM_REQUIRE(pthread_create(&th[i], NULL, lookup_thread, &jobs[i]) == 0);
    }
    LOOM_REQUIRE(pthread_create(&adder, NULL, adder_thread, &add_errors) == 0);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    pthread_join(adder, NULL);
    for (int i = 0; i < N; i++)
        LOOM_CHECK_EQ_INT(jobs[i].errors, 0);
    LOOM_CHECK_EQ_INT(add_errors, 0);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 2 + 64);
    LOOM_CHECK(loom_registry_reg_by_name("extra63") == &extra_regs[63]);
    loom_registry_reset();
}

LOOM_TEST(registry, devices_from_spec_through_modules) {
    paths();
    loom_registry_reset();
    loom_dev_t devs[8];
    size_t n = 0;
    /* Nothing registered and nothing linked: clear errors. */
    LOOM_CHECK_EQ_INT(loom_devices_from_spec("cpu", devs, 8, &n), LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "device spec 'cpu': no CPU backend");
    LOOM_CHECK_EQ_INT(loom_devices_from_spec("sim:2", devs, 8, &n), LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "no sim backend");
    /* the registry lives in a shared library here: no static-link advice */
    LOOM_CHECK(strstr(loom_last_error(), "libloom.a") == NULL);

    LOOM_REQUIRE(loom_registry_load(cpu_so, NULL) == LOOM_OK);
    LOOM_REQUIRE(loom_registry_load(sim_so, NULL) == LOOM_OK);
    LOOM_REQUIRE(loom_devices_from_spec("cpu", devs, 8, &n) == LOOM_OK);
    LOOM_CHECK(n == 1 && devs[0] == loom_registry_dev_by_name("CPU"));

    LOOM_REQUIRE(loom_devices_from_spec("sim:3,mem=1MiB", devs, 8, &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 3);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 3);
    size_t total = 0;
    loom_dev_memory(devs[2], NULL, &total);
    LOOM_CHECK(total == (size_t)1 << 20);
    /* The module's default reg holds SIM0, SIM1: the spec's reg continues the numbering. */
    LOOM_CHECK(strcmp(loom_dev_name(devs[0]), "SIM2") == 0);
    LOOM_CHECK(strcmp(loom_dev_name(devs[2]), "SIM4") == 0);
    LOOM_CHECK(strcmp(loom_reg_name(loom_dev_reg(devs[0])), "SIM2..SIM4") == 0);
    LOOM_CHECK(loom_registry_dev_by_name("SIM3") == devs[1]);
    add_on_device(devs[2]);

    /* Errors raised inside the module reach this thread's loom_last_error. */
    loom_buffer_t big = loom_buft_alloc_buffer(loom_dev_buffer_type(devs[0]), (size_t)2 << 20);
    LOOM_CHECK(big == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_DEVICE_OOM);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "SIM2: out of memory allocating 2.00 MiB (0 B of 1.00 MiB in use)");
    LOOM_CHECK_EQ_INT(loom_devices_from_spec("sim:x", devs, 8, &n), LOOM_ERR_FORMAT);
    LOOM_CHECK(strcmp(loom_last_error(), "device spec 'sim:x': 'x' is not a device count") == 0);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "device spec 'sim:x': 'x' is not a device count");
    LOOM_CHECK_EQ_INT(loom_devices_from_spec("sim:2,link=carrier-pigeon", devs, 8, &n),
                      LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "unknown link preset 'carrier-pigeon'");
    LOOM_CHECK_EQ_INT(loom_devices_from_spec("cuda:0", devs, 8, &n), LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "device spec 'cuda:0': no CUDA devices");
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 3);
    loom_registry_reset(); /* frees the spec's sim reg through the module, then unregisters */
}
