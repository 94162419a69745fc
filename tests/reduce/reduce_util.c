/* Helpers for the reduce tests (see reduce_util.h). */
#include "tests/reduce/reduce_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/shim/loom_test.h"

bool rt_devs_open(rt_devs *d, const char *spec_in) {
    memset(d, 0, sizeof *d);
    /* these tests are about the reducer's own algorithms: the sim reg's native
     * communicator (which AUTO would pick) only where a spec asks for it with comm=1 */
    char spec[256];
    snprintf(spec, sizeof spec, "%s%s", spec_in, strstr(spec_in, "comm=") ? "" : ",comm=0");
    loom_status s = loom_sim_reg_new_from_spec(spec, &d->reg);
    if (s != LOOM_OK) {
        loom_test_fail(__FILE__, __LINE__, "sim '%s': %s", spec, loom_last_error());
        return false;
    }
    d->n = (int)loom_reg_dev_count(d->reg);
    for (int j = 0; j < d->n; j++) {
        d->be[j] = loom_dev_init(loom_reg_dev_get(d->reg, (size_t)j), NULL);
        if (!d->be[j]) {
            loom_test_fail(__FILE__, __LINE__, "backend %d of '%s': %s", j, spec,
                           loom_last_error());
            rt_devs_close(d);
            return false;
        }
    }
    return true;
}

void rt_devs_close(rt_devs *d) {
    for (int j = 0; j < d->n; j++)
        loom_backend_free(d->be[j]);
    if (d->reg) loom_sim_reg_free(d->reg);
    memset(d, 0, sizeof *d);
}

bool rt_set_alloc(rt_set *s, const rt_devs *d, int64_t ne0, int64_t ne1) {
    memset(s, 0, sizeof *s);
    s->n = d->n;
    s->ne = ne0 * ne1;
    for (int j = 0; j < d->n; j++) {
        loom_ctx_params cp = {.mem_size = 8 * loom_tensor_overhead(), .no_alloc = true};
        s->ctx[j] = loom_ctx_new(cp);
        if (!s->ctx[j]) return false;
        s->whole[j] = loom_new_tensor_1d(s->ctx[j], LOOM_TYPE_F32, s->ne + 2 * RT_GUARD);
        if (!s->whole[j]) return false;
        loom_format_name(s->whole[j], "whole%d", j);
        s->buf[j] = loom_alloc_ctx_tensors(s->ctx[j], loom_backend_default_buft(d->be[j]));
        if (!s->buf[j]) return false;
        size_t off = RT_GUARD * sizeof(float);
        s->t[j] = ne1 == 1 ? loom_view_1d(s->ctx[j], s->whole[j], ne0, off)
                           : loom_view_2d(s->ctx[j], s->whole[j], ne0, ne1,
                                          (size_t)ne0 * sizeof(float), off);
        if (!s->t[j]) return false;
        if (!s->t[j]->buffer && loom_buffer_init_view(s->t[j]) != LOOM_OK) return false;
        loom_format_name(s->t[j], "partial%d", j);
    }
    return true;
}

void rt_set_free(rt_set *s) {
    for (int j = 0; j < s->n; j++) {
        loom_buffer_free(s->buf[j]);
        loom_ctx_free(s->ctx[j]);
    }
    memset(s, 0, sizeof *s);
}

static uint64_t rt_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float rt_val(uint64_t seed, int j, int64_t i) {
    /* cheap (two multiplies, no division): the 64 MiB cases generate ~10^8 of these */
    uint64_t z = ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ull ^
                 ((uint64_t)j + 1 + seed * 64) * 0xd1b54a32d192ed03ull;
    z ^= z >> 29;
    z *= 0xbf58476d1ce4e5b9ull;
    uint64_t k = ((z >> 32) * 2001u) >> 32; /* 0..2000 */
    return (float)((int)k - 1000) * (1.0f / 64.0f);
}

static float rt_bad(int64_t i) {
    return (i & 1) ? -INFINITY : NAN;
}

