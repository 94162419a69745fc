/* The generator of block_vectors.txt (not built by Bazel: it links the oracle's libggml,
 * built outside the repository, see README.md): quantises deterministic data with the
 * oracle's quantisers and decodes it with the oracle's to_float; prints per type
 * "<ggml type id> <n> <hex bytes> <n floats %.9g>".
 *   gcc -O1 -I$ORACLE/ggml/include gen_blocks.c -L$ORACLE/build/ggml/src -lggml */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include "ggml.h"

static uint64_t s = 0x9e3779b97f4a7c15ull;
static double u(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return (double)(s >> 11) / 9007199254740992.0; }

int main(void) {
    const int types[] = {2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 39};
    struct ggml_init_params ip = {1 << 20, NULL, false};
    struct ggml_context *ctx = ggml_init(ip); /* builds the fp16 tables to_float reads */
    (void)ctx;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        enum ggml_type t = (enum ggml_type)types[i];
        const int n = ggml_blck_size(t) == 256 ? 512 : 256;
        float x[512], y[512];
        for (int j = 0; j < n; j++) {
            int blk = j / 32;
            double sc = blk % 4 == 0 ? 1.0 : blk % 4 == 1 ? 0.01 : blk % 4 == 2 ? 30.0 : 0.3;
            x[j] = (float)((u() * 2 - 1) * sc + (blk % 3 == 0 ? 0.2 * sc : 0));
        }
        unsigned char q[4096];
        size_t nb = ggml_quantize_chunk(t, x, q, 0, 1, n, NULL, NULL);
        ggml_internal_get_type_traits(t).to_float(q, y, n);
        printf("%d %d ", types[i], n);
        for (size_t k = 0; k < nb; k++) printf("%02x", q[k]);
        for (int j = 0; j < n; j++) printf(" %.9g", y[j]);
        printf("\n");
    }
    return 0;
}
