#define _GNU_SOURCE
/*
 * GGUF reader. A file is parsed once, front to back, through a bounds-checked cursor; every
 * failure names the field and the byte offset where it was read. After a successful open
 * every accessor is a plain lookup: the file cannot surprise a caller later.
 *
 * Layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 n_tensors, u64 n_kv,
 * n_kv x {string key, u32 type, value}, n_tensors x {string name, u32 n_dims,
 * u64 ne[n_dims], u32 type, u64 offset}, padding to `general.alignment` (default 32),
 * tensor data. A string is u64 length + bytes; an array is u32 element type + u64 count +
 * elements (arrays of arrays are rejected).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf-impl.h"

/* ---------------------------------------------------------------- cursor */

typedef struct cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
} cursor;

static loom_status truncated(const cursor *c, const char *field, size_t need) {
    return loom_error(LOOM_ERR_FORMAT,
                      "gguf: truncated: %s at offset %zu needs %zu bytes, file has %zu", field,
                      c->pos, need, c->size);
}

static loom_status rd(cursor *c, void *dst, size_t n, const char *field) {
    if (n > c->size - c->pos) return truncated(c, field, n);
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return LOOM_OK;
}

static loom_status rd_u32(cursor *c, uint32_t *v, const char *field) {
    return rd(c, v, 4, field);
}

static loom_status rd_u64(cursor *c, uint64_t *v, const char *field) {
    return rd(c, v, 8, field);
}

static loom_status rd_str(cursor *c, loom__gguf_str *s, const char *field) {
    uint64_t len = 0;
    size_t at = c->pos;
    loom_status st = rd_u64(c, &len, field);
    if (st) return st;
    if (len > c->size - c->pos)
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: %s at offset %zu: string length %llu runs past the end of the "
                          "file (%zu bytes)",
                          field, at, (unsigned long long)len, c->size);
    s->ptr = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += len;
    return LOOM_OK;
}

static char *dup_str(const loom__gguf_str *s) {
    char *r = loom_malloc(s->len + 1);
    if (!r) return NULL;
    memcpy(r, s->ptr, s->len);
    r[s->len] = 0;
    return r;
}

/* ---------------------------------------------------------------- parsing */

static loom_status parse_kv(cursor *c, loom__gguf_kv *kv, int64_t index) {
    char field[96];
    size_t at = c->pos;
    loom__gguf_str key;
    snprintf(field, sizeof field, "key of metadata entry %lld", (long long)index);
    loom_status st = rd_str(c, &key, field);
    if (st) return st;
    if (memchr(key.ptr, 0, key.len))
        return loom_error(LOOM_ERR_FORMAT, "gguf: metadata key %lld at offset %zu contains a NUL",
                          (long long)index, at);
    kv->key = dup_str(&key);
    if (!kv->key) return loom_error(LOOM_ERR_NOMEM, "gguf: out of memory reading keys");

    uint32_t type;
    size_t type_at = c->pos;
    snprintf(field, sizeof field, "type of '%s'", kv->key);
    if ((st = rd_u32(c, &type, field))) return st;
    if (type >= LOOM_GGUF_TYPE_COUNT)
        return loom_error(LOOM_ERR_FORMAT, "gguf: '%s' at offset %zu has unknown value type %u",
                          kv->key, type_at, type);
    kv->type = (loom_gguf_type)type;
    kv->value_offset = c->pos;
    snprintf(field, sizeof field, "value of '%s'", kv->key);

    if (kv->type == LOOM_GGUF_STRING) {
        if ((st = rd_str(c, &kv->str, field))) return st;
        kv->str_copy = dup_str(&kv->str);
        if (!kv->str_copy) return loom_error(LOOM_ERR_NOMEM, "gguf: out of memory reading '%s'", kv->key);
        return LOOM_OK;
    }
    if (kv->type != LOOM_GGUF_ARRAY) {
        size_t n = loom__gguf_scalar_size(kv->type);
        if (n > c->size - c->pos) return truncated(c, field, n);
        kv->data = c->base + c->pos;
        c->pos += n;
        return LOOM_OK;
    }

    uint32_t et;
    size_t et_at = c->pos;
    if ((st = rd_u32(c, &et, field))) return st;
    if (et >= LOOM_GGUF_TYPE_COUNT || et == LOOM_GGUF_ARRAY)
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: array '%s' at offset %zu has %s element type %u", kv->key,
                          et_at, et == LOOM_GGUF_ARRAY ? "unsupported (nested array)" : "unknown",
                          et);
    kv->arr_type = (loom_gguf_type)et;
    size_t n_at = c->pos;
    if ((st = rd_u64(c, &kv->arr_n, field))) return st;
    if (kv->arr_type == LOOM_GGUF_STRING) {
        /* Each string needs at least its 8-byte length: a cheap bound before allocating. */
        if (kv->arr_n > (c->size - c->pos) / 8)
            return loom_error(LOOM_ERR_FORMAT,
                              "gguf: array '%s' at offset %zu claims %llu strings, more than "
                              "the %zu remaining bytes can hold",
                              kv->key, n_at, (unsigned long long)kv->arr_n, c->size - c->pos);
        kv->strs = loom_malloc(sizeof(loom__gguf_str) * (size_t)(kv->arr_n ? kv->arr_n : 1));
        if (!kv->strs) return loom_error(LOOM_ERR_NOMEM, "gguf: out of memory reading '%s'", kv->key);
        for (uint64_t j = 0; j < kv->arr_n; j++) {
            snprintf(field, sizeof field, "string %llu of array '%s'", (unsigned long long)j,
                     kv->key);
            if ((st = rd_str(c, &kv->strs[j], field))) return st;
        }
        return LOOM_OK;
    }
    size_t es = loom__gguf_scalar_size(kv->arr_type);
    if (kv->arr_n > (c->size - c->pos) / es)
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: array '%s' at offset %zu: %llu elements of %zu bytes run past "
                          "the end of the file (%zu bytes)",
                          kv->key, n_at, (unsigned long long)kv->arr_n, es, c->size);
    kv->data = c->base + c->pos;
    c->pos += (size_t)kv->arr_n * es;
    return LOOM_OK;
}

