#define _GNU_SOURCE
/*
 * `loom run`: generate text. stdout is the prompt and the pieces as they are sampled, and
 * nothing else (`loom run > out.txt` is the text); on stderr, as llama.cpp's, the memory per
 * device at load, then load time, prompt and generation speed, the scheduler's node and
 * split counts of the prompt and the one-token graphs (plus reductions per token under
 * tensor parallelism). --log-disable leaves only the text and errors.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/dist_cli.h"
#include "tools/model_cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: loom run [-m FILE] [-p PROMPT | -f FILE] [-n N] [options]\n\n"
            "Generates text with the model: stdout is the prompt and the text alone; the\n"
            "per-device memory at load, then speed and scheduling figures go to stderr\n"
            "(--log-disable: none of them).\n\n"
            "prompt and generation:\n"
            "  -p, --prompt TEXT         prompt (default \"Once upon a time\")\n"
            "  -f, --file FILE           read the prompt from a file (one trailing newline\n"
            "                            dropped, as llama.cpp's); a pipe too: -f /dev/stdin\n"
            "  --stdin                   the prompt from standard input (-f /dev/stdin)\n"
            "  -n, --n-predict, --predict N\n"
            "                            tokens to generate (default 64; -1 or -2 = until the\n"
            "                            end of text or of the context)\n"
            "  -e, --escape              process \\n \\r \\t \\' \\\" \\\\ \\xHH in the prompt and "
            "in -r\n"
            "                            (the default, as llama.cpp's)\n"
            "  --no-escape               take the prompt's backslashes literally\n"
            "  -r, --reverse-prompt TEXT stop when the output shows TEXT (repeatable)\n"
            "  --ignore-eos              never end at an end-of-generation token (EOS, the\n"
            "                            end of turn, ...): their logits are -inf\n"
            "  -sp, --special            print control tokens (\"<|im_end|>\") as their text\n"
            "  --no-display-prompt       do not echo the prompt\n"
            "  --verbose-prompt          list the prompt's tokens on stderr ('id -> 'piece'')\n"
            "  -no-cnv, --no-conversation, --no-warmup\n"
            "                            accepted: loom run never enters a chat mode and runs\n"
            "                            no warm-up pass (-cnv, -i and -if are refused)\n"
            "sampling (llama.cpp's order: penalties, top-k, top-p, min-p, temperature):\n"
            "  --temp, --temperature T   temperature; 0 (or below) = greedy (default 0.8, as\n"
            "                            llama.cpp's)\n"
            "  --top-k K                 keep the K most likely tokens (default 40; 0 or -1 = off)\n"
            "  --top-p P                 nucleus sampling (default 0.95; 1 = off)\n"
            "  --min-p P                 drop tokens below P x the top probability (default\n"
            "                            0.05; 0 = off)\n"
            "  --repeat-penalty X        penalize the last --repeat-last-n tokens (default 1 =\n"
            "                            off)\n"
            "  --repeat-last-n N         tokens the penalties look back over (default 64; 0 =\n"
            "                            off, -1 = the context)\n"
            "  --presence-penalty X      subtract X from a token seen in that window (default\n"
            "                            0 = off)\n"
            "  --frequency-penalty X     subtract X per time a token was seen there (default 0)\n"
            "  -s, --seed S              random seed (default: random, printed; -1 = random)\n"
            "output and memory:\n"
            "  --list-devices            list the devices (loom devices) and exit\n"
            "  --mlock                   lock the weights in memory (a warning if the limit\n"
            "                            refuses; see ulimit -l)\n"
            "  --logits-out FILE         write every evaluated position's logits, one line each:\n"
            "                            the position, then the logits, space-separated\n"
            "across processes:\n"
            "  --dist mpi                under mpirun: one rank per process, tensor parallelism\n"
            "                            across ranks (each holds and computes its slices; the\n"
            "                            AllReduce is MPI's), or with -sm layer one pipeline\n"
            "                            stage per rank; --devices is each rank's device (cpu\n"
            "                            or sim:1), or its devices (sim:2) for the hybrid: -sm\n"
            "                            layer (the default then) with each stage tensor\n"
            "                            parallel over them; rank 0 tokenizes, samples, prints\n"
            "%s",
            loom_model_opts_help());
}

static const char *const run_names[] = {"-h",
                                        "--help",
                                        "-p",
                                        "--prompt",
                                        "-f",
                                        "--file",
                                        "-n",
                                        "--n-predict",
                                        "--predict",
                                        "--stdin",
                                        "--list-devices",
                                        "--temperature",
                                        "-no-cnv",
                                        "--no-conversation",
                                        "--no-warmup",
                                        "-cnv",
                                        "--conversation",
                                        "-i",
                                        "--interactive",
                                        "-if",
                                        "--interactive-first",
                                        "-e",
                                        "--escape",
                                        "--no-escape",
                                        "-r",
                                        "--reverse-prompt",
                                        "--ignore-eos",
                                        "-sp",
                                        "--special",
                                        "--no-display-prompt",
                                        "--verbose-prompt",
                                        "--presence-penalty",
                                        "--frequency-penalty",
                                        "--mlock",
                                        "--temp",
                                        "--top-k",
                                        "--top-p",
                                        "--min-p",
                                        "--repeat-penalty",
                                        "--repeat-last-n",
                                        "-s",
                                        "--seed",
                                        "--logits-out",
                                        "--dist",
                                        NULL};

static void write_logits(FILE *f, int64_t pos0, const float *logits, int64_t n, int64_t V) {
    for (int64_t t = 0; t < n; t++) {
        fprintf(f, "%lld", (long long)(pos0 + t));
        for (int64_t i = 0; i < V; i++)
            fprintf(f, " %.6g", logits[t * V + i]);
        fputc('\n', f);
    }
}

/* The prompt file, whole: a regular file, or a pipe or terminal read to its end
 * (-f /dev/stdin), of at most 64 MiB; NULL and the error printed. */
