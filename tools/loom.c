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
    {"plan", loom_cli_plan, "will it fit, and how fast: bytes per device and projected t/s"},
    {"demo", loom_cli_demo,
     "a llama-style block on the CPU and split over devices; checks agreement"},
    {"devices", loom_cli_devices, "list registries, devices, memory and caps"},
};

static void usage(FILE *f) {
    fprintf(f,
            "loom %d.%d.%d: tensor-parallel inference on many devices\n"
            "\n"
            "usage: loom <command> [options]     (loom <command> --help for its options)\n"
            "       run, bench and explain take llama.cpp's flags (-m -p -n -c -b -ub -t -ngl -sm\n"
            "       -ts -mg -dev -fa -ctk -ctv -s --temp ...); bench follows llama-bench\n"
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
    /* the nearest command, when it is plausibly a typo */
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const char *c = commands[i].name, *a = argv[1];
        size_t la = strlen(a), lc = strlen(c), d = la > lc ? la - lc : lc - la;
        for (size_t k = 0; k < la && k < lc; k++)
            d += a[k] != c[k];
        /* or a transposition of two neighbours */
        if (la == lc)
            for (size_t k = 0; k + 1 < la; k++)
                if (a[k] == c[k + 1] && a[k + 1] == c[k] && !strncmp(a, c, k) &&
                    !strcmp(a + k + 2, c + k + 2))
                    d = 1;
        if (d < best_d) {
            best_d = d;
            best = c;
        }
    }
    if (best)
        fprintf(stderr, "loom: unknown command '%s' (did you mean %s? see loom --help)\n", argv[1],
                best);
    else
        fprintf(stderr, "loom: unknown command '%s' (see loom --help)\n", argv[1]);
    return 2;
}
