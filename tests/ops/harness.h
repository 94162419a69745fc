/*
 * The ops test harness: builds one small graph at a time in a no_alloc context, fills its
 * inputs with deterministic random data on the host, allocates it on the backend under
 * test, computes, reads the results back and compares them with the scalar reference
 * (ref.h) under an explicit tolerance.
 *
 * A case is written once with OPS_CASE and runs in every test target; what it runs on is
 * the target's `ops_target_mode` (mode_*.c): the CPU backend with 1 and 3 threads on the
 * default SIMD path, the same capped to avx2 or scalar, or a sim device checked against
 * the CPU oracle (the case body then runs twice on the same inputs).
 *
 * Inputs come from the harness's own xorshift stream, seeded from the test's
 * loom_test_rand() stream, so runs are deterministic per test and a replay config sees
 * exactly the oracle's inputs. With OPS_VERBOSE=1 in the environment every check prints
 * its largest error and how much of its tolerance that used.
 *
 *   OPS_CASE(add) {
 *       ops_begin(e, "add %d", n);
 *       loom_tensor *a = ops_src(e, LOOM_TYPE_F32, 7, 3, 1, 1, OPS_PADDED);
 *       loom_tensor *out = loom_add(ops_ctx(e), a, b);
 *       ops_compute(e, out);
 *       ref_tensor exp = ops_expect(e, LOOM_TYPE_F32, 7, 3, 1, 1);
 *       ref_tensor ra = ops_ref(e, a), rb = ops_ref(e, b);
 *       ref_binary(REF_ADD, &ra, &rb, &exp);
 *       ops_check(e, out, &exp, (ops_tol){.rtol = 1e-5});
 *       ops_end(e);
 *   }
 */
#ifndef LOOM_TESTS_OPS_HARNESS_H
#define LOOM_TESTS_OPS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/core.h"
#include "tests/ops/ref.h"
#include "tests/shim/loom_test.h"

typedef struct ops_env ops_env;

/* ---------------------------------------------------------------- modes (per target) */

typedef struct ops_backend {
    loom_backend_t backend;
    loom_buft_t buft;
    void *priv;     /* the mode's own state (a sim reg) */
    char label[64]; /* "cpu x3", "sim" */
} ops_backend;

typedef struct ops_mode {
    const char *name;
    int n_configs;
    /* true: config 0 is the CPU oracle; later configs replay its inputs and are compared
     * with its results instead of the reference */
    bool replay;
    /* Opens config i; on false a test failure has been recorded. */
    bool (*open)(int config, ops_backend *out);
    void (*close)(ops_backend *b);
} ops_mode;

/* Defined by exactly one mode_*.c in each test target. */
extern const ops_mode ops_target_mode;

/* CPU backend configs shared by the CPU modes: config 0 = 1 thread, 1 = 3 threads. */
bool ops_cpu_open(int config, ops_backend *out);
void ops_cpu_close(ops_backend *b);

/* Runs body once per config of ops_target_mode. */
void ops_run(const char *case_name, void (*body)(ops_env *e));

#define OPS_CASE(name)                                                                             \
    static void ops_case_##name(ops_env *e);                                                       \
    LOOM_TEST(ops, name) {                                                                         \
        ops_run(#name, ops_case_##name);                                                           \
    }                                                                                              \
    static void ops_case_##name(ops_env *e)

/* ---------------------------------------------------------------- one graph */

typedef enum ops_layout {
    OPS_CONTIG,     /* the leaf itself */
    OPS_PADDED,     /* a view starting one element (block) in, rows longer than ne0 */
    OPS_TRANSPOSED, /* transpose of a [ne1, ne0, ..] leaf (nb0 != type size) */
    OPS_PERM12,     /* dims 1 and 2 swapped (rows stay contiguous) */
    OPS_SCRAMBLED,  /* every dim moved: leaf [ne1, ne3, ne0, ne2] permuted (1, 3, 0, 2) */
    OPS_LAYOUT_COUNT
} ops_layout;

const char *ops_layout_name(ops_layout l);
/* Whether a type can be viewed in this layout (quantised rows cannot be transposed). */
bool ops_layout_ok(loom_type type, ops_layout l);

/* Starts a graph: a fresh no_alloc context; label names the case in failure messages. */
void ops_begin(ops_env *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
loom_ctx *ops_ctx(ops_env *e);
/* A source of shape ne in layout l, backed by a leaf filled uniformly in [-1, 1) (integer
 * types: 0). Returns the leaf (OPS_CONTIG) or a view of it. */
loom_tensor *ops_src(ops_env *e, loom_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3,
                     ops_layout l);
/* Refills the leaf under t: floats uniform in [lo, hi), integer types uniform integers in
 * [lo, hi). */
void ops_fill(ops_env *e, loom_tensor *t, double lo, double hi);
/* Sets one element of t (through t's strides) on the host: F32/F16/BF16/I32/I64. */
void ops_set(ops_env *e, loom_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v);
/* Host view of t's input data (t a leaf or a view of one). */
ref_tensor ops_ref(ops_env *e, loom_tensor *t);
/* Deterministic random numbers for this run (replayed identically in replay modes). */
double ops_randf(ops_env *e, double lo, double hi);
int64_t ops_randi(ops_env *e, int64_t lo, int64_t hi); /* [lo, hi) */

/* Marks another tensor to read after compute (out of ops_compute is always one). */
void ops_output(ops_env *e, loom_tensor *t);
/* Builds the graph of out (and any ops_output tensors), allocates every tensor of the
 * context on the mode's buffer type, uploads the inputs, computes and keeps the results.
 * A NULL out (a builder refused its inputs) or any failure records a test failure with
 * loom_last_error(); later checks of this graph are then skipped. */
bool ops_compute(ops_env *e, loom_tensor *out);

/* A zeroed contiguous host tensor for expected values, freed by ops_end. */
ref_tensor ops_expect(ops_env *e, loom_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                      int64_t ne3);
/* Scratch memory (zeroed) freed by ops_end. */
void *ops_scratch(ops_env *e, size_t size);

/* Element k (row-major over exp's shape) passes when |got - exp| <= atol + rtol * |exp| +
 * elem[k]. Integer results must match exactly whatever the tolerance. */
typedef struct ops_tol {
    double atol;
    double rtol;
    const double *elem; /* optional, one per element of exp */
} ops_tol;

/* Compares out (read back through its strides) with exp: same shape, out's type equal to
 * exp's. In a replay config the comparison is with the oracle's result instead. */
void ops_check(ops_env *e, loom_tensor *out, const ref_tensor *exp, ops_tol tol);
/* The same, for an out whose type differs from exp's (F16 results compared as F32). */
void ops_check_as(ops_env *e, loom_tensor *out, loom_type out_type, const ref_tensor *exp,
                  ops_tol tol);
/* Frees the graph, its buffer and every host allocation of this graph. */
void ops_end(ops_env *e);

/* The label of the backend config running ("cpu x3", "sim"). */
const char *ops_config_label(ops_env *e);

#endif /* LOOM_TESTS_OPS_HARNESS_H */
