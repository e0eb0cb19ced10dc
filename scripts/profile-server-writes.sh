#!/usr/bin/env bash
# Profiles `tucana serve` (buffered, as tucana-bench's tucana-buffered runs it) under
# redis-benchmark's LPUSH and LPOP (one list, `mylist`), a ZADD of random members onto
# one sorted set, and HSET then HGETALL of 10-field records at random keys, 50 clients at
# -P 16: `perf record --call-graph dwarf` of the server
# process for each test, and the server's CPU time per test (utime + stime, in clock
# ticks) next to redis-benchmark's last line in OUT_DIR/summary.txt. Read a profile with
#   perf report -i OUT_DIR/lpop.data --children --sort symbol --stdio -g none
# (DESIGN.md, "Data types", "Pipelined runs of collection writes").
#
#   scripts/profile-server-writes.sh target/release/tucana /tmp/prof [PORT]
#   N=100000 scripts/profile-server-writes.sh ...     # requests per test (default 200000)
#   PERF=0 scripts/profile-server-writes.sh ...       # CPU ticks only, no perf sampling
#   VALUE_BYTES=100 scripts/profile-server-writes.sh  # redis-benchmark -d (default 3)
#   PERF=0 scripts/profile-server-writes.sh redis-server /tmp/r  # the same tests against
#                           redis-server (appendonly yes, appendfsync everysec), for scale
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 TUCANA_BINARY OUT_DIR [PORT]" >&2
  exit 2
fi
BIN=$1; OUT=$2; PORT=${3:-7411}
N=${N:-200000}
PERF=${PERF:-1}
VALUE_BYTES=${VALUE_BYTES:-3}
mkdir -p "$OUT"
VOLUME_DIR=$(mktemp -d)
trap 'rm -rf "$VOLUME_DIR"' EXIT
if [ "$(basename "$BIN")" = redis-server ]; then
  "$BIN" --port "$PORT" --dir "$VOLUME_DIR" --appendonly yes --appendfsync everysec \
    --save '' >"$OUT/serve.log" 2>&1 &
else
  "$BIN" --db "$VOLUME_DIR/volume.tucana" serve --port "$PORT" --durability buffered \
    --flush-interval-ms 1000 2>"$OUT/serve.log" &
fi
PID=$!
sleep 2
# name, then redis-benchmark's test arguments
run() {
  local name=$1; shift
  local perf_pid=
  if [ "$PERF" != 0 ]; then
    perf record -F 499 --call-graph dwarf,16384 -p "$PID" -o "$OUT/$name.data" \
      2>"$OUT/$name.perf.log" &
    perf_pid=$!
    sleep 1
  fi
  local t0 t1
  t0=$(awk '{print $14+$15}' "/proc/$PID/stat")
  redis-benchmark -p "$PORT" -c 50 -n "$N" -P 16 -d "$VALUE_BYTES" -q "$@" > "$OUT/$name.bench" 2>&1
  t1=$(awk '{print $14+$15}' "/proc/$PID/stat")
  if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid"; fi
  echo "$name cpu_ticks=$((t1 - t0)) $(tr '\r' '\n' < "$OUT/$name.bench" | grep 'per second' | tail -1 \
    | sed 's/.*: \([0-9.]* requests per second\)/\1/')" \
    >> "$OUT/summary.txt"
}
run lpush -t lpush
run lpop -t lpop
run zadd -r 100000 ZADD rec-index __rand_int__ rec:__rand_int__
# Records of 10 fields of VALUE_BYTES (as tucana-bench's HSET and HGETALL), random keys.
fields=()
for f in 0 1 2 3 4 5 6 7 8 9; do fields+=("field$f" "$(head -c "$VALUE_BYTES" /dev/zero | tr '\0' v)"); done
run hset -r 100000 HSET rec:__rand_int__ "${fields[@]}"
run hgetall -r 100000 HGETALL rec:__rand_int__
kill "$PID"; wait "$PID"
cat "$OUT/summary.txt"
