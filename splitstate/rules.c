/*
 * The op rule table of the meta device: for every op of docs/ops.md, the split state of
 * the result given the states of its sources (already resolved with assume-sync), or a
 * refusal naming op, tensor and the states that do not fit. It is a whitelist: an op
 * without a rule is refused, so the meta device's supports_op says no and the scheduler
 * places the op elsewhere.
 *
 * The heart is MUL_MAT: weight split on its output rows (axis 1) x mirrored activations ->
 * output split on axis 0 (column parallel, free); weight split on K (axis 0) x activations
 * split on K the same way -> PARTIAL (row parallel: needs an AllReduce). Per-row ops refuse
 * a split of the row; elementwise ops need both operands split the same way, or the second
 * one mirrored and broadcast along the split axis; views, reshapes and copies move the
 * split to wherever it lands (map.c). PARTIAL sources (leafs and their views only: computed
 * PARTIAL tensors are reduced before use) are accepted only by linear ops, and never mixed
 * with MIRRORED addends (that would count the mirrored operand N times).
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "splitstate/splitstate-impl.h"

typedef struct rule {
    const loom_tensor *t;
    const loom_split_state *const *src;
    const loom_split_state *dst;
    int n;
    loom_split_state *out;
    char op[32];
} rule;

const char *loom__split_op_lower(loom_op op, char *buf, size_t size) {
    const char *name = loom_op_name(op);
    size_t i = 0;
    for (; name && name[i] && i + 1 < size; i++)
        buf[i] = (char)tolower((unsigned char)name[i]);
    if (size) buf[i < size ? i : size - 1] = '\0';
    return buf;
}

static const char *tname(const loom_tensor *t) {
    return t && t->name[0] ? t->name : "(unnamed)";
}

/* "'k-0' AXIS_2 [4,4]" for source i (or the destination when i < 0) */
static const char *sdesc(const rule *r, int i, char *buf, size_t size) {
    const loom_tensor *t = i >= 0 ? r->t->src[i] : r->t->view_src;
    const loom_split_state *s = i >= 0 ? r->src[i] : r->dst;
    char st[256];
    loom_split_state_format(s, st, sizeof st);
    snprintf(buf, size, "'%s' %s", tname(t), st);
    return buf;
}

static loom_status fail(const rule *r, const char *fmt, ...) LOOM_PRINTF(2, 3);
static loom_status fail(const rule *r, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return loom_error(LOOM_ERR_UNSUPPORTED, "%s '%s': %s", r->op, tname(r->t), msg);
}

#define S(i) (r->src[i])
#define T(i) (r->t->src[i])
#define IS_M(s) ((s)->axis == LOOM_SPLIT_MIRRORED)
#define IS_P(s) ((s)->axis == LOOM_SPLIT_PARTIAL)
#define IS_DIM(s) (loom_split_axis_is_dim((s)->axis))
#define D1 char d1_[400]
#define D2 char d2_[400]
#define DSC1(i) sdesc(r, i, d1_, sizeof d1_)
#define DSC2(i) sdesc(r, i, d2_, sizeof d2_)

static loom_status set(rule *r, const loom_split_state *s) {
    *r->out = *s;
    return LOOM_OK;
}

static loom_status set_axis(rule *r, const loom_split_state *s, int axis) {
    *r->out = *s;
    r->out->axis = (loom_split_axis)axis;
    return LOOM_OK;
}

static loom_status set_kind(rule *r, loom_split_axis axis) {
    loom_split_state_init(r->out, axis, r->n);
    return LOOM_OK;
}

static bool same(const loom_split_state *a, const loom_split_state *b) {
    return loom_split_state_equal(a, b);
}

static loom_status not_linear(rule *r, int i) {
    D1;
    return fail(r,
                "source %s is a sum over devices and %s is not linear; it needs the reduced "
                "value (only computed tensors are reduced before use)",
                DSC1(i), r->op);
}

/* ---------------------------------------------------------------- geometry helpers */

/* Contiguous strides in elements for a logical reshape. */
static void virtual_strides(const int64_t ne[4], int64_t nb[4]) {
    nb[0] = 1;
    for (int d = 1; d < 4; d++)
        nb[d] = nb[d - 1] * ne[d - 1];
}

/* The state of a row-major re-interpretation of source `si` (shape src->ne) as shape `ne`
 * of type `type` (RESHAPE, CONT, CPY). */
static loom_status reshape_to(rule *r, int si, const int64_t ne[4], loom_type type,
                              loom_split_state *res) {
    const loom_split_state *s = S(si);
    if (!IS_DIM(s)) {
        *res = *s;
        return LOOM_OK;
    }
    const loom_tensor *a = T(si);
    int64_t a_nb[4], v_nb[4];
    virtual_strides(a->ne, a_nb);
    virtual_strides(ne, v_nb);
    char why[512];
    if (loom__split_map(a->ne, a_nb, s, ne, v_nb, 0, res, why, sizeof why) != LOOM_OK) {
        D1;
        return fail(r,
                    "cannot reshape %s from [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                    "] to [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]: %s",
                    DSC1(si), a->ne[0], a->ne[1], a->ne[2], a->ne[3], ne[0], ne[1], ne[2], ne[3],
                    why);
    }
    int64_t blck = loom_blck_size(type);
    if (res->axis == LOOM_SPLIT_AXIS_0 && blck > 1 && !loom__split_counts_multiple_of(res, blck)) {
        char st[256];
        loom_split_state_format(res, st, sizeof st);
        return fail(r,
                    "the result would be %s, but a %s row splits only at %" PRId64
                    "-element block boundaries",
                    st, loom_type_name(type), blck);
    }
    return LOOM_OK;
}

