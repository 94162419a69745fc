#define _GNU_SOURCE
/*
 * `loom bench`: llama-bench's semantics and formats. Every combination of the parameter
 * lists (models x device specs x split modes x threads x ngl) is one configuration; every
 * test of it (ppN, tgN, ppN+tgM, each at every depth d: "tg128 @ d512") is one row, timed
 * over -r repetitions after a warm-up, each repetition on a cleared KV cache filled to the
 * depth first (untimed). t/s is the mean and standard deviation over the repetitions of
 * (prompt + generated tokens) / time, as llama-bench computes it. Rows print as they
 * finish; a failed row is one line on stderr (the table stays whole) and the exit status
 * is 1. A configuration of one device is run once, not once per split mode.
 *
 * loom's own figures per generated token (tg rows): allreduces, bytes reduced, and for sim
 * devices the projected communication time under the NVLink and PCIe 4 link presets (each
 * reduction costed as a ring: 2(N-1) steps of latency plus 2(N-1)/N of the bytes). On sim
 * devices with a profile (sim:N,profile=NAME), "projected t/s" (proj_avg_ts) is the same
 * test's tokens over the virtual time of sim's timing model (tools/plan.h), in its own
 * column, never mixed with the measured host time.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "loom/cuda.h"
#include "loom/sim.h"
#include "tools/cli.h"
#include "tools/dist_cli.h"
#include "tools/model_cli.h"
#include "tools/plan.h"

#define MAX_LIST 32

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: loom bench [-m FILE]... [--devices SPEC[;SPEC...]] [-sm LIST] [-ts LIST]\n"
        "                  [-p LIST] [-n LIST] [-pg PP,TG]... [-d LIST] [-r N]\n"
        "                  [-o md|csv|json|jsonl|sql] [options]\n\n"
        "Measures prompt processing and generation speed as llama-bench does. Every LIST\n"
        "takes commas and ranges: 128,512 | 1-4 | 128-512+128 | 64-512*2, at most 32 values;\n"
        "all the lists together (models x specs x modes x splits x combinations x tests x\n"
        "repetitions) at most 100000 runs.\n\n"
        "  -m, --model FILE[,FILE]   models (repeatable; default: the built-in one)\n"
        "  -dev, --devices SPECS     ';'-separated device specs (default cpu)\n"
        "  -sm, --split-mode LIST    none,layer,tensor (default: the default per spec)\n"
        "  -ts, --tensor-split LIST  ';'-separated splits, each per-device proportions 3/1 or\n"
        "                            3,1: a configuration each (llama-bench's -ts 1/1;3/1)\n"
        "  -p, --n-prompt LIST       prompt tokens: a ppN test each (default 512; 0 = none)\n"
        "  -n, --n-gen LIST          generated tokens: a tgN test each (default 128; 0 = none)\n"
        "  -pg PP,TG                 a ppPP+tgTG test (repeatable)\n"
        "  -d, --n-depth LIST        tokens in the KV cache before each test (default 0)\n"
        "  -t, --threads LIST        CPU threads (default: all cores)\n"
        "  -ngl, --n-gpu-layers LIST layers on the devices (default all)\n"
        "  -fa, --flash-attn LIST    0,1 (or off,on,auto): a configuration each (default auto)\n"
        "  -ctk, -ctv LIST           K / V cache types, e.g. f16,q8_0 (default f16)\n"
        "  -b, -ub LIST              logical / physical batch sizes (default 2048 / 512)\n"
        "  -nkvo [LIST]              0,1: the KV cache in host memory (alone: 1)\n"
        "  -mmp, --mmap LIST         0,1: use the weights in place from the mapped file\n"
        "                            (default 1; 0 = --no-mmap)\n"
        "  -embd 0                   accepted (1, llama-bench's embeddings test, is refused)\n"
        "  --delay S                 seconds to wait between tests (default 0)\n"
        "  --progress                a line on stderr as each test starts\n"
        "  -r, --repetitions N       timed runs per test after one warm-up (default 5)\n"
        "  -o, --output FMT          md (default), csv, json, jsonl or sql\n"
        "  --dist mpi                under mpirun: every configuration across the MPI ranks\n"
        "                            (--devices: one spec, each rank's device; rank 0 prints,\n"
        "                            the rows say the number of ranks)\n"
        "%s",
        loom_model_opts_help());
}

static const char *const bench_names[] = {"-h",
                                          "--help",
                                          "-m",
                                          "--model",
                                          "--devices",
                                          "-dev",
                                          "--device",
                                          "-sm",
                                          "--split-mode",
                                          "-p",
                                          "--n-prompt",
                                          "-n",
                                          "--n-gen",
                                          "-pg",
                                          "-d",
                                          "--n-depth",
                                          "-t",
                                          "--threads",
                                          "-ngl",
                                          "--n-gpu-layers",
                                          "-r",
                                          "--repetitions",
                                          "-o",
                                          "--output",
                                          "--dist",
                                          "-fa",
                                          "--flash-attn",
                                          "-ctk",
                                          "--cache-type-k",
                                          "-ctv",
                                          "--cache-type-v",
                                          "-b",
                                          "--batch-size",
                                          "-ub",
                                          "--ubatch-size",
                                          "-nkvo",
                                          "--no-kv-offload",
                                          "-mmp",
                                          "--mmap",
                                          "-embd",
                                          "--embeddings",
                                          "--delay",
                                          "--progress",
                                          NULL};

/* "a", "a-b", "a-b+s", "a-b*m", comma-separated, into out[]; prints the error. */
static bool parse_list(const char *opt, const char *v, long min, long max, long *out, int *n) {
    if (!v || !v[0]) {
        fprintf(stderr, "loom bench: %s needs a value\n", opt);
        return false;
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *e = NULL;
        errno = 0;
        long a = strtol(t, &e, 10), b = a, step = 1;
        char kind = '+';
        if (e != t && *e == '-' && e[1]) {
            char *e2 = NULL;
            b = strtol(e + 1, &e2, 10);
            if (e2 == e + 1) goto bad;
            e = e2;
            if (*e == '+' || *e == '*') {
                kind = *e;
                char *e3 = NULL;
                step = strtol(e + 1, &e3, 10);
                if (e3 == e + 1) goto bad;
                e = e3;
            }
        }
        if (e == t || *e || errno || a < min || b > max || b < a ||
            (kind == '+' ? step < 1 : step < 2) || (kind == '*' && a < 1))
            goto bad;
        for (long x = a;;) {
            if (*n >= MAX_LIST) {
                fprintf(stderr, "loom bench: %s '%s': more than %d values\n", opt, v, MAX_LIST);
                return false;
            }
            out[(*n)++] = x;
            /* the next value, unless it passes b (tested without overflowing: a step near
             * LONG_MAX used to wrap around into values the range does not hold) */
            if (kind == '+' ? step > b - x : x > b / step) break;
            x = kind == '+' ? x + step : x * step;
        }
        continue;
    bad:
        fprintf(stderr, "loom bench: %s '%s': '%s' is not a value or range in %ld..%ld\n", opt, v,
                t, min, max);
        return false;
    }
    return true;
}

typedef struct test {
    int n_prompt, n_gen, n_depth;
    char name[48];
} test;

typedef struct result {
    bool ok;
    char err[256];
    double avg_ts, sd_ts, avg_ns, sd_ns;
    double samples_ns[64], samples_ts[64];
    int n_samples;
    double red_per_tok, bytes_per_tok, proj_nvlink_us, proj_pcie_us;
    double proj_ts; /* profiled sim devices: (prompt + generated) / projected time, mean over
                     * the repetitions; 0 without a profile */
    /* tensor parallelism's measured host cost of generated tokens (tg rows, a meta device;
     * 0 otherwise), separate from the link model's projections: subgraphs per token, host
     * us to issue one (fingerprint, plan lookup, members' queueing), us per reduction
     * (issuing it, plus the sim devices' threads synchronising: waiting for the peers,
     * copying, summing; averaged over the devices), and their total per token */
    double sub_per_tok, us_per_sub, us_per_red, host_us_per_tok;
} result;

