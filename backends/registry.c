/*
 * The global backend registry: every reg (loaded module or statically linked backend) and
 * the flattened list of their devices, behind one mutex so lookups may come from any
 * thread. Modules are shared objects exporting `loom_backend_init`, dlopen'ed with
 * RTLD_NOW | RTLD_LOCAL; their `loom_backend_api_version` is checked before init runs.
 * load_all scans libloom's directory and its loom/ subdirectory, the executable's
 * directory and LOOM_BACKEND_PATH, and registers the statically linked backends through
 * weak references, so this file depends on no backend library. Device specs ("cpu",
 * "sim:N,...", "cuda:0,1") resolve here too; sim regs created for a spec are owned by the
 * registry and freed by loom_registry_reset.
 */
#define _GNU_SOURCE /* dladdr */
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h> /* dl_iterate_phdr */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/registry-internal.h"
#include "loom/backend-impl.h"
#include "loom/topo.h"

/* Statically linked backends, when present (weak: NULL when not linked). sim's under
 * internal names (backends/sim/sim-reg.c): libloom defines loom_sim_* itself, as forwarders
 * to the module (backends/module-api.c), which are not a statically linked sim. */
extern loom_reg_t loom_cpu_reg(void) __attribute__((weak));
extern loom_reg_t loom__sim_static_reg_default(void) __attribute__((weak));
extern loom_status loom__sim_static_reg_new_from_spec(const char *spec, loom_reg_t *out)
    __attribute__((weak));
extern void loom__sim_static_reg_free(loom_reg_t reg) __attribute__((weak));
extern loom_reg_t loom_cpu_numa_reg(void) __attribute__((weak));
/* The topology, when linked (topo/, through the CPU backend): orders "all devices" specs. */
extern loom_topo *loom_topo_get(void) __attribute__((weak));
extern int loom_topo_pci_find(const loom_topo *t, loom_topo_kind kind, const char *busid)
    __attribute__((weak));
extern loom_status loom_topo_ring_order(const loom_topo *t, loom_topo_kind kind, const int *place,
                                        int n, int *order, char *why, size_t why_size)
    __attribute__((weak));

typedef loom_status (*loom__sim_new_fn)(const char *spec, loom_reg_t *out);
typedef void (*loom__sim_free_fn)(loom_reg_t reg);
typedef const char *(*loom__last_error_fn)(void);
typedef loom_status (*loom__last_status_fn)(void);

typedef struct loom__reg_entry {
    loom_reg_t reg;
    void *handle;              /* dlopen handle, or NULL for a static reg */
    loom__sim_free_fn free_fn; /* set for sim regs created by a device spec */
} loom__reg_entry;

static pthread_mutex_t loom__reg_mutex = PTHREAD_MUTEX_INITIALIZER;
static loom__reg_entry *loom__regs;
static size_t loom__n_regs, loom__cap_regs;
static loom_dev_t *loom__devs;
static size_t loom__n_devs, loom__cap_devs;

/* ---------------------------------------------------------------- internals (locked) */

static loom__reg_entry *loom__find_reg_locked(loom_reg_t reg) {
    for (size_t i = 0; i < loom__n_regs; i++) {
        if (loom__regs[i].reg == reg) return &loom__regs[i];
    }
    return NULL;
}

static loom_reg_t loom__find_name_locked(const char *name) {
    for (size_t i = 0; i < loom__n_regs; i++) {
        if (strcasecmp(loom_reg_name(loom__regs[i].reg), name) == 0) return loom__regs[i].reg;
    }
    return NULL;
}

/* Whether reg has what the registry and every caller rely on: a table with the required
 * hooks, a name, and for each device a table with the required hooks (backend-impl.h).
 * `what` names the module file or "backend"; the error says what is missing. A reg that
 * fails is never called again (its other hooks may be as broken). */
static loom_status loom__reg_check(loom_reg_t reg, const char *what) {
    const struct loom_reg_i *ri = reg->iface;
    const char *miss = !ri                     ? "has no table (iface NULL)"
                       : !ri->get_name         ? "lacks the required hook get_name"
                       : !ri->get_device_count ? "lacks the required hook get_device_count"
                       : !ri->get_device       ? "lacks the required hook get_device"
                                               : NULL;
    if (miss) return loom_error(LOOM_ERR_FORMAT, "%s: its reg %s", what, miss);
    const char *name = ri->get_name(reg);
    if (!name || !name[0])
        return loom_error(LOOM_ERR_FORMAT, "%s: its reg has no name (get_name returned %s)", what,
                          name ? "\"\"" : "NULL");
    const size_t n = ri->get_device_count(reg);
    if (n > 4096)
        return loom_error(LOOM_ERR_FORMAT, "%s: backend '%s' reports %zu devices (at most 4096)",
                          what, name, n);
    for (size_t i = 0; i < n; i++) {
        loom_dev_t dev = ri->get_device(reg, i);
        const struct loom_dev_i *di = dev ? dev->iface : NULL;
        const char *dmiss = !dev                   ? "is NULL"
                            : !di                  ? "has no table (iface NULL)"
                            : !di->get_name        ? "lacks the required hook get_name"
                            : !di->get_memory      ? "lacks the required hook get_memory"
                            : !di->get_type        ? "lacks the required hook get_type"
                            : !di->get_props       ? "lacks the required hook get_props"
                            : !di->init_backend    ? "lacks the required hook init_backend"
                            : !di->get_buffer_type ? "lacks the required hook get_buffer_type"
                            : !di->supports_op     ? "lacks the required hook supports_op"
                            : !di->supports_buft   ? "lacks the required hook supports_buft"
                                                   : NULL;
        if (dmiss)
            return loom_error(LOOM_ERR_FORMAT, "%s: backend '%s': device %zu of %zu %s", what, name,
                              i, n, dmiss);
    }
    return LOOM_OK;
}

