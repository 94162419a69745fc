/*
 * attn_bench: decode attention (FLASH_ATTN_EXT with few queries) on the CPU backend.
 *
 * TinyLlama-1.1B's attention shape (head_dim 64, 32 query heads over 4 KV heads, F16 K/V
 * cache) for Nq = 1 (generation) and Nq = 4 at KV depths 512 and 2048, with a mask.
 * Prints the best time per call over several runs, the K/V bytes per call and the
 * resulting GB/s. One output per case is checked against a double-precision softmax
 * attention computed here; a wrong result fails the run.
 *
 *   attn_bench [--threads T] [--small]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/loom.h"

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static float rng_uniform(uint64_t *s) {
    return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct attn_case {
    int64_t D, H, Hk, Nq, Nkv;
} attn_case;

/* Runs one case; returns the best seconds per call or a negative value on failure. */
static double run_case(loom_backend_t be, const attn_case *c, int reps, double *err_out) {
    const int64_t D = c->D, H = c->H, Hk = c->Hk, Nq = c->Nq, Nkv = c->Nkv;
    loom_ctx_params cp = {.mem_size = loom_tensor_overhead() * 8 + loom_graph_overhead(16) + 4096,
                          .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(cp);
    if (!ctx) return -1;
    loom_tensor *q = loom_new_tensor_4d(ctx, LOOM_TYPE_F32, D, Nq, H, 1);
    loom_tensor *k = loom_new_tensor_4d(ctx, LOOM_TYPE_F16, D, Nkv, Hk, 1);
    loom_tensor *v = loom_new_tensor_4d(ctx, LOOM_TYPE_F16, D, Nkv, Hk, 1);
    loom_tensor *m = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, Nkv, Nq);
    const float scale = 1.0f / sqrtf((float)D);
    loom_tensor *o = loom_flash_attn_ext(ctx, q, k, v, m, NULL, scale, 0.0f, 0.0f);
    loom_graph *g = loom_graph_new(ctx, 16);
    if (!o || !g || loom_graph_build_forward(g, o) != LOOM_OK) {
        loom_ctx_free(ctx);
        return -1;
    }
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, loom_backend_default_buft(be));
    if (!buf) {
        loom_ctx_free(ctx);
        return -1;
    }
    uint64_t rng = 0x5eed1234u ^ (uint64_t)(Nq * 131 + Nkv);
    size_t nq = (size_t)(D * Nq * H), nk = (size_t)(D * Nkv * Hk), nm = (size_t)(Nkv * Nq);
    float *hq = malloc(nq * 4), *hk = malloc(nk * 4), *hv = malloc(nk * 4), *hm = malloc(nm * 4);
    uint16_t *k16 = malloc(nk * 2), *v16 = malloc(nk * 2), *m16 = malloc(nm * 2);
    float *res = malloc((size_t)(D * H * Nq) * 4);
    double best = -1;
    if (!hq || !hk || !hv || !hm || !k16 || !v16 || !m16 || !res) goto done;
    for (size_t i = 0; i < nq; i++)
        hq[i] = rng_uniform(&rng) * 2.0f;
    for (size_t i = 0; i < nk; i++) {
        k16[i] = loom_fp32_to_fp16(rng_uniform(&rng));
        v16[i] = loom_fp32_to_fp16(rng_uniform(&rng));
        hk[i] = loom_fp16_to_fp32(k16[i]);
        hv[i] = loom_fp16_to_fp32(v16[i]);
    }
    /* causal over the last Nq positions */
    for (int64_t j = 0; j < Nq; j++)
        for (int64_t i = 0; i < Nkv; i++) {
            hm[j * Nkv + i] = i <= Nkv - Nq + j ? 0.0f : -INFINITY;
            m16[j * Nkv + i] = loom_fp32_to_fp16(hm[j * Nkv + i]);
        }
    loom_tensor_set(q, hq, 0, nq * 4);
    loom_tensor_set(k, k16, 0, nk * 2);
    loom_tensor_set(v, v16, 0, nk * 2);
    loom_tensor_set(m, m16, 0, nm * 2);
    if (loom_backend_graph_compute(be, g) != LOOM_OK) goto done;
    loom_tensor_get(o, res, 0, (size_t)(D * H * Nq) * 4);
    /* check query Nq-1 of head H-1 (dst is [D, H, Nq]) */
    {
        const int64_t j = Nq - 1, h = H - 1, hh = h / (H / Hk);
        double mx = -INFINITY, sum = 0, worst = 0;
        double *w = malloc((size_t)Nkv * sizeof *w);
        if (!w) goto done;
        for (int64_t i = 0; i < Nkv; i++) {
            double z = 0;
            for (int64_t d = 0; d < D; d++)
                z += (double)hq[(h * Nq + j) * D + d] * hk[(hh * Nkv + i) * D + d];
            w[i] = z * scale + hm[j * Nkv + i];
            if (w[i] > mx) mx = w[i];
        }
        for (int64_t i = 0; i < Nkv; i++)
            sum += w[i] = exp(w[i] - mx);
        for (int64_t d = 0; d < D; d++) {
            double ref = 0;
            for (int64_t i = 0; i < Nkv; i++)
                ref += w[i] * hv[(hh * Nkv + i) * D + d];
            ref /= sum;
            double e = fabs(res[(j * H + h) * D + d] - ref);
            if (!(e <= worst)) worst = e;
        }
        free(w);
        *err_out = worst;
    }
    for (int r = 0; r < reps; r++) {
        int64_t t0 = loom_time_ns();
        if (loom_backend_graph_compute(be, g) != LOOM_OK) {
            best = -1;
            goto done;
        }
        double s = (double)(loom_time_ns() - t0) * 1e-9;
        if (best < 0 || s < best) best = s;
    }
done:
    free(hq), free(hk), free(hv), free(hm), free(k16), free(v16), free(m16), free(res);
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    return best;
}

int main(int argc, char **argv) {
    int threads = 0;
    bool small = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small"))
            small = true;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: attn_bench [--threads T] [--small]\n");
            return 2;
        }
    }
    if (threads <= 0) threads = loom_n_cpus();
    loom_backend_t be = loom_cpu_backend_new(threads);
    if (!be) {
        fprintf(stderr, "attn_bench: cannot create the CPU backend: %s\n", loom_last_error());
        return 1;
    }
    const attn_case cases[] = {
        {64, 32, 4, 1, 512}, {64, 32, 4, 1, 2048}, {64, 32, 4, 4, 512}, {64, 32, 4, 4, 2048}};
    const int reps = small ? 5 : 200;
    printf("attn_bench: FLASH_ATTN_EXT, F16 K/V, %d threads, simd %s\n", threads,
           loom_cpu_simd_name());
    printf("| D | H | Hk | Nq | Nkv | us/call | KV GB/s | max abs err |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const attn_case *c = &cases[i];
        double err = INFINITY;
        double s = run_case(be, c, reps, &err);
        if (s < 0) {
            fprintf(stderr, "attn_bench: case failed: %s\n", loom_last_error());
            rc = 1;
            continue;
        }
        double bytes = 2.0 * 2.0 * (double)(c->D * c->Nkv * c->Hk);
        printf("| %lld | %lld | %lld | %lld | %lld | %.1f | %.2f | %.2g |\n", (long long)c->D,
               (long long)c->H, (long long)c->Hk, (long long)c->Nq, (long long)c->Nkv, s * 1e6,
               bytes / s * 1e-9, err);
        if (!(err < 2e-3)) {
            fprintf(stderr, "attn_bench: wrong result (error %g)\n", err);
            rc = 1;
        }
    }
    loom_backend_free(be);
    return rc;
}
