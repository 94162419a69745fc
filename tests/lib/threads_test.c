/*
 * The library used from many threads at once, each result against the same work done on
 * one thread (the oracle):
 *   - 8 threads, each with its own session over stories260K (cpu, sim:2 tensor, sim:3
 *     tensor: each sim spec makes its own sim reg, concurrently), evaluate a prompt and 12
 *     greedy tokens: every logit bit-equal to the single-threaded run of that device spec;
 *   - 8 threads tokenize and detokenize on one shared vocabulary: the ids and pieces of the
 *     single-threaded run;
 *   - registry calls racing: load_all, device specs (each sim spec makes a sim reg), lookups
 *     and enumeration from 6 threads: no reg lost or doubled, every lookup consistent;
 *   - the log sink replaced from one thread while 6 others log: every message reaches
 *     exactly one sink, and no sink is called after loom_log_set replaced it (its
 *     user_data may then be freed: before the fix a call could still be in flight).
 * Run under --config=tsan as well (.bazelrc).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/model.h"
#include "loom/session.h"
#include "loom/tokenizer.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/stories.h"

enum { N_GEN = 12, N_THREADS = 8, MAX_VOCAB = 1024 };
static const char *const specs[3] = {"cpu", "sim:2", "sim:3"};
static char model[4096]; /* loom_test_stories() once, before any thread (it writes a static) */

typedef struct run_result {
    loom_status st;
    char err[512];
    int32_t tokens[N_GEN];
    float logits[N_GEN][MAX_VOCAB];
    int n_vocab;
} run_result;

/* A session over spec: the prompt, then N_GEN greedy tokens; the logits before each. */
static void run_session(const char *spec, run_result *r) {
    memset(r, 0, sizeof *r);
    loom_session_params p = loom_session_params_default();
    p.devices = spec;
    p.split_mode = strcmp(spec, "cpu") ? LOOM_SPLIT_MODE_TENSOR : LOOM_SPLIT_MODE_NONE;
    p.threads = 1;
    p.n_ctx = 64;
    loom_session *s = NULL;
    r->st = loom_session_new(model, NULL, &p, &s);
    if (r->st) {
        snprintf(r->err, sizeof r->err, "%s", loom_last_error());
        return;
    }
    const loom_tokenizer *tok = loom_session_tokenizer(s);
    int32_t ids[32];
    size_t n = 0;
    const char *prompt = "Once upon a time, a cat";
    r->st = loom_tokenize(tok, prompt, strlen(prompt), true, ids, 32, &n);
    r->n_vocab = (int)loom_session_model(s)->hp.n_vocab;
    if (r->st == LOOM_OK && r->n_vocab > MAX_VOCAB) r->st = LOOM_ERR_INTERNAL;
    if (r->st == LOOM_OK) r->st = loom_session_eval(s, ids, (int64_t)n, false, r->logits[0]);
    for (int k = 0; r->st == LOOM_OK && k < N_GEN; k++) {
        int32_t best = 0;
        for (int v = 1; v < r->n_vocab; v++)
            if (r->logits[k][v] > r->logits[k][best]) best = v;
        r->tokens[k] = best;
        if (k + 1 < N_GEN) r->st = loom_session_eval(s, &best, 1, false, r->logits[k + 1]);
    }
    if (r->st) snprintf(r->err, sizeof r->err, "%s", loom_last_error());
    loom_session_free(s);
}

typedef struct {
    int spec;
    run_result r;
} session_job;

static void *session_thread(void *arg) {
    session_job *j = arg;
    run_session(specs[j->spec], &j->r);
    return NULL;
}

