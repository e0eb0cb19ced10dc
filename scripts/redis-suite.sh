#!/usr/bin/env bash
# Redis 7.0.15's own test suite (TCL), run in external-server mode against `tucana serve`:
# one `runtest` per unit, each against a fresh server, and a count of passed and
# failed tests per unit (issue 23's proof), and the few skipped because they would
# derail the rest of their unit (scripts/redis-suite-skips.txt, with reasons). Exit 0
# when the run completed, whatever the counts: failures are listed, with reasons, in
# docs/redis-suite.md.
#
#   scripts/redis-suite.sh                          # the units of issue 23
#   scripts/redis-suite.sh unit/type/list unit/scan # some units
#   TUCANA_BIN=target/release/tucana scripts/redis-suite.sh
#
# Needs the suite (../shared/redis-tests/redis-7.0.15-tests.tar.gz next to the repository,
# or REDIS_TESTS=path/to/tarball) and tclsh (Debian's `tcl`, installed here with apt when
# missing and possible); skips with a message, exit 0, when either is absent.
# Environment: TUCANA_BIN (default: built with cargo, debug), UNIT_TIMEOUT_S (600),
# RESULTS (a file to write the per-unit table to), KEEP=1 (keep the work directory).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

tarball="${REDIS_TESTS:-${repo}/../shared/redis-tests/redis-7.0.15-tests.tar.gz}"
if [[ ! -f "${tarball}" ]]; then
    echo "skipped: Redis's test suite not found at ${tarball} (set REDIS_TESTS)"
    exit 0
fi
if ! command -v tclsh >/dev/null 2>&1; then
    # shellcheck source=apt-install.sh
    source "${repo}/scripts/apt-install.sh"
    if command -v apt-get >/dev/null 2>&1; then
        apt_install_missing tclsh -- tcl || true
    fi
    if ! command -v tclsh >/dev/null 2>&1; then
        echo "skipped: tclsh not found and could not be installed (apt-get install tcl)"
        exit 0
    fi
fi

units=("$@")
# unit/info runs no test in external-server mode (the whole file is tagged
# external:skip); it stays so that the table shows it (docs/redis-suite.md).
if [[ ${#units[@]} -eq 0 ]]; then
    units=(
        unit/type/string unit/type/incr unit/keyspace unit/scan unit/multi
        unit/protocol unit/info unit/other unit/expire
        unit/type/hash unit/type/list unit/type/set unit/type/zset
    )
fi

bin="${TUCANA_BIN:-}"
if [[ -z "${bin}" ]]; then
    (cd "${repo}" && cargo build -q -p tucana-cli)
    bin="${CARGO_TARGET_DIR:-${repo}/target}/debug/tucana"
fi

work="$(mktemp -d)"
server_pid=""
cleanup() {
    if [[ -n "${server_pid}" ]] && kill -0 "${server_pid}" 2>/dev/null; then
        kill "${server_pid}" 2>/dev/null || true
        wait "${server_pid}" 2>/dev/null || true
    fi
    if [[ "${KEEP:-0}" != 1 ]]; then
        rm -rf "${work}"
    else
        echo "kept ${work}"
    fi
}
trap cleanup EXIT

tar xzf "${tarball}" -C "${work}"

# A fresh server (and volume) per unit: a test that fails half-way can leave a setting
# changed (e.g. hash-max-ziplist-entries 0) that would fail the next units.
start_server() {
    local name="$1"
    if [[ -n "${server_pid}" ]] && kill -0 "${server_pid}" 2>/dev/null; then
        kill "${server_pid}" 2>/dev/null || true
        wait "${server_pid}" 2>/dev/null || true
    fi
    rm -f "${work}/volume.tucana"
    # Buffered durability: the suite tests replies, not fsyncs; sync mode only slows it.
    "${bin}" --db "${work}/volume.tucana" serve --port 0 --durability buffered --enable-debug-command \
        2>"${work}/server-${name}.log" &
    server_pid=$!
    port=""
    for _ in $(seq 1 600); do
        port="$(sed -n 's/.* on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "${work}/server-${name}.log" 2>/dev/null || true)"
        [[ -n "${port}" ]] && return 0
        sleep 0.05
    done
    echo "server did not start:" >&2
    cat "${work}/server-${name}.log" >&2
    exit 1
}

# Tests that would derail the rest of their unit (reasons in the file).
grep -v '^#' "${repo}/scripts/redis-suite-skips.txt" | sed '/^$/d' >"${work}/skips"

table="$(printf '%-20s %6s %6s %7s %8s\n' unit passed failed skipped total)"
total_ok=0
total_err=0
total_skipped=0
for unit in "${units[@]}"; do
    name="$(echo "${unit}" | tr / _)"
    log="${work}/${name}.log"
    start_server "${name}"
    started=$SECONDS
    (cd "${work}" && timeout "${UNIT_TIMEOUT_S:-600}" ./runtest --host 127.0.0.1 --port "${port}" \
        --singledb --durable --clients 1 --timeout 60 --skipfile "${work}/skips" \
        --single "${unit}") \
        2>&1 </dev/null | sed 's/\x1b\[[0-9;]*m//g' >"${log}" || true
    ok=$(grep -c '^\[ok\]:' "${log}" || true)
    err=$(grep -cE '^\[(err|exception)\]:' "${log}" || true)
    skipped=$(grep -Fxf "${work}/skips" <(sed -n 's/^\[skip\]: //p' "${log}") | wc -l || true)
    if ! grep -q 'All tests passed\|tests failed' "${log}"; then
        note=" (did not finish: see below)"
    else
        note=""
    fi
    line="$(printf '%-20s %6d %6d %7d %8d%s' "${unit}" "${ok}" "${err}" "${skipped}" "$((ok + err + skipped))" "${note}")"
    echo "${line}   [$((SECONDS - started)) s]"
    table+=$'\n'"${line}"
    grep -E '^\[(err|exception)\]:' "${log}" | sed 's/^/    /' | head -100 || true
    if [[ -n "${note}" ]]; then
        tail -5 "${log}" | sed 's/^/    | /'
    fi
    total_ok=$((total_ok + ok))
    total_err=$((total_err + err))
    total_skipped=$((total_skipped + skipped))
    if ! kill -0 "${server_pid}" 2>/dev/null; then
        echo "the server died during ${unit}:" >&2
        tail -20 "${work}/server-${name}.log" >&2
        exit 1
    fi
done
table+=$'\n'"$(printf '%-20s %6d %6d %7d %8d' total "${total_ok}" "${total_err}" "${total_skipped}" "$((total_ok + total_err + total_skipped))")"
echo
echo "${table}"
if [[ -n "${RESULTS:-}" ]]; then
    echo "${table}" >"${RESULTS}"
fi
