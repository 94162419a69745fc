/*
 * `--dist mpi` for the model subcommands: MPI init, the local device from --devices (one
 * per rank), the dist devices as the session's explicit devices (tensor parallelism across
 * ranks), and the per-rank memory line (include/loom/dist.h).
 */
#ifndef LOOM_TOOLS_DIST_CLI_H
#define LOOM_TOOLS_DIST_CLI_H

#include <stdio.h>

#include "loom/dist.h"
#include "tools/model_cli.h"

typedef struct loom_cli_dist {
    loom_dist *d; /* NULL: not distributed */
    int rank, size;
    loom_dev_t devs[16];
    int n_devs;
    /* hybrid (several local devices, -sm layer): each rank's stage runs on a meta device
     * over its local devices, whose weights split by the rules of the opened model */
    loom_dev_t local[16];
    int n_local;
    loom_dev_t meta;
    const loom_model_opts *o; /* its gguf is read at the first split-state question */
    loom_rules *rules;
    loom_hparams hp;
} loom_cli_dist;

/* Whether `v` names a --dist value ("mpi"); prints the error naming cmd otherwise. */
bool loom_cli_dist_parse(const char *cmd, const char *v);
/* Starts MPI and points o's session at the dist devices; prints the error and returns
 * false on a refusal (not under a launcher, built without MPI, -sm none, several devices
 * per rank with -sm tensor). Several devices per rank: the hybrid, -sm layer (the default
 * then) over dist devices whose local one is a meta device over them (cd->meta). */
bool loom_cli_dist_setup(loom_cli_dist *cd, loom_model_opts *o, const char *cmd);
/* Every rank: whether every rank's `ok` was true; a rank that was fine prints the failing
 * rank's message (which that rank printed itself). Without dist, returns ok. */
bool loom_cli_dist_agree(loom_cli_dist *cd, bool ok, const char *cmd);
/* On every rank but 0, stdout goes to /dev/null (rank 0 prints what all ranks computed);
 * a rank that cannot redirect it aborts every rank. Without dist, nothing. */
void loom_cli_dist_quiet_followers(loom_cli_dist *cd, const char *cmd);
/* Every rank: whether every rank's session has rank 0's shape (model hyperparameters,
 * context, batch, split mode, KV type and placement), so all build the same graphs in step;
 * a rank that differs is named. Then (loom_dist_comm_setup) picks how device memory
 * crosses ranks: NCCL for CUDA members, else host memory and MPI. Without dist, true. */
bool loom_cli_dist_same_session(loom_cli_dist *cd, loom_session *s, const loom_model_opts *o,
                                const char *cmd);
/* One line on f: this rank's resident memory (anonymous and file-backed, now and peak) and
 * its device's weight/KV/compute bytes. */
void loom_cli_dist_print_rank_memory(const loom_cli_dist *cd, loom_session *s, FILE *f);
void loom_cli_dist_free(loom_cli_dist *cd);

#endif
