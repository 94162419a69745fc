/*
 * libloom as a shared library (issue 12). This test links libloom.so.0 itself (not the
 * static packages), loads the sim module from the runfiles, and inspects the built files
 * with binutils (nm, readelf):
 *   - loom_version() and the version macros agree, and the SONAME is libloom.so.<major>;
 *   - libloom exports exactly the LOOM_API names of its headers (scripts/loom_exports.sh);
 *   - the modules and the loom tool need libloom.so.0 and define no core symbol;
 *   - a module shares the application's core: its host allocations go through the
 *     allocator the application installed, and its errors reach the application's
 *     loom_last_error();
 *   - load_all's default module directories (bazel-bin/loom/ beside libloom, and this
 *     executable's, which holds a copy of libloom-sim.so) are overridden by
 *     LOOM_BACKEND_PATH.
 */
#define _GNU_SOURCE /* popen, dladdr, setenv */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/backend-impl.h"
#include "loom/loom.h"
#include "tests/shim/loom_test.h"

#define LOOM_CHECK_STR_EQ(a, b) LOOM_CHECK_MSG(strcmp((a), (b)) == 0, "\"%s\" != \"%s\"", (a), (b))

static const char *runfile(const char *rel, char *buf, size_t size) {
    const char *srcdir = getenv("TEST_SRCDIR");
    const char *ws = getenv("TEST_WORKSPACE");
    snprintf(buf, size, "%s/%s/%s", srcdir ? srcdir : ".", ws ? ws : "loom", rel);
    return buf;
}

/* Runs cmd and returns its whole stdout (malloc'ed, NUL-terminated), NULL on failure. */
static char *run_cmd(const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t len = 0, cap = 65536;
    char *out = malloc(cap);
    size_t n;
    while (out && (n = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 4096) {
            char *q = realloc(out, cap * 2);
            if (!q) {
                free(out);
                out = NULL;
                break;
            }
            out = q;
            cap *= 2;
        }
    }
    int rc = pclose(p);
    if (!out) return NULL;
    out[len] = '\0';
    if (rc != 0) {
        free(out);
        return NULL;
    }
    return out;
}

/* Whether the newline-separated list has the line `name`. */
static bool has_line(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

/* Calls fn(line, ud) for each line of list. */
static void each_line(const char *list, void (*fn)(const char *, void *), void *ud) {
    char line[512];
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > 0 && len < sizeof line) {
            memcpy(line, p, len);
            line[len] = '\0';
            fn(line, ud);
        }
        p = e ? e + 1 : NULL;
    }
}

/* The defined dynamic symbols of an ELF file, one a line. */
static char *defined_dynamic(const char *path) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s' | awk 'NF==3 {print $3}' | sort -u", path);
    return run_cmd(cmd);
}

LOOM_TEST(lib, version_macros_function_and_soname_agree) {
    LOOM_CHECK(strcmp(loom_version(), LOOM_VERSION_STRING) == 0);
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR,
             LOOM_VERSION_PATCH);
    LOOM_CHECK(strcmp(loom_version(), want) == 0);
    LOOM_CHECK_EQ_INT(loom_version_number(),
                      LOOM_VERSION_MAJOR * 10000 + LOOM_VERSION_MINOR * 100 + LOOM_VERSION_PATCH);

    char lib[4096], cmd[8192], soname[64];
    runfile("libloom.so.0", lib, sizeof lib);
    snprintf(cmd, sizeof cmd, "readelf -d '%s' | sed -n 's/.*(SONAME).*\\[\\(.*\\)\\]/\\1/p'", lib);
    char *out = run_cmd(cmd);
    LOOM_REQUIRE(out != NULL);
    snprintf(soname, sizeof soname, "libloom.so.%d\n", LOOM_VERSION_MAJOR);
    LOOM_CHECK(strcmp(out, soname) == 0);
    free(out);
}

typedef struct {
    const char *other;
    const char *what;
    int missing;
} diff_ctx;

static void check_in_other(const char *name, void *ud) {
    diff_ctx *d = ud;
    if (!has_line(d->other, name)) {
        d->missing++;
        loom_test_fail(__FILE__, __LINE__, "%s: %s", d->what, name);
    }
}

