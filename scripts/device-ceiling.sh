#!/usr/bin/env bash
# The data directory's device ceiling, so benchmark figures can be read against the physical
# limit: fio's sequential write (1 MiB blocks, O_DIRECT) and 4 KiB random read at queue
# depth 32 (O_DIRECT, io_uring, else libaio), short time-based runs on one test file in DIR.
# Prints MB/s and IOPS, and with --json FILE writes them for `tucana-bench suite
# --device-ceiling-json FILE` (or `report --device-ceiling-json FILE`), which puts them in
# BENCHMARKS.md's machine section.
#   scripts/device-ceiling.sh /var/tmp/bench --json bench/device-ceiling.json
# Options: --runtime-secs N (each test, default 20), --file-mib N (test file, default 2048),
# --note TEXT (kept in the JSON and shown after the figures, e.g. what else ran).
# Installs fio with apt-get when missing; skips with a message (exit 0, no JSON) where it
# cannot: no apt, a file system without O_DIRECT (tmpfs), too little free space. Other work
# on the device during the run lowers the figures: run it on a quiet machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/apt-install.sh
source scripts/apt-install.sh

skip() {
    echo "device-ceiling: skipped: $*" >&2
    exit 0
}

dir=""
json=""
runtime_secs=20
file_mib=2048
note=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --json) json="$2"; shift 2 ;;
        --runtime-secs) runtime_secs="$2"; shift 2 ;;
        --file-mib) file_mib="$2"; shift 2 ;;
        --note) note="$2"; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) dir="$1"; shift ;;
    esac
done
if [[ -z "${dir}" ]]; then
    echo "usage: scripts/device-ceiling.sh DIR [--json FILE] [--runtime-secs N] [--file-mib N]" >&2
    exit 2
fi
mkdir -p "${dir}"

if ! command -v fio >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || skip "fio is not installed and there is no apt-get"
    apt_install_missing fio -- fio || skip "installing fio with apt-get failed"
fi
command -v python3 >/dev/null 2>&1 || skip "python3 (to read fio's JSON) is missing"

fs_type="$(stat -f -c %T "${dir}")"
case "${fs_type}" in
    tmpfs|ramfs|overlayfs) skip "${dir} is on ${fs_type}, not on a device" ;;
esac
free_mib=$(( $(df -Pk "${dir}" | awk 'NR==2 {print $4}') / 1024 ))
if (( free_mib < file_mib * 2 )); then
    skip "${free_mib} MiB free in ${dir}, the test needs twice the ${file_mib} MiB test file"
fi

test_file="${dir}/device-ceiling.fio"
out="$(mktemp -d)"
trap 'rm -rf "${out}" "${test_file}"' EXIT

# io_uring where the kernel and fio have it, else libaio.
engine=""
for candidate in io_uring libaio; do
    if fio --name=probe --filename="${test_file}" --size=4M --bs=4k --rw=read --direct=1 \
        --ioengine="${candidate}" --output=/dev/null >/dev/null 2>&1; then
        engine="${candidate}"
        break
    fi
done
[[ -n "${engine}" ]] || skip "fio cannot do O_DIRECT asynchronous I/O in ${dir} (tmpfs, or neither io_uring nor libaio works)"

common=(--filename="${test_file}" --size="${file_mib}M" --direct=1 --ioengine="${engine}"
    --time_based --runtime="${runtime_secs}" --ramp_time=2 --group_reporting
    --output-format=json)
# The sequential write first: it also lays out the file the random reads read.
fio --name=seq-write "${common[@]}" --rw=write --bs=1M --iodepth=8 --output="${out}/write.json" \
    >/dev/null
fio --name=rand-read "${common[@]}" --rw=randread --bs=4k --iodepth=32 --output="${out}/read.json" \
    >/dev/null

device="$(df -P "${dir}" | awk 'NR==2 {print $1}')"
python3 - "${out}/write.json" "${out}/read.json" "${engine}" "${runtime_secs}" "${file_mib}" \
    "${dir}" "${device}" "$(fio --version)" "${json}" "${note}" <<'EOF'
import json, sys
write_path, read_path, engine, runtime, file_mib, dir_, device, version, out, note = sys.argv[1:]
write = json.load(open(write_path))["jobs"][0]["write"]
read = json.load(open(read_path))["jobs"][0]["read"]
result = {
    "tool": version,
    "dir": dir_,
    "device": device,
    "ioengine": engine,
    "runtime_s": int(runtime),
    "file_bytes": int(file_mib) << 20,
    # fio's bw_bytes is bytes per second; MB here is 10^6 bytes, as device makers count.
    "seq_write_block": "1 MiB, depth 8, O_DIRECT",
    "seq_write_mb_s": round(write["bw_bytes"] / 1e6, 1),
    "rand_read_block": "4 KiB, depth 32, O_DIRECT",
    "rand_read_iops": round(read["iops"]),
    "rand_read_mb_s": round(read["bw_bytes"] / 1e6, 1),
}
if note:
    result["note"] = note
print(f"device-ceiling: {device} under {dir_} ({version}, {engine}, {runtime} s each):")
print(f"  sequential write 1 MiB blocks: {result['seq_write_mb_s']} MB/s")
print(f"  random read 4 KiB at depth 32: {result['rand_read_iops']} IOPS ({result['rand_read_mb_s']} MB/s)")
if out:
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"  written to {out}")
EOF
