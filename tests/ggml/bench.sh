#!/usr/bin/env bash
# What the ggml bridge costs, in figures (a benchmark: nothing here is asserted on time).
# On a TinyLlama-shaped model of 2 layers (bench/synth_model, Q4_0) and on stories260K:
#   A  llama-bench -dev none            ggml 0.27's own CPU backend
#   B  llama-bench -dev LOOM0, cpu      loom's CPU device behind the bridge
#   C  llama-bench -dev LOOM0, sim:2    loom's meta device over 2 sim GPUs behind the bridge
#   D  loom bench --devices sim:2       the same meta device through loom's own session
# and prints pp/tg tokens/s with the ratios B/A and C/D (the bridge's overhead per token is
# 1 - C/D). Runs in the root tests/ggml/run.sh uses (LOOM_GGML_SANDBOX), which must be set
# up (scripts/ggml-sandbox.sh DIR --enter). --small: tiny sizes, for CI.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
dir=${LOOM_GGML_SANDBOX:-/var/tmp/loom-ggml-root}
pp=512 tg=128 reps=3 layers=2
if [ "${1:-}" = --small ]; then pp=32 tg=16 reps=1; fi
work=/tmp/loom-ggml-bench
mkdir -p "$dir$work"
bazel build -c opt //bench:synth_model //tools:loom >/dev/null 2>&1 || {
    echo "ggml bench: cannot build //bench:synth_model //tools:loom" >&2
    exit 1
}
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
models=()
if [ ! -f "$dir$work/tl2-q4_0.gguf" ]; then
    "$bin/bench/synth_model" "$dir$work/tl2-q4_0.gguf" --type q4_0 --layers $layers >/dev/null ||
        exit 1
fi
models+=("tl2-q4_0.gguf")
stories=${LOOM_MODELS_DIR:-../shared/models}/stories260K.gguf
if [ -f "$stories" ]; then
    cp "$stories" "$dir$work/" && models+=("stories260K.gguf")
fi

# tps CSV_LINE_FILTER: "pp tg" tokens/s from llama-bench's (or loom bench's) csv
tps() {
    python3 -c '
import csv, sys
rows = list(csv.DictReader(sys.stdin))
pp = [float(r["avg_ts"]) for r in rows if int(r["n_prompt"]) > 0 and int(r["n_gen"]) == 0]
tg = [float(r["avg_ts"]) for r in rows if int(r["n_gen"]) > 0 and int(r["n_prompt"]) == 0]
print(f"{pp[0] if pp else 0:.1f} {tg[0] if tg else 0:.1f}")'
}
llama_bench() { # SPEC DEV MODEL
    chroot "$dir" env GGML_BACKEND_PATH=/opt/loom/lib/libggml-loom.so LOOM_GGML_DEVICES="$1" \
        llama-bench -m "$work/$3" -dev "$2" -t 2 -p $pp -n $tg -r $reps -o csv 2>/dev/null | tps
}
printf '| model | ggml CPU pp/tg | LOOM0(cpu) pp/tg | B/A | LOOM0(sim:2) pp/tg | loom bench sim:2 pp/tg | C/D |\n'
printf '|---|---|---|---|---|---|---|\n'
for m in "${models[@]}"; do
    read -r apn atg < <(llama_bench sim:1 none "$m")
    read -r bpn btg < <(llama_bench cpu LOOM0 "$m")
    read -r cpn ctg < <(llama_bench sim:2 LOOM0 "$m")
    read -r dpn dtg < <("$bin/tools/loom" bench -m "$dir$work/$m" --devices sim:2 -t 2 -p $pp -n $tg \
        -r $reps -o csv 2>/dev/null | tps)
    ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}' if b else '-')" "$1" "$2"; }
    printf '| %s | %s / %s | %s / %s | %s / %s | %s / %s | %s / %s | %s / %s |\n' "$m" \
        "$apn" "$atg" "$bpn" "$btg" "$(ratio "$bpn" "$apn")" "$(ratio "$btg" "$atg")" \
        "$cpn" "$ctg" "$dpn" "$dtg" "$(ratio "$cpn" "$dpn")" "$(ratio "$ctg" "$dtg")"
done
