/*
 * libloom-sim.so's entry points: the registry dlopens the module, checks
 * loom_backend_api_version and calls loom_backend_init, which returns the default sim reg
 * (devices from env LOOM_SIM_DEVICES, else "sim:2"). More sim regs come through the reg's
 * proc address "loom_sim_reg_new_from_spec" (loom_devices_from_spec does that). The module
 * links libloom (core, the CPU kernels it computes with) and carries no copy of it.
 */
#include "backends/sim/sim-impl.h"

LOOM_BACKEND_MODULE(loom_sim_reg_default)