static char *read_prompt(const char *path) {
    enum { MAX = 64 << 20 };
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "loom run: cannot open '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(sb.st_mode) || (S_ISREG(sb.st_mode) && sb.st_size > MAX)) {
        fprintf(stderr, "loom run: -f '%s' is not a file of at most 64 MiB\n", path);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    size_t n = 0, cap = S_ISREG(sb.st_mode) ? (size_t)sb.st_size + 1 : 4096;
    char *text = f ? malloc(cap) : NULL;
    while (text && !ferror(f)) {
        n += fread(text + n, 1, cap - 1 - n, f);
        if (n < cap - 1 || feof(f)) break;
        if (n >= MAX) {
            fprintf(stderr, "loom run: -f '%s' is longer than 64 MiB\n", path);
            free(text);
            fclose(f);
            return NULL;
        }
        char *more = realloc(text, cap * 2);
        if (!more) {
            free(text);
            text = NULL;
            break;
        }
        text = more;
        cap *= 2;
    }
    if (!f || !text || ferror(f)) {
        fprintf(stderr, "loom run: cannot read '%s': %s\n", path,
                f ? strerror(errno) : "out of memory");
        free(text);
        if (f) fclose(f);
        return NULL;
    }
    fclose(f);
    text[n] = 0;
    return text;
}

/* Ctrl-C during generation: the line ends, the figures are printed and run exits 130, as
 * llama.cpp's (a second Ctrl-C, the default action again, ends the process at once). */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
    signal(SIGINT, SIG_DFL);
}

static bool parse_seed(const char *v, uint64_t *out, bool *random) {
    char *end = NULL;
    errno = 0;
    if (v && !strcmp(v, "-1")) {
        *random = true;
        return true;
    }
    if (!v || !v[0] || v[0] == '-' || v[0] == '+') return false;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || errno) return false;
    *out = x;
    *random = false;
    return true;
}

static uint64_t random_seed(void) {
    uint64_t x = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&x, sizeof x, 1, f) != 1) x = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (f) fclose(f);
    return x & 0xffffffffu; /* 32 bits, as llama.cpp prints them */
}

typedef struct extra_sampling {
    float min_p, repeat_penalty, presence_penalty, frequency_penalty;
    long repeat_last_n;
} extra_sampling;

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* llama.cpp's penalties over the last repeat_last_n tokens, once per distinct token t seen
 * c times there: a positive logit divided by the repeat penalty, a negative one multiplied,
 * then c x frequency + presence subtracted (top-k, top-p, min-p and the temperature follow in
 * the sampler). scratch holds n_hist ids. */
static void apply_penalties(const extra_sampling *x, const int32_t *hist, int64_t n_hist,
                            int32_t *scratch, float *logits, int64_t V) {
    bool penalize =
        x->repeat_penalty != 1.0f || x->presence_penalty != 0.0f || x->frequency_penalty != 0.0f;
    if (penalize && x->repeat_last_n != 0) {
        int64_t from =
            x->repeat_last_n < 0 || x->repeat_last_n > n_hist ? 0 : n_hist - x->repeat_last_n;
        int64_t m = n_hist - from;
        memcpy(scratch, hist + from, (size_t)m * sizeof *scratch);
        qsort(scratch, (size_t)m, sizeof *scratch, cmp_id);
        for (int64_t i = 0; i < m;) {
            int64_t j = i;
            while (j < m && scratch[j] == scratch[i])
                j++;
            int32_t t = scratch[i];
            if (t >= 0 && t < V) {
                float l = logits[t];
                l = l > 0 ? l / x->repeat_penalty : l * x->repeat_penalty;
                logits[t] = l - (float)(j - i) * x->frequency_penalty - x->presence_penalty;
            }
            i = j;
        }
    }
}

