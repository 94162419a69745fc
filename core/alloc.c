/*
 * alloc.c: the replaceable host allocator (SQLite style). Every loom host allocation,
 * aligned ones included, goes through the hooks installed here, so a test allocator that
 * fails on the Nth call reaches every allocation path.
 */
#include <stdlib.h>

#include "core/core-impl.h"

static void *loom__libc_malloc(size_t size, void *ud) {
    (void)ud;
    return malloc(size);
}

static void *loom__libc_realloc(void *p, size_t size, void *ud) {
    (void)ud;
    return realloc(p, size);
}

static void loom__libc_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

static const loom_allocator loom__libc_allocator = {
    .malloc_fn = loom__libc_malloc,
    .realloc_fn = loom__libc_realloc,
    .free_fn = loom__libc_free,
    .user_data = NULL,
};

static loom_allocator loom__alloc = {
    .malloc_fn = loom__libc_malloc,
    .realloc_fn = loom__libc_realloc,
    .free_fn = loom__libc_free,
    .user_data = NULL,
};

void loom_allocator_set(const loom_allocator *a) {
    if (!a) {
        loom__alloc = loom__libc_allocator;
        return;
    }
    LOOM_ASSERT(a->malloc_fn && a->realloc_fn && a->free_fn);
    loom__alloc = *a;
}

/* Size 0 is served as 1 byte so that success always means a unique non-NULL pointer. */
void *loom_malloc(size_t size) {
    void *p = loom__alloc.malloc_fn(size ? size : 1, loom__alloc.user_data);
    if (!p) loom_error(LOOM_ERR_NOMEM, "out of memory allocating %zu bytes", size);
    return p;
}

void *loom_calloc(size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        loom_error(LOOM_ERR_NOMEM, "calloc: %zu x %zu bytes overflows size_t", n, size);
        return NULL;
    }
    void *p = loom_malloc(total);
    if (p) memset(p, 0, total);
    return p;
}

void *loom_realloc(void *p, size_t size) {
    if (!p) return loom_malloc(size);
    void *q = loom__alloc.realloc_fn(p, size ? size : 1, loom__alloc.user_data);
    if (!q) loom_error(LOOM_ERR_NOMEM, "out of memory reallocating to %zu bytes", size);
    return q;
}

void loom_free(void *p) {
    if (p) loom__alloc.free_fn(p, loom__alloc.user_data);
}

char *loom_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = loom_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Aligned blocks: one loom_malloc with room to align, the raw pointer stored just below
 * the aligned address. */
void *loom_aligned_alloc(size_t alignment, size_t size) {
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    if ((alignment & (alignment - 1)) != 0) {
        loom_error(LOOM_ERR_INVALID_ARG, "aligned_alloc: alignment %zu is not a power of two",
                   alignment);
        return NULL;
    }
    size_t total;
    if (__builtin_add_overflow(size, alignment - 1 + sizeof(void *), &total)) {
        loom_error(LOOM_ERR_NOMEM, "aligned_alloc: %zu bytes overflows size_t", size);
        return NULL;
    }
    char *raw = loom_malloc(total);
    if (!raw) {
        loom_error(LOOM_ERR_NOMEM, "out of memory allocating %zu bytes (aligned to %zu)", size,
                   alignment);
        return NULL;
    }
    uintptr_t a = ((uintptr_t)(raw + sizeof(void *)) + alignment - 1) & ~(uintptr_t)(alignment - 1);
    ((void **)a)[-1] = raw;
    return (void *)a;
}

void loom_aligned_free(void *p) {
    if (p) loom_free(((void **)p)[-1]);
}
