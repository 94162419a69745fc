/*
 * GGUF files: a reader (mmap, versions 2 and 3, every metadata type, alignment, files with
 * no tensors) and a writer.
 *
 * The reader trusts nothing: every count, length, offset and type is checked against the
 * bytes actually present, and a hostile or truncated file is rejected with
 * LOOM_ERR_FORMAT and a message naming the field and its byte offset, e.g.
 * "gguf: tensor 3 ('blk.0.attn_q.weight') data [4096, 8392704) lies past the end of the
 * file (8000000 bytes)". A reader borrows nothing after open: strings and arrays point into
 * the mapping, which lives as long as the loom_gguf.
 */
#ifndef LOOM_GGUF_H
#define LOOM_GGUF_H

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_gguf_type {
    LOOM_GGUF_UINT8 = 0,
    LOOM_GGUF_INT8 = 1,
    LOOM_GGUF_UINT16 = 2,
    LOOM_GGUF_INT16 = 3,
    LOOM_GGUF_UINT32 = 4,
    LOOM_GGUF_INT32 = 5,
    LOOM_GGUF_FLOAT32 = 6,
    LOOM_GGUF_BOOL = 7,
    LOOM_GGUF_STRING = 8,
    LOOM_GGUF_ARRAY = 9,
    LOOM_GGUF_UINT64 = 10,
    LOOM_GGUF_INT64 = 11,
    LOOM_GGUF_FLOAT64 = 12,
    LOOM_GGUF_TYPE_COUNT = 13,
} loom_gguf_type;

#define LOOM_GGUF_DEFAULT_ALIGNMENT 32

typedef struct loom_gguf loom_gguf;

/* Opens and validates a file (mmap, read-only; a file that cannot be mapped is read into
 * memory instead). */
LOOM_API loom_status loom_gguf_open(const char *path, loom_gguf **out);
/* Opens the metadata and tensor table only: tensor data may be absent (a file truncated
 * after its header, or a header copied from a 40 GB model); loom_gguf_tensor_data returns
 * NULL for a tensor whose bytes are not in the file. For planning (`loom plan`). */
LOOM_API loom_status loom_gguf_open_header(const char *path, loom_gguf **out);
/* Parses a memory image (borrowed: it must outlive the result). For tests and fuzzing. */
LOOM_API loom_status loom_gguf_open_memory(const void *data, size_t size, loom_gguf **out);
LOOM_API void loom_gguf_free(loom_gguf *g); /* NULL is a no-op */
/* Whether g's bytes are a mapping of the file (false: opened from memory, or a file that
 * could not be mapped and was read into memory instead). */
LOOM_API bool loom_gguf_is_mapped(const loom_gguf *g);
/* A new private (copy-on-write) mapping of the whole file g was opened from, independent of
 * g's lifetime: munmap(*base, *size) when done. Pages are shared with the page cache until
 * written. LOOM_ERR_UNSUPPORTED for a gguf opened from memory, LOOM_ERR_IO if mmap fails. */
LOOM_API loom_status loom_gguf_map_file(const loom_gguf *g, void **base, size_t *size);
/* A new descriptor (close-on-exec) of the file g was opened from, independent of g's lifetime,
 * so that the owner of a mapping can fstat the file later (a file truncated under a mapping
 * raises SIGBUS on the next read of a page past its new end); -1 for a gguf opened from
 * memory or when dup fails. */
LOOM_API int loom_gguf_dup_fd(const loom_gguf *g);
/* Copies `size` bytes at file offset `offset` into dst (from memory, or read from the file:
 * the tensor data of a header-only open). */
LOOM_API loom_status loom_gguf_read_at(const loom_gguf *g, uint64_t offset, void *dst, size_t size);
/* Test hook: the next n mmap calls of the reader (open, loom_gguf_map_file) fail. */
LOOM_API void loom_gguf_test_fail_mmap(int n);

LOOM_API const char *loom_gguf_type_name(loom_gguf_type t);
LOOM_API uint32_t loom_gguf_version(const loom_gguf *g);
LOOM_API size_t loom_gguf_alignment(const loom_gguf *g);
LOOM_API size_t loom_gguf_data_offset(const loom_gguf *g); /* start of the tensor data */
LOOM_API size_t loom_gguf_file_size(const loom_gguf *g);

/* ---- metadata */
LOOM_API int64_t loom_gguf_kv_count(const loom_gguf *g);
LOOM_API int64_t loom_gguf_find_kv(const loom_gguf *g, const char *key); /* -1 if absent */
LOOM_API const char *loom_gguf_kv_key(const loom_gguf *g, int64_t i);
LOOM_API loom_gguf_type loom_gguf_kv_type(const loom_gguf *g, int64_t i);
/* For arrays: element type and count. */
LOOM_API loom_gguf_type loom_gguf_kv_arr_type(const loom_gguf *g, int64_t i);
LOOM_API uint64_t loom_gguf_kv_arr_n(const loom_gguf *g, int64_t i);
/* Raw element data of a numeric array (little-endian, packed). NULL for string arrays. */
LOOM_API const void *loom_gguf_kv_arr_data(const loom_gguf *g, int64_t i);
/* Element j of a string array (not NUL-terminated: use *len). */
LOOM_API const char *loom_gguf_kv_arr_str(const loom_gguf *g, int64_t i, uint64_t j,
                                          uint64_t *len);

/* Typed getters by key. Integer getters accept any integer (and bool) type whose value
 * fits; float getters accept float and integer types. LOOM_ERR_NOT_FOUND if the key is
 * absent, LOOM_ERR_TYPE (naming key and types) if the type does not fit. */
