#define _GNU_SOURCE
/*
 * GGUF reader and writer: round trips of every metadata type (versions 2 and 3, custom
 * alignment), the shared real model files, and hostile inputs — every one rejected with a
 * message naming the field, never a crash (the asan/ubsan configs check that).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/gguf.h"
#include "tests/shim/loom_test.h"

/* A small file with one of every metadata type and three tensors. */
static loom_gguf_writer *sample_writer(void) {
    loom_gguf_writer *w = loom_gguf_writer_new();
    if (!w) return NULL;
    loom_gguf_set_str(w, "general.architecture", "llama");
    loom_gguf_set_u8(w, "t.u8", 200);
    loom_gguf_set_i8(w, "t.i8", -100);
    loom_gguf_set_u16(w, "t.u16", 60000);
    loom_gguf_set_i16(w, "t.i16", -30000);
    loom_gguf_set_u32(w, "t.u32", 4000000000u);
    loom_gguf_set_i32(w, "t.i32", -2000000000);
    loom_gguf_set_u64(w, "t.u64", 18000000000000000000ull);
    loom_gguf_set_i64(w, "t.i64", -9000000000000000000ll);
    loom_gguf_set_f32(w, "t.f32", 1.5f);
    loom_gguf_set_f64(w, "t.f64", -2.25);
    loom_gguf_set_bool(w, "t.bool", true);
    int32_t arr[5] = {1, -2, 3, -4, 5};
    loom_gguf_set_arr(w, "t.arr_i32", LOOM_GGUF_INT32, arr, 5);
    const char *strs[3] = {"<s>", "hello", ""};
    loom_gguf_set_arr_str(w, "t.arr_str", strs, 3);
    float a[8 * 3];
    for (int i = 0; i < 24; i++) a[i] = (float)i * 0.5f;
    int64_t ne_a[2] = {8, 3};
    loom_gguf_add_tensor(w, "a", LOOM_TYPE_F32, 2, ne_a, a);
    uint16_t h[32];
    for (int i = 0; i < 32; i++) h[i] = loom_fp32_to_fp16((float)i);
    int64_t ne_h[1] = {32};
    loom_gguf_add_tensor(w, "h", LOOM_TYPE_F16, 1, ne_h, h);
    float q[64];
    for (int i = 0; i < 64; i++) q[i] = (float)(i - 32) / 8.0f;
    loom_block_q8_0 qb[2];
    loom_type_traits_get(LOOM_TYPE_Q8_0)->from_float(q, qb, 64);
    int64_t ne_q[2] = {32, 2};
    loom_gguf_add_tensor(w, "q", LOOM_TYPE_Q8_0, 2, ne_q, qb);
    return w;
}

