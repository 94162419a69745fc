/* allreduce_bench's MPI mode (allreduce_mpi.c): sizes min..max growing 4x, iters per timed
 * run (0: by size), the best of reps runs. Returns the exit status. */
#ifndef LOOM_BENCH_ALLREDUCE_MPI_H
#define LOOM_BENCH_ALLREDUCE_MPI_H

#include <stddef.h>

int loom_bench_allreduce_mpi(size_t min_bytes, size_t max_bytes, int iters, int reps);

#endif