LOOM_API loom_status loom_gguf_get_int(const loom_gguf *g, const char *key, int64_t *out);
LOOM_API loom_status loom_gguf_get_uint(const loom_gguf *g, const char *key, uint64_t *out);
LOOM_API loom_status loom_gguf_get_float(const loom_gguf *g, const char *key, double *out);
LOOM_API loom_status loom_gguf_get_bool(const loom_gguf *g, const char *key, bool *out);
/* A string value, NUL-terminated copy owned by g (valid until loom_gguf_free). */
LOOM_API loom_status loom_gguf_get_str(const loom_gguf *g, const char *key, const char **out);
/* A value of any type formatted for display (arrays abbreviated). */
LOOM_API void loom_gguf_kv_format(const loom_gguf *g, int64_t i, char *buf, size_t size);

/* ---- tensors */
LOOM_API int64_t loom_gguf_tensor_count(const loom_gguf *g);
LOOM_API int64_t loom_gguf_find_tensor(const loom_gguf *g, const char *name); /* -1 absent */
LOOM_API const char *loom_gguf_tensor_name(const loom_gguf *g, int64_t i);
/* The tensor's GGUF type id. It may be an id GGUF defines that loom does not compute with
 * (IQ2_XXS, TQ1_0, ...): the file still opens and lists; check it with
 * loom_gguf_tensor_check_type before using the data. */
LOOM_API loom_type loom_gguf_tensor_type(const loom_gguf *g, int64_t i);
/* LOOM_OK when loom can compute with the tensor's type, else LOOM_ERR_UNSUPPORTED with
 * "tensor 'NAME' has type IQ2_XXS (16), which loom does not support". */
LOOM_API loom_status loom_gguf_tensor_check_type(const loom_gguf *g, int64_t i);
/* The tensor type's upper-case GGUF name, supported or not ("Q4_K", "IQ2_XXS"). */
LOOM_API const char *loom_gguf_tensor_type_name(const loom_gguf *g, int64_t i);
LOOM_API int loom_gguf_tensor_n_dims(const loom_gguf *g, int64_t i);
LOOM_API void loom_gguf_tensor_ne(const loom_gguf *g, int64_t i, int64_t ne[LOOM_MAX_DIMS]);
LOOM_API size_t loom_gguf_tensor_offset(const loom_gguf *g, int64_t i); /* from data start */
LOOM_API size_t loom_gguf_tensor_size(const loom_gguf *g, int64_t i);
/* Pointer to the tensor's bytes in the mapping. */
LOOM_API const void *loom_gguf_tensor_data(const loom_gguf *g, int64_t i);

/* ---- writer */
typedef struct loom_gguf_writer loom_gguf_writer;

LOOM_API loom_gguf_writer *loom_gguf_writer_new(void); /* NULL on OOM */
LOOM_API void loom_gguf_writer_free(loom_gguf_writer *w);
/* Setting an existing key replaces it. */
LOOM_API loom_status loom_gguf_set_u8(loom_gguf_writer *w, const char *key, uint8_t v);
LOOM_API loom_status loom_gguf_set_i8(loom_gguf_writer *w, const char *key, int8_t v);
LOOM_API loom_status loom_gguf_set_u16(loom_gguf_writer *w, const char *key, uint16_t v);
LOOM_API loom_status loom_gguf_set_i16(loom_gguf_writer *w, const char *key, int16_t v);
LOOM_API loom_status loom_gguf_set_u32(loom_gguf_writer *w, const char *key, uint32_t v);
LOOM_API loom_status loom_gguf_set_i32(loom_gguf_writer *w, const char *key, int32_t v);
LOOM_API loom_status loom_gguf_set_u64(loom_gguf_writer *w, const char *key, uint64_t v);
LOOM_API loom_status loom_gguf_set_i64(loom_gguf_writer *w, const char *key, int64_t v);
LOOM_API loom_status loom_gguf_set_f32(loom_gguf_writer *w, const char *key, float v);
LOOM_API loom_status loom_gguf_set_f64(loom_gguf_writer *w, const char *key, double v);
LOOM_API loom_status loom_gguf_set_bool(loom_gguf_writer *w, const char *key, bool v);
LOOM_API loom_status loom_gguf_set_str(loom_gguf_writer *w, const char *key, const char *v);
/* A numeric array (elements copied). */
LOOM_API loom_status loom_gguf_set_arr(loom_gguf_writer *w, const char *key,
                                       loom_gguf_type elem_type, const void *data, uint64_t n);
LOOM_API loom_status loom_gguf_set_arr_str(loom_gguf_writer *w, const char *key,
                                           const char *const *strs, uint64_t n);
/* Adds a tensor; data (nbytes of the given type/shape) is copied. Duplicate names are
 * an error. */
LOOM_API loom_status loom_gguf_add_tensor(loom_gguf_writer *w, const char *name, loom_type type,
                                          int n_dims, const int64_t *ne, const void *data);
LOOM_API void loom_gguf_writer_set_alignment(loom_gguf_writer *w, size_t alignment);
LOOM_API void loom_gguf_writer_set_version(loom_gguf_writer *w, uint32_t version); /* 2|3 */
LOOM_API loom_status loom_gguf_write_file(const loom_gguf_writer *w, const char *path);
/* Serialises into a new loom_malloc'd buffer (*out_data, *out_size; free with loom_free). */
LOOM_API loom_status loom_gguf_write_memory(const loom_gguf_writer *w, void **out_data,
                                            size_t *out_size);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_GGUF_H */
