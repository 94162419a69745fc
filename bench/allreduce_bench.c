/*
 * allreduce_bench: the AllReduce ladder on sim devices, in the style of nccl-tests'
 * all_reduce_perf. For each algorithm (ring, butterfly, host, and auto, which shows what
 * the ladder picks) and device count (default 2, 4, 8), sizes from 4 B to 256 MiB growing
 * 4x, it prints the time measured on this machine, the algorithm bandwidth
 * (algbw = size / time) and the bus bandwidth (busbw = algbw * 2(n-1)/n, the per-link rate
 * an ideal ring would need), and the time the sim link model projects for the same
 * communication steps on NVLink 4 and PCIe 4 links (loom_sim_link_time_us of the largest
 * transfer of each step, summed over the steps; transfers within a step run concurrently
 * on separate links, and the adds are not counted).
 *
 * Measured figures are of sim devices: worker threads doing memcpy and CPU adds, sharing
 * this machine's cores and memory bandwidth. They measure the reducer's overhead and the
 * algorithms' relative cost here, not a GPU's; the projections are the interconnect side.
 *
 *   allreduce_bench [--small] [--max-bytes N] [--min-bytes N] [--devices 2,4,8]
 *                   [--algos ring,butterfly,host,auto] [--iters N] [--reps N]
 *                   [--mem-budget N]
 *   mpirun -np N allreduce_bench --dist mpi [--small] [--max-bytes N] ...
 * --small: up to 1 MiB, fewer iterations, one repetition (CI). Sizes accept K/M/G
 * suffixes (binary). --reps: timed repetitions per point, the best reported (default 3:
 * the machine this runs on is shared, and the minimum is the least disturbed figure).
 * --mem-budget: host memory a configuration may use (tensors + scratch); configurations
 * above it are skipped with a note (default 6G, so the bench cannot drive a shared
 * machine into swapping).
 * --dist mpi: the AllReduce across MPI ranks (one CPU each) through the dist communicator
 * that `loom run --dist mpi` uses (allreduce_mpi.c), nccl-tests columns, from rank 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/allreduce_mpi.h"
#include "loom/reduce.h"
#include "loom/sim.h"

#define MAX_LIST 16

static size_t parse_size(const char *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || v < 0) return 0;
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024.0;
        break;
    case 'm':
    case 'M':
        v *= 1024.0 * 1024.0;
        break;
    case 'g':
    case 'G':
        v *= 1024.0 * 1024.0 * 1024.0;
        break;
    default:
        break;
    }
    return (size_t)v;
}

static int parse_int_list(const char *s, int *out, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (end == s) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static int parse_algo_list(const char *s, loom_allreduce_algo *out, int cap) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok && n < cap; tok = strtok(NULL, ",")) {
        if (loom_allreduce_algo_parse(tok, &out[n]) != LOOM_OK) return -1;
        n++;
    }
    return n;
}

static void fmt_size(size_t b, char *out, size_t cap) {
    if (b >= ((size_t)1 << 30) && b % ((size_t)1 << 30) == 0) {
        snprintf(out, cap, "%zuG", b >> 30);
    } else if (b >= ((size_t)1 << 20) && b % ((size_t)1 << 20) == 0) {
        snprintf(out, cap, "%zuM", b >> 20);
    } else if (b >= 1024 && b % 1024 == 0) {
        snprintf(out, cap, "%zuK", b >> 10);
    } else {
        snprintf(out, cap, "%zu", b);
    }
}

/* Device scratch + host staging (bytes, all devices) an algorithm needs for one size. */
static size_t scratch_bytes(loom_allreduce_algo a, int n, size_t size) {
    int p = 1, logp = 0;
    while (p * 2 <= n)
        p *= 2, logp++;
    switch (a) {
    case LOOM_ALLREDUCE_RING:
        return (size_t)n * (size / (size_t)n + 128);
    case LOOM_ALLREDUCE_BUTTERFLY:
        return (size_t)p * (size_t)(logp + (n > p)) * size;
    case LOOM_ALLREDUCE_HOST: {
        size_t chunk = size < ((size_t)4 << 20) ? size : ((size_t)4 << 20);
        return 2 * (size_t)(n + 1) * chunk;
    }
    default:
        return 0;
    }
}

