#!/usr/bin/env bash
# CI check of loom as an installed library (issue 12), no Bazel past the install step:
#   1. scripts/install.sh --prefix into a temporary directory, then the tree is moved
#      elsewhere (it must be relocatable) and searched for build-tree paths;
#   2. the exported symbols of lib/libloom.so are exactly the LOOM_API names of its headers,
#      and the modules in lib/loom/ need libloom.so.0 and define no core symbol; every
#      installed header compiles alone as C11 and as C++17;
#   3. examples/embed, examples/custom-device and examples/cxx are copied out of the tree
#      and built with plain make + pkg-config, then run (embed needs stories260K.gguf from
#      $LOOM_MODELS_DIR or ../shared/models: skipped with a note when absent);
#   4. custom-device links the static libloom.a too, and bin/loom runs from the moved tree.
# Prints "ci_install: OK" and exits 0 when everything passed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
root=$(pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
    echo "ci_install: FAILED: $*"
    fails=$((fails + 1))
}
ok() {
    echo "ci_install: ok: $*"
}

# 1. install, move, look for build-tree paths
./scripts/install.sh --prefix "$tmp/staging" || {
    echo "ci_install: FAILED: scripts/install.sh"
    exit 1
}
mv "$tmp/staging" "$tmp/moved"
prefix=$tmp/moved
output_base=$(bazel info output_base 2>/dev/null || echo /nonexistent-output-base)
for f in "$prefix"/lib/libloom.so.* "$prefix"/lib/loom/*.so "$prefix"/bin/loom "$prefix"/lib/pkgconfig/loom.pc; do
    [ -L "$f" ] && continue
    if grep -q -F -e "$root" -e "$output_base" -e "$tmp/staging" "$f"; then
        fail "$f mentions the build tree ($root or $output_base)"
    fi
done
for f in "$prefix"/lib/libloom.so.0 "$prefix"/lib/loom/*.so "$prefix"/bin/loom; do
    rp=$(readelf -d "$f" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
    for d in ${rp//:/ }; do
        case $d in
        '$ORIGIN'* | /usr/local/cuda*) ;;
        *) fail "$f has a run path '$d' that is neither \$ORIGIN-relative nor the CUDA toolkit" ;;
        esac
    done
done
ok "installed and moved to $prefix"

# 2. symbols
api=$(sh scripts/loom_exports.sh "$prefix"/include/loom/*.h) # every header: sim.h and cuda.h forward
exported=$(nm -D --defined-only "$prefix/lib/libloom.so" | awk 'NF==3 {print $3}' | LC_ALL=C sort -u)
if [ "$api" != "$exported" ]; then
    fail "libloom.so exports differ from the LOOM_API list:"
    diff <(echo "$api") <(echo "$exported") | head -20
else
    ok "libloom.so exports exactly the $(echo "$api" | wc -l) LOOM_API symbols"
fi
soname=$(readelf -d "$prefix/lib/libloom.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
major=$(sed -n 's/^#define LOOM_VERSION_MAJOR \([0-9]*\).*/\1/p' "$prefix/include/loom/version.h")
[ "$soname" = "libloom.so.$major" ] || fail "SONAME '$soname', expected libloom.so.$major"
for m in "$prefix"/lib/loom/libloom-*.so; do
    readelf -d "$m" | grep -q 'NEEDED.*\[libloom.so.0\]' || fail "$m does not need libloom.so.0"
    if nm -D --defined-only "$m" | awk '{print $3}' | grep -qx -e loom_new_tensor -e loom_last_error; then
        fail "$m carries a copy of core"
    fi
done
ok "modules link libloom without a copy of core"

