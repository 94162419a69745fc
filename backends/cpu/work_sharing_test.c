/*
 * How the CPU backend shares a graph's work between its threads (graph.c, Work sharing and
 * Contention; cpu-impl.h, loom__cpu_chunks):
 * - chunks claimed from a node's counter cover every item exactly once, however the
 *   threads interleave, and a thread that comes late finds the work done by the others;
 * - the token matmuls and flash attention, run as one thread that claims everything and a
 *   second that comes after it, give the one-thread values and the late thread writes
 *   nothing;
 * - graphs with a worker that starts late give the one-thread values bit for bit;
 * - a backend whose threads share one core runs its graphs on one thread for a stretch,
 *   then tries its threads again; LOOM_CPU_ADAPT=0 keeps them;
 * - a large CPU buffer is backed by transparent huge pages once written.
 */
#define _GNU_SOURCE /* sched_setaffinity, setenv */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/cpu_test_util.h"
#include "loom/cpu.h"
#include "tests/shim/loom_test.h"

/* params of thread ith of nth with the counter claim (NULL: static shares) */
static loom__cpu_params params_of(int ith, int nth, _Atomic int64_t *claim, loom__cpu_state *st,
                                  int *epoch, void *wshared, size_t ws, void *wthread, size_t wt) {
    return (loom__cpu_params){
        .ith = ith,
        .nth = nth,
        .wshared = wshared,
        .wshared_size = ws,
        .wthread = wthread,
        .wthread_size = wt,
        .simd = loom__cpu_simd_get(),
        .state = st,
        .epoch = epoch,
        .claim = claim,
    };
}

/* ---------------------------------------------------------------- the counter */

LOOM_TEST(cpu_chunks, claims_cover_every_item_once) {
    static const int64_t sizes[] = {1, 7, 16, 100, 2048, 5633};
    loom__cpu_state st = {.nth = 3};
    int epoch = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t n = sizes[si];
        for (int order = 0; order < 3; order++) { /* greedy thread 0, round robin, random */
            unsigned char *seen = calloc((size_t)n, 1);
            LOOM_REQUIRE(seen);
            _Atomic int64_t claim = 0;
            loom__cpu_params p[3];
            loom__cpu_chunks ch[3];
            bool live[3] = {true, true, true};
            for (int t = 0; t < 3; t++) {
                p[t] = params_of(t, 3, &claim, &st, &epoch, NULL, 0, NULL, 0);
                ch[t] = loom__cpu_chunks_of(&p[t], n, 4);
                /* about LOOM__CPU_CHUNKS_PER_THREAD chunks a thread, never below the minimum */
                LOOM_CHECK(ch[t].size >= 4);
                LOOM_CHECK(ch[t].size == 4 || ch[t].size * 3 * LOOM__CPU_CHUNKS_PER_THREAD >= n);
            }
            int nlive = 3, turn = 0;
            while (nlive > 0) {
                int t = order == 0 ? (live[0] ? 0 : live[1] ? 1 : 2)
                        : order == 1 ? turn++ % 3
                                     : (int)(loom_test_randf(0, 2.999f));
                if (!live[t]) continue;
                int64_t i0, i1;
                if (!loom__cpu_chunks_next(&p[t], &ch[t], &i0, &i1)) {
                    live[t] = false;
                    nlive--;
                    continue;
                }
                LOOM_CHECK(i0 >= 0 && i0 < i1 && i1 <= n);
                for (int64_t i = i0; i < i1; i++)
                    seen[i]++;
            }
            for (int64_t i = 0; i < n; i++)
                LOOM_CHECK_MSG(seen[i] == 1, "n %lld order %d: item %lld taken %d times",
                               (long long)n, order, (long long)i, seen[i]);
            free(seen);
        }
    }
}

/* Without a counter (one thread, a serial step, a kernel called directly) each thread
 * takes its static share once, and the item walk visits it in order. */
