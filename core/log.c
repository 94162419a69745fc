/*
 * log.c: leveled logging through one replaceable sink. The default sink writes whole
 * lines to stderr (one fprintf per line, so concurrent threads never interleave within a
 * line); the level filter (LOOM_LOG_LEVEL=debug|info|warn|error|none, default warn, or
 * loom_log_set_level) applies before any sink, so filtered messages cost no formatting.
 * loom_log_set waits for the calls of the sink it replaces (so its user_data may be freed
 * when it returns). loom_abort is the always-on assert's end: file:line:message to stderr, then
 * abort().
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "core/core-impl.h"

#define LOOM__LOG_LINE_MAX 2048

static pthread_mutex_t loom__log_mu = PTHREAD_MUTEX_INITIALIZER;
static loom_log_fn loom__log_sink = NULL; /* NULL: default sink */
static void *loom__log_ud = NULL;
/* -1 until read from the environment on first use. */
static atomic_int loom__log_level = -1;

/* Set when LOOM_LOG_LEVEL was not a level: warned about once it is read. */
static atomic_int loom__log_env_bad;

static int loom__log_level_from_env(void) {
    const char *s = getenv("LOOM_LOG_LEVEL");
    if (!s || !*s) return LOOM_LOG_WARN;
    static const char *const names[] = {"debug", "info", "warn", "error", "none"};
    for (int i = 0; i < 5; i++)
        if (strcasecmp(s, names[i]) == 0) return i;
    if (strcasecmp(s, "warning") == 0) return LOOM_LOG_WARN;
    if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0') return s[0] - '0';
    atomic_store(&loom__log_env_bad, 1);
    return LOOM_LOG_WARN;
}

loom_log_level loom_log_get_level(void) {
    int lvl = atomic_load_explicit(&loom__log_level, memory_order_relaxed);
    if (lvl < 0) {
        int want = loom__log_level_from_env();
        int expected = -1;
        /* a concurrent loom_log_set_level wins over the environment */
        bool first = atomic_compare_exchange_strong(&loom__log_level, &expected, want);
        lvl = atomic_load(&loom__log_level);
        if (first && atomic_exchange(&loom__log_env_bad, 0))
            loom_log(LOOM_LOG_WARN,
                     "LOOM_LOG_LEVEL='%s' is not a level (debug, info, warn, error, none or "
                     "0-4): the level is warn",
                     getenv("LOOM_LOG_LEVEL"));
    }
    return (loom_log_level)lvl;
}

void loom_log_set_level(loom_log_level min_level) {
    int lvl = (int)min_level;
    if (lvl < LOOM_LOG_DEBUG) lvl = LOOM_LOG_DEBUG;
    if (lvl > LOOM_LOG_NONE) lvl = LOOM_LOG_NONE;
    atomic_store(&loom__log_level, lvl);
}

/* Calls of a sink in flight, counted per generation of the sink (its parity): loom_log_set
 * returns only once every call of the sink it replaced has returned, so the caller may free
 * that sink's user_data at once. A sink that calls loom_log_set itself does not wait (it
 * would wait for itself). */
static pthread_cond_t loom__log_idle = PTHREAD_COND_INITIALIZER;
static unsigned long loom__log_gen;
static unsigned long loom__log_inflight[2];
static _Thread_local int loom__log_depth; /* sink calls on this thread's stack */

void loom_log_set(loom_log_fn fn, void *user_data) {
    pthread_mutex_lock(&loom__log_mu);
    const bool wait = loom__log_depth == 0;
    while (wait && loom__log_inflight[(loom__log_gen + 1) & 1] != 0)
        pthread_cond_wait(&loom__log_idle, &loom__log_mu); /* the slot about to be reused */
    const unsigned long old = loom__log_gen++;
    loom__log_sink = fn;
    loom__log_ud = fn ? user_data : NULL;
    while (wait && loom__log_inflight[old & 1] != 0)
        pthread_cond_wait(&loom__log_idle, &loom__log_mu);
    pthread_mutex_unlock(&loom__log_mu);
}

static const char *loom__level_tag(loom_log_level level) {
    switch (level) {
    case LOOM_LOG_DEBUG:
        return "debug";
    case LOOM_LOG_INFO:
        return "info";
    case LOOM_LOG_WARN:
        return "warn";
    case LOOM_LOG_ERROR:
        return "error";
    default:
        return "?";
    }
}

static void loom__log_default(loom_log_level level, const char *msg) {
    fprintf(stderr, "loom %s: %s\n", loom__level_tag(level), msg);
}

void loom_log(loom_log_level level, const char *fmt, ...) {
    if (level >= LOOM_LOG_NONE || level < loom_log_get_level()) return;
    char buf[LOOM__LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    size_t n = strlen(buf);
    while (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';

    pthread_mutex_lock(&loom__log_mu);
    loom_log_fn fn = loom__log_sink;
    void *ud = loom__log_ud;
    const unsigned long slot = loom__log_gen & 1;
    if (fn) loom__log_inflight[slot]++;
    pthread_mutex_unlock(&loom__log_mu);
    if (!fn) {
        loom__log_default(level, buf);
        return;
    }
    loom__log_depth++;
    fn(level, buf, ud);
    loom__log_depth--;
    pthread_mutex_lock(&loom__log_mu);
    if (--loom__log_inflight[slot] == 0) pthread_cond_broadcast(&loom__log_idle);
    pthread_mutex_unlock(&loom__log_mu);
}

void loom_abort(const char *file, int line, const char *fmt, ...) {
    char buf[LOOM__LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "loom: %s:%d: %s\n", file ? file : "?", line, buf);
    fflush(stderr);
    abort();
}