static void check_sample(loom_gguf *g) {
    int64_t iv;
    uint64_t uv;
    double fv;
    bool bv;
    const char *sv;
    LOOM_CHECK(loom_gguf_get_str(g, "general.architecture", &sv) == LOOM_OK && strcmp(sv, "llama") == 0);
    LOOM_CHECK(loom_gguf_get_int(g, "t.u8", &iv) == LOOM_OK && iv == 200);
    LOOM_CHECK(loom_gguf_get_int(g, "t.i8", &iv) == LOOM_OK && iv == -100);
    LOOM_CHECK(loom_gguf_get_int(g, "t.u16", &iv) == LOOM_OK && iv == 60000);
    LOOM_CHECK(loom_gguf_get_int(g, "t.i16", &iv) == LOOM_OK && iv == -30000);
    LOOM_CHECK(loom_gguf_get_uint(g, "t.u32", &uv) == LOOM_OK && uv == 4000000000u);
    LOOM_CHECK(loom_gguf_get_int(g, "t.i32", &iv) == LOOM_OK && iv == -2000000000);
    LOOM_CHECK(loom_gguf_get_uint(g, "t.u64", &uv) == LOOM_OK && uv == 18000000000000000000ull);
    LOOM_CHECK(loom_gguf_get_int(g, "t.i64", &iv) == LOOM_OK && iv == -9000000000000000000ll);
    LOOM_CHECK(loom_gguf_get_float(g, "t.f32", &fv) == LOOM_OK && fv == 1.5);
    LOOM_CHECK(loom_gguf_get_float(g, "t.f64", &fv) == LOOM_OK && fv == -2.25);
    LOOM_CHECK(loom_gguf_get_bool(g, "t.bool", &bv) == LOOM_OK && bv);
    /* conversions that do not fit are refused with the key named */
    LOOM_CHECK(loom_gguf_get_int(g, "t.u64", &iv) == LOOM_ERR_TYPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "t.u64");
    LOOM_CHECK(loom_gguf_get_uint(g, "t.i8", &uv) == LOOM_ERR_TYPE);
    LOOM_CHECK(loom_gguf_get_str(g, "t.u8", &sv) == LOOM_ERR_TYPE);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "expected string");
    LOOM_CHECK(loom_gguf_get_int(g, "no.such.key", &iv) == LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "no.such.key");

    int64_t ai = loom_gguf_find_kv(g, "t.arr_i32");
    LOOM_REQUIRE(ai >= 0);
    LOOM_CHECK(loom_gguf_kv_type(g, ai) == LOOM_GGUF_ARRAY);
    LOOM_CHECK(loom_gguf_kv_arr_type(g, ai) == LOOM_GGUF_INT32);
    LOOM_CHECK_EQ_INT(loom_gguf_kv_arr_n(g, ai), 5);
    int32_t arr[5];
    memcpy(arr, loom_gguf_kv_arr_data(g, ai), sizeof arr);
    LOOM_CHECK(arr[0] == 1 && arr[1] == -2 && arr[4] == 5);
    int64_t si = loom_gguf_find_kv(g, "t.arr_str");
    LOOM_REQUIRE(si >= 0);
    LOOM_CHECK_EQ_INT(loom_gguf_kv_arr_n(g, si), 3);
    uint64_t len;
    const char *s1 = loom_gguf_kv_arr_str(g, si, 1, &len);
    LOOM_CHECK(len == 5 && memcmp(s1, "hello", 5) == 0);
    loom_gguf_kv_arr_str(g, si, 2, &len);
    LOOM_CHECK_EQ_INT(len, 0);
    LOOM_CHECK(loom_gguf_kv_arr_str(g, si, 3, &len) == NULL);

    LOOM_REQUIRE(loom_gguf_tensor_count(g) == 3);
    int64_t ta = loom_gguf_find_tensor(g, "a");
    LOOM_REQUIRE(ta >= 0);
    int64_t ne[4];
    loom_gguf_tensor_ne(g, ta, ne);
    LOOM_CHECK(ne[0] == 8 && ne[1] == 3 && ne[2] == 1 && ne[3] == 1);
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_n_dims(g, ta), 2);
    LOOM_CHECK(loom_gguf_tensor_type(g, ta) == LOOM_TYPE_F32);
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_size(g, ta), 24 * 4);
    const float *ad = loom_gguf_tensor_data(g, ta);
    LOOM_CHECK(ad[0] == 0.0f && ad[23] == 11.5f);
    LOOM_CHECK_EQ_INT(((uintptr_t)loom_gguf_tensor_offset(g, ta)) % loom_gguf_alignment(g), 0);
    int64_t th = loom_gguf_find_tensor(g, "h");
    const uint16_t *hd = loom_gguf_tensor_data(g, th);
    LOOM_CHECK(loom_fp16_to_fp32(hd[31]) == 31.0f);
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_offset(g, th) % loom_gguf_alignment(g), 0);
    int64_t tq = loom_gguf_find_tensor(g, "q");
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_size(g, tq), 2 * sizeof(loom_block_q8_0));
    float back[64];
    loom_type_traits_get(LOOM_TYPE_Q8_0)->to_float(loom_gguf_tensor_data(g, tq), back, 64);
    LOOM_CHECK_NEAR(back[0], -4.0, 0.02);
    LOOM_CHECK_NEAR(back[63], 31.0 / 8.0, 0.02);
    LOOM_CHECK(loom_gguf_find_tensor(g, "zzz") == -1);
}

