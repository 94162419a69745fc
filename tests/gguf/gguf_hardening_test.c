#define _GNU_SOURCE
/*
 * GGUF reader hardening (issue 9): look-ups over a file's names are hashed (a file with
 * 300,000 metadata keys opens and answers every look-up at once; with the old linear scans
 * this took minutes), a FIFO is refused before it is opened (the old order hung in open()),
 * and a string with a NUL inside is refused by the getter that would hand it out cut.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/gguf.h"
#include "tests/shim/loom_test.h"

static void put(uint8_t **p, const void *v, size_t n) {
    memcpy(*p, v, n);
    *p += n;
}

/* A GGUF image with n_kv uint32 keys "key.%07d" = i (the last one repeating key 0 when
 * dup) and n_t zero-sized tensors "t%07d". */
static uint8_t *many_names(uint64_t n_kv, uint64_t n_t, bool dup, size_t *size) {
    size_t cap = 32 + n_kv * 32 + n_t * 48 + 64;
    uint8_t *buf = calloc(1, cap), *p = buf;
    uint32_t v3 = 3;
    put(&p, "GGUF", 4);
    put(&p, &v3, 4);
    put(&p, &n_t, 8);
    put(&p, &n_kv, 8);
    char name[32];
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t len = (uint64_t)snprintf(name, sizeof name, "key.%07llu",
                                          (unsigned long long)(dup && i == n_kv - 1 ? 0 : i));
        uint32_t type = LOOM_GGUF_UINT32, val = (uint32_t)i;
        put(&p, &len, 8);
        put(&p, name, len);
        put(&p, &type, 4);
        put(&p, &val, 4);
    }
    for (uint64_t i = 0; i < n_t; i++) {
        uint64_t len = (uint64_t)snprintf(name, sizeof name, "t%07llu", (unsigned long long)i);
        uint32_t nd = 1, type = LOOM_TYPE_F32;
        uint64_t ne = 0, off = 0;
        put(&p, &len, 8);
        put(&p, name, len);
        put(&p, &nd, 4);
        put(&p, &ne, 8);
        put(&p, &type, 4);
        put(&p, &off, 8);
    }
    *size = (size_t)(p - buf);
    return buf;
}

LOOM_TEST(gguf_hardening, many_keys_and_tensors_hashed) {
    const uint64_t n_kv = 300000, n_t = 100000;
    size_t size;
    uint8_t *img = many_names(n_kv, n_t, false, &size);
    LOOM_REQUIRE(img != NULL);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(img, size, &g) == LOOM_OK);
    LOOM_CHECK(loom_gguf_kv_count(g) == (int64_t)n_kv);
    char name[32];
    int64_t wrong = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        snprintf(name, sizeof name, "key.%07llu", (unsigned long long)i);
        int64_t v = -1;
        if (loom_gguf_find_kv(g, name) != (int64_t)i || loom_gguf_get_int(g, name, &v) ||
            v != (int64_t)i)
            wrong++;
    }
    for (uint64_t i = 0; i < n_t; i++) {
        snprintf(name, sizeof name, "t%07llu", (unsigned long long)i);
        if (loom_gguf_find_tensor(g, name) != (int64_t)i) wrong++;
    }
    LOOM_CHECK_EQ_INT(wrong, 0);
    LOOM_CHECK(loom_gguf_find_kv(g, "key.9999999") == -1);
    LOOM_CHECK(loom_gguf_find_kv(g, "") == -1);
    LOOM_CHECK(loom_gguf_find_tensor(g, "t9999999") == -1);
    loom_gguf_free(g);
    free(img);

    /* a duplicate as the very last key is still found */
    img = many_names(n_kv, 0, true, &size);
    LOOM_CHECK(loom_gguf_open_memory(img, size, &g) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "duplicate metadata key 'key.0000000'");
    free(img);
}

static const char *tmpdir(void) {
    const char *d = getenv("TEST_TMPDIR");
    return d && *d ? d : "/tmp";
}

LOOM_TEST(gguf_hardening, fifo_and_directory_refused_without_blocking) {
    char path[4096];
    snprintf(path, sizeof path, "%s/loom_fifo_%d.gguf", tmpdir(), (int)getpid());
    unlink(path);
    LOOM_REQUIRE(mkfifo(path, 0600) == 0);
    loom_gguf *g = (loom_gguf *)1;
    /* no writer ever opens the FIFO: an open() before the check would block forever */
    LOOM_CHECK(loom_gguf_open(path, &g) == LOOM_ERR_IO);
    LOOM_CHECK(g == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "is not a regular file");
    unlink(path);
    LOOM_CHECK(loom_gguf_open(tmpdir(), &g) == LOOM_ERR_IO);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "is not a regular file");
}

LOOM_TEST(gguf_hardening, string_with_nul_refused_by_get_str) {
    uint8_t buf[128], *p = buf;
    uint32_t v3 = 3, type = LOOM_GGUF_STRING;
    uint64_t n_t = 0, n_kv = 2, klen = 20, vlen = 9;
    put(&p, "GGUF", 4);
    put(&p, &v3, 4);
    put(&p, &n_t, 8);
    put(&p, &n_kv, 8);
    put(&p, &klen, 8);
    put(&p, "general.architecture", 20);
    put(&p, &type, 4);
    put(&p, &vlen, 8);
    put(&p, "llama\0bad", 9);
    klen = 6;
    vlen = 5;
    put(&p, &klen, 8);
    put(&p, "t.good", 6);
    put(&p, &type, 4);
    put(&p, &vlen, 8);
    put(&p, "hello", 5);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(buf, (size_t)(p - buf), &g) == LOOM_OK);
    const char *s = NULL;
    LOOM_CHECK(loom_gguf_get_str(g, "general.architecture", &s) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'general.architecture' contains a NUL byte at 5");
    LOOM_CHECK(loom_gguf_get_str(g, "t.good", &s) == LOOM_OK);
    LOOM_CHECK(s && strcmp(s, "hello") == 0);
    loom_gguf_free(g);
}
