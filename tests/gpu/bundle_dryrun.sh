#!/usr/bin/env bash
# CI's CPU dry run of the GPU check bundle, so it cannot rot and shows the window's shape:
# builds the bundle (tests/gpu/bundle.sh) into a temporary folder and checks it
#   - under 60 MiB (the device tool carries 64 MiB);
#   - the window (window.sh, the one command a GPU session runs) with a tiny synthesised
#     model (SYNTH_ARGS): it completes within its budget, writes exactly the four files
#     (summary.txt, summary.json, speed.md, logs.tgz) into $OUT, prints the summary last,
#     resolves every bundled library, loads the CUDA module from the bundle, reaches every
#     test case (run or skipped), synthesises the model and benchmarks it on the CPU, and
#     nothing fails, times out or is cut by the budget;
#   - the budget rules (RUNNER_SELFTEST, BUDGET=60): a case whose limit fits runs, one past
#     its limit is TIMEOUT and fails the run, one whose limit cannot fit is NOTRUN;
#   - dist_nccl.sh with stand-ins for mpirun and loom: the image's mpirun runs with the
#     image's library path, never the bundle's Open MPI; only loom gets the bundle's.
# The window's budget is the real one (540 s), not a figure tuned to this machine, so a
# loaded machine does not fail it; the dry run itself takes about 20 s once the opt build
# is cached (CI's first step builds it).
#
#   bash tests/gpu/bundle_dryrun.sh        # exit 0: the bundle works
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/loom-gpu-dry.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
    echo "gpu bundle dry run: FAILED: $*" >&2
    [ -f "$work/out/summary.txt" ] && cat "$work/out/summary.txt" >&2
    exit 1
}

GPU_BUNDLE_DIR="$work/.gpu" bash tests/gpu/bundle.sh || fail "bundle.sh failed"
kib=$(du -sk "$work/.gpu" | cut -f1)
[ "$kib" -le $((60 * 1024)) ] || fail "the bundle is $kib KiB, over 60 MiB"

# out_files DIR: exactly the four files, nothing else
out_files() {
    local got
    got=$(cd "$1" && find . -mindepth 1 | sort | tr '\n' ' ')
    [ "$got" = "./logs.tgz ./speed.md ./summary.json ./summary.txt " ] ||
        fail "$1 holds '$got', not the four files"
    local list
    list=$(tar -tzf "$1/logs.tgz") || fail "$1/logs.tgz cannot be read"
    grep -q 'log.txt$' <<<"$list" || fail "logs.tgz has no log.txt"
}

# ---------------------------------------------------------------- the window
t0=$SECONDS
OUT="$work/out" SYNTH_TYPES=q4_0 SYNTH_ARGS="--layers 1 --vocab 512" \
    bash "$work/.gpu/window.sh" >"$work/console.txt" 2>&1
rc=$?
took=$((SECONDS - t0))
tail -n 30 "$work/console.txt"
s="$work/out/summary.txt"
[ -s "$s" ] || fail "no summary written"
out_files "$work/out"
[ "$took" -le 540 ] || fail "the window took ${took}s, over its budget of 540s"
totals='^[0-9]+ passed, [0-9]+ failed, [0-9]+ timed out, [0-9]+ skipped, [0-9]+ not run'
grep -Eq "$totals" "$s" || fail "the summary has no totals line"
tail -n 1 "$work/console.txt" | grep -Eq "$totals" || fail "the summary is not printed last"
if grep -Eq '^(FAIL|TIMEOUT|NOTRUN) ' "$s"; then fail "a case failed, timed out or was not run"; fi
[ "$rc" -eq 0 ] || fail "the runner exited with $rc"
for c in env.libraries cuda.module_through_the_registry loom.devices model.synth.q4_0 \
    loom.bench.q4_0.cpu; do
    grep -Eq "^PASS +$c " "$s" || fail "$c did not pass"