/* Appends reg and its devices. The caller checked it is not registered. */
static loom_status loom__add_locked(loom_reg_t reg, void *handle, loom__sim_free_fn free_fn) {
    if (reg->api_version != LOOM_BACKEND_API_VERSION) {
        return loom_error(LOOM_ERR_FORMAT,
                          "backend '%s': backend API version %d, this loom (%s) has backend API "
                          "version %d",
                          loom_reg_name(reg), reg->api_version, loom_version(),
                          LOOM_BACKEND_API_VERSION);
    }
    size_t n = loom_reg_dev_count(reg);
    if (loom__n_regs == loom__cap_regs) {
        size_t cap = loom__cap_regs ? 2 * loom__cap_regs : 8;
        loom__reg_entry *p = loom_realloc(loom__regs, cap * sizeof *p);
        if (!p) return loom_error(LOOM_ERR_NOMEM, "registry: out of host memory");
        loom__regs = p;
        loom__cap_regs = cap;
    }
    if (loom__n_devs + n > loom__cap_devs) {
        size_t cap = loom__cap_devs ? 2 * loom__cap_devs : 16;
        while (cap < loom__n_devs + n)
            cap *= 2;
        loom_dev_t *p = loom_realloc(loom__devs, cap * sizeof *p);
        if (!p) return loom_error(LOOM_ERR_NOMEM, "registry: out of host memory");
        loom__devs = p;
        loom__cap_devs = cap;
    }
    for (size_t i = 0; i < n; i++)
        loom__devs[loom__n_devs++] = loom_reg_dev_get(reg, i);
    loom__regs[loom__n_regs++] = (loom__reg_entry){reg, handle, free_fn};
    LOOM_LOG_DEBUG("registry: added backend '%s' with %zu device(s)", loom_reg_name(reg), n);
    return LOOM_OK;
}

/* ---------------------------------------------------------------- public: add / lookup */

loom_status loom_registry_add(loom_reg_t reg) {
    if (!reg) return loom_error(LOOM_ERR_INVALID_ARG, "loom_registry_add: NULL reg");
    if (reg->api_version == LOOM_BACKEND_API_VERSION && loom__reg_check(reg, "loom_registry_add"))
        return loom_last_status();
    pthread_mutex_lock(&loom__reg_mutex);
    loom_status s = LOOM_OK;
    if (!loom__find_reg_locked(reg)) s = loom__add_locked(reg, NULL, NULL);
    pthread_mutex_unlock(&loom__reg_mutex);
    return s;
}

size_t loom_registry_reg_count(void) {
    pthread_mutex_lock(&loom__reg_mutex);
    size_t n = loom__n_regs;
    pthread_mutex_unlock(&loom__reg_mutex);
    return n;
}

loom_reg_t loom_registry_reg_get(size_t index) {
    pthread_mutex_lock(&loom__reg_mutex);
    loom_reg_t r = index < loom__n_regs ? loom__regs[index].reg : NULL;
    pthread_mutex_unlock(&loom__reg_mutex);
    return r;
}

loom_reg_t loom_registry_reg_by_name(const char *name) {
    if (!name) return NULL;
    pthread_mutex_lock(&loom__reg_mutex);
    loom_reg_t r = loom__find_name_locked(name);
    pthread_mutex_unlock(&loom__reg_mutex);
    return r;
}

size_t loom_registry_dev_count(void) {
    pthread_mutex_lock(&loom__reg_mutex);
    size_t n = loom__n_devs;
    pthread_mutex_unlock(&loom__reg_mutex);
    return n;
}

loom_dev_t loom_registry_dev_get(size_t index) {
    pthread_mutex_lock(&loom__reg_mutex);
    loom_dev_t d = index < loom__n_devs ? loom__devs[index] : NULL;
    pthread_mutex_unlock(&loom__reg_mutex);
    return d;
}

loom_dev_t loom_registry_dev_by_name(const char *name) {
    if (!name) return NULL;
    loom_dev_t d = NULL;
    pthread_mutex_lock(&loom__reg_mutex);
    for (size_t i = 0; i < loom__n_devs && !d; i++) {
        if (strcasecmp(loom_dev_name(loom__devs[i]), name) == 0) d = loom__devs[i];
    }
    pthread_mutex_unlock(&loom__reg_mutex);
    return d;
}

loom_dev_t loom_registry_dev_by_type(loom_dev_type type) {
    loom_dev_t d = NULL;
    pthread_mutex_lock(&loom__reg_mutex);
    for (size_t i = 0; i < loom__n_devs && !d; i++) {
        if (loom_dev_get_type(loom__devs[i]) == type) d = loom__devs[i];
    }
    pthread_mutex_unlock(&loom__reg_mutex);
    return d;
}

/* ---------------------------------------------------------------- modules */

