#!/usr/bin/env bash
# loom's GPU check runner. tests/gpu/bundle.sh copies it to .gpu/run.sh beside the binaries,
# module and models it runs; on the GPU machine run it from anywhere:
#
#   bash .gpu/run.sh                 # writes ./gpu-out/summary.txt and ./gpu-out/log.txt
#   OUT=/tmp/o BUDGET=600 bash .gpu/run.sh
#
# Needs only bash, coreutils (timeout, date, ...) and python3 (optional: summary.json).
# Every test case runs in its own process with its own timeout; the whole run stops
# itself within BUDGET seconds (default 300), writing, in $OUT (default ./gpu-out):
#   summary.txt   one line per case (PASS, FAIL, SKIP, TIMEOUT, NOTRUN), the libraries
#                 and GPU used, the figures (bench tokens/s, CUDA graph captures/replays),
#                 and the totals; also printed at the end
#   log.txt       the full output of every case
#   cases/*.log   each case's output alone
# Order: the environment (nvidia-smi, which cuBLAS/cudart/NCCL were found), every test of
# //tests/gpu:cuda_test (the quick device checks, every op against the CPU, then the
# graph-replay, model and meta-device checks), `loom devices`, `loom bench` on cpu, cuda:0
# and a 2-way meta device on GPU 0, `loom run --dist mpi` over cuda:0 with NCCL between
# ranks where the image has mpirun (dist_nccl.sh), then with the time left compute-sanitizer: racecheck
# on the AllReduce and attention tests, memcheck on every op test.
# Without a GPU (the CPU dry run in CI) the GPU cases skip and the runner still completes.
#
# Environment: OUT, BUDGET (seconds), CASE_TIMEOUT (default 90 s per case),
# CUDA_PATH (searched first for the CUDA libraries), GPU_FILTER (a grep -E pattern: run only
# the test cases it matches), NO_SANITIZER=1.
# Exit status: 0 when nothing failed or timed out (skips and budget cut-offs are not
# failures), 1 otherwise, 2 when the bundle is incomplete.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -x "$here/bin/cuda_test" ] && [ -x "$here/../../.gpu/bin/cuda_test" ]; then
    here=$(cd "$here/../../.gpu" && pwd) # run from the source tree: use the bundle
fi
if [ ! -x "$here/bin/cuda_test" ] || [ ! -x "$here/bin/loom" ]; then
    echo "run.sh: no bundle at $here (build it first: bash tests/gpu/bundle.sh)" >&2
    exit 2
fi
OUT=${OUT:-./gpu-out}
BUDGET=${BUDGET:-300}
CASE_TIMEOUT=${CASE_TIMEOUT:-90}
mkdir -p "$OUT/cases" || exit 2
OUT=$(cd "$OUT" && pwd)
log="$OUT/log.txt"
summary="$OUT/summary.txt"
results="$OUT/results.tsv"
: >"$log"
: >"$results"
t_start=$(date +%s)
deadline=$((t_start + BUDGET))
reserve=3 # seconds kept for the summary

say() { echo "$*" | tee -a "$log"; }
now() { date +%s; }
left() { echo $((deadline - $(now) - reserve)); }

# record STATUS NAME SECONDS NOTE
record() {
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$results"
    printf '%-8s %-70s %5ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$log"
}

