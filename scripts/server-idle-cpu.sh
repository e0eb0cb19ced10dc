#!/usr/bin/env bash
# The CPU an idle `tucana serve` spends, in clock ticks (`/proc/PID/stat`, user + system)
# over a quiet window, after a preload of an N-member sorted set: what the server's
# background work (expiry sweep, collector of old versions, commits) costs when no client
# asks anything. Compare two builds, or N against 0.
#
#   scripts/server-idle-cpu.sh BINARY N [WINDOW_S] [SETTLE_S] [PORT]
#
# The set is `rec-index`, members rec:000000000000... with scrambled scores, as
# scripts/server-instructions.sh's `zset:N`. After the preload the server settles for
# SETTLE_S seconds (default 15: the collector's first round over N = 200000 takes ~10 s),
# then WINDOW_S seconds (default 20) are counted. Prints the ticks (usually 100 a second).
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 BINARY N [WINDOW_S] [SETTLE_S] [PORT]" >&2
  exit 2
fi
BIN=$1; N=$2; WINDOW=${3:-20}; SETTLE=${4:-15}; PORT=${5:-7413}
if ! command -v redis-cli >/dev/null; then
  echo "skipped: redis-cli is not installed (apt-get install redis-tools)" >&2
  exit 0
fi
DIR=$(mktemp -d)
SERVER=
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; rm -rf "$DIR"' EXIT
"$BIN" --db "$DIR/volume.tucana" serve --port "$PORT" >"$DIR/log" 2>&1 &
SERVER=$!
for _ in $(seq 1 100); do
  redis-cli -p "$PORT" PING >/dev/null 2>&1 && break
  sleep 0.1
done
if ! redis-cli -p "$PORT" PING >/dev/null 2>&1; then
  echo "the server did not start:" >&2
  cat "$DIR/log" >&2
  exit 1
fi
awk -v n="$N" 'BEGIN {
  for (i = 0; i < n; i++) {
    m = sprintf("rec:%012d", i); s = (i * 7919) % n
    printf "*4\r\n$4\r\nZADD\r\n$9\r\nrec-index\r\n$%d\r\n%d\r\n$%d\r\n%s\r\n", length(s ""), s, length(m), m
  } }' | redis-cli -p "$PORT" --pipe >/dev/null
sleep "$SETTLE"
ticks() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
before=$(ticks)
sleep "$WINDOW"
after=$(ticks)
echo "$(basename "$BIN"): $((after - before)) ticks in ${WINDOW} s idle after a ${N}-member sorted set"