done
grep -Eq '^\| llama .* Q4_0 \| cpu \| .* \| tg8 @ d64 \| [0-9.]+' "$work/out/speed.md" ||
    fail "speed.md has no tg8 @ d64 row of the synthesised model: $(cat "$work/out/speed.md")"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["cases"] and d["speed"]' \
    "$work/out/summary.json" || fail "summary.json lacks its cases or speed rows"
# every test case of the binary was reached (run or skipped, none cut by the budget)
n_cases=$(LD_LIBRARY_PATH="$work/.gpu/lib" "$work/.gpu/bin/cuda_test" --gtest_list_tests |
    grep -c '^  ')
n_seen=$(grep -Ec '^(PASS|SKIP) +cuda(_ops)?\.' "$s")
[ "$n_seen" -eq "$n_cases" ] || fail "$n_seen of $n_cases test cases reported"
# NCCL is loaded lazily: the module must not need it at load time
mod="$work/.gpu/runfiles/loom/backends/cuda/libloom-cuda.so"
if [ -f "$mod" ] && ldd "$mod" 2>/dev/null | grep -q libnccl; then
    fail "libloom-cuda.so links libnccl (it must dlopen it lazily)"
fi

# ---------------------------------------------------------------- the budget rules
t1=$SECONDS
OUT="$work/out2" BUDGET=60 GPU_FILTER='^$' SYNTH_TYPES= RUNNER_SELFTEST=1 \
    bash "$work/.gpu/run.sh" >"$work/console2.txt" 2>&1
rc2=$?
took2=$((SECONDS - t1))
s2="$work/out2/summary.txt"
out_files "$work/out2"
[ "$took2" -le 60 ] || fail "the self-test run took ${took2}s, over its budget of 60s"
grep -Eq '^PASS +selftest\.fits ' "$s2" || fail "selftest.fits did not pass: $(cat "$s2")"
grep -Eq '^TIMEOUT +selftest\.past-its-limit ' "$s2" || fail "no TIMEOUT for a case past its limit"
grep -Eq '^NOTRUN +selftest\.does-not-fit ' "$s2" || fail "no NOTRUN for a case that cannot fit"
[ "$rc2" -eq 1 ] || fail "a TIMEOUT must fail the run (exit $rc2)"

# ---------------------------------------------------------------- mpirun not shadowed
# dist_nccl.sh with stand-ins for mpirun and loom: mpirun must see the image's library path
# (LOOM_IMAGE_LD_LIBRARY_PATH, as run.sh exports it), the loom it starts the bundle's.
fake="$work/fake"
mkdir -p "$fake/bin"
cat >"$fake/bin/mpirun" <<'SH'
#!/usr/bin/env bash
echo "${LD_LIBRARY_PATH-}" >"$FAKE_REC/mpirun.env"
while [ $# -gt 0 ] && [ "$1" != env ]; do shift; done
exec "$@"
SH
cat >"$fake/loom" <<'SH'
#!/usr/bin/env bash
echo "${LD_LIBRARY_PATH-}" >>"$FAKE_REC/loom.env"
SH
chmod +x "$fake/bin/mpirun" "$fake/loom"
PATH="$fake/bin:$PATH" FAKE_REC="$fake" LOOM_IMAGE_LD_LIBRARY_PATH=/image/lib \
    LD_LIBRARY_PATH=/bundle/lib bash "$work/.gpu/dist_nccl.sh" "$fake/loom" /none >/dev/null 2>&1
[ "$(cat "$fake/mpirun.env" 2>/dev/null)" = /image/lib ] ||
    fail "dist_nccl.sh runs mpirun with LD_LIBRARY_PATH '$(cat "$fake/mpirun.env" 2>/dev/null)', not the image's"
[ "$(sort -u "$fake/loom.env" 2>/dev/null)" = /bundle/lib ] ||
    fail "dist_nccl.sh runs loom with LD_LIBRARY_PATH '$(sort -u "$fake/loom.env" 2>/dev/null)', not the bundle's"

echo "gpu bundle dry run: ok ($n_cases test cases, window ${took}s of 540s, self-test ${took2}s of 60s, bundle $((kib / 1024)) MiB)"
