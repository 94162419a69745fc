/*
 * topo_test.c: the topology walk, the ring order and the affinity policies on the XML
 * topologies of tests/data (2socket.xml: 2 packages x 1 NUMA node x 2 cores x 2 PUs, 16 GB
 * per node, one 32 MB L3 per package; gpu8.xml: 2 packages x 4 cores, 64 GiB per node, two
 * PCIe switches per package with two GPUs each), load errors, binding that cannot be done,
 * and (on this machine) real pinning and node-bound memory. Expected values are read off
 * the XML files, not the code.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/topo.h"
#include "tests/shim/loom_test.h"

static loom_topo *load_data(const char *file) {
    const char *root = loom_test_source_root();
    if (!root) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/%s", root, file);
    loom_topo *t = NULL;
    if (loom_topo_load(path, &t) != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "%s: %s", path, loom_last_error());
        return NULL;
    }
    return t;
}

LOOM_TEST(topo, walk_two_sockets) {
    loom_topo *t = load_data("2socket.xml");
    LOOM_REQUIRE(t);
    LOOM_CHECK(!loom_topo_is_this_system(t));
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_PACKAGE), 2);
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_NUMA), 2);
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_CORE), 4);
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_PU), 8);
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_L3), 2);
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_GPU), 0);
    for (int i = 0; i < 2; i++) {
        loom_topo_numa_info ni;
        LOOM_REQUIRE(loom_topo_numa(t, i, &ni) == LOOM_OK);
        LOOM_CHECK_EQ_INT(ni.index, i);
        LOOM_CHECK_EQ_INT(ni.os_index, i);
        LOOM_CHECK_EQ_INT(ni.package, i);
        LOOM_CHECK_EQ_INT(ni.memory, 16000000000ULL);
        LOOM_CHECK_EQ_INT(ni.n_cores, 2);
        LOOM_CHECK_EQ_INT(ni.n_pus, 4);
    }
    loom_topo_numa_info ni;
    LOOM_CHECK(loom_topo_numa(t, 2, &ni) == LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "NUMA node 2 does not exist (2 nodes)");

    const char *labels[] = {"NUMA1", "NUMA0"};
    const int numa[] = {1, 0}, pci[] = {-1, -1};
    char buf[4096];
    size_t need = loom_topo_format(t, buf, sizeof buf, 2, labels, numa, pci);
    LOOM_CHECK(need == strlen(buf));
    LOOM_CHECK_STR_CONTAINS(buf, "2 packages, 2 NUMA nodes, 4 cores, 8 PUs, 0 GPUs");
    LOOM_CHECK_STR_CONTAINS(buf, "not this machine");
    LOOM_CHECK_STR_CONTAINS(buf, "  package 1\n    NUMA 1 (os 1): 14.9 GiB, 2 cores, 4 PUs, L3 1 x "
                                 "30.5 MiB  <- NUMA1\n");
    LOOM_CHECK_STR_CONTAINS(buf, "NUMA 0 (os 0): 14.9 GiB, 2 cores, 4 PUs, L3 1 x 30.5 MiB  <- "
                                 "NUMA0\n");
    /* a short buffer still reports the full length and stays terminated */
    char small[16];
    LOOM_CHECK_EQ_INT(loom_topo_format(t, small, sizeof small, 2, labels, numa, pci), need);
    LOOM_CHECK_EQ_INT(strlen(small), 15);
    loom_topo_free(t);
}

