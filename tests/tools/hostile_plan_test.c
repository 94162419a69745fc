/*
 * `loom plan` on hostile headers (issue #29 item 8): a tensor count or metadata count no
 * file can hold, a tensor whose element count overflows int64, a 512 GiB embedding, a
 * training context of 2^40 taken by -c 0, and device specs with no memory or no devices.
 * Each is refused with a message naming what is wrong, quickly and without allocating what
 * the header asks for. The files are written byte by byte here (header only: plan reads
 * no weight).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/shim/loom_test.h"
#include "tests/tools/capture.h"
#include "tools/cli.h"

typedef struct buf {
    unsigned char b[8192];
    size_t n;
} buf;

static void put(buf *w, const void *p, size_t n) {
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void u32(buf *w, uint32_t v) {
    put(w, &v, 4);
}
static void u64(buf *w, uint64_t v) {
    put(w, &v, 8);
}
static void str(buf *w, const char *s) {
    u64(w, strlen(s));
    put(w, s, strlen(s));
}
static void kv_str(buf *w, const char *k, const char *v) {
    str(w, k);
    u32(w, 8);
    str(w, v);
}
static void kv_u64(buf *w, const char *k, uint64_t v) {
    str(w, k);
    u32(w, 10);
    u64(w, v);
}

typedef struct hdr {
    uint64_t E, V, L, ctx;
    uint64_t n_tensors_override, n_kv_override; /* 0: the real counts */
    const char *bad_tensor;                     /* a single tensor of dims bad_ne instead */
    uint64_t bad_ne[4];
    int bad_nd;
} hdr;

/* A llama header (tokenizer none) with f32 tensors at consecutive offsets, to path. */
static void write_header(const char *path, const hdr *h) {
    buf *w = calloc(1, sizeof *w);
    enum { N_KV = 7 };
    const char *names[16];
    uint64_t ne[16][2];
    int nd[16], nt = 0;
    if (h->bad_tensor) {
        names[0] = h->bad_tensor;
        nd[0] = h->bad_nd;
        nt = 1;
    } else {
        const uint64_t E = h->E, V = h->V, FF = 128;
        const char *n[] = {
            "token_embd.weight",      "output_norm.weight",       "output.weight",
            "blk.0.attn_norm.weight", "blk.0.attn_q.weight",      "blk.0.attn_k.weight",
            "blk.0.attn_v.weight",    "blk.0.attn_output.weight", "blk.0.ffn_norm.weight",
            "blk.0.ffn_gate.weight",  "blk.0.ffn_up.weight",      "blk.0.ffn_down.weight"};
        const uint64_t s[][2] = {{E, V}, {E, 1}, {E, V}, {E, 1},  {E, E},  {E, E},
                                 {E, E}, {E, E}, {E, 1}, {E, FF}, {E, FF}, {FF, E}};
        for (nt = 0; nt < 12; nt++) {
            names[nt] = n[nt];
            ne[nt][0] = s[nt][0];
            ne[nt][1] = s[nt][1];
            nd[nt] = s[nt][1] == 1 ? 1 : 2;
        }
    }
    put(w, "GGUF", 4);
    u32(w, 3);
    u64(w, h->n_tensors_override ? h->n_tensors_override : (uint64_t)nt);
    u64(w, h->n_kv_override ? h->n_kv_override : N_KV);
    kv_str(w, "general.architecture", "llama");
    kv_u64(w, "llama.embedding_length", h->E);
    kv_u64(w, "llama.block_count", h->L);
    kv_u64(w, "llama.attention.head_count", 2);
    kv_u64(w, "llama.feed_forward_length", 128);
    kv_u64(w, "llama.context_length", h->ctx);
    kv_str(w, "tokenizer.ggml.model", "none");
    uint64_t off = 0;
    for (int t = 0; t < nt; t++) {
        str(w, names[t]);
        u32(w, (uint32_t)nd[t]);
        uint64_t bytes = 4;
        for (int d = 0; d < nd[t]; d++) {
            const uint64_t x = h->bad_tensor ? h->bad_ne[d] : ne[t][d];
            u64(w, x);
            bytes *= x;
        }
        u32(w, 0); /* F32 */
        u64(w, off);
        off += (bytes + 31) / 32 * 32;
    }
    while (w->n % 32)
        w->b[w->n++] = 0;
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(w->b, 1, w->n, f);
        fclose(f);
    }
    free(w);
}

static char *tmp_path(const char *name) {
    const char *dir = getenv("TEST_TMPDIR");
    static char path[8][512];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 512, "%s/%s", dir ? dir : "/tmp", name);
    return p;
}

/* runs `loom plan -m path --devices devices [-c ctx]`: the exit code, stderr contains want */
static void expect_plan(const char *path, const char *devices, const char *ctx, int rc,
                        const char *want) {
    char *argv[] = {
        "plan",      "-m", (char *)path, "--devices", (char *)devices, ctx ? "-c" : NULL,
        (char *)ctx, NULL};
    char *out = NULL, *err = NULL;
    const int got = loom_test_capture(loom_cli_plan, argv, &out, &err);
    LOOM_CHECK_MSG(got == rc, "plan %s --devices %s: exit %d (want %d), stderr: %s", path, devices,
                   got, rc, err ? err : "");
    LOOM_CHECK_STR_CONTAINS(err ? err : "", want);
    free(out);
    free(err);
}

