/*
 * order_test.c: "all devices" specs come in ring order. A stand-in CUDA reg (8 GPUs that
 * report PCI bus ids, enumerated in a scrambled order, as a driver may) on the 8-GPU XML
 * topology (two PCIe switches per socket, two GPUs per switch): "cuda" lists them so that
 * ring neighbours share a switch, then a socket, and says why; "cuda:5,0" keeps its order.
 * A reg without bus ids keeps the enumeration order and says so.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend-impl.h"
#include "loom/cpu.h"
#include "tests/shim/loom_test.h"

/* enumeration order -> bus id (gpu8.xml: 19,1a | 2b,2c on socket 0; 9b,9c | ab,ac on 1) */
static const char *const BUS[8] = {"0000:9c:00.0", "0000:19:00.0", "0000:ac:00.0", "0000:2b:00.0",
                                   "0000:1a:00.0", "0000:9b:00.0", "0000:2c:00.0", "0000:ab:00.0"};

typedef struct {
    struct loom_dev dev;
    char name[16];
    int i;
} fake_gpu;

static fake_gpu gpus[8];

static const char *fake_name(loom_dev_t d) {
    return ((fake_gpu *)d->context)->name;
}
static void fake_memory(loom_dev_t d, size_t *f, size_t *t) {
    (void)d;
    *f = *t = 0;
}
static loom_dev_type fake_type(loom_dev_t d) {
    (void)d;
    return LOOM_DEV_TYPE_GPU;
}
static void fake_props(loom_dev_t d, loom_dev_props *p) {
    memset(p, 0, sizeof *p);
    p->name = fake_name(d);
    p->type = LOOM_DEV_TYPE_GPU;
}
static loom_backend_t fake_init(loom_dev_t d, const char *params) {
    (void)d;
    (void)params;
    return NULL;
}
static loom_buft_t fake_buft(loom_dev_t d) {
    (void)d;
    return NULL;
}
static bool fake_supports_op(loom_dev_t d, const loom_tensor *op) {
    (void)d;
    (void)op;
    return false;
}
static bool fake_supports_buft(loom_dev_t d, loom_buft_t b) {
    (void)d;
    (void)b;
    return false;
}
static const struct loom_dev_i fake_dev_i = {
    .get_name = fake_name,
    .get_memory = fake_memory,
    .get_type = fake_type,
    .get_props = fake_props,
    .init_backend = fake_init,
    .get_buffer_type = fake_buft,
    .supports_op = fake_supports_op,
    .supports_buft = fake_supports_buft,
};

static const char *fake_bus_id(loom_dev_t d) {
    return BUS[((fake_gpu *)d->context)->i];
}
static const char *reg_name(loom_reg_t r) {
    (void)r;
    return "CUDA";
}
static size_t reg_count(loom_reg_t r) {
    (void)r;
    return 8;
}
static loom_dev_t reg_dev(loom_reg_t r, size_t i) {
    (void)r;
    return i < 8 ? &gpus[i].dev : NULL;
}
static void *reg_proc(loom_reg_t r, const char *name) {
    if (r->context && strcmp(name, "loom_dev_pci_bus_id") == 0)
        return (void *)(uintptr_t)fake_bus_id;
    return NULL;
}
static const struct loom_reg_i fake_reg_i = {
    .get_name = reg_name,
    .get_device_count = reg_count,
    .get_device = reg_dev,
    .get_proc_address = reg_proc,
};
static int with_bus = 1;
static struct loom_reg fake_reg = {
    .api_version = LOOM_BACKEND_API_VERSION, .iface = &fake_reg_i, .context = &with_bus};
/* the same GPUs from a backend that reports no bus ids */
static struct loom_reg nobus_reg = {
    .api_version = LOOM_BACKEND_API_VERSION, .iface = &fake_reg_i, .context = NULL};

static void setup_reg(loom_reg_t reg) {
    char path[4096];
    const char *root = loom_test_source_root();
    snprintf(path, sizeof path, "%s/tests/data/gpu8.xml", root ? root : ".");
    setenv("LOOM_TOPOLOGY", path, 1);
    for (int i = 0; i < 8; i++) {
        gpus[i].i = i;
        snprintf(gpus[i].name, sizeof gpus[i].name, "CUDA%d", i);
        gpus[i].dev =
            (struct loom_dev){.iface = &fake_dev_i, .reg = &fake_reg, .context = &gpus[i]};
    }
    loom_registry_reset();
    loom_registry_add(reg);
}

static void setup(void) {
    setup_reg(&fake_reg);
}

/* The bus id of the k-th device returned. */
static const char *bus_of(loom_dev_t d) {
    return BUS[((fake_gpu *)d->context)->i];
}

LOOM_TEST(order, all_gpus_in_ring_order_explicit_list_kept) {
    setup();
    LOOM_REQUIRE(loom_cpu_reg() != NULL); /* links the topology */
    loom_dev_t devs[16];
    size_t n = 0;
    LOOM_REQUIRE(loom_devices_from_spec("cuda", devs, 16, &n) == LOOM_OK);
    LOOM_REQUIRE(n == 8);
    /* the ring walks socket 0's switches, then socket 1's, each switch's pair together */
    static const char *const want[8] = {"0000:19:00.0", "0000:1a:00.0", "0000:2b:00.0",
                                        "0000:2c:00.0", "0000:9b:00.0", "0000:9c:00.0",
                                        "0000:ab:00.0", "0000:ac:00.0"};
    for (int k = 0; k < 8; k++)
        LOOM_CHECK_MSG(strcmp(bus_of(devs[k]), want[k]) == 0, "position %d: %s (%s)", k,
                       loom_dev_name(devs[k]), bus_of(devs[k]));
    const char *why = loom_devices_last_order();
    LOOM_CHECK_STR_CONTAINS(why, "cuda: ring order 1,4 | 3,6 || 5,0 | 7,2");
    LOOM_CHECK_STR_CONTAINS(why, "PCIe switch");

    LOOM_REQUIRE(loom_devices_from_spec("cuda:5,0", devs, 16, &n) == LOOM_OK);
    LOOM_REQUIRE(n == 2);
    LOOM_CHECK(strcmp(loom_dev_name(devs[0]), "CUDA5") == 0);
    LOOM_CHECK(strcmp(loom_dev_name(devs[1]), "CUDA0") == 0);
}

LOOM_TEST(order, numa_all_in_topology_order) {
    setup();
    loom_dev_t devs[4];
    size_t n = 0;
    LOOM_REQUIRE(loom_devices_from_spec("numa", devs, 4, &n) == LOOM_OK);
    LOOM_REQUIRE(n == 2);
    LOOM_CHECK(strcmp(loom_dev_name(devs[0]), "NUMA0") == 0);
    LOOM_CHECK(strcmp(loom_dev_name(devs[1]), "NUMA1") == 0);
    LOOM_CHECK_STR_CONTAINS(loom_devices_last_order(), "numa: ring order 0 || 1");
}

LOOM_TEST(order, gpus_without_bus_ids_keep_enumeration_order) {
    setup_reg(&nobus_reg);
    loom_dev_t devs[16];
    size_t n = 0;
    LOOM_REQUIRE(loom_devices_from_spec("cuda", devs, 16, &n) == LOOM_OK);
    LOOM_REQUIRE(n == 8);
    for (int k = 0; k < 8; k++)
        LOOM_CHECK(devs[k] == &gpus[k].dev);
    LOOM_CHECK_STR_CONTAINS(loom_devices_last_order(),
                            "cuda: backend 'CUDA' reports no PCI bus ids: enumeration order");
    loom_registry_reset();
}
