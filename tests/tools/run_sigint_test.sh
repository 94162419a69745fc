#!/usr/bin/env bash
# Ctrl-C during `loom run` (issue 26), as llama.cpp's: the text ends, the figures are printed
# (on stderr) and the exit status is 130. The run is endless (-n -1 --ignore-eos on the
# built-in model); SIGINT is sent once its prompt shows on stdout (run catches it from
# before that), so nothing here depends on timing.
set -uo pipefail
loom="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() {
    echo "FAIL: $*"
    exit 1
}
"$loom" run -n -1 --ignore-eos --temp 0 >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 1 6000); do # wait for the prompt (at most ~10 min, the test's timeout)
    [ -s "$tmp/out" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
[ -s "$tmp/out" ] || fail "no prompt on stdout: $(cat "$tmp/err")"
kill -INT "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 130 ] || fail "exit status $rc after SIGINT, want 130: $(tail -3 "$tmp/err")"
grep -q "^generation: [0-9]* tokens" "$tmp/err" || fail "no figures after SIGINT: $(cat "$tmp/err")"
grep -q "^Once upon a time" "$tmp/out" || fail "stdout is not the text: $(head -c 200 "$tmp/out")"
! grep -q "generation:" "$tmp/out" || fail "figures on stdout"
echo "ok: SIGINT ends the run with its figures and exit 130 ($(grep '^generation:' "$tmp/err"))"
