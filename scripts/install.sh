#!/usr/bin/env bash
# Builds loom with Bazel and installs it as a relocatable tree:
#
#   DIR/include/loom/*.h                public headers
#   DIR/lib/libloom.so.X.Y.Z            the shared library (SONAME libloom.so.X), with the
#   DIR/lib/libloom.so.X, libloom.so    usual symlinks
#   DIR/lib/libloom.a                   the static library
#   DIR/lib/loom/libloom-*.so           backend modules (the registry's default directory,
#                                       found relative to libloom; LOOM_BACKEND_PATH adds more)
#   DIR/lib/pkgconfig/loom.pc           pkg-config (prefix computed from its own location)
#   DIR/bin/loom                        the tool (finds libloom through $ORIGIN/../lib)
#   DIR/lib/libggml-loom.so             loom as a ggml backend, only where pkg-config finds
#                                       ggml 0.27 (docs/ggml.md); its sources in DIR/src/ggml
#
# Usage: scripts/install.sh --prefix DIR [--no-build] [-- BAZEL_BUILD_FLAGS...]
# Nothing in the tree refers to the build directory: DIR can be moved afterwards.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
prefix=""
build=1
bazel_flags=()
while [ $# -gt 0 ]; do
    case $1 in
    --prefix) prefix=${2:-}; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --no-build) build=0; shift ;;
    --) shift; bazel_flags=("$@"); break ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$prefix" ]; then
    echo "install.sh: --prefix DIR is required" >&2
    exit 2
fi

targets=(
    //:libloom.so.0
    //:libloom_static
    //backends/cpu:libloom-cpu.so
    //backends/sim:libloom-sim.so
    //backends/cuda:libloom-cuda.so
    //tools:loom
)
if [ "$build" = 1 ]; then
    bazel build "${bazel_flags[@]}" "${targets[@]}"
fi
bin=$(bazel info "${bazel_flags[@]}" bazel-bin 2>/dev/null)

ver_h=include/loom/version.h
major=$(sed -n 's/^#define LOOM_VERSION_MAJOR \([0-9]*\).*/\1/p' "$ver_h")
minor=$(sed -n 's/^#define LOOM_VERSION_MINOR \([0-9]*\).*/\1/p' "$ver_h")
patch=$(sed -n 's/^#define LOOM_VERSION_PATCH \([0-9]*\).*/\1/p' "$ver_h")
version="$major.$minor.$patch"
if [ ! -f "$bin/libloom.so.$major" ]; then
    echo "install.sh: $bin/libloom.so.$major not built (version.h says major $major;" \
        "the //:libloom.so.N target must match)" >&2
    exit 1
fi

mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
install -d "$prefix/include/loom" "$prefix/lib/loom" "$prefix/lib/pkgconfig" "$prefix/bin"
install -m 644 include/loom/*.h "$prefix/include/loom/"
install -m 755 "$bin/libloom.so.$major" "$prefix/lib/libloom.so.$version"
ln -sfn "libloom.so.$version" "$prefix/lib/libloom.so.$major"
ln -sfn "libloom.so.$major" "$prefix/lib/libloom.so"
install -m 644 "$bin/libloom.a" "$prefix/lib/libloom.a"
rm -f "$prefix"/lib/loom/libloom-*.so
for m in cpu sim cuda; do
    # libloom-cuda.so exists only where the CUDA toolkit was found at build time
    f="$bin/backends/$m/libloom-$m.so"
    if [ -f "$f" ]; then install -m 755 "$f" "$prefix/lib/loom/"; fi
done
install -m 755 "$bin/tools/loom" "$prefix/bin/loom"

# what a static link of libloom.a needs: the shared libraries libloom.so itself links
# (libpcre2-8.so.0 -> -lpcre2-8, libhwloc.so.15 -> -lhwloc, libm.so.6 -> -lm, ...),
# read from its dynamic section so a build with or without Open MPI stays right
private=""
for lib in $(readelf -d "$prefix/lib/libloom.so.0" 2>/dev/null |
    sed -n 's/.*Shared library: \[lib\([^]]*\)\.so[^]]*\].*/\1/p'); do
    case $lib in c | gcc_s | stdc++ | ld-linux*) ;; *) private="$private -l$lib" ;; esac
done
private="$private -lpthread -ldl"

cat >"$prefix/lib/pkgconfig/loom.pc" <<PC
# loom $version: relocatable (prefix is where this file lies, two levels up)
prefix=\${pcfiledir}/../..
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include
moduledir=\${libdir}/loom

Name: loom
Description: tensor-parallel inference over many devices (meta device, scheduler, backends)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lloom
Libs.private:$private
PC
# loom as a ggml backend (ggml/README.md), where ggml's development files are found
if command -v pkg-config >/dev/null && pkg-config --exists ggml; then
    mkdir -p "$prefix/src"
    rm -rf "$prefix/src/ggml"
    cp -r ggml "$prefix/src/ggml"
    if bash ggml/build.sh "$prefix"; then
        echo "installed $prefix/lib/libggml-loom.so (GGML_BACKEND_PATH)"
    else
        echo "install.sh: libggml-loom.so not built (see above)" >&2
    fi
else
    echo "install.sh: pkg-config finds no ggml: libggml-loom.so not built" \
        "(scripts/ggml-sandbox.sh builds it in a Debian testing root)" >&2
fi
echo "installed loom $version into $prefix"
