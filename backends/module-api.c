/*
 * The LOOM_API functions of the backends that are modules (loom/sim.h: libloom-sim.so;
 * loom/cuda.h: libloom-cuda.so), defined in libloom as thin forwarders so that a program
 * linking libloom links them: each finds the module's function through the registry
 * (loom_reg_get_proc_address) and calls it.
 *
 *   - a function of a device, backend or reg asks that object's reg: a device of another
 *     backend answers as the header says for one (loom_dev_is_sim: false; the stats: zeros);
 *   - any other asks every registered reg in turn and, when none answers, loads the modules
 *     (loom_registry_load_all) once and asks again; when still none does, the call fails
 *     as its header says for a failure, with loom_last_error naming the module that is
 *     missing (a double is NAN then, a pointer NULL).
 *
 * Only libloom.so and libloom.a contain this file (//:libloom.so.0 and //:libloom.a): tests
 * and the loom tool that link a backend statically get the backend's own definitions.
 */
#include <math.h>
#include <string.h>

#include "backends/registry-internal.h"
#include "loom/backend-impl.h"
#include "loom/cuda.h"
#include "loom/sim.h"

/* The first registered reg's `name`; with `load`, loads the modules once when none has
 * it. NULL with loom_last_error naming the module otherwise. */
static void *loom__module_proc(const char *name, const char *module) {
    for (int pass = 0; pass < 2; pass++) {
        size_t n = loom_registry_reg_count();
        for (size_t i = 0; i < n; i++) {
            void *p = loom_reg_get_proc_address(loom_registry_reg_get(i), name);
            if (p) return p;
        }
        if (pass == 0) loom_registry_load_all();
    }
    if (loom__registry_linked_statically()) {
        loom_error(LOOM_ERR_NOT_FOUND, "%s: the %s backend module is not loaded%s", name, module,
                   loom__registry_static_hint(module));
    } else {
        loom_error(LOOM_ERR_NOT_FOUND,
                   "%s: the %s backend module (libloom-%s.so) is not loaded and none was found "
                   "(LOOM_BACKEND_PATH, lib/loom/ beside libloom, the executable's directory)",
                   name, module, module);
    }
    return NULL;
}

/* The reg's own `name`; NULL (no error) when the reg is not of the module. */
static void *loom__reg_proc(loom_reg_t reg, const char *name) {
    return reg ? loom_reg_get_proc_address(reg, name) : NULL;
}

static void *loom__dev_proc(loom_dev_t dev, const char *name) {
    return dev ? loom__reg_proc(loom_dev_reg(dev), name) : NULL;
}

static void *loom__backend_proc(loom_backend_t backend, const char *name) {
    return backend ? loom__dev_proc(loom_backend_device(backend), name) : NULL;
}

/* fn: a function pointer variable of the callee's type, set from the proc (NULL: absent). */
#define LOOM__PROC(fn, lookup)                                                                     \
    do {                                                                                           \
        void *p_ = (lookup);                                                                       \
        memcpy(&(fn), &p_, sizeof(fn));                                                            \
    } while (0)

/* A forwarder of a function without a device, backend or reg: `fallback` when the module
 * is missing. */
