/*
 * topo.c: the machine's topology through hwloc (the only file that includes it): loading
 * (this machine, an XML export, a synthetic description), the queries of loom/topo.h,
 * thread placement policies and binding, memory bound to a NUMA node, ring orders, and the
 * short tree `loom devices` prints.
 */
#include <errno.h>
#include <hwloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "loom/topo.h"

struct loom_topo {
    hwloc_topology_t h;
    bool this_system;
    char source[512];
};

/* ---------------------------------------------------------------- load / free */

enum { LOOM__TOPO_XML_MAX = 64 << 20, LOOM__TOPO_OS_INDEX_MAX = 1 << 20 };

/* What hwloc is not protected against in an XML file, checked before it reads one: a path
 * that is not a regular file (a FIFO or /dev/zero would be read for ever), a file over 64
 * MiB (an lstopo export of the largest machines is a few MB), and an os_index that is not
 * a number in [0, 2^20] (hwloc sets that bit in a bitmap: 99999999999999999999 keeps it
 * busy for minutes). Sets the error naming the file and what is wrong; true when fine. */
static bool loom__topo_xml_sane(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return true; /* hwloc says why (e.g. no such file) */
    if (!S_ISREG(st.st_mode)) {
        loom_error(LOOM_ERR_FORMAT,
                   "topology '%s': not a regular file (%s); use an lstopo .xml export or "
                   "synthetic:DESC",
                   path, S_ISDIR(st.st_mode) ? "a directory" : "a FIFO, device or socket");
        return false;
    }
    if (st.st_size > LOOM__TOPO_XML_MAX) {
        loom_error(LOOM_ERR_FORMAT,
                   "topology '%s': %lld bytes, more than the %d MiB an lstopo export needs", path,
                   (long long)st.st_size, LOOM__TOPO_XML_MAX >> 20);
        return false;
    }
    FILE *f = fopen(path, "rb");
    if (!f) return true;
    char *text = loom_malloc((size_t)st.st_size + 1);
    size_t n = text ? fread(text, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!text) {
        loom_error(LOOM_ERR_NOMEM, "topology '%s': out of memory reading it", path);
        return false;
    }
    text[n] = '\0';
    bool ok = true;
    static const char key[] = "os_index=\"";
    for (const char *p = strstr(text, key); p && ok; p = strstr(p, key)) {
        p += sizeof key - 1;
        const char *q = p;
        unsigned long long v = 0;
        while (*q >= '0' && *q <= '9' && v <= LOOM__TOPO_OS_INDEX_MAX)
            v = v * 10 + (unsigned long long)(*q++ - '0');
        if (q == p || *q != '"' || v > LOOM__TOPO_OS_INDEX_MAX) {
            int line = 1;
            for (const char *c = text; c < p; c++)
                line += *c == '\n';
            const char *end = strchr(p, '"');
            int len = end && end - p < 40 ? (int)(end - p) : 40;
            loom_error(LOOM_ERR_FORMAT,
                       "topology '%s': line %d: os_index \"%.*s\" is not a number from 0 to %d",
                       path, line, len, p, LOOM__TOPO_OS_INDEX_MAX);
            ok = false;
        }
    }
    loom_free(text);
    return ok;
}

