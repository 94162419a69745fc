/*
 * sim device profiles, link presets and the timing model: a profile sets the devices'
 * memory, unknown names list the known ones, every op run on a profiled device accounts
 * max(bytes / bandwidth, flops / throughput) / efficiency + launch, copies account the
 * preset's link time, and virtual=1 reserves address space only (a device "holding" far
 * more than the host has) while still accounting.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/sim.h"
#include "tests/shim/loom_test.h"

static const char *const required[] = {"h200", "h100-sxm", "h100-pcie", "a100-80g",
                                       "l40s", "rtx-5090", "rtx-4090",  "rtx-3090"};

LOOM_TEST(sim_profile, table_has_every_profile_with_a_source) {
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        const loom_sim_profile *p = NULL;
        LOOM_REQUIRE(loom_sim_profile_find(required[i], &p) == LOOM_OK);
        LOOM_CHECK(p->mem_bytes >= ((size_t)24 << 30));
        LOOM_CHECK(p->hbm_gbps > 500 && p->fp16_tflops > 50 && p->int8_tops > p->fp16_tflops);
        LOOM_CHECK(p->launch_us > 0 && p->efficiency > 0 && p->efficiency <= 1);
        LOOM_CHECK(p->source && strlen(p->source) > 10);
    }
    static const char *const links[] = {"nvlink3",  "nvlink4",     "nvlink5",
                                        "nvswitch", "pcie4",       "pcie4-nop2p",
                                        "pcie5",    "pcie5-nop2p", "host-staged"};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        const loom_sim_link_preset_info *l = NULL;
        LOOM_REQUIRE(loom_sim_link_preset_find(links[i], &l) == LOOM_OK);
        LOOM_CHECK(l->bandwidth_gbps > 0 && l->latency_us > 0 && l->source[0]);
        LOOM_CHECK_EQ_INT(l->p2p,
                          strstr(links[i], "nop2p") == NULL && strcmp(links[i], "host-staged"));
    }
}

LOOM_TEST(sim_profile, spec_sets_memory_link_and_rejects_unknown_names) {
    loom_sim_config c;
    LOOM_REQUIRE(loom_sim_config_parse("sim:4,profile=rtx-3090,link=pcie4", &c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c.n_devices, 4);
    LOOM_CHECK(c.mem_bytes == ((size_t)24 << 30));
    LOOM_CHECK(strcmp(c.profile, "rtx-3090") == 0);
    LOOM_CHECK_NEAR(c.link.bandwidth_gbps, 25.0, 1e-9);
    LOOM_CHECK(c.p2p);
    /* mem= wins over the profile in either order; a no-P2P preset turns p2p off */
    LOOM_REQUIRE(loom_sim_config_parse("sim:2,mem=1GiB,profile=h200,link=pcie4-nop2p", &c) ==
                 LOOM_OK);
    LOOM_CHECK(c.mem_bytes == ((size_t)1 << 30));
    LOOM_CHECK(!c.p2p);
    LOOM_REQUIRE(loom_sim_config_parse("sim:2,p2p=1,link=host-staged", &c) == LOOM_OK);
    LOOM_CHECK(c.p2p);

    LOOM_CHECK_EQ_INT(loom_sim_config_parse("sim:2,profile=rtx-9090", &c), LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "unknown device profile 'rtx-9090'");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "rtx-3090");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "h200");
    LOOM_CHECK_EQ_INT(loom_sim_config_parse("sim:2,link=token-ring", &c), LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "nvlink4");

    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2,profile=rtx-4090", &reg) == LOOM_OK);
    size_t free_b = 0, total = 0;
    loom_dev_memory(loom_reg_dev_get(reg, 1), &free_b, &total);
    LOOM_CHECK(total == ((size_t)24 << 30));
    LOOM_CHECK_STR_CONTAINS(loom_dev_description(loom_reg_dev_get(reg, 0)), "rtx-4090");
    loom_sim_reg_free(reg);
}

/* A matmul and an add on a profiled device: the accounted time is the model's formula,
 * computed here from the profile's figures (not from loom_sim_op_time_us). */
LOOM_TEST(sim_profile, ops_account_the_timing_model) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:1,profile=rtx-3090", &reg) == LOOM_OK);
    loom_dev_t dev = loom_reg_dev_get(reg, 0);
    loom_backend_t be = loom_dev_init(dev, NULL);
    LOOM_REQUIRE(be != NULL);
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){
        .mem_size = 16 * loom_tensor_overhead() + loom_graph_overhead(LOOM_DEFAULT_GRAPH_SIZE),
        .no_alloc = true});
    const int64_t K = 4096, M = 1024, N = 8;
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, K, M);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, N);
    loom_tensor *y = loom_mul_mat(ctx, w, x); /* [M, N] F32 */
    loom_tensor *z = loom_add(ctx, y, y);     /* elementwise */
    loom_graph *g = loom_graph_new(ctx, LOOM_DEFAULT_GRAPH_SIZE);
    LOOM_REQUIRE(loom_graph_build_forward(g, z) == LOOM_OK);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_dev_buffer_type(dev));
    LOOM_REQUIRE(buf != NULL);
    loom_buffer_clear(buf, 0);
    loom_sim_dev_reset_stats(dev);
    LOOM_REQUIRE(loom_backend_graph_compute(be, g) == LOOM_OK);
    loom_sim_stats st;
    loom_sim_dev_stats(dev, &st);

    const double bw = 936e9, fp16 = 71e12, eff = 0.75, launch = 4.0;
    double mm_bytes = (double)(K * M * 2 + K * N * 4 + M * N * 4);
    double mm_flops = 2.0 * K * M * N;
    double mm = fmax(mm_bytes / bw, mm_flops / fp16) / eff * 1e6 + launch;
    double add = (3.0 * M * N * 4) / bw / eff * 1e6 + launch; /* 5 flops/elt: bandwidth-bound */
    LOOM_CHECK_EQ_INT((int)st.ops, 2);
    LOOM_CHECK_NEAR(st.compute_time_us, mm + add, 1e-6 * (mm + add));

    /* a prompt-sized matmul is compute-bound: time grows with N past the memory bound */
    loom_tensor *xb = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, 4096);
    loom_tensor *yb = loom_mul_mat(ctx, w, xb);
    double big = loom_sim_op_time_us(loom_sim_profile_get(7), yb);
    LOOM_CHECK(strcmp(loom_sim_profile_get(7)->name, "rtx-3090") == 0);
    LOOM_CHECK_NEAR(big, 2.0 * K * M * 4096 / fp16 / eff * 1e6 + launch, 1e-3);

    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    loom_backend_free(be);
    loom_sim_reg_free(reg);
}

