/* Internal layout of a parsed GGUF file, shared by the reader and its accessors. */
#ifndef LOOM_GGUF_IMPL_H
#define LOOM_GGUF_IMPL_H

#include "loom/gguf.h"

typedef struct loom__gguf_str {
    const char *ptr; /* into the mapping; not NUL-terminated */
    uint64_t len;
} loom__gguf_str;

typedef struct loom__gguf_kv {
    char *key;               /* owned, NUL-terminated */
    loom_gguf_type type;
    size_t value_offset;     /* file offset of the value */
    const void *data;        /* scalars and numeric arrays: into the mapping */
    loom__gguf_str str;      /* STRING */
    char *str_copy;          /* STRING: owned NUL-terminated copy */
    loom_gguf_type arr_type; /* ARRAY */
    uint64_t arr_n;
    loom__gguf_str *strs;    /* ARRAY of STRING: owned index */
} loom__gguf_kv;

typedef struct loom__gguf_tensor {
    char *name; /* owned */
    int n_dims;
    int64_t ne[LOOM_MAX_DIMS];
    loom_type type;
    uint64_t offset; /* from data_offset */
    size_t size;     /* bytes */
} loom__gguf_tensor;

struct loom_gguf {
    const uint8_t *data;
    size_t size;
    int fd;
    bool mapped;
    uint8_t *owned; /* the file read into memory (when it could not be mapped), or NULL */
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    int64_t n_kv;
    loom__gguf_kv *kv;
    int64_t n_tensors;
    loom__gguf_tensor *tensors;
    /* name -> index hash tables (open addressing, -1 empty, cap a power of two, at least
     * twice the count), so every look-up and the duplicate checks at open are O(1) */
    int64_t *kv_index;
    size_t kv_cap;
    int64_t *tensor_index;
    size_t tensor_cap;
    bool header_only; /* loom_gguf_open_header: tensor data may lie past the end */
};

/* The name of metadata entry i and of tensor i: the name_of of the two index tables. */
const char *loom__gguf_kv_name(const loom_gguf *g, int64_t i);
const char *loom__gguf_tensor_name(const loom_gguf *g, int64_t i);

/* The index of `name` in a table built by the reader, or -1. */
int64_t loom__gguf_index_find(const int64_t *slots, size_t cap, const char *name,
                              const char *(*name_of)(const loom_gguf *, int64_t),
                              const loom_gguf *g);
uint64_t loom__gguf_hash(const char *s);

/* mmap(NULL, size, prot, MAP_PRIVATE, fd, 0), failing as the test hook says. */
void *loom__gguf_mmap(size_t size, int prot, int fd);

/* Bytes of one scalar of type t (0 for STRING, ARRAY and unknown types). */
size_t loom__gguf_scalar_size(loom_gguf_type t);

#endif
