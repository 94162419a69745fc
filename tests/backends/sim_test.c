/*
 * Tests of sim devices (backends/sim/): properties and naming, the memory cap (error
 * message, accounting, nothing leaked), link counters against the link formula for every
 * kind of transfer, offload_op thresholds (default, env, spec), op refusals and graph
 * validation, and loom_devices_from_spec with statically linked cpu and sim.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static loom_reg_t new_reg(const char *spec) {
    loom_reg_t reg = NULL;
    if (loom_sim_reg_new_from_spec(spec, &reg) != LOOM_OK) return NULL;
    return reg;
}

LOOM_TEST(sim, props_and_names) {
    loom_reg_t a = new_reg("sim:3,mem=1GiB");
    LOOM_REQUIRE(a != NULL);
    LOOM_CHECK_EQ_INT(loom_reg_dev_count(a), 3);
    LOOM_CHECK(loom_reg_dev_get(a, 3) == NULL);
    /* Devices carry process-wide numbers: a's are SIM<k>, SIM<k+1>, SIM<k+2>, k being the
     * first run of 3 free numbers (0 when no other sim reg is alive). */
    char want[32];
    int k = -1;
    LOOM_REQUIRE(sscanf(loom_dev_name(loom_reg_dev_get(a, 0)), "SIM%d", &k) == 1 && k >= 0);
    if (k == 0) {
        LOOM_CHECK(strcmp(loom_reg_name(a), "SIM") == 0);
    } else {
        snprintf(want, sizeof want, "SIM%d..SIM%d", k, k + 2);
        LOOM_CHECK(strcmp(loom_reg_name(a), want) == 0);
    }
    for (int i = 0; i < 3; i++) {
        loom_dev_t d = loom_reg_dev_get(a, (size_t)i);
        snprintf(want, sizeof want, "SIM%d", k + i);
        LOOM_CHECK(strcmp(loom_dev_name(d), want) == 0);
        LOOM_CHECK(loom_dev_is_sim(d));
        LOOM_CHECK(loom_dev_reg(d) == a);
        LOOM_CHECK_EQ_INT(loom_dev_get_type(d), LOOM_DEV_TYPE_GPU);
        loom_dev_props p;
        loom_dev_get_props(d, &p);
        LOOM_CHECK(strcmp(p.name, want) == 0);
        LOOM_CHECK(p.caps.async && p.caps.events && !p.caps.host_buffer);
        LOOM_CHECK(p.memory_total == (size_t)1 << 30 && p.memory_free == p.memory_total);
        LOOM_CHECK(p.description && strstr(p.description, "1.00 GiB"));
        loom_buft_t buft = loom_dev_buffer_type(d);
        LOOM_CHECK(strcmp(loom_buft_name(buft), want) == 0);
        LOOM_CHECK(!loom_buft_is_host(buft));
        LOOM_CHECK(loom_buft_device(buft) == d);
        LOOM_CHECK(loom_dev_supports_buft(d, buft));
        LOOM_CHECK(!loom_dev_supports_buft(d, loom_cpu_buffer_type()));
        LOOM_CHECK(loom_dev_host_buffer_type(d) == NULL);
    }
    LOOM_CHECK(!loom_dev_supports_buft(loom_reg_dev_get(a, 0),
                                       loom_dev_buffer_type(loom_reg_dev_get(a, 1))));
    LOOM_CHECK(!loom_dev_is_sim(loom_cpu_dev()));

    /* A second live reg continues the numbering; a freed reg's numbers are reused. */
    loom_reg_t b = new_reg("sim:1");
    LOOM_REQUIRE(b != NULL);
    LOOM_CHECK(strcmp(loom_reg_name(a), loom_reg_name(b)) != 0);
    int kb = -1;
    LOOM_REQUIRE(sscanf(loom_dev_name(loom_reg_dev_get(b, 0)), "SIM%d", &kb) == 1);
    LOOM_CHECK(kb < k || kb > k + 2); /* never one of a's */
    LOOM_CHECK(strcmp(loom_reg_name(b), kb == 0 ? "SIM" : loom_dev_name(loom_reg_dev_get(b, 0))) ==
               0); /* a reg of one device is named by it */
    char a_names[3][32];
    for (int i = 0; i < 3; i++)
        snprintf(a_names[i], sizeof a_names[i], "%s",
                 loom_dev_name(loom_reg_dev_get(a, (size_t)i)));
    loom_sim_reg_free(a);
    loom_reg_t c = new_reg("sim:3");
    LOOM_REQUIRE(c != NULL);
    for (int i = 0; i < 3; i++) /* first fit: a's run again */
        LOOM_CHECK(strcmp(loom_dev_name(loom_reg_dev_get(c, (size_t)i)), a_names[i]) == 0);
    loom_sim_reg_free(b);
    loom_sim_reg_free(c);
    loom_sim_reg_free(NULL);
}

