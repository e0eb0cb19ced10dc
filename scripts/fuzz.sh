#!/usr/bin/env bash
# Row M5 of docs/reliability.md: runs every fuzz target of fuzz/ for a given time and
# prints one figure line per target:
#   M5 <target>: <runs> runs, 0 crashes
# Usage: scripts/fuzz.sh [seconds-per-target] [target...]   (default 60 s, all targets)
# Needs the nightly toolchain and cargo-fuzz (installed here if missing). A crash (panic,
# abort, sanitizer report, leak, timeout of one input) stops that target, leaves its input
# in fuzz/artifacts/<target>/ (replay: cargo +nightly fuzz run <target> <file>), and makes
# the script exit 1 after the remaining targets ran. Corpora grow in fuzz/corpus/<target>/
# (not committed), so later runs start where earlier ones stopped. FUZZ_JOBS targets run at
# once (default: the number of cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(superblock descriptor node log_record buddy open resp_decode repl_frame node_rewrite collection_records packed_hash)
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "the nightly toolchain is needed: rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz >&2
fi

cd fuzz
# One build for all targets (release with debug assertions, address sanitizer).
cargo +nightly fuzz build -O >&2

# libFuzzer runs one process per target on one core: run FUZZ_JOBS targets at once
# (default: one per core), each in its own corpus directory, and print their figure lines
# in the targets' order once all have run.
jobs="${FUZZ_JOBS:-$(nproc)}"
results="$(mktemp -d)"
trap 'rm -rf "${results}"' EXIT

fuzz_one() {
    local target="$1" log="${results}/$1.log" crashes=0
    # -timeout: one input running this long counts as a crash (a hang on bad bytes).
    if ! cargo +nightly fuzz run -O "${target}" -- \
        -max_total_time="${seconds}" -timeout=20 -print_final_stats=1 >"${log}" 2>&1; then
        crashes=1
    fi
    local runs
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "${log}" | grep -o "[0-9]*$" | tail -1 || true)"
    echo "M5 ${target}: ${runs:-0} runs, ${crashes} crashes" >"${results}/${target}.line"
    echo "${crashes}" >"${results}/${target}.crashes"
}

running=0
for target in "${targets[@]}"; do
    if [ "${running}" -ge "${jobs}" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    fuzz_one "${target}" &
    running=$((running + 1))
done
wait

failed=0
for target in "${targets[@]}"; do
    cat "${results}/${target}.line"
    if [ "$(cat "${results}/${target}.crashes")" -ne 0 ]; then
        failed=1
        echo "---- ${target} failed; the end of its log:" >&2
        grep -v '^#[0-9]' "${results}/${target}.log" | tail -40 | cut -c1-400 >&2
        ls -t "artifacts/${target}/" 2>/dev/null | head -3 | sed "s|^|  artifact: fuzz/artifacts/${target}/|" >&2
    fi
done
exit "${failed}"
