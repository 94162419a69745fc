/*
 * Options shared by the model subcommands (run, bench, explain, gguf): the model file (or
 * the built-in synthetic default), devices, split mode and the session knobs.
 */
#ifndef LOOM_TOOLS_MODEL_CLI_H
#define LOOM_TOOLS_MODEL_CLI_H

#include "loom/session.h"

typedef struct loom_model_opts {
    const char *model;           /* -m FILE; NULL: the built-in default model */
    loom_session_params sp;
    /* the built-in model, when used (owned) */
    void *synth_data;
    size_t synth_size;
    loom_gguf *gguf;             /* opened model (owned) */
} loom_model_opts;

void loom_model_opts_init(loom_model_opts *o);
void loom_model_opts_free(loom_model_opts *o);

/* Consumes the shared option at argv[*i] (and its value), returning 1 if it was one, 0 if
 * not, -1 on a bad value (message printed, naming the command). */
int loom_model_opts_parse(loom_model_opts *o, const char *cmd, int argc, char **argv, int *i);
/* The help text of the shared options. */
const char *loom_model_opts_help(void);

/* Opens the model file (or generates the built-in one) into o->gguf; prints the error. */
bool loom_model_opts_open(loom_model_opts *o, const char *cmd);
/* A session over o->gguf with o->sp; prints the error. */
loom_session *loom_model_opts_session(loom_model_opts *o, const char *cmd);

#endif
