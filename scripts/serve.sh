#!/usr/bin/env bash
# The README's run command: runs `tucana serve` (release build) with the given arguments,
# e.g. `scripts/serve.sh --port 7000`. Installs protoc first if it is missing
# (scripts/cluster-deps.sh --protoc-only: tucana-cli links the cluster crate, whose etcd
# client's build compiles etcd's protobuf files).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/cluster-deps.sh --protoc-only
exec cargo run --release -p tucana-cli -- serve "$@"