static loom_status parse_tensor_info(cursor *c, loom__gguf_tensor *t, int64_t index) {
    char field[96];
    loom__gguf_str name;
    size_t at = c->pos;
    snprintf(field, sizeof field, "name of tensor %lld", (long long)index);
    loom_status st = rd_str(c, &name, field);
    if (st) return st;
    if (name.len >= LOOM_MAX_NAME || memchr(name.ptr, 0, name.len))
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: tensor %lld at offset %zu: name of %llu bytes is too long (max "
                          "%d) or contains a NUL",
                          (long long)index, at, (unsigned long long)name.len, LOOM_MAX_NAME - 1);
    t->name = dup_str(&name);
    if (!t->name) return loom_error(LOOM_ERR_NOMEM, "gguf: out of memory reading tensor names");

    uint32_t n_dims;
    size_t nd_at = c->pos;
    snprintf(field, sizeof field, "n_dims of tensor '%s'", t->name);
    if ((st = rd_u32(c, &n_dims, field))) return st;
    if (n_dims == 0 || n_dims > LOOM_MAX_DIMS)
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: tensor '%s' at offset %zu has %u dimensions (1..%d allowed)",
                          t->name, nd_at, n_dims, LOOM_MAX_DIMS);
    t->n_dims = (int)n_dims;
    int64_t total = 1;
    for (int d = 0; d < LOOM_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        size_t ne_at = c->pos;
        snprintf(field, sizeof field, "ne[%u] of tensor '%s'", d, t->name);
        if ((st = rd_u64(c, &ne, field))) return st;
        if (ne > (uint64_t)INT64_MAX || (ne != 0 && (uint64_t)total > (uint64_t)INT64_MAX / ne))
            return loom_error(LOOM_ERR_FORMAT,
                              "gguf: tensor '%s': ne[%u] = %llu at offset %zu overflows the "
                              "element count",
                              t->name, d, (unsigned long long)ne, ne_at);
        t->ne[d] = (int64_t)ne;
        total *= (int64_t)ne;
    }

    uint32_t type;
    size_t ty_at = c->pos;
    snprintf(field, sizeof field, "type of tensor '%s'", t->name);
    if ((st = rd_u32(c, &type, field))) return st;
    /* Any id GGUF defines is accepted here, so such a file still opens and lists; a type loom
     * does not compute with is refused where the data is used (loom_gguf_tensor_check_type). */
    loom_gguf_type_info tr;
    if (!loom_gguf_type_info_get((int)type, &tr))
        return loom_error(LOOM_ERR_FORMAT, "gguf: tensor '%s' at offset %zu has unknown type %u",
                          t->name, ty_at, type);
    t->type = (loom_type)type;
    if (t->ne[0] % tr.blck_size != 0)
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: tensor '%s': ne[0] = %lld is not a multiple of the %s block "
                          "size %lld",
                          t->name, (long long)t->ne[0],
                          loom_type_is_valid((int)type) ? loom_type_name((loom_type)type) : tr.name,
                          (long long)tr.blck_size);
    /* bytes = total / blck * type_size, checked for overflow */
    uint64_t blocks = (uint64_t)total / (uint64_t)tr.blck_size;
    if (tr.type_size && blocks > SIZE_MAX / tr.type_size)
        return loom_error(LOOM_ERR_FORMAT, "gguf: tensor '%s': byte size overflows", t->name);
    t->size = (size_t)blocks * tr.type_size;

    uint64_t off;
    snprintf(field, sizeof field, "offset of tensor '%s'", t->name);
    if ((st = rd_u64(c, &off, field))) return st;
    t->offset = off;
    return LOOM_OK;
}

