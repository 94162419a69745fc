/*
 * Uneven tensor splits save memory on the smaller member (review finding m1): a meta buffer
 * made for a list of tensors placed one after another holds on member j only member j's
 * slices. Checked against the sim's own per-device allocation count, for 3/1 and 1/3 over
 * sim:2 and 2/1/1 over sim:3: member bytes follow the proportions, a MIRRORED tensor takes
 * its full size on every member, data round-trips and each member holds the right columns.
 * A session over sim:2 with -ts 3/1 loads stories260K, matches the CPU session's logits,
 * and what its weights take on each sim is what the sim allocated.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/meta.h"
#include "loom/sched.h"
#include "loom/session.h"
#include "loom/sim.h"
#include "tests/shim/loom_test.h"
#include "tests/tools/stories.h"

static int g_n;
static int64_t g_cols[3]; /* columns of "split" on each member */

/* "split" is split on axis 1 by g_cols, everything else MIRRORED. */
static loom_status leaf(const loom_tensor *t, loom_split_state *out, void *ud) {
    (void)ud;
    if (strcmp(t->name, "split") != 0) return LOOM_OK;
    loom_split_state_init(out, LOOM_SPLIT_AXIS_1, g_n);
    return loom_split_state_add_segment(out, g_cols, 1);
}

static size_t up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

static size_t sim_used(loom_dev_t d) {
    loom_sim_stats st;
    loom_sim_dev_stats(d, &st);
    return st.mem_used;
}

/* One uneven layout: a [R, C] F32 "split" with columns cols[0..n) and a mirrored [R]. */
static void check_layout(int n, const int64_t *cols) {
    enum { R = 64 };
    int64_t C = 0;
    for (int j = 0; j < n; j++)
        C += g_cols[j] = cols[j];
    g_n = n;
    char spec[32];
    snprintf(spec, sizeof spec, "sim:%d", n);
    loom_reg_t reg = NULL;
    LOOM_REQUIRE(loom_sim_reg_new_from_spec(spec, &reg) == LOOM_OK);
    loom_dev_t devs[3], meta = NULL;
    for (int j = 0; j < n; j++)
        devs[j] = loom_reg_dev_get(reg, (size_t)j);
    LOOM_REQUIRE(loom_meta_device_new(devs, n, leaf, NULL, &meta) == LOOM_OK);
    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 8 * loom_tensor_overhead(), .no_alloc = true});
    loom_tensor *w = loom_new_tensor_2d(ctx, LOOM_TYPE_F32, R, C);
    loom_set_name(w, "split");
    loom_tensor *m = loom_new_tensor_1d(ctx, LOOM_TYPE_F32, R);
    loom_set_name(m, "mirrored");

    size_t before[3];
    for (int j = 0; j < n; j++)
        before[j] = sim_used(devs[j]);
    loom_buft_t buft = loom_dev_buffer_type(meta);
    loom_buffer_t buf = loom_alloc_ctx_tensors(ctx, buft);
    LOOM_CHECK_MSG(buf != NULL, "alloc: %s", loom_last_error());
    LOOM_REQUIRE(buf != NULL);
    size_t a = loom_buft_alignment(buft);
    for (int j = 0; j < n; j++) {
        /* member j: its own columns of "split" plus the whole mirrored vector */
        size_t want = up((size_t)(R * cols[j]) * 4, a) + up(R * 4, a);
        size_t got = sim_used(devs[j]) - before[j];
        LOOM_CHECK_MSG(got == want, "%s member %d: sim allocated %zu bytes, want %zu", spec, j, got,
                       want);
        LOOM_CHECK_EQ_INT(loom_buffer_size(loom_meta_buffer_member(buf, j)), got);
    }

    float *x = malloc(sizeof(float) * (size_t)(R * C)),
          *y = malloc(sizeof(float) * (size_t)(R * C));
    for (int64_t i = 0; i < R * C; i++)
        x[i] = (float)i * 0.5f - 7.0f;
    loom_tensor_set(w, x, 0, loom_nbytes(w));
    loom_tensor_set(m, x, 0, loom_nbytes(m));
    memset(y, 0, sizeof(float) * (size_t)(R * C));
    loom_tensor_get(w, y, 0, loom_nbytes(w));
    LOOM_CHECK(memcmp(x, y, loom_nbytes(w)) == 0);
    memset(y, 0, sizeof(float) * (size_t)R);
    loom_tensor_get(m, y, 0, loom_nbytes(m));
    LOOM_CHECK(memcmp(x, y, loom_nbytes(m)) == 0);
    /* member j holds columns [c0, c0 + cols[j]) of "split", and the whole mirrored vector */
    int64_t c0 = 0;
    for (int j = 0; j < n; j++) {
        loom_buffer_t db = loom_meta_buffer_member(buf, j);
        size_t ow = loom_meta_buffer_member_offset(buf, w, j),
               om = loom_meta_buffer_member_offset(buf, m, j);
        LOOM_REQUIRE(ow != SIZE_MAX && om != SIZE_MAX);
        loom_tensor tw = {.type = LOOM_TYPE_F32, .ne = {R * cols[j] + R, 1, 1, 1}, .buffer = db};
        tw.nb[0] = 4;
        tw.nb[1] = tw.nb[2] = tw.nb[3] = 4 * (size_t)tw.ne[0];
        tw.data = (char *)loom_buffer_base(db) + ow;
        loom_tensor tm = tw;
        tm.ne[0] = R;
        tm.data = (char *)loom_buffer_base(db) + om;
        if (cols[j] > 0) {
            loom_tensor_get(&tw, y, 0, (size_t)(R * cols[j]) * 4);
            LOOM_CHECK_MSG(memcmp(y, x + R * c0, (size_t)(R * cols[j]) * 4) == 0,
                           "member %d columns", j);
        }
        loom_tensor_get(&tm, y, 0, R * 4);
        LOOM_CHECK_MSG(memcmp(y, x, R * 4) == 0, "member %d mirrored", j);
        c0 += cols[j];
    }
    LOOM_CHECK(loom_meta_buffer_member_offset(buf, m, n) == SIZE_MAX);
    free(x);
    free(y);
    loom_buffer_free(buf);
    for (int j = 0; j < n; j++)
        LOOM_CHECK_EQ_INT(sim_used(devs[j]), before[j]);
    loom_ctx_free(ctx);
    loom_meta_device_free(meta);
    loom_sim_reg_free(reg);
}

