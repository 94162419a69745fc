#!/usr/bin/env bash
# Builds everything loom's GPU checks need, on this (CPU) machine, into one git-ignored
# folder, .gpu/, that can be carried to a bare GPU machine (CUDA driver, cuBLAS, cudart and
# NCCL in its image; no Bazel, no package manager, no network) and run there with
#
#   bash .gpu/window.sh         # the whole window: BUDGET=540, four files in $OUT
#
# Layout of .gpu/ (kept under 60 MiB, as the device tool carries 64 MiB; the script fails if
# it grows past that):
#   window.sh, run.sh           the window and the runner (copies of tests/gpu/)
#   dist_nccl.sh                `loom run --dist mpi` over cuda:0 with NCCL (run.sh runs it with mpirun)
#   bin/cuda_test               //tests/gpu:cuda_test (every op vs the CPU, graphs, models...)
#   bin/loom                    //tools:loom
#   bin/synth_model             //bench:synth_model (the TinyLlama-shaped models of the
#                               speed checks are made on the GPU machine, not carried)
#   runfiles/loom/backends/cuda/libloom-cuda.so   the module (also the test's runfile;
#                               LOOM_BACKEND_PATH points here); libloom.so beside it when
#                               the tree has a //:libloom target
#   lib/                        non-CUDA shared libraries the binaries need that a bare image
#                               may lack (found with ldd: libgtest, libpcre2-8, libhwloc, ...)
#   lib/fallback/               libstdc++/libgcc_s, used only where the image has none
#   lib/mpi/                    Open MPI's libraries (libmpi, libopen-pal, libpmix, ...), used
#                               only where the image has no libmpi: an image's own mpirun
#                               never loads the bundle's copies
#   models/                     stories260K.gguf, llama-2-tiny-random.gguf
#   MANIFEST                    commit, build date, CUDA architectures, files and sizes
# cuBLAS, cudart, NCCL and the driver are never bundled: the runner finds them by name in
# the GPU image (never in a stubs/ folder) and says which it used.
#
# Environment: LOOM_CUDA_ARCHS (e.g. 90 for an H100/H200 only bundle; default: the build's
# own default, sm_80 + sm_90), LOOM_MODELS_DIR (default ../shared/models), GPU_BUNDLE_DIR
# (default .gpu). Exit status non-zero when a build or a copy fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
dest=${GPU_BUNDLE_DIR:-$root/.gpu}
models=${LOOM_MODELS_DIR:-$root/../shared/models}
max_mib=60

bazel_flags=(--color=no --curses=no --show_progress_rate_limit=30)
[ -n "${LOOM_CUDA_ARCHS:-}" ] && bazel_flags+=("--repo_env=LOOM_CUDA_ARCHS=$LOOM_CUDA_ARCHS")