LOOM_TEST(topo, walk_eight_gpus) {
    loom_topo *t = load_data("gpu8.xml");
    LOOM_REQUIRE(t);
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_NUMA), 2);
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_CORE), 8);
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_GPU), 8);
    /* the PCI devices: 8 GPUs and 4 switches (bridges are not PCI devices to hwloc) */
    LOOM_CHECK_EQ_INT(loom_topo_count(t, LOOM_TOPO_PCI), 8);
    static const char *const bus[8] = {"0000:19:00.0", "0000:1a:00.0", "0000:2b:00.0",
                                       "0000:2c:00.0", "0000:9b:00.0", "0000:9c:00.0",
                                       "0000:ab:00.0", "0000:ac:00.0"};
    int sw[8];
    for (int g = 0; g < 8; g++) {
        loom_topo_pci_info pi;
        LOOM_REQUIRE(loom_topo_pci(t, LOOM_TOPO_GPU, g, &pi) == LOOM_OK);
        LOOM_CHECK_MSG(strcmp(pi.busid, bus[g]) == 0, "GPU %d: %s", g, pi.busid);
        LOOM_CHECK_EQ_INT(pi.vendor, 0x10de);
        LOOM_CHECK_EQ_INT(pi.device, 0x2330);
        LOOM_CHECK_EQ_INT(pi.class_id, 0x0302);
        LOOM_CHECK_EQ_INT(pi.numa, g / 4);
        sw[g] = pi.switch_id;
        LOOM_CHECK(sw[g] >= 0);
    }
    for (int g = 0; g < 8; g++)
        for (int h = 0; h < 8; h++)
            LOOM_CHECK_MSG((sw[g] == sw[h]) == (g / 2 == h / 2), "GPUs %d, %d: switches %d, %d", g,
                           h, sw[g], sw[h]);
    LOOM_CHECK_EQ_INT(loom_topo_pci_find(t, LOOM_TOPO_GPU, "9b:00.0"), 4);
    LOOM_CHECK_EQ_INT(loom_topo_pci_find(t, LOOM_TOPO_GPU, "0000:2C:00.0"), 3);
    LOOM_CHECK_EQ_INT(loom_topo_pci_find(t, LOOM_TOPO_GPU, "0000:2d:00.0"), -1);
    LOOM_CHECK_EQ_INT(loom_topo_pci_find(t, LOOM_TOPO_GPU, "garbage"), -1);
    loom_topo_pci_info pi;
    LOOM_CHECK(loom_topo_pci(t, LOOM_TOPO_GPU, 8, &pi) == LOOM_ERR_NOT_FOUND);

    const char *labels[] = {"CUDA0", "CUDA5"};
    const int numa[] = {-1, -1}, pci[] = {2, 7};
    char buf[4096];
    loom_topo_format(t, buf, sizeof buf, 2, labels, numa, pci);
    LOOM_CHECK_STR_CONTAINS(buf, "GPU 2 0000:2b:00.0 [10de:2330]");
    LOOM_CHECK_STR_CONTAINS(buf, "<- CUDA0\n");
    LOOM_CHECK_STR_CONTAINS(buf, "GPU 7 0000:ac:00.0 [10de:2330]");
    LOOM_CHECK_STR_CONTAINS(buf, "<- CUDA5\n");
    /* GPU 4 sits under package 1's NUMA node */
    const char *p1 = strstr(buf, "package 1"), *g4 = strstr(buf, "GPU 4 ");
    LOOM_CHECK(p1 && g4 && g4 > p1);
    loom_topo_free(t);
}