/* One combination of llama-bench's per-run lists: -t, -ngl, -b, -ub, -ctk, -ctv, -nkvo, -fa,
 * -mmp. */
typedef struct variant {
    int threads, ngl;
    long n_batch, n_ubatch;
    const char *type_k, *type_v; /* as given */
    loom_type kv_k, kv_v;
    bool nkvo;
    int fa; /* -1 auto (on), 0 off, 1 on */
    bool mmap;
} variant;

typedef struct config {
    const char *model, *devices;
    const char *ts; /* the -ts value as llama-bench writes it: "3.00/1.00"; "0.00" for none */
    loom_split_mode mode;
    variant v;
    /* filled from the session */
    char model_type[128], backend[64];
    char cpu_info[128], gpu_info[256]; /* llama-bench's: the CPU's and the GPUs' descriptions */
    int n_dev;
    double size, params;
} config;

/* The whole configuration, for a FAILED line: "MODEL | DEVICES | SM[ | ts TS] | t N | ngl N
 * | b N | ub N | ctk T | ctv T | fa N | nkvo N | mmap N". */
static const char *config_text(const config *c, char *buf, size_t n) {
    char t[16] = "all";
    if (c->v.threads > 0) snprintf(t, sizeof t, "%d", c->v.threads);
    snprintf(
        buf, n,
        "%s | %s | %s%s%s | t %s | ngl %d | b %ld | ub %ld | ctk %s | ctv %s | fa %d | nkvo %d "
        "| mmap %d",
        c->model ? c->model : "built-in", c->devices, loom_split_mode_name(c->mode),
        c->ts ? " | ts " : "", c->ts ? c->ts : "", t, c->v.ngl, c->v.n_batch, c->v.n_ubatch,
        c->v.type_k, c->v.type_v, c->v.fa, (int)c->v.nkvo, (int)c->v.mmap);
    return buf;
}

static void stats(const double *x, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    *mean = n ? s / n : 0;
    for (int i = 0; i < n; i++)
        q += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

static double ring_us(const loom_sim_link *l, int n, double bytes) {
    if (n < 2) return 0;
    double steps = 2.0 * (n - 1), per_step = bytes / n;
    return steps * loom_sim_link_time_us(l, (uint64_t)per_step);
}

/* Prompt-like token ids: pseudo-random, past the usual control tokens when the
 * vocabulary has more than those (a vocabulary of 3 or fewer tokens uses them all). */
static int32_t bench_token(uint64_t *seed, int64_t V) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = *seed >> 33;
    return V > 3 ? (int32_t)(3 + r % (uint64_t)(V - 3)) : (int32_t)(r % (uint64_t)(V > 0 ? V : 1));
}

/* Evaluates n tokens as a prompt (in batches of the session's n_batch). */
static loom_status eval_prompt(loom_session *s, int n, int64_t V, float *logits, uint64_t *seed,
                               int32_t *ids) {
    for (int i = 0; i < n; i++)
        ids[i] = bench_token(seed, V);
    return n > 0 ? loom_session_eval(s, ids, n, false, logits) : LOOM_OK;
}

/* The meta device's host figures of generated tokens (loom_session_stats' last_*). */
typedef struct gen_host {
    double subgraphs, issue_ns, reduce_ns;
} gen_host;

static loom_status eval_gen(loom_session *s, int n, int64_t V, float *logits, uint64_t *seed,
                            double *red, double *bytes, gen_host *h) {
    for (int i = 0; i < n; i++) {
        int32_t tok = bench_token(seed, V);
        loom_status st = loom_session_eval(s, &tok, 1, false, logits);
        if (st) return st;
        loom_session_stats ss;
        loom_session_get_stats(s, &ss);
        *red += ss.last_reductions;
        *bytes += (double)ss.last_bytes_reduced;
        h->subgraphs += ss.last_subgraphs;
        h->issue_ns += (double)ss.last_issue_ns;
        h->reduce_ns += (double)ss.last_reduce_ns;
    }
    return LOOM_OK;
}

/* Sim member devices: their worker threads' synchronisation time (event waits, device
 * copies, AllReduce), averaged over the devices, in ns since the last stats reset. */
static double sim_sync_ns(loom_session *s) {
    int n = loom_session_n_devices(s), k = 0;
    double sum = 0;
    for (int j = 0; j < n; j++) {
        if (!loom_dev_is_sim(loom_session_device(s, j))) continue;
        loom_sim_stats st;
        loom_sim_dev_stats(loom_session_device(s, j), &st);
        sum += (double)st.host_sync_ns;
        k++;
    }
    return k ? sum / k : 0;
}

static void run_test(loom_session *s, const test *t, int reps, result *r) {
    memset(r, 0, sizeof *r);
    const int64_t V = loom_session_model(s)->hp.n_vocab;
    int np = t->n_prompt > t->n_depth ? t->n_prompt : t->n_depth;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(np > 0 ? np : 1));
    float *logits = malloc(sizeof(float) * (size_t)(V > 0 ? V : 1));
    if (!ids || !logits) {
        snprintf(r->err, sizeof r->err, "out of memory");
        goto out;
    }
    uint64_t seed = 7;
    double red = 0, bytes = 0, sync_ns = 0;
    gen_host gh = {0};
    loom_status st = LOOM_OK;
    /* warm-up as llama-bench: a prompt batch and one generated token */
    loom_session_clear(s);
    if (t->n_prompt > 0) st = eval_prompt(s, t->n_prompt, V, logits, &seed, ids);
    if (!st && t->n_gen > 0) st = eval_gen(s, 1, V, logits, &seed, &red, &bytes, &gh);
    for (int k = 0; k < reps && !st; k++) {
        loom_session_clear(s);
        if ((st = eval_prompt(s, t->n_depth, V, logits, &seed, ids))) break;
        red = bytes = 0;
        gh = (gen_host){0};
        loom_plan_session_time_us(s); /* the projection counts the timed part only */
        int64_t t0 = loom_time_us();
        st = eval_prompt(s, t->n_prompt, V, logits, &seed, ids);
        double sync0 = sim_sync_ns(s);
        if (!st) st = eval_gen(s, t->n_gen, V, logits, &seed, &red, &bytes, &gh);
        int64_t dt = loom_time_us() - t0;
        sync_ns += (sim_sync_ns(s) - sync0) / reps;
        double proj_us = loom_plan_session_time_us(s);
        if (proj_us > 0) r->proj_ts += (double)(t->n_prompt + t->n_gen) * 1e6 / proj_us / reps;
        if (dt < 1) dt = 1;
        r->samples_ns[k] = (double)dt * 1000.0;
        r->samples_ts[k] = (double)(t->n_prompt + t->n_gen) * 1e6 / (double)dt;
        r->n_samples++;
    }
    if (st) {
        snprintf(r->err, sizeof r->err, "%s", loom_last_error());
        goto out;
    }
    r->ok = true;
    stats(r->samples_ns, r->n_samples, &r->avg_ns, &r->sd_ns);
    stats(r->samples_ts, r->n_samples, &r->avg_ts, &r->sd_ts);
    if (t->n_gen > 0) {
        r->red_per_tok = red / t->n_gen;
        r->bytes_per_tok = bytes / t->n_gen;
        /* the last repetition's meta figures, the mean synchronisation of all */
        if (gh.subgraphs > 0) {
            const double sync_last = r->red_per_tok > 0 ? sync_ns : 0;
            r->sub_per_tok = gh.subgraphs / t->n_gen;
            r->us_per_sub = gh.issue_ns / gh.subgraphs / 1000.0;
            r->us_per_red = red > 0 ? (gh.reduce_ns + sync_last) / red / 1000.0 : 0;
            r->host_us_per_tok = (gh.issue_ns + gh.reduce_ns + sync_last) / t->n_gen / 1000.0;
        }
    }
    bool sim = loom_session_n_devices(s) > 0 && loom_dev_is_sim(loom_session_device(s, 0));
    if (sim && r->red_per_tok > 0 && loom_session_meta_backend(s)) {
        loom_sim_link nv, pc;
        loom_sim_link_preset("nvlink", &nv);
        loom_sim_link_preset("pcie4", &pc);
        double per = r->bytes_per_tok / r->red_per_tok;
        int n = loom_session_n_devices(s);
        r->proj_nvlink_us = r->red_per_tok * ring_us(&nv, n, per);
        r->proj_pcie_us = r->red_per_tok * ring_us(&pc, n, per);
    }
