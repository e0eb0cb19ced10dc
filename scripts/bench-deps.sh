#!/usr/bin/env bash
# System packages the benchmark harness needs beyond Rust, on Debian/Ubuntu:
#   librocksdb-dev     RocksDB 7.8, linked by the `rocksdb` feature (ROCKSDB_LIB_DIR) instead
#                      of the ~16-minute bundled C++ build (feature `rocksdb-bundled`);
#   clang, libclang-dev bindgen of librocksdb-sys needs libclang even when linking the system lib;
#   fonts-dejavu-core  the font the plots are drawn with.
# Idempotent; run as root (or with sudo). CI does not need it: the smoke test builds no peer.
set -euo pipefail

packages=(librocksdb-dev libclang-dev clang fonts-dejavu-core pkg-config)
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
