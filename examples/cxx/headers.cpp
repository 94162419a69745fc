// Every public header of loom in one C++17 translation unit: the headers must stay valid C++
// (extern "C", no C-only constructs), so an engine written in C++ can include them.
// Built by the Makefile with pkg-config; running it prints the library version.
#include <loom/backend-impl.h>
#include <loom/backend.h>
#include <loom/core.h>
#include <loom/cpu.h>
#include <loom/cuda.h>
#include <loom/dist.h>
#include <loom/gguf.h>
#include <loom/loom.h>
#include <loom/meta.h>
#include <loom/model.h>
#include <loom/reduce.h>
#include <loom/rules.h>
#include <loom/sched.h>
#include <loom/session.h>
#include <loom/sim.h>
#include <loom/splitstate.h>
#include <loom/tokenizer.h>
#include <loom/topo.h>
#include <loom/version.h>

#include <cstdio>
#include <cstring>

int main() {
    // The version macros and the linked library agree.
    if (std::strcmp(loom_version(), LOOM_VERSION_STRING) != 0) {
        std::fprintf(stderr, "headers_cxx: library %s, headers %s\n", loom_version(),
                     LOOM_VERSION_STRING);
        return 1;
    }
    loom_backend_init_fn init = nullptr; // a type from the device interface
    (void)init;
    std::printf("headers_cxx: every public header compiles as C++17 (loom %s)\n", loom_version());
    return 0;
}
