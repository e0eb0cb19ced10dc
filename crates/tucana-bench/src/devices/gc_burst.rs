//! `tucana-bench devices --gc-burst`: read latency during a garbage-collection burst, with
//! the trims of freed segments scheduled (`TrimSchedule::Scheduled`: held while the
//! member's queue is busy writing) or punched as they are released
//! (`TrimSchedule::AtRelease`), for issue 21's "GC burst with scheduled trims vs
//! immediate trims: read p99".
//!
//! Owns: one run (load, then every record overwritten by the load's threads while one
//! reader gets random keys, then a settle window while background GC collects what the
//! overwrites left, reads going on), its figures, printed line and JSON record. Does not
//! own: the devices (`scripts/bench-devices.sh`), nor the engine's trim scheduling.
//!
//! Thread-safety: writer threads and the reader share the database handle; the reader's
//! histogram is its own and is handed back when it is joined.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::{key, put_all, DevicesArgs};
use crate::Result;

/// When freed segments are trimmed (`Options::trim_schedule`).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Trims {
    Scheduled,
    AtRelease,
}

/// Gets random records until `stop`, recording each get's latency in microseconds.
fn read_until(ks: &tucana::Keyspace, records: u64, stop: &AtomicBool) -> Histogram<u64> {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7215);
    while !stop.load(Ordering::Relaxed) {
        let i = rng.random_range(0..records);
        let started = Instant::now();
        let found = ks.get(&key(i));
        let us = started.elapsed().as_micros() as u64;
        assert!(matches!(found, Ok(Some(_))), "record {i} lost: {found:?}");
        hist.saturating_record(us.max(1));
    }
    hist
}

pub fn run(args: &DevicesArgs, trims: Trims) -> Result<()> {
    let _cgroup = match args.memory_limit_bytes {
        Some(limit) => Some(crate::cgroup::enter(limit)?),
        None => None,
    };
    let schedule = match trims {
        Trims::Scheduled => tucana::trim::TrimSchedule::Scheduled,
        Trims::AtRelease => tucana::trim::TrimSchedule::AtRelease,
    };
    let db = tucana::Database::builder()
        .member_dispatch(args.dispatch_policy())
        .writes_in_flight_segments(args.writes_in_flight)
        .writes_in_flight_depth(args.writes_in_flight_depth)
        .segment_writes_wait_for_device(args.wait_for_device)
        .trim_schedule(schedule)
        .format_block_devices(args.format_devices)
        .open_members(&args.members)?;
    let ks = db.keyspace("devices")?;
    let threads = args.threads.max(1);
    put_all(&ks, args, threads, 0)?;
    db.sync()?;
    let before = db.stats();
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (hist, overwrite_s) = std::thread::scope(|scope| -> Result<(Histogram<u64>, f64)> {
        let reader = {
            let (ks, stop) = (ks.clone(), &stop);
            scope.spawn(move || read_until(&ks, args.records, stop))
        };
        let written = put_all(&ks, args, threads, 1).and_then(|()| Ok(db.sync()?));
        let overwrite_s = started.elapsed().as_secs_f64();
        // Background GC collects what the overwrites left dead: the burst goes on.
        if written.is_ok() {
            std::thread::sleep(Duration::from_secs(args.settle_seconds));
        }
        stop.store(true, Ordering::Relaxed);
        let hist = reader.join().expect("the reader panicked");
        written.map(|()| (hist, overwrite_s))
    })?;
    let window_s = started.elapsed().as_secs_f64();
    let after = db.stats();
    db.close()?;
    let delta = |f: fn(&tucana::Stats) -> u64| f(&after).saturating_sub(f(&before));
    let us = |q: f64| hist.value_at_quantile(q);
    let record = json!({
        "case": "gc-burst",
        "label": args.label,
        "trims": format!("{trims:?}"),
        "members": args.members.len(),
        "policy": format!("{:?}", args.policy),
        "records": args.records,
        "value_bytes": args.value_bytes,
        "threads": threads,
        "writes_in_flight": args.writes_in_flight,
        "wait_for_device": args.wait_for_device,
        "memory_limit_bytes": args.memory_limit_bytes,
        "overwrite_s": overwrite_s,
        "window_s": window_s,
        "reads": hist.len(),
        "read_p50_us": us(0.5),
        "read_p99_us": us(0.99),
        "read_p999_us": us(0.999),
        "read_max_us": hist.max(),
        "gc_reclaimed_bytes": delta(|s| s.gc_reclaimed_bytes),
        "trims_queued": delta(|s| s.trims_queued),
        "trims_issued": delta(|s| s.trims_issued),
        "trims_forced": delta(|s| s.trims_forced),
        "trims_pending_bytes_at_end": after.trims_pending_bytes,
        "space_used_bytes_at_end": after.space_used_bytes,
        "loadavg": super::loadavg_1m(),
    });
    println!(
        "{:<28} trims {:<10}: reads {:>8} p50 {:>6} us p99 {:>7} us p99.9 {:>7} us max {:>8} us; overwrite {:.1} s, window {:.1} s; GC reclaimed {:.0} MiB; trims issued {} forced {}, {:.0} MiB pending at the end",
        args.label,
        format!("{trims:?}"),
        hist.len(),
        us(0.5),
        us(0.99),
        us(0.999),
        hist.max(),
        overwrite_s,
        window_s,
        delta(|s| s.gc_reclaimed_bytes) as f64 / (1u64 << 20) as f64,
        delta(|s| s.trims_issued),
        delta(|s| s.trims_forced),
        after.trims_pending_bytes as f64 / (1u64 << 20) as f64,
    );
    super::append_json(args, &record)
}
