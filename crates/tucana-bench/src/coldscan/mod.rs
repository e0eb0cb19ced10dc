//! `tucana-bench coldscan`: scans of a data set that is not in memory, on Tucana (scan
//! prefetch, `Options::scan_prefetch_entries`, off and on) and on every selected peer, in
//! one run, into one JSON file that `report --coldscan-json` turns into a section of
//! BENCHMARKS.md.
//!
//! Per engine: a fresh store is loaded with every key once in a random (hashed) order, so
//! Tucana's log is not in key order and a scan of it reads one random page per record;
//! then settled (each engine's own "give space back / compact" call, so no compaction left
//! over from the load runs during a measurement) and closed. Every measurement then starts
//! cold: the store is closed (nothing mapped), every file of its directory is synced and
//! dropped from the page cache with `posix_fadvise(POSIX_FADV_DONTNEED)`, and it is
//! reopened, which also empties engine caches of their own (RocksDB's block cache). The
//! measurements run inside a memory cgroup smaller than the data set (module `cgroup`), so
//! the page cache cannot hold it and the scans really read the device; the load does not
//! (its speed is not measured here, and outside the limit it takes seconds, not minutes).
//!
//! Phases on every engine: full forward scan, full reverse scan, and `short_scans` seeks to
//! random keys each followed by `short_scan_len` nexts. Tucana alone also runs batches of
//! random keys read by `get` one at a time and by one `multi_get` (cold), and a forward
//! scan with the volume in the page cache (outside the cgroup: what asking for resident
//! pages costs). Every scan reads every value: each item's key and value go into an
//! order-independent checksum, and a full scan must see every key, in order, with the
//! checksum of the load; a short scan must start at its key and return as many items as
//! the key's rank allows, and all engines must agree on the short scans' checksum.
//!
//! Owns the plan, the checks and the records; engines, timing and formats are other
//! modules'. Tucana goes through its own API (the harness's `Engine` trait has no
//! prefetch setting and no multi-get), the peers through `Engine`. Single-threaded: the
//! point is how many reads one reader keeps in flight.

use std::ops::{Bound, ControlFlow};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use rand::Rng;
use serde_json::{json, Map, Value};
use tucana::{Database, Keyspace, Options};

use crate::engine::{Direction, Engine, EngineConfig, EngineKind, Visit};
use crate::format::fmt_bytes;
use crate::measure::{Latencies, Measurement, PhaseTimer};
use crate::report::{self, Machine, Record, RunOptions};
use crate::workload::{thread_rng, Generation, KeySet, Permutation};
use crate::{cgroup, measure, sys, EngineChoice, Result};

/// File name of Tucana's volume inside the engine's directory.
const VOLUME_FILE: &str = "coldscan.tucana";
const KEYSPACE: &str = "bench";
/// Keys written per batch during the load.
const LOAD_BATCH_KEYS: u64 = 1000;

/// Workload names of the JSON records (the phases every engine runs).
pub const FORWARD: &str = "cold-scan-forward";
pub const REVERSE: &str = "cold-scan-reverse";
pub const SEEK_NEXT: &str = "cold-seek-next";
/// Tucana-only phases.
const GET_BATCH: &str = "cold-get-batch";
const MULTI_GET_BATCH: &str = "cold-multi-get-batch";
const HOT_FORWARD: &str = "hot-scan-forward";

#[derive(Args, Debug, Clone)]
pub struct ColdScanArgs {
    /// Engines to run, in order (default: every engine this build has).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub engines: Vec<EngineChoice>,
    /// Directory in which each engine's temporary directory is created.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// JSON file of the results (rewritten after every engine).
    #[arg(long, default_value = "bench/coldscan.json")]
    pub json: PathBuf,
    /// Keys in the data set.
    #[arg(long, default_value_t = 1_200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,
    /// Bytes per key.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=tucana::MAX_KEY_BYTES as u64))]
    pub key_bytes: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=tucana::MAX_VALUE_BYTES as u64))]
    pub value_bytes: u64,
    /// Seed of keys, values and the load and read orders.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Short scans (seek + `--short-scan-len` nexts) per measurement.
    #[arg(long, default_value_t = 500)]
    pub short_scans: u64,
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub short_scan_len: u64,
    /// Batches of random keys per measurement (Tucana only).
    #[arg(long, default_value_t = 500)]
    pub batches: u64,
    /// Keys per batch (one `multi_get`, or that many `get`s).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_keys: u64,
    /// `scan_prefetch_entries` of Tucana's runs with prefetch on.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub prefetch_entries: u64,
    /// Leave out the full forward and reverse scans.
    #[arg(long)]
    pub skip_full_scans: bool,
    /// Memory limit (page cache included) of the cgroup the measurements run in; 0: no
    /// cgroup (the page cache is then only dropped before each measurement).
    #[arg(long, default_value_t = 512 << 20)]
    pub memory_limit_bytes: u64,
    /// Cache budget of every engine that has a cache of its own (at most a quarter of the
    /// memory limit).
    #[arg(long, default_value_t = 128 << 20)]
    pub cache_bytes: u64,
    /// Do not settle (compact) each store after its load.
    #[arg(long)]
    pub no_settle: bool,
    /// Seconds: a tiny data set for a smoke test of the harness (overrides the sizes).
    #[arg(long)]
    pub quick: bool,
    /// A remark for the results document (repeatable), e.g. that the machine was shared.
    #[arg(long)]
    pub note: Vec<String>,
}

