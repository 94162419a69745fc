/*
 * libloom-cuda.so's entry point: the registry dlopens the module and calls
 * loom_backend_init, which returns the process-wide CUDA reg (zero devices, never NULL,
 * on a machine without a GPU or a driver, so the registry lists "CUDA" with no devices
 * and a device spec "cuda" reports "no CUDA devices").
 */
#include "backends/cuda/cuda-impl.h"

LOOM_API loom_reg_t loom_backend_init(void);

loom_reg_t loom_backend_init(void) {
    return loom_cuda_reg();
}