/* Offset in bytes of view t from the first element of its source a. */
static bool view_rel(const loom_tensor *t, const loom_tensor *a, int64_t *rel) {
    if (t->view_src == a) {
        *rel = (int64_t)t->view_offs;
        return true;
    }
    if (a->view_src && a->view_src == t->view_src && t->view_offs >= a->view_offs) {
        *rel = (int64_t)(t->view_offs - a->view_offs);
        return true;
    }
    if (!t->view_src && !a->view_src) { /* an unplaced view: offset 0 */
        *rel = 0;
        return true;
    }
    return false;
}

/* ---------------------------------------------------------------- layout ops */

static loom_status rule_copy(rule *r) { /* DUP: same shape, same state */
    return set(r, S(0));
}

static loom_status rule_cont(rule *r) {
    loom_split_state res;
    loom_status st = reshape_to(r, 0, r->t->ne, r->t->type, &res);
    return st != LOOM_OK ? st : set(r, &res);
}

static loom_status rule_reshape(rule *r) {
    return rule_cont(r);
}

/* A split state with one segment occurring once: a device's part is one range along the
 * axis, so a whole tensor can be viewed down to it. */
static bool one_piece(const loom_split_state *s) {
    return s->n_segments == 1 && s->nr[0] == 1;
}

static loom_status rule_cpy(rule *r) {
    loom_split_state res;
    const loom_tensor *b = T(1);
    const int64_t *ne = b ? b->ne : r->t->ne;
    loom_status st = reshape_to(r, 0, ne, b ? b->type : r->t->type, &res);
    if (st != LOOM_OK) return st;
    if (!b || !S(1) || S(1)->axis == LOOM_SPLIT_NONE || same(S(1), &res)) return set(r, &res);
    /* a whole source (computed elsewhere, copied in) of the destination's shape: each
     * device copies its part of it */
    if (IS_M(S(0)) && IS_DIM(S(1)) && one_piece(S(1)) && memcmp(T(0)->ne, b->ne, sizeof b->ne) == 0)
        return set(r, S(1));
    D1;
    D2;
    char st_res[256];
    loom_split_state_format(&res, st_res, sizeof st_res);
    return fail(r,
                "copies %s (%s in the destination's shape) into %s; the destination must be "
                "distributed the same way (or have no state of its own)",
                DSC1(0), st_res, DSC2(1));
}

/* The state of the view r->t (geometry t->ne, t->nb) placed `rel` bytes into a, whose state
 * is s (split). `what` describes a for messages. */
static loom_status map_view(rule *r, const loom_tensor *a, const loom_split_state *s, int64_t rel,
                            const char *what, loom_split_state *res) {
    const loom_tensor *t = r->t;
    const int64_t blck = loom_blck_size(a->type);
    int64_t a_ne[4], a_nb[4], v_ne[4], v_nb[4];
    for (int d = 0; d < 4; d++) {
        a_ne[d] = a->ne[d];
        a_nb[d] = (int64_t)a->nb[d];
        v_ne[d] = t->ne[d];
        v_nb[d] = (int64_t)t->nb[d];
    }
    loom_split_state in = *s;
    if (blck > 1) { /* dimension 0 in whole blocks */
        if (a->ne[0] % blck || t->ne[0] % blck)
            return fail(r, "a %s view must keep whole blocks", loom_type_name(a->type));
        a_ne[0] /= blck;
        v_ne[0] /= blck;
        if (in.axis == LOOM_SPLIT_AXIS_0) {
            if (!loom__split_counts_multiple_of(&in, blck))
                return fail(r, "%s splits inside a %s block", what, loom_type_name(a->type));
            loom__split_scale(&in, 0, blck);
        }
    }
    char why[512];
    if (loom__split_map(a_ne, a_nb, &in, v_ne, v_nb, rel, res, why, sizeof why) != LOOM_OK)
        return fail(r,
                    "cannot map the split of %s into the view [%" PRId64 ", %" PRId64 ", %" PRId64
                    ", %" PRId64 "] at offset %" PRId64 ": %s",
                    what, t->ne[0], t->ne[1], t->ne[2], t->ne[3], rel, why);
    if (blck > 1 && res->axis == LOOM_SPLIT_AXIS_0) loom__split_scale(res, blck, 0);
    return LOOM_OK;
}

static loom_status rule_view(rule *r) {
    const loom_split_state *s = S(0);
    if (!IS_DIM(s)) return set(r, s);
    int64_t rel;
    D1;
    if (!view_rel(r->t, T(0), &rel))
        return fail(r, "cannot place the view within its source %s", DSC1(0));
    loom_split_state res;
    loom_status st = map_view(r, T(0), s, rel, DSC1(0), &res);
    return st != LOOM_OK ? st : set(r, &res);
}

static loom_status rule_permute(rule *r) {
    const loom_split_state *s = S(0);
    if (!IS_DIM(s)) return set(r, s);
    int axis = (int)s->axis;
    int to;
    if (r->t->op == LOOM_OP_TRANSPOSE) {
        to = axis == 0 ? 1 : axis == 1 ? 0 : axis;
    } else {
        to = loom_get_op_params_i32(r->t, axis);
        if (to < 0 || to > 3) return fail(r, "bad permutation parameter %d", to);
    }
    return set_axis(r, s, to);
}

