/*
 * Writes the architecture cases' GGUF files (tests/model/arch_cases.c) into a folder, and
 * the prompt's token ids, so that an external engine can be run on them as an oracle:
 *   arch_gguf_gen DIR [q8_0]  ->  DIR/<case>.gguf ..., DIR/prompt.txt (ids, one line)
 * With q8_0 the matrices are Q8_0 and the files DIR/<case>-q8_0.gguf.
 */
#include <stdio.h>
#include <string.h>

#include "tests/model/arch_cases.h"

int main(int argc, char **argv) {
    const bool q8 = argc == 3 && strcmp(argv[2], "q8_0") == 0;
    if (argc != 2 && !q8) {
        fprintf(stderr, "usage: arch_gguf_gen DIR [q8_0]\n");
        return 2;
    }
    for (int i = 0; i < arch_case_count(); i++) {
        arch_case c0 = *arch_case_get(i);
        const arch_case *c = &c0;
        if (q8) c0.p.wtype = LOOM_TYPE_Q8_0;
        void *data = NULL;
        size_t size = 0;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s%s.gguf", argv[1], c->name, q8 ? "-q8_0" : "");
        FILE *f = NULL;
        if (arch_case_write(c, &data, &size) != LOOM_OK || !(f = fopen(path, "wb")) ||
            fwrite(data, 1, size, f) != size) {
            fprintf(stderr, "arch_gguf_gen: %s: %s\n", path, loom_last_error());
            if (f) fclose(f);
            loom_free(data);
            return 1;
        }
        fclose(f);
        loom_free(data);
        printf("%s\n", path);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/prompt.txt", argv[1]);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    for (int i = 0; i < ARCH_N_EVAL; i++)
        fprintf(f, "%s%d", i ? " " : "", (int)ARCH_IDS[i]);
    fprintf(f, "\n");
    fclose(f);
    return 0;
}