static void round_trip(uint32_t version, size_t alignment) {
    loom_gguf_writer *w = sample_writer();
    LOOM_REQUIRE(w != NULL);
    loom_gguf_writer_set_version(w, version);
    loom_gguf_writer_set_alignment(w, alignment);
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    loom_gguf *g = NULL;
    loom_status st = loom_gguf_open_memory(data, size, &g);
    LOOM_CHECK_MSG(st == LOOM_OK, "open: %s", loom_last_error());
    if (g) {
        LOOM_CHECK_EQ_INT(loom_gguf_version(g), version);
        LOOM_CHECK_EQ_INT(loom_gguf_alignment(g), alignment);
        LOOM_CHECK_EQ_INT(loom_gguf_data_offset(g) % alignment, 0);
        check_sample(g);
    }
    loom_gguf_free(g);
    loom_free(data);
    loom_gguf_writer_free(w);
}

LOOM_TEST(gguf, round_trip_v3) { round_trip(3, 32); }
LOOM_TEST(gguf, round_trip_v2) { round_trip(2, 32); }
LOOM_TEST(gguf, round_trip_alignment_64) { round_trip(3, 64); }

LOOM_TEST(gguf, file_round_trip_and_replace_key) {
    loom_gguf_writer *w = sample_writer();
    LOOM_REQUIRE(w != NULL);
    LOOM_CHECK(loom_gguf_set_str(w, "general.architecture", "qwen2") == LOOM_OK); /* replace */
    LOOM_CHECK(loom_gguf_add_tensor(w, "a", LOOM_TYPE_F32, 1, (int64_t[]){4}, NULL) != LOOM_OK);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "duplicate tensor 'a'");
    char path[] = "/tmp/loom_gguf_XXXXXX";
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    LOOM_REQUIRE(loom_gguf_write_file(w, path) == LOOM_OK);
    loom_gguf *g = NULL;
    LOOM_CHECK(loom_gguf_open(path, &g) == LOOM_OK);
    if (g) {
        const char *arch;
        LOOM_CHECK(loom_gguf_get_str(g, "general.architecture", &arch) == LOOM_OK && strcmp(arch, "qwen2") == 0);
        LOOM_CHECK_EQ_INT(loom_gguf_find_kv(g, "general.architecture") >= 0, 1);
        LOOM_CHECK_EQ_INT(loom_gguf_file_size(g) > 0, 1);
    }
    loom_gguf_free(g);
    unlink(path);
    loom_gguf_writer_free(w);
}

LOOM_TEST(gguf, missing_file_is_named) {
    loom_gguf *g = (loom_gguf *)1;
    LOOM_CHECK(loom_gguf_open("/nonexistent/model.gguf", &g) == LOOM_ERR_IO);
    LOOM_CHECK(g == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "/nonexistent/model.gguf");
}