LOOM_TEST(sim, device_numbers_run_out_cleanly) {
    /* Regs of 64 devices until the process-wide numbers run out: a clear error, nothing
     * half-made, and every number is free again once the regs are freed. */
    loom_reg_t regs[32];
    int n = 0;
    loom_status s = LOOM_OK;
    while (n < 32) {
        regs[n] = NULL;
        s = loom_sim_reg_new_from_spec("sim:64,mem=1MiB", &regs[n]);
        if (s != LOOM_OK) break;
        n++;
    }
    LOOM_CHECK(n >= 15 && n <= 16); /* 1024 numbers, some may be held by a static reg */
    LOOM_CHECK_EQ_INT(s, LOOM_ERR_FULL);
    LOOM_CHECK(regs[n] == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "sim: no run of 64 free device numbers");
    static bool seen[1024]; /* no two live devices share a number */
    memset(seen, 0, sizeof seen);
    for (int j = 0; j < n; j++) {
        for (size_t i = 0; i < 64; i++) {
            int num = -1;
            LOOM_REQUIRE(sscanf(loom_dev_name(loom_reg_dev_get(regs[j], i)), "SIM%d", &num) == 1);
            LOOM_REQUIRE(num >= 0 && num < 1024);
            LOOM_CHECK(!seen[num]);
            seen[num] = true;
        }
    }
    while (n > 0)
        loom_sim_reg_free(regs[--n]);
    loom_reg_t again = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:64,mem=1MiB", &again) == LOOM_OK);
    loom_sim_reg_free(again);
}

LOOM_TEST(sim, hostmem_uses_the_cpu_buffer_type) {
    loom_reg_t r = new_reg("sim:2,hostmem=1");
    LOOM_REQUIRE(r != NULL);
    loom_dev_t d = loom_reg_dev_get(r, 1);
    LOOM_CHECK(loom_dev_buffer_type(d) == loom_cpu_buffer_type());
    LOOM_CHECK(loom_dev_supports_buft(d, loom_cpu_buffer_type()));
    LOOM_CHECK_EQ_INT(loom_dev_get_type(d), LOOM_DEV_TYPE_GPU);
    loom_sim_reg_free(r);
}

