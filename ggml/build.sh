#!/usr/bin/env bash
# Builds libggml-loom.so against an installed loom (PREFIX, from scripts/install.sh) and the
# ggml development files pkg-config finds (Debian's libggml-dev 0.27.0), and installs it as
# PREFIX/lib/libggml-loom.so. Plain cc, no Bazel: it runs where ggml is (a Debian testing
# root, see scripts/ggml-sandbox.sh, or a machine with ggml installed).
#
# Usage: ggml/build.sh PREFIX [EXTRA_CFLAGS...]      (CC overrides the compiler; OUT overrides
#        the output file, e.g. an ASan build beside the real one)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=${1:?usage: ggml/build.sh PREFIX [CFLAGS...]}
shift
if ! pkg-config --exists ggml; then
    echo "ggml/build.sh: pkg-config finds no ggml (install libggml-dev)" >&2
    exit 1
fi
ver=$(pkg-config --modversion ggml)
case $ver in
0.27.*) ;;
*) echo "ggml/build.sh: ggml $ver found; this bridge declares ggml 0.27's backend tables" \
    "(GGML_BACKEND_API_VERSION 3) and is not built for another version" >&2
    exit 1 ;;
esac
"${CC:-cc}" -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -fPIC -shared -fvisibility=hidden \
    -I"$here/.." -I"$prefix/include" $(pkg-config --cflags ggml) "$@" \
    -o "${OUT:-$prefix/lib/libggml-loom.so}" \
    "$here/device.c" "$here/buffer.c" "$here/twin.c" \
    -L"$prefix/lib" -Wl,-rpath,'$ORIGIN' -lloom $(pkg-config --libs ggml) -lggml-base -lpthread
echo "built ${OUT:-$prefix/lib/libggml-loom.so} (ggml $ver)"
