#!/usr/bin/env python3
"""Reads `loom bench` output as llama.cpp's scripts/compare-llama-bench.py reads llama-bench's.

The oracle is that script's reading, restated here (not copied): llama.cpp commit 05f3b204
(scripts/compare-llama-bench.py), and the field types of tools/llama-bench/llama-bench.cpp
(commit 0104b151, test::get_field_type: flash_attn is an INT, written as its
llama_flash_attn_type value -1/0/1; no_kv_offload, cpu_strict, embeddings are BOOL).

  * JSON, JSONL, CSV: each row must hold the keys the script requires (its key properties,
    build_commit, test_time, avg_ts); the keys it knows are inserted into an SQLite table of
    its schema (names and types below), the others dropped, as the script does;
  * SQL: the statements are run as `sqlite3` would; the table must have every column the
    script's queries name;
  * then each value's SQLite storage class must match the column's type (an INTEGER column
    holding text would break the script's equality joins and averages), and the script's
    baseline/compare join must pair every row of one build with exactly one of another.

Usage: bench_compare_check.py FORMAT FILE [EXPECT...]; EXPECT items are `key=value` that
every row must have, or `flash_attn_set=-1,0,1` (the set of flash_attn values over the
rows). Exits 0 when everything holds, 1 with one line per problem otherwise.
"""
import csv
import json
import sqlite3
import sys

# compare-llama-bench.py's llama-bench schema: (name, SQLite type).
SCHEMA = [
    ("build_commit", "TEXT"), ("build_number", "INTEGER"), ("cpu_info", "TEXT"),
    ("gpu_info", "TEXT"), ("backends", "TEXT"), ("model_filename", "TEXT"),
    ("model_type", "TEXT"), ("model_size", "INTEGER"), ("model_n_params", "INTEGER"),
    ("n_batch", "INTEGER"), ("n_ubatch", "INTEGER"), ("n_threads", "INTEGER"),
    ("cpu_mask", "TEXT"), ("cpu_strict", "INTEGER"), ("poll", "INTEGER"),
    ("type_k", "TEXT"), ("type_v", "TEXT"), ("n_gpu_layers", "INTEGER"),
    ("split_mode", "TEXT"), ("main_gpu", "INTEGER"), ("no_kv_offload", "INTEGER"),
    ("flash_attn", "INTEGER"), ("tensor_split", "TEXT"), ("tensor_buft_overrides", "TEXT"),
    ("use_mmap", "INTEGER"), ("embeddings", "INTEGER"), ("no_op_offload", "INTEGER"),
    ("n_prompt", "INTEGER"), ("n_gen", "INTEGER"), ("n_depth", "INTEGER"),
    ("test_time", "TEXT"), ("avg_ns", "INTEGER"), ("stddev_ns", "INTEGER"),
    ("avg_ts", "REAL"), ("stddev_ts", "REAL"),
]
FIELDS = [n for n, _ in SCHEMA]
# The properties the script joins a baseline row with a compare row on.
KEY_PROPERTIES = [
    "cpu_info", "gpu_info", "backends", "n_gpu_layers", "tensor_buft_overrides",
    "model_filename", "model_type", "n_batch", "n_ubatch", "embeddings", "cpu_mask",
    "cpu_strict", "poll", "n_threads", "type_k", "type_v", "use_mmap", "no_kv_offload",
    "split_mode", "main_gpu", "tensor_split", "flash_attn", "n_prompt", "n_gen", "n_depth",
]
REQUIRED = set(KEY_PROPERTIES) | {"build_commit", "test_time", "avg_ts"}
# llama-bench's JSON types (test::get_field_type) for the fields loom writes: a JSON bool
# where it writes one, a JSON integer for its INT fields.
JSON_BOOL = {"no_kv_offload", "cpu_strict", "embeddings", "use_mmap"}
JSON_INT = {"build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size",
            "model_n_params", "n_gpu_layers", "main_gpu", "n_prompt", "n_gen", "n_depth",
            "avg_ns", "stddev_ns", "no_op_offload", "n_cpu_moe", "flash_attn"}
SQL_CLASS = {"INTEGER": "integer", "TEXT": "text", "REAL": "real"}

problems = []


def problem(msg):
    problems.append(msg)


def new_db():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE llama_bench(%s);" % ", ".join("%s %s" % f for f in SCHEMA))
    return db


