#define _GNU_SOURCE
/*
 * `loom explain`: where every node of a batch's graph runs and why. Splits with their
 * inputs (the tensors copied in), every node with its backend and the scheduler's cause
 * code, and under tensor parallelism each node's split state, where the meta device cuts
 * subgraphs and reduces, and the bytes each reduction moves; the memory per device. Ends
 * with a summary whose lines read `graph nodes = N`, `graph splits = M`, `allreduces = K`.
 * --batch takes a list (1,32): each batch is explained in turn.
 *
 * --html writes one self-contained page (no network): (a) a header with the model,
 * devices, split mode and batches; (b) one lane per device of the meta device with its
 * slice of every split weight (heads, FFN columns, vocabulary rows, experts), so a device
 * with an empty slice shows as idle; (c) the memory per device stacked by weights, KV cache
 * and compute; (d) a timeline of one forward pass per batch in projected time (the sim
 * timing model on the devices' profile, else a reference GPU; the CPU's nodes on the host
 * profile): the subgraphs every device runs and each AllReduce with its bytes and time,
 * labels in non-overlapping tracks under the lanes; (e) the splits as a chain of boxes with
 * the copies into each; (f) a legend of every cause code; (g) with several batches, their
 * timelines and splits side by side; (h) every node of every batch in a table.
 * The lanes, timeline and memory bars are drawn by the page's script from a JSON block,
 * and the script marks the page `data-ok="1"` once drawn (the render test checks that).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "loom/sim.h"
#include "tools/cli.h"
#include "tools/dist_cli.h"
#include "tools/model_cli.h"

#define MAX_BATCHES 4

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: loom explain [-m FILE] [--devices SPEC] [--batch N[,N]] [--html OUT] [options]\n\n"
        "Shows where every node of the graph of a batch of N tokens (default 1) runs and\n"
        "why, the splits and their inputs, the tensor-parallel subgraphs and reductions,\n"
        "and the memory per device.\n\n"
        "  --batch LIST              the batches (tokens) explained, e.g. 1,32 (default 1)\n"
        "  --html OUT                also write a self-contained HTML page (batches side by side)\n"
        "  -q, --quiet               print only the splits, the memory and the summary\n"
        "  --dist mpi                under mpirun: the graph of a session across the MPI ranks\n"
        "                            (--devices is each rank's device); rank 0 prints, every\n"
        "                            rank its memory line on stderr\n"
        "%s",
        loom_model_opts_help());
}

static const char *const explain_names[] = {"-h",      "--help",  "--html", "-q",
                                            "--quiet", "--batch", "--dist", NULL};

/* Every cause code of the scheduler's passes, for the legend. */
static const char *const CAUSES[][2] = {
    {"usr", "pinned by the caller (loom_sched_set_tensor_backend)"},
    {"1.dst", "pass 1: its own buffer (a weight, the KV cache) decides"},
    {"1.vsrc", "pass 1: a view: the buffer of its view source decides"},
    {"1.inp", "pass 1: a graph input: on the CPU, the last backend"},
    {"1.wgtN", "pass 1: with its weight source N (src[N] lives in that backend's memory)"},
    {"1.off", "pass 1: a host-weight op pulled to a device for a large batch (op offload)"},
    {"2.gpu-dn", "pass 2: from an assigned device neighbour, sweeping down the graph"},
    {"2.gpu-up", "pass 2: from an assigned device neighbour, sweeping up"},
    {"2.any-dn", "pass 2: from any assigned neighbour (CPU included), sweeping down"},
    {"2.any-up", "pass 2: from any assigned neighbour, sweeping up"},
    {"3.upg", "pass 3: upgraded to a higher-priority backend that supports it and its sources"},
    {"3.best", "pass 3: the backend holding most of its sources' bytes"},
    {"4.vsrc", "pass 4: a view, placed with its view source"},
    {"4.cur", "pass 4: kept on the backend of the current split"},
    {"4.sup", "pass 4: the first backend that supports it"},
    {"4.cpy", "a copy the scheduler made for a split input"},
};

typedef struct node_info {
    char op[24], name[LOOM_MAX_NAME], shape[40], cause[12], state[64];
    int backend; /* index in the scheduler's backends */
    bool view, reduce;
    size_t bytes;
    double us; /* projected time on one device (the timing model; a split node's share) */
} node_info;

/* What the page's timeline projects with: the devices' sim profile (else a reference one)
 * for nodes on the meta device, the "host" profile for the CPU's, and the devices' link for
 * each AllReduce (a ring). */
typedef struct projection {
    const loom_sim_profile *dev, *host;
    bool dev_given; /* the spec named profile= */
    loom_sim_link link;
    char link_name[16];
    int n_dev; /* devices of the meta device (1: none) */
} projection;

typedef struct split_view {
    int backend, i_start, i_end, n_inputs;
    char *inputs; /* "name (size)" joined by '\n' (owned) */
} split_view;

typedef struct view {
    long batch;
    int n_nodes, n_splits, n_reduce;
    uint64_t bytes_reduced;
    node_info *ni;
    split_view *sv;
} view;

typedef struct lane_row {
    char name[LOOM_MAX_NAME + 8], key[LOOM_MAX_NAME + 8], unit[16]; /* key: "blk.*.<rest>" */
    int64_t per_dev[LOOM_META_MAX_DEVICES];
    int n_layers; /* how many layers share this slice pattern */
} lane_row;

typedef struct lanes {
    lane_row *rows;
    int n, cap;
    int n_dev;
    const loom_session *s;
    loom_dev_t meta;
} lanes;