/* Copies a module's own last error (it has its own core) into this thread's slot. */
static void loom__import_reg_error(loom_reg_t reg, loom_status fallback, const char *what) {
    loom__last_error_fn err_fn =
        (loom__last_error_fn)loom_reg_get_proc_address(reg, "loom_last_error");
    loom__last_status_fn st_fn =
        (loom__last_status_fn)loom_reg_get_proc_address(reg, "loom_last_status");
    if (err_fn && st_fn && err_fn != loom_last_error && st_fn() != LOOM_OK) {
        loom_error(st_fn(), "%s", err_fn());
    } else if (loom_last_status() == LOOM_OK) {
        loom_error(fallback, "%s failed", what);
    }
}

/* Whether the ELF file at path (st: its stat) holds everything dlopen will map: the
 * program headers and each loaded segment's file bytes. dlopen maps a segment past the end
 * of a file cut short without a check, and the first touch of it is a SIGBUS that ends the
 * process; so a truncated module is refused here, naming where it ends. Other defects (not
 * ELF, another machine or class) are left to dlopen, which reports them. Writes why. */
static bool loom__elf_complete(const char *path, const struct stat *st, char *why, size_t size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, size, "%s", strerror(errno));
        return false;
    }
    bool ok = true;
    Elf64_Ehdr eh;
    const uint64_t fsize = (uint64_t)st->st_size;
    if (fread(&eh, 1, sizeof eh, f) == sizeof eh && memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
        eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_phentsize == sizeof(Elf64_Phdr)) {
        const uint64_t ph_end = eh.e_phoff + (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr);
        if (eh.e_phoff > fsize || ph_end > fsize) {
            snprintf(why, size,
                     "a truncated ELF file: its program headers end at byte %llu, the file has "
                     "%llu bytes",
                     (unsigned long long)ph_end, (unsigned long long)fsize);
            ok = false;
        }
        for (unsigned i = 0; ok && i < eh.e_phnum; i++) {
            Elf64_Phdr ph;
            if (fseeko(f, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph), SEEK_SET) != 0 ||
                fread(&ph, 1, sizeof ph, f) != sizeof ph) {
                snprintf(why, size, "cannot read its program header %u", i);
                ok = false;
            } else if ((ph.p_type == PT_LOAD || ph.p_type == PT_DYNAMIC) &&
                       (ph.p_offset > fsize || ph.p_filesz > fsize - ph.p_offset)) {
                snprintf(why, size,
                         "a truncated ELF file: its segment %u ends at byte %llu, the file has "
                         "%llu bytes",
                         i, (unsigned long long)(ph.p_offset + ph.p_filesz),
                         (unsigned long long)fsize);
                ok = false;
            }
        }
    }
    fclose(f);
    return ok;
}

/* Loads one module. A module whose reg (or reg name) is already registered is unloaded
 * again, *out_reg is the registered one and *skipped is set: not an error. */
static loom_status loom__load(const char *path, loom_reg_t *out_reg, bool *skipped) {
    if (out_reg) *out_reg = NULL;
    if (skipped) *skipped = false;
    if (!path || !path[0]) {
        return loom_error(LOOM_ERR_INVALID_ARG, "loom_registry_load: empty module path");
    }
    /* Only a regular file (after symlinks) is opened: dlopen of a FIFO waits for a writer
     * for ever, and a directory or a device is never a module. A bare name (no '/') is
     * dlopen's to search for. */
    struct stat st;
    const bool named = strchr(path, '/') == NULL;
    if (!named && stat(path, &st) != 0) {
        int e = errno;
        return loom_error(e == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_FORMAT,
                          "cannot load backend module '%s': %s", path, strerror(e));
    }
    if (!named && !S_ISREG(st.st_mode))
        return loom_error(LOOM_ERR_FORMAT,
                          "cannot load backend module '%s': not a regular file (%s)", path,
                          S_ISDIR(st.st_mode)                          ? "a directory"
                          : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                          : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                          : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                       : "not a file");
    char bad[256];
    if (!named && !loom__elf_complete(path, &st, bad, sizeof bad))
        return loom_error(LOOM_ERR_FORMAT, "cannot load backend module '%s': %s", path, bad);
    dlerror();
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *why = dlerror();
        return loom_error(named ? LOOM_ERR_NOT_FOUND : LOOM_ERR_FORMAT,
                          "cannot load backend module '%s': %s", path, why ? why : "dlopen failed");
    }
    /* The module's compiled-in interface version, read before any of its code runs (a
     * module built for another layout of the tables must not be called at all). Modules
     * older than the symbol have only their reg's api_version, checked below. */
    const int *ver = dlsym(handle, LOOM_BACKEND_VERSION_SYMBOL);
    if (ver && *ver != LOOM_BACKEND_API_VERSION) {
        int v = *ver;
        dlclose(handle);
        return loom_error(LOOM_ERR_FORMAT,
                          "backend module '%s': built for backend API version %d, this loom "
                          "(%s) has backend API version %d",
                          path, v, loom_version(), LOOM_BACKEND_API_VERSION);
    }
    loom_backend_init_fn init = NULL;
    void *sym = dlsym(handle, LOOM_BACKEND_INIT_SYMBOL);
    memcpy(&init, &sym, sizeof init);
    if (!init) {
        dlclose(handle);
        return loom_error(LOOM_ERR_FORMAT, "backend module '%s': no %s symbol", path,
                          LOOM_BACKEND_INIT_SYMBOL);
    }
    loom_reg_t reg = init();
    if (!reg) {
        dlclose(handle);
        return loom_error(LOOM_ERR_NOT_FOUND, "backend module '%s': %s returned no backend", path,
                          LOOM_BACKEND_INIT_SYMBOL);
    }
    if (reg->api_version != LOOM_BACKEND_API_VERSION) {
        int v = reg->api_version;
        dlclose(handle);
        return loom_error(LOOM_ERR_FORMAT,
                          "backend module '%s': its reg has backend API version %d, this loom "
                          "(%s) has backend API version %d",
                          path, v, loom_version(), LOOM_BACKEND_API_VERSION);
    }
    char what[4096 + 32];
    snprintf(what, sizeof what, "backend module '%s'", path);
    if (loom__reg_check(reg, what)) {
        dlclose(handle);
        return loom_last_status();
    }
    pthread_mutex_lock(&loom__reg_mutex);
    loom_status s = LOOM_OK;
    loom_reg_t known = loom__find_reg_locked(reg) ? reg : NULL;
    if (!known) known = loom__find_name_locked(loom_reg_name(reg));
    if (known) {
        /* Registering twice is a no-op: same module (dlopen gave the same handle) or a
         * backend of that name already present (e.g. statically linked). */
        LOOM_LOG_DEBUG("registry: backend '%s' already registered; '%s' not added",
                       loom_reg_name(known), path);
        if (skipped) *skipped = true;
        reg = known;
    } else {
        s = loom__add_locked(reg, handle, NULL);
    }
    pthread_mutex_unlock(&loom__reg_mutex);
    if (known || s != LOOM_OK) {
        if (s != LOOM_OK) reg = NULL;
        dlclose(handle);
    } else {
        /* A registered module stays mapped for the life of the process (RTLD_NODELETE):
         * reset only unregisters it. GPU runtimes and the C++ runtimes some of them carry
         * (cuBLAS) cannot be unloaded cleanly: their exit handlers and allocations would
         * point into unmapped code. A later load of the same file reuses it. */
        void *pin = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD | RTLD_NODELETE);
        if (pin) dlclose(pin);
    }
    if (s == LOOM_OK && out_reg) *out_reg = reg;
    return s;
}

