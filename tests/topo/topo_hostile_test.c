/*
 * LOOM_TOPOLOGY / loom_topo_load against hostile topology files: a missing file, an empty
 * one, a directory, malformed XML, XML that is not an hwloc topology, negative, huge and
 * duplicate os_index values and cpusets, objects nested where they cannot be, zero PUs and
 * zero NUMA nodes, and a 10 MB file. Each either loads and every query of loom/topo.h
 * walks it without a crash (counts, NUMA info, PCI lookups, affinities, ring orders, the
 * formatted tree), or fails with an error naming the file and what is wrong. loom_topo_get
 * over a bad LOOM_TOPOLOGY falls back to no topology with one warning naming the file, and
 * does not parse the file again on every call.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/topo.h"
#include "tests/shim/loom_test.h"

static char dir[4096];
static const char *tmp_file(const char *name, const char *text, char *buf, size_t size) {
    if (!dir[0]) {
        const char *t = getenv("TEST_TMPDIR");
        snprintf(dir, sizeof dir, "%s/topo_hostile_%d", t ? t : "/tmp", (int)getpid());
        mkdir(dir, 0700);
    }
    snprintf(buf, size, "%s/%s", dir, name);
    if (text) {
        FILE *f = fopen(buf, "w");
        LOOM_REQUIRE(f != NULL);
        fputs(text, f);
        fclose(f);
    }
    return buf;
}

/* Every query on a loaded topology: nothing may crash, counts stay sane. */
static void walk(loom_topo *t) {
    int counts[7];
    for (int k = LOOM_TOPO_PACKAGE; k <= LOOM_TOPO_GPU; k++) {
        counts[k] = loom_topo_count(t, (loom_topo_kind)k);
        LOOM_CHECK(counts[k] >= 0 && counts[k] < 1 << 20);
    }
    for (int i = 0; i < counts[LOOM_TOPO_NUMA]; i++) {
        loom_topo_numa_info ni;
        LOOM_CHECK_EQ_INT(loom_topo_numa(t, i, &ni), LOOM_OK);
        LOOM_CHECK(ni.n_cores >= 0 && ni.n_pus >= 0);
    }
    loom_topo_numa_info ni;
    LOOM_CHECK(loom_topo_numa(t, counts[LOOM_TOPO_NUMA], &ni) != LOOM_OK);
    for (int i = 0; i < counts[LOOM_TOPO_PCI]; i++) {
        loom_topo_pci_info pi;
        LOOM_CHECK_EQ_INT(loom_topo_pci(t, LOOM_TOPO_PCI, i, &pi), LOOM_OK);
        LOOM_CHECK(loom_topo_pci_find(t, LOOM_TOPO_PCI, pi.busid) >= 0);
    }
    LOOM_CHECK_EQ_INT(loom_topo_pci_find(t, LOOM_TOPO_GPU, "zz:zz.z"), -1);
    char why[256];
    (void)loom_topo_affinity_default(t, why, sizeof why);
    int pus[64];
    for (int a = LOOM_AFFINITY_NONE; a <= LOOM_AFFINITY_NUMA; a++)
        for (int ith = 0; ith < 3; ith++) {
            int n = loom_topo_thread_pus(t, (loom_affinity)a, -1, ith, 3, pus, 64);
            LOOM_CHECK(n >= 0 && n <= 64);
            n = loom_topo_thread_pus(t, (loom_affinity)a, 0, ith, 3, pus, 64);
            LOOM_CHECK(n >= 0 && n <= 64);
        }
    int place[4] = {0, 1, 0, 1}, order[4];
    if (counts[LOOM_TOPO_NUMA] >= 2)
        LOOM_CHECK_EQ_INT(loom_topo_ring_order(t, LOOM_TOPO_NUMA, place, 4, order, why, sizeof why),
                          LOOM_OK);
    const char *labels[1] = {"X"};
    int numa[1] = {0}, pci[1] = {-1};
    size_t need = loom_topo_format(t, NULL, 0, 1, labels, numa, pci);
    char *buf = malloc(need + 1);
    LOOM_REQUIRE(buf != NULL);
    LOOM_CHECK_EQ_INT(loom_topo_format(t, buf, need + 1, 1, labels, numa, pci), need);
    LOOM_CHECK_EQ_INT(strlen(buf), need);
    free(buf);
}

/* Loading path fails with the given status, the message naming the file and containing
 * why. */
static void refused(const char *path, loom_status want, const char *why) {
    loom_topo *t = (loom_topo *)1;
    LOOM_CHECK_EQ_INT(loom_topo_load(path, &t), want);
    LOOM_CHECK(t == NULL);
    char named[4200];
    snprintf(named, sizeof named, "topology '%s': ", path);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), named);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), why);
}

/* Loads (or not) and walks what loaded; returns whether it loaded. Refusals must name the
 * file. */
