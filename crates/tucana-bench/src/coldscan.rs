//! `tucana-bench coldscan`: scans and multi-gets of a Tucana data set that is not in
//! memory, with scan prefetch (`Options::scan_prefetch_entries`) off and on in the same run.
//!
//! Owns the cold-read phases: full forward and reverse scans, batches of short scans (a
//! seek, then `short_scan_len` nexts), and batches of random keys read by `get` one at a time or by
//! one `multi_get`. Every measurement starts cold: the database is closed (so nothing of the
//! volume is mapped), the file synced and dropped from the page cache with
//! `posix_fadvise(POSIX_FADV_DONTNEED)`, and reopened; the index too is then read from the
//! device as the phase goes, the same for both settings. The load writes keys in a random
//! order, so the log is not in key order and a scan reads one random page per record.
//!
//! Tucana only, through its own API (the harness's `Engine` trait has no prefetch setting
//! and no multi-get). Single-threaded: the point is how many reads one reader keeps in
//! flight.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng;
use tucana::{Database, Keyspace, Options};

use crate::measure::{Latencies, Measurement, PhaseTimer};
use crate::workload::{thread_rng, Generation, KeySet, Permutation};
use crate::{sys, Result};

/// File name of the volume inside the run's temporary directory.
const VOLUME_FILE: &str = "coldscan.tucana";
const KEYSPACE: &str = "bench";
/// Keys written per batch during the load.
const LOAD_BATCH_KEYS: u64 = 1000;

#[derive(Clone, Debug)]
pub struct ColdScanConfig {
    pub keys: u64,
    pub key_bytes: usize,
    pub value_bytes: usize,
    pub seed: u64,
    pub dir: PathBuf,
    /// Short scans per measurement.
    pub short_scans: u64,
    /// Items each short scan reads after its seek.
    pub short_scan_len: u64,
    /// Batches of random keys per measurement.
    pub batches: u64,
    /// Keys per batch.
    pub batch_keys: u64,
    /// `scan_prefetch_entries` of the "on" runs.
    pub prefetch_entries: usize,
    /// Skip the full scans (they take longest on a slow device).
    pub skip_full_scans: bool,
}

/// One measured phase: its name, the prefetch window, what it did and how long it took.
struct Row {
    phase: &'static str,
    prefetch_entries: usize,
    /// Operations (items for full scans, scans, batches).
    ops: u64,
    /// Keys + values returned, in bytes.
    user_bytes: u64,
    measurement: Measurement,
    prefetch_calls: u64,
    prefetch_bytes: u64,
}

pub fn run(config: &ColdScanConfig) -> Result<()> {
    let keyset = KeySet::new(
        config.seed,
        config.keys,
        config.key_bytes,
        config.value_bytes,
    )?;
    let run_dir = tempfile::Builder::new()
        .prefix("tucana-coldscan-")
        .tempdir_in(&config.dir)?;
    let path = run_dir.path().join(VOLUME_FILE);

    let load = load(&path, &keyset, config)?;
    let volume_bytes = std::fs::metadata(&path)?.len();
    println!(
        "loaded {} keys ({} B keys, {} B values) in random order in {:.1} s; volume {:.1} MiB",
        config.keys,
        config.key_bytes,
        config.value_bytes,
        load.as_secs_f64(),
        volume_bytes as f64 / (1 << 20) as f64
    );
    println!(
        "each measurement: close, fsync + posix_fadvise(DONTNEED) on the volume file (drops it \
         from the page cache), reopen, run; read MiB = read_bytes of /proc/self/io (device reads)"
    );

    let settings = [0, config.prefetch_entries];
    let mut rows = Vec::new();
    if !config.skip_full_scans {
        for forward in [true, false] {
            for &prefetch_entries in &settings {
                rows.push(cold(&path, prefetch_entries, |ks| {
                    full_scan(ks, forward, config)
                })?);
                print_row(rows.last().expect("just pushed"));
            }
        }
        // What asking for resident pages costs: the same scan with the file in memory.
        for &prefetch_entries in &settings {
            rows.push(hot(&path, prefetch_entries, |ks| {
                let (_, items, bytes, latencies) = full_scan(ks, true, config)?;
                Ok(("hot scan fwd", items, bytes, latencies))
            })?);
            print_row(rows.last().expect("just pushed"));
        }
    }
    for &prefetch_entries in &settings {
        rows.push(cold(&path, prefetch_entries, |ks| {
            short_scans(ks, &keyset, config)
        })?);
        print_row(rows.last().expect("just pushed"));
    }
    // `get` never prefetches: one run.
    rows.push(cold(&path, 0, |ks| batches(ks, &keyset, config, false))?);
    print_row(rows.last().expect("just pushed"));
    for &prefetch_entries in &settings {
        rows.push(cold(&path, prefetch_entries, |ks| {
            batches(ks, &keyset, config, true)
        })?);
        print_row(rows.last().expect("just pushed"));
    }
    drop(run_dir);
    Ok(())
}