loom_status loom_registry_load(const char *path, loom_reg_t *out_reg) {
    return loom__load(path, out_reg, NULL);
}

/* The directory of file (a path with a '/'): "/" for a file at the root; "" when it does
 * not fit. */
static void loom__dir_of(const char *file, char *out, size_t size) {
    out[0] = '\0';
    const char *slash = strrchr(file, '/');
    if (!slash) return;
    size_t len = slash == file ? 1 : (size_t)(slash - file); /* "/libloom.so" */
    if (len >= size) return;
    memcpy(out, file, len);
    out[len] = '\0';
}

/* The running executable's directory; "" when unknown. */
static void loom__exe_dir(char *out, size_t size) {
    out[0] = '\0';
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = '\0';
    loom__dir_of(exe, out, size);
}

/* The registry's own directory: where the loom library (or the executable linking it
 * statically) lives, symlinks resolved (Bazel links libloom through a symlink in _solib;
 * the real file lies beside its loom/ module directory, as in an installed tree). Writes ""
 * when unknown. */
static void loom__self_dir(char *out, size_t size) {
    out[0] = '\0';
    Dl_info info;
    void *self = NULL;
    loom_status (*fn)(const char *, loom_reg_t *) = loom_registry_load;
    memcpy(&self, &fn, sizeof self);
    if (!dladdr(self, &info) || !info.dli_fname || !strchr(info.dli_fname, '/')) {
        loom__exe_dir(out, size); /* /proc/self/exe: already without symlinks */
        return;
    }
    char *real = realpath(info.dli_fname, NULL); /* malloc'ed by libc */
    loom__dir_of(real ? real : info.dli_fname, out, size);
    free(real);
}

/* dl_iterate_phdr reports the executable first: 1 when *data lies in one of its loaded
 * segments, else 2 (either stops the walk). */
static int loom__in_executable(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    uintptr_t addr = *(const uintptr_t *)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = (uintptr_t)info->dlpi_addr + (uintptr_t)ph->p_vaddr;
        if (ph->p_type == PT_LOAD && addr >= lo && addr - lo < (uintptr_t)ph->p_memsz) return 1;
    }
    return 2;
}

bool loom__registry_linked_statically(void) {
    static int answer; /* 0 unknown, 1 yes, 2 no; the same for the whole process */
    if (!answer) {
        loom_status (*fn)(const char *, loom_reg_t *) = loom_registry_load;
        void *self = NULL;
        memcpy(&self, &fn, sizeof self);
        uintptr_t addr = (uintptr_t)self;
        answer = dl_iterate_phdr(loom__in_executable, &addr) == 1 ? 1 : 2;
    }
    return answer == 1;
}

const char *loom__registry_static_hint(const char *module) {
    static _Thread_local char hint[512];
    if (!loom__registry_linked_statically()) return "";
    snprintf(hint, sizeof hint,
             " in this program: it links libloom statically (libloom.a), which holds the CPU "
             "backend only, and no libloom-%s.so was found beside it; set LOOM_BACKEND_PATH to "
             "the installed lib/loom/ before loom_registry_load_all() (the module brings "
             "libloom.so along), or link libloom.so (pkg-config --libs loom), which finds its "
             "lib/loom/ itself",
             module);
    return hint;
}