static loom_status rule_concat(rule *r) {
    const loom_split_state *a = S(0), *b = S(1);
    int dim = loom_get_op_params_i32(r->t, 0);
    D1;
    D2;
    if (IS_M(a) && IS_M(b)) return set_kind(r, LOOM_SPLIT_MIRRORED);
    if (IS_P(a) && IS_P(b)) return set_kind(r, LOOM_SPLIT_PARTIAL);
    if (IS_DIM(a) && IS_DIM(b) && a->axis == b->axis) {
        if ((int)a->axis != dim) {
            if (same(a, b)) return set(r, a);
            return fail(r, "%s and %s are split differently", DSC1(0), DSC2(1));
        }
        /* split along the concatenated axis: a's pieces, then b's */
        loom_split_state res = *a;
        for (int i = 0; i < b->n_segments; i++)
            if (loom__split_append(&res, b->ne[i], b->nr[i]) != LOOM_OK)
                return fail(r, "concatenating %s and %s needs more than %d segments", DSC1(0),
                            DSC2(1), LOOM_SPLIT_MAX_SEGMENTS);
        loom__split_normalize(&res);
        return set(r, &res);
    }
    return fail(r,
                "cannot concatenate %s and %s along axis %d: both must be split the same "
                "way, or both MIRRORED",
                DSC1(0), DSC2(1), dim);
}

/* ---------------------------------------------------------------- elementwise */

static loom_status rule_unary_like(rule *r) { /* SQR, SQRT, UNARY, CLAMP */
    if (IS_P(S(0))) return not_linear(r, 0);
    return set(r, S(0));
}

static loom_status rule_scale(rule *r) {
    if (IS_P(S(0)) && loom_get_op_params_f32(r->t, 1) != 0.0f) {
        D1;
        return fail(r,
                    "source %s is a sum over devices, and a scale with a bias (%g) is not "
                    "linear",
                    DSC1(0), (double)loom_get_op_params_f32(r->t, 1));
    }
    return set(r, S(0));
}

static loom_status rule_fill(rule *r) {
    if (IS_P(S(0))) return set_kind(r, LOOM_SPLIT_MIRRORED); /* values unused */
    return set(r, S(0));
}

static loom_status rule_binary(rule *r) {
    const loom_split_state *a = S(0), *b = S(1);
    const loom_tensor *ta = T(0), *tb = T(1);
    const loom_op op = r->t->op;
    const bool additive = op == LOOM_OP_ADD || op == LOOM_OP_SUB;
    D1;
    D2;
    if (IS_M(a) && IS_M(b)) return set_kind(r, LOOM_SPLIT_MIRRORED);
    if (IS_P(a) || IS_P(b)) {
        if (IS_P(a) && IS_P(b)) {
            if (additive) return set_kind(r, LOOM_SPLIT_PARTIAL);
            return fail(r, "%s and %s are both sums over devices; their product is not", DSC1(0),
                        DSC2(1));
        }
        const int pi = IS_P(a) ? 0 : 1, oi = 1 - pi;
        if (IS_M(S(oi))) {
            if (additive)
                return fail(r,
                            "adding %s to %s would count the MIRRORED operand %d times; "
                            "make both PARTIAL or both MIRRORED",
                            DSC1(pi), DSC2(oi), r->n);
            if (op == LOOM_OP_MUL || pi == 0) return set_kind(r, LOOM_SPLIT_PARTIAL);
            return fail(r, "dividing by %s, a sum over devices, is not linear", DSC1(pi));
        }
        return fail(r, "cannot combine %s with %s", DSC1(pi), DSC2(oi));
    }
    if (IS_DIM(a)) {
        const int k = (int)a->axis;
        if (IS_DIM(b)) {
            if (b->axis == a->axis && tb->ne[k] == ta->ne[k] && same(a, b)) return set(r, a);
            return fail(r, "a %s and b %s are split differently", DSC1(0), DSC2(1));
        }
        if (IS_M(b) && tb->ne[k] == 1) return set(r, a); /* broadcast along the split */
        return fail(r,
                    "a %s is split along axis %d but b %s has ne[%d] = %" PRId64
                    "; b must be split the same way (or broadcast along axis %d)",
                    DSC1(0), k, DSC2(1), k, tb->ne[k], k);
    }
    return fail(r, "a %s is not split but b %s is; a must be split the same way", DSC1(0), DSC2(1));
}

static loom_status rule_add_id(rule *r) {
    const loom_split_state *a = S(0), *b = S(1), *ids = S(2);
    D1;
    D2;
    if (!IS_M(ids) && !IS_DIM(ids)) return fail(r, "the expert ids %s must be MIRRORED", DSC1(2));
    if (IS_P(a) || IS_P(b)) {
        if (IS_P(a) && IS_P(b) && IS_M(ids)) return set_kind(r, LOOM_SPLIT_PARTIAL);
        if (IS_P(a) != IS_P(b) && (IS_M(a) || IS_M(b)))
            return fail(r,
                        "adding %s to %s would count the MIRRORED operand %d times; make the "
                        "bias MIRRORED (or both PARTIAL)",
                        DSC1(IS_P(b) ? 1 : 0), DSC2(IS_P(b) ? 0 : 1), r->n);
        return fail(r, "cannot combine %s with %s", DSC1(0), DSC2(1));
    }
    if (IS_M(a)) {
        if (IS_M(b) && IS_M(ids)) return set_kind(r, LOOM_SPLIT_MIRRORED);
        return fail(r, "a %s is MIRRORED, so the bias %s and the ids must be MIRRORED too", DSC1(0),
                    DSC2(1));
    }
    const int k = (int)a->axis;
    if (k == 0) {
        if (!IS_M(ids)) return fail(r, "the expert ids %s must be MIRRORED", DSC1(2));
        if (IS_DIM(b) && b->axis == LOOM_SPLIT_AXIS_0 && same(a, b)) return set(r, a);
        return fail(r,
                    "a %s is split along axis 0, so the bias %s must be split along axis 0 "
                    "the same way",
                    DSC1(0), DSC2(1));
    }
    if (!IS_M(b))
        return fail(r, "a %s is split along axis %d, so the bias %s must be MIRRORED", DSC1(0), k,
                    DSC2(1));
    if (k == 3) {
        if (IS_M(ids)) return set(r, a);
    } else if (IS_DIM(ids) && (int)ids->axis == k - 1) {
        loom_split_state x = *ids;
        x.axis = a->axis;
        if (same(&x, a)) return set(r, a);
    }
    return fail(r,
                "a %s is split along axis %d, so the ids %s must be split along axis %d the "
                "same way",
                DSC1(0), k, DSC2(2), k - 1);
}

