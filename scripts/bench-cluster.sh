#!/usr/bin/env bash
# Redis Cluster side by side with a Tucana cluster on this machine (issue 19): Redis 7 with
# 3 masters + 1 replica each (appendonly yes, appendfsync everysec) against etcd + 3 Tucana
# servers with 1 backup per region (sync, and buffered): redis-benchmark --cluster SET/GET,
# then kill -9 of a master under acknowledged writes (failover time, writes lost); the
# harness's `tucana-bench cluster-compare` command. Records go to bench/cluster-results.json
# (or --json); `scripts/bench.sh report` adds them to BENCHMARKS.md.
#
#   scripts/bench-cluster.sh --dir /var/tmp            # defaults: 500k requests, 5 cycles each
#   scripts/bench-cluster.sh --quick                   # about a minute; a smoke test
#   scripts/bench-cluster.sh --help                    # every flag
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/server-deps.sh --bench >&2
# etcd for Tucana's cluster, and protoc: tucana-cli links the cluster crate, whose etcd
# client is built with it.
bash scripts/cluster-deps.sh >&2
# The server and the harness, both release builds; the harness finds `tucana` next to itself.
cargo build --release -q -p tucana-cli -p tucana-bench >&2
exec "${CARGO_TARGET_DIR:-target}/release/tucana-bench" cluster-compare "$@"
