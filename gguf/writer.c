/*
 * GGUF writer: collects metadata and tensors in memory, then serialises them in one pass
 * (header, metadata, tensor infos, aligned data). Used by tests (hostile-file generation,
 * round trips) and by `loom` to generate its built-in default model.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gguf/gguf-impl.h"

typedef struct wkv {
    char *key;
    loom_gguf_type type;
    loom_gguf_type arr_type;
    uint64_t n;      /* array length */
    void *data;      /* scalar bytes, numeric array bytes, or the string */
    size_t size;     /* bytes of data */
    char **strs;     /* string array */
} wkv;

typedef struct wtensor {
    char *name;
    loom_type type;
    int n_dims;
    int64_t ne[LOOM_MAX_DIMS];
    void *data;
    size_t size;
} wtensor;

struct loom_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    size_t alignment;
    uint32_t version;
};

loom_gguf_writer *loom_gguf_writer_new(void) {
    loom_gguf_writer *w = loom_calloc(1, sizeof *w);
    if (!w) {
        loom_error(LOOM_ERR_NOMEM, "gguf writer: out of memory");
        return NULL;
    }
    w->alignment = LOOM_GGUF_DEFAULT_ALIGNMENT;
    w->version = 3;
    return w;
}

static void wkv_clear(wkv *kv) {
    loom_free(kv->key);
    loom_free(kv->data);
    if (kv->strs) {
        for (uint64_t i = 0; i < kv->n; i++) loom_free(kv->strs[i]);
        loom_free(kv->strs);
    }
    memset(kv, 0, sizeof *kv);
}

void loom_gguf_writer_free(loom_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) wkv_clear(&w->kv[i]);
    loom_free(w->kv);
    for (size_t i = 0; i < w->n_t; i++) {
        loom_free(w->t[i].name);
        loom_free(w->t[i].data);
    }
    loom_free(w->t);
    loom_free(w);
}

void loom_gguf_writer_set_alignment(loom_gguf_writer *w, size_t alignment) {
    LOOM_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0);
    w->alignment = alignment;
}

void loom_gguf_writer_set_version(loom_gguf_writer *w, uint32_t version) {
    LOOM_ASSERT(version == 2 || version == 3);
    w->version = version;
}

/* Returns the slot for key (replacing an existing entry), or NULL on OOM. */
static wkv *slot(loom_gguf_writer *w, const char *key) {
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            char *k = w->kv[i].key;
            w->kv[i].key = NULL;
            wkv_clear(&w->kv[i]);
            w->kv[i].key = k;
            return &w->kv[i];
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *n = loom_realloc(w->kv, cap * sizeof *n);
        if (!n) return NULL;
        w->kv = n;
        w->cap_kv = cap;
    }
    wkv *kv = &w->kv[w->n_kv];
    memset(kv, 0, sizeof *kv);
    kv->key = loom_strdup(key);
    if (!kv->key) return NULL;
    w->n_kv++;
    return kv;
}

/* Stores a copy of the value bytes under key; *out (optional) receives the slot. */
static loom_status set_bytes(loom_gguf_writer *w, const char *key, loom_gguf_type type,
                             const void *data, size_t size, wkv **out) {
    if (!w || !key) return loom_error(LOOM_ERR_INVALID_ARG, "gguf writer: NULL argument");
    wkv *kv = slot(w, key);
    if (!kv) return loom_error(LOOM_ERR_NOMEM, "gguf writer: out of memory setting '%s'", key);
    kv->type = type;
    kv->data = loom_malloc(size ? size : 1);
    if (!kv->data) return loom_error(LOOM_ERR_NOMEM, "gguf writer: out of memory setting '%s'", key);
    if (size) memcpy(kv->data, data, size);
    kv->size = size;
    if (out) *out = kv;
    return LOOM_OK;
}

#define SETTER(fn, ctype, gtype)                                                                   \
    loom_status fn(loom_gguf_writer *w, const char *key, ctype v) {                                \
        return set_bytes(w, key, gtype, &v, sizeof v, NULL);                                             \
    }
SETTER(loom_gguf_set_u8, uint8_t, LOOM_GGUF_UINT8)
SETTER(loom_gguf_set_i8, int8_t, LOOM_GGUF_INT8)
SETTER(loom_gguf_set_u16, uint16_t, LOOM_GGUF_UINT16)
SETTER(loom_gguf_set_i16, int16_t, LOOM_GGUF_INT16)
SETTER(loom_gguf_set_u32, uint32_t, LOOM_GGUF_UINT32)
SETTER(loom_gguf_set_i32, int32_t, LOOM_GGUF_INT32)
SETTER(loom_gguf_set_u64, uint64_t, LOOM_GGUF_UINT64)
SETTER(loom_gguf_set_i64, int64_t, LOOM_GGUF_INT64)
SETTER(loom_gguf_set_f32, float, LOOM_GGUF_FLOAT32)
SETTER(loom_gguf_set_f64, double, LOOM_GGUF_FLOAT64)
#undef SETTER

