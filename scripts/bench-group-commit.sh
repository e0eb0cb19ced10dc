#!/usr/bin/env bash
# Side by side of two tucana-bench builds on sync-per-write YCSB (group commit, issue 22):
# alternating runs of `suite --sync` (Tucana only) at each thread count, then a table of
# A and F: ops/s and fsyncs per write (the engine's `Stats::syncs` over the workload's
# writes) per build, and the ratio new ÷ old within each round.
#
# Usage: scripts/bench-group-commit.sh OLD_BIN NEW_BIN OUT_DIR [ROUNDS] [THREADS...]
#   (defaults: 3 rounds, threads 8 64; RECORDS, OPERATIONS and DIR from the environment)
set -euo pipefail
old=$1 new=$2 out=$3
rounds=${4:-3}
shift $(( $# >= 4 ? 4 : 3 ))
threads=("$@")
[ ${#threads[@]} -eq 0 ] && threads=(8 64)
records=${RECORDS:-20000}
operations=${OPERATIONS:-40000}
dir=${DIR:-/var/tmp/gcbench}
mkdir -p "$out" "$dir"
for round in $(seq 1 "$rounds"); do
  for t in "${threads[@]}"; do
    for build in old new; do
      bin=$old; [ "$build" = new ] && bin=$new
      "$bin" suite --sync --engines tucana --dir "$dir" --json "$out/$build-t$t-r$round.json" \
        --threads "$t" --records "$records" --fields 1 --operations "$operations" \
        --load-batch 100 --large-records 0 --micro-keys 0 --gc-records 0 \
        --cache-bytes 268435456 --note "group commit side by side, $build build, round $round" \
        > "$out/$build-t$t-r$round.log" 2>&1
      echo "round $round threads $t $build: done (load $(cut -d' ' -f1-3 /proc/loadavg))"
    done
  done
done
python3 - "$out" "$rounds" "${threads[@]}" <<'PY'
import json, sys, statistics
out, rounds, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(build, t, r):
    recs = json.load(open(f"{out}/{build}-t{t}-r{r}.json"))["records"]
    return {x["workload"]: x for x in recs if x.get("engine") == "tucana"}
print("| workload | threads | old ops/s | new ops/s | new ÷ old (per round) | old fsyncs/write | new fsyncs/write | old p99 µs | new p99 µs |")
print("|---|---|---|---|---|---|---|---|---|")
for w in ["ycsb_a", "ycsb_f"]:
    for t in threads:
        rows = {b: [load(b, t, r)[w] for r in range(1, rounds + 1)] for b in ("old", "new")}
        ops = {b: [x["ops_per_sec"] for x in rows[b]] for b in rows}
        fpw = {b: sum(x["syncs"] for x in rows[b]) / sum(x["writes"] for x in rows[b]) for b in rows}
        p99 = {b: statistics.median(x["p99_us"] for x in rows[b]) for b in rows}
        ratios = [n / o for n, o in zip(ops["new"], ops["old"])]
        print(f"| {w} | {t} | {statistics.median(ops['old']):.0f} | {statistics.median(ops['new']):.0f} | "
              f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) | "
              f"{fpw['old']:.3f} | {fpw['new']:.3f} | {p99['old']:.0f} | {p99['new']:.0f} |")
PY