LOOM_TEST(gguf, empty_file_with_no_tensors) {
    loom_gguf_writer *w = loom_gguf_writer_new();
    LOOM_REQUIRE(w != NULL);
    void *data;
    size_t size;
    LOOM_REQUIRE(loom_gguf_write_memory(w, &data, &size) == LOOM_OK);
    LOOM_CHECK_EQ_INT(size, 24); /* magic, version, two counts */
    loom_gguf *g = NULL;
    LOOM_CHECK(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    if (g) {
        LOOM_CHECK_EQ_INT(loom_gguf_tensor_count(g), 0);
        LOOM_CHECK_EQ_INT(loom_gguf_kv_count(g), 0);
        /* data offset (32) lies past EOF (24): legal when there are no tensor bytes */
        LOOM_CHECK(loom_gguf_data_offset(g) > size);
    }
    loom_gguf_free(g);
    loom_free(data);
    loom_gguf_writer_free(w);
}

/* ---------------------------------------------------------------- hostile inputs */

static void *sample_bytes(size_t *size) {
    loom_gguf_writer *w = sample_writer();
    void *data = NULL;
    if (w) loom_gguf_write_memory(w, &data, size);
    loom_gguf_writer_free(w);
    return data;
}

/* Opens `data` and expects a FORMAT error whose message contains `needle`. */
static void expect_reject(const void *data, size_t size, const char *needle) {
    loom_gguf *g = (loom_gguf *)1;
    loom_status st = loom_gguf_open_memory(data, size, &g);
    LOOM_CHECK_MSG(st == LOOM_ERR_FORMAT, "expected a format error containing '%s', got %s (%s)",
                   needle, loom_status_str(st), loom_last_error());
    LOOM_CHECK(g == NULL);
    if (st != LOOM_OK) LOOM_CHECK_STR_CONTAINS(loom_last_error(), needle);
    if (st == LOOM_OK) loom_gguf_free(g);
}

LOOM_TEST(gguf, truncation_anywhere_is_rejected) {
    size_t size;
    uint8_t *data = sample_bytes(&size);
    LOOM_REQUIRE(data != NULL);
    /* every strict prefix of the header and of the data must be rejected */
    for (size_t n = 0; n < size; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, data, n);
        loom_gguf *g = (loom_gguf *)1;
        loom_status st = loom_gguf_open_memory(copy, n, &g);
        if (st != LOOM_ERR_FORMAT || g != NULL) {
            loom_test_fail(__FILE__, __LINE__, "prefix of %zu/%zu bytes: %s", n, size,
                           loom_status_str(st));
            if (st == LOOM_OK) loom_gguf_free(g);
            free(copy);
            break;
        }
        free(copy);
    }
    loom_free(data);
}

LOOM_TEST(gguf, bad_magic_and_version) {
    size_t size;
    uint8_t *data = sample_bytes(&size);
    LOOM_REQUIRE(data != NULL);
    data[0] = 'X';
    expect_reject(data, size, "bad magic at offset 0");
    data[0] = 'G';
    uint32_t v = 1;
    memcpy(data + 4, &v, 4);
    expect_reject(data, size, "unsupported version 1");
    v = 99;
    memcpy(data + 4, &v, 4);
    expect_reject(data, size, "unsupported version 99");
    loom_free(data);
}

LOOM_TEST(gguf, counts_that_overflow) {
    size_t size;
    uint8_t *data = sample_bytes(&size);
    LOOM_REQUIRE(data != NULL);
    uint64_t huge = 0xffffffffffffffffull;
    uint8_t *c = malloc(size);
    memcpy(c, data, size);
    memcpy(c + 8, &huge, 8);
    expect_reject(c, size, "tensor count");
    memcpy(c, data, size);
    memcpy(c + 16, &huge, 8);
    expect_reject(c, size, "metadata count");
    /* first key's string length: at offset 24 */
    memcpy(c, data, size);
    memcpy(c + 24, &huge, 8);
    expect_reject(c, size, "string length");
    free(c);
    loom_free(data);
}

/* Builds a minimal file by hand: header + a raw tail. */
static size_t build(uint8_t *buf, uint64_t n_tensors, uint64_t n_kv, const void *tail,
                    size_t tail_size) {
    memcpy(buf, "GGUF", 4);
    uint32_t v = 3;
    memcpy(buf + 4, &v, 4);
    memcpy(buf + 8, &n_tensors, 8);
    memcpy(buf + 16, &n_kv, 8);
    memcpy(buf + 24, tail, tail_size);
    return 24 + tail_size;
}

typedef struct {
    uint8_t b[512];
    size_t n;
} bytes;

static void b_u32(bytes *b, uint32_t v) { memcpy(b->b + b->n, &v, 4); b->n += 4; }
static void b_u64(bytes *b, uint64_t v) { memcpy(b->b + b->n, &v, 8); b->n += 8; }
static void b_str(bytes *b, const char *s) {
    b_u64(b, strlen(s));
    memcpy(b->b + b->n, s, strlen(s));
    b->n += strlen(s);
}

