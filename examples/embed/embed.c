/*
 * embed: what an engine that links loom does (built outside Bazel with `make`, against an
 * installed loom found by pkg-config; see docs/embedding.md).
 *
 *   1. Generation with tensor parallelism: a GGUF model placed on a meta device over N sim
 *      devices through the session API, greedy decoding; a CPU-only session evaluates the
 *      same tokens and every step's logits are compared with it.
 *   2. Its own graph: y = W_down * (W_up * x)^2 built with the op builders, the weights split
 *      across a meta device over the sim devices (W_up by rows, W_down by columns, so the
 *      result is a partial sum the meta device all-reduces), run through the scheduler
 *      [meta, CPU]; checked against the same graph on the CPU backend.
 *
 * Usage: embed [MODEL.gguf | synth (default: a small synthetic llama made in memory)]
 *              [N_DEVICES (default 2)] [N_TOKENS (default 24)]
 * Exit status 0 when both checks pass.
 */
#include <loom/gguf.h>
#include <loom/loom.h>
#include <loom/meta.h>
#include <loom/model.h>
#include <loom/sched.h>
#include <loom/session.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(st, what)                                                                            \
    do {                                                                                           \
        if ((st) != LOOM_OK) {                                                                     \
            fprintf(stderr, "embed: %s: %s\n", what, loom_last_error());                           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static float max_abs_diff(const float *a, const float *b, size_t n, float *scale) {
    float d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        float e = fabsf(a[i] - b[i]);
        if (e > d) d = e;
        if (fabsf(b[i]) > s) s = fabsf(b[i]);
    }
    *scale = s;
    return d;
}

/* ---------------------------------------------------------------- 1. generation */

/* model: a GGUF path, or NULL to use g (borrowed). */
static int generate(const char *model, const loom_gguf *g, int n_dev, int n_gen) {
    char spec[32];
    snprintf(spec, sizeof spec, "sim:%d", n_dev);
    loom_session_params p = loom_session_params_default();
    p.devices = spec;
    p.split_mode = LOOM_SPLIT_MODE_TENSOR;
    p.n_ctx = 256;
    loom_session *tp = NULL, *cpu = NULL;
    CHECK(loom_session_new(model, g, &p, &tp), "tensor-parallel session");
    loom_session_params pc = loom_session_params_default();
    pc.devices = "cpu";
    pc.n_ctx = 256;
    CHECK(loom_session_new(model, g, &pc, &cpu), "CPU session");
    printf("model %s on %s (%d devices, split %s)\n", model ? model : "(synthetic)",
           loom_dev_name(loom_backend_device(loom_session_meta_backend(tp))),
           loom_session_n_devices(tp), loom_split_mode_name(loom_session_split_mode(tp)));

    const loom_tokenizer *tok = loom_session_tokenizer(tp);
    const char *prompt = "Once upon a time";
    int32_t ids[64];
    size_t n = 0;
    CHECK(loom_tokenize(tok, prompt, strlen(prompt), true, ids, 64, &n), "tokenize");
    const int64_t n_vocab = loom_tokenizer_n_vocab(tok);
    float *lt = malloc(sizeof(float) * (size_t)n_vocab);
    float *lc = malloc(sizeof(float) * (size_t)n_vocab);
    loom_sampler_params sp = {.temp = 0};
    loom_sampler *greedy = loom_sampler_new(&sp);
    if (!lt || !lc || !greedy) return 1;

    printf("%s", prompt);
    float worst = 0, scale = 0;
    int32_t *batch = ids;
    int64_t n_batch = (int64_t)n;
    int32_t next = 0;
    for (int i = 0; i < n_gen; i++) {
        CHECK(loom_session_eval(tp, batch, n_batch, false, lt), "eval (tensor parallel)");
        CHECK(loom_session_eval(cpu, batch, n_batch, false, lc), "eval (CPU)");
        float d = max_abs_diff(lt, lc, (size_t)n_vocab, &scale);
        if (d > worst) worst = d;
        next = loom_sampler_sample(greedy, lt, n_vocab);
        if (loom_token_is_eog(tok, next)) break; /* EOS, an end of turn, ... */
        char piece[64];
        size_t len = loom_token_to_piece(tok, next, piece, sizeof piece);
        printf("%.*s", (int)(len < sizeof piece ? len : sizeof piece), piece);
        fflush(stdout);
        batch = &next;
        n_batch = 1;
    }
    printf("\n");
    loom_session_stats st;
    loom_session_get_stats(tp, &st);
    printf("logits vs CPU: max |diff| %.3g (logit scale %.3g); %d reductions per token\n", worst,
           scale, st.last_reductions);
    loom_sampler_free(greedy);
    free(lt);
    free(lc);
    loom_session_free(tp);
    loom_session_free(cpu);
    if (!(worst <= 1e-3f * (scale > 1 ? scale : 1))) {
        fprintf(stderr, "embed: tensor-parallel logits differ from the CPU\n");
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- 2. own graph */

enum { E = 64, F = 96, T = 5 };

/* Split states of the static tensors: W_up by rows (its ne[1]), W_down by columns (ne[0]);
 * everything else (the input) is mirrored. */
static loom_status leaf(const loom_tensor *t, loom_split_state *out, void *ud) {
    int n = *(const int *)ud;
    if (strcmp(t->name, "w_up") == 0)
        return loom_split_state_even(out, LOOM_SPLIT_AXIS_1, n, t->ne[1], 1, 0);
    if (strcmp(t->name, "w_down") == 0)
        return loom_split_state_even(out, LOOM_SPLIT_AXIS_0, n, t->ne[0], 1, 0);
    return LOOM_OK; /* out is MIRRORED already */
}

typedef struct {
    loom_ctx *wctx; /* the weights (its own context, so they get their own buffer) */
    loom_ctx *ctx;  /* the input and the ops */
    loom_tensor *w_up, *w_down, *x, *y;
    loom_graph *g;
} block;

/* own_weight_ctx false: everything in one context. */
static loom_status build(block *b, bool own_weight_ctx) {
    loom_ctx_params cp = {.mem_size = 64 * loom_tensor_overhead() +
                                      loom_graph_overhead(LOOM_DEFAULT_GRAPH_SIZE),
                          .no_alloc = true};
    b->ctx = loom_ctx_new(cp);
    b->wctx = own_weight_ctx ? loom_ctx_new(cp) : b->ctx;
    if (!b->ctx || !b->wctx) return loom_last_status();
    b->w_up = loom_new_tensor_2d(b->wctx, LOOM_TYPE_F32, E, F);
    b->w_down = loom_new_tensor_2d(b->wctx, LOOM_TYPE_F32, F, E);
    b->x = loom_new_tensor_2d(b->ctx, LOOM_TYPE_F32, E, T);
    loom_set_name(b->w_up, "w_up");
    loom_set_name(b->w_down, "w_down");
    loom_set_name(b->x, "x");
    loom_set_input(b->x);
    loom_tensor *h = loom_mul_mat(b->ctx, b->w_up, b->x); /* [F, T] */
    h = loom_mul(b->ctx, h, h);
    b->y = loom_mul_mat(b->ctx, b->w_down, h); /* [E, T] */
    if (!b->y) return loom_last_status();
    loom_set_name(b->y, "y");
    loom_set_output(b->y);
    b->g = loom_graph_new(b->ctx, LOOM_DEFAULT_GRAPH_SIZE);
    if (!b->g) return loom_last_status();
    return loom_graph_build_forward(b->g, b->y);
}

static void block_free(block *b) {
    if (b->wctx != b->ctx) loom_ctx_free(b->wctx);
    loom_ctx_free(b->ctx);
}

static void fill(float *v, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f;
    }
}

static int own_graph(int n_dev) {
    static float w_up[E * F], w_down[F * E], x[E * T], y_meta[E * T], y_cpu[E * T];
    fill(w_up, E * F, 1);
    fill(w_down, F * E, 2);
    fill(x, E * T, 3);

    /* The CPU reference: weights and graph in CPU memory, computed by the CPU backend. */
    block c = {0};
    CHECK(build(&c, false), "build (CPU)");
    loom_backend_t cpu = loom_cpu_backend_new(0);
    if (!cpu) CHECK(loom_last_status(), "CPU backend");
    loom_buffer_t cbuf = loom_alloc_ctx_tensors(c.ctx, loom_cpu_buffer_type());
    if (!cbuf) CHECK(loom_last_status(), "CPU buffer");
    loom_tensor_set(c.w_up, w_up, 0, sizeof w_up);
    loom_tensor_set(c.w_down, w_down, 0, sizeof w_down);
    loom_tensor_set(c.x, x, 0, sizeof x);
    CHECK(loom_backend_graph_compute(cpu, c.g), "CPU compute");
    loom_tensor_get(c.y, y_cpu, 0, sizeof y_cpu);

    /* The same graph on a meta device over n_dev sim devices, through the scheduler
     * [meta, CPU]: the weights in the meta buffer type (split by leaf()), the rest placed
     * and allocated by the scheduler. */
    char spec[32];
    snprintf(spec, sizeof spec, "sim:%d", n_dev);
    loom_dev_t devs[16];
    size_t nd = 0;
    CHECK(loom_devices_from_spec(spec, devs, 16, &nd), "sim devices");
    loom_dev_t meta = NULL;
    int n = (int)nd;
    CHECK(loom_meta_device_new(devs, n, leaf, &n, &meta), "meta device");
    block m = {0};
    CHECK(build(&m, true), "build (meta)");
    loom_buffer_t wbuf = loom_alloc_ctx_tensors(m.wctx, loom_dev_buffer_type(meta));
    if (!wbuf) CHECK(loom_last_status(), "meta weight buffer");
    loom_buffer_set_usage(wbuf, LOOM_BUFFER_USAGE_WEIGHTS);
    loom_tensor_set(m.w_up, w_up, 0, sizeof w_up);
    loom_tensor_set(m.w_down, w_down, 0, sizeof w_down);
    loom_backend_t be[2] = {loom_dev_init(meta, NULL), cpu};
    if (!be[0]) CHECK(loom_last_status(), "meta backend");
    loom_sched *sched = loom_sched_new(be, NULL, 2, LOOM_DEFAULT_GRAPH_SIZE, false, true);
    if (!sched) CHECK(loom_last_status(), "scheduler");
    CHECK(loom_sched_alloc_graph(sched, m.g), "schedule");
    loom_tensor_set(m.x, x, 0, sizeof x);
    CHECK(loom_sched_graph_compute(sched, m.g), "compute on the meta device");
    loom_tensor_get(m.y, y_meta, 0, sizeof y_meta);
    loom_backend_t ran_on = loom_sched_get_tensor_backend(sched, m.y);

    float scale = 0, d = max_abs_diff(y_meta, y_cpu, E * T, &scale);
    printf("own graph: y computed on %s via the scheduler (%d splits); max |diff| vs CPU "
           "%.3g (scale %.3g)\n",
           ran_on ? loom_backend_name(ran_on) : "?", loom_sched_get_n_splits(sched), d, scale);
    bool on_meta = ran_on == be[0];
    loom_sched_free(sched);
    loom_backend_free(be[0]);
    loom_buffer_free(wbuf);
    block_free(&m);
    loom_meta_device_free(meta);
    loom_buffer_free(cbuf);
    loom_backend_free(cpu);
    block_free(&c);
    if (!on_meta) {
        fprintf(stderr, "embed: the scheduler did not run the block on the meta device\n");
        return 1;
    }
    if (!(d <= 1e-5f * (scale > 1 ? scale : 1))) {
        fprintf(stderr, "embed: the meta device's result differs from the CPU\n");
        return 1;
    }
    return 0;
}

/* A small llama model with random weights, in memory (when no GGUF file is given). */
static loom_status synth_model(void **data, loom_gguf **g) {
    loom_synth_params sp = loom_synth_params_default();
    loom_gguf_writer *w = NULL;
    size_t size = 0;
    loom_status st = loom_model_synth(&sp, &w);
    if (st == LOOM_OK) st = loom_gguf_write_memory(w, data, &size);
    loom_gguf_writer_free(w);
    if (st == LOOM_OK) st = loom_gguf_open_memory(*data, size, g);
    return st;
}

int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == '-') {
        fprintf(stderr, "usage: %s [MODEL.gguf|synth] [N_DEVICES] [N_TOKENS]\n", argv[0]);
        return 2;
    }
    const char *model = argc > 1 && strcmp(argv[1], "synth") != 0 ? argv[1] : NULL;
    int n_dev = argc > 2 ? atoi(argv[2]) : 2;
    int n_gen = argc > 3 ? atoi(argv[3]) : 24;
    printf("loom %s (built against %s)\n", loom_version(), LOOM_VERSION_STRING);
    /* The backend modules: lib/loom/ beside libloom, and LOOM_BACKEND_PATH. */
    size_t loaded = loom_registry_load_all();
    printf("%zu backend(s) registered, %zu device(s)\n", loaded, loom_registry_dev_count());
    void *data = NULL;
    loom_gguf *g = NULL;
    if (!model && synth_model(&data, &g) != LOOM_OK) {
        fprintf(stderr, "embed: synthetic model: %s\n", loom_last_error());
        return 1;
    }
    int rc = generate(model, g, n_dev, n_gen);
    loom_gguf_free(g);
    loom_free(data);
    if (rc == 0) rc = own_graph(n_dev);
    loom_registry_reset();
    printf("%s\n", rc == 0 ? "embed: OK" : "embed: FAILED");
    return rc;
}
