/*
 * `loom explain`: where every node of a batch's graph runs and why. Splits with their
 * inputs (the tensors copied in), every node with its backend and the scheduler's cause
 * code, and under tensor parallelism each node's split state, where the meta device cuts
 * subgraphs and reduces, and the bytes each reduction moves. Ends with a summary whose
 * lines read `graph nodes = N`, `graph splits = M`, `allreduces = K`. --html writes the
 * same as one self-contained page (no network needed) drawing the graph coloured by device.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/model_cli.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: loom explain [-m FILE] [--devices SPEC] [--batch N] [--html OUT] [options]\n\n"
        "Shows where every node of the graph of a batch of N tokens (default 1) runs and\n"
        "why, the splits and their inputs, and the tensor-parallel subgraphs and reductions.\n\n"
        "  --batch N                 the batch (tokens) whose graph is explained (default 1)\n"
        "  --html OUT                also write a self-contained HTML page\n"
        "  -q, --quiet               print only the splits, the memory and the summary\n"
        "%s",
        loom_model_opts_help());
}

typedef struct node_info {
    const loom_tensor *t;
    int backend; /* index in the scheduler's backends */
    const char *cause;
    int split;
    char state[64]; /* meta: split state, "" otherwise */
    bool reduce;    /* meta: a reduction point (PARTIAL) */
} node_info;

