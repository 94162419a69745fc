/*
 * Calibration of the projection (docs/projection.md) against published figures, as a test
 * over the model (never over measured time). The models are header-only GGUF files made
 * here: the Llama-2 SentencePiece vocab file (a 7B-shaped header with no tensors) with its
 * llama.* shape keys patched to the model wanted and a Q4_0 tensor table appended, no byte
 * of weight data. `loom plan`'s engine plans them on profiled sim devices.
 *
 * Published figures (issue 18):
 *   ik_llama.cpp, 4x RTX 3090 PCIe with P2P, Llama-3-70B GGUF: 48.6 tokens/s decode;
 *   llama.cpp -sm tensor on 2 consumer GPUs: 1.68x decode over layer split;
 *   one-shot AllReduce ~7 us at decode sizes on NVLink; NCCL 20-24 us over PCIe.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/sim.h"
#include "tests/shim/loom_test.h"
#include "tools/plan.h"

#define LOOM_REQUIRE_MSG(cond, ...)                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            loom_test_fail(__FILE__, __LINE__, __VA_ARGS__);                                       \
            return;                                                                                \
        }                                                                                          \
    } while (0)

typedef struct shape {
    const char *name;
    uint32_t n_embd, n_layer, n_head, n_head_kv, n_ff;
} shape;

/* Overwrites the uint32 value of `key` in a GGUF image (key string, u32 type, u32 value). */
static bool patch_u32(unsigned char *img, size_t n, const char *key, uint32_t v) {
    size_t kl = strlen(key);
    for (size_t i = 8; i + kl + 8 <= n; i++) {
        uint64_t len;
        memcpy(&len, img + i - 8, 8);
        if (len == kl && memcmp(img + i, key, kl) == 0) {
            uint32_t type;
            memcpy(&type, img + i + kl, 4);
            if (type != 4) return false; /* GGUF_TYPE_UINT32 */
            memcpy(img + i + kl + 4, &v, 4);
            return true;
        }
    }
    return false;
}

typedef struct sink {
    unsigned char *p;
    size_t n, cap;
} sink;

static void put(sink *s, const void *d, size_t n) {
    if (s->n + n > s->cap) {
        s->cap = (s->n + n) * 2;
        s->p = realloc(s->p, s->cap);
    }
    memcpy(s->p + s->n, d, n);
    s->n += n;
}

static uint64_t g_offset, g_count;

static void tensor(sink *s, const char *name, int type, int nd, uint64_t ne0, uint64_t ne1) {
    uint64_t len = strlen(name);
    put(s, &len, 8);
    put(s, name, len);
    uint32_t n_dims = (uint32_t)nd, t = (uint32_t)type;
    put(s, &n_dims, 4);
    put(s, &ne0, 8);
    if (nd > 1) put(s, &ne1, 8);
    put(s, &t, 4);
    put(s, &g_offset, 8);
    uint64_t bytes = type == 2 ? ne0 / 32 * 18 * ne1 : ne0 * (nd > 1 ? ne1 : 1) * 4;
    g_offset += (bytes + 31) / 32 * 32;
    g_count++;
}

