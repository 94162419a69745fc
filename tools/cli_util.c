/*
 * Small helpers shared by the `loom` subcommands: option values, device specs, and the
 * formatting of sizes and device types.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tools/cli.h"

bool loom_cli_parse_int(const char *cmd, const char *opt, const char *val, int min, int max,
                        int *out) {
    if (!val) {
        fprintf(stderr, "loom %s: %s needs a value (an integer in %d..%d)\n", cmd, opt, min, max);
        return false;
    }
    char *end = NULL;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (!val[0] || *end || errno || v < min || v > max) {
        fprintf(stderr, "loom %s: %s needs an integer in %d..%d (got '%s')\n", cmd, opt, min, max,
                val);
        return false;
    }
    *out = (int)v;
    return true;
}

loom_status loom_cli_devices_from_spec(const char *spec, loom_dev_t *devs, size_t cap, size_t *n) {
    /* A sim spec creates its own reg (sim is linked into the tool). Loading the modules
     * first would also register the default sim reg (SIM0, SIM1), and the spec's devices
     * would then be numbered from SIM2 instead of SIM0. */
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

const char *loom_cli_path(const char *p, char *buf, size_t size) {
    const char *wd = getenv("BUILD_WORKING_DIRECTORY");
    if (!p || !p[0] || p[0] == '/' || !wd || !wd[0] || !strcmp(p, "-")) return p;
    int n = snprintf(buf, size, "%s/%s", wd, p);
    return n > 0 && (size_t)n < size ? buf : NULL;
}

/* Edit distance (insert, delete, substitute), on the first 63 characters. */
static int distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63) la = 63;
    if (lb > 63) lb = 63;
    int prev[64], cur[64];
    for (int j = 0; j <= lb; j++)
        prev[j] = j;
    for (int i = 1; i <= la; i++) {
        cur[0] = i;
        for (int j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof cur);
    }
    return prev[lb];
}

void loom_cli_unknown_option(const char *cmd, const char *arg, const char *const *names,
                             const char *const *more) {
    const char *best = NULL;
    int best_d = 1 << 30;
    const char *const *lists[2] = {names, more};
    for (int l = 0; l < 2; l++)
        for (const char *const *n = lists[l]; n && *n; n++) {
            int d = distance(arg, *n);
            if (d < best_d) {
                best_d = d;
                best = *n;
            }
        }
    /* a hint only when it is plausibly what was meant */
    int len = (int)strlen(arg);
    if (best && best_d <= (len < 6 ? 2 : len / 3 + 1))
        fprintf(stderr, "loom %s: unknown option '%s' (did you mean %s? see loom %s --help)\n", cmd,
                arg, best, cmd);
    else
        fprintf(stderr, "loom %s: unknown option '%s' (see loom %s --help)\n", cmd, arg, cmd);
}

void loom_cli_bad_option(const char *cmd, const char *arg, const char *const *names,
                         const char *const *more) {
    const char *const *lists[2] = {names, more};
    for (int l = 0; l < 2; l++)
        for (const char *const *n = lists[l]; n && *n; n++)
            if (!strcmp(arg, *n)) {
                fprintf(stderr, "loom %s: %s needs a value\n", cmd, arg);
                return;
            }
    loom_cli_unknown_option(cmd, arg, names, more);
}

bool loom_cli_parse_float(const char *cmd, const char *opt, const char *val, double min, double max,
                          float *out) {
    if (!val) {
        fprintf(stderr, "loom %s: %s needs a value\n", cmd, opt);
        return false;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(val, &end);
    if (!val[0] || *end || errno || !isfinite(v) || v < min || v > max) {
        fprintf(stderr, "loom %s: %s '%s' is not a number in %g..%g\n", cmd, opt, val, min, max);
        return false;
    }
    *out = (float)v;
    return true;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

size_t loom_cli_process_escapes(char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            s[o++] = s[i];
            continue;
        }
        char c = s[i + 1];
        int h1, h2;
        if (c == 'n' || c == 'r' || c == 't' || c == '\'' || c == '"' || c == '\\') {
            s[o++] = c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
            i++;
        } else if (c == 'x' && i + 3 < n && (h1 = hex_digit(s[i + 2])) >= 0 &&
                   (h2 = hex_digit(s[i + 3])) >= 0) {
            s[o++] = (char)(h1 * 16 + h2);
            i += 3;
        } else {
            s[o++] = s[i];
        }
    }
    return o;
}
