/*
 * libFuzzer target for the GGUF reader: any byte string must either open (and then be
 * readable end to end) or be rejected with an error — never crash, leak or read out of
 * bounds. Built by tests/fuzz/run.sh with clang -fsanitize=fuzzer,address,undefined.
 */
#include <stddef.h>
#include <stdint.h>

#include "loom/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loom_gguf *g = NULL;
    if (loom_gguf_open_memory(data, size, &g) != LOOM_OK) return 0;
    char buf[256];
    for (int64_t i = 0; i < loom_gguf_kv_count(g); i++) {
        loom_gguf_kv_format(g, i, buf, sizeof buf);
        uint64_t n = loom_gguf_kv_arr_n(g, i);
        uint64_t len;
        if (n && loom_gguf_kv_arr_type(g, i) == LOOM_GGUF_STRING)
            (void)loom_gguf_kv_arr_str(g, i, n - 1, &len);
    }
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
        const uint8_t *p = loom_gguf_tensor_data(g, i);
        size_t sz = loom_gguf_tensor_size(g, i);
        if (sz) sink ^= p[0] ^ p[sz - 1];
    }
    (void)sink;
    loom_gguf_free(g);
    return 0;
}
