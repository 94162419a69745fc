#!/usr/bin/env bash
# Hostile ranks under `loom run --dist mpi` (2 local ranks on loopback, stories260K), each
# case bounded by a timeout (a hang fails it):
#   - options that only rank 0 reads (-r, -sp, --ignore-eos, -s with --temp) given to one
#     rank only: rank 0 leads, the job ends, and the text equals one process with rank 0's
#     options (before, a rank with its own -r stopped alone and the other waited for ever);
#   - another model file on one rank (stories260K with one weight byte changed: same shape),
#     and options that shape the graphs or the split differing on one rank (-c, -b, -ctk,
#     --devices, -ts, --split-rules): every rank stops, the message names the rank, the
#     option (or both files) and both values; in loom bench, a session only one rank cannot
#     make stops every rank;
#   - a rank killed (SIGKILL) mid-generation: the job ends within seconds, non-zero, with
#     mpirun naming the rank and the signal.
# Skips (exit 0) without mpirun, without the shared models, or with a loom built without MPI.
set -euo pipefail
loom=$(readlink -f "$1")

fail() {
    echo "FAIL: $*"
    exit 1
}

. "$(dirname "$0")/mpi_env.sh" loom-hostile
if [ ! -f "$model" ]; then
    echo "SKIP: $model not found (set LOOM_MODELS_DIR)"
    exit 0
fi
mpi() {
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 60 mpirun --oversubscribe "$@"
}
text() { cat "$1"; }
base=(run -n 24 -t 1 -ctk f32 -ctv f32)

# one process, the oracle
one() { # TAG ARGS...
    local tag=$1
    shift
    "$loom" "${base[@]}" -m "$model" "$@" >"$tmp/$tag.ref" 2>"$tmp/$tag.referr" ||
        fail "$tag: one process: $(cat "$tmp/$tag.referr")"
}
# rank 0 with A0, rank 1 with A1; must succeed with rank 0's text equal to one process's
lead() { # TAG "A0" "A1" (word-split on purpose)
    local tag=$1 rc=0
    # shellcheck disable=SC2086
    one "$tag" $2
    # shellcheck disable=SC2086
    mpi -np 1 "$loom" "${base[@]}" -m "$model" $2 --dist mpi : -np 1 "$loom" "${base[@]}" -m "$model" $3 --dist mpi \
        >"$tmp/$tag.out" 2>"$tmp/$tag.err" || rc=$?
    [ "$rc" -ne 124 ] || fail "$tag: the ranks hung (rank 1: $3)"
    [ "$rc" -eq 0 ] || fail "$tag: mpirun exit $rc: $(tail -5 "$tmp/$tag.err")"
    cmp -s "$tmp/$tag.out" "$tmp/$tag.ref" || fail "$tag: text '$(cat "$tmp/$tag.out")' vs one process '$(cat "$tmp/$tag.ref")'"
    echo "ok: $tag: rank 1 with '$3' follows rank 0 ('$2'): the text of one process"
}
lead reverse_prompt_on_rank1 "--temp 0 -s 1" "--temp 0 -s 1 -r the"
lead reverse_prompt_on_rank0 "--temp 0 -s 1 -r the" "--temp 0 -s 1"
lead special_on_rank1 "--temp 0 -s 1" "--temp 0 -s 1 -sp"
lead ignore_eos_on_rank1 "--temp 0 -s 1 -n 200" "--temp 0 -s 1 -n 200 --ignore-eos"
lead seed_differs "--temp 0.9 -s 7" "--temp 0.9 -s 12345"

# the same kind of device under another spec is fine (ranks of one node name their own GPU:
# cuda:0, cuda:1): sim:1 on rank 0, sim:1 with a memory cap on rank 1
lead devices_same_kind "--temp 0 -s 1 --devices sim:1" "--temp 0 -s 1 --devices sim:1,mem=1GiB"

