#!/usr/bin/env bash
# Runs every GPU check of loom on a machine with an NVIDIA GPU (compute capability 8.0+),
# CUDA 13 with NCCL at /usr/local/cuda (or $CUDA_PATH) and Bazel, in under 5 minutes on
# one GPU:
#   1. nvidia-smi, so the log says what it ran on;
#   2. bazel test //tests/gpu:cuda_test (every op against the CPU, buffers, copies, events,
#      CUDA graphs, the communicator and its fallback, the meta device over several loom
#      devices on one GPU), with --test_output=all;
#   3. the loom tool through the module: `loom devices`, `loom demo` split over two loom
#      devices on one GPU (it compares with the CPU and fails on a difference), `loom run`
#      and `loom bench` on cuda:0 and on cuda:0,1.
# Exit status: 0 when every step passed; the last lines summarise each step.
#
# Environment: LOOM_GPU_OUTPUT_BASE (Bazel output base, default ~/.cache/bazel-gpu),
# LOOM_CUDA_ARCHS (e.g. 90: build only for this GPU; default both sm_80 and sm_90),
# LOOM_MODELS_DIR (shared models; stories260K is used when present), JOBS.
set -u
cd "$(dirname "$0")/../.."

OUT_BASE=${LOOM_GPU_OUTPUT_BASE:-$HOME/.cache/bazel-gpu}
JOBS=${JOBS:-$(nproc)}
BAZEL=(bazel "--output_base=$OUT_BASE")
REPO_ENV=()
[ -n "${LOOM_CUDA_ARCHS:-}" ] && REPO_ENV+=("--repo_env=LOOM_CUDA_ARCHS=$LOOM_CUDA_ARCHS")
[ -n "${CUDA_PATH:-}" ] && REPO_ENV+=("--repo_env=CUDA_PATH=$CUDA_PATH")

declare -a RESULTS=()
FAILED=0
step() { # step NAME COMMAND...
    local name=$1
    shift
    echo
    echo "==== $name: $*"
    local t0=$SECONDS
    if "$@"; then
        RESULTS+=("PASS  $name ($((SECONDS - t0)) s)")
    else
        RESULTS+=("FAIL  $name ($((SECONDS - t0)) s)")
        FAILED=$((FAILED + 1))
    fi
}

step "nvidia-smi" nvidia-smi

step "cuda_test" timeout 280 "${BAZEL[@]}" test "${REPO_ENV[@]}" --jobs="$JOBS" \
    --test_output=all --test_timeout=240 --test_env=LOOM_MODELS_DIR --test_env=LOOM_LOG_LEVEL \
    //tests/gpu:cuda_test

step "build loom + module" "${BAZEL[@]}" build "${REPO_ENV[@]}" --jobs="$JOBS" \
    //tools:loom //backends/cuda:libloom-cuda.so

BIN=$("${BAZEL[@]}" info bazel-bin 2>/dev/null)
LOOM="$BIN/tools/loom"
export LOOM_BACKEND_PATH="$BIN/backends/cuda"
MODEL=()
if [ -n "${LOOM_MODELS_DIR:-}" ] && [ -f "$LOOM_MODELS_DIR/stories260K.gguf" ]; then
    MODEL=(-m "$LOOM_MODELS_DIR/stories260K.gguf")
elif [ -f ../shared/models/stories260K.gguf ]; then
    MODEL=(-m ../shared/models/stories260K.gguf)
fi

step "loom devices" timeout 60 "$LOOM" devices --devices cuda
step "loom demo cuda:0,1 (2 loom devices on GPU 0)" \
    env LOOM_CUDA_DEVICES_PER_GPU=2 timeout 60 "$LOOM" demo --devices cuda:0,1
step "loom run cuda:0" timeout 60 "$LOOM" run "${MODEL[@]}" -n 24 --devices cuda:0
step "loom run cuda:0,1 (2 loom devices on GPU 0)" \
    env LOOM_CUDA_DEVICES_PER_GPU=2 timeout 60 "$LOOM" run "${MODEL[@]}" -n 24 --devices cuda:0,1
step "loom bench" env LOOM_CUDA_DEVICES_PER_GPU=2 timeout 90 "$LOOM" bench "${MODEL[@]}" \
    --devices 'cuda:0;cuda:0,1' -p 64 -n 16

"${BAZEL[@]}" shutdown >/dev/null 2>&1

echo
echo "==== summary"
printf '%s\n' "${RESULTS[@]}"
echo "$(( ${#RESULTS[@]} - FAILED )) passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
