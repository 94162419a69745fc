/*
 * A rank that leaves early (MPI_Finalize and exit 0: MPI does not report it as dead) while
 * the others wait for it in a collective: every wait of dist/ ends within LOOM_DIST_TIMEOUT
 * with an error naming the call and the rank, never a hang. peer_left_test.sh runs it on 2
 * and 3 local ranks with LOOM_DIST_TIMEOUT=2; one mode per run:
 *   bcast   the last rank leaves; the others wait in a broadcast from it (MPI_Bcast)
 *   agree   the last rank leaves; the others wait in loom_dist_agree (MPI_Allreduce)
 * The rank that leaves prints "PASS rank R left"; every other prints "PASS rank R MODE: <the
 * error>" and ends the job with loom_dist_abort (its pending request cannot be finished).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/dist.h"

static int my_rank = -1;

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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    loom_dist *d = NULL;
    if (loom_dist_init(&d) != LOOM_OK) {
        printf("SKIP: %s\n", loom_last_error());
        return 0;
    }
    my_rank = loom_dist_rank(d);
    const int n = loom_dist_size(d), last = n - 1;
    CHECK(n >= 2, "%d ranks", n);
    /* every rank is in step here: one collective that succeeds */
    int x = my_rank == 0 ? 42 : 0;
    CHECK(loom_dist_bcast(d, &x, sizeof x, 0) == LOOM_OK && x == 42, "first bcast: %s",
          loom_last_error());
    if (my_rank == last) {
        printf("PASS rank %d left\n", my_rank);
        fflush(stdout);
        loom_dist_free(d); /* MPI_Finalize: waits there for the others, who never come */
        return 0;
    }
    const double t0 = now_s();
    loom_status st;
    const char *want;
    if (!strcmp(mode, "bcast")) {
        st = loom_dist_bcast(d, &x, sizeof x, last);
        want = "MPI_Bcast did not finish within 2 s";
    } else if (!strcmp(mode, "agree")) {
        st = loom_dist_agree(d, LOOM_OK);
        want = "MPI_Allreduce (status) did not finish within 2 s";
    } else {
        CHECK(false, "unknown mode '%s'", mode);
        return 1;
    }
    const double waited = now_s() - t0;
    CHECK(st == LOOM_ERR_DEVICE, "%s: status %d (%s)", mode, (int)st, loom_last_error());
    char rank_tag[64];
    snprintf(rank_tag, sizeof rank_tag, "rank %d of %d: ", my_rank, n);
    CHECK(strstr(loom_last_error(), want) && strstr(loom_last_error(), rank_tag) &&
              strstr(loom_last_error(), "a peer rank died, left"),
          "message: %s", loom_last_error());
    CHECK(waited >= 1.9 && waited < 10, "waited %.2f s", waited);
    printf("PASS rank %d %s: %s (after %.1f s)\n", my_rank, mode, loom_last_error(), waited);
    fflush(stdout);
    loom_dist_abort(d, 3);
    return 1;
}
