#!/usr/bin/env bash
# `loom run --dist mpi` over local MPI ranks on loopback (Open MPI's mpirun, --oversubscribe):
#   - stories260K's greedy text and rank 0's logits of every position equal a single-process
#     CPU run (logits to 5e-4: they are printed with 6 digits and MPI sums the slices in its
#     own order) for N = 2, 3, 4 ranks in tensor mode and in layer mode (pipeline stages,
#     activations sent point-to-point), and with sim:1 as each rank's device;
#   - each rank holds 1/N of the split weights (rank lines on stderr);
#   - failure injection: one rank given a bad model path ends every rank with the error,
#     within the timeout (no hang);
#   - --dist mpi outside a launcher, and --dist with another value, are refused clearly;
#   - every rank reports what crosses ranks (host memory and MPI here, and why: no
#     communicator between ranks on a CPU or sim device); LOOM_DIST_NCCL=1 then stops
#     every rank with that reason;
#   - loom bench --dist mpi prints its rows once, from rank 0, with the world size; loom
#     explain --dist mpi its plan once (the reductions of one process over sim:2, a stage
#     per rank in layer mode), every rank its memory line, a bad rank stopping all;
#   - ranks given other options: rank 0's -n leads; another context stops every rank;
#   - hybrid (--devices sim:2 or sim:3 per rank, -sm layer): stage r on rank r, tensor
#     parallel over the rank's sim devices (a meta device inside the dist device): text and
#     logits equal the single CPU process, also on one rank (against a lone meta device),
#     each local device holds about 1/k of its rank's weights, the stage's meta device
#     reduces; several devices with -sm tensor are refused clearly;
#   - micro-batches (-ub 4, a 34-token prompt in 9 ubatches through 2 and 3 stages, and the
#     hybrid): logits of every position equal the CPU's in one batch, the greedy text too;
#     the ubatches cross the stages point-to-point only: per evaluated graph the same sends
#     as with one batch, and not one collective more (nothing waits for the last stage
#     between ubatches).
# Skips (exit 0) without mpirun, without the shared models, or with a loom built without MPI.
set -euo pipefail
loom=$(readlink -f "$1")

fail() {
    echo "FAIL: $*"
    exit 1
}

. "$(dirname "$0")/mpi_env.sh" loom-mpi
if [ ! -f "$model" ]; then
    echo "SKIP: $model not found (set LOOM_MODELS_DIR)"
    exit 0
fi
# Under ASan the ranks run without LeakSanitizer: Open MPI's components (dlclosed at exit)
# leak by design and their frames cannot be told apart; memory errors still abort. The
# runs outside mpirun keep leak detection.
mpi() {
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 120 mpirun --oversubscribe "$@"
}

run_args=(run -m "$model" -n 32 -s 1 -t 1 --temp 0 -ctk f32 -ctv f32) # f32 KV: the 5e-4 bound

# outside a launcher: a clear refusal (or: this loom has no MPI, and the rest is skipped)
set +e
env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMI_RANK -u PMI_SIZE "$loom" "${run_args[@]}" \
    --dist mpi >"$tmp/lone.out" 2>"$tmp/lone.err"
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "--dist mpi outside mpirun succeeded"
if grep -q "built without MPI" "$tmp/lone.err"; then
    echo "SKIP: this loom was built without MPI: $(cat "$tmp/lone.err")"
    exit 0
fi
grep -q "not started by an MPI launcher" "$tmp/lone.err" ||
    fail "--dist mpi outside mpirun: unclear message: $(cat "$tmp/lone.err")"
[ ! -s "$tmp/lone.out" ] || fail "--dist mpi outside mpirun printed on stdout"
set +e
"$loom" "${run_args[@]}" --dist tcp >/dev/null 2>"$tmp/bad.err"
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "expected: mpi" "$tmp/bad.err" || fail "--dist tcp: rc $rc, $(cat "$tmp/bad.err")"

# the oracle: one process on the CPU
"$loom" "${run_args[@]}" --logits-out "$tmp/ref.logits" >"$tmp/ref.out" 2>"$tmp/ref.err" ||
    fail "single-process run: $(cat "$tmp/ref.err")"