out:
    free(ids);
    free(logits);
}

/* ---------------------------------------------------------------- output */

typedef struct printer {
    const char *fmt;
    int n_rows;
    bool show_ts; /* md: a ts column (only when -ts is given, as llama-bench) */
    /* md: a column for each list given (n_batch, n_ubatch, type_k, type_v, fa, nkvo, mmap) */
    bool show_b, show_ub, show_tk, show_tv, show_fa, show_nkvo, show_mmp;
    const loom_model_opts *o;
} printer;

static void fmt_params(char *buf, size_t n, double p) {
    if (p >= 1e9)
        snprintf(buf, n, "%.2f B", p / 1e9);
    else if (p >= 1e6)
        snprintf(buf, n, "%.2f M", p / 1e6);
    else
        snprintf(buf, n, "%.2f K", p / 1e3);
}

static void fmt_size(char *buf, size_t n, double b) {
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", b / 1024 / 1024 / 1024);
    else if (b >= 1024.0 * 1024)
        snprintf(buf, n, "%.2f MiB", b / 1024 / 1024);
    else
        snprintf(buf, n, "%.2f KiB", b / 1024);
}

/* A string field: JSON ("..." with \\, \" and control characters escaped), SQL ('...'
 * with '' for a quote) or CSV ("..." with "" for a quote); control characters never pass. */
