#include "backends/cpu/cpu_test_util.h"

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