LOOM_TEST(threads, sessions_in_parallel_equal_the_single_threaded_run) {
    if (!loom_test_stories()) LOOM_SKIP("stories260K.gguf not found (LOOM_MODELS_DIR)");
    snprintf(model, sizeof model, "%s", loom_test_stories());
    static run_result ref[3];
    for (int k = 0; k < 3; k++) {
        run_session(specs[k], &ref[k]);
        LOOM_CHECK_MSG(ref[k].st == LOOM_OK, "%s: %s", specs[k], ref[k].err);
        LOOM_REQUIRE(ref[k].st == LOOM_OK);
    }
    static session_job jobs[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i].spec = i % 3;
        LOOM_REQUIRE(pthread_create(&th[i], NULL, session_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N_THREADS; i++) {
        const run_result *a = &jobs[i].r, *b = &ref[jobs[i].spec];
        LOOM_CHECK_MSG(a->st == LOOM_OK, "thread %d (%s): %s", i, specs[jobs[i].spec], a->err);
        if (a->st) continue;
        LOOM_CHECK_EQ_INT(memcmp(a->tokens, b->tokens, sizeof a->tokens), 0);
        int diffs = 0;
        for (int k = 0; k < N_GEN; k++)
            for (int v = 0; v < b->n_vocab; v++)
                diffs += a->logits[k][v] != b->logits[k][v];
        LOOM_CHECK_MSG(diffs == 0, "thread %d (%s): %d logits differ from the lone run", i,
                       specs[jobs[i].spec], diffs);
    }
    /* the three specs agree with each other too (tensor parallel = one device), to 1e-4 */
    for (int k = 1; k < 3; k++)
        for (int v = 0; v < ref[0].n_vocab; v++)
            LOOM_CHECK_NEAR(ref[k].logits[0][v], ref[0].logits[0][v], 1e-4);
}

/* ---------------------------------------------------------------- the tokenizer */

static const char *const texts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the park with her friends!",
    "  leading spaces,\ttabs\nand newlines  ",
    "Unicode: héllo wörld ✓ 日本語",
    "a <b>tag</b> in the text & symbols #@!",
    "",
};
enum { N_TEXTS = sizeof texts / sizeof texts[0], MAX_IDS = 256 };

typedef struct {
    const loom_tokenizer *tok;
    int32_t ids[N_TEXTS][MAX_IDS];
    size_t n[N_TEXTS];
    char text[N_TEXTS][1024];
    int bad;
} tok_job;

static void tokenize_all(tok_job *j) {
    for (int rep = 0; rep < 200; rep++)
        for (int t = 0; t < N_TEXTS; t++) {
            size_t n = 0;
            if (loom_tokenize(j->tok, texts[t], strlen(texts[t]), true, j->ids[t], MAX_IDS, &n))
                j->bad++;
            j->n[t] = n;
            size_t o = 0;
            for (size_t k = 0; k < n && k < MAX_IDS; k++) {
                char piece[64];
                size_t pn = loom_token_to_piece(j->tok, j->ids[t][k], piece, sizeof piece);
                if (pn > sizeof piece || o + pn >= sizeof j->text[t]) {
                    j->bad++;
                    break;
                }
                memcpy(j->text[t] + o, piece, pn);
                o += pn;
            }
            j->text[t][o] = '\0';
        }
}

static void *tok_thread(void *arg) {
    tokenize_all(arg);
    return NULL;
}

LOOM_TEST(threads, one_vocabulary_tokenizes_from_many_threads) {
    if (!loom_test_stories()) LOOM_SKIP("stories260K.gguf not found (LOOM_MODELS_DIR)");
    loom_session_params p = loom_session_params_default();
    p.threads = 1;
    p.n_ctx = 16;
    loom_session *s = NULL;
    loom_status st = loom_session_new(loom_test_stories(), NULL, &p, &s);
    LOOM_CHECK_MSG(st == LOOM_OK, "%s", loom_last_error());
    LOOM_REQUIRE(st == LOOM_OK);
    static tok_job ref, jobs[N_THREADS];
    ref.tok = loom_session_tokenizer(s);
    tokenize_all(&ref);
    LOOM_CHECK_EQ_INT(ref.bad, 0);
    LOOM_CHECK_STR_CONTAINS(ref.text[0], "Once upon a time, there was a little girl named Lily.");
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i].tok = ref.tok;
        LOOM_REQUIRE(pthread_create(&th[i], NULL, tok_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N_THREADS; i++) {
        LOOM_CHECK_EQ_INT(jobs[i].bad, 0);
        for (int t = 0; t < N_TEXTS; t++) {
            LOOM_CHECK_EQ_INT(jobs[i].n[t], ref.n[t]);
            LOOM_CHECK_EQ_INT(memcmp(jobs[i].ids[t], ref.ids[t], ref.n[t] * sizeof(int32_t)), 0);
            LOOM_CHECK_MSG(!strcmp(jobs[i].text[t], ref.text[t]), "thread %d text %d: '%s' vs '%s'",
                           i, t, jobs[i].text[t], ref.text[t]);
        }
    }
    loom_session_free(s);
}

