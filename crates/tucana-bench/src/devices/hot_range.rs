//! `tucana-bench devices --hot-range`: writers load while readers get records of a hot
//! key range that sits on member 0, for issue 21's "reads pinned to one member":
//! least-weighted-queue dispatch against round-robin, by the writers' throughput and the
//! spread of the members' queues.
//!
//! A run: the hot range (`--hot-records` keys, apart from the writers' keys) is loaded
//! with every segment and node run dispatched to member 0 (`DispatchPolicy::Member(0)`),
//! made durable, and the volume closed; the members' cached pages are dropped
//! (`posix_fadvise(DONTNEED)` on member files; a raw device's cache is its own and is
//! dropped the same way), so the hot reads reach the device. The volume is reopened with
//! the policy under test; `--readers` threads get random hot keys while `--threads`
//! writers put `--records` new keys and sync; a sampler reads the members' figures every
//! `SAMPLE_MS` and the spread (largest minus smallest) of their weighted queues and of
//! their write-queue bytes is averaged over the samples.
//!
//! Owns: that run, its figures, printed line and JSON record. Does not own: the devices,
//! throttles and cgroups (`scripts/bench-devices.sh`), the dispatch itself (the engine).
//!
//! Thread-safety: writers, readers and the sampler share the database handle; each reader
//! and the sampler hand their own figures back when joined.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::{key, put_keys, DevicesArgs};
use crate::Result;

/// How often the sampler reads the members' figures.
const SAMPLE_MS: u64 = 20;

/// The hot keys are `key(HOT_BASE + i)`, apart from the writers' `key(0..records)`.
const HOT_BASE: u64 = 1 << 40;

/// Drops the cached pages of `path` (clean after the close's sync), so that reads of it
/// go to the device. Errors: the file cannot be opened.
fn drop_cached_pages(path: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)
        .map_err(|e| format!("{}: open to drop its cache: {e}", path.display()))?;
    // SAFETY: `posix_fadvise` only reads its integer arguments; the descriptor is open
    // for the length of the call (`file` is alive).
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(format!("{}: posix_fadvise: error {rc}", path.display()).into());
    }
    Ok(())
}

/// Gets random hot keys until `stop`: the reads' latency histogram (µs).
fn read_hot(ks: &tucana::Keyspace, hot: u64, seed: u64, stop: &AtomicBool) -> Histogram<u64> {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    while !stop.load(Ordering::Relaxed) {
        let i = HOT_BASE + rng.random_range(0..hot);
        let started = Instant::now();
        let found = ks.get(&key(i));
        let us = started.elapsed().as_micros() as u64;
        assert!(
            matches!(found, Ok(Some(_))),
            "hot record {i} lost: {found:?}"
        );
        hist.saturating_record(us.max(1));
    }
    hist
}

/// The sampler's figures: per member, the sums of its weighted queue (ps) and write-queue
/// bytes over the samples; over the samples, the sums of the spreads; the sample count.
#[derive(Default)]
pub(super) struct Samples {
    pub(super) weighted_ps: Vec<f64>,
    pub(super) queue_bytes: Vec<f64>,
    pub(super) weighted_spread_ps: f64,
    pub(super) queue_spread_bytes: f64,
    pub(super) count: u64,
}

impl Samples {
    fn add(&mut self, members: &[tucana::volume::MemberStats]) {
        if members.is_empty() {
            return;
        }
        self.weighted_ps.resize(members.len(), 0.0);
        self.queue_bytes.resize(members.len(), 0.0);
        let spread = |f: &dyn Fn(&tucana::volume::MemberStats) -> u64| {
            let values = members.iter().map(f);
            (values.clone().max().unwrap_or(0) - values.min().unwrap_or(0)) as f64
        };
        self.weighted_spread_ps += spread(&|m| m.weighted_queue_ps);
        self.queue_spread_bytes += spread(&|m| m.queue_bytes);
        for (i, m) in members.iter().enumerate() {
            self.weighted_ps[i] += m.weighted_queue_ps as f64;
            self.queue_bytes[i] += m.queue_bytes as f64;
        }
        self.count += 1;
    }

    pub(super) fn mean(&self, sum: f64) -> f64 {
        sum / self.count.max(1) as f64
    }
}

/// Samples `db`'s members every `SAMPLE_MS` until `stop`.
pub(super) fn sample_until(db: &tucana::Database, stop: &AtomicBool) -> Samples {
    let mut samples = Samples::default();
    while !stop.load(Ordering::Relaxed) {
        samples.add(&db.stats().members);
        std::thread::sleep(Duration::from_millis(SAMPLE_MS));
    }
    samples
}

