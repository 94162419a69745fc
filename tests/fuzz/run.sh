#!/usr/bin/env bash
# Builds the GGUF fuzz target with clang's libFuzzer (Debian's clang + libclang-rt) and runs
# it for a bounded time (default 60 s; FUZZ_SECONDS overrides), seeded with GGUF files
# written by loom's own writer and the shared models when present. Exit 0 if no crash.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
secs=${FUZZ_SECONDS:-60}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
CC=${CC_FUZZ:-clang}
if ! command -v "$CC" >/dev/null; then echo "fuzz: $CC not found, skipping"; exit 0; fi
"$CC" -g -O1 -std=c11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root" "$root"/core/*.c "$root"/gguf/*.c "$root/tests/fuzz/gguf_fuzz.c" \
  -lpthread -lm -o "$out/gguf_fuzz"
mkdir -p "$out/corpus"
# seeds: small real files if present (the big-vocab ones are too slow to mutate usefully)
models=${LOOM_MODELS_DIR:-$root/../shared/models}
[ -f "$models/stories260K.gguf" ] && head -c 65536 "$models/stories260K.gguf" > "$out/corpus/stories_head"
printf 'GGUF\003\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000' > "$out/corpus/empty"
"$out/gguf_fuzz" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 "$out/corpus" 2>&1 | tail -5
