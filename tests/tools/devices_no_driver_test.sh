#!/usr/bin/env bash
# `loom devices` on a machine without the CUDA driver (issue 26): the CUDA module is not
# loaded at all (no CUDA runtime or cuBLAS is mapped: the dynamic loader's own trace shows
# it), and the listing says why. With the driver, the CUDA registry is listed instead.
set -uo pipefail
loom="$1"
module="${2:-}" # the CUDA module (absent: built without the toolkit)
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() {
    echo "FAIL: $*"
    exit 1
}
case "$module" in
*libloom-cuda.so) ;;
*)
    echo "ok: no CUDA module (built without the toolkit): nothing to check"
    exit 0
    ;;
esac
# the module where load_all looks first, as an installed one would be found
LOOM_BACKEND_PATH=$(cd "$(dirname "$module")" && pwd) LD_DEBUG=files "$loom" devices \
    >"$tmp/out" 2>"$tmp/ld" || fail "loom devices: exit $?"
if grep -q "file=libcuda.so.1 .*calling init\|calling init: .*libcuda.so.1" "$tmp/ld"; then
    grep -q "^registry CUDA: " "$tmp/out" || fail "a driver, but no CUDA registry: $(cat "$tmp/out")"
    echo "ok: the driver is present and the CUDA registry listed"
    exit 0
fi
grep -q "no CUDA driver: libcuda.so.1 cannot be loaded" "$tmp/out" ||
    fail "no reason given: $(grep -i cuda "$tmp/out")"
! grep -q "libcublas\|libcudart" "$tmp/ld" || fail "cuBLAS or the CUDA runtime was loaded without a driver"
! grep -q "^registry CUDA" "$tmp/out" || fail "a CUDA registry without a driver"
echo "ok: without a driver the CUDA module is not loaded: $(grep '^CUDA:' "$tmp/out" | cut -c1-120)"