static void shape(const loom_tensor *t, char *buf, size_t n) {
    int nd = loom_n_dims(t);
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < (nd > 0 ? nd : 1) && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? "," : "", (long long)t->ne[d]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static void esc(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '<')
            fputs("&lt;", f);
        else if (c == '>')
            fputs("&gt;", f);
        else if (c == '&')
            fputs("&amp;", f);
        else if (c == '"')
            fputs("&quot;", f);
        else if (c < 0x20)
            fputc(' ', f);
        else
            fputc(c, f);
    }
}

/* A JSON string that is also safe inside <script> ("</" never appears). */
static void jstr(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == '<' || c == '>' || c == '&')
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* ---------------------------------------------------------------- lanes (b) */

static void lane_add(loom_tensor *t, int layer, void *ud) {
    lanes *L = ud;
    if (!t || !t->buffer || !L->meta) return;
    loom_dev_t dev = loom_buft_device(loom_buffer_buft(t->buffer));
    if (dev != L->meta) return; /* host weights (token embeddings): not on the devices */
    loom_split_state st;
    if (loom_meta_tensor_state(L->meta, t, false, &st) != LOOM_OK ||
        !loom_split_axis_is_dim(st.axis))
        return;
    lane_row r = {0};
    const char *name = t->name;
    snprintf(r.name, sizeof r.name, "%s", name);
    snprintf(r.key, sizeof r.key, "%s", name);
    if (layer >= 0 && !strncmp(name, "blk.", 4)) {
        const char *dot = strchr(name + 4, '.');
        if (dot) snprintf(r.key, sizeof r.key, "blk.*.%s", dot + 1);
    }
    const loom_hparams *hp = &loom_session_model(L->s)->hp;
    bool heads = strstr(name, "attn_q.") || strstr(name, "attn_k.") || strstr(name, "attn_v.") ||
                 strstr(name, "attn_qkv.") || strstr(name, "attn_output.");
    bool experts = strstr(name, "_exps") != NULL;
    int64_t div = 1;
    if (experts) {
        snprintf(r.unit, sizeof r.unit, st.axis == 2 ? "experts" : "columns");
    } else if (heads && hp->head_dim > 0) {
        snprintf(r.unit, sizeof r.unit, "heads");
        div = hp->head_dim;
    } else if (strstr(name, "ffn_")) {
        snprintf(r.unit, sizeof r.unit, "FFN cols");
    } else if (!strcmp(name, "output.weight")) {
        snprintf(r.unit, sizeof r.unit, "vocab rows");
    } else {
        snprintf(r.unit, sizeof r.unit, "elements");
    }
    bool whole = true;
    for (int j = 0; j < L->n_dev && j < st.n_devices; j++) {
        int64_t e = 0;
        for (int sg = 0; sg < st.n_segments; sg++)
            e += st.ne[sg][j] * (st.nr[sg] > 0 ? st.nr[sg] : 1);
        r.per_dev[j] = e;
        whole = whole && e % div == 0;
    }
    if (div > 1 && whole) {
        for (int j = 0; j < L->n_dev; j++)
            r.per_dev[j] /= div;
    } else if (div > 1) {
        snprintf(r.unit, sizeof r.unit, "columns"); /* a slice that cuts a head */
    }
    for (int i = 0; i < L->n; i++)
        if (!strcmp(L->rows[i].name, r.name) &&
            !memcmp(L->rows[i].per_dev, r.per_dev, sizeof r.per_dev)) {
            L->rows[i].n_layers++;
            return;
        }
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 32;
        lane_row *nr = realloc(L->rows, (size_t)cap * sizeof *nr);
        if (!nr) return;
        L->rows = nr;
        L->cap = cap;
    }
    r.n_layers = 1;
    L->rows[L->n++] = r;
}

/* ---------------------------------------------------------------- gathering */

static void view_free(view *v) {
    for (int k = 0; v->sv && k < v->n_splits; k++)
        free(v->sv[k].inputs);
    free(v->sv);
    free(v->ni);
    memset(v, 0, sizeof *v);
}

/* The devices' profile and link when the spec is a sim one that names them; otherwise the
 * reference profile h100-sxm and NVLink. n_dev is set once the session exists. */
static void projection_init(projection *pj, const char *devices) {
    memset(pj, 0, sizeof *pj);
    pj->n_dev = 1;
    loom_sim_config cfg;
    bool sim = devices && !strncasecmp(devices, "sim", 3) &&
               loom_sim_config_parse(devices, &cfg) == LOOM_OK;
    if (sim && cfg.profile[0] && loom_sim_profile_find(cfg.profile, &pj->dev) == LOOM_OK)
        pj->dev_given = true;
    if (!pj->dev) loom_sim_profile_find("h100-sxm", &pj->dev);
    if (loom_sim_profile_find("host", &pj->host) != LOOM_OK) pj->host = pj->dev;
    if (sim) {
        pj->link = cfg.link;
        snprintf(pj->link_name, sizeof pj->link_name, "%s", cfg.link_name);
    } else {
        loom_sim_link_preset("nvlink", &pj->link);
        snprintf(pj->link_name, sizeof pj->link_name, "nvlink");
    }
    loom_clear_error();
}