typedef struct bench_opts {
    size_t min_bytes, max_bytes, mem_budget;
    int devices[MAX_LIST], n_devices;
    loom_allreduce_algo algos[MAX_LIST];
    int n_algos;
    int iters; /* 0: by size */
    int reps;  /* timed repetitions per point; the best is reported */
    bool small;
} bench_opts;

static int iters_for(const bench_opts *o, size_t size) {
    if (o->iters > 0) return o->iters;
    size_t budget = o->small ? ((size_t)8 << 20) : ((size_t)256 << 20); /* bytes per point */
    size_t it = budget / (size ? size : 1);
    size_t lo = o->small ? 2 : 3, hi = o->small ? 20 : 100;
    if (it < lo) it = lo;
    if (it > hi) it = hi;
    return (int)it;
}

typedef struct bench_row {
    bool done;
    char note[160]; /* skipped/failed: why */
    double us;      /* best of the repetitions */
    double proj_nv, proj_pc;
    loom_allreduce_algo used;
    size_t steps;
} bench_row;

#define MAX_SIZES 32

/* One measurement: warm-up, then the best of o->reps timed runs of iters calls. */
static void measure(const bench_opts *o, loom_reducer *r, loom_tensor **t, size_t size,
                    const loom_sim_link *nvl, const loom_sim_link *pcie, bench_row *row) {
    int iters = iters_for(o, size);
    loom_status s = loom_reducer_allreduce(r, t, NULL); /* builds the plan, grows scratch */
    loom_reducer_synchronize(r);
    row->us = -1;
    for (int rep = 0; rep < o->reps && s == LOOM_OK; rep++) {
        int64_t t0 = loom_time_us();
        for (int it = 0; it < iters && s == LOOM_OK; it++)
            s = loom_reducer_allreduce(r, t, NULL);
        loom_reducer_synchronize(r);
        double us = (double)(loom_time_us() - t0) / iters;
        if (row->us < 0 || us < row->us) row->us = us;
    }
    if (s != LOOM_OK) {
        snprintf(row->note, sizeof row->note, "failed: %s", loom_last_error());
        return;
    }
    loom_reducer_stats st;
    loom_reducer_get_stats(r, &st);
    uint64_t steps[4096];
    row->steps = loom_reducer_last_steps(r, steps, 4096);
    for (size_t k = 0; k < row->steps && k < 4096; k++) {
        row->proj_nv += loom_sim_link_time_us(nvl, steps[k]);
        row->proj_pc += loom_sim_link_time_us(pcie, steps[k]);
    }
    row->used = st.last_algo;
    row->done = true;
}

/* Every algorithm at every size on n sim devices. Sizes are the outer loop, so the
 * algorithms compared at one size are measured close together in time (this machine's
 * load varies); the table is printed per algorithm afterwards. */
