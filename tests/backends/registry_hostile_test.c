/*
 * The registry (backends/registry.c) against hostile module files and directories: random
 * bytes named like a module, an empty file, a module cut short, regs of the right API
 * version that lack hooks or a name or give a NULL device, and a LOOM_BACKEND_PATH whose
 * directories hold junk (a subdirectory named like a module, a symlink loop, a dangling
 * link, a FIFO — which dlopen would wait on for ever —, a character device, other files),
 * that do not exist, that are empty entries, or that hold the same module twice. Each is
 * refused (loom_registry_load) or warned about (loom_registry_load_all) with a message
 * naming the file and the reason; the good modules still load; nothing is half-registered.
 */
#define _DEFAULT_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/backend-impl.h"
#include "tests/shim/loom_test.h"

static const char *runfile(const char *rel, char *buf, size_t size) {
    const char *srcdir = getenv("TEST_SRCDIR");
    const char *ws = getenv("TEST_WORKSPACE");
    snprintf(buf, size, "%s/%s/%s", srcdir ? srcdir : ".", ws ? ws : "loom", rel);
    return buf;
}

static char log_text[65536];
static size_t log_len;
static int log_warns;
static void capture(loom_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (level >= LOOM_LOG_WARN) log_warns++;
    int n = snprintf(log_text + log_len, sizeof log_text - log_len, "%s\n", msg);
    if (n > 0 && log_len + (size_t)n < sizeof log_text) log_len += (size_t)n;
}
static void capture_start(void) {
    log_len = 0;
    log_text[0] = '\0';
    log_warns = 0;
    loom_log_set(capture, NULL);
}

static char tmp_root[4096];
static const char *tmp_path(const char *name, char *buf, size_t size) {
    if (!tmp_root[0]) {
        const char *t = getenv("TEST_TMPDIR");
        snprintf(tmp_root, sizeof tmp_root, "%s/reg_hostile_%d", t ? t : "/tmp", (int)getpid());
        mkdir(tmp_root, 0700);
    }
    snprintf(buf, size, "%s/%s", tmp_root, name);
    return buf;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    LOOM_REQUIRE(f != NULL);
    LOOM_REQUIRE(fwrite(data, 1, n, f) == n);
    fclose(f);
}

/* the first `limit` bytes of src (all when limit is 0) into dst */
static void copy_file(const char *src, const char *dst, size_t limit) {
    FILE *in = fopen(src, "rb");
    LOOM_REQUIRE(in != NULL);
    FILE *out = fopen(dst, "wb");
    LOOM_REQUIRE(out != NULL);
    char buf[65536];
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0 && (!limit || total < limit)) {
        if (limit && total + n > limit) n = limit - total;
        LOOM_REQUIRE(fwrite(buf, 1, n, out) == n);
        total += n;
    }
    fclose(in);
    fclose(out);
}

/* loading path fails with status want, the message naming the path and containing why */
static void refused(const char *path, loom_status want, const char *why) {
    loom_reg_t reg = (loom_reg_t)1;
    LOOM_CHECK_EQ_INT(loom_registry_load(path, &reg), want);
    LOOM_CHECK(reg == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), path);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), why);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 0);
}