static loom_status rule_glu(rule *r) {
    const loom_split_state *a = S(0);
    D1;
    D2;
    if (T(1)) { /* split form: act(a) * b */
        if (IS_P(a)) return not_linear(r, 0);
        if (IS_P(S(1))) return not_linear(r, 1);
        if (same(a, S(1))) return set(r, a);
        return fail(r, "%s and %s are split differently", DSC1(0), DSC2(1));
    }
    if (IS_P(a)) return not_linear(r, 0);
    if (a->axis != LOOM_SPLIT_AXIS_0) return set(r, a);
    /* fused form: both halves of every row must be split alike */
    const int64_t half = r->t->ne[0];
    loom_split_state x, g;
    if (loom_split_state_sub(a, 0, half, &x, NULL) != LOOM_OK ||
        loom_split_state_sub(a, half, half, &g, NULL) != LOOM_OK) {
        loom_clear_error();
        return fail(r, "cannot cut %s into its two halves", DSC1(0));
    }
    x.axis = g.axis = LOOM_SPLIT_AXIS_0;
    if (same(&x, &g)) return set(r, &x);
    char sx[256], sg[256];
    loom_split_state_format(&x, sx, sizeof sx);
    loom_split_state_format(&g, sg, sizeof sg);
    return fail(r,
                "the two halves of %s are split differently (x: %s, gate: %s); split each "
                "half as its own segment",
                DSC1(0), sx, sg);
}

/* ---------------------------------------------------------------- per-row ops */

static const char *row_what(loom_op op) {
    switch (op) {
    case LOOM_OP_NORM:
    case LOOM_OP_RMS_NORM:
        return "the normalised row";
    case LOOM_OP_SOFT_MAX:
        return "the softmax row";
    case LOOM_OP_ARGSORT:
        return "the sorted row";
    case LOOM_OP_TOP_K:
        return "the row top_k selects from";
    case LOOM_OP_ARGMAX:
        return "the row argmax searches";
    case LOOM_OP_SUM_ROWS:
        return "the summed row";
    case LOOM_OP_MEAN:
        return "the averaged row";
    default:
        return "the row";
    }
}

static loom_status rule_per_row(rule *r) {
    const loom_split_state *a = S(0);
    const loom_op op = r->t->op;
    if (a->axis == LOOM_SPLIT_AXIS_0)
        return fail(r, "cannot split along axis 0 (%s)", row_what(op));
    if (IS_P(a)) {
        if (op == LOOM_OP_SUM_ROWS || op == LOOM_OP_MEAN) return set(r, a);
        return not_linear(r, 0);
    }
    if (op == LOOM_OP_ARGMAX && IS_DIM(a)) /* [ne0, ne1] -> [ne1] */
        return set_axis(r, a, (int)a->axis - 1);
    return set(r, a);
}

static loom_status rule_soft_max(rule *r) {
    loom_status st = rule_per_row(r);
    if (st != LOOM_OK) return st;
    const loom_split_state *a = S(0), *mask = T(1) ? S(1) : NULL, *sinks = T(2) ? S(2) : NULL;
    const loom_tensor *tm = T(1);
    D1;
    D2;
    const int k = IS_DIM(a) ? (int)a->axis : -1;
    if (mask) {
        if (IS_P(mask)) return not_linear(r, 1);
        if (IS_DIM(mask)) {
            if (!(k >= 0 && mask->axis == a->axis && same(mask, a)))
                return fail(r, "the mask %s is split, but differently from the scores %s", DSC1(1),
                            DSC2(0));
        } else if (k == 1) {
            return fail(r,
                        "the scores %s are split along axis 1 (the queries), so the mask %s "
                        "must be split along axis 1 the same way",
                        DSC2(0), DSC1(1));
        } else if (k >= 2 && tm->ne[k] > 1) {
            return fail(r,
                        "the scores %s are split along axis %d, but the mask %s is not "
                        "broadcast along it (ne[%d] = %" PRId64 ")",
                        DSC2(0), k, DSC1(1), k, tm->ne[k]);
        }
    }
    if (sinks) {
        if (k == 2) {
            loom_split_state x = *a;
            x.axis = LOOM_SPLIT_AXIS_0;
            if (!same(sinks, &x))
                return fail(r,
                            "the scores %s are split on heads, so the sinks %s must be split "
                            "along axis 0 the same way",
                            DSC2(0), DSC1(2));
        } else if (!IS_M(sinks)) {
            return fail(r, "the sinks %s must be MIRRORED unless the heads are split", DSC1(2));
        }
    }
    if (k == 2 && loom_get_op_params_f32(r->t, 1) != 0.0f)
        return fail(r,
                    "ALiBi (max_bias %g) slopes depend on the global head index, so the heads "
                    "(axis 2) cannot be split",
                    (double)loom_get_op_params_f32(r->t, 1));
    return LOOM_OK;
}

