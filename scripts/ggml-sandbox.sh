#!/usr/bin/env bash
# Makes DIR a Debian testing root holding the packaged ggml and llama.cpp (the oracle and host
# engine of loom's ggml backend), builds loom and libggml-loom.so for it and installs them in
# DIR/opt/loom. Needs root and Debian's package archive (nothing else is downloaded).
#
#   scripts/ggml-sandbox.sh DIR            set up (reused when DIR is ready) and (re)install loom
#   scripts/ggml-sandbox.sh DIR --enter    also mount /proc, /dev, /sys in DIR (for chroot);
#   scripts/ggml-sandbox.sh DIR --leave    unmount them
#
# What it installs there: llama.cpp-tools (llama-cli, llama-completion, llama-bench,
# llama-server, llama-quantize), llama.cpp-tests (test-backend-ops), whisper.cpp-tools
# (whisper-cli, on the same libggml0; tests/ggml/whisper.sh), libggml-dev, gcc and
# pkg-config (to build the bridge against ggml's headers), and the runtime libraries libloom
# needs (libhwloc15, libpcre2-8-0, libopenmpi40), and the sanitizer runtimes (libasan8,
# libubsan1) tests/ggml/run.sh loads the bridge with. The pinned versions are checked: ggml
# 0.27.0 and llama.cpp 0.7.0, the ABI ggml/ggml-abi.h declares; whisper.cpp's version is
# printed beside them (1.9.5 when this was written) and its libggml must be that same ggml.
# About 4 minutes and 1.1 GB the first time (whisper.cpp brings ffmpeg's libraries). Then
# run e.g.
#   chroot DIR env GGML_BACKEND_PATH=/opt/loom/lib/libggml-loom.so LOOM_GGML_DEVICES=sim:4 \
#       llama-completion -m /tmp/model.gguf -dev LOOM0 -p "Once upon a time" -n 64
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${1:?usage: scripts/ggml-sandbox.sh DIR [--enter|--leave]}
action=${2:-}
mirror=${LOOM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=(llama.cpp-tools llama.cpp-tests whisper.cpp-tools libggml-dev gcc libc6-dev pkg-config binutils
    libhwloc15 libpcre2-8-0 libopenmpi40 libasan8 libubsan1)

mounts() {
    for m in proc dev sys; do
        mountpoint -q "$dir/$m" || case $m in
        proc) mount -t proc proc "$dir/proc" ;;
        *) mount --bind "/$m" "$dir/$m" ;;
        esac
    done
}
unmounts() {
    for m in sys dev proc; do
        if mountpoint -q "$dir/$m"; then umount "$dir/$m" || umount -l "$dir/$m"; fi
    done
}

if [ "$action" = --leave ]; then
    unmounts
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ggml-sandbox: needs root (debootstrap, chroot)" >&2
    exit 1
fi

if [ ! -f "$dir/.loom-sandbox-ready" ]; then
    if ! command -v debootstrap >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
    fi
    mkdir -p "$dir"
    t0=$SECONDS
    if [ ! -x "$dir/usr/bin/apt-get" ]; then
        debootstrap --variant=minbase --include=ca-certificates testing "$dir" "$mirror" \
            >"$dir.debootstrap.log" 2>&1 || {
            echo "ggml-sandbox: debootstrap failed; see $dir.debootstrap.log" >&2
            tail -5 "$dir.debootstrap.log" >&2
            exit 1
        }
    fi
    cp /etc/resolv.conf "$dir/etc/resolv.conf"
    # the archive's testing Release may be older than its Valid-Until on a frozen mirror
    echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/99loom"
    mounts
    chroot "$dir" env DEBIAN_FRONTEND=noninteractive sh -c \
        "apt-get update -q && apt-get install -y -q --no-install-recommends ${packages[*]}" \
        >"$dir.apt.log" 2>&1 || {
        echo "ggml-sandbox: apt-get in $dir failed; see $dir.apt.log" >&2
        tail -5 "$dir.apt.log" >&2
        unmounts
        exit 1
    }
    touch "$dir/.loom-sandbox-ready"
    echo "ggml-sandbox: $dir made in $((SECONDS - t0)) s"
fi
mounts
# a root made by an older version of this script: add what the list has gained since
missing=()
for p in "${packages[@]}"; do
    chroot "$dir" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
        missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    chroot "$dir" env DEBIAN_FRONTEND=noninteractive sh -c \
        "apt-get update -q && apt-get install -y -q --no-install-recommends ${missing[*]}" \
        >"$dir.apt.log" 2>&1 || {
        echo "ggml-sandbox: apt-get install ${missing[*]} in $dir failed; see $dir.apt.log" >&2
        exit 1
    }
fi
ggml=$(chroot "$dir" pkg-config --modversion ggml)
llama=$(chroot "$dir" dpkg-query -W -f='${Version}' llama.cpp-tools)
whisper=$(chroot "$dir" dpkg-query -W -f='${Version}' whisper.cpp-tools)
echo "ggml-sandbox: ggml $ggml, llama.cpp $llama, whisper.cpp $whisper"
case $ggml in
0.27.*) ;;
*) echo "ggml-sandbox: ggml $ggml: the bridge is written for 0.27 (ggml/ggml-abi.h)" >&2; exit 1 ;;
esac
# whisper.cpp must run on the ggml the bridge is built against, not a copy of its own
if ! chroot "$dir" ldd /usr/bin/whisper-cli | grep -q 'libggml-base.so.0 => /usr/lib/.*/libggml-base.so.0'; then
    echo "ggml-sandbox: whisper-cli does not load the packaged libggml-base.so.0 (ggml $ggml):" \
        "$(chroot "$dir" ldd /usr/bin/whisper-cli | grep ggml | tr '\n' ' ')" >&2
    exit 1
fi

# loom (built here, its glibc is older: it runs there) and the bridge (built there, against
# ggml's headers)
./scripts/install.sh --prefix "$dir/opt/loom" >/dev/null 2>&1 || {
    echo "ggml-sandbox: scripts/install.sh failed" >&2
    exit 1
}
rm -rf "$dir/opt/loom/src/ggml"
mkdir -p "$dir/opt/loom/src"
cp -r ggml "$dir/opt/loom/src/"
chroot "$dir" bash /opt/loom/src/ggml/build.sh /opt/loom
[ "$action" = --enter ] || unmounts
echo "ggml-sandbox: ready: chroot $dir, GGML_BACKEND_PATH=/opt/loom/lib/libggml-loom.so"
