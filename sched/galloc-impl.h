/*
 * Graph allocator internals shared with the scheduler and the tests: the plan check that
 * tells why a graph no longer fits, and the stamping step on its own.
 */
#ifndef LOOM_SCHED_GALLOC_IMPL_H
#define LOOM_SCHED_GALLOC_IMPL_H

#include "loom/sched.h"

typedef enum loom__galloc_check {
    LOOM__GALLOC_FITS = 0,
    LOOM__GALLOC_NO_PLAN,  /* never planned (or the last plan failed) */
    LOOM__GALLOC_IDS,      /* a tensor to place moved to another buffer type */
    LOOM__GALLOC_SHAPE,    /* other node or leaf count */
    LOOM__GALLOC_SIZE,     /* a tensor is larger than planned, or was not planned */
    LOOM__GALLOC_TOPOLOGY, /* same counts, other ops, sources or layouts */
} loom__galloc_check;

const char *loom__galloc_check_name(loom__galloc_check c);
/* Compares g (and, when given, the buffer id of each node and leaf) with the plan. */
loom__galloc_check loom__gallocr_check(loom_gallocr *ga, const loom_graph *g,
                                       const int *node_buffer_ids, const int *leaf_buffer_ids);
/* Stamps the plan into g (which must fit it). */
loom_status loom__gallocr_stamp(loom_gallocr *ga, loom_graph *g);
/* From now on, use fp as the graph's topology fingerprint for plans and checks instead of
 * hashing the graph (the scheduler derives one while splitting, for free). */
void loom__gallocr_set_topology(loom_gallocr *ga, uint64_t fp);
/* Number of successful reserves that allocated buffers. */
int loom__gallocr_n_reserves(const loom_gallocr *ga);

#endif /* LOOM_SCHED_GALLOC_IMPL_H */
