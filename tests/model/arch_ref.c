/*
 * The naive reference forward pass (see arch_ref.h). What it implements, per layer:
 *   h = rms_norm(x) * attn_norm; q, k, v = W h + b (or one fused W_qkv)
 *   qwen3: q, k per head = rms_norm(.) * attn_[qk]_norm
 *   rope at position p: theta_i = p * scale * base^(-2i/n_rot) / rope_freqs[i], pairs
 *   (2i, 2i+1) for llama/mistral/mixtral, (i, i + n_rot/2) for the qwen family
 *   causal softmax(q.k / sqrt(D)) over positions <= p, query head h reading KV head
 *   h / (H / Hk); x += W_o a + b_o
 *   h = rms_norm(x) * ffn_norm; dense: x += W_down (silu(W_gate h) * W_up h)
 *   MoE: p = softmax(W_router h), the top U experts, weights p (divided by their sum
 *   except for qwen2moe), expert FFNs with their biases; qwen2moe adds the shared expert
 *   times sigmoid(w_gate_shexp . h)
 *   logits = (output or token_embd) (rms_norm(x) * output_norm)
 * gemma2 / gemma3: x starts as token_embd[t] * sqrt(n_embd); the attention and FFN outputs
 * pass through their post norms before the residual add; the FFN is gelu(gate) * up;
 * sliding-window layers (gemma2: even layers, gemma3: il % 6 < 5) see positions
 * p - j < attention.sliding_window; gemma3's sliding layers use rope base 10000 without
 * scaling; gemma2 caps attention scores (50 tanh(s / 50)) and logits (30 tanh(l / 30)).
 * phi3: ffn_up = [gate; up] rows; every layer slides when the file gives a window.
 * gpt-oss: attention biases; a sink logit per head joins every softmax; even layers slide;
 * YaRN rope as ggml computes it (theta = mix of s theta and theta by the ramp between the
 * correction dims, cos and sin times 1 + 0.1 ln(1/s)); pre-FFN norm post_attention_norm;
 * router bias, weights = the chosen experts' probabilities renormalised (the same as a
 * softmax over their logits); experts min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, 7) + 1).
 */
#include "tests/model/arch_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref {
    const loom_gguf *g;
    loom_hparams hp;
    loom_status st;
} ref;

/* The tensor as floats (malloc), or NULL when absent. */
static float *tensor(ref *r, const char *name, bool required) {
    int64_t ti = loom_gguf_find_tensor(r->g, name);
    if (ti < 0) {
        if (required && !r->st) r->st = loom_error(LOOM_ERR_FORMAT, "ref: no tensor '%s'", name);
        return NULL;
    }
    int64_t ne[4];
    loom_gguf_tensor_ne(r->g, ti, ne);
    int64_t n = ne[0] * ne[1] * ne[2] * ne[3];
    float *f = malloc((size_t)n * sizeof *f);
    loom_type t = loom_gguf_tensor_type(r->g, ti);
    if (t == LOOM_TYPE_F32)
        memcpy(f, loom_gguf_tensor_data(r->g, ti), (size_t)n * sizeof *f);
    else
        loom_type_traits_get(t)->to_float(loom_gguf_tensor_data(r->g, ti), f, n);
    return f;
}

static float *layer_tensor(ref *r, int il, const char *suffix, bool required) {
    char name[128];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    return tensor(r, name, required);
}

