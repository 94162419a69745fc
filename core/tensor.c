/*
 * tensor.c: questions about a tensor header (sizes, layout, contiguity), its name, flags
 * and op_params, and host-side element access for tests and tools. Pure functions of the
 * header; tensors are created in ctx.c and by the op builders.
 */
#include <stdio.h>

#include "core/core-impl.h"

int64_t loom_nelements(const loom_tensor *t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

int64_t loom_nrows(const loom_tensor *t) {
    return t->ne[1] * t->ne[2] * t->ne[3];
}

size_t loom_nbytes(const loom_tensor *t) {
    for (int i = 0; i < LOOM_MAX_DIMS; i++)
        if (t->ne[i] <= 0) return 0;
    const int64_t blck = loom_blck_size(t->type);
    size_t nbytes;
    if (blck == 1) {
        nbytes = loom_type_size(t->type);
        for (int i = 0; i < LOOM_MAX_DIMS; i++)
            nbytes += (size_t)(t->ne[i] - 1) * t->nb[i];
    } else {
        nbytes = (size_t)(t->ne[0] / blck) * t->nb[0];
        for (int i = 1; i < LOOM_MAX_DIMS; i++)
            nbytes += (size_t)(t->ne[i] - 1) * t->nb[i];
    }
    return nbytes;
}

size_t loom_element_size(const loom_tensor *t) {
    return loom_type_size(t->type);
}

int loom_n_dims(const loom_tensor *t) {
    for (int i = LOOM_MAX_DIMS - 1; i >= 1; i--)
        if (t->ne[i] > 1) return i + 1;
    return 1;
}

/* Strides of dimensions with a single element do not matter (as ggml_is_contiguous). */
bool loom_is_contiguous(const loom_tensor *t) {
    const int64_t blck = loom_blck_size(t->type);
    size_t next = loom_type_size(t->type);
    if (t->ne[0] != blck && t->nb[0] != next) return false;
    next *= (size_t)(t->ne[0] / blck);
    for (int i = 1; i < LOOM_MAX_DIMS; i++) {
        if (t->ne[i] != 1) {
            if (t->nb[i] != next) return false;
            next *= (size_t)t->ne[i];
        }
    }
    return true;
}

bool loom_is_transposed(const loom_tensor *t) {
    return t->nb[0] > t->nb[1];
}

bool loom_is_permuted(const loom_tensor *t) {
    return t->nb[0] > t->nb[1] || t->nb[1] > t->nb[2] || t->nb[2] > t->nb[3];
}

bool loom_is_view(const loom_tensor *t) {
    return t->view_src != NULL;
}

bool loom_are_same_shape(const loom_tensor *a, const loom_tensor *b) {
    for (int i = 0; i < LOOM_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return false;
    return true;
}

bool loom_are_same_layout(const loom_tensor *a, const loom_tensor *b) {
    if (a->type != b->type) return false;
    for (int i = 0; i < LOOM_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i] || a->nb[i] != b->nb[i]) return false;
    return true;
}

bool loom_can_repeat(const loom_tensor *b, const loom_tensor *a) {
    for (int i = 0; i < LOOM_MAX_DIMS; i++) {
        if (b->ne[i] == 0) {
            if (a->ne[i] != 0) return false;
        } else if (a->ne[i] % b->ne[i] != 0) {
            return false;
        }
    }
    return true;
}

void loom_set_name(loom_tensor *t, const char *name) {
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
}

void loom_format_name(loom_tensor *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
}

const char *loom_get_name(const loom_tensor *t) {
    return t->name;
}

void loom_set_input(loom_tensor *t) {
    t->flags |= LOOM_TENSOR_FLAG_INPUT;
}

void loom_set_output(loom_tensor *t) {
    t->flags |= LOOM_TENSOR_FLAG_OUTPUT;
}

void loom_set_param(loom_tensor *t) {
    t->flags |= LOOM_TENSOR_FLAG_PARAM;
}

#define LOOM__N_PARAM_WORDS ((int)(LOOM_MAX_OP_PARAMS / sizeof(int32_t)))

int32_t loom_get_op_params_i32(const loom_tensor *t, int i) {
    LOOM_ASSERT(i >= 0 && i < LOOM__N_PARAM_WORDS);
    return t->op_params[i];
}

float loom_get_op_params_f32(const loom_tensor *t, int i) {
    LOOM_ASSERT(i >= 0 && i < LOOM__N_PARAM_WORDS);
    float v;
    memcpy(&v, &t->op_params[i], sizeof v);
    return v;
}

void loom_set_op_params_i32(loom_tensor *t, int i, int32_t v) {
    LOOM_ASSERT(i >= 0 && i < LOOM__N_PARAM_WORDS);
    t->op_params[i] = v;
}

void loom_set_op_params_f32(loom_tensor *t, int i, float v) {
    LOOM_ASSERT(i >= 0 && i < LOOM__N_PARAM_WORDS);
    memcpy(&t->op_params[i], &v, sizeof v);
}

static void *loom__host_elem(const loom_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    LOOM_ASSERT(t->data != NULL);
    LOOM_ASSERT(i0 >= 0 && i0 < t->ne[0] && i1 >= 0 && i1 < t->ne[1] && i2 >= 0 && i2 < t->ne[2] &&
                i3 >= 0 && i3 < t->ne[3]);
    return loom__elem_ptr(t, i0, i1, i2, i3);
}

float loom_get_f32_nd(const loom_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    void *p = loom__host_elem(t, i0, i1, i2, i3);
    switch (t->type) {
    case LOOM_TYPE_F32: {
        float v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case LOOM_TYPE_F16: {
        uint16_t h;
        memcpy(&h, p, sizeof h);
        return loom__fp16_to_fp32(h);
    }
    case LOOM_TYPE_BF16: {
        uint16_t h;
        memcpy(&h, p, sizeof h);
        return loom__bf16_to_fp32(h);
    }
    case LOOM_TYPE_I32: {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return (float)v;
    }
    default:
        loom_abort(__FILE__, __LINE__, "get_f32_nd: type %s is not F32/F16/BF16/I32",
                   loom_type_name(t->type));
    }
}

void loom_set_f32_nd(loom_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v) {
    void *p = loom__host_elem(t, i0, i1, i2, i3);
    switch (t->type) {
    case LOOM_TYPE_F32:
        memcpy(p, &v, sizeof v);
        break;
    case LOOM_TYPE_F16: {
        uint16_t h = loom__fp32_to_fp16(v);
        memcpy(p, &h, sizeof h);
        break;
    }
    case LOOM_TYPE_BF16: {
        uint16_t h = loom__fp32_to_bf16(v);
        memcpy(p, &h, sizeof h);
        break;
    }
    case LOOM_TYPE_I32: {
        int32_t i = (int32_t)v;
        memcpy(p, &i, sizeof i);
        break;
    }
    default:
        loom_abort(__FILE__, __LINE__, "set_f32_nd: type %s is not F32/F16/BF16/I32",
                   loom_type_name(t->type));
    }
}

const char *loom__shape_str(const loom_tensor *t, char *buf, size_t size) {
    snprintf(buf, size, "[%lld, %lld, %lld, %lld]", (long long)t->ne[0], (long long)t->ne[1],
             (long long)t->ne[2], (long long)t->ne[3]);
    return buf;
}

void loom_tensor_describe(const loom_tensor *t, char *buf, size_t size) {
    if (!buf || size == 0) return;
    if (!t) {
        snprintf(buf, size, "(null)");
        return;
    }
    char shape[96];
    snprintf(buf, size, "%s %s %s", t->name[0] ? t->name : "(unnamed)",
             loom__shape_str(t, shape, sizeof shape), loom_type_name(t->type));
}