static bool load_or_refuse(const char *path) {
    loom_topo *t = NULL;
    loom_status st = loom_topo_load(path, &t);
    if (st != LOOM_OK) {
        LOOM_CHECK(t == NULL);
        char named[4200];
        snprintf(named, sizeof named, "topology '%s': ", path);
        LOOM_CHECK_STR_CONTAINS(loom_last_error(), named);
        return false;
    }
    LOOM_REQUIRE(t != NULL);
    LOOM_CHECK(!loom_topo_is_this_system(t));
    walk(t);
    loom_topo_free(t);
    return true;
}

#define HEAD                                                                                       \
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
#define MACHINE(cpuset, body)                                                                      \
    HEAD "<topology version=\"2.0\">\n<object type=\"Machine\" os_index=\"0\" cpuset=\"" cpuset    \
         "\" complete_cpuset=\"" cpuset "\" allowed_cpuset=\"" cpuset "\" nodeset=\"0x1\" "        \
         "complete_nodeset=\"0x1\" allowed_nodeset=\"0x1\" gp_index=\"1\">\n" body                 \
         "</object>\n</topology>\n"
#define NODE(os, cpuset, gp)                                                                       \
    "<object type=\"NUMANode\" os_index=\"" os "\" cpuset=\"" cpuset                               \
    "\" complete_cpuset=\"" cpuset "\" nodeset=\"0x1\" complete_nodeset=\"0x1\" gp_index=\"" gp    \
    "\" local_memory=\"1000\"/>\n"
#define PU(os, cpuset, gp)                                                                         \
    "<object type=\"PU\" os_index=\"" os "\" cpuset=\"" cpuset "\" complete_cpuset=\"" cpuset      \
    "\" nodeset=\"0x1\" complete_nodeset=\"0x1\" gp_index=\"" gp "\"/>\n"

LOOM_TEST(topo_hostile, unreadable_sources_are_refused_naming_the_file) {
    char p[4096];
    refused(tmp_file("missing.xml", NULL, p, sizeof p), LOOM_ERR_NOT_FOUND,
            "not a readable hwloc XML file");
    refused(tmp_file("empty.xml", "", p, sizeof p), LOOM_ERR_FORMAT,
            "not a readable hwloc XML file");
    refused(tmp_file("garbage.xml", "\x01\x02 not xml at all <<<>>>", p, sizeof p), LOOM_ERR_FORMAT,
            "not a readable hwloc XML file");
    refused(tmp_file("truncated.xml", HEAD "<topology version=\"2.0\">\n<object type=\"Mach", p,
                     sizeof p),
            LOOM_ERR_FORMAT, "not a readable hwloc XML file");
    refused(tmp_file("other.xml", HEAD "<html><body>hello</body></html>\n", p, sizeof p),
            LOOM_ERR_FORMAT, "hwloc cannot load it");
    tmp_file("adir.xml", NULL, p, sizeof p);
    mkdir(p, 0700);
    refused(p, LOOM_ERR_FORMAT, "not a regular file (a directory)");
    refused("/dev/zero", LOOM_ERR_FORMAT, "not a regular file (a FIFO, device or socket)");
    /* os_index values hwloc would take as bit numbers (minutes of work, or wrapped) */
    refused(tmp_file("huge_os.xml",
                     MACHINE("0x1", NODE("0", "0x1", "2") PU("99999999999999999999", "0x1", "3")),
                     p, sizeof p),
            LOOM_ERR_FORMAT,
            "line 6: os_index \"99999999999999999999\" is not a number from 0 to 1048576");
    refused(tmp_file("negative_os.xml", MACHINE("0x1", NODE("-5", "0x1", "2") PU("0", "0x1", "3")),
                     p, sizeof p),
            LOOM_ERR_FORMAT, "line 5: os_index \"-5\" is not a number from 0 to 1048576");
    refused("synthetic:pack:-2 pu:99999999999", LOOM_ERR_FORMAT,
            "hwloc rejects the synthetic description");
}

