/*
 * Data movement kernels: DUP / CONT / CPY (with type conversion), GET_ROWS, SET_ROWS and
 * CONCAT. Sources may be any strided view; elements move in row-major order of the
 * source into row-major order of the destination (which may itself be a strided view for
 * CPY and SET_ROWS). Threads split the destination rows.
 */
#include "backends/cpu/cpu-impl.h"

/* Destination rows (i1, i2, i3) from a flat row index. */
static void unflatten_row(const loom_tensor *t, int64_t r, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = r % t->ne[1];
    *i2 = (r / t->ne[1]) % t->ne[2];
    *i3 = r / (t->ne[1] * t->ne[2]);
}

/* Elements [e, e + n) of src in row-major order, as f32. */
static void gather_f32(const loom_tensor *src, int64_t e, int64_t n, float *y,
                       const loom__cpu_simd *simd) {
    const int64_t ne0 = src->ne[0];
    while (n > 0) {
        int64_t i0 = e % ne0, i1, i2, i3;
        unflatten_row(src, e / ne0, &i1, &i2, &i3);
        int64_t take = ne0 - i0 < n ? ne0 - i0 : n;
        const void *row = loom__at(src, 0, i1, i2, i3);
        if (src->type == LOOM_TYPE_F16 && src->nb[0] == sizeof(uint16_t))
            simd->f16_to_f32((const uint16_t *)row + i0, y, take);
        else
            loom__cpu_row_to_f32(src->type, row, src->nb[0], i0, take, y);
        y += take;
        e += take;
        n -= take;
    }
}

/* Units (elements, or blocks for quantised types) [e, e + n) of src in row-major order,
 * copied raw into y (unit-contiguous). e and n count elements (block multiples). */
static void gather_raw(const loom_tensor *src, int64_t e, int64_t n, char *y) {
    const int64_t ne0 = src->ne[0];
    const int64_t blck = loom_blck_size(src->type);
    const size_t usize = loom_type_size(src->type);
    while (n > 0) {
        int64_t i0 = e % ne0, i1, i2, i3;
        unflatten_row(src, e / ne0, &i1, &i2, &i3);
        int64_t take = ne0 - i0 < n ? ne0 - i0 : n;
        const char *row = loom__at(src, 0, i1, i2, i3);
        int64_t u0 = i0 / blck, un = take / blck;
        if (src->nb[0] == usize) {
            memcpy(y, row + u0 * usize, (size_t)un * usize);
        } else {
            for (int64_t u = 0; u < un; u++)
                memcpy(y + u * usize, row + (u0 + u) * (int64_t)src->nb[0], usize);
        }
        y += un * usize;
        e += take;
        n -= take;
    }
}

void loom__cpu_op_dup(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *src = dst->src[0];
    const int64_t ne0 = dst->ne[0];
    const int64_t nrows = loom_nrows(dst);
    const size_t usize = loom_type_size(dst->type);
    const int64_t blck = loom_blck_size(dst->type);

    if (src->type == dst->type && loom_is_contiguous(src) && loom_is_contiguous(dst)) {
        /* plain bytes, split evenly */
        size_t n = loom_nbytes(dst);
        int64_t b0, b1;
        loom__range((int64_t)n, p->ith, p->nth, &b0, &b1);
        if (b1 > b0)
            memcpy((char *)dst->data + b0, (const char *)src->data + b0, (size_t)(b1 - b0));
        return;
    }

    int64_t r0, r1;
    loom__range(nrows, p->ith, p->nth, &r0, &r1);
    float *tmp = p->wthread;
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten_row(dst, r, &i1, &i2, &i3);
        char *drow = loom__at(dst, 0, i1, i2, i3);
        if (src->type == dst->type) {
            if (dst->nb[0] == usize) {
                gather_raw(src, r * ne0, ne0, drow);
            } else {
                char *raw = p->wthread;
                gather_raw(src, r * ne0, ne0, raw);
                for (int64_t u = 0; u < ne0 / blck; u++)
                    memcpy(drow + u * (int64_t)dst->nb[0], raw + u * usize, usize);
            }
            continue;
        }
        gather_f32(src, r * ne0, ne0, tmp, p->simd);
        if (dst->type == LOOM_TYPE_F16 && dst->nb[0] == sizeof(uint16_t))
            p->simd->f32_to_f16(tmp, (uint16_t *)drow, ne0);
        else
            loom__cpu_row_from_f32(dst->type, tmp, drow, dst->nb[0], ne0);
    }
}

/* ---------------------------------------------------------------- get_rows */

static int64_t read_index(const loom_tensor *ids, int64_t i0, int64_t i1, int64_t i2) {
    const void *q = loom__at(ids, i0, i1, i2, 0);
    if (ids->type == LOOM_TYPE_I64) {
        int64_t v;
        memcpy(&v, q, sizeof v);
        return v;
    }
    int32_t v;
    memcpy(&v, q, sizeof v);
    return v;
}