/* Copies account the preset's latency + bytes / bandwidth; virtual=1 devices hold 64 GiB
 * each in address space alone and copy nothing (the host bytes read back are untouched). */
LOOM_TEST(sim_profile, virtual_memory_accounts_without_moving) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec(
                     "sim:2,profile=h100-sxm,mem=1TiB,virtual=1,link=nvlink4", &reg) == LOOM_OK);
    loom_dev_t d0 = loom_reg_dev_get(reg, 0);
    loom_buffer_t big = loom_buft_alloc_buffer(loom_dev_buffer_type(d0), (size_t)64 << 30);
    LOOM_REQUIRE(big != NULL);
    size_t free_b = 0, total = 0;
    loom_dev_memory(d0, &free_b, &total);
    LOOM_CHECK(total - free_b == ((size_t)64 << 30));
    loom_buffer_clear(big, 7); /* no page is touched */

    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 4 * loom_tensor_overhead(), .no_alloc = true});
    loom_tensor *t = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 1 << 20);
    LOOM_REQUIRE(loom_buffer_alloc_tensor(big, t, 0) == LOOM_OK);
    static float host[1 << 20];
    for (int i = 0; i < (1 << 20); i++)
        host[i] = 1.0f;
    loom_sim_dev_reset_stats(d0);
    loom_tensor_set(t, host, 0, sizeof host);
    host[5] = 3.0f;
    loom_tensor_get(t, host, 0, sizeof host);
    LOOM_CHECK(host[5] == 3.0f && host[6] == 1.0f); /* nothing was moved */
    loom_sim_stats st;
    loom_sim_dev_stats(d0, &st);
    LOOM_CHECK_EQ_INT((int)st.copies, 2);
    double one = 2.0 + (double)sizeof host / 450e9 * 1e6;
    LOOM_CHECK_NEAR(st.link_time_us, 2 * one, 1e-9);
    LOOM_CHECK_NEAR(st.link_wait_us, 2 * one, 1e-9); /* host transfers: the device waits */
    loom_ctx_free(ctx);
    loom_buffer_free(big);
    loom_sim_reg_free(reg);
}

LOOM_TEST(sim_profile, allreduce_ring_steps) {
    loom_sim_link l = {.bandwidth_gbps = 25, .latency_us = 8};
    /* 4 devices, 32 KiB: 6 steps of 8 KiB */
    double step = 8.0 + 8192.0 / 25e9 * 1e6;
    LOOM_CHECK_NEAR(loom_sim_allreduce_time_us(&l, true, 4, 32768), 6 * step, 1e-9);
    LOOM_CHECK_NEAR(loom_sim_allreduce_time_us(&l, false, 4, 32768), 12 * step, 1e-9);
    LOOM_CHECK_NEAR(loom_sim_allreduce_time_us(&l, true, 1, 32768), 0.0, 0);
}

/* Full duplex: a device-to-device copy is waited for by its receiver only (link_wait_us),
 * while link_time_us keeps charging both ends. */
LOOM_TEST(sim_profile, device_copies_are_waited_for_by_the_receiver) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2,profile=l40s,link=pcie4", &reg) == LOOM_OK);
    loom_dev_t d[2] = {loom_reg_dev_get(reg, 0), loom_reg_dev_get(reg, 1)};
    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 4 * loom_tensor_overhead(), .no_alloc = true});
    loom_tensor *t[2];
    loom_buffer_t b[2];
    for (int i = 0; i < 2; i++) {
        t[i] = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 4096);
        b[i] = loom_buft_alloc_buffer(loom_dev_buffer_type(d[i]), loom_nbytes(t[i]));
        LOOM_REQUIRE(b[i] != NULL);
        LOOM_REQUIRE(loom_buffer_alloc_tensor(b[i], t[i], 0) == LOOM_OK);
        loom_sim_dev_reset_stats(d[i]);
    }
    LOOM_REQUIRE(loom_tensor_copy(t[0], t[1]) == LOOM_OK);
    loom_sim_stats s0, s1;
    loom_sim_dev_stats(d[0], &s0);
    loom_sim_dev_stats(d[1], &s1);
    double one = 8.0 + 16384.0 / 25e9 * 1e6;
    LOOM_CHECK_NEAR(s0.link_time_us, one, 1e-9);
    LOOM_CHECK_NEAR(s1.link_time_us, one, 1e-9);
    LOOM_CHECK_NEAR(s0.link_wait_us, 0.0, 0);
    LOOM_CHECK_NEAR(s1.link_wait_us, one, 1e-9);
    for (int i = 0; i < 2; i++)
        loom_buffer_free(b[i]);
    loom_ctx_free(ctx);
    loom_sim_reg_free(reg);
}