static loom_status rule_rope(rule *r) {
    const loom_split_state *a = S(0), *pos = S(1);
    D1;
    D2;
    if (a->axis == LOOM_SPLIT_AXIS_0)
        return fail(r, "cannot split along axis 0 (the rotated head dimension)");
    if (T(2) && !IS_M(S(2))) return fail(r, "the frequency factors %s must be MIRRORED", DSC1(2));
    if (a->axis == LOOM_SPLIT_AXIS_2) {
        loom_split_state x = *a;
        x.axis = LOOM_SPLIT_AXIS_0;
        if (same(pos, &x)) return set(r, a);
        return fail(r,
                    "%s is split along axis 2 (the tokens), so the positions %s must be "
                    "split along axis 0 the same way",
                    DSC1(0), DSC2(1));
    }
    if (!IS_M(pos))
        return fail(r, "the positions %s must be MIRRORED (the tokens of %s are not split)",
                    DSC1(1), DSC2(0));
    return set(r, a); /* heads (axis 1), MIRRORED, or PARTIAL: rope is linear */
}

/* ---------------------------------------------------------------- matmuls and lookups */

static loom_status rule_mul_mat(rule *r) {
    const loom_split_state *a = S(0), *b = S(1);
    const loom_tensor *ta = T(0), *tb = T(1);
    D1;
    D2;
    if (IS_P(a) || IS_P(b)) {
        if (IS_P(a) && IS_M(b)) return set_kind(r, LOOM_SPLIT_PARTIAL);
        if (IS_M(a) && IS_P(b)) return set_kind(r, LOOM_SPLIT_PARTIAL);
        return fail(r, "cannot multiply %s by %s", DSC1(0), DSC2(1));
    }
    if (IS_M(a) && IS_M(b)) return set_kind(r, LOOM_SPLIT_MIRRORED);
    if (IS_M(a)) {
        switch (b->axis) {
        case LOOM_SPLIT_AXIS_0:
            return fail(r,
                        "b %s is split along K (axis 0), so a %s must be split along K the "
                        "same way",
                        DSC2(1), DSC1(0));
        case LOOM_SPLIT_AXIS_1:
            return set(r, b);
        case LOOM_SPLIT_AXIS_2:
        case LOOM_SPLIT_AXIS_3: {
            const int k = (int)b->axis;
            if (ta->ne[k] == 1) return set(r, b);
            return fail(r,
                        "b %s is split along axis %d but a %s has %" PRId64
                        " matrices along it; split a along axis %d too",
                        DSC2(1), k, DSC1(0), ta->ne[k], k);
        }
        default:
            break;
        }
    }
    if (IS_M(b)) {
        if (a->axis == LOOM_SPLIT_AXIS_1) return set_axis(r, a, 0); /* column parallel */
        /* row parallel with whole activations: each device multiplies its K-slice of the
         * weight by the same K-slice of b (the meta device views it), a partial sum */
        if (a->axis == LOOM_SPLIT_AXIS_0 && a->n_segments == 1 && a->nr[0] == 1)
            return set_kind(r, LOOM_SPLIT_PARTIAL);
        if (a->axis == LOOM_SPLIT_AXIS_0)
            return fail(r,
                        "a %s is split along K (axis 0) in several segments, so b %s must be "
                        "split along K the same way",
                        DSC1(0), DSC2(1));
        return fail(r, "a %s is split along axis %d, so b %s must be split along it too", DSC1(0),
                    (int)a->axis, DSC2(1));
    }
    /* both split */
    if (a->axis == LOOM_SPLIT_AXIS_0 && b->axis == LOOM_SPLIT_AXIS_0) {
        if (same(a, b)) return set_kind(r, LOOM_SPLIT_PARTIAL); /* row parallel */
        return fail(r, "the contraction dimension K is split differently in a %s and b %s", DSC1(0),
                    DSC2(1));
    }
    if (a->axis == b->axis && (a->axis == LOOM_SPLIT_AXIS_2 || a->axis == LOOM_SPLIT_AXIS_3)) {
        const int k = (int)a->axis;
        const int64_t ratio = ta->ne[k] ? tb->ne[k] / ta->ne[k] : 1;
        if (loom__split_scaled_equal(a, b, ratio)) return set(r, b);
        return fail(r,
                    "a %s and b %s are split along axis %d inconsistently (b has %" PRId64
                    " matrices per matrix of a)",
                    DSC1(0), DSC2(1), k, ratio);
    }
    return fail(r,
                "cannot multiply a %s by b %s: a 2D split (both operands split on their "
                "non-contracted axes) is not possible",
                DSC1(0), DSC2(1));
}

static loom_status rule_mul_mat_id(rule *r) {
    const loom_split_state *as = S(0), *b = S(1), *ids = S(2);
    D1;
    D2;
    if (IS_P(ids)) return not_linear(r, 2);
    if (IS_DIM(ids)) { /* tokens split: ids along axis 1, b and the result along axis 2 */
        loom_split_state x = *ids;
        x.axis = LOOM_SPLIT_AXIS_2;
        if (ids->axis == LOOM_SPLIT_AXIS_1 && IS_M(as) && IS_DIM(b) &&
            b->axis == LOOM_SPLIT_AXIS_2 && same(&x, b))
            return set(r, b);
        return fail(r,
                    "the ids %s are split; only a token split (ids axis 1, b %s axis 2, "
                    "MIRRORED experts) is possible",
                    DSC1(2), DSC2(1));
    }
    if (IS_P(as) || IS_P(b)) {
        if ((IS_P(as) && IS_M(b)) || (IS_M(as) && IS_P(b))) return set_kind(r, LOOM_SPLIT_PARTIAL);
        return fail(r, "cannot multiply %s by %s", DSC1(0), DSC2(1));
    }
    if (IS_M(as) && IS_M(b)) return set_kind(r, LOOM_SPLIT_MIRRORED);
    if (IS_M(b)) {
        switch (as->axis) {
        case LOOM_SPLIT_AXIS_1:
            return set_axis(r, as, 0); /* experts' rows: column parallel */
        case LOOM_SPLIT_AXIS_2:
            /* expert parallel: each device computes the slots routed to its experts and
             * contributes zeros elsewhere; the sum over devices is the result */
            return set_kind(r, LOOM_SPLIT_PARTIAL);
        case LOOM_SPLIT_AXIS_0:
            return fail(r,
                        "the experts %s are split along K (axis 0), so b %s must be split "
                        "along K the same way",
                        DSC1(0), DSC2(1));
        default:
            break;
        }
        return fail(r, "cannot split the experts %s along axis %d", DSC1(0), (int)as->axis);
    }
    if (as->axis == LOOM_SPLIT_AXIS_0 && b->axis == LOOM_SPLIT_AXIS_0) {
        if (same(as, b)) return set_kind(r, LOOM_SPLIT_PARTIAL);
        return fail(r, "the contraction dimension K is split differently in %s and %s", DSC1(0),
                    DSC2(1));
    }
    return fail(r, "cannot multiply the experts %s by b %s", DSC1(0), DSC2(1));
}