text() { cat "$1"; } # stdout is the text alone (the figures are on stderr)
text "$tmp/ref.out" >"$tmp/ref.txt"
grep -q "Lily" "$tmp/ref.txt" || fail "the oracle's text is not stories260K's: $(cat "$tmp/ref.txt")"

# max |a - b| over two logits files (same positions, same count); "bad" if the shapes differ
maxdiff() {
    awk 'NR == FNR { n1 = NR; for (i = 1; i <= NF; i++) a[NR, i] = $i; nf[NR] = NF; next }
         { n2 = FNR; if (NF != nf[FNR]) bad = 1
           for (i = 1; i <= NF; i++) { d = $i - a[FNR, i]; if (d < 0) d = -d; if (d > m) m = d } }
         END { if (bad || n1 != n2 || n1 == 0) print "bad"; else printf "%.3g\n", m }' "$1" "$2"
}

weight_mib() { # rank 0's weight share from its rank line
    sed -n 's/^rank 0\/[0-9]*: MPI0 holds weights \([0-9.]*\) MiB.*/\1/p' "$1"
}

check_run() { # N device label split-mode
    local n=$1 dev=$2 tag=$3 sm=$4
    local out="$tmp/$tag.out" err="$tmp/$tag.err"
    local t0=$SECONDS
    mpi -np "$n" "$loom" "${run_args[@]}" --devices "$dev" -sm "$sm" --dist mpi --logits-out "$tmp/$tag.logits" \
        >"$out" 2>"$err" || fail "$tag: mpirun exit $?: $(tail -5 "$err")"
    text "$out" | cmp -s - "$tmp/ref.txt" ||
        fail "$tag: text differs: '$(text "$out")' vs '$(cat "$tmp/ref.txt")'"
    grep -q "split mode $sm, $n MPI ranks" "$err" || fail "$tag: no 'split mode $sm, $n MPI ranks' in the summary"
    if [ "$sm" = tensor ]; then
        grep -q "^tensor parallel: .* allreduces" "$err" || fail "$tag: no tensor-parallel line"
    else
        grep -q "^token graph: .*graph splits = $((n + 1))" "$err" || fail "$tag: not $n stages + CPU"
    fi
    local d
    d=$(maxdiff "$tmp/ref.logits" "$tmp/$tag.logits")
    [ "$d" != bad ] || fail "$tag: logits files differ in shape"
    awk -v d="$d" 'BEGIN { exit !(d <= 5e-4) }' || fail "$tag: logits differ by $d"
    local k
    for ((k = 0; k < n; k++)); do
        grep -q "^rank $k/$n: MPI$k holds weights" "$err" || fail "$tag: no memory line of rank $k"
        # the choice of what crosses ranks, and why (no rank communicator on a host device)
        grep -q "^rank $k/$n: across ranks: MPI through host memory (rank 0: .* has no communicator between ranks); through it 0 allreduces, 0 sends, 0 receives" "$err" ||
            fail "$tag: rank $k does not report the host path: $(grep "^rank $k/$n: across" "$err")"
    done
    echo "ok: $tag ($n ranks, -sm $sm, --devices $dev): text equal, logits max diff $d, rank 0 weights $(weight_mib "$err") MiB, $((SECONDS - t0)) s"
}

check_run 2 cpu np2 tensor
check_run 3 cpu np3 tensor
check_run 4 cpu np4 tensor
check_run 2 sim:1 np2sim tensor
check_run 2 cpu np2layer layer
check_run 3 cpu np3layer layer
check_run 4 cpu np4layer layer
check_run 3 sim:1 np3simlayer layer

# LOOM_DIST_NCCL=1 (a communicator between ranks required) where there is none: every
# rank stops with the reason, nothing is printed on stdout
set +e
LOOM_DIST_NCCL=1 mpi -np 2 "$loom" "${run_args[@]}" --devices sim:1 --dist mpi >"$tmp/req.out" 2>"$tmp/req.err"
rc=$?
set -e
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "LOOM_DIST_NCCL=1 without a communicator: rc $rc"
for k in 0 1; do
    grep -q "^loom run: rank $k stops: dist: LOOM_DIST_NCCL=1 but no communicator between ranks: rank 0: SIM0 (reg SIM) has no communicator between ranks" "$tmp/req.err" ||
        fail "LOOM_DIST_NCCL=1: rank $k's message: $(cat "$tmp/req.err")"
