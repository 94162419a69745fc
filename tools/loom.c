/*
 * loom: the command-line tool. Dispatches to a subcommand (cli.h); every subcommand has
 * --help. Output goes to stdout; an error is one line on stderr and a non-zero exit.
 */
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"

typedef struct loom_cli_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} loom_cli_cmd;

static const loom_cli_cmd commands[] = {
    {"run", loom_cli_run, "generate text with a GGUF model (or the built-in one) on any devices"},
    {"bench", loom_cli_bench, "prompt and generation speed per device spec and split mode"},
    {"explain", loom_cli_explain, "where every node runs and why; splits, subgraphs, reductions"},
    {"gguf", loom_cli_gguf, "a GGUF file's metadata, tensors and split plan"},
    {"tokenize", loom_cli_tokenize, "the tokens of a text under a GGUF file's vocabulary"},
    {"demo", loom_cli_demo,
     "a llama-style block on the CPU and split over devices; checks agreement"},
    {"devices", loom_cli_devices, "list registries, devices, memory and caps"},
};

static void usage(FILE *f) {
    fprintf(f,
            "loom %d.%d.%d: tensor-parallel inference on many devices\n"
            "\n"
            "usage: loom <command> [options]     (loom <command> --help for its options)\n"
            "\n"
            "commands:\n",
            LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR, LOOM_VERSION_PATCH);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nenvironment: LOOM_LOG_LEVEL=debug|info|warn|error|none, "
               "LOOM_BACKEND_PATH=dir1:dir2 (backend modules)\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("loom %d.%d.%d\n", LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR, LOOM_VERSION_PATCH);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "loom: unknown command '%s' (see loom --help)\n", argv[1]);
    return 2;
}
