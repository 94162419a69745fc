/*
 * matmul_bench: how close the CPU backend's MUL_MAT gets to this machine's limits.
 *
 * First it measures the machine itself (machine_limits.c): streaming read bandwidth and
 * FMA peak on every hardware thread. Then it times MUL_MAT of an M x K weight (F32, F16, BF16,
 * Q8_0, Q4_0, the other legacy quants, the K-quants, IQ4_NL/IQ4_XS, MXFP4) by K x N activations
 * for one token (N = 1, a matrix-vector product that is bound by memory bandwidth) and for a
 * batch (N = 512 by default, bound by arithmetic). Each row reports the best time of several
 * runs, GFLOP/s (2*M*N*K per matmul), GB/s
 * ((weight bytes + activation bytes) / time), and the fraction of the measured read
 * bandwidth (N = 1) or FMA peak (batch). For N = 1 the graph holds enough copies of the
 * weight to exceed the last-level cache several times, so the figure is DRAM streaming,
 * not a cache-resident replay. A few outputs of every run are checked against a
 * double-precision dot product of the dequantised weights; a wrong result fails the run.
 *
 *   matmul_bench [--size K] [--tokens N] [--threads T] [--small]
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h" /* loom__cpu_has_avx512bf16 */
#include "bench/bench_rng.h"
#include "bench/machine_limits.h"
#include "loom/loom.h"

typedef struct bench_opts {
    int64_t size;   /* K = M */
    int64_t tokens; /* N of the batched row */
    int threads;
    bool small;
    const char *types; /* comma-separated type names to run, NULL: all */
    double min_time_s; /* keep repeating a case until this much time is spent */
    int min_reps, max_reps;
    size_t stream_bytes; /* working set of the bandwidth test and of N = 1 runs */
} bench_opts;

typedef struct case_result {
    double best_s; /* seconds per matmul, best run */
    int reps;
    int copies;           /* weights streamed per graph */
    double weight_bytes;  /* one copy */
    double act_bytes;     /* activations in (K*N*4) */
    double max_err_ratio; /* max |got - ref| / tolerance over the sampled outputs */
} case_result;

static void usage(FILE *f) {
    fprintf(f, "usage: matmul_bench [--size K] [--tokens N] [--threads T] [--small]\n"
               "\n"
               "Measures memory bandwidth and FMA peak, then times the CPU backend's MUL_MAT\n"
               "with KxK weights (F32, F16, every quant type) for N=1 and N tokens.\n"
               "  --size K     weight rows and columns (default 4096; a multiple of 32,\n"
               "               of 256 for the K-quants and IQ4_XS, which are skipped otherwise)\n"
               "  --tokens N   batch of the second row per type (default 512)\n"
               "  --threads T  threads (default: every hardware thread)\n"
               "  --types L    only these types (comma-separated names, e.g. q8_0,q4_0)\n"
               "  --small      quick run for CI: 512x512 weights, fewer repetitions\n"
               "\n"
               "Quantised types at N > 1 get two rows, timed alternately (best of three\n"
               "rounds each): path int8 (the int8 GEMM) and f32 (LOOM_CPU_QGEMM=0: weights\n"
               "dequantised to the F32 GEMM). %%peak is GFLOP/s (2*M*N*K, int8 or float\n"
               "multiply-adds alike) over the measured FMA peak. BF16 at N > 1 on a CPU with\n"
               "AVX512_BF16: path bf16 (the vdpbf16ps GEMM, activations rounded to bf16) and\n"
               "f32 (LOOM_CPU_BGEMM=0: weights converted to the F32 GEMM).\n");
}

static bool parse_i64(const char *s, int64_t *out) {
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (!s[0] || *end || v <= 0) return false;
    *out = v;
    return true;
}

/* Tolerance of one output relative to sum |a_k b_k|: the kernels may round activations to
 * the weight's dot type (F16, or Q8_0 for quantised weights) and sum in any order. */
static double rel_tolerance(loom_type t) {
    switch (t) {
    case LOOM_TYPE_F32:
        return 1e-4;
    case LOOM_TYPE_F16:
    case LOOM_TYPE_BF16:
        return 8e-3;
    default:
        return 3e-2;
    }
}

