/*
 * `loom devices`: loads every backend module (loom_registry_load_all), optionally resolves
 * a device spec (which creates sim devices), and lists each registry with its devices:
 * type, memory, caps and buffer types.
 */
#include <stdio.h>
#include <string.h>

#include "loom/cpu.h"
#include "loom/topo.h"
#include "tools/cli.h"

static void devices_usage(FILE *f) {
    fprintf(f, "usage: loom devices [--devices SPEC]\n"
               "\n"
               "Loads the backend modules (the directory of the loom library and\n"
               "LOOM_BACKEND_PATH) and lists every registry and device: type, memory, caps\n"
               "and buffer types.\n"
               "\n"
               "options:\n"
               "  --devices SPEC   also resolve SPEC first (e.g. sim:4,mem=2GiB), creating the\n"
               "                   devices it names, and mark them in the list\n"
               "  -h, --help       this text\n"
               "\n"
               "Then the machine's topology (hwloc; LOOM_TOPOLOGY=file.xml or synthetic:DESC\n"
               "loads another) as a short tree with each device where it sits: NUMA devices\n"
               "at their node, GPUs at their PCI bus id when their backend reports it.\n");
}

static const char *yes_no(bool b) {
    return b ? "yes" : "no";
}

static void print_buft(const char *label, loom_buft_t buft) {
    if (!buft) {
        printf("      %-12s none\n", label);
        return;
    }
    printf("      %-12s %s (alignment %zu, %s)\n", label, loom_buft_name(buft),
           loom_buft_alignment(buft), loom_buft_is_host(buft) ? "host memory" : "device memory");
}

/* Where a device sits: its NUMA node (NUMA devices) or its GPU index in the topology (a
 * backend exporting "loom_dev_pci_bus_id", const char *(loom_dev_t)). */
static void device_place(const loom_topo *t, loom_dev_t dev, int *numa, int *pci) {
    *numa = -1;
    *pci = -1;
    const char *name = loom_dev_name(dev);
    int node;
    char extra;
    if (sscanf(name, "NUMA%d%c", &node, &extra) == 1) *numa = node;
    loom_reg_t reg = loom_dev_reg(dev);
    void *fn = reg ? loom_reg_get_proc_address(reg, "loom_dev_pci_bus_id") : NULL;
    if (fn) {
        const char *(*bus_id)(loom_dev_t) = NULL;
        memcpy(&bus_id, &fn, sizeof bus_id);
        const char *id = bus_id(dev);
        if (id) *pci = loom_topo_pci_find(t, LOOM_TOPO_GPU, id);
    }
}

static void print_topology(loom_dev_t *chosen, size_t n_chosen) {
    loom_topo *t = loom_topo_get();
    if (!t) {
        printf("\ntopology: unavailable (%s)\n", loom_last_error());
        return;
    }
    enum { MAXL = 128 };
    const char *labels[MAXL];
    int numa[MAXL], pci[MAXL], n = 0;
    size_t nd = loom_registry_dev_count();
    for (size_t i = 0; i < nd && n < MAXL; i++) {
        loom_dev_t dev = loom_registry_dev_get(i);
        device_place(t, dev, &numa[n], &pci[n]);
        if (numa[n] < 0 && pci[n] < 0) continue;
        labels[n++] = loom_dev_name(dev);
    }
    size_t need = loom_topo_format(t, NULL, 0, n, labels, numa, pci) + 1;
    char *buf = loom_malloc(need);
    if (!buf) return;
    loom_topo_format(t, buf, need, n, labels, numa, pci);
    printf("\n%s", buf);
    loom_free(buf);
    char why[256];
    loom_affinity a = loom_cpu_affinity(why, sizeof why);
    printf("cpu affinity: %s (%s)\n", loom_affinity_name(a), why);
    (void)chosen;
    (void)n_chosen;
    const char *order = loom_devices_last_order(); /* of "cuda" / "numa" */
    if (order[0]) printf("device order: %s\n", order);
}

int loom_cli_devices(int argc, char **argv) {
    const char *spec = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            devices_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--devices")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "loom devices: --devices needs a value (e.g. sim:2)\n");
                return 2;
            }
            spec = argv[++i];
        } else {
            static const char *const names[] = {"-h", "--help", "--devices", NULL};
            loom_cli_unknown_option("devices", argv[i], names, NULL);
            return 2;
        }
    }
    loom_dev_t chosen[64];
    size_t n_chosen = 0;
    loom_registry_load_all();
    if (spec && loom_cli_devices_from_spec(spec, chosen, 64, &n_chosen) != LOOM_OK) {
        fprintf(stderr, "loom devices: %s\n", loom_last_error()); /* names the spec */
        return 1;
    }

    size_t n_reg = loom_registry_reg_count();
    printf("%zu registr%s, %zu device%s\n", n_reg, n_reg == 1 ? "y" : "ies",
           loom_registry_dev_count(), loom_registry_dev_count() == 1 ? "" : "s");
    for (size_t r = 0; r < n_reg; r++) {
        loom_reg_t reg = loom_registry_reg_get(r);
        size_t nd = loom_reg_dev_count(reg);
        printf("\nregistry %s: %zu device%s\n", loom_reg_name(reg), nd, nd == 1 ? "" : "s");
        for (size_t d = 0; d < nd; d++) {
            loom_dev_t dev = loom_reg_dev_get(reg, d);
            loom_dev_props p;
            memset(&p, 0, sizeof p);
            loom_dev_get_props(dev, &p);
            bool is_chosen = false;
            for (size_t k = 0; k < n_chosen; k++)
                is_chosen |= chosen[k] == dev;
            char fr[24], tot[24];
            loom_cli_format_bytes(fr, sizeof fr, (double)p.memory_free);
            loom_cli_format_bytes(tot, sizeof tot, (double)p.memory_total);
            printf("  %s%s  [%s] %s\n", loom_dev_name(dev), is_chosen ? " (from --devices)" : "",
                   loom_cli_dev_type_name(p.type), p.description ? p.description : "");
            printf("      %-12s %s free of %s\n", "memory", fr, tot);
            printf("      %-12s async %s, events %s, host buffer %s\n", "caps",
                   yes_no(p.caps.async), yes_no(p.caps.events), yes_no(p.caps.host_buffer));
            print_buft("buffer type", loom_dev_buffer_type(dev));
            if (p.caps.host_buffer) print_buft("host buffer", loom_dev_host_buffer_type(dev));
        }
    }
    /* CUDA absent or without devices: why (no driver, no module, the driver's error) */
    loom_reg_t cuda = loom_registry_reg_by_name("CUDA");
    if (!cuda || loom_reg_dev_count(cuda) == 0) {
        loom_dev_t none[1];
        size_t n_none = 0;
        if (loom_devices_from_spec("cuda", none, 1, &n_none) != LOOM_OK)
            printf("\nCUDA: %s\n", loom_last_error());
        loom_clear_error();
    }
    print_topology(chosen, n_chosen);
    return 0;
}
