/*
 * NCCL through dlopen (see cuda-nccl.h): the CUDA module links cudart and cuBLAS but not
 * NCCL, which only the communicator needs and which many machines lack.
 */
#define _GNU_SOURCE /* RTLD_LOCAL, pthread_once */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda-nccl.h"
#include "loom/core.h"

#define LOOM__NCCL_MIN_VERSION 21200 /* ncclCommGetAsyncError, ncclCommAbort, BF16 */

static void *nccl_sym(void *h, const char *name, const char **missing) {
    void *p = dlsym(h, name);
    if (!p && !*missing) *missing = name;
    return p;
}

loom_status loom__cuda_nccl_load(const char *path, loom__nccl_api *out) {
    memset(out, 0, sizeof *out);
    const char *file = path && path[0] ? path : "libnccl.so.2";
    dlerror();
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return loom_error(LOOM_ERR_NOT_FOUND, "CUDA: cannot load NCCL '%s': %s", file,
                          why ? why : "dlopen failed");
    }
    const char *missing = NULL;
    loom__nccl_api a;
    memset(&a, 0, sizeof a);
    a.handle = h;
    snprintf(a.path, sizeof a.path, "%s", file);
    /* dlsym returns void *; POSIX guarantees it converts to a function pointer */
#define LOOM__NCCL_SYM(field, name)                                                                \
    do {                                                                                           \
        void *p_ = nccl_sym(h, name, &missing);                                                    \
        memcpy(&a.field, &p_, sizeof p_);                                                          \
    } while (0)
    LOOM__NCCL_SYM(GetVersion, "ncclGetVersion");
    LOOM__NCCL_SYM(GetErrorString, "ncclGetErrorString");
    LOOM__NCCL_SYM(CommInitAll, "ncclCommInitAll");
    LOOM__NCCL_SYM(CommDestroy, "ncclCommDestroy");
    LOOM__NCCL_SYM(CommAbort, "ncclCommAbort");
    LOOM__NCCL_SYM(CommGetAsyncError, "ncclCommGetAsyncError");
    LOOM__NCCL_SYM(GroupStart, "ncclGroupStart");
    LOOM__NCCL_SYM(GroupEnd, "ncclGroupEnd");
    LOOM__NCCL_SYM(AllReduce, "ncclAllReduce");
    LOOM__NCCL_SYM(GetUniqueId, "ncclGetUniqueId");
    LOOM__NCCL_SYM(CommInitRank, "ncclCommInitRank");
    LOOM__NCCL_SYM(Send, "ncclSend");
    LOOM__NCCL_SYM(Recv, "ncclRecv");
#undef LOOM__NCCL_SYM
    if (missing) {
        dlclose(h);
        return loom_error(LOOM_ERR_UNSUPPORTED, "CUDA: NCCL '%s' has no %s: not an NCCL library",
                          file, missing);
    }
    if (a.GetVersion(&a.version) != 0 || a.version < LOOM__NCCL_MIN_VERSION) {
        const int v = a.version;
        dlclose(h);
        return loom_error(LOOM_ERR_UNSUPPORTED,
                          "CUDA: NCCL '%s' is version %d; loom needs 2.12 (%d) or newer", file, v,
                          LOOM__NCCL_MIN_VERSION);
    }
    *out = a;
    return LOOM_OK;
}

void loom__cuda_nccl_unload(loom__nccl_api *api) {
    if (!api || !api->handle) return;
    dlclose(api->handle);
    memset(api, 0, sizeof *api);
}

static pthread_once_t loom__nccl_once = PTHREAD_ONCE_INIT;
static loom__nccl_api loom__nccl_global;
static bool loom__nccl_ok;
static char loom__nccl_why[512];

static void loom__nccl_init(void) {
    const char *env = getenv("LOOM_CUDA_NCCL");
    if (env && strcmp(env, "0") == 0) {
        snprintf(loom__nccl_why, sizeof loom__nccl_why, "NCCL disabled by LOOM_CUDA_NCCL=0");
    } else if (loom__cuda_nccl_load(env, &loom__nccl_global) == LOOM_OK) {
        loom__nccl_ok = true;
        LOOM_LOG_INFO("CUDA: NCCL %d.%d.%d loaded from %s", loom__nccl_global.version / 10000,
                      loom__nccl_global.version / 100 % 100, loom__nccl_global.version % 100,
                      loom__nccl_global.path);
        return;
    } else {
        snprintf(loom__nccl_why, sizeof loom__nccl_why, "%s", loom_last_error());
    }
    LOOM_LOG_WARN("%s; no NCCL communicator (loom's own AllReduce is used)", loom__nccl_why);
}

const loom__nccl_api *loom__cuda_nccl(const char **why) {
    pthread_once(&loom__nccl_once, loom__nccl_init);
    if (why) *why = loom__nccl_ok ? "" : loom__nccl_why;
    return loom__nccl_ok ? &loom__nccl_global : NULL;
}
