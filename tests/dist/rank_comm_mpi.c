/*
 * The rank communicator of dist/ (loom_dist_comm_setup, include/loom/dist.h) under mpirun,
 * with a stand-in for NCCL injected through loom_dist_set_rank_comm: the same table a CUDA
 * reg exports (LOOM_PROC_RANK_COMM), whose calls are recorded and whose data calls move
 * host memory with MPI on MPI_COMM_WORLD (dist/ uses its own duplicate), as NCCL would move
 * device memory. rank_comm_test.sh runs it on 2-4 local ranks; one mode per run:
 *
 *   bootstrap   rank 0 alone makes the id; every rank's init gets rank 0's bytes with
 *               (nranks, rank); a second setup does nothing
 *   id_fails    rank 0's id fails (FAKE_FAIL_ID=1): no rank enters init; in automatic mode
 *               every rank takes the host path with rank 0's error as the reason, with
 *               LOOM_DIST_NCCL=1 every rank returns that error
 *   init_fails  rank FAKE_FAIL_INIT_RANK's init fails: the host path on every rank
 *               (automatic) or its error on every rank (LOOM_DIST_NCCL=1), naming the rank;
 *               the ranks whose init succeeded free their communicator
 *   unusable    rank FAKE_UNUSABLE_RANK cannot join: every rank takes the host path, saying
 *               which rank and why; no id, no init anywhere
 *   other_version  rank FAKE_OTHER_VERSION_RANK has another version of the library: the
 *               host path on every rank, naming both versions
 *   forced_off  LOOM_DIST_NCCL=0: the host path, without asking the communicator
 *   required    LOOM_DIST_NCCL=1 and an unusable rank: every rank fails
 *   mismatch    the reducer's communicator (LOOM_PROC_COMM_*) sums through the rank
 *               communicator; ranks passing different counts fail on every rank (the
 *               next synchronize), before the communicator is called
 *   session MODE  stories260K through a session over the dist devices (-sm MODE: tensor or
 *               layer) gives the logits of a single CPU process, its AllReduces (tensor)
 *               or its activations (layer) going through the rank communicator
 * Prints "PASS rank R MODE" on success; any failed check prints "FAIL rank R: ..." and
 * exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/backend-impl.h"
#include "loom/cpu.h"
#include "loom/dist.h"
#include "loom/model.h"
#include "loom/reduce.h"
#include "loom/session.h"

static int my_rank = -1, n_ranks = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL rank %d: %s:%d: %s: ", my_rank, __FILE__, __LINE__, #cond);               \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            fflush(stdout);                                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---------------------------------------------------------------- the stand-in */

#define FAKE_ID_BYTES 128

static struct {
    int usable_calls, get_id_calls, init_calls, free_calls;
    int allreduce_calls, send_calls, recv_calls;
    int init_nranks, init_rank;
    unsigned char made_id[FAKE_ID_BYTES], init_id[FAKE_ID_BYTES];
} F;
static int fake_token; /* the communicator's address */

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : -1;
}

static bool f_usable(loom_dev_t local, char *why, size_t cap) {
    F.usable_calls++;
    if (env_int("FAKE_UNUSABLE_RANK") == my_rank) {
        snprintf(why, cap, "fake: no NCCL library on this node");
        return false;
    }
    if (local != loom_cpu_dev()) {
        snprintf(why, cap, "fake: not the test's device");
        return false;
    }
    return true;
}

static loom_status f_get_id(void *id, char *err, size_t cap) {
    F.get_id_calls++;
    if (env_int("FAKE_FAIL_ID") == 1) {
        snprintf(err, cap, "fake ncclGetUniqueId failed: unhandled system error");
        return LOOM_ERR_DEVICE;
    }
    /* bytes no other rank can guess: only a broadcast can bring them there */
    unsigned long x = (unsigned long)getpid() * 2654435761UL ^ (unsigned long)time(NULL);
    for (int i = 0; i < FAKE_ID_BYTES; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        F.made_id[i] = (unsigned char)(x >> 33);
    }
    memcpy(id, F.made_id, FAKE_ID_BYTES);
    return LOOM_OK;
}