/* y[rows] = W [rows][cols] x + b */
static void matvec(const float *W, const float *b, const double *x, int64_t cols, int64_t rows,
                   double *y) {
    for (int64_t r = 0; r < rows; r++) {
        double s = b ? b[r] : 0.0;
        for (int64_t c = 0; c < cols; c++)
            s += (double)W[r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rms_norm(const double *x, const float *w, int64_t n, double eps, double *y) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double k = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * k * (w ? w[i] : 1.0);
}

static double silu(double x) {
    return x / (1.0 + exp(-x));
}

static double gelu(double x) {
    return 0.5 * x *
           (1.0 + tanh(0.7978845608028654 /* sqrt(2 / pi) */ * (x + 0.044715 * x * x * x)));
}

static double key_or(const loom_gguf *g, const char *arch, const char *suffix, double dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double f;
    return loom_gguf_find_kv(g, key) >= 0 && loom_gguf_get_float(g, key, &f) == LOOM_OK ? f : dflt;
}

static bool gelu_ffn, oai_swiglu;

/* ggml's YaRN: corr dims from beta_fast / beta_slow, a linear ramp between them */
static double corr_dim(double n_dims, double n_orig, double beta, double base) {
    return n_dims * log(n_orig / (beta * 2.0 * 3.14159265358979323846)) / (2.0 * log(base));
}

static void rope_yarn(double *v, int64_t n_rot, int64_t pos, double base, double s, double n_orig,
                      double ext) {
    double lo = fmax(0.0, floor(corr_dim((double)n_rot, n_orig, 32.0, base)));
    double hi = fmin((double)n_rot - 1, ceil(corr_dim((double)n_rot, n_orig, 1.0, base)));
    double mscale = 1.0 + 0.1 * log(1.0 / s);
    for (int64_t i = 0; i < n_rot / 2; i++) {
        double extrap = (double)pos * pow(base, -2.0 * (double)i / (double)n_rot);
        double y = ((double)i - lo) / fmax(0.001, hi - lo);
        double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * ext;
        double theta = s * extrap * (1.0 - mix) + extrap * mix;
        int64_t a = i, b = i + n_rot / 2; /* neox */
        double c = cos(theta) * mscale, sn = sin(theta) * mscale, x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * sn;
        v[b] = x0 * sn + x1 * c;
    }
}

static double rope_mscale = 1.0;

static void rope(double *v, int64_t n_rot, bool neox, int64_t pos, double base, double scale,
                 const float *factors) {
    for (int64_t i = 0; i < n_rot / 2; i++) {
        double theta = (double)pos * scale * pow(base, -2.0 * (double)i / (double)n_rot);
        if (factors) theta /= factors[i];
        int64_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        double c = cos(theta) * rope_mscale, s = sin(theta) * rope_mscale, x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

/* y [E] = W_down (silu(W_gate h + bg) * (W_up h + bu)) + bd */
static void glu_ffn(const float *wg, const float *bg, const float *wu, const float *bu,
                    const float *wd, const float *bd, const double *h, int64_t E, int64_t F,
                    double *y) {
    double *g = malloc((size_t)F * sizeof *g), *u = malloc((size_t)F * sizeof *u);
    matvec(wg, bg, h, E, F, g);
    matvec(wu, bu, h, E, F, u);
    for (int64_t i = 0; i < F; i++) {
        if (oai_swiglu) {
            double xg = fmin(g[i], 7.0), yu = fmin(fmax(u[i], -7.0), 7.0);
            g[i] = xg / (1.0 + exp(-1.702 * xg)) * (yu + 1.0);
        } else {
            g[i] = (gelu_ffn ? gelu(g[i]) : silu(g[i])) * u[i];
        }
    }
    matvec(wd, bd, g, F, E, y);
    free(g);
    free(u);
}

loom_status arch_ref_logits(const loom_gguf *g, const int32_t *ids, int n, float *out) {
    ref r = {.g = g};
    loom_status st = loom_hparams_from_gguf(g, &r.hp);
    if (st) return st;
    const loom_hparams *hp = &r.hp;
    const char *arch = hp->arch;
    const bool gemma = strncmp(arch, "gemma", 5) == 0, gemma2 = strcmp(arch, "gemma2") == 0;
    gelu_ffn = gemma;
    const bool phi3 = strcmp(arch, "phi3") == 0, gptoss = strcmp(arch, "gpt-oss") == 0;
    const bool neox = strncmp(arch, "qwen", 4) == 0 || gemma || phi3 || gptoss;
    oai_swiglu = gptoss;
    const double yarn_orig =
        gptoss ? key_or(g, arch, "rope.scaling.original_context_length", 0) : 0;
    const int64_t n_swa =
        gemma || phi3 || gptoss
            ? (int64_t)key_or(g, arch, "attention.sliding_window", gemma2 ? 4096 : 0)
            : 0;
    const double attn_cap = gemma2 ? key_or(g, arch, "attention.logit_softcapping", 50.0) : 0;
    const double final_cap = gemma2 ? key_or(g, arch, "final_logit_softcapping", 30.0) : 0;
    const bool norm_topk = strcmp(arch, "qwen2moe") != 0;
    const int64_t E = hp->n_embd, H = hp->n_head, Hk = hp->n_head_kv, D = hp->head_dim;
    const int64_t V = hp->n_vocab, F = hp->n_ff, X = hp->n_expert, U = hp->n_expert_used;
    const int64_t Dq = H * D, Dkv = Hk * D, L = hp->n_layer;
    double freq_scale = 1.0;
    {
        char key[128];
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        double f;
        if (loom_gguf_find_kv(g, key) >= 0 && loom_gguf_get_float(g, key, &f) == LOOM_OK)
            freq_scale = 1.0 / f;
    }
    float *embd = tensor(&r, "token_embd.weight", true);
    float *onorm = tensor(&r, "output_norm.weight", true);
    float *outw = tensor(&r, "output.weight", false);
    float *freqs = tensor(&r, "rope_freqs.weight", false);
    /* phi3 longrope: long factors when the cache (ARCH_REF_N_CTX) exceeds the trained
     * context, and cos, sin times rope.scaling.attn_factor */
    float *rlong = tensor(&r, "rope_factors_long.weight", false);
    float *rshort = tensor(&r, "rope_factors_short.weight", false);
    const double orig =
        key_or(g, arch, "rope.scaling.original_context_length", (double)hp->n_ctx_train);
    rope_mscale = key_or(g, arch, "rope.scaling.attn_factor", 1.0);
    if (rlong) freqs = ARCH_REF_N_CTX > orig ? rlong : rshort;
    double *kc = calloc((size_t)(L * n * Dkv), sizeof *kc),
           *vc = calloc((size_t)(L * n * Dkv), sizeof *vc);
    double *x = malloc((size_t)E * sizeof *x), *h = malloc((size_t)E * sizeof *h);
    double *qkv = malloc((size_t)(Dq + 2 * Dkv) * sizeof *qkv), *a = malloc((size_t)Dq * sizeof *a);
    double *o = malloc((size_t)E * sizeof *o), *y = malloc((size_t)E * sizeof *y);
    double *att = malloc((size_t)n * sizeof *att),
           *lg = malloc((size_t)(X > 0 ? X : 1) * sizeof *lg);
    double *lv = malloc((size_t)V * sizeof *lv);
    for (int t = 0; t < n && !r.st; t++) {
        for (int64_t i = 0; i < E; i++)
            x[i] = embd[(int64_t)ids[t] * E + i] * (gemma ? sqrt((double)E) : 1.0);
        for (int il = 0; il < L && !r.st; il++) {
            const bool swa = n_swa > 0 && (gemma2 || gptoss ? il % 2 == 0
                                           : gemma          ? il % 6 < 5
                                                            : true);
            const bool gemma3_swa = swa && gemma && !gemma2;
            const double base = gemma3_swa ? 10000.0 : hp->rope_freq_base;
            const double fscale = gemma3_swa ? 1.0 : freq_scale;
            float *pan = gptoss ? NULL : layer_tensor(&r, il, "post_attention_norm.weight", false);
            float *sinks = layer_tensor(&r, il, "attn_sinks.weight", false);
            float *pfn = layer_tensor(&r, il, "post_ffw_norm.weight", false);
            float *an = layer_tensor(&r, il, "attn_norm.weight", true);
            float *wqkv = layer_tensor(&r, il, "attn_qkv.weight", false);
            float *bqkv = layer_tensor(&r, il, "attn_qkv.bias", false);
            float *wq = layer_tensor(&r, il, "attn_q.weight", !wqkv),
                  *bq = layer_tensor(&r, il, "attn_q.bias", false);
            float *wk = layer_tensor(&r, il, "attn_k.weight", !wqkv),
                  *bk = layer_tensor(&r, il, "attn_k.bias", false);
            float *wv = layer_tensor(&r, il, "attn_v.weight", !wqkv),
                  *bv = layer_tensor(&r, il, "attn_v.bias", false);
            float *qn = layer_tensor(&r, il, "attn_q_norm.weight", false);
            float *kn = layer_tensor(&r, il, "attn_k_norm.weight", false);
            float *wo = layer_tensor(&r, il, "attn_output.weight", true),
                  *bo = layer_tensor(&r, il, "attn_output.bias", false);
            float *fn = layer_tensor(
                &r, il, gptoss ? "post_attention_norm.weight" : "ffn_norm.weight", true);
            if (r.st) break;
            rms_norm(x, an, E, hp->rms_eps, h);
            double *q = qkv, *k = qkv + Dq, *v = qkv + Dq + Dkv;
            if (wqkv) {
                matvec(wqkv, bqkv, h, E, Dq + 2 * Dkv, qkv);
            } else {
                matvec(wq, bq, h, E, Dq, q);
                matvec(wk, bk, h, E, Dkv, k);
                matvec(wv, bv, h, E, Dkv, v);
            }
            for (int64_t hh = 0; hh < H; hh++) {
                if (qn) rms_norm(q + hh * D, qn, D, hp->rms_eps, q + hh * D);
                if (yarn_orig > 0)
                    rope_yarn(q + hh * D, hp->n_rot, t, base, fscale, yarn_orig, 1.0);
                else
                    rope(q + hh * D, hp->n_rot, neox, t, base, fscale, freqs);
            }
            for (int64_t hh = 0; hh < Hk; hh++) {
                if (kn) rms_norm(k + hh * D, kn, D, hp->rms_eps, k + hh * D);
                if (yarn_orig > 0)
                    rope_yarn(k + hh * D, hp->n_rot, t, base, fscale, yarn_orig, 1.0);
                else
                    rope(k + hh * D, hp->n_rot, neox, t, base, fscale, freqs);
            }
            memcpy(kc + ((int64_t)il * n + t) * Dkv, k, (size_t)Dkv * sizeof *k);
            memcpy(vc + ((int64_t)il * n + t) * Dkv, v, (size_t)Dkv * sizeof *v);
            for (int64_t hh = 0; hh < H; hh++) {
                int64_t kh = hh / (H / Hk);
                double mx = -INFINITY, sum = 0;
                const int j0 = swa && t - n_swa + 1 > 0 ? (int)(t - n_swa + 1) : 0;
                for (int j = j0; j <= t; j++) {
                    const double *kj = kc + ((int64_t)il * n + j) * Dkv + kh * D;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++)
                        s += q[hh * D + d] * kj[d];
                    att[j] = s / sqrt((double)D);
                    if (attn_cap > 0) att[j] = attn_cap * tanh(att[j] / attn_cap);
                    mx = fmax(mx, att[j]);
                }
                for (int j = 0; j < j0; j++)
                    att[j] = 0;
                if (sinks) mx = fmax(mx, sinks[hh]);
                for (int j = j0; j <= t; j++)
                    sum += att[j] = exp(att[j] - mx);
                if (sinks) sum += exp(sinks[hh] - mx); /* in the sum, no value */
                for (int64_t d = 0; d < D; d++) {
                    double s = 0;
                    for (int j = 0; j <= t; j++)
                        s += att[j] * vc[((int64_t)il * n + j) * Dkv + kh * D + d];
                    a[hh * D + d] = s / sum;
                }
            }
            matvec(wo, bo, a, Dq, E, o);
            if (pan) rms_norm(o, pan, E, hp->rms_eps, o);
            for (int64_t i = 0; i < E; i++)
                x[i] += o[i];
            rms_norm(x, fn, E, hp->rms_eps, h);
            if (X == 0) {
                float *wg = layer_tensor(&r, il, "ffn_gate.weight", false),
                      *wu = layer_tensor(&r, il, "ffn_up.weight", true);
                float *wd = layer_tensor(&r, il, "ffn_down.weight", true);
                /* phi3: no ffn_gate, ffn_up holds the gate rows then the up rows */
                if (!r.st && wg) glu_ffn(wg, NULL, wu, NULL, wd, NULL, h, E, F, y);
                if (!r.st && !wg) glu_ffn(wu, NULL, wu + F * E, NULL, wd, NULL, h, E, F, y);
                if (!r.st && pfn) rms_norm(y, pfn, E, hp->rms_eps, y);
                for (int64_t i = 0; i < E && !r.st; i++)
                    x[i] += y[i];
                free(wg);
                free(wu);
                free(wd);
            } else {
                float *wr = layer_tensor(&r, il, "ffn_gate_inp.weight", true);
                float *br = layer_tensor(&r, il, "ffn_gate_inp.bias", false);
                float *wg = layer_tensor(&r, il, "ffn_gate_exps.weight", true),
                      *wu = layer_tensor(&r, il, "ffn_up_exps.weight", true);
                float *wd = layer_tensor(&r, il, "ffn_down_exps.weight", true);
                float *bg = layer_tensor(&r, il, "ffn_gate_exps.bias", false),
                      *bu = layer_tensor(&r, il, "ffn_up_exps.bias", false);
                float *bd = layer_tensor(&r, il, "ffn_down_exps.bias", false);
                float *sgi = layer_tensor(&r, il, "ffn_gate_inp_shexp.weight", false);
                float *sg = layer_tensor(&r, il, "ffn_gate_shexp.weight", false),
                      *su = layer_tensor(&r, il, "ffn_up_shexp.weight", false);
                float *sd = layer_tensor(&r, il, "ffn_down_shexp.weight", false);
                if (!r.st) {
                    matvec(wr, br, h, E, X, lg);
                    double mx = -INFINITY, sum = 0;
                    for (int64_t e = 0; e < X; e++)
                        mx = fmax(mx, lg[e]);
                    for (int64_t e = 0; e < X; e++)
                        sum += lg[e] = exp(lg[e] - mx);
                    for (int64_t e = 0; e < X; e++)
                        lg[e] /= sum;
                    int64_t sel[64];
                    double wsum = 0;
                    for (int64_t u = 0; u < U; u++) { /* the U largest, in order */
                        int64_t best = -1;
                        for (int64_t e = 0; e < X; e++) {
                            bool taken = false;
                            for (int64_t k2 = 0; k2 < u; k2++)
                                taken |= sel[k2] == e;
                            if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
                        }
                        sel[u] = best;
                        wsum += lg[best];
                    }
                    for (int64_t u = 0; u < U; u++) {
                        int64_t e = sel[u];
                        glu_ffn(wg + e * F * E, bg ? bg + e * F : NULL, wu + e * F * E,
                                bu ? bu + e * F : NULL, wd + e * E * F, bd ? bd + e * E : NULL, h,
                                E, F, y);
                        double wgt = norm_topk || gptoss ? lg[e] / wsum : lg[e];
                        for (int64_t i = 0; i < E; i++)
                            x[i] += wgt * y[i];
                    }
                    if (su) {
                        const int64_t Fs =
                            loom_gguf_find_tensor(g, "blk.0.ffn_up_shexp.weight") >= 0
                                ? hp->n_ff_shexp
                                : 0;
                        glu_ffn(sg, NULL, su, NULL, sd, NULL, h, E, Fs, y);
                        double gate = 1.0;
                        if (sgi) {
                            double s = 0;
                            for (int64_t i = 0; i < E; i++)
                                s += (double)sgi[i] * h[i];
                            gate = 1.0 / (1.0 + exp(-s));
                        }
                        for (int64_t i = 0; i < E; i++)
                            x[i] += gate * y[i];
                    }
                }
                free(wr);
                free(br);
                free(wg);
                free(wu);
                free(wd);
                free(bg);
                free(bu);
                free(bd);
                free(sgi);
                free(sg);
                free(su);
                free(sd);
            }
            free(an);
            free(pan);
            free(sinks);
            free(pfn);
            free(wqkv);
            free(bqkv);
            free(wq);
            free(bq);
            free(wk);
            free(bk);
            free(wv);
            free(bv);
            free(qn);
            free(kn);
            free(wo);
            free(bo);
            free(fn);
        }
        if (r.st) break;
        rms_norm(x, onorm, E, hp->rms_eps, h);
        matvec(outw ? outw : embd, NULL, h, E, V, lv);
        for (int64_t i = 0; i < V; i++)
            out[(int64_t)t * V + i] =
                (float)(final_cap > 0 ? final_cap * tanh(lv[i] / final_cap) : lv[i]);
    }
    free(embd);
    free(onorm);
    free(outw);
    if (freqs != rlong && freqs != rshort) free(freqs);
    free(rlong);
    free(rshort);
    free(kc);
    free(vc);
    free(x);
    free(h);
    free(qkv);
    free(a);
    free(o);
    free(y);
    free(att);
    free(lg);
    free(lv);
    return r.st;
}