const char *loom__gguf_kv_name(const loom_gguf *g, int64_t i) {
    return g->kv[i].key;
}
const char *loom__gguf_tensor_name(const loom_gguf *g, int64_t i) {
    return g->tensors[i].name;
}

/* Builds the name -> index hash table of n names (linear in n), refusing a duplicate. */
static loom_status build_index(const loom_gguf *g, int64_t n,
                               const char *(*name_of)(const loom_gguf *, int64_t),
                               int64_t **slots_out, size_t *cap_out, const char *what) {
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap <<= 1;
    int64_t *slots = loom_malloc(cap * sizeof *slots);
    if (!slots)
        return loom_error(LOOM_ERR_NOMEM, "gguf: out of memory indexing %lld names", (long long)n);
    for (size_t k = 0; k < cap; k++)
        slots[k] = -1;
    for (int64_t i = 0; i < n; i++) {
        const char *name = name_of(g, i);
        size_t k = loom__gguf_hash(name) & (cap - 1);
        for (; slots[k] >= 0; k = (k + 1) & (cap - 1)) {
            if (strcmp(name_of(g, slots[k]), name) == 0) {
                loom_free(slots);
                return loom_error(LOOM_ERR_FORMAT, "gguf: duplicate %s '%s'", what, name);
            }
        }
        slots[k] = i;
    }
    *slots_out = slots;
    *cap_out = cap;
    return LOOM_OK;
}

static const loom__gguf_kv *find_kv(const loom_gguf *g, const char *key) {
    int64_t i = loom_gguf_find_kv(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

static loom_status parse(loom_gguf *g) {
    cursor c = {.base = g->data, .size = g->size, .pos = 0};
    char magic[4];
    loom_status st;
    if ((st = rd(&c, magic, 4, "magic"))) return st;
    if (memcmp(magic, "GGUF", 4) != 0)
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: bad magic at offset 0: %02x %02x %02x %02x (expected 'GGUF')",
                          (uint8_t)magic[0], (uint8_t)magic[1], (uint8_t)magic[2],
                          (uint8_t)magic[3]);
    if ((st = rd_u32(&c, &g->version, "version"))) return st;
    if (g->version != 2 && g->version != 3)
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: unsupported version %u at offset 4 (2 and 3 are supported)",
                          g->version);
    uint64_t n_tensors, n_kv;
    if ((st = rd_u64(&c, &n_tensors, "tensor count"))) return st;
    if ((st = rd_u64(&c, &n_kv, "metadata count"))) return st;
    /* Bounds before allocating: a kv needs >= 12 bytes, a tensor info >= 8+4+8+4+8. */
    if (n_kv > (c.size - c.pos) / 12)
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: metadata count %llu at offset 16 is more than the file can hold",
                          (unsigned long long)n_kv);
    if (n_tensors > (c.size - c.pos) / 32)
        return loom_error(LOOM_ERR_FORMAT,
                          "gguf: tensor count %llu at offset 8 is more than the file can hold",
                          (unsigned long long)n_tensors);

    g->kv = loom_calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    if (!g->kv) return loom_error(LOOM_ERR_NOMEM, "gguf: out of memory (%llu keys)", (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv = (int64_t)i + 1; /* so that free() releases what was parsed */
        if ((st = parse_kv(&c, &g->kv[i], (int64_t)i))) return st;
    }
    if ((st =
             build_index(g, g->n_kv, loom__gguf_kv_name, &g->kv_index, &g->kv_cap, "metadata key")))
        return st;

    g->alignment = LOOM_GGUF_DEFAULT_ALIGNMENT;
    const loom__gguf_kv *al = find_kv(g, "general.alignment");
    if (al) {
        uint32_t a;
        if (al->type != LOOM_GGUF_UINT32)
            return loom_error(LOOM_ERR_FORMAT, "gguf: general.alignment has type %s, expected uint32",
                              loom_gguf_type_name(al->type));
        memcpy(&a, al->data, 4);
        if (a == 0 || (a & (a - 1)) != 0)
            return loom_error(LOOM_ERR_FORMAT,
                              "gguf: general.alignment = %u is not a power of two", a);
        g->alignment = a;
    }

    g->tensors = loom_calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors) return loom_error(LOOM_ERR_NOMEM, "gguf: out of memory (%llu tensors)", (unsigned long long)n_tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
        g->n_tensors = (int64_t)i + 1;
        if ((st = parse_tensor_info(&c, &g->tensors[i], (int64_t)i))) return st;
    }

    if ((st = build_index(g, g->n_tensors, loom__gguf_tensor_name, &g->tensor_index, &g->tensor_cap,
                          "tensor name")))
        return st;

    /* Data starts at the next aligned offset. A file with no tensor bytes may end before
     * it (a vocab-only file whose header ends exactly at EOF). */
    size_t off = c.pos;
    size_t pad = (g->alignment - off % g->alignment) % g->alignment;
    g->data_offset = off + pad;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        loom__gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return loom_error(LOOM_ERR_FORMAT,
                              "gguf: tensor '%s' offset %llu is not a multiple of the alignment "
                              "%zu",
                              t->name, (unsigned long long)t->offset, g->alignment);
        if (t->size == 0 || g->header_only) continue;
        if (g->data_offset > g->size || t->offset > g->size - g->data_offset ||
            t->size > g->size - g->data_offset - t->offset)
            return loom_error(LOOM_ERR_FORMAT,
                              "gguf: tensor %lld ('%s') data [%llu, %llu) lies past the end of the "
                              "file (%zu bytes)",
                              (long long)i, t->name,
                              (unsigned long long)(g->data_offset + t->offset),
                              (unsigned long long)(g->data_offset + t->offset + t->size), g->size);
    }
    return LOOM_OK;
}