done
[ ! -s "$tmp/req.out" ] || fail "LOOM_DIST_NCCL=1: printed on stdout: $(cat "$tmp/req.out")"
echo "ok: LOOM_DIST_NCCL=1 without a communicator stops both ranks with the reason"

# hybrid: pipeline stages across ranks, tensor parallelism over each rank's sim devices.
# First the oracle's twin on one process: the same meta device alone (-sm tensor, sim:2).
"$loom" "${run_args[@]}" --devices sim:2 -sm tensor --logits-out "$tmp/meta2.logits" \
    >"$tmp/meta2.out" 2>"$tmp/meta2.err" || fail "meta(sim:2) alone: $(cat "$tmp/meta2.err")"
text "$tmp/meta2.out" | cmp -s - "$tmp/ref.txt" || fail "meta(sim:2) alone: text differs"
check_hybrid() { # N local-spec k
    local n=$1 dev=$2 k=$3 tag="hy$1x$3"
    local out="$tmp/$tag.out" err="$tmp/$tag.err" t0=$SECONDS
    mpi -np "$n" "$loom" "${run_args[@]}" --devices "$dev" --dist mpi --logits-out "$tmp/$tag.logits" \
        >"$out" 2>"$err" || fail "$tag: mpirun exit $?: $(tail -5 "$err")"
    text "$out" | cmp -s - "$tmp/ref.txt" ||
        fail "$tag: text differs: '$(text "$out")' vs '$(cat "$tmp/ref.txt")'"
    grep -q "split mode layer, $n MPI ranks (each stage tensor parallel over $k devices)" "$err" ||
        fail "$tag: not the hybrid summary: $(grep '^devices' "$err")"
    grep -q "^token graph: .*graph splits = $((n + 1))" "$err" || fail "$tag: not $n stages + CPU"
    local d dm
    d=$(maxdiff "$tmp/ref.logits" "$tmp/$tag.logits")
    dm=$(maxdiff "$tmp/meta2.logits" "$tmp/$tag.logits")
    [ "$d" != bad ] && [ "$dm" != bad ] || fail "$tag: logits files differ in shape"
    awk -v d="$d" -v e="$dm" 'BEGIN { exit !(d <= 5e-4 && e <= 5e-4) }' ||
        fail "$tag: logits differ by $d from the CPU, $dm from meta(sim:2) alone"
    local r line
    for ((r = 0; r < n; r++)); do
        line=$(grep "^rank $r/$n: stage on Meta(SIM0" "$err") || fail "$tag: no stage line of rank $r"
        # the stage's meta device reduced its partial sums (tensor parallelism ran)
        awk -v l="$line" 'BEGIN { split(l, a, ": "); split(a[3], b, " "); exit !(b[1] > 0) }' ||
            fail "$tag: rank $r's stage did no allreduce: $line"
    done
    echo "ok: $tag ($n ranks x --devices $dev, -sm layer): text equal, logits max diff $d (CPU), $dm (meta alone), rank 0 weights $(weight_mib "$err") MiB each local device, $((SECONDS - t0)) s"
}
check_hybrid 1 sim:2 2
check_hybrid 2 sim:2 2
check_hybrid 2 sim:3 3
# each local device holds about 1/k of what the one device of a rank holds in the same
# pipeline without the local split (2 ranks x sim:1, -sm layer)
check_run 2 sim:1 np2simlayer layer
w1=$(weight_mib "$tmp/np2simlayer.err") wh2=$(weight_mib "$tmp/hy2x2.err") wh3=$(weight_mib "$tmp/hy2x3.err")
awk -v a="$w1" -v b="$wh2" -v c="$wh3" 'BEGIN { exit !(b > 0 && b < 0.6 * a && c > 0 && c < 0.45 * a) }' ||
    fail "hybrid weights per local device: $wh2 MiB (sim:2), $wh3 MiB (sim:3) vs $w1 MiB (sim:1)"
echo "ok: hybrid weight share per local device: $w1 MiB (sim:1), $wh2 MiB (sim:2), $wh3 MiB (sim:3)"
set +e
mpi -np 2 "$loom" "${run_args[@]}" --devices sim:2 -sm tensor --dist mpi >"$tmp/hyt.out" 2>"$tmp/hyt.err"
rc=$?
set -e
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "sim:2 with -sm tensor: mpirun exit $rc"
grep -q "2 devices per rank: that is the hybrid layout, -sm layer" "$tmp/hyt.err" ||
    fail "sim:2 with -sm tensor: unclear refusal: $(cat "$tmp/hyt.err")"