impl ColdScanArgs {
    fn apply_quick(&mut self) {
        if self.quick {
            self.keys = self.keys.min(3_000);
            self.short_scans = self.short_scans.min(20);
            self.batches = self.batches.min(5);
        }
    }
}

/// What every measurement of the run shares.
struct Plan {
    args: ColdScanArgs,
    keyset: KeySet,
    /// The first `min(8, key_bytes)` bytes of every key (unique, so they order the keys)
    /// as big-endian numbers, sorted: a key's rank, hence what a short scan must return.
    sorted_prefixes: Vec<u64>,
    /// Checksum of every (key, value) of the load.
    load_checksum: u64,
    engine_config: EngineConfig,
}

/// One way of running an engine: Tucana with a prefetch window, or a peer.
#[derive(Clone, Copy)]
enum Variant {
    Tucana { prefetch_entries: usize },
    Peer(&'static dyn EngineKind),
}

impl Variant {
    fn engine_name(&self) -> &'static str {
        match self {
            Variant::Tucana { .. } => "tucana",
            Variant::Peer(kind) => kind.name(),
        }
    }

    fn prefetch_entries(&self) -> Option<usize> {
        match self {
            Variant::Tucana { prefetch_entries } => Some(*prefetch_entries),
            Variant::Peer(_) => None,
        }
    }

    /// "tucana (prefetch 64)", "rocksdb".
    fn label(&self) -> String {
        match self.prefetch_entries() {
            Some(0) => "tucana (prefetch off)".to_string(),
            Some(n) => format!("tucana (prefetch {n})"),
            None => self.engine_name().to_string(),
        }
    }
}

/// An open store of one variant.
enum Store {
    Tucana { db: Database, keyspace: Keyspace },
    Peer(Box<dyn Engine>),
}

impl Store {
    fn open(variant: Variant, dir: &Path, config: &EngineConfig) -> Result<Store> {
        Ok(match variant {
            Variant::Tucana { prefetch_entries } => {
                let db = tucana_options(prefetch_entries).open(dir.join(VOLUME_FILE))?;
                let keyspace = db.keyspace(KEYSPACE)?;
                Store::Tucana { db, keyspace }
            }
            Variant::Peer(kind) => Store::Peer(kind.open(dir, config)?),
        })
    }

    /// Visits the pairs from `lower` on (forward) or up to the end (reverse) in `direction`
    /// order until `visit` breaks.
    fn scan(&self, lower: Bound<&[u8]>, direction: Direction, visit: &mut Visit<'_>) -> Result<()> {
        match self {
            Store::Tucana { keyspace, .. } => {
                let range = keyspace.range::<&[u8], _>((lower, Bound::Unbounded));
                let mut step = |item: tucana::Result<(Vec<u8>, Vec<u8>)>| -> Result<bool> {
                    let (key, value) = item?;
                    Ok(visit(&key, &value).is_break())
                };
                match direction {
                    Direction::Forward => {
                        for item in range {
                            if step(item)? {
                                break;
                            }
                        }
                    }
                    Direction::Reverse => {
                        for item in range.rev() {
                            if step(item)? {
                                break;
                            }
                        }
                    }
                }
                Ok(())
            }
            Store::Peer(engine) => engine.scan(lower, Bound::Unbounded, direction, visit),
        }
    }

