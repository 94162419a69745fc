/*
 * libFuzzer target for split tables: any byte string is parsed as a rules file (it must
 * parse or be refused with an error), and every table that parses is put in front of the
 * built-in llama table and asked for the split state of llama-shaped weights and caches
 * (F32 and Q4_0, over 1..8 devices, with hyperparameters taken from the input, huge ones
 * included). A split state that is returned must cover its axis exactly; anything else
 * must be an error, never a crash, an overflow or a leak.
 *
 * Input: byte 0 = devices (1 + b % 8), bytes 1..8 = head_dim, n_head, n_head_kv, attn
 * block selectors; the rest is the rules text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/rules.h"

static int64_t pick(uint8_t b) {
    static const int64_t v[16] = {1,
                                  2,
                                  3,
                                  4,
                                  8,
                                  16,
                                  32,
                                  64,
                                  7,
                                  12,
                                  96,
                                  128,
                                  (int64_t)1 << 31,
                                  (int64_t)1 << 40,
                                  INT64_MAX / 3,
                                  INT64_MAX};
    return v[b % 16];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 9 || size > 65536) return 0;
    const int n_dev = 1 + data[0] % 8;
    loom_hparams hp = {0};
    memcpy(hp.arch, "llama", 6);
    hp.head_dim = pick(data[1]);
    hp.n_head = pick(data[2]);
    hp.n_head_kv = data[3] % 2 ? hp.n_head : pick(data[3]);
    if (hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv) hp.n_head_kv = 1;
    hp.attn_block = data[4] % 2 ? 32 : 1;
    hp.ffn_block = data[5] % 2 ? 32 : 1;
    hp.n_embd = 64;
    hp.n_ff = 172;
    hp.n_layer = 4;
    hp.n_vocab = 512;
    char *text = malloc(size - 9 + 1);
    if (!text) return 0;
    memcpy(text, data + 9, size - 9);
    text[size - 9] = 0; /* a NUL inside ends the text early: the parser sees a C string */
    loom_rules *user = NULL, *rules = NULL;
    if (loom_rules_parse(text, "fuzz.rules", &user) != LOOM_OK) {
        free(text);
        return 0;
    }
    free(text);
    if (loom_rules_builtin("llama", false, &rules) != LOOM_OK) {
        loom_rules_free(user);
        return 0;
    }
    if (loom_rules_prepend(rules, user) != LOOM_OK) {
        loom_rules_free(rules);
        return 0;
    }
    loom_ctx *ctx =
        loom_ctx_new((loom_ctx_params){.mem_size = 32 * loom_tensor_overhead(), .no_alloc = true});
    if (!ctx) {
        loom_rules_free(rules);
        return 0;
    }
    static const struct {
        const char *name;
        int64_t ne0, ne1;
    } W[] = {
        {"token_embd.weight", 64, 512},     {"output.weight", 64, 512},
        {"blk.0.attn_q.weight", 64, 64},    {"blk.1.attn_k.weight", 64, 32},
        {"blk.2.attn_v.weight", 64, 32},    {"blk.3.attn_output.weight", 64, 64},
        {"blk.0.attn_qkv.weight", 64, 128}, {"blk.1.ffn_up.weight", 64, 172},
        {"blk.2.ffn_down.weight", 192, 64}, {"cache_k_l1", 32, 256},
        {"blk.3.attn_norm.weight", 64, 1},  {"blk.0.ffn_gate.weight", 64, 172},
    };
    for (size_t i = 0; i < sizeof W / sizeof W[0]; i++) {
        for (int q = 0; q < 2; q++) {
            loom_type type = q && W[i].ne0 % 32 == 0 ? LOOM_TYPE_Q4_0 : LOOM_TYPE_F32;
            loom_tensor *t = loom_new_tensor_2d(ctx, type, W[i].ne0, W[i].ne1);
            if (!t) continue;
            loom_set_name(t, W[i].name);
            loom_split_state s;
            const loom_rule *rule = NULL;
            if (loom_rules_split_state(rules, &hp, t, n_dev, &s, &rule) != LOOM_OK) continue;
            if (loom_split_axis_is_dim(s.axis)) {
                /* a returned split covers its axis exactly */
                int64_t total = loom_split_state_total(&s);
                if (total != t->ne[s.axis]) __builtin_trap();
                for (int j = 0; j < n_dev; j++)
                    if (loom_split_state_dev_count(&s, j) < 0) __builtin_trap();
            }
        }
    }
    (void)loom_rules_match(rules, "blk.12345678901234567890.attn_q.weight");
    loom_ctx_free(ctx);
    loom_rules_free(rules);
    return 0;
}