static int run_devices(const bench_opts *o, int n, const loom_sim_link *nvl,
                       const loom_sim_link *pcie) {
    char spec[32];
    snprintf(spec, sizeof spec, "sim:%d", n);
    loom_reg_t reg = NULL;
    if (loom_sim_reg_new_from_spec(spec, &reg) != LOOM_OK) {
        fprintf(stderr, "allreduce_bench: %s: %s\n", spec, loom_last_error());
        return 1;
    }
    loom_backend_t be[LOOM_REDUCE_MAX_DEVICES] = {0};
    loom_ctx *ctx[LOOM_REDUCE_MAX_DEVICES] = {0};
    loom_buffer_t buf[LOOM_REDUCE_MAX_DEVICES] = {0};
    loom_tensor *whole[LOOM_REDUCE_MAX_DEVICES] = {0};
    loom_reducer *red[MAX_LIST] = {0};
    static bench_row rows[MAX_LIST][MAX_SIZES];
    memset(rows, 0, sizeof rows);
    int rc = 0;
    size_t max_bytes = o->max_bytes / 4 * 4;
    while (max_bytes > 4 && (size_t)n * max_bytes > o->mem_budget / 2)
        max_bytes /= 4;
    for (int j = 0; j < n && rc == 0; j++) {
        be[j] = loom_dev_init(loom_reg_dev_get(reg, (size_t)j), NULL);
        loom_ctx_params cp = {.mem_size = 64 * loom_tensor_overhead(), .no_alloc = true};
        ctx[j] = loom_ctx_new(cp);
        if (!be[j] || !ctx[j]) {
            fprintf(stderr, "allreduce_bench: %s\n", loom_last_error());
            rc = 1;
            break;
        }
        whole[j] = loom_new_tensor_1d(ctx[j], LOOM_TYPE_F32, (int64_t)(max_bytes / 4));
        buf[j] = whole[j] ? loom_alloc_ctx_tensors(ctx[j], loom_backend_default_buft(be[j])) : NULL;
        if (!buf[j]) {
            fprintf(stderr, "allreduce_bench: %d x %zu bytes: %s\n", n, max_bytes,
                    loom_last_error());
            rc = 1;
            break;
        }
        loom_buffer_clear(buf[j], 0); /* zeros: sums stay finite however many iterations */
    }
    for (int ai = 0; ai < o->n_algos && rc == 0; ai++) {
        loom_reducer_params p = loom_reducer_params_default();
        p.algorithm = o->algos[ai];
        red[ai] = loom_reducer_new(be, n, &p);
        if (!red[ai]) {
            fprintf(stderr, "allreduce_bench: reducer: %s\n", loom_last_error());
            rc = 1;
        }
    }
    int n_sizes = 0;
    for (size_t size = o->min_bytes; rc == 0 && size <= max_bytes && n_sizes < MAX_SIZES;
         size *= 4, n_sizes++) {
        loom_ctx_params cp = {.mem_size = 2 * (size_t)n * loom_tensor_overhead() + 1024,
                              .no_alloc = true};
        loom_ctx *vctx = loom_ctx_new(cp);
        loom_tensor *t[LOOM_REDUCE_MAX_DEVICES] = {0};
        for (int j = 0; j < n && vctx; j++) {
            t[j] = loom_view_1d(vctx, whole[j], (int64_t)(size / 4), 0);
            if (t[j] && !t[j]->buffer) loom_buffer_init_view(t[j]);
        }
        for (int ai = 0; ai < o->n_algos; ai++) {
            bench_row *row = &rows[ai][n_sizes];
            loom_allreduce_algo used = loom_reducer_choose(red[ai], size);
            size_t need = (size_t)n * max_bytes + scratch_bytes(used, n, size);
            if (!t[n - 1]) {
                snprintf(row->note, sizeof row->note, "failed: %s", loom_last_error());
            } else if (need > o->mem_budget) {
                snprintf(row->note, sizeof row->note,
                         "skipped: needs %.1f GiB of host memory (--mem-budget %.1f GiB)",
                         (double)need / (1 << 30), (double)o->mem_budget / (1 << 30));
            } else {
                measure(o, red[ai], t, size, nvl, pcie, row);
            }
        }
        loom_ctx_free(vctx);
    }
    for (int ai = 0; ai < o->n_algos && rc == 0; ai++) {
        size_t size = o->min_bytes;
        for (int si = 0; si < n_sizes; si++, size *= 4) {
            const bench_row *row = &rows[ai][si];
            char sz[32];
            fmt_size(size, sz, sizeof sz);
            if (!row->done) {
                printf("%-9s %2d %10s %10zu   %s\n", loom_allreduce_algo_name(o->algos[ai]), n, sz,
                       size / 4, row->note);
                continue;
            }
            double algbw = (double)size / (row->us * 1e-6) / 1e9;
            double busbw = algbw * 2.0 * (n - 1) / n;
            printf("%-9s %2d %10s %10zu %11.1f %9.3f %9.3f %10.1f %10.1f  %-9s %5zu\n",
                   loom_allreduce_algo_name(o->algos[ai]), n, sz, size / 4, row->us, algbw, busbw,
                   row->proj_nv, row->proj_pc, loom_allreduce_algo_name(row->used), row->steps);
        }
    }
    fflush(stdout);
    for (int ai = 0; ai < o->n_algos; ai++)
        loom_reducer_free(red[ai]);
    for (int j = 0; j < n; j++) {
        loom_buffer_free(buf[j]);
        loom_ctx_free(ctx[j]);
        loom_backend_free(be[j]);
    }
    loom_sim_reg_free(reg);
    return rc;
}

static void usage(void) {
    fprintf(stderr, "usage: allreduce_bench [--small] [--max-bytes N] [--min-bytes N] "
                    "[--devices 2,4,8] [--algos ring,butterfly,host,auto] [--iters N] [--reps N] "
                    "[--mem-budget N] [--dist mpi]\n");
}

