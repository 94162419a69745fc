/*
 * The op/type contract of docs/ops.md as a predicate: which op and type combinations a
 * backend implementing every op must accept. The CPU backend (the oracle) supports exactly
 * these; other backends start from it and narrow it (CUDA limits flash-attention head
 * sizes).
 */
#include "backends/backend-impl.h"


static bool is_float(loom_type t) {
    return t == LOOM_TYPE_F32 || t == LOOM_TYPE_F16 || t == LOOM_TYPE_BF16;
}

/* Block-quantised weight types (every quantised loom type but the activation-only Q8_1
 * and Q8_K). */
static bool is_quant(loom_type t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t);
    return tr && tr->is_quantized && tr->is_weight;
}

/* Quantised types a copy or SET_ROWS may write (a quantised KV cache). */
bool loom__op_quant_dst(loom_type t) {
    return t == LOOM_TYPE_Q8_0 || t == LOOM_TYPE_Q4_0 || t == LOOM_TYPE_Q4_1 ||
           t == LOOM_TYPE_Q5_0 || t == LOOM_TYPE_Q5_1 || t == LOOM_TYPE_IQ4_NL;
}

/* Types the matmul kernels take as weights. */
static bool is_mm_weight(loom_type t) {
    return is_float(t) || is_quant(t);
}

/* Quantised tensors must keep whole blocks contiguous along dim 0. */
static bool blocks_ok(const loom_tensor *t) {
    const loom_type_traits *tr = loom_type_traits_get((int)t->type);
    if (!tr || !tr->is_quantized) return true;
    return t->nb[0] == tr->type_size && t->ne[0] % tr->blck_size == 0;
}

static bool all_f32(const loom_tensor *op, int n_src) {
    if (op->type != LOOM_TYPE_F32) return false;
    for (int i = 0; i < n_src; i++)
        if (!op->src[i] || op->src[i]->type != LOOM_TYPE_F32) return false;
    return true;
}

static bool cpy_types_ok(const loom_tensor *src, const loom_tensor *dst) {
    if (!loom_type_is_valid((int)src->type) || !loom_type_is_valid((int)dst->type)) return false;
    if (!blocks_ok(src) || !blocks_ok(dst)) return false;
    if (src->type == dst->type) return true;
    if (src->type == LOOM_TYPE_F32)
        return dst->type == LOOM_TYPE_F16 || dst->type == LOOM_TYPE_BF16 ||
               loom__op_quant_dst(dst->type);
    if (dst->type == LOOM_TYPE_F32)
        return src->type == LOOM_TYPE_F16 || src->type == LOOM_TYPE_BF16 || is_quant(src->type);
    return false;
}

bool loom__op_types_ok(const loom_tensor *op) {
    if (!op) return false;
    const loom_tensor *a = op->src[0], *b = op->src[1], *c = op->src[2];
    switch (op->op) {
    case LOOM_OP_NONE:
    case LOOM_OP_RESHAPE:
    case LOOM_OP_VIEW:
    case LOOM_OP_PERMUTE:
    case LOOM_OP_TRANSPOSE:
        return true;
    case LOOM_OP_DUP:
    case LOOM_OP_CONT:
        return a && a->type == op->type && cpy_types_ok(a, op);
    case LOOM_OP_CPY: /* src[1] is the destination b, or absent for a cast */
        return a && (!b || b->type == op->type) && cpy_types_ok(a, op);
    case LOOM_OP_ADD:
    case LOOM_OP_SUB:
    case LOOM_OP_MUL:
    case LOOM_OP_DIV:
        return all_f32(op, 2);
    case LOOM_OP_ADD_ID:
        return all_f32(op, 2) && c && c->type == LOOM_TYPE_I32;
    case LOOM_OP_SCALE:
    case LOOM_OP_SQR:
    case LOOM_OP_SQRT:
    case LOOM_OP_SUM_ROWS:
    case LOOM_OP_MEAN:
    case LOOM_OP_NORM:
    case LOOM_OP_RMS_NORM:
    case LOOM_OP_CLAMP:
        return all_f32(op, 1);
    case LOOM_OP_UNARY: {
        int u = loom_get_op_params_i32(op, 0);
        return all_f32(op, 1) && u >= 0 && u < LOOM_UNARY_COUNT;
    }
    case LOOM_OP_GLU: {
        int g = loom_get_op_params_i32(op, 0);
        return all_f32(op, 1) && (!b || b->type == LOOM_TYPE_F32) && g >= 0 && g < LOOM_GLU_COUNT;
    }
    case LOOM_OP_ARGMAX:
    case LOOM_OP_ARGSORT:
    case LOOM_OP_TOP_K:
        return a && a->type == LOOM_TYPE_F32 && op->type == LOOM_TYPE_I32;
    case LOOM_OP_FILL:
        return op->type == LOOM_TYPE_F32;
    case LOOM_OP_MUL_MAT:
        return a && b && is_mm_weight(a->type) && blocks_ok(a) && b->type == LOOM_TYPE_F32 &&
               op->type == LOOM_TYPE_F32;
    case LOOM_OP_MUL_MAT_ID:
        return a && b && c && is_mm_weight(a->type) && blocks_ok(a) && b->type == LOOM_TYPE_F32 &&
               c->type == LOOM_TYPE_I32 && op->type == LOOM_TYPE_F32;
    case LOOM_OP_GET_ROWS:
        if (!a || !b || b->type != LOOM_TYPE_I32) return false;
        if (a->type == LOOM_TYPE_I32) return op->type == LOOM_TYPE_I32;
        return is_mm_weight(a->type) && blocks_ok(a) && op->type == LOOM_TYPE_F32;
    case LOOM_OP_SET_ROWS:
        return a && b && a->type == LOOM_TYPE_F32 &&
               (b->type == LOOM_TYPE_I32 || b->type == LOOM_TYPE_I64) &&
               (is_float(op->type) || loom__op_quant_dst(op->type)) && blocks_ok(op);
    case LOOM_OP_SOFT_MAX:
        return a && a->type == LOOM_TYPE_F32 && op->type == LOOM_TYPE_F32 &&
               (!b || b->type == LOOM_TYPE_F32 || b->type == LOOM_TYPE_F16) &&
               (!c || c->type == LOOM_TYPE_F32);
    case LOOM_OP_ROPE: {
        int mode = loom_get_op_params_i32(op, 1);
        return a && b && a->type == LOOM_TYPE_F32 && op->type == LOOM_TYPE_F32 &&
               b->type == LOOM_TYPE_I32 && (!c || c->type == LOOM_TYPE_F32) &&
               (mode == LOOM_ROPE_TYPE_NORMAL || mode == LOOM_ROPE_TYPE_NEOX);
    }
    case LOOM_OP_FLASH_ATTN_EXT: {
        const loom_tensor *mask = op->src[3], *sinks = op->src[4];
        return a && b && c && a->type == LOOM_TYPE_F32 && op->type == LOOM_TYPE_F32 &&
               (b->type == LOOM_TYPE_F32 || b->type == LOOM_TYPE_F16) &&
               (c->type == LOOM_TYPE_F32 || c->type == LOOM_TYPE_F16) &&
               (!mask || mask->type == LOOM_TYPE_F32 || mask->type == LOOM_TYPE_F16) &&
               (!sinks || sinks->type == LOOM_TYPE_F32);
    }
    case LOOM_OP_CONCAT:
        return a && b && a->type == b->type && op->type == a->type &&
               loom_type_is_valid((int)a->type) &&
               !loom_type_traits_get((int)a->type)->is_quantized;
    default:
        return false;
    }
}
