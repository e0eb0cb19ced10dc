//! `tucana-bench devices --ycsb-a`: YCSB A (zipfian, 50% reads, 50% updates) for a fixed
//! time on a volume over the members given, after a load larger than the memory cgroup,
//! for issue 21's "a larger-than-memory load and YCSB A inside a memory cgroup": three
//! equal members against one, and least-weighted-queue dispatch against round-robin on
//! members of unequal speeds.
//!
//! A run, inside the memory cgroup (`crate::cgroup`, as the suite's larger-than-memory
//! runs): `--records` records loaded by `--threads` threads (the plain case's `put_keys`)
//! and made durable; then `--ycsb-threads` clients each draw keys from YCSB's scrambled
//! zipfian over the records (`ycsb::ScrambledZipfian`) and operations by workload A's
//! proportions (`ycsb::A`), for `--seconds`; a read must find its record (every key was
//! loaded) of the loaded length, an update puts a new value. The members' figures are
//! sampled every 20 ms as in the hot-range case (`hot_range::sample_until`) for the
//! spread of their queues. Printed and recorded: operations per second (the workload's
//! operations over its seconds; the final sync is not counted), the load's throughput,
//! read and update p99, the queue spread, and bytes written and read per member during
//! the workload.
//!
//! Owns: that run, its figures, printed line and JSON record (`"case": "ycsb-a"`). Does
//! not own: the devices, throttles and cgroups (`scripts/bench-devices.sh`), the YCSB
//! generators (`ycsb.rs`), the dispatch (the engine).
//!
//! Thread-safety: clients and the sampler share the database handle; each client hands
//! its histograms back when joined.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;

use super::hot_range::{sample_until, Samples};
use super::{key, put_keys, value, DevicesArgs};
use crate::ycsb::{Op, ScrambledZipfian, A};
use crate::Result;