LOOM_TEST(lib, exports_exactly_the_loom_api_symbols) {
    char lib[4096], script[4096], inc[4096], cmd[16384];
    runfile("libloom.so.0", lib, sizeof lib);
    runfile("scripts/loom_exports.sh", script, sizeof script);
    runfile("include/loom", inc, sizeof inc);
    snprintf(cmd, sizeof cmd, "sh '%s' '%s'/*.h", script, inc); /* every public header */
    char *api = run_cmd(cmd);
    char *exported = defined_dynamic(lib);
    LOOM_REQUIRE(api != NULL && exported != NULL);
    LOOM_CHECK(has_line(api, "loom_new_tensor")); /* the list is real */
    LOOM_CHECK(has_line(api, "loom_version"));
    LOOM_CHECK(has_line(api, "loom_sim_reg_new_from_spec")); /* the module backends' too */
    LOOM_CHECK(has_line(api, "loom_cuda_backend_get_stats"));
    diff_ctx a = {exported, "LOOM_API symbol not exported by libloom.so.0", 0};
    each_line(api, check_in_other, &a);
    diff_ctx b = {api, "libloom.so.0 exports a symbol that is not LOOM_API", 0};
    each_line(exported, check_in_other, &b);
    LOOM_CHECK_EQ_INT(a.missing, 0);
    LOOM_CHECK_EQ_INT(b.missing, 0);
    free(api);
    free(exported);
}

/* A module or the tool: needs libloom.so.0, defines none of core's symbols. */
static void check_links_libloom(const char *rel, bool dynamic_only) {
    char path[4096], cmd[8192];
    runfile(rel, path, sizeof path);
    snprintf(cmd, sizeof cmd, "readelf -d '%s' | grep -c 'NEEDED.*\\[libloom.so.0\\]'", path);
    char *out = run_cmd(cmd);
    LOOM_CHECK_MSG(out && strcmp(out, "1\n") == 0, "%s does not need libloom.so.0", rel);
    free(out);
    /* The tool's full symbol table too: a static copy of core would show there. */
    snprintf(cmd, sizeof cmd, "nm %s --defined-only '%s' | awk 'NF==3 {print $3}' | sort -u",
             dynamic_only ? "-D" : "", path);
    char *defs = run_cmd(cmd);
    LOOM_REQUIRE(defs != NULL);
    const char *core[] = {"loom_new_tensor", "loom_last_error", "loom_malloc", "loom_error",
                          "loom_registry_load"};
    for (size_t i = 0; i < sizeof core / sizeof core[0]; i++) {
        LOOM_CHECK_MSG(!has_line(defs, core[i]), "%s defines %s (a copy of core)", rel, core[i]);
    }
    free(defs);
}

LOOM_TEST(lib, modules_and_tool_link_libloom_without_a_copy_of_core) {
    check_links_libloom("backends/cpu/libloom-cpu.so", true);
    check_links_libloom("backends/sim/libloom-sim.so", true);
    check_links_libloom("tools/loom", false);
    char cuda[4096];
    runfile("backends/cuda/libloom-cuda.so", cuda, sizeof cuda);
    FILE *f = fopen(cuda, "r");
    if (f) { /* built only where the CUDA toolkit was found */
        fclose(f);
        check_links_libloom("backends/cuda/libloom-cuda.so", true);
    }
}

/* Counts allocations made through loom's allocator. */
static size_t n_allocs;
static void *count_malloc(size_t size, void *ud) {
    (void)ud;
    n_allocs++;
    return malloc(size);
}
static void *count_realloc(void *p, size_t size, void *ud) {
    (void)ud;
    n_allocs++;
    return realloc(p, size);
}
static void count_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

LOOM_TEST(lib, a_module_shares_the_applications_core) {
    char sim_so[4096];
    runfile("backends/sim/libloom-sim.so", sim_so, sizeof sim_so);
    loom_registry_reset();
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_registry_load(sim_so, &reg) == LOOM_OK);
    LOOM_REQUIRE(loom_reg_dev_count(reg) >= 1);
    loom_dev_t dev = loom_reg_dev_get(reg, 0);
    loom_buft_t buft = loom_dev_buffer_type(dev);

    /* The module's allocations go through the allocator installed here. */
    loom_allocator a = {count_malloc, count_realloc, count_free, NULL};
    loom_allocator_set(&a);
    n_allocs = 0;
    loom_buffer_t buf = loom_buft_alloc_buffer(buft, 4096);
    size_t counted = n_allocs;
    loom_buffer_free(buf);
    loom_allocator_set(NULL);
    LOOM_CHECK(buf != NULL);
    LOOM_CHECK(counted > 0);

    /* The module's error is this thread's last error here. */
    loom_clear_error();
    loom_buffer_t huge = loom_buft_alloc_buffer(buft, SIZE_MAX / 2);
    LOOM_CHECK(huge == NULL);
    LOOM_CHECK(loom_last_status() != LOOM_OK);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), loom_dev_name(dev));
    loom_registry_reset();
}

