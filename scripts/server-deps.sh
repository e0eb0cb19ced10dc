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

# shellcheck source=apt-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh"
apt_install_missing "${need[@]}" -- "${packages[@]}"
