/*
 * The CUDA reg's communicator between processes (LOOM_PROC_RANK_COMM: NCCL with one GPU per
 * rank, which dist/ sets up with the id broadcast over MPI; tests/dist/rank_comm_test.sh
 * checks that bootstrap with a stand-in). Here, the real NCCL on what one GPU allows: a
 * communicator of one rank (id, init, an AllReduce of device memory, free), a bad rank
 * refused with NCCL's message, and two ranks on the same GPU (two threads, as two
 * processes would be) failing cleanly on both instead of hanging: NCCL does not put two
 * ranks of one communicator on one GPU, so a 2-rank NCCL run needs two GPUs (or nodes).
 * Without a GPU: the table exists and refuses a device that is not CUDA, saying so.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "loom/cpu.h"
#include "tests/gpu/gpu_util.h"

static const loom_rank_comm_iface *rank_comm(void) {
    void *p = loom_reg_get_proc_address(loom_cuda_reg(), LOOM_PROC_RANK_COMM);
    if (!p) return NULL;
    loom_rank_comm_get_fn get;
    memcpy(&get, &p, sizeof get);
    return get();
}

LOOM_TEST(cuda, rank_comm_nccl_refuses_a_device_that_is_not_cuda) {
    const loom_rank_comm_iface *api = rank_comm();
    if (!api) {
        LOOM_CHECK_STR_CONTAINS(loom_cuda_no_devices_reason(loom_cuda_reg()), "toolkit");
        LOOM_SKIP("built without the CUDA toolkit: no communicator between ranks");
    }
    LOOM_CHECK(!strncmp(api->name, "NCCL", 4));
    LOOM_CHECK(api->id_size == 128 && api->id_size <= LOOM_RANK_COMM_ID_MAX);
    char why[512] = "";
    LOOM_CHECK(!api->usable(loom_cpu_dev(), why, sizeof why));
    LOOM_CHECK_STR_CONTAINS(why, "is not a CUDA device");
    void *c = (void *)1;
    unsigned char id[LOOM_RANK_COMM_ID_MAX] = {0};
    char err[512] = "";
    LOOM_CHECK(api->init(loom_cpu_dev(), 1, 0, id, &c, err, sizeof err) == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK(c == NULL);
    LOOM_CHECK_STR_CONTAINS(err, "is not a CUDA device");
}

/* The table, and NCCL usable on GPU 0, or skip saying why. */
#define RANK_COMM_OR_SKIP(api, dev)                                                                \
    GPU_DEVICE_OR_SKIP(dev);                                                                       \
    const loom_rank_comm_iface *api = rank_comm();                                                 \
    LOOM_REQUIRE(api != NULL);                                                                     \
    char api##_why[512] = "";                                                                      \
    if (!api->usable(dev, api##_why, sizeof api##_why)) LOOM_SKIP(api##_why)

LOOM_TEST(cuda, rank_comm_nccl_one_rank) {
    RANK_COMM_OR_SKIP(api, dev);
    unsigned char id[LOOM_RANK_COMM_ID_MAX] = {0};
    char err[512] = "";
    LOOM_REQUIRE(api->get_id(id, err, sizeof err) == LOOM_OK);
    void *c = NULL;
    LOOM_REQUIRE(api->init(dev, 1, 0, id, &c, err, sizeof err) == LOOM_OK);
    LOOM_REQUIRE(c != NULL);

    loom_backend_t be = loom_dev_init(dev, NULL);
    LOOM_REQUIRE(be != NULL);
    const int64_t n = (int64_t)1 << 20;
    loom_buffer_t buf = loom_backend_alloc_buffer(be, (size_t)n * sizeof(float));
    LOOM_REQUIRE(buf != NULL);
    loom_ctx_params cp = {.mem_size = 4 * loom_tensor_overhead(), .no_alloc = true};
    loom_ctx *ctx = loom_ctx_new(cp);
    loom_tensor *t = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, n);
    LOOM_REQUIRE(loom_buffer_alloc_tensor(buf, t, 0) == LOOM_OK);
    float *v = malloc((size_t)n * sizeof *v), *got = malloc((size_t)n * sizeof *got);
    LOOM_REQUIRE(v && got);
    uint64_t seed = 17;
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)gpu_randf(&seed, -4, 4);
    /* queued, not yet done: the communicator's call is ordered after it */
    loom_backend_tensor_set_async(be, t, v, 0, (size_t)n * sizeof(float));
    LOOM_CHECK(api->allreduce_f32(c, t->data, (size_t)n, err, sizeof err) == LOOM_OK);
    loom_tensor_get(t, got, 0, (size_t)n * sizeof(float));
    LOOM_CHECK(memcmp(v, got, (size_t)n * sizeof(float)) == 0); /* a sum over one rank */
    api->free(c);

    /* rank 1 of 1: NCCL's refusal, naming the call and the rank */
    c = (void *)1;
    LOOM_CHECK(api->init(dev, 1, 1, id, &c, err, sizeof err) != LOOM_OK);
    LOOM_CHECK(c == NULL);
    LOOM_CHECK_STR_CONTAINS(err, "CommInitRank");
    LOOM_CHECK_STR_CONTAINS(err, "rank 1 of 1");
    free(v);
    free(got);
    loom_ctx_free(ctx);
    loom_buffer_free(buf);
    loom_backend_free(be);
}

typedef struct two_ranks {
    const loom_rank_comm_iface *api;
    loom_dev_t dev;
    const unsigned char *id;
    int rank;
    loom_status st;
    void *comm;
    char err[512];
} two_ranks;

static void *join(void *arg) {
    two_ranks *r = arg;
    r->st = r->api->init(r->dev, 2, r->rank, r->id, &r->comm, r->err, sizeof r->err);
    return NULL;
}

LOOM_TEST(cuda, rank_comm_nccl_two_ranks_on_one_gpu_fail_cleanly) {
    RANK_COMM_OR_SKIP(api, dev);
    unsigned char id[LOOM_RANK_COMM_ID_MAX] = {0};
    char err[512] = "";
    LOOM_REQUIRE(api->get_id(id, err, sizeof err) == LOOM_OK);
    two_ranks r[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        r[k] = (two_ranks){.api = api, .dev = dev, .id = id, .rank = k};
        LOOM_REQUIRE(pthread_create(&th[k], NULL, join, &r[k]) == 0);
    }
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        printf("rank %d: %s\n", k, r[k].st ? r[k].err : "joined");
        if (r[k].st == LOOM_OK) {
            api->free(r[k].comm);
            continue;
        }
        LOOM_CHECK(r[k].comm == NULL);
        LOOM_CHECK_STR_CONTAINS(r[k].err, "CommInitRank");
    }
    /* NCCL refuses two ranks of one communicator on one GPU */
    LOOM_CHECK(r[0].st != LOOM_OK || r[1].st != LOOM_OK);
}
