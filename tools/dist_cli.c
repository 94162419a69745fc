/*
 * `--dist mpi` for loom run (tools/dist_cli.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/meta.h"
#include "loom/rules.h"
#include "tools/dist_cli.h"

bool loom_cli_dist_parse(const char *cmd, const char *v) {
    if (v && !strcmp(v, "mpi")) return true;
    fprintf(stderr, "loom %s: --dist '%s' is not a distribution (expected: mpi)\n", cmd,
            v ? v : "");
    return false;
}

/* The split state of a weight or cache tensor of a hybrid stage's meta device: the rules of
 * the opened model's architecture (the --split-rules file first), as the session gives
 * its own meta device in tensor mode; everything else is whole on every local device. */
static loom_status hybrid_leaf(const loom_tensor *t, loom_split_state *out, void *ud) {
    loom_cli_dist *cd = ud;
    if (!t->name[0] || !(t->flags & LOOM_TENSOR_FLAG_PARAM || strncmp(t->name, "cache_", 6) == 0))
        return LOOM_OK;
    if (!cd->rules) {
        if (!cd->o || !cd->o->gguf)
            return loom_error(LOOM_ERR_INTERNAL,
                              "--dist mpi: no model opened for the stage's split");
        loom_status st = loom_hparams_from_gguf(cd->o->gguf, &cd->hp);
        if (st == LOOM_OK) st = loom_rules_builtin(cd->hp.arch, cd->hp.n_expert > 0, &cd->rules);
        if (st == LOOM_OK && cd->o->sp.split_rules) {
            loom_rules *user = NULL;
            st = loom_rules_load_file(cd->o->sp.split_rules, &user);
            if (st == LOOM_OK) st = loom_rules_prepend(cd->rules, user);
        }
        if (st == LOOM_OK)
            st = loom_kv_cache_check_type(&cd->hp, "K (-ctk)", cd->o->sp.kv_type, true);
        if (st == LOOM_OK)
            st = loom_kv_cache_check_type(
                &cd->hp, "V (-ctv)",
                cd->o->sp.kv_type_v_set ? cd->o->sp.kv_type_v : cd->o->sp.kv_type, true);
        if (st) {
            loom_rules_free(cd->rules);
            cd->rules = NULL;
            return loom_error(st, "--dist mpi: each stage splits its tensors over %d devices: %s",
                              cd->n_local, loom_last_error());
        }
    }
    return loom_rules_split_state_weighted(cd->rules, &cd->hp, t, cd->n_local, NULL, out, NULL);
}

bool loom_cli_dist_setup(loom_cli_dist *cd, loom_model_opts *o, const char *cmd) {
    memset(cd, 0, sizeof *cd);
    cd->size = 1;
    if (o->sp.split_mode == LOOM_SPLIT_MODE_NONE) {
        fprintf(stderr,
                "loom %s: --dist mpi splits the model across ranks: -sm tensor or layer, "
                "not none\n",
                cmd);
        return false;
    }
    if (loom_dist_init(&cd->d)) {
        fprintf(stderr, "loom %s: %s\n", cmd, loom_last_error());
        return false;
    }
    cd->rank = loom_dist_rank(cd->d);
    cd->size = loom_dist_size(cd->d);
    const char *spec = o->sp.devices && *o->sp.devices ? o->sp.devices : "cpu";
    size_t n = 0;
    loom_status st = loom_devices_from_spec(spec, cd->local, 16, &n);
    cd->n_local = (int)n;
    loom_dev_t local = n ? cd->local[0] : NULL;
    if (n > 1 && o->sp.split_mode == LOOM_SPLIT_MODE_DEFAULT)
        o->sp.split_mode = LOOM_SPLIT_MODE_LAYER; /* several devices per rank: the hybrid */
    if (st == LOOM_OK && n == 0)
        st = loom_error(LOOM_ERR_INVALID_ARG, "--dist mpi: --devices '%s' names no device", spec);
    if (st == LOOM_OK && n > 1 && o->sp.split_mode != LOOM_SPLIT_MODE_LAYER)
        st = loom_error(LOOM_ERR_INVALID_ARG,
                        "--dist mpi: --devices '%s' is %zu devices per rank: that is the hybrid "
                        "layout, -sm layer (pipeline stages across ranks, tensor parallelism over "
                        "each rank's devices); -sm tensor takes one device per rank",
                        spec, n);
    if (st == LOOM_OK && n > 1) {
        st = loom_meta_device_new(cd->local, (int)n, hybrid_leaf, cd, &cd->meta);
        cd->o = o;
        local = cd->meta;
    }
    if (st == LOOM_OK)
        st = loom_dist_devices(cd->d, local, o->sp.threads, cd->devs, 16, &cd->n_devs);
    if (st) fprintf(stderr, "loom %s: rank %d: %s\n", cmd, cd->rank, loom_last_error());
    /* agreed: a rank given other --devices or -sm than the others must not leave them
     * waiting for it in the first collective */
    if (!loom_cli_dist_agree(cd, st == LOOM_OK, cmd)) return false;
    o->sp.devs = cd->devs;
    o->sp.n_devs = cd->n_devs;
    if (cd->n_devs > 1 && o->sp.split_mode == LOOM_SPLIT_MODE_DEFAULT)
        o->sp.split_mode = LOOM_SPLIT_MODE_TENSOR;
    return true;
}