/* ---------------------------------------------------------------- open / free */

static loom_status finish_open(loom_gguf *g, loom_gguf **out) {
    loom_status st = parse(g);
    if (st) {
        loom_gguf_free(g);
        *out = NULL;
        return st;
    }
    *out = g;
    return LOOM_OK;
}

loom_status loom_gguf_open_memory(const void *data, size_t size, loom_gguf **out) {
    if (!out || (!data && size)) return loom_error(LOOM_ERR_INVALID_ARG, "gguf: NULL argument");
    *out = NULL;
    loom_gguf *g = loom_calloc(1, sizeof *g);
    if (!g) return loom_error(LOOM_ERR_NOMEM, "gguf: out of memory");
    g->data = data;
    g->size = size;
    g->fd = -1;
    return finish_open(g, out);
}

static loom_status open_file(const char *path, bool header_only, loom_gguf **out);

loom_status loom_gguf_open(const char *path, loom_gguf **out) {
    return open_file(path, false, out);
}

loom_status loom_gguf_open_header(const char *path, loom_gguf **out) {
    return open_file(path, true, out);
}

/* Test hook (loom_gguf_test_fail_mmap): the next n mappings fail as if mmap had. */
static int fail_mmap_n;

void loom_gguf_test_fail_mmap(int n) {
    __atomic_store_n(&fail_mmap_n, n > 0 ? n : 0, __ATOMIC_SEQ_CST);
}

void *loom__gguf_mmap(size_t size, int prot, int fd) {
    for (int n = __atomic_load_n(&fail_mmap_n, __ATOMIC_SEQ_CST); n > 0;)
        if (__atomic_compare_exchange_n(&fail_mmap_n, &n, n - 1, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST)) {
            errno = ENODEV;
            return MAP_FAILED;
        }
    return mmap(NULL, size, prot, MAP_PRIVATE, fd, 0);
}

/* The fallback when mapping fails: the whole file in one owned allocation. */
static loom_status read_all(loom_gguf *g, const char *path) {
    uint8_t *buf = loom_malloc(g->size);
    if (!buf)
        return loom_error(LOOM_ERR_NOMEM,
                          "gguf: '%s' cannot be mapped, and %zu bytes to read it "
                          "into are not available",
                          path, g->size);
    size_t got = 0;
    while (got < g->size) {
        ssize_t n = pread(g->fd, buf + got, g->size - got, (off_t)got);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) {
            loom_status st =
                loom_error(LOOM_ERR_IO, "gguf: cannot read '%s' at offset %zu: %s", path, got,
                           n < 0 ? strerror(errno) : "unexpected end of file");
            loom_free(buf);
            return st;
        }
        got += (size_t)n;
    }
    g->data = buf;
    g->owned = buf;
    return LOOM_OK;
}