echo "ok: several devices per rank with -sm tensor are refused (mpirun exit $rc)"

# micro-batches: a long prompt split into ubatches of 4 that flow through the stages
long_prompt="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day"
ub_args=(run -m "$model" -n 8 -s 1 -t 1 --temp 0 -ctk f32 -ctv f32 -p "$long_prompt")
"$loom" "${ub_args[@]}" --logits-out "$tmp/ubref.logits" >"$tmp/ubref.out" 2>"$tmp/ubref.err" ||
    fail "long prompt, one process: $(cat "$tmp/ubref.err")"
text "$tmp/ubref.out" >"$tmp/ubref.txt"
sends_of() { sed -n 's/^rank 0\/[0-9]*: MPI point-to-point: \([0-9]*\) sends.*/\1/p' "$1"; }
colls_of() { sed -n 's/^rank 0\/[0-9]*: MPI point-to-point: .*; \([0-9]*\) collectives/\1/p' "$1"; }
check_ubatch() { # N devices tag
    local n=$1 dev=$2 tag=$3 d
    # every position's logits (each ubatch's logits are read back: that waits per ubatch)
    mpi -np "$n" "$loom" "${ub_args[@]}" -ub 4 --devices "$dev" -sm layer --dist mpi \
        --logits-out "$tmp/$tag.logits" >"$tmp/$tag.out" 2>"$tmp/$tag.err" ||
        fail "$tag: mpirun exit $?: $(tail -5 "$tmp/$tag.err")"
    text "$tmp/$tag.out" | cmp -s - "$tmp/ubref.txt" || fail "$tag: text differs: '$(text "$tmp/$tag.out")'"
    grep -q "^prompt: *34 tokens" "$tmp/$tag.err" || fail "$tag: the prompt is not 34 tokens"
    d=$(maxdiff "$tmp/ubref.logits" "$tmp/$tag.logits")
    [ "$d" != bad ] && awk -v d="$d" 'BEGIN { exit !(d <= 5e-4) }' || fail "$tag: logits differ by $d"
    # the flow: without --logits-out only the last position is read, so the ubatches cross
    # the stages with point-to-point sends alone
    mpi -np "$n" "$loom" "${ub_args[@]}" -ub 4 --devices "$dev" -sm layer --dist mpi \
        >"$tmp/$tag.f.out" 2>"$tmp/$tag.f.err" || fail "$tag flow: mpirun exit $?"
    mpi -np "$n" "$loom" "${ub_args[@]}" --devices "$dev" -sm layer --dist mpi \
        >"$tmp/$tag.one.out" 2>"$tmp/$tag.one.err" || fail "$tag one batch: mpirun exit $?"
    text "$tmp/$tag.f.out" | cmp -s - "$tmp/ubref.txt" || fail "$tag flow: text differs"
    text "$tmp/$tag.one.out" | cmp -s - "$tmp/ubref.txt" || fail "$tag one batch: text differs"
    local s1 s9 c1 c9
    s1=$(sends_of "$tmp/$tag.one.err") s9=$(sends_of "$tmp/$tag.f.err")
    c1=$(colls_of "$tmp/$tag.one.err") c9=$(colls_of "$tmp/$tag.f.err")
    [ -n "$s1" ] && [ -n "$s9" ] && [ -n "$c1" ] && [ "$s1" -gt 0 ] || fail "$tag: no MPI counts"
    # 8 graphs with one batch (the prompt, 7 tokens), 16 with 9 ubatches: twice the sends
    [ "$s9" -eq $((s1 * 16 / 8)) ] && [ $((s1 % 8)) -eq 0 ] ||
        fail "$tag: rank 0 sent $s9 messages in 9 ubatches + 7 tokens, $s1 in 1 batch + 7 tokens"
    [ "$c9" -eq "$c1" ] || fail "$tag: $c9 collectives with ubatches, $c1 without"
    echo "ok: $tag ($n stages, --devices $dev, -ub 4: 9 ubatches): text equal, logits max diff $d; rank 0 sends $s1 -> $s9, collectives $c1 = $c9"
}
check_ubatch 2 cpu ub2
check_ubatch 3 cpu ub3
check_ubatch 2 sim:2 ub2x2

