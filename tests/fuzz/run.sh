#!/usr/bin/env bash
# Builds loom's libFuzzer targets with clang (Debian's clang + libclang-rt) and runs each for
# a bounded time: FUZZ_SECONDS (default 60) split evenly between them. Targets:
#   gguf       the GGUF reader, seeded with the start of stories260K and an empty file
#   rules      the split-rules parser + split-state computation over llama-shaped weights
#   tokenizer  arbitrary bytes through the SentencePiece (llama) and BPE (gpt-2) vocabs
#   model      hyperparameter validation through one CPU forward pass on a tiny model
#   quant      the block types' integer dots on every SIMD table: hostile scales, NaN/Inf
# FUZZ_TARGETS (space-separated) picks a subset. The vocab-based target is skipped when the
# shared models are missing. Exit 0 if no target crashed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
secs=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-gguf rules tokenizer model quant}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
CC=${CC_FUZZ:-clang}
if ! command -v "$CC" >/dev/null; then echo "fuzz: $CC not found, skipping"; exit 0; fi
models=${LOOM_MODELS_DIR:-$root/../shared/models}
flags=(-g -O1 -std=c11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root")
srcs() { # the non-test C files of the given package dirs
    for d in "$@"; do
        for f in "$root/$d"/*.c; do
            case $f in *_test.c | *_test_util.c | */module.c) ;; *) echo "$f" ;; esac
        done
    done
}
n=0
for t in $targets; do n=$((n + 1)); done
per=$((secs / n))
[ "$per" -ge 1 ] || per=1
rc=0
for t in $targets; do
    corpus="$out/corpus-$t"
    mkdir -p "$corpus"
    env_vars=()
    case $t in
    gguf)
        # shellcheck disable=SC2046
        "$CC" "${flags[@]}" $(srcs core gguf) "$root/tests/fuzz/gguf_fuzz.c" -lpthread -lm -o "$out/$t"
        # small real files only (the big-vocab ones are too slow to mutate usefully)
        [ -f "$models/stories260K.gguf" ] && head -c 65536 "$models/stories260K.gguf" > "$corpus/stories_head"
        printf 'GGUF\003\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000' > "$corpus/empty"
        ;;
    rules)
        # shellcheck disable=SC2046
        "$CC" "${flags[@]}" $(srcs core splitstate) "$root/rules/rules.c" "$root/tests/fuzz/rules_fuzz.c" \
            -lpcre2-8 -lpthread -lm -o "$out/$t"
        printf '\003\004\010\002\001\000\000\000\000blk\\.\\d+\\.ffn_down\\.weight mirrored\nblk\\.\\d+\\.attn_q\\.weight 1 qgroup\n' > "$corpus/override"
        printf '\007\005\006\003\000\001\000\000\000output\\.weight 0 32\ncache_[kv]_l\\d+ 0 kvhead\n(a|b)+ 2 head\n' > "$corpus/axes"
        ;;
    tokenizer)
        spm="$models/ggml-vocab-llama-spm.gguf" bpe="$models/ggml-vocab-gpt-2.gguf"
        if [ ! -f "$spm" ] || [ ! -f "$bpe" ]; then echo "fuzz: $t: no shared vocabs, skipping"; continue; fi
        env_vars=(LOOM_MODELS_DIR="$models")
        # shellcheck disable=SC2046
        "$CC" "${flags[@]}" $(srcs core gguf) "$root"/model/{tokenizer,bpe,pretok,wpm}.c \
            "$root/tests/fuzz/tokenizer_fuzz.c" -lpcre2-8 -lpthread -lm -o "$out/$t"
        printf '\000Once upon a time, there was a little girl.' > "$corpus/spm"
        printf '\201Hello world!\n\tcode: x = 1; // \303\251t\303\251 \360\237\230\200' > "$corpus/bpe"
        ;;
    model)
        # shellcheck disable=SC2046
        # the scalar kernels only: clang 14 cannot test for f16c with __builtin_cpu_supports
        "$CC" "${flags[@]}" '-D__builtin_cpu_supports(x)=0' $(srcs core gguf backends backends/cpu topo) \
            $(srcs model | grep -v '/session\.c$') \
            "$root/tests/fuzz/model_fuzz.c" -lpcre2-8 -lhwloc -ldl -lpthread -lm -o "$out/$t"
        printf '\000\000\000\000\000\000\000\000' > "$corpus/dense"
        printf '\002\001\001\001\021\001\001\003\013\004\000\000\000\000\000\000\200\177' > "$corpus/moe_inf_base"
        ;;
    quant)
        # shellcheck disable=SC2046
        "$CC" "${flags[@]}" '-D__builtin_cpu_supports(x)=0' $(srcs core backends backends/cpu topo) \
            "$root/tests/fuzz/quant_fuzz.c" -lhwloc -ldl -lpthread -lm -o "$out/$t"
        printf '\000\001' > "$corpus/q4_1_zero"
        printf '\011\002\000\176\000\174' > "$corpus/q6_K_nan_scale"
        ;;
    *) echo "fuzz: unknown target '$t'"; rc=1; continue ;;
    esac
    echo "==== fuzz $t ($per s)"
    if ! env "${env_vars[@]}" "$out/$t" -max_total_time="$per" -max_len=65536 -rss_limit_mb=2048 \
        -timeout=20 -artifact_prefix="$out/$t-" "$corpus" >"$out/$t.log" 2>&1; then
        echo "fuzz: $t FAILED"
        tail -40 "$out/$t.log"
        # keep the reproducer where CI can find it (FUZZ_ARTIFACTS, default: not kept)
        if [ -n "${FUZZ_ARTIFACTS:-}" ]; then mkdir -p "$FUZZ_ARTIFACTS" && cp "$out/$t-"* "$FUZZ_ARTIFACTS"/ 2>/dev/null || true; fi
        rc=1
    else
        tail -3 "$out/$t.log"
    fi
done
exit $rc
