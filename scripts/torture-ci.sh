#!/usr/bin/env bash
# The torture suites of RELIABILITY.md at their CI counts (M1, M2, M4, M6; M3 and M5 are
# run by their own scripts), in release mode. Each suite prints one figures line and
# exits non-zero on any failure, printing the seed and case that replay it:
#   cargo run --release -p tucana-torture -- m1 --seed <S> --case <C>
# TORTURE_SEED overrides the seed (default: a fixed one, so CI runs are reproducible).
# Garbage collection runs in M1, M2 and M6 (forced passes, and the background collector
# in the cases that run background threads); their figures lines count the crash states
# and I/O positions inside GC.
# Measured on a shared 2-core machine: M1 9 s, M2 8 s, M4 11 s, M6 6 s when it is quiet
# (about three times that under load), plus the release build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seed="${TORTURE_SEED:-20160622}"
cargo build --release -p tucana-torture
bin=target/release/tucana-torture

run() {
    echo "==> tucana-torture $*"
    local start=$SECONDS
    "$bin" "$@" --seed "$seed"
    echo "    ($((SECONDS - start)) s)"
}

run m1 --count 10000
run m2 --count 6
run m4 --count 2000
run m6 --count 300
echo "torture suites passed (seed ${seed})"