def insert_rows(db, rows, where):
    for i, row in enumerate(rows):
        missing = REQUIRED - set(row.keys())
        if missing:
            problem("%s row %d lacks %s" % (where, i + 1, ", ".join(sorted(missing))))
            continue
        kept = {k: v for k, v in row.items() if k in FIELDS}
        db.execute("INSERT INTO llama_bench(%s) VALUES(%s);" %
                   (", ".join(kept), ", ".join("?" * len(kept))), tuple(kept.values()))


def check_json_types(rows, where):
    for i, row in enumerate(rows):
        for k, v in row.items():
            if k in JSON_BOOL and not isinstance(v, bool):
                problem("%s row %d: %s is %r, llama-bench writes a JSON bool" % (where, i + 1, k, v))
            if k in JSON_INT and (isinstance(v, bool) or not isinstance(v, int)):
                problem("%s row %d: %s is %r, llama-bench writes a JSON integer" %
                        (where, i + 1, k, v))


def check_db(db, expects, where):
    n = db.execute("SELECT COUNT(*) FROM llama_bench").fetchone()[0]
    if n == 0:
        problem("%s: no rows" % where)
        return
    cols = [r[1] for r in db.execute("PRAGMA table_info(llama_bench)")]
    for f in FIELDS:
        if f not in cols:
            problem("%s: the table has no column %s" % (where, f))
    for name, ty in SCHEMA:
        if name not in cols:
            continue
        for (cls, val) in db.execute("SELECT typeof(%s), %s FROM llama_bench" % (name, name)):
            if cls != SQL_CLASS[ty]:
                problem("%s: %s holds %s %r, the script's column is %s" % (where, name, cls, val, ty))
    # the script's comparison: the same rows under two builds join one to one
    db.execute("CREATE TABLE two AS SELECT * FROM llama_bench")
    db.execute("UPDATE two SET build_commit = 'bbbbbbbb'")
    db.execute("UPDATE llama_bench SET build_commit = 'aaaaaaaa'")
    db.execute("INSERT INTO llama_bench SELECT * FROM two")
    on = " AND ".join("tb.%s = tc.%s" % (p, p) for p in KEY_PROPERTIES)
    pairs = db.execute(
        "SELECT tb.n_prompt, tb.n_gen, tb.n_depth, AVG(tb.avg_ts), AVG(tc.avg_ts) FROM "
        "llama_bench tb JOIN llama_bench tc ON %s AND tb.build_commit = 'aaaaaaaa' AND "
        "tc.build_commit = 'bbbbbbbb' GROUP BY %s" %
        (on, ", ".join("tb.%s" % p for p in KEY_PROPERTIES))).fetchall()
    if len(pairs) != n:
        problem("%s: the script's join pairs %d rows of %d" % (where, len(pairs), n))
    for p in pairs:
        if p[3] is None or p[3] <= 0 or p[3] != p[4]:
            problem("%s: joined t/s %r vs %r" % (where, p[3], p[4]))
    for e in expects:
        key, _, want = e.partition("=")
        if key == "flash_attn_set":
            got = sorted(r[0] for r in db.execute(
                "SELECT DISTINCT flash_attn FROM llama_bench WHERE build_commit = 'aaaaaaaa'"))
            if got != sorted(int(x) for x in want.split(",")):
                problem("%s: flash_attn values %s, want %s" % (where, got, want))
            continue
        for (v,) in db.execute("SELECT %s FROM llama_bench" % key):
            if str(v) != want:
                problem("%s: %s is %r, want %s" % (where, key, v, want))


def main():
    fmt, path, expects = sys.argv[1], sys.argv[2], sys.argv[3:]
    where = "%s (%s)" % (path, fmt)
    db = new_db()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if fmt == "json":
        rows = json.loads(text)
        check_json_types(rows, where)
        insert_rows(db, rows, where)
    elif fmt == "jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        check_json_types(rows, where)
        insert_rows(db, rows, where)
    elif fmt == "csv":
        rows = list(csv.DictReader(text.splitlines()))
        insert_rows(db, rows, where)
    elif fmt == "sql":
        db = sqlite3.connect(":memory:")
        db.executescript(text)
    else:
        sys.exit("unknown format " + fmt)
    check_db(db, expects, where)
    for p in problems:
        print("FAIL: " + p)
    if not problems:
        print("ok: %s" % where)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
