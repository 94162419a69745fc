/*
 * status.c: status codes and the per-thread "last error". Every failing loom call records
 * a message naming what is wrong with loom_error() and returns its status, so callers
 * can `return loom_error(LOOM_ERR_SHAPE, "...")` and users read loom_last_error().
 */
#include <stdio.h>

#include "core/core-impl.h"

#define LOOM__ERROR_MAX 1024

static _Thread_local char loom__err_msg[LOOM__ERROR_MAX];
static _Thread_local loom_status loom__err_status = LOOM_OK;

static const char *const loom__status_strs[LOOM_STATUS_COUNT] = {
    [LOOM_OK] = "ok",
    [LOOM_ERR_INVALID_ARG] = "invalid argument",
    [LOOM_ERR_SHAPE] = "shape mismatch",
    [LOOM_ERR_TYPE] = "type mismatch",
    [LOOM_ERR_NOMEM] = "out of memory",
    [LOOM_ERR_DEVICE_OOM] = "device out of memory",
    [LOOM_ERR_UNSUPPORTED] = "unsupported",
    [LOOM_ERR_NOT_FOUND] = "not found",
    [LOOM_ERR_IO] = "i/o error",
    [LOOM_ERR_FORMAT] = "bad format",
    [LOOM_ERR_DEVICE] = "device error",
    [LOOM_ERR_FULL] = "container full",
    [LOOM_ERR_INTERNAL] = "internal error",
};

const char *loom_status_str(loom_status s) {
    if ((int)s < 0 || s >= LOOM_STATUS_COUNT) return "unknown status";
    return loom__status_strs[s];
}

const char *loom_last_error(void) {
    return loom__err_msg;
}

loom_status loom_last_status(void) {
    return loom__err_status;
}

loom_status loom_error(loom_status s, const char *fmt, ...) {
    /* Format into a local buffer first: the arguments may point at loom__err_msg. */
    char buf[LOOM__ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(loom__err_msg, buf, sizeof buf);
    loom__err_status = s;
    loom_log(LOOM_LOG_DEBUG, "error (%s): %s", loom_status_str(s), buf);
    return s;
}

void loom_clear_error(void) {
    loom__err_msg[0] = '\0';
    loom__err_status = LOOM_OK;
}
