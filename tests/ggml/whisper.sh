#!/usr/bin/env bash
# whisper.cpp over loom's ggml backend: the unmodified packaged whisper-cli (Debian testing
# whisper.cpp-tools, on the same libggml0 0.27) transcribes a short generated WAV with a tiny
# random-weight whisper model (tests/ggml/gen_whisper.py: F32, F16, Q8_0) greedily, once on
# ggml's CPU (-ng) and once on LOOM0, and the two transcripts must agree token by token
# (ids, and probabilities within 0.05 in log space, 0.1 for Q8_0; tests/ggml/whisper_cmp.py).
# Checks:
#   F32 over sim:1, sim:2, sim:3; F16 and Q8_0 over sim:2 (all -nfa: attention as
#   MUL_MAT + SOFT_MAX); F32 with flash attention over sim:2; LOOM0 ran the model's matmuls,
#   layer norms and GELUs (LOOM_GGML_STATS), and no op but the convolutions' was refused
#   (LOOM_GGML_DEBUG): IM2COL, which loom lacks, and with F16 convolution weights (the F16
#   and Q8_0 files) the matmul over IM2COL's F16 columns (loom's MUL_MAT takes F32
#   activations); ggml's CPU runs those.
# Run by tests/ggml/run.sh inside the root it entered (scripts/ggml-sandbox.sh DIR --enter);
# alone: tests/ggml/whisper.sh [--cases FILE] with the same root entered. Each check is a line
# "ggml: ok|FAILED: whisper ..."; exits non-zero if any failed.
#   LOOM_GGML_SANDBOX  the root (default /var/tmp/loom-ggml-root)
#   LOOM_GGML_PREFIX   where loom is installed in it (default /opt/loom)
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
dir=${LOOM_GGML_SANDBOX:-/var/tmp/loom-ggml-root}
prefix=${LOOM_GGML_PREFIX:-/opt/loom}
cases=/dev/null
[ "${1:-}" = --cases ] && cases=$2
fails=0
record() { # status name
    printf '%s\tggml: whisper %s\n' "$1" "$2" >>"$cases"
    if [ "$1" = passed ]; then echo "ggml: ok: whisper $2"; else echo "ggml: FAILED: whisper $2"; fails=$((fails + 1)); fi
}

if ! chroot "$dir" sh -c 'command -v whisper-cli' >/dev/null 2>&1; then
    record failed "whisper-cli not in $dir (scripts/ggml-sandbox.sh installs whisper.cpp-tools)"
    exit 1
fi
echo "ggml: whisper.cpp $(chroot "$dir" dpkg-query -W -f='${Version}' whisper.cpp-tools 2>/dev/null)"

work=/tmp/loom-ggml-test/whisper
rm -rf "${dir:?}$work"
mkdir -p "$dir$work"
for t in f32 f16 q8_0; do
    python3 tests/ggml/gen_whisper.py "$dir$work/tiny-$t.bin" $t ||
        record failed "write the $t model (tests/ggml/gen_whisper.py)"
done
python3 tests/ggml/gen_whisper.py --wav "$dir$work/tone.wav" || record failed "write the WAV"

