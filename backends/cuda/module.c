/*
 * libloom-cuda.so's entry points: the registry dlopens the module, checks
 * loom_backend_api_version and calls loom_backend_init, which returns the process-wide
 * CUDA reg (zero devices, never NULL, on a machine without a GPU or a driver, so the
 * registry lists "CUDA" with no devices and a device spec "cuda" reports "no CUDA
 * devices"). The module links libloom and carries no copy of it.
 */
#include "backends/cuda/cuda-impl.h"

LOOM_BACKEND_MODULE(loom_cuda_reg)
