/* Moved: the backend interface is public now, include/loom/backend-impl.h. */
#include "loom/backend-impl.h"