/* The bytes a token prints as (at most cap): its piece, or with `special` a control token's
 * text ("<|im_end|>"), as llama.cpp's -sp. */
static size_t token_output(const loom_tokenizer *tok, int32_t id, bool special, char *buf,
                           size_t cap) {
    size_t n = special && loom_token_is_control(tok, id)
                   ? (size_t)snprintf(buf, cap, "%s", loom_token_text(tok, id))
                   : loom_token_to_piece(tok, id, buf, cap);
    return n < cap ? n : cap;
}

/* Reverse prompts (-r): a stop text each, and its token when it is a single token (a control
 * token such as "<|im_end|>" prints as nothing, so the text alone would not see it). */
#define RUN_MAX_RPROMPTS 16
typedef struct rprompts {
    int n;
    char *text[RUN_MAX_RPROMPTS];
    size_t len[RUN_MAX_RPROMPTS], max_len;
    int32_t token[RUN_MAX_RPROMPTS];
    char *tail; /* the last bytes of the output, tail_cap = max_len + 256 */
    size_t tail_len, tail_cap;
} rprompts;

static void tail_append(rprompts *r, const char *p, size_t n) {
    if (!r->n) return;
    if (n >= r->tail_cap) {
        p += n - r->tail_cap;
        n = r->tail_cap;
    }
    if (r->tail_len + n > r->tail_cap) {
        size_t drop = r->tail_len + n - r->tail_cap;
        memmove(r->tail, r->tail + drop, r->tail_len - drop);
        r->tail_len -= drop;
    }
    memcpy(r->tail + r->tail_len, p, n);
    r->tail_len += n;
}

/* Whether the newest token (id, its piece the last pn bytes of the tail) completes a stop. */
static bool rprompt_hit(const rprompts *r, int32_t id, size_t pn) {
    for (int k = 0; k < r->n; k++) {
        if (r->token[k] >= 0 && r->token[k] == id) return true;
        size_t l = r->len[k];
        if (!pn || !l || l > r->tail_len) continue;
        size_t from = r->tail_len > pn + l - 1 ? r->tail_len - pn - l + 1 : 0;
        if (memmem(r->tail + from, r->tail_len - from, r->text[k], l)) return true;
    }
    return false;
}

/* --mlock: the mapping of the file and the weights' host buffers locked in memory, as
 * llama.cpp's (a warning, not an error, when the limit refuses; the pages stay locked until
 * the process exits or unmaps them). */
static void lock_weights(const loom_model *m, FILE *warn) {
    size_t locked = 0;
    int err = 0;
    if (m->map && m->map_size) {
        if (mlock(m->map, m->map_size) == 0)
            locked += m->map_size;
        else
            err = errno;
    }
    for (int i = 0; i < m->n_buffers && !err; i++) {
        loom_buffer_t b = m->buffers[i];
        if (!b || !loom_buffer_is_host(b) || !loom_buffer_base(b) || !loom_buffer_size(b)) continue;
        if (mlock(loom_buffer_base(b), loom_buffer_size(b)) == 0)
            locked += loom_buffer_size(b);
        else
            err = errno;
    }
    if (err && warn) {
        struct rlimit rl = {0};
        getrlimit(RLIMIT_MEMLOCK, &rl);
        fprintf(warn,
                "loom run: warning: --mlock: cannot lock the weights in memory (after %zu bytes): "
                "%s (the limit is %llu bytes; raise it with ulimit -l)\n",
                locked, strerror(err), (unsigned long long)rl.rlim_cur);
    }
}

/* What a run measured, for the figures after the text. */
typedef struct run_figures {
    size_t n_prompt;
    int64_t n_gen, t_prompt, t_gen; /* tokens; microseconds */
    bool seed_random;
    const extra_sampling *xs;
    const loom_sampler_params *sp;
    const loom_cli_dist *cd;
    const loom_cli_mem_row *mem;
    int nm;
} run_figures;

/* The figures after the text (on stderr, as llama.cpp's, so stdout is the text alone):
 * model, devices, sampling, load time, weights per device, speeds, the graphs' node and
 * split counts and the reductions per token. */
