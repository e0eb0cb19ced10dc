#!/usr/bin/env bash
# Slot migration's figures (DESIGN.md, "Slot migration"): etcd and two `tucana serve`
# processes in cluster mode (sync durability, one backup per region), KEYS keys with
# 100-byte values loaded into region 1 (slots 0-8191), then `tucana cluster move-slots`
# to the other server, timed: its upper half (slots 4096-8191) idle, then the rest while
# `redis-benchmark --cluster` runs SET/GET against the cluster (its figures printed,
# after a baseline SET run with no migration).
#
#   scripts/bench-migrate.sh [KEYS]        # default 500000
#
# Uses target/release/tucana (built if missing; TUCANA=path picks another binary), ports
# 27011-27012 (and +100 for replication) and 23791 for etcd, and a temporary directory
# it removes. Needs etcd, redis-cli, redis-benchmark (scripts/cluster-deps.sh,
# scripts/server-deps.sh) and python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

keys="${1:-500000}"
bin="${TUCANA:-target/release/tucana}"
if [[ ! -x "${bin}" ]]; then
    cargo build --release -p tucana-cli
fi
dir="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "${pid}" 2>/dev/null || true; done
    sleep 1
    rm -rf "${dir}"
}
trap cleanup EXIT

etcd_url=http://127.0.0.1:23791
etcd --data-dir "${dir}/etcd" --listen-client-urls "${etcd_url}" \
    --advertise-client-urls "${etcd_url}" --listen-peer-urls http://127.0.0.1:23801 \
    >"${dir}/etcd.log" 2>&1 &
pids+=($!)
sleep 2
for port in 27011 27012; do
    "${bin}" --db "${dir}/s${port}/volume.tucana" serve --port "${port}" --durability sync \
        --repl-port $((port + 100)) --cluster-etcd "${etcd_url}" --cluster-name bench \
        >"${dir}/s${port}.log" 2>&1 &
    pids+=($!)
done
sleep 1
E=(--etcd "${etcd_url}" --name bench)
"${bin}" cluster create "${E[@]}" --replicas 1 127.0.0.1:27011 127.0.0.1:27012 >/dev/null

# SETs of keys whose slot (CRC16/XMODEM mod 16384) is in 0..8191, as RESP for --pipe.
python3 - "${keys}" >"${dir}/load.resp" <<'EOF'
import sys
def crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xffff
    return crc
n, out, i, made, val = int(sys.argv[1]), sys.stdout.buffer, 0, 0, b"x" * 100
while made < n:
    k = b"key:%d" % i
    i += 1
    if crc16(k) % 16384 < 8192:
        out.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(val), val))
        made += 1
EOF
redis-cli -p 27011 --pipe <"${dir}/load.resp" | tail -1
echo "loaded: $(redis-cli -p 27011 dbsize) keys on 127.0.0.1:27011"

seconds() { date +%s.%N; }
start=$(seconds)
"${bin}" cluster move-slots "${E[@]}" --from-region 1 --slots 4096-8191 --to 127.0.0.1:27012 >/dev/null
end=$(seconds)
moved=$(grep -o 'finished the migration of region 1 into 3 ([0-9]* pairs' "${dir}/s27011.log" | grep -o '[0-9]* pairs')
echo "idle: moved ${moved} in $(python3 -c "print(round(${end} - ${start}, 2))") s (move-slots, including its 200 ms polls of etcd)"

echo "redis-benchmark SET with no migration running (baseline):"
redis-benchmark --cluster -p 27011 -t set -n 200000 -c 20 -r 1000000 -q 2>&1 |
    tr '\r' '\n' | grep -E '^SET: [0-9]'
redis-benchmark --cluster -p 27011 -t set,get -n 400000 -c 20 -r 1000000 -q \
    >"${dir}/bench.log" 2>&1 &
bench=$!
sleep 2
start=$(seconds)
"${bin}" cluster move-slots "${E[@]}" --from-region 1 --to 127.0.0.1:27012 >/dev/null
end=$(seconds)
moved=$(grep -o 'finished the migration of region 1 into 4 ([0-9]* pairs' "${dir}/s27011.log" | grep -o '[0-9]* pairs')
echo "under redis-benchmark --cluster -c 20: moved ${moved} in $(python3 -c "print(round(${end} - ${start}, 2))") s"
wait "${bench}" || true
echo "redis-benchmark (SET ran during the move, GET mostly after it):"
tr '\r' '\n' <"${dir}/bench.log" | grep -E '^(SET|GET): [0-9]'
echo "redis-benchmark refetched the slot map $(tr '\r' '\n' <"${dir}/bench.log" | grep -c 'configuration changed') times (after MOVED/ASK)"