static void put_str(FILE *f, const char *s, char mode) {
    char quote = mode == 's' ? '\'' : '"';
    fputc(quote, f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == (unsigned char)quote)
            fputs(mode == 'j' ? "\\\"" : (mode == 's' ? "''" : "\"\""), f);
        else if (c == '\\' && mode == 'j')
            fputs("\\\\", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, mode == 'j' ? "\\u%04x" : "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc(quote, f);
}

/* The fields, in llama-bench's names where the concept is the same, then loom's own. */
#define N_FIELDS 28
static const char *const FIELDS[N_FIELDS] = {"model_filename",
                                             "model_type",
                                             "model_size",
                                             "model_n_params",
                                             "backends",
                                             "devices",
                                             "n_batch",
                                             "n_ubatch",
                                             "n_threads",
                                             "type_k",
                                             "type_v",
                                             "n_gpu_layers",
                                             "split_mode",
                                             "main_gpu",
                                             "no_kv_offload",
                                             "flash_attn",
                                             "tensor_split",
                                             "n_prompt",
                                             "n_gen",
                                             "n_depth",
                                             "test_time",
                                             "avg_ns",
                                             "stddev_ns",
                                             "avg_ts",
                                             "stddev_ts",
                                             "allreduces_per_token",
                                             "bytes_reduced_per_token",
                                             "proj_nvlink_us_per_token"};
/* (and proj_pcie4_us_per_token, proj_avg_ts, the HOST_FIELDS, samples_ns, samples_ts:
 * written after these) */

/* The rest of llama-bench's fields (what scripts/compare-llama-bench.py requires of each row,
 * and its table's columns), after use_mmap: the build, the machine, and the settings loom
 * does not have at their llama-bench values (no CPU mask, no polling, no embeddings mode, no
 * tensor overrides, no CPU MoE layers). Types for -o sql. */
#define N_LB_FIELDS 11
static const char *const LB_FIELDS[N_LB_FIELDS] = {
    "build_commit",  "build_number", "cpu_info",
    "gpu_info",      "cpu_mask",     "cpu_strict",
    "poll",          "embeddings",   "tensor_buft_overrides",
    "no_op_offload", "n_cpu_moe"};
static const char LB_TEXT[N_LB_FIELDS] = {1, 0, 1, 1, 1, 0, 0, 0, 1, 0, 0};

/* Tensor parallelism's measured host cost (result.sub_per_tok ...), after proj_avg_ts. */
#define N_HOST_FIELDS 4
static const char *const HOST_FIELDS[N_HOST_FIELDS] = {
    "subgraphs_per_token", "host_us_per_subgraph", "host_us_per_reduction", "host_us_per_token"};

static void header(printer *p) {
    if (!strcmp(p->fmt, "md")) {
        printf("| model | size | params | backend | devices | threads | ngl | sm |%s%s%s%s%s%s%s%s "
               "test | t/s | allreduces/tok | bytes/tok | nvlink us/tok | pcie4 us/tok | "
               "projected t/s | host us/tok (sub, red) |\n",
               p->show_b ? " n_batch |" : "", p->show_ub ? " n_ubatch |" : "",
               p->show_tk ? " type_k |" : "", p->show_tv ? " type_v |" : "",
               p->show_fa ? " fa |" : "", p->show_nkvo ? " nkvo |" : "",
               p->show_mmp ? " mmap |" : "", p->show_ts ? " ts |" : "");
        printf(
            "| --- | ---: | ---: | --- | --- | ---: | ---: | --- |%s%s%s%s%s%s%s%s ---: | ---: | "
            "---: | ---: | ---: | ---: | ---: | ---: |\n",
            p->show_b ? " ---: |" : "", p->show_ub ? " ---: |" : "", p->show_tk ? " --- |" : "",
            p->show_tv ? " --- |" : "", p->show_fa ? " ---: |" : "", p->show_nkvo ? " ---: |" : "",
            p->show_mmp ? " ---: |" : "", p->show_ts ? " --- |" : "");
    } else if (!strcmp(p->fmt, "csv")) {
        for (int i = 0; i < N_FIELDS; i++)
            printf("%s,", FIELDS[i]);
        printf("proj_pcie4_us_per_token,proj_avg_ts");
        for (int i = 0; i < N_HOST_FIELDS; i++)
            printf(",%s", HOST_FIELDS[i]);
        printf(",use_mmap");
        for (int i = 0; i < N_LB_FIELDS; i++)
            printf(",%s", LB_FIELDS[i]);
        printf("\n");
    } else if (!strcmp(p->fmt, "json")) {
        printf("[\n");
    } else if (!strcmp(p->fmt, "sql")) {
        printf("CREATE TABLE IF NOT EXISTS llama_bench (\n"); /* llama-bench's table */
        for (int i = 0; i < N_FIELDS; i++) {
            const char *ty = i == 0 || i == 1 || i == 4 || i == 5 || i == 9 || i == 10 || i == 12 ||
                                     i == 16 || i == 20
                                 ? "TEXT"
                                 : (i >= 23 ? "REAL" : "INTEGER"); /* avg_ns, stddev_ns: INTEGER */
            printf("  %s %s,\n", FIELDS[i], ty);
        }
        printf("  proj_pcie4_us_per_token REAL,\n  proj_avg_ts REAL,\n");
        for (int i = 0; i < N_HOST_FIELDS; i++)
            printf("  %s REAL,\n", HOST_FIELDS[i]);
        printf("  use_mmap INTEGER");
        for (int i = 0; i < N_LB_FIELDS; i++)
            printf(",\n  %s %s", LB_FIELDS[i], LB_TEXT[i] ? "TEXT" : "INTEGER");
        printf("\n);\n");
    }
    fflush(stdout);
}

/* The LB_FIELDS of a row: JSON as ', "key": value', else each value after sep (q: put_str's
 * quoting mode). */
static void lb_values(const config *c, const loom_model_opts *o, bool json, const char *sep,
                      char q) {
    char num[32];
    const char *text[N_LB_FIELDS] = {loom_version(), NULL, c->cpu_info, c->gpu_info, "0x0", NULL,
                                     NULL,           NULL, "none",      NULL,        NULL};
    const long ival[N_LB_FIELDS] = {0, loom_version_number(), 0, 0, 0, 0, 50, 0,
                                    0, o->sp.no_op_offload,   0};
    /* JSON booleans where llama-bench writes them (its BOOL fields; no_op_offload is an INT) */
    const bool is_bool[N_LB_FIELDS] = {0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0};
    for (int i = 0; i < N_LB_FIELDS; i++) {
        if (json)
            printf(", \"%s\": ", LB_FIELDS[i]);
        else
            printf("%s", sep);
        if (LB_TEXT[i]) {
            put_str(stdout, text[i], q);
            continue;
        }
        snprintf(num, sizeof num, "%ld", ival[i]);
        printf("%s", json && is_bool[i] ? (ival[i] ? "true" : "false") : num);
    }
}

static void row(printer *p, const config *c, const test *t, const result *r, const char *when) {
    const loom_model_opts *o = p->o;
    const char *model = c->model ? c->model : "built-in";
    const char *sm = loom_split_mode_name(c->mode);
    char threads[16];
    if (c->v.threads > 0)
        snprintf(threads, sizeof threads, "%d", c->v.threads);
    else
        snprintf(threads, sizeof threads, "all");
    const char *kt = c->v.type_k, *vt = c->v.type_v;
    const char *ts = c->ts ? c->ts : "0.00";
    /* llama-bench's flash_attn is an integer field (llama_flash_attn_type): -1 auto, 0 off,
     * 1 on, as asked, in every format */
    int fa = c->v.fa < 0 ? -1 : c->v.fa != 0;
    if (!strcmp(p->fmt, "md")) {
        char size[32], params[32];
        fmt_size(size, sizeof size, c->size);
        fmt_params(params, sizeof params, c->params);
        char proj[32] = "-";
        if (r->proj_ts > 0) snprintf(proj, sizeof proj, "%.2f", r->proj_ts);
        char tscol[384] = "";
        size_t tl = 0;
#define COL(on, ...)                                                                               \
    if (on) tl += (size_t)snprintf(tscol + tl, sizeof tscol - tl, __VA_ARGS__)
        COL(p->show_b, " %ld |", c->v.n_batch);
        COL(p->show_ub, " %ld |", c->v.n_ubatch);
        COL(p->show_tk, " %s |", kt);
        COL(p->show_tv, " %s |", vt);
        COL(p->show_fa, " %d |", fa);
        COL(p->show_nkvo, " %d |", c->v.nkvo);
        COL(p->show_mmp, " %d |", c->v.mmap);
        COL(p->show_ts, " %s |", ts);
#undef COL
        char host[64] = "-";
        if (r->sub_per_tok > 0)
            snprintf(host, sizeof host, "%.0f (%.1f, %.1f)", r->host_us_per_tok, r->us_per_sub,
                     r->us_per_red);
        /* per generated token: a prompt-only row has none ("-", not 0) */
        char red[32] = "-", bytes[32] = "-", nv[32] = "-", pc[32] = "-";
        if (t->n_gen > 0) {
            snprintf(red, sizeof red, "%.2f", r->red_per_tok);
            snprintf(bytes, sizeof bytes, "%.0f", r->bytes_per_tok);
            snprintf(nv, sizeof nv, "%.1f", r->proj_nvlink_us);
            snprintf(pc, sizeof pc, "%.1f", r->proj_pcie_us);
        }
        printf("| %s | %s | %s | %s | %s | %s | %d | %s |%s %s | %.2f ± %.2f | %s | %s | %s | %s "
               "| %s | %s |\n",
               c->model_type, size, params, c->backend, c->devices, threads, c->v.ngl, sm, tscol,
               t->name, r->avg_ts, r->sd_ts, red, bytes, nv, pc, proj, host);
    } else {
        bool json = !strcmp(p->fmt, "json") || !strcmp(p->fmt, "jsonl");
        bool sql = !strcmp(p->fmt, "sql");
        char q = json ? 'j' : (sql ? 's' : 'c');
        if (!strcmp(p->fmt, "json"))
            printf("%s  {", p->n_rows ? ",\n" : "");
        else if (json)
            printf("{");
        else if (sql) {
            printf("INSERT INTO llama_bench (");
            for (int i = 0; i < N_FIELDS; i++)
                printf("%s, ", FIELDS[i]);
            printf("proj_pcie4_us_per_token, proj_avg_ts");
            for (int i = 0; i < N_HOST_FIELDS; i++)
                printf(", %s", HOST_FIELDS[i]);
            printf(", use_mmap");
            for (int i = 0; i < N_LB_FIELDS; i++)
                printf(", %s", LB_FIELDS[i]);
            printf(") VALUES (");
        }
        const char *sep = json ? ", " : (sql ? ", " : ",");
        const double host_vals[N_HOST_FIELDS] = {r->sub_per_tok, r->us_per_sub, r->us_per_red,
                                                 r->host_us_per_tok};
#define KEY(i)                                                                                     \
    (json ? (printf("%s\"%s\": ", (i) ? sep : "", FIELDS[i]), 0)                                   \
          : (printf("%s", (i) ? sep : ""), 0))
        KEY(0), put_str(stdout, model, q);
        KEY(1), put_str(stdout, c->model_type, q);
        KEY(2), printf("%.0f", c->size);
        KEY(3), printf("%.0f", c->params);
        KEY(4), put_str(stdout, c->backend, q);
        KEY(5), put_str(stdout, c->devices, q);
        KEY(6), printf("%ld", c->v.n_batch);
        KEY(7), printf("%ld", c->v.n_ubatch);
        KEY(8), printf("%d", c->v.threads > 0 ? c->v.threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
        KEY(9), put_str(stdout, kt, q);
        KEY(10), put_str(stdout, vt, q);
        KEY(11), printf("%d", c->v.ngl);
        KEY(12), put_str(stdout, sm, q);
        KEY(13), printf("%d", o->main_gpu);
        KEY(14), printf("%s", json ? (c->v.nkvo ? "true" : "false") : (c->v.nkvo ? "1" : "0"));
        KEY(15), printf("%d", fa);
        KEY(16), put_str(stdout, ts, q);
        KEY(17), printf("%d", t->n_prompt);
        KEY(18), printf("%d", t->n_gen);
        KEY(19), printf("%d", t->n_depth);
        KEY(20), put_str(stdout, when, q);
        KEY(21), printf("%.0f", r->avg_ns);
        KEY(22), printf("%.0f", r->sd_ns);
        KEY(23), printf("%.6f", r->avg_ts);
        KEY(24), printf("%.6f", r->sd_ts);
        /* per generated token: none in a prompt-only row (null, NULL, an empty field) */
        const bool per_tok = t->n_gen > 0;
        const char *none = json ? "null" : (sql ? "NULL" : "");
        KEY(25), per_tok ? printf("%.2f", r->red_per_tok) : printf("%s", none);
        KEY(26), per_tok ? printf("%.0f", r->bytes_per_tok) : printf("%s", none);
        KEY(27), per_tok ? printf("%.3f", r->proj_nvlink_us) : printf("%s", none);
#undef KEY
        char pcie[32];
        snprintf(pcie, sizeof pcie, "%.3f", r->proj_pcie_us);
        if (!per_tok) snprintf(pcie, sizeof pcie, "%s", none);
        if (json) {
            printf(", \"proj_pcie4_us_per_token\": %s", pcie);
            if (r->proj_ts > 0)
                printf(", \"proj_avg_ts\": %.6f", r->proj_ts);
            else
                printf(", \"proj_avg_ts\": null");
            for (int i = 0; i < N_HOST_FIELDS; i++)
                printf(", \"%s\": %.3f", HOST_FIELDS[i], host_vals[i]);
            printf(", \"use_mmap\": %s", c->v.mmap ? "true" : "false");
            lb_values(c, o, true, NULL, q);
            printf(", \"samples_ns\": [");
            for (int k = 0; k < r->n_samples; k++)
                printf("%s%.0f", k ? ", " : "", r->samples_ns[k]);
            printf("], \"samples_ts\": [");
            for (int k = 0; k < r->n_samples; k++)
                printf("%s%.6f", k ? ", " : "", r->samples_ts[k]);
            printf("]}%s", !strcmp(p->fmt, "jsonl") ? "\n" : "");
        } else if (sql) {
            printf(", %s, ", pcie);
            if (r->proj_ts > 0)
                printf("%.6f", r->proj_ts);
            else
                printf("NULL");
            for (int i = 0; i < N_HOST_FIELDS; i++)
                printf(", %.3f", host_vals[i]);
            printf(", %d", c->v.mmap);
            lb_values(c, o, false, ", ", q);
            printf(");\n");
        } else {
            printf(",%s,", pcie);
            if (r->proj_ts > 0) printf("%.6f", r->proj_ts);
            for (int i = 0; i < N_HOST_FIELDS; i++)
                printf(",%.3f", host_vals[i]);
            printf(",%d", c->v.mmap);
            lb_values(c, o, false, ",", q);
            printf("\n");
        }
    }
    p->n_rows++;
    fflush(stdout);
}

static void footer(printer *p) {
    if (!strcmp(p->fmt, "json")) printf("%s]\n", p->n_rows ? "\n" : "");
    fflush(stdout);
}

/* ---------------------------------------------------------------- configurations */

/* Whether a spec lists at most one device (then every split mode is the same run). */
static bool single_device(const char *spec) {
    if (!strcmp(spec, "cpu") || !strcmp(spec, "none")) return true;
    if (!strncmp(spec, "sim:", 4)) {
        char *e = NULL;
        long n = strtol(spec + 4, &e, 10);
        return n == 1 && (*e == 0 || *e == ',');
    }
    if (!strncmp(spec, "cuda:", 5)) return strchr(spec + 5, ',') == NULL;
    return false;
}

/* The CUDA graphs of a configuration (every CUDA backend, meta members included, through
 * the module's "loom_cuda_backend_get_stats"): one line on stderr when any CUDA backend
 * ran, so a graph cache that never replays shows. */
static void report_cuda_graphs(loom_session *s, const config *c) {
    loom_cuda_backend_stats st, sum = {0};
    bool any = false;
    loom_sched *sc = loom_session_sched(s);
    for (int i = 0; sc && i < loom_sched_get_n_backends(sc); i++) {
        loom_backend_t b = loom_sched_get_backend(sc, i);
        const int n = loom_backend_is_meta(b) ? loom_meta_n_devices(loom_backend_device(b)) : 1;
        for (int j = 0; j < n; j++) {
            loom_backend_t m = loom_backend_is_meta(b) ? loom_meta_backend_member(b, j) : b;
            loom_reg_t reg = m ? loom_dev_reg(loom_backend_device(m)) : NULL;
            void *p = reg ? loom_reg_get_proc_address(reg, "loom_cuda_backend_get_stats") : NULL;
            void (*get)(loom_backend_t, loom_cuda_backend_stats *) = NULL;
            memcpy(&get, &p, sizeof get);
            if (!get) continue;
            get(m, &st);
            sum.graphs += st.graphs;
            sum.graph_captures += st.graph_captures;
            sum.graph_launches += st.graph_launches;
            any = true;
        }
    }
    if (any)
        fprintf(stderr,
                "loom bench: %s | %s: CUDA graphs: %llu computes, %llu captured, %llu replayed\n",
                c->model ? c->model : "built-in", c->devices, (unsigned long long)sum.graphs,
                (unsigned long long)sum.graph_captures, (unsigned long long)sum.graph_launches);
}

static void describe(config *c, loom_session *s, const loom_gguf *g) {
    const loom_model *m = loom_session_model(s);
    double size = 0, params = 0, by_type[LOOM_TYPE_COUNT] = {0};
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
        int64_t ne[LOOM_MAX_DIMS];
        loom_gguf_tensor_ne(g, i, ne);
        double e = 1;
        for (int d = 0; d < LOOM_MAX_DIMS; d++)
            e *= (double)(ne[d] > 0 ? ne[d] : 1);
        params += e;
        size += (double)loom_gguf_tensor_size(g, i);
        loom_type ty = loom_gguf_tensor_type(g, i);
        if ((int)ty >= 0 && ty < LOOM_TYPE_COUNT && loom_gguf_tensor_n_dims(g, i) >= 2)
            by_type[ty] += 1;
    }
    /* the matrices' type, as llama-bench's "Q4_0": the type most matrices have (by count,
     * as the reference guesses it, so F32 embeddings of a small quantised model do not
     * outweigh its layers) */
    int main_type = 0;
    for (int ty = 1; ty < LOOM_TYPE_COUNT; ty++)
        if (by_type[ty] > by_type[main_type]) main_type = ty;
    c->size = size;
    c->params = params;
    char pn[32];
    fmt_params(pn, sizeof pn, params);
    for (char *q = pn; *q; q++)
        if (*q == ' ') memmove(q, q + 1, strlen(q));
    char tn[16];
    snprintf(tn, sizeof tn, "%s", loom_type_name((loom_type)main_type));
    for (char *q = tn; *q; q++)
        if (*q >= 'a' && *q <= 'z') *q = (char)(*q - 'a' + 'A');
    snprintf(c->model_type, sizeof c->model_type, "%s %s %s", m->hp.arch, pn, tn);
    c->n_dev = loom_session_n_devices(s);
    loom_dev_t cpu = loom_registry_dev_by_type(LOOM_DEV_TYPE_CPU);
    snprintf(c->cpu_info, sizeof c->cpu_info, "%s", cpu ? loom_dev_description(cpu) : "");
    size_t gl = 0;
    c->gpu_info[0] = 0;
    for (int i = 0; i < c->n_dev && gl < sizeof c->gpu_info; i++) { /* llama-bench's ", " list */
        loom_dev_t d = loom_session_device(s, i);
        if (loom_dev_get_type(d) == LOOM_DEV_TYPE_GPU)
            gl += (size_t)snprintf(c->gpu_info + gl, sizeof c->gpu_info - gl, "%s%s",
                                   gl ? ", " : "", loom_dev_description(d));
    }
    if (c->n_dev == 0) {
        snprintf(c->backend, sizeof c->backend, "CPU");
    } else {
        loom_dev_t d0 = loom_session_device(s, 0);
        const char *reg =
            loom_dev_is_sim(d0) ? "SIM" : loom_cli_dev_type_name(loom_dev_get_type(d0));
        if (loom_dev_get_type(d0) == LOOM_DEV_TYPE_GPU && !loom_dev_is_sim(d0)) reg = "CUDA";
        snprintf(c->backend, sizeof c->backend, "%s", reg);
    }
}

/* One -ts value of the list: its proportions and llama-bench's string of them. */
typedef struct ts_val {
    float v[16];
    int n;
    char str[16 * 12];
} ts_val;

/* -ts "1/1;3/1" (llama-bench: ';' between values, '/' or ',' between proportions) into
 * out[]; prints the error naming the bad value and returns false. */
static bool parse_ts_list(const char *v, ts_val *out, int *n_out) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", v);
    int n = 0;
    for (char *p = buf, *q; p; p = q) {
        q = strchr(p, ';');
        if (q) *q++ = 0;
        if (!p[0]) {
            fprintf(stderr, "loom bench: -ts '%s' has an empty split\n", v);
            return false;
        }
        if (n >= MAX_LIST) {
            fprintf(stderr, "loom bench: -ts: more than %d splits\n", MAX_LIST);
            return false;
        }
        ts_val *t = &out[n];
        if (!loom_model_cli_tensor_split("bench", "-ts", p, t->v, 16, &t->n)) return false;
        /* llama-bench's tensor_split: "%.2f" each, '/'-joined, up to the last non-zero */
        int last = 0;
        for (int k = 0; k < t->n; k++)
            if (t->v[k] > 0) last = k;
        size_t len = 0;
        t->str[0] = 0;
        for (int k = 0; k <= last && len < sizeof t->str; k++)
            len += (size_t)snprintf(t->str + len, sizeof t->str - len, "%s%.2f", k ? "/" : "",
                                    (double)t->v[k]);
        n++;
    }
    *n_out = n;
    return true;
}