/* Checks `samples` outputs of out = w x b against a double reference. */
static double check_outputs(const loom_tensor *w, const float *b_host, const loom_tensor *out,
                            int64_t K, int64_t M, int64_t N, uint64_t *rng) {
    const loom_type_traits *tr = loom_type_traits_get(w->type);
    size_t row_bytes = loom_row_size(w->type, K);
    void *wrow = loom_malloc(row_bytes);
    float *wf = loom_malloc(sizeof(float) * (size_t)K);
    float *res = loom_malloc(sizeof(float) * (size_t)(M * N));
    if (!wrow || !wf || !res) {
        loom_free(wrow);
        loom_free(wf);
        loom_free(res);
        return INFINITY;
    }
    loom_tensor_get(out, res, 0, sizeof(float) * (size_t)(M * N));
    double worst = 0;
    for (int s = 0; s < 16; s++) {
        int64_t m = (int64_t)(rng_next(rng) % (uint64_t)M);
        int64_t n = (int64_t)(rng_next(rng) % (uint64_t)N);
        loom_tensor_get(w, wrow, (size_t)m * w->nb[1], row_bytes);
        tr->to_float(wrow, wf, K);
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; k++) {
            double p = (double)wf[k] * (double)b_host[n * K + k];
            ref += p;
            mag += fabs(p);
        }
        double err = fabs((double)res[n * M + m] - ref);
        double ratio = err / (rel_tolerance(w->type) * mag + 1e-6);
        if (!(ratio <= worst)) worst = ratio; /* NaN propagates as a failure */
    }
    loom_free(wrow);
    loom_free(wf);
    loom_free(res);
    return worst;
}

/* Times `copies` independent M x K weights times one K x N activation matrix. */
static loom_status run_case(loom_backend_t be, const bench_opts *o, loom_type type, int64_t N,
                            case_result *r) {
    const int64_t K = o->size, M = o->size;
    memset(r, 0, sizeof *r);
    r->weight_bytes = (double)loom_row_size(type, K) * (double)M;
    r->act_bytes = 4.0 * (double)K * (double)N;
    int copies = 1;
    if (N == 1) {
        double c = ceil((double)o->stream_bytes / r->weight_bytes);
        copies = c < 1 ? 1 : c > 1024 ? 1024 : (int)c;
    }
    r->copies = copies;

    size_t graph_size = (size_t)copies + 8;
    loom_ctx_params cp = {
        .mem_size = loom_tensor_overhead() * (size_t)(2 * copies + 8) +
                    loom_graph_overhead(graph_size) + 4096,
        .no_alloc = true,
    };
    loom_ctx *ctx = loom_ctx_new(cp);
    if (!ctx) return loom_last_status();
    loom_status st = LOOM_OK;
    loom_buffer_t buf = NULL;
    float *host_w = NULL, *host_b = NULL;
    void *packed = NULL;
    loom_tensor **w = loom_calloc((size_t)copies, sizeof *w);
    loom_tensor **out = loom_calloc((size_t)copies, sizeof *out);
    loom_tensor *b = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, N);
    loom_graph *g = loom_graph_new(ctx, graph_size);
    if (!w || !out || !b || !g) {
        st = loom_last_status() != LOOM_OK ? loom_last_status() : LOOM_ERR_NOMEM;
        goto done;
    }
    for (int c = 0; c < copies; c++) {
        w[c] = loom_new_tensor_2d(ctx, type, K, M);
        out[c] = loom_mul_mat(ctx, w[c], b);
        if (!out[c] || (st = loom_graph_build_forward(g, out[c])) != LOOM_OK) {
            if (st == LOOM_OK) st = loom_last_status();
            goto done;
        }
    }
    buf = loom_alloc_ctx_tensors(ctx, loom_backend_default_buft(be));
    if (!buf) {
        st = loom_last_status();
        goto done;
    }

    /* deterministic data: uniform [-1, 1], weights converted to `type` */
    uint64_t rng = 0x10c0ffee ^ (uint64_t)type ^ ((uint64_t)N << 20);
    size_t packed_bytes = loom_row_size(type, K) * (size_t)M;
    host_w = loom_malloc(sizeof(float) * (size_t)(K * M));
    host_b = loom_malloc(sizeof(float) * (size_t)(K * N));
    packed = loom_malloc(packed_bytes);
    if (!host_w || !host_b || !packed) {
        st = loom_error(LOOM_ERR_NOMEM, "cannot allocate host copies of the operands");
        goto done;
    }
    for (int64_t i = 0; i < K * M; i++)
        host_w[i] = rng_uniform(&rng);
    for (int64_t i = 0; i < K * N; i++)
        host_b[i] = rng_uniform(&rng);
    loom_type_traits_get(type)->from_float(host_w, packed, K * M);
    for (int c = 0; c < copies; c++)
        loom_tensor_set(w[c], packed, 0, packed_bytes);
    loom_tensor_set(b, host_b, 0, sizeof(float) * (size_t)(K * N));

    /* warm-up (also the run whose outputs are checked) */
    if ((st = loom_backend_graph_compute(be, g)) != LOOM_OK) goto done;
    r->max_err_ratio = check_outputs(w[0], host_b, out[0], K, M, N, &rng);

    double best = INFINITY, spent = 0;
    int reps = 0;
    while (reps < o->max_reps && (reps < o->min_reps || spent < o->min_time_s)) {
        int64_t t0 = loom_time_ns();
        if ((st = loom_backend_graph_compute(be, g)) != LOOM_OK) goto done;
        double s = (double)(loom_time_ns() - t0) * 1e-9;
        spent += s;
        if (s < best) best = s;
        reps++;
    }
    r->best_s = best / copies;
    r->reps = reps;