pub fn run(args: &DevicesArgs) -> Result<()> {
    let _cgroup = match args.memory_limit_bytes {
        Some(limit) => Some(crate::cgroup::enter(limit)?),
        None => None,
    };
    let threads = args.threads.max(1);
    let builder = || {
        tucana::Database::builder()
            .writes_in_flight_segments(args.writes_in_flight)
            .writes_in_flight_depth(args.writes_in_flight_depth)
            .segment_writes_wait_for_device(args.wait_for_device)
            .format_block_devices(args.format_devices)
    };
    // The hot range, on member 0.
    let hot = args.hot_records;
    let placed = Instant::now();
    {
        let db = builder()
            .member_dispatch(tucana::volume::DispatchPolicy::Member(0))
            .open_members(&args.members)?;
        let ks = db.keyspace("devices")?;
        put_keys(&ks, HOT_BASE, hot, 0, args.value_bytes, threads)?;
        db.sync()?;
        let on: Vec<String> = db
            .stats()
            .members
            .iter()
            .map(|m| format!("{:.0}", m.bytes_written as f64 / (1u64 << 20) as f64))
            .collect();
        eprintln!(
            "hot range: {hot} records placed in {:.1} s, MiB per member {}",
            placed.elapsed().as_secs_f64(),
            on.join("/")
        );
        db.close()?;
    }
    for path in &args.members {
        drop_cached_pages(path)?;
    }

    let db = builder()
        .member_dispatch(args.dispatch_policy())
        .open_members(&args.members)?;
    let ks = db.keyspace("devices")?;
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (hist, samples, load_s) = std::thread::scope(|scope| -> Result<_> {
        let readers: Vec<_> = (0..args.readers)
            .map(|r| {
                let (ks, stop) = (ks.clone(), &stop);
                scope.spawn(move || read_hot(&ks, hot, 0x407 + r, stop))
            })
            .collect();
        let sampler = {
            let (db, stop) = (&db, &stop);
            scope.spawn(move || sample_until(db, stop))
        };
        let written = put_keys(&ks, 0, args.records, 0, args.value_bytes, threads)
            .and_then(|()| Ok(db.sync()?));
        let load_s = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let mut hist =
            Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
        for r in readers {
            hist.add(r.join().expect("a reader panicked"))
                .expect("same bounds");
        }
        let samples = sampler.join().expect("the sampler panicked");
        written.map(|()| (hist, samples, load_s))
    })?;
    let stats = db.stats();
    db.close()?;
    report(args, &stats, &hist, &samples, load_s)
}

/// Prints the run's line and appends its JSON record.
fn report(
    args: &DevicesArgs,
    stats: &tucana::Stats,
    hist: &Histogram<u64>,
    samples: &Samples,
    load_s: f64,
) -> Result<()> {
    let mib = |bytes: f64| bytes / (1u64 << 20) as f64;
    let record_bytes = args.records * (16 + args.value_bytes as u64);
    let write_mib_per_s = mib(record_bytes as f64) / load_s;
    let reads_per_s = hist.len() as f64 / load_s;
    let ms = |ps: f64| ps / 1e9;
    let weighted_ms: Vec<f64> = samples
        .weighted_ps
        .iter()
        .map(|&s| ms(samples.mean(s)))
        .collect();
    let queue_mib: Vec<f64> = samples
        .queue_bytes
        .iter()
        .map(|&s| mib(samples.mean(s)))
        .collect();
    let written_mib: Vec<f64> = stats
        .members
        .iter()
        .map(|m| mib(m.bytes_written as f64))
        .collect();
    let read_mib: Vec<f64> = stats
        .members
        .iter()
        .map(|m| mib(m.bytes_read as f64))
        .collect();
    let record = json!({
        "case": "hot-range",
        "label": args.label,
        "members": args.members.len(),
        "policy": format!("{:?}", args.policy),
        "records": args.records,
        "hot_records": args.hot_records,
        "value_bytes": args.value_bytes,
        "threads": args.threads,
        "readers": args.readers,
        "writes_in_flight": args.writes_in_flight,
        "wait_for_device": args.wait_for_device,
        "memory_limit_bytes": args.memory_limit_bytes,
        "load_s": load_s,
        "mib_per_s": write_mib_per_s,
        "reads": hist.len(),
        "reads_per_s": reads_per_s,
        "read_p50_us": hist.value_at_quantile(0.5),
        "read_p99_us": hist.value_at_quantile(0.99),
        "samples": samples.count,
        "weighted_queue_spread_ms": ms(samples.mean(samples.weighted_spread_ps)),
        "write_queue_spread_mib": mib(samples.mean(samples.queue_spread_bytes)),
        "weighted_queue_ms_per_member": weighted_ms,
        "write_queue_mib_per_member": queue_mib,
        "written_mib_per_member": written_mib,
        "read_mib_per_member": read_mib,
        "loadavg": super::loadavg_1m(),
    });
    println!(
        "{:<28} {:<10}: writes {:>6.1} MiB/s in {:.1} s, hot reads {:>7.0}/s p99 {} us; queue spread {:.1} ms weighted, {:.1} MiB queued (mean per member {} ms, {} MiB); MiB written {}, read {}",
        args.label,
        format!("{:?}", args.policy),
        write_mib_per_s,
        load_s,
        reads_per_s,
        hist.value_at_quantile(0.99),
        ms(samples.mean(samples.weighted_spread_ps)),
        mib(samples.mean(samples.queue_spread_bytes)),
        super::per_member(&weighted_ms, 1),
        super::per_member(&queue_mib, 1),
        super::per_member(&written_mib, 0),
        super::per_member(&read_mib, 0),
    );
    super::append_json(args, &record)
}