LOOM_TEST(cpu_chunks, without_a_counter_each_thread_takes_its_share) {
    loom__cpu_state st = {.nth = 3};
    int epoch = 0;
    int64_t total = 0;
    for (int t = 0; t < 3; t++) {
        loom__cpu_params p = params_of(t, 3, NULL, &st, &epoch, NULL, 0, NULL, 0);
        loom__cpu_chunks ch = loom__cpu_chunks_of(&p, 100, 1);
        int64_t want0, want1, prev = -1;
        loom__range(100, t, 3, &want0, &want1);
        for (int64_t i; loom__cpu_chunks_item(&p, &ch, &i);) {
            LOOM_CHECK(i >= want0 && i < want1 && i == (prev < 0 ? want0 : prev + 1));
            prev = i;
            total++;
        }
        LOOM_CHECK_EQ_INT(prev, want1 - 1);
    }
    LOOM_CHECK_EQ_INT(total, 100);
}

/* ---------------------------------------------------------------- kernels */

/* dst computed as thread 0 of 2 claiming every chunk, then thread 1 coming late: the
 * values of one thread, and thread 1 writes nothing (dst poisoned in between). */
static void check_late_thread(loom_tensor *dst) {
    const size_t bytes = loom_nbytes(dst);
    float *ref = malloc(bytes);
    LOOM_REQUIRE(ref);
    loom__cpu_work w = dst->op == LOOM_OP_MUL_MAT
                           ? loom__cpu_mul_mat_work(dst, 2, loom__cpu_simd_get())
                           : loom__cpu_flash_attn_work(dst);
    const size_t ws = w.shared + 64, wt = w.per_thread + 64;
    char *wshared = aligned_alloc(64, (ws + 63) & ~(size_t)63);
    char *wthread = aligned_alloc(64, (wt + 63) & ~(size_t)63);
    LOOM_REQUIRE(wshared && wthread);
    loom__cpu_kernel_fn fn =
        dst->op == LOOM_OP_MUL_MAT ? loom__cpu_op_mul_mat : loom__cpu_op_flash_attn;
    loom__cpu_state st = {.nth = 1};
    atomic_init(&st.fail_epoch, LOOM__CPU_NO_FAIL);
    int epoch = 0;
    loom__cpu_params one = params_of(0, 1, NULL, &st, &epoch, wshared, ws, wthread, wt);
    fn(&one, dst);
    memcpy(ref, dst->data, bytes);

    _Atomic int64_t claim = 0;
    loom__cpu_state st2 = {.nth = 2};
    atomic_init(&st2.fail_epoch, LOOM__CPU_NO_FAIL);
    memset(dst->data, 0, bytes);
    loom__cpu_params t0 = params_of(0, 2, &claim, &st2, &epoch, wshared, ws, wthread, wt);
    fn(&t0, dst);
    LOOM_CHECK_MSG(memcmp(dst->data, ref, bytes) == 0, "%s: thread 0 alone differs from one thread",
                   dst->name);
    memset(dst->data, 0x7f, bytes);
    loom__cpu_params t1 = params_of(1, 2, &claim, &st2, &epoch, wshared, ws, wthread, wt);
    fn(&t1, dst);
    const unsigned char *d = dst->data;
    size_t touched = 0;
    for (size_t i = 0; i < bytes; i++)
        touched += d[i] != 0x7f;
    LOOM_CHECK_MSG(touched == 0, "%s: the late thread wrote %zu bytes", dst->name, touched);
    free(wshared);
    free(wthread);
    free(ref);
}

