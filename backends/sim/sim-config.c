/*
 * sim configuration: defaults, link presets, the link time model, and the parser of spec
 * strings "sim:N[,key=value...]" (see include/loom/sim.h for the keys). Every parse error
 * is LOOM_ERR_FORMAT with a message "sim spec 'SPEC': REASON" where REASON quotes the
 * offending part, so a user can fix the string from the message alone.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r, pthread */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backends/sim/sim-impl.h"

#define LOOM__SIM_DEFAULT_MEM ((size_t)16 << 30)
#define LOOM__SIM_DEFAULT_OFFLOAD 32
#define LOOM__SIM_MAX_THREADS 256

/* The presets live in sim-profiles.c's one table of hardware figures. */
loom_status loom_sim_link_preset(const char *name, loom_sim_link *out) {
    const loom_sim_link_preset_info *info = NULL;
    loom_status s = loom_sim_link_preset_find(name, &info);
    if (s != LOOM_OK) return s;
    if (out) {
        out->bandwidth_gbps = info->bandwidth_gbps;
        out->latency_us = info->latency_us;
    }
    return LOOM_OK;
}

double loom_sim_link_time_us(const loom_sim_link *link, uint64_t bytes) {
    if (!link) return 0.0;
    double t = link->latency_us > 0 ? link->latency_us : 0.0;
    if (link->bandwidth_gbps > 0) t += (double)bytes / (link->bandwidth_gbps * 1e9) * 1e6;
    return t;
}

void loom__sim_format_size(size_t bytes, char *buf, size_t size) {
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(buf, size, "%zu B", bytes);
        return;
    }
    double v = (double)bytes / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 3) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, size, "%.2f %s", v, units[u]);
}

/* The offload threshold default: env LOOM_OP_OFFLOAD_MIN_BATCH, else 32. */
static int64_t loom__sim_env_offload(void) {
    const char *env = getenv("LOOM_OP_OFFLOAD_MIN_BATCH");
    if (!env || !env[0]) return LOOM__SIM_DEFAULT_OFFLOAD;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(env, &end, 10);
    if (errno || *end || v < 0 || !isdigit((unsigned char)env[0])) {
        LOOM_LOG_WARN("LOOM_OP_OFFLOAD_MIN_BATCH='%s' is not a non-negative integer; using %d", env,
                      LOOM__SIM_DEFAULT_OFFLOAD);
        return LOOM__SIM_DEFAULT_OFFLOAD;
    }
    return (int64_t)v;
}

void loom_sim_config_default(loom_sim_config *out, int n_devices) {
    LOOM_ASSERT(out != NULL);
    memset(out, 0, sizeof *out);
    out->n_devices = n_devices;
    out->mem_bytes = LOOM__SIM_DEFAULT_MEM;
    loom_sim_link_preset("nvlink", &out->link);
    snprintf(out->link_name, sizeof out->link_name, "nvlink");
    out->offload_min_batch = loom__sim_env_offload();
    out->threads = 1;
    out->host_memory = false;
    out->p2p = true;
}

/* ---------------------------------------------------------------- parsing helpers */

/* A whole-string decimal integer (optional leading '-'); false on anything else. */
static bool loom__sim_parse_int(const char *s, long long *out) {
    if (!s[0]) return false;
    const char *p = s[0] == '-' ? s + 1 : s;
    if (!isdigit((unsigned char)p[0])) return false;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

/* A whole-string finite non-negative number. */
static bool loom__sim_parse_num(const char *s, double *out) {
    if (!s[0] || !(isdigit((unsigned char)s[0]) || s[0] == '.')) return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < 0) return false;
    *out = v;
    return true;
}

static bool loom__sim_parse_bool(const char *s, bool *out) {
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) return *out = true, true;
        if (strcasecmp(s, no[i]) == 0) return *out = false, true;
    }
    return false;
}

typedef struct {
    const char *suffix;
    double mult;
} loom__sim_suffix;

static const loom__sim_suffix loom__sim_suffixes[] = {
    {"", 1.0},
    {"b", 1.0},
    {"k", 1024.0},
    {"kib", 1024.0},
    {"kb", 1e3},
    {"m", 1048576.0},
    {"mib", 1048576.0},
    {"mb", 1e6},
    {"g", 1073741824.0},
    {"gib", 1073741824.0},
    {"gb", 1e9},
    {"t", 1099511627776.0},
    {"tib", 1099511627776.0},
    {"tb", 1e12},
};

