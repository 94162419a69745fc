/*
 * The dlopen-able CPU module (libloom-cpu.so). The CPU backend itself lives in libloom
 * (the model and the sim backend need it, and it is the oracle), so this module holds no
 * code of its own: it links libloom and exports the entry points returning libloom's CPU
 * reg. A process that links libloom already has "CPU" registered and skips it.
 */
#include "loom/backend-impl.h"
#include "loom/cpu.h"

LOOM_BACKEND_MODULE(loom_cpu_reg)