LOOM_TEST(meta_uneven, members_hold_only_their_slices) {
    check_layout(2, (int64_t[]){48, 16}); /* -ts 3/1 */
    check_layout(2, (int64_t[]){16, 48}); /* -ts 1/3 */
    check_layout(3, (int64_t[]){32, 16, 16});
    check_layout(2, (int64_t[]){64, 0}); /* an empty slice takes nothing */
}

static float *logits(const char *path, const loom_session_params *p, int64_t *V,
                     loom_session **keep) {
    static const int32_t ids[] = {1, 403, 407, 261, 378};
    loom_session *s = NULL;
    loom_status st = loom_session_new(path, NULL, p, &s);
    LOOM_CHECK_MSG(st == LOOM_OK, "session on %s: %s", p->devices, loom_last_error());
    if (st != LOOM_OK) return NULL;
    *V = loom_session_model(s)->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)*V);
    st = loom_session_eval(s, ids, 5, false, out);
    LOOM_CHECK_MSG(st == LOOM_OK, "eval on %s: %s", p->devices, loom_last_error());
    *keep = s;
    return out;
}

/* Bytes of member j's buffers among bufs (meta buffers only). */
static size_t member_bytes(loom_buffer_t *bufs, int nb, int j) {
    size_t b = 0;
    for (int i = 0; i < nb; i++)
        if (loom_dev_is_meta(loom_buft_device(loom_buffer_buft(bufs[i]))))
            b += loom_buffer_size(loom_meta_buffer_member(bufs[i], j));
    return b;
}