LOOM_TEST(sim, memory_cap) {
    loom_reg_t r = new_reg("sim:2,mem=2MiB");
    LOOM_REQUIRE(r != NULL);
    loom_dev_t d1 = loom_reg_dev_get(r, 1);
    loom_buft_t buft = loom_dev_buffer_type(d1);
    const size_t cap = (size_t)2 << 20, first = 1258291; /* 1.2 MiB */
    loom_buffer_t b1 = loom_buft_alloc_buffer(buft, first);
    LOOM_REQUIRE(b1 != NULL);
    LOOM_CHECK_EQ_INT(loom_buffer_size(b1), first);
    LOOM_CHECK(!loom_buffer_is_host(b1));
    LOOM_CHECK_EQ_INT((uintptr_t)loom_buffer_base(b1) % loom_buft_alignment(buft), 0);
    size_t free_mem, total;
    loom_dev_memory(d1, &free_mem, &total);
    LOOM_CHECK_EQ_INT(total, cap);
    LOOM_CHECK_EQ_INT(free_mem, cap - first);

    loom_buffer_t big = loom_buft_alloc_buffer(buft, (size_t)3 << 20);
    LOOM_CHECK(big == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_DEVICE_OOM);
    char want[128];
    snprintf(want, sizeof want,
             "%s: out of memory allocating 3.00 MiB (1.20 MiB of 2.00 MiB in use)",
             loom_dev_name(d1));
    LOOM_CHECK(strcmp(loom_last_error(), want) == 0);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), want);

    /* Exactly the rest fits; one byte more does not. */
    LOOM_CHECK(loom_buft_alloc_buffer(buft, cap - first + 1) == NULL);
    loom_buffer_t rest = loom_buft_alloc_buffer(buft, cap - first);
    LOOM_REQUIRE(rest != NULL);
    loom_dev_memory(d1, &free_mem, NULL);
    LOOM_CHECK_EQ_INT(free_mem, 0);
    loom_sim_stats st;
    loom_sim_dev_stats(d1, &st);
    LOOM_CHECK_EQ_INT(st.mem_used, cap);
    LOOM_CHECK_EQ_INT(st.mem_peak, cap);
    /* The other device's cap is separate. */
    loom_buffer_t other = loom_buft_alloc_buffer(loom_dev_buffer_type(loom_reg_dev_get(r, 0)), cap);
    LOOM_CHECK(other != NULL);
    loom_buffer_free(other);

    loom_buffer_free(rest);
    loom_buffer_free(b1);
    loom_sim_dev_stats(d1, &st);
    LOOM_CHECK_EQ_INT(st.mem_used, 0);
    LOOM_CHECK_EQ_INT(st.mem_peak, cap);
    loom_sim_dev_reset_stats(d1);
    loom_sim_dev_stats(d1, &st);
    LOOM_CHECK_EQ_INT(st.mem_peak, 0);

    /* A whole context beyond the cap: NULL, nothing allocated, nothing charged. */
    loom_ctx *ctx = new_ctx(4);
    loom_tensor *t = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 1024, 600); /* 2.34 MiB */
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK(loom_alloc_ctx_tensors(ctx, buft) == NULL);
    LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_DEVICE_OOM);
    LOOM_CHECK(t->buffer == NULL && t->data == NULL);
    loom_sim_dev_stats(d1, &st);
    LOOM_CHECK_EQ_INT(st.mem_used, 0);
    loom_ctx_free(ctx);
    loom_sim_reg_free(r);
}

/* Link time by the documented formula, written out independently of the library. */
static double link_us(double gbps, double lat_us, double bytes) {
    return lat_us + (gbps > 0 ? bytes / (gbps * 1e9) * 1e6 : 0.0);
}

typedef struct {
    uint64_t in, out, copies;
    double time;
} expect_t;

static void check_stats(loom_dev_t d, const expect_t *e, const char *what) {
    loom_sim_stats st;
    loom_sim_dev_stats(d, &st);
    LOOM_CHECK_MSG(st.bytes_in == e->in && st.bytes_out == e->out && st.copies == e->copies,
                   "%s %s: in %llu/%llu out %llu/%llu copies %llu/%llu", what, loom_dev_name(d),
                   (unsigned long long)st.bytes_in, (unsigned long long)e->in,
                   (unsigned long long)st.bytes_out, (unsigned long long)e->out,
                   (unsigned long long)st.copies, (unsigned long long)e->copies);
    LOOM_CHECK_MSG(st.link_time_us > e->time - 1e-6 && st.link_time_us < e->time + 1e-6,
                   "%s %s: link time %.9f, expected %.9f", what, loom_dev_name(d), st.link_time_us,
                   e->time);
}

