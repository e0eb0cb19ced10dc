#!/usr/bin/env bash
# Installs what the cluster crate (crates/tucana-cluster) needs: `protoc`, which
# etcd-client's build runs on etcd's protobuf files (Debian's protobuf-compiler), and
# `etcd`, which its tests start (Debian's etcd-server, etcd 3.4). Idempotent: does nothing
# when both are on PATH. Needs root (or sudo) and Debian/Ubuntu's apt.
#   --protoc-only   only protoc: what building tucana-cli (which links the cluster crate
#                   through tucana-server) needs, for scripts that build it to run it
set -euo pipefail

tools=(etcd protoc)
packages=(etcd-server protobuf-compiler)
if [[ "${1:-}" == "--protoc-only" ]]; then
    tools=(protoc)
    packages=(protobuf-compiler)
fi

missing=0
for tool in "${tools[@]}"; do
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
# Debian's package starts an etcd service on the default ports where a service manager
# runs; the tests start their own on free ports and do not need it.