bool loom_cli_dist_agree(loom_cli_dist *cd, bool ok, const char *cmd) {
    if (!cd->d) return ok;
    loom_status st = loom_dist_agree(
        cd->d, ok ? LOOM_OK : (loom_last_status() ? loom_last_status() : LOOM_ERR_INTERNAL));
    if (st == LOOM_OK) return true;
    if (ok) fprintf(stderr, "loom %s: rank %d stops: %s\n", cmd, cd->rank, loom_last_error());
    return false;
}

void loom_cli_dist_quiet_followers(loom_cli_dist *cd, const char *cmd) {
    if (!cd->d || cd->rank == 0) return;
    if (!freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "loom %s: rank %d: cannot silence stdout\n", cmd, cd->rank);
        loom_dist_abort(cd->d, 1);
    }
}

/* FNV-1a, 64 bits, over n bytes, continuing from h */
static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The fingerprint of a file: its size and a hash of its first MiB (the GGUF header: the
 * metadata and the tensor table) and its last 64 KiB (weights). false after setting the
 * error (the file cannot be read). */
static bool file_fingerprint(const char *path, int64_t *size, uint64_t *hash) {
    *size = -1;
    *hash = 0xcbf29ce484222325ull;
    FILE *f = fopen(path, "rb");
    if (!f) {
        loom_error(LOOM_ERR_IO, "cannot read '%s' for its fingerprint: %s", path, strerror(errno));
        return false;
    }
    enum { HEAD = 1 << 20 };
    unsigned char *buf = malloc(HEAD);
    bool ok = buf && fseeko(f, 0, SEEK_END) == 0 && (*size = (int64_t)ftello(f)) >= 0;
    const int64_t head = *size < HEAD ? *size : HEAD;
    const int64_t tail_at = *size - 65536 > head ? *size - 65536 : head;
    ok = ok && fseeko(f, 0, SEEK_SET) == 0 && fread(buf, 1, (size_t)head, f) == (size_t)head;
    if (ok) *hash = fnv1a(*hash, buf, (size_t)head);
    ok = ok && fseeko(f, (off_t)tail_at, SEEK_SET) == 0 &&
         fread(buf, 1, (size_t)(*size - tail_at), f) == (size_t)(*size - tail_at);
    if (ok) *hash = fnv1a(*hash, buf, (size_t)(*size - tail_at));
    fclose(f);
    free(buf);
    if (!ok) loom_error(LOOM_ERR_IO, "cannot read '%s' for its fingerprint", path);
    return ok;
}

