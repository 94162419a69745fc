/*
 * Accessors over a parsed GGUF file: metadata lookups with type-checked conversions, and
 * tensor info. Everything was validated at open, so these are plain lookups; an index out of
 * range is a caller bug (assert).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gguf/gguf-impl.h"

static const char *const type_names[LOOM_GGUF_TYPE_COUNT] = {
    [LOOM_GGUF_UINT8] = "uint8",     [LOOM_GGUF_INT8] = "int8",
    [LOOM_GGUF_UINT16] = "uint16",   [LOOM_GGUF_INT16] = "int16",
    [LOOM_GGUF_UINT32] = "uint32",   [LOOM_GGUF_INT32] = "int32",
    [LOOM_GGUF_FLOAT32] = "float32", [LOOM_GGUF_BOOL] = "bool",
    [LOOM_GGUF_STRING] = "string",   [LOOM_GGUF_ARRAY] = "array",
    [LOOM_GGUF_UINT64] = "uint64",   [LOOM_GGUF_INT64] = "int64",
    [LOOM_GGUF_FLOAT64] = "float64",
};

const char *loom_gguf_type_name(loom_gguf_type t) {
    return (unsigned)t < LOOM_GGUF_TYPE_COUNT ? type_names[t] : "unknown";
}

size_t loom__gguf_scalar_size(loom_gguf_type t) {
    switch (t) {
    case LOOM_GGUF_UINT8: case LOOM_GGUF_INT8: case LOOM_GGUF_BOOL: return 1;
    case LOOM_GGUF_UINT16: case LOOM_GGUF_INT16: return 2;
    case LOOM_GGUF_UINT32: case LOOM_GGUF_INT32: case LOOM_GGUF_FLOAT32: return 4;
    case LOOM_GGUF_UINT64: case LOOM_GGUF_INT64: case LOOM_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

uint32_t loom_gguf_version(const loom_gguf *g) { return g->version; }
size_t loom_gguf_alignment(const loom_gguf *g) { return g->alignment; }
size_t loom_gguf_data_offset(const loom_gguf *g) { return g->data_offset; }
size_t loom_gguf_file_size(const loom_gguf *g) { return g->size; }

/* ---------------------------------------------------------------- metadata */

int64_t loom_gguf_kv_count(const loom_gguf *g) { return g->n_kv; }

uint64_t loom__gguf_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

int64_t loom__gguf_index_find(const int64_t *slots, size_t cap, const char *name,
                              const char *(*name_of)(const loom_gguf *, int64_t),
                              const loom_gguf *g) {
    if (!slots || !name) return -1;
    for (size_t k = loom__gguf_hash(name) & (cap - 1);; k = (k + 1) & (cap - 1)) {
        if (slots[k] < 0) return -1;
        if (strcmp(name_of(g, slots[k]), name) == 0) return slots[k];
    }
}

int64_t loom_gguf_find_kv(const loom_gguf *g, const char *key) {
    return loom__gguf_index_find(g->kv_index, g->kv_cap, key, loom__gguf_kv_name, g);
}

static const loom__gguf_kv *kv_at(const loom_gguf *g, int64_t i) {
    LOOM_ASSERT(i >= 0 && i < g->n_kv);
    return &g->kv[i];
}

const char *loom_gguf_kv_key(const loom_gguf *g, int64_t i) { return kv_at(g, i)->key; }
loom_gguf_type loom_gguf_kv_type(const loom_gguf *g, int64_t i) { return kv_at(g, i)->type; }

loom_gguf_type loom_gguf_kv_arr_type(const loom_gguf *g, int64_t i) {
    return kv_at(g, i)->arr_type;
}

uint64_t loom_gguf_kv_arr_n(const loom_gguf *g, int64_t i) {
    const loom__gguf_kv *kv = kv_at(g, i);
    return kv->type == LOOM_GGUF_ARRAY ? kv->arr_n : 0;
}

const void *loom_gguf_kv_arr_data(const loom_gguf *g, int64_t i) {
    const loom__gguf_kv *kv = kv_at(g, i);
    return kv->type == LOOM_GGUF_ARRAY && kv->arr_type != LOOM_GGUF_STRING ? kv->data : NULL;
}

const char *loom_gguf_kv_arr_str(const loom_gguf *g, int64_t i, uint64_t j, uint64_t *len) {
    const loom__gguf_kv *kv = kv_at(g, i);
    if (kv->type != LOOM_GGUF_ARRAY || kv->arr_type != LOOM_GGUF_STRING || j >= kv->arr_n) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = kv->strs[j].len;
    return kv->strs[j].ptr;
}