/* A 0/1 list ("0,1"; for -fa also off/on/auto, auto = -1) into out[]; prints the error. */
static bool parse_switches(const char *opt, const char *v, bool allow_auto, int *out, int *n) {
    if (!v || !v[0]) {
        fprintf(stderr, "loom bench: %s needs a value\n", opt);
        return false;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int x;
        if (!strcmp(t, "1") || (allow_auto && !strcmp(t, "on")))
            x = 1;
        else if (!strcmp(t, "0") || (allow_auto && !strcmp(t, "off")))
            x = 0;
        else if (allow_auto && !strcmp(t, "auto"))
            x = -1;
        else {
            fprintf(stderr, "loom bench: %s '%s': '%s' is not %s\n", opt, v, t,
                    allow_auto ? "0, 1, on, off or auto" : "0 or 1");
            return false;
        }
        if (*n >= MAX_LIST) {
            fprintf(stderr, "loom bench: %s '%s': more than %d values\n", opt, v, MAX_LIST);
            return false;
        }
        out[(*n)++] = x;
    }
    return true;
}

/* A -ctk/-ctv list ("f16,q8_0") into names[] (pointers into store, which keeps the copy) and
 * types[]; prints the error. */
static bool parse_kv_types(const char *opt, const char *v, char *store, size_t cap,
                           const char **names, loom_type *types, int *n) {
    if (!v || !v[0]) {
        fprintf(stderr, "loom bench: %s needs a value\n", opt);
        return false;
    }
    snprintf(store, cap, "%s", v);
    *n = 0;
    char *save = NULL;
    for (char *t = strtok_r(store, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAX_LIST) {
            fprintf(stderr, "loom bench: %s '%s': more than %d values\n", opt, v, MAX_LIST);
            return false;
        }
        if (!loom_model_cli_kv_type("bench", opt, t, &types[*n])) return false;
        names[(*n)++] = t;
    }
    return true;
}