# transcribe NAME SPEC MODEL ARGS...: greedy (beam 1, best of 1, no temperature fallback), no
# timestamps (so every step is a text token), the full JSON to $work/NAME.json
transcribe() {
    local name=$1 spec=$2 model=$3
    shift 3
    chroot "$dir" env GGML_BACKEND_PATH=$prefix/lib/libggml-loom.so LOOM_GGML_DEVICES="$spec" \
        LOOM_GGML_STATS=1 LOOM_GGML_DEBUG=1 timeout 300 whisper-cli -m $work/tiny-$model.bin \
        -f $work/tone.wav -t 2 -bs 1 -bo 1 -nf -nt -ojf -of $work/$name "$@" \
        >"$dir$work/$name.log" 2>&1
}
# same_tokens MODEL SPEC ATTN [TOL]: LOOM0 over SPEC against ggml's CPU, ATTN -nfa or -fa,
# log-probabilities within TOL (default 0.05)
declare -A cpu_done
same_tokens() {
    local model=$1 spec=$2 attn=$3 tol=${4:-0.05} cpu=cpu-$1$3 name=loom-$1-$2$3 why rc
    name=${name//:/}
    if [ -z "${cpu_done[$cpu]:-}" ]; then
        transcribe "$cpu" sim:1 "$model" -ng "$attn"
        cpu_done[$cpu]=$?
    fi
    transcribe "$name" "$spec" "$model" "$attn"
    rc=$?
    local label="$model $spec $attn"
    if [ "${cpu_done[$cpu]}" != 0 ] || [ $rc -ne 0 ]; then
        record failed "$label: whisper-cli failed (CPU rc ${cpu_done[$cpu]}, LOOM0 rc $rc): $(grep -a -m3 'loom-ggml: LOOM0:\|error' "$dir$work/$name.log" "$dir$work/$cpu.log" | tr '\n' ' ')"
        return
    fi
    if ! why=$(python3 tests/ggml/whisper_cmp.py "$dir$work/$cpu.json" "$dir$work/$name.json" "$tol"); then
        record failed "$label: $why"
        return
    fi
    # it ran on LOOM0: the model's matmuls, norms and GELUs, and nothing was refused but the
    # convolutions (IM2COL, and with F16 convolution weights their matmul over F16 columns)
    local ran refused
    ran=$(grep -a 'LOOM0 ran' "$dir$work/$name.log")
    refused=$(grep -a 'LOOM0 refuses' "$dir$work/$name.log" |
        grep -av 'refuses IM2COL\|refuses MUL_MAT .*b must be f32, not f16' | head -3 | tr '\n' ' ')
    if grep -q 'MUL_MAT [1-9]' <<<"$ran" && grep -q 'NORM [1-9]' <<<"$ran" &&
        grep -q 'GELU [1-9]' <<<"$ran" && [ -z "$refused" ]; then
        record passed "$label: the CPU's tokens ($why)"
    else
        record failed "$label: tokens agree but LOOM0 did not run the model: '$ran' $refused"
    fi
}
same_tokens f32 sim:1 -nfa
same_tokens f32 sim:2 -nfa
same_tokens f32 sim:3 -nfa
same_tokens f16 sim:2 -nfa
# Q8_0 matmuls are rounded differently by ggml's CPU (repacked Q8_0, its activation blocks)
# and loom's kernels: log-probabilities differ by up to 0.045 here, as noise of both signs
# (F32: 0.002), so 0.1
same_tokens q8_0 sim:2 -nfa 0.1
same_tokens f32 sim:2 -fa
if grep -aq 'FLASH_ATTN_EXT [1-9]' "$dir$work/loom-f32-sim2-fa.log"; then
    record passed "f32 sim:2 -fa: flash attention ran on LOOM0"
else
    record failed "f32 sim:2 -fa: no FLASH_ATTN_EXT on LOOM0: $(grep -a 'LOOM0 ran' "$dir$work/loom-f32-sim2-fa.log")"
fi
# whisper's file is no GGUF: the bridge says it has no split table (tensors kept whole)
if grep -aq "tiny-f32.bin is a legacy ggml model file (whisper.cpp's format), not a GGUF: no split table" \
    "$dir$work/loom-f32-sim2-nfa.log"; then
    record passed "the model file is named as whisper.cpp's format, without a split table"
else
    record failed "no line about the split table: $(grep -a -m2 'loom-ggml' "$dir$work/loom-f32-sim2-nfa.log" | tr '\n' ' ')"
fi
grep -ah 'LOOM0 ran\|LOOM0 stats' "$dir$work/loom-f32-sim2-nfa.log"
[ $fails -eq 0 ]
