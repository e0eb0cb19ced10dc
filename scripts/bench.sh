#!/usr/bin/env bash
# Builds tucana-bench in release mode with every peer and the plots, then runs it with the
# given arguments.
#   scripts/bench.sh suite --dir /var/tmp --json bench/results.json
#   scripts/bench.sh report bench/results.json
#
# RocksDB is compiled from the sources bundled in librocksdb-sys (the current `rocksdb`
# crate cannot link Debian's librocksdb 7.8): about 16+ minutes on 2 cores the first time,
# cached afterwards. scripts/bench-deps.sh installs the C++ compiler and the libclang that
# bindgen needs. Its C++ is built with -march=native, as RocksDB's own Makefile does unless
# PORTABLE is set (without SSE4.2 its CRC32c falls back to software: librocksdb-sys's build
# warns about it); CXXFLAGS reaches only the C++ of the build, so the Rust crates, Tucana
# included, keep their usual code generation. The build honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -n "${ROCKSDB_LIB_DIR:-}" ]]; then
    echo "ROCKSDB_LIB_DIR is set (${ROCKSDB_LIB_DIR}): the rocksdb feature builds the bundled sources; unset it" >&2
    exit 1
fi
export CXXFLAGS="${CXXFLAGS:--march=native}"
cargo build --release -p tucana-bench --features all-peers,plots
exec "${CARGO_TARGET_DIR:-target}/release/tucana-bench" "$@"
