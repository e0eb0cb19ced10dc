//! `tucana-bench devices`: one load of a volume over the member files it is given, for
//! the comparisons of issue 21 (DESIGN.md, "Volumes over several devices"): one member
//! against three, least-weighted-queue dispatch against round-robin on members of unequal
//! speeds, the writes in flight per member from 1 to N, (`--gc-burst`, in
//! `devices/gc_burst.rs`) read latency during a GC burst with trims scheduled or punched
//! at release, and (`--hot-range`, in `devices/hot_range.rs`) the two policies while
//! readers keep one member busy with a hot key range, and (`--ycsb-a`, in
//! `devices/ycsb_a.rs`) YCSB A for a fixed time after a larger-than-memory load.
//!
//! Owns: one run (open over the members, a load of records by a few threads, a sync
//! that makes it durable, the figures) and its printed line and JSON record. Does not
//! own: the devices. `scripts/bench-devices.sh` makes them (loop devices, a file system
//! on each, a blkio cgroup throttling each, a memory cgroup), runs this once per case
//! inside them and takes them down; run alone, this measures whatever the paths are on.
//!
//! Thread-safety: the load's threads share the database handle; the figures are read
//! after they are joined.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use serde_json::json;

use crate::Result;

mod gc_burst;
mod hot_range;
mod ycsb_a;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Policy {
    RoundRobin,
    Lwql,
}

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// A member file (or raw block device) of the volume, in order; one is a
    /// single-file volume. Files are created (they must not exist, or be empty); a
    /// device must carry no Tucana volume and is formatted only with
    /// `--format-devices`.
    #[arg(long = "member", value_name = "PATH", required = true)]
    members: Vec<PathBuf>,
    /// Format the raw block devices given as members (`Options::format_block_devices`).
    #[arg(long)]
    format_devices: bool,
    /// How segments are dispatched over the members.
    #[arg(long, value_enum, default_value_t = Policy::RoundRobin)]
    policy: Policy,
    /// Records loaded.
    #[arg(long, default_value_t = 250_000)]
    records: u64,
    /// Bytes per value (keys are 16 bytes).
    #[arg(long, default_value_t = 1000)]
    value_bytes: usize,
    /// Threads sharing the load.
    #[arg(long, default_value_t = 2)]
    threads: u64,
    /// Segment writes in flight per member (`Options::writes_in_flight_segments`).
    #[arg(long, default_value_t = 4)]
    writes_in_flight: usize,
    /// Segment writes running at once per member (`Options::writes_in_flight_depth`).
    #[arg(long, default_value_t = tucana::Options::default().writes_in_flight_depth)]
    writes_in_flight_depth: usize,
    /// A block device's `/sys/block/NAME/stat`: the bytes the device wrote during the
    /// run (its sectors written, before and after) are printed and recorded.
    #[arg(long, value_name = "PATH")]
    device_stat: Option<PathBuf>,
    /// Segment writes wait until the device has their bytes
    /// (`Options::segment_writes_wait_for_device`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    wait_for_device: bool,
    /// Run inside a memory cgroup limited to this many bytes (page cache included).
    #[arg(long)]
    memory_limit_bytes: Option<u64>,
    /// A name for the case, printed and recorded.
    #[arg(long, default_value = "")]
    label: String,
    /// Append the run's record (one JSON object per line) to this file; `report
    /// --devices-json` makes BENCHMARKS.md's "Devices" section from it.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Instead of the load: load, then overwrite every record while one thread reads
    /// random records, then keep reading `--settle-seconds` while background GC collects;
    /// prints read latency (`devices/gc_burst.rs`).
    #[arg(long)]
    gc_burst: bool,
    /// With `--gc-burst`: when freed segments are trimmed.
    #[arg(long, value_enum, default_value_t = gc_burst::Trims::Scheduled)]
    trims: gc_burst::Trims,
    /// With `--gc-burst`: seconds of reading after the overwrites are durable.
    #[arg(long, default_value_t = 10)]
    settle_seconds: u64,
    /// Instead of the load: a hot range of `--hot-records` placed on member 0, then the
    /// load while `--readers` threads get hot records (`devices/hot_range.rs`).
    #[arg(long)]
    hot_range: bool,
    /// With `--hot-range`: records of the hot range.
    #[arg(long, default_value_t = 150_000)]
    hot_records: u64,
    /// With `--hot-range`: threads reading the hot range.
    #[arg(long, default_value_t = 4)]
    readers: u64,
    /// Instead of the load alone: the load, then YCSB A (zipfian, half reads, half
    /// updates) for `--seconds` (`devices/ycsb_a.rs`).
    #[arg(long)]
    ycsb_a: bool,
    /// With `--ycsb-a`: seconds of the workload.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// With `--ycsb-a`: client threads of the workload.
    #[arg(long, default_value_t = 4)]
    ycsb_threads: u64,
}

