/*
 * `loom gguf FILE [--plan --devices SPEC]`: a file's metadata and tensors; with --plan,
 * each tensor's split state over the devices and the rule that decided it.
 */
#include <stdio.h>
#include <string.h>

#include "loom/rules.h"
#include "tools/cli.h"
#include "tools/model_cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: loom gguf FILE [--plan --devices SPEC] [--split-rules FILE]\n\n"
               "Prints the metadata and tensors of a GGUF file. With --plan, also each tensor's\n"
               "split state over the devices (tensor parallelism) and the rule that matched it.\n");
}

int loom_cli_gguf(int argc, char **argv) {
    const char *path = NULL, *devices = NULL, *rules_file = NULL;
    bool plan = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--plan")) {
            plan = true;
        } else if (!strcmp(a, "--devices") && v) {
            devices = v;
            i++;
        } else if (!strcmp(a, "--split-rules") && v) {
            rules_file = v;
            i++;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "loom gguf: unknown or incomplete option '%s' (see loom gguf --help)\n", a);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "loom gguf: no file given (see loom gguf --help)\n");
        return 2;
    }
    loom_gguf *g = NULL;
    if (loom_gguf_open(path, &g)) {
        fprintf(stderr, "loom gguf: %s\n", loom_last_error());
        return 1;
    }
    int n_dev = 0;
    loom_rules *rules = NULL;
    loom_hparams hp;
    int rc = 1;
    if (plan) {
        loom_dev_t devs[16];
        size_t nd = 0;
        if (!devices) devices = "sim:2";
        if (loom_cli_devices_from_spec(devices, devs, 16, &nd)) {
            fprintf(stderr, "loom gguf: %s\n", loom_last_error());
            goto out;
        }
        n_dev = (int)(nd > 16 ? 16 : nd);
        if (loom_hparams_from_gguf(g, &hp) || loom_rules_builtin(hp.arch, hp.n_expert > 0, &rules)) {
            fprintf(stderr, "loom gguf: %s\n", loom_last_error());
            goto out;
        }
        if (rules_file) {
            loom_rules *user = NULL;
            if (loom_rules_load_file(rules_file, &user)) {
                fprintf(stderr, "loom gguf: %s\n", loom_last_error());
                goto out;
            }
            loom_rules_prepend(rules, user);
        }
    }
    printf("%s: GGUF v%u, %lld metadata entries, %lld tensors, alignment %zu, data at %zu\n", path,
           loom_gguf_version(g), (long long)loom_gguf_kv_count(g), (long long)loom_gguf_tensor_count(g),
           loom_gguf_alignment(g), loom_gguf_data_offset(g));
    printf("\nmetadata:\n");
    for (int64_t i = 0; i < loom_gguf_kv_count(g); i++) {
        char val[320];
        loom_gguf_kv_format(g, i, val, sizeof val);
        printf("  %-44s %-8s %s\n", loom_gguf_kv_key(g, i), loom_gguf_type_name(loom_gguf_kv_type(g, i)), val);
    }
    printf("\ntensors:\n");
    loom_ctx *ctx = loom_ctx_new((loom_ctx_params){.mem_size = 4 * loom_tensor_overhead(), .no_alloc = true});
    for (int64_t i = 0; i < loom_gguf_tensor_count(g); i++) {
        int64_t ne[4];
        loom_gguf_tensor_ne(g, i, ne);
        char sh[80], sz[32];
        int nd = loom_gguf_tensor_n_dims(g, i);
        size_t o = (size_t)snprintf(sh, sizeof sh, "[");
        for (int d = 0; d < nd; d++) o += (size_t)snprintf(sh + o, sizeof sh - o, "%s%lld", d ? ", " : "", (long long)ne[d]);
        snprintf(sh + o, sizeof sh - o, "]");
        loom_cli_format_bytes(sz, sizeof sz, (double)loom_gguf_tensor_size(g, i));
        printf("  %-32s %-5s %-22s %10s", loom_gguf_tensor_name(g, i), loom_gguf_tensor_type_name(g, i), sh, sz);
        if (plan && ctx && loom_gguf_tensor_check_type(g, i) != LOOM_OK) {
            printf("  (type not supported)");
        } else if (plan && ctx) {
            loom_tensor *t = loom_new_tensor(ctx, loom_gguf_tensor_type(g, i), 4, ne);
            loom_set_name(t, loom_gguf_tensor_name(g, i));
            loom_split_state st;
            const loom_rule *m = NULL;
            char state[96];
            if (loom_rules_split_state(rules, &hp, t, n_dev, &st, &m) == LOOM_OK)
                loom_split_state_format(&st, state, sizeof state);
            else
                snprintf(state, sizeof state, "error: %.80s", loom_last_error());
            printf("  %-28s", state);
            /* block-quantised rows split on axis 0 move whole blocks: show them per device */
            const loom_type_traits *tr = loom_type_traits_get((int)t->type);
            if (tr && tr->is_quantized && st.axis == LOOM_SPLIT_AXIS_0) {
                printf(" blocks");
                for (int j = 0; j < n_dev; j++)
                    printf("%s%lld", j ? "," : " ", (long long)(loom_split_state_dev_count(&st, j) / tr->blck_size));
            }
            if (m) printf(" %s:%d /%s/", m->source, m->line, m->pattern);
            else printf(" (no rule: mirrored)");
            loom_ctx_free(ctx);
            ctx = loom_ctx_new((loom_ctx_params){.mem_size = 4 * loom_tensor_overhead(), .no_alloc = true});
        }
        printf("\n");
    }
    loom_ctx_free(ctx);
    if (plan) printf("\nsplit over %d devices (%s)\n", n_dev, devices);
    rc = 0;
out:
    loom_rules_free(rules);
    loom_gguf_free(g);
    return rc;
}
