/*
 * The split-state algebra: building states (explicit, even or weighted counts with a
 * granularity and a rotation), querying a device's slice (counts, shape, bytes, the byte
 * ranges of each piece), equality of layouts, printing, validation, and sub-ranges (the
 * state of a view that selects part of a split axis). Everything else in splitstate/ and
 * the meta device is built on these.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "splitstate/splitstate-impl.h"

const char *loom_split_axis_name(loom_split_axis axis) {
    switch (axis) {
    case LOOM_SPLIT_AXIS_0:
        return "AXIS_0";
    case LOOM_SPLIT_AXIS_1:
        return "AXIS_1";
    case LOOM_SPLIT_AXIS_2:
        return "AXIS_2";
    case LOOM_SPLIT_AXIS_3:
        return "AXIS_3";
    case LOOM_SPLIT_MIRRORED:
        return "MIRRORED";
    case LOOM_SPLIT_PARTIAL:
        return "PARTIAL";
    case LOOM_SPLIT_NONE:
        return "NONE";
    }
    return "?";
}

bool loom_split_axis_is_dim(loom_split_axis axis) {
    return axis >= LOOM_SPLIT_AXIS_0 && axis <= LOOM_SPLIT_AXIS_3;
}

/* ---------------------------------------------------------------- building */

void loom_split_state_init(loom_split_state *s, loom_split_axis axis, int n_devices) {
    LOOM_ASSERT(s != NULL);
    LOOM_ASSERT(n_devices >= 1 && n_devices <= LOOM_SPLIT_MAX_DEVICES);
    memset(s, 0, sizeof *s);
    s->axis = axis;
    s->n_devices = n_devices;
}

loom_status loom_split_state_add_segment(loom_split_state *s, const int64_t *counts, int64_t nr) {
    if (!s || !counts) return loom_error(LOOM_ERR_INVALID_ARG, "split state: NULL argument");
    if (nr < 1)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "split state: a segment repeats %" PRId64 " times (must be >= 1)", nr);
    for (int j = 0; j < s->n_devices; j++)
        if (counts[j] < 0)
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "split state: device %d gets %" PRId64 " elements (negative)", j,
                              counts[j]);
    if (s->n_segments >= LOOM_SPLIT_MAX_SEGMENTS)
        return loom_error(LOOM_ERR_FULL, "split state: more than %d segments",
                          LOOM_SPLIT_MAX_SEGMENTS);
    int seg = s->n_segments++;
    s->nr[seg] = nr;
    for (int j = 0; j < s->n_devices; j++)
        s->ne[seg][j] = counts[j];
    return LOOM_OK;
}

loom_status loom_split_counts(int64_t size, int64_t granularity, int n_devices, int rotation,
                              const float *weights, int64_t *counts) {
    if (!counts) return loom_error(LOOM_ERR_INVALID_ARG, "split counts: NULL counts");
    if (n_devices < 1 || n_devices > LOOM_SPLIT_MAX_DEVICES)
        return loom_error(LOOM_ERR_INVALID_ARG, "split counts: %d devices (must be 1..%d)",
                          n_devices, LOOM_SPLIT_MAX_DEVICES);
    if (size < 0)
        return loom_error(LOOM_ERR_INVALID_ARG, "split counts: negative size %" PRId64, size);
    if (granularity < 1) granularity = 1;
    if (size % granularity != 0)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "cannot split %" PRId64 " elements in units of %" PRId64
                          " (not a multiple of the granularity)",
                          size, granularity);
    int n = n_devices;
    int rot = ((rotation % n) + n) % n;
    int64_t units = size / granularity;
    int64_t u[LOOM_SPLIT_MAX_DEVICES] = {0};
    int64_t given = 0;
    if (!weights) {
        for (int j = 0; j < n; j++)
            u[j] = units / n;
        given = (units / n) * n;
    } else {
        double sum = 0;
        for (int j = 0; j < n; j++) {
            if (!(weights[j] >= 0) || isinf(weights[j]))
                return loom_error(LOOM_ERR_INVALID_ARG,
                                  "split counts: weight %d is %g (must be finite and >= 0)", j,
                                  (double)weights[j]);
            sum += weights[j];
        }
        if (!(sum > 0))
            return loom_error(LOOM_ERR_INVALID_ARG, "split counts: the weights sum to 0");
        for (int j = 0; j < n; j++) {
            u[j] = (int64_t)floor((double)units * weights[j] / sum);
            if (u[j] > units - given) u[j] = units - given; /* guard rounding */
            given += u[j];
        }
    }
    /* The leftover units go one each to devices rot, rot+1, ... (positive weight only). */
    for (int i = 0; given < units; i = (i + 1) % n) {
        int j = (rot + i) % n;
        if (weights && !(weights[j] > 0)) continue;
        u[j]++;
        given++;
    }
    for (int j = 0; j < n; j++)
        counts[j] = u[j] * granularity;
    return LOOM_OK;
}