impl DevicesArgs {
    fn dispatch_policy(&self) -> tucana::volume::DispatchPolicy {
        match self.policy {
            Policy::RoundRobin => tucana::volume::DispatchPolicy::RoundRobin,
            Policy::Lwql => tucana::volume::DispatchPolicy::LeastWeightedQueue,
        }
    }
}

/// Appends `record` as one line to `--json`'s file, if given.
/// The 1-minute load average (`/proc/loadavg`'s first figure), for a run's record.
fn loadavg_1m() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
}

/// Per-member figures joined by `/` with `digits` decimals, for a run's line.
fn per_member(v: &[f64], digits: usize) -> String {
    v.iter()
        .map(|x| format!("{x:.digits$}"))
        .collect::<Vec<_>>()
        .join("/")
}

fn append_json(args: &DevicesArgs, record: &serde_json::Value) -> Result<()> {
    if let Some(path) = &args.json {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        writeln!(file, "{record}")?;
    }
    Ok(())
}

/// Puts records `0..records` (value seed `round`) from `threads` threads.
fn put_all(ks: &tucana::Keyspace, args: &DevicesArgs, threads: u64, round: u64) -> Result<()> {
    put_keys(ks, 0, args.records, round, args.value_bytes, threads)
}

/// Puts `key(first + i)` for `i` in `0..count` (values seeded `(first + i) ^ round`) from
/// `threads` threads.
fn put_keys(
    ks: &tucana::Keyspace,
    first: u64,
    count: u64,
    round: u64,
    value_bytes: usize,
    threads: u64,
) -> Result<()> {
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ks = ks.clone();
                scope.spawn(move || -> tucana::Result<()> {
                    let mut i = t;
                    while i < count {
                        ks.put(&key(first + i), &value((first + i) ^ round, value_bytes))?;
                        i += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a load thread panicked")?;
        }
        Ok(())
    })
}

/// A key: 16 bytes, spread over the key space in a fixed order (not the load's order).
fn key(i: u64) -> [u8; 16] {
    let mixed = i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) ^ i;
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&mixed.to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn value(i: u64, len: usize) -> Vec<u8> {
    // Not all one byte, so nothing below could shortcut it.
    (0..len)
        .map(|j| (i as usize).wrapping_mul(31).wrapping_add(j) as u8)
        .collect()
}

/// Bytes written by the device whose `/sys/block/NAME/stat` is `--device-stat` (field 7:
/// sectors written, in 512-byte units whatever the device's block size), if given.
fn device_written_bytes(args: &DevicesArgs) -> Result<Option<u64>> {
    let Some(path) = &args.device_stat else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)?;
    let sectors: u64 = text
        .split_whitespace()
        .nth(6)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| format!("{}: no sectors-written field in {text:?}", path.display()))?;
    Ok(Some(sectors * 512))
}