/* Reads a scalar of an integer type as a signed/unsigned 128-bit-ish pair. */
static bool scalar_int(loom_gguf_type t, const void *p, int64_t *s, uint64_t *u, bool *neg) {
    int64_t sv = 0;
    uint64_t uv = 0;
    bool isneg = false;
    switch (t) {
    case LOOM_GGUF_UINT8: { uint8_t v; memcpy(&v, p, 1); uv = v; break; }
    case LOOM_GGUF_BOOL: { uint8_t v; memcpy(&v, p, 1); uv = v != 0; break; }
    case LOOM_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); uv = v; break; }
    case LOOM_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); uv = v; break; }
    case LOOM_GGUF_UINT64: { memcpy(&uv, p, 8); break; }
    case LOOM_GGUF_INT8: { int8_t v; memcpy(&v, p, 1); sv = v; isneg = v < 0; break; }
    case LOOM_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); sv = v; isneg = v < 0; break; }
    case LOOM_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); sv = v; isneg = v < 0; break; }
    case LOOM_GGUF_INT64: { memcpy(&sv, p, 8); isneg = sv < 0; break; }
    default: return false;
    }
    if (t == LOOM_GGUF_INT8 || t == LOOM_GGUF_INT16 || t == LOOM_GGUF_INT32 ||
        t == LOOM_GGUF_INT64) {
        uv = isneg ? 0 : (uint64_t)sv;
    } else {
        sv = uv > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)uv;
    }
    *s = sv;
    *u = uv;
    *neg = isneg;
    return true;
}

static loom_status lookup(const loom_gguf *g, const char *key, const loom__gguf_kv **out) {
    int64_t i = loom_gguf_find_kv(g, key);
    if (i < 0) return loom_error(LOOM_ERR_NOT_FOUND, "gguf: no metadata key '%s'", key);
    *out = &g->kv[i];
    return LOOM_OK;
}

static loom_status wrong_type(const loom__gguf_kv *kv, const char *want) {
    return loom_error(LOOM_ERR_TYPE, "gguf: '%s' has type %s, expected %s", kv->key,
                      loom_gguf_type_name(kv->type), want);
}

loom_status loom_gguf_get_int(const loom_gguf *g, const char *key, int64_t *out) {
    const loom__gguf_kv *kv = NULL;
    loom_status st = lookup(g, key, &kv);
    if (st) return st;
    int64_t s;
    uint64_t u;
    bool neg;
    if (!scalar_int(kv->type, kv->data, &s, &u, &neg)) return wrong_type(kv, "an integer");
    if (!neg && u > (uint64_t)INT64_MAX)
        return loom_error(LOOM_ERR_TYPE, "gguf: '%s' = %" PRIu64 " does not fit in int64", key, u);
    *out = s;
    return LOOM_OK;
}

loom_status loom_gguf_get_uint(const loom_gguf *g, const char *key, uint64_t *out) {
    const loom__gguf_kv *kv = NULL;
    loom_status st = lookup(g, key, &kv);
    if (st) return st;
    int64_t s;
    uint64_t u;
    bool neg;
    if (!scalar_int(kv->type, kv->data, &s, &u, &neg)) return wrong_type(kv, "an integer");
    if (neg) return loom_error(LOOM_ERR_TYPE, "gguf: '%s' = %" PRId64 " is negative", key, s);
    *out = u;
    return LOOM_OK;
}

loom_status loom_gguf_get_float(const loom_gguf *g, const char *key, double *out) {
    const loom__gguf_kv *kv = NULL;
    loom_status st = lookup(g, key, &kv);
    if (st) return st;
    if (kv->type == LOOM_GGUF_FLOAT32) {
        float f;
        memcpy(&f, kv->data, 4);
        *out = f;
        return LOOM_OK;
    }
    if (kv->type == LOOM_GGUF_FLOAT64) {
        memcpy(out, kv->data, 8);
        return LOOM_OK;
    }
    int64_t s;
    uint64_t u;
    bool neg;
    if (kv->type == LOOM_GGUF_BOOL || !scalar_int(kv->type, kv->data, &s, &u, &neg))
        return wrong_type(kv, "a number");
    *out = neg ? (double)s : (double)u;
    return LOOM_OK;
}

loom_status loom_gguf_get_bool(const loom_gguf *g, const char *key, bool *out) {
    const loom__gguf_kv *kv = NULL;
    loom_status st = lookup(g, key, &kv);
    if (st) return st;
    if (kv->type != LOOM_GGUF_BOOL) return wrong_type(kv, "bool");
    *out = *(const uint8_t *)kv->data != 0;
    return LOOM_OK;
}

loom_status loom_gguf_get_str(const loom_gguf *g, const char *key, const char **out) {
    const loom__gguf_kv *kv = NULL;
    loom_status st = lookup(g, key, &kv);
    if (st) return st;
    if (kv->type != LOOM_GGUF_STRING) return wrong_type(kv, "string");
    /* callers read it as a C string: a NUL inside would silently cut it */
    const char *nul = memchr(kv->str.ptr, 0, kv->str.len);
    if (nul)
        return loom_error(LOOM_ERR_FORMAT, "gguf: string '%s' contains a NUL byte at %zu of %llu",
                          key, (size_t)(nul - kv->str.ptr), (unsigned long long)kv->str.len);
    *out = kv->str_copy;
    return LOOM_OK;
}