static void tensor_info(bytes *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                        uint32_t type, uint64_t offset) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) b_u64(b, ne[d]);
    b_u32(b, type);
    b_u64(b, offset);
}

LOOM_TEST(gguf, hostile_metadata) {
    uint8_t buf[1024];
    bytes t = {.n = 0};
    b_str(&t, "k");
    b_u32(&t, 77); /* unknown type */
    expect_reject(buf, build(buf, 0, 1, t.b, t.n), "unknown value type 77");

    t.n = 0;
    b_str(&t, "k");
    b_u32(&t, LOOM_GGUF_ARRAY);
    b_u32(&t, LOOM_GGUF_ARRAY); /* nested */
    b_u64(&t, 1);
    expect_reject(buf, build(buf, 0, 1, t.b, t.n), "nested array");

    t.n = 0;
    b_str(&t, "k");
    b_u32(&t, LOOM_GGUF_ARRAY);
    b_u32(&t, LOOM_GGUF_UINT64);
    b_u64(&t, 0x2000000000000000ull); /* elements * 8 overflows */
    expect_reject(buf, build(buf, 0, 1, t.b, t.n), "array 'k'");

    t.n = 0;
    b_str(&t, "k");
    b_u32(&t, LOOM_GGUF_ARRAY);
    b_u32(&t, LOOM_GGUF_STRING);
    b_u64(&t, 1000000); /* far more strings than bytes */
    expect_reject(buf, build(buf, 0, 1, t.b, t.n), "claims 1000000 strings");

    t.n = 0;
    b_str(&t, "k");
    b_u32(&t, LOOM_GGUF_UINT8);
    t.b[t.n++] = 1;
    b_str(&t, "k");
    b_u32(&t, LOOM_GGUF_UINT8);
    t.b[t.n++] = 2;
    expect_reject(buf, build(buf, 0, 2, t.b, t.n), "duplicate metadata key 'k'");

    t.n = 0;
    b_str(&t, "general.alignment");
    b_u32(&t, LOOM_GGUF_UINT32);
    b_u32(&t, 48);
    expect_reject(buf, build(buf, 0, 1, t.b, t.n), "not a power of two");

    t.n = 0;
    b_str(&t, "general.alignment");
    b_u32(&t, LOOM_GGUF_STRING);
    b_str(&t, "32");
    expect_reject(buf, build(buf, 0, 1, t.b, t.n), "general.alignment has type string");
}

LOOM_TEST(gguf, hostile_tensor_infos) {
    uint8_t buf[1024];
    bytes t = {.n = 0};
    uint64_t ne2[2] = {4, 4};
    tensor_info(&t, "w", 2, ne2, 55, 0);
    expect_reject(buf, build(buf, 1, 0, t.b, t.n), "unknown type 55");

    t.n = 0;
    uint64_t ne7[7] = {1, 1, 1, 1, 1, 1, 1};
    tensor_info(&t, "w", 7, ne7, 0, 0);
    expect_reject(buf, build(buf, 1, 0, t.b, t.n), "has 7 dimensions");

    t.n = 0;
    uint64_t big[3] = {1ull << 40, 1ull << 40, 1ull << 40};
    tensor_info(&t, "w", 3, big, 0, 0);
    expect_reject(buf, build(buf, 1, 0, t.b, t.n), "overflows");

    t.n = 0;
    uint64_t q[1] = {33};
    tensor_info(&t, "w", 1, q, LOOM_TYPE_Q4_0, 0);
    expect_reject(buf, build(buf, 1, 0, t.b, t.n), "not a multiple of the q4_0 block size");

    t.n = 0;
    tensor_info(&t, "w", 2, ne2, 0, 0); /* 64 bytes of data that are not there */
    expect_reject(buf, build(buf, 1, 0, t.b, t.n), "lies past the end of the file");

    t.n = 0;
    tensor_info(&t, "w", 2, ne2, 0, 3);
    expect_reject(buf, build(buf, 1, 0, t.b, t.n), "not a multiple of the alignment");

    t.n = 0;
    uint64_t one[1] = {1};
    tensor_info(&t, "w", 1, one, 0, 0);
    tensor_info(&t, "w", 1, one, 0, 32);
    size_t n = build(buf, 2, 0, t.b, t.n);
    memset(buf + n, 0, 128);
    expect_reject(buf, n + 128, "duplicate tensor name 'w'");

    /* a huge offset whose sum with the data offset would wrap */
    t.n = 0;
    tensor_info(&t, "w", 1, one, 0, 0xffffffffffffffe0ull);
    n = build(buf, 1, 0, t.b, t.n);
    memset(buf + n, 0, 64);
    expect_reject(buf, n + 64, "lies past the end of the file");
}