LOOM_TEST(sim, link_counters_follow_the_formula) {
    const char *specs[] = {"sim:2,link=pcie4", "sim:2,link=nvlink,bw=10,lat=1.5", "sim:2,link=none",
                           "sim:2,link=pcie5,p2p=0"};
    const double bws[] = {25, 10, 0, 50}, lats[] = {8, 1.5, 0, 6};
    for (int k = 0; k < 4; k++) {
        loom_reg_t r = new_reg(specs[k]);
        LOOM_REQUIRE(r != NULL);
        loom_dev_t d0 = loom_reg_dev_get(r, 0), d1 = loom_reg_dev_get(r, 1);
        loom_backend_t b0 = loom_dev_init(d0, NULL), b1 = loom_dev_init(d1, NULL);
        LOOM_REQUIRE(b0 && b1);
        loom_ctx *c0 = new_ctx(2), *c1 = new_ctx(2), *ch = new_ctx(2);
        loom_tensor *t0 = loom_new_tensor_1d(c0, LOOM_TYPE_F32, 1000);
        loom_tensor *t1 = loom_new_tensor_1d(c1, LOOM_TYPE_F32, 1000);
        loom_tensor *th = loom_new_tensor_1d(ch, LOOM_TYPE_F32, 1000);
        loom_buffer_t m0 = loom_alloc_ctx_tensors(c0, loom_dev_buffer_type(d0));
        loom_buffer_t m1 = loom_alloc_ctx_tensors(c1, loom_dev_buffer_type(d1));
        loom_buffer_t mh = loom_alloc_ctx_tensors(ch, loom_cpu_buffer_type());
        LOOM_REQUIRE(m0 && m1 && mh);
        expect_t e0 = {0}, e1 = {0};
        double bw = bws[k], lat = lats[k];
        static float host[1000];
        for (int i = 0; i < 1000; i++)
            host[i] = (float)i;

        loom_tensor_set(t0, host, 0, 4000); /* host -> d0 */
        e0.in += 4000, e0.copies++, e0.time += link_us(bw, lat, 4000);
        loom_tensor_get(t0, host, 400, 1000); /* d0 -> host */
        e0.out += 1000, e0.copies++, e0.time += link_us(bw, lat, 1000);
        loom_tensor_memset(t0, 0, 0, 100);                    /* on the device: free */
        LOOM_CHECK_EQ_INT(loom_tensor_copy(t0, t1), LOOM_OK); /* d0 -> d1 (direct or staged) */
        e0.out += 4000, e0.copies++, e0.time += link_us(bw, lat, 4000);
        e1.in += 4000, e1.copies++, e1.time += link_us(bw, lat, 4000);
        LOOM_CHECK_EQ_INT(loom_tensor_copy(th, t1), LOOM_OK); /* host buffer -> d1 */
        e1.in += 4000, e1.copies++, e1.time += link_us(bw, lat, 4000);
        LOOM_CHECK_EQ_INT(loom_tensor_copy(t1, th), LOOM_OK); /* d1 -> host buffer */
        e1.out += 4000, e1.copies++, e1.time += link_us(bw, lat, 4000);
        LOOM_CHECK_EQ_INT(loom_backend_tensor_copy_async(b1, b0, t1, t0), LOOM_OK);
        loom_backend_synchronize(b0); /* the copy reads t1: finish it before t1 changes */
        static float host2[3];
        loom_backend_tensor_set_async(b1, t1, host, 8, 800);
        loom_backend_tensor_get_async(b0, t0, host2, 0, 12);
        loom_backend_synchronize(b0);
        loom_backend_synchronize(b1);
        e1.out += 4000, e1.copies++, e1.time += link_us(bw, lat, 4000);
        e0.in += 4000, e0.copies++, e0.time += link_us(bw, lat, 4000);
        e1.in += 800, e1.copies++, e1.time += link_us(bw, lat, 800);
        e0.out += 12, e0.copies++, e0.time += link_us(bw, lat, 12);
        check_stats(d0, &e0, specs[k]);
        check_stats(d1, &e1, specs[k]);

        loom_sim_dev_reset_stats(d0);
        expect_t zero = {0};
        check_stats(d0, &zero, "after reset");
        loom_buffer_free(m0);
        loom_buffer_free(m1);
        loom_buffer_free(mh);
        loom_ctx_free(c0);
        loom_ctx_free(c1);
        loom_ctx_free(ch);
        loom_backend_free(b0);
        loom_backend_free(b1);
        loom_sim_reg_free(r);
    }
}