/* The file a registered reg's code comes from. */
static const char *reg_file(loom_reg_t reg) {
    Dl_info info;
    void *fn = NULL;
    memcpy(&fn, &reg->iface->get_name, sizeof fn);
    return dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "";
}

LOOM_TEST(lib, backend_path_overrides_the_default_module_dirs) {
    char sim_so[4096], sim_dir[4096];
    runfile("backends/sim/libloom-sim.so", sim_so, sizeof sim_so);
    snprintf(sim_dir, sizeof sim_dir, "%s", sim_so);
    *strrchr(sim_dir, '/') = '\0';

    /* Default: a copy from a default directory (bazel-bin/loom/ beside libloom, or the
     * one next to this executable), not the one in backends/sim/. */
    unsetenv("LOOM_BACKEND_PATH");
    loom_registry_reset();
    loom_registry_load_all();
    loom_reg_t sim = loom_registry_reg_by_name("SIM");
    LOOM_REQUIRE(sim != NULL);
    LOOM_CHECK_STR_CONTAINS(reg_file(sim), "libloom-sim.so");
    LOOM_CHECK_MSG(strncmp(reg_file(sim), sim_dir, strlen(sim_dir)) != 0,
                   "SIM came from '%s' without LOOM_BACKEND_PATH", reg_file(sim));
    LOOM_CHECK(loom_registry_reg_by_name("CPU") != NULL); /* libloom's own */

    /* LOOM_BACKEND_PATH comes first: its libloom-sim.so wins. */
    loom_registry_reset();
    setenv("LOOM_BACKEND_PATH", sim_dir, 1);
    loom_registry_load_all();
    unsetenv("LOOM_BACKEND_PATH");
    sim = loom_registry_reg_by_name("SIM");
    LOOM_REQUIRE(sim != NULL);
    LOOM_CHECK_MSG(strncmp(reg_file(sim), sim_dir, strlen(sim_dir)) == 0,
                   "SIM came from '%s', not from LOOM_BACKEND_PATH '%s'", reg_file(sim), sim_dir);
    loom_registry_reset();
}

/* Every LOOM_API function links from libloom, those of the module backends too (issue 26):
 * libloom's forwarders load the sim module and answer as the module's own functions
 * (reached through the reg's proc address) do; on a device of another backend they answer
 * as the header says; a missing module (CUDA here unless built) is an error naming it. */
