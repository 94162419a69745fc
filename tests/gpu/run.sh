#!/usr/bin/env bash
# loom's GPU check runner: the whole first GPU window in one command. tests/gpu/bundle.sh
# copies it to .gpu/run.sh beside the binaries, module and models it runs; on the GPU
# machine run it from anywhere:
#
#   bash .gpu/window.sh              # the window: BUDGET=540 s, OUT=./gpu-out (or $OUT)
#   OUT=/tmp/o BUDGET=300 bash .gpu/run.sh
#
# Needs only bash, coreutils (timeout, date, ...), tar and python3 (optional: summary.json).
# It writes exactly four files into $OUT (default ./gpu-out), so that a tool returning only
# a few files returns all of them:
#   summary.txt   the GPU, libraries, every case (PASS, FAIL, SKIP, TIMEOUT, NOTRUN) and
#                 its seconds, the figures (logits vs the CPU, CUDA graph captures and
#                 replays, ...), the speed table and the totals; printed last on stdout,
#                 ordered so that its end (the tail a tool keeps) holds what matters most
#   summary.json  the same cases and figures as JSON
#   speed.md      the speed table: pp512, tg128 and tg128 @ d2048 per model and device spec
#   logs.tgz      everything else: log.txt (every case's output), cases/*.log, the MANIFEST
# Its working files live in a temporary folder (TMPDIR), removed at the end.
#
# Budget: the whole run, the runner's own steps included, ends within BUDGET seconds
# (default 540: 9 minutes, so that a second run fits in a 15-minute device lease). Every
# case has its own limit; a case starts only when that limit fits in what is left of the
# budget (less the reserve for the summary), else it is recorded NOTRUN; a case that runs
# past its limit is TIMEOUT and fails the run.
#
# Order: the environment (nvidia-smi, which cuBLAS/cudart/NCCL were found); in the
# background from the start, synth_model writes TinyLlama-1.1B-shaped models (SYNTH_TYPES,
# default q4_0 q8_0 f16); every test of //tests/gpu:cuda_test in its own process (the quick
# device checks, every op against the CPU, then the graph-replay, model and meta-device
# checks); `loom devices`; for each synthesised model `loom bench` (pp512, tg128, tg128 @
# d2048) on cuda:0, and for the first one also on a 2-way meta device over GPU 0 and its
# logits on cuda:0 and meta devices against the CPU (cuda.model_synth_file_vs_cpu); `loom run
# --dist mpi` over cuda:0 where the image has mpirun (dist_nccl.sh); then, with the time left,
# compute-sanitizer racecheck and memcheck on the kernels with shared memory and block
# layouts (attention, sorts, block reductions, block-type matmuls, set_rows), each tool an
# equal share. Without a GPU (the CPU dry run in CI) the GPU cases skip, the model is
# synthesised at SYNTH_ARGS' size and benchmarked on the CPU, and the runner still completes.
#
# Environment: OUT, BUDGET (seconds), CUDA_PATH (searched first for the CUDA libraries),
# GPU_FILTER (a grep -E pattern: run only the cuda_test cases it matches), NO_SANITIZER=1,
# SYNTH_TYPES (weight types, "" = none), SYNTH_ARGS (extra synth_model arguments, e.g.
# "--layers 1 --vocab 512" for a tiny model), RUNNER_SELFTEST=1 (adds three cases that
# sleep, one of them past its limit and one whose limit cannot fit: the dry run checks the
# budget rules with them).
# Exit status: 0 when nothing failed or timed out (skips and NOTRUN are not failures), 1
# otherwise, 2 when the bundle is incomplete.
set -u
t_start=$(date +%s) # the runner's own time counts against the budget from here
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -x "$here/bin/cuda_test" ] && [ -x "$here/../../.gpu/bin/cuda_test" ]; then
    here=$(cd "$here/../../.gpu" && pwd) # run from the source tree: use the bundle