LOOM_TEST(hostile_plan, counts_no_file_can_hold) {
    const hdr a = {.E = 64, .V = 1000, .L = 1, .ctx = 128, .n_tensors_override = 1ull << 62};
    char *p = tmp_path("count.gguf");
    write_header(p, &a);
    expect_plan(
        p, "sim:2,profile=l40s", NULL, 1,
        "gguf: tensor count 4611686018427387904 at offset 8 is more than the file can hold");
    const hdr b = {.E = 64, .V = 1000, .L = 1, .ctx = 128, .n_kv_override = 1ull << 60};
    p = tmp_path("kvcount.gguf");
    write_header(p, &b);
    expect_plan(p, "sim:2,profile=l40s", NULL, 1,
                "gguf: metadata count 1152921504606846976 at offset 16 is more than the file can "
                "hold");
}

LOOM_TEST(hostile_plan, shapes_overflowing_int64) {
    const hdr a = {.E = 64,
                   .L = 1,
                   .ctx = 128,
                   .bad_tensor = "token_embd.weight",
                   .bad_ne = {1ull << 62, 4},
                   .bad_nd = 2};
    char *p = tmp_path("overflow.gguf");
    write_header(p, &a);
    expect_plan(p, "sim:2,profile=l40s", NULL, 1,
                "tensor 'token_embd.weight': ne[1] = 4 at offset");
    const hdr b = {.E = 64,
                   .L = 1,
                   .ctx = 128,
                   .bad_tensor = "token_embd.weight",
                   .bad_ne = {1 << 20, 1 << 20, 1 << 20, 1 << 20},
                   .bad_nd = 4};
    p = tmp_path("dims.gguf");
    write_header(p, &b);
    expect_plan(p, "sim:2,profile=l40s", NULL, 1, "ne[3] = 1048576 at offset");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "overflows the element count");
}

/* A 512 GiB embedding (vocabulary 2^31 - 1) is planned from the header and refused for the
 * host memory it would need, with the size; nothing of that size is allocated. */
LOOM_TEST(hostile_plan, absurd_sizes_named_not_allocated) {
    const hdr a = {.E = 64, .V = (1ull << 31) - 1, .L = 1, .ctx = 128};
    char *p = tmp_path("bigvocab.gguf");
    write_header(p, &a);
    expect_plan(p, "sim:2,profile=l40s", NULL, 1, "524288.0 MiB of weights");
    const hdr b = {.E = 64, .V = 1ull << 40, .L = 1, .ctx = 128};
    p = tmp_path("hugevocab.gguf");
    write_header(p, &b);
    expect_plan(p, "sim:2,profile=l40s", NULL, 1, "vocabulary of 1099511627776 tokens");
    const hdr c = {.E = 64, .V = 1000, .L = 2000, .ctx = 128};
    p = tmp_path("layers.gguf");
    write_header(p, &c);
    expect_plan(p, "sim:2,profile=l40s", NULL, 1, "n_layer 2000 (max 512)");
}

/* -c 0 takes the training context: 2^40 positions is refused by name before any KV cache
 * (was: an attempt to allocate 128 TiB, reported as out of host memory). */
LOOM_TEST(hostile_plan, training_context_past_the_limit) {
    const hdr a = {.E = 64, .V = 1000, .L = 1, .ctx = 1ull << 40};
    char *p = tmp_path("bigctx.gguf");
    write_header(p, &a);
    expect_plan(p, "sim:2,profile=l40s", "0", 2,
                "loom plan: -c 0: the model's training context (llama.context_length) is "
                "1099511627776, more than the 16777216 positions a plan takes; give -c N");
    /* a context given with -c plans */
    expect_plan(p, "sim:2,profile=l40s", "256", 0, "");
}

LOOM_TEST(hostile_plan, device_specs_without_memory_or_devices) {
    const hdr a = {.E = 64, .V = 1000, .L = 1, .ctx = 128};
    char *p = tmp_path("small.gguf");
    write_header(p, &a);
    expect_plan(p, "sim:2,mem=0", NULL, 2, "mem: '0' is not a positive size");
    expect_plan(p, "sim:2,profile=l40s,mem=0", NULL, 2, "mem: '0' is not a positive size");
    expect_plan(p, "sim:0", NULL, 2, "device count 0 is out of range 1..64");
    expect_plan(p, "sim:2,mem=-5", NULL, 2, "mem: '-5' is not a size");
    expect_plan(p, "sim:2,profile=l40s,mem=18446744073709551615", NULL, 2,
                "mem: size '18446744073709551615' is too large");
    expect_plan(p, "sim:32,profile=l40s", NULL, 2, "at most 16 devices");
}