LOOM_TEST(cpu_chunks, token_matmuls_leave_nothing_to_a_late_thread) {
    static const loom_type types[] = {LOOM_TYPE_F32, LOOM_TYPE_F16, LOOM_TYPE_BF16,
                                      LOOM_TYPE_Q8_0, LOOM_TYPE_Q4_0, LOOM_TYPE_Q4_K,
                                      LOOM_TYPE_IQ4_NL, LOOM_TYPE_Q6_K};
    static float buf[512 * 256];
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        for (int64_t N = 1; N <= 4; N += 3) {
            loom_ctx *ctx = loom_cpu_test_ctx(8);
            LOOM_REQUIRE(ctx);
            loom_tensor *a = loom_new_tensor_2d(ctx, types[ti], 256, 500);
            loom_tensor *b = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, N);
            loom_cpu_test_fill_f32(buf, 256 * 500, -1, 1);
            loom_cpu_test_set_from_f32(a, buf);
            loom_cpu_test_fill_f32(b->data, 256 * N, -1, 1);
            loom_tensor *dst = loom_mul_mat(ctx, a, b);
            LOOM_REQUIRE(dst);
            loom_format_name(dst, "%s N=%lld", loom_type_name(types[ti]), (long long)N);
            check_late_thread(dst);
            loom_ctx_free(ctx);
        }
    }
}

LOOM_TEST(cpu_chunks, flash_attention_leaves_nothing_to_a_late_thread) {
    loom_ctx *ctx = loom_cpu_test_ctx(8);
    LOOM_REQUIRE(ctx);
    const int64_t D = 64, H = 8, Hk = 2, n_kv = 96;
    loom_tensor *q = loom_new_tensor_3d(ctx, LOOM_TYPE_F32, D, 1, H);
    loom_tensor *k = loom_new_tensor_3d(ctx, LOOM_TYPE_F16, D, n_kv, Hk);
    loom_tensor *v = loom_new_tensor_3d(ctx, LOOM_TYPE_F16, D, n_kv, Hk);
    static float buf[64 * 96 * 2];
    loom_cpu_test_fill_f32(q->data, D * H, -1, 1);
    loom_cpu_test_fill_f32(buf, D * n_kv * Hk, -1, 1);
    loom_cpu_test_set_from_f32(k, buf);
    loom_cpu_test_fill_f32(buf, D * n_kv * Hk, -1, 1);
    loom_cpu_test_set_from_f32(v, buf);
    loom_tensor *dst = loom_flash_attn_ext(ctx, q, k, v, NULL, NULL, 0.125f, 0.0f, 0.0f);
    LOOM_REQUIRE(dst);
    loom_format_name(dst, "flash_attn");
    check_late_thread(dst);
    loom_ctx_free(ctx);
}

/* ---------------------------------------------------------------- graphs */

/* Worker threads that start late (their first task waits): the caller claims what they
 * would have done. */