fi
if [ ! -x "$here/bin/cuda_test" ] || [ ! -x "$here/bin/loom" ]; then
    echo "run.sh: no bundle at $here (build it first: bash tests/gpu/bundle.sh)" >&2
    exit 2
fi
OUT=${OUT:-./gpu-out}
BUDGET=${BUDGET:-540}
SYNTH_TYPES=${SYNTH_TYPES-q4_0 q8_0 f16}
SYNTH_ARGS=${SYNTH_ARGS:-}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/loom-gpu-run.XXXXXX") || exit 2
models_tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-gpu-models.XXXXXX") || exit 2
bg_pids=()
# stop_job PID: a background job of ours and the processes it started (timeout, synth_model)
stop_job() {
    pkill -TERM -P "$1" 2>/dev/null
    kill "$1" 2>/dev/null
}
cleanup() {
    local p
    for p in "${bg_pids[@]}"; do stop_job "$p"; done
    rm -rf "$work" "$models_tmp"
}
trap cleanup EXIT
mkdir -p "$work/cases"
log="$work/log.txt"
results="$work/results.tsv"
: >"$log"
: >"$results"
deadline=$((t_start + BUDGET))
reserve=6 # seconds kept for the summary, summary.json and logs.tgz

say() { echo "$*" | tee -a "$log"; }
now() { date +%s; }
left() { echo $((deadline - $(now) - reserve)); }

# record STATUS NAME SECONDS NOTE
record() {
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$results"
    printf '%-8s %-62s %5ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$log"
}

case_log() { echo "$work/cases/${1//[^A-Za-z0-9_.@-]/_}.log"; }

# run_case NAME LIMIT KIND CMD...: runs CMD with its own timeout LIMIT, its output into
# cases/NAME.log and log.txt. It starts only when LIMIT fits in what is left of the budget
# (else NOTRUN). KIND gtest: SKIP when the test said so.
run_case() {
    local name=$1 limit=$2 kind=$3
    shift 3
    local l
    l=$(left)
    if [ "$limit" -gt "$l" ]; then
        record NOTRUN "$name" 0 "its limit of ${limit}s does not fit in the ${l}s left"
        return 0
    fi
    local f t0 rc st note
    f=$(case_log "$name")
    t0=$(now)
    echo "==== $name (limit ${limit}s): $*" >>"$log"
    timeout -k 3 "$limit" "$@" >"$f" 2>&1 </dev/null
    rc=$?
    cat "$f" >>"$log"
    note=""
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        st=TIMEOUT
        note="killed after its limit of ${limit}s"
    elif [ "$rc" -ne 0 ]; then
        st=FAIL
        # the first failure's message (gtest: "file:line: Failure", "Failed", message)
        local nf
        nf=$(grep -c ': Failure$' "$f")
        note=$(awk '/: Failure$/ {f = 1; next} f && $0 != "Failed" {print; exit}' "$f" | cut -c1-200)
        [ -n "$note" ] || note=$(grep -m1 -E 'failed|error|ERROR|FAILED|FAIL' "$f" | cut -c1-200)
        [ "$nf" -gt 1 ] && note="($nf failures) $note"
        [ -n "$note" ] || note="exit $rc"
    elif [ "$kind" = gtest ] && grep -q '^\[  SKIPPED \]' "$f"; then
        st=SKIP
        note=$(grep -m1 -A1 -E ': Skipped$' "$f" | tail -1 | cut -c1-160)
    else
        st=PASS
    fi
    record "$st" "$name" $(($(now) - t0)) "$note"
}

# ---------------------------------------------------------------- environment
say "loom GPU checks: bundle $here, output $OUT, budget ${BUDGET}s, started $(date -u +%FT%TZ)"
[ -f "$here/MANIFEST" ] && sed -n '1,6p' "$here/MANIFEST" | tee -a "$log"

have_gpu=0
gpu_desc="none"
if command -v nvidia-smi >/dev/null 2>&1; then
    run_case env.nvidia-smi 20 plain nvidia-smi
    if timeout 10 nvidia-smi -L >/dev/null 2>&1 && [ -n "$(timeout 10 nvidia-smi -L 2>/dev/null)" ]; then
        have_gpu=1
        gpu_desc=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
    fi