loom_status loom_gguf_set_bool(loom_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_bytes(w, key, LOOM_GGUF_BOOL, &b, 1, NULL);
}

loom_status loom_gguf_set_str(loom_gguf_writer *w, const char *key, const char *v) {
    if (!v) return loom_error(LOOM_ERR_INVALID_ARG, "gguf writer: NULL string for '%s'", key);
    return set_bytes(w, key, LOOM_GGUF_STRING, v, strlen(v), NULL);
}

loom_status loom_gguf_set_arr(loom_gguf_writer *w, const char *key, loom_gguf_type elem_type,
                              const void *data, uint64_t n) {
    size_t es = loom__gguf_scalar_size(elem_type);
    if (es == 0)
        return loom_error(LOOM_ERR_INVALID_ARG, "gguf writer: '%s': element type %s is not numeric",
                          key, loom_gguf_type_name(elem_type));
    wkv *kv;
    loom_status st = set_bytes(w, key, LOOM_GGUF_ARRAY, data, (size_t)n * es, &kv);
    if (st) return st;
    kv->arr_type = elem_type;
    kv->n = n;
    return LOOM_OK;
}

loom_status loom_gguf_set_arr_str(loom_gguf_writer *w, const char *key, const char *const *strs,
                                  uint64_t n) {
    if (!w || !key || (!strs && n)) return loom_error(LOOM_ERR_INVALID_ARG, "gguf writer: NULL argument");
    wkv *kv = slot(w, key);
    if (!kv) return loom_error(LOOM_ERR_NOMEM, "gguf writer: out of memory setting '%s'", key);
    kv->type = LOOM_GGUF_ARRAY;
    kv->arr_type = LOOM_GGUF_STRING;
    kv->strs = loom_calloc(n ? (size_t)n : 1, sizeof(char *));
    if (!kv->strs) return loom_error(LOOM_ERR_NOMEM, "gguf writer: out of memory setting '%s'", key);
    for (uint64_t i = 0; i < n; i++) {
        kv->strs[i] = loom_strdup(strs[i]);
        kv->n = i + 1;
        if (!kv->strs[i]) return loom_error(LOOM_ERR_NOMEM, "gguf writer: out of memory setting '%s'", key);
    }
    kv->n = n;
    return LOOM_OK;
}

loom_status loom_gguf_add_tensor(loom_gguf_writer *w, const char *name, loom_type type, int n_dims,
                                 const int64_t *ne, const void *data) {
    if (!w || !name || !ne) return loom_error(LOOM_ERR_INVALID_ARG, "gguf writer: NULL argument");
    if (strlen(name) >= LOOM_MAX_NAME)
        return loom_error(LOOM_ERR_INVALID_ARG, "gguf writer: tensor name '%s' is too long", name);
    if (n_dims < 1 || n_dims > LOOM_MAX_DIMS)
        return loom_error(LOOM_ERR_INVALID_ARG, "gguf writer: tensor '%s': %d dims", name, n_dims);
    const loom_type_traits *tr = loom_type_traits_get(type);
    if (!tr) return loom_error(LOOM_ERR_TYPE, "gguf writer: tensor '%s': unknown type %d", name, (int)type);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return loom_error(LOOM_ERR_INVALID_ARG, "gguf writer: duplicate tensor '%s'", name);
    int64_t total = 1;
    for (int d = 0; d < n_dims; d++) total *= ne[d];
    if (ne[0] % tr->blck_size)
        return loom_error(LOOM_ERR_SHAPE, "gguf writer: tensor '%s': ne[0] %lld not a multiple of %lld",
                          name, (long long)ne[0], (long long)tr->blck_size);
    size_t size = (size_t)(total / tr->blck_size) * tr->type_size;
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 16;
        wtensor *n = loom_realloc(w->t, cap * sizeof *n);
        if (!n) return loom_error(LOOM_ERR_NOMEM, "gguf writer: out of memory");
        w->t = n;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = loom_strdup(name);
    t->data = loom_malloc(size ? size : 1);
    if (!t->name || !t->data) {
        loom_free(t->name);
        loom_free(t->data);
        return loom_error(LOOM_ERR_NOMEM, "gguf writer: out of memory adding '%s' (%zu bytes)", name, size);
    }
    if (size && data) memcpy(t->data, data, size);
    else if (size) memset(t->data, 0, size);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < LOOM_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->size = size;
    w->n_t++;
    return LOOM_OK;
}

