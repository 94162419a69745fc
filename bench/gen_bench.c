/*
 * gen_bench: token generation on the CPU backend, and whether its threads hold their
 * cores. Per generated token: the time, the context switches (voluntary: a thread went to
 * sleep; involuntary: the kernel took its core), the CPU time of the process over the wall
 * time (cores held; from getrusage), and from the thread pool's counters the graph runs,
 * the barriers completed, the waits that went to sleep on a futex and the futex wake-ups.
 *
 *   gen_bench -m FILE [-t THREADS] [-n TOKENS] [-d DEPTH] [-r REPS] [--busy N]
 *   gen_bench --small   (CI: a tiny synthetic model in memory, a few tokens)
 *
 * --busy N forks N processes that spin for the whole run (a competing load). Figures only:
 * it exits non-zero when the model does not load or an evaluation fails, never on a time.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/gguf.h"
#include "loom/loom.h"
#include "loom/model.h"
#include "loom/session.h"

typedef struct gen_opts {
    const char *model;
    int threads, n_gen, depth, reps, busy;
    bool small;
} gen_opts;

/* One sample of the process's counters. */
typedef struct sample {
    int64_t ns;
    double cpu_s; /* user + system time of all threads */
    long nvcsw, nivcsw;
    loom_threadpool_stats tp;
} sample;

static double tv_s(struct timeval tv) {
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

static sample sample_now(void) {
    sample s;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    s.cpu_s = tv_s(ru.ru_utime) + tv_s(ru.ru_stime);
    s.nvcsw = ru.ru_nvcsw;
    s.nivcsw = ru.ru_nivcsw;
    loom_threadpool_get_stats(&s.tp);
    s.ns = loom_time_ns();
    return s;
}

static void usage(FILE *f) {
    fprintf(f, "usage: gen_bench -m FILE [-t THREADS] [-n TOKENS] [-d DEPTH] [-r REPS] [--busy N]\n"
               "       gen_bench --small\n"
               "  defaults: -t 2 -n 128 -d 0 -r 3 --busy 0 (N spinning processes compete)\n");
}

static bool parse(int argc, char **argv, gen_opts *o) {
    *o = (gen_opts){.threads = 2, .n_gen = 128, .reps = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *num = !strcmp(a, "-t")       ? &o->threads
                   : !strcmp(a, "-n")     ? &o->n_gen
                   : !strcmp(a, "-d")     ? &o->depth
                   : !strcmp(a, "-r")     ? &o->reps
                   : !strcmp(a, "--busy") ? &o->busy
                                          : NULL;
        if (!strcmp(a, "--small")) {
            o->small = true;
        } else if (!strcmp(a, "-m") && v) {
            o->model = argv[++i];
        } else if (num && v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end || x < 0 || x > 1000000) {
                fprintf(stderr, "gen_bench: %s needs a count, got '%s'\n", a, v);
                return false;
            }
            *num = (int)x;
            i++;
        } else {
            usage(stderr);
            return false;
        }
    }
    if (o->small) {
        o->n_gen = 16;
        o->reps = 1;
        o->depth = o->depth ? o->depth : 8;
    }
    if (!o->model && !o->small) {
        usage(stderr);
        return false;
    }
    if (o->threads < 1 || o->n_gen < 1 || o->reps < 1) {
        fprintf(stderr, "gen_bench: -t, -n and -r must be at least 1\n");
        return false;
    }
    return true;
}

/* The tiny model of --small: 2 layers, 256 wide, Q4_0, in memory (*data: its bytes). */
static loom_gguf *small_model(void **data) {
    loom_synth_params p = loom_synth_params_default();
    p.n_embd = 256;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 512;
    p.n_vocab = 512;
    p.n_ctx = 256;
    p.wtype = LOOM_TYPE_Q4_0;
    loom_gguf_writer *w = NULL;
    loom_gguf *g = NULL;
    size_t size = 0;
    if (loom_model_synth(&p, &w) || loom_gguf_write_memory(w, data, &size) ||
        loom_gguf_open_memory(*data, size, &g))
        g = NULL;
    loom_gguf_writer_free(w);
    return g;
}

/* A child that spins until killed (the competing load of --busy). */
static pid_t spawn_busy(void) {
    pid_t pid = fork();
    if (pid == 0) {
        volatile unsigned long x = 0;
        for (;;)
            x++;
    }
    return pid;
}

/* One repetition: a fresh KV cache, depth tokens of prompt, then n_gen tokens one at a
 * time (each the argmax of the last logits). Fills *gen with the counters around the
 * generation only. */
