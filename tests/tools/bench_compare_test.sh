#!/usr/bin/env bash
# `loom bench` output read as llama.cpp's scripts/compare-llama-bench.py reads llama-bench's
# (bench_compare_check.py says which llama.cpp revision it restates): JSON, JSONL, CSV and
# SQL rows carry the fields it requires, with its column types (flash_attn the integer
# llama-bench writes: -1 auto, 0 off, 1 on), and its baseline/compare join pairs them; the
# markdown fa column shows the same integers and a prompt-only row shows "-" for the
# per-token AllReduces under a tensor split.
set -uo pipefail
loom="$1"
check="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
bench() { # FORMAT OUT ARGS...: loom bench on the built-in model, small
    local fmt=$1 out=$2
    shift 2
    "$loom" bench -p 4 -n 2 -r 1 -o "$fmt" "$@" >"$out" 2>"$out.err" || fail "loom bench -o $fmt $*: $(cat "$out.err")"
}

bench json "$tmp/a.json" --devices "cpu;sim:2" -sm tensor -fa 0,1
python3 "$check" json "$tmp/a.json" flash_attn_set=0,1 || fail "json"
bench jsonl "$tmp/a.jsonl" --devices sim:2 -ts "1/1;3/1"
python3 "$check" jsonl "$tmp/a.jsonl" flash_attn=-1 use_mmap=1 || fail "jsonl"
bench csv "$tmp/a.csv" --devices sim:2 -fa auto,on -nkvo 1
python3 "$check" csv "$tmp/a.csv" flash_attn_set=-1,1 no_kv_offload=1 || fail "csv"
bench sql "$tmp/a.sql" -dev none -fa off
python3 "$check" sql "$tmp/a.sql" flash_attn=0 || fail "sql"

# markdown: llama-bench's fa column holds the same integers
bench md "$tmp/a.md" --devices sim:2 -sm tensor -fa auto,0,1
for v in -1 0 1; do
    n=$(grep -c "| tensor | $v | pp4 |" "$tmp/a.md")
    [ "$n" -eq 1 ] || fail "md: $n pp4 rows with fa $v, want 1: $(cat "$tmp/a.md")"
done
# a prompt-only row of a tensor split: no AllReduces per generated token ("-"), the tg row
# its count (a number)
grep -q '| tensor | -1 | pp4 | [0-9.]* ± [0-9.]* | - |' "$tmp/a.md" || fail "md: the pp4 row's allreduces/tok is not '-'"
grep -q '| tensor | -1 | tg2 | [0-9.]* ± [0-9.]* | [0-9][0-9.]* |' "$tmp/a.md" || fail "md: the tg2 row has no allreduces/tok count"

[ "$fails" -eq 0 ] || exit 1
echo "PASS: json, jsonl, csv, sql read as compare-llama-bench.py reads them; md fa and '-'"