static loom_status rule_get_rows(rule *r) {
    const loom_split_state *a = S(0), *ids = S(1);
    const loom_tensor *ta = T(0);
    D1;
    D2;
    if (IS_P(ids)) return not_linear(r, 1);
    if (a->axis == LOOM_SPLIT_AXIS_1)
        return fail(r, "cannot gather rows from %s, split along axis 1 (the rows)", DSC1(0));
    if (IS_M(ids)) {
        if (IS_M(a) || IS_P(a) || a->axis == LOOM_SPLIT_AXIS_0) return set(r, a);
        return fail(r,
                    "%s is split along axis %d, so the ids %s must be split along axis %d "
                    "the same way",
                    DSC1(0), (int)a->axis, DSC2(1), (int)a->axis - 1);
    }
    /* ids split along axis i: the result is split along axis i + 1 */
    const int i = (int)ids->axis;
    if (i == 3) return fail(r, "the ids %s cannot be split along axis 3", DSC2(1));
    loom_split_state x = *ids;
    x.axis = (loom_split_axis)(i + 1);
    if (IS_M(a)) {
        if (i == 0 || ta->ne[i + 1] == 1) return set(r, &x);
        return fail(r,
                    "the ids %s are split along axis %d but %s is MIRRORED with %" PRId64
                    " matrices along axis %d; split it the same way",
                    DSC2(1), i, DSC1(0), ta->ne[i + 1], i + 1);
    }
    if (i >= 1 && a->axis == x.axis && same(a, &x)) return set(r, a);
    return fail(r, "%s and the ids %s are split inconsistently", DSC1(0), DSC2(1));
}

static loom_status rule_set_rows(rule *r) {
    const loom_split_state *dst = r->dst, *b = S(0), *ids = S(1);
    const loom_tensor *tb = T(0), *tids = T(1);
    D1;
    D2;
    if (!dst)
        return loom_error(LOOM_ERR_INVALID_ARG, "%s '%s': the destination's state is missing",
                          r->op, tname(r->t));
    /* dst is the state of the storage owner (view_src); the rows are written into the
     * part of it the result views */
    loom_split_state dst_view;
    if (IS_DIM(dst)) {
        loom_status st =
            map_view(r, r->t->view_src, dst, (int64_t)r->t->view_offs, DSC1(-1), &dst_view);
        if (st != LOOM_OK) return st;
        dst = &dst_view;
    }
    if (IS_P(b)) return fail(r, "cannot store %s, a sum over devices", DSC1(0));
    if (IS_P(dst)) return fail(r, "cannot write rows into %s, a sum over devices", DSC1(-1));
    if (IS_P(ids) || (IS_DIM(ids) && ids->axis == LOOM_SPLIT_AXIS_0))
        return fail(r, "the row ids %s must be MIRRORED", DSC1(1));
    if (dst->axis == LOOM_SPLIT_NONE) { /* the destination follows the rows written */
        if (IS_M(b) || b->axis == LOOM_SPLIT_AXIS_0) return set(r, b);
        return fail(r, "cannot write %s into %s", DSC1(0), DSC2(-1));
    }
    if (dst->axis == LOOM_SPLIT_AXIS_1)
        return fail(r, "cannot write rows into %s, split along axis 1 (the rows being written)",
                    DSC1(-1));
    if (IS_M(dst)) {
        if (IS_M(b) && IS_M(ids)) return set(r, dst);
        return fail(r,
                    "writes %s into the MIRRORED destination %s; both must be distributed "
                    "alike",
                    DSC1(0), DSC2(-1));
    }
    const int k = (int)dst->axis;
    if (k == 0) {
        if (IS_DIM(b) && b->axis == LOOM_SPLIT_AXIS_0 && same(b, dst) && IS_M(ids))
            return set(r, dst);
        /* whole rows (computed elsewhere, copied in): each device writes its part of them */
        if (IS_M(b) && IS_M(ids) && one_piece(dst)) return set(r, dst);
        return fail(r,
                    "the destination %s is split along axis 0, so the rows %s must be split "
                    "along axis 0 the same way",
                    DSC2(-1), DSC1(0));
    }
    /* k = 2 or 3: b and ids broadcast along it, or are split the same way */
    const bool b_ok =
        (IS_M(b) && tb->ne[k] == 1) || (IS_DIM(b) && b->axis == dst->axis && same(b, dst));
    bool ids_ok = IS_M(ids) && tids->ne[k - 1] == 1;
    if (IS_DIM(ids) && (int)ids->axis == k - 1) {
        loom_split_state x = *ids;
        x.axis = dst->axis;
        ids_ok = same(&x, dst);
    }
    if (b_ok && ids_ok) return set(r, dst);
    return fail(r,
                "the destination %s is split along axis %d, so the rows %s and their ids "
                "must be split the same way or broadcast along it",
                DSC2(-1), k, DSC1(0));
}

/* ---------------------------------------------------------------- attention */

