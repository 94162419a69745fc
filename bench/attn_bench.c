/*
 * attn_bench: decode attention (FLASH_ATTN_EXT with few queries) on the CPU backend.
 *
 * TinyLlama-1.1B's attention shape (head_dim 64, 32 query heads over 4 KV heads) for
 * Nq = 1 (generation) and Nq = 4 at KV depths 512 and 2048, with a mask, for an F16, Q8_0
 * and Q4_0 K/V cache (or the one --kv names). Prints the best time per call over several
 * runs, the K/V bytes per call and the resulting GB/s. One output per case is checked
 * against a double-precision softmax attention over the cache's decoded values computed
 * here; a wrong result fails the run.
 *
 *   attn_bench [--threads T] [--kv TYPE] [--small]
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
    loom_type kv;
} attn_case;

/* n floats (whole rows of d) -> the cache type's bytes, and back into x (the values the
 * kernel sees). False when the type cannot be encoded. */
static bool encode(loom_type t, float *x, void *out, int64_t n, int64_t d) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    if (t == LOOM_TYPE_F32) {
        memcpy(out, x, (size_t)n * sizeof(float));
        return true;
    }
    if (!tr || !tr->from_float || !tr->to_float || d % tr->blck_size) return false;
    const size_t row = (size_t)(d / tr->blck_size) * tr->type_size;
    for (int64_t r = 0; r < n / d; r++) {
        char *o = (char *)out + (size_t)r * row;
        tr->from_float(x + r * d, o, d);
        tr->to_float(o, x + r * d, d);
    }
    return true;
}

/* Runs one case; returns the best seconds per call or a negative value on failure. */
static double run_case(loom_backend_t be, const attn_case *c, int reps, double *err_out) {
    const int64_t D = c->D, H = c->H, Hk = c->Hk, Nq = c->Nq, Nkv = c->Nkv;
    loom_ctx_params cp = {.mem_size = loom_tensor_overhead() * 8 + loom_graph_overhead(16) + 4096,
                          .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(cp);
    if (!ctx) return -1;
    loom_tensor *q = loom_new_tensor_4d(ctx, LOOM_TYPE_F32, D, Nq, H, 1);
    loom_tensor *k = loom_new_tensor_4d(ctx, c->kv, D, Nkv, Hk, 1);
    loom_tensor *v = loom_new_tensor_4d(ctx, c->kv, D, Nkv, Hk, 1);
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
    const size_t kvbytes = loom_nbytes(k);
    void *kb = malloc(kvbytes), *vb = malloc(kvbytes);
    uint16_t *m16 = malloc(nm * 2);
    float *res = malloc((size_t)(D * H * Nq) * 4);
    double best = -1;
    if (!hq || !hk || !hv || !hm || !kb || !vb || !m16 || !res) goto done;
    for (size_t i = 0; i < nq; i++)
        hq[i] = rng_uniform(&rng) * 2.0f;
    for (size_t i = 0; i < nk; i++) {
        hk[i] = rng_uniform(&rng);
        hv[i] = rng_uniform(&rng);
    }
    if (!encode(c->kv, hk, kb, (int64_t)nk, D) || !encode(c->kv, hv, vb, (int64_t)nk, D)) {
        fprintf(stderr, "attn_bench: cannot encode a %s cache\n", loom_type_name(c->kv));
        goto done;
    }
    /* causal over the last Nq positions */
    for (int64_t j = 0; j < Nq; j++)
        for (int64_t i = 0; i < Nkv; i++) {
            hm[j * Nkv + i] = i <= Nkv - Nq + j ? 0.0f : -INFINITY;
            m16[j * Nkv + i] = loom_fp32_to_fp16(hm[j * Nkv + i]);
        }
    loom_tensor_set(q, hq, 0, nq * 4);
    loom_tensor_set(k, kb, 0, kvbytes);
    loom_tensor_set(v, vb, 0, kvbytes);
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
    free(hq), free(hk), free(hv), free(hm), free(kb), free(vb), free(m16), free(res);
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    return best;
}

int main(int argc, char **argv) {
    int threads = 0;
    bool small = false;
    loom_type kvs[] = {LOOM_TYPE_F16, LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0};
    int nkv = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small"))
            small = true;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) {
            const char *name = argv[++i];
            nkv = 0;
            for (int t = 0; t < LOOM_TYPE_COUNT && !nkv; t++) {
                const loom_type_traits *tr = loom_type_traits_get(t);
                if (tr && tr->name && !strcmp(tr->name, name)) kvs[0] = (loom_type)t, nkv = 1;
            }
            if (!nkv) {
                fprintf(stderr, "attn_bench: unknown type '%s'\n", name);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: attn_bench [--threads T] [--kv TYPE] [--small]\n");
            return 2;
        }
    }
    if (threads <= 0) threads = loom_n_cpus();
    loom_backend_t be = loom_cpu_backend_new(threads);
    if (!be) {
        fprintf(stderr, "attn_bench: cannot create the CPU backend: %s\n", loom_last_error());
        return 1;
    }
    const attn_case shapes[] = {{64, 32, 4, 1, 512, 0},
                                {64, 32, 4, 1, 2048, 0},
                                {64, 32, 4, 4, 512, 0},
                                {64, 32, 4, 4, 2048, 0}};
    const int reps = small ? 5 : 200;
    printf("attn_bench: FLASH_ATTN_EXT, %d threads, simd %s\n", threads, loom_cpu_simd_name());
    printf("| K/V | D | H | Hk | Nq | Nkv | us/call | KV GB/s | max abs err |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    for (int ik = 0; ik < nkv; ik++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            attn_case c = shapes[i];
            c.kv = kvs[ik];
            double err = INFINITY;
            double s = run_case(be, &c, reps, &err);
            if (s < 0) {
                fprintf(stderr, "attn_bench: case failed: %s\n", loom_last_error());
                rc = 1;
                continue;
            }
            /* K and V, Nkv rows of D values per KV head, in the cache's own bytes */
            double bytes = 2.0 * (double)(c.Nkv * c.Hk) * (double)loom_row_size(c.kv, c.D);
            printf("| %s | %lld | %lld | %lld | %lld | %lld | %.1f | %.2f | %.2g |\n",
                   loom_type_name(c.kv), (long long)c.D, (long long)c.H, (long long)c.Hk,
                   (long long)c.Nq, (long long)c.Nkv, s * 1e6, bytes / s * 1e-9, err);
            if (!(err < 2e-3)) {
                fprintf(stderr, "attn_bench: wrong result (error %g)\n", err);
                rc = 1;
            }
        }
    loom_backend_free(be);
    return rc;
}