/* Plans batch v->batch, prints its text report and keeps what the page needs. */
static bool explain_batch(loom_session *s, const loom_model_opts *o, const char *devices, view *v,
                          bool quiet, const projection *pj) {
    loom_graph *g = NULL;
    if (loom_session_plan(s, v->batch, &g)) {
        fprintf(stderr, "loom explain: %s\n", loom_last_error());
        return false;
    }
    loom_sched *sc = loom_session_sched(s);
    loom_backend_t meta_be = loom_session_meta_backend(s);
    loom_dev_t meta = meta_be ? loom_backend_device(meta_be) : NULL;
    int nb = loom_sched_get_n_backends(sc);
    v->n_nodes = g->n_nodes;
    v->n_splits = loom_sched_get_n_splits(sc);
    v->ni = calloc((size_t)g->n_nodes + 1, sizeof *v->ni);
    v->sv = calloc((size_t)v->n_splits + 1, sizeof *v->sv);
    if (!v->ni || !v->sv) {
        fprintf(stderr, "loom explain: out of memory\n");
        return false;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const loom_tensor *t = g->nodes[i];
        node_info *n = &v->ni[i];
        snprintf(n->op, sizeof n->op, "%s", loom_op_name(t->op));
        snprintf(n->name, sizeof n->name, "%s", t->name);
        shape(t, n->shape, sizeof n->shape);
        n->view = loom_op_is_view(t->op);
        n->bytes = loom_nbytes(t);
        loom_backend_t b = loom_sched_get_tensor_backend(sc, t);
        n->backend = 0;
        while (n->backend < nb && loom_sched_get_backend(sc, n->backend) != b)
            n->backend++;
        if (n->backend == nb) n->backend = nb - 1;
        snprintf(n->cause, sizeof n->cause, "%s", loom_sched_get_tensor_cause(sc, t));
        n->us = n->view ? 0 : loom_sim_op_time_us(meta && b == meta_be ? pj->dev : pj->host, t);
        if (meta && b == meta_be) {
            loom_split_state st;
            if (loom_meta_tensor_state(meta, t, false, &st) == LOOM_OK) {
                loom_split_state_format(&st, n->state, sizeof n->state);
                /* a sliced node (or one summing partials) does 1/N of the work on each */
                if (!n->view && pj->n_dev > 1 &&
                    (loom_split_axis_is_dim(st.axis) || st.axis == LOOM_SPLIT_PARTIAL)) {
                    double launch = pj->dev->launch_us;
                    if (n->us > launch) n->us = (n->us - launch) / pj->n_dev + launch;
                }
                n->reduce = st.axis == LOOM_SPLIT_PARTIAL && t->op != LOOM_OP_NONE && !n->view;
                if (n->reduce) {
                    v->n_reduce++;
                    v->bytes_reduced += n->bytes;
                }
            } else {
                snprintf(n->state, sizeof n->state, "? %.50s", loom_last_error());
            }
        }
    }
    printf("model: %s; devices %s; split mode %s; batch %ld\n",
           o->model ? o->model : "built-in synthetic", devices,
           loom_split_mode_name(loom_session_split_mode(s)), v->batch);
    printf("backends (priority order):");
    for (int b = 0; b < nb; b++)
        printf(" %s", loom_backend_name(loom_sched_get_backend(sc, b)));
    printf("\n\n");
    for (int k = 0; k < v->n_splits; k++) {
        loom_sched_split_info si;
        if (loom_sched_get_split(sc, k, &si)) continue;
        split_view *sv = &v->sv[k];
        sv->i_start = si.i_start;
        sv->i_end = si.i_end;
        sv->n_inputs = si.n_inputs;
        sv->backend = 0;
        while (sv->backend < nb && loom_sched_get_backend(sc, sv->backend) != si.backend)
            sv->backend++;
        size_t cap = 1, len = 0;
        for (int q = 0; q < si.n_inputs; q++)
            cap += strlen(si.inputs[q]->name) + 40;
        sv->inputs = calloc(cap, 1);
        printf("## SPLIT #%d: %s # %d inputs:", k, loom_backend_name(si.backend), si.n_inputs);
        for (int q = 0; q < si.n_inputs; q++) {
            char sz[32];
            loom_cli_format_bytes(sz, sizeof sz, (double)loom_nbytes(si.inputs[q]));
            printf(" [%s (%s)]", si.inputs[q]->name, sz);
            if (sv->inputs)
                len += (size_t)snprintf(sv->inputs + len, cap - len, "%s%s (%s)", q ? "\n" : "",
                                        si.inputs[q]->name, sz);
        }
        printf("\n");
        for (int i = si.i_start; !quiet && i < si.i_end && i < g->n_nodes; i++) {
            const node_info *n = &v->ni[i];
            printf("node #%4d (%14s): %-24.24s %-16s [%s %s]%s%s%s\n", i, n->op, n->name, n->shape,
                   loom_backend_name(loom_sched_get_backend(sc, n->backend)), n->cause,
                   n->state[0] ? " " : "", n->state, n->reduce ? "  <- allreduce" : "");
        }
    }
    printf("\n");
    loom_cli_mem_row mem[LOOM_META_MAX_DEVICES + 2];
    int nm = loom_cli_session_memory(s, mem, (int)(sizeof mem / sizeof mem[0]));
    loom_cli_print_memory(
        stdout, "memory per device (compute buffers as planned for this batch):", mem, nm);
    printf("\n");
    if (meta) {
        char sz[32];
        loom_cli_format_bytes(sz, sizeof sz, (double)v->bytes_reduced);
        printf("tensor parallel over %d devices: %d reduction points, %s reduced per graph\n",
               loom_meta_n_devices(meta), v->n_reduce, sz);
    }
    printf("graph nodes = %d\n", g->n_nodes);
    printf("graph splits = %d\n", v->n_splits);
    printf("allreduces = %d\n", v->n_reduce);
    return true;
}

/* ---------------------------------------------------------------- the page */

static double ring_us(const loom_sim_link *l, int n, double bytes) {
    if (n < 2) return 0;
    return 2.0 * (n - 1) * loom_sim_link_time_us(l, (uint64_t)(bytes / n));
}