static void print_figures(FILE *f, const loom_model_opts *o, loom_session *s,
                          const run_figures *r) {
    loom_session_stats st;
    loom_session_get_stats(s, &st);
    const loom_model *lm = loom_session_model(s);
    fprintf(f, "\n\n");
    fprintf(f, "model:      %s (%s, %lld layers, n_embd %lld, vocab %lld)\n",
            o->model ? o->model : "built-in synthetic (random weights)", lm->hp.arch,
            (long long)lm->hp.n_layer, (long long)lm->hp.n_embd, (long long)lm->hp.n_vocab);
    fprintf(f, "devices:    %s, split mode %s", o->sp.devices ? o->sp.devices : "cpu",
            loom_split_mode_name(loom_session_split_mode(s)));
    if (r->cd->d && r->cd->n_local > 1)
        fprintf(f, ", %d MPI ranks (each stage tensor parallel over %d devices)", r->cd->size,
                r->cd->n_local);
    else if (r->cd->d)
        fprintf(f, ", %d MPI ranks (one device each)", r->cd->size);
    fprintf(f, "\n");
    fprintf(f,
            "sampling:   seed %llu%s, temp %g, top-k %d, top-p %g, min-p %g, repeat-penalty %g "
            "(last %ld)\n",
            (unsigned long long)r->sp->seed, r->seed_random ? " (random; -s repeats it)" : "",
            (double)r->sp->temp, r->sp->top_k, (double)r->sp->top_p, (double)r->xs->min_p,
            (double)r->xs->repeat_penalty, r->xs->repeat_last_n);
    /* the weights: how fast they came in, where they went, how much is used in place */
    double mb = (double)lm->n_bytes / 1e6, ms = (double)lm->load_us / 1000.0;
    fprintf(f,
            "load time:  %.1f ms (weights %.2f MB in %.1f ms, %.0f MB/s; %.2f MB used in "
            "place from the mapped file)\n",
            (double)st.load_us / 1000.0, mb, ms, ms > 0 ? mb * 1000.0 / ms : 0.0,
            (double)lm->n_mapped_bytes / 1e6);
    fprintf(f, "weights per device:");
    for (int i = 0; i < r->nm; i++) {
        char w[32];
        loom_cli_format_bytes(w, sizeof w, r->mem[i].weights);
        fprintf(f, "%s %s %s", i ? "," : "", r->mem[i].name, w);
    }
    fprintf(f, "\n");
    fprintf(f, "prompt:     %zu tokens in %.1f ms (%.1f tokens/s)\n", r->n_prompt,
            (double)r->t_prompt / 1000.0,
            (double)r->n_prompt * 1e6 / (double)(r->t_prompt > 0 ? r->t_prompt : 1));
    fprintf(f, "generation: %lld tokens in %.1f ms (%.1f tokens/s)\n", (long long)r->n_gen,
            (double)r->t_gen / 1000.0,
            (double)(r->n_gen > 1 ? r->n_gen - 1 : 0) * 1e6 /
                (double)(r->t_gen > 0 ? r->t_gen : 1));
    fprintf(f, "prompt graph: graph nodes = %d, graph splits = %d\n",
            st.prompt_nodes ? st.prompt_nodes : st.gen_nodes,
            st.prompt_nodes ? st.prompt_splits : st.gen_splits);
    fprintf(f, "token graph:  graph nodes = %d, graph splits = %d\n", st.gen_nodes, st.gen_splits);
    if (loom_session_meta_backend(s))
        fprintf(f, "tensor parallel: %d subgraphs, %d allreduces, %llu bytes reduced per token\n",
                st.last_subgraphs, st.last_reductions, (unsigned long long)st.last_bytes_reduced);
}

