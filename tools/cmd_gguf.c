/*
 * `loom gguf FILE [--plan --devices SPEC]`: a file's metadata and tensors; with --plan,
 * each tensor's split state over the devices and the rule that decided it.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "loom/rules.h"
#include "tools/cli.h"
#include "tools/model_cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: loom gguf FILE [--plan [--devices SPEC] [-c N] [-ctk T]] [--split-rules "
            "FILE]\n\n"
            "Prints the metadata and tensors of a GGUF file (control characters in names and\n"
            "strings escaped). With --plan, also each tensor's split state over the devices\n"
            "(tensor parallelism), the rule that matched it, and the planned memory per device\n"
            "(weights and KV cache, against each device's free memory; a plan that does not\n"
            "fit is refused, naming the device and both numbers).\n\n"
            "  --plan                    plan the tensor-parallel split\n"
            "  -dev, --devices SPEC      devices of the plan (default sim:2; at most %d)\n"
            "  -c, --ctx-size N          KV cache positions (default: min(train, 2048))\n"
            "  -ctk, --cache-type-k T    KV cache type: f16 (default), f32, bf16, q8_0, q4_0,\n"
            "                            q4_1, q5_0, q5_1, iq4_nl\n"
            "  --split-rules FILE        split rules that override/extend the built-in table\n",
            LOOM_META_MAX_DEVICES);
}

static const char *const gguf_names[] = {"-h",         "--help",   "--plan",         "--devices",
                                         "-dev",       "--device", "--split-rules",  "-c",
                                         "--ctx-size", "-ctk",     "--cache-type-k", NULL};

/* Prints s with control characters (and DEL) escaped, so a file's bytes never reach the
 * terminal as escape sequences or line breaks. */
static void put_escaped(const char *s, int width) {
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\n')
            n += printf("\\n");
        else if (*p == '\r')
            n += printf("\\r");
        else if (*p == '\t')
            n += printf("\\t");
        else if (*p < 0x20 || *p == 0x7f)
            n += printf("\\x%02x", *p);
        else {
            putchar(*p);
            n++;
        }
    }
    for (; n < width; n++)
        putchar(' ');
}

/* Adds t's bytes on each device under its split state (a mirrored tensor: whole on each). */
static void plan_add(double *per_dev, int n_dev, const loom_split_state *st, const loom_tensor *t) {
    for (int j = 0; j < n_dev; j++)
        per_dev[j] += loom_split_axis_is_dim(st->axis)
                          ? (double)loom_split_state_slice_nbytes(st, t, j)
                          : (double)loom_nbytes(t);
}

/* A context for one tensor's metadata (no data), made afresh for each tensor. */
static loom_ctx *meta_ctx(void) {
    return loom_ctx_new(
        (loom_ctx_params){.mem_size = 4 * loom_tensor_overhead(), .no_alloc = true});
}

