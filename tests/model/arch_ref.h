/*
 * A naive forward pass (plain loops in double precision, one token at a time) for the
 * synthetic models of arch_test.c, written from the architectures' definitions and
 * independent of loom's graph code: the test's second oracle beside the CPU backend.
 */
#ifndef LOOM_TESTS_MODEL_ARCH_REF_H
#define LOOM_TESTS_MODEL_ARCH_REF_H

#include "loom/model.h"

/* The cache length the tests use (it picks phi3's long or short rope factors). */
#define ARCH_REF_N_CTX 64

/* Logits of every position: out [n][n_vocab]. Weights of any type with a to_float. */
loom_status arch_ref_logits(const loom_gguf *g, const int32_t *ids, int n, float *out);

#endif