static int loom__cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads every libloom-*.so of dir (sorted), skipping names already registered. */
/* Why the CUDA module (libloom-cuda.so) last failed to load, for the "no CUDA devices"
 * message of a device spec ("" when it did not fail). */
static char loom__cuda_load_error[512]; /* under loom__cuda_err_mutex (scans may race) */
static pthread_mutex_t loom__cuda_err_mutex = PTHREAD_MUTEX_INITIALIZER;

static size_t loom__scan_dir(const char *dir, bool from_env) {
    DIR *d = opendir(dir);
    if (!d) {
        /* a directory the user named is worth a warning; a default one may well be absent */
        if (from_env)
            LOOM_LOG_WARN("registry: LOOM_BACKEND_PATH: cannot open backend directory '%s': %s",
                          dir, strerror(errno));
        else
            LOOM_LOG_DEBUG("registry: cannot open backend directory '%s': %s", dir,
                           strerror(errno));
        return 0;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len <= 11 || strncmp(e->d_name, "libloom-", 8) != 0 ||
            strcmp(e->d_name + len - 3, ".so") != 0) {
            continue;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 8;
            char **p = loom_realloc(names, nc * sizeof *p);
            if (!p) break;
            names = p;
            cap = nc;
        }
        names[n] = loom_strdup(e->d_name);
        if (names[n]) n++;
    }
    closedir(d);
    if (n > 1) qsort(names, n, sizeof *names, loom__cmp_str);

    size_t loaded = 0;
    for (size_t i = 0; i < n; i++) {
        /* libloom-<name>.so: skip before loading when <name> is registered already. */
        char stem[256];
        size_t len = strlen(names[i]) - 11;
        if (len < sizeof stem) {
            memcpy(stem, names[i] + 8, len);
            stem[len] = '\0';
            if (loom_registry_reg_by_name(stem)) {
                LOOM_LOG_DEBUG("registry: '%s/%s' skipped: backend '%s' already registered", dir,
                               names[i], stem);
                loom_free(names[i]);
                continue;
            }
        }
        /* The CUDA module needs the driver: without libcuda.so.1 it could only report zero
         * devices, after loading the CUDA runtime and cuBLAS (hundreds of MB, seconds), so
         * it is not loaded at all and the reason is kept for a "cuda" spec. */
        if (strcmp(names[i], "libloom-cuda.so") == 0 && !getenv("LOOM_CUDA_NO_DRIVER_CHECK")) {
            dlerror();
            void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
            if (!drv) {
                const char *why = dlerror();
                char msg[sizeof loom__cuda_load_error];
                snprintf(msg, sizeof msg,
                         "no CUDA driver: libcuda.so.1 cannot be loaded (%s), so %s/%s was not "
                         "loaded",
                         why ? why : "not found", dir, names[i]);
                pthread_mutex_lock(&loom__cuda_err_mutex);
                memcpy(loom__cuda_load_error, msg, sizeof msg);
                pthread_mutex_unlock(&loom__cuda_err_mutex);
                LOOM_LOG_DEBUG("registry: %s", msg);
                loom_free(names[i]);
                continue;
            }
        }
        size_t plen = strlen(dir) + 1 + strlen(names[i]) + 1;
        char *path = loom_malloc(plen);
        if (path) {
            snprintf(path, plen, "%s/%s", dir, names[i]);
            bool skipped = false;
            loom_status s = loom__load(path, NULL, &skipped);
            if (s != LOOM_OK) {
                LOOM_LOG_WARN("registry: skipping backend module: %s", loom_last_error());
                if (strcmp(names[i], "libloom-cuda.so") == 0) {
                    pthread_mutex_lock(&loom__cuda_err_mutex);
                    snprintf(loom__cuda_load_error, sizeof loom__cuda_load_error, "%s",
                             loom_last_error());
                    pthread_mutex_unlock(&loom__cuda_err_mutex);
                }
            } else if (!skipped) {
                loaded++;
            }
            loom_free(path);
        }
        loom_free(names[i]);
    }
    loom_free(names);
    return loaded;
}

size_t loom_registry_load_all(void) {
    size_t loaded = 0;
    size_t before = loom_registry_reg_count();
    if (loom_cpu_reg) {
        loom_reg_t r = loom_cpu_reg();
        if (r && loom_registry_add(r) != LOOM_OK) {
            LOOM_LOG_WARN("registry: cannot register the CPU backend: %s", loom_last_error());
        }
    }
    if (loom__sim_static_reg_default) {
        loom_reg_t r = loom__sim_static_reg_default();
        if (!r) {
            LOOM_LOG_WARN("registry: no default sim backend: %s", loom_last_error());
        } else if (loom_registry_add(r) != LOOM_OK) {
            LOOM_LOG_WARN("registry: cannot register the sim backend: %s", loom_last_error());
        }
    }
    loaded += loom_registry_reg_count() - before;

    /* The directories, in order: LOOM_BACKEND_PATH first (so a module there overrides one
     * of the same name installed with the library: the first of a name wins), then the
     * library's own directory and its loom/ subdirectory (an installed tree: lib/libloom.so
     * and lib/loom/libloom-*.so), then the executable's directory (the build tree keeps
     * modules next to the loom tool). Each directory is scanned once. */
    enum { MAX_DIRS = 64 };
    char self[4096], self_loom[4096 + 8], exe[4096];
    loom__self_dir(self, sizeof self);
    snprintf(self_loom, sizeof self_loom, "%s%s", self, self[0] ? "/loom" : "");
    loom__exe_dir(exe, sizeof exe);
    const char *dirs[MAX_DIRS];
    int n_dirs = 0;
    const char *env = getenv("LOOM_BACKEND_PATH");
    char *copy = env && env[0] ? loom_strdup(env) : NULL;
    if (copy) {
        char *save = NULL;
        for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
            if (n_dirs == MAX_DIRS - 3) {
                LOOM_LOG_WARN("registry: LOOM_BACKEND_PATH names more than %d directories; "
                              "'%s' and the ones after it are not scanned",
                              MAX_DIRS - 3, dir);
                break;
            }
            dirs[n_dirs++] = dir;
        }
    }
    const int n_env = n_dirs;
    dirs[n_dirs++] = self;
    dirs[n_dirs++] = self_loom;
    dirs[n_dirs++] = exe;
    for (int i = 0; i < n_dirs; i++) {
        bool seen = !dirs[i][0];
        for (int j = 0; j < i && !seen; j++)
            seen = strcmp(dirs[i], dirs[j]) == 0;
        if (!seen) loaded += loom__scan_dir(dirs[i], i < n_env);
    }
    loom_free(copy);
    return loaded;
}