# the weight share shrinks with N: 4 ranks hold about half of what 2 ranks hold each
w2=$(weight_mib "$tmp/np2.err") w4=$(weight_mib "$tmp/np4.err")
awk -v a="$w2" -v b="$w4" 'BEGIN { exit !(b > 0 && b < 0.6 * a) }' ||
    fail "rank 0 weights: $w2 MiB with 2 ranks, $w4 MiB with 4"

# loom bench --dist mpi: one row per test from rank 0 only (the others print nothing), the
# world size in the rows
mpi -np 2 "$loom" bench -m "$model" -p 16 -n 8 -r 1 -t 1 -sm tensor,layer --dist mpi -o csv \
    >"$tmp/bench.csv" 2>"$tmp/bench.err" || fail "bench: $(tail -5 "$tmp/bench.err")"
rows=$(grep -c '"cpu x 2 MPI ranks"' "$tmp/bench.csv" || true)
[ "$rows" -eq 4 ] || fail "bench: $rows rows with 'cpu x 2 MPI ranks', want 4: $(cat "$tmp/bench.csv")"
[ "$(grep -c '^model_filename' "$tmp/bench.csv")" -eq 1 ] || fail "bench: the header is printed more than once"
echo "ok: loom bench --dist mpi: 4 rows (pp16, tg8 x tensor, layer) from rank 0"
mpi -np 2 "$loom" bench -m "$model" -p 16 -n 8 -r 1 -t 1 -sm layer --devices sim:2 --dist mpi -o csv \
    >"$tmp/benchhy.csv" 2>"$tmp/benchhy.err" || fail "bench hybrid: $(tail -5 "$tmp/benchhy.err")"
rows=$(grep -c '"sim:2 x 2 MPI ranks"' "$tmp/benchhy.csv" || true)
[ "$rows" -eq 2 ] || fail "bench hybrid: $rows rows with 'sim:2 x 2 MPI ranks', want 2: $(cat "$tmp/benchhy.csv")"
echo "ok: loom bench --dist mpi --devices sim:2 -sm layer: 2 rows from rank 0"

# loom explain --dist mpi: rank 0 alone prints the plan of the session across the ranks
# (tensor mode: the same reductions as one process over sim:2; layer mode: a stage per rank),
# every rank its memory line on stderr; a rank that cannot open the model stops every rank
"$loom" explain -m "$model" --devices sim:2 -sm tensor -q >"$tmp/ex1.out" 2>"$tmp/ex1.err" ||
    fail "explain sim:2: $(cat "$tmp/ex1.err")"
want_red=$(sed -n 's/^allreduces = //p' "$tmp/ex1.out")
mpi -np 2 "$loom" explain -m "$model" --dist mpi -q >"$tmp/ex2.out" 2>"$tmp/ex2.err" ||
    fail "explain --dist: mpirun exit $?: $(tail -5 "$tmp/ex2.err")"
[ "$(grep -c '^graph nodes = ' "$tmp/ex2.out")" -eq 1 ] || fail "explain --dist: not printed once: $(cat "$tmp/ex2.out")"
grep -q "devices cpu x 2 MPI ranks; split mode tensor; batch 1" "$tmp/ex2.out" || fail "explain --dist: $(head -2 "$tmp/ex2.out")"
grep -q "^## SPLIT #1: Meta(MPI0,MPI1)" "$tmp/ex2.out" || fail "explain --dist: no split on Meta(MPI0,MPI1)"
grep -q "^allreduces = $want_red\$" "$tmp/ex2.out" ||
    fail "explain --dist: $(grep '^allreduces' "$tmp/ex2.out"), want $want_red (one process over sim:2)"
for k in 0 1; do
    grep -q "^rank $k/2: MPI$k holds weights" "$tmp/ex2.err" || fail "explain --dist: no memory line of rank $k"
done
mpi -np 3 "$loom" explain -m "$model" --dist mpi -sm layer --batch 1,4 -q >"$tmp/ex3.out" 2>"$tmp/ex3.err" ||
    fail "explain --dist layer: mpirun exit $?: $(tail -5 "$tmp/ex3.err")"
