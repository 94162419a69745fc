#!/usr/bin/env bash
# The rank communicator of dist/ (NCCL's place for CUDA members, here a stand-in table:
# rank_comm_mpi.c) over 2, 3 and 4 local MPI ranks on loopback: the id bootstrap (rank 0's
# bytes reach every rank's init with the right nranks and rank), the agreed host fallback
# (an unusable rank, another library version on one rank, LOOM_DIST_NCCL=0; in automatic mode
# also rank 0's id or one rank's init failing) saying why, the failures (rank 0's id or one
# rank's init with LOOM_DIST_NCCL=1, LOOM_DIST_NCCL=1 without a communicator, ranks
# disagreeing on an AllReduce's count) returned on every rank, none hanging (each run bounded by a timeout), and stories260K's
# logits through it equal the CPU's in tensor and layer mode.
# Skips (exit 0) without mpirun, with a loom built without MPI, or (the session runs only)
# without the shared models.
set -euo pipefail
bin=$(readlink -f "$1")

fail() {
    echo "FAIL: $*"
    exit 1
}

. "$(dirname "$0")/mpi_env.sh" loom-rc
unset LOOM_DIST_NCCL LOOM_DIST_CHECK FAKE_FAIL_ID FAKE_FAIL_INIT_RANK FAKE_UNUSABLE_RANK \
    FAKE_OTHER_VERSION_RANK

# run NAME NP [VAR=VALUE...] -- ARGS...: every rank must print PASS, within the timeout
run() {
    local name=$1 np=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do
        envs+=("$1")
        shift
    done
    shift
    local out="$tmp/$name.$np.out" rc=0
    env "${envs[@]}" ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        timeout 120 mpirun --oversubscribe -np "$np" "$bin" "$@" >"$out" 2>&1 || rc=$?
    if grep -q "^SKIP" "$out"; then
        echo "SKIP: $(grep -m1 '^SKIP' "$out")"
        exit 0
    fi
    [ "$rc" -ne 124 ] || fail "$name on $np ranks timed out (a hang): $(cat "$out")"
    [ "$rc" -eq 0 ] || fail "$name on $np ranks exited $rc: $(cat "$out")"
    local n
    n=$(grep -c "^PASS rank" "$out" || true)
    [ "$n" -eq "$np" ] || fail "$name on $np ranks: $n ranks passed: $(cat "$out")"
    echo "ok: $name on $np ranks"
}

for np in 2 3 4; do
    run bootstrap "$np" -- bootstrap
    run id_fails "$np" FAKE_FAIL_ID=1 -- id_fails
    run id_fails_required "$np" FAKE_FAIL_ID=1 LOOM_DIST_NCCL=1 -- id_fails
    run init_fails "$np" FAKE_FAIL_INIT_RANK=$((np - 1)) -- init_fails
    run init_fails_required "$np" FAKE_FAIL_INIT_RANK=$((np - 1)) LOOM_DIST_NCCL=1 -- init_fails
    run unusable "$np" FAKE_UNUSABLE_RANK=$((np - 1)) -- unusable
    run mismatch "$np" -- mismatch
done
run init_fails_rank0 2 FAKE_FAIL_INIT_RANK=0 -- init_fails
run init_fails_rank0_required 2 FAKE_FAIL_INIT_RANK=0 LOOM_DIST_NCCL=1 -- init_fails
run other_version 3 FAKE_OTHER_VERSION_RANK=1 -- other_version
run forced_off 2 LOOM_DIST_NCCL=0 -- forced_off
run required 3 LOOM_DIST_NCCL=1 FAKE_UNUSABLE_RANK=1 -- required

if [ ! -f "$model" ]; then
    echo "SKIP (the session runs): $model not found (set LOOM_MODELS_DIR)"
    exit 0
fi
for np in 2 3; do
    run session_tensor "$np" -- session tensor "$model"
    run session_layer "$np" -- session layer "$model"
done
grep -h "worst" "$tmp"/session_*.out
echo "PASS"
