#!/usr/bin/env bash
# Installs what loom's build needs on a Debian 12 machine and nothing else: Bazel 4.2.3
# (bazel-bootstrap), GoogleTest, PCRE2 and hwloc from the Debian archive, plus clang and
# its runtime (libFuzzer, the sanitizers) for the fuzz target, and chromium (run headless)
# for the render test of `loom explain --html`, and Open MPI (openmpi-bin, libopenmpi-dev)
# for dist/ and `loom run --dist mpi`. Packages already present are not touched,
# and when all are present the script does not call apt at all, so it also runs offline.
# Run from anywhere, as root or with sudo available:
#
#   ./scripts/setup.sh && bazel run //tools:loom -- run --devices sim:4 && bazel run //tools:loom -- explain --devices sim:4 -q
#   ./scripts/setup.sh && bazel test //...
set -euo pipefail

packages=(bazel-bootstrap libgtest-dev libpcre2-dev libhwloc-dev clang libclang-rt-14-dev chromium
    openmpi-bin libopenmpi-dev)

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for p in "${packages[@]}"; do
    installed "$p" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: ${packages[*]} already installed" >&2
else
    echo "setup: installing ${missing[*]}" >&2
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "setup: need root (or sudo) to install ${missing[*]}" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" apt-get install -y -q "${missing[@]}"
fi

# Sanity: the tools the build calls must now be on PATH.
for tool in bazel cc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "setup: '$tool' not found on PATH after installation" >&2
        exit 1
    fi
done
