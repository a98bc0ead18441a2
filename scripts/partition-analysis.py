#!/usr/bin/env python3
"""Reads what scripts/partition-study.sh kept and prints the numbers of docs/BENCHMARKS.md,
"Workload A: what placement can reach".

  partition-analysis.py study KEEPDIR LOGDIR  per seed: splits meeting each goal, kvroute's
      rank, how well start-time balance and the peak live footprint predict the excess, and
      the digit strings meeting the recompute goal on every seed. KEEPDIR is the study's
      KEEP=DIR; LOGDIR holds kvroute.seedN.jsonl from `cmd/replay -policies kvroute -log-dir`.
  partition-analysis.py random N              N random 8/8 partition:<digits> policies (fixed
      seed), comma-separated, for cmd/replay -policies.
  partition-analysis.py goals JSON            per policy of a Workload A `cmd/replay -format
      json` run (with kv): seeds within 2 % of the floor, summed p95 × kv on seeds 1–3 and
      the mean of per-seed p95 ratios.

"Excess" is recompute - 76,288 (the floor) over kv's recompute on the seed; "p95" is the
resumed-turn p95 TTFT over kv's.
"""
import glob
import json
import math
import random
import statistics
import sys

FLOOR = 76288


def excess(r, kv):
    return (r["recomputed_prefill_tokens"] - FLOOR) / kv[r["seed"]]["recomputed_prefill_tokens"]


def p95x(r, kv):
    return r["resumed_ttft_p95_ms"] / kv[r["seed"]]["resumed_ttft_p95_ms"]


