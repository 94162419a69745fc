#!/usr/bin/env bash
# A rank that leaves early (peer_left_mpi.c: MPI_Finalize and exit 0, which MPI does not
# report) while the others wait for it: with LOOM_DIST_TIMEOUT=2 a waiting rank gets an
# error naming the call and itself within a few seconds, and the job ends (loom_dist_abort),
# on 2 and 3 local ranks, in a broadcast and in loom_dist_agree. Skips without mpirun or with
# a loom built without MPI.
set -euo pipefail
bin=$(readlink -f "$1")

fail() {
    echo "FAIL: $*"
    exit 1
}

. "$(dirname "$0")/mpi_env.sh" loom-left
for np in 2 3; do
    for mode in bcast agree; do
        out="$tmp/$mode.$np.out" rc=0 t0=$SECONDS
        LOOM_DIST_TIMEOUT=2 ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
            timeout 60 mpirun --oversubscribe -np "$np" "$bin" "$mode" >"$out" 2>&1 || rc=$?
        if grep -q "^SKIP" "$out"; then
            echo "SKIP: $(grep -m1 '^SKIP' "$out")"
            exit 0
        fi
        [ "$rc" -ne 124 ] || fail "$mode on $np ranks: a hang (the job did not end in 60 s): $(cat "$out")"
        ! grep -q "^FAIL" "$out" || fail "$mode on $np ranks: $(grep '^FAIL' "$out")"
        grep -q "^PASS rank $((np - 1)) left" "$out" || fail "$mode on $np ranks: the last rank did not leave: $(cat "$out")"
        n=$(grep -c "^PASS rank [0-9]* $mode: " "$out" || true)
        # the first waiting rank to time out aborts the job (loom_dist_abort), which may kill
        # the other waiting ranks before their own deadline: one report is the proof
        [ "$n" -ge 1 ] || fail "$mode on $np ranks: no waiting rank saw the error: $(cat "$out")"
        [ "$rc" -ne 0 ] || fail "$mode on $np ranks: mpirun exit 0 although the job was aborted"
        echo "ok: $mode on $np ranks: $(grep -m1 "^PASS rank [0-9]* $mode: " "$out" | cut -d' ' -f4-) (mpirun exit $rc, $((SECONDS - t0)) s)"
    done
done
echo "PASS"