static loom_status rule_flash_attn(rule *r) {
    const loom_split_state *q = S(0), *k = S(1), *v = S(2);
    const loom_split_state *mask = T(3) ? S(3) : NULL, *sinks = T(4) ? S(4) : NULL;
    const loom_tensor *tq = T(0), *tk = T(1);
    D1;
    D2;
    for (int i = 0; i < 5; i++)
        if (T(i) && IS_P(S(i))) return not_linear(r, i);
    if (IS_M(q) && IS_M(k) && IS_M(v)) {
        if (mask && !IS_M(mask)) return fail(r, "the mask %s must be MIRRORED", DSC1(3));
        if (sinks && !IS_M(sinks)) return fail(r, "the sinks %s must be MIRRORED", DSC1(4));
        return set_kind(r, LOOM_SPLIT_MIRRORED);
    }
    /* whole queries (computed elsewhere, copied in) with k and v split on heads: each device
     * reads the query heads of its KV heads */
    loom_split_state qs;
    if (IS_M(q) && IS_DIM(k) && k->axis == LOOM_SPLIT_AXIS_2 && same(k, v) && one_piece(k) &&
        !sinks && tk->ne[2] > 0 && tq->ne[2] % tk->ne[2] == 0) {
        qs = *k;
        for (int j = 0; j < qs.n_devices; j++)
            qs.ne[0][j] *= tq->ne[2] / tk->ne[2];
        q = &qs;
    }
    if (!IS_DIM(q))
        return fail(r, "q %s is not split but k %s is; split q the same way", DSC1(0), DSC2(1));
    switch (q->axis) {
    case LOOM_SPLIT_AXIS_0:
        return fail(r, "cannot split q along axis 0 (the head dimension of the dot products)");
    case LOOM_SPLIT_AXIS_2: { /* heads */
        if (IS_M(k) && IS_M(v) && tk->ne[2] == 1) {
            /* one KV head (MQA), kept whole on every device: any query head reads it */
            if (mask && !IS_M(mask)) return fail(r, "the mask %s must be MIRRORED", DSC1(3));
            if (sinks) {
                loom_split_state x = *q;
                x.axis = LOOM_SPLIT_AXIS_0;
                if (!same(sinks, &x))
                    return fail(r, "the sinks %s must be split along axis 0 like the heads of q %s",
                                DSC1(4), DSC2(0));
            }
            if (loom_get_op_params_f32(r->t, 1) != 0.0f)
                return fail(r,
                            "ALiBi (max_bias %g) slopes depend on the global head index, so the "
                            "heads cannot be split",
                            (double)loom_get_op_params_f32(r->t, 1));
            return set_axis(r, q, 1);
        }
        if (!IS_DIM(k) || k->axis != LOOM_SPLIT_AXIS_2)
            return fail(r,
                        "q %s is split on heads (axis 2), so k %s must be split on its heads "
                        "too",
                        DSC1(0), DSC2(1));
        if (!same(k, v)) return fail(r, "k %s and v %s must be split alike", DSC1(1), DSC2(2));
        const int64_t gqa = tk->ne[2] ? tq->ne[2] / tk->ne[2] : 1;
        if (!loom__split_scaled_equal(k, q, gqa))
            return fail(r,
                        "q %s and k %s split the heads inconsistently: with %" PRId64
                        " query heads per KV head every device needs %" PRId64
                        " times its KV heads",
                        DSC1(0), DSC2(1), gqa, gqa);
        if (mask && !IS_M(mask)) return fail(r, "the mask %s must be MIRRORED", DSC1(3));
        if (sinks) {
            loom_split_state x = *q;
            x.axis = LOOM_SPLIT_AXIS_0;
            if (!same(sinks, &x))
                return fail(r, "the sinks %s must be split along axis 0 like the heads of q %s",
                            DSC1(4), DSC2(0));
        }
        if (loom_get_op_params_f32(r->t, 1) != 0.0f)
            return fail(r,
                        "ALiBi (max_bias %g) slopes depend on the global head index, so the "
                        "heads cannot be split",
                        (double)loom_get_op_params_f32(r->t, 1));
        return set_axis(r, q, 1); /* result [Dv, H, Nq, S]: heads on axis 1 */
    }
    case LOOM_SPLIT_AXIS_1: { /* queries */
        if (!IS_M(k) || !IS_M(v))
            return fail(r, "q %s is split on queries (axis 1), so k %s and v must be MIRRORED",
                        DSC1(0), DSC2(1));
        if (mask && !same(mask, q))
            return fail(r,
                        "q %s is split on queries, so the mask %s must be split along axis 1 "
                        "the same way",
                        DSC1(0), DSC2(3));
        if (sinks && !IS_M(sinks)) return fail(r, "the sinks %s must be MIRRORED", DSC1(4));
        return set_axis(r, q, 2);
    }
    case LOOM_SPLIT_AXIS_3: { /* sequences */
        if (!same(k, q) || !same(v, q))
            return fail(r,
                        "q %s is split on sequences (axis 3), so k %s and v must be split "
                        "the same way",
                        DSC1(0), DSC2(1));
        if (mask && !IS_M(mask)) return fail(r, "the mask %s must be MIRRORED", DSC1(3));
        if (sinks && !IS_M(sinks)) return fail(r, "the sinks %s must be MIRRORED", DSC1(4));
        return set(r, q);
    }
    default:
        break;
    }
    return fail(r, "cannot split q %s", DSC1(0));
}

/* ---------------------------------------------------------------- the table */

typedef loom_status (*rule_fn)(rule *r);

