/* loom: tensor-parallel inference on many devices. The umbrella header: every public header
 * of the API. The device interface, loom/backend-impl.h (for writing a backend), is apart:
 * include it yourself. */
#ifndef LOOM_H
#define LOOM_H

#include "loom/version.h"

#include "loom/backend.h"
#include "loom/core.h"
#include "loom/cpu.h"
#include "loom/cuda.h"
#include "loom/dist.h"
#include "loom/gguf.h"
#include "loom/meta.h"
#include "loom/model.h"
#include "loom/reduce.h"
#include "loom/rules.h"
#include "loom/sched.h"
#include "loom/session.h"
#include "loom/sim.h"
#include "loom/splitstate.h"
#include "loom/tokenizer.h"
#include "loom/topo.h"

#endif /* LOOM_H */
