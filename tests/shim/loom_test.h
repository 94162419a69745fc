/*
 * loom's C test shim. Tests are plain C functions registered with LOOM_TEST; the GoogleTest
 * bridge (shim.cc) turns each into a gtest case, so `bazel test` reports them one by one.
 *
 *   LOOM_TEST(core, add_broadcasts) {
 *       LOOM_CHECK(t != NULL);            // failure recorded, test goes on
 *       LOOM_REQUIRE(ctx != NULL);        // failure recorded, test returns
 *       LOOM_CHECK_NEAR(x, 1.0, 1e-6);
 *       LOOM_CHECK_EQ_INT(n, 3);
 *       LOOM_CHECK_STR_CONTAINS(loom_last_error(), "shape");
 *       if (!have_gpu) LOOM_SKIP("no CUDA devices");
 *   }
 */
#ifndef LOOM_TEST_H
#define LOOM_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*loom_test_fn)(void);

void loom_test_register(const char *suite, const char *name, loom_test_fn fn, const char *file,
                        int line);
/* Records a failure; returns false so macros can chain. */
bool loom_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Marks the running test skipped with a reason (the test function must then return). */
void loom_test_skip(const char *file, int line, const char *reason);
/* Failures recorded so far in the running test. */
int loom_test_failures(void);
/* A deterministic per-test random stream (seeded from the test's name). */
uint32_t loom_test_rand(void);
float loom_test_randf(float lo, float hi);

/* The repository root of the source tree the test was built from (resolved through the
 * runfiles symlink of //:WORKSPACE, which the test must list in `data`), or NULL. */
const char *loom_test_source_root(void);
/* A directory of shared test models: $LOOM_MODELS_DIR, else <source root>/../shared/models
 * when it exists, else NULL (tests that need it skip). */
const char *loom_test_models_dir(void);

#define LOOM_TEST(suite, name)                                                                     \
    static void loom_test_##suite##_##name(void);                                                  \
    __attribute__((constructor)) static void loom_test_reg_##suite##_##name(void) {                \
        loom_test_register(#suite, #name, loom_test_##suite##_##name, __FILE__, __LINE__);         \
    }                                                                                              \
    static void loom_test_##suite##_##name(void)

#define LOOM_CHECK(cond)                                                                           \
    ((cond) ? true : loom_test_fail(__FILE__, __LINE__, "check failed: %s", #cond))
#define LOOM_REQUIRE(cond)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            loom_test_fail(__FILE__, __LINE__, "requirement failed: %s", #cond);                   \
            return;                                                                                \
        }                                                                                          \
    } while (0)
#define LOOM_CHECK_MSG(cond, ...)                                                                  \
    ((cond) ? true : loom_test_fail(__FILE__, __LINE__, __VA_ARGS__))
#define LOOM_CHECK_EQ_INT(a, b)                                                                    \
    do {                                                                                           \
        long long loom_a_ = (long long)(a), loom_b_ = (long long)(b);                              \
        if (loom_a_ != loom_b_)                                                                    \
            loom_test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, loom_a_,          \
                           loom_b_);                                                               \
    } while (0)
#define LOOM_CHECK_NEAR(a, b, tol)                                                                 \
    do {                                                                                           \
        double loom_a_ = (double)(a), loom_b_ = (double)(b), loom_t_ = (double)(tol);              \
        if (!(loom_a_ - loom_b_ <= loom_t_ && loom_b_ - loom_a_ <= loom_t_))                       \
            loom_test_fail(__FILE__, __LINE__, "|%s - %s| <= %g: %.9g vs %.9g", #a, #b, loom_t_,   \
                           loom_a_, loom_b_);                                                      \
    } while (0)
#define LOOM_CHECK_STR_CONTAINS(hay, needle)                                                       \
    do {                                                                                           \
        const char *loom_h_ = (hay), *loom_n_ = (needle);                                          \
        if (!loom_h_ || !strstr(loom_h_, loom_n_))                                                 \
            loom_test_fail(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"",                  \
                           loom_h_ ? loom_h_ : "(null)", loom_n_);                                 \
    } while (0)
#define LOOM_SKIP(reason)                                                                          \
    do {                                                                                           \
        loom_test_skip(__FILE__, __LINE__, reason);                                                \
        return;                                                                                    \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* LOOM_TEST_H */