# run_case NAME LIMIT KIND CMD...: runs CMD with its own timeout (LIMIT, cut to the budget
# left), its output into cases/NAME.log and log.txt. KIND gtest: SKIP when the test said
# so. A case that no longer fits the budget is NOTRUN.
run_case() {
    local name=$1 limit=$2 kind=$3
    shift 3
    local l
    l=$(left)
    if [ "$l" -lt 2 ]; then
        record NOTRUN "$name" 0 "budget spent"
        return 0
    fi
    [ "$limit" -gt "$l" ] && limit=$l
    local f="$OUT/cases/${name//[^A-Za-z0-9_.-]/_}.log"
    local t0 rc st note
    t0=$(now)
    {
        echo "==== $name (limit ${limit}s): $*"
    } >>"$log"
    timeout -k 3 "$limit" "$@" >"$f" 2>&1 </dev/null
    rc=$?
    cat "$f" >>"$log"
    note=""
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        st=TIMEOUT
        note="killed after ${limit}s"
    elif [ "$rc" -ne 0 ]; then
        st=FAIL
        # the first failure's message (gtest: "file:line: Failure", "Failed", message)
        local nf
        nf=$(grep -c ': Failure$' "$f")
        note=$(awk '/: Failure$/ {f = 1; next} f && $0 != "Failed" {print; exit}' "$f" | cut -c1-200)
        [ -n "$note" ] || note=$(grep -m1 -E 'failed|error|ERROR|FAILED' "$f" | cut -c1-200)
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
# libstdc++/libgcc_s from the bundle only where the image has none
if command -v ldconfig >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q 'libstdc++\.so\.6 '; then
    libpath="$libpath:$here/lib/fallback"
elif ! command -v ldconfig >/dev/null 2>&1; then
    libpath="$libpath:$here/lib/fallback"
fi
export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LOOM_BACKEND_PATH="$here/runfiles/loom/backends/cuda"
export LOOM_MODELS_DIR="$here/models"
export TEST_SRCDIR="$here/runfiles" TEST_WORKSPACE=loom
say "gpu: $gpu_desc"
for l in "${lib_report[@]}"; do say "library: $l"; done
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# Every bundled object must resolve (ldd, with the paths above).
unresolved=""
if command -v ldd >/dev/null 2>&1; then
    for o in "$here/bin/cuda_test" "$here/bin/loom" "$LOOM_BACKEND_PATH"/*.so; do
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

# ---------------------------------------------------------------- cuda_test, case by case
test_bin="$here/bin/cuda_test"
timeout 60 "$test_bin" --gtest_list_tests >"$OUT/cases/list.txt" 2>"$OUT/cases/list.err"
mapfile -t all_cases < <(awk '
    /^[^ ]/ {suite = $1; next}
    /^  / {print suite $1}' "$OUT/cases/list.txt")
if [ "${#all_cases[@]}" -eq 0 ]; then
    # cannot even start (a library or a glibc version the image lacks, ...): say why
    cat "$OUT/cases/list.err" >>"$log"
    record FAIL cuda_test.list 0 "cuda_test cannot list its cases: $(head -c 300 "$OUT/cases/list.err" | tr '\n' ' ')"
fi
if [ -n "${GPU_FILTER:-}" ]; then
    mapfile -t all_cases < <(printf '%s\n' "${all_cases[@]}" | grep -E "$GPU_FILTER")
fi
late='model|meta_|graph_replay|stories|llama|nccl'
quick=() ops=() heavy=()
for c in "${all_cases[@]}"; do
    case "$c" in
    cuda_ops.*) ops+=("$c") ;;
    *) if printf '%s' "$c" | grep -Eq "$late"; then heavy+=("$c"); else quick+=("$c"); fi ;;
    esac
done
for c in "${quick[@]}" "${ops[@]}" "${heavy[@]}"; do
    run_case "$c" "$CASE_TIMEOUT" gtest "$test_bin" "--gtest_filter=$c"
done
# a GPU that CUDA cannot use (a driver older than the CUDA 13 runtime, ...) is a failure
# here, not a row of skips
if [ "$have_gpu" = 1 ]; then
    why=$(awk -F'\t' '$1 == "SKIP" && $2 == "cuda.device_properties" {print $4}' "$results")
    [ -n "$why" ] && record FAIL env.cuda-devices 0 "nvidia-smi sees a GPU but CUDA does not: $why"
fi

# ---------------------------------------------------------------- the loom tool
loom="$here/bin/loom"
stories="$here/models/stories260K.gguf"
run_case loom.devices 30 plain "$loom" devices
bench=(bench -p 64 -n 32 -r 3)
[ -f "$stories" ] && bench+=(-m "$stories")
run_case loom.bench.cpu 60 plain "$loom" "${bench[@]}" --devices cpu
if [ "$have_gpu" = 1 ]; then
    run_case loom.bench.cuda0 60 plain "$loom" "${bench[@]}" --devices cuda:0
    run_case loom.bench.meta2-on-gpu0 90 plain env LOOM_CUDA_DEVICES_PER_GPU=2 "$loom" \
        "${bench[@]}" --devices cuda:0,1
    run_case loom.run.cuda0 60 plain "$loom" run ${stories:+-m "$stories"} -n 32 --devices cuda:0
    # --dist mpi over CUDA members: NCCL between ranks on what one GPU allows (dist_nccl.sh)
    if ! command -v mpirun >/dev/null 2>&1; then
        record SKIP dist.nccl-one-gpu 0 "mpirun not in the image (Open MPI's openmpi-bin, the version loom was built with)"
    elif [ ! -f "$stories" ] || [ ! -f "$here/dist_nccl.sh" ]; then
        record SKIP dist.nccl-one-gpu 0 "no stories260K or no dist_nccl.sh in the bundle"
    else
        run_case dist.nccl-one-gpu 300 plain bash "$here/dist_nccl.sh" "$loom" "$stories"
    fi
else
    record SKIP loom.bench.cuda0 0 "no GPU"
    record SKIP loom.bench.meta2-on-gpu0 0 "no GPU"
    record SKIP loom.run.cuda0 0 "no GPU"
    record SKIP dist.nccl-one-gpu 0 "no GPU"
fi

# ---------------------------------------------------------------- compute-sanitizer
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
    race=() mem=()
    for c in "${all_cases[@]}"; do
        case "$c" in
        *comm* | *allreduce* | *nccl* | *flash_attn* | *soft_max* | *attention*) race+=("$c") ;;
        esac
        case "$c" in cuda_ops.*) mem+=("$c") ;; esac
    done
    for c in "${race[@]}"; do
        run_case "racecheck.$c" 120 gtest "$san" --tool racecheck --racecheck-report hazard \
            --error-exitcode 99 "$test_bin" "--gtest_filter=$c"
    done
    for c in "${mem[@]}"; do
        run_case "memcheck.$c" 120 gtest "$san" --tool memcheck --error-exitcode 99 \
            "$test_bin" "--gtest_filter=$c"
    done
elif [ "$have_gpu" = 1 ] && [ "${NO_SANITIZER:-0}" != 1 ]; then
    record SKIP sanitizer 0 "compute-sanitizer not found in the image"
else
    record SKIP sanitizer 0 "no GPU (or NO_SANITIZER=1)"
fi

# ---------------------------------------------------------------- summary
used=$(($(now) - t_start))
count() { awk -F'\t' -v s="$1" '$1 == s' "$results" | wc -l; }
{
    echo "loom GPU checks  $(date -u +%FT%TZ)  budget ${BUDGET}s, used ${used}s"
    [ -f "$here/MANIFEST" ] && grep -E '^(commit|cuda archs|toolkit):' "$here/MANIFEST"
    echo "gpu: $gpu_desc"
    for l in "${lib_report[@]}"; do echo "library: $l"; done
    [ -n "$san" ] && echo "compute-sanitizer: $san"
    echo
    awk -F'\t' '{printf "%-8s %-70s %5ss  %s\n", $1, $2, $3, $4}' "$results"
    echo
    echo "figures:"
    grep -h '^FIGURE ' "$OUT"/cases/*.log 2>/dev/null | sed 's/^FIGURE /  /'
    for f in "$OUT"/cases/loom.bench.*.log; do
        [ -f "$f" ] || continue
        grep -h '^| ' "$f" | grep -v -- '---|' | grep -v '^| devices' | sed "s/^/  bench: /"
    done
    echo
    echo "$(count PASS) passed, $(count FAIL) failed, $(count TIMEOUT) timed out, $(count SKIP) skipped, $(count NOTRUN) not run (budget)"
} >"$summary"
if command -v python3 >/dev/null 2>&1; then
    python3 - "$results" "$OUT/summary.json" "$used" "$BUDGET" <<'PY' || true
import json, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
cases = [{"status": r[0], "name": r[1], "seconds": int(r[2]), "note": r[3] if len(r) > 3 else ""} for r in rows]
json.dump({"used_s": int(sys.argv[3]), "budget_s": int(sys.argv[4]), "cases": cases}, open(sys.argv[2], "w"), indent=1)
PY
fi
echo
echo "==== summary ($summary)"
cat "$summary"
[ "$(count FAIL)" -eq 0 ] && [ "$(count TIMEOUT)" -eq 0 ]
