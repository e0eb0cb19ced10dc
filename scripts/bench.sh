#!/usr/bin/env bash
# Builds tucana-bench in release mode with every peer and the plots, then runs it with the
# given arguments. RocksDB links Debian's librocksdb (scripts/bench-deps.sh installs it)
# unless BUNDLED_ROCKSDB=1, which compiles RocksDB from source (about 16 minutes here).
#   scripts/bench.sh suite --dir /var/tmp --json bench/results.json
#   scripts/bench.sh report bench/results.json
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

features="all-peers,plots"
if [[ "${BUNDLED_ROCKSDB:-0}" == 1 ]]; then
    unset ROCKSDB_LIB_DIR
    features="${features},rocksdb-bundled"
else
    export ROCKSDB_LIB_DIR="${ROCKSDB_LIB_DIR:-/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)}"
    if [[ ! -e "${ROCKSDB_LIB_DIR}/librocksdb.so" ]]; then
        echo "no librocksdb.so in ${ROCKSDB_LIB_DIR}: run scripts/bench-deps.sh (or BUNDLED_ROCKSDB=1)" >&2
        exit 1
    fi
fi
cargo build --release -p tucana-bench --features "${features}"
exec target/release/tucana-bench "$@"