loom_status loom_topo_load(const char *source, loom_topo **out) {
    if (!out) return loom_error(LOOM_ERR_INVALID_ARG, "loom_topo_load: NULL out");
    *out = NULL;
    if (source && !source[0]) source = NULL;
    if (!source) {
        const char *env = getenv("LOOM_TOPOLOGY");
        source = env && env[0] ? env : NULL;
    }
    loom_topo *t = loom_calloc(1, sizeof *t);
    if (!t) return loom_error(LOOM_ERR_NOMEM, "topology: out of memory");
    if (hwloc_topology_init(&t->h) != 0) {
        loom_free(t);
        return loom_error(LOOM_ERR_INTERNAL, "topology: hwloc_topology_init failed");
    }
    int rc = 0;
    if (!source) {
        snprintf(t->source, sizeof t->source, "this machine");
        hwloc_topology_set_io_types_filter(t->h, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
        /* PCI devices from Linux sysfs, not the libpciaccess plugin (which leaks at
         * unload; sysfs finds the same devices) */
        hwloc_topology_set_components(t->h, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
    } else if (strncmp(source, "synthetic:", 10) == 0) {
        snprintf(t->source, sizeof t->source, "%s", source);
        rc = hwloc_topology_set_synthetic(t->h, source + 10);
        if (rc != 0) {
            hwloc_topology_destroy(t->h);
            loom_free(t);
            return loom_error(LOOM_ERR_FORMAT,
                              "topology '%s': hwloc rejects the synthetic description (e.g. "
                              "synthetic:pack:2 core:4 pu:2)",
                              source);
        }
    } else {
        snprintf(t->source, sizeof t->source, "%s", source);
        if (!loom__topo_xml_sane(source)) {
            hwloc_topology_destroy(t->h);
            loom_free(t);
            return loom_last_status();
        }
        hwloc_topology_set_io_types_filter(t->h, HWLOC_TYPE_FILTER_KEEP_ALL);
        rc = hwloc_topology_set_xml(t->h, source);
        if (rc != 0) {
            int e = errno;
            hwloc_topology_destroy(t->h);
            loom_free(t);
            return loom_error(e == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_FORMAT,
                              "topology '%s': not a readable hwloc XML file (%s); use an lstopo "
                              ".xml export or synthetic:DESC",
                              source, strerror(e));
        }
    }
    if (hwloc_topology_load(t->h) != 0) {
        int e = errno;
        hwloc_topology_destroy(t->h);
        loom_free(t);
        return loom_error(LOOM_ERR_FORMAT,
                          "topology '%s': hwloc cannot load it (%s; HWLOC_XML_VERBOSE=1 makes "
                          "hwloc say why on stderr)",
                          source ? source : "this machine",
                          e ? strerror(e) : "an inconsistent tree, e.g. no PU or NUMA node");
    }
    t->this_system = hwloc_topology_is_thissystem(t->h) != 0;
    *out = t;
    return LOOM_OK;
}

void loom_topo_free(loom_topo *t) {
    if (!t) return;
    hwloc_topology_destroy(t->h);
    loom_free(t);
}

static pthread_mutex_t loom__topo_mu = PTHREAD_MUTEX_INITIALIZER;
static loom_topo *loom__topo_global;

/* A failed load is remembered: the first call warns once, naming the source and why, and
 * every call after returns NULL with the same error, without loading again (the CPU
 * backend asks from each worker thread; a bad 10 MB file would be parsed every time). */
static bool loom__topo_failed;
static loom_status loom__topo_fail_status;
static char loom__topo_fail_msg[768];

loom_topo *loom_topo_get(void) {
    pthread_mutex_lock(&loom__topo_mu);
    if (!loom__topo_global && !loom__topo_failed) {
        loom_status st = loom_topo_load(NULL, &loom__topo_global);
        if (st != LOOM_OK) {
            loom__topo_global = NULL;
            loom__topo_failed = true;
            loom__topo_fail_status = st;
            snprintf(loom__topo_fail_msg, sizeof loom__topo_fail_msg, "%s", loom_last_error());
            const char *env = getenv("LOOM_TOPOLOGY");
            LOOM_LOG_WARN("%s%s; running without a topology (no thread or memory binding, plain "
                          "device order)",
                          env && env[0] ? "LOOM_TOPOLOGY: " : "", loom__topo_fail_msg);
        }
    }
    loom_topo *t = loom__topo_global;
    if (!t) loom_error(loom__topo_fail_status, "%s", loom__topo_fail_msg);
    pthread_mutex_unlock(&loom__topo_mu);
    return t;
}

/* At exit, or when a module holding this code (libloom-cpu.so) is unloaded. */
__attribute__((destructor)) static void loom__topo_global_free(void) {
    pthread_mutex_lock(&loom__topo_mu);
    loom_topo_free(loom__topo_global);
    loom__topo_global = NULL;
    loom__topo_failed = false;
    pthread_mutex_unlock(&loom__topo_mu);
}

bool loom_topo_is_this_system(const loom_topo *t) {
    return t && t->this_system;
}

const char *loom_topo_source(const loom_topo *t) {
    return t ? t->source : "";
}

/* ---------------------------------------------------------------- queries */

static hwloc_obj_type_t kind_type(loom_topo_kind k) {
    switch (k) {
    case LOOM_TOPO_PACKAGE:
        return HWLOC_OBJ_PACKAGE;
    case LOOM_TOPO_NUMA:
        return HWLOC_OBJ_NUMANODE;
    case LOOM_TOPO_CORE:
        return HWLOC_OBJ_CORE;
    case LOOM_TOPO_PU:
        return HWLOC_OBJ_PU;
    case LOOM_TOPO_L3:
        return HWLOC_OBJ_L3CACHE;
    default:
        return HWLOC_OBJ_PCI_DEVICE;
    }
}

static bool is_gpu(hwloc_obj_t o) {
    return (o->attr->pcidev.class_id >> 8) == 0x03;
}

/* The i-th PCI device of kind, NULL past the end. */
static hwloc_obj_t pci_get(const loom_topo *t, loom_topo_kind kind, int i) {
    hwloc_obj_t o = NULL;
    int k = 0;
    while ((o = hwloc_get_next_pcidev(t->h, o)) != NULL) {
        if (kind == LOOM_TOPO_GPU && !is_gpu(o)) continue;
        if (k++ == i) return o;
    }
    return NULL;
}

int loom_topo_count(const loom_topo *t, loom_topo_kind kind) {
    if (!t) return 0;
    if (kind == LOOM_TOPO_PCI || kind == LOOM_TOPO_GPU) {
        int n = 0;
        for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(t->h, o)) != NULL;)
            n += kind == LOOM_TOPO_PCI || is_gpu(o);
        return n;
    }
    int n = hwloc_get_nbobjs_by_type(t->h, kind_type(kind));
    return n < 0 ? 0 : n;
}

