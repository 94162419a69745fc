/*
 * The dlopen-able CPU module (libloom-cpu.so): exports the entry point the registry looks
 * for, returning the CPU reg.
 */
#include "backends/backend-impl.h"
#include "loom/cpu.h"

LOOM_API loom_reg_t loom_backend_init(void);

LOOM_API loom_reg_t loom_backend_init(void) {
    return loom_cpu_reg();
}