void rt_fill(rt_set *s, uint64_t seed, const bool *empty) {
    int64_t total = s->ne + 2 * RT_GUARD;
    float *buf = malloc((size_t)total * sizeof(float));
    LOOM_ASSERT(buf != NULL);
    for (int j = 0; j < s->n; j++) {
        bool e = empty && empty[j];
        for (int64_t i = 0; i < RT_GUARD; i++)
            buf[i] = buf[total - 1 - i] = RT_GUARD_VAL;
        for (int64_t i = 0; i < s->ne; i++)
            buf[RT_GUARD + i] = e ? rt_bad(i) : rt_val(seed, j, i);
        loom_tensor_set(s->whole[j], buf, 0, (size_t)total * sizeof(float));
    }
    free(buf);
}

float *rt_expected(const rt_set *s, uint64_t seed, const bool *empty) {
    float *out = malloc((size_t)(s->ne ? s->ne : 1) * sizeof(float));
    LOOM_ASSERT(out != NULL);
    for (int64_t i = 0; i < s->ne; i++) {
        double acc = 0.0;
        for (int j = 0; j < s->n; j++) {
            if (!(empty && empty[j])) acc += (double)rt_val(seed, j, i);
        }
        out[i] = (float)acc;
    }
    return out;
}

int rt_check(const rt_set *s, const float *expected, const char *what) {
    int64_t total = s->ne + 2 * RT_GUARD;
    float *buf = malloc((size_t)total * sizeof(float));
    LOOM_ASSERT(buf != NULL);
    int bad_devs = 0;
    for (int j = 0; j < s->n; j++) {
        loom_tensor_get(s->whole[j], buf, 0, (size_t)total * sizeof(float));
        bool bad = false;
        for (int64_t i = 0; i < RT_GUARD && !bad; i++) {
            if (buf[i] != RT_GUARD_VAL || buf[total - 1 - i] != RT_GUARD_VAL) {
                loom_test_fail(__FILE__, __LINE__, "%s: device %d: guard overwritten (%s)", what, j,
                               buf[i] != RT_GUARD_VAL ? "before" : "after");
                bad = true;
            }
        }
        if (!bad && memcmp(buf + RT_GUARD, expected, (size_t)s->ne * sizeof(float)) != 0) {
            int64_t i = 0;
            while (i < s->ne && memcmp(&buf[RT_GUARD + i], &expected[i], sizeof(float)) == 0)
                i++;
            loom_test_fail(__FILE__, __LINE__,
                           "%s: device %d of %d, element %lld of %lld: got %.9g, expected %.9g",
                           what, j, s->n, (long long)i, (long long)s->ne, (double)buf[RT_GUARD + i],
                           (double)expected[i]);
            bad = true;
        }
        bad_devs += bad;
    }
    free(buf);
    return bad_devs;
}

float *rt_fill_real(rt_set *s, uint64_t seed) {
    float *in = malloc((size_t)s->n * (size_t)s->ne * sizeof(float));
    LOOM_ASSERT(in != NULL);
    for (int j = 0; j < s->n; j++) {
        float *x = in + (size_t)j * (size_t)s->ne;
        for (int64_t i = 0; i < s->ne; i++) {
            uint64_t z = rt_mix(seed ^ ((uint64_t)j << 48) ^ (uint64_t)i);
            x[i] = (float)(int32_t)(z >> 32) * (1.0f / 2147483648.0f);
        }
        loom_tensor_set(s->t[j], x, 0, (size_t)s->ne * sizeof(float));
    }
    return in;
}

void rt_read(const rt_set *s, int j, float *out) {
    loom_tensor_get(s->t[j], out, 0, (size_t)s->ne * sizeof(float));
}

loom_reducer *rt_reducer(const rt_devs *d, loom_allreduce_algo algo) {
    loom_reducer_params p = loom_reducer_params_default();
    p.algorithm = algo;
    loom_backend_t be[RT_MAX];
    memcpy(be, d->be, sizeof be);
    loom_reducer *r = loom_reducer_new(be, d->n, &p);
    if (!r) {
        loom_test_fail(__FILE__, __LINE__, "loom_reducer_new(%d, %s): %s", d->n,
                       loom_allreduce_algo_name(algo), loom_last_error());
    }
    return r;
}