static hwloc_obj_t numa_obj(const loom_topo *t, int i) {
    return i < 0 ? NULL : hwloc_get_obj_by_type(t->h, HWLOC_OBJ_NUMANODE, (unsigned)i);
}

/* Inside cpuset, how many objects of type. */
static int count_in(const loom_topo *t, hwloc_const_cpuset_t set, hwloc_obj_type_t type) {
    int n = hwloc_get_nbobjs_inside_cpuset_by_type(t->h, set, type);
    return n < 0 ? 0 : n;
}

loom_status loom_topo_numa(const loom_topo *t, int i, loom_topo_numa_info *info) {
    if (!t || !info) return loom_error(LOOM_ERR_INVALID_ARG, "loom_topo_numa: NULL argument");
    hwloc_obj_t o = numa_obj(t, i);
    if (!o) {
        return loom_error(LOOM_ERR_NOT_FOUND, "topology: NUMA node %d does not exist (%d nodes)", i,
                          loom_topo_count(t, LOOM_TOPO_NUMA));
    }
    hwloc_obj_t pk = hwloc_get_ancestor_obj_by_type(t->h, HWLOC_OBJ_PACKAGE, o);
    info->index = (int)o->logical_index;
    info->os_index = o->os_index;
    info->package = pk ? (int)pk->logical_index : -1;
    info->memory = o->attr ? o->attr->numanode.local_memory : 0;
    info->n_cores = count_in(t, o->cpuset, HWLOC_OBJ_CORE);
    info->n_pus = count_in(t, o->cpuset, HWLOC_OBJ_PU);
    return LOOM_OK;
}

/* The NUMA node nearest to an I/O object: the first whose cpuset meets its non-I/O
 * ancestor's. */
static int io_numa(const loom_topo *t, hwloc_obj_t o) {
    hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t->h, o);
    if (!a || !a->cpuset) return -1;
    int n = loom_topo_count(t, LOOM_TOPO_NUMA);
    for (int i = 0; i < n; i++) {
        hwloc_obj_t m = numa_obj(t, i);
        if (m && hwloc_bitmap_intersects(m->cpuset, a->cpuset)) return i;
    }
    return -1;
}

static void pci_fill(const loom_topo *t, hwloc_obj_t o, loom_topo_pci_info *info) {
    const struct hwloc_pcidev_attr_s *p = &o->attr->pcidev;
    snprintf(info->busid, sizeof info->busid, "%04x:%02x:%02x.%01x", p->domain & 0xffffu, p->bus,
             p->dev, p->func);
    info->vendor = p->vendor_id;
    info->device = p->device_id;
    info->class_id = p->class_id;
    info->numa = io_numa(t, o);
    info->switch_id =
        o->parent && o->parent->type == HWLOC_OBJ_BRIDGE ? (int)o->parent->logical_index : -1;
}

