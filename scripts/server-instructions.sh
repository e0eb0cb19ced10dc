#!/usr/bin/env bash
# Counts the instructions `tucana serve` executes (valgrind's callgrind, event Ir) while
# one redis-benchmark test runs against it, after a preload: a figure the noise of a
# shared machine cannot blur, where CPU ticks of the same binary swing by a quarter from
# run to run. Compare two builds with the same arguments; read where the instructions go
# with `callgrind_annotate OUT`. Runs ~50 times slower than natively, so keep the test
# short (a few thousand requests).
#
#   scripts/server-instructions.sh BINARY PRELOAD.resp OUT "BENCHMARK ARGS" [PORT]
#
# PRELOAD.resp is fed to `redis-cli --pipe` before counting starts (`-` for none;
# `zset:N` for N members rec:000000000000... with scores 0..N-1 scrambled, in a sorted
# set `rec-index`, the shape of the harness's YCSB index). The
# benchmark runs with 50 clients plus BENCHMARK ARGS, e.g.
#   "-n 5000 -P 16 -r 10000 ZRANGEBYSCORE rec-index __rand_int__ +inf LIMIT 0 10"
# The server reserves 1 GiB for its read mapping (--mapping-reservation-mib), since
# valgrind refuses the default 64 GiB. Prints redis-benchmark's line and the total.
set -u
if [ $# -lt 4 ]; then
  echo "usage: $0 BINARY PRELOAD.resp|- OUT \"BENCHMARK ARGS\" [PORT]" >&2
  exit 2
fi
BIN=$1; PRELOAD=$2; OUT=$3; ARGS=$4; PORT=${5:-7412}
for tool in valgrind callgrind_control callgrind_annotate redis-cli redis-benchmark; do
  if ! command -v "$tool" >/dev/null; then
    echo "skipped: $tool is not installed (apt-get install valgrind redis-tools)" >&2
    exit 0
  fi
done
DIR=$(mktemp -d)
SERVER=
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; rm -rf "$DIR"' EXIT
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT" \
  "$BIN" --mapping-reservation-mib 1024 --db "$DIR/volume.tucana" serve --port "$PORT" \
  --durability buffered --flush-interval-ms 1000 >"$DIR/log" 2>&1 &
SERVER=$!
for _ in $(seq 1 120); do
  redis-cli -p "$PORT" PING >/dev/null 2>&1 && break
  sleep 1
done
if ! redis-cli -p "$PORT" PING >/dev/null 2>&1; then
  echo "the server did not start:" >&2
  cat "$DIR/log" >&2
  exit 1
fi
case $PRELOAD in
  -) ;;
  zset:*)
    awk -v n="${PRELOAD#zset:}" 'BEGIN {
      for (i = 0; i < n; i++) {
        m = sprintf("rec:%012d", i); s = (i * 7919) % n
        printf "*4\r\n$4\r\nZADD\r\n$9\r\nrec-index\r\n$%d\r\n%d\r\n$%d\r\n%s\r\n", length(s ""), s, length(m), m
      } }' | redis-cli -p "$PORT" --pipe >/dev/null ;;
  *) redis-cli -p "$PORT" --pipe <"$PRELOAD" >/dev/null ;;
esac
callgrind_control -i on "$SERVER" >/dev/null
# shellcheck disable=SC2086 # ARGS is a list of arguments
redis-benchmark -p "$PORT" -c 50 -q $ARGS | tr '\r' '\n' | grep "per second" | tail -1
callgrind_control -i off "$SERVER" >/dev/null
kill "$SERVER"
wait "$SERVER" 2>/dev/null
SERVER=
callgrind_annotate "$OUT" 2>/dev/null | grep -m1 "PROGRAM TOTALS"