/* What every rank must agree on: the model file and each option that shapes the graphs,
 * the placement or the split. Rank 0's is broadcast; each rank names the first that differs.
 * The sampling options (-s, --temp, --top-k ...), -n, -p and -r are rank 0's alone: it
 * samples and leads the control flow. */
enum { SHAPE_N = 16 };
typedef struct dist_shape {
    int64_t v[SHAPE_N];
    int64_t model_size;
    uint64_t model_hash;
    char model[512], devices[128], dev_kind[128], rules[512], ts[128];
} dist_shape;

static const char *const shape_names[SHAPE_N] = {
    "the model's vocabulary size",
    "the model's n_embd",
    "the model's layer count",
    "the model's head count",
    "the model's KV head count",
    "the model's expert count",
    "-c (the context)",
    "-sm (the split mode)",
    "-b/-ub (the graph batch)",
    "-ctk (the K cache type)",
    "-ctv (the V cache type)",
    "-ngl (layers on the devices)",
    "-nkvo (KV cache in host memory)",
    "-fa (flash attention)",
    "--devices (devices per rank)",
    "--swa-full",
};

static void shape_of(const loom_cli_dist *cd, loom_session *s, const loom_model_opts *o,
                     dist_shape *sh) {
    const loom_hparams *hp = &loom_session_model(s)->hp;
    memset(sh, 0, sizeof *sh);
    const int64_t v[SHAPE_N] = {hp->n_vocab,
                                hp->n_embd,
                                hp->n_layer,
                                hp->n_head,
                                hp->n_head_kv,
                                hp->n_expert,
                                loom_session_n_ctx(s),
                                loom_session_split_mode(s),
                                o->sp.n_batch,
                                o->sp.kv_type,
                                o->sp.kv_type_v_set ? o->sp.kv_type_v : o->sp.kv_type,
                                o->sp.n_gpu_layers,
                                o->sp.no_kv_offload,
                                o->flash_attn,
                                cd->n_local,
                                o->sp.swa_full};
    memcpy(sh->v, v, sizeof v);
    snprintf(sh->model, sizeof sh->model, "%s", o->model ? o->model : "(the built-in model)");
    snprintf(sh->devices, sizeof sh->devices, "%s",
             o->sp.devices && *o->sp.devices ? o->sp.devices : "cpu");
    /* the kind of each local device (its backend), not the spec: ranks of one node may
     * name different GPUs (cuda:0 on rank 0, cuda:1 on rank 1) */
    for (int i = 0; i < cd->n_local; i++) {
        loom_reg_t reg = loom_dev_reg(cd->local[i]);
        size_t l = strlen(sh->dev_kind);
        snprintf(sh->dev_kind + l, sizeof sh->dev_kind - l, "%s%s", i ? "," : "",
                 reg ? loom_reg_name(reg) : loom_dev_name(cd->local[i]));
    }
    snprintf(sh->rules, sizeof sh->rules, "%s", o->sp.split_rules ? o->sp.split_rules : "");
    snprintf(sh->ts, sizeof sh->ts, "%s", o->tensor_split ? o->tensor_split : "");
    sh->model_hash = 0xcbf29ce484222325ull;
    if (o->synth_data) {
        sh->model_size = (int64_t)o->synth_size;
        sh->model_hash = fnv1a(sh->model_hash, o->synth_data, o->synth_size);
    }
}

/* Field i's value v as the option would spell it (a split mode, a cache type) */
static void shape_value(int i, int64_t v, char *buf, size_t size) {
    if (i == 7)
        snprintf(buf, size, "%s", loom_split_mode_name((loom_split_mode)v));
    else if (i == 9 || i == 10)
        snprintf(buf, size, "%s", loom_type_name((loom_type)v));
    else
        snprintf(buf, size, "%lld", (long long)v);
}

/* Sets the error naming what differs between this rank's shape and rank 0's; false when
 * nothing does. */
