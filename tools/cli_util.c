/*
 * Small helpers shared by the `loom` subcommands: option values, device specs, and the
 * formatting of sizes and device types.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "tools/cli.h"

bool loom_cli_parse_int(const char *cmd, const char *opt, const char *val, int min, int max,
                        int *out) {
    if (!val) {
        fprintf(stderr, "loom %s: %s needs a value\n", cmd, opt);
        return false;
    }
    char *end = NULL;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (!val[0] || *end || errno || v < min || v > max) {
        fprintf(stderr, "loom %s: %s '%s' is not an integer in %d..%d\n", cmd, opt, val, min, max);
        return false;
    }
    *out = (int)v;
    return true;
}

loom_status loom_cli_devices_from_spec(const char *spec, loom_dev_t *devs, size_t cap, size_t *n) {
    /* A sim spec creates its own reg (sim is linked into the tool). Loading the modules
     * first would also register the default sim reg, and the spec's devices would then be
     * named B-SIM0.. instead of SIM0.. */
    if (strncasecmp(spec, "sim", 3) != 0) loom_registry_load_all();
    return loom_devices_from_spec(spec, devs, cap, n);
}

void loom_cli_format_bytes(char *buf, size_t size, double bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%.0f B", bytes);
    else
        snprintf(buf, size, "%.1f %s", bytes, units[u]);
}

const char *loom_cli_dev_type_name(loom_dev_type t) {
    switch (t) {
    case LOOM_DEV_TYPE_CPU:
        return "CPU";
    case LOOM_DEV_TYPE_GPU:
        return "GPU";
    case LOOM_DEV_TYPE_ACCEL:
        return "ACCEL";
    case LOOM_DEV_TYPE_META:
        return "META";
    }
    return "?";
}