void loom__cpu_op_get_rows(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *ids = dst->src[1];
    const int64_t n = a->ne[0], R = a->ne[1];
    const int64_t X = ids->ne[0], B1 = ids->ne[1];
    const int64_t nrows = X * B1 * ids->ne[2];
    int64_t r0, r1;
    loom__range(nrows, p->ith, p->nth, &r0, &r1);
    float *tmp = p->wthread;
    for (int64_t r = r0; r < r1; r++) {
        int64_t x = r % X, i1 = (r / X) % B1, i2 = r / (X * B1);
        int64_t row = read_index(ids, x, i1, i2);
        if (row < 0 || row >= R) {
            loom__cpu_fail(p, LOOM_ERR_INVALID_ARG,
                           "GET_ROWS '%s': row index %lld (ids[%lld, %lld, %lld]) out of range "
                           "[0, %lld)",
                           loom__cpu_name(dst), (long long)row, (long long)x, (long long)i1,
                           (long long)i2, (long long)R);
            return;
        }
        const char *srow = loom__at(a, 0, row, i1 % a->ne[2], i2 % a->ne[3]);
        char *drow = loom__at(dst, 0, x, i1, i2);
        if (a->type == LOOM_TYPE_I32) {
            for (int64_t i = 0; i < n; i++)
                memcpy(drow + i * (int64_t)dst->nb[0], srow + i * (int64_t)a->nb[0],
                       sizeof(int32_t));
            continue;
        }
        float *y = dst->nb[0] == sizeof(float) ? (float *)drow : tmp;
        if (a->type == LOOM_TYPE_F16 && a->nb[0] == sizeof(uint16_t))
            p->simd->f16_to_f32((const uint16_t *)srow, y, n);
        else
            loom__cpu_row_to_f32(a->type, srow, a->nb[0], 0, n, y);
        if (y == tmp) loom__cpu_row_from_f32(LOOM_TYPE_F32, tmp, drow, dst->nb[0], n);
    }
}

/* ---------------------------------------------------------------- set_rows */

void loom__cpu_op_set_rows(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *b = dst->src[0], *ids = dst->src[1];
    const int64_t n = dst->ne[0], R = dst->ne[1];
    const int64_t X = b->ne[1], B2 = b->ne[2], B3 = b->ne[3];
    const int64_t nrows = X * dst->ne[2] * dst->ne[3];
    int64_t r0, r1;
    loom__range(nrows, p->ith, p->nth, &r0, &r1);
    float *tmp = p->wthread;
    for (int64_t r = r0; r < r1; r++) {
        int64_t x = r % X, i2 = (r / X) % dst->ne[2], i3 = r / (X * dst->ne[2]);
        int64_t row = read_index(ids, x, i2 % B2, i3 % B3);
        if (row < 0 || row >= R) {
            loom__cpu_fail(p, LOOM_ERR_INVALID_ARG,
                           "SET_ROWS '%s': row index %lld (ids[%lld, %lld, %lld]) out of range "
                           "[0, %lld)",
                           loom__cpu_name(dst), (long long)row, (long long)x, (long long)(i2 % B2),
                           (long long)(i3 % B3), (long long)R);
            return;
        }
        const char *srow = loom__at(b, 0, x, i2 % B2, i3 % B3);
        char *drow = loom__at(dst, 0, row, i2, i3);
        const float *v = (const float *)srow;
        if (b->nb[0] != sizeof(float)) {
            loom__cpu_row_to_f32(LOOM_TYPE_F32, srow, b->nb[0], 0, n, tmp);
            v = tmp;
        }
        if (dst->type == LOOM_TYPE_F16 && dst->nb[0] == sizeof(uint16_t))
            p->simd->f32_to_f16(v, (uint16_t *)drow, n);
        else
            loom__cpu_row_from_f32(dst->type, v, drow, dst->nb[0], n);
    }
}

/* ---------------------------------------------------------------- concat */

void loom__cpu_op_concat(const loom__cpu_params *p, loom_tensor *dst) {
    const loom_tensor *a = dst->src[0], *b = dst->src[1];
    const int dim = loom_get_op_params_i32(dst, 0);
    const size_t es = loom_type_size(dst->type);
    const int64_t nrows = loom_nrows(dst);
    int64_t r0, r1;
    loom__range(nrows, p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i[4] = {0, 0, 0, 0};
        unflatten_row(dst, r, &i[1], &i[2], &i[3]);
        char *drow = loom__at(dst, 0, i[1], i[2], i[3]);
        if (dim == 0) {
            const char *ra = loom__at(a, 0, i[1], i[2], i[3]);
            const char *rb = loom__at(b, 0, i[1], i[2], i[3]);
            for (int64_t k = 0; k < a->ne[0]; k++)
                memcpy(drow + k * (int64_t)dst->nb[0], ra + k * (int64_t)a->nb[0], es);
            for (int64_t k = 0; k < b->ne[0]; k++)
                memcpy(drow + (a->ne[0] + k) * (int64_t)dst->nb[0], rb + k * (int64_t)b->nb[0], es);
            continue;
        }
        const loom_tensor *s = a;
        if (i[dim] >= a->ne[dim]) {
            s = b;
            i[dim] -= a->ne[dim];
        }
        const char *rs = loom__at(s, 0, i[1], i[2], i[3]);
        for (int64_t k = 0; k < dst->ne[0]; k++)
            memcpy(drow + k * (int64_t)dst->nb[0], rs + k * (int64_t)s->nb[0], es);
    }
}
