/*
 * Tests of the sim spec parser and link model (backends/sim/sim-config.c): good specs
 * give the documented values, bad ones LOOM_ERR_FORMAT with a message that quotes the
 * offending part; link presets and loom_sim_link_time_us against the formula.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/sim.h"
#include "tests/shim/loom_test.h"

LOOM_TEST(sim_config, defaults) {
    unsetenv("LOOM_OP_OFFLOAD_MIN_BATCH");
    loom_sim_config c;
    loom_sim_config_default(&c, 3);
    LOOM_CHECK_EQ_INT(c.n_devices, 3);
    LOOM_CHECK(c.mem_bytes == (size_t)16 * 1024 * 1024 * 1024);
    LOOM_CHECK_NEAR(c.link.bandwidth_gbps, 150.0, 0);
    LOOM_CHECK_NEAR(c.link.latency_us, 2.0, 0);
    LOOM_CHECK(strcmp(c.link_name, "nvlink") == 0);
    LOOM_CHECK_EQ_INT(c.offload_min_batch, 32);
    LOOM_CHECK_EQ_INT(c.threads, 1);
    LOOM_CHECK(!c.host_memory);
    LOOM_CHECK(c.p2p);
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        LOOM_CHECK(!c.refuse[op]);
}

LOOM_TEST(sim_config, good_specs) {
    unsetenv("LOOM_OP_OFFLOAD_MIN_BATCH");
    loom_sim_config c;
    LOOM_REQUIRE(loom_sim_config_parse("sim", &c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c.n_devices, 1);
    LOOM_REQUIRE(loom_sim_config_parse("5", &c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c.n_devices, 5);
    LOOM_REQUIRE(loom_sim_config_parse("SIM:64", &c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c.n_devices, 64);

    LOOM_REQUIRE(loom_sim_config_parse("sim:4,mem=2GiB,link=pcie4", &c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c.n_devices, 4);
    LOOM_CHECK(c.mem_bytes == (size_t)2 << 30);
    LOOM_CHECK_NEAR(c.link.bandwidth_gbps, 25.0, 0);
    LOOM_CHECK_NEAR(c.link.latency_us, 8.0, 0);
    LOOM_CHECK(strcmp(c.link_name, "pcie4") == 0);

    struct {
        const char *mem;
        size_t bytes;
    } sizes[] = {
        {"4096", 4096},       {"1KiB", 1024},         {"1KB", 1000},
        {"3MiB", 3u << 20},   {"3MB", 3000000},       {"2GB", 2000000000},
        {"1.5GiB", 3u << 29}, {"512kib", 512u << 10}, {"7B", 7},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char spec[64];
        snprintf(spec, sizeof spec, "sim:1,mem=%s", sizes[i].mem);
        LOOM_CHECK_MSG(loom_sim_config_parse(spec, &c) == LOOM_OK, "%s: %s", spec,
                       loom_last_error());
        LOOM_CHECK_MSG(c.mem_bytes == sizes[i].bytes, "%s: %zu", spec, c.mem_bytes);
    }

    LOOM_REQUIRE(loom_sim_config_parse("sim:2,bw=12.5,link=pcie5,lat=3", &c) == LOOM_OK);
    LOOM_CHECK_NEAR(c.link.bandwidth_gbps, 12.5, 0); /* overrides win over the preset */
    LOOM_CHECK_NEAR(c.link.latency_us, 3.0, 0);
    LOOM_CHECK(strcmp(c.link_name, "custom") == 0);

    LOOM_REQUIRE(loom_sim_config_parse("sim:2,link=none", &c) == LOOM_OK);
    LOOM_CHECK_NEAR(loom_sim_link_time_us(&c.link, 1u << 30), 0.0, 0);

    LOOM_REQUIRE(loom_sim_config_parse("sim:2,refuse=mul_mat+ROPE+soft_max", &c) == LOOM_OK);
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        bool expect = op == LOOM_OP_MUL_MAT || op == LOOM_OP_ROPE || op == LOOM_OP_SOFT_MAX;
        LOOM_CHECK_MSG(c.refuse[op] == expect, "op %s", loom_op_name((loom_op)op));
    }

    LOOM_REQUIRE(loom_sim_config_parse("sim:3,offload=0,threads=4,hostmem=1,p2p=0", &c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c.offload_min_batch, 0);
    LOOM_CHECK_EQ_INT(c.threads, 4);
    LOOM_CHECK(c.host_memory);
    LOOM_CHECK(!c.p2p);

    LOOM_REQUIRE(loom_sim_config_parse("sim,mem=1MiB", &c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c.n_devices, 1);
    LOOM_CHECK(c.mem_bytes == (size_t)1 << 20);
}

LOOM_TEST(sim_config, bad_specs_name_the_bad_part) {
    struct {
        const char *spec;
        const char *msg;
    } bad[] = {
        {"sim:x", "sim spec 'sim:x': 'x' is not a device count"},
        {"sim:", "'' is not a device count"},
        {"sim:2x", "'2x' is not a device count"},
        {"sim:0", "device count 0 is out of range 1..64"},
        {"sim:65", "device count 65 is out of range 1..64"},
        {"sim:-1", "device count -1 is out of range 1..64"},
        {"gpu:2", "'gpu:2' is not a device count"},
        {"sim:2,foo=1", "unknown option 'foo'"},
        {"sim:2,mem", "option 'mem' needs a value"},
        {"sim:2,mem=", "option 'mem' needs a value"},
        {"sim:2,mem=2XB", "unknown size suffix 'XB' in '2XB'"},
        {"sim:2,mem=lots", "'lots' is not a size"},
        {"sim:2,mem=0", "'0' is not a positive size"},
        {"sim:2,link=infiniband", "unknown link preset 'infiniband'"},
        {"sim:2,bw=fast", "bw: 'fast' is not a bandwidth"},
        {"sim:2,bw=-3", "bw: '-3' is not a bandwidth"},
        {"sim:2,lat=1us", "lat: '1us' is not a latency"},
        {"sim:2,refuse=mul_mat+warp", "refuse: unknown op 'warp'"},
        {"sim:2,offload=-1", "offload: '-1' is not a non-negative batch size"},
        {"sim:2,threads=0", "threads=0 is out of range 1..256"},
        {"sim:2,threads=two", "threads: 'two' is not a number"},
        {"sim:2,hostmem=maybe", "hostmem: 'maybe' is not 0 or 1"},
        {"sim:2,p2p=2", "p2p: '2' is not 0 or 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_sim_config c;
        loom_status s = loom_sim_config_parse(bad[i].spec, &c);
        LOOM_CHECK_MSG(s == LOOM_ERR_FORMAT, "'%s' gave status %d", bad[i].spec, (int)s);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), bad[i].msg);
        char prefix[128];
        snprintf(prefix, sizeof prefix, "sim spec '%s': ", bad[i].spec);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), prefix);
    }
    loom_sim_config c;
    LOOM_CHECK_EQ_INT(loom_sim_config_parse(NULL, &c), LOOM_ERR_INVALID_ARG);
}