int loom_cli_bench(int argc, char **argv) {
    loom_model_opts o;
    loom_model_opts_init(&o);
    const char *devices = "cpu", *fmt = "md";
    const char *models[MAX_LIST];
    char model_bufs[MAX_LIST][1024];
    int n_models = 0;
    long pl[MAX_LIST], nl[MAX_LIST], dl[MAX_LIST], tl[MAX_LIST], gl[MAX_LIST], pgl[2 * MAX_LIST];
    int n_pl = 0, n_nl = 0, n_dl = 0, n_tl = 0, n_gl = 0, n_pg = 0;
    loom_split_mode mlist[8];
    int n_modes = 0, reps = 5;
    const char *ts_arg = NULL; /* -ts LIST (llama-bench's; not the shared single -ts) */
    ts_val tsl[MAX_LIST];
    tsl[0].n = 0; /* no -ts: one configuration without a split */
    int n_ts = 0;
    bool p_set = false, n_set = false, dist = false, progress = false;
    /* llama-bench's per-run lists: each combination is a configuration */
    int fal[MAX_LIST], nkvol[MAX_LIST], mmpl[MAX_LIST], n_fa = 0, n_nkvo = 0, n_mmp = 0;
    long bl[MAX_LIST], ubl[MAX_LIST];
    int n_b = 0, n_ub = 0, n_tk = 0, n_tv = 0;
    const char *tkl[MAX_LIST], *tvl[MAX_LIST];
    loom_type tkt[MAX_LIST], tvt[MAX_LIST];
    char tk_store[512], tv_store[512];
    double delay = 0;
    variant *vars = NULL;
    loom_cli_dist cd = {.size = 1};
    char dist_label[192] = "";
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            loom_model_opts_free(&o);
            return 0;
        }
        bool list = true;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!v || !v[0]) goto missing;
            char buf[4096];
            snprintf(buf, sizeof buf, "%s", v);
            char *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (n_models >= MAX_LIST) {
                    fprintf(stderr, "loom bench: more than %d models\n", MAX_LIST);
                    goto done;
                }
                const char *pth = loom_cli_path(t, model_bufs[n_models], sizeof model_bufs[0]);
                if (pth != model_bufs[n_models])
                    snprintf(model_bufs[n_models], sizeof model_bufs[0], "%s", t);
                models[n_models] = model_bufs[n_models];
                n_models++;
            }
        } else if (!strcmp(a, "--devices") || !strcmp(a, "-dev") || !strcmp(a, "--device")) {
            if (!v) goto missing;
            devices = v;
        } else if (!strcmp(a, "--dist")) {
            if (!v) goto missing;
            if (!loom_cli_dist_parse("bench", v)) goto done;
            dist = true;
            i++;
            continue;
        } else if (!strcmp(a, "--split-mode") || !strcmp(a, "-sm")) {
            if (!v) goto missing;
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            char *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (n_modes >= 8) break;
                if (!strcmp(t, "row")) {
                    fprintf(stderr,
                            "loom bench: -sm row (llama.cpp's row split) does not exist in loom; "
                            "use tensor or layer\n");
                    goto done;
                }
                if (loom_split_mode_parse(t, &mlist[n_modes])) {
                    fprintf(stderr, "loom bench: %s\n", loom_last_error());
                    goto done;
                }
                n_modes++;
            }
        } else if (!strcmp(a, "-ts") || !strcmp(a, "--tensor-split")) {
            if (!v) goto missing;
            ts_arg = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
            if (!parse_list(a, v, 0, 1 << 20, pl, &n_pl)) goto done;
            p_set = true;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            if (!parse_list(a, v, 0, 1 << 20, nl, &n_nl)) goto done;
            n_set = true;
        } else if (!strcmp(a, "-d") || !strcmp(a, "--n-depth")) {
            if (!parse_list(a, v, 0, 1 << 20, dl, &n_dl)) goto done;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!parse_list(a, v, 1, 1024, tl, &n_tl)) goto done;
        } else if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers")) {
            if (!parse_list(a, v, -1, 100000, gl, &n_gl)) goto done;
        } else if (!strcmp(a, "-pg")) {
            long two[MAX_LIST];
            int n2 = 0;
            if (!parse_list(a, v, 0, 1 << 20, two, &n2)) goto done;
            if (n2 != 2 || n_pg >= MAX_LIST) {
                fprintf(stderr, "loom bench: -pg '%s' is not PP,TG (two numbers)\n", v);
                goto done;
            }
            pgl[2 * n_pg] = two[0];
            pgl[2 * n_pg + 1] = two[1];
            n_pg++;
        } else if (!strcmp(a, "-fa") || !strcmp(a, "--flash-attn")) {
            n_fa = 0;
            if (!parse_switches(a, v, true, fal, &n_fa)) goto done;
        } else if (!strcmp(a, "-mmp") || !strcmp(a, "--mmap")) {
            n_mmp = 0;
            if (!parse_switches(a, v, false, mmpl, &n_mmp)) goto done;
        } else if (!strcmp(a, "-nkvo") || !strcmp(a, "--no-kv-offload")) {
            n_nkvo = 0;
            /* llama-bench's -nkvo 0,1; alone (the shared flag) it means 1 */
            if (v && (v[0] == '0' || v[0] == '1') && (!v[1] || v[1] == ',')) {
                if (!parse_switches(a, v, false, nkvol, &n_nkvo)) goto done;
            } else {
                nkvol[n_nkvo++] = 1;
                continue;
            }
        } else if (!strcmp(a, "-embd") || !strcmp(a, "--embeddings")) {
            int el[MAX_LIST], n_e = 0;
            if (!parse_switches(a, v, false, el, &n_e)) goto done;
            for (int k = 0; k < n_e; k++)
                if (el[k]) {
                    fprintf(stderr,
                            "loom bench: %s 1: loom has no embeddings-only benchmark; "
                            "its tests run generation (-embd 0)\n",
                            a);
                    goto done;
                }
        } else if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k")) {
            if (!parse_kv_types(a, v, tk_store, sizeof tk_store, tkl, tkt, &n_tk)) goto done;
        } else if (!strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) {
            if (!parse_kv_types(a, v, tv_store, sizeof tv_store, tvl, tvt, &n_tv)) goto done;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            n_b = 0;
            if (!parse_list(a, v, 1, 1 << 20, bl, &n_b)) goto done;
        } else if (!strcmp(a, "-ub") || !strcmp(a, "--ubatch-size")) {
            n_ub = 0;
            if (!parse_list(a, v, 1, 1 << 20, ubl, &n_ub)) goto done;
        } else if (!strcmp(a, "--delay")) {
            float d;
            if (!loom_cli_parse_float("bench", a, v, 0, 3600, &d)) goto done;
            delay = d;
        } else if (!strcmp(a, "--progress")) {
            progress = true;
            continue;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) {
            int x;
            if (!loom_cli_parse_int("bench", a, v, 1, 64, &x)) goto done;
            reps = x;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!v) goto missing;
            fmt = v;
            if (strcmp(fmt, "md") && strcmp(fmt, "csv") && strcmp(fmt, "json") &&
                strcmp(fmt, "jsonl") && strcmp(fmt, "sql")) {
                fprintf(stderr, "loom bench: -o '%s' (md, csv, json, jsonl or sql)\n", fmt);
                goto done;
            }
        } else {
            list = false;
        }
        if (list) {
            i++;
            continue;
        }
        int r = loom_model_opts_parse(&o, "bench", argc, argv, &i);
        if (r < 0) goto done;
        if (r > 0) continue;
        loom_cli_unknown_option("bench", a, bench_names, loom_model_opts_names);
        goto done;
    missing:
        fprintf(stderr, "loom bench: %s needs a value\n", a);
        goto done;
    }
    if (!loom_model_opts_finish(&o, "bench")) goto done;
    if (ts_arg && !parse_ts_list(ts_arg, tsl, &n_ts)) goto done;
    /* the device specs: ';'-separated, none empty */
    char dbuf[1024];
    const char *specs[MAX_LIST];
    int n_specs = 0;
    snprintf(dbuf, sizeof dbuf, "%s", devices);
    for (char *p = dbuf, *q; p; p = q) {
        q = strchr(p, ';');
        if (q) *q++ = 0;
        if (!p[0]) {
            fprintf(stderr, "loom bench: --devices '%s' has an empty device spec\n", devices);
            goto done;
        }
        if (n_specs >= MAX_LIST) {
            fprintf(stderr, "loom bench: --devices: more than %d specs\n", MAX_LIST);
            goto done;
        }
        specs[n_specs++] = p;
    }
    if (n_models == 0) models[n_models++] = NULL;
    if (!n_modes) mlist[n_modes++] = LOOM_SPLIT_MODE_DEFAULT;
    if (!p_set) pl[n_pl++] = 512;
    if (!n_set) nl[n_nl++] = 128;
    if (!n_dl) dl[n_dl++] = 0;
    if (!n_tl) tl[n_tl++] = 0;
    if (!n_gl) gl[n_gl++] = -1;
    printer pr = {.fmt = fmt,
                  .show_ts = n_ts > 0,
                  .o = &o,
                  .show_b = n_b > 0,
                  .show_ub = n_ub > 0,
                  .show_tk = n_tk > 0,
                  .show_tv = n_tv > 0,
                  .show_fa = n_fa > 0,
                  .show_nkvo = n_nkvo > 0,
                  .show_mmp = n_mmp > 0};
    if (!n_fa) fal[n_fa++] = o.flash_attn;
    if (!n_mmp) mmpl[n_mmp++] = !o.sp.no_mmap;
    if (!n_nkvo) nkvol[n_nkvo++] = o.sp.no_kv_offload;
    if (!n_tk) {
        tkl[0] = o.ctk ? o.ctk : "f16";
        tkt[n_tk++] = o.sp.kv_type;
    }
    if (!n_tv) {
        tvl[0] = o.ctv ? o.ctv : "f16";
        tvt[n_tv++] = o.sp.kv_type_v;
    }
    if (!n_b) bl[n_b++] = (long)o.n_batch;
    if (!n_ub) ubl[n_ub++] = (long)o.n_ubatch;
    /* the combinations, in llama-bench's order of its parameters (the last one varying
     * fastest): an index in mixed radix, one digit per list */
    const int radix[9] = {n_tl, n_gl, n_b, n_ub, n_tk, n_tv, n_nkvo, n_fa, n_mmp};
    const int max_vars = 4096;
    int n_vars = 1;
    for (int d = 0; d < 9; d++)
        if ((n_vars *= radix[d]) > max_vars) {
            fprintf(stderr,
                    "loom bench: more than %d combinations of -t, -ngl, -b, -ub, -ctk, -ctv, "
                    "-nkvo, -fa and -mmp\n",
                    max_vars);
            goto done;
        }
    if (!(vars = malloc(sizeof *vars * (size_t)n_vars))) {
        fprintf(stderr, "loom bench: out of memory\n");
        goto done;
    }
    for (int k = 0; k < n_vars; k++) {
        int i[9];
        for (int d = 8, r = k; d >= 0; r /= radix[d], d--)
            i[d] = r % radix[d];
        vars[k] = (variant){.threads = (int)tl[i[0]],
                            .ngl = (int)gl[i[1]],
                            .n_batch = bl[i[2]],
                            .n_ubatch = ubl[i[3]],
                            .type_k = tkl[i[4]],
                            .kv_k = tkt[i[4]],
                            .type_v = tvl[i[5]],
                            .kv_v = tvt[i[5]],
                            .nkvo = nkvol[i[6]] != 0,
                            .fa = fal[i[7]],
                            .mmap = mmpl[i[8]] != 0};
    }
    /* the tests, in llama-bench's order: pp, tg, pg; each at every depth */
    test tests[4 * MAX_LIST * MAX_LIST];
    int n_tests = 0;
    for (int d = 0; d < n_dl; d++) {
        for (int k = 0; k < n_pl; k++)
            if (pl[k] > 0) tests[n_tests++] = (test){.n_prompt = (int)pl[k], .n_depth = (int)dl[d]};
        for (int k = 0; k < n_nl; k++)
            if (nl[k] > 0) tests[n_tests++] = (test){.n_gen = (int)nl[k], .n_depth = (int)dl[d]};
        for (int k = 0; k < n_pg; k++)
            if (pgl[2 * k] + pgl[2 * k + 1] > 0)
                tests[n_tests++] = (test){.n_prompt = (int)pgl[2 * k],
                                          .n_gen = (int)pgl[2 * k + 1],
                                          .n_depth = (int)dl[d]};
    }
    for (int k = 0; k < n_tests; k++) {
        test *t = &tests[k];
        int o2 = t->n_prompt && t->n_gen
                     ? snprintf(t->name, sizeof t->name, "pp%d+tg%d", t->n_prompt, t->n_gen)
                 : t->n_prompt ? snprintf(t->name, sizeof t->name, "pp%d", t->n_prompt)
                               : snprintf(t->name, sizeof t->name, "tg%d", t->n_gen);
        if (t->n_depth > 0 && o2 > 0 && (size_t)o2 < sizeof t->name)
            snprintf(t->name + o2, sizeof t->name - (size_t)o2, " @ d%d", t->n_depth);
    }
    if (n_tests == 0) {
        fprintf(stderr, "loom bench: no test (every -p, -n and -pg is 0)\n");
        goto done;
    }
    /* every configuration runs every test reps times: bounded before anything is loaded, so
     * lists that multiply out (-p 1-32 -n 1-32 -d 1-32 -t 1-32 ...) are refused, not run for
     * days (each factor is at most MAX_LIST or max_vars: the product fits int64) */
    const int64_t max_runs = 100000;
    const int64_t n_runs = (int64_t)n_models * n_specs * n_modes * (n_ts ? n_ts : 1) * n_vars *
                           n_tests * reps;
    if (n_runs > max_runs) {
        fprintf(stderr,
                "loom bench: %d models x %d device specs (--devices) x %d split modes (-sm) x %d "
                "splits (-ts) x %d combinations (-t, -ngl, -b, -ub, -ctk, -ctv, -nkvo, -fa, "
                "-mmp) x %d tests (-p, -n, -pg at each -d) x %d repetitions (-r) = %lld runs, "
                "more than %lld: shorten the lists\n",
                n_models, n_specs, n_modes, n_ts ? n_ts : 1, n_vars, n_tests, reps,
                (long long)n_runs, (long long)max_runs);
        goto done;
    }
    int64_t need = 0;
    for (int k = 0; k < n_tests; k++) {
        int64_t x = (int64_t)tests[k].n_depth + tests[k].n_prompt + tests[k].n_gen;
        if (x > need) need = x;
    }
    if (dist) {
        if (n_specs != 1) {
            fprintf(stderr, "loom bench: --dist mpi takes one device spec (each rank's device)\n");
            goto done;
        }
        loom_split_mode want = o.sp.split_mode;
        o.sp.devices = specs[0];
        o.sp.split_mode = LOOM_SPLIT_MODE_DEFAULT; /* the -sm list decides per configuration */
        if (!loom_cli_dist_setup(&cd, &o, "bench")) {
            rc = 1;
            goto done;
        }
        o.sp.split_mode = want;
        snprintf(dist_label, sizeof dist_label, "%s x %d MPI ranks", specs[0], cd.size);
        if (cd.size > 1 && n_modes == 1 && mlist[0] == LOOM_SPLIT_MODE_DEFAULT)
            mlist[0] = LOOM_SPLIT_MODE_TENSOR;
        loom_cli_dist_quiet_followers(&cd, "bench"); /* the others run the same configurations */
    }
    if (!n_ts) n_ts = 1; /* tsl[0].n == 0: no split given */
    header(&pr);
    int failed = 0;
    rc = 0;
    for (int mi = 0; mi < n_models; mi++) {
        loom_gguf_free(o.gguf);
        o.gguf = NULL;
        o.model = models[mi];
        if (!loom_cli_dist_agree(&cd, loom_model_opts_open(&o, "bench"), "bench")) {
            failed++;
            continue;
        }
        for (int si = 0; si < n_specs; si++)
            for (int mo = 0; mo < n_modes; mo++)
                for (int xi = 0; xi < n_ts; xi++) {
                    /* a one-device spec: every split mode and -ts is the same run, with no
                     * split (its ts is llama-bench's for none, "0.00") */
                    const bool one = !cd.d && single_device(specs[si]);
                    if ((mo > 0 || xi > 0) && one) continue;
                    for (int vi = 0; vi < n_vars; vi++) {
                        const variant *va = &vars[vi];
                        config c = {.model = models[mi],
                                    .devices = cd.d ? dist_label : specs[si],
                                    .mode = mlist[mo],
                                    .ts = tsl[xi].n && !one ? tsl[xi].str : NULL,
                                    .v = *va};
                        loom_session_params sp = o.sp;
                        /* llama-bench's -dev none: no device but the CPU */
                        sp.devices = strcasecmp(specs[si], "none") ? specs[si] : "cpu";
                        sp.split_mode = mlist[mo];
                        if (tsl[xi].n) {
                            sp.tensor_split = tsl[xi].v;
                            sp.n_tensor_split = tsl[xi].n;
                        }
                        sp.threads = va->threads;
                        sp.n_gpu_layers = va->ngl;
                        sp.n_batch = va->n_batch < va->n_ubatch ? va->n_batch : va->n_ubatch;
                        sp.kv_type = va->kv_k;
                        sp.kv_type_v_set = true;
                        sp.kv_type_v = va->kv_v;
                        sp.no_kv_offload = va->nkvo;
                        sp.no_mmap = !va->mmap;
                        if (sp.n_ctx == 0) sp.n_ctx = need;
                        loom_session *s = NULL;
                        char when[32];
                        time_t now = time(NULL);
                        struct tm tmv;
                        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
                        bool made = loom_session_new(NULL, o.gguf, &sp, &s) == LOOM_OK;
                        /* every rank agrees, the one that failed too (it must not skip
                         * the collective the others wait in) */
                        if (!loom_cli_dist_agree(&cd, made, "bench") ||
                            !loom_cli_dist_same_session(&cd, s, &o, "bench")) {
                            char ct[1024];
                            fprintf(stderr, "loom bench: FAILED %s: %s\n",
                                    config_text(&c, ct, sizeof ct), loom_last_error());
                            loom_session_free(s);
                            failed++;
                            continue;
                        }
                        if (cd.d && loom_dist_uses_rank_comm(cd.d) && !strstr(dist_label, " via "))
                            snprintf(dist_label + strlen(dist_label),
                                     sizeof dist_label - strlen(dist_label), " via %s",
                                     loom_dist_comm_describe(cd.d, NULL));
                        ((loom_model *)loom_session_model(s))->no_flash_attn = va->fa == 0;
                        c.mode = loom_session_split_mode(s);
                        describe(&c, s, o.gguf);
                        if (cd.d) snprintf(c.backend, sizeof c.backend, "MPI");
                        for (int k = 0; k < n_tests; k++) {
                            result r;
                            if (delay > 0 && pr.n_rows > 0) {
                                struct timespec ds = {
                                    (time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
                                nanosleep(&ds, NULL);
                            }
                            if (progress && cd.rank == 0)
                                fprintf(stderr, "loom bench: %s | %s | %s: %s\n",
                                        c.model ? c.model : "built-in", c.devices,
                                        loom_split_mode_name(c.mode), tests[k].name);
                            run_test(s, &tests[k], reps, &r);
                            if (!r.ok) {
                                char ct[1024];
                                fprintf(stderr, "loom bench: FAILED %s | %s: %s\n",
                                        config_text(&c, ct, sizeof ct), tests[k].name, r.err);
                                /* mid-run on one rank: the others wait in a collective */
                                if (cd.d) loom_dist_abort(cd.d, 1);
                                failed++;
                                continue;
                            }
                            row(&pr, &c, &tests[k], &r, when);
                        }
                        if (cd.rank == 0) report_cuda_graphs(s, &c);
                        loom_session_free(s);
                    }
                }
    }
    footer(&pr);
    if (failed) rc = 1;
done:
    free(vars);
    loom_model_opts_free(&o);
    loom_cli_dist_free(&cd);
    return rc;
}
