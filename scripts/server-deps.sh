#!/usr/bin/env bash
# Installs what the server's script tests and benchmark need: Debian's redis-cli
# (redis-tools), and with --bench also redis-server and redis-benchmark (redis-server
# ships redis-benchmark in redis-tools). Idempotent: does nothing when the tools are there.
# Needs root (or sudo) and Debian/Ubuntu's apt.
set -euo pipefail

need=(redis-cli)
packages=(redis-tools)
if [[ "${1:-}" == "--bench" ]]; then
    need+=(redis-server redis-benchmark)
    packages+=(redis-server)
fi

missing=0
for tool in "${need[@]}"; do
    command -v "${tool}" >/dev/null 2>&1 || missing=1
done
if [[ "${missing}" == 0 ]]; then
    exit 0
fi

sudo=()
if [[ "$(id -u)" != 0 ]]; then
    sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq </dev/null
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" </dev/null