LOOM_TEST(topo, ring_order_keeps_neighbours_close) {
    loom_topo *t = load_data("gpu8.xml");
    LOOM_REQUIRE(t);
    /* devices enumerated in a scrambled order (place = GPU index in the topology) */
    const int place[8] = {6, 0, 3, 5, 1, 7, 2, 4};
    int order[8];
    char why[512];
    LOOM_REQUIRE(loom_topo_ring_order(t, LOOM_TOPO_GPU, place, 8, order, why, sizeof why) ==
                 LOOM_OK);
    /* walking the ring: switch pairs {0,1} {2,3} on socket 0, then {4,5} {6,7} */
    for (int k = 0; k < 8; k++)
        LOOM_CHECK_MSG(place[order[k]] == k, "position %d: GPU %d", k, place[order[k]]);
    LOOM_CHECK_STR_CONTAINS(why, "ring order 1,4 | 6,2 || 7,3 | 0,5");
    /* a subset: one GPU per switch, listed socket 1 first */
    const int sub[4] = {7, 5, 2, 0};
    LOOM_REQUIRE(loom_topo_ring_order(t, LOOM_TOPO_GPU, sub, 4, order, why, sizeof why) == LOOM_OK);
    LOOM_CHECK_EQ_INT(sub[order[0]], 0);
    LOOM_CHECK_EQ_INT(sub[order[1]], 2);
    LOOM_CHECK_EQ_INT(sub[order[2]], 5);
    LOOM_CHECK_EQ_INT(sub[order[3]], 7);
    const int nodes[2] = {1, 0};
    LOOM_REQUIRE(loom_topo_ring_order(t, LOOM_TOPO_NUMA, nodes, 2, order, why, sizeof why) ==
                 LOOM_OK);
    LOOM_CHECK_EQ_INT(order[0], 1);
    LOOM_CHECK_EQ_INT(order[1], 0);
    const int bad[1] = {8};
    LOOM_CHECK(loom_topo_ring_order(t, LOOM_TOPO_GPU, bad, 1, order, NULL, 0) ==
               LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "PCI device 8 does not exist");
    LOOM_CHECK(loom_topo_ring_order(t, LOOM_TOPO_CORE, nodes, 2, order, NULL, 0) ==
               LOOM_ERR_INVALID_ARG);
    loom_topo_free(t);
}

/* The PUs of a thread as a bit mask (logical PU indexes; the 2-socket file has 8). */
static unsigned pus_mask(const loom_topo *t, loom_affinity a, int node, int ith, int nth) {
    int pus[64];
    int n = loom_topo_thread_pus(t, a, node, ith, nth, pus, 64);
    unsigned m = 0;
    for (int i = 0; i < n; i++)
        m |= 1u << pus[i];
    return m;
}

LOOM_TEST(topo, affinity_policies) {
    loom_topo *t = load_data("2socket.xml");
    LOOM_REQUIRE(t);
    /* cores: 0 = PUs 0,1 and 1 = PUs 2,3 on node 0; 2 = PUs 4,5 and 3 = PUs 6,7 on node 1 */
    for (int i = 0; i < 4; i++)
        LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_COMPACT, -1, i, 4), 3u << (2 * i));
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_COMPACT, -1, 5, 6), 3u << 2); /* wraps */
    static const unsigned spread[4] = {0x03, 0x30, 0x0c, 0xc0};
    for (int i = 0; i < 4; i++)
        LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_SPREAD, -1, i, 4), spread[i]);
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_NUMA, -1, 0, 4), 0x0f);
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_NUMA, -1, 1, 4), 0x0f);
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_NUMA, -1, 2, 4), 0xf0);
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_NUMA, -1, 3, 4), 0xf0);
    /* inside node 1 */
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_NUMA, 1, 0, 3), 0xf0);
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_COMPACT, 1, 0, 2), 0x30);
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_COMPACT, 1, 1, 2), 0xc0);
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_SPREAD, 1, 1, 2), 0xc0);
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_NONE, -1, 0, 4), 0);
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_COMPACT, 2, 0, 4), 0);  /* no node 2 */
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_COMPACT, -1, 4, 4), 0); /* ith >= nth */
    /* the default: numa with two nodes, none with one */
    char why[128];
    LOOM_CHECK_EQ_INT(loom_topo_affinity_default(t, why, sizeof why), LOOM_AFFINITY_NUMA);
    LOOM_CHECK_STR_CONTAINS(why, "2 NUMA nodes");
    LOOM_CHECK_EQ_INT(pus_mask(t, LOOM_AFFINITY_DEFAULT, -1, 3, 4), 0xf0);
    /* not this machine: binding is skipped (logged once), never an error */
    LOOM_CHECK(!loom_topo_bind_thread(t, LOOM_AFFINITY_COMPACT, -1, 0, 4));
    loom_topo_free(t);

    loom_topo *one = NULL;
    LOOM_REQUIRE(loom_topo_load("synthetic:pack:1 core:2 pu:1", &one) == LOOM_OK);
    LOOM_CHECK_EQ_INT(loom_topo_affinity_default(one, why, sizeof why), LOOM_AFFINITY_NONE);
    LOOM_CHECK_STR_CONTAINS(why, "one NUMA node");
    LOOM_CHECK_EQ_INT(loom_topo_count(one, LOOM_TOPO_CORE), 2);
    loom_topo_free(one);

    loom_affinity a = LOOM_AFFINITY_NONE;
    LOOM_CHECK(loom_affinity_parse("Spread", &a) == LOOM_OK && a == LOOM_AFFINITY_SPREAD);
    LOOM_CHECK(loom_affinity_parse("numa", &a) == LOOM_OK && a == LOOM_AFFINITY_NUMA);
    LOOM_CHECK(loom_affinity_parse("tight", &a) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "'tight' is not one of none, compact, spread, numa");
    LOOM_CHECK(strcmp(loom_affinity_name(LOOM_AFFINITY_COMPACT), "compact") == 0);
}