static loom_status f_init(loom_dev_t local, int nranks, int rank, const void *id, void **comm,
                          char *err, size_t cap) {
    (void)local;
    F.init_calls++;
    F.init_nranks = nranks;
    F.init_rank = rank;
    memcpy(F.init_id, id, FAKE_ID_BYTES);
    if (env_int("FAKE_FAIL_INIT_RANK") == my_rank) {
        snprintf(err, cap,
                 "fake ncclCommInitRank failed: remote process exited or there was a "
                 "network error");
        return LOOM_ERR_DEVICE;
    }
    *comm = &fake_token;
    return LOOM_OK;
}

static loom_status f_allreduce(void *comm, void *data, size_t count, char *err, size_t cap) {
    F.allreduce_calls++;
    if (comm != &fake_token || count > (size_t)1 << 30) {
        snprintf(err, cap, "fake: bad arguments");
        return LOOM_ERR_INVALID_ARG;
    }
    MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return LOOM_OK;
}

static loom_status f_send(void *comm, const void *data, size_t bytes, int peer, char *err,
                          size_t cap) {
    (void)err, (void)cap, (void)comm;
    F.send_calls++;
    MPI_Send(data, (int)bytes, MPI_BYTE, peer, 99, MPI_COMM_WORLD);
    return LOOM_OK;
}