    /// Tucana's prefetch counters (calls, bytes) so far.
    fn prefetch_counters(&self) -> Option<(u64, u64)> {
        match self {
            Store::Tucana { db, .. } => {
                let stats = db.stats();
                Some((stats.prefetch_calls, stats.prefetch_bytes))
            }
            Store::Peer(_) => None,
        }
    }

    fn close(self) -> Result<()> {
        match self {
            Store::Tucana { db, keyspace } => {
                // The keyspace handle may keep the database alive; close wants the last one.
                drop(keyspace);
                Ok(db.close()?)
            }
            Store::Peer(engine) => engine.close(),
        }
    }
}

fn tucana_options(prefetch_entries: usize) -> Options {
    // Reads only: no background work that could read or write during a phase.
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .gc(false)
        .scan_prefetch_entries(prefetch_entries)
}

/// What [`tucana_options`] and the load use, for the results.
fn tucana_configuration(prefetch_entries: u64) -> Value {
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "load": format!("Database::builder().gc(false), one batch per {LOAD_BATCH_KEYS} puts, then close"),
        "measurements": "commit_interval None, flush_interval None, gc off (reads only: no background work)",
        "scan_prefetch_entries": format!("0 (prefetch off) and {prefetch_entries} (on)"),
        "cache": "none of its own: the index is in memory, values are read through the page cache",
    })
}

/// What one phase returns: operations, items read, user bytes read, latencies, checksum.
struct PhaseOutput {
    ops: u64,
    items: u64,
    user_bytes: u64,
    latencies: Latencies,
    checksum: u64,
}

pub fn run_command(args: &ColdScanArgs) -> Result<()> {
    let mut args = args.clone();
    args.apply_quick();
    let choices = EngineChoice::chosen_or_built(&args.engines);
    let kinds = choices
        .iter()
        .map(|e| e.kind())
        .collect::<std::result::Result<Vec<_>, String>>()?;
    if args.memory_limit_bytes > 0 && args.cache_bytes > args.memory_limit_bytes / 4 {
        return Err(format!(
            "--cache-bytes {} leaves too little of --memory-limit-bytes {} for the engines' \
             other memory and the page cache (at most a quarter)",
            args.cache_bytes, args.memory_limit_bytes
        )
        .into());
    }
    let keyset = KeySet::new(
        args.seed,
        args.keys,
        args.key_bytes as usize,
        args.value_bytes as usize,
    )?;
    let engine_config = EngineConfig {
        cache_bytes: args.cache_bytes,
        gc: false,
        ..EngineConfig::default()
    };

    let mut machine = Machine::detect();
    machine.disk = measure::watch_device_of(&args.dir);
    let mut options = RunOptions::with_argv_and_engines(kinds.iter().map(|k| k.name()));
    options.set("keys", args.keys);
    options.set("key_bytes", args.key_bytes);
    options.set("value_bytes", args.value_bytes);
    options.set(
        "user_bytes",
        args.keys * (args.key_bytes + args.value_bytes),
    );
    options.set("seed", args.seed);
    options.set("short_scans", args.short_scans);
    options.set("short_scan_len", args.short_scan_len);
    options.set("batches", args.batches);
    options.set("batch_keys", args.batch_keys);
    options.set("prefetch_entries", args.prefetch_entries);
    options.set("cache_bytes", args.cache_bytes);
    options.set("memory_limit_bytes", args.memory_limit_bytes);
    options.set("settle", !args.no_settle);
    options.set("quick", args.quick);
    options.set("notes", args.note.clone());
    // The machine is shared: how busy it was when the run started.
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        options.set("loadavg_at_start", load.trim().to_string());
    }
    let configurations: Map<String, Value> = kinds
        .iter()
        .map(|k| {
            let configuration = if k.name() == "tucana" {
                // Tucana runs through its own API here, not the `Engine` adapter.
                tucana_configuration(args.prefetch_entries)
            } else {
                k.configuration(&engine_config)
            };
            (k.name().to_string(), configuration)
        })
        .collect();
    options.set("configurations", Value::Object(configurations));
    crate::describe_dir(&args.dir, &mut options);
    report::print_header("coldscan", &machine, &options);
    if let Some(parent) = args.json.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }

    let (sorted_prefixes, load_checksum) = expected(&keyset, args.keys);
    let plan = Plan {
        args,
        keyset,
        sorted_prefixes,
        load_checksum,
        engine_config,
    };
    println!(
        "each measurement: close, fsync + posix_fadvise(DONTNEED) on every file of the store \
         (drops them from the page cache), reopen (engine caches start empty), run; read MiB = \
         read_bytes of /proc/self/io (device reads)"
    );

    let mut records: Vec<Record> = Vec::new();
    let mut cgroups = Map::new();
    let mut short_scan_checksum: Option<(String, u64)> = None;
    for kind in &kinds {
        let variants: Vec<Variant> = if kind.name() == "tucana" {
            vec![
                Variant::Tucana {
                    prefetch_entries: 0,
                },
                Variant::Tucana {
                    prefetch_entries: plan.args.prefetch_entries as usize,
                },
            ]
        } else {
            vec![Variant::Peer(*kind)]
        };
        let first = records.len();
        let cgroup_note = run_engine(&plan, &variants, &mut records, &mut short_scan_checksum)?;
        cgroups.insert(kind.name().to_string(), cgroup_note);
        options.set("cgroups", Value::Object(cgroups.clone()));
        for record in &mut records[first..] {
            record.set("keys", plan.args.keys);
            record.set("key_bytes", plan.args.key_bytes);
            record.set("value_bytes", plan.args.value_bytes);
            record.set("threads", 1u64);
        }
        report::write_json(&plan.args.json, "coldscan", &machine, &options, &records)?;
    }
    print_summary(&records);
    println!("\nrecords written to {}", plan.args.json.display());
    Ok(())
}

