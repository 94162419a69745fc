/*
 * Elementwise F32 kernels: ADD/SUB/MUL/DIV with broadcasting, ADD_ID, the one-input maps
 * (SCALE, SQR, SQRT, CLAMP, UNARY silu/gelu/relu), GLU (split and fused) and FILL.
 *
 * Threads split rows. Contiguous rows go through the SIMD table's vector routines (add,
 * mul, scale, silu, swiglu); strided rows take a plain per-element loop. The destination
 * may alias the first source with the same layout (in-place), which every loop allows.
 */
#include "backends/cpu/cpu-impl.h"

static float gelu1(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static float silu1(float x) {
    return x / (1.0f + expf(-x));
}

static void row_of(const loom_tensor *t, int64_t r, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = r % t->ne[1];
    *i2 = (r / t->ne[1]) % t->ne[2];
    *i3 = r / (t->ne[1] * t->ne[2]);
}

#define EL(base, i, nb) (*(float *)((char *)(base) + (i) * (int64_t)(nb)))
#define CEL(base, i, nb) (*(const float *)((const char *)(base) + (i) * (int64_t)(nb)))

/* ---------------------------------------------------------------- binary */

static float apply_binary(loom_op op, float x, float y) {
    switch (op) {
    case LOOM_OP_ADD:
        return x + y;
    case LOOM_OP_SUB:
        return x - y;
    case LOOM_OP_MUL:
        return x * y;
    default:
        return x / y;
    }
}

static void vec_binary(const loom__cpu_simd *simd, loom_op op, int64_t n, float *z, const float *x,
                       const float *y) {
    switch (op) {
    case LOOM_OP_ADD:
        simd->vec_add(n, z, x, y);
        break;
    case LOOM_OP_MUL:
        simd->vec_mul(n, z, x, y);
        break;
    case LOOM_OP_SUB:
        for (int64_t i = 0; i < n; i++)
            z[i] = x[i] - y[i];
        break;
    default:
        for (int64_t i = 0; i < n; i++)
            z[i] = x[i] / y[i];
        break;
    }
}

void loom__cpu_op_binary(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t ne0 = dst->ne[0], bne0 = b->ne[0];
    const bool contig =
        a->nb[0] == sizeof(float) && b->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float);
    int64_t r0, r1;
    loom__range(loom_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_of(dst, r, &i1, &i2, &i3);
        float *z = loom__at(dst, 0, i1, i2, i3);
        const float *x = loom__at(a, 0, i1, i2, i3);
        const float *y = loom__at(b, 0, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        if (contig) {
            if (bne0 == 1) {
                float v = y[0];
                for (int64_t i = 0; i < ne0; i++)
                    z[i] = apply_binary(dst->op, x[i], v);
            } else {
                for (int64_t k = 0; k < ne0; k += bne0)
                    vec_binary(p->simd, dst->op, bne0, z + k, x + k, y);
            }
        } else {
            for (int64_t i = 0; i < ne0; i++)
                EL(z, i, dst->nb[0]) =
                    apply_binary(dst->op, CEL(x, i, a->nb[0]), CEL(y, i % bne0, b->nb[0]));
        }
    }
}

/* ---------------------------------------------------------------- add_id */

void loom__cpu_op_add_id(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1], *ids = dst->src[2];
    const int64_t n = dst->ne[0], E = b->ne[1];
    int64_t r0, r1;
    loom__range(loom_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t u, t, i3;
        row_of(dst, r, &u, &t, &i3);
        int32_t id;
        memcpy(&id, loom__at(ids, u, t, 0, 0), sizeof id);
        if (id < 0 || id >= E) {
            loom__cpu_fail(p, LOOM_ERR_INVALID_ARG,
                           "ADD_ID '%s': expert id %d (ids[%lld, %lld]) out of range [0, %lld)",
                           loom__cpu_name(dst), id, (long long)u, (long long)t, (long long)E);
            return;
        }
        float *z = loom__at(dst, 0, u, t, i3);
        const float *x = loom__at(a, 0, u, t, i3);
        const float *y = loom__at(b, 0, id, 0, 0);
        if (a->nb[0] == sizeof(float) && b->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float))
            p->simd->vec_add(n, z, x, y);
        else
            for (int64_t i = 0; i < n; i++)
                EL(z, i, dst->nb[0]) = CEL(x, i, a->nb[0]) + CEL(y, i, b->nb[0]);
    }
}

