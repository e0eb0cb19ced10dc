#!/usr/bin/env bash
# A primary alone and with one and two backups (send-index, as Talos; build-index, as Redis
# replicas), each a `tucana serve` process on this machine: YCSB Load and A in Talos's size
# mixes, redis-benchmark SETs -P 16, and the failover of a 1 GiB region; the harness's
# `tucana-bench replication` command. Records go to bench/replication-results.json (or
# --json); `scripts/bench.sh report` adds them to BENCHMARKS.md.
#
#   scripts/bench-replication.sh --dir /var/tmp          # defaults: 1M records, 1M ops
#   scripts/bench-replication.sh --quick                 # seconds; a smoke test
#   scripts/bench-replication.sh --help                  # every flag
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/server-deps.sh --bench >&2
# The server and the harness, both release builds; the harness finds `tucana` next to itself.
# tucana-cli links the cluster crate, whose etcd client is built with protoc.
bash scripts/cluster-deps.sh --protoc-only
cargo build --release -q -p tucana-cli -p tucana-bench >&2
exec "${CARGO_TARGET_DIR:-target}/release/tucana-bench" replication "$@"