static const char *const COLORS[] = {
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02"};

static const char *PAGE_CSS =
    "body{font:13px/1.4 system-ui,sans-serif;margin:20px;color:#222}h1{margin:0 0 4px}"
    "h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #ddd}"
    ".hdr td{padding:1px 10px 1px 0}.cols{display:flex;gap:18px;align-items:flex-start}"
    ".col{flex:1;min-width:0;overflow:hidden}"
    "div.lane{display:flex;align-items:center;margin:2px 0}#lanes{overflow-x:auto}"
    ".lane-name{flex:0 0 90px;width:90px;font-weight:bold;font-family:monospace}"
    ".busy{color:#555;padding-right:6px}"
    "table.lanes{border-collapse:collapse}table.lanes td{padding:1px 2px}"
    "table.lanes th{font:10px monospace;color:#555;padding:2px 0;writing-mode:vertical-rl;"
    "transform:rotate(180deg);text-align:left;white-space:nowrap}"
    ".cell{display:inline-block;min-width:40px;margin:1px;padding:2px 4px;border-radius:3px;"
    "color:#fff;font:11px monospace;text-align:center}"
    ".idle{background:#fff!important;color:#c00;border:1px dashed #c00}"
    ".bar{display:flex;height:18px;background:#f3f3f3;border-radius:3px;overflow:hidden}"
    ".bar div{height:100%}.w{background:#4e79a7}.k{background:#f28e2b}.c{background:#59a14f}"
    ".tl{position:relative;flex:1;min-width:0;height:22px;background:#f3f3f3}"
    ".seg{position:absolute;top:0;height:22px;box-sizing:border-box;border-right:1px solid #fff}"
    ".axis{display:flex;justify-content:space-between;margin:2px 0 0 90px;font:10px monospace;"
    "color:#555}"
    ".tlabs{position:relative;margin-left:90px}"
    ".tlab{position:absolute;font:10px/13px monospace;white-space:nowrap;background:#fff;"
    "padding:0 2px;color:#333}.tlab.arl{color:#d00}"
    ".lead{position:absolute;top:0;width:1px;background:#bbb}"
    ".ar{background:#d00!important}.arkey{background:#d00;color:#fff;padding:0 "
    "4px;border-radius:3px}"
    ".split{border:2px solid #ccc;border-radius:8px;margin:6px 0;padding:6px}"
    ".arrow{color:#777;margin:0 0 0 20px;font:11px monospace;white-space:pre-wrap}"
    ".node{display:inline-block;margin:1px;padding:2px 5px;border-radius:4px;color:#fff;"
    "font:10px monospace}"
    ".node.view{opacity:.5}.red{outline:3px solid #d00;outline-offset:1px}"
    "table.t{border-collapse:collapse}"
    ".t td,.t th{padding:1px 8px;text-align:left;border-bottom:1px solid #eee}"
    ".err{color:#c00;font-weight:bold}";

/* The script: draws lanes, memory bars and timelines from the JSON; marks the page. */
static const char *PAGE_JS =
    "window.onerror=function(m){var e=document.getElementById('status');"
    "e.setAttribute('data-ok','0');e.className='err';e.textContent='SCRIPT ERROR: '+m;};\n"
    "(function(){var D=JSON.parse(document.getElementById('data').textContent);\n"
    "function el(t,c,x){var "
    "e=document.createElement(t);if(c)e.className=c;if(x!=null)e.textContent=x;return e;}\n"
    "var L=document.getElementById('lanes');\n"
    "if(!D.lanes.length){L.appendChild(el('p',null,'No tensor-parallel weights: one device holds "
    "everything (split mode '+D.split_mode+').'));}\n"
    "var TB=el('table','lanes');if(D.lanes.length){var "
    "H=el('tr');H.appendChild(el('th',null,'device'));"
    "H.appendChild(el('th',null,'busy'));D.lanes.forEach(function(t){var "
    "h=el('th',null,t.name.replace('.weight',''));"
    "h.textContent+=' ('+t.unit+')';H.appendChild(h);});TB.appendChild(H);}\n"
    "D.devices.forEach(function(d,j){var r=el('tr','lane');r.setAttribute('data-device',d.name);"
    "r.appendChild(el('td','lane-name',d.name));var busy=0;var "
    "bz=el('td','busy');r.appendChild(bz);\n"
    " D.lanes.forEach(function(t){var n=t.per_dev[j];var td=el('td');var "
    "c=el('span','cell'+(n?'':' idle'),n?String(n):'idle');"
    "c.style.background=d.color;c.title=t.name+': '+n+' '+t.unit+' on '+d.name+(t.layers>1?' "
    "(x'+t.layers+' layers)':'');"
    "if(n)busy++;td.appendChild(c);r.appendChild(td);});\n"
    " bz.textContent=busy+'/'+D.lanes.length;bz.title=busy+' of '+D.lanes.length+' split weights "
    "hold a slice';"
    "TB.appendChild(r);});L.appendChild(TB);\n"
    "var M=document.getElementById('memory');var mx=1;D.memory.forEach(function(m){var "
    "t=m.weights+m.kv+m.compute;"
    "if(t>mx)mx=t;});\n"
    "D.memory.forEach(function(m){var r=el('div','lane');r.setAttribute('data-device',m.name);"
    "r.appendChild(el('span','lane-name',m.name));var b=el('div','bar');b.style.flex='0 0 60%';\n"
    " [['w',m.weights,'weights'],['k',m.kv,'KV "
    "cache'],['c',m.compute,'compute']].forEach(function(p){"
    "var s=el('div',p[0]);s.style.width=(100*p[1]/(m.total||mx))+'%';"
    "if(p[1]>0)s.style.minWidth='2px';s.title=p[2]+': '+fmt(p[1]);b.appendChild(s);});\n"
    " r.appendChild(b);r.appendChild(el('span',null,' '+fmt(m.weights+m.kv+m.compute)+' of '+"
    "(m.total?fmt(m.total)+' ('+fmt(m.free)+' free)':'? (the bar: of the fullest device)')));"
    "M.appendChild(r);});\n"
    "function fmt(x){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(x>=1024&&i<4){x/=1024;i++;}"
    "return (i?x.toFixed(1):x.toFixed(0))+' '+u[i];}\n"
    "function fmtus(u){return u>=1000?(u/1000).toFixed(2)+' ms':(u>=10?u.toFixed(1):"
    "u.toFixed(2))+' us';}\n"
    /* a timeline: segments placed by projected time; labels below in tracks, each in the
     * first track where it clears the one before (4 px), with a leader to its segment */
    "function timeline(B,bi){var T=document.getElementById('timeline'+bi);T.textContent='';"
    "var tot=0;B.segments.forEach(function(s){tot+=s.us;});if(!(tot>0))tot=1;\n"
    " var lanes=D.devices.length?D.devices:[{name:'CPU',color:'#4e79a7'}];\n"
    " lanes.forEach(function(d){var r=el('div','lane');r.setAttribute('data-device',d.name);"
    "r.appendChild(el('span','lane-name',d.name));var box=el('div','tl');var t0=0;\n"
    "  B.segments.forEach(function(s,si){var c=el('span','seg'+(s.kind=='allreduce'?' ar':''));"
    "c.style.left=(100*t0/tot)+'%';c.style.width=(100*s.us/tot)+'%';t0+=s.us;"
    "if(s.kind!='allreduce')c.style.background=s.tp?d.color:'#999';"
    "c.title=s.title;c.setAttribute('data-seg',si);box.appendChild(c);});"
    "r.appendChild(box);T.appendChild(r);});\n"
    " var ax=el('div','axis');ax.appendChild(el('span',null,'0'));"
    "ax.appendChild(el('span',null,'projected time'));ax.appendChild(el('span',null,fmtus(tot)));"
    "T.appendChild(ax);\n"
    " var LB=el('div','tlabs');T.appendChild(LB);var "
    "cw=LB.getBoundingClientRect().width,ends=[],t0=0,H=14;\n"
    " B.segments.forEach(function(s,si){var x=(t0+s.us/2)/tot*cw;t0+=s.us;"
    "var l=el('span','tlab'+(s.kind=='allreduce'?' arl':''),s.label);l.title=s.title;"
    "l.setAttribute('data-seg',si);LB.appendChild(l);var w=l.getBoundingClientRect().width;"
    "var left=Math.max(0,Math.min(cw-w,x-w/2));var k=0;while(k<ends.length&&ends[k]+4>left)k++;"
    "ends[k]=left+w;l.style.left=left+'px';l.style.top=(k*H+6)+'px';"
    "var ld=el('span','lead');ld.style.left=Math.round(x)+'px';ld.style.height=(k*H+6)+'px';"
    "LB.insertBefore(ld,LB.firstChild);});\n"
    " LB.style.height=(ends.length*H+8)+'px';}\n"
    "function timelines(){D.batches.forEach(timeline);}timelines();"
    "window.addEventListener('resize',timelines);\n"
    "var st=document.getElementById('status');st.setAttribute('data-ok','1');"
    "st.textContent='rendered '+D.devices.length+' devices';})();\n";

/* "4.1 us", "0.35 us", "1.20 ms", in one of two static buffers used in turn (so one call
 * may format two values). */
static const char *fmt_us(double us) {
    static char buf[2][24];
    static int which;
    char *b = buf[which ^= 1];
    if (us >= 1000)
        snprintf(b, sizeof buf[0], "%.2f ms", us / 1000);
    else if (us >= 10)
        snprintf(b, sizeof buf[0], "%.1f us", us);
    else
        snprintf(b, sizeof buf[0], "%.2f us", us);
    return b;
}

/* One compute segment of a timeline: k-th subgraph (tp: on the meta device). */
static void segment(FILE *f, int *first, int k, bool tp, int nodes, double us, const char *be) {
    char lab[200];
    fprintf(f, "%s{\"kind\": \"compute\", \"tp\": %s, \"nodes\": %d, \"us\": %.4f, \"label\": ",
            *first ? "" : ", ", tp ? "true" : "false", nodes, us);
    snprintf(lab, sizeof lab, "%s%d %s", tp ? "sub" : "cpu", k, fmt_us(us));
    jstr(f, lab);
    fprintf(f, ", \"title\": ");
    snprintf(lab, sizeof lab, "%s%d: %d nodes on %s, %s projected", tp ? "sub" : "cpu", k, nodes,
             be, fmt_us(us));
    jstr(f, lab);
    fprintf(f, "}");
    *first = 0;
}

static void write_json(FILE *f, loom_session *s, const loom_model_opts *o, const view *vs, int nv,
                       const lanes *L, const loom_cli_mem_row *mem, int nm, const projection *pj) {
    loom_sched *sc = loom_session_sched(s);
    loom_backend_t meta_be = loom_session_meta_backend(s);
    int n_dev = L->n_dev;
    loom_sim_link nv_link, pc_link;
    loom_sim_link_preset("nvlink", &nv_link);
    loom_sim_link_preset("pcie4", &pc_link);
    fprintf(f, "{\"split_mode\": ");
    jstr(f, loom_split_mode_name(loom_session_split_mode(s)));
    fprintf(f, ", \"devices\": [");
    for (int j = 0; j < n_dev; j++) {
        fprintf(f, "%s{\"name\": ", j ? ", " : "");
        jstr(f, loom_dev_name(loom_meta_member(L->meta, j)));
        fprintf(f, ", \"color\": \"%s\"}", COLORS[j % 16]);
    }
    fprintf(f, "],\n\"lanes\": [");
    for (int i = 0; i < L->n; i++) {
        fprintf(f, "%s{\"name\": ", i ? ",\n " : "");
        jstr(f, L->rows[i].name);
        fprintf(f, ", \"unit\": ");
        jstr(f, L->rows[i].unit);
        fprintf(f, ", \"layers\": %d, \"per_dev\": [", L->rows[i].n_layers);
        for (int j = 0; j < n_dev; j++)
            fprintf(f, "%s%lld", j ? ", " : "", (long long)L->rows[i].per_dev[j]);
        fprintf(f, "]}");
    }
    fprintf(f, "],\n\"memory\": [");
    for (int i = 0; i < nm; i++) {
        fprintf(f, "%s{\"name\": ", i ? ", " : "");
        jstr(f, mem[i].name);
        fprintf(f,
                ", \"weights\": %.0f, \"kv\": %.0f, \"compute\": %.0f, \"free\": %zu, "
                "\"total\": %zu}",
                mem[i].weights, mem[i].kv, mem[i].compute, mem[i].free, mem[i].total);
    }
    fprintf(f, "],\n\"projection\": {\"profile\": ");
    jstr(f, pj->dev ? pj->dev->name : "?");
    fprintf(f, ", \"profile_given\": %s, \"link\": ", pj->dev_given ? "true" : "false");
    jstr(f, pj->link_name);
    fprintf(f, "},\n\"batches\": [");
    for (int b = 0; b < nv; b++) {
        const view *v = &vs[b];
        fprintf(f, "%s{\"batch\": %ld, \"segments\": [", b ? ",\n" : "", v->batch);
        /* consecutive nodes of one backend form a subgraph; a meta node that reduces ends
         * one (its AllReduce follows); each segment's time is projected (node_info.us; an
         * AllReduce: a ring over the devices' link) */
        int first = 1, seg_nodes = 0, seg_b = -1, k = 0;
        double seg_us = 0;
        for (int i = 0; i <= v->n_nodes; i++) {
            const node_info *n = i < v->n_nodes ? &v->ni[i] : NULL;
            bool cut = !n || (n->backend != seg_b && seg_nodes > 0);
            bool reduce = n && !n->view && n->reduce;
            if (cut && seg_nodes > 0) {
                loom_backend_t be = loom_sched_get_backend(sc, seg_b);
                segment(f, &first, k++, be == meta_be, seg_nodes, seg_us, loom_backend_name(be));
                seg_nodes = 0;
                seg_us = 0;
            }
            if (!n) break;
            if (n->view) continue;
            seg_b = n->backend;
            seg_nodes++;
            seg_us += n->us;
            if (reduce) {
                loom_backend_t be = loom_sched_get_backend(sc, seg_b);
                segment(f, &first, k++, true, seg_nodes, seg_us, loom_backend_name(be));
                seg_nodes = 0;
                seg_us = 0;
                double us = ring_us(&pj->link, n_dev, (double)n->bytes),
                       nvu = ring_us(&nv_link, n_dev, (double)n->bytes),
                       pcu = ring_us(&pc_link, n_dev, (double)n->bytes);
                char sz[32], lab[256];
                loom_cli_format_bytes(sz, sizeof sz, (double)n->bytes);
                fprintf(f,
                        ", {\"kind\": \"allreduce\", \"us\": %.4f, \"bytes\": %zu, "
                        "\"nvlink_us\": %.3f, \"pcie4_us\": %.3f, \"label\": ",
                        us, n->bytes, nvu, pcu);
                snprintf(lab, sizeof lab, "AR %s %s", sz, fmt_us(us));
                jstr(f, lab);
                fprintf(f, ", \"title\": ");
                snprintf(lab, sizeof lab,
                         "AllReduce of %s (%s): %s; %s on %s (ring, %d devices); NVLink %.2f us, "
                         "PCIe 4 %.2f us",
                         n->name, n->op, sz, fmt_us(us), pj->link_name, n_dev, nvu, pcu);
                jstr(f, lab);
                fprintf(f, "}");
            }
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]}");
    (void)o;
}

static void write_splits(FILE *f, loom_session *s, const view *v) {
    loom_sched *sc = loom_session_sched(s);
    for (int k = 0; k < v->n_splits; k++) {
        const split_view *sv = &v->sv[k];
        if (sv->n_inputs > 0) {
            fprintf(f, "<div class=\"arrow\">&#8595; %d input cop%s:\n", sv->n_inputs,
                    sv->n_inputs == 1 ? "y" : "ies");
            if (sv->inputs) esc(f, sv->inputs);
            fprintf(f, "</div>\n");
        }
        fprintf(f, "<div class=\"split\" style=\"border-color:%s\"><b>split %d: ",
                COLORS[sv->backend % 16], k);
        esc(f, loom_backend_name(loom_sched_get_backend(sc, sv->backend)));
        fprintf(f, "</b> &mdash; nodes %d..%d<br>\n", sv->i_start, sv->i_end - 1);
        for (int i = sv->i_start; i < sv->i_end && i < v->n_nodes; i++) {
            const node_info *n = &v->ni[i];
            char title[256];
            snprintf(title, sizeof title, "#%d %s %s %s cause %s %s", i, n->op, n->name, n->shape,
                     n->cause, n->state);
            fprintf(f, "<span class=\"node%s%s\" style=\"background:%s\" title=\"",
                    n->view ? " view" : "", n->reduce ? " red" : "", COLORS[n->backend % 16]);
            esc(f, title);
            fprintf(f, "\">%s</span>", n->op);
        }
        fprintf(f, "\n</div>\n");
    }
}

static void write_html(FILE *f, loom_session *s, const loom_model_opts *o, const view *vs, int nv,
                       const lanes *L, const projection *pj) {
    loom_sched *sc = loom_session_sched(s);
    int nb = loom_sched_get_n_backends(sc);
    loom_cli_mem_row mem[LOOM_META_MAX_DEVICES + 2];
    int nm = loom_cli_session_memory(s, mem, (int)(sizeof mem / sizeof mem[0]));
    const loom_hparams *hp = &loom_session_model(s)->hp;
    fprintf(f,
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>loom "
            "explain</title>\n<style>%s</style>"
            "</head><body>\n",
            PAGE_CSS);
    /* (a) header */
    fprintf(f, "<h1>loom explain</h1>\n<table class=\"hdr\"><tr><td>model</td><td>");
    esc(f, o->model ? o->model : "built-in synthetic (random weights)");
    fprintf(f,
            " (%s, %lld layers, %lld heads / %lld KV heads, n_embd %lld, vocab "
            "%lld)</td></tr>\n<tr><td>devices</td><td>",
            hp->arch, (long long)hp->n_layer, (long long)hp->n_head, (long long)hp->n_head_kv,
            (long long)hp->n_embd, (long long)hp->n_vocab);
    esc(f, o->sp.devices ? o->sp.devices : "cpu");
    fprintf(f, " &mdash; backends:");
    for (int b = 0; b < nb; b++) {
        fprintf(f, " <span class=\"node\" style=\"background:%s\">", COLORS[b % 16]);
        esc(f, loom_backend_name(loom_sched_get_backend(sc, b)));
        fprintf(f, "</span>");
    }
    fprintf(f, "</td></tr>\n<tr><td>split mode</td><td>%s</td></tr>\n<tr><td>batch</td><td>",
            loom_split_mode_name(loom_session_split_mode(s)));
    for (int b = 0; b < nv; b++)
        fprintf(f, "%s%ld token%s: %d nodes, %d splits, %d allreduces", b ? "; " : "", vs[b].batch,
                vs[b].batch == 1 ? "" : "s", vs[b].n_nodes, vs[b].n_splits, vs[b].n_reduce);
    fprintf(f, "</td></tr></table>\n<p id=\"status\" data-ok=\"0\">(the script has not run)</p>\n");
    /* (b) lanes, (c) memory: drawn by the script */
    fprintf(f, "<h2>per-device slices of every split weight</h2>\n<p>One lane per device of the "
               "meta device; each "
               "cell is that device's share of a split weight (heads, FFN columns, vocabulary "
               "rows, experts). "
               "<span class=\"cell idle\">idle</span> marks an empty slice.</p>\n<div "
               "id=\"lanes\"></div>\n");
    fprintf(f, "<h2>memory per device</h2>\n<p><span class=\"cell w\">weights</span><span "
               "class=\"cell k\">KV "
               "cache</span><span class=\"cell c\">compute</span> (compute buffers as planned for "
               "the last batch)</p>\n"
               "<div id=\"memory\"></div>\n");
    /* (d) timelines and (e) splits, (g) side by side */
    fprintf(f,
            "<h2>one forward pass per batch</h2>\n<p>Subgraphs per device in projected time: "
            "each node by the sim timing model on %s%s (a sliced node: its share of the work), "
            "the CPU's on the host profile; each <span class=\"arkey\">AllReduce</span> a ring "
            "over %s, its bytes and time in its label (hover: NVLink and PCIe 4). Not "
            "measured.</p>\n<div class=\"cols\">\n",
            pj->dev ? pj->dev->name : "?",
            pj->dev_given ? "" : " (the devices name no profile=: a reference GPU)", pj->link_name);
    for (int b = 0; b < nv; b++) {
        fprintf(f, "<div class=\"col\"><h3>batch %ld</h3><div id=\"timeline%d\"></div>\n",
                vs[b].batch, b);
        fprintf(f, "<h3>splits and their input copies</h3>\n");
        write_splits(f, s, &vs[b]);
        fprintf(f, "</div>\n");
    }
    fprintf(f, "</div>\n");
    /* (f) legend */
    fprintf(f, "<h2>cause codes</h2>\n<table class=\"t\"><tr><th>code</th><th>why the node got its "
               "backend</th></tr>\n");
    for (size_t c = 0; c < sizeof CAUSES / sizeof CAUSES[0]; c++)
        fprintf(f, "<tr><td><code>%s</code></td><td>%s</td></tr>\n", CAUSES[c][0], CAUSES[c][1]);
    fprintf(f, "</table>\n");
    /* every node of every batch */
    for (int b = 0; b < nv; b++) {
        const view *v = &vs[b];
        fprintf(f,
                "<h2 class=\"nodes\">nodes (batch %ld)</h2>\n<table class=\"t\" "
                "data-batch=\"%ld\"><tr><th>#</th><th>op</th><th>name</th><th>shape</th>"
                "<th>backend</th><th>cause</th><th>split state</th><th>projected</th></tr>\n",
                v->batch, v->batch);
        for (int i = 0; i < v->n_nodes; i++) {
            const node_info *n = &v->ni[i];
            fprintf(f, "<tr><td>%d</td><td>%s</td><td>", i, n->op);
            esc(f, n->name);
            fprintf(f, "</td><td>%s</td><td style=\"color:%s\">", n->shape,
                    COLORS[n->backend % 16]);
            esc(f, loom_backend_name(loom_sched_get_backend(sc, n->backend)));
            fprintf(f, "</td><td>%s</td><td>", n->cause);
            esc(f, n->state);
            fprintf(f, "%s</td><td>%s</td></tr>\n", n->reduce ? " &#8635; allreduce" : "",
                    n->view ? "" : fmt_us(n->us));
        }
        fprintf(f, "</table>\n");
    }
    fprintf(f, "<script type=\"application/json\" id=\"data\">");
    write_json(f, s, o, vs, nv, L, mem, nm, pj);
    fprintf(f, "</script>\n<script>%s</script>\n</body></html>\n", PAGE_JS);
}

int loom_cli_explain(int argc, char **argv) {
    loom_model_opts o;
    loom_model_opts_init(&o);
    const char *html = NULL;
    char hbuf[4096];
    long batches[MAX_BATCHES] = {1};
    int n_batches = 0;
    bool quiet = false, dist = false;
    loom_cli_dist cd = {.size = 1};
    char dev_label[192];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--batch")) {
            /* explain's --batch is the batch to explain (not llama.cpp's -b) */
            if (!v) {
                fprintf(stderr, "loom explain: --batch needs a value\n");
                goto usage_error;
            }
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            char *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                int x;
                if (n_batches >= MAX_BATCHES) {
                    fprintf(stderr, "loom explain: --batch '%s': at most %d batches\n", v,
                            MAX_BATCHES);
                    goto usage_error;
                }
                if (!loom_cli_parse_int("explain", a, t, 1, 1 << 20, &x)) goto usage_error;
                batches[n_batches++] = x;
            }
            i++;
            continue;
        }
        if (!strcmp(a, "--dist")) {
            if (!loom_cli_dist_parse("explain", v)) goto usage_error;
            dist = true;
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
    if (!n_batches) n_batches = 1;
    if (!loom_model_opts_finish(&o, "explain")) goto usage_error;
    for (int b = 0; b < n_batches; b++)
        if (o.sp.n_batch < batches[b]) o.sp.n_batch = batches[b];
    snprintf(dev_label, sizeof dev_label, "%s", o.sp.devices ? o.sp.devices : "cpu");
    if (dist) {
        if (!loom_cli_dist_setup(&cd, &o, "explain")) {
            loom_cli_dist_free(&cd);
            loom_model_opts_free(&o);
            return 1;
        }
        snprintf(dev_label, sizeof dev_label, "%s x %d MPI ranks",
                 o.sp.devices && *o.sp.devices ? o.sp.devices : "cpu", cd.size);
        /* rank 0 prints; the others plan the same session (their memory lines on stderr) */
        loom_cli_dist_quiet_followers(&cd, "explain");
        if (cd.rank != 0) html = NULL;
    }
    int rc = 1;
    loom_session *s = NULL;
    projection pj;
    projection_init(&pj, o.sp.devices);
    view views[MAX_BATCHES];
    memset(views, 0, sizeof views);
    lanes L = {0};
    /* every rank opens the model and places its share; a failure anywhere ends every rank */
    bool ok = loom_model_opts_open(&o, "explain") && (s = loom_model_opts_session(&o, "explain"));
    if (!loom_cli_dist_agree(&cd, ok, "explain") ||
        !loom_cli_dist_same_session(&cd, s, &o, "explain"))
        goto out;
    if (loom_session_meta_backend(s)) {
        int nd = loom_meta_n_devices(loom_backend_device(loom_session_meta_backend(s)));
        pj.n_dev = nd > 1 ? nd : 1;
    }
    for (int b = 0; b < n_batches; b++) {
        views[b].batch = batches[b];
        if (b) printf("\n");
        ok = explain_batch(s, &o, dev_label, &views[b], quiet, &pj);
        if (!loom_cli_dist_agree(&cd, ok, "explain")) goto out;
    }
    if (!quiet) { /* what the cause code in each node's [BACKEND CAUSE] means */
        printf("\ncause codes:\n");
        for (size_t c = 0; c < sizeof CAUSES / sizeof CAUSES[0]; c++)
            printf("  %-9s %s\n", CAUSES[c][0], CAUSES[c][1]);
    }
    if (cd.d) {
        fflush(stdout);
        loom_cli_dist_print_rank_memory(&cd, s, stderr);
    }
    if (html) {
        loom_backend_t meta_be = loom_session_meta_backend(s);
        L.s = s;
        L.meta = meta_be ? loom_backend_device(meta_be) : NULL;
        L.n_dev = L.meta ? loom_meta_n_devices(L.meta) : 0;
        loom_model_foreach_weight((loom_model *)loom_session_model(s), lane_add, &L);
        FILE *f = fopen(html, "w");
        if (!f) {
            fprintf(stderr, "loom explain: cannot write '%s': %s\n", html, strerror(errno));
            goto out;
        }
        write_html(f, s, &o, views, n_batches, &L, &pj);
        bool bad = ferror(f) != 0;
        if (fclose(f) != 0) bad = true;
        if (bad) {
            fprintf(stderr, "loom explain: cannot write '%s': %s\n", html, strerror(errno));
            goto out;
        }
        printf("wrote %s\n", html);
    }
    rc = 0;
out:
    for (int b = 0; b < n_batches; b++)
        view_free(&views[b]);
    free(L.rows);
    loom_session_free(s);
    loom_cli_dist_free(&cd);
    loom_model_opts_free(&o);
    return rc;
usage_error:
    loom_model_opts_free(&o);
    return 2;
}