/* Writes the header-only model; returns its path (NULL without the shared models). */
static const char *make_model(const shape *sh) {
    static char path[4096];
    if (!loom_test_models_dir()) return NULL;
    char vocab[4096];
    snprintf(vocab, sizeof vocab, "%s/ggml-vocab-llama-spm.gguf", loom_test_models_dir());
    FILE *f = fopen(vocab, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    rewind(f);
    sink s = {0};
    s.p = malloc(n);
    s.cap = n;
    s.n = fread(s.p, 1, n, f);
    fclose(f);
    if (s.n != n) return NULL;
    bool ok = patch_u32(s.p, n, "llama.block_count", sh->n_layer) &&
              patch_u32(s.p, n, "llama.embedding_length", sh->n_embd) &&
              patch_u32(s.p, n, "llama.feed_forward_length", sh->n_ff) &&
              patch_u32(s.p, n, "llama.attention.head_count", sh->n_head) &&
              patch_u32(s.p, n, "llama.attention.head_count_kv", sh->n_head_kv);
    if (!ok) return NULL;
    const uint64_t E = sh->n_embd, V = 32000, F = sh->n_ff, D = E / sh->n_head;
    const uint64_t Dkv = D * sh->n_head_kv;
    g_offset = g_count = 0;
    tensor(&s, "token_embd.weight", 2, 2, E, V);
    tensor(&s, "output_norm.weight", 0, 1, E, 1);
    tensor(&s, "output.weight", 2, 2, E, V);
    char name[96];
    for (uint32_t l = 0; l < sh->n_layer; l++) {
#define T(suffix, type, nd, a, b)                                                                  \
    snprintf(name, sizeof name, "blk.%u." suffix, l), tensor(&s, name, type, nd, a, b)
        T("attn_norm.weight", 0, 1, E, 1);
        T("attn_q.weight", 2, 2, E, E);
        T("attn_k.weight", 2, 2, E, Dkv);
        T("attn_v.weight", 2, 2, E, Dkv);
        T("attn_output.weight", 2, 2, E, E);
        T("ffn_norm.weight", 0, 1, E, 1);
        T("ffn_gate.weight", 2, 2, E, F);
        T("ffn_up.weight", 2, 2, E, F);
        T("ffn_down.weight", 2, 2, F, E);
#undef T
    }
    memcpy(s.p + 8, &g_count, 8); /* n_tensors */
    const char *dir = getenv("TEST_TMPDIR");
    snprintf(path, sizeof path, "%s/%s-header.gguf", dir ? dir : "/tmp", sh->name);
    f = fopen(path, "wb");
    ok = f && fwrite(s.p, 1, s.n, f) == s.n;
    if (f) fclose(f);
    free(s.p);
    return ok ? path : NULL;
}

static loom_plan_candidate plan(const char *path, const char *spec, loom_split_mode mode, int n,
                                size_t mem) {
    loom_gguf *g = NULL;
    loom_plan_candidate c;
    memset(&c, 0, sizeof c);
    if (loom_gguf_open_header(path, &g)) return c;
    loom_plan_opts o = {
        .spec_opts = spec, .dev_mem = mem, .n_batch = 512, .kv_type = LOOM_TYPE_F16};
    loom_plan_candidate_eval(g, &o, mode, n, 4096, &c);
    loom_gguf_free(g);
    return c;
}

static const shape llama70b = {"llama70b", 8192, 80, 64, 8, 28672};
static const shape llama13b = {"llama13b", 5120, 40, 40, 40, 13824};

/* ik_llama.cpp 4x RTX 3090 PCIe P2P: 48.6 t/s decode. The model gives 41.0 (-16%: loom's
 * graph has ~23 kernels per layer at 4 us each, where ik_llama fuses and uses CUDA graphs);
 * the band kept is 20%. It fits (40 GB of Q4_0 over 4 x 24 GB); a layer split is slower. */
LOOM_TEST(calibration, llama70b_4x3090_pcie_decode) {
    const char *path = make_model(&llama70b);
    if (!path) LOOM_SKIP("shared models not found");
    loom_plan_candidate tp =
        plan(path, "profile=rtx-3090,link=pcie4", LOOM_SPLIT_MODE_TENSOR, 4, (size_t)24 << 30);
    LOOM_REQUIRE_MSG(tp.ok, "%s", tp.err);
    printf("70B Q4_0 4x3090 pcie4 tensor: tg %.2f t/s (published 48.6), pp %.1f t/s, "
           "%.2f GiB/device\n",
           tp.tg_tps, tp.pp_tps, (tp.weights + tp.kv + tp.compute) / (1 << 30));
    LOOM_CHECK(tp.fits);
    LOOM_CHECK_MSG(fabs(tp.tg_tps - 48.6) <= 0.20 * 48.6, "tg %.2f vs 48.6", tp.tg_tps);
    loom_plan_candidate ls =
        plan(path, "profile=rtx-3090,link=pcie4", LOOM_SPLIT_MODE_LAYER, 4, (size_t)24 << 30);
    LOOM_REQUIRE(ls.ok);
    printf("70B Q4_0 4x3090 pcie4 layer: tg %.2f t/s\n", ls.tg_tps);
    LOOM_CHECK(ls.tg_tps < tp.tg_tps / 2);
}

/* llama.cpp -sm tensor on 2 consumer GPUs: 1.68x decode over layer split. The model gives
 * 1.39x for a 13B Q4_0 on 2 x RTX 4090 without P2P (-17%; the same per-kernel overhead
 * weighs more on the half-sized slices); the band kept is 20%. */
LOOM_TEST(calibration, tensor_over_layer_on_two_consumer_gpus) {
    const char *path = make_model(&llama13b);
    if (!path) LOOM_SKIP("shared models not found");
    loom_plan_candidate tp = plan(path, "profile=rtx-4090,link=pcie4-nop2p", LOOM_SPLIT_MODE_TENSOR,
                                  2, (size_t)24 << 30);
    loom_plan_candidate ls =
        plan(path, "profile=rtx-4090,link=pcie4-nop2p", LOOM_SPLIT_MODE_LAYER, 2, (size_t)24 << 30);
    LOOM_REQUIRE_MSG(tp.ok && ls.ok, "%s %s", tp.err, ls.err);
    double ratio = tp.tg_tps / ls.tg_tps;
    printf("13B Q4_0 2x4090 no-P2P: tensor tg %.2f, layer tg %.2f: %.2fx (published 1.68x)\n",
           tp.tg_tps, ls.tg_tps, ratio);
    LOOM_CHECK_MSG(fabs(ratio - 1.68) <= 0.20 * 1.68, "ratio %.2f vs 1.68", ratio);
}

/* AllReduce at decode size (one token's activations, 8192 floats = 32 KiB): a one-shot
 * over NVLink is one transfer plus one add kernel (~7 us published); a ring over PCIe 4
 * between 2 GPUs is NCCL's algorithm (20-24 us published). The model: 6.1 us (-13%) and
 * 17.3 us (-13% from the low end); the bands kept are 25%. */
LOOM_TEST(calibration, allreduce_at_decode_size) {
    const uint64_t bytes = 8192 * 4;
    const loom_sim_profile *h100 = NULL;
    LOOM_REQUIRE(loom_sim_profile_find("h100-sxm", &h100) == LOOM_OK);
    loom_sim_link nv, pc;
    LOOM_REQUIRE(loom_sim_link_preset("nvlink4", &nv) == LOOM_OK);
    LOOM_REQUIRE(loom_sim_link_preset("pcie4", &pc) == LOOM_OK);
    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 4 * loom_tensor_overhead(), .no_alloc = true});
    loom_tensor *a = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 8192);
    loom_tensor *sum = loom_add(ctx, a, a);
    double oneshot = loom_sim_link_time_us(&nv, bytes) + loom_sim_op_time_us(h100, sum);
    double ring = loom_sim_allreduce_time_us(&pc, true, 2, bytes);
    printf("allreduce 32 KiB: one-shot nvlink4 %.2f us (published ~7), ring pcie4 x2 %.2f us "
           "(published 20-24)\n",
           oneshot, ring);
    LOOM_CHECK_MSG(fabs(oneshot - 7.0) <= 0.25 * 7.0, "one-shot %.2f vs 7", oneshot);
    LOOM_CHECK_MSG(ring >= 0.75 * 20 && ring <= 1.25 * 24, "ring %.2f vs 20-24", ring);
    loom_ctx_free(ctx);
}