def first_turns(logdir, seed):
    """Sessions' start times in arrival order, their end, and their footprint per turn."""
    reqs = []
    with open(f"{logdir}/kvroute.seed{seed}.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r["kind"] == "request":
                reqs.append(r)
    by = {}
    for r in reqs:
        by.setdefault(r["session"], []).append(r)
    order = sorted(by, key=lambda s: min(x["arrival_ms"] for x in by[s]))
    start = [min(x["arrival_ms"] for x in by[s]) / 1000 for s in order]
    end = [max(x["first_token_ms"] for x in by[s]) / 1000 for s in order]
    turns = [sorted((x["arrival_ms"] / 1000, (x["prompt"] + 63) // 64) for x in by[s]) for s in order]
    digits = "".join(str(min(by[s], key=lambda x: x["turn"])["worker"]) for s in order)
    return start, end, turns, digits


def study(keep, logdir):
    rows = []
    for f in sorted(glob.glob(f"{keep}/out.*.json")):
        with open(f) as fh:
            rows += json.load(fh)
    kv = {r["seed"]: r for r in rows if r["policy"] == "kv"}
    kr = {r["seed"]: r for r in rows if r["policy"] == "kvroute"}
    parts = {}
    for r in rows:
        if r["policy"].startswith("partition:"):
            parts.setdefault(r["policy"][len("partition:"):], {})[r["seed"]] = r
    seeds = sorted(kv)
    for s in seeds:
        ds = [d for d in parts if s in parts[d]]
        ex = {d: excess(parts[d][s], kv) for d in ds}
        px = {d: p95x(parts[d][s], kv) for d in ds}
        ok = [d for d in ds if ex[d] <= 0.02]
        fast = [d for d in ds if px[d] <= 0.60]
        both = [d for d in ok if px[d] <= 0.60]
        n = len(ds)
        print(f"seed {s}: kv recompute {kv[s]['recomputed_prefill_tokens']}, resumed p95 {kv[s]['resumed_ttft_p95_ms']:.1f} ms; {n} splits")
        print(f"  within 2 %: {len(ok)} ({len(ok) / n:.1%}); p95 <= 0.60: {len(fast)} ({len(fast) / n:.1%}); both: {len(both)} ({len(both) / n:.1%})")
        print(f"  excess median {statistics.median(ex.values()):.2%}, best {min(ex.values()):.2%}; p95 median {statistics.median(px.values()):.3f},"
              f" best within 2 % {min((px[d] for d in ok), default=float('nan')):.3f}")
        kex, kpx = excess(kr[s], kv), p95x(kr[s], kv)
        print(f"  kvroute: excess {kex:.2%}, p95 {kpx:.3f}; splits with a lower p95: {sum(px[d] < kpx for d in ds) / n:.0%}")

        start, end, turns, kdigits = first_turns(logdir, s)
        if kdigits[0] == "1":  # the study puts the first session on w0; the workers are identical
            kdigits = kdigits.translate(str.maketrans("01", "10"))

        def balance(d):
            return abs(sum(t for t, c in zip(start, d) if c == "0") - sum(t for t, c in zip(start, d) if c == "1"))

        times = sorted({t for tl in turns for t, _ in tl})

        def peak(d):
            worst = 0
            for t in times[::3]:
                for w in "01":
                    worst = max(worst, sum(max(b for tt, b in turns[i] if tt <= t)
                                           for i, c in enumerate(d) if c == w and start[i] <= t <= end[i]))
            return worst

        exs = [ex[d] for d in ds]
        bal = [balance(d) for d in ds]
        print(f"  correlation with the excess: start-time balance {statistics.correlation(bal, exs):.2f},"
              f" peak live footprint {statistics.correlation([peak(d) for d in ds], exs):.2f}")
        def proximity(d):  # same-worker pairs of sessions that started close together
            return sum(math.exp(-abs(start[i] - start[j])) for i in range(len(d)) for j in range(i + 1, len(d)) if d[i] == d[j])

        pxs = [px[d] for d in ds]
        print(f"  correlation with the p95: start-time balance {statistics.correlation(bal, pxs):.2f},"
              f" start proximity (1 s) {statistics.correlation([proximity(d) for d in ds], pxs):.2f}")
        ranked = sorted(ds, key=balance)
        top = ranked[:50]
        print(f"  the 50 best-balanced splits: {sum(ex[d] <= 0.02 for d in top) / 50:.0%} within 2 %;"
              f" kvroute's split ({kdigits}) ranks {ranked.index(kdigits) + 1 if kdigits in ranked else '-'} on balance")
    every = [d for d in parts if all(s in parts[d] and excess(parts[d][s], kv) <= 0.02 for s in seeds)]
    total = sum(kv[s]["resumed_ttft_p95_ms"] for s in seeds)
    summed = {d: sum(parts[d][s]["resumed_ttft_p95_ms"] for s in seeds) / total for d in every}
    print(f"digit strings within 2 % on every seed: {len(every)}; of them with summed p95 <= 0.60: {sum(v <= 0.60 for v in summed.values())}")
    for d in sorted(every, key=summed.get):
        print(f"  partition:{d} summed p95 {summed[d]:.3f}")


def goals(path):
    with open(path) as f:
        rows = json.load(f)
    kv = {r["seed"]: r for r in rows if r["policy"] == "kv"}
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    for p in policies:
        rs = {r["seed"]: r for r in rows if r["policy"] == p}
        exs = {s: excess(r, kv) for s, r in rs.items()}
        ratios = [p95x(r, kv) for r in rs.values()]
        first3 = [s for s in (1, 2, 3) if s in rs]
        summed = sum(rs[s]["resumed_ttft_p95_ms"] for s in first3) / max(1e-9, sum(kv[s]["resumed_ttft_p95_ms"] for s in first3))
        print(f"{p}: excess seeds 1-3 {' / '.join(f'{exs[s]:.1%}' for s in first3)}; within 2 % on {sum(e <= 0.02 for e in exs.values())}/{len(rs)} seeds;"
              f" p95 summed 1-3 {summed:.3f}, mean {statistics.mean(ratios):.3f}; moved turns max {max(r['moved_turns'] for r in rs.values())}")


def main(argv):
    if len(argv) == 4 and argv[1] == "study":
        study(argv[2], argv[3])
    elif len(argv) == 3 and argv[1] == "random":
        rng = random.Random(7)
        out = []
        for _ in range(int(argv[2])):
            bits = [1] * 8 + [0] * 7
            rng.shuffle(bits)
            out.append("partition:0" + "".join(map(str, bits)))
        print(",".join(out))
    elif len(argv) == 3 and argv[1] == "goals":
        goals(argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
