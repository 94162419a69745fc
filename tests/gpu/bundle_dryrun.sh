#!/usr/bin/env bash
# CI's CPU dry run of the GPU check bundle, so it cannot rot: builds the bundle
# (tests/gpu/bundle.sh) into a temporary folder, runs its runner there with a small budget
# (GPU cases skip on a machine without a GPU), and checks that the runner completed within
# its budget, wrote its summary and log, resolved every bundled library, loaded the CUDA
# module from the bundle, and that nothing failed or timed out. About 10 s once the opt
# build is cached (CI's first step builds it).
#
#   bash tests/gpu/bundle_dryrun.sh        # exit 0: the bundle works
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/loom-gpu-dry.XXXXXX")
trap 'rm -rf "$work"' EXIT
budget=${DRYRUN_BUDGET:-90}

fail() {
    echo "gpu bundle dry run: FAILED: $*" >&2
    [ -f "$work/out/summary.txt" ] && cat "$work/out/summary.txt" >&2
    exit 1
}

GPU_BUNDLE_DIR="$work/.gpu" bash tests/gpu/bundle.sh || fail "bundle.sh failed"
t0=$SECONDS
OUT="$work/out" BUDGET=$budget bash "$work/.gpu/run.sh" >"$work/console.txt" 2>&1
rc=$?
took=$((SECONDS - t0))
tail -n 40 "$work/console.txt"
s="$work/out/summary.txt"
[ -s "$s" ] || fail "no summary written"
[ -s "$work/out/log.txt" ] || fail "no log written"
[ "$took" -le "$budget" ] || fail "the runner took ${took}s, over its budget of ${budget}s"
grep -Eq '^[0-9]+ passed, [0-9]+ failed, [0-9]+ timed out, [0-9]+ skipped, [0-9]+ not run' "$s" ||
    fail "the summary has no totals line"
if grep -Eq '^(FAIL|TIMEOUT) ' "$s"; then fail "a case failed or timed out"; fi
[ "$rc" -eq 0 ] || fail "the runner exited with $rc"
for c in env.libraries cuda.module_through_the_registry loom.devices loom.bench.cpu; do
    grep -Eq "^PASS +$c " "$s" || fail "$c did not pass"
done
# every test case of the binary was reached (run or skipped, none cut by the budget)
n_cases=$(LD_LIBRARY_PATH="$work/.gpu/lib" "$work/.gpu/bin/cuda_test" --gtest_list_tests |
    grep -c '^  ')
n_seen=$(grep -Ec '^(PASS|SKIP) +cuda(_ops)?\.' "$s")
[ "$n_seen" -eq "$n_cases" ] || fail "$n_seen of $n_cases test cases reported"
if grep -Eq '^NOTRUN ' "$s"; then fail "the budget of ${budget}s was too small for a dry run"; fi
# NCCL is loaded lazily: the module must not need it at load time
mod="$work/.gpu/runfiles/loom/backends/cuda/libloom-cuda.so"
if [ -f "$mod" ] && ldd "$mod" 2>/dev/null | grep -q libnccl; then
    fail "libloom-cuda.so links libnccl (it must dlopen it lazily)"
fi
echo "gpu bundle dry run: ok ($n_cases test cases, ${took}s, bundle $(du -sh "$work/.gpu" | cut -f1))"
