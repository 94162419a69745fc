/*
 * loom's version: the macros are what a program was compiled against, loom_version*()
 * what it runs against (the library loaded). The shared library's SONAME is
 * libloom.so.<LOOM_VERSION_MAJOR>; a program built against one major version runs with any
 * library of that major version whose minor version is at least the one it was built with.
 */
#ifndef LOOM_VERSION_H
#define LOOM_VERSION_H

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0

#define LOOM__VERSION_STR2(x) #x
#define LOOM__VERSION_STR(x) LOOM__VERSION_STR2(x)
/* "MAJOR.MINOR.PATCH" */
#define LOOM_VERSION_STRING                                                                        \
    LOOM__VERSION_STR(LOOM_VERSION_MAJOR)                                                          \
    "." LOOM__VERSION_STR(LOOM_VERSION_MINOR) "." LOOM__VERSION_STR(LOOM_VERSION_PATCH)
/* MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons. */
#define LOOM_VERSION_NUMBER                                                                        \
    (LOOM_VERSION_MAJOR * 10000 + LOOM_VERSION_MINOR * 100 + LOOM_VERSION_PATCH)

#ifndef LOOM_API /* also defined by loom/core.h */
#if defined(__GNUC__)
#define LOOM_API __attribute__((visibility("default")))
#else
#define LOOM_API
#endif
#endif

/* The running library's LOOM_VERSION_STRING (static storage). */
LOOM_API const char *loom_version(void);
/* The running library's LOOM_VERSION_NUMBER. */
LOOM_API int loom_version_number(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_VERSION_H */