/// Sorted key prefixes and the checksum of the whole data set.
fn expected(keyset: &KeySet, keys: u64) -> (Vec<u64>, u64) {
    let (mut key, mut value) = (keyset.key_buf(), keyset.value_buf());
    let mut prefixes = Vec::with_capacity(usize::try_from(keys).unwrap_or(0));
    let mut checksum = 0u64;
    for i in 0..keys {
        keyset.key_into(i, &mut key);
        keyset.value_into(&key, Generation(0), &mut value);
        prefixes.push(prefix(&key));
        checksum = checksum.wrapping_add(item_checksum(&key, &value));
    }
    prefixes.sort_unstable();
    (prefixes, checksum)
}

/// The key's first (at most 8) bytes as a big-endian number: unique per key, and ordered as
/// the keys are.
fn prefix(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = key.len().min(8);
    bytes[8 - n..].copy_from_slice(&key[..n]);
    u64::from_be_bytes(bytes)
}

/// A hash of one pair that touches every byte of the value (so no engine can skip reading
/// it), summed with wrapping adds into a checksum that does not depend on scan order.
fn item_checksum(key: &[u8], value: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01B3;
    let mut hash = 0xCBF2_9CE4_8422_2325u64 ^ key.len() as u64;
    for part in [key, value] {
        let mut chunks = part.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            hash = (hash ^ u64::from_le_bytes(word)).wrapping_mul(PRIME);
        }
        for &byte in chunks.remainder() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(PRIME);
        }
        hash = hash.rotate_left(29);
    }
    hash
}