static bool run_once(loom_session *s, const gen_opts *o, int64_t n_vocab, float *logits, sample *t0,
                     sample *t1) {
    loom_session_clear(s);
    int32_t *prompt = malloc(sizeof *prompt * (size_t)(o->depth + 1));
    if (!prompt) return false;
    for (int i = 0; i <= o->depth; i++)
        prompt[i] = (int32_t)(1 + (i * 7919) % (n_vocab - 1));
    loom_status st = loom_session_eval(s, prompt, o->depth + 1, false, logits);
    free(prompt);
    if (st != LOOM_OK) return false;
    *t0 = sample_now();
    for (int i = 0; i < o->n_gen; i++) {
        int32_t tok = 0;
        for (int64_t v = 1; v < n_vocab; v++)
            if (logits[v] > logits[tok]) tok = (int32_t)v;
        if (loom_session_eval(s, &tok, 1, false, logits) != LOOM_OK) return false;
    }
    *t1 = sample_now();
    return true;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    gen_opts o;
    if (!parse(argc, argv, &o)) return 2;
    void *data = NULL;
    loom_gguf *g = NULL;
    if (!o.model && !(g = small_model(&data))) {
        fprintf(stderr, "gen_bench: cannot synthesise the small model: %s\n", loom_last_error());
        return 1;
    }
    loom_session_params sp = loom_session_params_default();
    sp.devices = "cpu";
    sp.threads = o.threads;
    sp.n_ctx = o.depth + o.n_gen + 16;
    sp.kv_type = LOOM_TYPE_F16;
    loom_session *s = NULL;
    if (loom_session_new(o.model, g, &sp, &s) != LOOM_OK) {
        fprintf(stderr, "gen_bench: %s\n", loom_last_error());
        loom_gguf_free(g);
        free(data);
        return 1;
    }
    const int64_t n_vocab = loom_session_model(s)->hp.n_vocab;
    float *logits = malloc(sizeof *logits * (size_t)n_vocab);
    pid_t *busy = calloc((size_t)o.busy + 1, sizeof *busy);
    int rc = logits && busy ? 0 : 1;
    for (int i = 0; i < o.busy && !rc; i++)
        busy[i] = spawn_busy();

    printf("gen_bench: %s, %d threads, %d cores online, depth %d, %d tokens x %d runs, "
           "%d competing busy process(es)\n",
           o.model ? o.model : "small synthetic Q4_0 model", o.threads, loom_n_cpus(), o.depth,
           o.n_gen, o.reps, o.busy);
    printf("| run | t/s | ms/tok | csw/tok | vol | invol | cpu/tok (cores) | runs/tok | "
           "barriers/tok | sleeps/tok | wakes/tok |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double tps[64], csw[64], cpu[64];
    int done = 0;
    /* one warm-up run, not printed */
    for (int r = -1; r < o.reps && !rc; r++) {
        sample a, b;
        if (!run_once(s, &o, n_vocab, logits, &a, &b)) {
            fprintf(stderr, "gen_bench: evaluation failed: %s\n", loom_last_error());
            rc = 1;
            break;
        }
        if (r < 0) continue;
        const double n = o.n_gen, wall = (double)(b.ns - a.ns) * 1e-9;
        const long vol = b.nvcsw - a.nvcsw, inv = b.nivcsw - a.nivcsw;
        const double util = (b.cpu_s - a.cpu_s) / wall;
        printf("| %d | %.1f | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.2f | %.2f |\n",
               r + 1, n / wall, wall * 1e3 / n, (double)(vol + inv) / n, (double)vol / n,
               (double)inv / n, util, (double)(b.tp.runs - a.tp.runs) / n,
               (double)(b.tp.barriers - a.tp.barriers) / n, (double)(b.tp.sleeps - a.tp.sleeps) / n,
               (double)(b.tp.wakes - a.tp.wakes) / n);
        if (done < 64) {
            tps[done] = n / wall;
            csw[done] = (double)(vol + inv) / n;
            cpu[done] = util;
            done++;
        }
    }
    if (done > 0) {
        qsort(tps, (size_t)done, sizeof *tps, cmp_double);
        qsort(csw, (size_t)done, sizeof *csw, cmp_double);
        qsort(cpu, (size_t)done, sizeof *cpu, cmp_double);
        printf("median: %.1f t/s, %.2f context switches/token, %.2f cores busy\n", tps[done / 2],
               csw[done / 2], cpu[done / 2]);
    }
    for (int i = 0; i < o.busy && busy && busy[i] > 0; i++) {
        kill(busy[i], SIGKILL);
        waitpid(busy[i], NULL, 0);
    }
    free(busy);
    free(logits);
    loom_session_free(s);
    loom_gguf_free(g);
    free(data);
    return rc;
}
