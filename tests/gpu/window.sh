#!/usr/bin/env bash
# The first GPU window in one command (bundle.sh copies it to .gpu/window.sh): every check
# of run.sh within 540 s (9 minutes, so that a rerun fits in a 15-minute device lease), the
# four files (summary.txt, summary.json, speed.md, logs.tgz) in $OUT (default ./gpu-out),
# the summary printed last. A smaller BUDGET in the environment is kept; a larger one is
# cut to 540 s.
#
#   bash .gpu/window.sh
set -u
b=${BUDGET:-540}
[ "$b" -gt 540 ] 2>/dev/null && b=540
BUDGET=$b exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" "$@"