LOOM_TEST(gguf, random_corruption_never_crashes) {
    size_t size;
    uint8_t *data = sample_bytes(&size);
    LOOM_REQUIRE(data != NULL);
    uint8_t *c = malloc(size);
    int accepted = 0, rejected = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(c, data, size);
        int flips = 1 + (int)(loom_test_rand() % 4);
        for (int k = 0; k < flips; k++) c[loom_test_rand() % size] = (uint8_t)loom_test_rand();
        loom_gguf *g = NULL;
        if (loom_gguf_open_memory(c, size, &g) == LOOM_OK) {
            accepted++;
            /* whatever was accepted must be readable end to end */
            for (int64_t i = 0; i < loom_gguf_kv_count(g); i++) {
                char tmp[256];
                loom_gguf_kv_format(g, i, tmp, sizeof tmp);
            }
            for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
                const uint8_t *p = loom_gguf_tensor_data(g, i);
                size_t sz = loom_gguf_tensor_size(g, i);
                volatile uint8_t sink = 0;
                if (sz) sink ^= p[0] ^ p[sz - 1];
                (void)sink;
            }
            loom_gguf_free(g);
        } else {
            rejected++;
            LOOM_CHECK(g == NULL);
            LOOM_CHECK(strlen(loom_last_error()) > 0);
        }
    }
    LOOM_CHECK(rejected > 0);
    LOOM_CHECK(accepted + rejected == 3000);
    free(c);
    loom_free(data);
}

/* ---------------------------------------------------------------- real files */

static loom_gguf *open_model(const char *name) {
    const char *dir = loom_test_models_dir();
    if (!dir) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    loom_gguf *g = NULL;
    loom_status st = loom_gguf_open(path, &g);
    LOOM_CHECK_MSG(st == LOOM_OK, "%s: %s", path, loom_last_error());
    return g;
}

LOOM_TEST(gguf, stories260k) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = open_model("stories260K.gguf");
    LOOM_REQUIRE(g != NULL);
    const char *arch;
    LOOM_CHECK(loom_gguf_get_str(g, "general.architecture", &arch) == LOOM_OK && strcmp(arch, "llama") == 0);
    int64_t v;
    LOOM_CHECK(loom_gguf_get_int(g, "llama.embedding_length", &v) == LOOM_OK && v == 64);
    LOOM_CHECK(loom_gguf_get_int(g, "llama.block_count", &v) == LOOM_OK && v == 5);
    LOOM_CHECK(loom_gguf_get_int(g, "llama.attention.head_count", &v) == LOOM_OK && v == 8);
    LOOM_CHECK(loom_gguf_get_int(g, "llama.attention.head_count_kv", &v) == LOOM_OK && v == 4);
    int64_t t = loom_gguf_find_tensor(g, "output.weight");
    LOOM_REQUIRE(t >= 0);
    int64_t ne[4];
    loom_gguf_tensor_ne(g, t, ne);
    LOOM_CHECK(ne[0] == 64 && ne[1] == 512);
    int64_t tok = loom_gguf_find_kv(g, "tokenizer.ggml.tokens");
    LOOM_REQUIRE(tok >= 0);
    LOOM_CHECK_EQ_INT(loom_gguf_kv_arr_n(g, tok), 512);
    loom_gguf_free(g);
}

