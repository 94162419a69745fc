/*
 * log.c: leveled logging through one replaceable sink. The default sink writes whole
 * lines to stderr (one fprintf per line, so concurrent threads never interleave within a
 * line); the level filter (LOOM_LOG_LEVEL=debug|info|warn|error|none, default warn, or
 * loom_log_set_level) applies before any sink, so filtered messages cost no formatting.
 * loom_abort is the always-on assert's end: file:line:message to stderr, then abort().
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

void loom_log_set(loom_log_fn fn, void *user_data) {
    pthread_mutex_lock(&loom__log_mu);
    loom__log_sink = fn;
    loom__log_ud = fn ? user_data : NULL;
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
    pthread_mutex_unlock(&loom__log_mu);
    if (fn)
        fn(level, buf, ud);
    else
        loom__log_default(level, buf);
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
