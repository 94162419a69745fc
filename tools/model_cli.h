/*
 * Options shared by the model subcommands (run, bench, explain): the model file (or the
 * built-in synthetic default), devices, split mode and the session knobs, under the names
 * llama.cpp users know (-m, -c/--ctx-size, -b, -ub, -t, -ngl, -sm, -ts, -mg, -dev, -fa,
 * -ctk/-ctv, --verbose). The per-device memory report (weights, KV, compute, total against
 * free) lives here too.
 */
#ifndef LOOM_TOOLS_MODEL_CLI_H
#define LOOM_TOOLS_MODEL_CLI_H

#include <stdio.h>

#include "loom/session.h"

typedef struct loom_model_opts {
    const char *model; /* -m FILE (resolved, see loom_cli_path); NULL: built-in */
    loom_session_params sp;
    int64_t n_batch, n_ubatch; /* -b, -ub (the graph batch is the smaller) */
    int flash_attn;            /* -fa: -1 auto, 0 off, 1 on */
    const char *ctk, *ctv;     /* -ctk / -ctv as given */
    const char *tensor_split;  /* -ts as given */
    float ts[16];              /* -ts parsed (sp.tensor_split points here) */
    int main_gpu;              /* -mg */
    int64_t n_ctx_given;       /* -c N as given (0: none or 0), for the training-context warning */
    bool ngl_given;            /* -ngl N >= 0 given: the session says N/M layers on the devices */
    bool verbose;              /* -v or --log-disable set the log level: restored at free */
    bool log_disable;          /* --log-disable: no statistics, notes or warnings either */
    bool set_affinity;         /* --cpu-affinity given: reset to the default by _free */
    int prev_log_level;        /* restored by loom_model_opts_free */
    char model_buf[4096], rules_buf[4096], dev_buf[256];
    /* the built-in model, when used (owned) */
    void *synth_data;
    size_t synth_size;
    loom_gguf *gguf; /* opened model (owned) */
} loom_model_opts;

void loom_model_opts_init(loom_model_opts *o);
void loom_model_opts_free(loom_model_opts *o);

/* Consumes the shared option at argv[*i] (and its value), returning 1 if it was one, 0 if
 * not, -1 on a bad value (message printed, naming the command). */
int loom_model_opts_parse(loom_model_opts *o, const char *cmd, int argc, char **argv, int *i);
/* The same for a command that takes only some of the shared options (gguf, plan): an option
 * not in `names` (NULL-terminated) is not one of them (0), for the command to refuse. */
int loom_model_opts_parse_only(loom_model_opts *o, const char *cmd, const char *const *names,
                               int argc, char **argv, int *i);
/* Checks the options together once all are parsed (-ctk vs -ctv, -ts, -mg, -b/-ub) and
 * derives the session parameters; prints the error and returns false on a refusal. */
bool loom_model_opts_finish(loom_model_opts *o, const char *cmd);
/* A -ctk/-ctv value (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl); false after printing
 * "loom CMD: OPT 'V' is not a cache type (...)" */
bool loom_model_cli_kv_type(const char *cmd, const char *opt, const char *v, loom_type *out);
/* A -ts value ("3,1" or "3/1": numbers >= 0, a positive sum, at most cap) into ts[0..*n);
 * false after printing "loom CMD: OPT 'V': ..." naming what is wrong. */
bool loom_model_cli_tensor_split(const char *cmd, const char *opt, const char *v, float *ts,
                                 int cap, int *n);
/* The help text of the shared options. */
const char *loom_model_opts_help(void);
/* The names of the shared options (NULL-terminated), for the nearest-match hint. */
extern const char *const loom_model_opts_names[];

/* Where the informational lines go (statistics, memory tables, notes, warnings): stderr, or
 * NULL under --log-disable (llama.cpp's: the output alone, errors still printed). */
FILE *loom_model_opts_info(const loom_model_opts *o);

/* Opens the model file (or generates the built-in one) into o->gguf; prints the error. */
bool loom_model_opts_open(loom_model_opts *o, const char *cmd);
/* A session over o->gguf with o->sp (and -fa applied); prints the error. */
loom_session *loom_model_opts_session(loom_model_opts *o, const char *cmd);

/* One device's memory, in bytes. dev NULL: host memory. */
typedef struct loom_cli_mem_row {
    loom_dev_t dev;
    char name[64];
    double weights, kv, compute;
    size_t free, total; /* the device's memory (0/0: unknown) */
} loom_cli_mem_row;

/* The session's memory per device (every member of a meta device, then the host):
 * weights, KV cache and compute buffers as allocated now. Returns the number of rows. */
int loom_cli_session_memory(loom_session *s, loom_cli_mem_row *rows, int cap);
/* Prints rows as a table under `title`; a row whose total exceeds its free memory is
 * marked. Returns the number of such rows. */
int loom_cli_print_memory(FILE *f, const char *title, const loom_cli_mem_row *rows, int n);

#endif
