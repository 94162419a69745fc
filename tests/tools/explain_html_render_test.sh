#!/usr/bin/env bash
# Renders `loom explain --html` in headless Chromium (Debian's chromium package) and checks
# that the page's script ran without errors (it marks #status data-ok="1"; a script error
# sets data-ok="0", class "err" and "SCRIPT ERROR: <message>") and that every device of sim:4 shows in the lanes,
# the memory bars and both timelines (batch 1 and 32). A copy of the page with a broken
# script must be caught, so the check itself is tested. Then, at 2, 4 and 8 devices (and 8 in
# a narrow window), the laid-out boxes as Chromium measures them (getBoundingClientRect,
# written into the DOM by a script added to a copy of the page): no timeline segment or
# label outside its column (nothing clipped), no two labels overlapping, no label text cut,
# one label per AllReduce with its bytes and time, and a node table for every batch.
# Skips (exit 0) without chromium.
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

render() { # page [width] -> DOM after the scripts ran
    local prof
    prof=$(mktemp -d "$tmp/profile.XXXXXX")
    timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --window-size="${2:-1400},1000" --user-data-dir="$prof" --dump-dom "file://$1" 2>"$prof.log"
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
# the layout, measured: a script added after the page's own writes every timeline's boxes
measure_js='<script>(function(){function R(e){var r=e.getBoundingClientRect();return [r.left,r.top,r.right,r.bottom];}
var out=[];document.querySelectorAll("[id^=timeline]").forEach(function(T){var col=T.closest(".col");
out.push({id:T.id,col:R(col),tl:Array.from(T.querySelectorAll(".tl")).map(R),
seg:Array.from(T.querySelectorAll(".seg")).map(R),labs:R(T.querySelector(".tlabs")),
lab:Array.from(T.querySelectorAll(".tlab")).map(function(l){return {r:R(l),t:l.textContent,cut:l.scrollWidth>l.clientWidth+1,ar:l.classList.contains("arl")};})});});
var p=document.createElement("pre");p.id="measure";p.textContent=JSON.stringify(out);document.body.appendChild(p);})();</script>'
layout() { # devices width
    local n=$1 w=$2 pg="$tmp/p$1.html"
    "$loom" explain --devices "sim:$n" --batch 1,32 -q --html "$pg" >"$tmp/t$n.txt" || fail "explain sim:$n"
    { sed 's|</body></html>||' "$pg"; echo "$measure_js</body></html>"; } >"$tmp/m$n.html"
    render "$tmp/m$n.html" "$w" >"$tmp/m$n.dom.html"
    python3 - "$tmp/m$n.dom.html" "$tmp/t$n.txt" "sim:$n at $w px" <<'PY' || fail "layout of sim:$n at $w px"
import html, json, re, sys
dom, txt, what = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
bad = []
m = re.search(r'<pre id="measure">(.*?)</pre>', dom, re.S)
if not m:
    sys.exit("FAIL %s: no measurement (did the page's script run?)" % what)
tls = json.loads(html.unescape(m.group(1)))
ars = [int(x) for x in re.findall(r"^allreduces = (\d+)$", txt, re.M)]
if len(tls) != 2 or len(ars) != 2:
    sys.exit("FAIL %s: %d timelines, %d batches in the text" % (what, len(tls), len(ars)))
E = 0.5
def inside(r, c):
    return r[0] >= c[0] - E and r[2] <= c[2] + E
for t, want_ar in zip(tls, ars):
    col = t["col"]
    for r in t["tl"]:
        if not inside(r, col):
            bad.append("%s: a lane %s leaves its column %s" % (t["id"], r, col))
    tl_right = max(r[2] for r in t["tl"])
    segs = t["seg"]
    if not segs or any(s[2] > tl_right + E for s in segs):
        bad.append("%s: a segment ends past its lane" % t["id"])
    if segs and abs(max(s[2] for s in segs) - tl_right) > 1.5:
        bad.append("%s: the pass ends at %.1f, the lane at %.1f" % (t["id"], max(s[2] for s in segs), tl_right))
    labs = t["lab"]
    if not inside(t["labs"], col):
        bad.append("%s: the label area leaves its column" % t["id"])
    for l in labs:
        if not inside(l["r"], t["labs"]) or l["r"][2] - l["r"][0] <= 0:
            bad.append("%s: label %r at %s leaves the label area %s" % (t["id"], l["t"], l["r"], t["labs"]))
        if l["cut"]:
            bad.append("%s: label %r is cut" % (t["id"], l["t"]))
    for i in range(len(labs)):
        for j in range(i + 1, len(labs)):
            a, b = labs[i]["r"], labs[j]["r"]
            if min(a[2], b[2]) - max(a[0], b[0]) > E and min(a[3], b[3]) - max(a[1], b[1]) > E:
                bad.append("%s: labels %r and %r overlap" % (t["id"], labs[i]["t"], labs[j]["t"]))
    arl = [l["t"] for l in labs if l["ar"]]
    if len(arl) != want_ar:
        bad.append("%s: %d AllReduce labels, the text says %d" % (t["id"], len(arl), want_ar))
    for a in arl:
        if not re.fullmatch(r"AR [0-9.]+ (B|KiB|MiB) [0-9.]+ (us|ms)", a):
            bad.append("%s: AllReduce label %r lacks bytes or time" % (t["id"], a))
    if len(labs) != len(segs) // max(1, len(t["tl"])):
        bad.append("%s: %d labels for %d segments" % (t["id"], len(labs), len(segs) // len(t["tl"])))
tables = re.findall(r'<table class="t" data-batch="(\d+)">(.*?)</table>', dom, re.S)
nodes = [int(x) for x in re.findall(r"^graph nodes = (\d+)$", txt, re.M)]
if [int(b) for b, _ in tables] != [1, 32]:
    bad.append("node tables for batches %s, want 1 and 32" % [b for b, _ in tables])
for (b, body), n in zip(tables, nodes):
    if body.count("<tr>") - 1 != n:
        bad.append("node table of batch %s: %d rows, the text says %d nodes" % (b, body.count("<tr>") - 1, n))
for x in bad:
    print("FAIL %s: %s" % (what, x))
print("%s: %d timelines, %d labels, no overlap" % (what, len(tls), sum(len(t["lab"]) for t in tls)))
sys.exit(1 if bad else 0)
PY
}
layout 2 1400
layout 4 1400
layout 8 1400
layout 8 900

# the layout check itself catches overlapping labels: every label moved to the same place
sed 's|ends\[k\]+4>left|false|' "$tmp/p4.html" >"$tmp/overlap.html"
{ sed 's|</body></html>||' "$tmp/overlap.html"; echo "$measure_js</body></html>"; } >"$tmp/mo.html"
render "$tmp/mo.html" 1400 >"$tmp/mo.dom.html"
grep -q '"cut"' "$tmp/mo.dom.html" || fail "no measurement of the altered page"
python3 - "$tmp/mo.dom.html" <<'PY' || fail "labels forced into one track were not seen to overlap"
import html, json, re, sys
tls = json.loads(html.unescape(re.search(r'<pre id="measure">(.*?)</pre>', open(sys.argv[1]).read(), re.S).group(1)))
labs = tls[0]["lab"]
hit = any(min(a["r"][2], b["r"][2]) - max(a["r"][0], b["r"][0]) > 0.5 and min(a["r"][3], b["r"][3]) - max(a["r"][1], b["r"][1]) > 0.5
          for i, a in enumerate(labs) for b in labs[i + 1:])
sys.exit(0 if hit else 1)
PY
echo "PASS: rendered, 4 devices shown, script errors detected; timelines at 2, 4, 8 devices unclipped, labels apart"