loom_status loom_topo_pci(const loom_topo *t, loom_topo_kind kind, int i,
                          loom_topo_pci_info *info) {
    if (!t || !info) return loom_error(LOOM_ERR_INVALID_ARG, "loom_topo_pci: NULL argument");
    hwloc_obj_t o = pci_get(t, kind, i);
    if (!o) {
        return loom_error(LOOM_ERR_NOT_FOUND, "topology: %s %d does not exist (%d)",
                          kind == LOOM_TOPO_GPU ? "GPU" : "PCI device", i,
                          loom_topo_count(t, kind));
    }
    pci_fill(t, o, info);
    return LOOM_OK;
}

int loom_topo_pci_find(const loom_topo *t, loom_topo_kind kind, const char *busid) {
    if (!t || !busid) return -1;
    unsigned dom = 0, bus, dev, fn;
    if (sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) {
        dom = 0;
        if (sscanf(busid, "%x:%x.%x", &bus, &dev, &fn) != 3) return -1;
    }
    int n = loom_topo_count(t, kind);
    for (int i = 0; i < n; i++) {
        hwloc_obj_t o = pci_get(t, kind, i);
        const struct hwloc_pcidev_attr_s *p = &o->attr->pcidev;
        if (p->domain == dom && p->bus == bus && p->dev == dev && p->func == fn) return i;
    }
    return -1;
}

/* ---------------------------------------------------------------- affinity */

loom_status loom_affinity_parse(const char *s, loom_affinity *out) {
    static const char *const names[] = {"none", "compact", "spread", "numa"};
    for (int i = 0; s && i < 4; i++) {
        if (strcasecmp(s, names[i]) == 0) {
            *out = (loom_affinity)i;
            return LOOM_OK;
        }
    }
    return loom_error(LOOM_ERR_FORMAT,
                      "cpu affinity '%s' is not one of none, compact, spread, numa", s ? s : "");
}

const char *loom_affinity_name(loom_affinity a) {
    switch (a) {
    case LOOM_AFFINITY_NONE:
        return "none";
    case LOOM_AFFINITY_COMPACT:
        return "compact";
    case LOOM_AFFINITY_SPREAD:
        return "spread";
    case LOOM_AFFINITY_NUMA:
        return "numa";
    default:
        return "default";
    }
}

loom_affinity loom_topo_affinity_default(const loom_topo *t, char *why, size_t why_size) {
    int nn = loom_topo_count(t, LOOM_TOPO_NUMA);
    loom_affinity a = nn > 1 ? LOOM_AFFINITY_NUMA : LOOM_AFFINITY_NONE;
    if (why && why_size) {
        if (nn > 1)
            snprintf(why, why_size, "%d NUMA nodes: threads kept on one node's cores and memory",
                     nn);
        else
            snprintf(why, why_size, "one NUMA node: the OS scheduler places threads as well");
    }
    return a;
}

/* The cores (objects) inside node (-1: all), in topology order; PUs when there is no core
 * level. Returns how many; *objs is malloc'ed. */
