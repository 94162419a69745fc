/*
 * The CUDA backend where the CUDA toolkit was absent at build time: the API of
 * include/loom/cuda.h with a "CUDA" reg of zero devices, so code and tests that link the
 * CUDA library build and run everywhere (and skip, saying why). No module is built from
 * this file: libloom-cuda.so only exists where the toolkit does.
 */
#include <stdint.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "backends/cuda/cuda-nccl.h"
#include "loom/cuda.h"

static const char loom__cuda_none_reason[] =
    "the CUDA backend was built without the CUDA toolkit (none found at build time)";

static const char *loom__cuda_none_name(loom_reg_t reg) {
    (void)reg;
    return "CUDA";
}

static size_t loom__cuda_none_count(loom_reg_t reg) {
    (void)reg;
    return 0;
}

static loom_dev_t loom__cuda_none_get(loom_reg_t reg, size_t index) {
    (void)reg;
    (void)index;
    return NULL;
}

const char *loom_cuda_no_devices_reason(loom_reg_t reg);

/* Only the reason, so a device spec can say why there are no devices. */
static void *loom__cuda_none_proc(loom_reg_t reg, const char *name) {
    (void)reg;
    if (strcmp(name, "loom_cuda_no_devices_reason") != 0) return NULL;
    const char *(*fn)(loom_reg_t) = loom_cuda_no_devices_reason;
    void *p;
    memcpy(&p, &fn, sizeof p);
    return p;
}

static const struct loom_reg_i loom__cuda_none_reg_i = {
    .get_name = loom__cuda_none_name,
    .get_device_count = loom__cuda_none_count,
    .get_device = loom__cuda_none_get,
    .get_proc_address = loom__cuda_none_proc,
};

static struct loom_reg loom__cuda_none_reg = {
    .api_version = LOOM_BACKEND_API_VERSION,
    .iface = &loom__cuda_none_reg_i,
    .context = NULL,
};

loom_reg_t loom_cuda_reg(void) {
    return &loom__cuda_none_reg;
}

const char *loom_cuda_no_devices_reason(loom_reg_t reg) {
    (void)reg;
    return loom__cuda_none_reason;
}

loom_status loom_cuda_reg_new_virtual(int per_gpu, loom_reg_t *out) {
    (void)per_gpu;
    if (out) *out = NULL;
    return loom_error(LOOM_ERR_UNSUPPORTED, "CUDA: %s", loom__cuda_none_reason);
}

void loom_cuda_reg_free(loom_reg_t reg) {
    (void)reg;
}

bool loom_dev_is_cuda(loom_dev_t dev) {
    (void)dev;
    return false;
}

void loom_cuda_backend_get_stats(loom_backend_t backend, loom_cuda_backend_stats *out) {
    (void)backend;
    if (out) memset(out, 0, sizeof *out);
}

loom_status loom__cuda_nccl_load(const char *path, loom__nccl_api *out) {
    (void)path;
    if (out) memset(out, 0, sizeof *out);
    return loom_error(LOOM_ERR_UNSUPPORTED, "CUDA: %s", loom__cuda_none_reason);
}

void loom__cuda_nccl_unload(loom__nccl_api *api) {
    if (api) memset(api, 0, sizeof *api);
}

const loom__nccl_api *loom__cuda_nccl(const char **why) {
    if (why) *why = loom__cuda_none_reason;
    return NULL;
}

void loom__cuda_comm_thresholds(size_t *oneshot_max, size_t *bf16_min) {
    *oneshot_max = 0;
    *bf16_min = SIZE_MAX;
}
