#!/usr/bin/env bash
# Installs what the cluster crate (crates/tucana-cluster) needs: `protoc`, which
# etcd-client's build runs on etcd's protobuf files (Debian's protobuf-compiler);
# `etcd`, which its tests start (Debian's etcd-server, etcd 3.4); and `ip` (iproute2),
# with which the partition test (tucana-cli's cluster_partition.rs, run as root) cuts a
# server off from etcd in a network namespace; and `go` (Debian's golang-go), which builds
# tools/lincheck, the fault campaign's linearizability checker (its one module,
# Porcupine, comes through the Go module proxy). Idempotent: does nothing when all four
# are on PATH. Needs root (or sudo) and Debian/Ubuntu's apt.
#   --protoc-only   only protoc: what building tucana-cli (which links the cluster crate
#                   through tucana-server) needs, for scripts that build it to run it
set -euo pipefail

tools=(etcd protoc ip go)
packages=(etcd-server protobuf-compiler iproute2 golang-go)
if [[ "${1:-}" == "--protoc-only" ]]; then
    tools=(protoc)
    packages=(protobuf-compiler)
fi

# shellcheck source=apt-install.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh"
apt_install_missing "${tools[@]}" -- "${packages[@]}"
# Debian's package starts an etcd service on the default ports where a service manager
# runs; the tests start their own on free ports and do not need it.