static void late_start(int ith, int n_threads, void *data) {
    (void)n_threads;
    (void)data;
    struct timespec ts = {0, (long)(ith * 3) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A token step and a prompt-sized step of a small layer (token matmuls, the int8 and F32
 * GEMMs with their packing barriers, flash attention, elementwise tails), on a pool whose
 * workers start late, against one thread, bit for bit. */
LOOM_TEST(cpu_chunks, graphs_with_late_workers_match_one_thread) {
    static float buf[256 * 768];
    for (int64_t N = 1; N <= 64; N += 63) {
        loom_ctx *ctx = loom_cpu_test_ctx(32);
        LOOM_REQUIRE(ctx);
        loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, N);
        loom_tensor *wq = loom_new_tensor_2d(ctx, LOOM_TYPE_Q4_0, 256, 256);
        loom_tensor *wk = loom_new_tensor_2d(ctx, LOOM_TYPE_Q8_0, 256, 128);
        loom_tensor *wv = loom_new_tensor_2d(ctx, LOOM_TYPE_F16, 256, 128);
        loom_tensor *wu = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 256, 768);
        loom_tensor *ws[] = {wq, wk, wv, wu};
        for (int i = 0; i < 4; i++) {
            loom_cpu_test_fill_f32(buf, loom_nelements(ws[i]), -0.2f, 0.2f);
            loom_cpu_test_set_from_f32(ws[i], buf);
        }
        loom_cpu_test_fill_f32(x->data, 256 * N, -1, 1);
        loom_tensor *q = loom_reshape_3d(ctx, loom_mul_mat(ctx, wq, x), 64, 4, N);
        loom_tensor *k = loom_reshape_3d(ctx, loom_mul_mat(ctx, wk, x), 64, 2, N);
        loom_tensor *v = loom_reshape_3d(ctx, loom_mul_mat(ctx, wv, x), 64, 2, N);
        loom_tensor *a = loom_flash_attn_ext(ctx, loom_permute(ctx, q, 0, 2, 1, 3),
                                             loom_permute(ctx, k, 0, 2, 1, 3),
                                             loom_permute(ctx, v, 0, 2, 1, 3), NULL, NULL, 0.125f,
                                             0.0f, 0.0f);
        loom_tensor *h = loom_add(ctx, loom_reshape_2d(ctx, a, 256, N), x);
        loom_tensor *out = loom_mul_mat(ctx, wu, h);
        LOOM_REQUIRE(out);
        loom_graph *g = loom_graph_new(ctx, 64);
        LOOM_REQUIRE(g && loom_graph_build_forward(g, out) == LOOM_OK);
        const size_t bytes = loom_nbytes(out);
        float *ref = malloc(bytes);
        LOOM_REQUIRE(ref);
        LOOM_CHECK_EQ_INT(loom_cpu_graph_compute(g, NULL), LOOM_OK);
        memcpy(ref, out->data, bytes);
        for (int threads = 2; threads <= 4; threads++) {
            loom_threadpool *tp = loom_threadpool_new_ex(threads, late_start, NULL, true);
            LOOM_REQUIRE(tp);
            for (int rep = 0; rep < 3; rep++) {
                memset(out->data, 0, bytes);
                LOOM_CHECK_EQ_INT(loom_cpu_graph_compute(g, tp), LOOM_OK);
                LOOM_CHECK_MSG(memcmp(out->data, ref, bytes) == 0,
                               "N %lld, %d threads, run %d: differs from one thread", (long long)N,
                               threads, rep);
            }
            loom_threadpool_free(tp);
        }
        free(ref);
        loom_ctx_free(ctx);
    }
}

/* ---------------------------------------------------------------- contention */

/* A backend of 2 threads in a process held to one CPU: its threads never hold more than
 * one core between them, so after LOOM__CPU_ADAPT_RUNS threaded runs it runs graphs on the
 * caller's thread (the pool's run count stops) for a stretch, then tries the threads
 * again; with LOOM_CPU_ADAPT=0 every run uses the pool. The values never change. */
