#!/usr/bin/env bash
# redis-benchmark (GET and SET, 50 clients, pipeline 1 and 16) against `tucana serve`
# (buffered and sync) and Debian's redis-server (appendonly yes, appendfsync everysec), side
# by side, then Tucana alone on a data set larger than its memory cgroup: the harness's
# `tucana-bench server` command. Records go to bench/server-results.json (or --json);
# `scripts/bench.sh report` adds them to BENCHMARKS.md.
#
#   scripts/bench-redis.sh --dir /var/tmp            # defaults: 200k requests, 100 B, 1M keys
#   scripts/bench-redis.sh --quick --large-keys 0    # seconds; a smoke test
#   scripts/bench-redis.sh --help                    # every flag
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/server-deps.sh --bench >&2
# The server and the harness, both release builds; the harness finds `tucana` next to itself.
# tucana-cli links the cluster crate, whose etcd client is built with protoc.
bash scripts/cluster-deps.sh --protoc-only
cargo build --release -q -p tucana-cli -p tucana-bench >&2
exec "${CARGO_TARGET_DIR:-target}/release/tucana-bench" server "$@"
