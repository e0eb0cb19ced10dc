#!/usr/bin/env bash
# Script test of `tucana serve` with Debian's redis-cli: starts a server on a fresh
# volume, runs commands the way a user would type them, and compares the output with
# what redis-cli prints against Redis. Exit 0 when everything matched.
#
#   TUCANA_BIN=target/debug/tucana scripts/test-redis-cli.sh
#
# Needs redis-cli (scripts/server-deps.sh installs it).
set -euo pipefail

bin="${TUCANA_BIN:-target/debug/tucana}"
command -v redis-cli >/dev/null || { echo "redis-cli not found: run scripts/server-deps.sh" >&2; exit 2; }

dir="$(mktemp -d)"
server_pid=""
cleanup() {
    if [[ -n "${server_pid}" ]] && kill -0 "${server_pid}" 2>/dev/null; then
        kill -9 "${server_pid}" 2>/dev/null || true
    fi
    rm -rf "${dir}"
}
trap cleanup EXIT

"${bin}" --db "${dir}/volume.tucana" serve --port 0 2>"${dir}/log" &
server_pid=$!
port=""
for _ in $(seq 1 300); do
    port="$(sed -n 's/.* on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "${dir}/log")"
    [[ -n "${port}" ]] && break
    sleep 0.05
done
[[ -n "${port}" ]] || { echo "server did not start:" >&2; cat "${dir}/log" >&2; exit 1; }

failures=0
# expect "<expected output>" redis-cli args...
expect() {
    local want="$1"
    shift
    local got
    got="$(redis-cli -p "${port}" "$@" 2>&1)"
    if [[ "${got}" != "${want}" ]]; then
        echo "FAIL: redis-cli $*" >&2
        echo "  want: ${want}" >&2
        echo "  got:  ${got}" >&2
        failures=$((failures + 1))
    else
        echo "ok: redis-cli $*"
    fi
}

expect "PONG" ping
expect "OK" set greeting "hello world"
expect "hello world" get greeting
expect "" get missing
expect "1" setnx fresh 1
expect "0" setnx fresh 2
expect "11" incrby counter 11
expect "10" decr counter
expect "OK" mset a 1 b 2 c 3
expect $'1\n2\n\n3' mget a b nope c
expect "2" del a b
expect "1" exists c
expect "string" type c
expect "-1" ttl c
expect $'c\ncounter\nfresh\ngreeting' keys '*'
expect $'c\ncounter' keys 'c*'
expect $'counter\n10\nfresh\n1' trange '(c' '[fresh' withvalues
expect $'greeting\nfresh' tprefix '' rev limit 2
expect "4" dbsize
expect "WRONGTYPE Operation against a key holding the wrong kind of value" hset c f 10
expect "1" hset h f 10
expect "11" hincrby h f 1
expect $'f\n11' hgetall h
expect "2" zadd z 1 a 2.5 b
expect $'a\n1\nb\n2.5' zrange z 0 -1 withscores
expect "hash" type h
expect "2" del h z
expect "ERR unknown command 'xadd', with args beginning with: 'c' '*' 'f' '10'" xadd c '*' f 10
# Deadlines far enough away that nothing below sees them pass.
expect "1" expire c 100000
expect "OK" set k v ex 100000
expect "-1" ttl greeting
expect "0" persist greeting
expect "ERR wrong number of arguments for 'get' command" get
expect "OK" select 2
# MULTI/EXEC through one connection (stdin feeds one redis-cli session).
got="$(printf 'MULTI\nSET t 0\nINCR t\nGET t\nEXEC\n' | redis-cli -p "${port}")"
want=$'OK\nQUEUED\nQUEUED\nQUEUED\nOK\n1\n1'
if [[ "${got}" != "${want}" ]]; then
    echo "FAIL: MULTI/EXEC: got ${got}" >&2
    failures=$((failures + 1))
else
    echo "ok: MULTI/EXEC"
fi
# --scan walks the whole keyspace with the SCAN cursor (10 keys a call: several calls).
expect $'c\ncounter\nfresh\ngreeting\nk\nt' --scan
redis-cli -p "${port}" -n 3 mset $(for i in $(seq 10 44); do echo "k$i $i"; done) >/dev/null
expect "$(seq 10 44 | sed 's/^/k/')" -n 3 --scan
expect $'counter\nfresh\ngreeting' --scan --pattern '*e*'
info="$(redis-cli -p "${port}" info keyspace)"
if [[ "${info}" != *"db0:keys=6,expires=2,avg_ttl=0"* ]]; then
    echo "FAIL: info keyspace: ${info}" >&2
    failures=$((failures + 1))
else
    echo "ok: info keyspace"
fi

# SHUTDOWN: the server commits and exits 0.
redis-cli -p "${port}" shutdown >/dev/null 2>&1 || true
status=0
wait "${server_pid}" || status=$?
server_pid=""
if [[ "${status}" != 0 ]]; then
    echo "FAIL: server exited with ${status} after SHUTDOWN" >&2
    cat "${dir}/log" >&2
    failures=$((failures + 1))
fi
# The data is in the volume: the CLI reads it back.
if [[ "$("${bin}" --db "${dir}/volume.tucana" get greeting)" != "hello world" ]]; then
    echo "FAIL: data not durable after SHUTDOWN" >&2
    failures=$((failures + 1))
fi

if [[ "${failures}" != 0 ]]; then
    echo "${failures} redis-cli checks failed" >&2
    exit 1
fi
echo "all redis-cli checks passed"