/// One client's latencies (µs) of reads and of updates.
struct Latencies {
    read: Histogram<u64>,
    update: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// Runs workload A on `ks` until `stop`: draws keys over `0..records`, checks reads.
fn client(
    ks: &tucana::Keyspace,
    records: u64,
    value_bytes: usize,
    seed: u64,
    stop: &AtomicBool,
) -> Result<Latencies> {
    let mut rng = crate::workload::thread_rng(seed, "devices-ycsb-a", 0);
    let mut chooser = ScrambledZipfian::new(records);
    let mut lat = Latencies {
        read: histogram(),
        update: histogram(),
    };
    let mut generation = 1u64;
    while !stop.load(Ordering::Relaxed) {
        let i = chooser.next(&mut rng);
        let started = Instant::now();
        match A.pick(&mut rng) {
            Op::Read => {
                let found = ks.get(&key(i))?;
                match found {
                    Some(v) if v.len() == value_bytes => {}
                    other => {
                        return Err(format!(
                            "record {i}: read {:?} bytes, loaded {value_bytes}",
                            other.map(|v| v.len())
                        )
                        .into())
                    }
                }
                lat.read
                    .saturating_record((started.elapsed().as_micros() as u64).max(1));
            }
            Op::Update => {
                // A value seeded apart from the load's (`i ^ 0`) and from other updates'.
                ks.put(&key(i), &value(i ^ (generation << 40), value_bytes))?;
                generation += 1;
                lat.update
                    .saturating_record((started.elapsed().as_micros() as u64).max(1));
            }
            op => unreachable!("workload A has no {op:?}"),
        }
    }
    Ok(lat)
}

/// Bytes written and read per member, from `stats`.
fn member_bytes(stats: &tucana::Stats) -> (Vec<u64>, Vec<u64>) {
    (
        stats.members.iter().map(|m| m.bytes_written).collect(),
        stats.members.iter().map(|m| m.bytes_read).collect(),
    )
}

pub fn run(args: &DevicesArgs) -> Result<()> {
    let _cgroup = match args.memory_limit_bytes {
        Some(limit) => Some(crate::cgroup::enter(limit)?),
        None => None,
    };
    let db = tucana::Database::builder()
        .member_dispatch(args.dispatch_policy())
        .writes_in_flight_segments(args.writes_in_flight)
        .writes_in_flight_depth(args.writes_in_flight_depth)
        .segment_writes_wait_for_device(args.wait_for_device)
        .format_block_devices(args.format_devices)
        .open_members(&args.members)?;
    let ks = db.keyspace("devices")?;
    let loading = Instant::now();
    put_keys(
        &ks,
        0,
        args.records,
        0,
        args.value_bytes,
        args.threads.max(1),
    )?;
    db.sync()?;
    let load_s = loading.elapsed().as_secs_f64();
    let (written_before, read_before) = member_bytes(&db.stats());

    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (lat, samples, run_s) = std::thread::scope(|scope| -> Result<_> {
        let clients: Vec<_> = (0..args.ycsb_threads.max(1))
            .map(|c| {
                let (ks, stop) = (ks.clone(), &stop);
                let (records, value_bytes) = (args.records, args.value_bytes);
                scope.spawn(move || client(&ks, records, value_bytes, 0xa11 + c, stop))
            })
            .collect();
        let sampler = {
            let (db, stop) = (&db, &stop);
            scope.spawn(move || sample_until(db, stop))
        };
        std::thread::sleep(Duration::from_secs(args.seconds));
        stop.store(true, Ordering::Relaxed);
        let run_s = started.elapsed().as_secs_f64();
        let mut lat = Latencies {
            read: histogram(),
            update: histogram(),
        };
        let mut first_error = None;
        for c in clients {
            match c.join().expect("a client panicked") {
                Ok(l) => {
                    lat.read.add(l.read).expect("same bounds");
                    lat.update.add(l.update).expect("same bounds");
                }
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        let samples = sampler.join().expect("the sampler panicked");
        match first_error {
            Some(e) => Err(e),
            None => Ok((lat, samples, run_s)),
        }
    })?;
    let stats = db.stats();
    db.sync()?;
    db.close()?;
    let (written_after, read_after) = member_bytes(&stats);
    let during = |after: &[u64], before: &[u64]| -> Vec<u64> {
        after
            .iter()
            .zip(before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect()
    };
    let written = during(&written_after, &written_before);
    let read = during(&read_after, &read_before);
    report(args, &lat, &samples, load_s, run_s, &written, &read)
}

/// Prints the run's line and appends its JSON record.
fn report(
    args: &DevicesArgs,
    lat: &Latencies,
    samples: &Samples,
    load_s: f64,
    run_s: f64,
    written: &[u64],
    read: &[u64],
) -> Result<()> {
    let mib = |bytes: f64| bytes / (1u64 << 20) as f64;
    let ms = |ps: f64| ps / 1e9;
    let ops = lat.read.len() + lat.update.len();
    let ops_per_s = ops as f64 / run_s;
    let load_mib_per_s = mib((args.records * (16 + args.value_bytes as u64)) as f64) / load_s;
    let written_mib: Vec<f64> = written.iter().map(|&b| mib(b as f64)).collect();
    let read_mib: Vec<f64> = read.iter().map(|&b| mib(b as f64)).collect();
    let weighted_ms: Vec<f64> = samples
        .weighted_ps
        .iter()
        .map(|&s| ms(samples.mean(s)))
        .collect();
    let record = json!({
        "case": "ycsb-a",
        "label": args.label,
        "members": args.members.len(),
        "policy": format!("{:?}", args.policy),
        "records": args.records,
        "value_bytes": args.value_bytes,
        "threads": args.threads,
        "ycsb_threads": args.ycsb_threads,
        "seconds": args.seconds,
        "writes_in_flight": args.writes_in_flight,
        "wait_for_device": args.wait_for_device,
        "memory_limit_bytes": args.memory_limit_bytes,
        "load_s": load_s,
        "load_mib_per_s": load_mib_per_s,
        "run_s": run_s,
        "ops": ops,
        "ops_per_s": ops_per_s,
        "read_p99_us": lat.read.value_at_quantile(0.99),
        "update_p99_us": lat.update.value_at_quantile(0.99),
        "samples": samples.count,
        "weighted_queue_spread_ms": ms(samples.mean(samples.weighted_spread_ps)),
        "write_queue_spread_mib": mib(samples.mean(samples.queue_spread_bytes)),
        "weighted_queue_ms_per_member": weighted_ms,
        "written_mib_per_member": written_mib,
        "read_mib_per_member": read_mib,
        "loadavg": super::loadavg_1m(),
    });
    println!(
        "{:<28} {} member(s) {:<10}: YCSB A {:>8.0} ops/s over {:.1} s (read p99 {} us, update p99 {} us; load {:.1} MiB/s); queue spread {:.1} ms weighted, {:.1} MiB queued (mean per member {} ms); during A MiB written {}, read {}",
        args.label,
        args.members.len(),
        format!("{:?}", args.policy),
        ops_per_s,
        run_s,
        lat.read.value_at_quantile(0.99),
        lat.update.value_at_quantile(0.99),
        load_mib_per_s,
        ms(samples.mean(samples.weighted_spread_ps)),
        mib(samples.mean(samples.queue_spread_bytes)),
        super::per_member(&weighted_ms, 1),
        super::per_member(&written_mib, 0),
        super::per_member(&read_mib, 0),
    );
    super::append_json(args, &record)
}
