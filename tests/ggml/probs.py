#!/usr/bin/env python3
"""Greedy steps of two llama-server instances (ggml's CPU and LOOM0) compared by their
log-probabilities: the chosen tokens must agree until the first step where the top two
candidates of either side are within TOL of each other (a near-tie, where a few units in
the last place of either engine decide), and every top log-probability before it must agree
within TOL. Prints what it compared; exits 0 when the two agree in that sense.

usage: probs.py PORT_CPU PORT_LOOM [N_PREDICT] [TOL]
"""
import json
import sys
import time
import urllib.error
import urllib.request


def steps(port, n):
    body = json.dumps({"prompt": "Once upon a time", "n_predict": n, "temperature": 0,
                       "n_probs": 2}).encode()
    last = None
    for _ in range(240):
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                         headers={"Content-Type": "application/json"})
            r = json.loads(urllib.request.urlopen(req, timeout=120).read())
            out = []
            for p in r["completion_probabilities"]:
                top = p.get("top_logprobs") or p.get("probs") or []
                out.append([(t["token"], t.get("logprob", 0.0)) for t in top])
            return out
        except urllib.error.HTTPError as e:
            if e.code != 503:  # 503: the model is still loading
                raise SystemExit(f"probs.py: port {port}: HTTP {e.code}: {e.read()[:300]!r}")
            last = e
            time.sleep(0.5)
        except OSError as e:  # not listening yet
            last = e
            time.sleep(0.5)
    raise SystemExit(f"probs.py: no answer from port {port}: {last}")


def main():
    a_port, b_port = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    tol = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
    a, b = steps(a_port, n), steps(b_port, n)
    worst = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        if not x or not y:
            break
        tie = (len(x) > 1 and x[0][1] - x[1][1] < tol) or (len(y) > 1 and y[0][1] - y[1][1] < tol)
        if x[0][0] != y[0][0]:
            if tie:
                print(f"probs.py: step {i}: a near-tie ({x} vs {y}); agreed before it, "
                      f"largest difference {worst:.4f}")
                return 0
            print(f"probs.py: step {i}: CPU chose {x[0]}, LOOM0 {y[0]} (no tie)")
            return 1
        d = abs(x[0][1] - y[0][1])
        worst = max(worst, d)
        if d > tol:
            print(f"probs.py: step {i}: log-probabilities {x[0][1]:.4f} vs {y[0][1]:.4f}")
            return 1
    print(f"probs.py: {len(a)} steps agree, largest log-probability difference {worst:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