int main(int argc, char **argv) {
    bench_opts o = {
        .min_bytes = 4, .max_bytes = (size_t)256 << 20, .mem_budget = (size_t)6 << 30, .reps = 3};
    o.n_devices = 3;
    o.devices[0] = 2, o.devices[1] = 4, o.devices[2] = 8;
    o.n_algos = 4;
    o.algos[0] = LOOM_ALLREDUCE_RING, o.algos[1] = LOOM_ALLREDUCE_BUTTERFLY;
    o.algos[2] = LOOM_ALLREDUCE_HOST, o.algos[3] = LOOM_ALLREDUCE_AUTO;
    bool max_given = false, dist = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--small") == 0) {
            o.small = true;
        } else if (strcmp(a, "--max-bytes") == 0 && v) {
            o.max_bytes = parse_size(v), max_given = true, i++;
        } else if (strcmp(a, "--min-bytes") == 0 && v) {
            o.min_bytes = parse_size(v), i++;
        } else if (strcmp(a, "--mem-budget") == 0 && v) {
            o.mem_budget = parse_size(v), i++;
        } else if (strcmp(a, "--reps") == 0 && v) {
            o.reps = atoi(v), i++;
        } else if (strcmp(a, "--iters") == 0 && v) {
            o.iters = atoi(v), i++;
        } else if (strcmp(a, "--devices") == 0 && v) {
            o.n_devices = parse_int_list(v, o.devices, MAX_LIST), i++;
        } else if (strcmp(a, "--dist") == 0 && v && strcmp(v, "mpi") == 0) {
            dist = true, i++;
        } else if (strcmp(a, "--algos") == 0 && v) {
            o.n_algos = parse_algo_list(v, o.algos, MAX_LIST), i++;
        } else {
            usage();
            return a[0] == '-' && a[1] == 'h' ? 0 : 2;
        }
    }
    if (o.small && !max_given) o.max_bytes = (size_t)1 << 20;
    if (o.small && o.reps > 1) o.reps = 1;
    if (o.n_devices <= 0 || o.n_algos <= 0 || o.min_bytes < 4 || o.max_bytes < o.min_bytes ||
        o.reps < 1) {
        fprintf(stderr, "allreduce_bench: bad --devices, --algos, --min-bytes or --max-bytes\n");
        usage();
        return 2;
    }
    for (int i = 0; i < o.n_devices; i++) {
        if (o.devices[i] < 2 || o.devices[i] > LOOM_REDUCE_MAX_DEVICES) {
            fprintf(stderr, "allreduce_bench: --devices: %d is outside 2..%d\n", o.devices[i],
                    LOOM_REDUCE_MAX_DEVICES);
            return 2;
        }
    }
    o.min_bytes = o.min_bytes / 4 * 4;
    if (dist) return loom_bench_allreduce_mpi(o.min_bytes, o.max_bytes, o.iters, o.reps);
    loom_sim_link nvl, pcie;
    loom_sim_link_preset("nvlink", &nvl);
    loom_sim_link_preset("pcie4", &pcie);

    printf("# loom allreduce_bench: F32 sum, in place, sim devices; time measured on this "
           "machine (%d cpus),\n",
           loom_n_cpus());
    printf("# projected link time: nvlink %.0f GB/s %.0f us, pcie4 %.0f GB/s %.0f us per "
           "transfer\n",
           nvl.bandwidth_gbps, nvl.latency_us, pcie.bandwidth_gbps, pcie.latency_us);
    printf("#%-8s %2s %10s %10s %11s %9s %9s %10s %10s  %-9s %5s\n", "algo", "n", "size", "count",
           "time(us)", "algbw", "busbw", "nvlink(us)", "pcie4(us)", "used", "steps");
    printf("#%-8s %2s %10s %10s %11s %9s %9s %10s %10s  %-9s %5s\n", "", "", "(B)", "(f32)",
           "measured", "(GB/s)", "(GB/s)", "projected", "projected", "", "");
    int rc = 0;
    for (int i = 0; i < o.n_devices && rc == 0; i++) {
        rc = run_devices(&o, o.devices[i], &nvl, &pcie);
    }
    return rc;
}
