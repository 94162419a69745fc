/* A backend module built against a future interface: its reg claims API version 7.
 * registry_test checks that the registry refuses it ("API version 7, expected 1"). */
#include "backends/backend-impl.h"

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
loom_reg_t loom_backend_init(void) {
    return &badver_reg;
}