void loom_registry_reset(void) {
    pthread_mutex_lock(&loom__reg_mutex);
    /* Owned sim regs first: their free function may live in a module unloaded below. */
    for (size_t i = loom__n_regs; i-- > 0;) {
        if (loom__regs[i].free_fn) loom__regs[i].free_fn(loom__regs[i].reg);
    }
    for (size_t i = loom__n_regs; i-- > 0;) {
        if (loom__regs[i].handle) dlclose(loom__regs[i].handle);
    }
    loom_free(loom__regs);
    loom_free(loom__devs);
    loom__regs = NULL;
    loom__devs = NULL;
    loom__n_regs = loom__cap_regs = 0;
    loom__n_devs = loom__cap_devs = 0;
    pthread_mutex_unlock(&loom__reg_mutex);
}

bool loom_registry_release(loom_reg_t reg) {
    if (!reg) return false;
    pthread_mutex_lock(&loom__reg_mutex);
    loom__reg_entry *e = loom__find_reg_locked(reg);
    loom__sim_free_fn free_fn = e ? e->free_fn : NULL;
    if (free_fn) {
        /* drop its devices from the flat list, then the entry itself */
        size_t k = 0;
        for (size_t i = 0; i < loom__n_devs; i++)
            if (loom_dev_reg(loom__devs[i]) != reg) loom__devs[k++] = loom__devs[i];
        loom__n_devs = k;
        size_t at = (size_t)(e - loom__regs);
        memmove(e, e + 1, (loom__n_regs - at - 1) * sizeof *e);
        loom__n_regs--;
    }
    pthread_mutex_unlock(&loom__reg_mutex);
    if (free_fn) free_fn(reg);
    return free_fn != NULL;
}

/* ---------------------------------------------------------------- device specs */

/* "sim spec 'X': reason" -> "reason", so the device-spec prefix is not doubled. */
static const char *loom__strip_sim_prefix(const char *msg) {
    if (strncmp(msg, "sim spec '", 10) == 0) {
        const char *p = strstr(msg + 10, "': ");
        if (p) return p + 3;
    }
    return msg;
}

static loom_status loom__spec_sim(const char *spec, loom_dev_t *devs, size_t cap, size_t *n_out) {
    loom__sim_new_fn new_fn = NULL;
    loom__sim_free_fn free_fn = NULL;
    loom_reg_t provider = NULL;
    /* A registered sim reg (static or from libloom-sim.so) provides the constructor. */
    pthread_mutex_lock(&loom__reg_mutex);
    for (size_t i = 0; i < loom__n_regs && !new_fn; i++) {
        void *p = loom_reg_get_proc_address(loom__regs[i].reg, "loom_sim_reg_new_from_spec");
        void *q = loom_reg_get_proc_address(loom__regs[i].reg, "loom_sim_reg_free");
        if (p && q) {
            memcpy(&new_fn, &p, sizeof new_fn);
            memcpy(&free_fn, &q, sizeof free_fn);
            provider = loom__regs[i].reg;
        }
    }
    pthread_mutex_unlock(&loom__reg_mutex);
    if (!new_fn && loom__sim_static_reg_new_from_spec && loom__sim_static_reg_free) {
        new_fn = loom__sim_static_reg_new_from_spec;
        free_fn = loom__sim_static_reg_free;
    }
    if (!new_fn) {
        if (loom__registry_linked_statically())
            return loom_error(LOOM_ERR_NOT_FOUND, "device spec '%s': no sim backend%s", spec,
                              loom__registry_static_hint("sim"));
        return loom_error(LOOM_ERR_NOT_FOUND,
                          "device spec '%s': no sim backend (link it or load libloom-sim.so)",
                          spec);
    }
    loom_reg_t reg = NULL;
    loom_clear_error();
    loom_status s = new_fn(spec, &reg);
    if (s != LOOM_OK) {
        if (provider) loom__import_reg_error(provider, s, "sim reg creation");
        char msg[512];
        snprintf(msg, sizeof msg, "%s", loom__strip_sim_prefix(loom_last_error()));
        return loom_error(s, "device spec '%s': %s", spec, msg);
    }
    pthread_mutex_lock(&loom__reg_mutex);
    s = loom__add_locked(reg, NULL, free_fn);
    pthread_mutex_unlock(&loom__reg_mutex);
    if (s != LOOM_OK) {
        free_fn(reg);
        return s;
    }
    size_t n = loom_reg_dev_count(reg);
    for (size_t i = 0; i < n && i < cap; i++)
        devs[i] = loom_reg_dev_get(reg, i);
    *n_out = n;
    return LOOM_OK;
}