LOOM_TEST(cpu_backend, threads_sharing_one_core_give_way_to_one_thread) {
    cpu_set_t saved, one;
    LOOM_REQUIRE(sched_getaffinity(0, sizeof saved, &saved) == 0);
    int cpu = -1;
    for (int c = 0; c < CPU_SETSIZE && cpu < 0; c++)
        if (CPU_ISSET(c, &saved)) cpu = c;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    LOOM_REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);

    /* unpinned workers (a NUMA default would bind them past the one CPU) */
    loom_cpu_set_affinity(LOOM_AFFINITY_NONE);

    loom_ctx *ctx = loom_cpu_test_ctx(48);
    LOOM_REQUIRE(ctx);
    /* 32 MiB of weights per run: well over the half millisecond a judged run needs */
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 4096, 2048);
    loom_tensor *x = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, 4096, 1);
    loom_cpu_test_fill_f32(w->data, 4096 * 2048, -1, 1);
    loom_cpu_test_fill_f32(x->data, 4096, -1, 1);
    loom_tensor *out = loom_mul_mat(ctx, w, x);
    loom_graph *g = loom_graph_new(ctx, 8);
    LOOM_REQUIRE(out && g && loom_graph_build_forward(g, out) == LOOM_OK);
    static float ref[2048];
    LOOM_CHECK_EQ_INT(loom_cpu_graph_compute(g, NULL), LOOM_OK);
    memcpy(ref, out->data, sizeof ref);

    for (int adapt = 1; adapt >= 0; adapt--) {
        if (adapt)
            unsetenv("LOOM_CPU_ADAPT");
        else
            setenv("LOOM_CPU_ADAPT", "0", 1);
        loom_backend_t be = loom_cpu_backend_new(2);
        LOOM_REQUIRE(be);
        int pooled[40];
        for (int r = 0; r < 40; r++) {
            loom_threadpool_stats a, b;
            loom_threadpool_get_stats(&a);
            memset(out->data, 0, sizeof ref);
            LOOM_CHECK_EQ_INT(loom_backend_graph_compute(be, g), LOOM_OK);
            loom_threadpool_get_stats(&b);
            pooled[r] = (int)(b.runs - a.runs);
            LOOM_CHECK(memcmp(out->data, ref, sizeof ref) == 0);
        }
        if (!adapt) {
            for (int r = 0; r < 40; r++)
                LOOM_CHECK_MSG(pooled[r] == 1, "LOOM_CPU_ADAPT=0: run %d did not use the pool", r);
        } else {
            /* 3 judged runs, 16 on one thread, a probe (judged again: contended), 32 alone */
            for (int r = 0; r < 3; r++)
                LOOM_CHECK_MSG(pooled[r] == 1, "run %d should use the threads", r);
            for (int r = 3; r < 19; r++)
                LOOM_CHECK_MSG(pooled[r] == 0, "run %d should run on one thread", r);
            LOOM_CHECK_MSG(pooled[19] == 1, "run 19 should try the threads again");
            for (int r = 20; r < 40; r++)
                LOOM_CHECK_MSG(pooled[r] == 0, "run %d should run on one thread (longer stretch)",
                               r);
        }
        loom_backend_free(be);
    }
    unsetenv("LOOM_CPU_ADAPT");
    loom_cpu_set_affinity(LOOM_AFFINITY_DEFAULT);
    loom_ctx_free(ctx);
    LOOM_CHECK(sched_setaffinity(0, sizeof saved, &saved) == 0);
}

/* ---------------------------------------------------------------- huge pages */

/* The AnonHugePages of /proc/self/smaps over the mapping holding p, in KiB (-1: unknown). */
static long anon_huge_kib_at(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    bool in = false;
    long kib = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && sscanf(line, "AnonHugePages: %ld kB", &kib) == 1) break;
    }
    fclose(f);
    return kib;
}

/* A large CPU buffer (weights read from a file, a KV cache) asks for transparent huge pages
 * before its pages are touched: where THP is in madvise mode (or always), the buffer is
 * backed by 2 MiB pages once written. */
LOOM_TEST(cpu_backend, large_buffers_get_huge_pages) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "";
    if (f) {
        if (!fgets(mode, sizeof mode, f)) mode[0] = 0;
        fclose(f);
    }
    if (!strstr(mode, "[madvise]") && !strstr(mode, "[always]"))
        LOOM_SKIP("transparent huge pages are off here (or no sysfs to say)");
    const size_t size = (size_t)64 << 20;
    loom_buffer_t buf = loom_buft_alloc_buffer(loom_cpu_buffer_type(), size);
    LOOM_REQUIRE(buf);
    char *base = loom_buffer_base(buf);
    memset(base, 1, size);
    const long kib = anon_huge_kib_at(base + size / 2);
    /* the kernel may have no huge page free; it has, on an idle test machine, most of them */
    LOOM_CHECK_MSG(kib > 0, "no huge pages behind a 64 MiB CPU buffer (AnonHugePages %ld kB)", kib);
    loom_buffer_free(buf);
}
