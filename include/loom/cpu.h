/*
 * The CPU backend: the reference implementation and test oracle. Host memory, every op,
 * multi-threaded, SIMD with runtime dispatch (AVX-512, AVX2+FMA, portable C).
 */
#ifndef LOOM_CPU_H
#define LOOM_CPU_H

#include "loom/backend.h"
#include "loom/topo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU reg (one device, "CPU"); static, never freed. */
LOOM_API loom_reg_t loom_cpu_reg(void);
LOOM_API loom_dev_t loom_cpu_dev(void);
/* Plain host memory (alignment 64, is_host). */
LOOM_API loom_buft_t loom_cpu_buffer_type(void);
/* A buffer over caller memory (not freed by loom_buffer_free). */
LOOM_API loom_buffer_t loom_cpu_buffer_from_ptr(void *ptr, size_t size);
/* A CPU backend with n_threads (<= 0: all cores). */
LOOM_API loom_backend_t loom_cpu_backend_new(int n_threads);
LOOM_API bool loom_backend_is_cpu(loom_backend_t backend);
LOOM_API void loom_cpu_backend_set_n_threads(loom_backend_t backend, int n_threads);

/* How CPU backends created from now on pin their worker threads (loom/topo.h policies;
 * LOOM_AFFINITY_DEFAULT: loom_topo_affinity_default of loom_topo_get()). The caller's own
 * thread (thread 0 of the CPU device) is never moved; NUMA devices pin all their threads
 * and default to numa. Binding that cannot be done is logged once and skipped. */
LOOM_API void loom_cpu_set_affinity(loom_affinity policy);
/* The policy in force (the default resolved), and why (may be NULL). */
LOOM_API loom_affinity loom_cpu_affinity(char *why, size_t why_size);
LOOM_API bool loom_cpu_affinity_is_default(void);
/* reg "NUMA": one CPU-kind device per NUMA node of loom_topo_get() (NUMA0..), each with
 * its own buffer type allocating on its node. Static; NULL when there is no topology. */
LOOM_API loom_reg_t loom_cpu_numa_reg(void);

/* Which SIMD path the kernels dispatched to on this machine: "avx512", "avx2", "scalar".
 * LOOM_CPU_SIMD=scalar|avx2|avx512 caps it (tests compare paths). */
LOOM_API const char *loom_cpu_simd_name(void);

/* Computes a graph of host-resident tensors directly (no backend object), with a caller's
 * pool (NULL: single-threaded). Used by sim devices and tests. */
LOOM_API loom_status loom_cpu_graph_compute(loom_graph *g, loom_threadpool *tp);
/* Whether the CPU kernels implement this op with these types. */
LOOM_API bool loom_cpu_supports_op(const loom_tensor *op);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_CPU_H */