/* The why of the last "all devices" spec's order (under the registry mutex). */
static char loom__order_why[512];

const char *loom_devices_last_order(void) {
    static _Thread_local char copy[512];
    pthread_mutex_lock(&loom__reg_mutex);
    snprintf(copy, sizeof copy, "%s", loom__order_why);
    pthread_mutex_unlock(&loom__reg_mutex);
    return copy;
}

/* Puts the n devices of an "all" spec in ring order: NUMA devices by node, GPUs by where
 * their PCI bus id (the reg's "loom_dev_pci_bus_id" extra) sits in the topology. Leaves the
 * enumeration order, saying why, when the topology cannot place every device. */
static void loom__ring_order(const char *spec, loom_reg_t reg, bool numa, loom_dev_t *devs,
                             size_t n) {
    char why[512] = "";
    enum { MAXD = 64 };
    int place[MAXD], order[MAXD];
    const char *(*bus_id)(loom_dev_t) = NULL;
    void *fn = loom_reg_get_proc_address(reg, "loom_dev_pci_bus_id");
    memcpy(&bus_id, &fn, sizeof bus_id);
    loom_topo *t = NULL;
    if (n < 2 || n > MAXD) {
        snprintf(why, sizeof why, "%zu device%s: enumeration order", n, n == 1 ? "" : "s");
    } else if (!numa && (!bus_id || !loom_topo_pci_find)) {
        snprintf(why, sizeof why, "backend '%s' reports no PCI bus ids: enumeration order",
                 loom_reg_name(reg));
    } else if (!loom_topo_get || !loom_topo_ring_order || !(t = loom_topo_get())) {
        snprintf(why, sizeof why, "no topology: enumeration order");
    } else {
        for (size_t i = 0; i < n && why[0] == 0; i++) {
            if (numa) {
                place[i] = (int)i;
                continue;
            }
            const char *id = bus_id(devs[i]);
            place[i] = id ? loom_topo_pci_find(t, LOOM_TOPO_GPU, id) : -1;
            if (place[i] < 0)
                snprintf(why, sizeof why, "%s (PCI %s) is not in the topology: enumeration order",
                         loom_dev_name(devs[i]), id ? id : "unknown");
        }
        if (!why[0] && loom_topo_ring_order(t, numa ? LOOM_TOPO_NUMA : LOOM_TOPO_GPU, place, (int)n,
                                            order, why, sizeof why) == LOOM_OK) {
            loom_dev_t tmp[MAXD];
            for (size_t k = 0; k < n; k++)
                tmp[k] = devs[order[k]];
            memcpy(devs, tmp, n * sizeof *devs);
        }
    }
    LOOM_LOG_INFO("device spec '%s': %s", spec, why);
    pthread_mutex_lock(&loom__reg_mutex);
    snprintf(loom__order_why, sizeof loom__order_why, "%.100s: %.400s", spec, why);
    pthread_mutex_unlock(&loom__reg_mutex);
}

static loom_status loom__spec_indexed(const char *spec, const char *list, loom_reg_t reg,
                                      const char *what, loom_dev_t *devs, size_t cap,
                                      size_t *n_out) {
    size_t count = reg ? loom_reg_dev_count(reg) : 0;
    if (count == 0)
        return loom_error(LOOM_ERR_NOT_FOUND, "device spec '%s': no %s devices", spec, what);
    if (!list) {
        for (size_t i = 0; i < count && i < cap; i++)
            devs[i] = loom_reg_dev_get(reg, i);
        if (count <= cap) loom__ring_order(spec, reg, strcmp(what, "NUMA") == 0, devs, count);
        *n_out = count;
        return LOOM_OK;
    }
    size_t n = 0;
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char part[32];
        if (len == 0 || len >= sizeof part) {
            return loom_error(LOOM_ERR_FORMAT, "device spec '%s': '%.*s' is not a device index",
                              spec, (int)len, p);
        }
        memcpy(part, p, len);
        part[len] = '\0';
        char *stop = NULL;
        errno = 0;
        unsigned long idx = strtoul(part, &stop, 10);
        if (!isdigit((unsigned char)part[0]) || *stop || errno) {
            return loom_error(LOOM_ERR_FORMAT, "device spec '%s': '%s' is not a device index", spec,
                              part);
        }
        if (idx >= count) {
            return loom_error(LOOM_ERR_NOT_FOUND,
                              "device spec '%s': %s device %lu does not exist (%zu device%s)", spec,
                              what, idx, count, count == 1 ? "" : "s");
        }
        if (n < cap) devs[n] = loom_reg_dev_get(reg, idx);
        n++;
        if (!end) break;
        p = end + 1;
    }
    *n_out = n;
    return LOOM_OK;
}