static void format_scalar(loom_gguf_type t, const void *p, char *buf, size_t size) {
    int64_t s;
    uint64_t u;
    bool neg;
    if (t == LOOM_GGUF_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        snprintf(buf, size, "%g", f);
    } else if (t == LOOM_GGUF_FLOAT64) {
        double d;
        memcpy(&d, p, 8);
        snprintf(buf, size, "%g", d);
    } else if (t == LOOM_GGUF_BOOL) {
        snprintf(buf, size, "%s", *(const uint8_t *)p ? "true" : "false");
    } else if (scalar_int(t, p, &s, &u, &neg)) {
        if (neg) snprintf(buf, size, "%" PRId64, s);
        else snprintf(buf, size, "%" PRIu64, u);
    } else {
        snprintf(buf, size, "?");
    }
}

void loom_gguf_kv_format(const loom_gguf *g, int64_t i, char *buf, size_t size) {
    const loom__gguf_kv *kv = kv_at(g, i);
    if (size == 0) return;
    if (kv->type == LOOM_GGUF_STRING) {
        snprintf(buf, size, "\"%.*s\"", (int)(kv->str.len > 200 ? 200 : kv->str.len), kv->str.ptr);
    } else if (kv->type == LOOM_GGUF_ARRAY) {
        size_t n = (size_t)snprintf(buf, size, "[%s x %" PRIu64 "]", loom_gguf_type_name(kv->arr_type),
                                    kv->arr_n);
        size_t es = loom__gguf_scalar_size(kv->arr_type);
        for (uint64_t j = 0; j < kv->arr_n && j < 4 && n + 1 < size; j++) {
            char item[64];
            if (kv->arr_type == LOOM_GGUF_STRING)
                snprintf(item, sizeof item, "\"%.*s\"", (int)(kv->strs[j].len > 24 ? 24 : kv->strs[j].len), kv->strs[j].ptr);
            else
                format_scalar(kv->arr_type, (const uint8_t *)kv->data + j * es, item, sizeof item);
            n += (size_t)snprintf(buf + n, size - n, "%s%s", j ? ", " : " ", item);
        }
        if (kv->arr_n > 4 && n + 1 < size) snprintf(buf + n, size - n, ", ...");
    } else {
        format_scalar(kv->type, kv->data, buf, size);
    }
}

/* ---------------------------------------------------------------- tensors */

int64_t loom_gguf_tensor_count(const loom_gguf *g) { return g->n_tensors; }

int64_t loom_gguf_find_tensor(const loom_gguf *g, const char *name) {
    return loom__gguf_index_find(g->tensor_index, g->tensor_cap, name, loom__gguf_tensor_name, g);
}

static const loom__gguf_tensor *tensor_at(const loom_gguf *g, int64_t i) {
    LOOM_ASSERT(i >= 0 && i < g->n_tensors);
    return &g->tensors[i];
}

const char *loom_gguf_tensor_name(const loom_gguf *g, int64_t i) { return tensor_at(g, i)->name; }
loom_type loom_gguf_tensor_type(const loom_gguf *g, int64_t i) { return tensor_at(g, i)->type; }
int loom_gguf_tensor_n_dims(const loom_gguf *g, int64_t i) { return tensor_at(g, i)->n_dims; }

loom_status loom_gguf_tensor_check_type(const loom_gguf *g, int64_t i) {
    const loom__gguf_tensor *t = tensor_at(g, i);
    const loom_type_traits *tr = loom_type_traits_get((int)t->type);
    if (tr && (tr->is_weight || !tr->is_quantized)) return LOOM_OK;
    return loom_error(LOOM_ERR_UNSUPPORTED, "tensor '%s' has type %s (%d), which loom does not support",
                      t->name, loom_gguf_type_str((int)t->type), (int)t->type);
}

const char *loom_gguf_tensor_type_name(const loom_gguf *g, int64_t i) {
    return loom_gguf_type_str((int)tensor_at(g, i)->type);
}

void loom_gguf_tensor_ne(const loom_gguf *g, int64_t i, int64_t ne[LOOM_MAX_DIMS]) {
    memcpy(ne, tensor_at(g, i)->ne, sizeof(int64_t) * LOOM_MAX_DIMS);
}

size_t loom_gguf_tensor_offset(const loom_gguf *g, int64_t i) {
    return (size_t)tensor_at(g, i)->offset;
}

size_t loom_gguf_tensor_size(const loom_gguf *g, int64_t i) { return tensor_at(g, i)->size; }

const void *loom_gguf_tensor_data(const loom_gguf *g, int64_t i) {
    const loom__gguf_tensor *t = tensor_at(g, i);
    if (t->size == 0) return NULL;
    if (g->header_only && (g->data_offset > g->size || t->offset > g->size - g->data_offset ||
                           t->size > g->size - g->data_offset - t->offset))
        return NULL; /* absent from a header-only file */
    return g->data + g->data_offset + t->offset;
}