targets=(//tests/gpu:cuda_test //tools:loom //backends/cuda:libloom-cuda.so //bench:synth_model)
# //:libloom (libloom.so.0) is being added on another branch: bundle it when the tree has
# it (the module and loom then link it; ldd below also copies it into lib/).
for t in $(grep -oE 'name *= *"libloom(\.so[.0-9]*)?"' BUILD 2>/dev/null | sed 's/.*"\(.*\)"/\1/'); do
    targets+=("//:$t")
done
echo "bundle: building ${targets[*]}"
bazel build "${bazel_flags[@]}" "${targets[@]}"
bin=$(bazel info "${bazel_flags[@]}" bazel-bin 2>/dev/null)

rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib/fallback" "$dest/lib/mpi" "$dest/models" "$dest/runfiles/loom/backends/cuda"
install -m 0755 "$bin/tests/gpu/cuda_test" "$dest/bin/cuda_test"
install -m 0755 "$bin/tools/loom" "$dest/bin/loom"
install -m 0755 "$bin/bench/synth_model" "$dest/bin/synth_model"
: >"$dest/runfiles/loom/WORKSPACE" # the test shim finds its runfiles root by this file
module="$bin/backends/cuda/libloom-cuda.so"
cuda_built=yes
if [ -f "$module" ]; then
    install -m 0755 "$module" "$dest/runfiles/loom/backends/cuda/libloom-cuda.so"
else
    cuda_built="no (the CUDA toolkit was absent at build time: GPU cases will skip)"
    echo "bundle: warning: no libloom-cuda.so was built ($cuda_built)" >&2
fi
for so in "$bin"/libloom.so "$bin"/libloom.so.*; do
    [ -f "$so" ] && install -m 0755 "$so" "$dest/runfiles/loom/backends/cuda/"
done
install -m 0755 tests/gpu/run.sh "$dest/run.sh"
install -m 0755 tests/gpu/window.sh "$dest/window.sh"
install -m 0755 tests/gpu/dist_nccl.sh "$dest/dist_nccl.sh"
for m in stories260K.gguf llama-2-tiny-random.gguf; do
    if [ -f "$models/$m" ]; then
        install -m 0644 "$models/$m" "$dest/models/$m"
    else
        echo "bundle: warning: $models/$m not found: its checks will skip" >&2
    fi
done

# Non-CUDA libraries the binaries link dynamically (ldd, resolved on this machine). The
# CUDA libraries and the driver come from the GPU image; glibc's own libraries are in
# every image; libstdc++/libgcc_s go to lib/fallback (the runner adds it only if needed,
# so a newer system copy that the image's CUDA libraries may need is never shadowed).
is_image_lib() {
    case "$1" in
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so* | libnvidia-*) return 0 ;;
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so*) return 0 ;;
    libresolv.so* | libutil.so*) return 0 ;;
    esac
    return 1
}
# bundle_lib NAME PATH: into lib/fallback (libstdc++, libgcc_s), lib/mpi (Open MPI and what
# only it uses) or lib/; the runner adds the first two only where the image lacks them.
bundle_lib() {
    local sub
    case "$1" in
    libstdc++.so* | libgcc_s.so*) sub=lib/fallback ;;
    libmpi.so* | libmpi_*.so* | libopen-pal.so* | libopen-rte.so* | libopen-orted*.so* | \
        libprrte.so* | libpmix.so* | libevent*.so* | libucp.so* | libucs.so* | libuct.so* | \
        libucm.so*) sub=lib/mpi ;;
    *) sub=lib ;;
    esac
    [ -f "$dest/$sub/$1" ] || install -m 0644 "$(readlink -f "$2")" "$dest/$sub/$1"
}
# ldd runs on the originals in bazel-bin, whose rpaths find Bazel's _solib_k8 libraries
# (the test links its packages dynamically); those go to lib/ too.
objs=("$bin/tests/gpu/cuda_test" "$bin/tools/loom" "$bin/bench/synth_model")
# NEEDED: the CUDA sonames the runner must find in the image (NCCL is dlopened lazily by
# the module, so it is named here although no object links it).
needed="$dest/NEEDED"
echo libnccl.so.2 >"$needed"
for so in "$module" "$bin"/libloom.so "$bin"/libloom.so.*; do [ -f "$so" ] && objs+=("$so"); done
for o in "${objs[@]}"; do
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        case "$name" in
        libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so*)
            grep -qx "$name" "$needed" || echo "$name" >>"$needed"
            ;;
        esac
        is_image_lib "$name" && continue
        if [ "$path" = "not" ] || [ ! -f "$path" ]; then
            echo "bundle: $o needs $name, which this machine cannot resolve" >&2
            exit 1
        fi
        bundle_lib "$name" "$path"
    done < <(ldd "$o" 2>/dev/null || true)
done

# Dependencies of the bundled libraries themselves (hwloc pulls in libudev, ...).
for pass in 1 2; do
    for l in "$dest"/lib/*.so* "$dest"/lib/mpi/*.so*; do
        [ -f "$l" ] || continue
        while read -r name arrow path _; do
            [ "$arrow" = "=>" ] || continue
            is_image_lib "$name" && continue
            [ -f "$path" ] || continue
            bundle_lib "$name" "$path"
        done < <(ldd "$l" 2>/dev/null || true)
    done
    : "$pass"
done

{
    echo "loom GPU bundle"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "cuda module: $cuda_built"
    echo "cuda archs: ${LOOM_CUDA_ARCHS:-80,90 (build default)}"
    nvcc=${CUDA_PATH:-/usr/local/cuda}/bin/nvcc
    [ -x "$nvcc" ] && echo "toolkit: $("$nvcc" --version | tail -1)"
    echo "files:"
    (cd "$dest" && find . -type f | sort | while read -r f; do
        printf '  %10d  %s\n' "$(stat -c %s "$f")" "${f#./}"
    done)
} >"$dest/MANIFEST"

kib=$(du -sk "$dest" | cut -f1)
echo "bundle: $dest: $((kib / 1024)) MiB ($kib KiB)"
if [ "$kib" -gt $((max_mib * 1024)) ]; then
    echo "bundle: $dest is over $max_mib MiB; it would not travel" >&2
    exit 1
fi
