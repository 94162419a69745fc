/*
 * A program that links loom statically (as one linking libloom.a does: the core, the
 * registry and the CPU backend in the executable, no module backend) is told why a sim or
 * CUDA device spec, or a sim.h function, finds nothing, and how to get the module, instead
 * of a bare "no sim backend" (issue 26). Built with linkstatic, so the registry's code lies
 * in this executable.
 */
#define _POSIX_C_SOURCE 200809L /* unsetenv */
#include <stdlib.h>
#include <string.h>

#include "backends/registry-internal.h"
#include "loom/backend.h"
#include "loom/sim.h"
#include "tests/shim/loom_test.h"

LOOM_TEST(static_link, sim_and_cuda_specs_say_what_a_static_link_lacks) {
    unsetenv("LOOM_BACKEND_PATH");
    LOOM_REQUIRE(loom__registry_linked_statically());
    loom_registry_reset();
    (void)loom_registry_load_all(); /* the CPU only: no module beside this executable */
    loom_dev_t devs[4];
    size_t n = 9;
    LOOM_CHECK_EQ_INT(loom_devices_from_spec("sim:2", devs, 4, &n), LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_EQ_INT(n, 0);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "device spec 'sim:2': no sim backend in this program: it links "
                            "libloom statically (libloom.a), which holds the CPU backend only, "
                            "and no libloom-sim.so was found beside it; set LOOM_BACKEND_PATH");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "or link libloom.so (pkg-config --libs loom)");
    LOOM_CHECK_EQ_INT(loom_devices_from_spec("cuda:0", devs, 4, &n), LOOM_ERR_NOT_FOUND);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "device spec 'cuda:0': no CUDA devices in this "
                                               "program: it links libloom statically");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "no libloom-cuda.so was found beside it");
    /* what a static link has still works */
    LOOM_REQUIRE(loom_devices_from_spec("cpu", devs, 4, &n) == LOOM_OK);
    LOOM_CHECK_EQ_INT(n, 1);
    loom_registry_reset();
}

LOOM_TEST(static_link, sim_header_functions_say_it_too) {
    unsetenv("LOOM_BACKEND_PATH");
    loom_registry_reset();
    /* libloom's forwarder (module-api.c): no module answers, so it fails as sim.h says */
    LOOM_CHECK(loom_sim_reg_default() == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "loom_sim_reg_default: the sim backend module is "
                                               "not loaded in this program: it links libloom "
                                               "statically (libloom.a)");
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "LOOM_BACKEND_PATH");
    loom_registry_reset();
}
