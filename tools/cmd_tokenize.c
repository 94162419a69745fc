/*
 * `loom tokenize -m FILE -p TEXT`: the token ids of a text under a GGUF file's vocabulary, as
 * llama-tokenize prints them (one `id -> 'piece'` per line, or with --ids a Python list). Only
 * the tokenizer.ggml.* keys are read, so vocabulary-only files work.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/gguf.h"
#include "loom/tokenizer.h"
#include "tools/cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: loom tokenize -m FILE (-p TEXT | -f FILE | --stdin) [options]\n\n"
            "Prints the tokens of a text under the vocabulary of a GGUF file (a model or a\n"
            "vocabulary-only file), one 'id -> 'piece'' per line.\n\n"
            "  -m, --model FILE      the GGUF file\n"
            "  -p, --prompt TEXT     the text\n"
            "  -f, --file FILE       read the text from FILE\n"
            "  --stdin               read the text from standard input\n"
            "  --ids                 print only the ids, as a list: [1, 2, 3]\n"
            "  --no-bos              add no BOS (nor EOS) even where the vocabulary asks for one\n"
            "  --parse-special       control tokens written in the text (\"<|im_start|>\") are\n"
            "                        those tokens (the default)\n"
            "  --no-parse-special    the text is plain text, control tokens included\n"
            "  --no-escape           take \\n, \\t, \\\\ ... in -p literally (by default they are\n"
            "                        processed)\n"
            "  --show-count          print the number of tokens last\n"
            "  --log-disable         no library log lines (warnings) on stderr\n");
}

/* Reads a whole stream; NULL on failure (errno set). */
static char *read_all(FILE *f, size_t *n) {
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (len == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    *n = len;
    return buf;
}

static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t l = s[i] < 0x80             ? 1
                   : (s[i] & 0xE0) == 0xC0 ? 2
                   : (s[i] & 0xF0) == 0xE0 ? 3
                   : (s[i] & 0xF8) == 0xF0 ? 4
                                           : 0;
        if (!l || i + l > n) return false;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        i += l;
    }
    return true;
}

static int tokenize_cmd(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL;
    bool use_stdin = false, ids_only = false, no_bos = false, parse_special = true;
    bool escape = true, show_count = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) {
            model = v;
            i++;
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && v) {
            prompt = v;
            i++;
        } else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && v) {
            file = v;
            i++;
        } else if (!strcmp(a, "--stdin")) {
            use_stdin = true;
        } else if (!strcmp(a, "--ids")) {
            ids_only = true;
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else if (!strcmp(a, "--parse-special")) {
            parse_special = true;
        } else if (!strcmp(a, "--no-parse-special")) {
            parse_special = false;
        } else if (!strcmp(a, "--no-escape")) {
            escape = false;
        } else if (!strcmp(a, "--show-count")) {
            show_count = true;
        } else if (!strcmp(a, "--log-disable")) {
            loom_log_set_level(LOOM_LOG_NONE); /* restored by loom_cli_tokenize */
        } else {
            fprintf(stderr,
                    "loom tokenize: unknown or incomplete option '%s' (see loom tokenize --help)\n",
                    a);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "loom tokenize: no model given: -m FILE (see loom tokenize --help)\n");
        return 2;
    }
    if ((prompt != NULL) + (file != NULL) + use_stdin != 1) {
        fprintf(stderr, "loom tokenize: give the text once: -p TEXT, -f FILE or --stdin\n");
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    if (prompt) {
        len = strlen(prompt);
        text = malloc(len + 1);
        if (text) memcpy(text, prompt, len + 1);
        if (text && escape) len = loom_cli_process_escapes(text, len);
    } else if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) {
            fprintf(stderr, "loom tokenize: cannot read '%s': %s\n", file, strerror(errno));
            return 1;
        }
        text = read_all(f, &len);
        fclose(f);
    } else {
        text = read_all(stdin, &len);
    }
    if (!text) {
        fprintf(stderr, "loom tokenize: cannot read the text: %s\n", strerror(errno));
        return 1;
    }
    int rc = 1;
    loom_gguf *g = NULL;
    loom_tokenizer *t = NULL;
    int32_t *ids = NULL;
    if (loom_gguf_open(model, &g) || loom_tokenizer_from_gguf(g, &t)) {
        fprintf(stderr, "loom tokenize: %s: %s\n", model, loom_last_error());
        goto out;
    }
    unsigned flags = (no_bos ? 0u : LOOM_TOKENIZE_ADD_SPECIAL) |
                     (parse_special ? LOOM_TOKENIZE_PARSE_SPECIAL : 0u);
    size_t cap = len + 8, n = 0;
    ids = malloc(cap * sizeof *ids);
    loom_status st = ids ? loom_tokenize_ex(t, text, len, flags, ids, cap, &n) : LOOM_ERR_NOMEM;
    if (st == LOOM_ERR_FULL) { /* SentencePiece byte fallback can exceed one id per byte */
        free(ids);
        cap = n;
        ids = malloc(cap * sizeof *ids);
        st = ids ? loom_tokenize_ex(t, text, len, flags, ids, cap, &n) : LOOM_ERR_NOMEM;
    }
    if (st) {
        fprintf(stderr, "loom tokenize: %s\n",
                st == LOOM_ERR_NOMEM ? "out of memory" : loom_last_error());
        goto out;
    }
    if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
    } else {
        for (size_t i = 0; i < n; i++) {
            char piece[256];
            size_t pn;
            const char *p = piece;
            if (loom_token_is_control(t, ids[i])) { /* shown as written: "<s>" */
                p = loom_token_text(t, ids[i]);
                pn = strlen(p);
            } else {
                pn = loom_token_to_piece(t, ids[i], piece, sizeof piece);
                if (pn > sizeof piece) pn = sizeof piece;
            }
            printf("%6d -> '", ids[i]);
            if (valid_utf8((const unsigned char *)p, pn)) {
                fwrite(p, 1, pn, stdout);
                printf("'\n");
            } else { /* a byte of a character split over tokens */
                for (size_t k = 0; k < pn; k++)
                    printf("\\x%02x", (unsigned char)p[k]);
                printf("' (not UTF-8 alone)\n");
            }
        }
    }
    if (show_count) printf("Total number of tokens: %zu\n", n);
    rc = 0;
out:
    free(ids);
    free(text);
    loom_tokenizer_free(t);
    loom_gguf_free(g);
    return rc;
}

int loom_cli_tokenize(int argc, char **argv) {
    loom_log_level prev = loom_log_get_level();
    int rc = tokenize_cmd(argc, argv);
    loom_log_set_level(prev);
    return rc;
}