LOOM_TEST(registry_hostile, bogus_files_are_refused_naming_them) {
    loom_registry_reset();
    char p[4096];
    /* random bytes (a fixed LCG), named like a module */
    unsigned char junk[8192];
    unsigned x = 12345;
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 16);
    write_bytes(tmp_path("libloom-x.so", p, sizeof p), junk, sizeof junk);
    refused(p, LOOM_ERR_FORMAT, "invalid ELF header");
    write_bytes(tmp_path("libloom-empty.so", p, sizeof p), "", 0);
    refused(p, LOOM_ERR_FORMAT, "file too short");
    /* a real module cut at 4 KiB: the ELF header is right, the rest is missing */
    char cpu[4096];
    runfile("backends/cpu/libloom-cpu.so", cpu, sizeof cpu);
    copy_file(cpu, tmp_path("libloom-cut.so", p, sizeof p), 4096);
    refused(p, LOOM_ERR_FORMAT, "a truncated ELF file: its ");
    /* not a regular file */
    LOOM_REQUIRE(mkdir(tmp_path("libloom-dir.so", p, sizeof p), 0700) == 0 || errno == EEXIST);
    refused(p, LOOM_ERR_FORMAT, "not a regular file (a directory)");
    unlink(tmp_path("libloom-fifo.so", p, sizeof p));
    LOOM_REQUIRE(mkfifo(p, 0600) == 0);
    refused(p, LOOM_ERR_FORMAT, "not a regular file (a FIFO)"); /* dlopen would block */
    unlink(tmp_path("libloom-zero.so", p, sizeof p));
    LOOM_REQUIRE(symlink("/dev/zero", p) == 0);
    refused(p, LOOM_ERR_FORMAT, "not a regular file (a device)");
    unlink(tmp_path("libloom-loop.so", p, sizeof p));
    LOOM_REQUIRE(symlink(p, p) == 0);
    refused(p, LOOM_ERR_FORMAT, "Too many levels of symbolic links");
    unlink(tmp_path("libloom-dangling.so", p, sizeof p));
    LOOM_REQUIRE(symlink("/nonexistent/libloom-gone.so", p) == 0);
    refused(p, LOOM_ERR_NOT_FOUND, "No such file or directory");
    loom_registry_reset();
}

/* module variant v refused with status FORMAT, the message naming it and what it lacks */
static void hostile(const char *v, const char *why) {
    char rel[256], p[4096];
    snprintf(rel, sizeof rel, "tests/backends/modules/libloom-hostile-%s.so", v);
    runfile(rel, p, sizeof p);
    refused(p, LOOM_ERR_FORMAT, why);
    char want[4096 + 64];
    snprintf(want, sizeof want, "backend module '%s': ", p);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), want);
}

LOOM_TEST(registry_hostile, malformed_regs_are_refused_before_a_missing_hook_is_called) {
    loom_registry_reset();
    hostile("no-reg", "its reg has no table (iface NULL)");
    hostile("no-name", "its reg lacks the required hook get_name");
    hostile("no-count", "its reg lacks the required hook get_device_count");
    hostile("null-name", "its reg has no name (get_name returned NULL)");
    hostile("null-device", "backend 'HOSTILE': device 0 of 2 is NULL");
    hostile("devtable", "backend 'HOSTILE': device 0 of 2 has no table (iface NULL)");
    /* the same checks for a reg registered directly */
    static const struct loom_reg_i no_dev_i = {.get_name = NULL};
    struct loom_reg r = {.api_version = LOOM_BACKEND_API_VERSION, .iface = &no_dev_i};
    LOOM_CHECK_EQ_INT(loom_registry_add(&r), LOOM_ERR_FORMAT);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(),
                            "loom_registry_add: its reg lacks the required hook get_name");
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 0);
    loom_registry_reset();
}

