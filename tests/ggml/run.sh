#!/usr/bin/env bash
# loom's ggml backend against the unmodified packaged llama.cpp 0.7.0 / ggml 0.27.0 (Debian
# testing), in the root scripts/ggml-sandbox.sh makes. Checks:
#   1. llama-completion --list-devices lists LOOM0 (members, memory) and LOOM0.j with
#      LOOM_GGML_MEMBERS=1; a bad spec or rules file is a message, never a crash;
#   2. greedy text through -dev LOOM0 equals -dev none (ggml's CPU) on stories260K with
#      LOOM_GGML_DEVICES = sim:1..4, and on loom's generated model of every architecture case
#      (tests/model/arch_cases.c: dense, MoE, sliding window, sinks, biases), F32 and Q8_0,
#      over sim:2 and sim:3; the graph is split in 2 (LOOM0 and the CPU) for stories260K;
#      sim:N with N > 1 reduces (LOOM_GGML_STATS), so the text came through tensor parallelism;
#   3. test-backend-ops -b LOOM0 (mode test) on the ops of a llama-family graph over sim:1 and
#      sim:2: no FAIL; the OK / not supported counts per op are printed;
#   4. llama-bench -dev LOOM0 and llama-server -dev LOOM0 (one completion over loopback);
#   4b. whisper.cpp's whisper-cli over LOOM0 gives ggml's CPU tokens on a generated tiny
#      model (tests/ggml/whisper.sh: F32 over sim:1..3, F16, Q8_0, flash attention);
#   5. the bridge built with ASan+UBSan runs a model, test-backend-ops and whisper-cli clean;
#   6. tests/ggml/bench.sh --small prints the speed figures (nothing asserted on time).
# Each check is a line "ggml: ok|FAILED: ..."; with --cases FILE each is also written there as
# "passed|failed<TAB>name" (.ci/run counts them). Exits non-zero if any failed.
#   LOOM_GGML_SANDBOX  the root (default /var/tmp/loom-ggml-root; reused when it exists)
#   LOOM_GGML_QUICK=1  fewer test-backend-ops ops (for a quick look)
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
root=$(pwd)
dir=${LOOM_GGML_SANDBOX:-/var/tmp/loom-ggml-root}
cases=/dev/null
[ "${1:-}" = --cases ] && cases=$2
models_dir=${LOOM_MODELS_DIR:-$root/../shared/models}
fails=0

record() { # status name
    printf '%s\tggml: %s\n' "$1" "$2" >>"$cases"
    if [ "$1" = passed ]; then echo "ggml: ok: $2"; else echo "ggml: FAILED: $2"; fails=$((fails + 1)); fi
}

if ! ./scripts/ggml-sandbox.sh "$dir" --enter; then
    record failed "sandbox set-up (scripts/ggml-sandbox.sh)"
    exit 1
fi
trap './scripts/ggml-sandbox.sh "$dir" --leave' EXIT

work=/tmp/loom-ggml-test
rm -rf "${dir:?}$work"
mkdir -p "$dir$work/arch"
in_root() { chroot "$dir" env GGML_BACKEND_PATH=/opt/loom/lib/libggml-loom.so "$@"; }

# ---------------------------------------------------------------- models
have_stories=0
if [ -f "$models_dir/stories260K.gguf" ]; then
    cp "$models_dir/stories260K.gguf" "$dir$work/"
    have_stories=1
else
    echo "ggml: note: no stories260K.gguf in $models_dir (LOOM_MODELS_DIR): its checks skipped"
fi
if bazel build -c opt //tests/model:arch_gguf_gen >/dev/null 2>&1; then
    gen=$(bazel info -c opt bazel-bin 2>/dev/null)/tests/model/arch_gguf_gen
    "$gen" "$dir$work/arch" >/dev/null && "$gen" "$dir$work/arch" q8_0 >/dev/null ||
        record failed "write the architecture models (arch_gguf_gen)"
else
    record failed "build //tests/model:arch_gguf_gen"
fi