pub fn run(args: &DevicesArgs) -> Result<()> {
    if args.gc_burst {
        return gc_burst::run(args, args.trims);
    }
    if args.hot_range {
        return hot_range::run(args);
    }
    if args.ycsb_a {
        return ycsb_a::run(args);
    }
    let _cgroup = match args.memory_limit_bytes {
        Some(limit) => Some(crate::cgroup::enter(limit)?),
        None => None,
    };
    let options = tucana::Database::builder()
        .member_dispatch(args.dispatch_policy())
        .writes_in_flight_segments(args.writes_in_flight)
        .writes_in_flight_depth(args.writes_in_flight_depth)
        .segment_writes_wait_for_device(args.wait_for_device)
        .format_block_devices(args.format_devices);
    let db = options.open_members(&args.members)?;
    let ks = db.keyspace("devices")?;
    let threads = args.threads.max(1);
    let device_before = device_written_bytes(args)?;
    let cpu_before = crate::sys::process_cpu_time();
    let started = Instant::now();
    put_all(&ks, args, threads, 0)?;
    let loaded_s = started.elapsed().as_secs_f64();
    // Durable: every queued segment written and every member synced.
    db.sync()?;
    let durable_s = started.elapsed().as_secs_f64();
    let cpu_s = crate::sys::process_cpu_time()
        .saturating_sub(cpu_before)
        .as_secs_f64();
    let device_mib_per_s = match (device_before, device_written_bytes(args)?) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / (1u64 << 20) as f64 / durable_s),
        _ => None,
    };
    let cpu_us_per_record = cpu_s * 1e6 / args.records.max(1) as f64;
    let stats = db.stats();
    db.close()?;
    let record_bytes = args.records * (16 + args.value_bytes as u64);
    let mib = |bytes: u64| bytes as f64 / (1u64 << 20) as f64;
    let members: Vec<serde_json::Value> = stats
        .members
        .iter()
        .map(|m| {
            json!({
                "name": m.name,
                "kind": m.kind,
                "bytes_written": m.bytes_written,
                "write_ps_per_byte": m.write_ps_per_byte,
                "queue_done_jobs": m.queue_done_jobs,
                "idle_while_others_busy_ms": m.idle_while_others_busy_ns / 1_000_000,
            })
        })
        .collect();
    let record = json!({
        "label": args.label,
        "members": args.members.len(),
        "volume_kind": stats.volume_kind,
        "raw_devices": args.format_devices,
        "policy": format!("{:?}", args.policy),
        "records": args.records,
        "value_bytes": args.value_bytes,
        "threads": threads,
        "writes_in_flight": args.writes_in_flight,
        "writes_in_flight_depth": args.writes_in_flight_depth,
        "wait_for_device": args.wait_for_device,
        "cpu_us_per_record": cpu_us_per_record,
        "device_written_mib_per_s": device_mib_per_s,
        "memory_limit_bytes": args.memory_limit_bytes,
        "loaded_s": loaded_s,
        "durable_s": durable_s,
        "ops_per_s": args.records as f64 / durable_s,
        "mib_per_s": mib(record_bytes) / durable_s,
        "volume_written_mib_per_s": mib(stats.bytes_written) / durable_s,
        "per_member": members,
        "loadavg": loadavg_1m(),
    });
    let shares: Vec<String> = stats
        .members
        .iter()
        .map(|m| format!("{:.0}", mib(m.bytes_written)))
        .collect();
    println!(
        "{:<28} {:>2} {}(s) {:<10} in-flight {:>2} depth {}: {:>9.0} ops/s {:>7.1} MiB/s (records; volume {:.1} MiB/s{}) in {:.1} s (load {:.1} s), {:.1} us CPU per record{}",
        args.label,
        args.members.len(),
        if stats.volume_kind == "block-device"
            || stats.members.iter().any(|m| m.kind == "block-device")
        {
            "raw device"
        } else {
            "member"
        },
        format!("{:?}", args.policy),
        args.writes_in_flight,
        args.writes_in_flight_depth,
        args.records as f64 / durable_s,
        mib(record_bytes) / durable_s,
        mib(stats.bytes_written) / durable_s,
        device_mib_per_s.map_or(String::new(), |d| format!("; device {d:.1} MiB/s")),
        durable_s,
        loaded_s,
        cpu_us_per_record,
        if shares.is_empty() {
            String::new()
        } else {
            format!("; MiB per member {}", shares.join("/"))
        }
    );
    append_json(args, &record)
}
