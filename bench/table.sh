#!/usr/bin/env bash
# The per-type table of bench/README.md (issue 28), regenerated: for each weight type and
# layer count, a TinyLlama-shaped file from bench/synth_model, then
#   loom bench  pp512, tg128 and tg128 at depth 512 (t/s; -t THREADS, -r REPS, F16 K/V),
#               its peak RSS (GNU time, the whole run),
#   gen_bench   context switches, cores held and CPU milliseconds (cores held / t/s) per
#               generated token (medians of 3 x 128; CPU time per token is the figure a
#               loaded machine disturbs least),
#   llama-bench (with --llama ROOT, a root from scripts/ggml-sandbox.sh, entered) the same
#               pp512/tg128/tg128@d512 on the same file, and loom / llama.cpp ratios.
# Figures only (nothing is asserted); prints a markdown table with the date, the machine
# and the load average before and after. Every run of a type is back to back; with
# --interleave A,B it runs the loom columns once per environment setting A and B in turn
# (e.g. LOOM_CPU_REPACK=0,LOOM_CPU_REPACK=1) and prints a row per setting. --busy N runs N
# spinning processes beside every run of the row, llama-bench's included (the competing
# load of issue 28; the 'busy' column).
#
#   bench/table.sh [-l 2,22] [-T q4_0,q8_0,q4_K,iq4_nl] [-t 2] [-r 2] [--dir /tmp]
#                  [--llama /var/tmp/loom-ggml-root] [--interleave ENV1,ENV2] [--busy N] [--small]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
layers=2 types=q4_0,q8_0,q4_K,iq4_nl threads=2 reps=2 dir=/tmp llama= interleave=- small=0 busy=0
while [ $# -gt 0 ]; do
    case $1 in
    -l) layers=$2; shift ;;
    -T) types=$2; shift ;;
    -t) threads=$2; shift ;;
    -r) reps=$2; shift ;;
    --dir) dir=$2; shift ;;
    --llama) llama=$2; shift ;;
    --interleave) interleave=$2; shift ;;
    --busy) busy=$2; shift ;;
    --small) small=1 ;;
    *) echo "usage: bench/table.sh [-l LAYERS] [-T TYPES] [-t N] [-r N] [--dir D] [--llama ROOT] [--interleave E1,E2] [--busy N] [--small]" >&2; exit 2 ;;
    esac
    shift
done
pp=512 tg=128 depth=512 gen=128
if [ $small = 1 ]; then pp=32 tg=8 depth=16 gen=8 reps=1; fi
bazel build -c opt //bench:synth_model //bench:gen_bench //tools:loom >/dev/null 2>&1 || {
    echo "table.sh: cannot build //bench:synth_model //bench:gen_bench //tools:loom" >&2
    exit 1
}
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
if [ -n "$llama" ] && [ ! -x "$llama/usr/bin/llama-bench" ]; then
    echo "table.sh: no llama-bench in $llama (scripts/ggml-sandbox.sh ROOT --enter first)" >&2
    exit 1
fi

# "pp tg tgd" t/s from loom bench's (or llama-bench's) csv on stdin
tps() {
    awk -F, -v depth=$depth '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        { gsub(/"/, "") }
        { p = $col["n_prompt"]; g = $col["n_gen"]; d = $col["n_depth"]; t = $col["avg_ts"] }
        p > 0 && g == 0 && d == 0 { pp = t }
        p == 0 && g > 0 && d == 0 { tg = t }
        p == 0 && g > 0 && d == depth { tgd = t }
        END { printf "%.1f %.1f %.1f\n", pp, tg, tgd }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "-" }'; }

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
hdr='| layers | type | env | busy | size MiB | pp512 t/s | tg128 t/s | tg128@d512 t/s | csw/token | cores held | CPU ms/token | peak RSS MiB | load |'
sep='|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|'
if [ -n "$llama" ]; then
    hdr="$hdr llama.cpp pp / tg / tg@d512 | loom/llama.cpp pp / tg / tg@d512 |"
    sep="$sep---|---|"
fi
echo "$hdr"
echo "$sep"
IFS=, read -r -a envs <<<"$interleave"
rc=0
# the competing load: N processes that spin until killed
busy_pids=()
busy_start() {
    local i
    for ((i = 0; i < busy; i++)); do
        (while :; do :; done) &
        busy_pids+=($!)
    done
}
busy_stop() {
    [ ${#busy_pids[@]} -eq 0 ] || kill "${busy_pids[@]}" 2>/dev/null
    wait "${busy_pids[@]}" 2>/dev/null
    busy_pids=()
}
trap busy_stop EXIT
for L in ${layers//,/ }; do
    for T in ${types//,/ }; do
        f=$dir/tl$L-$T.gguf
        if [ ! -f "$f" ]; then
            "$bin/bench/synth_model" "$f" --type "$T" --layers "$L" >/dev/null 2>&1 || {
                echo "table.sh: synth_model $T $L layers failed" >&2
                continue
            }
        fi
        size=$(awk -v b="$(stat -c %s "$f")" 'BEGIN { printf "%.0f", b / 1048576 }')
        lcols=
        busy_start
        if [ -n "$llama" ]; then
            # a hard link where the root is on the same file system: both engines then read
            # the same page cache (a fresh copy's cache is made of the small folios the
            # writes left; a file read cold gets large ones, mapped with 2 MiB pages)
            mkdir -p "$llama/tmp/loom-table" &&
                { ln -f "$f" "$llama/tmp/loom-table/" 2>/dev/null || cp "$f" "$llama/tmp/loom-table/"; } &&
                read -r lpp ltg ltgd < <(chroot "$llama" llama-bench -m "/tmp/loom-table/$(basename "$f")" \
                    -t "$threads" -p $pp -n $tg -d 0,$depth -r "$reps" -o csv 2>/dev/null | tps)
            rm -f "$llama/tmp/loom-table/$(basename "$f")"
        fi
        for e in "${envs[@]}"; do
            envv=()
            [ "$e" != - ] && envv=("$e")
            rss=$(mktemp)
            read -r bpp btg btgd < <(env "${envv[@]}" /usr/bin/time -f '%M' -o "$rss" "$bin/tools/loom" bench -m "$f" \
                -t "$threads" -p $pp -n $tg -d 0,$depth -r "$reps" -ctk f16 -ctv f16 -o csv 2>/dev/null | tps)
            if [ "$bpp" = 0.0 ] || [ "$btg" = 0.0 ] || [ "$btgd" = 0.0 ]; then
                echo "table.sh: loom bench gave no figure for $f ($e)" >&2
                rc=1
            fi
            peak=$(awk '{ printf "%.0f", $1 / 1024 }' "$rss")
            rm -f "$rss"
            read -r csw cores cpums < <(env "${envv[@]}" "$bin/bench/gen_bench" -m "$f" -t "$threads" -n $gen -r 3 2>/dev/null |
                awk '/^median:/ { printf "%s %s %.2f\n", $4, $7, ($2 > 0 ? 1000 * $7 / $2 : 0) }')
            row="| $L | $T | $e | $busy | $size | $bpp | $btg | $btgd | ${csw:--} | ${cores:--} | ${cpums:--} | $peak | $(cut -d' ' -f1 /proc/loadavg) |"
            if [ -n "$llama" ]; then
                row="$row $lpp / $ltg / $ltgd | $(ratio "$bpp" "$lpp") / $(ratio "$btg" "$ltg") / $(ratio "$btgd" "$ltgd") |"
            fi
            echo "$row"
        done
        busy_stop
    done
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