/* ---------------------------------------------------------------- serialisation */

typedef struct sink {
    uint8_t *buf; /* NULL while measuring */
    size_t pos;
} sink;

static void put(sink *s, const void *p, size_t n) {
    if (s->buf && n) memcpy(s->buf + s->pos, p, n);
    s->pos += n;
}

static void put_u32(sink *s, uint32_t v) { put(s, &v, 4); }
static void put_u64(sink *s, uint64_t v) { put(s, &v, 8); }

static void put_str(sink *s, const char *str, size_t len) {
    put_u64(s, len);
    put(s, str, len);
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static void serialise(const loom_gguf_writer *w, sink *s) {
    put(s, "GGUF", 4);
    put_u32(s, w->version);
    put_u64(s, w->n_t);
    bool has_align = false;
    for (size_t i = 0; i < w->n_kv; i++) has_align |= strcmp(w->kv[i].key, "general.alignment") == 0;
    bool add_align = !has_align && w->alignment != LOOM_GGUF_DEFAULT_ALIGNMENT;
    put_u64(s, w->n_kv + (add_align ? 1 : 0));
    if (add_align) {
        put_str(s, "general.alignment", strlen("general.alignment"));
        put_u32(s, LOOM_GGUF_UINT32);
        put_u32(s, (uint32_t)w->alignment);
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        put_str(s, kv->key, strlen(kv->key));
        put_u32(s, kv->type);
        if (kv->type == LOOM_GGUF_STRING) {
            put_str(s, kv->data, kv->size);
        } else if (kv->type == LOOM_GGUF_ARRAY) {
            put_u32(s, kv->arr_type);
            put_u64(s, kv->n);
            if (kv->arr_type == LOOM_GGUF_STRING)
                for (uint64_t j = 0; j < kv->n; j++) put_str(s, kv->strs[j], strlen(kv->strs[j]));
            else
                put(s, kv->data, kv->size);
        } else {
            put(s, kv->data, kv->size);
        }
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put_str(s, t->name, strlen(t->name));
        put_u32(s, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(s, (uint64_t)t->ne[d]);
        put_u32(s, t->type);
        put_u64(s, off);
        off = align_up(off + t->size, w->alignment);
    }
    static const uint8_t zeros[256];
    size_t pad = align_up(s->pos, w->alignment) - s->pos;
    if (w->n_t) {
        while (pad) {
            size_t n = pad < sizeof zeros ? pad : sizeof zeros;
            put(s, zeros, n);
            pad -= n;
        }
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put(s, t->data, t->size);
        size_t p = align_up(t->size, w->alignment) - t->size;
        if (i + 1 < w->n_t) {
            while (p) {
                size_t n = p < sizeof zeros ? p : sizeof zeros;
                put(s, zeros, n);
                p -= n;
            }
        }
    }
}

loom_status loom_gguf_write_memory(const loom_gguf_writer *w, void **out_data, size_t *out_size) {
    if (!w || !out_data || !out_size) return loom_error(LOOM_ERR_INVALID_ARG, "gguf writer: NULL argument");
    sink m = {0};
    serialise(w, &m);
    sink s = {.buf = loom_malloc(m.pos ? m.pos : 1), .pos = 0};
    if (!s.buf) return loom_error(LOOM_ERR_NOMEM, "gguf writer: out of memory (%zu bytes)", m.pos);
    serialise(w, &s);
    LOOM_ASSERT(s.pos == m.pos);
    *out_data = s.buf;
    *out_size = s.pos;
    return LOOM_OK;
}

loom_status loom_gguf_write_file(const loom_gguf_writer *w, const char *path) {
    void *data;
    size_t size;
    loom_status st = loom_gguf_write_memory(w, &data, &size);
    if (st) return st;
    FILE *f = fopen(path, "wb");
    if (!f) {
        loom_free(data);
        return loom_error(LOOM_ERR_IO, "gguf writer: cannot create '%s': %s", path, strerror(errno));
    }
    size_t n = fwrite(data, 1, size, f);
    int rc = fclose(f);
    loom_free(data);
    if (n != size || rc != 0)
        return loom_error(LOOM_ERR_IO, "gguf writer: writing '%s' failed: %s", path, strerror(errno));
    return LOOM_OK;
}