loom_status loom_split_state_add_even(loom_split_state *s, int64_t size, int64_t granularity,
                                      int rotation, int64_t nr) {
    if (!s) return loom_error(LOOM_ERR_INVALID_ARG, "split state: NULL state");
    int64_t counts[LOOM_SPLIT_MAX_DEVICES];
    loom_status st = loom_split_counts(size, granularity, s->n_devices, rotation, NULL, counts);
    if (st != LOOM_OK) return st;
    return loom_split_state_add_segment(s, counts, nr);
}

loom_status loom_split_state_even(loom_split_state *s, loom_split_axis axis, int n_devices,
                                  int64_t size, int64_t granularity, int rotation) {
    if (!s) return loom_error(LOOM_ERR_INVALID_ARG, "split state: NULL state");
    if (!loom_split_axis_is_dim(axis))
        return loom_error(LOOM_ERR_INVALID_ARG, "split state: %s is not an axis",
                          loom_split_axis_name(axis));
    if (n_devices < 1 || n_devices > LOOM_SPLIT_MAX_DEVICES)
        return loom_error(LOOM_ERR_INVALID_ARG, "split state: %d devices (must be 1..%d)",
                          n_devices, LOOM_SPLIT_MAX_DEVICES);
    loom_split_state_init(s, axis, n_devices);
    return loom_split_state_add_even(s, size, granularity, rotation, 1);
}

/* ---------------------------------------------------------------- queries */

static int64_t seg_width(const loom_split_state *s, int seg) {
    int64_t w = 0;
    for (int j = 0; j < s->n_devices; j++)
        w += s->ne[seg][j];
    return w;
}

int64_t loom_split_state_total(const loom_split_state *s) {
    if (!s || !loom_split_axis_is_dim(s->axis)) return 0;
    int64_t t = 0;
    for (int i = 0; i < s->n_segments; i++)
        t += s->nr[i] * seg_width(s, i);
    return t;
}

int64_t loom_split_state_dev_count(const loom_split_state *s, int dev) {
    if (!s || !loom_split_axis_is_dim(s->axis) || dev < 0 || dev >= s->n_devices) return 0;
    int64_t t = 0;
    for (int i = 0; i < s->n_segments; i++)
        t += s->nr[i] * s->ne[i][dev];
    return t;
}

void loom_split_state_slice_ne(const loom_split_state *s, const int64_t ne[4], int dev,
                               int64_t out[4]) {
    for (int d = 0; d < 4; d++)
        out[d] = ne[d];
    if (s && loom_split_axis_is_dim(s->axis)) out[s->axis] = loom_split_state_dev_count(s, dev);
}

int64_t loom_split_state_slice_nelements(const loom_split_state *s, const loom_tensor *t, int dev) {
    int64_t ne[4];
    loom_split_state_slice_ne(s, t->ne, dev, ne);
    return ne[0] * ne[1] * ne[2] * ne[3];
}