done:
    loom_free(host_w);
    loom_free(host_b);
    loom_free(packed);
    loom_free(w);
    loom_free(out);
    loom_buffer_free(buf);
    loom_ctx_free(ctx);
    return st;
}

/* name is in the comma-separated list (NULL: every name) */
static bool type_selected(const char *list, const char *name) {
    if (!list) return true;
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

static void print_size(char *buf, size_t n, double bytes) {
    if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
    else if (bytes >= 1024.0 * 1024)
        snprintf(buf, n, "%.1f MiB", bytes / (1024.0 * 1024));
    else
        snprintf(buf, n, "%.1f KiB", bytes / 1024.0);
}

int main(int argc, char **argv) {
    bench_opts o = {.size = 4096, .tokens = 512, .threads = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--small")) {
            o.small = true;
        } else if (!strcmp(a, "--types")) {
            if (!v) {
                fprintf(stderr, "matmul_bench: --types needs a list of type names\n");
                return 2;
            }
            o.types = v;
            i++;
        } else if (!strcmp(a, "--size") || !strcmp(a, "--tokens") || !strcmp(a, "--threads")) {
            if (!v || !parse_i64(v, &x)) {
                fprintf(stderr, "matmul_bench: %s needs a positive integer\n", a);
                return 2;
            }
            if (!strcmp(a, "--size")) o.size = x;
            if (!strcmp(a, "--tokens")) o.tokens = x;
            if (!strcmp(a, "--threads")) o.threads = (int)x;
            i++;
        } else {
            fprintf(stderr, "matmul_bench: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    bool size_given = false;
    for (int i = 1; i < argc; i++)
        size_given |= !strcmp(argv[i], "--size");
    if (o.small && !size_given) o.size = 512;
    if (o.size % 32 != 0) {
        fprintf(stderr, "matmul_bench: --size %lld is not a multiple of 32 (quant blocks)\n",
                (long long)o.size);
        return 2;
    }
    if (o.threads <= 0) o.threads = loom_n_cpus();
    o.min_time_s = o.small ? 0.05 : 1.0;
    o.min_reps = o.small ? 2 : 3;
    o.max_reps = o.small ? 10 : 100;
    size_t llc = loom__bench_llc_bytes();
    size_t mib = (size_t)1 << 20;
    o.stream_bytes = 4 * llc;
    if (o.stream_bytes < 512 * mib) o.stream_bytes = 512 * mib;
    if (o.stream_bytes > 1024 * mib) o.stream_bytes = 1024 * mib;
    if (o.small) o.stream_bytes = 256 * mib;

    loom_threadpool *tp = loom_threadpool_new(o.threads);
    if (!tp) {
        fprintf(stderr, "matmul_bench: cannot start %d threads: %s\n", o.threads,
                loom_last_error());
        return 1;
    }
    int runs = o.small ? 5 : 10;
    loom__bench_bandwidth bw;
    loom__bench_peak peak;
    if (loom__bench_measure_bandwidth(tp, o.stream_bytes, runs, &bw) != LOOM_OK) {
        fprintf(stderr, "matmul_bench: %s\n", loom_last_error());
        loom_threadpool_free(tp);
        return 1;
    }
    loom__bench_measure_fma_peak(tp, runs, &peak);
    loom__bench_peak i8peak;
    const bool have_i8 = loom__bench_measure_int8_peak(tp, runs, &i8peak);

    loom_backend_t be = loom_cpu_backend_new(o.threads);
    if (!be) {
        fprintf(stderr, "matmul_bench: cannot create the CPU backend: %s\n", loom_last_error());
        loom_threadpool_free(tp);
        return 1;
    }

    char s1[32], s2[32];
    print_size(s1, sizeof s1, (double)bw.bytes);
    print_size(s2, sizeof s2, (double)llc);
    printf("loom matmul_bench: %d threads, CPU kernels: %s%s\n", o.threads, loom_cpu_simd_name(),
           o.small ? " (--small)" : "");
    printf("memory bandwidth: read %.1f GB/s, copy %.1f GB/s (%s buffer, LLC %s, best of %d)\n",
           bw.read_gbps, bw.copy_gbps, s1, llc ? s2 : "unknown", bw.runs);
    printf("FMA peak:         %.1f GFLOP/s (%s, %d threads, best of %d)\n", peak.gflops, peak.isa,
           o.threads, peak.runs);
    if (have_i8)
        printf("int8 peak:        %.1f GOP/s (%s, %d threads, best of %d)\n", i8peak.gflops,
               i8peak.isa, o.threads, i8peak.runs);
    printf("\nMUL_MAT %lldx%lld weights (M x K) x activations (K x N); time = best run; "
           "N=1 streams %s of weights\n\n",
           (long long)o.size, (long long)o.size, s1);
    printf("%-6s %5s %5s %11s %10s %9s %8s %8s %7s %6s %5s\n", "type", "N", "path", "time(ms)",
           "GFLOP/s", "GB/s", "%bw", "%peak", "%i8pk", "reps", "check");

    static const loom_type types[] = {
        LOOM_TYPE_F32,  LOOM_TYPE_F16,    LOOM_TYPE_BF16,   LOOM_TYPE_Q8_0,
        LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_1,   LOOM_TYPE_Q5_0,   LOOM_TYPE_Q5_1,
        LOOM_TYPE_Q2_K, LOOM_TYPE_Q3_K,   LOOM_TYPE_Q4_K,   LOOM_TYPE_Q5_K,
        LOOM_TYPE_Q6_K, LOOM_TYPE_IQ4_NL, LOOM_TYPE_IQ4_XS, LOOM_TYPE_MXFP4};
    int failed = 0;
    bool over_limit = false;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        if (!type_selected(o.types, loom_type_name(types[ti]))) continue;
        if (o.size % loom_blck_size(types[ti])) {
            printf("%-6s  (skipped: K = %lld is not a multiple of its %lld-element block)\n",
                   loom_type_name(types[ti]), (long long)o.size,
                   (long long)loom_blck_size(types[ti]));
            continue;
        }
        int64_t ns[2] = {1, o.tokens};
        const bool quant = loom_type_traits_get(types[ti])->is_quantized;
        for (int k = 0; k < (o.tokens == 1 ? 1 : 2); k++) {
            /* quantised, N > 1: the int8 GEMM and the f32 one, two alternating rounds;
             * BF16 with AVX512_BF16: the BF16 GEMM and the f32 one (LOOM_CPU_BGEMM=0) */
            const bool bf16 = types[ti] == LOOM_TYPE_BF16 && loom__cpu_has_avx512bf16() &&
                              !strcmp(loom_cpu_simd_name(), "avx512");
            const char *off_env = bf16 ? "LOOM_CPU_BGEMM" : "LOOM_CPU_QGEMM";
            const int npaths = (quant || bf16) && ns[k] > 1 ? 2 : 1;
            case_result rs[2];
            loom_status st = LOOM_OK;
            for (int round = 0; round < (npaths > 1 ? 3 : 1) && st == LOOM_OK; round++) {
                for (int pi = 0; pi < npaths && st == LOOM_OK; pi++) {
                    case_result r;
                    if (pi == 1) setenv(off_env, "0", 1);
                    st = run_case(be, &o, types[ti], ns[k], &r);
                    unsetenv(off_env);
                    if (round == 0 || r.best_s < rs[pi].best_s) {
                        r.max_err_ratio = round == 0 || r.max_err_ratio > rs[pi].max_err_ratio
                                              ? r.max_err_ratio
                                              : rs[pi].max_err_ratio;
                        rs[pi] = r;
                    } else if (r.max_err_ratio > rs[pi].max_err_ratio) {
                        rs[pi].max_err_ratio = r.max_err_ratio;
                    }
                }
            }
            if (st != LOOM_OK) {
                fprintf(stderr, "matmul_bench: %s N=%lld: %s (%s)\n", loom_type_name(types[ti]),
                        (long long)ns[k], loom_last_error(), loom_status_str(st));
                failed++;
                continue;
            }
            /* the bandwidth of a shared machine drifts: N=1 rows are held to the larger of
             * the first measurement and one taken right after the row's runs */
            double read_gbps = bw.read_gbps;
            loom__bench_bandwidth bw_now;
            if (ns[k] == 1 &&
                loom__bench_measure_bandwidth(tp, o.stream_bytes, o.small ? 2 : 4, &bw_now) ==
                    LOOM_OK &&
                bw_now.read_gbps > read_gbps)
                read_gbps = bw_now.read_gbps;
            for (int pi = 0; pi < npaths; pi++) {
                const case_result r = rs[pi];
                double flops = 2.0 * (double)o.size * (double)o.size * (double)ns[k];
                double gflops = flops / r.best_s * 1e-9;
                double gbps = (r.weight_bytes + r.act_bytes) / r.best_s * 1e-9;
                bool ok = r.max_err_ratio <= 1.0;
                failed += !ok;
                char bwf[16] = "", pkf[16] = "", i8f[16] = "";
                if (npaths > 1 && pi == 0 && have_i8 && !bf16)
                    snprintf(i8f, sizeof i8f, "%.1f%%", 100.0 * gflops / i8peak.gflops);
                double frac = ns[k] == 1 ? gbps / read_gbps : gflops / peak.gflops;
                over_limit |= frac > (bf16 && pi == 0 ? 2.0 : 1.0);
                if (ns[k] == 1)
                    snprintf(bwf, sizeof bwf, "%.0f%%", 100.0 * frac);
                else
                    snprintf(pkf, sizeof pkf, "%.1f%%", 100.0 * frac);
                /* LOOM_CPU_QGEMM=0: the F32 GEMM from 32 columns, the integer dots below */
                const char *pname = npaths == 1           ? "-"
                                    : pi == 0 && bf16     ? "bf16"
                                    : pi == 0             ? "int8"
                                    : ns[k] >= 32 || bf16 ? "f32"
                                                          : "dots";
                printf("%-6s %5lld %5s %11.3f %10.1f %9.1f %8s %8s %7s %6d %5s\n",
                       loom_type_name(types[ti]), (long long)ns[k], pname, r.best_s * 1e3, gflops,
                       gbps, bwf, pkf, i8f, r.reps, ok ? "ok" : "FAIL");
                fflush(stdout);
            }
        }
    }
    printf("\n%%bw: GB/s over the read bandwidth (N=1; the larger of the first figure and one\n"
           "measured right after that row); %%peak: GFLOP/s over FMA peak;\n"
           "%%i8pk (int8 path): the same 2*M*N*K ops/s over the measured int8 (VNNI) peak;\n"
           "the bf16 path (vdpbf16ps, two multiply-adds per lane) tops out at 200%% of the FMA "
           "peak.\n");
    if (over_limit)
        printf("note: a fraction above 100%% means a machine limit was measured low (other load "
               "on the machine during its short runs) or the weights stayed in cache.\n");
    loom_backend_free(be);
    loom_threadpool_free(tp);
    if (failed) {
        fprintf(stderr, "matmul_bench: %d case(s) failed\n", failed);
        return 1;
    }
    return 0;
}