static rule_fn rule_for(loom_op op) {
    switch (op) {
    case LOOM_OP_DUP:
        return rule_copy;
    case LOOM_OP_CPY:
        return rule_cpy;
    case LOOM_OP_CONT:
        return rule_cont;
    case LOOM_OP_ADD:
    case LOOM_OP_SUB:
    case LOOM_OP_MUL:
    case LOOM_OP_DIV:
        return rule_binary;
    case LOOM_OP_ADD_ID:
        return rule_add_id;
    case LOOM_OP_SCALE:
        return rule_scale;
    case LOOM_OP_SQR:
    case LOOM_OP_SQRT:
    case LOOM_OP_UNARY:
    case LOOM_OP_CLAMP:
        return rule_unary_like;
    case LOOM_OP_SUM_ROWS:
    case LOOM_OP_MEAN:
    case LOOM_OP_ARGMAX:
    case LOOM_OP_NORM:
    case LOOM_OP_RMS_NORM:
    case LOOM_OP_ARGSORT:
    case LOOM_OP_TOP_K:
        return rule_per_row;
    case LOOM_OP_SOFT_MAX:
        return rule_soft_max;
    case LOOM_OP_MUL_MAT:
        return rule_mul_mat;
    case LOOM_OP_MUL_MAT_ID:
        return rule_mul_mat_id;
    case LOOM_OP_GET_ROWS:
        return rule_get_rows;
    case LOOM_OP_SET_ROWS:
        return rule_set_rows;
    case LOOM_OP_RESHAPE:
        return rule_reshape;
    case LOOM_OP_VIEW:
        return rule_view;
    case LOOM_OP_PERMUTE:
    case LOOM_OP_TRANSPOSE:
        return rule_permute;
    case LOOM_OP_ROPE:
        return rule_rope;
    case LOOM_OP_FLASH_ATTN_EXT:
        return rule_flash_attn;
    case LOOM_OP_CONCAT:
        return rule_concat;
    case LOOM_OP_GLU:
        return rule_glu;
    case LOOM_OP_FILL:
        return rule_fill;
    default:
        return NULL;
    }
}

bool loom_split_op_known(loom_op op) {
    return rule_for(op) != NULL;
}

/* Which sources may be NONE ("follows its writer"): CPY's destination only. */
static bool none_allowed(loom_op op, int i) {
    return op == LOOM_OP_CPY && i == 1;
}

loom_status loom_split_rule_apply(const loom_tensor *t, const loom_split_state *const *src,
                                  const loom_split_state *dst, int n_devices,
                                  loom_split_state *out) {
    if (!t || !src || !out) return loom_error(LOOM_ERR_INVALID_ARG, "split rule: NULL argument");
    if (n_devices < 1 || n_devices > LOOM_SPLIT_MAX_DEVICES)
        return loom_error(LOOM_ERR_INVALID_ARG, "split rule: %d devices (must be 1..%d)", n_devices,
                          LOOM_SPLIT_MAX_DEVICES);
    rule r = {.t = t, .src = src, .dst = dst, .n = n_devices, .out = out};
    loom__split_op_lower(t->op, r.op, sizeof r.op);
    if (t->op == LOOM_OP_NONE)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "split rule: '%s' is a leaf (op NONE); its state comes from the leaf "
                          "callback",
                          tname(t));
    rule_fn fn = rule_for(t->op);
    if (!fn) return fail(&r, "no split rule for this op");
    for (int i = 0; i < LOOM_MAX_SRC; i++) {
        if (!t->src[i]) continue;
        if (!src[i])
            return loom_error(LOOM_ERR_INVALID_ARG, "%s '%s': the state of source %d is missing",
                              r.op, tname(t), i);
        if (src[i]->n_devices != n_devices)
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "%s '%s': source '%s' is over %d devices, not %d", r.op, tname(t),
                              tname(t->src[i]), src[i]->n_devices, n_devices);
        if (src[i]->axis == LOOM_SPLIT_NONE && !none_allowed(t->op, i))
            return fail(&r, "source '%s' has no split state (NONE)", tname(t->src[i]));
    }
    if (!t->src[0] && t->op != LOOM_OP_FILL)
        return loom_error(LOOM_ERR_INVALID_ARG, "%s '%s': no source", r.op, tname(t));
    if (t->op == LOOM_OP_SET_ROWS && dst && dst->n_devices != n_devices)
        return loom_error(LOOM_ERR_INVALID_ARG, "%s '%s': the destination is over %d devices", r.op,
                          tname(t), dst->n_devices);
    loom_split_state res;
    loom_split_state_init(&res, LOOM_SPLIT_NONE, n_devices);
    r.out = &res;
    loom_status st = fn(&r);
    if (st != LOOM_OK) return st;
    LOOM_ASSERT(res.n_devices == n_devices);
    if (loom_split_axis_is_dim(res.axis)) {
        /* a rule's result must describe the tensor exactly */
        int64_t total = loom_split_state_total(&res);
        if (total != t->ne[res.axis]) {
            char s[256];
            loom_split_state_format(&res, s, sizeof s);
            return loom_error(LOOM_ERR_INTERNAL,
                              "%s '%s': derived %s, which sums to %" PRId64
                              " but ne[%d] = %" PRId64,
                              r.op, tname(t), s, total, (int)res.axis, t->ne[res.axis]);
        }
    }
    *out = res;
    return LOOM_OK;
}

static bool op_is_view(loom_op op) {
    return op == LOOM_OP_NONE || op == LOOM_OP_RESHAPE || op == LOOM_OP_VIEW ||
           op == LOOM_OP_PERMUTE || op == LOOM_OP_TRANSPOSE;
}

void loom_split_state_assume_sync(const loom_tensor *t, loom_split_state *s) {
    if (t && s && s->axis == LOOM_SPLIT_PARTIAL && !op_is_view(t->op))
        loom_split_state_init(s, LOOM_SPLIT_MIRRORED, s->n_devices);
}