static void shape(const loom_tensor *t, char *buf, size_t n) {
    int nd = loom_n_dims(t);
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < (nd > 0 ? nd : 1) && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? "," : "", (long long)t->ne[d]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static void html_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

static const char *const COLORS[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                     "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

static void write_html(FILE *f, loom_session *s, const node_info *ni, int n, int n_splits,
                       int n_reduce, uint64_t bytes_reduced, int64_t batch) {
    loom_sched *sc = loom_session_sched(s);
    int nb = loom_sched_get_n_backends(sc);
    fprintf(f, "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>loom explain</title>\n"
               "<style>body{font:13px/1.4 system-ui,sans-serif;margin:20px;color:#222}"
               ".split{border:2px solid #ccc;border-radius:8px;margin:14px 0;padding:8px}"
               ".split h2{font-size:14px;margin:2px 0 8px}.inputs{color:#555;margin-bottom:6px}"
               ".node{display:inline-block;margin:2px;padding:3px 6px;border-radius:4px;color:#fff;"
               "font-family:monospace;font-size:11px}.node.view{opacity:.55}"
               ".red{outline:3px solid #d00;outline-offset:1px}.legend span{display:inline-block;"
               "padding:2px 8px;margin-right:6px;border-radius:4px;color:#fff}"
               ".cut{display:inline-block;margin:2px 4px;color:#d00;font-weight:bold}"
               "table{border-collapse:collapse}td,th{padding:1px "
               "8px;text-align:left}</style></head><body>\n");
    fprintf(f,
            "<h1>loom explain</h1>\n<p>batch of %lld token(s); %d graph nodes in %d splits; "
            "%d allreduces moving %llu bytes per graph.</p>\n",
            (long long)batch, n, n_splits, n_reduce, (unsigned long long)bytes_reduced);
    fprintf(f, "<div class=\"legend\">");
    for (int b = 0; b < nb; b++) {
        fprintf(f, "<span style=\"background:%s\">", COLORS[b % 10]);
        html_escape(f, loom_backend_name(loom_sched_get_backend(sc, b)));
        fprintf(f, "</span>");
    }
    fprintf(f, "<span style=\"background:#fff;color:#d00;outline:3px solid #d00\">allreduce "
               "after</span></div>\n");
    for (int k = 0; k < n_splits; k++) {
        loom_sched_split_info si;
        if (loom_sched_get_split(sc, k, &si)) continue;
        int b = 0;
        while (b < nb && loom_sched_get_backend(sc, b) != si.backend)
            b++;
        fprintf(f, "<div class=\"split\" style=\"border-color:%s\"><h2>split %d: ", COLORS[b % 10],
                k);
        html_escape(f, loom_backend_name(si.backend));
        fprintf(f, " &mdash; nodes %d..%d</h2>\n<div class=\"inputs\">%d input copies:", si.i_start,
                si.i_end - 1, si.n_inputs);
        for (int q = 0; q < si.n_inputs; q++) {
            fprintf(f, " <code>");
            html_escape(f, si.inputs[q]->name);
            fprintf(f, "</code>");
        }
        fprintf(f, "</div>\n");
        for (int i = si.i_start; i < si.i_end && i < n; i++) {
            char sh[64], title[256];
            shape(ni[i].t, sh, sizeof sh);
            snprintf(title, sizeof title, "#%d %s %s %s cause %s %s", i, loom_op_name(ni[i].t->op),
                     ni[i].t->name, sh, ni[i].cause, ni[i].state);
            fprintf(f, "<span class=\"node%s%s\" style=\"background:%s\" title=\"",
                    loom_op_is_view(ni[i].t->op) ? " view" : "", ni[i].reduce ? " red" : "",
                    COLORS[ni[i].backend % 10]);
            html_escape(f, title);
            fprintf(f, "\">%s</span>", loom_op_name(ni[i].t->op));
            if (ni[i].reduce) fprintf(f, "<span class=\"cut\">&#8635; allreduce</span>");
        }
        fprintf(f, "\n</div>\n");
    }
    fprintf(f, "<h2>nodes</h2>\n<table><tr><th>#</th><th>op</th><th>name</th><th>shape</th>"
               "<th>backend</th><th>cause</th><th>split state</th></tr>\n");
    for (int i = 0; i < n; i++) {
        char sh[64];
        shape(ni[i].t, sh, sizeof sh);
        fprintf(f, "<tr><td>%d</td><td>%s</td><td>", i, loom_op_name(ni[i].t->op));
        html_escape(f, ni[i].t->name);
        fprintf(f, "</td><td>%s</td><td style=\"color:%s\">", sh, COLORS[ni[i].backend % 10]);
        html_escape(f, loom_backend_name(loom_sched_get_backend(sc, ni[i].backend)));
        fprintf(f, "</td><td>%s</td><td>%s%s</td></tr>\n", ni[i].cause, ni[i].state,
                ni[i].reduce ? " &#8635;" : "");
    }
    fprintf(f, "</table>\n</body></html>\n");
}

static const char *const explain_names[] = {"-h",      "--help",  "--html", "-q",
                                            "--quiet", "--batch", NULL};

int loom_cli_explain(int argc, char **argv) {
    loom_model_opts o;
    loom_model_opts_init(&o);
    const char *html = NULL;
    char hbuf[4096];
    long batch = 1;
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--batch")) {
            /* explain's --batch is the batch to explain (not llama.cpp's -b) */
            int x;
            if (!loom_cli_parse_int("explain", a, v, 1, 1 << 20, &x)) goto usage_error;
            batch = x;
            i++;
            continue;
        }
        int r = loom_model_opts_parse(&o, "explain", argc, argv, &i);
        if (r < 0) goto usage_error;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            loom_model_opts_free(&o);
            return 0;
        } else if (!strcmp(a, "--html") && v) {
            if (!(html = loom_cli_path(v, hbuf, sizeof hbuf))) goto usage_error;
            i++;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else if (!strcmp(a, "--html")) {
            fprintf(stderr, "loom explain: %s needs a value\n", a);
            goto usage_error;
        } else {
            loom_cli_unknown_option("explain", a, explain_names, loom_model_opts_names);
            goto usage_error;
        }
    }
    if (!loom_model_opts_finish(&o, "explain")) goto usage_error;
    if (o.sp.n_batch < batch) o.sp.n_batch = batch;
    int rc = 1;
    loom_session *s = NULL;
    node_info *ni = NULL;
    if (!loom_model_opts_open(&o, "explain") || !(s = loom_model_opts_session(&o, "explain")))
        goto out;
    loom_graph *g = NULL;
    if (loom_session_plan(s, batch, &g)) {
        fprintf(stderr, "loom explain: %s\n", loom_last_error());
        goto out;
    }
    loom_sched *sc = loom_session_sched(s);
    loom_backend_t meta_be = loom_session_meta_backend(s);
    loom_dev_t meta = meta_be ? loom_backend_device(meta_be) : NULL;
    int nb = loom_sched_get_n_backends(sc), n_splits = loom_sched_get_n_splits(sc);
    ni = calloc((size_t)g->n_nodes + 1, sizeof *ni);
    if (!ni) goto out;
    int n_reduce = 0;
    uint64_t bytes_reduced = 0;
    for (int k = 0; k < n_splits; k++) {
        loom_sched_split_info si;
        if (loom_sched_get_split(sc, k, &si)) continue;
        for (int i = si.i_start; i < si.i_end && i < g->n_nodes; i++)
            ni[i].split = k;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        ni[i].t = t;
        loom_backend_t b = loom_sched_get_tensor_backend(sc, t);
        ni[i].backend = 0;
        while (ni[i].backend < nb && loom_sched_get_backend(sc, ni[i].backend) != b)
            ni[i].backend++;
        if (ni[i].backend == nb) ni[i].backend = nb - 1;
        ni[i].cause = loom_sched_get_tensor_cause(sc, t);
        if (meta && b == meta_be) {
            loom_split_state st;
            if (loom_meta_tensor_state(meta, t, false, &st) == LOOM_OK) {
                loom_split_state_format(&st, ni[i].state, sizeof ni[i].state);
                ni[i].reduce = st.axis == LOOM_SPLIT_PARTIAL && t->op != LOOM_OP_NONE &&
                               !loom_op_is_view(t->op);
                if (ni[i].reduce) {
                    n_reduce++;
                    bytes_reduced += loom_nbytes(t);
                }
            } else {
                snprintf(ni[i].state, sizeof ni[i].state, "? %.50s", loom_last_error());
            }
        }
    }
    printf("model: %s; devices %s; split mode %s; batch %ld\n",
           o.model ? o.model : "built-in synthetic", o.sp.devices ? o.sp.devices : "cpu",
           loom_split_mode_name(loom_session_split_mode(s)), batch);
    printf("backends (priority order):");
    for (int b = 0; b < nb; b++)
        printf(" %s", loom_backend_name(loom_sched_get_backend(sc, b)));
    printf("\n\n");
    for (int k = 0; k < n_splits; k++) {
        loom_sched_split_info si;
        if (loom_sched_get_split(sc, k, &si)) continue;
        printf("## SPLIT #%d: %s # %d inputs:", k, loom_backend_name(si.backend), si.n_inputs);
        for (int q = 0; q < si.n_inputs; q++) {
            char sz[32];
            loom_cli_format_bytes(sz, sizeof sz, (double)loom_nbytes(si.inputs[q]));
            printf(" [%s (%s)]", si.inputs[q]->name, sz);
        }
        printf("\n");
        for (int i = si.i_start; !quiet && i < si.i_end && i < g->n_nodes; i++) {
            char sh[64];
            shape(ni[i].t, sh, sizeof sh);
            printf("node #%4d (%14s): %-24.24s %-16s [%s %s]%s%s%s\n", i, loom_op_name(ni[i].t->op),
                   ni[i].t->name, sh, loom_backend_name(loom_sched_get_backend(sc, ni[i].backend)),
                   ni[i].cause, ni[i].state[0] ? " " : "", ni[i].state,
                   ni[i].reduce ? "  <- allreduce" : "");
        }
    }
    printf("\n");
    if (meta) {
        char sz[32];
        loom_cli_format_bytes(sz, sizeof sz, (double)bytes_reduced);
        printf("tensor parallel over %d devices: %d reduction points, %s reduced per graph\n",
               loom_meta_n_devices(meta), n_reduce, sz);
    }
    printf("graph nodes = %d\n", g->n_nodes);
    printf("graph splits = %d\n", n_splits);
    printf("allreduces = %d\n", n_reduce);
    if (html) {
        FILE *f = fopen(html, "w");
        if (!f) {
            fprintf(stderr, "loom explain: cannot write '%s': %s\n", html, strerror(errno));
            goto out;
        }
        write_html(f, s, ni, g->n_nodes, n_splits, n_reduce, bytes_reduced, batch);
        fclose(f);
        printf("wrote %s\n", html);
    }
    rc = 0;
out:
    free(ni);
    loom_session_free(s);
    loom_model_opts_free(&o);
    return rc;
usage_error:
    loom_model_opts_free(&o);
    return 2;
}
