#!/usr/bin/env bash
# The workspace's tests, from a fresh machine: installs what they need (redis-cli for the
# server's script test, redis-server for the tests that compare our replies with its own;
# protoc and etcd for the cluster crate), then runs
# `cargo test --workspace` with any arguments given (e.g. `scripts/test.sh --exclude
# tucana-torture`, or `-- --nocapture`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/server-deps.sh --bench
bash scripts/cluster-deps.sh
exec cargo test --workspace "$@"
