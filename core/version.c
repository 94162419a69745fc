/* loom_version(): the version this library was built as (include/loom/version.h). */
#include "loom/version.h"

const char *loom_version(void) {
    return LOOM_VERSION_STRING;
}

int loom_version_number(void) {
    return LOOM_VERSION_NUMBER;
}
