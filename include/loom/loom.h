/* loom: tensor-parallel inference on many devices. The umbrella header. */
#ifndef LOOM_H
#define LOOM_H

#include "loom/backend.h"
#include "loom/core.h"
#include "loom/cpu.h"

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0

#endif /* LOOM_H */