LOOM_TEST(topo_hostile, odd_but_parsable_topologies_load_or_are_refused_never_crash) {
    char p[4096];
    /* want: NULL when it loads (and every query walks it), else the refusal's text */
    static const char *const cannot = "hwloc cannot load it (";
    static const struct {
        const char *name, *xml, *want;
    } cases[] = {
        {"zero_pus.xml", MACHINE("0x0", NODE("0", "0x0", "2")), cannot},
        {"zero_numa.xml", MACHINE("0x1", PU("0", "0x1", "2")), cannot},
        {"large_os.xml", MACHINE("0x1", NODE("1048576", "0x1", "2") PU("1048575", "0x1", "3")),
         NULL},
        {"huge_cpuset.xml",
         MACHINE("0xffffffff,0xffffffff,0xffffffff,0xffffffff,0xffffffff,0xffffffff,0xffffffff",
                 NODE("0", "0x1", "2") PU("0", "0x1", "3")),
         NULL},
        {"duplicate_ids.xml",
         MACHINE("0x3",
                 NODE("0", "0x3", "2") PU("0", "0x1", "3") PU("0", "0x1", "3") PU("0", "0x2", "3")),
         NULL},
        {"negative_memory.xml",
         MACHINE("0x1", "<object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x1\" "
                        "complete_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodeset=\"0x1\" "
                        "gp_index=\"2\" local_memory=\"-1\"/>\n" PU("0", "0x1", "3")),
         NULL},
        /* a PU holding a Machine holding a PU: the tree nests against its own order */
        {"nested_wrong.xml",
         MACHINE("0x1", NODE("0", "0x1", "2") "<object type=\"PU\" os_index=\"0\" cpuset=\"0x1\" "
                                              "complete_cpuset=\"0x1\" gp_index=\"3\">\n"
                                              "<object type=\"Machine\" os_index=\"0\" "
                                              "cpuset=\"0x1\" gp_index=\"1\">\n" PU(
                                                  "0", "0x1", "1") "</object>\n</object>\n"),
         cannot},
        {"bad_type.xml", MACHINE("0x1", "<object type=\"Quantum\" os_index=\"0\"/>\n"), cannot},
        {"bad_cpuset.xml", MACHINE("0xZZ", NODE("0", "0xQQ", "2")), cannot},
        {"pci_no_bus.xml",
         MACHINE("0x1", NODE("0", "0x1", "2")
                            PU("0", "0x1",
                               "3") "<object type=\"PCIDev\" gp_index=\"9\" pci_busid=\"garbage\" "
                                    "pci_type=\"0300 [10de:1234] [0000:0000] 00\"/>\n"),
         NULL},
    };
    int loaded = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool ok = load_or_refuse(tmp_file(cases[i].name, cases[i].xml, p, sizeof p));
        fprintf(stderr, "case %s: %s\n", cases[i].name, ok ? "loaded" : loom_last_error());
        LOOM_CHECK_EQ_INT(ok, cases[i].want == NULL);
        if (!ok && cases[i].want) LOOM_CHECK_STR_CONTAINS(loom_last_error(), cases[i].want);
        loaded += ok;
    }
    LOOM_CHECK_EQ_INT(loaded, 5);
}

LOOM_TEST(topo_hostile, a_10_mb_file_loads_or_is_refused_in_bounded_time) {
    char p[4096];
    tmp_file("big.xml", NULL, p, sizeof p);
    FILE *f = fopen(p, "w");
    LOOM_REQUIRE(f != NULL);
    fputs(HEAD "<topology version=\"2.0\">\n<object type=\"Machine\" os_index=\"0\" "
               "cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodeset=\"0x1\" "
               "gp_index=\"1\">\n" NODE("0", "0x1", "2") PU("0", "0x1", "3"),
          f);
    /* 10 MB of info attributes: legal XML, nothing hwloc must keep */
    for (int i = 0; i < 100000; i++)
        fprintf(f, "<info name=\"pad%06d\" value=\"%080d\"/>\n", i, i);
    fputs("</object>\n</topology>\n", f);
    fclose(f);
    struct stat st;
    LOOM_REQUIRE(stat(p, &st) == 0);
    LOOM_CHECK(st.st_size > 10 * 1000 * 1000);
    load_or_refuse(p);
}

static int warns;
static char warn_text[8192];
static void capture(loom_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (level < LOOM_LOG_WARN) return;
    warns++;
    snprintf(warn_text, sizeof warn_text, "%s", msg);
}

LOOM_TEST(topo_hostile, a_bad_LOOM_TOPOLOGY_falls_back_with_one_warning) {
    /* loom_topo_get is process-wide: this test is the only one here that calls it */
    char p[4096];
    tmp_file("env_bad.xml", "not xml", p, sizeof p);
    setenv("LOOM_TOPOLOGY", p, 1);
    loom_log_set(capture, NULL);
    loom_topo *t = loom_topo_get();
    LOOM_CHECK(t == NULL);
    char named[4200];
    snprintf(named, sizeof named, "topology '%s': not a readable hwloc XML file", p);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), named);
    /* the file is not read again: replacing it with a good one changes nothing, and the
     * error is still the first one */
    tmp_file("env_bad.xml", MACHINE("0x1", NODE("0", "0x1", "2") PU("0", "0x1", "3")), p, sizeof p);
    loom_clear_error();
    LOOM_CHECK(loom_topo_get() == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), named);
    loom_log_set(NULL, NULL);
    LOOM_CHECK_EQ_INT(warns, 1);
    LOOM_CHECK_STR_CONTAINS(warn_text, "LOOM_TOPOLOGY: topology '");
    LOOM_CHECK_STR_CONTAINS(warn_text, "running without a topology (no thread or memory binding, "
                                       "plain device order)");
    unsetenv("LOOM_TOPOLOGY");
}
