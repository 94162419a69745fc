/*
 * dist/ without a launcher (the MPI runs are mpi_run_test.sh): loom_dist_init refuses a
 * process that mpirun did not start (or says loom has no MPI), and a session over explicit
 * devices (the hook `loom run --dist mpi` uses for the dist devices) places and computes
 * exactly like the same devices named by a spec.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/dist.h"
#include "loom/session.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/stories.h"

LOOM_TEST(dist, init_outside_a_launcher_is_refused) {
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMIX_RANK");
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
    LOOM_CHECK(!loom_dist_launched());
    loom_dist *d = (loom_dist *)1;
    loom_status st = loom_dist_init(&d);
    LOOM_CHECK(st == LOOM_ERR_UNSUPPORTED);
    LOOM_CHECK(d == NULL);
    if (loom_dist_available())
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "not started by an MPI launcher");
    else
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "built without MPI");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "--dist mpi");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    LOOM_CHECK(loom_dist_launched());
    unsetenv("OMPI_COMM_WORLD_SIZE");
    loom_dist_free(NULL); /* a no-op */
}

static loom_status eval_prompt(loom_session *s, float *logits) {
    int32_t ids[32];
    size_t n = 0;
    loom_status st =
        loom_tokenize(loom_session_tokenizer(s), "Once upon a time", 16, true, ids, 32, &n);
    return st ? st : loom_session_eval(s, ids, (int64_t)n, false, logits);
}

LOOM_TEST(dist, session_over_explicit_devices_matches_the_spec) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    float ref[512], got[512];

    loom_session_params p = loom_session_params_default();
    p.devices = "sim:3";
    p.n_ctx = 64;
    p.threads = 1;
    loom_session *s = NULL;
    LOOM_REQUIRE(loom_session_new(path, NULL, &p, &s) == LOOM_OK);
    LOOM_REQUIRE(eval_prompt(s, ref) == LOOM_OK);
    loom_session_free(s);

    loom_dev_t devs[4];
    size_t nd = 0;
    LOOM_REQUIRE(loom_devices_from_spec("sim:3", devs, 4, &nd) == LOOM_OK && nd == 3);
    p.devices = "cpu"; /* ignored: the explicit devices win */
    p.devs = devs;
    p.n_devs = 3;
    LOOM_REQUIRE(loom_session_new(path, NULL, &p, &s) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_session_n_devices(s), 3);
    LOOM_CHECK(loom_session_split_mode(s) == LOOM_SPLIT_MODE_TENSOR);
    for (int j = 0; j < 3; j++)
        LOOM_CHECK(loom_session_device(s, j) == devs[j]);
    LOOM_CHECK(loom_session_meta_backend(s) != NULL);
    LOOM_REQUIRE(eval_prompt(s, got) == LOOM_OK);
    float worst = 0;
    for (int i = 0; i < 512; i++) {
        float e = got[i] > ref[i] ? got[i] - ref[i] : ref[i] - got[i];
        if (e > worst) worst = e;
    }
    LOOM_CHECK_NEAR(worst, 0.0, 1e-5);
    loom_session_free(s);

    p.n_devs = 17; /* more than a session takes */
    LOOM_CHECK(loom_session_new(path, NULL, &p, &s) == LOOM_ERR_INVALID_ARG);
    LOOM_CHECK(s == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "17 explicit devices");
}
