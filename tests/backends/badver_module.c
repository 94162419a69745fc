/* Backend modules built against a future interface (API version 7), for registry_test.
 *
 * Built twice:
 *   libloom-badver.so  exports loom_backend_api_version = 7 (as LOOM_BACKEND_MODULE
 *                      writes it): the registry must refuse it, naming both versions,
 *                      without calling its init (which aborts the process if called: a
 *                      table layout from another version must never be used).
 *   libloom-badreg.so  (-DBADVER_REG_ONLY) an older-style module with no version symbol
 *                      whose reg claims API version 7: refused once init returned it. */
#include <stdlib.h>

#include "loom/backend-impl.h"

static const char *badver_name(loom_reg_t reg) {
    (void)reg;
    return "BADVER";
}
static size_t badver_count(loom_reg_t reg) {
    (void)reg;
    return 0;
}
static loom_dev_t badver_get(loom_reg_t reg, size_t i) {
    (void)reg, (void)i;
    return NULL;
}

static const struct loom_reg_i badver_reg_i = {
    .get_name = badver_name,
    .get_device_count = badver_count,
    .get_device = badver_get,
};

static struct loom_reg badver_reg = {.api_version = 7, .iface = &badver_reg_i};

LOOM_API loom_reg_t loom_backend_init(void);

#ifdef BADVER_REG_ONLY
loom_reg_t loom_backend_init(void) {
    return &badver_reg;
}
#else
LOOM_API extern const int loom_backend_api_version;
const int loom_backend_api_version = 7;

loom_reg_t loom_backend_init(void) {
    abort(); /* the registry read the version symbol and must not get here */
    return &badver_reg;
}
#endif
