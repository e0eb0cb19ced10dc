#!/usr/bin/env bash
# System packages the benchmark harness needs beyond Rust, on Debian/Ubuntu:
#   g++                the `rocksdb` feature compiles RocksDB from the sources bundled in
#                      librocksdb-sys (about 16+ minutes on 2 cores). Debian's librocksdb-dev
#                      is too old for the current `rocksdb` crate and is not used;
#   clang, libclang-dev bindgen of librocksdb-sys loads libclang at build time;
#   fonts-dejavu-core  the font the plots are drawn with.
# Idempotent; run as root (or with sudo). CI does not need it: the smoke test builds no peer.
set -euo pipefail

packages=(g++ libclang-dev clang fonts-dejavu-core pkg-config)
missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "${package}" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("${package}")
    fi
done
if ((${#missing[@]} == 0)); then
    echo "bench-deps: all present (${packages[*]})"
    exit 0
fi
sudo_cmd=()
if [[ "$(id -u)" != 0 ]]; then
    sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "bench-deps: installed ${missing[*]}"
