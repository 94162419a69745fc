/*
 * Where a split axis lands in a view or a reshape. The source a is split along axis k
 * (unit stride u = a->nb[k], extent n); the view V addresses a's memory with its own
 * strides from an offset. Each dimension of V is cut into factors that step inside a's
 * lower dimensions (INNER), along the split axis (AXIS) or over a's higher dimensions
 * (OUTER); a dimension that crosses a boundary (a reshape that merges dims) is factored.
 * The AXIS factors must cover a contiguous range of the axis (steps 1, e1, e1*e2, ...);
 * with none, the view keeps one index of the axis and lives on that index's device.
 * The split then lands on the V dimension of one AXIS factor f_i when the layout of the
 * range is periodic over f_i's span (so every device has the same pieces under each index
 * of the higher factors) and every piece is a whole number of f_i's steps; the highest
 * such f_i wins. Counts are rescaled to V's units, and repeated when V's dimension also
 * runs over a's higher dimensions (that is where nr > 1 comes from). Anything else is
 * refused with the reason, which is how "a split boundary falls inside a merged dim"
 * is reported. A reshape is the same question asked with contiguous strides.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "splitstate/splitstate-impl.h"

enum { F_INNER, F_AXIS, F_OUTER };

typedef struct factor {
    int vdim;
    int kind;
    int64_t e;    /* extent */
    int64_t step; /* AXIS: elements of the split axis per index; else the stride */
} factor;

#define WHY(...) snprintf(why, why_size, __VA_ARGS__)

