/*
 * `loom demo`: builds a small llama-style transformer block with deterministic weights,
 * computes it on the CPU backend, then again split by hand across the devices of
 * --devices (default sim:2: attention on SIM0, FFN on SIM1), and reports whether the two
 * agree and what each device did. Exit 0 only if they agree.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tools/cli.h"
#include "tools/demo_run.h"

static void demo_usage(FILE *f) {
    fprintf(f, "usage: loom demo [options]\n"
               "\n"
               "Builds a llama-style transformer block (RMSNorm, Q/K/V projections, RoPE,\n"
               "causal flash attention with GQA, output projection, residual, RMSNorm, SwiGLU\n"
               "FFN, residual) with deterministic weights, computes it on the CPU backend, then\n"
               "on the given devices with the stages split by hand (stage i on device i mod N:\n"
               "attention on the first, FFN on the second), the activations copied between\n"
               "devices asynchronously and ordered by events. Prints whether the results agree\n"
               "and what each device did; exits 0 only if they agree.\n"
               "\n"
               "options:\n"
               "  --devices SPEC   devices to split over (default sim:2; e.g. sim:4,link=pcie4,\n"
               "                   cpu)\n"
               "  --layers N       layers (default 1; 2 stages each)\n"
               "  --tokens N       tokens per batch (default 16)\n"
               "  --embd N         model width (default 256)\n"
               "  --heads N        attention heads (default 8)\n"
               "  --kv-heads N     key/value heads (default 4)\n"
               "  --ff N           FFN width (default 688)\n"
               "  --type T         weight type: f32, f16, bf16, q8_0, q4_0 (default f16)\n"
               "  --seed N         weights and inputs (default 42)\n"
               "  --threads N      threads of the CPU reference (default: all)\n"
               "  --tol X          largest relative L2 error that counts as agreement\n"
               "                   (default 1e-4)\n"
               "  -h, --help       this text\n");
}

static bool parse_type(const char *name, loom_type *out) {
    for (int t = 0; t < LOOM_TYPE_COUNT; t++) {
        const loom_type_traits *tr = loom_type_traits_get(t);
        if (tr && tr->name && !strcasecmp(tr->name, name)) {
            *out = (loom_type)t;
            return true;
        }
    }
    return false;
}

static void print_report(const loom_demo_hparams *hp, const char *spec, const loom_demo_report *cpu,
                         const loom_demo_report *rep, const loom_demo_diff *d, double tol,
                         bool agree) {
    printf("loom demo: llama-style block, n_embd %d, heads %d (kv %d, head_dim %d), n_ff %d, "
           "%d tokens, %d layer%s, %s weights, seed %llu\n\n",
           hp->n_embd, hp->n_head, hp->n_head_kv, loom_demo_head_dim(hp), hp->n_ff, hp->n_tokens,
           hp->n_layers, hp->n_layers == 1 ? "" : "s", loom_type_name(hp->wtype),
           (unsigned long long)hp->seed);
    printf("CPU reference: 1 graph, %d nodes, %d threads, %.3f ms\n", cpu->cpu_nodes,
           cpu->cpu_threads, cpu->cpu_ms);
    printf("devices %s: %d stages split by hand over %d device%s\n", spec, rep->n_stages,
           rep->n_devices, rep->n_devices == 1 ? "" : "s");
    for (int s = 0; s < rep->n_stages; s++) {
        int d = rep->stage_device[s];
        printf("  stage %d  %-9s layer %d -> %-8s %3d nodes", s,
               loom_demo_stage_is_attn(s) ? "attention" : "ffn", s / 2, rep->dev[d].name,
               rep->stage_nodes[s]);
        if (s == 0)
            printf(", input set from the host\n");
        else if (rep->stage_device[s - 1] != d)
            printf(", input copied from %s (event-ordered)\n",
                   rep->dev[rep->stage_device[s - 1]].name);
        else
            printf(", input copied on the same device\n");
    }
    printf("  run: %.3f ms from input upload to output back on the host\n\n", rep->dev_ms);

    printf("%-10s %6s %6s %6s %11s %11s %6s %12s %11s %11s\n", "device", "stages", "graphs",
           "nodes", "bytes in", "bytes out", "copies", "link time", "mem peak", "weights in");
    for (int i = 0; i < rep->n_devices; i++) {
        const loom_demo_device_report *r = &rep->dev[i];
        if (!r->is_sim) {
            printf("%-10s %6d %6s %6s %11s %11s %6s %12s %11s %11s\n", r->name, r->n_stages, "-",
                   "-", "-", "-", "-", "-", "-", "-");
            continue;
        }
        char bin[24], bout[24], peak[24], up[24], lt[24];
        loom_cli_format_bytes(bin, sizeof bin, (double)r->run.bytes_in);
        loom_cli_format_bytes(bout, sizeof bout, (double)r->run.bytes_out);
        loom_cli_format_bytes(peak, sizeof peak, (double)r->run.mem_peak);
        loom_cli_format_bytes(up, sizeof up, (double)r->upload.bytes_in);
        snprintf(lt, sizeof lt, "%.2f us", r->run.link_time_us);
        printf("%-10s %6d %6llu %6llu %11s %11s %6llu %12s %11s %11s\n", r->name, r->n_stages,
               (unsigned long long)r->run.graphs, (unsigned long long)r->run.nodes, bin, bout,
               (unsigned long long)r->run.copies, lt, peak, up);
    }
    printf("(link time: virtual time of the run's copies under the sim link model; "
           "weights in: uploaded before the run)\n\n");
    printf("result: max |devices - cpu| = %.3g (max |cpu| = %.3g), relative L2 error %.3g "
           "(tolerance %.3g): %s\n",
           d->max_abs, d->max_abs_ref, d->rel_l2, tol,
           agree ? "AGREE" : (d->finite ? "DIFFER" : "NOT FINITE"));
}

int loom_cli_demo(int argc, char **argv) {
    loom_demo_hparams hp;
    loom_demo_hparams_default(&hp);
    const char *spec = "sim:2";
    int threads = 0;
    double tol = 1e-4;
    for (int i = 1; i < argc; i += 2) { /* every option but --help takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            demo_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--devices")) {
            if (!v) {
                fprintf(stderr, "loom demo: --devices needs a value (e.g. sim:2)\n");
                return 2;
            }
            spec = v;
        } else if (!strcmp(a, "--type")) {
            if (!v || !parse_type(v, &hp.wtype)) {
                fprintf(stderr, "loom demo: --type '%s' is not a type (f32, f16, q8_0, ...)\n",
                        v ? v : "");
                return 2;
            }
        } else if (!strcmp(a, "--tol")) {
            char *end = NULL;
            tol = v ? strtod(v, &end) : -1;
            if (!v || !v[0] || *end || !(tol >= 0)) {
                fprintf(stderr, "loom demo: --tol needs a non-negative number\n");
                return 2;
            }
        } else if (!strcmp(a, "--seed")) {
            if (!loom_cli_parse_int("demo", a, v, 0, 2147483647, &x)) return 2;
            hp.seed = (uint64_t)x;
        } else {
            static const struct {
                const char *name;
                int min, max;
            } ints[] = {{"--layers", 1, LOOM_DEMO_MAX_LAYERS},
                        {"--tokens", 1, 4096},
                        {"--embd", 1, 1 << 16},
                        {"--heads", 1, 1024},
                        {"--kv-heads", 1, 1024},
                        {"--ff", 1, 1 << 18},
                        {"--threads", 1, 1024}};
            int *dst[] = {&hp.n_layers,  &hp.n_tokens, &hp.n_embd, &hp.n_head,
                          &hp.n_head_kv, &hp.n_ff,     &threads};
            size_t k = 0;
            while (k < sizeof ints / sizeof ints[0] && strcmp(a, ints[k].name))
                k++;
            if (k == sizeof ints / sizeof ints[0]) {
                static const char *const names[] = {
                    "-h",         "--help",   "--devices", "--type", "--tol",
                    "--seed",     "--layers", "--tokens",  "--embd", "--heads",
                    "--kv-heads", "--ff",     "--threads", NULL};
                loom_cli_unknown_option("demo", a, names, NULL);
                return 2;
            }
            if (!loom_cli_parse_int("demo", a, v, ints[k].min, ints[k].max, dst[k])) return 2;
        }
    }
    if (loom_demo_hparams_check(&hp) != LOOM_OK) {
        fprintf(stderr, "loom %s\n", loom_last_error());
        return 2;
    }

    loom_dev_t devs[LOOM_DEMO_MAX_DEVICES];
    size_t n_dev = 0;
    if (loom_cli_devices_from_spec(spec, devs, LOOM_DEMO_MAX_DEVICES, &n_dev) != LOOM_OK) {
        fprintf(stderr, "loom demo: %s\n", loom_last_error()); /* names the spec */
        return 1;
    }
    if (n_dev == 0) {
        fprintf(stderr, "loom demo: --devices '%s' names no device\n", spec);
        return 1;
    }

    size_t n_out = (size_t)hp.n_embd * (size_t)hp.n_tokens;
    float *ref = loom_malloc(sizeof(float) * n_out);
    float *got = loom_malloc(sizeof(float) * n_out);
    loom_demo_report *cpu = loom_calloc(1, sizeof *cpu);
    loom_demo_report *rep = loom_calloc(1, sizeof *rep);
    int rc = 1;
    if (!ref || !got || !cpu || !rep) {
        fprintf(stderr, "loom demo: out of host memory\n");
        goto done;
    }
    if (loom_demo_run_cpu(&hp, threads, ref, cpu) != LOOM_OK) {
        fprintf(stderr, "loom demo: CPU run failed: %s\n", loom_last_error());
        goto done;
    }
    if (loom_demo_run_devices(&hp, devs, (int)n_dev, got, rep) != LOOM_OK) {
        fprintf(stderr, "loom demo: run on %s failed: %s\n", spec, loom_last_error());
        goto done;
    }
    loom_demo_diff d;
    loom_demo_compare(ref, got, n_out, &d);
    bool agree = d.finite && d.rel_l2 <= tol;
    print_report(&hp, spec, cpu, rep, &d, tol, agree);
    fflush(stdout);
    if (!agree) {
        fprintf(stderr, "loom demo: results differ: relative L2 error %.3g > tolerance %.3g%s\n",
                d.rel_l2, tol, d.finite ? "" : " (non-finite values)");
        goto done;
    }
    rc = 0;

done:
    loom_free(ref);
    loom_free(got);
    loom_free(cpu);
    loom_free(rep);
    return rc;
}