size_t loom_split_state_slice_nbytes(const loom_split_state *s, const loom_tensor *t, int dev) {
    int64_t ne[4];
    loom_split_state_slice_ne(s, t->ne, dev, ne);
    int64_t blck = loom_blck_size(t->type);
    size_t row = (size_t)(ne[0] / blck) * loom_type_size(t->type);
    return row * (size_t)ne[1] * (size_t)ne[2] * (size_t)ne[3];
}

/* Bytes of `n` elements along `axis` of a contiguous tensor of t's type and shape. */
static size_t axis_bytes(const loom_tensor *t, int axis, int64_t n) {
    int64_t blck = loom_blck_size(t->type);
    size_t tsize = loom_type_size(t->type);
    if (axis == 0) return (size_t)(n / blck) * tsize;
    size_t unit = (size_t)(t->ne[0] / blck) * tsize;
    for (int d = 1; d < axis; d++)
        unit *= (size_t)t->ne[d];
    return unit * (size_t)n;
}

loom_status loom_split_state_range(const loom_split_state *s, const loom_tensor *t, int seg,
                                   int64_t rep, int dev, loom_split_range *out) {
    if (!s || !t || !out) return loom_error(LOOM_ERR_INVALID_ARG, "split range: NULL argument");
    if (!loom_split_axis_is_dim(s->axis))
        return loom_error(LOOM_ERR_INVALID_ARG, "split range of '%s': the state is %s, not split",
                          t->name, loom_split_axis_name(s->axis));
    if (seg < 0 || seg >= s->n_segments || rep < 0 || rep >= s->nr[seg] || dev < 0 ||
        dev >= s->n_devices)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "split range of '%s': segment %d, repeat %" PRId64
                          ", device %d out of range",
                          t->name, seg, rep, dev);
    int axis = (int)s->axis;
    int64_t g = 0, d0 = 0;
    for (int i = 0; i < seg; i++) {
        g += s->nr[i] * seg_width(s, i);
        d0 += s->nr[i] * s->ne[i][dev];
    }
    g += rep * seg_width(s, seg);
    for (int j = 0; j < dev; j++)
        g += s->ne[seg][j];
    d0 += rep * s->ne[seg][dev];
    int64_t blck = loom_blck_size(t->type);
    int64_t dev_total = loom_split_state_dev_count(s, dev);
    if (axis == 0 && blck > 1 &&
        (g % blck != 0 || s->ne[seg][dev] % blck != 0 || dev_total % blck != 0))
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "split range of '%s': a %s row splits only at %" PRId64
                          "-element block boundaries",
                          t->name, loom_type_name(t->type), blck);
    out->offset = g;
    out->size = s->ne[seg][dev];
    out->dev_offset = d0;
    out->offset_bytes = axis_bytes(t, axis, g);
    out->size_bytes = axis_bytes(t, axis, out->size);
    out->dev_offset_bytes = axis_bytes(t, axis, d0);
    out->chunk_bytes = axis_bytes(t, axis, t->ne[axis]);
    out->dev_chunk_bytes = axis_bytes(t, axis, dev_total);
    out->n_chunks = 1;
    for (int d = axis + 1; d < 4; d++)
        out->n_chunks *= t->ne[d];
    return LOOM_OK;
}

/* ---------------------------------------------------------------- normal form, equality */

static bool counts_equal(const loom_split_state *s, int seg, const int64_t *c) {
    for (int j = 0; j < s->n_devices; j++)
        if (s->ne[seg][j] != c[j]) return false;
    return true;
}

loom_status loom__split_append(loom_split_state *s, const int64_t *counts, int64_t nr) {
    if (nr <= 0) return LOOM_OK;
    bool empty = true;
    for (int j = 0; j < s->n_devices; j++)
        if (counts[j] != 0) empty = false;
    if (empty) return LOOM_OK;
    if (s->n_segments > 0 && counts_equal(s, s->n_segments - 1, counts)) {
        s->nr[s->n_segments - 1] += nr;
        return LOOM_OK;
    }
    if (s->n_segments >= LOOM_SPLIT_MAX_SEGMENTS) return LOOM_ERR_FULL;
    int seg = s->n_segments++;
    s->nr[seg] = nr;
    for (int j = 0; j < s->n_devices; j++)
        s->ne[seg][j] = counts[j];
    return LOOM_OK;
}

