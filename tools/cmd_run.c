/*
 * `loom run`: generate text. Streams the pieces as they are sampled, then prints load time,
 * prompt and generation speed, and the scheduler's node and split counts of the prompt
 * and the one-token graphs (plus reductions per token under tensor parallelism).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/model_cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: loom run [-m FILE] [-p PROMPT] [-n N] [options]\n\n"
               "Generates text with the model and prints speed and scheduling figures.\n\n"
               "  -p, --prompt TEXT      prompt (default \"Once upon a time\")\n"
               "  -n, --n-predict N      tokens to generate (default 64)\n"
               "  --temp T               temperature; 0 = greedy (default 0)\n"
               "  --top-k K              keep the K most likely tokens (default 40; 0 = off)\n"
               "  --top-p P              nucleus sampling (default 0.95; 1 = off)\n"
               "  --seed S               random seed (default 42)\n"
               "  --logits-out FILE      write every evaluated position's logits, one line each:\n"
               "                         the position, then the logits, space-separated\n"
               "%s",
            loom_model_opts_help());
}

static bool parse_float(const char *v, float *out) {
    char *end = NULL;
    errno = 0;
    float x = v ? strtof(v, &end) : 0;
    if (!v || !v[0] || *end || errno) return false;
    *out = x;
    return true;
}

static void write_logits(FILE *f, int64_t pos0, const float *logits, int64_t n, int64_t V) {
    for (int64_t t = 0; t < n; t++) {
        fprintf(f, "%lld", (long long)(pos0 + t));
        for (int64_t i = 0; i < V; i++) fprintf(f, " %.6g", logits[t * V + i]);
        fputc('\n', f);
    }
}

int loom_cli_run(int argc, char **argv) {
    loom_model_opts o;
    loom_model_opts_init(&o);
    const char *prompt = "Once upon a time", *logits_out = NULL;
    long n_predict = 64;
    loom_sampler_params sp = {.temp = 0.0f, .top_k = 40, .top_p = 0.95f, .seed = 42};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = loom_model_opts_parse(&o, "run", argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && v) {
            prompt = v;
            i++;
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--n-predict")) && v) {
            int x;
            if (!loom_cli_parse_int("run", a, v, 0, 1 << 20, &x)) return 2;
            n_predict = x;
            i++;
        } else if (!strcmp(a, "--temp") && v && parse_float(v, &sp.temp)) {
            i++;
        } else if (!strcmp(a, "--top-p") && v && parse_float(v, &sp.top_p)) {
            i++;
        } else if (!strcmp(a, "--top-k") && v) {
            if (!loom_cli_parse_int("run", a, v, 0, 1 << 24, &sp.top_k)) return 2;
            i++;
        } else if (!strcmp(a, "--seed") && v) {
            sp.seed = strtoull(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--logits-out") && v) {
            logits_out = v;
            i++;
        } else {
            fprintf(stderr, "loom run: unknown or incomplete option '%s' (see loom run --help)\n", a);
            return 2;
        }
    }
    int rc = 1;
    loom_session *s = NULL;
    loom_sampler *smp = NULL;
    FILE *lf = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    if (!loom_model_opts_open(&o, "run") || !(s = loom_model_opts_session(&o, "run"))) goto out;
    const loom_tokenizer *tok = loom_session_tokenizer(s);
    const int64_t V = loom_session_model(s)->hp.n_vocab;
    size_t plen = strlen(prompt), cap = plen + 8, n_prompt = 0;
    ids = malloc(cap * sizeof *ids);
    if (!ids || loom_tokenize(tok, prompt, plen, loom_tokenizer_add_bos(tok), ids, cap, &n_prompt)) {
        fprintf(stderr, "loom run: cannot tokenize the prompt: %s\n", loom_last_error());
        goto out;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "loom run: the prompt is empty and the vocabulary has no BOS token\n");
        goto out;
    }
    if ((int64_t)n_prompt + n_predict > loom_session_n_ctx(s)) {
        n_predict = loom_session_n_ctx(s) - (int64_t)n_prompt;
        if (n_predict < 0) {
            fprintf(stderr, "loom run: the prompt (%zu tokens) does not fit the context of %lld\n",
                    n_prompt, (long long)loom_session_n_ctx(s));
            goto out;
        }
    }
    if (logits_out && !(lf = fopen(logits_out, "w"))) {
        fprintf(stderr, "loom run: cannot write '%s': %s\n", logits_out, strerror(errno));
        goto out;
    }
    logits = malloc(sizeof(float) * (size_t)V * (lf ? n_prompt : 1));
    smp = loom_sampler_new(&sp);
    if (!logits || !smp) {
        fprintf(stderr, "loom run: out of memory\n");
        goto out;
    }
    fputs(prompt, stdout);
    fflush(stdout);
    int64_t t0 = loom_time_us();
    if (loom_session_eval(s, ids, (int64_t)n_prompt, lf != NULL, logits)) {
        fprintf(stderr, "\nloom run: %s\n", loom_last_error());
        goto out;
    }
    int64_t t_prompt = loom_time_us() - t0;
    const float *last = lf ? logits + (n_prompt - 1) * V : logits;
    if (lf) write_logits(lf, 0, logits, (int64_t)n_prompt, V);
    int64_t n_gen = 0, t1 = loom_time_us();
    for (; n_gen < n_predict; n_gen++) {
        int32_t next = loom_sampler_sample(smp, last, V);
        if (next == loom_tokenizer_eos(tok)) break;
        char piece[256];
        size_t pn = loom_token_to_piece(tok, next, piece, sizeof piece);
        fwrite(piece, 1, pn < sizeof piece ? pn : sizeof piece, stdout);
        fflush(stdout);
        if (n_gen + 1 == n_predict) {
            n_gen++;
            break;
        }
        if (loom_session_eval(s, &next, 1, false, logits)) {
            fprintf(stderr, "\nloom run: %s\n", loom_last_error());
            goto out;
        }
        last = logits;
        if (lf) write_logits(lf, loom_session_n_past(s) - 1, logits, 1, V);
    }
    int64_t t_gen = loom_time_us() - t1;
    loom_session_stats st;
    loom_session_get_stats(s, &st);
    printf("\n\n");
    printf("model:      %s (%s, %lld layers, n_embd %lld, vocab %lld)\n", o.model ? o.model : "built-in synthetic",
           loom_session_model(s)->hp.arch, (long long)loom_session_model(s)->hp.n_layer,
           (long long)loom_session_model(s)->hp.n_embd, (long long)V);
    printf("devices:    %s, split mode %s\n", o.sp.devices ? o.sp.devices : "cpu",
           loom_split_mode_name(loom_session_split_mode(s)));
    printf("load time:  %.1f ms\n", (double)st.load_us / 1000.0);
    printf("prompt:     %zu tokens in %.1f ms (%.1f tokens/s)\n", n_prompt, (double)t_prompt / 1000.0,
           (double)n_prompt * 1e6 / (double)(t_prompt > 0 ? t_prompt : 1));
    printf("generation: %lld tokens in %.1f ms (%.1f tokens/s)\n", (long long)n_gen, (double)t_gen / 1000.0,
           (double)(n_gen > 1 ? n_gen - 1 : 0) * 1e6 / (double)(t_gen > 0 ? t_gen : 1));
    printf("prompt graph: graph nodes = %d, graph splits = %d\n", st.prompt_nodes ? st.prompt_nodes : st.gen_nodes,
           st.prompt_nodes ? st.prompt_splits : st.gen_splits);
    printf("token graph:  graph nodes = %d, graph splits = %d\n", st.gen_nodes, st.gen_splits);
    if (loom_session_meta_backend(s))
        printf("tensor parallel: %d subgraphs, %d allreduces, %llu bytes reduced per token\n",
               st.last_subgraphs, st.last_reductions, (unsigned long long)st.last_bytes_reduced);
    rc = 0;
out:
    if (lf) fclose(lf);
    free(logits);
    free(ids);
    loom_sampler_free(smp);
    loom_session_free(s);
    loom_model_opts_free(&o);
    return rc;
}