[ "$(grep -c '^graph splits = 4$' "$tmp/ex3.out")" -eq 2 ] || fail "explain --dist layer: not 3 stages + CPU for both batches"
grep -q "^backends (priority order): MPI0 MPI1 MPI2 CPU" "$tmp/ex3.out" || fail "explain --dist layer: $(grep '^backends' "$tmp/ex3.out")"
! grep -q '\[ (' "$tmp/ex3.out" || fail "explain --dist layer: an unnamed split input: $(grep '\[ (' "$tmp/ex3.out")"
set +e
mpi -np 1 "$loom" explain -m "$model" --dist mpi : -np 1 "$loom" explain -m "$tmp/missing.gguf" --dist mpi \
    >"$tmp/exbad.out" 2>"$tmp/exbad.err"
rc=$?
set -e
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "explain, rank 1 bad model: mpirun exit $rc"
grep -q "rank 0 stops: rank 1: .*missing.gguf" "$tmp/exbad.err" || fail "explain, rank 1 bad model: $(cat "$tmp/exbad.err")"
! grep -q "^graph nodes" "$tmp/exbad.out" || fail "explain, rank 1 bad model: rank 0 printed a plan"
echo "ok: loom explain --dist mpi: once from rank 0, $want_red allreduces as sim:2, 3 stages in layer mode, a bad rank stops all (exit $rc)"

# failure injection: rank 1 (of 2, then of 3) gets a bad path; every rank must end, non-zero
inject() { # label ranks-before-bad ranks-after-bad
    local tag=$1 before=$2 after=$3 rc
    local cmd=(-np "$before" "$loom" "${run_args[@]}" --dist mpi : -np 1 "$loom" run -m "$tmp/missing.gguf"
        -n 4 --dist mpi)
    [ "$after" -gt 0 ] && cmd+=(: -np "$after" "$loom" "${run_args[@]}" --dist mpi)
    set +e
    mpi "${cmd[@]}" >"$tmp/$tag.out" 2>"$tmp/$tag.err"
    rc=$?
    set -e
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "$tag: ranks hung (timeout)"
    [ "$rc" -ne 0 ] || fail "$tag: mpirun succeeded with a bad path on rank $before"
    grep -q "missing.gguf" "$tmp/$tag.err" || fail "$tag: the bad rank's error is not shown"
    local k
    for ((k = 0; k < before + 1 + after; k++)); do
        [ "$k" -eq "$before" ] && continue
        grep -q "rank $k stops: rank $before: .*missing.gguf" "$tmp/$tag.err" ||
            fail "$tag: rank $k did not report rank $before's error: $(cat "$tmp/$tag.err")"
    done
    ! grep -q "Once upon" "$tmp/$tag.out" || fail "$tag: text was generated despite the failure"
    echo "ok: $tag: every rank ended (mpirun exit $rc) with rank $before's error"
}
inject bad_of_2 1 0
inject bad_of_3 1 1

# ranks that disagree: rank 0 leads the control flow (-n, --logits-out), and a rank whose
# model or context differs from rank 0's stops every rank with a message naming it
mpi -np 1 "$loom" "${run_args[@]}" --dist mpi : -np 1 "$loom" run -m "$model" -n 4 -t 1 -ctk f32 -ctv f32 --dist mpi \
    >"$tmp/lead.out" 2>"$tmp/lead.err" || fail "mixed -n: mpirun exit $?: $(tail -5 "$tmp/lead.err")"
text "$tmp/lead.out" | cmp -s - "$tmp/ref.txt" || fail "mixed -n: rank 0's text differs"
echo "ok: rank 1 with another -n follows rank 0"
set +e
mpi -np 1 "$loom" "${run_args[@]}" --dist mpi : -np 1 "$loom" "${run_args[@]}" -c 64 --dist mpi \
    >"$tmp/ctx.out" 2>"$tmp/ctx.err"
rc=$?
set -e
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "mixed -c: mpirun exit $rc"
grep -q "rank 0 stops: rank 1: its model or options differ from rank 0's" "$tmp/ctx.err" ||
    fail "mixed -c: $(cat "$tmp/ctx.err")"
echo "ok: rank 1 with another context stops every rank (mpirun exit $rc)"

echo "PASS"