# refused: rank 1 differs in what shapes the graphs; every rank stops naming rank 1 and what
refused() { # TAG "A1 (rank 1's extra args)" EXPECTED-TEXT [M1 (rank 1's model)]
    local tag=$1 m1=${4:-$model} rc=0
    # shellcheck disable=SC2086
    mpi -np 1 "$loom" "${base[@]}" -m "$model" --temp 0 --dist mpi : -np 1 "$loom" "${base[@]}" -m "$m1" --temp 0 $2 --dist mpi \
        >"$tmp/$tag.out" 2>"$tmp/$tag.err" || rc=$?
    [ "$rc" -ne 124 ] || fail "$tag: the ranks hung"
    [ "$rc" -ne 0 ] || fail "$tag: mpirun succeeded with rank 1 given '$2' $m1"
    grep -qF "rank 0 stops: rank 1: $3" "$tmp/$tag.err" ||
        fail "$tag: rank 0 does not name it: $(cat "$tmp/$tag.err")"
    grep -qF "loom run: rank 1: $3" "$tmp/$tag.err" ||
        fail "$tag: rank 1 does not name it: $(cat "$tmp/$tag.err")"
    ! grep -q "Once upon" "$tmp/$tag.out" || fail "$tag: text was generated"
    echo "ok: $tag: every rank stops: $3"
}
# the same shape, another weight byte: before, both ranks ran and the logits were wrong
size=$(stat -c %s "$model")
cp "$model" "$tmp/other.gguf"
chmod u+w "$tmp/other.gguf"
printf '\x01' | dd of="$tmp/other.gguf" bs=1 seek=$((size - 100)) conv=notrunc status=none
refused other_file "" "its model or options differ from rank 0's: the model file '$tmp/other.gguf' ($size bytes, fingerprint" "$tmp/other.gguf"
grep -qF "is not rank 0's '$model' ($size bytes, fingerprint" "$tmp/other_file.err" ||
    fail "other_file: rank 0's file is not named: $(cat "$tmp/other_file.err")"
refused context "-c 64" "its model or options differ from rank 0's: -c (the context) is 64 here, 2048 on rank 0"
refused batch "-b 8" "its model or options differ from rank 0's: -b/-ub (the graph batch) is 8 here, 512 on rank 0"
refused kv_type "-ctk f16 -ctv f16" "its model or options differ from rank 0's: -ctk (the K cache type) is f16 here, f32 on rank 0"
refused devices_tensor "--devices sim:2 -sm tensor" "--dist mpi: --devices 'sim:2' is 2 devices per rank: that is the hybrid layout, -sm layer"
refused devices_count "--devices sim:2 -sm layer" "its model or options differ from rank 0's: -sm (the split mode) is layer here, tensor on rank 0"
refused devices_kind "--devices sim:1" "its model or options differ from rank 0's: --devices (the kind of device) is 'sim:1' (SIM) here, 'cpu' (CPU) on rank 0"
refused tensor_split "-ts 3,1" "its model or options differ from rank 0's: -ts (the tensor split) is '3,1' here, '' on rank 0"
printf 'output\\.weight mirrored\n' >"$tmp/rules.txt"
refused split_rules "--split-rules $tmp/rules.txt" "its model or options differ from rank 0's: --split-rules is '$tmp/rules.txt ("

# loom bench: a session that only rank 1 cannot make (its sim device has 64 KiB) stops every
# rank's configuration with rank 1's error (before, rank 1 skipped the agreement the others
# waited in)
rc=0
mpi -np 1 "$loom" bench -m "$model" -p 16 -n 8 -r 1 -t 1 --dist mpi -o csv : \
    -np 1 "$loom" bench -m "$model" -p 16 -n 8 -r 1 -t 1 --devices sim:1,mem=64KiB --dist mpi -o csv \
    >"$tmp/bench.out" 2>"$tmp/bench.err" || rc=$?
[ "$rc" -ne 124 ] || fail "bench, rank 1 out of memory: the ranks hung"
grep -q "loom bench: rank 0 stops: rank 1: session: .* on MPI0, which has 0.1 MiB free" "$tmp/bench.err" ||
    fail "bench, rank 1 out of memory: rank 0 does not name it: $(cat "$tmp/bench.err")"
echo "ok: bench: a session only rank 1 cannot make stops every rank (mpirun exit $rc)"

# a rank killed in the middle of the generation: mpirun ends the job within seconds (a
# generation that lasts well past the kill: 2000 tokens to the end of text took under 3 s)
long=(-c 32768 -n 30000 --ignore-eos)
rc=0 t0=$SECONDS
mpi -np 1 "$loom" "${base[@]}" -m "$model" --temp 0 "${long[@]}" --dist mpi : \
    -np 1 timeout -s KILL 3 "$loom" "${base[@]}" -m "$model" --temp 0 "${long[@]}" --dist mpi \
    >"$tmp/kill.out" 2>"$tmp/kill.err" || rc=$?
[ "$rc" -ne 124 ] || fail "killed rank: the other rank hung"
[ "$rc" -ne 0 ] || fail "killed rank: mpirun exit 0"
grep -q "process rank 1 .* exited on signal 9" "$tmp/kill.err" || fail "killed rank: not reported: $(tail -5 "$tmp/kill.err")"
grep -q "^Once upon a time" "$tmp/kill.out" || fail "killed rank: it was killed before the generation"
echo "ok: a rank killed mid-run ends the job in $((SECONDS - t0)) s (mpirun exit $rc)"
echo "PASS"