bool loom_gguf_is_mapped(const loom_gguf *g) {
    return g && g->mapped;
}

loom_status loom_gguf_map_file(const loom_gguf *g, void **base, size_t *size) {
    *base = NULL;
    *size = 0;
    if (!g || g->fd < 0 || g->size == 0)
        return loom_error(LOOM_ERR_UNSUPPORTED, "gguf: not opened from a file that can be mapped");
    void *p = loom__gguf_mmap(g->size, PROT_READ | PROT_WRITE, g->fd);
    if (p == MAP_FAILED)
        return loom_error(LOOM_ERR_IO, "gguf: cannot map the file (%zu bytes): %s", g->size,
                          strerror(errno));
    *base = p;
    *size = g->size;
    return LOOM_OK;
}

int loom_gguf_dup_fd(const loom_gguf *g) {
    return g && g->fd >= 0 ? fcntl(g->fd, F_DUPFD_CLOEXEC, 0) : -1;
}

loom_status loom_gguf_read_at(const loom_gguf *g, uint64_t offset, void *dst, size_t size) {
    if (!g || (size && !dst)) return loom_error(LOOM_ERR_INVALID_ARG, "gguf: NULL argument");
    if (offset > g->size || size > g->size - offset)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "gguf: read of %zu bytes at offset %llu runs past the end of the file "
                          "(%zu bytes)",
                          size, (unsigned long long)offset, g->size);
    /* from memory when the bytes are there already (read at open, or opened from memory);
     * a mapped file is read with pread, so the copy does not fault its pages in as well */
    if (g->data && (!g->mapped || g->fd < 0)) {
        memcpy(dst, g->data + offset, size);
        return LOOM_OK;
    }
    if (g->fd < 0) return loom_error(LOOM_ERR_IO, "gguf: no data to read");
    size_t got = 0;
    while (got < size) {
        ssize_t n = pread(g->fd, (uint8_t *)dst + got, size - got, (off_t)(offset + got));
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0)
            return loom_error(LOOM_ERR_IO, "gguf: cannot read %zu bytes at offset %llu: %s", size,
                              (unsigned long long)(offset + got),
                              n < 0 ? strerror(errno) : "unexpected end of file");
        got += (size_t)n;
    }
    return LOOM_OK;
}

static loom_status open_file(const char *path, bool header_only, loom_gguf **out) {
    if (!path || !out) return loom_error(LOOM_ERR_INVALID_ARG, "gguf: NULL argument");
    *out = NULL;
    /* a FIFO or a device would block open() or read without end: refuse it before opening,
     * and open non-blocking so that one swapped in after the check cannot hang either */
    struct stat sb;
    if (stat(path, &sb) != 0)
        return loom_error(LOOM_ERR_IO, "gguf: cannot open '%s': %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return loom_error(LOOM_ERR_IO, "gguf: '%s' is not a regular file", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return loom_error(LOOM_ERR_IO, "gguf: cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return loom_error(LOOM_ERR_IO, "gguf: '%s' is not a regular file", path);
    }
    loom_gguf *g = loom_calloc(1, sizeof *g);
    if (!g) {
        close(fd);
        return loom_error(LOOM_ERR_NOMEM, "gguf: out of memory");
    }
    g->fd = fd;
    g->size = (size_t)sb.st_size;
    g->header_only = header_only;
    if (g->size > 0) {
        void *p = loom__gguf_mmap(g->size, PROT_READ, fd);
        if (p != MAP_FAILED) {
            g->data = p;
            g->mapped = true;
        } else {
            /* a file that cannot be mapped is read into memory instead */
            loom_status st = read_all(g, path);
            if (st) {
                g->size = 0;
                loom_gguf_free(g);
                return st;
            }
        }
    }
    loom_status st = finish_open(g, out);
    if (st) {
        /* prefix the path so the user knows which file */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        return loom_error(st, "%s: %s", path, msg);
    }
    return LOOM_OK;
}

void loom_gguf_free(loom_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        loom_free(g->kv[i].key);
        loom_free(g->kv[i].strs);
        loom_free(g->kv[i].str_copy);
    }
    loom_free(g->kv);
    for (int64_t i = 0; i < g->n_tensors; i++) loom_free(g->tensors[i].name);
    loom_free(g->tensors);
    loom_free(g->kv_index);
    loom_free(g->tensor_index);
    if (g->mapped) munmap((void *)g->data, g->size);
    loom_free(g->owned);
    if (g->fd >= 0) close(g->fd);
    loom_free(g);
}