void loom__split_normalize(loom_split_state *s) {
    if (!loom_split_axis_is_dim(s->axis)) {
        s->n_segments = 0;
        memset(s->nr, 0, sizeof s->nr);
        memset(s->ne, 0, sizeof s->ne);
        return;
    }
    loom_split_state in = *s;
    s->n_segments = 0;
    memset(s->nr, 0, sizeof s->nr);
    memset(s->ne, 0, sizeof s->ne);
    for (int i = 0; i < in.n_segments; i++) {
        /* merging never needs more segments than the input had */
        loom_status st = loom__split_append(s, in.ne[i], in.nr[i]);
        LOOM_ASSERT(st == LOOM_OK);
    }
    if (s->n_segments == 0) { /* an empty axis: one all-zero segment */
        s->n_segments = 1;
        s->nr[0] = 1;
    }
}

bool loom_split_state_equal(const loom_split_state *a, const loom_split_state *b) {
    if (!a || !b) return false;
    if (a->axis != b->axis || a->n_devices != b->n_devices) return false;
    if (!loom_split_axis_is_dim(a->axis)) return true;
    loom_split_state na = *a, nb = *b;
    loom__split_normalize(&na);
    loom__split_normalize(&nb);
    if (na.n_segments != nb.n_segments) return false;
    for (int i = 0; i < na.n_segments; i++) {
        if (na.nr[i] != nb.nr[i]) return false;
        if (!counts_equal(&na, i, nb.ne[i])) return false;
    }
    return true;
}

void loom__split_scale(loom_split_state *s, int64_t mul, int64_t div) {
    for (int i = 0; i < s->n_segments; i++)
        for (int j = 0; j < s->n_devices; j++) {
            if (mul > 0) s->ne[i][j] *= mul;
            if (div > 0) {
                LOOM_ASSERT(s->ne[i][j] % div == 0);
                s->ne[i][j] /= div;
            }
        }
}

bool loom__split_counts_multiple_of(const loom_split_state *s, int64_t m) {
    if (m <= 1) return true;
    for (int i = 0; i < s->n_segments; i++)
        for (int j = 0; j < s->n_devices; j++)
            if (s->ne[i][j] % m != 0) return false;
    return true;
}

loom_status loom__split_repeat(loom_split_state *s, int64_t k) {
    if (k <= 1) return LOOM_OK;
    loom__split_normalize(s);
    if (s->n_segments == 1) {
        s->nr[0] *= k;
        return LOOM_OK;
    }
    loom_split_state one = *s;
    for (int64_t r = 1; r < k; r++)
        for (int i = 0; i < one.n_segments; i++)
            if (loom__split_append(s, one.ne[i], one.nr[i]) != LOOM_OK) return LOOM_ERR_FULL;
    return LOOM_OK;
}

bool loom__split_periodic(const loom_split_state *s, int64_t period, loom_split_state *pattern) {
    int64_t total = loom_split_state_total(s);
    if (period <= 0 || total % period != 0) return false;
    if (loom_split_state_sub(s, 0, period, pattern, NULL) != LOOM_OK) {
        loom_clear_error();
        return false;
    }
    if (period == total) return true;
    loom_split_state rep = *pattern;
    if (loom__split_repeat(&rep, total / period) != LOOM_OK) return false;
    return loom_split_state_equal(&rep, s);
}

bool loom__split_scaled_equal(const loom_split_state *a, const loom_split_state *b, int64_t ratio) {
    if (!loom_split_axis_is_dim(a->axis) || ratio < 1) return false;
    loom_split_state x = *a;
    loom__split_scale(&x, ratio, 0);
    return loom_split_state_equal(&x, b);
}

