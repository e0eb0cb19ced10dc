#!/usr/bin/env bash
# The devices benchmark of issue 21 (`tucana-bench devices` over throttled devices):
# makes N loop devices over files in a data directory, puts an ext4 file system on each
# and mounts it (members are files on them), or with RAW_DEVICES=1 gives the loop devices
# themselves to the volume as raw block-device members (O_DIRECT writes, discards;
# each run formats them with --format-devices after blkdiscard wiped the last run's
# volume), throttles each loop device with the cgroup v1 blkio controller
# (blkio.throttle.write_bps_device / read_bps_device with its MAJ:MIN) in a cgroup the
# benchmark process joins, runs the cases below (each inside a memory cgroup, the
# harness's --memory-limit-bytes), prints one line per run, and takes everything down
# again (also on failure or Ctrl-C).
#
# Cases: 3 equal members at 20 MiB/s against 1 (target >= 2.7x); unequal members 10/20/40
# MiB/s, least weighted queue length against round-robin (target >= 1.5x); writes in
# flight per member 1 -> 16 on one unthrottled member (segments queued, one written at a
# time). Case inflight-depth (not in the default CASES): one member, DEPTH_THROTTLE MiB/s
# (default 0: unthrottled), 8 segments queued, the segment writes running at once per
# member (`--writes-in-flight-depth`) taking each of DEPTHS (default "1 2 4 8") in turn
# within each round, segment writes waiting for the device unless DEPTH_WAIT=false, with
# the device's own MiB/s (its /sys/block stat) and the CPU per record printed. Each
# throttled case runs with segment writes waiting for the device (what LWQL needs to see
# a device's backlog) and, for comparison, without (buffered writes: see BENCHMARKS.md, "Devices", for what the
# throttle does to them). Case gc-burst (not in the default CASES): one member at 20
# MiB/s, load, overwrite every record while a reader gets random records, then
# SETTLE_SECONDS more of reading while background GC collects; trims scheduled against
# trims punched at release, alternated, read p50/p99/p99.9 printed (records into
# TRIMS_JSON, default ${DATA_DIR}/trims.jsonl, apart from the load records). Case
# hot-range (not in the default CASES): 3 members at 20 MiB/s reads and writes; HOT_RECORDS
# (150000) records placed on member 0, then RECORDS new records loaded while READERS (4)
# threads get random hot records; round-robin against least weighted queue length, with
# the writers' MiB/s, the hot reads per second and the spread of the members' queues
# printed (records into JSON with the others, "case": "hot-range"). QUEUE_DEPTH (unset:
# members on the throttled loop devices): each member's file system is on an upper loop
# device QUEUE_DEPTH requests deep over a file on the throttled one, so that its reads
# and writes share a queue (blkio alone throttles them with separate budgets); INNER_BYTES
# (900M) is the size of the upper device's file. Case ycsb-a (not in the default CASES):
# RECORDS loaded inside the memory cgroup, then YCSB A (zipfian, half reads, half updates)
# by YCSB_THREADS (4) clients for YCSB_SECONDS (20), segment writes waiting for the
# device: 1 member at 20 MiB/s, 3 at 20 MiB/s (round-robin and LWQL), then 10/20/40 MiB/s
# round-robin and LWQL; ops/s, queue spread and MiB written and read per member printed
# (records into JSON with the others, "case": "ycsb-a").
#
# Needs root, losetup, mkfs.ext4 and /sys/fs/cgroup/blkio (cgroup v1); skips with a
# message (exit 0) where any is missing. Settings (environment): DATA_DIR (default
# /var/tmp/tucana-devices), RECORDS (300000 records of 16 + VALUE_BYTES bytes),
# VALUE_BYTES (1000), MEMORY_LIMIT_BYTES (134217728), LOOP_BYTES (size of each backing
# file, sparse; 1G), ROUNDS (1), JSON (a file the runs' records are appended to), BENCH
# (the tucana-bench binary; built in release when unset), CASES (default "equal unequal
# depth"; also "unequal-deep", "inflight-depth", "hot-range", "ycsb-a" and "gc-burst"), SETTLE_SECONDS (10), MOUNT_OPTIONS (of
# the members' file systems, noatime; noatime,discard makes each punch a synchronous
# discard of the loop device), RAW_DEVICES (0; 1: members are the loop devices, no file
# system; each needs whole 128 MiB slots, so LOOP_BYTES of 1G holds 8), DEPTHS,
# DEPTH_THROTTLE and DEPTH_WAIT (case inflight-depth).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

