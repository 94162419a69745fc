/*
 * allreduce_bench --dist mpi: the AllReduce over MPI ranks, as the meta device runs it across
 * processes (a reducer over the dist devices MPI0..MPI{N-1}, whose communicator is
 * MPI_Allreduce on each rank's host slice). Run under mpirun; rank 0 prints nccl-tests'
 * all_reduce_perf columns: size, count, type, redop, time, algbw, busbw (algbw x
 * 2(N-1)/N) and #wrong (elements of a checked reduction that differ from the exact sum).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/allreduce_mpi.h"
#include "loom/cpu.h"
#include "loom/dist.h"
#include "loom/reduce.h"

static int fail(loom_dist *d, const char *what) {
    fprintf(stderr, "allreduce_bench: rank %d: %s: %s\n", loom_dist_rank(d), what,
            loom_last_error());
    loom_dist_abort(d, 1); /* the other ranks are inside collectives */
    return 1;
}

int loom_bench_allreduce_mpi(size_t min_bytes, size_t max_bytes, int iters, int reps) {
    loom_dist *d = NULL;
    if (loom_dist_init(&d)) {
        fprintf(stderr, "allreduce_bench: %s\n", loom_last_error());
        return 2;
    }
    const int rank = loom_dist_rank(d), n = loom_dist_size(d);
    loom_dev_t devs[16];
    int nd = 0;
    loom_backend_t be[16] = {0};
    loom_buffer_t buf[16] = {0};
    loom_tensor *t[16] = {0};
    if (loom_dist_devices(d, loom_cpu_dev(), 1, devs, 16, &nd)) return fail(d, "devices");
    if (n < 2) {
        fprintf(stderr, "allreduce_bench: --dist mpi needs at least 2 ranks (mpirun -np N)\n");
        loom_dist_free(d);
        return 2;
    }
    for (int j = 0; j < n; j++)
        if (!(be[j] = loom_dev_init(devs[j], NULL))) return fail(d, "backend");
    loom_reducer *r = loom_reducer_new(be, n, NULL);
    if (!r) return fail(d, "reducer");
    if (!loom_reducer_has_comm(r)) {
        loom_error(LOOM_ERR_INTERNAL, "the reducer did not find the MPI communicator");
        return fail(d, "reducer");
    }
    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 64 * loom_tensor_overhead(), .no_alloc = true});
    float *host = malloc(max_bytes);
    if (!ctx || !host) return fail(d, "host memory");
    if (rank == 0) {
        printf("# loom allreduce_bench --dist mpi: F32 sum, in place, %d ranks (one CPU each), "
               "MPI_Allreduce through the dist communicator\n",
               n);
        printf("#%11s %12s %8s %6s %10s %9s %9s %7s\n", "size", "count", "type", "redop", "time",
               "algbw", "busbw", "#wrong");
        printf("#%11s %12s %8s %6s %10s %9s %9s %7s\n", "(B)", "(elements)", "", "", "(us)",
               "(GB/s)", "(GB/s)", "");
    }
    int rc = 0;
    for (size_t size = min_bytes; size <= max_bytes; size *= 4) {
        int64_t count = (int64_t)(size / sizeof(float));
        for (int j = 0; j < n; j++) {
            loom_buffer_free(buf[j]);
            buf[j] = loom_buft_alloc_buffer(loom_dev_buffer_type(devs[j]), size);
            t[j] = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, count);
            if (!buf[j] || !t[j] || loom_buffer_alloc_tensor(buf[j], t[j], 0))
                return fail(d, "buffer");
        }
        loom_reducer_free(r); /* plans hold the old tensors */
        if (!(r = loom_reducer_new(be, n, NULL))) return fail(d, "reducer");
        /* checked once: rank k holds (k + 1) + (i % 7); the sum is n(n+1)/2 + n (i % 7) */
        for (int64_t i = 0; i < count; i++)
            host[i] = (float)(rank + 1) + (float)(i % 7);
        loom_tensor_set(t[rank], host, 0, size);
        if (loom_reducer_allreduce(r, t, NULL)) return fail(d, "allreduce");
        loom_reducer_synchronize(r);
        /* every rank's result, read by every rank (a read of member j is a broadcast from
         * rank j, so all ranks read the members in the same order) */
        long wrong = 0;
        for (int j = 0; j < n; j++) {
            loom_tensor_get(t[j], host, 0, size);
            for (int64_t i = 0; i < count; i++)
                wrong += host[i] != (float)(n * (n + 1) / 2) + (float)n * (float)(i % 7);
        }
        /* timed on zeros (they stay finite) */
        memset(host, 0, size);
        loom_tensor_set(t[rank], host, 0, size);
        int it = iters > 0 ? iters
                           : (int)((256u << 20) / size < 5     ? 5
                                   : (256u << 20) / size > 200 ? 200
                                                               : (256u << 20) / size);
        double best = -1;
        for (int rep = 0; rep < reps; rep++) {
            if (loom_reducer_allreduce(r, t, NULL))
                return fail(d, "allreduce"); /* lines ranks up */
            int64_t t0 = loom_time_us();
            for (int k = 0; k < it; k++)
                if (loom_reducer_allreduce(r, t, NULL)) return fail(d, "allreduce");
            loom_reducer_synchronize(r);
            double us = (double)(loom_time_us() - t0) / it;
            if (best < 0 || us < best) best = us;
        }
        if (rank == 0) {
            double algbw = best > 0 ? (double)size / best / 1e3 : 0;
            printf(" %11zu %12lld %8s %6s %10.1f %9.3f %9.3f %7ld\n", size, (long long)count,
                   "float", "sum", best, algbw, algbw * 2.0 * (n - 1) / n, wrong);
            fflush(stdout);
        }
        if (wrong) rc = 1;
    }
    loom_reducer_free(r);
    for (int j = 0; j < n; j++) {
        loom_buffer_free(buf[j]);
        loom_backend_free(be[j]);
    }
    loom_ctx_free(ctx);
    free(host);
    loom_dist_free(d);
    return rc;
}