/* ---------------------------------------------------------------- one-input maps */

typedef struct map_args {
    loom_op op;
    int unary;
    float f0, f1;
} map_args;

static float apply_map(const map_args *m, float x) {
    switch (m->op) {
    case LOOM_OP_SCALE:
        return x * m->f0 + m->f1;
    case LOOM_OP_SQR:
        return x * x;
    case LOOM_OP_SQRT:
        return sqrtf(x);
    case LOOM_OP_CLAMP:
        return fminf(fmaxf(x, m->f0), m->f1);
    default:
        switch (m->unary) {
        case LOOM_UNARY_SILU:
            return silu1(x);
        case LOOM_UNARY_GELU:
            return gelu1(x);
        default:
            return x > 0.0f ? x : 0.0f;
        }
    }
}

void loom__cpu_op_unary_map(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0];
    map_args m = {.op = dst->op, .unary = -1, .f0 = 0.0f, .f1 = 0.0f};
    if (dst->op == LOOM_OP_SCALE || dst->op == LOOM_OP_CLAMP) {
        m.f0 = loom_get_op_params_f32(dst, 0);
        m.f1 = loom_get_op_params_f32(dst, 1);
    }
    if (dst->op == LOOM_OP_UNARY) m.unary = loom_get_op_params_i32(dst, 0);
    const int64_t n = dst->ne[0];
    const bool contig = a->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float);
    int64_t r0, r1;
    loom__range(loom_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_of(dst, r, &i1, &i2, &i3);
        float *y = loom__at(dst, 0, i1, i2, i3);
        const float *x = loom__at(a, 0, i1, i2, i3);
        if (contig && m.op == LOOM_OP_SCALE) {
            p->simd->vec_scale(n, y, x, m.f0, m.f1);
        } else if (contig && m.op == LOOM_OP_UNARY && m.unary == LOOM_UNARY_SILU) {
            p->simd->vec_silu(n, y, x);
        } else if (contig) {
            for (int64_t i = 0; i < n; i++)
                y[i] = apply_map(&m, x[i]);
        } else {
            for (int64_t i = 0; i < n; i++)
                EL(y, i, dst->nb[0]) = apply_map(&m, CEL(x, i, a->nb[0]));
        }
    }
}

/* ---------------------------------------------------------------- glu */

void loom__cpu_op_glu(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const int op = loom_get_op_params_i32(dst, 0);
    const bool swapped = loom_get_op_params_i32(dst, 1) != 0;
    const int64_t n = dst->ne[0];
    int64_t r0, r1;
    loom__range(loom_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_of(dst, r, &i1, &i2, &i3);
        float *y = loom__at(dst, 0, i1, i2, i3);
        const char *x, *g;
        size_t xs, gs;
        if (b) {
            const loom_tensor *tx = swapped ? b : a, *tg = swapped ? a : b;
            x = loom__at(tx, 0, i1, i2, i3);
            g = loom__at(tg, 0, i1, i2, i3);
            xs = tx->nb[0];
            gs = tg->nb[0];
        } else {
            const char *row = loom__at(a, 0, i1, i2, i3);
            const char *lo = row, *hi = row + n * (int64_t)a->nb[0];
            x = swapped ? hi : lo;
            g = swapped ? lo : hi;
            xs = gs = a->nb[0];
        }
        if (op == LOOM_GLU_SWIGLU && xs == sizeof(float) && gs == sizeof(float) &&
            dst->nb[0] == sizeof(float)) {
            p->simd->vec_swiglu(n, y, (const float *)x, (const float *)g);
            continue;
        }
        for (int64_t i = 0; i < n; i++) {
            float xv = CEL(x, i, xs), gv = CEL(g, i, gs);
            float act = op == LOOM_GLU_SWIGLU ? silu1(xv) : gelu1(xv);
            EL(y, i, dst->nb[0]) = act * gv;
        }
    }
}

/* ---------------------------------------------------------------- fill */

void loom__cpu_op_fill(const loom__cpu_params *p, loom_tensor *dst) {
    const float v = loom_get_op_params_f32(dst, 0);
    int64_t r0, r1;
    loom__range(loom_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        row_of(dst, r, &i1, &i2, &i3);
        float *y = loom__at(dst, 0, i1, i2, i3);
        for (int64_t i = 0; i < dst->ne[0]; i++)
            EL(y, i, dst->nb[0]) = v;
    }
}