LOOM_TEST(sim, offload_threshold) {
    unsetenv("LOOM_OP_OFFLOAD_MIN_BATCH");
    loom_ctx *ctx = new_ctx(32);
    LOOM_REQUIRE(ctx != NULL);
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, 64, 64);
    loom_tensor *mm[5];
    const int64_t batch[5] = {1, 7, 8, 31, 32};
    for (int i = 0; i < 5; i++) {
        mm[i] = loom_mul_mat(ctx, w, loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 64, batch[i]));
        LOOM_REQUIRE(mm[i] != NULL);
    }
    loom_tensor *rows = loom_get_rows(ctx, w, loom_new_tensor_1d(ctx, LOOM_TYPE_I32, 512));
    LOOM_REQUIRE(rows != NULL);

    struct {
        const char *spec;
        const char *env;
        int64_t threshold; /* 0: never */
    } cases[] = {
        {"sim:1", NULL, 32},
        {"sim:1", "8", 8},
        {"sim:1,offload=4", "8", 4},
        {"sim:1,offload=0", NULL, 0},
    };
    for (int k = 0; k < 4; k++) {
        if (cases[k].env) {
            setenv("LOOM_OP_OFFLOAD_MIN_BATCH", cases[k].env, 1);
        } else {
            unsetenv("LOOM_OP_OFFLOAD_MIN_BATCH");
        }
        loom_reg_t r = new_reg(cases[k].spec);
        LOOM_REQUIRE(r != NULL);
        loom_dev_t d = loom_reg_dev_get(r, 0);
        for (int i = 0; i < 5; i++) {
            bool want = cases[k].threshold > 0 && batch[i] >= cases[k].threshold;
            LOOM_CHECK_MSG(loom_dev_offload_op(d, mm[i]) == want, "%s env=%s batch %lld",
                           cases[k].spec, cases[k].env ? cases[k].env : "-", (long long)batch[i]);
        }
        LOOM_CHECK(!loom_dev_offload_op(d, rows)); /* GET_ROWS never offloads */
        loom_sim_reg_free(r);
    }
    unsetenv("LOOM_OP_OFFLOAD_MIN_BATCH");
    loom_ctx_free(ctx);
}

LOOM_TEST(sim, refusals_and_validation) {
    loom_reg_t r = new_reg("sim:2,refuse=mul_mat+rope");
    LOOM_REQUIRE(r != NULL);
    loom_dev_t d = loom_reg_dev_get(r, 0);
    loom_ctx *ctx = new_ctx(16);
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 32, 8);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 32, 2);
    loom_tensor *mm = loom_mul_mat(ctx, w, x);
    loom_tensor *add = loom_add(ctx, x, x);
    loom_tensor *sm = loom_soft_max(ctx, x);
    LOOM_REQUIRE(mm && add && sm);
    loom_set_name(mm, "the_matmul");
    LOOM_CHECK(loom_cpu_supports_op(mm));
    LOOM_CHECK(!loom_dev_supports_op(d, mm));
    LOOM_CHECK(loom_dev_supports_op(d, add));
    LOOM_CHECK(loom_dev_supports_op(d, sm));
    loom_backend_t b = loom_dev_init(d, NULL);
    LOOM_REQUIRE(b != NULL);
    LOOM_CHECK(!loom_backend_supports_op(b, mm));

    loom_graph *g = loom_graph_new(ctx, 64);
    LOOM_REQUIRE(loom_graph_build_forward(g, mm) == LOOM_OK);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_dev_buffer_type(d));
    LOOM_REQUIRE(buf != NULL);
    LOOM_CHECK_EQ_INT(loom_backend_graph_compute(b, g), LOOM_ERR_UNSUPPORTED);
    char want[128];
    snprintf(want, sizeof want, "%s: op MUL_MAT (node 0 'the_matmul') is not supported",
             loom_dev_name(d));
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), want);

    /* A graph over another device's memory is refused before it runs. */
    loom_backend_t b1 = loom_dev_init(loom_reg_dev_get(r, 1), NULL);
    LOOM_REQUIRE(b1 != NULL);
    loom_graph *g2 = loom_graph_new(ctx, 64);
    LOOM_REQUIRE(loom_graph_build_forward(g2, add) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_backend_graph_compute(b1, g2), LOOM_ERR_INVALID_ARG);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "which this device cannot read");
    LOOM_CHECK_EQ_INT(loom_backend_graph_compute(b, g2), LOOM_OK);

    /* Backend params. */
    LOOM_CHECK(loom_dev_init(d, "threads=lots") == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "threads must be 1..256");
    LOOM_CHECK(loom_dev_init(d, "colour=blue") == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "unknown option 'colour=blue'");
    loom_backend_t b4 = loom_dev_init(d, "threads=3");
    LOOM_CHECK(b4 != NULL);
    loom_backend_free(b4);

    loom_buffer_free(buf);
    loom_backend_free(b);
    loom_backend_free(b1);
    loom_ctx_free(ctx);
    loom_sim_reg_free(r);
}

