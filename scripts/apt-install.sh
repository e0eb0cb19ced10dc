#!/usr/bin/env bash
# Shared by the *-deps.sh scripts (sourced, not run): `apt_install_missing TOOLS -- PACKAGES`
# installs Debian's PACKAGES with apt-get unless every one of TOOLS is already on PATH.
# Needs root (or sudo) and Debian/Ubuntu's apt.

apt_install_missing() {
    local tools=() packages=() missing=0 sudo=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do
        tools+=("$1")
        shift
    done
    shift
    packages=("$@")
    for tool in "${tools[@]}"; do
        command -v "${tool}" >/dev/null 2>&1 || missing=1
    done
    if [[ "${missing}" == 0 ]]; then
        return 0
    fi
    if [[ "$(id -u)" != 0 ]]; then
        sudo=(sudo)
    fi
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get update -qq </dev/null
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${packages[@]}" </dev/null
}
