/*
 * `loom tokenize` as a user runs it (called in-process, stdout and stderr captured), on the
 * vocabulary-only files in ../shared/models: ids and `id -> 'piece'` lines, BOS as the
 * vocabulary asks and --no-bos, special tokens parsed or plain, -f and escapes, and the
 * errors as one line with the right exit status. Expected ids are the public GPT-2 and
 * Llama-2 vocabularies' (GPT-2: "Hello" 15496, " world" 995, "a" 64, "b" 65, "\n" 198,
 * <|endoftext|> 50256; Llama-2: <s> 1, "▁Hello" 15043, "▁world" 3186).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/shim/loom_test.h"
#include "tests/tools/capture.h"
#include "tools/cli.h"

/* Runs `loom tokenize argv...` with stdout/stderr captured into malloc'd strings. */
static int run_tokenize(char **argv, char **out, char **err) {
    return loom_test_capture(loom_cli_tokenize, argv, out, err);
}

static char *vocab(const char *name) {
    static char path[2][4096];
    static int k;
    k ^= 1;
    snprintf(path[k], sizeof path[k], "%s/%s", loom_test_models_dir(), name);
    return path[k];
}

LOOM_TEST(tokenize, ids_of_a_bpe_vocabulary) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *out, *err;
    char *argv[] = {"tokenize", "-m", vocab("ggml-vocab-gpt-2.gguf"), "-p", "Hello world",
                    "--ids",    NULL};
    int rc = run_tokenize(argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_MSG(strcmp(out, "[15496, 995]\n") == 0, "got '%s'", out);
    free(out);
    free(err);
}