/* "2GiB", "512MB", "1.5g", "4096". Returns NULL on success, else the reason. */
static const char *loom__sim_parse_size(const char *s, size_t *out, char *why, size_t why_size) {
    if (!s[0] || !(isdigit((unsigned char)s[0]) || s[0] == '.')) {
        snprintf(why, why_size, "'%s' is not a size", s);
        return why;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) {
        snprintf(why, why_size, "'%s' is not a size", s);
        return why;
    }
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof loom__sim_suffixes / sizeof loom__sim_suffixes[0]; i++) {
        if (strcasecmp(end, loom__sim_suffixes[i].suffix) == 0) {
            double bytes = v * loom__sim_suffixes[i].mult;
            if (bytes >= 18446744073709551615.0 || bytes > (double)SIZE_MAX) {
                snprintf(why, why_size, "size '%s' is too large", s);
                return why;
            }
            *out = (size_t)(bytes + 0.5);
            return NULL;
        }
    }
    snprintf(why, why_size,
             "unknown size suffix '%s' in '%s' (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)", end,
             s);
    return why;
}

/* Sets refuse[] from "mul_mat+rope". Returns NULL on success, else the reason. */
static const char *loom__sim_parse_refuse(char *list, bool *refuse, char *why, size_t why_size) {
    char *save = NULL;
    int n = 0;
    for (char *name = strtok_r(list, "+", &save); name; name = strtok_r(NULL, "+", &save)) {
        int found = -1;
        for (int op = 0; op < LOOM_OP_COUNT && found < 0; op++) {
            const char *opname = loom_op_name((loom_op)op);
            if (opname && strcasecmp(opname, name) == 0) found = op;
        }
        if (found < 0) {
            snprintf(why, why_size, "refuse: unknown op '%s'", name);
            return why;
        }
        refuse[found] = true;
        n++;
    }
    if (n == 0) {
        snprintf(why, why_size, "refuse needs op names (refuse=mul_mat+rope)");
        return why;
    }
    return NULL;
}

/* ---------------------------------------------------------------- the parser */

#define LOOM__SIM_SPEC_MAX 1024

static loom_status loom__sim_fail(const char *spec, const char *fmt, ...) LOOM_PRINTF(2, 3);
static loom_status loom__sim_fail(const char *spec, const char *fmt, ...) {
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return loom_error(LOOM_ERR_FORMAT, "sim spec '%s': %s", spec, reason);
}