# every installed header compiles alone, as C11 and as C++17
for h in "$prefix"/include/loom/*.h; do
    b=loom/$(basename "$h")
    echo "#include <$b>" | cc -std=c11 -Wall -Wextra -Werror -fsyntax-only -x c -I"$prefix/include" - ||
        fail "$b does not compile alone as C11"
    echo "#include <$b>" | c++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only -x c++ -I"$prefix/include" - ||
        fail "$b does not compile alone as C++17"
done
ok "every header compiles alone (C11, C++17)"

# 3. examples, out of the tree, plain make + pkg-config
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
tool_version=$("$prefix/bin/loom" --version | awk '{print $2}')
[ "$(pkg-config --modversion loom)" = "$tool_version" ] ||
    fail "loom.pc version $(pkg-config --modversion loom) differs from loom --version ($tool_version)"
cp -r examples "$tmp/examples"
for ex in embed custom-device cxx; do
    if make -C "$tmp/examples/$ex" >"$tmp/make-$ex.log" 2>&1; then
        ok "examples/$ex built with make"
    else
        cat "$tmp/make-$ex.log"
        fail "examples/$ex did not build"
    fi
done
models=${LOOM_MODELS_DIR:-$root/../shared/models}
if [ -f "$models/stories260K.gguf" ]; then
    for n in 2 3; do
        "$tmp/examples/embed/embed" "$models/stories260K.gguf" $n 16 || fail "embed on sim:$n"
    done
else
    echo "ci_install: note: embed not run (no stories260K.gguf in $models)"
fi
"$tmp/examples/custom-device/custom-device" 3 || fail "custom-device"
make -s -C "$tmp/examples/cxx" run || fail "headers_cxx (make run)"

# 4. the static library, and the tool from the moved tree
if cc -O2 -std=c11 -I"$prefix/include" -o "$tmp/custom-static" \
    "$tmp/examples/custom-device/custom_device.c" "$prefix/lib/libloom.a" \
    $(pkg-config --static --libs-only-l loom | sed 's/-lloom//'); then
    if readelf -d "$tmp/custom-static" | grep -q 'libloom.so'; then
        fail "the static build still needs libloom.so"
    fi
    "$tmp/custom-static" 2 || fail "custom-device linked with libloom.a"
else
    fail "custom-device does not link with libloom.a"
fi
# a static link says what it lacks (no module backend) and how to get it; LOOM_BACKEND_PATH
# pointing at the installed lib/loom/ brings the sim module in
cat >"$tmp/static_spec.c" <<'EOF_C'
#include <stdio.h>
#include <loom/loom.h>
int main(void) {
    loom_dev_t devs[4];
    size_t n = 0;
    loom_registry_load_all();
    if (loom_devices_from_spec("sim:2", devs, 4, &n) != LOOM_OK) {
        printf("error: %s\n", loom_last_error());
        return 1;
    }
    printf("devices: %s,%s\n", loom_dev_name(devs[0]), loom_dev_name(devs[1]));
    return 0;
}
EOF_C
if cc -O2 -std=c11 -I"$prefix/include" -o "$tmp/static-spec" "$tmp/static_spec.c" "$prefix/lib/libloom.a" \
    $(pkg-config --static --libs-only-l loom | sed 's/-lloom//'); then
    out=$(env -u LOOM_BACKEND_PATH "$tmp/static-spec")
    case $out in
    *"no sim backend in this program: it links libloom statically (libloom.a)"*LOOM_BACKEND_PATH*) ;;
    *) fail "a static link's sim spec does not say what it lacks: $out" ;;
    esac
    if out=$(LOOM_BACKEND_PATH="$prefix/lib/loom" "$tmp/static-spec"); then
        ok "a static link names what it lacks; LOOM_BACKEND_PATH brings the sim module ($out)"
    else
        fail "the static link with LOOM_BACKEND_PATH=lib/loom: $out"
    fi
else
    fail "static_spec.c does not link with libloom.a"
fi
"$prefix/bin/loom" --version || fail "bin/loom --version"
"$prefix/bin/loom" devices >"$tmp/devices.txt" 2>&1 || fail "bin/loom devices"
grep -q "registry SIM" "$tmp/devices.txt" || fail "bin/loom devices lists no SIM registry"

if [ "$fails" -eq 0 ]; then
    echo "ci_install: OK"
    exit 0
fi
echo "ci_install: $fails failure(s)"
exit 1
