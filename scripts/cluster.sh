#!/usr/bin/env bash
# A whole Tucana cluster on this machine, for trying it out: etcd plus N `tucana serve`
# processes in cluster mode, each with its own data directory and port, and the cluster
# map that splits the 16384 hash slots over them.
#
#   scripts/cluster.sh start                  # etcd on 2379, servers on 7001..7003, 1 backup each
#   scripts/cluster.sh start --servers 5 --replicas 2 --port 7101 --etcd-port 2479 --dir /tmp/c5
#   scripts/cluster.sh status                 # the map and the live servers
#   scripts/cluster.sh stop                   # servers first (they give up their leases), then etcd
#
# Server i listens for clients on port P+i and for its regions' replication on P+i+10000.
# Every region has --replicas backups (default 1) on other servers; when a server dies the
# elected coordinator promotes a backup of each region it led. Writes are sync (the
# server's default): answered once durable on the primary and received by the backups.
# Everything lives under --dir (default ./tucana-cluster): etcd's data, one directory per
# server, their logs, and the process ids `stop` reads. Starting again over the same
# directory brings the same cluster back (the servers keep their ids and data; the map
# stays in etcd). Installs etcd and protoc with apt-get when missing
# (scripts/cluster-deps.sh) and builds the release binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

action="${1:-}"
[[ -n "${action}" ]] || usage 2
shift
servers=3
replicas=1
port=7001
etcd_port=2379
dir=./tucana-cluster
name=local
while [[ $# -gt 0 ]]; do
    case "$1" in
        --servers) servers="$2"; shift 2 ;;
        --replicas) replicas="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --etcd-port) etcd_port="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --name) name="$2"; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "cluster.sh: unknown argument $1" >&2; usage 2 ;;
    esac
done

tucana="${CARGO_TARGET_DIR:-target}/release/tucana"
pids="${dir}/pids"
etcd_url="http://127.0.0.1:${etcd_port}"

# Waits until something listens on 127.0.0.1:$1, or fails naming $2 and its log $3.
wait_for_port() {
    for _ in $(seq 1 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "cluster.sh: $2 did not start listening on port $1; its log: $3" >&2
    tail -n 20 "$3" >&2 || true
    return 1
}

# CLUSTER INFO of the server on 127.0.0.1:$1, spoken in RESP without redis-cli.
cluster_state() {
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 0
        printf '*2\r\n$7\r\nCLUSTER\r\n$4\r\nINFO\r\n*1\r\n$4\r\nQUIT\r\n' >&3
        timeout 2 cat <&3
    ) 2>/dev/null || true
}

alive() {
    [[ -f "${pids}" ]] && while read -r _ pid; do
        kill -0 "${pid}" 2>/dev/null && return 0
    done <"${pids}"
    return 1
}

# The etcd URL and cluster name the running cluster was started with (saved by start).
load_settings() {
    if [[ -f "${dir}/settings" ]]; then
        # shellcheck source=/dev/null
        source "${dir}/settings"
    fi
}

start() {
    if alive; then
        echo "cluster.sh: a cluster from ${dir} is running; stop it first (scripts/cluster.sh stop --dir ${dir})" >&2
        exit 1
    fi
    bash scripts/cluster-deps.sh
    cargo build --release -q -p tucana-cli
    mkdir -p "${dir}"
    : >"${pids}"
    printf 'etcd_url=%q\nname=%q\n' "${etcd_url}" "${name}" >"${dir}/settings"

    etcd --name tucana-local --data-dir "${dir}/etcd" \
        --listen-client-urls "${etcd_url}" --advertise-client-urls "${etcd_url}" \
        --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
        --initial-cluster "tucana-local=http://127.0.0.1:$((etcd_port + 1))" \
        >"${dir}/etcd.log" 2>&1 &
    echo "etcd $!" >>"${pids}"
    wait_for_port "${etcd_port}" etcd "${dir}/etcd.log"

    addresses=()
    for i in $(seq 0 $((servers - 1))); do
        p=$((port + i))
        mkdir -p "${dir}/server-${p}"
        "${tucana}" --db "${dir}/server-${p}/volume.tucana" serve --port "${p}" \
            --repl-port "$((p + 10000))" --cluster-etcd "${etcd_url}" --cluster-name "${name}" \
            >"${dir}/server-${p}.log" 2>&1 &
        echo "server-${p} $!" >>"${pids}"
        addresses+=("127.0.0.1:${p}")
    done
    for i in $(seq 0 $((servers - 1))); do
        p=$((port + i))
        wait_for_port "${p}" "server ${p}" "${dir}/server-${p}.log"
    done

    # A restarted cluster has its map already: wait until every server has registered
    # again (a server killed without a clean stop waits for its old lease to expire).
    if [[ -f "${dir}/created" ]]; then
        for _ in $(seq 1 300); do
            if "${tucana}" cluster status --etcd "${etcd_url}" --name "${name}" 2>/dev/null |
                grep -q "^live servers: ${servers}\$"; then
                break
            fi
            sleep 0.1
        done
    fi
    if [[ ! -f "${dir}/created" ]]; then
        "${tucana}" cluster create --etcd "${etcd_url}" --name "${name}" \
            --replicas "${replicas}" "${addresses[@]}"
        touch "${dir}/created"
    fi
    # Each server learns the map through its etcd watch: wait until all serve it.
    for i in $(seq 0 $((servers - 1))); do
        p=$((port + i))
        for _ in $(seq 1 300); do
            cluster_state "${p}" | grep -q "cluster_state:ok" && break
            sleep 0.1
        done
    done
    "${tucana}" cluster status --etcd "${etcd_url}" --name "${name}"
    echo
    echo "cluster up: redis-cli -c -p ${port}   (stop: scripts/cluster.sh stop --dir ${dir})"
}

stop() {
    if [[ ! -f "${pids}" ]]; then
        echo "cluster.sh: nothing started from ${dir}"
        return 0
    fi
    # Servers first, with SIGTERM: a server that shuts down cleanly gives its lease back,
    # so etcd drops its key at once. etcd last.
    for role in server etcd; do
        while read -r what pid; do
            [[ "${what}" == "${role}"* ]] || continue
            kill -TERM "${pid}" 2>/dev/null || continue
            for _ in $(seq 1 100); do
                kill -0 "${pid}" 2>/dev/null || break
                sleep 0.1
            done
            if kill -0 "${pid}" 2>/dev/null; then
                echo "cluster.sh: ${what} (pid ${pid}) did not stop in 10 s; killing it" >&2
                kill -KILL "${pid}" 2>/dev/null || true
            fi
            echo "stopped ${what}"
        done <"${pids}"
    done
    rm -f "${pids}"
}

case "${action}" in
    start) start ;;
    stop) stop ;;
    status)
        load_settings
        "${tucana}" cluster status --etcd "${etcd_url}" --name "${name}"
        ;;
    -h|--help) usage 0 ;;
    *) echo "cluster.sh: unknown action ${action}" >&2; usage 2 ;;
esac