loom_status loom__split_map(const int64_t a_ne[4], const int64_t a_nb[4],
                            const loom_split_state *in, const int64_t v_ne[4],
                            const int64_t v_nb[4], int64_t rel, loom_split_state *out, char *why,
                            size_t why_size) {
    LOOM_ASSERT(loom_split_axis_is_dim(in->axis));
    const int k = (int)in->axis;
    const int n_dev = in->n_devices;
    if (v_ne[0] * v_ne[1] * v_ne[2] * v_ne[3] == 0) {
        /* nothing on any device */
        loom_split_state_init(out, LOOM_SPLIT_MIRRORED, n_dev);
        return LOOM_OK;
    }
    const int64_t n = a_ne[k], u = a_nb[k];
    if (n <= 0 || u <= 0) {
        WHY("the split axis %d has extent %" PRId64 " and stride %" PRId64, k, n, u);
        return LOOM_ERR_UNSUPPORTED;
    }
    const int64_t span = n * u;
    int64_t outer = span; /* the smallest stride of a's dimensions above the axis */
    bool has_outer = false;
    for (int j = 0; j < 4; j++) {
        if (j == k || a_ne[j] <= 1) continue;
        if (a_nb[j] >= span) {
            if (!has_outer || a_nb[j] < outer) outer = a_nb[j];
            has_outer = true;
        } else if (a_nb[j] >= u || (a_ne[j] - 1) * a_nb[j] >= u) {
            WHY("the source's dimension %d (stride %" PRId64 ") interleaves with its split "
                "axis %d (stride %" PRId64 ")",
                j, a_nb[j], k, u);
            return LOOM_ERR_UNSUPPORTED;
        }
    }
    if (rel < 0) {
        WHY("negative view offset %" PRId64, rel);
        return LOOM_ERR_UNSUPPORTED;
    }
    const int64_t q = rel % outer;
    const int64_t q0 = q / u, rin = q % u;
    if (q0 >= n) {
        WHY("the view starts past the end of the split axis");
        return LOOM_ERR_UNSUPPORTED;
    }

    factor f[12];
    int nf = 0;
    int64_t reach = rin; /* furthest inner offset reached */
    for (int d = 0; d < 4; d++) {
        int64_t e = v_ne[d], t = v_nb[d];
        if (e <= 1) continue;
        if (t <= 0) {
            WHY("view dimension %d has stride %" PRId64, d, t);
            return LOOM_ERR_UNSUPPORTED;
        }
        if (t < u) {
            if (reach + (e - 1) * t < u) {
                f[nf++] = (factor){d, F_INNER, e, t};
                reach += (e - 1) * t;
                continue;
            }
            if (rin != 0 || u % t != 0 || e % (u / t) != 0) {
                WHY("view dimension %d (extent %" PRId64 ", stride %" PRId64
                    ") straddles the split axis %d (stride %" PRId64 ")",
                    d, e, t, k, u);
                return LOOM_ERR_UNSUPPORTED;
            }
            int64_t m = u / t;
            f[nf++] = (factor){d, F_INNER, m, t};
            reach += (m - 1) * t;
            e /= m;
            t = u;
            if (e == 1) continue;
        }
        if (t < span) {
            if (t % u != 0) {
                WHY("view dimension %d steps %" PRId64 " bytes, not a whole number of "
                    "split-axis elements (%" PRId64 ")",
                    d, t, u);
                return LOOM_ERR_UNSUPPORTED;
            }
            int64_t s = t / u;
            if (q0 + (e - 1) * s < n) {
                f[nf++] = (factor){d, F_AXIS, e, s};
                continue;
            }
            if (q0 != 0 || n % s != 0 || e % (n / s) != 0 || outer != span) {
                WHY("view dimension %d (extent %" PRId64 ") runs past the end of the split "
                    "axis %d (extent %" PRId64 ")",
                    d, e, k, n);
                return LOOM_ERR_UNSUPPORTED;
            }
            int64_t m = n / s;
            f[nf++] = (factor){d, F_AXIS, m, s};
            e /= m;
            t = span;
            if (e == 1) continue;
        }
        if (t % outer != 0) {
            WHY("view dimension %d steps %" PRId64 " bytes, not whole indices of the "
                "source's dimensions above the split axis (%" PRId64 ")",
                d, t, outer);
            return LOOM_ERR_UNSUPPORTED;
        }
        f[nf++] = (factor){d, F_OUTER, e, t};
    }
    if (reach >= u) {
        WHY("the view's inner dimensions overlap the split axis %d", k);
        return LOOM_ERR_UNSUPPORTED;
    }

    /* the chain of AXIS factors, by step */
    factor chain[4];
    int nc = 0;
    for (int i = 0; i < nf; i++)
        if (f[i].kind == F_AXIS) chain[nc++] = f[i];
    for (int i = 1; i < nc; i++)
        for (int j = i; j > 0 && chain[j].step < chain[j - 1].step; j--) {
            factor tmp = chain[j];
            chain[j] = chain[j - 1];
            chain[j - 1] = tmp;
        }
    if (nc == 0) {
        /* one index of the split axis (a row, a head, a block): it lives on one device; the
         * split is carried by a view dimension of extent 1, axis k's own if it has one */
        int d1 = v_ne[k] == 1 ? k : -1;
        for (int d = 0; d < 4 && d1 < 0; d++)
            if (v_ne[d] == 1) d1 = d;
        if (d1 < 0) {
            WHY("the view keeps a single index (%" PRId64 ") of the split axis %d and has no "
                "dimension of extent 1 to carry it",
                q0, k);
            return LOOM_ERR_UNSUPPORTED;
        }
        if (loom_split_state_sub(in, q0, 1, out, NULL) != LOOM_OK) {
            WHY("%s", loom_last_error());
            loom_clear_error();
            return LOOM_ERR_UNSUPPORTED;
        }
        out->axis = (loom_split_axis)d1;
        return LOOM_OK;
    }
    if (chain[0].step != 1) {
        WHY("the view takes one element in every %" PRId64 " of the split axis %d", chain[0].step,
            k);
        return LOOM_ERR_UNSUPPORTED;
    }
    for (int i = 1; i < nc; i++)
        if (chain[i].step != chain[i - 1].step * chain[i - 1].e) {
            WHY("the view's dimensions do not cover the split axis %d contiguously", k);
            return LOOM_ERR_UNSUPPORTED;
        }
    const int64_t len = chain[nc - 1].step * chain[nc - 1].e;
    if (q0 + len > n) {
        WHY("the view runs past the end of the split axis %d", k);
        return LOOM_ERR_UNSUPPORTED;
    }
    loom_split_state range;
    if (loom_split_state_sub(in, q0, len, &range, NULL) != LOOM_OK) {
        WHY("%s", loom_last_error());
        loom_clear_error();
        return LOOM_ERR_UNSUPPORTED;
    }
    for (int i = nc - 1; i >= 0; i--) {
        const int64_t w = chain[i].step, period = w * chain[i].e;
        loom_split_state pat;
        if (!loom__split_periodic(&range, period, &pat)) continue;
        if (!loom__split_counts_multiple_of(&pat, w)) continue;
        loom__split_scale(&pat, 0, w);
        const int d = chain[i].vdim;
        int64_t inner = 1, rep = 1;
        for (int j = 0; j < nf; j++) {
            if (f[j].vdim != d) continue;
            if (f[j].kind == F_INNER) inner *= f[j].e;
            if (f[j].kind == F_OUTER) rep *= f[j].e;
        }
        if (inner > 1) loom__split_scale(&pat, inner, 0);
        if (loom__split_repeat(&pat, rep) != LOOM_OK) continue;
        pat.axis = (loom_split_axis)d;
        loom__split_normalize(&pat);
        *out = pat;
        return LOOM_OK;
    }
    char st[256];
    loom_split_state_format(&range, st, sizeof st);
    WHY("the split boundaries (%s) fall inside merged dimensions: the counts are not "
        "multiples of the merged extent %" PRId64,
        st, chain[nc - 1].step);
    return LOOM_ERR_UNSUPPORTED;
}
