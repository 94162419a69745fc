#include "backends/cpu/cpu_test_util.h"

#include <string.h>

#include "tests/shim/loom_test.h"

loom_ctx *loom_cpu_test_ctx(size_t mb) {
    loom_ctx_params p = {.mem_size = mb << 20, .mem_buffer = NULL, .no_alloc = false};
    return loom_ctx_new(p);
}

loom_status loom_cpu_test_compute(loom_tensor *out, int threads) {
    loom_ctx *gctx = loom_cpu_test_ctx(4);
    loom_graph *g = loom_graph_new(gctx, 64);
    loom_status s = loom_graph_build_forward(g, out);
    if (s == LOOM_OK) {
        loom_threadpool *tp = threads > 1 ? loom_threadpool_new(threads) : NULL;
        s = loom_cpu_graph_compute(g, tp);
        if (tp) loom_threadpool_free(tp);
    }
    loom_ctx_free(gctx);
    return s;
}

loom_tensor *loom_cpu_test_b(loom_ctx *ctx, int64_t K, int64_t N, int64_t B2, b_layout lb,
                             int64_t pad, loom_tensor **src) {
    loom_tensor *bsrc, *b;
    if (lb == B_TRANSPOSED) {
        bsrc = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, N, K, B2);
        b = bsrc ? loom_transpose(ctx, bsrc) : NULL;
    } else if (lb == B_PADDED) {
        bsrc = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, K + pad, N, B2);
        b = bsrc ? loom_view_3d(ctx, bsrc, K, N, B2, bsrc->nb[1], bsrc->nb[2], 0) : NULL;
    } else {
        bsrc = b = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, K, N, B2);
    }
    if (!b) return NULL;
    memset(bsrc->data, 0x7f, loom_nbytes(bsrc));
    if (src) *src = bsrc;
    return b;
}

void loom_cpu_test_fill_f32(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++)
        x[i] = loom_test_randf(lo, hi);
}

void loom_cpu_test_set_from_f32(loom_tensor *t, const float *x) {
    const loom_type_traits *tr = loom_type_traits_get(t->type);
    const int64_t n0 = t->ne[0], rows = loom_nrows(t);
    for (int64_t r = 0; r < rows; r++)
        tr->from_float(x + r * n0, (char *)t->data + r * loom_row_size(t->type, n0), n0);
}
