/*
 * loom core: status codes, logging, allocation hooks, types, tensors, contexts, graphs and
 * the op builders. Everything here is pure bookkeeping: no op is computed by core; a
 * backend (cpu, sim, cuda, meta) computes graphs built from these tensors.
 *
 * Conventions (GGUF/ggml): ne[0] is the contiguous dimension; nb[i] is the byte stride of
 * dimension i; for block-quantized types nb[0] is the block size in bytes and ne[0] must be
 * a multiple of the block length. Every op builder returns NULL on bad input (mismatched
 * shapes or types, NULL sources, a full context) and records a message that
 * loom_last_error() returns; a NULL source propagates as a NULL result, so a chain of
 * builders can be checked once at its end.
 */
#ifndef LOOM_CORE_H
#define LOOM_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#ifndef LOOM_API
#define LOOM_API __attribute__((visibility("default")))
#endif
#define LOOM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define LOOM_NORETURN __attribute__((noreturn))
#else
#ifndef LOOM_API
#define LOOM_API
#endif
#define LOOM_PRINTF(f, a)
#define LOOM_NORETURN
#endif

/* ---------------------------------------------------------------- status */

typedef enum loom_status {
    LOOM_OK = 0,
    LOOM_ERR_INVALID_ARG,  /* a caller passed something malformed */
    LOOM_ERR_SHAPE,        /* tensor shapes do not fit the op */
    LOOM_ERR_TYPE,         /* tensor types do not fit the op */
    LOOM_ERR_NOMEM,        /* host allocation failed */
    LOOM_ERR_DEVICE_OOM,   /* a device (or its memory cap) is out of memory */
    LOOM_ERR_UNSUPPORTED,  /* no implementation for this op/type/config */
    LOOM_ERR_NOT_FOUND,    /* a named thing (module, device, tensor) does not exist */
    LOOM_ERR_IO,           /* reading or writing a file failed */
    LOOM_ERR_FORMAT,       /* a file or string does not parse */
    LOOM_ERR_DEVICE,       /* a device or driver call failed */
    LOOM_ERR_FULL,         /* a fixed-capacity container is full */
    LOOM_ERR_INTERNAL,     /* should not happen; report it */
    LOOM_STATUS_COUNT
} loom_status;

/* Stable short description of a status code ("out of memory", ...). */
LOOM_API const char *loom_status_str(loom_status s);

/* The message of the last error recorded on this thread ("" if none). Thread-local. */
LOOM_API const char *loom_last_error(void);
LOOM_API loom_status loom_last_status(void);
/* Records an error on this thread and returns `s`, so `return loom_error(...)` works. */
LOOM_API loom_status loom_error(loom_status s, const char *fmt, ...) LOOM_PRINTF(2, 3);
LOOM_API void loom_clear_error(void);

/* ---------------------------------------------------------------- logging */

typedef enum loom_log_level {
    LOOM_LOG_DEBUG = 0,
    LOOM_LOG_INFO = 1,
    LOOM_LOG_WARN = 2,
    LOOM_LOG_ERROR = 3,
    LOOM_LOG_NONE = 4,
} loom_log_level;

/* A log sink. `msg` has no trailing newline. */
typedef void (*loom_log_fn)(loom_log_level level, const char *msg, void *user_data);

/* Replaces the log sink; NULL restores the default, which writes lines of level
 * >= LOOM_LOG_LEVEL (env: debug|info|warn|error|none, default warn) to stderr. Thread-safe:
 * it returns once no thread is still inside the sink it replaced, so that sink's user_data
 * may be freed then (a sink that calls loom_log_set does not wait for itself). A sink may
 * be called from any thread, concurrently. */
LOOM_API void loom_log_set(loom_log_fn fn, void *user_data);
LOOM_API void loom_log_set_level(loom_log_level min_level);
LOOM_API loom_log_level loom_log_get_level(void);
LOOM_API void loom_log(loom_log_level level, const char *fmt, ...) LOOM_PRINTF(2, 3);

#define LOOM_LOG_DEBUG(...) loom_log(LOOM_LOG_DEBUG, __VA_ARGS__)
#define LOOM_LOG_INFO(...) loom_log(LOOM_LOG_INFO, __VA_ARGS__)
#define LOOM_LOG_WARN(...) loom_log(LOOM_LOG_WARN, __VA_ARGS__)
#define LOOM_LOG_ERROR(...) loom_log(LOOM_LOG_ERROR, __VA_ARGS__)

/* Always-on assert for broken invariants (bugs), never for bad input. */
LOOM_API LOOM_NORETURN void loom_abort(const char *file, int line, const char *fmt, ...)
    LOOM_PRINTF(3, 4);