static int scope_cores(const loom_topo *t, int node, hwloc_obj_t **objs) {
    hwloc_const_cpuset_t set = hwloc_topology_get_topology_cpuset(t->h);
    if (node >= 0) {
        hwloc_obj_t m = numa_obj(t, node);
        if (!m) return 0;
        set = m->cpuset;
    }
    hwloc_obj_type_t type = count_in(t, set, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int n = count_in(t, set, type);
    *objs = n > 0 ? loom_malloc(sizeof **objs * (size_t)n) : NULL;
    if (!*objs) return 0;
    for (int i = 0; i < n; i++)
        (*objs)[i] = hwloc_get_obj_inside_cpuset_by_type(t->h, set, type, (unsigned)i);
    return n;
}

/* Which NUMA node (logical) holds a core, -1 when none does. */
static int core_numa(const loom_topo *t, hwloc_obj_t c) {
    int n = loom_topo_count(t, LOOM_TOPO_NUMA);
    for (int i = 0; i < n; i++)
        if (hwloc_bitmap_isincluded(c->cpuset, numa_obj(t, i)->cpuset)) return i;
    return -1;
}

static int set_to_pus(const loom_topo *t, hwloc_const_cpuset_t set, int *pus, int cap) {
    int k = 0, n = count_in(t, set, HWLOC_OBJ_PU);
    for (int i = 0; i < n && k < cap; i++)
        pus[k++] = (int)hwloc_get_obj_inside_cpuset_by_type(t->h, set, HWLOC_OBJ_PU, (unsigned)i)
                       ->logical_index;
    return k;
}

int loom_topo_thread_pus(const loom_topo *t, loom_affinity a, int node, int ith, int nth, int *pus,
                         int cap) {
    if (!t || !pus || cap <= 0 || nth <= 0 || ith < 0 || ith >= nth) return 0;
    if (a == LOOM_AFFINITY_DEFAULT) a = loom_topo_affinity_default(t, NULL, 0);
    if (a == LOOM_AFFINITY_NONE) return 0;
    if (a == LOOM_AFFINITY_NUMA) {
        int nn = node >= 0 ? 1 : loom_topo_count(t, LOOM_TOPO_NUMA);
        if (nn <= 0) return 0;
        int which = node >= 0 ? node : (int)((int64_t)ith * nn / nth);
        hwloc_obj_t m = numa_obj(t, which);
        return m ? set_to_pus(t, m->cpuset, pus, cap) : 0;
    }
    hwloc_obj_t *cores = NULL;
    int nc = scope_cores(t, node, &cores);
    if (nc == 0) return 0;
    hwloc_obj_t c = NULL;
    if (a == LOOM_AFFINITY_COMPACT) {
        c = cores[ith % nc];
    } else { /* spread: round-robin over the NUMA nodes, in core order within each */
        int nn = loom_topo_count(t, LOOM_TOPO_NUMA);
        if (nn < 1) nn = 1;
        int *node_of = loom_malloc(sizeof *node_of * (size_t)nc);
        if (!node_of) {
            loom_free(cores);
            return 0;
        }
        for (int i = 0; i < nc; i++) {
            node_of[i] = core_numa(t, cores[i]);
            if (node_of[i] < 0) node_of[i] = 0;
        }
        /* the order: k-th round takes the k-th core of each node that has one */
        int want = ith % nc, seen = 0;
        for (int round = 0; !c && round < nc; round++) {
            for (int m = 0; !c && m < nn; m++) {
                int kth = 0;
                for (int i = 0; i < nc; i++) {
                    if (node_of[i] != m) continue;
                    if (kth++ == round) {
                        if (seen++ == want) c = cores[i];
                        break;
                    }
                }
            }
        }
        loom_free(node_of);
    }
    int k = c ? set_to_pus(t, c->cpuset, pus, cap) : 0;
    loom_free(cores);
    return k;
}

static atomic_bool loom__bind_warned, loom__mem_warned;

static void warn_once(atomic_bool *flag, const char *fmt, ...) {
    if (atomic_exchange(flag, true)) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    LOOM_LOG_WARN("%s", msg);
}

bool loom_topo_bind_thread(const loom_topo *t, loom_affinity a, int node, int ith, int nth) {
    if (!t) return false;
    int pus[1024];
    int n = loom_topo_thread_pus(t, a, node, ith, nth, pus, 1024);
    if (n == 0) return false;
    if (!t->this_system) {
        warn_once(&loom__bind_warned,
                  "topology: '%s' is not this machine's, so threads are not pinned", t->source);
        return false;
    }
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return false;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t pu = hwloc_get_obj_by_type(t->h, HWLOC_OBJ_PU, (unsigned)pus[i]);
        if (pu) hwloc_bitmap_or(set, set, pu->cpuset);
    }
    int rc = hwloc_set_cpubind(t->h, set, HWLOC_CPUBIND_THREAD);
    int e = errno;
    hwloc_bitmap_free(set);
    if (rc != 0) {
        warn_once(&loom__bind_warned, "topology: cannot pin threads (%s); they run unpinned",
                  strerror(e));
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- memory */

void *loom_topo_alloc_on_node(const loom_topo *t, int node, size_t size) {
    if (!t) return NULL;
    if (size == 0) size = 64;
    void *p = hwloc_alloc(t->h, size);
    if (!p) return NULL;
    hwloc_obj_t m = numa_obj(t, node);
    if (!m) return p;
    if (!t->this_system) {
        warn_once(&loom__mem_warned,
                  "topology: '%s' is not this machine's, so memory is not bound to its nodes",
                  t->source);
        return p;
    }
    if (hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_NUMANODE) > 1 &&
        hwloc_set_area_membind(t->h, p, size, m->nodeset, HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET) != 0) {
        warn_once(&loom__mem_warned, "topology: cannot bind memory to NUMA node %d (%s)", node,
                  strerror(errno));
    }
    return p;
}

void loom_topo_free_mem(const loom_topo *t, void *p, size_t size) {
    if (!t || !p) return;
    hwloc_free(t->h, p, size ? size : 64);
}

int loom_topo_mem_node(const loom_topo *t, const void *p, size_t size) {
    if (!t || !p || !t->this_system) return -1;
    hwloc_nodeset_t ns = hwloc_bitmap_alloc();
    if (!ns) return -1;
    int r = -1;
    if (hwloc_get_area_memlocation(t->h, p, size, ns, HWLOC_MEMBIND_BYNODESET) == 0) {
        int os = hwloc_bitmap_first(ns);
        int n = loom_topo_count(t, LOOM_TOPO_NUMA);
        for (int i = 0; i < n && os >= 0; i++)
            if (numa_obj(t, i)->os_index == (unsigned)os) r = i;
    }
    hwloc_bitmap_free(ns);
    return r;
}

/* ---------------------------------------------------------------- ring order */

typedef struct {
    int numa, sw, idx, pos;
} ring_key;

static int ring_cmp(const void *a, const void *b) {
    const ring_key *x = a, *y = b;
    if (x->numa != y->numa) return x->numa < y->numa ? -1 : 1;
    if (x->sw != y->sw) return x->sw < y->sw ? -1 : 1;
    if (x->idx != y->idx) return x->idx < y->idx ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static size_t appendf(char *buf, size_t size, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(len < size ? buf + len : NULL, len < size ? size - len : 0, fmt, ap);
    va_end(ap);
    return len + (n > 0 ? (size_t)n : 0);
}

loom_status loom_topo_ring_order(const loom_topo *t, loom_topo_kind kind, const int *place, int n,
                                 int *order, char *why, size_t why_size) {
    if (!t || n < 0 || (n > 0 && (!place || !order)))
        return loom_error(LOOM_ERR_INVALID_ARG, "loom_topo_ring_order: NULL argument");
    bool numa = kind == LOOM_TOPO_NUMA;
    if (!numa && kind != LOOM_TOPO_GPU && kind != LOOM_TOPO_PCI)
        return loom_error(LOOM_ERR_INVALID_ARG, "loom_topo_ring_order: places must be NUMA "
                                                "nodes, GPUs or PCI devices");
    ring_key *k = loom_malloc(sizeof *k * (size_t)(n ? n : 1));
    if (!k) return loom_error(LOOM_ERR_NOMEM, "ring order: out of memory");
    int limit = loom_topo_count(t, kind);
    for (int i = 0; i < n; i++) {
        if (place[i] < 0 || place[i] >= limit) {
            loom_free(k);
            return loom_error(LOOM_ERR_NOT_FOUND, "ring order: %s %d does not exist (%d)",
                              numa ? "NUMA node" : "PCI device", place[i], limit);
        }
        k[i] = (ring_key){.numa = place[i], .sw = -1, .idx = place[i], .pos = i};
        if (!numa) {
            loom_topo_pci_info pi;
            loom_topo_pci(t, kind, place[i], &pi);
            k[i].numa = pi.numa < 0 ? 1 << 20 : pi.numa;
            k[i].sw = pi.switch_id;
        }
    }
    qsort(k, (size_t)n, sizeof *k, ring_cmp);
    size_t len = 0;
    if (why && why_size) why[0] = 0;
    len = appendf(why, why_size, len, "ring order");
    for (int i = 0; i < n; i++) {
        order[i] = k[i].pos;
        const char *sep = i == 0                       ? " "
                          : k[i].numa != k[i - 1].numa ? " || "
                          : k[i].sw != k[i - 1].sw     ? " | "
                                                       : ",";
        len = appendf(why, why_size, len, "%s%d", sep, k[i].pos);
    }
    len = appendf(why, why_size, len,
                  numa ? " (topology order: || = next NUMA node, nodes of a package together)"
                       : " (|| = next NUMA node, | = next PCIe switch: ring neighbours share "
                         "a switch or a node)");
    loom_free(k);
    return LOOM_OK;
}

/* ---------------------------------------------------------------- tree */

static size_t fmt_bytes(char *buf, size_t size, size_t len, uint64_t b) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024.0 && i < 4) {
        v /= 1024.0;
        i++;
    }
    return appendf(buf, size, len, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static size_t labels_at(char *buf, size_t size, size_t len, int n, const char *const *labels,
                        const int *numa, const int *pci, int at_numa, int at_pci) {
    bool first = true;
    for (int i = 0; i < n; i++) {
        bool here = at_pci >= 0 ? (pci && pci[i] == at_pci)
                                : ((!pci || pci[i] < 0) && numa && numa[i] == at_numa);
        if (!here) continue;
        len = appendf(buf, size, len, "%s%s", first ? "  <- " : ", ", labels[i]);
        first = false;
    }
    return len;
}

size_t loom_topo_format(const loom_topo *t, char *buf, size_t size, int n_labels,
                        const char *const *labels, const int *numa, const int *pci) {
    if (buf && size) buf[0] = 0;
    if (!t) return 0;
    size_t len = 0;
    int np = loom_topo_count(t, LOOM_TOPO_PACKAGE), nn = loom_topo_count(t, LOOM_TOPO_NUMA);
    int ng = loom_topo_count(t, LOOM_TOPO_GPU);
    len = appendf(buf, size, len,
                  "topology: %s: %d package%s, %d NUMA node%s, %d cores, %d PUs, %d GPU%s%s\n",
                  t->source, np, np == 1 ? "" : "s", nn, nn == 1 ? "" : "s",
                  loom_topo_count(t, LOOM_TOPO_CORE), loom_topo_count(t, LOOM_TOPO_PU), ng,
                  ng == 1 ? "" : "s", t->this_system ? "" : " (not this machine: no binding)");
    for (int p = -1; p < np; p++) {
        bool header = false;
        for (int m = 0; m < nn; m++) {
            loom_topo_numa_info ni;
            if (loom_topo_numa(t, m, &ni) != LOOM_OK) continue;
            if (ni.package != p) continue;
            if (!header) {
                if (p >= 0) len = appendf(buf, size, len, "  package %d\n", p);
                header = true;
            }
            len = appendf(buf, size, len, "    NUMA %d (os %u): ", m, ni.os_index);
            len = fmt_bytes(buf, size, len, ni.memory);
            len = appendf(buf, size, len, ", %d cores, %d PUs", ni.n_cores, ni.n_pus);
            hwloc_obj_t mo = numa_obj(t, m);
            int nl3 = count_in(t, mo->cpuset, HWLOC_OBJ_L3CACHE);
            if (nl3 > 0) {
                hwloc_obj_t l3 =
                    hwloc_get_obj_inside_cpuset_by_type(t->h, mo->cpuset, HWLOC_OBJ_L3CACHE, 0);
                len = appendf(buf, size, len, ", L3 %d x ", nl3);
                len = fmt_bytes(buf, size, len, l3->attr->cache.size);
            }
            len = labels_at(buf, size, len, n_labels, labels, numa, pci, m, -1);
            len = appendf(buf, size, len, "\n");
            for (int g = 0; g < ng; g++) {
                loom_topo_pci_info pi;
                loom_topo_pci(t, LOOM_TOPO_GPU, g, &pi);
                if (pi.numa != m) continue;
                len = appendf(buf, size, len, "      GPU %d %s [%04x:%04x]", g, pi.busid, pi.vendor,
                              pi.device);
                if (pi.switch_id >= 0) len = appendf(buf, size, len, " bridge %d", pi.switch_id);
                len = labels_at(buf, size, len, n_labels, labels, numa, pci, -1, g);
                len = appendf(buf, size, len, "\n");
            }
        }
    }
    for (int g = 0; g < ng; g++) {
        loom_topo_pci_info pi;
        loom_topo_pci(t, LOOM_TOPO_GPU, g, &pi);
        if (pi.numa >= 0) continue;
        len = appendf(buf, size, len, "    GPU %d %s (locality unknown)", g, pi.busid);
        len = labels_at(buf, size, len, n_labels, labels, numa, pci, -1, g);
        len = appendf(buf, size, len, "\n");
    }
    return len;
}
