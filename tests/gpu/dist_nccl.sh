#!/usr/bin/env bash
# `loom run --dist mpi` over CUDA members on one GPU machine (run.sh runs it when the image
# has mpirun; bundle.sh copies it to .gpu/). What one GPU allows:
#   - 1 rank on cuda:0 with LOOM_DIST_NCCL=1: NCCL between ranks is set up (ncclGetUniqueId,
#     the id over MPI, ncclCommInitRank of one rank) and reported; the text equals cuda:0
#     alone;
#   - 2 ranks on cuda:0 (the same GPU): NCCL refuses two ranks of one communicator on one
#     GPU; every rank must stop with NCCL's message (ncclCommInitRank), none may hang (a
#     NCCL that accepts it must give cuda:0's text with its AllReduces through NCCL);
#   - 2 ranks on cuda:0 with LOOM_DIST_NCCL=0 (host memory and MPI), -sm tensor and layer:
#     the text equals cuda:0 alone, and the ranks report the host path and why.
# NCCL's AllReduce and send/recv between two GPUs need a machine with two GPUs (or two nodes):
# `mpirun -np 2 loom run ... --dist mpi --devices cuda:<local rank>` there (README).
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
args=(run -m "$model" -n 16 -s 1 -t 1 --temp 0 -ctk f32 -ctv f32)
"$loom" "${args[@]}" --devices cuda:0 >"$tmp/ref.out" 2>"$tmp/ref.err" ||
    fail "cuda:0 alone: $(tail -3 "$tmp/ref.err")"
text "$tmp/ref.out" >"$tmp/ref.txt"

# 1 rank: NCCL set up between ranks
LOOM_DIST_NCCL=1 timeout 90 mpirun --oversubscribe -np 1 "$loom" "${args[@]}" --dist mpi \
    --devices cuda:0 >"$tmp/np1.out" 2>"$tmp/np1.err" || fail "1 rank, NCCL: $(tail -5 "$tmp/np1.err")"
grep -q "^rank 0/1: across ranks: NCCL [0-9.]* across 1 ranks" "$tmp/np1.err" ||
    fail "1 rank: NCCL not reported: $(grep across "$tmp/np1.err")"
text "$tmp/np1.out" | cmp -s - "$tmp/ref.txt" || fail "1 rank, NCCL: text differs"
echo "FIGURE dist 1 rank cuda:0: $(grep -m1 'across ranks' "$tmp/np1.err")"

# 2 ranks on the same GPU: NCCL's refusal on every rank, no hang
timeout 120 mpirun --oversubscribe -np 2 "$loom" "${args[@]}" --dist mpi --devices cuda:0 \
    >"$tmp/np2.out" 2>"$tmp/np2.err"
rc=$?
[ "$rc" -ne 124 ] || fail "2 ranks on one GPU: timed out (a hang): $(tail -5 "$tmp/np2.err")"
if [ "$rc" -eq 0 ]; then # a NCCL that accepts it: then it must be right
    text "$tmp/np2.out" | cmp -s - "$tmp/ref.txt" || fail "2 ranks on one GPU, NCCL: text differs"
    grep -q "^rank 1/2: across ranks: NCCL [0-9.]* across 2 ranks; through it [1-9]" "$tmp/np2.err" ||
        fail "2 ranks on one GPU: NCCL not used: $(grep across "$tmp/np2.err")"
    echo "FIGURE dist 2 ranks on one GPU: NCCL accepted them: $(grep -m1 '^rank 1/2: across' "$tmp/np2.err")"
else
    for k in 0 1; do
        grep -q "^loom run: rank $k stops: dist: NCCL [0-9.]* across 2 ranks: rank [01]: .*CommInitRank" \
            "$tmp/np2.err" || fail "2 ranks on one GPU: rank $k's message: $(grep stops "$tmp/np2.err")"
    done
    echo "FIGURE dist 2 ranks on one GPU refused: $(grep -m1 'rank 0 stops' "$tmp/np2.err" | cut -c1-240)"
fi

# 2 ranks on the same GPU through host memory
for sm in tensor layer; do
    LOOM_DIST_NCCL=0 timeout 120 mpirun --oversubscribe -np 2 "$loom" "${args[@]}" --dist mpi \
        --devices cuda:0 -sm "$sm" >"$tmp/host.$sm.out" 2>"$tmp/host.$sm.err" ||
        fail "2 ranks, host path, -sm $sm: $(tail -5 "$tmp/host.$sm.err")"
    text "$tmp/host.$sm.out" | cmp -s - "$tmp/ref.txt" || fail "2 ranks, host path, -sm $sm: text differs"
    grep -q "^rank 1/2: across ranks: MPI through host memory (LOOM_DIST_NCCL=0" "$tmp/host.$sm.err" ||
        fail "2 ranks, host path: not reported: $(grep across "$tmp/host.$sm.err")"
done
echo "PASS"
