#include "tests/tools/plan_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/sim.h"
#include "tests/tools/stories.h"
#include "tools/plan.h"

bool loom_test_plan_real_run(const loom_test_run_cfg *c, loom_test_run_bytes *b) {
    memset(b, 0, sizeof *b);
    char spec[64];
    snprintf(spec, sizeof spec, "sim:%d,profile=rtx-3090,link=pcie4", c->n_dev);
    loom_session_params sp = loom_session_params_default();
    sp.devices = spec;
    sp.split_mode = c->mode;
    sp.threads = 1;
    sp.n_ctx = c->n_ctx;
    sp.n_batch = c->n_batch;
    sp.kv_type = c->kv_k;
    sp.kv_type_v_set = true;
    sp.kv_type_v = c->kv_v;
    sp.tensor_split = c->ts;
    sp.n_tensor_split = c->n_ts;
    if (c->host_layers > 0) sp.n_gpu_layers = 5 - c->host_layers; /* 5 layers: checked below */
    loom_session *s = NULL;
    if (loom_session_new(loom_test_stories(), NULL, &sp, &s)) return false;
    const int64_t V = loom_session_model(s)->hp.n_vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *ids = malloc((size_t)c->n_batch * sizeof *ids);
    bool ok = logits && ids && loom_session_model(s)->hp.n_layer == 5;
    for (int64_t i = 0; ok && i < c->n_batch; i++)
        ids[i] = (int32_t)(1 + i % (V - 1));
    ok = ok && loom_session_eval(s, ids, c->n_batch, false, logits) == LOOM_OK &&
         loom_session_eval(s, ids, 1, false, logits) == LOOM_OK;
    while (ok && c->to_depth && loom_session_n_past(s) < loom_session_n_ctx(s)) {
        int64_t left = loom_session_n_ctx(s) - loom_session_n_past(s);
        ok = loom_session_eval(s, ids, left < c->n_batch ? left : c->n_batch, false, logits) ==
             LOOM_OK;
    }
    if (ok && c->to_depth) ok = loom_session_n_past(s) == c->n_ctx;
    b->n_dev = loom_session_n_devices(s);
    for (int j = 0; ok && j < b->n_dev && j < 16; j++) {
        loom_sim_stats st;
        loom_sim_dev_stats(loom_session_device(s, j), &st);
        b->dev[j] = (double)st.mem_used;
    }
    loom_plan_session_host_bytes(s, &b->host_weights, &b->host_kv, &b->host_compute);
    free(ids);
    free(logits);
    loom_session_free(s);
    return ok;
}