LOOM_TEST(tokenize, pieces_and_bos_of_a_sentencepiece_vocabulary) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *out, *err;
    char *argv[] = {"tokenize", "-m",          vocab("ggml-vocab-llama-spm.gguf"),
                    "-p",       "Hello world", NULL};
    int rc = run_tokenize(argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_MSG(strcmp(out, "     1 -> '<s>'\n 15043 -> ' Hello'\n  3186 -> ' world'\n") == 0,
                   "got '%s'", out);
    free(out);
    free(err);
    char *argv2[] = {"tokenize", "-m",           vocab("ggml-vocab-llama-spm.gguf"),
                     "-p",       "Hello world",  "--no-bos",
                     "--ids",    "--show-count", NULL};
    rc = run_tokenize(argv2, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_MSG(strcmp(out, "[15043, 3186]\nTotal number of tokens: 2\n") == 0, "got '%s'", out);
    free(out);
    free(err);
}

LOOM_TEST(tokenize, special_tokens_parsed_or_plain) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *out, *err;
    char *argv[] = {
        "tokenize",        "-m", vocab("ggml-vocab-gpt-2.gguf"), "-p", "<|endoftext|>", "--ids",
        "--parse-special", NULL};
    int rc = run_tokenize(argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_MSG(strcmp(out, "[50256]\n") == 0, "got '%s'", out);
    free(out);
    free(err);
    char *argv2[] = {"tokenize",      "-m",    vocab("ggml-vocab-gpt-2.gguf"), "-p",
                     "<|endoftext|>", "--ids", "--no-parse-special",           NULL};
    rc = run_tokenize(argv2, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK(strstr(out, "50256") == NULL && strchr(out, ',') != NULL);
    free(out);
    free(err);
}

LOOM_TEST(tokenize, text_from_a_file_and_escapes) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char path[] = "/tmp/loom_tok_XXXXXX";
    int fd = mkstemp(path);
    LOOM_REQUIRE(fd >= 0);
    LOOM_REQUIRE(write(fd, "a\nb", 3) == 3);
    close(fd);
    char *out, *err;
    char *argv[] = {"tokenize", "-m", vocab("ggml-vocab-gpt-2.gguf"), "-f", path, "--ids", NULL};
    int rc = run_tokenize(argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_MSG(strcmp(out, "[64, 198, 65]\n") == 0, "got '%s'", out);
    free(out);
    free(err);
    unlink(path);
    /* -p "a\nb" (backslash, n) is the same text; --no-escape keeps the backslash */
    char *argv2[] = {"tokenize", "-m", vocab("ggml-vocab-gpt-2.gguf"), "-p", "a\\nb",
                     "--ids",    NULL};
    rc = run_tokenize(argv2, &out, &err);
    LOOM_CHECK_MSG(rc == 0 && strcmp(out, "[64, 198, 65]\n") == 0, "rc %d, got '%s'", rc, out);
    free(out);
    free(err);
    char *argv3[] = {"tokenize",    "-m", vocab("ggml-vocab-gpt-2.gguf"), "-p", "a\\nb", "--ids",
                     "--no-escape", NULL};
    rc = run_tokenize(argv3, &out, &err);
    LOOM_CHECK_MSG(rc == 0 && strstr(out, "198") == NULL, "rc %d, got '%s'", rc, out);
    free(out);
    free(err);
}

LOOM_TEST(tokenize, errors_are_one_clear_line) {
    char *out, *err;
    char *argv[] = {"tokenize", "-p", "hi", NULL};
    LOOM_CHECK_EQ_INT(run_tokenize(argv, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "-m FILE");
    free(out);
    free(err);
    char *argv2[] = {"tokenize", "-m", "/nonexistent/x.gguf", "-p", "hi", NULL};
    LOOM_CHECK_EQ_INT(run_tokenize(argv2, &out, &err), 1);
    LOOM_CHECK_STR_CONTAINS(err, "/nonexistent/x.gguf");
    LOOM_CHECK(out[0] == 0);
    free(out);
    free(err);
    char *argv3[] = {"tokenize", "-m", "x.gguf", "--bogus", NULL};
    LOOM_CHECK_EQ_INT(run_tokenize(argv3, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "'--bogus'");
    free(out);
    free(err);
    char *argv4[] = {"tokenize", "-m", "x.gguf", NULL};
    LOOM_CHECK_EQ_INT(run_tokenize(argv4, &out, &err), 2);
    LOOM_CHECK_STR_CONTAINS(err, "-p TEXT");
    free(out);
    free(err);
}

/* A WordPiece vocabulary: [CLS] and [SEP] around the text, as the vocabulary asks. */
LOOM_TEST(tokenize, wordpiece_vocabulary) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *out, *err;
    char *argv[] = {"tokenize", "-m", vocab("ggml-vocab-bert-bge.gguf"), "-p", "Hello world",
                    "--ids",    NULL};
    int rc = run_tokenize(argv, &out, &err);
    LOOM_CHECK_MSG(rc == 0, "rc %d, stderr: %s", rc, err);
    LOOM_CHECK_MSG(strcmp(out, "[101, 7592, 2088, 102]\n") == 0, "got '%s'", out);
    free(out);
    free(err);
}

/* --log-disable (llama-tokenize's) silences the library's warnings for this run only. */
LOOM_TEST(tokenize, log_disable_silences_warnings_for_the_run) {
    if (!loom_test_models_dir()) LOOM_SKIP("shared models not found (set LOOM_MODELS_DIR)");
    char *out, *err;
    loom_log_level before = loom_log_get_level();
    char *a[] = {"tokenize", "-m", vocab("ggml-vocab-llama-spm.gguf"), "-p", "<s>Hello",
                 "--ids",    NULL};
    LOOM_CHECK_EQ_INT(run_tokenize(a, &out, &err), 0);
    LOOM_CHECK_STR_CONTAINS(err, "two BOS");
    char *ids = out;
    free(err);
    char *b[] = {
        "tokenize",      "-m", vocab("ggml-vocab-llama-spm.gguf"), "-p", "<s>Hello", "--ids",
        "--log-disable", NULL};
    LOOM_CHECK_EQ_INT(run_tokenize(b, &out, &err), 0);
    LOOM_CHECK_MSG(err[0] == 0, "stderr: '%s'", err);
    LOOM_CHECK_MSG(strcmp(out, ids) == 0, "'%s' vs '%s'", out, ids);
    LOOM_CHECK_EQ_INT((int)loom_log_get_level(), (int)before);
    free(ids);
    free(out);
    free(err);
}
