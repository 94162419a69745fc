/*
 * ops_sim_test: every ops case on a simulated GPU (private device memory, its own worker
 * thread with 2 compute threads), compared with the CPU backend (the oracle) on the same
 * inputs: config 0 runs on the CPU with 1 thread (and is checked against the reference),
 * config 1 replays the same graphs on the sim device.
 */
#include <stdio.h>

#include "loom/cpu.h"
#include "loom/sim.h"
#include "tests/ops/harness.h"

#define OPS_SIM_SPEC "sim:1,threads=2"

static bool ops_sim_open(int config, ops_backend *out) {
    if (config == 0) return ops_cpu_open(0, out);
    loom_reg_t reg = NULL;
    loom_status st = loom_sim_reg_new_from_spec(OPS_SIM_SPEC, &reg);
    if (st != LOOM_OK || !reg) {
        loom_test_fail(__FILE__, __LINE__, "loom_sim_reg_new_from_spec(\"%s\"): %s", OPS_SIM_SPEC,
                       loom_last_error());
        return false;
    }
    loom_dev_t dev = loom_reg_dev_get(reg, 0);
    out->backend = dev ? loom_dev_init(dev, NULL) : NULL;
    if (!out->backend) {
        loom_test_fail(__FILE__, __LINE__, "sim device init: %s", loom_last_error());
        loom_sim_reg_free(reg);
        return false;
    }
    out->buft = loom_dev_buffer_type(dev);
    out->priv = reg;
    snprintf(out->label, sizeof out->label, "%s", loom_dev_name(dev));
    return true;
}

static void ops_sim_close(ops_backend *b) {
    loom_backend_free(b->backend);
    if (b->priv) loom_sim_reg_free((loom_reg_t)b->priv);
}

const ops_mode ops_target_mode = {
    .name = "sim",
    .n_configs = 2,
    .replay = true,
    .open = ops_sim_open,
    .close = ops_sim_close,
};

/* The comparison is only meaningful if the sim device really computes out of its own
 * (non-host) memory, reached through set/get. */
LOOM_TEST(ops_mode, sim_memory_is_private) {
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec(OPS_SIM_SPEC, &reg) == LOOM_OK && reg);
    loom_dev_t dev = loom_reg_dev_get(reg, 0);
    LOOM_CHECK(dev != NULL && loom_dev_is_sim(dev));
    if (dev) {
        LOOM_CHECK(loom_dev_get_type(dev) == LOOM_DEV_TYPE_GPU);
        LOOM_CHECK(!loom_buft_is_host(loom_dev_buffer_type(dev)));
    }
    loom_sim_reg_free(reg);
}
