#!/usr/bin/env bash
# Builds the tokenizer fuzz target with clang's libFuzzer and runs it for a bounded time
# (default 60 s; FUZZ_SECONDS overrides) over the shared test vocabularies, seeded with their
# .inp texts. Exit 0 if no crash; skips when clang or the models are missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
secs=${FUZZ_SECONDS:-60}
models=${LOOM_MODELS_DIR:-$root/../shared/models}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
CC=${CC_FUZZ:-clang}
if ! command -v "$CC" >/dev/null; then echo "fuzz: $CC not found, skipping"; exit 0; fi
if [ ! -f "$models/ggml-vocab-gpt-2.gguf" ]; then echo "fuzz: no vocabularies in $models, skipping"; exit 0; fi
"$CC" -g -O1 -std=c11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root" "$root"/core/*.c "$root"/gguf/*.c "$root"/model/tokenizer.c \
  "$root"/model/bpe.c "$root"/model/pretok.c "$root"/model/wpm.c "$root/tests/fuzz/tokenizer_fuzz.c" \
  -lpcre2-8 -lpthread -lm -ldl -o "$out/tokenizer_fuzz"
mkdir -p "$out/corpus"
i=0
for f in "$models"/*.inp; do
  awk -v d="$out/corpus" -v k="$i" 'BEGIN{RS="\n__ggml_vocab_test__\n"} {f=sprintf("%s/%s_%d", d, k, NR); printf "%c%s", NR%96, $0 > f; close(f)}' "$f"
  i=$((i + 1))
done
LOOM_MODELS_DIR="$models" "$out/tokenizer_fuzz" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 \
  "$out/corpus" 2>&1 | tail -5