else
    record SKIP env.nvidia-smi 0 "nvidia-smi not found: no GPU here (dry run)"
fi

# The CUDA libraries by name, from the image: the loader's cache, then the usual places
# (CUDA_PATH first, Python wheels last); never a stubs/ folder (stubs load and then fail).
find_lib() { # find_lib SONAME -> prints "path<TAB>how"
    local so=$1 p d
    if command -v ldconfig >/dev/null 2>&1; then
        p=$(ldconfig -p 2>/dev/null | awk -v so="$so" '$1 == so {print $NF}' | grep -v /stubs/ | head -1)
        if [ -n "$p" ] && [ -f "$p" ]; then
            printf '%s\tldconfig cache\n' "$p"
            return 0
        fi
    fi
    local dirs=()
    [ -n "${CUDA_PATH:-}" ] && dirs+=("$CUDA_PATH/lib64" "$CUDA_PATH/lib" "$CUDA_PATH/targets/x86_64-linux/lib")
    dirs+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
    for d in /usr/local/cuda-*/lib64; do [ -d "$d" ] && dirs+=("$d"); done
    dirs+=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /opt/conda/lib)
    if command -v python3 >/dev/null 2>&1; then
        while read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <(python3 - <<'PY' 2>/dev/null
import glob, site, sys
roots = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
for r in dict.fromkeys(roots):
    for d in sorted(glob.glob(r + "/nvidia/*/lib")):
        print(d)
PY
)
    fi
    for d in "${dirs[@]}"; do
        case "$d" in */stubs | */stubs/*) continue ;; esac
        if [ -f "$d/$so" ]; then
            printf '%s\t%s\n' "$d/$so" "search path"
            return 0
        fi
    done
    return 1
}

needed=()
if [ -f "$here/NEEDED" ]; then
    while read -r so; do [ -n "$so" ] && needed+=("$so"); done <"$here/NEEDED"
fi
libpath=""
lib_report=()
missing_cuda=0
for so in "${needed[@]}"; do
    if r=$(find_lib "$so"); then
        p=${r%%$'\t'*}
        lib_report+=("$so -> $(readlink -f "$p") ($(printf '%s' "$r" | cut -f2))")
        d=$(dirname "$p")
        case ":$libpath:" in *":$d:"*) ;; *) libpath="${libpath:+$libpath:}$d" ;; esac
    else
        lib_report+=("$so -> NOT FOUND in the image")
        missing_cuda=$((missing_cuda + 1))
    fi
done
libpath="${libpath:+$libpath:}$here/lib"
# Libraries the image may have in another version are used from the bundle only where the
# image has none: libstdc++/libgcc_s (lib/fallback) and Open MPI (lib/mpi), so that the
# image's own mpirun and CUDA libraries never load the bundle's copies.
image_has() { command -v ldconfig >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$1 "; }
image_has 'libstdc++\.so\.6' || libpath="$libpath:$here/lib/fallback"
mpi_from=image
if [ -d "$here/lib/mpi" ] && ! image_has 'libmpi\.so\.[0-9]*'; then
    libpath="$libpath:$here/lib/mpi"
    mpi_from=bundle
fi
# mpirun itself runs with the image's own library path; only the loom it starts gets ours
export LOOM_IMAGE_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LOOM_BACKEND_PATH="$here/runfiles/loom/backends/cuda"
export LOOM_MODELS_DIR="$here/models"
export TEST_SRCDIR="$here/runfiles" TEST_WORKSPACE=loom
say "gpu: $gpu_desc"
for l in "${lib_report[@]}"; do say "library: $l"; done
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH (libmpi from the $mpi_from)"

# Every bundled object must resolve (ldd, with the paths above).
unresolved=""
if command -v ldd >/dev/null 2>&1; then
    for o in "$here/bin/cuda_test" "$here/bin/loom" "$here/bin/synth_model" "$LOOM_BACKEND_PATH"/*.so; do
        [ -f "$o" ] || continue
        u=$(ldd "$o" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
        [ -n "$u" ] && unresolved="$unresolved $(basename "$o"): $u"
    done
fi
if [ -n "$unresolved" ]; then
    if [ "$have_gpu" = 1 ]; then
        record FAIL env.libraries 0 "unresolved:$unresolved"
    else
        record SKIP env.libraries 0 "unresolved without a GPU image:$unresolved"
    fi
else
    record PASS env.libraries 0 "${#needed[@]} CUDA libraries named, $missing_cuda not found"
fi

# ---------------------------------------------------------------- models, in the background
# synth_model writes each type in turn while the tests run; each is a case of its own
# (recorded by the background job), and waited for before its benchmark.
synth_limit=150
synth_types=()
for t in $SYNTH_TYPES; do synth_types+=("$t"); done
if [ "${#synth_types[@]}" -gt 0 ] && [ -x "$here/bin/synth_model" ]; then
    (
        for t in "${synth_types[@]}"; do
            # shellcheck disable=SC2086 # SYNTH_ARGS is a word list
            run_case "model.synth.$t" "$synth_limit" plain "$here/bin/synth_model" \
                "$models_tmp/tinyllama-$t.gguf.part" --type "$t" $SYNTH_ARGS
            if [ -s "$models_tmp/tinyllama-$t.gguf.part" ] &&
                grep -q "^PASS"$'\t'"model.synth.$t"$'\t' "$results"; then
                mv "$models_tmp/tinyllama-$t.gguf.part" "$models_tmp/tinyllama-$t.gguf"
            fi
            : >"$models_tmp/$t.done"
        done
    ) &
    bg_pids+=($!)
elif [ "${#synth_types[@]}" -gt 0 ]; then
    record FAIL model.synth 0 "no bin/synth_model in the bundle"
fi

# wait_model TYPE: waits (within the synth limit and the budget) for TYPE's file; prints
# its path when it is there.
wait_model() {
    local t=$1 waited=0
    while [ ! -f "$models_tmp/$1.done" ] && [ "$waited" -lt "$synth_limit" ] && [ "$(left)" -gt 0 ]; do
        sleep 1
        waited=$((waited + 1))
    done
    [ -f "$models_tmp/tinyllama-$t.gguf" ] && echo "$models_tmp/tinyllama-$t.gguf"
}

# ---------------------------------------------------------------- cuda_test, case by case
test_bin="$here/bin/cuda_test"
timeout 60 "$test_bin" --gtest_list_tests >"$work/cases/list.txt" 2>"$work/cases/list.err"
mapfile -t all_cases < <(awk '
    /^[^ ]/ {suite = $1; next}
    /^  / {print suite $1}' "$work/cases/list.txt")
if [ "${#all_cases[@]}" -eq 0 ]; then
    # cannot even start (a library or a glibc version the image lacks, ...): say why
    cat "$work/cases/list.err" >>"$log"
    record FAIL cuda_test.list 0 "cuda_test cannot list its cases: $(head -c 300 "$work/cases/list.err" | tr '\n' ' ')"
fi
if [ -n "${GPU_FILTER:-}" ]; then
    mapfile -t all_cases < <(printf '%s\n' "${all_cases[@]}" | grep -E "$GPU_FILTER")
fi
late='model|meta_|graph_replay|stories|llama|nccl'
quick=() ops=() heavy=()
for c in "${all_cases[@]}"; do
    case "$c" in
    cuda.model_synth_file_vs_cpu) ;; # run on the synthesised model below
    cuda_ops.*) ops+=("$c") ;;
    *) if printf '%s' "$c" | grep -Eq "$late"; then heavy+=("$c"); else quick+=("$c"); fi ;;
    esac
done
for c in "${quick[@]}"; do run_case "$c" 30 gtest "$test_bin" "--gtest_filter=$c"; done
for c in "${ops[@]}"; do run_case "$c" 45 gtest "$test_bin" "--gtest_filter=$c"; done
for c in "${heavy[@]}"; do run_case "$c" 90 gtest "$test_bin" "--gtest_filter=$c"; done
# a GPU that CUDA cannot use (a driver older than the CUDA 13 runtime, ...) is a failure
# here, not a row of skips
if [ "$have_gpu" = 1 ]; then
    why=$(awk -F'\t' '$1 == "SKIP" && $2 == "cuda.device_properties" {print $4}' "$results")
    [ -n "$why" ] && record FAIL env.cuda-devices 0 "nvidia-smi sees a GPU but CUDA does not: $why"
fi

if [ "${RUNNER_SELFTEST:-0}" = 1 ]; then # the budget rules, for the dry run
    run_case selftest.fits 5 plain sleep 1
    run_case selftest.past-its-limit 2 plain sleep 10
    run_case selftest.does-not-fit $((BUDGET + 1)) plain true
fi

# ---------------------------------------------------------------- the loom tool and speed
loom="$here/bin/loom"
stories="$here/models/stories260K.gguf"
run_case loom.devices 30 plain "$loom" devices
# bench_case NAME LIMIT DEVICES MODEL [ENV=VALUE...]: llama-bench's pp512, tg128 and
# tg128 @ d2048 (F16 K/V cache, llama-bench's default); on the CPU a small version
bench_case() {
    local name=$1 limit=$2 devs=$3 model=$4
    shift 4
    local args=(bench -m "$model" -ctk f16 -ctv f16 --devices "$devs")
    if [ "$have_gpu" = 1 ]; then
        args+=(-p 512 -n 128 -d 0,2048 -r 3)
    else
        args+=(-p 32 -n 8 -d 0,64 -r 1 -t 2)
    fi
    run_case "$name" "$limit" plain env "$@" "$loom" "${args[@]}"
}
first_model=""
for t in "${synth_types[@]}"; do
    m=$(wait_model "$t")
    if [ -z "$m" ]; then
        record NOTRUN "loom.bench.$t" 0 "no tinyllama-$t.gguf (model.synth.$t did not finish)"
        continue
    fi
    if [ "$have_gpu" = 1 ]; then
        bench_case "loom.bench.$t.cuda0" 120 cuda:0 "$m"
        [ -z "$first_model" ] &&
            bench_case "loom.bench.$t.meta2-on-gpu0" 150 cuda:0,1 "$m" LOOM_CUDA_DEVICES_PER_GPU=2
    elif [ -z "$first_model" ]; then
        bench_case "loom.bench.$t.cpu" 60 cpu "$m" # the table's shape, on the CPU
        record SKIP "loom.bench.$t.cuda0" 0 "no GPU"
    fi
    # the logits of the first model on cuda:0 and a 2-way meta device against the CPU
    [ -z "$first_model" ] && printf '%s\n' "${all_cases[@]}" | grep -qx cuda.model_synth_file_vs_cpu &&
        run_case "cuda.model_synth_file_vs_cpu.$t" 150 gtest env LOOM_GPU_SYNTH_MODEL="$m" \
            "$test_bin" --gtest_filter=cuda.model_synth_file_vs_cpu
    [ -n "$first_model" ] || first_model=$m
done
if [ "$have_gpu" = 1 ] && [ -f "$stories" ]; then
    run_case loom.run.cuda0 60 plain "$loom" run -m "$stories" -n 32 --devices cuda:0
fi

# --dist mpi over CUDA members: NCCL between ranks on what one GPU allows (dist_nccl.sh)
if [ "$have_gpu" != 1 ]; then
    record SKIP dist.nccl-one-gpu 0 "no GPU"
elif ! command -v mpirun >/dev/null 2>&1; then
    record SKIP dist.nccl-one-gpu 0 "mpirun not in the image (Open MPI's openmpi-bin, the version loom was built with)"
elif [ ! -f "$stories" ] || [ ! -f "$here/dist_nccl.sh" ]; then
    record SKIP dist.nccl-one-gpu 0 "no stories260K or no dist_nccl.sh in the bundle"
else
    run_case dist.nccl-one-gpu 150 plain bash "$here/dist_nccl.sh" "$loom" "$stories"
fi

# ---------------------------------------------------------------- compute-sanitizer
# The kernels with shared memory and block layouts, through the op tests that launch them
# (every kernel of the test is instrumented), in this order of priority:
san_targets=(
    cuda_ops.attention            # k_flash_attn, k_flash_attn_tiled, k_soft_max
    cuda_ops.flash_decoding_and_causal_skip # k_flash_attn_tiled split + skip, k_flash_attn_combine
    cuda_ops.rows_and_sorting     # k_argsort_chunk, k_argsort_merge(_nan), k_norm, k_reduce_rows, k_argmax
    cuda_ops.block_types_matmul   # k_mmv<T> over the block types, k_weights_to_bf16<T>
    cuda_ops.rows_set_rows_concat # k_set_rows (quantising), k_get_rows, k_concat
    cuda_ops.matmul               # k_mmv<T>, k_mmid<T>, k_mul_mat_id_bucket, k_weights_to_f32
)
san=""
if [ "$have_gpu" = 1 ] && [ "${NO_SANITIZER:-0}" != 1 ]; then
    for c in compute-sanitizer "${CUDA_PATH:-/usr/local/cuda}/bin/compute-sanitizer" \
        /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
        /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        if command -v "$c" >/dev/null 2>&1; then
            san=$(command -v "$c")
            break
        fi
    done
fi
if [ -n "$san" ]; then
    say "compute-sanitizer: $san"
    # each run (racecheck and memcheck of one target, interleaved) an equal share of what
    # is left, at least 20 s: targets that do not fit are NOTRUN, for both tools alike
    n_t=${#san_targets[@]}
    share=$(($(left) / (2 * n_t)))
    while [ "$share" -lt 20 ] && [ "$n_t" -gt 1 ]; do
        n_t=$((n_t - 1))
        share=$(($(left) / (2 * n_t)))
    done
    for ((i = 0; i < ${#san_targets[@]}; i++)); do
        tcase=${san_targets[$i]}
        for tool in racecheck memcheck; do
            targs=(--tool "$tool")
            [ "$tool" = racecheck ] && targs+=(--racecheck-report hazard)
            if [ "$i" -ge "$n_t" ]; then
                record NOTRUN "$tool.$tcase" 0 "the time left fits $n_t of ${#san_targets[@]} sanitizer targets"
                continue
            fi
            run_case "$tool.$tcase" "$share" gtest "$san" "${targs[@]}" --error-exitcode 99 \
                "$test_bin" "--gtest_filter=$tcase"
        done
    done
elif [ "$have_gpu" = 1 ] && [ "${NO_SANITIZER:-0}" != 1 ]; then
    record SKIP sanitizer 0 "compute-sanitizer not found in the image"
else
    record SKIP sanitizer 0 "no GPU (or NO_SANITIZER=1)"
fi

# ---------------------------------------------------------------- the four files
for p in "${bg_pids[@]}"; do stop_job "$p"; done # a synth still running: recorded below
for t in "${synth_types[@]}"; do
    grep -q $'\t'"model.synth.$t"$'\t' "$results" ||
        record NOTRUN "model.synth.$t" 0 "still waiting or writing when the budget ran out"
done
count() { awk -F'\t' -v s="$1" '$1 == s' "$results" | wc -l; }
speed="$OUT/speed.md"
{
    echo "| model | devices | sm | test | t/s |"
    echo "| --- | --- | --- | ---: | ---: |"
    for f in "$work"/cases/loom.bench.*.log; do
        [ -f "$f" ] || continue
        awk -F' *[|] *' '
            /^[|] model / {for (i = 2; i < NF; i++) col[$i] = i; next}
            /^[|] ---/ {next}
            /^[|] / && ("test" in col) {
                printf "| %s | %s | %s | %s | %s |\n", $col["model"], $col["devices"],
                    $col["sm"], $col["test"], $col["t/s"]}' "$f"
    done
} >"$speed"
summary="$OUT/summary.txt"
used=$(($(now) - t_start))
{
    echo "loom GPU checks  $(date -u +%FT%TZ)  budget ${BUDGET}s"
    [ -f "$here/MANIFEST" ] && grep -E '^(commit|cuda archs|toolkit):' "$here/MANIFEST"
    echo "gpu: $gpu_desc"
    for l in "${lib_report[@]}"; do echo "library: $l"; done
    [ -n "$san" ] && echo "compute-sanitizer: $san"
    echo
    echo "passed and skipped:"
    awk -F'\t' '$1 == "PASS" || $1 == "SKIP" {printf "%-8s %-62s %5ss  %s\n", $1, $2, $3, $4}' "$results"
    echo
    echo "figures:"
    grep -h '^FIGURE ' "$work"/cases/*.log 2>/dev/null | sed 's/^FIGURE /  /'
    grep -h 'max |diff|' "$work"/cases/cuda.model_synth_file_vs_cpu.*.log 2>/dev/null | sed 's/^/  logits: /'
    grep -h 'CUDA graphs:' "$work"/cases/loom.bench.*.log 2>/dev/null | sed 's/^loom bench: /  /'
    echo
    echo "speed (loom bench; speed.md):"
    cat "$speed"
    echo
    echo "failed, timed out, not run:"
    awk -F'\t' '$1 != "PASS" && $1 != "SKIP" {printf "%-8s %-62s %5ss  %s\n", $1, $2, $3, $4}' "$results"
    echo
    echo "$(count PASS) passed, $(count FAIL) failed, $(count TIMEOUT) timed out, $(count SKIP) skipped, $(count NOTRUN) not run (budget); ${used}s of ${BUDGET}s"
} >"$summary"
if command -v python3 >/dev/null 2>&1; then
    python3 - "$results" "$OUT/summary.json" "$used" "$BUDGET" "$speed" <<'PY' || true
import json, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
cases = [{"status": r[0], "name": r[1], "seconds": int(r[2]), "note": r[3] if len(r) > 3 else ""} for r in rows]
speed = []
for l in open(sys.argv[5]).read().splitlines()[2:]:
    c = [x.strip() for x in l.strip("|").split("|")]
    if len(c) == 5:
        speed.append(dict(zip(["model", "devices", "sm", "test", "t/s"], c)))
json.dump({"used_s": int(sys.argv[3]), "budget_s": int(sys.argv[4]), "cases": cases, "speed": speed},
          open(sys.argv[2], "w"), indent=1)
PY
fi
[ -f "$here/MANIFEST" ] && cp "$here/MANIFEST" "$work/MANIFEST"
cp "$summary" "$work/summary.txt"
# logs: each case's log cut to its first and last 1 MiB, so the archive stays small
for f in "$work"/cases/*.log; do
    [ -f "$f" ] || continue
    if [ "$(stat -c %s "$f")" -gt $((2 * 1048576)) ]; then
        { head -c 1048576 "$f"; printf '\n[... cut ...]\n'; tail -c 1048576 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
    fi
done
if [ "$(stat -c %s "$log")" -gt $((4 * 1048576)) ]; then
    { head -c 2097152 "$log"; printf '\n[... cut ...]\n'; tail -c 2097152 "$log"; } >"$log.cut" && mv "$log.cut" "$log"
fi
tar -czf "$OUT/logs.tgz" -C "$work" . 2>/dev/null || echo "run.sh: could not write logs.tgz" >&2
echo
echo "==== summary ($summary; also summary.json, speed.md, logs.tgz)"
cat "$summary"
[ "$(count FAIL)" -eq 0 ] && [ "$(count TIMEOUT)" -eq 0 ]