LOOM_TEST(sim_config, link_presets_and_time) {
    struct {
        const char *name;
        double bw, lat;
    } presets[] = {{"nvlink", 150, 2}, {"pcie4", 25, 8}, {"pcie5", 50, 6}, {"none", 0, 0}};
    for (size_t i = 0; i < 4; i++) {
        loom_sim_link l;
        LOOM_REQUIRE(loom_sim_link_preset(presets[i].name, &l) == LOOM_OK);
        LOOM_CHECK_NEAR(l.bandwidth_gbps, presets[i].bw, 0);
        LOOM_CHECK_NEAR(l.latency_us, presets[i].lat, 0);
    }
    loom_sim_link l;
    LOOM_CHECK_EQ_INT(loom_sim_link_preset("token-ring", &l), LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'token-ring'");

    /* latency + bytes / bandwidth: 1 GB at 25 GB/s is 40 ms = 40000 us, plus 8 us. */
    loom_sim_link_preset("pcie4", &l);
    LOOM_CHECK_NEAR(loom_sim_link_time_us(&l, 1000000000ull), 40008.0, 1e-6);
    LOOM_CHECK_NEAR(loom_sim_link_time_us(&l, 0), 8.0, 1e-12);
    loom_sim_link custom = {.bandwidth_gbps = 2.0, .latency_us = 0.5};
    LOOM_CHECK_NEAR(loom_sim_link_time_us(&custom, 3000), 0.5 + 3000 / 2000.0, 1e-12);
}

LOOM_TEST(sim_config, offload_env_sets_default) {
    loom_sim_config c;
    setenv("LOOM_OP_OFFLOAD_MIN_BATCH", "8", 1);
    loom_sim_config_default(&c, 1);
    LOOM_CHECK_EQ_INT(c.offload_min_batch, 8);
    LOOM_REQUIRE(loom_sim_config_parse("sim:1", &c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c.offload_min_batch, 8);
    LOOM_REQUIRE(loom_sim_config_parse("sim:1,offload=4", &c) == LOOM_OK);
    LOOM_CHECK_EQ_INT(c.offload_min_batch, 4); /* the spec wins over the env */
    setenv("LOOM_OP_OFFLOAD_MIN_BATCH", "many", 1);
    loom_sim_config_default(&c, 1);
    LOOM_CHECK_EQ_INT(c.offload_min_batch, 32); /* bad value: warned, default kept */
    unsetenv("LOOM_OP_OFFLOAD_MIN_BATCH");
}