LOOM_TEST(gguf, llama2_tiny_random_f16) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = open_model("llama-2-tiny-random.gguf");
    LOOM_REQUIRE(g != NULL);
    bool saw_f16 = false;
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++)
        saw_f16 |= loom_gguf_tensor_type(g, i) == LOOM_TYPE_F16;
    LOOM_CHECK(saw_f16);
    int64_t tok = loom_gguf_find_kv(g, "tokenizer.ggml.tokens");
    LOOM_REQUIRE(tok >= 0);
    LOOM_CHECK_EQ_INT(loom_gguf_kv_arr_n(g, tok), 32000);
    loom_gguf_free(g);
}

LOOM_TEST(gguf, vocab_only_header_ends_at_eof) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_gguf *g = open_model("ggml-vocab-llama-spm.gguf");
    LOOM_REQUIRE(g != NULL);
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_count(g), 0);
    LOOM_CHECK(loom_gguf_data_offset(g) >= loom_gguf_file_size(g));
    loom_gguf_free(g);
}

/* ---------------------------------------------------------------- quant types */

/* A file with one tensor of each given GGUF type id: written as Q8_0 (whose 256-element
 * rows are larger than any type's here), then the type field patched in the bytes. */
static void *file_with_types(const int *types, int n, size_t *size) {
    loom_gguf_writer *w = loom_gguf_writer_new();
    if (!w) return NULL;
    loom_gguf_set_str(w, "general.architecture", "llama");
    static uint8_t zeros[8 * 34];
    char name[64];
    for (int i = 0; i < n; i++) {
        int64_t ne[1] = {256};
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
        loom_gguf_add_tensor(w, name, LOOM_TYPE_Q8_0, 1, ne, zeros);
    }
    void *data = NULL;
    if (loom_gguf_write_memory(w, &data, size)) data = NULL;
    loom_gguf_writer_free(w);
    for (int i = 0; data && i < n; i++) {
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
        uint8_t *p = memmem(data, *size, name, strlen(name));
        if (!LOOM_CHECK(p != NULL)) {
            loom_free(data);
            return NULL;
        }
        uint32_t t = (uint32_t)types[i];
        memcpy(p + strlen(name) + 4 + 8, &t, 4); /* after n_dims (u32) and ne[0] (u64) */
    }
    return data;
}

/* GGUF type ids loom has no kernels for open and list (names from the GGUF table), and
 * are refused by name and id where the data would be used; loom's own types pass. */
LOOM_TEST(gguf, unsupported_types_listed_then_refused_by_name) {
    const int types[] = {16, LOOM_TYPE_Q4_K, 35, LOOM_TYPE_MXFP4};
    size_t size = 0;
    void *data = file_with_types(types, 4, &size);
    LOOM_REQUIRE(data != NULL);
    loom_gguf *g = NULL;
    LOOM_REQUIRE(loom_gguf_open_memory(data, size, &g) == LOOM_OK);
    LOOM_CHECK(strcmp(loom_gguf_tensor_type_name(g, 0), "IQ2_XXS") == 0);
    LOOM_CHECK(strcmp(loom_gguf_tensor_type_name(g, 1), "Q4_K") == 0);
    LOOM_CHECK(strcmp(loom_gguf_tensor_type_name(g, 2), "TQ2_0") == 0);
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_size(g, 0), 66);  /* one IQ2_XXS block */
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_size(g, 1), 144); /* one Q4_K block */
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_size(g, 3), 8 * 17);
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_check_type(g, 0), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "tensor 'blk.0.ffn_up.weight' has type IQ2_XXS (16), which loom does "
                            "not support");
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_check_type(g, 2), LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "has type TQ2_0 (35)");
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_check_type(g, 1), LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_gguf_tensor_check_type(g, 3), LOOM_OK);
    loom_gguf_free(g);
    loom_free(data);

    /* an id GGUF does not define is still refused at open (its size is unknowable) */
    const int bad[] = {4};
    data = file_with_types(bad, 1, &size);
    LOOM_REQUIRE(data != NULL);
    expect_reject(data, size, "unknown type 4");
    loom_free(data);
}
