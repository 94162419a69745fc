/*
 * affinity_bench: the CPU backend's F32 matrix-vector product (token generation's shape,
 * bound by memory bandwidth) with its worker threads unpinned and pinned by each
 * --cpu-affinity policy (compact, spread, numa). The graph multiplies several copies of a
 * K x K weight so the working set exceeds the last-level cache. Per policy: best seconds
 * per matvec, GB/s of weight streamed and GFLOP/s; the first outputs are checked against a
 * double-precision dot product (a wrong result fails the run). The topology and whether
 * binding happened are printed first (a synthetic LOOM_TOPOLOGY skips binding).
 *
 *   affinity_bench [--size K] [--copies C] [--threads T] [--small]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/loom.h"
#include "loom/topo.h"

static void usage(FILE *f) {
    fprintf(f, "usage: affinity_bench [--size K] [--copies C] [--threads T] [--small]\n"
               "  --size K     weight rows and columns (default 4096)\n"
               "  --copies C   weights per graph (default 4: 256 MiB at K = 4096)\n"
               "  --threads T  CPU threads (default: all cores)\n"
               "  --small      K = 512, 2 copies, 3 repetitions (CI)\n");
}

int main(int argc, char **argv) {
    int64_t K = 4096;
    int copies = 4, threads = 0, reps = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) {
            K = 512;
            copies = 2;
            reps = 3;
        } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            K = atol(argv[++i]);
        } else if (!strcmp(argv[i], "--copies") && i + 1 < argc) {
            copies = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else {
            usage(strcmp(argv[i], "-h") && strcmp(argv[i], "--help") ? stderr : stdout);
            return strcmp(argv[i], "-h") && strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (K < 8 || copies < 1 || copies > 64 || threads < 0) {
        usage(stderr);
        return 2;
    }
    if (threads == 0) threads = loom_n_cpus();
    loom_topo *t = loom_topo_get();
    if (!t) {
        fprintf(stderr, "affinity_bench: %s\n", loom_last_error());
        return 1;
    }
    char why[256];
    loom_affinity def = loom_topo_affinity_default(t, why, sizeof why);
    printf("topology: %s: %d NUMA node(s), %d cores, %d PUs%s; default policy %s (%s)\n",
           loom_topo_source(t), loom_topo_count(t, LOOM_TOPO_NUMA),
           loom_topo_count(t, LOOM_TOPO_CORE), loom_topo_count(t, LOOM_TOPO_PU),
           loom_topo_is_this_system(t) ? "" : " (not this machine: binding skipped)",
           loom_affinity_name(def), why);
    printf("F32 matvec, %lld x %lld weight x %d copies (%.1f MiB), %d threads\n\n", (long long)K,
           (long long)K, copies, (double)(K * K * 4 * copies) / (1 << 20), threads);
    printf(
        "| policy  | ms/matvec | GB/s   | GFLOP/s |\n| ---     | ---:      | ---:   | ---:    |\n");

    size_t wbytes = (size_t)(K * K) * sizeof(float);
    size_t mem = (wbytes + (size_t)K * 8 + 4096) * (size_t)copies + (size_t)K * 4 + (1u << 20);
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = mem});
    if (!ctx) {
        fprintf(stderr, "affinity_bench: cannot allocate %.1f MiB\n", (double)mem / (1 << 20));
        return 1;
    }
    loom_tensor *x = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, K);
    float *xd = x->data;
    for (int64_t i = 0; i < K; i++)
        xd[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    loom_graph *g = loom_graph_new(ctx, 4 * (size_t)copies + 16);
    loom_tensor *w0 = NULL, *y0 = NULL;
    for (int c = 0; c < copies; c++) {
        loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, K, K);
        float *wd = w->data;
        for (int64_t i = 0; i < K * K; i++)
            wd[i] = (float)(((i + c) * 7919) % 29) / 29.0f - 0.5f;
        loom_tensor *y = loom_mul_mat(ctx, w, x);
        if (!g || !w || !y || loom_graph_build_forward(g, y) != LOOM_OK) {
            fprintf(stderr, "affinity_bench: %s\n", loom_last_error());
            return 1;
        }
        if (c == 0) {
            w0 = w;
            y0 = y;
        }
    }
    static const loom_affinity pol[] = {LOOM_AFFINITY_NONE, LOOM_AFFINITY_COMPACT,
                                        LOOM_AFFINITY_SPREAD, LOOM_AFFINITY_NUMA};
    int bad = 0;
    for (int p = 0; p < 4; p++) {
        loom_cpu_set_affinity(pol[p]);
        loom_backend_t be = loom_cpu_backend_new(threads);
        if (!be) {
            fprintf(stderr, "affinity_bench: %s\n", loom_last_error());
            return 1;
        }
        double best = 1e30;
        for (int r = 0; r < reps + 1; r++) { /* the first run starts (and pins) the pool */
            int64_t t0 = loom_time_us();
            if (loom_backend_graph_compute(be, g) != LOOM_OK) {
                fprintf(stderr, "affinity_bench: %s\n", loom_last_error());
                return 1;
            }
            double s = (double)(loom_time_us() - t0) * 1e-6 / copies;
            if (r > 0 && s < best) best = s;
        }
        loom_backend_free(be);
        /* check the first outputs of the first copy */
        const float *wd = w0->data, *yd = y0->data;
        for (int64_t m = 0; m < 8 && m < K; m++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                ref += (double)wd[m * K + k] * xd[k];
                mag += fabs((double)wd[m * K + k] * xd[k]);
            }
            if (fabs(yd[m] - ref) > 1e-5 * mag + 1e-6) {
                fprintf(stderr, "affinity_bench: %s: y[%lld] = %g, expected %g\n",
                        loom_affinity_name(pol[p]), (long long)m, yd[m], ref);
                bad = 1;
            }
        }
        printf("| %-7s | %9.3f | %6.2f | %7.2f |\n", loom_affinity_name(pol[p]), best * 1e3,
               (double)wbytes / best * 1e-9, 2.0 * (double)(K * K) / best * 1e-9);
    }
    loom_cpu_set_affinity(LOOM_AFFINITY_DEFAULT);
    loom_ctx_free(ctx);
    return bad;
}
