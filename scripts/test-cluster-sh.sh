#!/usr/bin/env bash
# Script test of the local cluster launcher, scripts/cluster.sh, as a user would use it:
# start a cluster of three servers with a backup per region (etcd on spare ports, a fresh
# directory), write keys through redis-cli -c, check that each key is served by exactly
# one server, stop it, start it again over the same directory and read every key back,
# then kill -9 one server and wait until every key is served again (its regions' backups
# promoted by the coordinator). Exit 0 when all held.
# Needs redis-cli (scripts/server-deps.sh); cluster.sh installs etcd and protoc itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="$(mktemp -d)"
args=(--dir "${dir}/cluster" --servers 3 --port 17301 --etcd-port 23791)
cleanup() {
    scripts/cluster.sh stop "${args[@]}" >/dev/null 2>&1 || true
    rm -rf "${dir}"
}
trap cleanup EXIT

fail() {
    echo "test-cluster-sh: $*" >&2
    exit 1
}

scripts/cluster.sh start "${args[@]}" >"${dir}/start.log" 2>&1 ||
    { cat "${dir}/start.log" >&2; fail "start failed"; }
keys=200
for i in $(seq 1 "${keys}"); do
    [[ "$(redis-cli -c -p 17301 set "user:${i}" "v${i}")" == OK ]] || fail "SET user:${i}"
done
total=0
for port in 17301 17302 17303; do
    n="$(redis-cli -p "${port}" dbsize)"
    [[ "${n}" -gt 0 ]] || fail "server ${port} holds no key"
    total=$((total + n))
done
[[ "${total}" == "${keys}" ]] || fail "the servers hold ${total} keys, not ${keys}"

scripts/cluster.sh stop "${args[@]}" >/dev/null
scripts/cluster.sh start "${args[@]}" >"${dir}/restart.log" 2>&1 ||
    { cat "${dir}/restart.log" >&2; fail "restart failed"; }
for i in $(seq 1 "${keys}"); do
    got="$(redis-cli -c -p 17302 get "user:${i}")"
    [[ "${got}" == "v${i}" ]] || fail "after the restart user:${i} is '${got}', not v${i}"
done
victim="$(awk '$1 == "server-17302" { print $2 }' "${dir}/cluster/pids")"
kill -9 "${victim}"
for i in $(seq 1 "${keys}"); do
    for _ in $(seq 1 300); do
        got="$(redis-cli -c -p 17301 get "user:${i}" 2>&1 || true)"
        [[ "${got}" == "v${i}" ]] && break
        sleep 0.1
    done
    [[ "${got}" == "v${i}" ]] || fail "after the kill of a server user:${i} is '${got}', not v${i}"
done
echo "test-cluster-sh: ${keys} keys over 3 servers, all back after a stop and start, and after a kill -9 of one server"

