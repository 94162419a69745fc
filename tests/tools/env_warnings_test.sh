#!/usr/bin/env bash
# An environment variable loom reads but cannot use is said aloud, once, not ignored
# (issue 26): LOOM_LOG_LEVEL=bogus and LOOM_CPU_SIMD=neon each give one warning naming the
# value and what is used instead; a valid value gives none.
set -uo pipefail
loom="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() {
    echo "FAIL: $*"
    exit 1
}
LOOM_LOG_LEVEL=bogus LOOM_CPU_SIMD=neon "$loom" run -n 2 >/dev/null 2>"$tmp/bad" || fail "run: exit $?"
[ "$(grep -c "LOOM_LOG_LEVEL='bogus' is not a level (debug, info, warn, error, none or 0-4): the level is warn" "$tmp/bad")" -eq 1 ] ||
    fail "LOOM_LOG_LEVEL: $(cat "$tmp/bad")"
[ "$(grep -c "LOOM_CPU_SIMD='neon' is not one of scalar, avx2, avx512" "$tmp/bad")" -eq 1 ] ||
    fail "LOOM_CPU_SIMD: $(cat "$tmp/bad")"
LOOM_LOG_LEVEL=info LOOM_CPU_SIMD=scalar "$loom" run -n 2 >/dev/null 2>"$tmp/good" || fail "run: exit $?"
! grep -q "LOOM_LOG_LEVEL=\|LOOM_CPU_SIMD=" "$tmp/good" || fail "a valid value warned: $(cat "$tmp/good")"
echo "ok: both bad values warned about once"
