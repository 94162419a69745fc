/* loom: tensor-parallel inference on many devices. The umbrella header. */
#ifndef LOOM_H
#define LOOM_H

#include "loom/backend.h"
#include "loom/core.h"
#include "loom/cpu.h"
#include "loom/version.h"

#endif /* LOOM_H */
