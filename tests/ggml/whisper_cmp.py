#!/usr/bin/env python3
"""Two whisper-cli -ojf transcripts (ggml's CPU and LOOM0) of one greedy run compared token
by token: the token ids must agree, and each token's probability within TOL in log space,
until the first step where the two sides chose different tokens with probabilities within
TOL of each other (a near-tie, where a few units in the last place of either engine decide;
-ojf gives each side's chosen token only, so equal probabilities of two different tokens
are what a tie looks like). At least MIN tokens must be compared. Prints what it compared;
exits 0 when the two agree in that sense.

usage: whisper_cmp.py CPU.json LOOM.json [TOL] [MIN]
"""
import json
import math
import sys


def tokens(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"whisper_cmp.py: {path}: {e}")
    return [(t["id"], t["p"]) for s in d.get("transcription", []) for t in s.get("tokens", [])]


def main():
    a, b = tokens(sys.argv[1]), tokens(sys.argv[2])
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    least = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    worst = 0.0
    n = 0
    for i, ((ia, pa), (ib, pb)) in enumerate(zip(a, b)):
        if pa <= 0 or pb <= 0:
            print(f"whisper_cmp.py: token {i}: probability {pa} vs {pb}")
            return 1
        d = abs(math.log(pa) - math.log(pb))
        if ia != ib:
            if d < tol and n >= least:
                print(f"whisper_cmp.py: token {i}: a near-tie ({ia} p {pa} vs {ib} p {pb}); "
                      f"{n} tokens agreed before it, largest log-probability difference {worst:.4f}")
                return 0
            print(f"whisper_cmp.py: token {i}: CPU chose {ia} (p {pa}), LOOM0 {ib} (p {pb})")
            return 1
        worst = max(worst, d)
        if d > tol:
            print(f"whisper_cmp.py: token {i} ({ia}): probability {pa} vs {pb}")
            return 1
        n += 1
    if len(a) != len(b):
        print(f"whisper_cmp.py: {len(a)} tokens vs {len(b)}")
        return 1
    if n < least:
        print(f"whisper_cmp.py: only {n} tokens (want at least {least})")
        return 1
    print(f"whisper_cmp.py: {n} tokens agree, largest log-probability difference {worst:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