/* The report of `path` (the options parsed); the command's exit code. */
static int gguf_report(const char *path, bool plan, const char *devices, const char *rules_file,
                       int64_t n_ctx, loom_type kv_type) {
    loom_gguf *g = NULL;
    if (loom_gguf_open(path, &g)) {
        fprintf(stderr, "loom gguf: %s\n", loom_last_error());
        return 1;
    }
    int n_dev = 0;
    loom_dev_t devs[LOOM_META_MAX_DEVICES];
    double w_dev[LOOM_META_MAX_DEVICES] = {0}, kv_dev[LOOM_META_MAX_DEVICES] = {0}, w_host = 0;
    loom_rules *rules = NULL;
    loom_hparams hp;
    int rc = 1;
    if (plan) {
        size_t nd = 0;
        if (!devices) devices = "sim:2";
        if (loom_cli_devices_from_spec(devices, devs, LOOM_META_MAX_DEVICES, &nd)) {
            fprintf(stderr, "loom gguf: %s\n", loom_last_error());
            goto out;
        }
        if (nd > LOOM_META_MAX_DEVICES || nd == 0) {
            fprintf(
                stderr,
                "loom gguf: --devices %s gives %zu devices; a tensor-parallel plan covers 1..%d\n",
                devices, nd, LOOM_META_MAX_DEVICES);
            rc = 2;
            goto out;
        }
        n_dev = (int)nd;
        if (loom_hparams_from_gguf(g, &hp) ||
            loom_rules_builtin(hp.arch, hp.n_expert > 0, &rules) ||
            loom_kv_cache_check_type(&hp, "K (-ctk)", kv_type, n_dev > 1)) {
            fprintf(stderr, "loom gguf: %s\n", loom_last_error());
            goto out;
        }
        if (rules_file) {
            loom_rules *user = NULL;
            if (loom_rules_load_file(rules_file, &user)) {
                fprintf(stderr, "loom gguf: %s\n", loom_last_error());
                goto out;
            }
            if (loom_rules_prepend(rules, user)) {
                fprintf(stderr, "loom gguf: %s\n", loom_last_error()); /* user is consumed */
                goto out;
            }
        }
    }
    printf("%s: GGUF v%u, %lld metadata entries, %lld tensors, alignment %zu, data at %zu\n", path,
           loom_gguf_version(g), (long long)loom_gguf_kv_count(g),
           (long long)loom_gguf_tensor_count(g), loom_gguf_alignment(g), loom_gguf_data_offset(g));
    printf("\nmetadata:\n");
    for (int64_t i = 0; i < loom_gguf_kv_count(g); i++) {
        char val[320];
        loom_gguf_kv_format(g, i, val, sizeof val);
        printf("  ");
        put_escaped(loom_gguf_kv_key(g, i), 44);
        printf(" %-8s ", loom_gguf_type_name(loom_gguf_kv_type(g, i)));
        put_escaped(val, 0);
        printf("\n");
    }
    printf("\ntensors:\n");
    loom_ctx *ctx = meta_ctx();
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
        int64_t ne[4];
        loom_gguf_tensor_ne(g, i, ne);
        char sh[80], sz[32];
        int nd = loom_gguf_tensor_n_dims(g, i);
        size_t o = (size_t)snprintf(sh, sizeof sh, "[");
        for (int d = 0; d < nd; d++)
            o += (size_t)snprintf(sh + o, sizeof sh - o, "%s%lld", d ? ", " : "", (long long)ne[d]);
        snprintf(sh + o, sizeof sh - o, "]");
        loom_cli_format_bytes(sz, sizeof sz, (double)loom_gguf_tensor_size(g, i));
        printf("  ");
        put_escaped(loom_gguf_tensor_name(g, i), 32);
        printf(" %-5s %-22s %10s", loom_gguf_tensor_type_name(g, i), sh, sz);
        if (plan && ctx && loom_gguf_tensor_check_type(g, i) != LOOM_OK) {
            printf("  (type not supported)");
        } else if (plan && ctx) {
            loom_tensor *t = loom_new_tensor(ctx, loom_gguf_tensor_type(g, i), 4, ne);
            loom_set_name(t, loom_gguf_tensor_name(g, i));
            loom_split_state st;
            const loom_rule *m = NULL;
            char state[96];
            if (loom_rules_split_state(rules, &hp, t, n_dev, &st, &m) == LOOM_OK) {
                loom_split_state_format(&st, state, sizeof state);
                /* as the session places it: token embeddings stay in host memory */
                if (!strcmp(t->name, "token_embd.weight"))
                    w_host += (double)loom_nbytes(t);
                else
                    plan_add(w_dev, n_dev, &st, t);
            } else
                snprintf(state, sizeof state, "error: %.80s", loom_last_error());
            printf("  %-28s", state);
            /* block-quantised rows split on axis 0 move whole blocks: show them per device */
            const loom_type_traits *tr = loom_type_traits_get((int)t->type);
            if (tr && tr->is_quantized && st.axis == LOOM_SPLIT_AXIS_0) {
                printf(" blocks");
                for (int j = 0; j < n_dev; j++)
                    printf("%s%lld", j ? "," : " ",
                           (long long)(loom_split_state_dev_count(&st, j) / tr->blck_size));
            }
            if (m) {
                printf(" %s:%d /", m->source, m->line);
                put_escaped(m->pattern, 0);
                printf("/");
            } else
                printf(" (no rule: mirrored)");
            loom_ctx_free(ctx);
            ctx = meta_ctx();
        }
        printf("\n");
    }
    loom_ctx_free(ctx);
    if (plan) {
        printf("\nsplit over %d devices (%s)\n", n_dev, devices);
        /* the KV cache as the session makes it: K and V [n_head_kv * head_dim, n_ctx] per
         * layer (a ring for sliding-window layers), split by the rules */
        int64_t ctx = loom_session_ctx_for(&hp, n_ctx);
        loom_ctx *kc = meta_ctx();
        for (int il = 0; kc && il < hp.n_layer; il++)
            for (int which = 0; which < 2; which++) {
                /* a sliding-window layer: its ring for the default batch of 512 */
                loom_tensor *t = loom_new_tensor_2d(kc, kv_type, hp.n_head_kv * hp.head_dim,
                                                    loom_kv_cache_layer_cells(&hp, ctx, 512, il));
                if (!t) break;
                loom_format_name(t, "cache_%c_l%d", which ? 'v' : 'k', il);
                loom_split_state st;
                if (loom_rules_split_state(rules, &hp, t, n_dev, &st, NULL) == LOOM_OK)
                    plan_add(kv_dev, n_dev, &st, t);
                else
                    plan_add(kv_dev, n_dev, &(loom_split_state){.axis = LOOM_SPLIT_MIRRORED}, t);
                loom_ctx_free(kc);
                kc = meta_ctx();
            }
        loom_ctx_free(kc);
        loom_cli_mem_row rows[LOOM_META_MAX_DEVICES + 1];
        for (int j = 0; j < n_dev; j++) {
            rows[j] = (loom_cli_mem_row){.dev = devs[j], .weights = w_dev[j], .kv = kv_dev[j]};
            snprintf(rows[j].name, sizeof rows[j].name, "%s", loom_dev_name(devs[j]));
            loom_dev_memory(devs[j], &rows[j].free, &rows[j].total);
        }
        rows[n_dev] = (loom_cli_mem_row){.weights = w_host};
        snprintf(rows[n_dev].name, sizeof rows[n_dev].name, "host");
        char title[160];
        snprintf(title, sizeof title,
                 "\nplanned memory per device (-sm tensor, context %lld, KV %s; compute buffers: "
                 "see loom explain):",
                 (long long)ctx, loom_type_name(kv_type));
        loom_cli_print_memory(stdout, title, rows, n_dev + 1);
        for (int j = 0; j < n_dev; j++) {
            double total = w_dev[j] + kv_dev[j];
            if (rows[j].total && total > (double)rows[j].free) {
                char a[32], b[32];
                loom_cli_format_bytes(a, sizeof a, total);
                loom_cli_format_bytes(b, sizeof b, (double)rows[j].free);
                fprintf(stderr,
                        "loom gguf: the plan does not fit %s: %s planned (weights + KV cache), %s "
                        "free\n",
                        rows[j].name, a, b);
                goto out;
            }
        }
    }
    rc = 0;