static bool shape_differs(const dist_shape *mine, const dist_shape *lead) {
    if (mine->model_size != lead->model_size || mine->model_hash != lead->model_hash) {
        loom_error(LOOM_ERR_INVALID_ARG,
                   "its model or options differ from rank 0's: the model file '%s' (%lld bytes, "
                   "fingerprint %016llx) is not rank 0's '%s' (%lld bytes, fingerprint %016llx): "
                   "every rank must open the same file",
                   mine->model, (long long)mine->model_size, (unsigned long long)mine->model_hash,
                   lead->model, (long long)lead->model_size, (unsigned long long)lead->model_hash);
        return true;
    }
    for (int i = 0; i < SHAPE_N; i++)
        if (mine->v[i] != lead->v[i]) {
            char a[64], b[64];
            shape_value(i, mine->v[i], a, sizeof a);
            shape_value(i, lead->v[i], b, sizeof b);
            loom_error(LOOM_ERR_INVALID_ARG,
                       "its model or options differ from rank 0's: %s is %s here, %s on rank 0: "
                       "every rank must run the same model with the same options",
                       shape_names[i], a, b);
            return true;
        }
    if (strcmp(mine->dev_kind, lead->dev_kind)) {
        loom_error(LOOM_ERR_INVALID_ARG,
                   "its model or options differ from rank 0's: --devices (the kind of device) is "
                   "'%s' (%s) here, '%s' (%s) on rank 0: every rank must run the same kind of "
                   "device",
                   mine->devices, mine->dev_kind, lead->devices, lead->dev_kind);
        return true;
    }
    const struct {
        const char *name, *mine, *lead;
    } str[] = {{"--split-rules", mine->rules, lead->rules},
               {"-ts (the tensor split)", mine->ts, lead->ts}};
    for (size_t i = 0; i < sizeof str / sizeof str[0]; i++)
        if (strcmp(str[i].mine, str[i].lead)) {
            loom_error(LOOM_ERR_INVALID_ARG,
                       "its model or options differ from rank 0's: %s is '%s' here, '%s' on rank "
                       "0: every rank must run the same model with the same options",
                       str[i].name, str[i].mine, str[i].lead);
            return true;
        }
    return false;
}

bool loom_cli_dist_same_session(loom_cli_dist *cd, loom_session *s, const loom_model_opts *o,
                                const char *cmd) {
    if (!cd->d) return true;
    static dist_shape mine, lead; /* one session per process at a time; 1.8 KiB each */
    shape_of(cd, s, o, &mine);
    loom_status st = LOOM_OK;
    if (o->model && !file_fingerprint(o->model, &mine.model_size, &mine.model_hash))
        st = loom_last_status();
    /* a rules file is compared by content too (same path, other text on another node) */
    int64_t rsize = 0;
    uint64_t rhash = 0;
    if (st == LOOM_OK && o->sp.split_rules && !file_fingerprint(o->sp.split_rules, &rsize, &rhash))
        st = loom_last_status();
    if (st == LOOM_OK && o->sp.split_rules) {
        size_t l = strlen(mine.rules);
        snprintf(mine.rules + l, sizeof mine.rules - l, " (%lld bytes, fingerprint %016llx)",
                 (long long)rsize, (unsigned long long)rhash);
    }
    lead = mine;
    if (loom_dist_bcast(cd->d, &lead, sizeof lead, 0)) st = loom_last_status();
    if (st == LOOM_OK && shape_differs(&mine, &lead)) st = loom_last_status();
    if (st) fprintf(stderr, "loom %s: rank %d: %s\n", cmd, cd->rank, loom_last_error());
    if (!loom_cli_dist_agree(cd, st == LOOM_OK, cmd)) return false;
    /* every rank is here with the same session: how device memory crosses ranks (NCCL for
     * CUDA members, else host memory and MPI); a failure is the same on every rank */
    st = loom_dist_comm_setup(cd->d);
    if (st) {
        fprintf(stderr, "loom %s: rank %d stops: %s\n", cmd, cd->rank, loom_last_error());
        return false;
    }
    return true;
}

/* kB fields of /proc/self/status */
static long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* The rank's lines go out in one write: the ranks' stderr reach mpirun's in pieces, and a
 * line written in parts can be cut by another rank's. */
