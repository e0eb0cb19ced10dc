#!/usr/bin/env bash
# Side-by-side redis-benchmark run: `tucana serve` against Debian's redis-server with
# `appendonly yes, appendfsync everysec`, GET and SET, 50 clients, pipeline 1 and 16.
# Prints a Markdown table of requests per second (and p50 latency) to stdout.
#
#   scripts/bench-redis.sh                 # all three servers
#   REQUESTS=200000 VALUE_BYTES=100 KEYSPACE=1000000 scripts/bench-redis.sh
#
# Servers compared:
#   redis-everysec   redis-server, appendonly yes, appendfsync everysec (no RDB saves)
#   tucana-buffered  tucana serve --durability buffered --flush-interval-ms 1000
#                    (every write goes to the log; durable within 1 s, like everysec)
#   tucana-sync      tucana serve --durability sync (a write is answered once durable)
# Each server gets a fresh data directory on the same file system (TMPDIR).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
requests="${REQUESTS:-200000}"
value_bytes="${VALUE_BYTES:-100}"
keyspace="${KEYSPACE:-1000000}"
clients="${CLIENTS:-50}"
servers="${SERVERS:-redis-everysec tucana-buffered tucana-sync}"

bash scripts/server-deps.sh --bench >&2
cargo build --release -q -p tucana-cli >&2
tucana="target/release/tucana"

work="$(mktemp -d)"
pid=""
stop_server() {
    if [[ -n "${pid}" ]]; then
        kill -TERM "${pid}" 2>/dev/null || true
        wait "${pid}" 2>/dev/null || true
        pid=""
    fi
}
trap 'stop_server; rm -rf "${work}"' EXIT

wait_for_port() {
    for _ in $(seq 1 200); do
        if redis-cli -p "$1" ping >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.05
    done
    echo "server on port $1 did not come up" >&2
    return 1
}

start_server() {
    local name="$1" port="$2" dir="${work}/$1"
    mkdir -p "${dir}"
    case "${name}" in
        redis-everysec)
            redis-server --port "${port}" --bind 127.0.0.1 --dir "${dir}" \
                --appendonly yes --appendfsync everysec --save "" \
                --daemonize no --logfile "${dir}/log" &
            ;;
        tucana-buffered)
            "${tucana}" --db "${dir}/volume.tucana" serve --port "${port}" \
                --durability buffered --flush-interval-ms 1000 2>"${dir}/log" &
            ;;
        tucana-sync)
            "${tucana}" --db "${dir}/volume.tucana" serve --port "${port}" \
                --durability sync 2>"${dir}/log" &
            ;;
        *)
            echo "unknown server ${name}" >&2
            return 1
            ;;
    esac
    pid=$!
    wait_for_port "${port}"
}

echo "# redis-benchmark: ${clients} clients, ${requests} requests per test, ${value_bytes}-byte values, ${keyspace} random keys"
echo "# machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr); $(redis-server --version | cut -d' ' -f1-3)"
echo
echo "| server | test | pipeline | requests/s | p50 ms |"
echo "|---|---|---:|---:|---:|"
port=7390
for server in ${servers}; do
    port=$((port + 1))
    start_server "${server}" "${port}"
    for pipeline in 1 16; do
        # SET runs before GET, so GET mostly finds the keys SET wrote.
        redis-benchmark -p "${port}" -c "${clients}" -n "${requests}" -P "${pipeline}" \
            -d "${value_bytes}" -r "${keyspace}" -t set,get --csv 2>/dev/null |
            awk -F'","' -v server="${server}" -v pipeline="${pipeline}" '
                NR > 1 {
                    gsub(/"/, "", $1); gsub(/"/, "", $2); gsub(/"/, "", $5)
                    printf "| %s | %s | %d | %.0f | %s |\n", server, $1, pipeline, $2, $5
                }'
    done
    if [[ "${server}" == tucana-sync ]]; then
        # Group commit at work: how many acknowledged SETs each fsync covered.
        syncs="$(redis-cli -p "${port}" info persistence | tr -d '\r' | sed -n 's/^syncs://p')"
        group_note="tucana-sync: $((2 * requests)) SETs acknowledged durable with ${syncs} log syncs (fsync), $(( 2 * requests / (syncs > 0 ? syncs : 1) )) writes per sync"
    fi
    stop_server
done
if [[ -n "${group_note:-}" ]]; then
    echo
    echo "${group_note}"
fi