LOOM_TEST(meta_uneven, session_ts_3_1_saves_memory_and_matches_cpu) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    loom_session_params p = loom_session_params_default();
    p.devices = "cpu";
    p.n_ctx = 64;
    p.threads = 1;
    int64_t V = 0, V2 = 0;
    loom_session *cpu = NULL, *tp = NULL;
    float *want = logits(path, &p, &V, &cpu);
    LOOM_REQUIRE(want != NULL);
    static const float ts[2][2] = {{3, 1}, {1, 3}};
    for (int k = 0; k < 2; k++) {
        p.devices = "sim:2";
        p.split_mode = LOOM_SPLIT_MODE_TENSOR;
        p.tensor_split = ts[k];
        p.n_tensor_split = 2;
        float *got = logits(path, &p, &V2, &tp);
        LOOM_REQUIRE(got != NULL);
        LOOM_REQUIRE(V2 == V);
        double worst = 0, scale = 1;
        for (int64_t i = 0; i < V; i++) {
            double d = fabs((double)got[i] - want[i]);
            if (d > worst) worst = d;
            if (fabs(want[i]) > scale) scale = fabs(want[i]);
        }
        LOOM_CHECK_MSG(worst <= 1e-4 * scale, "-ts %g/%g: logits differ by %g", ts[k][0], ts[k][1],
                       worst);
        const loom_model *m = loom_session_model(tp);
        const loom_kv_cache *kv = loom_session_kv(tp);
        loom_sched *sc = loom_session_sched(tp);
        size_t compute = 0;
        loom_dev_t meta = NULL;
        for (int b = 0; b < loom_sched_get_n_backends(sc); b++) {
            loom_backend_t be = loom_sched_get_backend(sc, b);
            if (!loom_backend_is_meta(be)) continue;
            compute = loom_sched_get_buffer_size(sc, be);
            meta = loom_backend_device(be);
        }
        LOOM_REQUIRE(meta != NULL);
        size_t w[2], all[2];
        for (int j = 0; j < 2; j++) {
            w[j] = member_bytes(m->buffers, m->n_buffers, j);
            all[j] = w[j] + member_bytes(kv->buffers, kv->n_buffers, j);
            /* the compute buffer is shared: its meta size on every member */
            all[j] += compute;
            LOOM_CHECK_MSG(all[j] == sim_used(loom_meta_member(meta, j)),
                           "member %d: buffers say %zu bytes, the sim allocated %zu", j, all[j],
                           sim_used(loom_meta_member(meta, j)));
        }
        fprintf(stderr, "-ts %g/%g on sim:2: weights %zu / %zu bytes per member\n", ts[k][0],
                ts[k][1], w[0], w[1]);
        /* the bigger share holds more weights (the mirrored ones are on both) */
        int big = ts[k][0] > ts[k][1] ? 0 : 1;
        LOOM_CHECK_MSG(w[big] > w[1 - big] + w[1 - big] / 2, "-ts %g/%g: weights %zu / %zu bytes",
                       ts[k][0], ts[k][1], w[0], w[1]);
        loom_session_free(tp);
        free(got);
    }
    loom_session_free(cpu);
    free(want);
}

/* The memory check before loading counts each device's own -ts share: with -ts 1/3 the
 * first device's quarter fits in 2 MiB and the refusal names the second device. */
LOOM_TEST(meta_uneven, memory_check_counts_each_devices_own_share) {
    const char *path = loom_test_stories();
    if (!path) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    static const float ts[2] = {1, 3};
    loom_session_params p = loom_session_params_default();
    p.devices = "sim:2,mem=2MiB";
    p.split_mode = LOOM_SPLIT_MODE_TENSOR;
    p.n_ctx = 4096; /* about 5 MiB of KV cache in all */
    p.threads = 1;
    p.tensor_split = ts;
    p.n_tensor_split = 2;
    loom_session *s = NULL;
    LOOM_CHECK(loom_session_new(path, NULL, &p, &s) == LOOM_ERR_DEVICE_OOM);
    LOOM_CHECK(s == NULL);
    LOOM_CHECK_STR_CONTAINS(loom_last_error(), "SIM1, which has 2.0 MiB free");
}