/* ---------------------------------------------------------------- printing */

int loom_split_state_format(const loom_split_state *s, char *buf, size_t size) {
    char tmp[1024];
    size_t n = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(tmp + n, sizeof tmp - n, __VA_ARGS__);                                   \
        if (w_ > 0) n = (n + (size_t)w_ < sizeof tmp) ? n + (size_t)w_ : sizeof tmp - 1;           \
    } while (0)
    if (!s) {
        PUT("(null)");
    } else {
        PUT("%s", loom_split_axis_name(s->axis));
        if (loom_split_axis_is_dim(s->axis)) {
            PUT(" ");
            for (int i = 0; i < s->n_segments; i++) {
                PUT("%s[", i ? "+" : "");
                for (int j = 0; j < s->n_devices; j++)
                    PUT("%s%" PRId64, j ? "," : "", s->ne[i][j]);
                PUT("]");
                if (s->nr[i] != 1) PUT("x%" PRId64, s->nr[i]);
            }
            if (s->n_segments == 0) PUT("[]");
        }
    }
#undef PUT
    if (buf && size > 0) snprintf(buf, size, "%s", tmp);
    return (int)n;
}

/* ---------------------------------------------------------------- validation */

loom_status loom_split_state_validate(const loom_split_state *s, const loom_tensor *t,
                                      int64_t granularity) {
    if (!s || !t) return loom_error(LOOM_ERR_INVALID_ARG, "split state: NULL argument");
    char st[256];
    loom_split_state_format(s, st, sizeof st);
    const char *name = t->name[0] ? t->name : "(unnamed)";
    if (s->n_devices < 1 || s->n_devices > LOOM_SPLIT_MAX_DEVICES)
        return loom_error(LOOM_ERR_INVALID_ARG, "split state of '%s': %d devices (must be 1..%d)",
                          name, s->n_devices, LOOM_SPLIT_MAX_DEVICES);
    switch (s->axis) {
    case LOOM_SPLIT_MIRRORED:
    case LOOM_SPLIT_PARTIAL:
    case LOOM_SPLIT_NONE:
        return LOOM_OK;
    case LOOM_SPLIT_AXIS_0:
    case LOOM_SPLIT_AXIS_1:
    case LOOM_SPLIT_AXIS_2:
    case LOOM_SPLIT_AXIS_3:
        break;
    default:
        return loom_error(LOOM_ERR_INVALID_ARG, "split state of '%s': unknown axis %d", name,
                          (int)s->axis);
    }
    int axis = (int)s->axis;
    if (s->n_segments < 1 || s->n_segments > LOOM_SPLIT_MAX_SEGMENTS)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "split state %s of '%s': %d segments (must be 1..%d)", st, name,
                          s->n_segments, LOOM_SPLIT_MAX_SEGMENTS);
    int64_t blck = loom_blck_size(t->type);
    for (int i = 0; i < s->n_segments; i++) {
        if (s->nr[i] < 1)
            return loom_error(LOOM_ERR_INVALID_ARG,
                              "split state %s of '%s': segment %d repeats %" PRId64 " times", st,
                              name, i, s->nr[i]);
        for (int j = 0; j < s->n_devices; j++) {
            int64_t c = s->ne[i][j];
            if (c < 0)
                return loom_error(LOOM_ERR_INVALID_ARG,
                                  "split state %s of '%s': device %d has %" PRId64
                                  " elements (negative)",
                                  st, name, j, c);
            if (granularity > 1 && c % granularity != 0)
                return loom_error(LOOM_ERR_INVALID_ARG,
                                  "split state %s of '%s': device %d gets %" PRId64
                                  " elements, not a multiple of the granularity %" PRId64,
                                  st, name, j, c, granularity);
            if (axis == 0 && blck > 1 && c % blck != 0)
                return loom_error(LOOM_ERR_INVALID_ARG,
                                  "split state %s of '%s': device %d gets %" PRId64
                                  " elements, but a %s row splits only at %" PRId64
                                  "-element block boundaries",
                                  st, name, j, c, loom_type_name(t->type), blck);
        }
    }
    int64_t total = loom_split_state_total(s);
    if (total != t->ne[axis])
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "split state %s of '%s': counts sum to %" PRId64
                          ", but ne[%d] = %" PRId64,
                          st, name, total, axis, t->ne[axis]);
    return LOOM_OK;
}

