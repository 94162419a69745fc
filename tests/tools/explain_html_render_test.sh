#!/usr/bin/env bash
# Renders `loom explain --html` in headless Chromium (Debian's chromium package) and checks
# that the page's script ran without errors (it marks #status data-ok="1"; a script error
# sets data-ok="0", class "err" and "SCRIPT ERROR: <message>") and that every device of sim:4 shows in the lanes,
# the memory bars and both timelines (batch 1 and 32). A copy of the page with a broken
# script must be caught, so the check itself is tested. Skips (exit 0) without chromium.
set -euo pipefail
loom="$1"
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
    echo "SKIP: chromium is not installed (scripts/setup.sh installs it)"
    exit 0
fi
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export HOME="$tmp"
page="$tmp/page.html"
"$loom" explain --devices sim:4 --batch 1,32 -q --html "$page" >"$tmp/explain.txt"

render() { # page -> DOM after the scripts ran
    local prof
    prof=$(mktemp -d "$tmp/profile.XXXXXX")
    timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$prof" --dump-dom "file://$1" 2>"$prof.log"
}

fail() {
    echo "FAIL: $*"
    exit 1
}

render "$page" >"$tmp/dom.html"
grep -q 'id="status" data-ok="1"' "$tmp/dom.html" || fail "the page's script did not finish: $(grep -o 'id="status"[^<]*' "$tmp/dom.html")"
! grep -q 'class="err"' "$tmp/dom.html" || fail "script error: $(grep -o 'id="status"[^<]*' "$tmp/dom.html")"
for d in SIM0 SIM1 SIM2 SIM3; do
    n=$(grep -o "class=\"lane\" data-device=\"$d\"" "$tmp/dom.html" | wc -l)
    # lanes + memory + the two timelines
    [ "$n" -eq 4 ] || fail "device $d shows $n times, want 4"
done
# memory bars are scaled to each device's capacity: a few MiB of a 16 GiB sim device is a
# sliver (under 1% of the bar), not a full bar
w=$(grep -o '<div class="w"[^>]*style="width: [0-9.e-]*%' "$tmp/dom.html" | head -1 | sed 's/.*width: \([0-9.e-]*\)%/\1/')
[ -n "$w" ] || fail "no weights bar segment"
awk -v w="$w" 'BEGIN { exit !(w > 0 && w < 1) }' || fail "the SIM0 weights bar is $w% of the bar, want a sliver of 16 GiB"
grep -q ' of 16.0 GiB (' "$tmp/dom.html" || fail "the memory row does not name the capacity"
grep -q 'cause codes' "$tmp/dom.html" || fail "no cause legend"
grep -q '4.cpy' "$tmp/dom.html" || fail "legend lacks 4.cpy"
! grep -qE 'https?://' "$page" || fail "the page refers to the network"

# the check catches a broken script
sed 's/JSON.parse(/JSON.parsee(/' "$page" >"$tmp/broken.html"
render "$tmp/broken.html" >"$tmp/broken_dom.html"
grep -q 'id="status" data-ok="0"' "$tmp/broken_dom.html" || fail "a broken script was not detected"
grep -q 'class="err">SCRIPT ERROR: ' "$tmp/broken_dom.html" || fail "a broken script left no error mark"
echo "PASS: rendered, 4 devices shown, script errors detected"