LOOM_TEST(sim, devices_from_spec_static) {
    loom_registry_reset();
    loom_dev_t devs[8];
    size_t n = 99;
    LOOM_REQUIRE(loom_devices_from_spec("cpu", devs, 8, &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 1);
    LOOM_CHECK(devs[0] == loom_cpu_dev());
    LOOM_CHECK_EQ_INT(loom_dev_get_type(devs[0]), LOOM_DEV_TYPE_CPU);

    LOOM_REQUIRE(loom_devices_from_spec("sim:3,mem=1GiB,link=pcie4", devs, 8, &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 3);
    for (size_t i = 0; i < n; i++) {
        LOOM_CHECK(loom_dev_is_sim(devs[i]));
        size_t total = 0;
        loom_dev_memory(devs[i], NULL, &total);
        LOOM_CHECK(total == (size_t)1 << 30);
        LOOM_CHECK(loom_registry_dev_by_name(loom_dev_name(devs[i])) == devs[i]);
    }
    loom_reg_t first = loom_dev_reg(devs[0]);
    LOOM_CHECK(loom_registry_reg_by_name(loom_reg_name(first)) == first);

    /* A second sim spec makes a second reg; cap limits what is written, not the count. */
    LOOM_REQUIRE(loom_devices_from_spec("sim:4", devs, 2, &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 4);
    LOOM_CHECK(loom_dev_reg(devs[0]) != first);
    /* A registered device by name. */
    LOOM_REQUIRE(loom_devices_from_spec(loom_dev_name(devs[1]), devs + 2, 1, &n) == LOOM_OK);
    LOOM_CHECK(n == 1 && devs[2] == devs[1]);

    struct {
        const char *spec;
        loom_status status;
        const char *msg;
    } bad[] = {
        {"sim:x", LOOM_ERR_FORMAT, "device spec 'sim:x': 'x' is not a device count"},
        {"sim:0", LOOM_ERR_FORMAT, "device spec 'sim:0': device count 0 is out of range 1..64"},
        {"sim:2,foo=1", LOOM_ERR_FORMAT, "device spec 'sim:2,foo=1': unknown option 'foo'"},
        {"sim:2,mem=2XB", LOOM_ERR_FORMAT, "device spec 'sim:2,mem=2XB': mem: unknown size"},
        {"cuda", LOOM_ERR_NOT_FOUND, "no CUDA devices"},
        {"cuda:0,1", LOOM_ERR_NOT_FOUND, "no CUDA devices"},
        {"tpu:1", LOOM_ERR_FORMAT, "device spec 'tpu:1': unknown device kind 'tpu'"},
        {"", LOOM_ERR_FORMAT, "device spec '' is empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t before = loom_registry_reg_count();
        LOOM_CHECK_EQ_INT(loom_devices_from_spec(bad[i].spec, devs, 8, &n), bad[i].status);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), bad[i].msg);
        LOOM_CHECK_EQ_INT(n, 0);
        LOOM_CHECK_EQ_INT(loom_registry_reg_count(), before); /* nothing half-registered */
    }
    loom_registry_reset(); /* frees both sim regs (asan: no leak) */
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 0);
    LOOM_CHECK_EQ_INT(loom_registry_dev_count(), 0);
}

LOOM_TEST(sim, load_all_registers_static_backends) {
    loom_registry_reset();
    unsetenv("LOOM_BACKEND_PATH");
    size_t n = loom_registry_load_all();
    LOOM_CHECK(n >= 2);
    LOOM_CHECK(loom_registry_reg_by_name("CPU") == loom_cpu_reg());
    loom_reg_t sim = loom_sim_reg_default();
    LOOM_REQUIRE(sim != NULL);
    LOOM_CHECK(loom_registry_reg_by_name(loom_reg_name(sim)) == sim);
    LOOM_CHECK(loom_registry_dev_by_type(LOOM_DEV_TYPE_CPU) == loom_cpu_dev());
    LOOM_CHECK(loom_dev_is_sim(loom_registry_dev_by_type(LOOM_DEV_TYPE_GPU)));
    size_t regs = loom_registry_reg_count();
    LOOM_CHECK_EQ_INT(loom_registry_load_all(), 0); /* all known already */
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), regs);
    loom_sim_reg_free(sim); /* the default reg is static: ignored */
    loom_registry_reset();
}

