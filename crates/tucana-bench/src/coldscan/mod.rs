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
//! Owns the run: its arguments, the plan every measurement shares, the order of the
//! phases per engine and the cgroup around them, and the records. `store` opens, loads and
//! closes the stores (Tucana through its own API, since the harness's `Engine` trait has no
//! prefetch setting and no multi-get; the peers through `Engine`); `phases` runs and checks
//! each measured phase. Timing and formats are other modules'. Single-threaded: the point
//! is how many reads one reader keeps in flight.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{json, Map, Value};

use crate::engine::{Direction, EngineConfig, EngineKind};
use crate::format::fmt_bytes;
use crate::results::{self, Machine, Record, RunOptions};
use crate::workload::KeySet;
use crate::{cgroup, measure, sys, EngineChoice, Result};

mod phases;
mod store;

use phases::{batches, expected, full_scan, measure_open, short_scans, PhaseOutput};
use store::{
    drop_store_from_page_cache, load, read_whole_files, tucana_configuration, Store, Variant,
};

/// Workload names of the JSON records (the phases every engine runs).
pub const FORWARD: &str = "cold-scan-forward";
pub const REVERSE: &str = "cold-scan-reverse";
pub const SEEK_NEXT: &str = "cold-seek-next";
/// Tucana-only phases.
pub(super) const GET_BATCH: &str = "cold-get-batch";
pub(super) const MULTI_GET_BATCH: &str = "cold-multi-get-batch";
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
    /// Also run Tucana on a second store, loaded the same way and then reorganised
    /// (`Database::reorganise`: records rewritten in key order), with prefetch on.
    #[arg(long)]
    pub reorganise: bool,
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
    let mut options = run_options(&args, &kinds, &engine_config);
    crate::describe_dir(&args.dir, &mut options);
    results::print_header("coldscan", &machine, &options);
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
        let first = records.len();
        let variants = variants(*kind, plan.args.prefetch_entries);
        let cgroup_note = run_engine(&plan, &variants, &mut records, &mut short_scan_checksum)?;
        cgroups.insert(kind.name().to_string(), cgroup_note);
        if kind.name() == "tucana" && plan.args.reorganise {
            // A store of its own, loaded the same way, then reorganised.
            let reorganised = [Variant::Tucana {
                prefetch_entries: plan.args.prefetch_entries as usize,
                reorganised: true,
            }];
            let note = run_engine(&plan, &reorganised, &mut records, &mut short_scan_checksum)?;
            cgroups.insert("tucana (reorganised)".to_string(), note);
        }
        options.set("cgroups", Value::Object(cgroups.clone()));
        for record in &mut records[first..] {
            record.set("keys", plan.args.keys);
            record.set("key_bytes", plan.args.key_bytes);
            record.set("value_bytes", plan.args.value_bytes);
            record.set("threads", 1u64);
        }
        results::write_json(&plan.args.json, "coldscan", &machine, &options, &records)?;
    }
    print_summary(&records);
    println!("\nrecords written to {}", plan.args.json.display());
    Ok(())
}

/// What the results file records of the run before it starts: its arguments, the load
/// average, and each engine's configuration.
fn run_options(
    args: &ColdScanArgs,
    kinds: &[&'static dyn EngineKind],
    engine_config: &EngineConfig,
) -> RunOptions {
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
    options.set("reorganise", args.reorganise);
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
                k.configuration(engine_config)
            };
            (k.name().to_string(), configuration)
        })
        .collect();
    options.set("configurations", Value::Object(configurations));
    options
}

/// How an engine runs: Tucana twice (scan prefetch off, then on with `prefetch_entries`),
/// a peer once.
fn variants(kind: &'static dyn EngineKind, prefetch_entries: u64) -> Vec<Variant> {
    if kind.name() == "tucana" {
        vec![
            Variant::Tucana {
                prefetch_entries: 0,
                reorganised: false,
            },
            Variant::Tucana {
                prefetch_entries: prefetch_entries as usize,
                reorganised: false,
            },
        ]
    } else {
        vec![Variant::Peer(kind)]
    }
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
    measure_cold(plan, variants, dir, records, short_scan_checksum)?;
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
        measure_hot(plan, variants, dir, records)?;
    }
    drop(run_dir);
    Ok(cgroup_note)
}

/// The cold phases of every variant of one store, each measured on the store reopened
/// after it was dropped from the page cache.
fn measure_cold(
    plan: &Plan,
    variants: &[Variant],
    dir: &Path,
    records: &mut Vec<Record>,
    short_scan_checksum: &mut Option<(String, u64)>,
) -> Result<()> {
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
        check_short_scans(variant.label(), output.checksum, short_scan_checksum)?;
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
    Ok(())
}

/// Every variant's short scans must return the same pairs as the first one's: `first` is
/// the first variant's label and checksum, set by the first call.
fn check_short_scans(
    label: String,
    checksum: u64,
    first: &mut Option<(String, u64)>,
) -> Result<()> {
    match first {
        None => *first = Some((label, checksum)),
        Some((first_label, first_checksum)) if *first_checksum != checksum => {
            return Err(format!(
                "{label}'s short scans returned other pairs than {first_label}'s (checksum \
                 {checksum:#x}, not {first_checksum:#x})",
            )
            .into());
        }
        Some(_) => {}
    }
    Ok(())
}

/// Tucana's forward scan of every variant with its volume in the page cache, outside the
/// cgroup so that the whole volume fits: what asking for resident pages costs.
fn measure_hot(
    plan: &Plan,
    variants: &[Variant],
    dir: &Path,
    records: &mut Vec<Record>,
) -> Result<()> {
    for &variant in variants {
        read_whole_files(dir)?;
        let (mut record, _) = measure_open(plan, variant, dir, HOT_FORWARD, &|store| {
            full_scan(store, Direction::Forward, plan)
        })?;
        record.set("cgroup_limited", false);
        records.push(record);
    }
    Ok(())
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

    /// A tiny data set through the whole command, Tucana only (and its reorganised store):
    /// every check passes and the JSON has the records the document needs.
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
            reorganise: true,
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
            assert_eq!(settings, ["off", "on", "on, reorganised"], "{workload}");
        }
        // The reorganised store was loaded as the other, then rewritten in key order.
        let settle = records
            .iter()
            .find(|r| r["prefetch"] == "on, reorganised")
            .map(|r| r["settle"].as_str().unwrap().to_string())
            .unwrap();
        assert!(settle.starts_with("Database::reorganise: "), "{settle}");
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