/* ---------------------------------------------------------------- sub-ranges */

/* Device j's elements of the range [lo, hi) within one occurrence starting at `occ`. */
static void occurrence_part(const loom_split_state *s, int seg, int64_t occ, int64_t lo, int64_t hi,
                            int64_t *part) {
    int64_t p = occ;
    for (int j = 0; j < s->n_devices; j++) {
        int64_t a = p > lo ? p : lo;
        int64_t e = p + s->ne[seg][j];
        int64_t b = e < hi ? e : hi;
        part[j] = b > a ? b - a : 0;
        p = e;
    }
}

loom_status loom_split_state_sub(const loom_split_state *s, int64_t start, int64_t len,
                                 loom_split_state *out, int64_t *dev_start) {
    if (!s || !out) return loom_error(LOOM_ERR_INVALID_ARG, "split sub-range: NULL argument");
    if (!loom_split_axis_is_dim(s->axis))
        return loom_error(LOOM_ERR_INVALID_ARG, "split sub-range: the state is %s, not split",
                          loom_split_axis_name(s->axis));
    int64_t total = loom_split_state_total(s);
    if (start < 0 || len < 0 || start + len > total)
        return loom_error(LOOM_ERR_INVALID_ARG,
                          "split sub-range [%" PRId64 ", %" PRId64 ") outside the axis of %" PRId64
                          " elements",
                          start, start + len, total);
    loom_split_state r;
    loom_split_state_init(&r, s->axis, s->n_devices);
    int64_t before[LOOM_SPLIT_MAX_DEVICES] = {0};
    int64_t lo = start, hi = start + len;
    int64_t g = 0;
    int64_t part[LOOM_SPLIT_MAX_DEVICES];
    for (int i = 0; i < s->n_segments; i++) {
        int64_t w = seg_width(s, i);
        int64_t span = w * s->nr[i];
        if (w == 0) continue;
        /* elements of each device before `lo` */
        if (lo >= g + span) {
            for (int j = 0; j < s->n_devices; j++)
                before[j] += s->nr[i] * s->ne[i][j];
        } else if (lo > g) {
            int64_t r0 = (lo - g) / w;
            occurrence_part(s, i, g + r0 * w, g + r0 * w, lo, part);
            for (int j = 0; j < s->n_devices; j++)
                before[j] += r0 * s->ne[i][j] + part[j];
        }
        int64_t a = lo > g ? lo : g;
        int64_t b = hi < g + span ? hi : g + span;
        if (a < b) {
            int64_t r0 = (a - g) / w, r1 = (b - 1 - g) / w;
            loom_status st;
            occurrence_part(s, i, g + r0 * w, a, b, part);
            st = loom__split_append(&r, part, 1);
            if (st == LOOM_OK && r1 > r0 + 1) st = loom__split_append(&r, s->ne[i], r1 - r0 - 1);
            if (st == LOOM_OK && r1 > r0) {
                occurrence_part(s, i, g + r1 * w, a, b, part);
                st = loom__split_append(&r, part, 1);
            }
            if (st != LOOM_OK)
                return loom_error(LOOM_ERR_FULL,
                                  "split sub-range [%" PRId64 ", %" PRId64
                                  ") needs more than %d segments",
                                  lo, hi, LOOM_SPLIT_MAX_SEGMENTS);
        }
        g += span;
    }
    loom__split_normalize(&r);
    *out = r;
    if (dev_start)
        for (int j = 0; j < s->n_devices; j++)
            dev_start[j] = before[j];
    return LOOM_OK;
}
