/* Backend modules of the right API version whose reg is malformed, for
 * registry_hostile_test: the registry must refuse each with a message naming the file and
 * what is missing, before it calls a hook that is not there. One variant per build:
 *   -DHOSTILE_NO_REG      loom_backend_init returns a reg with no table (iface NULL)
 *   -DHOSTILE_NO_NAME     the table lacks get_name
 *   -DHOSTILE_NO_COUNT    the table lacks get_device_count
 *   -DHOSTILE_NULL_NAME   get_name returns NULL
 *   -DHOSTILE_NULL_DEVICE get_device returns NULL
 *   (none)                device 0 has no table (iface NULL)
 */
#include <stddef.h>

#include "loom/backend-impl.h"

static const char *h_name(loom_reg_t reg) {
    (void)reg;
#ifdef HOSTILE_NULL_NAME
    return NULL;
#else
    return "HOSTILE";
#endif
}
static size_t h_count(loom_reg_t reg) {
    (void)reg;
    return 2;
}
static struct loom_dev h_dev0;
static loom_dev_t h_get(loom_reg_t reg, size_t i) {
    (void)reg;
#ifdef HOSTILE_NULL_DEVICE
    (void)i;
    return NULL;
#else
    (void)i;
    return &h_dev0;
#endif
}

static const struct loom_reg_i h_reg_i = {
#ifndef HOSTILE_NO_NAME
    .get_name = h_name,
#endif
#ifndef HOSTILE_NO_COUNT
    .get_device_count = h_count,
#endif
    .get_device = h_get,
};

static struct loom_reg h_reg = {
    .api_version = LOOM_BACKEND_API_VERSION,
#ifndef HOSTILE_NO_REG
    .iface = &h_reg_i,
#endif
};

static loom_reg_t h_init(void) {
    return &h_reg;
}
LOOM_BACKEND_MODULE(h_init)