/// Loads one store, measures each variant on it, and returns what the cgroup was.
fn run_engine(
    plan: &Plan,
    variants: &[Variant],
    records: &mut Vec<Record>,
    short_scan_checksum: &mut Option<(String, u64)>,
) -> Result<Value> {
    let name = variants[0].engine_name();
    let run_dir = tempfile::Builder::new()
        .prefix(&format!("tucana-coldscan-{name}-"))
        .tempdir_in(&plan.args.dir)?;
    let dir = run_dir.path();
    let (load_time, settle) = load(plan, variants[0], dir)?;
    let space_bytes = sys::dir_space_used_bytes(dir)?;
    println!(
        "\n== {name}: loaded {} keys ({} B keys, {} B values) in random order in {:.1} s; \
         settled: {settle}; files {}",
        plan.args.keys,
        plan.args.key_bytes,
        plan.args.value_bytes,
        load_time.as_secs_f64(),
        fmt_bytes(space_bytes),
    );

    let first = records.len();
    // The guard keeps the process in the cgroup until this engine's cold phases are done.
    let (cgroup, cgroup_note) = enter_cgroup(plan.args.memory_limit_bytes);
    let mut measure = |variant: Variant,
                       workload: &'static str,
                       phase: &dyn Fn(&Store) -> Result<PhaseOutput>|
     -> Result<PhaseOutput> {
        drop_store_from_page_cache(dir)?;
        let (record, output) = measure_open(plan, variant, dir, workload, phase)?;
        records.push(record);
        Ok(output)
    };
    if !plan.args.skip_full_scans {
        for (workload, direction) in [(FORWARD, Direction::Forward), (REVERSE, Direction::Reverse)]
        {
            for &variant in variants {
                measure(variant, workload, &|store| {
                    full_scan(store, direction, plan)
                })?;
            }
        }
    }
    for &variant in variants {
        let output = measure(variant, SEEK_NEXT, &|store| short_scans(store, plan))?;
        let label = variant.label();
        match short_scan_checksum {
            None => *short_scan_checksum = Some((label, output.checksum)),
            Some((first, checksum)) if *checksum != output.checksum => {
                return Err(format!(
                    "{label}'s short scans returned other pairs than {first}'s (checksum \
                     {:#x}, not {checksum:#x})",
                    output.checksum
                )
                .into());
            }
            Some(_) => {}
        }
    }
    if let Variant::Tucana { .. } = variants[0] {
        // `get` never prefetches: one run.
        measure(variants[0], GET_BATCH, &|store| batches(store, plan, false))?;
        for &variant in variants {
            measure(variant, MULTI_GET_BATCH, &|store| {
                batches(store, plan, true)
            })?;
        }
    }
    if let Some(cgroup) = &cgroup {
        let peak = cgroup.peak_bytes();
        let hits = cgroup.limit_hits();
        println!(
            "cgroup: peak {} of {}, limit hit {} times",
            peak.map_or("?".into(), fmt_bytes),
            fmt_bytes(plan.args.memory_limit_bytes),
            hits.map_or("?".into(), |n| n.to_string())
        );
        for record in &mut records[first..] {
            if let Some(peak) = peak {
                record.set("cgroup_peak_bytes_so_far", peak);
            }
        }
    }
    let limited = cgroup.is_some();
    drop(cgroup);
    for record in &mut records[first..] {
        record.set("cgroup_limited", limited);
        record.set("space_used_bytes", space_bytes);
        record.set("settle", settle.as_str());
        record.set("load_s", load_time.as_secs_f64());
    }

    if let (Variant::Tucana { .. }, false) = (variants[0], plan.args.skip_full_scans) {
        // Outside the cgroup, so the whole volume fits in the page cache: what asking for
        // resident pages costs.
        for &variant in variants {
            read_whole_files(dir)?;
            let (mut record, _) = measure_open(plan, variant, dir, HOT_FORWARD, &|store| {
                full_scan(store, Direction::Forward, plan)
            })?;
            record.set("cgroup_limited", false);
            records.push(record);
        }
    }
    drop(run_dir);
    Ok(cgroup_note)
}

/// Enters a memory cgroup limited to `limit_bytes` (none for 0), and what to record of it.
fn enter_cgroup(limit_bytes: u64) -> (Option<cgroup::MemoryCgroup>, Value) {
    if limit_bytes == 0 {
        println!(
            "WARNING: no memory cgroup (--memory-limit-bytes 0); the page cache is NOT limited"
        );
        return (None, json!({ "limited": false, "error": "not asked for" }));
    }
    match cgroup::enter(limit_bytes) {
        Ok(cgroup) => {
            println!(
                "measuring inside a memory cgroup limited to {}",
                fmt_bytes(limit_bytes)
            );
            let mut note = cgroup.describe();
            note["limited"] = Value::Bool(true);
            (Some(cgroup), note)
        }
        Err(reason) => {
            println!("WARNING: no memory cgroup ({reason}); the page cache is NOT limited");
            (None, json!({ "limited": false, "error": reason }))
        }
    }
}

