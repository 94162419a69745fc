/*
 * Token sampling: greedy (temp <= 0), or llama.cpp's chain: top-k, top-p (nucleus, over the
 * softmax before the temperature), min-p, then the temperature softmax, drawn from a seeded
 * xoshiro256** stream so a seed reproduces a run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/model.h"

struct loom_sampler {
    loom_sampler_params p;
    uint64_t s[4];
    /* scratch, grown on demand */
    struct cand { float logit; int32_t id; } *cand;
    float *prob;
    int64_t cap;
};

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(loom_sampler *s) {
    uint64_t r = rotl(s->s[1] * 5, 7) * 9, t = s->s[1] << 17;
    s->s[2] ^= s->s[0];
    s->s[3] ^= s->s[1];
    s->s[1] ^= s->s[2];
    s->s[0] ^= s->s[3];
    s->s[2] ^= t;
    s->s[3] = rotl(s->s[3], 45);
    return r;
}

loom_sampler *loom_sampler_new(const loom_sampler_params *p) {
    loom_sampler *s = loom_calloc(1, sizeof *s);
    if (!s) {
        loom_error(LOOM_ERR_NOMEM, "sampler: out of memory");
        return NULL;
    }
    s->p = *p;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->s[i] = splitmix(&x);
    return s;
}

void loom_sampler_free(loom_sampler *s) {
    if (!s) return;
    loom_free(s->cand);
    loom_free(s->prob);
    loom_free(s);
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static int by_logit_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

int32_t loom_sampler_sample(loom_sampler *s, const float *logits, int64_t n) {
    if (s->p.temp <= 0.0f) return argmax(logits, n);
    if (n > s->cap) {
        struct cand *cand = loom_realloc(s->cand, (size_t)n * sizeof *cand);
        if (cand) s->cand = cand;
        float *prob = loom_realloc(s->prob, (size_t)n * sizeof *prob);
        if (prob) s->prob = prob;
        if (!cand || !prob) return argmax(logits, n); /* out of memory: degrade to greedy */
        s->cap = n;
    }
    for (int64_t i = 0; i < n; i++) s->cand[i] = (struct cand){logits[i], (int32_t)i};
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_logit_desc);
    int64_t k = n;
    if (s->p.top_k > 0 && s->p.top_k < k) k = s->p.top_k;
    const double mx = s->cand[0].logit;
    if (s->p.top_p < 1.0f) { /* the nucleus of the untempered distribution, as llama.cpp */
        double sum1 = 0, cum = 0;
        for (int64_t i = 0; i < k; i++)
            sum1 += (s->prob[i] = (float)exp(s->cand[i].logit - mx));
        for (int64_t i = 0; i < k; i++) {
            cum += s->prob[i] / sum1;
            if (cum >= s->p.top_p) {
                k = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0.0f) { /* p_i >= min_p * p_max, i.e. logit_i >= max + log(min_p) */
        const double cut = mx + log((double)s->p.min_p);
        int64_t keep = 1;
        while (keep < k && s->cand[keep].logit >= cut)
            keep++;
        k = keep;
    }
    double sum = 0;
    for (int64_t i = 0; i < k; i++) {
        s->prob[i] = (float)exp((s->cand[i].logit - mx) / s->p.temp);
        sum += s->prob[i];
    }
    double r = (double)(next_u64(s) >> 11) / 9007199254740992.0 * sum;
    for (int64_t i = 0; i < k; i++) {
        r -= s->prob[i];
        if (r < 0) return s->cand[i].id;
    }
    return s->cand[k - 1].id;
}