static loom_status f_recv(void *comm, void *data, size_t bytes, int peer, char *err, size_t cap) {
    (void)err, (void)cap, (void)comm;
    F.recv_calls++;
    MPI_Recv(data, (int)bytes, MPI_BYTE, peer, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return LOOM_OK;
}

static void f_free(void *comm) {
    if (comm == &fake_token) F.free_calls++;
}

#define FAKE_IFACE(version)                                                                        \
    {                                                                                              \
        .name = "fake-nccl " version, .id_size = FAKE_ID_BYTES, .usable = f_usable,                \
        .get_id = f_get_id, .init = f_init, .allreduce_f32 = f_allreduce, .send = f_send,          \
        .recv = f_recv, .free = f_free,                                                            \
    }

static const loom_rank_comm_iface fake = FAKE_IFACE("9.9.9");
/* the same, another version (FAKE_OTHER_VERSION_RANK) */
static const loom_rank_comm_iface fake_other = FAKE_IFACE("9.9.8");

/* ---------------------------------------------------------------- modes */

static bool contains(const char *s, const char *sub) {
    return s && strstr(s, sub) != NULL;
}

static void check_bootstrap(loom_dist *d, loom_status st) {
    CHECK(st == LOOM_OK, "setup: %s", loom_last_error());
    CHECK(loom_dist_uses_rank_comm(d), "not the rank communicator");
    char want[96];
    snprintf(want, sizeof want, "fake-nccl 9.9.9 across %d ranks", n_ranks);
    CHECK(!strcmp(loom_dist_comm_describe(d, NULL), want), "describe: '%s'",
          loom_dist_comm_describe(d, NULL));
    CHECK(F.get_id_calls == (my_rank == 0), "get_id called %d times", F.get_id_calls);
    CHECK(F.init_calls == 1, "init called %d times", F.init_calls);
    CHECK(F.init_nranks == n_ranks && F.init_rank == my_rank, "init(nranks %d, rank %d)",
          F.init_nranks, F.init_rank);
    /* rank 0's id, sent again outside dist: every rank's init must have had exactly it */
    unsigned char id0[FAKE_ID_BYTES];
    memcpy(id0, F.made_id, sizeof id0);
    MPI_Bcast(id0, FAKE_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK(memcmp(id0, F.init_id, FAKE_ID_BYTES) == 0, "init got other bytes than rank 0's id");
    int nonzero = 0;
    for (int i = 0; i < FAKE_ID_BYTES; i++)
        nonzero += id0[i] != 0;
    CHECK(nonzero > 64, "rank 0's id looks empty (%d nonzero bytes)", nonzero);
    /* again: nothing happens */
    CHECK(loom_dist_comm_setup(d) == LOOM_OK, "second setup: %s", loom_last_error());
    CHECK(F.get_id_calls == (my_rank == 0) && F.init_calls == 1, "second setup called again");
}

/* The id or an init failed on some rank: with LOOM_DIST_NCCL=1 every rank returns the
 * failing rank's message; in automatic mode every rank takes the host path with it as the
 * reason. */
static void check_setup_failure(loom_dist *d, loom_status st, const char *err, const char *msg) {
    const char *mode = getenv("LOOM_DIST_NCCL");
    const char *why = NULL;
    const char *desc = loom_dist_comm_describe(d, &why);
    CHECK(!loom_dist_uses_rank_comm(d), "the rank communicator was chosen");
    if (mode && !strcmp(mode, "1")) {
        CHECK(st == LOOM_ERR_DEVICE, "setup: %d", (int)st);
        CHECK(contains(err, msg) && contains(err, "fake-nccl 9.9.9 across"), "message: %s", err);
    } else {
        CHECK(st == LOOM_OK, "setup: %s", err);
        CHECK(!strcmp(desc, "MPI through host memory"), "describe '%s'", desc);
        CHECK(contains(why, msg) && contains(why, "fake-nccl 9.9.9 across") &&
                  contains(why, "failed, so not used"),
              "why '%s'", why);
    }
}

static void check_host_path(loom_dist *d, loom_status st, const char *why_part) {
    CHECK(st == LOOM_OK, "setup: %s", loom_last_error());
    CHECK(!loom_dist_uses_rank_comm(d), "the rank communicator was chosen");
    const char *why = NULL;
    CHECK(!strcmp(loom_dist_comm_describe(d, &why), "MPI through host memory"), "describe '%s'",
          loom_dist_comm_describe(d, NULL));
    CHECK(contains(why, why_part), "why '%s' lacks '%s'", why, why_part);
    CHECK(F.get_id_calls == 0 && F.init_calls == 0, "id %d, init %d calls", F.get_id_calls,
          F.init_calls);
}

/* The reducer's communicator of the dist reg, over tensors of n floats in each member. */
static void check_mismatch(loom_dist *d, loom_dev_t *devs) {
    loom_backend_t be[16];
    loom_buffer_t buf[16];
    loom_tensor *a[16], *b[16];
    loom_ctx_params cp = {.mem_size = 64 * loom_tensor_overhead(), .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(cp);
    CHECK(ctx, "ctx");
    const int64_t nb = my_rank == 1 ? 8 : 16; /* rank 1 disagrees on b */
    for (int j = 0; j < n_ranks; j++) {
        be[j] = loom_dev_init(devs[j], NULL);
        CHECK(be[j], "backend %d: %s", j, loom_last_error());
        buf[j] = loom_buft_alloc_buffer(loom_dev_buffer_type(devs[j]), 4096);
        CHECK(buf[j], "buffer %d: %s", j, loom_last_error());
        a[j] = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, 16);
        b[j] = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, nb);
        snprintf(b[j]->name, sizeof b[j]->name, "ffn_out-%d", j);
        CHECK(loom_buffer_alloc_tensor(buf[j], a[j], 0) == LOOM_OK, "alloc a");
        CHECK(loom_buffer_alloc_tensor(buf[j], b[j], 1024) == LOOM_OK, "alloc b");
    }
    float v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (float)(my_rank + 1) * (float)(i + 1);
    loom_tensor_set(a[my_rank], v, 0, sizeof v);
    loom_tensor_set(b[my_rank], v, 0, (size_t)nb * sizeof(float));
    loom_reg_t reg = loom_dev_reg(devs[0]);
    loom_comm_init_fn init = (loom_comm_init_fn)loom_reg_get_proc_address(reg, LOOM_PROC_COMM_INIT);
    loom_comm_allreduce_tensor_fn ar =
        (loom_comm_allreduce_tensor_fn)loom_reg_get_proc_address(reg, LOOM_PROC_COMM_ALLREDUCE);
    loom_comm_free_fn fr = (loom_comm_free_fn)loom_reg_get_proc_address(reg, LOOM_PROC_COMM_FREE);
    CHECK(init && ar && fr, "the dist reg exports no communicator");
    void *c = init(be, (size_t)n_ranks);
    CHECK(c, "no communicator");

    CHECK(ar(c, a, (size_t)n_ranks), "declined a");
    CHECK(F.allreduce_calls == 1, "rank communicator called %d times", F.allreduce_calls);
    CHECK(loom_backend_synchronize(be[my_rank]) == LOOM_OK, "sync: %s", loom_last_error());
    const float tri = (float)(n_ranks * (n_ranks + 1) / 2);
    for (int j = 0; j < n_ranks; j++) { /* every member, in order: each read is a broadcast */
        float got[16];
        loom_tensor_get(a[j], got, 0, sizeof got);
        for (int i = 0; i < 16; i++)
            CHECK(got[i] == tri * (float)(i + 1), "member %d [%d] = %g, want %g", j, i, got[i],
                  tri * (float)(i + 1));
    }
    loom_dist_stats ds;
    loom_dist_get_stats(d, &ds);
    CHECK(ds.rank_comm_allreduces == 1, "stats: %llu", (unsigned long long)ds.rank_comm_allreduces);

    CHECK(ar(c, b, (size_t)n_ranks), "declined b"); /* taken: the failure comes next */
    CHECK(F.allreduce_calls == 1, "the mismatched sum reached the communicator");
    loom_status st = loom_backend_synchronize(be[my_rank]);
    CHECK(st == LOOM_ERR_SHAPE, "sync after the mismatch: %d (%s)", (int)st, loom_last_error());
    CHECK(contains(loom_last_error(), "disagree") &&
              contains(loom_last_error(), "rank 0 sums 16 values of f32") &&
              contains(loom_last_error(), "rank 1 8 values") &&
              contains(loom_last_error(), "ffn_out-"),
          "message: %s", loom_last_error());
    /* and it stays: the ranks are no longer in step */
    CHECK(loom_backend_synchronize(be[my_rank]) == LOOM_ERR_SHAPE, "not sticky");
    fr(c);
    for (int j = 0; j < n_ranks; j++) {
        loom_buffer_free(buf[j]);
        loom_backend_free(be[j]);
    }
    loom_ctx_free(ctx);
}

static void eval(loom_session *s, float *logits) {
    int32_t ids[32];
    size_t n = 0;
    loom_status st =
        loom_tokenize(loom_session_tokenizer(s), "Once upon a time", 16, true, ids, 32, &n);
    CHECK(st == LOOM_OK, "tokenize: %s", loom_last_error());
    st = loom_session_eval(s, ids, (int64_t)n, false, logits);
    CHECK(st == LOOM_OK, "eval: %s", loom_last_error());
}

static void check_session(loom_dist *d, loom_dev_t *devs, const char *model, const char *mode) {
    static float ref[1 << 16], got[1 << 16];
    loom_session_params p = loom_session_params_default();
    p.n_ctx = 64;
    p.threads = 1;
    p.devices = "cpu";
    loom_session *s = NULL;
    CHECK(loom_session_new(model, NULL, &p, &s) == LOOM_OK, "ref session: %s", loom_last_error());
    const int64_t nv = loom_session_model(s)->hp.n_vocab;
    CHECK(nv > 0 && nv <= (1 << 16), "n_vocab %lld", (long long)nv);
    eval(s, ref);
    loom_session_free(s);

    p.devs = devs;
    p.n_devs = n_ranks;
    CHECK(loom_split_mode_parse(mode, &p.split_mode) == LOOM_OK, "mode %s", mode);
    CHECK(loom_session_new(model, NULL, &p, &s) == LOOM_OK, "dist session: %s", loom_last_error());
    eval(s, got);
    double worst = 0;
    for (int64_t i = 0; i < nv; i++)
        worst = fmax(worst, fabs((double)got[i] - (double)ref[i]));
    CHECK(worst <= 5e-4, "logits differ from the CPU's by %g", worst);
    loom_dist_stats ds;
    loom_dist_get_stats(d, &ds);
    if (!strcmp(mode, "tensor")) {
        CHECK(ds.rank_comm_allreduces > 0 && (int)ds.rank_comm_allreduces == F.allreduce_calls,
              "allreduces: stats %llu, calls %d", (unsigned long long)ds.rank_comm_allreduces,
              F.allreduce_calls);
    } else {
        /* stage r sends to r + 1: the first stage only sends, the last only receives */
        CHECK((my_rank < n_ranks - 1) == (F.send_calls > 0), "sends %d", F.send_calls);
        CHECK((my_rank > 0) == (F.recv_calls > 0), "receives %d", F.recv_calls);
        CHECK(ds.rank_comm_sends == (uint64_t)F.send_calls &&
                  ds.rank_comm_recvs == (uint64_t)F.recv_calls && ds.sends == 0 && ds.recvs == 0,
              "stats: %llu/%llu through the communicator, %llu/%llu through MPI",
              (unsigned long long)ds.rank_comm_sends, (unsigned long long)ds.rank_comm_recvs,
              (unsigned long long)ds.sends, (unsigned long long)ds.recvs);
    }
    printf("rank %d: %s: worst |logit - cpu| %.3g, %d allreduces, %d sends, %d receives through "
           "%s\n",
           my_rank, mode, worst, F.allreduce_calls, F.send_calls, F.recv_calls,
           loom_dist_comm_describe(d, NULL));
    loom_session_free(s);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    loom_dist *d = NULL;
    if (loom_dist_init(&d) != LOOM_OK) {
        printf("SKIP: %s\n", loom_last_error());
        return 0;
    }
    my_rank = loom_dist_rank(d);
    n_ranks = loom_dist_size(d);
    loom_dev_t devs[16];
    int n = 0;
    CHECK(loom_dist_devices(d, loom_cpu_dev(), 1, devs, 16, &n) == LOOM_OK, "devices: %s",
          loom_last_error());
    loom_dist_set_rank_comm(d, env_int("FAKE_OTHER_VERSION_RANK") == my_rank ? &fake_other : &fake);
    loom_status st = loom_dist_comm_setup(d);
    const char *err = loom_last_error();
    char rank_tag[96];
    if (!strcmp(mode, "bootstrap")) {
        check_bootstrap(d, st);
    } else if (!strcmp(mode, "id_fails")) {
        check_setup_failure(d, st, err, "rank 0: fake ncclGetUniqueId failed");
        CHECK(F.init_calls == 0, "init entered");
    } else if (!strcmp(mode, "init_fails")) {
        const int bad = env_int("FAKE_FAIL_INIT_RANK");
        snprintf(rank_tag, sizeof rank_tag, "rank %d: fake ncclCommInitRank failed", bad);
        check_setup_failure(d, st, err, rank_tag);
        CHECK(F.init_calls == 1, "init %d", F.init_calls);
        CHECK(F.free_calls == (my_rank != bad), "freed %d", F.free_calls);
    } else if (!strcmp(mode, "unusable")) {
        snprintf(rank_tag, sizeof rank_tag, "rank %d: fake: no NCCL",
                 env_int("FAKE_UNUSABLE_RANK"));
        check_host_path(d, st, rank_tag);
        CHECK(F.usable_calls == 1, "usable asked %d times", F.usable_calls);
    } else if (!strcmp(mode, "other_version")) {
        snprintf(rank_tag, sizeof rank_tag,
                 "rank %d: fake-nccl 9.9.8 here, fake-nccl 9.9.9 on rank 0: every rank needs the "
                 "same library",
                 env_int("FAKE_OTHER_VERSION_RANK"));
        check_host_path(d, st, rank_tag);
    } else if (!strcmp(mode, "forced_off")) {
        check_host_path(d, st, "LOOM_DIST_NCCL=0");
        CHECK(F.usable_calls == 0, "usable asked although forced off");
    } else if (!strcmp(mode, "required")) {
        snprintf(rank_tag, sizeof rank_tag, "rank %d: fake: no NCCL",
                 env_int("FAKE_UNUSABLE_RANK"));
        CHECK(st == LOOM_ERR_UNSUPPORTED, "setup: %d", (int)st);
        CHECK(contains(err, "LOOM_DIST_NCCL=1") && contains(err, rank_tag), "message: %s", err);
    } else if (!strcmp(mode, "mismatch")) {
        CHECK(st == LOOM_OK, "setup: %s", err);
        check_mismatch(d, devs);
    } else if (!strcmp(mode, "session") && argc > 3) {
        CHECK(st == LOOM_OK, "setup: %s", err);
        check_session(d, devs, argv[3], argv[2]);
    } else {
        CHECK(false, "unknown mode '%s'", mode);
    }
    printf("PASS rank %d %s\n", my_rank, mode);
    fflush(stdout);
    loom_dist_free(d);
    return 0;
}