int loom_cli_run(int argc, char **argv) {
    loom_model_opts o;
    loom_model_opts_init(&o);
    const char *prompt = "Once upon a time", *logits_out = NULL, *prompt_file = NULL;
    char lbuf[4096], fbuf[4096];
    bool prompt_given = false, seed_random = true, dist = false;
    bool escape = true, ignore_eos = false, special = false, display_prompt = true;
    bool mlock = false, verbose_prompt = false;
    rprompts rp = {0};
    loom_cli_dist cd = {.size = 1};
    long n_predict = 64;
    loom_sampler_params sp = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 0};
    extra_sampling xs = {.min_p = 0.05f, .repeat_penalty = 1.0f, .repeat_last_n = 64};
    const char *rp_arg[RUN_MAX_RPROMPTS];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = loom_model_opts_parse(&o, "run", argc, argv, &i);
        if (r < 0) goto usage_error;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            loom_model_opts_free(&o);
            return 0;
        }
        bool known = false;
        for (const char *const *n = run_names; *n && !known; n++)
            known = !strcmp(a, *n);
        if (!known) {
            loom_cli_unknown_option("run", a, run_names, loom_model_opts_names);
            goto usage_error;
        }
        if (!strcmp(a, "-no-cnv") || !strcmp(a, "--no-conversation") || !strcmp(a, "--no-warmup"))
            continue;
        if (!strcmp(a, "--list-devices")) { /* llama.cpp's: the list, then exit */
            char *dv[] = {"devices", NULL};
            loom_model_opts_free(&o);
            return loom_cli_devices(1, dv);
        }
        if (!strcmp(a, "--stdin")) {
            prompt_file = "/dev/stdin";
            continue;
        }
        if (!strcmp(a, "-cnv") || !strcmp(a, "--conversation") || !strcmp(a, "-i") ||
            !strcmp(a, "--interactive") || !strcmp(a, "-if") || !strcmp(a, "--interactive-first")) {
            fprintf(stderr,
                    "loom run: %s: loom run has no conversation or interactive mode; give the "
                    "whole prompt (with the model's chat template written out) by -p or -f\n",
                    a);
            goto usage_error;
        }
        bool flag = true;
        if (!strcmp(a, "-e") || !strcmp(a, "--escape"))
            escape = true;
        else if (!strcmp(a, "--no-escape"))
            escape = false;
        else if (!strcmp(a, "--ignore-eos"))
            ignore_eos = true;
        else if (!strcmp(a, "-sp") || !strcmp(a, "--special"))
            special = true;
        else if (!strcmp(a, "--no-display-prompt"))
            display_prompt = false;
        else if (!strcmp(a, "--verbose-prompt"))
            verbose_prompt = true;
        else if (!strcmp(a, "--mlock"))
            mlock = true;
        else
            flag = false;
        if (flag) continue;
        if (!v) {
            fprintf(stderr, "loom run: %s needs a value\n", a);
            goto usage_error;
        }
        i++;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            prompt = v;
            prompt_given = true;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(prompt_file = loom_cli_path(v, fbuf, sizeof fbuf))) goto usage_error;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict") || !strcmp(a, "--predict")) {
            int x;
            if (!loom_cli_parse_int("run", a, v, -2, 1 << 24, &x)) goto usage_error;
            n_predict = x < 0 ? -1 : x; /* llama.cpp's -2 (until the context is full) is -1 here */
        } else if (!strcmp(a, "--temp") || !strcmp(a, "--temperature")) {
            if (!loom_cli_parse_float("run", a, v, -1e6, 1e6, &sp.temp)) goto usage_error;
            if (sp.temp < 0) sp.temp = 0; /* llama.cpp clamps a negative temperature: greedy */
        } else if (!strcmp(a, "--top-p")) {
            if (!loom_cli_parse_float("run", a, v, 0, 1, &sp.top_p)) goto usage_error;
        } else if (!strcmp(a, "--min-p")) {
            if (!loom_cli_parse_float("run", a, v, 0, 1, &xs.min_p)) goto usage_error;
        } else if (!strcmp(a, "--repeat-penalty")) {
            if (!loom_cli_parse_float("run", a, v, 1e-6, 1e6, &xs.repeat_penalty)) goto usage_error;
        } else if (!strcmp(a, "--presence-penalty")) {
            if (!loom_cli_parse_float("run", a, v, -1e6, 1e6, &xs.presence_penalty))
                goto usage_error;
        } else if (!strcmp(a, "--frequency-penalty")) {
            if (!loom_cli_parse_float("run", a, v, -1e6, 1e6, &xs.frequency_penalty))
                goto usage_error;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reverse-prompt")) {
            if (rp.n == RUN_MAX_RPROMPTS) {
                fprintf(stderr, "loom run: at most %d reverse prompts (-r)\n", RUN_MAX_RPROMPTS);
                goto usage_error;
            }
            if (!v[0]) {
                fprintf(stderr, "loom run: %s needs a non-empty text\n", a);
                goto usage_error;
            }
            rp_arg[rp.n++] = v;
        } else if (!strcmp(a, "--repeat-last-n")) {
            int x;
            if (!loom_cli_parse_int("run", a, v, -1, 1 << 24, &x)) goto usage_error;
            xs.repeat_last_n = x;
        } else if (!strcmp(a, "--top-k")) {
            if (!loom_cli_parse_int("run", a, v, -1, 1 << 24, &sp.top_k)) goto usage_error;
            if (sp.top_k < 0) sp.top_k = 0; /* <= 0: off, as llama.cpp's */
        } else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) {
            if (!parse_seed(v, &sp.seed, &seed_random)) {
                fprintf(stderr,
                        "loom run: %s '%s' is not a seed (an unsigned integer, or -1 = random)\n",
                        a, v);
                goto usage_error;
            }
        } else if (!strcmp(a, "--dist")) {
            if (!loom_cli_dist_parse("run", v)) goto usage_error;
            dist = true;
        } else if (!strcmp(a, "--logits-out")) {
            if (!(logits_out = loom_cli_path(v, lbuf, sizeof lbuf))) goto usage_error;
        }
    }
    if (prompt_given && prompt_file) {
        fprintf(stderr, "loom run: -p and -f both give the prompt; use one\n");
        goto usage_error;
    }
    if (!loom_model_opts_finish(&o, "run")) goto usage_error;
    sp.min_p = xs.min_p;
    if (dist && !loom_cli_dist_setup(&cd, &o, "run")) {
        loom_cli_dist_free(&cd);
        loom_model_opts_free(&o);
        return 1;
    }
    /* rank 0 leads: it tokenizes, samples and prints; the others follow its tokens */
    const bool lead = cd.rank == 0;
    if (seed_random) sp.seed = random_seed();
    int rc = 1;
    loom_cli_mem_row mem[LOOM_META_MAX_DEVICES + 2];
    int nm = 0;
    loom_session *s = NULL;
    loom_sampler *smp = NULL;
    FILE *lf = NULL;
    int32_t *ids = NULL;
    float *logits = NULL, *work = NULL;
    char *file_text = NULL;
    int32_t *scratch = NULL;
    bool ok = true, catch_int = false;
    struct sigaction old_int;
    size_t plen = strlen(prompt);
    if (prompt_file && lead) {
        if (!(file_text = read_prompt(prompt_file)))
            ok = false;
        else if ((plen = strlen(prompt = file_text)) > 0 && file_text[plen - 1] == '\n')
            file_text[--plen] = 0; /* one trailing newline dropped, as llama.cpp's -f */
    } else if (prompt_given && lead && !(prompt = file_text = strdup(prompt))) {
        fprintf(stderr, "loom run: out of memory\n");
        ok = false;
    }
    if (ok && lead && escape && file_text) plen = loom_cli_process_escapes(file_text, plen);
    for (int k = 0; k < rp.n && ok; k++) {
        size_t l = strlen(rp_arg[k]);
        if (!(rp.text[k] = strdup(rp_arg[k]))) {
            fprintf(stderr, "loom run: out of memory\n");
            ok = false;
            break;
        }
        rp.len[k] = escape ? loom_cli_process_escapes(rp.text[k], l) : l;
        if (rp.len[k] > rp.max_len) rp.max_len = rp.len[k];
    }
    rp.tail_cap = rp.max_len + 256;
    if (ok && rp.n && !(rp.tail = malloc(rp.tail_cap))) {
        fprintf(stderr, "loom run: out of memory\n");
        ok = false;
    }
    /* every rank opens the model and places its share; a failure anywhere ends every rank */
    ok = ok && loom_model_opts_open(&o, "run") && (s = loom_model_opts_session(&o, "run"));
    if (!loom_cli_dist_agree(&cd, ok, "run")) goto out;
    if (!loom_cli_dist_same_session(&cd, s, &o, "run")) goto out;
    const loom_tokenizer *tok = loom_session_tokenizer(s);
    if (!tok) { /* every rank has the same file: all stop here */
        if (lead)
            fprintf(stderr, "loom run: the model has no vocabulary (tokenizer.ggml.model "
                            "'none'): run cannot tokenize a prompt; loom bench runs it\n");
        goto out;
    }
    const int64_t V = loom_session_model(s)->hp.n_vocab, n_ctx = loom_session_n_ctx(s);
    if (mlock && lead) lock_weights(loom_session_model(s), loom_model_opts_info(&o));
    for (int k = 0; k < rp.n; k++) { /* a stop that is one token is also matched as that token */
        int32_t one[2];
        size_t nt = 0;
        rp.token[k] =
            loom_tokenize(tok, rp.text[k], rp.len[k], false, one, 2, &nt) == LOOM_OK && nt == 1
                ? one[0]
                : -1;
    }
    loom_clear_error();
    size_t cap = plen + 8, n_prompt = 0;
    if (cap < (size_t)n_ctx) cap = (size_t)n_ctx;
    ids = malloc(cap * sizeof *ids);
    ok = ids != NULL;
    if (lead && ids) {
        /* cap >= n_ctx: a prompt needing more ids (LOOM_ERR_FULL, n_prompt = the count) is
         * refused below as longer than the context, with its true length */
        loom_status tst =
            loom_tokenize(tok, prompt, plen, loom_tokenizer_add_bos(tok), ids, cap, &n_prompt);
        if (tst && tst != LOOM_ERR_FULL) {
            fprintf(stderr, "loom run: cannot tokenize the prompt: %s\n", loom_last_error());
            ok = false;
        }
    }
    if (lead && ok && n_prompt == 0) {
        fprintf(stderr, "loom run: the prompt is empty and the vocabulary has no BOS token\n");
        ok = false;
    }
    if (lead && ok && (int64_t)n_prompt > n_ctx) {
        fprintf(stderr, "loom run: the prompt (%zu tokens) does not fit the context of %lld (-c)\n",
                n_prompt, (long long)n_ctx);
        ok = false;
    }
    if (lead && ok && verbose_prompt) { /* llama-cli's listing of the prompt tokens */
        fprintf(stderr, "prompt: %zu tokens\n", n_prompt);
        for (size_t k = 0; k < n_prompt && k < cap; k++) {
            char pc[256]; /* control tokens shown, as llama-cli shows them */
            size_t pn = token_output(tok, ids[k], true, pc, sizeof pc);
            fprintf(stderr, "%6d -> '%.*s'\n", ids[k], (int)pn, pc);
        }
    }
    if (!ok) loom_error(LOOM_ERR_INVALID_ARG, "the prompt was refused");
    if (!loom_cli_dist_agree(&cd, ok, "run")) goto out;
    bool all_logits = logits_out != NULL; /* the graphs every rank builds depend on it */
    if (cd.d) { /* rank 0 leads: its prompt tokens, -n and --logits-out are everyone's */
        int64_t ctl[3] = {(int64_t)n_prompt, n_predict, all_logits};
        if (loom_dist_bcast(cd.d, ctl, sizeof ctl, 0) ||
            loom_dist_bcast(cd.d, ids, (size_t)ctl[0] * sizeof *ids, 0)) {
            fprintf(stderr, "loom run: rank %d: %s\n", cd.rank, loom_last_error());
            loom_dist_abort(cd.d, 1);
        }
        n_prompt = (size_t)ctl[0];
        n_predict = (long)ctl[1];
        all_logits = ctl[2] != 0;
    }
    if (n_predict < 0 || (int64_t)n_prompt + n_predict > n_ctx) {
        if (n_predict >= 0 && lead && loom_model_opts_info(&o))
            fprintf(loom_model_opts_info(&o),
                    "loom run: -n %ld does not fit the context of %lld after %zu prompt tokens: "
                    "generating %lld\n",
                    n_predict, (long long)n_ctx, n_prompt, (long long)(n_ctx - (int64_t)n_prompt));
        n_predict = n_ctx - (int64_t)n_prompt;
    }
    {
        /* the memory at load, with the prompt's compute buffers planned */
        loom_graph *pg = NULL;
        int64_t nb = o.sp.n_batch > 0 ? o.sp.n_batch : 512;
        ok = true;
        if (loom_session_plan(s, (int64_t)n_prompt < nb ? (int64_t)n_prompt : nb, &pg)) {
            fprintf(stderr, "loom run: %s\n", loom_last_error());
            ok = false; /* agreed below: no rank goes on alone */
        } else {
            nm = loom_cli_session_memory(s, mem, (int)(sizeof mem / sizeof mem[0]));
            if (lead && loom_model_opts_info(&o))
                loom_cli_print_memory(loom_model_opts_info(&o), "memory per device (at load):",
                                      mem, nm);
        }
    }
    if (ok && lead && logits_out && !(lf = fopen(logits_out, "w"))) {
        fprintf(stderr, "loom run: cannot write '%s': %s\n", logits_out, strerror(errno));
        loom_error(LOOM_ERR_IO, "cannot write '%s'", logits_out);
        ok = false;
    }
    if (ok) {
        logits = malloc(sizeof(float) * (size_t)V * (all_logits ? n_prompt : 1));
        work = malloc(sizeof(float) * (size_t)V);
        scratch = malloc(sizeof(int32_t) * (size_t)(n_ctx > 0 ? n_ctx : 1));
        smp = loom_sampler_new(&sp);
        if (!logits || !work || !scratch || !smp) {
            fprintf(stderr, "loom run: out of memory\n");
            loom_error(LOOM_ERR_NOMEM, "out of memory");
            ok = false;
        }
    }
    /* from here on every rank runs the same graphs in step (collectives inside): a failure
     * on one rank cannot reach the others cleanly, so it ends them all */
    if (!loom_cli_dist_agree(&cd, ok, "run")) goto out;
    if (!o.model && lead && loom_model_opts_info(&o))
        fprintf(loom_model_opts_info(&o),
                "note: the built-in model has random weights, so its text is noise: look at the "
                "per-device memory above and the graph splits and allreduces below\n");
    /* Ctrl-C is caught from before the prompt shows; in one process only: under --dist mpi
     * the ranks must stop together (mpirun ends them) */
    struct sigaction on_int = {.sa_handler = on_sigint};
    interrupted = 0;
    catch_int = !cd.d && sigaction(SIGINT, &on_int, &old_int) == 0;
    if (lead && display_prompt) {
        fwrite(prompt, 1, plen, stdout);
        fflush(stdout);
    }
    int64_t t0 = loom_time_us();
    if (loom_session_eval(s, ids, (int64_t)n_prompt, all_logits, logits)) {
        fprintf(stderr, "\nloom run: %s\n", loom_last_error());
        if (cd.d) loom_dist_abort(cd.d, 1);
        goto out;
    }
    int64_t t_prompt = loom_time_us() - t0;
    const float *last = all_logits ? logits + (n_prompt - 1) * V : logits;
    if (lf) write_logits(lf, 0, logits, (int64_t)n_prompt, V);
    int64_t n_gen = 0, n_hist = (int64_t)n_prompt, t1 = loom_time_us();
    for (; n_gen < n_predict && !interrupted; n_gen++) {
        /* rank 0 leads: it samples, prints, and decides whether the token is evaluated (an
         * end of generation, a reverse prompt, -n); the other ranks follow its decision
         * (msg), so options only rank 0 reads (-r, -sp, --ignore-eos, sampling) cannot
         * make one rank stop while the others wait for it in the next evaluation */
        int32_t msg[2] = {-1, 0}; /* the token; 1: evaluate it, 0: stop */
        if (lead) {
            memcpy(work, last, sizeof(float) * (size_t)V);
            if (ignore_eos) /* llama.cpp's way: every end-of-generation token biased to -inf */
                for (int64_t t = 0; t < V; t++)
                    if (loom_token_is_eog(tok, (int32_t)t)) work[t] = -INFINITY;
            apply_penalties(&xs, ids, n_hist, scratch, work, V);
            const int32_t next = loom_sampler_sample(smp, work, V);
            msg[0] = next;
            /* an end of generation (EOS, the end of turn ...) ends it, printed only with -sp */
            const bool eog = loom_token_is_eog(tok, next);
            if (!eog || special) {
                char piece[256];
                size_t pn = token_output(tok, next, special, piece, sizeof piece);
                fwrite(piece, 1, pn, stdout);
                fflush(stdout);
                if (!eog) {
                    tail_append(&rp, piece, pn);
                    if (n_gen + 1 == n_predict || rprompt_hit(&rp, next, pn))
                        n_gen++; /* counted, not evaluated */
                    else
                        msg[1] = 1;
                }
            }
        }
        if (cd.d && loom_dist_bcast(cd.d, msg, sizeof msg, 0)) { /* rank 0's choice */
            fprintf(stderr, "\nloom run: rank %d: %s\n", cd.rank, loom_last_error());
            loom_dist_abort(cd.d, 1);
        }
        if (!msg[1]) break;
        int32_t next = msg[0];
        if (n_hist < n_ctx) ids[n_hist++] = next;
        if (loom_session_eval(s, &next, 1, false, logits)) {
            fprintf(stderr, "\nloom run: %s\n", loom_last_error());
            if (cd.d) loom_dist_abort(cd.d, 1);
            goto out;
        }
        last = logits;
        if (lf) write_logits(lf, loom_session_n_past(s) - 1, logits, 1, V);
    }
    int64_t t_gen = loom_time_us() - t1;
    if (lf) {
        /* a full disk or /dev/full shows here, from the buffered writes */
        bool bad = fflush(lf) != 0 || ferror(lf);
        int err = errno;
        if (fclose(lf) != 0 && !bad) {
            bad = true;
            err = errno;
        }
        lf = NULL;
        if (bad) {
            fprintf(stderr, "\nloom run: cannot write '%s': %s\n", logits_out, strerror(err));
            goto out;
        }
    }
    if (cd.d && loom_model_opts_info(&o))
        loom_cli_dist_print_rank_memory(&cd, s, loom_model_opts_info(&o));
    if (!lead) {
        rc = 0;
        goto out;
    }
    FILE *info = loom_model_opts_info(&o);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "loom run: cannot write the output: %s\n", strerror(errno));
        goto out;
    }
    if (info) {
        run_figures fig = {.n_prompt = n_prompt,
                           .n_gen = n_gen,
                           .t_prompt = t_prompt,
                           .t_gen = t_gen,
                           .seed_random = seed_random,
                           .xs = &xs,
                           .sp = &sp,
                           .cd = &cd,
                           .mem = mem,
                           .nm = nm};
        /* composed apart, then written at once: under mpirun the other ranks' lines share
         * stderr, and a line written in pieces could be cut by one of theirs */
        char *block = NULL;
        size_t block_len = 0;
        FILE *mf = open_memstream(&block, &block_len);
        if (mf) {
            print_figures(mf, &o, s, &fig);
            fclose(mf);
            fwrite(block, 1, block_len, info);
            fflush(info);
        } else {
            print_figures(info, &o, s, &fig);
        }
        free(block);
    }
    if (interrupted) {
        rc = 130; /* 128 + SIGINT, as llama.cpp's */
        goto out;
    }
    rc = 0;
out:
    if (catch_int) sigaction(SIGINT, &old_int, NULL);
    if (lf) fclose(lf);
    free(file_text);
    free(scratch);
    for (int k = 0; k < rp.n; k++)
        free(rp.text[k]);
    free(rp.tail);
    free(logits);
    free(work);
    free(ids);
    loom_sampler_free(smp);
    loom_session_free(s);
    loom_model_opts_free(&o);
    loom_cli_dist_free(&cd);
    return rc;
usage_error:
    loom_model_opts_free(&o);
    return 2;
}