/// Writes every key once, in a random order, settles the store (unless asked not to) and
/// closes it; returns how long the load took and what settling did.
fn load(plan: &Plan, variant: Variant, dir: &Path) -> Result<(Duration, String)> {
    let start = std::time::Instant::now();
    let order = Permutation::new(plan.args.keys, plan.args.seed ^ 0xC01D);
    let keyset = &plan.keyset;
    let (mut key, mut value) = (keyset.key_buf(), keyset.value_buf());
    let settle = match variant {
        Variant::Tucana { .. } => {
            let db = Database::builder().gc(false).open(dir.join(VOLUME_FILE))?;
            let ks = db.keyspace(KEYSPACE)?;
            let mut position = 0;
            while position < plan.args.keys {
                let mut batch = ks.batch();
                let end = (position + LOAD_BATCH_KEYS).min(plan.args.keys);
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
            // No overwrites or deletes: nothing for GC to do, and the index is committed.
            "nothing to do (no dead records; index committed at close)".to_string()
        }
        Variant::Peer(kind) => {
            let mut engine = kind.open(dir, &plan.engine_config)?;
            let mut pairs = Vec::with_capacity(LOAD_BATCH_KEYS as usize);
            let mut position = 0;
            while position < plan.args.keys {
                pairs.clear();
                let end = (position + LOAD_BATCH_KEYS).min(plan.args.keys);
                for p in position..end {
                    keyset.key_into(order.at(p), &mut key);
                    keyset.value_into(&key, Generation(0), &mut value);
                    pairs.push((key.clone(), value.clone()));
                }
                engine.put_batch(&pairs)?;
                position = end;
            }
            engine.commit()?;
            let settle = if plan.args.no_settle {
                "not asked to (--no-settle)".to_string()
            } else {
                engine.reclaim_space()?.to_string()
            };
            engine.sync()?;
            engine.close()?;
            settle
        }
    };
    Ok((start.elapsed(), settle))
}

/// Syncs and drops every file of the store's directory from the page cache.
fn drop_store_from_page_cache(dir: &Path) -> Result<()> {
    for file in sys::files_under(dir)? {
        sys::drop_from_page_cache(&file)?;
    }
    Ok(())
}

/// Reads every file of the store's directory, so that it is in the page cache.
fn read_whole_files(dir: &Path) -> Result<()> {
    for file in sys::files_under(dir)? {
        std::io::copy(&mut std::fs::File::open(file)?, &mut std::io::sink())?;
    }
    Ok(())
}

/// Opens the store as `variant`, runs `phase`, measures it and closes; the record and
/// what the phase returned.
fn measure_open(
    plan: &Plan,
    variant: Variant,
    dir: &Path,
    workload: &'static str,
    phase: &dyn Fn(&Store) -> Result<PhaseOutput>,
) -> Result<(Record, PhaseOutput)> {
    let store = Store::open(variant, dir, &plan.engine_config)?;
    let before = store.prefetch_counters();
    let timer = PhaseTimer::start();
    let output = phase(&store)?;
    let measurement = timer.finish(output.ops, std::slice::from_ref(&output.latencies));
    let after = store.prefetch_counters();
    store.close()?;

    let mut record = Record::measured(variant.engine_name(), workload, &measurement);
    record.set_io_amp(&measurement, output.user_bytes, 0);
    if output.latencies.count() == 0 {
        // Full scans time the whole scan, not each item.
        record.p50_us = None;
        record.p99_us = None;
        record.p999_us = None;
    }
    record.set("dataset", "cold");
    record.set("items", output.items);
    let seconds = measurement.elapsed.as_secs_f64().max(1e-9);
    record.set("items_per_sec", output.items as f64 / seconds);
    record.set("mb_per_sec", output.user_bytes as f64 / 1e6 / seconds);
    record.set("checksum", format!("{:#018x}", output.checksum));
    if let Some(entries) = variant.prefetch_entries() {
        record.set("prefetch_entries", entries as u64);
        record.set("prefetch", if entries == 0 { "off" } else { "on" });
    }
    if let (Some(before), Some(after)) = (before, after) {
        record.set("prefetch_calls", after.0 - before.0);
        record.set("prefetch_bytes", after.1 - before.1);
    }
    if workload == SEEK_NEXT {
        record.set("short_scan_len", plan.args.short_scan_len);
    }
    if workload == GET_BATCH || workload == MULTI_GET_BATCH {
        record.set("batch_keys", plan.args.batch_keys);
    }
    print_row(&variant, workload, &measurement, &output);
    Ok((record, output))
}

fn full_scan(store: &Store, direction: Direction, plan: &Plan) -> Result<PhaseOutput> {
    let (mut items, mut bytes, mut checksum) = (0u64, 0u64, 0u64);
    let mut previous: Vec<u8> = Vec::new();
    let mut error: Option<String> = None;
    store.scan(Bound::Unbounded, direction, &mut |key, value| {
        let in_order = match direction {
            Direction::Forward => previous.as_slice() < key,
            Direction::Reverse => key < previous.as_slice(),
        };
        if items > 0 && !in_order {
            error = Some(format!(
                "a {direction:?} scan went out of order at item {items}"
            ));
            return ControlFlow::Break(());
        }
        previous.clear();
        previous.extend_from_slice(key);
        items += 1;
        bytes += (key.len() + value.len()) as u64;
        checksum = checksum.wrapping_add(item_checksum(key, value));
        ControlFlow::Continue(())
    })?;
    if let Some(error) = error {
        return Err(error.into());
    }
    if items != plan.args.keys || checksum != plan.load_checksum {
        return Err(format!(
            "a {direction:?} scan saw {items} of {} keys, checksum {checksum:#x} (the load's: {:#x})",
            plan.args.keys, plan.load_checksum
        )
        .into());
    }
    Ok(PhaseOutput {
        ops: items,
        items,
        user_bytes: bytes,
        latencies: Latencies::new(),
        checksum,
    })
}

/// Seeks to random keys, each followed by up to `short_scan_len` items.
fn short_scans(store: &Store, plan: &Plan) -> Result<PhaseOutput> {
    let config = &plan.args;
    let mut rng = thread_rng(config.seed, "coldscan-short", 0);
    let mut key = plan.keyset.key_buf();
    let mut latencies = Latencies::new();
    let (mut items, mut bytes, mut checksum) = (0u64, 0u64, 0u64);
    for _ in 0..config.short_scans {
        plan.keyset
            .key_into(rng.random_range(0..config.keys), &mut key);
        let rank = plan.sorted_prefixes.partition_point(|&p| p < prefix(&key)) as u64;
        let expected = config.short_scan_len.min(config.keys - rank);
        let mut seen = 0u64;
        let mut first_ok = true;
        latencies.time(|| {
            store.scan(Bound::Included(&key), Direction::Forward, &mut |k, v| {
                if seen == 0 {
                    first_ok = k == key.as_slice();
                }
                seen += 1;
                bytes += (k.len() + v.len()) as u64;
                checksum = checksum.wrapping_add(item_checksum(k, v));
                if seen >= config.short_scan_len {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
        })?;
        if seen != expected || !first_ok {
            return Err(format!(
                "a short scan from key rank {rank} returned {seen} items, not {expected}{}",
                if first_ok {
                    ""
                } else {
                    ", not starting at its key"
                }
            )
            .into());
        }
        items += seen;
    }
    Ok(PhaseOutput {
        ops: config.short_scans,
        items,
        user_bytes: bytes,
        latencies,
        checksum,
    })
}

/// Batches of `batch_keys` random keys (all present), by one `multi_get` each or by
/// `get`s one at a time (Tucana only).
fn batches(store: &Store, plan: &Plan, multi: bool) -> Result<PhaseOutput> {
    let Store::Tucana { keyspace: ks, .. } = store else {
        return Err("batches of gets are measured on Tucana only".into());
    };
    let config = &plan.args;
    let mut rng = thread_rng(config.seed, "coldscan-batches", 0);
    let mut latencies = Latencies::new();
    let (mut bytes, mut checksum, mut items) = (0u64, 0u64, 0u64);
    let mut keys: Vec<Vec<u8>> = (0..config.batch_keys)
        .map(|_| plan.keyset.key_buf())
        .collect();
    for _ in 0..config.batches {
        for key in keys.iter_mut() {
            plan.keyset.key_into(rng.random_range(0..config.keys), key);
        }
        let found = latencies.time(|| -> Result<u64> {
            let mut found = 0;
            if multi {
                for (key, value) in keys.iter().zip(ks.multi_get(&keys)?) {
                    if let Some(value) = value {
                        bytes += value.len() as u64;
                        checksum = checksum.wrapping_add(item_checksum(key, &value));
                        found += 1;
                    }
                }
            } else {
                for key in &keys {
                    if let Some(value) = ks.get(key)? {
                        bytes += value.len() as u64;
                        checksum = checksum.wrapping_add(item_checksum(key, &value));
                        found += 1;
                    }
                }
            }
            Ok(found)
        })?;
        if found != config.batch_keys {
            return Err(format!("a batch found {found} of {} keys", config.batch_keys).into());
        }
        items += found;
    }
    Ok(PhaseOutput {
        ops: config.batches,
        items,
        user_bytes: bytes,
        latencies,
        checksum,
    })
}

fn print_row(variant: &Variant, workload: &str, m: &Measurement, output: &PhaseOutput) {
    let seconds = m.elapsed.as_secs_f64().max(1e-9);
    let read_mib =
        m.io.process
            .map(|io| format!("{:.1}", io.read_bytes as f64 / (1 << 20) as f64))
            .unwrap_or_else(|| "?".into());
    let latency = if m.p50_us() > 0.0 {
        format!("  p50 {:.0} us  p99 {:.0} us", m.p50_us(), m.p99_us())
    } else {
        String::new()
    };
    println!(
        "{:<22} {:<21} {:>9} ops in {:>7.2} s = {:>9.0} ops/s {:>9.0} items/s {:>7.1} MB/s  read {:>8} MiB  cpu {:>6.2} s{}",
        variant.label(),
        workload,
        output.ops,
        seconds,
        m.ops_per_sec(),
        output.items as f64 / seconds,
        output.user_bytes as f64 / 1e6 / seconds,
        read_mib,
        m.cpu.as_secs_f64(),
        latency,
    );
}

/// Items per second of the phases every engine ran, side by side.
fn print_summary(records: &[Record]) {
    let label = |r: &Record| match r.get("prefetch").and_then(Value::as_str) {
        Some(setting) => format!("{} pf {setting}", r.engine),
        None => r.engine.to_string(),
    };
    let mut columns: Vec<String> = Vec::new();
    for record in records {
        let l = label(record);
        if !columns.contains(&l) {
            columns.push(l);
        }
    }
    println!("\nsummary: items/s (cold, single thread)");
    print!("{:<20}", "workload");
    for column in &columns {
        print!(" {column:>16}");
    }
    println!();
    for workload in [FORWARD, REVERSE, SEEK_NEXT] {
        print!("{workload:<20}");
        for column in &columns {
            let value = records
                .iter()
                .find(|r| r.workload == workload && label(r) == *column)
                .and_then(|r| r.get("items_per_sec").and_then(Value::as_f64));
            match value {
                Some(v) => print!(" {v:>16.0}"),
                None => print!(" {:>16}", "-"),
            }
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_reads_every_byte_and_ignores_order() {
        let a = item_checksum(b"key-a", &[1u8; 1000]);
        let mut changed = [1u8; 1000];
        changed[999] = 2;
        assert_ne!(a, item_checksum(b"key-a", &changed));
        assert_ne!(a, item_checksum(b"key-b", &[1u8; 1000]));
        let b = item_checksum(b"key-b", &[3u8; 7]);
        assert_eq!(a.wrapping_add(b), b.wrapping_add(a));
    }

    #[test]
    fn prefixes_order_like_keys() {
        assert!(prefix(b"\x00\x01zzzzzzzzz") < prefix(b"\x00\x02aaaaaaa"));
        assert_eq!(prefix(b"\x01"), 1);
    }

    /// A tiny data set through the whole command, Tucana only: every check passes and the
    /// JSON has the records the document needs.
    #[test]
    fn quick_run_on_tucana_writes_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let json_path = dir.path().join("coldscan.json");
        let args = ColdScanArgs {
            engines: vec![EngineChoice::Tucana],
            dir: dir.path().to_path_buf(),
            json: json_path.clone(),
            keys: 500,
            key_bytes: 16,
            value_bytes: 100,
            seed: 3,
            short_scans: 10,
            short_scan_len: 100,
            batches: 2,
            batch_keys: 10,
            prefetch_entries: 16,
            skip_full_scans: false,
            // No cgroup: tests must not move the test process around.
            memory_limit_bytes: 0,
            cache_bytes: 1 << 20,
            no_settle: false,
            quick: true,
            note: vec![],
        };
        run_command(&args).unwrap();
        let doc: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
        let records = doc["records"].as_array().unwrap();
        for workload in [FORWARD, REVERSE, SEEK_NEXT, MULTI_GET_BATCH, HOT_FORWARD] {
            let settings: Vec<&str> = records
                .iter()
                .filter(|r| r["workload"] == workload)
                .map(|r| r["prefetch"].as_str().unwrap())
                .collect();
            assert_eq!(settings, ["off", "on"], "{workload}");
        }
        let forward = records.iter().find(|r| r["workload"] == FORWARD).unwrap();
        assert_eq!(forward["items"], 500);
        assert_eq!(forward["ops"], 500);
        assert_eq!(forward["cgroup_limited"], false);
        let seek = records.iter().find(|r| r["workload"] == SEEK_NEXT).unwrap();
        assert_eq!(seek["ops"], 10);
        assert!(seek["p50_us"].as_f64().unwrap() > 0.0);
        assert_eq!(doc["options"]["keys"], 500);
    }
}