loom_status loom_sim_config_parse(const char *spec, loom_sim_config *out) {
    if (!spec || !out) return loom_error(LOOM_ERR_INVALID_ARG, "loom_sim_config_parse: NULL");
    size_t len = strlen(spec);
    if (len >= LOOM__SIM_SPEC_MAX) {
        return loom_error(LOOM_ERR_FORMAT, "sim spec is too long (%zu characters)", len);
    }
    char buf[LOOM__SIM_SPEC_MAX];
    memcpy(buf, spec, len + 1);

    /* Optional "sim" prefix: "sim" = 1 device, "sim:N,...", "sim,opts" = 1 device. */
    char *p = buf;
    char *count = NULL;
    if (strncasecmp(p, "sim", 3) == 0 && (p[3] == '\0' || p[3] == ':' || p[3] == ',')) {
        p += 3;
        if (*p == ':') {
            count = ++p;
        } else if (*p == ',') {
            p++;
        }
    } else {
        count = p;
    }
    char *opts = NULL;
    if (count) {
        char *comma = strchr(count, ',');
        if (comma) {
            *comma = '\0';
            opts = comma + 1;
        }
    } else {
        opts = *p ? p : NULL;
    }

    long long n = 1;
    if (count && !loom__sim_parse_int(count, &n)) {
        return loom__sim_fail(spec, "'%s' is not a device count", count);
    }
    if (n < 1 || n > LOOM_SIM_MAX_DEVICES) {
        return loom__sim_fail(spec, "device count %lld is out of range 1..%d", n,
                              LOOM_SIM_MAX_DEVICES);
    }
    loom_sim_config cfg;
    loom_sim_config_default(&cfg, (int)n);

    bool have_bw = false, have_lat = false, have_mem = false, have_p2p = false;
    const loom_sim_link_preset_info *preset = NULL;
    const loom_sim_profile *prof = NULL;
    double bw = 0, lat = 0;
    char why[512];
    char *save = NULL;
    for (char *opt = opts ? strtok_r(opts, ",", &save) : NULL; opt;
         opt = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(opt, '=');
        if (!eq) {
            return loom__sim_fail(spec, "option '%s' needs a value (%s=...)", opt, opt);
        }
        *eq = '\0';
        const char *key = opt, *val = eq + 1;
        if (!val[0]) return loom__sim_fail(spec, "option '%s' needs a value (%s=...)", key, key);
        if (strcasecmp(key, "mem") == 0) {
            size_t bytes = 0;
            if (loom__sim_parse_size(val, &bytes, why, sizeof why)) {
                return loom__sim_fail(spec, "mem: %s", why);
            }
            if (bytes == 0) return loom__sim_fail(spec, "mem: '%s' is not a positive size", val);
            cfg.mem_bytes = bytes;
            have_mem = true;
        } else if (strcasecmp(key, "link") == 0) {
            if (loom_sim_link_preset_find(val, &preset) != LOOM_OK) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", loom_last_error());
                return loom__sim_fail(spec, "%s", msg);
            }
            cfg.link.bandwidth_gbps = preset->bandwidth_gbps;
            cfg.link.latency_us = preset->latency_us;
            snprintf(cfg.link_name, sizeof cfg.link_name, "%s", val);
            for (char *c = cfg.link_name; *c; c++)
                *c = (char)tolower((unsigned char)*c);
        } else if (strcasecmp(key, "bw") == 0) {
            if (!loom__sim_parse_num(val, &bw)) {
                return loom__sim_fail(spec, "bw: '%s' is not a bandwidth in GB/s", val);
            }
            have_bw = true;
        } else if (strcasecmp(key, "lat") == 0) {
            if (!loom__sim_parse_num(val, &lat)) {
                return loom__sim_fail(spec, "lat: '%s' is not a latency in microseconds", val);
            }
            have_lat = true;
        } else if (strcasecmp(key, "refuse") == 0) {
            char list[LOOM__SIM_SPEC_MAX];
            snprintf(list, sizeof list, "%s", val);
            if (loom__sim_parse_refuse(list, cfg.refuse, why, sizeof why)) {
                return loom__sim_fail(spec, "%s", why);
            }
        } else if (strcasecmp(key, "offload") == 0) {
            long long v;
            if (!loom__sim_parse_int(val, &v) || v < 0) {
                return loom__sim_fail(spec, "offload: '%s' is not a non-negative batch size", val);
            }
            cfg.offload_min_batch = v;
        } else if (strcasecmp(key, "threads") == 0) {
            long long v;
            if (!loom__sim_parse_int(val, &v)) {
                return loom__sim_fail(spec, "threads: '%s' is not a number", val);
            }
            if (v < 1 || v > LOOM__SIM_MAX_THREADS) {
                return loom__sim_fail(spec, "threads=%lld is out of range 1..%d", v,
                                      LOOM__SIM_MAX_THREADS);
            }
            cfg.threads = (int)v;
        } else if (strcasecmp(key, "hostmem") == 0) {
            if (!loom__sim_parse_bool(val, &cfg.host_memory)) {
                return loom__sim_fail(spec, "hostmem: '%s' is not 0 or 1", val);
            }
        } else if (strcasecmp(key, "p2p") == 0) {
            if (!loom__sim_parse_bool(val, &cfg.p2p)) {
                return loom__sim_fail(spec, "p2p: '%s' is not 0 or 1", val);
            }
            have_p2p = true;
        } else if (strcasecmp(key, "profile") == 0) {
            if (loom_sim_profile_find(val, &prof) != LOOM_OK) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", loom_last_error());
                return loom__sim_fail(spec, "%s", msg);
            }
            snprintf(cfg.profile, sizeof cfg.profile, "%s", prof->name);
        } else if (strcasecmp(key, "comm") == 0) {
            bool on = true;
            if (!loom__sim_parse_bool(val, &on)) {
                return loom__sim_fail(spec, "comm: '%s' is not 0 or 1", val);
            }
            cfg.no_comm = !on;
        } else if (strcasecmp(key, "virtual") == 0) {
            if (!loom__sim_parse_bool(val, &cfg.virtual_memory)) {
                return loom__sim_fail(spec, "virtual: '%s' is not 0 or 1", val);
            }
        } else {
            return loom__sim_fail(spec,
                                  "unknown option '%s' (expected mem, link, bw, lat, refuse, "
                                  "offload, threads, hostmem, p2p, profile, virtual or comm)",
                                  key);
        }
    }
    /* the profile's memory and the preset's p2p apply unless given explicitly, whatever
     * the order of the options */
    if (prof && !have_mem) cfg.mem_bytes = prof->mem_bytes;
    if (preset && !have_p2p) cfg.p2p = preset->p2p;
    if (cfg.virtual_memory && cfg.host_memory)
        return loom__sim_fail(spec, "virtual=1 and hostmem=1 exclude each other");
    if (have_bw) cfg.link.bandwidth_gbps = bw;
    if (have_lat) cfg.link.latency_us = lat;
    if (have_bw || have_lat) snprintf(cfg.link_name, sizeof cfg.link_name, "custom");
    *out = cfg;
    return LOOM_OK;
}