skip() {
    echo "bench-devices: skipped: $*"
    exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root (loop devices, mounts, cgroups)"
blkio=/sys/fs/cgroup/blkio
[ -f "${blkio}/blkio.throttle.write_bps_device" ] ||
    skip "no cgroup v1 blkio controller at ${blkio}"
raw_devices="${RAW_DEVICES:-0}"
for tool in losetup mkfs.ext4 mount umount blkdiscard; do
    command -v "${tool}" >/dev/null || skip "no ${tool}"
done

data_dir="${DATA_DIR:-/var/tmp/tucana-devices}"
records="${RECORDS:-300000}"
value_bytes="${VALUE_BYTES:-1000}"
memory_limit="${MEMORY_LIMIT_BYTES:-134217728}"
loop_bytes="${LOOP_BYTES:-1G}"
rounds="${ROUNDS:-1}"
cases="${CASES:-equal unequal depth}"
json="${JSON:-${data_dir}/devices.jsonl}"
trims_json="${TRIMS_JSON:-${data_dir}/trims.jsonl}"
settle_seconds="${SETTLE_SECONDS:-10}"
mount_options="${MOUNT_OPTIONS:-noatime}"
if [ -z "${BENCH:-}" ]; then
    cargo build -q --release -p tucana-bench
    BENCH="${CARGO_TARGET_DIR:-target}/release/tucana-bench"
fi

queue_depth="${QUEUE_DEPTH:-}"
[ -n "${queue_depth}" ] && [ "${raw_devices}" = 1 ] &&
    skip "QUEUE_DEPTH needs member files (RAW_DEVICES=0)"
loops=()
mounted=()
upper_loops=()
lower_mounted=()
cgroup="${blkio}/tucana-devices-$$"
cleanup() {
    set +e
    for m in "${mounted[@]}"; do umount "${m}"; done
    for l in "${upper_loops[@]}"; do losetup -d "${l}"; done
    for m in "${lower_mounted[@]}"; do umount "${m}"; done
    for l in "${loops[@]}"; do losetup -d "${l}"; done
    [ -d "${cgroup}" ] && rmdir "${cgroup}"
    rm -rf "${data_dir}/backing" "${data_dir}/m"* "${data_dir}/lower"*
}
trap cleanup EXIT

mkdir -p "${data_dir}/backing"
for i in 0 1 2; do
    truncate -s "${loop_bytes}" "${data_dir}/backing/${i}.img"
    # Direct I/O from the loop device to its backing file: the data is not cached twice,
    # and the loop device's own rate is what the throttle sets.
    loop="$(losetup --direct-io=on -f --show "${data_dir}/backing/${i}.img")"
    loops+=("${loop}")
    [ "${raw_devices}" = 1 ] && continue
    # Inode tables and journal initialised now, not by a kernel thread during the runs.
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard "${loop}"
    members_device="${loop}"
    if [ -n "${queue_depth}" ]; then
        # A device whose reads and writes share one queue: an upper loop device, QUEUE_DEPTH
        # requests deep, over a file on the throttled loop device. blkio throttles reads
        # and writes with separate budgets, so on a throttled loop device alone a member's
        # reads never slow its writes; here a request waiting at the throttle below holds
        # one of the upper device's few tags, and reads and writes wait for each other.
        mkdir -p "${data_dir}/lower${i}"
        mount -o noatime "${loop}" "${data_dir}/lower${i}"
        lower_mounted+=("${data_dir}/lower${i}")
        truncate -s "${INNER_BYTES:-900M}" "${data_dir}/lower${i}/inner.img"
        members_device="$(losetup --direct-io=on -f --show "${data_dir}/lower${i}/inner.img")"
        upper_loops+=("${members_device}")
        echo "${queue_depth}" >"/sys/block/$(basename "${members_device}")/queue/nr_requests"
        mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard "${members_device}"
    fi
    mkdir -p "${data_dir}/m${i}"
    mount -o "${mount_options}" "${members_device}" "${data_dir}/m${i}"
    mounted+=("${data_dir}/m${i}")
done

# member I: the path of member I, made empty for a new volume (a raw device is discarded
# whole: the backing file gives the space back and the device reads zeros, so the next
# run formats it afresh; a file is removed).
member() {
    local i="$1"
    if [ "${raw_devices}" = 1 ]; then
        blkdiscard "${loops[$i]}"
        echo "${loops[$i]}"
    else
        rm -f "${data_dir}/m${i}/member.tucana"
        echo "${data_dir}/m${i}/member.tucana"
    fi
}
format_args=()
[ "${raw_devices}" = 1 ] && format_args=(--format-devices)
mkdir "${cgroup}"

# throttle R0 R1 R2: MiB/s for reads and writes of each loop device (0: none).
throttle() {
    local i=0
    for rate in "$@"; do
        local dev
        dev="$(cat "/sys/block/$(basename "${loops[$i]}")/dev")"
        echo "${dev} $((rate << 20))" >"${cgroup}/blkio.throttle.write_bps_device"
        echo "${dev} $((rate << 20))" >"${cgroup}/blkio.throttle.read_bps_device"
        i=$((i + 1))
    done
}

# run LABEL MEMBERS POLICY IN_FLIGHT WAIT [DEPTH]: one load over members 0..MEMBERS-1,
# inside the blkio cgroup (and the memory cgroup the harness makes); DEPTH segment writes
# run at once per member (default: the engine's). One member: its device's bytes written
# are measured too.
run() {
    local label="$1" n="$2" policy="$3" in_flight="$4" wait="$5" depth="${6:-}"
    [ "${raw_devices}" = 1 ] && label="raw ${label}"
    local args=()
    for ((i = 0; i < n; i++)); do
        args+=(--member "$(member "${i}")")
    done
    [ -n "${depth}" ] && args+=(--writes-in-flight-depth "${depth}")
    [ "${n}" = 1 ] && args+=(--device-stat "/sys/block/$(basename "${loops[0]}")/stat")
    sync
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "${cgroup}" \
        "${BENCH}" devices "${args[@]}" "${format_args[@]}" --policy "${policy}" --records "${records}" \
        --value-bytes "${value_bytes}" --writes-in-flight "${in_flight}" \
        --wait-for-device "${wait}" --memory-limit-bytes "${memory_limit}" \
        --label "${label}" --json "${json}"
    for ((i = 0; i < n; i++)); do rm -f "${data_dir}/m${i}/member.tucana"; done
}

# hot_range LABEL POLICY: the hot-range case over members 0..2, inside the blkio cgroup.
hot_range() {
    local label="$1" policy="$2"
    [ "${raw_devices}" = 1 ] && label="raw ${label}"
    local args=()
    for i in 0 1 2; do
        args+=(--member "$(member "${i}")")
    done
    sync
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "${cgroup}" \
        "${BENCH}" devices "${args[@]}" "${format_args[@]}" --hot-range --policy "${policy}" \
        --hot-records "${HOT_RECORDS:-150000}" --readers "${READERS:-4}" \
        --records "${records}" --value-bytes "${value_bytes}" --wait-for-device true \
        --memory-limit-bytes "${memory_limit}" --label "${label}" --json "${json}"
    for i in 0 1 2; do rm -f "${data_dir}/m${i}/member.tucana"; done
}

# ycsb_a LABEL MEMBERS POLICY: the ycsb-a case over members 0..MEMBERS-1, inside the blkio
# cgroup.
ycsb_a() {
    local label="$1" n="$2" policy="$3"
    [ "${raw_devices}" = 1 ] && label="raw ${label}"
    local args=()
    for ((i = 0; i < n; i++)); do
        args+=(--member "$(member "${i}")")
    done
    sync
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "${cgroup}" \
        "${BENCH}" devices "${args[@]}" "${format_args[@]}" --ycsb-a --policy "${policy}" \
        --seconds "${YCSB_SECONDS:-20}" --ycsb-threads "${YCSB_THREADS:-4}" \
        --records "${records}" --value-bytes "${value_bytes}" --wait-for-device true \
        --memory-limit-bytes "${memory_limit}" --label "${label}" --json "${json}"
    for ((i = 0; i < n; i++)); do rm -f "${data_dir}/m${i}/member.tucana"; done
}

# gc_burst LABEL TRIMS: the GC-burst case on member 0, inside the blkio cgroup.
gc_burst() {
    local label="$1" trims="$2"
    [ "${raw_devices}" = 1 ] && label="raw ${label}"
    local m0
    m0="$(member 0)"
    sync
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "${cgroup}" \
        "${BENCH}" devices --member "${m0}" "${format_args[@]}" --gc-burst \
        --trims "${trims}" --settle-seconds "${settle_seconds}" --records "${records}" \
        --value-bytes "${value_bytes}" --memory-limit-bytes "${memory_limit}" \
        --label "${label}" --json "${trims_json}"
    rm -f "${data_dir}/m0/member.tucana"
}

echo "bench-devices: ${records} records of $((16 + value_bytes)) bytes, memory limit ${memory_limit}, loop devices ${loops[*]} ($([ "${raw_devices}" = 1 ] && echo "raw members" || echo "ext4, member files")${queue_depth:+, over upper loop devices ${upper_loops[*]} ${queue_depth} requests deep}), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "${rounds}"); do
    for case in ${cases}; do
        case "${case}" in
        equal)
            throttle 20 20 20
            for wait in true false; do
                run "equal-1x20 wait=${wait}" 1 round-robin 4 "${wait}"
                run "equal-3x20 wait=${wait}" 3 round-robin 4 "${wait}"
                run "equal-3x20 wait=${wait}" 3 lwql 4 "${wait}"
            done
            ;;
        unequal)
            throttle 10 20 40
            for wait in true false; do
                run "unequal-10/20/40 wait=${wait}" 3 round-robin 4 "${wait}"
                run "unequal-10/20/40 wait=${wait}" 3 lwql 4 "${wait}"
            done
            ;;
        unequal-deep)
            # The same with more segments in flight per member.
            throttle 10 20 40
            for in_flight in 8 16; do
                run "unequal-10/20/40 wait=true" 3 round-robin "${in_flight}" true
                run "unequal-10/20/40 wait=true" 3 lwql "${in_flight}" true
            done
            ;;
        depth)
            throttle 0 0 0
            for in_flight in 1 2 4 8 16; do
                run "depth unthrottled" 1 round-robin "${in_flight}" true 1
            done
            ;;
        inflight-depth)
            throttle "${DEPTH_THROTTLE:-0}" 0 0
            for depth in ${DEPTHS:-1 2 4 8}; do
                run "inflight-depth ${DEPTH_THROTTLE:-0} wait=${DEPTH_WAIT:-true}" 1 round-robin 8 \
                    "${DEPTH_WAIT:-true}" "${depth}"
            done
            ;;
        hot-range)
            throttle 20 20 20
            hot_label="hot-range 3x20 wait=true"
            [ -n "${queue_depth}" ] && hot_label="${hot_label} queue=${queue_depth}"
            [ "${READERS:-4}" != 4 ] && hot_label="${hot_label} readers=${READERS}"
            [ "${HOT_RECORDS:-150000}" != 150000 ] && hot_label="${hot_label} hot=${HOT_RECORDS}"
            [ "${memory_limit}" != 134217728 ] && hot_label="${hot_label} memory=${memory_limit}"
            hot_range "${hot_label}" round-robin
            hot_range "${hot_label}" lwql
            ;;
        ycsb-a)
            throttle 20 20 20
            ycsb_a "ycsb-a equal-1x20" 1 round-robin
            ycsb_a "ycsb-a equal-3x20" 3 round-robin
            ycsb_a "ycsb-a equal-3x20" 3 lwql
            throttle 10 20 40
            ycsb_a "ycsb-a unequal-10/20/40" 3 round-robin
            ycsb_a "ycsb-a unequal-10/20/40" 3 lwql
            ;;
        gc-burst)
            throttle 20 0 0
            gc_burst "gc-burst 1x20 ${mount_options}" scheduled
            gc_burst "gc-burst 1x20 ${mount_options}" at-release
            ;;
        *) echo "bench-devices: unknown case ${case}" >&2; exit 2 ;;
        esac
    done
done
echo "bench-devices: records appended to ${json}"