/* An allocator that fails the Nth allocation from now (malloc and realloc). */
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
static const loom_allocator oom_allocator = {oom_malloc, oom_realloc, oom_free, NULL};

LOOM_TEST(sim, host_oom_on_every_path) {
    /* Reg creation. */
    int failures = 0;
    loom_reg_t r = NULL;
    for (int n = 0; n < 20 && !r; n++) {
        atomic_store(&oom_countdown, n);
        loom_allocator_set(&oom_allocator);
        loom_status s = loom_sim_reg_new_from_spec("sim:2", &r);
        loom_allocator_set(NULL);
        if (s != LOOM_OK) {
            failures++;
            LOOM_CHECK_EQ_INT(s, LOOM_ERR_NOMEM);
            LOOM_CHECK(r == NULL);
        }
    }
    LOOM_REQUIRE(r != NULL);
    LOOM_CHECK(failures >= 1);

    /* Backend creation: fails cleanly (the reg asserts no backend is left at free). */
    loom_dev_t d = loom_reg_dev_get(r, 0);
    loom_backend_t b = NULL;
    failures = 0;
    for (int n = 0; n < 20 && !b; n++) {
        atomic_store(&oom_countdown, n);
        loom_allocator_set(&oom_allocator);
        b = loom_dev_init(d, NULL);
        loom_allocator_set(NULL);
        if (!b) {
            failures++;
            LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
        }
    }
    LOOM_REQUIRE(b != NULL);
    LOOM_CHECK(failures >= 1);

    /* Device buffers. */
    loom_buffer_t buf = NULL;
    failures = 0;
    for (int n = 0; n < 20 && !buf; n++) {
        atomic_store(&oom_countdown, n);
        loom_allocator_set(&oom_allocator);
        buf = loom_buft_alloc_buffer(loom_dev_buffer_type(d), 4096);
        loom_allocator_set(NULL);
        if (!buf) {
            failures++;
            LOOM_CHECK_EQ_INT(loom_last_status(), LOOM_ERR_NOMEM);
            loom_sim_stats st;
            loom_sim_dev_stats(d, &st);
            LOOM_CHECK_EQ_INT(st.mem_used, 0); /* the cap charge was undone */
        }
    }
    LOOM_REQUIRE(buf != NULL);
    LOOM_CHECK(failures >= 1);

    /* Async commands whose queue entry cannot be allocated run synchronously. */
    loom_ctx *ctx = new_ctx(2);
    loom_tensor *t = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 64);
    LOOM_REQUIRE(loom_buffer_alloc_tensor(buf, t, 0) == LOOM_OK);
    float in[64], out[64];
    for (int i = 0; i < 64; i++) in[i] = (float)i - 3.5f;
    loom_event_t ev = loom_event_new(d);
    LOOM_REQUIRE(ev != NULL);
    atomic_store(&oom_countdown, 0);
    loom_allocator_set(&oom_allocator);
    loom_backend_tensor_set_async(b, t, in, 0, sizeof in);
    atomic_store(&oom_countdown, 0);
    loom_event_record(ev, b);
    atomic_store(&oom_countdown, 0);
    loom_backend_tensor_get_async(b, t, out, 0, sizeof out);
    loom_allocator_set(NULL);
    loom_event_synchronize(ev);
    loom_backend_synchronize(b);
    LOOM_CHECK(memcmp(in, out, sizeof in) == 0);

    loom_event_free(ev);
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    loom_backend_free(b);
    loom_sim_reg_free(r);
}