#define LOOM_ASSERT(x)                                                                             \
    do {                                                                                           \
        if (!(x)) loom_abort(__FILE__, __LINE__, "assertion failed: %s", #x);                      \
    } while (0)

/* ---------------------------------------------------------------- allocation */

/* A replaceable host allocator (SQLite style): tests install one that fails on the Nth call
 * to prove every path survives out-of-memory. All of loom's host allocations go through
 * loom_malloc/loom_calloc/loom_realloc/loom_free. `aligned` allocations come from
 * loom_aligned_alloc (alignment a power of two) and are freed with loom_aligned_free. */
typedef struct loom_allocator {
    void *(*malloc_fn)(size_t size, void *user_data);
    void *(*realloc_fn)(void *p, size_t size, void *user_data);
    void (*free_fn)(void *p, void *user_data);
    void *user_data;
} loom_allocator;

/* NULL restores libc. Not thread-safe against concurrent allocation: set it up front. */
LOOM_API void loom_allocator_set(const loom_allocator *a);
LOOM_API void *loom_malloc(size_t size);
LOOM_API void *loom_calloc(size_t n, size_t size);
LOOM_API void *loom_realloc(void *p, size_t size);
LOOM_API void loom_free(void *p);
LOOM_API char *loom_strdup(const char *s);
LOOM_API void *loom_aligned_alloc(size_t alignment, size_t size);
LOOM_API void loom_aligned_free(void *p);

/* ---------------------------------------------------------------- checked arithmetic */

/* For sizes read from files: each returns true (and leaves *out unspecified) when the exact
 * result does not fit, so callers can refuse the input instead of wrapping around. */
static inline bool loom_mul_overflow_i64(int64_t a, int64_t b, int64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool loom_add_overflow_i64(int64_t a, int64_t b, int64_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool loom_mul_overflow_size(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool loom_add_overflow_size(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out);
}

/* ---------------------------------------------------------------- types */

/* Values match GGUF's ggml_type ids, so a GGUF file's type field maps directly. Ids that
 * GGUF defines but loom has no kernels for (IQ1/IQ2/IQ3, TQ, F64, ...) are not loom types:
 * loom_type_traits_get returns NULL for them, loom_gguf_type_info still names them. */
typedef enum loom_type {
    LOOM_TYPE_F32 = 0,
    LOOM_TYPE_F16 = 1,
    LOOM_TYPE_Q4_0 = 2,
    LOOM_TYPE_Q4_1 = 3,
    LOOM_TYPE_Q5_0 = 6,
    LOOM_TYPE_Q5_1 = 7,
    LOOM_TYPE_Q8_0 = 8,
    LOOM_TYPE_Q8_1 = 9, /* activation type of the Q4_1/Q5_1 dot products */
    LOOM_TYPE_Q2_K = 10,
    LOOM_TYPE_Q3_K = 11,
    LOOM_TYPE_Q4_K = 12,
    LOOM_TYPE_Q5_K = 13,
    LOOM_TYPE_Q6_K = 14,
    LOOM_TYPE_Q8_K = 15, /* activation type of the K-quant and IQ4_XS dot products */
    LOOM_TYPE_IQ4_NL = 20,
    LOOM_TYPE_IQ4_XS = 23,
    LOOM_TYPE_I8 = 24,
    LOOM_TYPE_I16 = 25,
    LOOM_TYPE_I32 = 26,
    LOOM_TYPE_I64 = 27,
    LOOM_TYPE_BF16 = 30,
    LOOM_TYPE_MXFP4 = 39,
    LOOM_TYPE_COUNT = 40,
} loom_type;

#define LOOM_QK8_0 32
#define LOOM_QK4_0 32
#define LOOM_QK4_1 32
#define LOOM_QK5_0 32
#define LOOM_QK5_1 32
#define LOOM_QK8_1 32
#define LOOM_QK4_NL 32
#define LOOM_QK_MXFP4 32
#define LOOM_QK_K 256         /* super-block of the K-quants and IQ4_XS */
#define LOOM_K_SCALE_SIZE 12  /* packed 6-bit scales and mins of Q4_K/Q5_K */

/* Q8_0 block: 32 values, x[i] = qs[i] * d. 34 bytes. */
typedef struct {
    uint16_t d; /* fp16 scale */
    int8_t qs[LOOM_QK8_0];
} loom_block_q8_0;

/* Q4_0 block: 32 values; qs[j] low nibble is x[j], high nibble is x[j+16];
 * x = (nibble - 8) * d. 18 bytes. */
typedef struct {
    uint16_t d; /* fp16 scale */
    uint8_t qs[LOOM_QK4_0 / 2];
} loom_block_q4_0;

/* Q4_1: x = nibble * d + m (nibbles as Q4_0). 20 bytes. */
typedef struct {
    uint16_t d, m; /* fp16 */
    uint8_t qs[LOOM_QK4_1 / 2];
} loom_block_q4_1;

/* Q5_0: 5-bit q = nibble | bit j of qh (little-endian u32) << 4, x = (q - 16) * d. 22 bytes. */
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[LOOM_QK5_0 / 2];
} loom_block_q5_0;

/* Q5_1: as Q5_0 without the -16, x = q * d + m. 24 bytes. */
typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[LOOM_QK5_1 / 2];
} loom_block_q5_1;

/* Q8_1: x = qs * d; s = d * sum(qs) (fp16). 36 bytes. */
typedef struct {
    uint16_t d, s;
    int8_t qs[LOOM_QK8_1];
} loom_block_q8_1;

/* Q2_K: 16 sub-blocks of 16; scales[i] = scale (low 4 bits) | min (high 4 bits);
 * x = d * scale * q2 - dmin * min. 84 bytes. */
typedef struct {
    uint8_t scales[LOOM_QK_K / 16];
    uint8_t qs[LOOM_QK_K / 4];
    uint16_t d, dmin;
} loom_block_q2_K;

/* Q3_K: x = d * (scale6 - 32) * (q2 - (hmask bit ? 0 : 4)); 16 six-bit scales packed in 12
 * bytes. 110 bytes. */
typedef struct {
    uint8_t hmask[LOOM_QK_K / 8];
    uint8_t qs[LOOM_QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} loom_block_q3_K;

/* Q4_K: 8 sub-blocks of 32 with 6-bit scale and min; x = d * sc * q4 - dmin * m. 144 bytes. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[LOOM_K_SCALE_SIZE];
    uint8_t qs[LOOM_QK_K / 2];
} loom_block_q4_K;

/* Q5_K: Q4_K plus one high bit per value in qh. 176 bytes. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[LOOM_K_SCALE_SIZE];
    uint8_t qh[LOOM_QK_K / 8];
    uint8_t qs[LOOM_QK_K / 2];
} loom_block_q5_K;

/* Q6_K: 16 sub-blocks of 16, int8 scales; x = d * scale * (q6 - 32). 210 bytes. */
typedef struct {
    uint8_t ql[LOOM_QK_K / 2];
    uint8_t qh[LOOM_QK_K / 4];
    int8_t scales[LOOM_QK_K / 16];
    uint16_t d;
} loom_block_q6_K;

/* Q8_K: x = qs * d (f32 scale); bsums[i] = sum of qs[16 i .. 16 i + 15]. 292 bytes. */
typedef struct {
    float d;
    int8_t qs[LOOM_QK_K];
    int16_t bsums[LOOM_QK_K / 16];
} loom_block_q8_K;

/* IQ4_NL: x = d * loom_iq4nl_values[nibble] (nibbles as Q4_0). 18 bytes. */
typedef struct {
    uint16_t d;
    uint8_t qs[LOOM_QK4_NL / 2];
} loom_block_iq4_nl;

/* IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (low 4 bits in scales_l, high 2 in
 * scales_h); x = d * (ls - 32) * loom_iq4nl_values[nibble]. 136 bytes. */
typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[LOOM_QK_K / 64];
    uint8_t qs[LOOM_QK_K / 2];
} loom_block_iq4_xs;

/* MXFP4: e8m0 shared exponent e, 4-bit e2m1 values (nibbles as Q4_0);
 * x = loom_mxfp4_values[nibble] * 2^(e - 128) (the table holds doubled e2m1). 17 bytes. */
typedef struct {
    uint8_t e;
    uint8_t qs[LOOM_QK_MXFP4 / 2];
} loom_block_mxfp4;

/* The 16 non-linear levels of IQ4_NL/IQ4_XS and the doubled e2m1 values of MXFP4. */
LOOM_API extern const int8_t loom_iq4nl_values[16];
LOOM_API extern const int8_t loom_mxfp4_values[16];

typedef void (*loom_to_float_fn)(const void *x, float *y, int64_t n);
typedef void (*loom_from_float_fn)(const float *x, void *y, int64_t n);

typedef struct loom_type_traits {
    const char *name;       /* "f32", "q4_0", ... */
    int64_t blck_size;      /* elements per block (1 for plain types) */
    size_t type_size;       /* bytes per block */
    bool is_quantized;
    loom_to_float_fn to_float;     /* NULL for integer types */
    loom_from_float_fn from_float; /* NULL for integer types; n must be a multiple of blck */
    /* The vector-dot kind: the type activations are quantised to for the integer dot
     * product against rows of this type (Q8_0, Q8_1 or Q8_K), or F32 for float dots, as
     * the reference engines do. */
    loom_type vec_dot_type;
    bool is_weight; /* matmul/get_rows take it as a weight (false for Q8_1/Q8_K, integers) */
} loom_type_traits;

/* Any GGUF type id, supported by loom or not: its upper-case name ("IQ2_XXS"), elements per
 * block and bytes per block, so a file that holds such tensors can still be listed. Returns
 * false (and leaves the outputs alone) for an id GGUF does not define. */
typedef struct loom_gguf_type_info {
    const char *name;
    int64_t blck_size;
    size_t type_size;
} loom_gguf_type_info;
LOOM_API bool loom_gguf_type_info_get(int type, loom_gguf_type_info *out);
/* The upper-case GGUF name of any id ("Q4_K", "IQ2_XXS"), or "unknown" for an id GGUF does
 * not define. */
LOOM_API const char *loom_gguf_type_str(int type);

/* NULL for an id that is not a loom type (so a hostile file's type id can be checked). */
LOOM_API const loom_type_traits *loom_type_traits_get(int type);
LOOM_API bool loom_type_is_valid(int type);
LOOM_API const char *loom_type_name(loom_type t);
LOOM_API int64_t loom_blck_size(loom_type t);
LOOM_API size_t loom_type_size(loom_type t);
/* Bytes of one row of ne0 elements (ne0 a multiple of the block length). */
LOOM_API size_t loom_row_size(loom_type t, int64_t ne0);

LOOM_API uint16_t loom_fp32_to_fp16(float f);
LOOM_API float loom_fp16_to_fp32(uint16_t h);
LOOM_API uint16_t loom_fp32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
LOOM_API float loom_bf16_to_fp32(uint16_t h);

/* ---------------------------------------------------------------- ops */

typedef enum loom_op {
    LOOM_OP_NONE = 0,
    LOOM_OP_DUP,        /* new contiguous tensor, same type, copy of a */
    LOOM_OP_CPY,        /* copy a into b (with type conversion); result is a view of b */
    LOOM_OP_CONT,       /* contiguous copy of a (possibly non-contiguous view) */
    LOOM_OP_ADD,        /* a + b, b broadcast (repeats) over a */
    LOOM_OP_ADD_ID,     /* a[n, u, t] + b[n, ids[u, t]]  (expert biases) */
    LOOM_OP_SUB,
    LOOM_OP_MUL,
    LOOM_OP_DIV,
    LOOM_OP_SCALE,      /* a * s + b; params f32 {s, b} */
    LOOM_OP_SQR,
    LOOM_OP_SQRT,
    LOOM_OP_SUM_ROWS,   /* [1, ne1, ne2, ne3] */
    LOOM_OP_MEAN,       /* [1, ne1, ne2, ne3] */
    LOOM_OP_ARGMAX,     /* a [ne0, ne1] -> I32 [ne1] */
    LOOM_OP_NORM,       /* (x - mean) / sqrt(var + eps) per row; params f32 {eps} */
    LOOM_OP_RMS_NORM,   /* x / sqrt(mean(x^2) + eps) per row; params f32 {eps} */
    LOOM_OP_MUL_MAT,    /* a [K, M, A2, A3] x b [K, N, B2, B3] -> F32 [M, N, B2, B3] */
    LOOM_OP_MUL_MAT_ID, /* experts as [K, M, E], b [K, U or 1, T], ids I32 [U, T] -> [M, U, T] */
    LOOM_OP_GET_ROWS,   /* a [n, R, A2, A3], ids I32 [X, A2, B2] -> F32 [n, X, A2, B2] */
    LOOM_OP_SET_ROWS,   /* dst [n, R, ...] rows ids[i] = b[:, i]; result a view of dst */
    LOOM_OP_RESHAPE,
    LOOM_OP_VIEW,
    LOOM_OP_PERMUTE,    /* params i32 {axis0, axis1, axis2, axis3} */
    LOOM_OP_TRANSPOSE,
    LOOM_OP_SOFT_MAX,   /* softmax(a * scale + mask*slope) per row, with optional sinks */
    LOOM_OP_ROPE,       /* rotary embedding; see loom_rope_ext */
    LOOM_OP_FLASH_ATTN_EXT,
    LOOM_OP_CONCAT,     /* params i32 {dim} */
    LOOM_OP_UNARY,      /* params i32 {loom_unary_op} */
    LOOM_OP_GLU,        /* params i32 {loom_glu_op, swapped} */
    LOOM_OP_ARGSORT,    /* I32 indices per row; params i32 {loom_sort_order} */
    LOOM_OP_TOP_K,      /* I32 [k, ne1, ..]: indices of the k largest per row, largest first */
    LOOM_OP_CLAMP,      /* params f32 {min, max} */
    LOOM_OP_FILL,       /* params f32 {value}; result has a's shape, every element = value */
    LOOM_OP_COUNT
} loom_op;

typedef enum loom_unary_op {
    LOOM_UNARY_SILU = 0,
    LOOM_UNARY_GELU, /* tanh approximation */
    LOOM_UNARY_RELU,
    LOOM_UNARY_COUNT
} loom_unary_op;

typedef enum loom_glu_op {
    LOOM_GLU_SWIGLU = 0, /* silu(x) * g */
    LOOM_GLU_GEGLU,      /* gelu(x) * g */
    LOOM_GLU_COUNT
} loom_glu_op;

typedef enum loom_sort_order {
    LOOM_SORT_ASC = 0,
    LOOM_SORT_DESC = 1,
} loom_sort_order;

#define LOOM_ROPE_TYPE_NORMAL 0 /* rotate adjacent pairs (x[2i], x[2i+1]) */
#define LOOM_ROPE_TYPE_NEOX 2   /* rotate halves (x[i], x[i + n_dims/2]) */

LOOM_API const char *loom_op_name(loom_op op);    /* "MUL_MAT" */
LOOM_API const char *loom_unary_op_name(loom_unary_op op);
/* True for RESHAPE, VIEW, PERMUTE, TRANSPOSE and NONE: metadata, nothing to compute. */
LOOM_API bool loom_op_is_view(loom_op op);

/* ---------------------------------------------------------------- tensors */

#define LOOM_MAX_DIMS 4
#define LOOM_MAX_SRC 10
#define LOOM_MAX_OP_PARAMS 64 /* bytes */
#define LOOM_MAX_NAME 64

enum loom_tensor_flag {
    LOOM_TENSOR_FLAG_INPUT = 1,   /* written by the caller before compute */
    LOOM_TENSOR_FLAG_OUTPUT = 2,  /* read by the caller after compute; never reused */
    LOOM_TENSOR_FLAG_PARAM = 4,   /* a model weight */
    LOOM_TENSOR_FLAG_COMPUTE = 8, /* set on graph nodes that must be computed */
    /* read outside the graph a backend is given: a scheduler sets it on the nodes of a
     * split that another split reads, so the backend must leave them holding their final
     * value (e.g. a meta backend must not delay their reduction) */
    LOOM_TENSOR_FLAG_EXTERNAL = 16,
};

struct loom_buffer;

typedef struct loom_tensor {
    loom_type type;
    struct loom_buffer *buffer; /* where data lives; NULL while unallocated */
    int64_t ne[LOOM_MAX_DIMS];  /* elements per dimension */
    size_t nb[LOOM_MAX_DIMS];   /* bytes between consecutive elements/blocks of a dim */
    loom_op op;
    int32_t op_params[LOOM_MAX_OP_PARAMS / sizeof(int32_t)];
    int32_t flags;
    struct loom_tensor *src[LOOM_MAX_SRC];
    struct loom_tensor *view_src; /* the tensor this one views, or NULL */
    size_t view_offs;             /* byte offset into view_src */
    void *data;                   /* address of element 0 (host or device address) */
    void *extra;                  /* backend-private per-tensor data */
    char name[LOOM_MAX_NAME];
} loom_tensor;

LOOM_API int64_t loom_nelements(const loom_tensor *t);
LOOM_API int64_t loom_nrows(const loom_tensor *t); /* ne1*ne2*ne3 */
LOOM_API size_t loom_nbytes(const loom_tensor *t); /* bytes spanned, strides included */
LOOM_API size_t loom_element_size(const loom_tensor *t); /* type size (block bytes) */
LOOM_API int loom_n_dims(const loom_tensor *t);  /* highest dim with ne > 1, plus one */
LOOM_API bool loom_is_contiguous(const loom_tensor *t);
LOOM_API bool loom_is_transposed(const loom_tensor *t);
LOOM_API bool loom_is_permuted(const loom_tensor *t);
LOOM_API bool loom_is_view(const loom_tensor *t);
LOOM_API bool loom_are_same_shape(const loom_tensor *a, const loom_tensor *b);
LOOM_API bool loom_are_same_layout(const loom_tensor *a, const loom_tensor *b);
/* b can be broadcast (repeated) to a's shape: a->ne[i] % b->ne[i] == 0 for all i. */
LOOM_API bool loom_can_repeat(const loom_tensor *b, const loom_tensor *a);
LOOM_API void loom_set_name(loom_tensor *t, const char *name);
LOOM_API void loom_format_name(loom_tensor *t, const char *fmt, ...) LOOM_PRINTF(2, 3);
LOOM_API const char *loom_get_name(const loom_tensor *t);
LOOM_API void loom_set_input(loom_tensor *t);
LOOM_API void loom_set_output(loom_tensor *t);
LOOM_API void loom_set_param(loom_tensor *t);
/* Typed access to op_params (index counts 32-bit words). */
LOOM_API int32_t loom_get_op_params_i32(const loom_tensor *t, int i);
LOOM_API float loom_get_op_params_f32(const loom_tensor *t, int i);
LOOM_API void loom_set_op_params_i32(loom_tensor *t, int i, int32_t v);
LOOM_API void loom_set_op_params_f32(loom_tensor *t, int i, float v);
/* Host-side element access for host-resident F32/F16/BF16/I32 tensors (tests, tools). */
LOOM_API float loom_get_f32_nd(const loom_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                               int64_t i3);
LOOM_API void loom_set_f32_nd(loom_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3,
                              float v);
/* A short human-readable description: "name [ne0, ne1, ne2, ne3] type". */
LOOM_API void loom_tensor_describe(const loom_tensor *t, char *buf, size_t size);

/* ---------------------------------------------------------------- contexts */

/* An arena of tensor headers and, unless no_alloc, of their data (host memory). */
typedef struct loom_ctx loom_ctx;

typedef struct loom_ctx_params {
    size_t mem_size;   /* bytes for headers (and data unless no_alloc) */
    void *mem_buffer;  /* caller-owned memory, or NULL to allocate */
    bool no_alloc;     /* headers only: data is placed later by a buffer/allocator */
} loom_ctx_params;

/* NULL (with loom_last_error) when the arena cannot be allocated. */
LOOM_API loom_ctx *loom_ctx_new(loom_ctx_params params);
LOOM_API void loom_ctx_free(loom_ctx *ctx); /* NULL is a no-op */
LOOM_API size_t loom_tensor_overhead(void); /* bytes of arena per tensor header */
LOOM_API size_t loom_graph_overhead(size_t size); /* bytes of arena per graph of `size` */
LOOM_API size_t loom_ctx_used(const loom_ctx *ctx);
LOOM_API bool loom_ctx_get_no_alloc(const loom_ctx *ctx);
LOOM_API void loom_ctx_set_no_alloc(loom_ctx *ctx, bool no_alloc);

LOOM_API loom_tensor *loom_new_tensor(loom_ctx *ctx, loom_type type, int n_dims,
                                      const int64_t *ne);
LOOM_API loom_tensor *loom_new_tensor_1d(loom_ctx *ctx, loom_type type, int64_t ne0);
LOOM_API loom_tensor *loom_new_tensor_2d(loom_ctx *ctx, loom_type type, int64_t ne0,
                                         int64_t ne1);
LOOM_API loom_tensor *loom_new_tensor_3d(loom_ctx *ctx, loom_type type, int64_t ne0,
                                         int64_t ne1, int64_t ne2);
LOOM_API loom_tensor *loom_new_tensor_4d(loom_ctx *ctx, loom_type type, int64_t ne0,
                                         int64_t ne1, int64_t ne2, int64_t ne3);
/* A new header with a's type and shape (contiguous), no op. */
LOOM_API loom_tensor *loom_dup_tensor(loom_ctx *ctx, const loom_tensor *a);
/* A view of all of a (op VIEW), same layout. */
LOOM_API loom_tensor *loom_view_tensor(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_ctx_first_tensor(const loom_ctx *ctx);
LOOM_API loom_tensor *loom_ctx_next_tensor(const loom_ctx *ctx, const loom_tensor *t);
LOOM_API loom_tensor *loom_ctx_get_tensor(const loom_ctx *ctx, const char *name);

/* ---------------------------------------------------------------- graphs */

/* An ordered node list (execution order) plus leafs (tensors without an op, or with a
 * buffer-resident constant). Built by a depth-first visit from outputs. */
typedef struct loom_graph {
    int size;              /* capacity of nodes[] and leafs[] */
    int n_nodes;
    int n_leafs;
    loom_tensor **nodes;
    loom_tensor **leafs;
    uint64_t uid;          /* fresh on every build or edit: caches key on it */
    /* visited set (open addressing over tensor pointers, capacity hash_size) */
    size_t hash_size;
    loom_tensor **hash_keys;
} loom_graph;

#define LOOM_DEFAULT_GRAPH_SIZE 2048

/* A graph of capacity `size`, allocated in ctx. NULL when ctx is full. */
LOOM_API loom_graph *loom_graph_new(loom_ctx *ctx, size_t size);
/* Adds t and everything it depends on. LOOM_ERR_FULL if the graph capacity is exceeded,
 * LOOM_ERR_INVALID_ARG for a NULL tensor. Refreshes uid. */
LOOM_API loom_status loom_graph_build_forward(loom_graph *g, loom_tensor *t);
/* Appends a node without visiting sources (used by schedulers building their own
 * order). Refreshes uid. */
LOOM_API loom_status loom_graph_add_node(loom_graph *g, loom_tensor *t);
LOOM_API void loom_graph_clear(loom_graph *g);
/* A graph that borrows nodes [i0, i1) of g (no leafs, own fresh uid). */
LOOM_API loom_graph loom_graph_view(const loom_graph *g, int i0, int i1);
LOOM_API loom_tensor *loom_graph_node(const loom_graph *g, int i); /* i < 0 counts back */
LOOM_API loom_tensor *loom_graph_get_tensor(const loom_graph *g, const char *name);
LOOM_API uint64_t loom_graph_next_uid(void);

/* ---------------------------------------------------------------- op builders */
/* Every builder returns a new tensor in ctx (or a view), or NULL with loom_last_error. */

LOOM_API loom_tensor *loom_dup(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_cpy(loom_ctx *ctx, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_cont(loom_ctx *ctx, loom_tensor *a);
/* CONT into a new shape (element counts must match). */
LOOM_API loom_tensor *loom_cont_4d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1,
                                   int64_t ne2, int64_t ne3);
/* A cast: CPY of a into a new contiguous tensor of `type`. */
LOOM_API loom_tensor *loom_cast(loom_ctx *ctx, loom_tensor *a, loom_type type);

LOOM_API loom_tensor *loom_add(loom_ctx *ctx, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_sub(loom_ctx *ctx, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_mul(loom_ctx *ctx, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_div(loom_ctx *ctx, loom_tensor *a, loom_tensor *b);
/* a [n, U, T] F32, b [n, E] F32, ids I32 [U, T] with values in [0, E). */
LOOM_API loom_tensor *loom_add_id(loom_ctx *ctx, loom_tensor *a, loom_tensor *b,
                                  loom_tensor *ids);
LOOM_API loom_tensor *loom_scale(loom_ctx *ctx, loom_tensor *a, float s);
LOOM_API loom_tensor *loom_scale_bias(loom_ctx *ctx, loom_tensor *a, float s, float b);
LOOM_API loom_tensor *loom_sqr(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_sqrt(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_sum_rows(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_mean(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_argmax(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_norm(loom_ctx *ctx, loom_tensor *a, float eps);
LOOM_API loom_tensor *loom_rms_norm(loom_ctx *ctx, loom_tensor *a, float eps);

/* a: weights [K, M, A2, A3] any float/quant type; b: F32 [K, N, B2, B3] with
 * B2 % A2 == 0 and B3 % A3 == 0 (a broadcast). Result F32 [M, N, B2, B3]. */
LOOM_API loom_tensor *loom_mul_mat(loom_ctx *ctx, loom_tensor *a, loom_tensor *b);
/* as: experts [K, M, E]; b: F32 [K, U or 1, T]; ids: I32 [U, T] (expert of slot u of token
 * t). Result F32 [M, U, T]: result[:, u, t] = as[:, :, ids[u, t]] x b[:, u % b->ne1, t]. */
LOOM_API loom_tensor *loom_mul_mat_id(loom_ctx *ctx, loom_tensor *as, loom_tensor *b,
                                      loom_tensor *ids);
/* a: [n, R, A2, A3] any type; ids: I32 [X, B1, B2] with B1 == A2 (or A2 == 1 broadcast)
 * Result F32 (I32 if a is I32) [n, X, B1, B2]: result[:, x, i1, i2] = a[:, ids[x, i1, i2],
 * i1 % A2, i2 % A3]. */
LOOM_API loom_tensor *loom_get_rows(loom_ctx *ctx, loom_tensor *a, loom_tensor *ids);
/* dst: [n, R, D2, D3] F32/F16/BF16/Q8_0/Q4_0; b: F32 [n, X, B2, B3]; ids: I32 or I64
 * [X, B2, B3] (broadcast over D2, D3 as in get_rows). Writes row ids[x] of dst from
 * b[:, x]. Returns a view of dst (op SET_ROWS, src = {b, ids}, view_src = dst). */
LOOM_API loom_tensor *loom_set_rows(loom_ctx *ctx, loom_tensor *dst, loom_tensor *b,
                                    loom_tensor *ids);

LOOM_API loom_tensor *loom_reshape(loom_ctx *ctx, loom_tensor *a, loom_tensor *like);
LOOM_API loom_tensor *loom_reshape_1d(loom_ctx *ctx, loom_tensor *a, int64_t ne0);
LOOM_API loom_tensor *loom_reshape_2d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1);
LOOM_API loom_tensor *loom_reshape_3d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1,
                                      int64_t ne2);
LOOM_API loom_tensor *loom_reshape_4d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1,
                                      int64_t ne2, int64_t ne3);
/* Views: offset in bytes from a's data; nbN are the new strides. */
LOOM_API loom_tensor *loom_view_1d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, size_t offset);
LOOM_API loom_tensor *loom_view_2d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1,
                                   size_t nb1, size_t offset);
LOOM_API loom_tensor *loom_view_3d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1,
                                   int64_t ne2, size_t nb1, size_t nb2, size_t offset);
LOOM_API loom_tensor *loom_view_4d(loom_ctx *ctx, loom_tensor *a, int64_t ne0, int64_t ne1,
                                   int64_t ne2, int64_t ne3, size_t nb1, size_t nb2, size_t nb3,
                                   size_t offset);
/* Axis i of a becomes axis `axisI` of the result (ggml semantics). */
LOOM_API loom_tensor *loom_permute(loom_ctx *ctx, loom_tensor *a, int axis0, int axis1,
                                   int axis2, int axis3);
LOOM_API loom_tensor *loom_transpose(loom_ctx *ctx, loom_tensor *a);

/* softmax over ne0 of (a * scale + slope_h * mask). mask (optional) F32 or F16
 * [ne0, >= ne1, ne2 or 1 (broadcast), ne3 or 1]; slope_h = 1 when max_bias == 0 (ALiBi
 * otherwise). sinks (optional) F32 [ne2]: one extra logit per head (dim 2) that takes part
 * in the normalisation but produces no output. */
LOOM_API loom_tensor *loom_soft_max(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_soft_max_ext(loom_ctx *ctx, loom_tensor *a, loom_tensor *mask,
                                        loom_tensor *sinks, float scale, float max_bias);

/* a: F32 [head_dim, n_head, T, 1]; pos: I32 [T]; freq_factors: optional F32 [n_dims/2].
 * theta_i = pos * freq_scale * freq_base^(-2i/n_dims) / freq_factors[i]. Dimensions at or
 * beyond n_dims pass through. params: i32 {n_dims, mode}, f32 {freq_base, freq_scale}
 * at words 2, 3. */
LOOM_API loom_tensor *loom_rope_ext(loom_ctx *ctx, loom_tensor *a, loom_tensor *pos,
                                    loom_tensor *freq_factors, int n_dims, int mode,
                                    float freq_base, float freq_scale);

/* q: F32 [D, Nq, H, S]; k: [D, Nkv, Hkv, S] F32/F16; v: [Dv, Nkv, Hkv, S] F32/F16 with
 * H % Hkv == 0 (GQA); mask: optional F32/F16 [Nkv, >= Nq, 1, 1]; sinks: optional F32 [H].
 * Result F32 [Dv, H, Nq, S] (note: heads before queries, ready to reshape to [Dv*H, Nq]).
 * params f32 {scale, max_bias, softcap} (softcap 0 = off). */
LOOM_API loom_tensor *loom_flash_attn_ext(loom_ctx *ctx, loom_tensor *q, loom_tensor *k,
                                          loom_tensor *v, loom_tensor *mask,
                                          loom_tensor *sinks, float scale, float max_bias,
                                          float softcap);

LOOM_API loom_tensor *loom_concat(loom_ctx *ctx, loom_tensor *a, loom_tensor *b, int dim);
LOOM_API loom_tensor *loom_unary(loom_ctx *ctx, loom_tensor *a, loom_unary_op op);
LOOM_API loom_tensor *loom_silu(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_gelu(loom_ctx *ctx, loom_tensor *a);
LOOM_API loom_tensor *loom_relu(loom_ctx *ctx, loom_tensor *a);
/* Split form: act(a) * b, same shapes (swapped: act(b) * a). */
LOOM_API loom_tensor *loom_glu_split(loom_ctx *ctx, loom_tensor *a, loom_tensor *b,
                                     loom_glu_op op);
/* Fused form: a [2n, ...] -> [n, ...]; act(first half) * second half (swapped: reverse). */
LOOM_API loom_tensor *loom_glu(loom_ctx *ctx, loom_tensor *a, loom_glu_op op, bool swapped);
LOOM_API loom_tensor *loom_swiglu_split(loom_ctx *ctx, loom_tensor *a, loom_tensor *b);
LOOM_API loom_tensor *loom_argsort(loom_ctx *ctx, loom_tensor *a, loom_sort_order order);
LOOM_API loom_tensor *loom_top_k(loom_ctx *ctx, loom_tensor *a, int k);
LOOM_API loom_tensor *loom_clamp(loom_ctx *ctx, loom_tensor *a, float min, float max);
LOOM_API loom_tensor *loom_fill(loom_ctx *ctx, loom_tensor *a, float value);

/* ---------------------------------------------------------------- thread pool */

/* A fixed pool of n_threads (the caller's thread counts as thread 0). run() executes
 * fn(ith, nth, user_data) on every thread and returns when all have finished. */
typedef struct loom_threadpool loom_threadpool;
typedef void (*loom_task_fn)(int ith, int nth, void *user_data);

LOOM_API loom_threadpool *loom_threadpool_new(int n_threads); /* NULL on failure */
/* The same, and each worker thread calls start(ith, n_threads, start_data) once before its
 * first task (to pin itself; NULL: nothing). caller_works false: n_threads workers do all
 * the work and the thread calling loom_threadpool_run only waits, so every working thread
 * went through start. */
typedef void (*loom_thread_start_fn)(int ith, int n_threads, void *start_data);
LOOM_API loom_threadpool *loom_threadpool_new_ex(int n_threads, loom_thread_start_fn start,
                                                 void *start_data, bool caller_works);
LOOM_API void loom_threadpool_free(loom_threadpool *tp);
LOOM_API int loom_threadpool_size(const loom_threadpool *tp);
LOOM_API void loom_threadpool_run(loom_threadpool *tp, loom_task_fn fn, void *user_data);
/* A barrier across all threads of the current run() (callable only inside fn). */
LOOM_API void loom_threadpool_barrier(loom_threadpool *tp);
/* The same, and the last thread to arrive calls last(arg) with its own arg before any
 * thread leaves: serial work between two parallel phases costs one barrier, not two
 * (last NULL: a plain barrier; a pool of one thread just calls it). */
LOOM_API void loom_threadpool_barrier_last(loom_threadpool *tp, void (*last)(void *arg), void *arg);
/* Process-wide counts since start, over every pool (for benchmarks): runs, barriers
 * completed, waits that went to sleep on a futex (after their spin), and futex wake-ups
 * (system calls made because a waiter slept). */
typedef struct loom_threadpool_stats {
    unsigned long long runs, barriers, sleeps, wakes;
} loom_threadpool_stats;
LOOM_API void loom_threadpool_get_stats(loom_threadpool_stats *out);
/* Number of hardware threads available to this process (>= 1). */
LOOM_API int loom_n_cpus(void);

/* Monotonic time. */
LOOM_API int64_t loom_time_us(void);
LOOM_API int64_t loom_time_ns(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_CORE_H */
