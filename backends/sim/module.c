/*
 * libloom-sim.so's entry point: the registry dlopens the module and calls
 * loom_backend_init, which returns the default sim reg (devices from env LOOM_SIM_DEVICES,
 * else "sim:2"). More sim regs come through the reg's proc address
 * "loom_sim_reg_new_from_spec" (loom_devices_from_spec does that).
 */
#include "backends/sim/sim-impl.h"

LOOM_API loom_reg_t loom_backend_init(void);

loom_reg_t loom_backend_init(void) {
    return loom_sim_reg_default();
}