LOOM_TEST(lib, module_backend_functions_link_and_forward_to_the_module) {
    loom_registry_reset();
    const loom_sim_profile *p = NULL;
    LOOM_REQUIRE(loom_sim_profile_find("rtx-3090", &p) == LOOM_OK); /* loads the modules */
    LOOM_REQUIRE(p != NULL);
    LOOM_CHECK_STR_EQ(p->name, "rtx-3090");
    loom_reg_t sim = loom_registry_reg_by_name("SIM");
    LOOM_REQUIRE(sim != NULL);
    LOOM_CHECK_STR_CONTAINS(reg_file(sim), "libloom-sim.so");
    /* the same answers as the module's functions called through its proc addresses */
    int (*count)(void) = NULL;
    void *q = loom_reg_get_proc_address(sim, "loom_sim_profile_count");
    memcpy(&count, &q, sizeof count);
    LOOM_REQUIRE(count != NULL);
    LOOM_CHECK(loom_sim_profile_count() > 0);
    LOOM_CHECK_EQ_INT(loom_sim_profile_count(), count());
    loom_sim_link link;
    LOOM_REQUIRE(loom_sim_link_preset("pcie4", &link) == LOOM_OK);
    double (*ar)(const loom_sim_link *, bool, int, uint64_t) = NULL;
    q = loom_reg_get_proc_address(sim, "loom_sim_allreduce_time_us");
    memcpy(&ar, &q, sizeof ar);
    LOOM_REQUIRE(ar != NULL);
    LOOM_CHECK(loom_sim_allreduce_time_us(&link, true, 4, 1 << 20) > 0);
    LOOM_CHECK(loom_sim_allreduce_time_us(&link, true, 4, 1 << 20) == ar(&link, true, 4, 1 << 20));
    /* a reg of the module, its devices and their stats */
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec("sim:2,mem=64MiB", &reg) == LOOM_OK);
    LOOM_REQUIRE(loom_reg_dev_count(reg) == 2);
    loom_dev_t dev = loom_reg_dev_get(reg, 1);
    LOOM_CHECK(loom_dev_is_sim(dev));
    LOOM_CHECK(!loom_dev_is_cuda(dev));
    loom_buffer_t buf = loom_buft_alloc_buffer(loom_dev_buffer_type(dev), 4096);
    LOOM_REQUIRE(buf != NULL);
    loom_sim_stats st;
    loom_sim_dev_stats(dev, &st);
    LOOM_CHECK(st.mem_used >= 4096);
    loom_buffer_free(buf);
    loom_sim_reg_free(reg);
    /* the CPU is no sim device: false and zeros, as for any other backend */
    loom_dev_t cpu = loom_registry_dev_by_type(LOOM_DEV_TYPE_CPU);
    LOOM_REQUIRE(cpu != NULL);
    LOOM_CHECK(!loom_dev_is_sim(cpu) && !loom_dev_is_cuda(cpu));
    memset(&st, 0xff, sizeof st);
    loom_sim_dev_stats(cpu, &st);
    LOOM_CHECK(st.bytes_in == 0 && st.mem_used == 0);
    /* CUDA: the module's reg where it was built (and loaded), else an error naming it */
    loom_clear_error();
    loom_reg_t cuda = loom_cuda_reg();
    if (cuda)
        LOOM_CHECK_STR_EQ(loom_reg_name(cuda), "CUDA");
    else
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), "libloom-cuda.so");
    loom_registry_reset();
}

/* loom/loom.h is the umbrella: it includes every public header but the device interface. */
LOOM_TEST(lib, the_umbrella_includes_every_public_header) {
    char inc[4096], cmd[8192];
    runfile("include/loom", inc, sizeof inc);
    snprintf(cmd, sizeof cmd, "cd '%s' && ls *.h", inc);
    char *headers = run_cmd(cmd);
    snprintf(cmd, sizeof cmd, "sed -n 's|^#include \"loom/\\(.*\\)\"$|\\1|p' '%s/loom.h'", inc);
    char *included = run_cmd(cmd);
    LOOM_REQUIRE(headers != NULL && included != NULL);
    LOOM_CHECK(has_line(headers, "sim.h")); /* the list is real */
    int missing = 0;
    for (const char *p = headers; *p;) {
        const char *e = strchr(p, '\n');
        char name[256];
        size_t len = e ? (size_t)(e - p) : strlen(p);
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        if (strcmp(name, "loom.h") && strcmp(name, "backend-impl.h") && !has_line(included, name)) {
            missing++;
            loom_test_fail(__FILE__, __LINE__, "loom/loom.h does not include loom/%s", name);
        }
        p = e ? e + 1 : p + len;
    }
    LOOM_CHECK_EQ_INT(missing, 0);
    free(headers);
    free(included);
}

/* libloom is C: it needs no C++ runtime (the toolchain's -lstdc++ is dropped as unneeded),
 * and no MPI library: --dist mpi loads it when first used (dist/mpi.c). */
LOOM_TEST(lib, libloom_needs_no_cxx_runtime_and_no_mpi) {
    char lib[4096], cmd[8192];
    runfile("libloom.so.0", lib, sizeof lib);
    snprintf(cmd, sizeof cmd, "readelf -d '%s' | sed -n 's/.*(NEEDED).*\\[\\(.*\\)\\]/\\1/p'", lib);
    char *needed = run_cmd(cmd);
    LOOM_REQUIRE(needed != NULL);
    LOOM_CHECK(has_line(needed, "libc.so.6")); /* the list is real */
    LOOM_CHECK_MSG(strstr(needed, "libstdc++") == NULL, "libloom.so.0 needs: %s", needed);
    LOOM_CHECK_MSG(strstr(needed, "libmpi") == NULL, "libloom.so.0 needs: %s", needed);
    free(needed);
}