/* "numa" (every NUMA node, in ring order) or "numa:I,J" (those nodes, in that order). */
static loom_status loom__spec_numa(const char *spec, const char *list, loom_dev_t *devs, size_t cap,
                                   size_t *n_out) {
    loom_reg_t reg = loom_cpu_numa_reg ? loom_cpu_numa_reg() : NULL;
    if (!reg) {
        return loom_error(LOOM_ERR_NOT_FOUND, "device spec '%s': no NUMA devices (%s)", spec,
                          loom_cpu_numa_reg ? loom_last_error() : "the CPU backend is not linked");
    }
    loom_status s = loom_registry_add(reg);
    if (s != LOOM_OK) return s;
    return loom__spec_indexed(spec, list, reg, "NUMA", devs, cap, n_out);
}

static loom_status loom__spec_cuda(const char *spec, const char *list, loom_dev_t *devs, size_t cap,
                                   size_t *n_out) {
    loom_reg_t reg = loom_registry_reg_by_name("CUDA");
    if (!reg || loom_reg_dev_count(reg) == 0) {
        /* say why: the module's or the driver's own reason */
        typedef const char *(*reason_fn)(loom_reg_t);
        reason_fn why = NULL;
        void *p = reg ? loom_reg_get_proc_address(reg, "loom_cuda_no_devices_reason") : NULL;
        memcpy(&why, &p, sizeof why);
        const char *r = why ? why(reg) : "";
        char load_err[sizeof loom__cuda_load_error];
        pthread_mutex_lock(&loom__cuda_err_mutex);
        memcpy(load_err, loom__cuda_load_error, sizeof load_err);
        pthread_mutex_unlock(&loom__cuda_err_mutex);
        if (!reg && load_err[0]) r = load_err;
        if (!reg && !r[0] && loom__registry_linked_statically())
            return loom_error(LOOM_ERR_NOT_FOUND, "device spec '%s': no CUDA devices%s", spec,
                              loom__registry_static_hint("cuda"));
        if (!reg && !r[0])
            r = "the CUDA backend module libloom-cuda.so was not found (set LOOM_BACKEND_PATH)";
        return loom_error(LOOM_ERR_NOT_FOUND, "device spec '%s': no CUDA devices%s%s%s", spec,
                          r && r[0] ? " (" : "", r ? r : "", r && r[0] ? ")" : "");
    }
    return loom__spec_indexed(spec, list, reg, "CUDA", devs, cap, n_out);
}

loom_status loom_devices_from_spec(const char *spec, loom_dev_t *devs, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!spec || !n_out || (cap > 0 && !devs)) {
        return loom_error(LOOM_ERR_INVALID_ARG, "loom_devices_from_spec: NULL argument");
    }
    size_t kind_len = strcspn(spec, ":,");
    if (kind_len == 0) return loom_error(LOOM_ERR_FORMAT, "device spec '%s' is empty", spec);

    if (kind_len == 3 && strncasecmp(spec, "cpu", 3) == 0 && spec[3] == '\0') {
        loom_reg_t reg = loom_registry_reg_by_name("CPU");
        if (!reg && loom_cpu_reg) {
            reg = loom_cpu_reg();
            if (loom_registry_add(reg) != LOOM_OK) return loom_last_status();
        }
        if (!reg || loom_reg_dev_count(reg) == 0) {
            return loom_error(LOOM_ERR_NOT_FOUND, "device spec '%s': no CPU backend", spec);
        }
        if (cap > 0) devs[0] = loom_reg_dev_get(reg, 0);
        *n_out = 1;
        return LOOM_OK;
    }
    if (kind_len == 3 && strncasecmp(spec, "sim", 3) == 0) {
        return loom__spec_sim(spec, devs, cap, n_out);
    }
    if (kind_len == 4 && strncasecmp(spec, "cuda", 4) == 0) {
        if (spec[4] == '\0') return loom__spec_cuda(spec, NULL, devs, cap, n_out);
        if (spec[4] == ':') return loom__spec_cuda(spec, spec + 5, devs, cap, n_out);
    }
    if (kind_len == 4 && strncasecmp(spec, "numa", 4) == 0) {
        if (spec[4] == '\0') return loom__spec_numa(spec, NULL, devs, cap, n_out);
        if (spec[4] == ':') return loom__spec_numa(spec, spec + 5, devs, cap, n_out);
    }
    /* A registered device by name ("SIM1", "CPU"). */
    loom_dev_t d = loom_registry_dev_by_name(spec);
    if (d) {
        if (cap > 0) devs[0] = d;
        *n_out = 1;
        return LOOM_OK;
    }
    /* a known kind with what it does not take: say what it takes */
    static const struct {
        const char *kind, *takes;
    } kinds[] = {
        {"cpu", "'cpu' takes no index or options (the one CPU device; numa[:I,...] gives one per "
                "NUMA node, -t the threads)"},
        {"cuda", "'cuda' takes a list of GPU indices after ':' (cuda:0,1), or nothing (every "
                 "GPU)"},
        {"numa", "'numa' takes a list of NUMA nodes after ':' (numa:0,1), or nothing (every "
                 "node)"},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        if (kind_len == strlen(kinds[k].kind) && strncasecmp(spec, kinds[k].kind, kind_len) == 0)
            return loom_error(LOOM_ERR_FORMAT, "device spec '%s': %s", spec, kinds[k].takes);
    return loom_error(LOOM_ERR_FORMAT,
                      "device spec '%s': unknown device kind '%.*s' (expected cpu, sim:N[,...], "
                      "cuda[:I,...], numa[:I,...] or a device name)",
                      spec, (int)kind_len, spec);
}