LOOM_TEST(topo, load_errors_name_the_source) {
    loom_topo *t = NULL;
    LOOM_CHECK(loom_topo_load("/nonexistent/topo.xml", &t) == LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "/nonexistent/topo.xml");
    LOOM_CHECK(t == NULL);
    LOOM_CHECK(loom_topo_load("synthetic:pack:two", &t) == LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "synthetic:pack:two");
    const char *root = loom_test_source_root();
    if (root) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/data/gen_topologies.py", root); /* not XML */
        LOOM_CHECK(loom_topo_load(path, &t) == LOOM_ERR_FORMAT);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "gen_topologies.py");
    }
    LOOM_CHECK(loom_topo_load(NULL, NULL) == LOOM_ERR_INVALID_ARG);
    loom_topo_free(NULL);
}

/* This machine: binding works (or is refused by a restricted cpuset, which is logged and
 * reported as false), and memory on node 0 is usable and reported on node 0. */
typedef struct {
    loom_topo *t;
    bool bound;
    int n_cpus_after, n_pus_expected;
} bind_ctx;

static void *bind_main(void *arg) {
    bind_ctx *c = arg;
    int pus[1024];
    c->n_pus_expected = loom_topo_thread_pus(c->t, LOOM_AFFINITY_COMPACT, -1, 0, 1, pus, 1024);
    c->bound = loom_topo_bind_thread(c->t, LOOM_AFFINITY_COMPACT, -1, 0, 1);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) c->n_cpus_after = CPU_COUNT(&set);
    return NULL;
}

LOOM_TEST(topo, this_machine_binds_threads_and_memory) {
    loom_topo *t = NULL;
    LOOM_REQUIRE(loom_topo_load("", &t) == LOOM_OK); /* "" = this machine */
    LOOM_CHECK(loom_topo_is_this_system(t));
    LOOM_CHECK(loom_topo_count(t, LOOM_TOPO_PU) >= 1);
    LOOM_CHECK(loom_topo_count(t, LOOM_TOPO_NUMA) >= 1);
    bind_ctx c = {.t = t};
    pthread_t th;
    LOOM_REQUIRE(pthread_create(&th, NULL, bind_main, &c) == 0);
    pthread_join(th, NULL);
    LOOM_CHECK(c.n_pus_expected >= 1);
    if (c.bound) /* pinned to the first core: exactly its PUs */
        LOOM_CHECK_EQ_INT(c.n_cpus_after, c.n_pus_expected);

    size_t size = 3 * 4096 + 5;
    unsigned char *p = loom_topo_alloc_on_node(t, 0, size);
    LOOM_REQUIRE(p);
    LOOM_CHECK_EQ_INT((uintptr_t)p % 64, 0);
    memset(p, 0x5a, size);
    LOOM_CHECK_EQ_INT(p[size - 1], 0x5a);
    int node = loom_topo_mem_node(t, p, size);
    LOOM_CHECK_MSG(node == 0 || node == -1, "memory of node 0 reported on node %d", node);
    if (loom_topo_count(t, LOOM_TOPO_NUMA) == 1) LOOM_CHECK_EQ_INT(node, 0);
    loom_topo_free_mem(t, p, size);
    loom_topo_free(t);
}