# ---------------------------------------------------------------- 1. devices
out=$(in_root LOOM_GGML_DEVICES="sim:2;sim:3" LOOM_GGML_MEMBERS=1 llama-completion --list-devices 2>&1)
# The module's default sim reg holds SIM0, SIM1: the specs' devices continue the numbering.
if grep -q 'LOOM0: loom meta device over SIM2,SIM3 (sim:2) ([0-9]* MiB' <<<"$out" &&
    grep -q 'LOOM1: loom meta device over SIM4,SIM5,SIM6 (sim:3)' <<<"$out" &&
    grep -q 'LOOM0.1: loom device' <<<"$out"; then
    record passed "--list-devices lists LOOM0, LOOM1 and the members"
else
    record failed "--list-devices: $out"
fi
out=$(in_root LOOM_GGML_DEVICES="bogus:2" llama-completion --list-devices 2>&1)
rc=$?
if [ $rc -eq 0 ] && grep -q "unknown device kind 'bogus'" <<<"$out" && ! grep -q '^  LOOM0:' <<<"$out"; then
    record passed "an unknown spec is named and gives no device"
else
    record failed "unknown spec (rc $rc): $out"
fi
printf 'blk\\..*\\.attn_q\\.weight  sideways\n' >"$dir$work/bad.rules"
out=$(in_root LOOM_GGML_DEVICES=sim:2 LOOM_GGML_SPLIT_RULES=$work/bad.rules llama-completion --list-devices 2>&1)
rc=$?
if [ $rc -eq 0 ] && grep -q "bad.rules:1" <<<"$out" && ! grep -q '^  LOOM0:' <<<"$out"; then
    record passed "a rules file that does not parse is named and gives no device"
else
    record failed "bad rules file (rc $rc): $out"
fi