out:
    loom_rules_free(rules);
    loom_gguf_free(g);
    return rc;
}

int loom_cli_gguf(int argc, char **argv) {
    const char *path = NULL;
    char pbuf[4096];
    bool plan = false;
    /* -dev, -c, -ctk, --split-rules: the shared parser's (the same values and errors as
     * loom run's) */
    loom_model_opts mo;
    loom_model_opts_init(&mo);
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        } else if (!strcmp(a, "--plan")) {
            plan = true;
        } else if ((r = loom_model_opts_parse_only(&mo, "gguf", gguf_names, argc, argv, &i))) {
            if (r < 0) goto done;
        } else if (a[0] != '-' && !path) {
            if (!(path = loom_cli_path(a, pbuf, sizeof pbuf))) goto done;
        } else if (a[0] != '-') {
            fprintf(stderr, "loom gguf: a second file '%s' (one at a time)\n", a);
            goto done;
        } else {
            loom_cli_bad_option("gguf", a, gguf_names, NULL);
            goto done;
        }
    }
    if (!path) {
        fprintf(stderr, "loom gguf: no file given (see loom gguf --help)\n");
        goto done;
    }
    if (!loom_model_opts_finish(&mo, "gguf")) goto done;
    rc = gguf_report(path, plan, mo.sp.devices, mo.sp.split_rules, mo.sp.n_ctx, mo.sp.kv_type);
done:
    loom_model_opts_free(&mo);
    return rc;
}