void loom_cli_dist_print_rank_memory(const loom_cli_dist *cd, loom_session *s, FILE *f) {
    loom_cli_mem_row rows[LOOM_META_MAX_DEVICES + 2];
    int n = loom_cli_session_memory(s, rows, (int)(sizeof rows / sizeof rows[0]));
    double w = 0, kv = 0, c = 0;
    const char *name = "?";
    for (int i = 0; i < n; i++) {
        if (rows[i].dev && loom_dev_is_dist(rows[i].dev) && !loom_dev_is_remote(rows[i].dev)) {
            w = rows[i].weights, kv = rows[i].kv, c = rows[i].compute;
            name = rows[i].name;
        }
    }
    char buf[2048];
    size_t o = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (o < sizeof buf) o += (size_t)snprintf(buf + o, sizeof buf - o, __VA_ARGS__);           \
    } while (0)
    PUT("rank %d/%d: %s holds weights %.3f MiB, KV %.3f MiB, compute %.3f MiB; RSS anon %.1f "
        "MiB, file %.1f MiB, peak %.1f MiB\n",
        cd->rank, cd->size, name, w / 1048576.0, kv / 1048576.0, c / 1048576.0,
        (double)status_kb("RssAnon") / 1024.0, (double)status_kb("RssFile") / 1024.0,
        (double)status_kb("VmHWM") / 1024.0);
    loom_dist_stats ds;
    loom_dist_get_stats(cd->d, &ds);
    PUT("rank %d/%d: MPI point-to-point: %llu sends (%llu bytes), %llu receives (%llu bytes); "
        "%llu collectives\n",
        cd->rank, cd->size, (unsigned long long)ds.sends, (unsigned long long)ds.bytes_sent,
        (unsigned long long)ds.recvs, (unsigned long long)ds.bytes_recv,
        (unsigned long long)ds.collectives);
    const char *why = NULL, *via = loom_dist_comm_describe(cd->d, &why);
    PUT("rank %d/%d: across ranks: %s%s%s%s; through it %llu allreduces, %llu sends, %llu "
        "receives\n",
        cd->rank, cd->size, via, why && why[0] ? " (" : "", why ? why : "",
        why && why[0] ? ")" : "", (unsigned long long)ds.rank_comm_allreduces,
        (unsigned long long)ds.rank_comm_sends, (unsigned long long)ds.rank_comm_recvs);
    if (cd->meta) {
        /* hybrid: the stage's tensor parallelism over this rank's devices */
        loom_meta_stats ms = {0};
        loom_sched *sc = loom_session_sched(s);
        for (int b = 0; b < loom_sched_get_n_backends(sc); b++) {
            loom_backend_t in = loom_dist_backend_local(loom_sched_get_backend(sc, b));
            if (in && loom_backend_is_meta(in)) loom_meta_backend_get_stats(in, &ms);
        }
        PUT("rank %d/%d: stage on %s: %llu allreduces in %llu graphs; in use:", cd->rank, cd->size,
            loom_dev_name(cd->meta), (unsigned long long)ms.reductions,
            (unsigned long long)ms.graphs);
        for (int j = 0; j < cd->n_local; j++) {
            size_t fr = 0, tot = 0;
            loom_dev_memory(cd->local[j], &fr, &tot);
            PUT(" %s %.3f MiB", loom_dev_name(cd->local[j]),
                tot > fr ? (double)(tot - fr) / 1048576.0 : 0.0);
        }
        PUT("\n");
    }
#undef PUT
    if (o >= sizeof buf) buf[sizeof buf - 2] = '\n', o = sizeof buf - 1;
    fwrite(buf, 1, o, f);
}

void loom_cli_dist_free(loom_cli_dist *cd) {
    loom_dist_free(cd->d); /* its proxies are buffers of cd->meta */
    cd->d = NULL;
    loom_meta_device_free(cd->meta);
    cd->meta = NULL;
    loom_rules_free(cd->rules);
    cd->rules = NULL;
}