# ---------------------------------------------------------------- 2. greedy text
# complete SPEC DEV MODEL N: the generated text (stdout) of one greedy run
complete() {
    in_root LOOM_GGML_DEVICES="$1" LOOM_GGML_STATS=1 timeout 300 llama-completion -m "$3" \
        -p "Once upon a time" -n "$4" --temp 0 -s 1 -t 2 --no-warmup -dev "$2" \
        2>"$dir$work/last.err"
}
# probs_agree SPEC MODEL N: the log-probabilities of the greedy steps agree (tests/ggml/probs.py)
probs_agree() {
    local p1=$((18000 + RANDOM % 1000)) p2=$((19000 + RANDOM % 1000)) rc
    in_root LOOM_GGML_DEVICES="$1" timeout 300 llama-server -m "$2" -dev none --host 127.0.0.1 \
        --port $p1 -c 256 >/dev/null 2>&1 &
    local s1=$!
    in_root LOOM_GGML_DEVICES="$1" timeout 300 llama-server -m "$2" -dev LOOM0 --host 127.0.0.1 \
        --port $p2 -c 256 >/dev/null 2>&1 &
    local s2=$!
    python3 tests/ggml/probs.py $p1 $p2 "$3"
    rc=$?
    kill $s1 $s2 2>/dev/null
    wait $s1 $s2 2>/dev/null
    return $rc
}
# same_text SPEC MODEL N NAME: -dev LOOM0 against -dev none, retrying an output cut short
# (llama-completion sometimes loses its last bytes at exit, with or without loom)
same_text() {
    local spec=$1 model=$2 n=$3 name=$4 a b try
    for try in 1 2 3; do
        a=$(complete "$spec" none "$model" "$n")
        b=$(complete "$spec" LOOM0 "$model" "$n")
        [ "$a" = "$b" ] && break
        case $a in "$b"* | "") continue ;; esac
        case $b in "$a"* | "") continue ;; esac
        break
    done
    if [ -n "$a" ] && [ "$a" = "$b" ]; then
        record passed "$name: same greedy text as ggml's CPU"
    elif [ -n "$a" ] && [ -n "$b" ] && probs_agree "$spec" "$model" "$n"; then
        # random weights: a near-tie decided by the last bits of either engine's rounding
        record passed "$name: text differs only after a near-tie; log-probabilities agree"
    else
        record failed "$name: CPU '$a' vs LOOM0 '$b' ($(grep -m3 'loom-ggml' "$dir$work/last.err" | tr '\n' ' '))"
    fi
}
if [ $have_stories = 1 ]; then
    for n in 1 2 3 4; do
        same_text "sim:$n" $work/stories260K.gguf 48 "stories260K sim:$n"
        if [ $n -gt 1 ]; then
            if grep -q 'LOOM0 stats: .* [1-9][0-9]* allreduces' "$dir$work/last.err"; then
                record passed "stories260K sim:$n ran tensor parallel (allreduces)"
            else
                record failed "stories260K sim:$n: no allreduce ($(grep 'stats' "$dir$work/last.err"))"
            fi
        fi
    done
    # a member out of memory: a clear message and a clean failure of the engine, no crash
    out=$(in_root LOOM_GGML_DEVICES='sim:2,mem=64KiB' timeout 120 llama-completion \
        -m $work/stories260K.gguf -p "Once" -n 4 --temp 0 -dev LOOM0 -fit off 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && grep -q 'loom-ggml: LOOM0: cannot allocate .*out of memory' <<<"$out"; then
        record passed "a member out of memory is named; the engine fails cleanly"
    else
        record failed "member out of memory (rc $rc): $(grep -a 'loom-ggml\|error' <<<"$out" | head -3)"
    fi
    in_root LOOM_GGML_DEVICES=sim:2 llama-completion -m $work/stories260K.gguf -p "Once" -n 4 \
        --temp 0 -dev LOOM0 -v >/dev/null 2>"$dir$work/v.err"
    if grep -q 'graph: nodes = [0-9]*, splits = 2,' "$dir$work/v.err"; then
        record passed "stories260K fully offloaded: graph splits = 2"
    else
        record failed "graph splits: $(grep 'splits =' "$dir$work/v.err" | head -2 | tr '\n' ' ')"
    fi
fi
for f in "$dir$work"/arch/*.gguf; do
    [ -f "$f" ] || continue
    m=$work/arch/$(basename "$f")
    for spec in sim:2 sim:3; do
        same_text "$spec" "$m" 16 "$(basename "$f" .gguf) $spec"
    done
done

# one_word_more A B: B is A and at most one word more
one_word_more() { [ "${2#"$1"}" != "$2" ] && [ "$(wc -w <<<"${2#"$1"}")" -le 1 ]; }
# ggml's own split modes over loom's devices (LOOM_GGML_MEMBERS=1: LOOM0.0, LOOM0.1), and
# ggml's tensor split wrapping LOOM0 itself
if [ $have_stories = 1 ]; then
    want=$(complete sim:2 none $work/stories260K.gguf 32)
    for mode in "-sm tensor -dev LOOM0.0,LOOM0.1" "-sm layer -dev LOOM0.0,LOOM0.1" "-sm tensor -dev LOOM0"; do
        got="" rc=1
        for try in 1 2 3; do
            got=$(in_root LOOM_GGML_DEVICES=sim:2 LOOM_GGML_MEMBERS=1 timeout 300 llama-completion \
                -m $work/stories260K.gguf -p "Once upon a time" -n 32 --temp 0 -s 1 -t 2 \
                --no-warmup $mode 2>"$dir$work/mode.err")
            rc=$?
            [ "$got" = "$want" ] && break
        done
        # llama-completion may lose its last word at exit (with or without loom): a clean
        # exit whose text is the CPU's but for that last word counts
        if [ -n "$got" ] && [ $rc -eq 0 ] && { [ "$got" = "$want" ] ||
            one_word_more "$got" "$want" || one_word_more "$want" "$got"; }; then
            record passed "stories260K $mode: ggml's CPU text"
        else
            record failed "stories260K $mode: '$got' vs '$want' ($(grep -a -m2 'loom-ggml\|error' "$dir$work/mode.err" | tr '\n' ' '))"
        fi
    done
fi

# ---------------------------------------------------------------- 3. test-backend-ops
tbo=/usr/libexec/x86_64-linux-gnu/llama.cpp-tests/test-backend-ops
ops=(ADD MUL RMS_NORM SCALE SOFT_MAX ROPE GET_ROWS SET_ROWS CPY SWIGLU GEGLU CONT SILU ADD_ID
    ARGSORT MUL_MAT MUL_MAT_ID FLASH_ATTN_EXT)
[ "${LOOM_GGML_QUICK:-0}" = 1 ] && ops=(ADD MUL RMS_NORM SWIGLU)
for spec in sim:1 sim:2; do
    for op in "${ops[@]}"; do
        # the big ones in the shapes llama-family graphs use
        filt=()
        case $op in
        MUL_MAT) filt=(-p 'type_a=(f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_K|q3_K|q4_K|q5_K|q6_K|iq4_nl|iq4_xs|mxfp4),type_b=f32,.*n=(1|9),k=256') ;;
        MUL_MAT_ID) filt=(-p 'type_a=(f32|q8_0|q4_0|q4_K),type_b=f32,n_mats=4,n_used=(1|2|4),b=0,m=512,n=(1|16),k=256') ;;
        ROPE) filt=(-p 'type=f32,ne_a=\[(64|128),.*v=0,inplace=0') ;;
        FLASH_ATTN_EXT) filt=(-p 'hsk=64,hsv=64,nh=(4|8),.*kv=(113|512),nb=(1|3|8),.*type_K=(f16|q8_0)') ;;
        esac
        log="$dir$work/tbo-$spec-$op.log"
        in_root LOOM_GGML_DEVICES=$spec timeout 600 $tbo test -b LOOM0 -o "$op" "${filt[@]}" >"$log" 2>&1
        rc=$?
        # one line per case: "  OP(params): OK | FAIL | not supported [LOOM0,CPU]"
        okn=$(grep -ac '^  [A-Z_]*(.*): .*OK' "$log")
        failn=$(grep -ac '^  [A-Z_]*(.*): .*FAIL' "$log")
        nsn=$(grep -ac '^  [A-Z_]*(.*): .*not supported' "$log")
        echo "ggml: test-backend-ops $spec $op: $okn OK, $failn FAIL, $nsn not supported (rc $rc)"
        if [ "$failn" -eq 0 ] && [ $rc -eq 0 ]; then
            record passed "test-backend-ops $spec $op ($okn OK, $nsn not supported)"
        else
            record failed "test-backend-ops $spec $op: $(grep -m3 'FAIL' "$log" | tr '\n' ' ') (rc $rc)"
        fi
    done
done

# ---------------------------------------------------------------- 4. llama-bench, llama-server
if [ $have_stories = 1 ]; then
    out=$(in_root LOOM_GGML_DEVICES=sim:2 timeout 300 llama-bench -m $work/stories260K.gguf \
        -dev LOOM0 -p 32 -n 16 -r 2 -o csv 2>"$dir$work/bench.err")
    if grep -q 'LOOM0' <<<"$out" && [ "$(grep -c ',' <<<"$out")" -ge 3 ]; then
        record passed "llama-bench -dev LOOM0"
        echo "$out"
    else
        record failed "llama-bench -dev LOOM0: $out $(tail -3 "$dir$work/bench.err")"
    fi
    port=$((18000 + RANDOM % 2000))
    in_root LOOM_GGML_DEVICES=sim:2 timeout 120 llama-server -m $work/stories260K.gguf -dev LOOM0 \
        --host 127.0.0.1 --port $port -c 256 >"$dir$work/server.log" 2>&1 &
    spid=$!
    reply=$(python3 - "$port" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
body = json.dumps({"prompt": "Once upon a time", "n_predict": 16, "temperature": 0}).encode()
for _ in range(120):
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        print(json.loads(urllib.request.urlopen(req, timeout=60).read())["content"])
        break
    except Exception:
        time.sleep(0.5)
PY
)
    kill $spid 2>/dev/null
    wait $spid 2>/dev/null
    want=$(complete sim:2 none $work/stories260K.gguf 16)
    if [ -n "$reply" ] && [ "Once upon a time$reply" = "$want" -o " Once upon a time$reply" = "$want" ]; then
        record passed "llama-server -dev LOOM0 answers a completion with the CPU's text"
    else
        record failed "llama-server: '$reply' (the CPU: '$want') $(grep -m3 -i 'error\|loom-ggml' "$dir$work/server.log" | tr '\n' ' ')"
    fi
fi

# ---------------------------------------------------------------- 4b. whisper.cpp
out=$(LOOM_GGML_SANDBOX=$dir LOOM_GGML_PREFIX=/opt/loom bash tests/ggml/whisper.sh --cases "$cases" 2>&1)
echo "$out"
fails=$((fails + $(grep -c '^ggml: FAILED' <<<"$out")))

# ---------------------------------------------------------------- 5. the bridge under ASan+UBSan
# (loom's own code runs under the sanitizers in the Bazel configurations; this is the bridge's)
if chroot "$dir" env OUT=/opt/loom/lib/libggml-loom-san.so bash /opt/loom/src/ggml/build.sh \
    /opt/loom -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    -fno-omit-frame-pointer >"$dir$work/san-build.log" 2>&1; then
    san() {
        chroot "$dir" env GGML_BACKEND_PATH=/opt/loom/lib/libggml-loom-san.so \
            LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libasan.so.8 ASAN_OPTIONS=detect_leaks=0 \
            "$@"
    }
    out=$(san LOOM_GGML_DEVICES=sim:3 timeout 600 llama-completion -m $work/arch/gpt-oss-q8_0.gguf \
        -p "Once upon a time" -n 8 --temp 0 -dev LOOM0 2>&1)
    out2=$(san LOOM_GGML_DEVICES=sim:2 timeout 600 $tbo test -b LOOM0 -o SET_ROWS 2>&1)
    if grep -aq 'Once upon a time' <<<"$out" && ! grep -aq 'ERROR: AddressSanitizer\|runtime error' \
        <<<"$out$out2" && grep -aq 'tests passed' <<<"$out2"; then
        record passed "the bridge under ASan+UBSan: gpt-oss-q8_0 over sim:3, test-backend-ops SET_ROWS"
    else
        record failed "the bridge under ASan+UBSan: $(grep -a -m3 'ERROR\|runtime error\|FAIL' <<<"$out$out2")"
    fi
    # whisper.cpp's graphs (ggml_view_tensor, cross-attention, Q8_0 weights), on
    # the model tests/ggml/whisper.sh wrote
    wm=$work/whisper
    if [ -f "$dir$wm/tiny-q8_0.bin" ]; then
        out=$(san LOOM_GGML_DEVICES=sim:3 timeout 600 whisper-cli -m $wm/tiny-q8_0.bin \
            -f $wm/tone.wav -bs 1 -bo 1 -nf -nt -nfa -ojf -of $wm/san 2>&1)
        rc=$?
        if [ $rc -eq 0 ] && ! grep -aq 'ERROR: AddressSanitizer\|runtime error' <<<"$out" &&
            python3 tests/ggml/whisper_cmp.py "$dir$wm/cpu-q8_0-nfa.json" "$dir$wm/san.json" 0.1 \
            >/dev/null 2>&1; then
            record passed "the bridge under ASan+UBSan: whisper-cli q8_0 over sim:3, the CPU's tokens"
        else
            record failed "the bridge under ASan+UBSan: whisper-cli (rc $rc): $(grep -a -m3 'ERROR\|runtime error\|loom-ggml' <<<"$out")"
        fi
    fi
else
    record failed "ASan build of the bridge: $(tail -3 "$dir$work/san-build.log")"
fi

# ---------------------------------------------------------------- 6. speed (figures only)
if ! bash tests/ggml/bench.sh --small; then
    record failed "tests/ggml/bench.sh --small"
fi

echo "ggml: $fails failed"
[ $fails -eq 0 ]