/* ---------------------------------------------------------------- the registry */

typedef struct {
    int id, errors;
    char err[256];
} reg_job;

static void *registry_thread(void *arg) {
    reg_job *j = arg;
    for (int it = 0; it < 40; it++) {
        if (j->id % 2 == 0) loom_registry_load_all();
        loom_dev_t devs[8];
        size_t n = 0;
        const char *spec = (it + j->id) % 2 ? "sim:2" : "cpu";
        if (loom_devices_from_spec(spec, devs, 8, &n) != LOOM_OK ||
            n != (spec[0] == 's' ? 2u : 1u)) {
            j->errors++;
            snprintf(j->err, sizeof j->err, "%s: %s", spec, loom_last_error());
        }
        if (!loom_registry_dev_by_name("CPU")) j->errors++;
        const size_t nd = loom_registry_dev_count();
        for (size_t k = 0; k < nd; k++) {
            loom_dev_t d = loom_registry_dev_get(k);
            if (d && !loom_dev_name(d)[0]) j->errors++;
        }
        size_t cpus = 0;
        for (size_t k = 0; k < loom_registry_reg_count(); k++) {
            loom_reg_t r = loom_registry_reg_get(k);
            cpus += r && !strcmp(loom_reg_name(r), "CPU");
        }
        if (cpus != 1) j->errors++;
    }
    return NULL;
}

LOOM_TEST(threads, registry_calls_race_safely) {
    loom_registry_load_all();
    const size_t regs0 = loom_registry_reg_count();
    enum { NT = 6 };
    static reg_job jobs[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = (reg_job){.id = i};
        LOOM_REQUIRE(pthread_create(&th[i], NULL, registry_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < NT; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < NT; i++)
        LOOM_CHECK_MSG(jobs[i].errors == 0, "thread %d: %d errors (%s)", i, jobs[i].errors,
                       jobs[i].err);
    /* each sim spec resolved made one sim reg (kept until loom_registry_reset): 20 per
     * thread; nothing else was added, nothing lost */
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), regs0 + NT * 20);
}

/* ---------------------------------------------------------------- the log sink */

typedef struct sink_ctx {
    atomic_int calls;
    atomic_int retired; /* set once loom_log_set replaced this sink */
    atomic_int late;    /* calls after that */
} sink_ctx;

static void sink(loom_log_level level, const char *msg, void *ud) {
    (void)level, (void)msg;
    sink_ctx *c = ud;
    sched_yield(); /* a sink that takes a while: the setter runs meanwhile */
    if (atomic_load(&c->retired)) atomic_fetch_add(&c->late, 1);
    atomic_fetch_add(&c->calls, 1);
}

enum { LOGGERS = 6, LOGS_EACH = 4000, SWAPS = 400 };
static atomic_int logging_done;

static void *logger_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < LOGS_EACH; i++)
        loom_log(LOOM_LOG_ERROR, "message %d", i);
    atomic_fetch_add(&logging_done, 1);
    return NULL;
}

LOOM_TEST(threads, log_sink_replaced_while_others_log) {
    static sink_ctx ctx[SWAPS + 1];
    memset(ctx, 0, sizeof ctx);
    loom_log_set(sink, &ctx[0]);
    pthread_t th[LOGGERS];
    for (int i = 0; i < LOGGERS; i++)
        LOOM_REQUIRE(pthread_create(&th[i], NULL, logger_thread, NULL) == 0);
    int k = 0;
    while (k < SWAPS && atomic_load(&logging_done) < LOGGERS) {
        loom_log_set(sink, &ctx[k + 1]);
        atomic_store(&ctx[k].retired, 1); /* the caller may free ctx[k] now */
        k++;
    }
    for (int i = 0; i < LOGGERS; i++)
        pthread_join(th[i], NULL);
    loom_log_set(NULL, NULL);
    atomic_store(&ctx[k].retired, 1);
    long total = 0, late = 0;
    for (int i = 0; i <= k; i++) {
        total += atomic_load(&ctx[i].calls);
        late += atomic_load(&ctx[i].late);
    }
    LOOM_CHECK_EQ_INT(total, (long)LOGGERS * LOGS_EACH);
    LOOM_CHECK_MSG(late == 0,
                   "%ld calls reached a sink after loom_log_set had replaced it "
                   "(%d swaps)",
                   late, k);
}
