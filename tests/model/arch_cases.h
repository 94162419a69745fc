/*
 * One small random-weight model per architecture, as the reference engines name and load
 * them (so the same files can be run by an external oracle): the generator of the
 * architecture tests. arch_gguf_gen writes them to a folder; arch_test runs them.
 */
#ifndef LOOM_TESTS_MODEL_ARCH_CASES_H
#define LOOM_TESTS_MODEL_ARCH_CASES_H

#include "loom/model.h"

typedef struct arch_case {
    const char *name; /* file stem: "llama", "qwen2moe", ... */
    loom_synth_params p;
    /* extra keys written after the synthetic model's own (rope scaling), or NULL */
    void (*edit)(loom_gguf_writer *w);
    int reductions_per_layer; /* on the meta device per generated token, -1: not checked */
} arch_case;

/* The prompt every case is evaluated on: 5 tokens, then 2 more one at a time. */
#define ARCH_N_PROMPT 5
#define ARCH_N_EVAL 7
extern const int32_t ARCH_IDS[ARCH_N_EVAL];

loom_synth_params arch_base_params(const char *arch);
int arch_case_count(void);
const arch_case *arch_case_get(int i);
/* The case's GGUF in memory (loom_free it). */
loom_status arch_case_write(const arch_case *c, void **data, size_t *size);
/* The case's GGUF written in memory and opened: *g over *data (free both: loom_gguf_free,
 * then loom_free). On an error nothing is left to free. */
loom_status arch_case_open(const arch_case *c, void **data, loom_gguf **g);

#endif