fn options(prefetch_entries: usize) -> Options {
    // Reads only: no background work that could read or write during a phase.
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .gc(false)
        .scan_prefetch_entries(prefetch_entries)
}

/// Writes every key once, in a random order, then commits and closes.
fn load(path: &Path, keyset: &KeySet, config: &ColdScanConfig) -> Result<Duration> {
    let start = std::time::Instant::now();
    let db = Database::builder().gc(false).open(path)?;
    let ks = db.keyspace(KEYSPACE)?;
    let order = Permutation::new(config.keys, config.seed ^ 0xC01D);
    let (mut key, mut value) = (keyset.key_buf(), keyset.value_buf());
    let mut position = 0;
    while position < config.keys {
        let mut batch = ks.batch();
        let end = (position + LOAD_BATCH_KEYS).min(config.keys);
        for p in position..end {
            keyset.key_into(order.at(p), &mut key);
            keyset.value_into(&key, Generation(0), &mut value);
            batch.put(&key, &value);
        }
        batch.commit()?;
        position = end;
    }
    drop(ks);
    db.close()?;
    Ok(start.elapsed())
}

/// Drops the closed volume from the page cache, then `measure_open`.
fn cold(
    path: &Path,
    prefetch_entries: usize,
    phase: impl FnOnce(&Keyspace) -> Result<(&'static str, u64, u64, Latencies)>,
) -> Result<Row> {
    sys::drop_from_page_cache(path)?;
    measure_open(path, prefetch_entries, phase)
}

/// As `cold`, but with the whole volume read into the page cache first.
fn hot(
    path: &Path,
    prefetch_entries: usize,
    phase: impl FnOnce(&Keyspace) -> Result<(&'static str, u64, u64, Latencies)>,
) -> Result<Row> {
    std::io::copy(&mut std::fs::File::open(path)?, &mut std::io::sink())?;
    measure_open(path, prefetch_entries, phase)
}

/// Opens the volume with `prefetch_entries`, runs `phase` (which returns its name,
/// operations and user bytes), measures it and closes.
fn measure_open(
    path: &Path,
    prefetch_entries: usize,
    phase: impl FnOnce(&Keyspace) -> Result<(&'static str, u64, u64, Latencies)>,
) -> Result<Row> {
    let db = options(prefetch_entries).open(path)?;
    let ks = db.keyspace(KEYSPACE)?;
    let before = db.stats();
    let timer = PhaseTimer::start();
    let (name, ops, user_bytes, latencies) = phase(&ks)?;
    let measurement = timer.finish(ops, &[latencies]);
    let after = db.stats();
    drop(ks);
    db.close()?;
    Ok(Row {
        phase: name,
        prefetch_entries,
        ops,
        user_bytes,
        measurement,
        prefetch_calls: after.prefetch_calls - before.prefetch_calls,
        prefetch_bytes: after.prefetch_bytes - before.prefetch_bytes,
    })
}

type PhaseResult = Result<(&'static str, u64, u64, Latencies)>;

fn full_scan(ks: &Keyspace, forward: bool, config: &ColdScanConfig) -> PhaseResult {
    let range = ks.range::<&[u8], _>(..);
    let (mut items, mut bytes) = (0u64, 0u64);
    let mut visit = |item: tucana::Result<(Vec<u8>, Vec<u8>)>| -> Result<()> {
        let (key, value) = item?;
        items += 1;
        bytes += (key.len() + value.len()) as u64;
        Ok(())
    };
    if forward {
        range.into_iter().try_for_each(&mut visit)?;
    } else {
        range.rev().try_for_each(&mut visit)?;
    }
    if items != config.keys {
        return Err(format!("full scan saw {items} of {} keys", config.keys).into());
    }
    let name = if forward {
        "scan forward"
    } else {
        "scan reverse"
    };
    Ok((name, items, bytes, Latencies::new()))
}

fn short_scans(ks: &Keyspace, keyset: &KeySet, config: &ColdScanConfig) -> PhaseResult {
    let mut rng = thread_rng(config.seed, "coldscan-short", 0);
    let mut key = keyset.key_buf();
    let mut latencies = Latencies::new();
    let mut bytes = 0u64;
    for _ in 0..config.short_scans {
        keyset.key_into(rng.random_range(0..config.keys), &mut key);
        latencies.time(|| -> Result<()> {
            for item in ks.range(key.clone()..).take(config.short_scan_len as usize) {
                let (k, v) = item?;
                bytes += (k.len() + v.len()) as u64;
            }
            Ok(())
        })?;
    }
    Ok(("short scans", config.short_scans, bytes, latencies))
}

/// Batches of `batch_keys` random keys (all present), by one `multi_get` each or by
/// `get`s one at a time.
fn batches(ks: &Keyspace, keyset: &KeySet, config: &ColdScanConfig, multi: bool) -> PhaseResult {
    let mut rng = thread_rng(config.seed, "coldscan-batches", 0);
    let mut latencies = Latencies::new();
    let mut bytes = 0u64;
    let mut keys: Vec<Vec<u8>> = (0..config.batch_keys).map(|_| keyset.key_buf()).collect();
    for _ in 0..config.batches {
        for key in keys.iter_mut() {
            keyset.key_into(rng.random_range(0..config.keys), key);
        }
        let found = latencies.time(|| -> Result<u64> {
            let mut found = 0;
            if multi {
                for value in ks.multi_get(&keys)?.into_iter().flatten() {
                    bytes += value.len() as u64;
                    found += 1;
                }
            } else {
                for key in &keys {
                    if let Some(value) = ks.get(key)? {
                        bytes += value.len() as u64;
                        found += 1;
                    }
                }
            }
            Ok(found)
        })?;
        if found != config.batch_keys {
            return Err(format!("a batch found {found} of {} keys", config.batch_keys).into());
        }
    }
    let name = if multi {
        "multi_get batch"
    } else {
        "get batch"
    };
    Ok((name, config.batches, bytes, latencies))
}

fn print_row(row: &Row) {
    let m = &row.measurement;
    let seconds = m.elapsed.as_secs_f64().max(1e-9);
    let read_mib =
        m.io.process
            .map(|io| format!("{:.1}", io.read_bytes as f64 / (1 << 20) as f64))
            .unwrap_or_else(|| "?".into());
    let prefetch = if row.prefetch_entries == 0 {
        "off".to_string()
    } else {
        format!("{}", row.prefetch_entries)
    };
    let latency = if m.p50_us() > 0.0 {
        format!("  p50 {:.0} us  p99 {:.0} us", m.p50_us(), m.p99_us())
    } else {
        String::new()
    };
    println!(
        "{:<16} prefetch {:>4}  {:>10} ops in {:>7.2} s = {:>10.0} ops/s  {:>7.1} MB/s  read {:>8} MiB  cpu {:>6.2} s  prefetch calls {} ({:.1} MiB){}",
        row.phase,
        prefetch,
        row.ops,
        seconds,
        m.ops_per_sec(),
        row.user_bytes as f64 / 1e6 / seconds,
        read_mib,
        m.cpu.as_secs_f64(),
        row.prefetch_calls,
        row.prefetch_bytes as f64 / (1 << 20) as f64,
        latency,
    );
}
