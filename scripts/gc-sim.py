#!/usr/bin/env python3
"""Simulates log garbage collection under zipfian overwrites, to compare victim policies.

A log of fixed-size segments holds one live record per key; each update appends a new
record and kills the old one. Whenever the log exceeds `target` times the live data, the
collector picks a victim, appends its live records again and frees it. What it counts is
how many records the collector copies per update: the write amplification GC adds.

Layouts: `one-log` (copies go to the foreground's tail, as Tucana did before its
relocation tail) and `relocation-log` (copies go to a tail of their own). Policies:
`greedy` (least live first) and `cost-benefit` (LFS: (1 - u) * age / (1 + u)).

    scripts/gc-sim.py                       # every layout and policy, the defaults below
    scripts/gc-sim.py --updates 600000 --layout relocation-log --policy cost-benefit

Pure Python, no dependencies; the default run takes a few minutes per combination. The
figures DESIGN.md quotes are the "steady" column (the second half of the updates).
"""

import argparse
import bisect
import itertools
import random


def zipf_cdf(n, theta):
    weights = [1.0 / (i ** theta) for i in range(1, n + 1)]
    total = sum(weights)
    return list(itertools.accumulate(w / total for w in weights))


def simulate(keys, segment_records, updates, target, layout, policy, seed):
    rng = random.Random(seed)
    cdf = zipf_cdf(keys, 0.99)
    # Scrambled, as YCSB does: popularity is not key order.
    scramble = list(range(keys))
    rng.shuffle(scramble)

    live = {}  # segment -> live records
    written = {}  # segment -> records written
    members = {}  # segment -> keys whose live record it holds
    where = [0] * keys
    tails = {"fg": None, "gc": None}
    next_segment = [0]

    def append(kind, key):
        seg = tails[kind]
        if seg is None or written[seg] >= segment_records:
            seg = next_segment[0]
            next_segment[0] += 1
            live[seg], written[seg], members[seg] = 0, 0, set()
            tails[kind] = seg
        written[seg] += 1
        live[seg] += 1
        members[seg].add(key)
        where[key] = seg

    def score(seg, newest):
        u = live[seg] / segment_records
        if policy == "greedy":
            return -u
        return (1 - u) * (newest - seg + 1) / (1 + u)

    for key in range(keys):
        append("fg", key)
    copies = 0
    copies_half = 0
    for n in range(updates):
        key = scramble[bisect.bisect_left(cdf, rng.random())]
        old = where[key]
        live[old] -= 1
        members[old].discard(key)
        append("fg", key)
        while len(live) * segment_records > target * keys:
            open_tails = set(tails.values())
            newest = next_segment[0]
            victim = max(
                (s for s in live if s not in open_tails), key=lambda s: score(s, newest)
            )
            kind = "gc" if layout == "relocation-log" else "fg"
            for k in list(members[victim]):
                append(kind, k)
                copies += 1
            del live[victim], written[victim], members[victim]
        if n + 1 == updates // 2:
            copies_half = copies
    return copies / updates, (copies - copies_half) / (updates - updates // 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=300_000)
    ap.add_argument("--segment-records", type=int, default=2000)
    ap.add_argument("--updates", type=int, default=2_400_000, help="8 overwrites of 300k keys")
    ap.add_argument("--target", type=float, default=1.45, help="log size over live data")
    ap.add_argument("--layout", choices=["one-log", "relocation-log"])
    ap.add_argument("--policy", choices=["greedy", "cost-benefit"])
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    layouts = [args.layout] if args.layout else ["one-log", "relocation-log"]
    policies = [args.policy] if args.policy else ["greedy", "cost-benefit"]
    print(f"{'layout':<16} {'policy':<14} {'copies/update':>14} {'steady':>8}")
    for layout in layouts:
        for policy in policies:
            total, steady = simulate(
                args.keys,
                args.segment_records,
                args.updates,
                args.target,
                layout,
                policy,
                args.seed,
            )
            print(f"{layout:<16} {policy:<14} {total:>14.3f} {steady:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