#define LOOM__FWD(module, ret, name, params, args, fallback)                                       \
    ret name params {                                                                              \
        ret(*fn_) params;                                                                          \
        LOOM__PROC(fn_, loom__module_proc(#name, module));                                         \
        return fn_ ? fn_ args : (fallback);                                                        \
    }

/* ---------------------------------------------------------------- sim (libloom-sim.so) */

LOOM__FWD("sim", int, loom_sim_profile_count, (void), (), 0)
LOOM__FWD("sim", const loom_sim_profile *, loom_sim_profile_get, (int i), (i), NULL)
LOOM__FWD("sim", loom_status, loom_sim_profile_find,
          (const char *name, const loom_sim_profile **out), (name, out), loom_last_status())
LOOM__FWD("sim", int, loom_sim_link_preset_count, (void), (), 0)
LOOM__FWD("sim", const loom_sim_link_preset_info *, loom_sim_link_preset_get, (int i), (i), NULL)
LOOM__FWD("sim", loom_status, loom_sim_link_preset_find,
          (const char *name, const loom_sim_link_preset_info **out), (name, out),
          loom_last_status())
LOOM__FWD("sim", double, loom_sim_op_time_us, (const loom_sim_profile *p, const loom_tensor *op),
          (p, op), NAN)
LOOM__FWD("sim", double, loom_sim_op_bytes, (const loom_tensor *op), (op), NAN)
LOOM__FWD("sim", double, loom_sim_op_flops, (const loom_tensor *op), (op), NAN)
LOOM__FWD("sim", double, loom_sim_allreduce_time_us,
          (const loom_sim_link *link, bool p2p, int n_devices, uint64_t bytes),
          (link, p2p, n_devices, bytes), NAN)
LOOM__FWD("sim", loom_status, loom_sim_link_preset, (const char *name, loom_sim_link *out),
          (name, out), loom_last_status())
LOOM__FWD("sim", loom_status, loom_sim_config_parse, (const char *spec, loom_sim_config *out),
          (spec, out), loom_last_status())
LOOM__FWD("sim", loom_status, loom_sim_reg_new, (const loom_sim_config *cfg, loom_reg_t *out),
          (cfg, out), loom_last_status())
LOOM__FWD("sim", loom_status, loom_sim_reg_new_from_spec, (const char *spec, loom_reg_t *out),
          (spec, out), loom_last_status())
LOOM__FWD("sim", loom_reg_t, loom_sim_reg_default, (void), (), NULL)
LOOM__FWD("sim", double, loom_sim_link_time_us, (const loom_sim_link *link, uint64_t bytes),
          (link, bytes), NAN)

void loom_sim_config_default(loom_sim_config *out, int n_devices) {
    void (*fn)(loom_sim_config *, int);
    LOOM__PROC(fn, loom__module_proc("loom_sim_config_default", "sim"));
    if (fn)
        fn(out, n_devices);
    else if (out)
        memset(out, 0, sizeof *out); /* n_devices 0: every use refuses it */
}

void loom_sim_reg_free(loom_reg_t reg) {
    void (*fn)(loom_reg_t);
    LOOM__PROC(fn, loom__reg_proc(reg, "loom_sim_reg_free"));
    if (fn) fn(reg);
}

bool loom_dev_is_sim(loom_dev_t dev) {
    bool (*fn)(loom_dev_t);
    LOOM__PROC(fn, loom__dev_proc(dev, "loom_dev_is_sim"));
    return fn && fn(dev);
}

void loom_sim_dev_stats(loom_dev_t dev, loom_sim_stats *out) {
    void (*fn)(loom_dev_t, loom_sim_stats *);
    LOOM__PROC(fn, loom__dev_proc(dev, "loom_sim_dev_stats"));
    if (fn)
        fn(dev, out);
    else if (out)
        memset(out, 0, sizeof *out);
}

void loom_sim_dev_reset_stats(loom_dev_t dev) {
    void (*fn)(loom_dev_t);
    LOOM__PROC(fn, loom__dev_proc(dev, "loom_sim_dev_reset_stats"));
    if (fn) fn(dev);
}

void loom_sim_backend_hold(loom_backend_t backend) {
    void (*fn)(loom_backend_t);
    LOOM__PROC(fn, loom__backend_proc(backend, "loom_sim_backend_hold"));
    if (fn) fn(backend);
}

/* ---------------------------------------------------------------- cuda (libloom-cuda.so) */

LOOM__FWD("cuda", loom_reg_t, loom_cuda_reg, (void), (), NULL)
LOOM__FWD("cuda", loom_status, loom_cuda_reg_new_virtual, (int per_gpu, loom_reg_t *out),
          (per_gpu, out), loom_last_status())

const char *loom_cuda_no_devices_reason(loom_reg_t reg) {
    const char *(*fn)(loom_reg_t);
    LOOM__PROC(fn, loom__reg_proc(reg, "loom_cuda_no_devices_reason"));
    if (fn) return fn(reg);
    return reg ? "not a CUDA reg"
               : "no CUDA reg: the CUDA backend module (libloom-cuda.so) is not loaded";
}

void loom_cuda_reg_free(loom_reg_t reg) {
    void (*fn)(loom_reg_t);
    LOOM__PROC(fn, loom__reg_proc(reg, "loom_cuda_reg_free"));
    if (fn) fn(reg);
}

bool loom_dev_is_cuda(loom_dev_t dev) {
    bool (*fn)(loom_dev_t);
    LOOM__PROC(fn, loom__dev_proc(dev, "loom_dev_is_cuda"));
    return fn && fn(dev);
}

void loom_cuda_backend_get_stats(loom_backend_t backend, loom_cuda_backend_stats *out) {
    void (*fn)(loom_backend_t, loom_cuda_backend_stats *);
    LOOM__PROC(fn, loom__backend_proc(backend, "loom_cuda_backend_get_stats"));
    if (fn)
        fn(backend, out);
    else if (out)
        memset(out, 0, sizeof *out);
}
