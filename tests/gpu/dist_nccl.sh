#!/usr/bin/env bash
# `loom run --dist mpi` over CUDA members on one GPU machine (run.sh runs it when the image
# has mpirun; bundle.sh copies it to .gpu/). What one GPU allows:
#   - 1 rank on cuda:0 with LOOM_DIST_NCCL=1: NCCL between ranks is set up (ncclGetUniqueId,
#     the id over MPI, ncclCommInitRank of one rank) and reported; the text equals cuda:0
#     alone;
#   - 2 ranks on cuda:0 (the same GPU): NCCL refuses two ranks of one communicator on one
#     GPU; in automatic mode every rank falls back to the host path with NCCL's message
#     (ncclCommInitRank) as the reason and gives cuda:0's text; with LOOM_DIST_NCCL=1 every
#     rank stops with that message; none may hang (a NCCL that accepts it must give cuda:0's
#     text with its AllReduces through NCCL);
#   - 2 ranks on cuda:0 with LOOM_DIST_NCCL=0 (host memory and MPI), -sm tensor and layer:
#     the text equals cuda:0 alone, and the ranks report the host path and why.
# NCCL's AllReduce and send/recv between two GPUs need a machine with two GPUs (or two nodes):
# `mpirun -np 2 loom run ... --dist mpi --devices cuda:<local rank>` there (README).
# mpirun runs with the image's own library path (LOOM_IMAGE_LD_LIBRARY_PATH, from run.sh), so
# a bundled Open MPI never shadows the image's; only the loom it starts gets the bundle's.
# usage: dist_nccl.sh LOOM MODEL
set -u
loom=$1 model=$2
tmp=$(mktemp -d /tmp/loom-nccl.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,tcp \
    OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
    OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_rmaps_base_oversubscribe=1
fail() {
    echo "FAIL: $*"
    exit 1
}
text() { cat "$1"; } # stdout is the text alone (the figures are on stderr)
# mpi SECONDS NP ARGS...: `mpirun -np NP` of loom ARGS under the image's library path,
# killed after SECONDS (exit 124)
mpi() {
    local t=$1 np=$2
    shift 2
    env LD_LIBRARY_PATH="${LOOM_IMAGE_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" timeout "$t" \
        mpirun --oversubscribe -np "$np" env LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" "$loom" "$@"
}
args=(run -m "$model" -n 16 -s 1 -t 1 --temp 0 -ctk f32 -ctv f32)
"$loom" "${args[@]}" --devices cuda:0 >"$tmp/ref.out" 2>"$tmp/ref.err" ||
    fail "cuda:0 alone: $(tail -3 "$tmp/ref.err")"
text "$tmp/ref.out" >"$tmp/ref.txt"

# 1 rank: NCCL set up between ranks
LOOM_DIST_NCCL=1 mpi 40 1 "${args[@]}" --dist mpi --devices cuda:0 >"$tmp/np1.out" 2>"$tmp/np1.err" || fail "1 rank, NCCL: $(tail -5 "$tmp/np1.err")"
grep -q "^rank 0/1: across ranks: NCCL [0-9.]* across 1 ranks" "$tmp/np1.err" ||
    fail "1 rank: NCCL not reported: $(grep across "$tmp/np1.err")"
text "$tmp/np1.out" | cmp -s - "$tmp/ref.txt" || fail "1 rank, NCCL: text differs"
echo "FIGURE dist 1 rank cuda:0: $(grep -m1 'across ranks' "$tmp/np1.err")"

# 2 ranks on the same GPU: NCCL refuses them; automatic mode falls back to host memory,
# LOOM_DIST_NCCL=1 stops every rank; no hang
mpi 40 2 "${args[@]}" --dist mpi --devices cuda:0 >"$tmp/np2.out" 2>"$tmp/np2.err"
rc=$?
[ "$rc" -ne 124 ] || fail "2 ranks on one GPU: timed out (a hang): $(tail -5 "$tmp/np2.err")"
[ "$rc" -eq 0 ] || fail "2 ranks on one GPU, automatic: exit $rc: $(tail -5 "$tmp/np2.err")"
text "$tmp/np2.out" | cmp -s - "$tmp/ref.txt" || fail "2 ranks on one GPU, automatic: text differs"
if grep -q "^rank 1/2: across ranks: NCCL [0-9.]* across 2 ranks; through it [1-9]" "$tmp/np2.err"; then
    echo "FIGURE dist 2 ranks on one GPU: NCCL accepted them: $(grep -m1 '^rank 1/2: across' "$tmp/np2.err")"
else
    grep -q "^rank 1/2: across ranks: MPI through host memory (NCCL [0-9.]* across 2 ranks failed, so not used: rank [01]: .*CommInitRank" \
        "$tmp/np2.err" || fail "2 ranks on one GPU: no fallback with NCCL's reason: $(grep across "$tmp/np2.err")"
    echo "FIGURE dist 2 ranks on one GPU, automatic: $(grep -m1 '^rank 1/2: across' "$tmp/np2.err" | cut -c1-240)"
    LOOM_DIST_NCCL=1 mpi 40 2 "${args[@]}" --dist mpi --devices cuda:0 \
        >"$tmp/np2r.out" 2>"$tmp/np2r.err"
    rc=$?
    [ "$rc" -ne 124 ] || fail "2 ranks on one GPU, LOOM_DIST_NCCL=1: timed out (a hang)"
    for k in 0 1; do
        grep -q "^loom run: rank $k stops: dist: NCCL [0-9.]* across 2 ranks: rank [01]: .*CommInitRank" \
            "$tmp/np2r.err" || fail "2 ranks on one GPU, LOOM_DIST_NCCL=1: rank $k's message: $(grep stops "$tmp/np2r.err")"
    done
fi

# 2 ranks on the same GPU through host memory
for sm in tensor layer; do
    LOOM_DIST_NCCL=0 mpi 40 2 "${args[@]}" --dist mpi --devices cuda:0 -sm "$sm" >"$tmp/host.$sm.out" 2>"$tmp/host.$sm.err" ||
        fail "2 ranks, host path, -sm $sm: $(tail -5 "$tmp/host.$sm.err")"
    text "$tmp/host.$sm.out" | cmp -s - "$tmp/ref.txt" || fail "2 ranks, host path, -sm $sm: text differs"
    grep -q "^rank 1/2: across ranks: MPI through host memory (LOOM_DIST_NCCL=0" "$tmp/host.$sm.err" ||
        fail "2 ranks, host path: not reported: $(grep across "$tmp/host.$sm.err")"
done
echo "PASS"