LOOM_TEST(registry_hostile, a_directory_of_junk_loads_the_good_modules_and_names_the_rest) {
    loom_registry_reset();
    char p[4096], dir[2048], cpu[4096], sim[4096], cpu_dir[2048], sim_dir[2048], badver[4096];
    runfile("backends/cpu/libloom-cpu.so", cpu, sizeof cpu);
    runfile("backends/sim/libloom-sim.so", sim, sizeof sim);
    runfile("tests/backends/modules/libloom-badver.so", badver, sizeof badver);
    snprintf(cpu_dir, sizeof cpu_dir, "%s", cpu);
    *strrchr(cpu_dir, '/') = '\0';
    snprintf(sim_dir, sizeof sim_dir, "%s", sim);
    *strrchr(sim_dir, '/') = '\0';
    /* a directory of junk named like modules, and of other files */
    char q[8192];
    LOOM_REQUIRE(mkdir(tmp_path("junk", dir, sizeof dir), 0700) == 0 || errno == EEXIST);
    LOOM_REQUIRE(mkdir(tmp_path("junk/libloom-dir.so", p, sizeof p), 0700) == 0 || errno == EEXIST);
    LOOM_REQUIRE(mkdir(tmp_path("junk/subdir", p, sizeof p), 0700) == 0 || errno == EEXIST);
    unlink(tmp_path("junk/libloom-fifo.so", p, sizeof p));
    LOOM_REQUIRE(mkfifo(p, 0600) == 0);
    unlink(tmp_path("junk/libloom-loop.so", p, sizeof p));
    LOOM_REQUIRE(symlink(p, p) == 0);
    write_bytes(tmp_path("junk/libloom-x.so", p, sizeof p),
                "\x7f"
                "ELF junk",
                8);
    write_bytes(tmp_path("junk/README.txt", p, sizeof p), "not a module\n", 13);
    write_bytes(tmp_path("junk/libloom-.so", p, sizeof p), "", 0); /* no name: not one */
    write_bytes(tmp_path("junk/libloom-notes.txt", p, sizeof p), "", 0);
    unlink(tmp_path("junk/libloom-badver.so", p, sizeof p));
    LOOM_REQUIRE(symlink(badver, p) == 0);
    /* empty entries, a directory that does not exist, the junk twice, and the CPU module's
     * directory twice (the second spelled otherwise: the same module again is skipped, the
     * first of a name wins) */
    char env[16384];
    snprintf(env, sizeof env, "::%s:/nonexistent/loom-modules::%s:%s:%s:%s/.:", dir, dir, cpu_dir,
             sim_dir, cpu_dir);
    setenv("LOOM_BACKEND_PATH", env, 1);
    capture_start();
    size_t n = loom_registry_load_all();
    loom_log_set(NULL, NULL);
    unsetenv("LOOM_BACKEND_PATH");
    LOOM_CHECK_EQ_INT(n, 2);
    LOOM_CHECK_EQ_INT(loom_registry_reg_count(), 2);
    LOOM_CHECK(loom_registry_reg_by_name("CPU") != NULL);
    LOOM_CHECK(loom_registry_reg_by_name("SIM") != NULL);
    /* each bad entry warned about once, by path and reason */
    snprintf(q, sizeof q, "'%s/libloom-dir.so': not a regular file (a directory)", dir);
    LOOM_CHECK_STR_CONTAINS(log_text, q);
    snprintf(q, sizeof q, "'%s/libloom-fifo.so': not a regular file (a FIFO)", dir);
    LOOM_CHECK_STR_CONTAINS(log_text, q);
    snprintf(q, sizeof q, "'%s/libloom-loop.so': Too many levels of symbolic links", dir);
    LOOM_CHECK_STR_CONTAINS(log_text, q);
    snprintf(q, sizeof q, "'%s/libloom-x.so': %s/libloom-x.so: file too short", dir, dir);
    LOOM_CHECK_STR_CONTAINS(log_text, q);
    snprintf(q, sizeof q, "'%s/libloom-badver.so': built for backend API version 7", dir);
    LOOM_CHECK_STR_CONTAINS(log_text, q);
    LOOM_CHECK_STR_CONTAINS(log_text, "LOOM_BACKEND_PATH: cannot open backend directory "
                                      "'/nonexistent/loom-modules': No such file or directory");
    LOOM_CHECK(strstr(log_text, "README.txt") == NULL);
    LOOM_CHECK(strstr(log_text, "libloom-notes.txt") == NULL);
    LOOM_CHECK(strstr(log_text, "subdir") == NULL);
    LOOM_CHECK_EQ_INT(log_warns, 6);
    if (log_warns != 6) printf("log:\n%s", log_text);
    loom_registry_reset();
}

LOOM_TEST(registry_hostile, too_many_path_entries_are_named) {
    loom_registry_reset();
    char env[8192] = "";
    size_t o = 0;
    for (int i = 0; i < 70; i++)
        o += (size_t)snprintf(env + o, sizeof env - o, "/nonexistent/d%d:", i);
    setenv("LOOM_BACKEND_PATH", env, 1);
    capture_start();
    loom_registry_load_all();
    loom_log_set(NULL, NULL);
    unsetenv("LOOM_BACKEND_PATH");
    LOOM_CHECK_STR_CONTAINS(log_text, "LOOM_BACKEND_PATH names more than 61 directories; "
                                      "'/nonexistent/d61' and the ones after it are not scanned");
    loom_registry_reset();
}
