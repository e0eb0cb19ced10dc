//! The garbage-collection proof (issue 5): what reclaiming dead log space costs the
//! foreground and how much space it gives back.
//!
//! Two runs per engine, each on a fresh database in its own temporary directory:
//!
//! - **Overwrite** (`gc_ycsb_a`): YCSB A (50% reads, 50% updates, scrambled zipfian) on a
//!   loaded data set for `overwrites × records / 0.5` operations, so the updates write the
//!   data set's bytes `overwrites` times over. Engines with a GC switch (Tucana) run it
//!   twice, GC on (at the space-amplification target) and GC off, and the figure that
//!   matters is throughput(on) ÷ throughput(off). A sampler thread reads the files'
//!   allocated bytes (st_blocks × 512) every `sample_interval` meanwhile, so the record has
//!   the largest space amplification of the run as well as the final one.
//! - **Delete-all** (`delete_all`): create (disk bytes of the empty store), load, delete
//!   every key, then whatever the engine documents as giving space back
//!   ([`Engine::reclaim_space`]); disk bytes after each step and after closing, next to
//!   the empty store's. Afterwards the store must be empty (no key found by a full scan).
//!
//! Every record has `dataset` = [`DATASET`] and a `gc` field (`"on"`/`"off"`), so the
//! document keeps them apart from the suite's other tables. Owns the run plan, the space
//! sampler and the GC summary on the terminal; workloads, engines and formats are other
//! modules'. Single-threaded apart from the phases' workers and the sampler thread, which
//! only reads file metadata.

use std::ops::{Bound, ControlFlow};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use crate::engine::{Engine, EngineConfig, EngineKind};
use crate::format::fmt_bytes;
use crate::measure::{Latencies, Measurement, PhaseTimer};
use crate::results::{self, Machine, Record, RunOptions};
use crate::sys;
use crate::workload::thread_share;
use crate::ycsb::{self, key_name, PhaseWatch, Records, ValueLayout, Workload, YcsbConfig};
use crate::{EngineChoice, Result};

/// The `dataset` of every record of this module.
pub const DATASET: &str = "gc";

/// Share of YCSB A's operations that are updates: operations = overwrites × records / this.
const UPDATE_SHARE: f64 = 0.5;

/// YCSB A under its own name, so that its records never mix with the suite's `ycsb_a`.
const OVERWRITE: Workload = Workload {
    name: "gc_ycsb_a",
    ..ycsb::A
};

/// Throughput with GC on ÷ with GC off that issue 5 asks for (WiscKey lost at most 35%).
pub const THROUGHPUT_RATIO_TARGET: f64 = 0.65;

#[derive(Args, Debug, Clone)]
pub struct GcArgs {
    /// Engines to run, in order; peers run once, with their compaction as configured.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [EngineChoice::Tucana])]
    engines: Vec<EngineChoice>,
    /// Directory in which each run's temporary engine directory is created.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// Also write the records as JSON to this file (`tucana-bench report` reads it).
    #[arg(long)]
    json: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// YCSB client threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=256))]
    threads: u64,
    #[command(flatten)]
    pub(crate) plan: GcPlanArgs,
    /// More space-amplification targets for Tucana's overwrite run with GC on, after
    /// --gc-space-amp: the trade-off between space and throughput in one run (each
    /// against the same GC-off run).
    #[arg(long, value_delimiter = ',')]
    also_gc_space_amp: Vec<f64>,
    /// Fields per record (YCSB's fieldcount).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    fields: u32,
    /// Bytes per field (YCSB's fieldlength).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(8..=1 << 20))]
    field_bytes: u64,
    /// Records per write batch when loading.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    load_batch: u64,
    /// Durable before each write returns (default: buffered, synced once a second).
    #[arg(long)]
    sync: bool,
    /// Seconds: tiny data sets for a smoke test (overrides the sizes).
    #[arg(long)]
    quick: bool,
}

/// The sizes of the GC runs; shared by `tucana-bench gc` and the suite (hence the ids:
/// the suite has arguments of its own named `records` and the like).
#[derive(Args, Debug, Clone)]
pub struct GcPlanArgs {
    /// Records of the overwrite run (YCSB's recordcount; 0 skips the GC runs in the suite).
    #[arg(id = "gc_records", long = "gc-records", default_value_t = 1_000_000)]
    pub records: u64,
    /// Times the updates overwrite the data set: operations = overwrites × records / 0.5.
    #[arg(id = "gc_overwrites", long = "overwrites", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub overwrites: u64,
    /// Space amplification target of Tucana's background GC (disk ÷ live, more than 1).
    #[arg(id = "gc_space_amp", long = "gc-space-amp", default_value_t = 1.5)]
    pub space_amp: f64,
    /// Records loaded then deleted by the delete-all run (default: --gc-records).
    #[arg(id = "gc_delete_records", long = "delete-records")]
    pub delete_records: Option<u64>,
    /// Seconds the engine stays open and idle after the overwrite workload before the
    /// space is read once more (background GC and compaction catching up); 0 with --quick.
    #[arg(id = "gc_settle_secs", long = "settle-secs", default_value_t = 15)]
    pub settle_secs: u64,
}

/// One engine's GC runs.
#[derive(Clone, Debug)]
pub struct GcConfig {
    pub records: u64,
    pub overwrites: u64,
    /// Records of the delete-all run (0: skip it).
    pub delete_records: u64,
    pub threads: usize,
    pub layout: ValueLayout,
    pub load_batch: usize,
    pub seed: u64,
    /// The engine's configuration; `gc` and `gc_space_amp` are set per run here.
    pub engine: EngineConfig,
    pub gc_space_amp: f64,
    /// More targets the overwrite run with GC on is repeated at (engines with a GC
    /// switch only).
    pub more_gc_space_amps: Vec<f64>,
    /// How often the sampler reads the files' allocated bytes.
    pub sample_interval: Duration,
    /// Idle time after the overwrite workload before the settled space reading.
    pub settle: Duration,
    pub dir: PathBuf,
}

impl GcConfig {
    /// Operations of the overwrite run.
    pub fn operations(&self) -> u64 {
        (self.overwrites as f64 * self.records as f64 / UPDATE_SHARE).ceil() as u64
    }

    /// A description for the run's options (the document's "Data sets" table).
    pub fn describe(&self) -> Value {
        json!({
            "records": self.records,
            "operations": self.operations(),
            "overwrites": self.overwrites,
            "delete_records": self.delete_records,
            "value_layout": self.layout.describe(),
            "load_batch": self.load_batch,
            "memory_limit_bytes": null,
            "gc_space_amp_target": self.gc_space_amp,
            "settle_secs": self.settle.as_secs(),
        })
    }
}

/// What the GC runs take from the command that runs them (the suite or `gc`).
#[derive(Clone, Debug)]
pub struct RunShape {
    pub threads: usize,
    pub layout: ValueLayout,
    pub load_batch: usize,
    pub seed: u64,
    pub engine: EngineConfig,
    pub dir: PathBuf,
}

impl GcPlanArgs {
    /// The plan as a configuration; `quick` shrinks it to seconds.
    pub fn config(&self, quick: bool, shape: RunShape) -> Result<GcConfig> {
        // NaN fails this too.
        if self.space_amp.partial_cmp(&1.0) != Some(std::cmp::Ordering::Greater) {
            return Err(format!("--gc-space-amp {} must be more than 1", self.space_amp).into());
        }
        let mut records = self.records;
        let mut delete_records = self.delete_records.unwrap_or(records);
        if quick {
            records = records.min(2_000);
            delete_records = delete_records.min(2_000);
        }
        Ok(GcConfig {
            records,
            overwrites: self.overwrites,
            delete_records,
            threads: shape.threads,
            layout: shape.layout,
            load_batch: shape.load_batch,
            seed: shape.seed,
            engine: shape.engine,
            gc_space_amp: self.space_amp,
            more_gc_space_amps: Vec::new(),
            sample_interval: if quick {
                Duration::from_millis(10)
            } else {
                Duration::from_millis(250)
            },
            settle: if quick {
                Duration::ZERO
            } else {
                Duration::from_secs(self.settle_secs)
            },
            dir: shape.dir,
        })
    }
}

/// `tucana-bench gc`: the GC runs alone, on each engine asked for.
pub fn run_command(args: &GcArgs) -> Result<()> {
    let kinds = args
        .engines
        .iter()
        .map(|e| e.kind())
        .collect::<std::result::Result<Vec<_>, String>>()?;
    let mut machine = Machine::detect();
    machine.disk = crate::measure::watch_device_of(&args.dir);
    let engine = EngineConfig {
        sync_writes: args.sync,
        ..EngineConfig::default()
    };
    let layout = ValueLayout::Fields {
        fields: args.fields,
        field_bytes: args.field_bytes as usize,
    };
    let mut config = args.plan.config(
        args.quick,
        RunShape {
            threads: args.threads as usize,
            layout,
            load_batch: args.load_batch as usize,
            seed: args.seed,
            engine,
            dir: args.dir.clone(),
        },
    )?;
    for &target in &args.also_gc_space_amp {
        // NaN fails this too.
        if target.partial_cmp(&1.0) != Some(std::cmp::Ordering::Greater) {
            return Err(format!("--also-gc-space-amp {target} must be more than 1").into());
        }
    }
    config.more_gc_space_amps = args.also_gc_space_amp.clone();
    let mut options = RunOptions::with_argv_and_engines(kinds.iter().map(|k| k.name()));
    options.set("threads", args.threads);
    options.set("sync", args.sync);
    options.set("cache_bytes", engine.cache_bytes);
    options.set("seed", args.seed);
    options.set("quick", args.quick);
    options.set("datasets", json!({ DATASET: config.describe() }));
    crate::describe_dir(&args.dir, &mut options);
    let configurations: serde_json::Map<String, Value> = kinds
        .iter()
        .map(|k| (k.name().to_string(), k.configuration(&engine)))
        .collect();
    options.set("configurations", Value::Object(configurations));
    results::print_header("gc", &machine, &options);

    let mut records = Vec::new();
    for kind in &kinds {
        run(*kind, &config, &mut records)?;
        if let Some(path) = &args.json {
            results::write_json(path, "gc", &machine, &options, &records)?;
        }
    }
    print_summary(&records);
    if let Some(path) = &args.json {
        println!("\nrecords written to {}", path.display());
    }
    Ok(())
}

/// The overwrite runs (GC on, and off where the engine can switch it off) and the
/// delete-all run of one engine; appends their records.
pub fn run(kind: &dyn EngineKind, config: &GcConfig, records: &mut Vec<Record>) -> Result<()> {
    println!(
        "\n== {} GC: YCSB A, {} records, {} operations ({}× overwrite), {}",
        kind.name(),
        config.records,
        config.operations(),
        config.overwrites,
        config.layout.describe()
    );
    // (GC on?, target): GC on at each target, then off.
    let mut settings = vec![(true, config.gc_space_amp)];
    if kind.has_gc_switch() {
        settings.extend(config.more_gc_space_amps.iter().map(|&t| (true, t)));
        settings.push((false, config.gc_space_amp));
    }
    results::print_phase_table_header();
    let mut runs: Vec<(bool, Record)> = Vec::new();
    for (gc, target) in settings {
        // A failed run (a wrong answer, an engine error) is recorded and the others go on,
        // as the suite does with its larger-than-memory runs.
        match overwrite_run(kind, config, gc, target) {
            Ok((load, overwrite)) => {
                records.push(load);
                runs.push((gc, overwrite));
            }
            Err(error) => {
                let mut failed = failure(kind.name(), OVERWRITE.name, &error.to_string());
                failed.set("gc", gc_label(gc));
                records.push(failed);
            }
        }
    }
    let off = runs.iter().find(|(gc, _)| !gc).map(|(_, r)| r);
    let off_ops = off.and_then(|r| r.ops_per_sec);
    let off_cpu = off.and_then(|r| r.cpu_us_per_op);
    for (gc, mut record) in runs {
        if let (true, Some(on), Some(off)) = (gc, record.ops_per_sec, off_ops) {
            if off > 0.0 {
                record.set("throughput_vs_gc_off", on / off);
            }
        }
        // CPU time per operation (GC's thread included), GC off ÷ on: the throughput
        // ratio a CPU-bound machine of its own would see. On a shared machine the two
        // runs' wall-clock rates move with other jobs; this moves much less.
        if let (true, Some(on), Some(off)) = (gc, record.cpu_us_per_op, off_cpu) {
            if on > 0.0 {
                record.set("cpu_per_op_vs_gc_off", off / on);
            }
        }
        print_overwrite_note(&record);
        records.push(record);
    }
    if config.delete_records > 0 {
        match delete_all(kind, config) {
            Ok(record) => records.push(record),
            Err(error) => records.push(failure(kind.name(), "delete_all", &error.to_string())),
        }
    }
    Ok(())
}

fn gc_label(gc: bool) -> &'static str {
    if gc {
        "on"
    } else {
        "off"
    }
}

/// One overwrite run, GC at `target` (engines with a GC switch): its load's record and its
/// workload's record.
fn overwrite_run(
    kind: &dyn EngineKind,
    config: &GcConfig,
    gc: bool,
    target: f64,
) -> Result<(Record, Record)> {
    let switchable = kind.has_gc_switch();
    let engine = EngineConfig {
        gc,
        gc_space_amp: switchable.then_some(target),
        ..config.engine
    };
    let ycsb_config = YcsbConfig {
        records: config.records,
        operations: config.operations(),
        threads: config.threads,
        layout: config.layout,
        load_batch: config.load_batch,
        seed: config.seed,
        dataset: DATASET.to_string(),
        engine,
        dir: config.dir.clone(),
    };
    let mut watch = OverwriteWatch {
        interval: config.sample_interval,
        settle: config.settle,
        dir: None,
        live_user_bytes: 0,
        sampler: None,
    };
    let (mut load, mut record) =
        ycsb::load_and_run(kind, &ycsb_config, "gc_load", &OVERWRITE, &mut watch)?;
    for r in [&mut load, &mut record] {
        r.set("gc", gc_label(gc));
        r.set("overwrites", config.overwrites);
        if switchable {
            r.set("gc_space_amp_target", target);
        }
    }
    Ok((load, record))
}

/// Samples space during the overwrite workload and adds the GC figures after it.
struct OverwriteWatch {
    interval: Duration,
    settle: Duration,
    dir: Option<PathBuf>,
    live_user_bytes: u64,
    sampler: Option<SpaceSampler>,
}

impl PhaseWatch for OverwriteWatch {
    fn start(&mut self, dir: &Path, live_user_bytes: u64) -> Result<()> {
        self.live_user_bytes = live_user_bytes;
        self.dir = Some(dir.to_path_buf());
        self.sampler = Some(SpaceSampler::start(dir.to_path_buf(), self.interval));
        Ok(())
    }

    fn finish(&mut self, engine: &dyn Engine, record: &mut Record) -> Result<()> {
        let samples = self
            .sampler
            .take()
            .map(SpaceSampler::stop)
            .unwrap_or_default();
        // The record's own space figure was read after the phase: the final one.
        let final_bytes = record
            .get("space_used_bytes")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let max_bytes = samples.max_bytes.max(final_bytes);
        record.set("space_used_bytes_max", max_bytes);
        record.set("space_samples", samples.count);
        record.set(
            "space_series_ms_bytes",
            Value::Array(
                samples
                    .series
                    .iter()
                    .map(|&(ms, bytes)| serde_json::json!([ms, bytes]))
                    .collect(),
            ),
        );
        if self.live_user_bytes > 0 {
            let live = self.live_user_bytes as f64;
            record.set("space_amp_max", max_bytes as f64 / live);
            record.set("space_amp_final", final_bytes as f64 / live);
        }
        let footprint = engine.footprint();
        set_log_figures(record, &footprint, "");
        set_gc_stats(record, &footprint, "");
        if !self.settle.is_zero() {
            // Idle, the engine open: what background GC (or compaction) does with the
            // time. Its figures are apart from the run's; throughput is the run's alone.
            std::thread::sleep(self.settle);
            let dir = self.dir.as_deref().expect("start ran before finish");
            let settled_bytes = sys::dir_space_used_bytes(dir)?;
            record.set("settle_seconds", self.settle.as_secs_f64());
            record.set("space_used_bytes_settled", settled_bytes);
            if self.live_user_bytes > 0 {
                record.set(
                    "space_amp_settled",
                    settled_bytes as f64 / self.live_user_bytes as f64,
                );
            }
            let settled = engine.footprint();
            set_log_figures(record, &settled, "_settled");
            set_gc_stats(record, &settled, "_settled");
        }
        Ok(())
    }
}

/// The engine's own view of its space, `suffix` after each field name.
fn set_log_figures(record: &mut Record, footprint: &crate::engine::Footprint, suffix: &str) {
    if let (Some(size), Some(live)) = (footprint.log_size_bytes, footprint.live_log_bytes) {
        record.set(&format!("log_size_bytes{suffix}"), size);
        record.set(&format!("live_log_bytes{suffix}"), live);
        if live > 0 {
            // The ratio Tucana's background GC steers (records' headers included).
            record.set(&format!("log_space_amp{suffix}"), size as f64 / live as f64);
        }
    }
    if let Some(allocated) = footprint.allocated_bytes {
        record.set(&format!("engine_allocated_bytes{suffix}"), allocated);
    }
}

/// The engine's GC counters, `suffix` after each field name.
fn set_gc_stats(record: &mut Record, footprint: &crate::engine::Footprint, suffix: &str) {
    for (name, value) in [
        ("gc_passes", footprint.gc_passes),
        ("gc_relocated_bytes", footprint.gc_relocated_bytes),
        ("gc_reclaimed_bytes", footprint.gc_reclaimed_bytes),
        ("gc_paced_ns", footprint.gc_paced_ns),
        ("commits", footprint.commits),
        ("dead_log_bytes", footprint.dead_log_bytes),
    ] {
        if let Some(value) = value {
            record.set(&format!("{name}{suffix}"), value);
        }
    }
}

/// What the sampler saw.
#[derive(Clone, Debug, Default)]
struct SpaceSamples {
    max_bytes: u64,
    count: u64,
    /// Every reading: milliseconds since the sampler started, allocated bytes. Where the
    /// peak falls (the burst's start, a commit pair, its end) says what set it.
    series: Vec<(u64, u64)>,
}

/// A thread reading a directory's allocated bytes every interval until stopped.
struct SpaceSampler {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<SpaceSamples>,
}

impl SpaceSampler {
    fn start(dir: PathBuf, interval: Duration) -> SpaceSampler {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("space-sampler".into())
            .spawn(move || {
                let mut samples = SpaceSamples::default();
                let started = std::time::Instant::now();
                loop {
                    // A file removed mid-walk (an engine deleting a segment or table) fails
                    // one reading; the next one sees the directory as it is.
                    if let Ok(bytes) = sys::dir_space_used_bytes(&dir) {
                        samples.max_bytes = samples.max_bytes.max(bytes);
                        samples.count += 1;
                        samples
                            .series
                            .push((started.elapsed().as_millis() as u64, bytes));
                    }
                    match stopped.recv_timeout(interval) {
                        Err(mpsc::RecvTimeoutError::Timeout) => continue,
                        // A message or the sender gone: stop.
                        _ => return samples,
                    }
                }
            })
            .expect("spawning a thread");
        SpaceSampler { stop, thread }
    }

    fn stop(self) -> SpaceSamples {
        let _ = self.stop.send(());
        self.thread
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

/// Create, load `delete_records`, delete them all, reclaim; disk bytes at every step.
fn delete_all(kind: &dyn EngineKind, config: &GcConfig) -> Result<Record> {
    let records = config.delete_records;
    let engine_config = EngineConfig {
        gc: true,
        gc_space_amp: kind.has_gc_switch().then_some(config.gc_space_amp),
        ..config.engine
    };
    let dir = tempfile::Builder::new()
        .prefix(&format!("tucana-bench-{}-delete-all-", kind.name()))
        .tempdir_in(&config.dir)
        .map_err(|e| format!("cannot create a directory in {}: {e}", config.dir.display()))?;
    let space = || -> Result<u64> { Ok(sys::dir_space_used_bytes(dir.path())?) };
    let mut engine = kind.open(dir.path(), &engine_config)?;
    engine.commit()?;
    let empty_bytes = space()?;

    let user_bytes = load_for_delete(engine.as_ref(), kind.name(), config)?;
    engine.commit()?;
    let loaded_bytes = space()?;

    let (m, deleted_key_bytes) = timed_deletes(engine.as_ref(), kind.name(), config)?;
    engine.commit()?;
    let deleted_bytes = space()?;
    let (left, first) = keys_left(engine.as_ref())?;
    if left > 0 {
        return Err(format!(
            "delete_all: every delete succeeded, yet a full scan found {left} key(s) (first {:?})",
            first.as_deref().map(String::from_utf8_lossy),
        )
        .into());
    }

    let reclaim_start = Instant::now();
    let method = engine.reclaim_space()?;
    engine.commit()?;
    let reclaim_seconds = reclaim_start.elapsed().as_secs_f64();
    let reclaimed_bytes = space()?;

    // The store must really be empty, and reclaiming must not bring anything back.
    let footprint = engine.footprint();
    let (left, first) = keys_left(engine.as_ref())?;
    if left > 0 || footprint.keys.is_some_and(|keys| keys > 0) {
        return Err(format!(
            "delete_all: after deleting every key and reclaiming ({method}), a full scan \
             found {left} key(s) (first {:?}; before reclaiming it found none); the engine \
             counts {:?}",
            first.as_deref().map(String::from_utf8_lossy),
            footprint.keys
        )
        .into());
    }
    engine.close()?;
    let closed_bytes = space()?;

    let mut record = Record::measured(kind.name(), "delete_all", &m);
    record.set_io_amp(&m, 0, deleted_key_bytes);
    record.set("dataset", DATASET);
    record.set("gc", "on");
    record.set("threads", config.threads as u64);
    record.set("records", records);
    record.set("value_layout", config.layout.describe());
    record.set("sync", config.engine.sync_writes);
    record.set("loaded_user_bytes", user_bytes);
    record.set("empty_space_bytes", empty_bytes);
    record.set("loaded_space_bytes", loaded_bytes);
    record.set("deleted_space_bytes", deleted_bytes);
    record.set("reclaimed_space_bytes", reclaimed_bytes);
    record.set("closed_space_bytes", closed_bytes);
    record.set(
        "above_empty_bytes",
        reclaimed_bytes.saturating_sub(empty_bytes),
    );
    record.set("reclaim", method);
    record.set("reclaim_seconds", reclaim_seconds);
    set_gc_stats(&mut record, &footprint, "");
    results::print_phase_row(&record);
    results::print_note(&format!(
        "disk: empty {}, loaded {}, after deletes {}, after reclaim {} ({} above empty), \
         after close {}; reclaim: {method}, {reclaim_seconds:.1} s",
        fmt_bytes(empty_bytes),
        fmt_bytes(loaded_bytes),
        fmt_bytes(deleted_bytes),
        fmt_bytes(reclaimed_bytes),
        fmt_bytes(reclaimed_bytes.saturating_sub(empty_bytes)),
        fmt_bytes(closed_bytes),
    ));
    Ok(record)
}

/// Loads the `delete_records` records of the delete-all run in batches; the user bytes
/// written.
fn load_for_delete(engine: &dyn Engine, engine_name: &str, config: &GcConfig) -> Result<u64> {
    let records = config.delete_records;
    let data = Records::new(config.layout, config.seed);
    let progress = crate::results::progress_bar(engine_name, DATASET, "delete_all load", records);
    let batch_size = config.load_batch.max(1) as u64;
    let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut user_bytes = 0u64;
    let mut start = 0;
    while start < records {
        let end = (start + batch_size).min(records);
        batch.resize_with((end - start) as usize, Default::default);
        for (slot, keynum) in batch.iter_mut().zip(start..end) {
            key_name(keynum, &mut slot.0);
            data.value_into(keynum, slot.0.len(), 0, &mut slot.1);
            user_bytes += (slot.0.len() + slot.1.len()) as u64;
        }
        engine.put_batch(&batch)?;
        progress.inc(end - start);
        start = end;
    }
    progress.finish_and_clear();
    Ok(user_bytes)
}

/// Deletes every record of the delete-all run, timed, each thread a contiguous share of the
/// record numbers; the measurement and the key bytes deleted.
fn timed_deletes(
    engine: &dyn Engine,
    engine_name: &str,
    config: &GcConfig,
) -> Result<(Measurement, u64)> {
    let records = config.delete_records;
    let progress = crate::results::progress_bar(engine_name, DATASET, "delete_all", records);
    let mut latencies: Vec<Latencies> = (0..config.threads).map(|_| Latencies::new()).collect();
    let timer = PhaseTimer::start();
    let shares: Vec<Result<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = latencies
            .iter_mut()
            .enumerate()
            .map(|(thread, lat)| {
                let progress = &progress;
                scope.spawn(move || -> Result<u64> {
                    let mut key = Vec::new();
                    let mut key_bytes = 0u64;
                    for keynum in thread_share(records, config.threads, thread) {
                        key_name(keynum, &mut key);
                        if !lat.time(|| engine.delete(&key))? {
                            return Err(format!(
                                "delete_all: record {keynum} ({}) was missing",
                                String::from_utf8_lossy(&key)
                            )
                            .into());
                        }
                        key_bytes += key.len() as u64;
                        progress.inc(1);
                    }
                    Ok(key_bytes)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut deleted_key_bytes = 0;
    for result in shares {
        deleted_key_bytes += result?;
    }
    let m = timer.finish(records, &latencies);
    progress.finish_and_clear();
    Ok((m, deleted_key_bytes))
}

/// Keys a full forward scan finds, and the first of them.
fn keys_left(engine: &dyn Engine) -> Result<(u64, Option<Vec<u8>>)> {
    let mut count = 0u64;
    let mut first = None;
    engine.scan(
        Bound::Unbounded,
        Bound::Unbounded,
        crate::engine::Direction::Forward,
        &mut |key, _| {
            count += 1;
            first.get_or_insert_with(|| key.to_vec());
            ControlFlow::Continue(())
        },
    )?;
    Ok((count, first))
}

/// A record saying that `workload` of the GC runs failed on `engine`, and why; the
/// document lists these apart (a `failed` field, as the suite's child runs have).
fn failure(engine: &'static str, workload: &str, error: &str) -> Record {
    println!("\nWARNING: {engine} {workload}: {error}");
    let mut record = Record::unmeasured(engine, workload);
    record.set("dataset", DATASET);
    record.set("failed", error);
    record
}

fn number(record: &Record, name: &str) -> Option<f64> {
    record.get(name).and_then(Value::as_f64)
}

/// The lines under an overwrite run's row: space and GC figures.
fn print_overwrite_note(record: &Record) {
    let fmt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
    let bytes = |name: &str| {
        record
            .get(name)
            .and_then(Value::as_u64)
            .map_or_else(|| "-".to_string(), fmt_bytes)
    };
    let gc = record.get("gc").and_then(Value::as_str).unwrap_or("?");
    let target = match number(record, "gc_space_amp_target") {
        Some(t) if gc == "on" => format!(" (target {t})"),
        _ => String::new(),
    };
    results::print_note(&format!(
        "GC {gc}{target}: space amp (disk ÷ live user bytes) max {} final {} settled {}; \
         log space amp {} settled {}{}",
        fmt(number(record, "space_amp_max")),
        fmt(number(record, "space_amp_final")),
        fmt(number(record, "space_amp_settled")),
        fmt(number(record, "log_space_amp")),
        fmt(number(record, "log_space_amp_settled")),
        number(record, "throughput_vs_gc_off")
            .map_or_else(String::new, |r| format!("; throughput vs GC off {r:.2}")),
    ));
    if let Some(r) = number(record, "cpu_per_op_vs_gc_off") {
        results::print_note(&format!(
            "CPU per operation, GC off ÷ this run: {r:.2} (the throughput ratio where CPU is \
             the limit and nothing else runs)"
        ));
    }
    results::print_note(&format!(
        "disk {} (engine allocator {}); GC relocated {} reclaimed {} during the run{}",
        bytes("space_used_bytes"),
        bytes("engine_allocated_bytes"),
        bytes("gc_relocated_bytes"),
        bytes("gc_reclaimed_bytes"),
        match (number(record, "gc_paced_ns"), number(record, "commits")) {
            (Some(paced_ns), Some(commits)) => format!(
                "; writers paced {:.2} s in all, {commits} commits since open",
                paced_ns / 1e9
            ),
            _ => String::new(),
        },
    ));
}

/// The figures of issue 5, one line each, for the end of a run.
pub fn print_summary(records: &[Record]) {
    let gc_records: Vec<&Record> = records
        .iter()
        .filter(|r| r.get("dataset").and_then(Value::as_str) == Some(DATASET))
        .collect();
    if gc_records.is_empty() {
        return;
    }
    println!("\nsummary: garbage collection");
    for record in &gc_records {
        if let Some(error) = record.get("failed").and_then(Value::as_str) {
            println!("{:<8} {} FAILED: {error}", record.engine, record.workload);
            continue;
        }
        match record.workload.as_str() {
            "gc_ycsb_a" => {
                let gc = record.get("gc").and_then(Value::as_str).unwrap_or("?");
                let ratio = number(record, "throughput_vs_gc_off").map_or_else(String::new, |r| {
                    format!(
                        ", {r:.2} of GC off (target ≥ {THROUGHPUT_RATIO_TARGET}{})",
                        if r >= THROUGHPUT_RATIO_TARGET {
                            ": met"
                        } else {
                            ": MISSED"
                        }
                    )
                });
                let target = number(record, "gc_space_amp_target");
                let space = number(record, "space_amp_max");
                let verdict = match (gc, target, space) {
                    ("on", Some(t), Some(s)) if s <= t => format!(" (target ≤ {t}: met)"),
                    ("on", Some(t), Some(_)) => format!(" (target ≤ {t}: MISSED)"),
                    _ => String::new(),
                };
                println!(
                    "{:<8} overwrite, GC {gc:<3}: {:>9.0} ops/s{ratio}; space amp max {:.2}{verdict}, \
                     final {:.2}, settled {:.2}",
                    record.engine,
                    record.ops_per_sec.unwrap_or(f64::NAN),
                    space.unwrap_or(f64::NAN),
                    number(record, "space_amp_final").unwrap_or(f64::NAN),
                    number(record, "space_amp_settled").unwrap_or(f64::NAN),
                );
            }
            "delete_all" => {
                let get = |name: &str| record.get(name).and_then(Value::as_u64).unwrap_or(0);
                println!(
                    "{:<8} delete-all: empty {}, loaded {}, after deletes {}, after reclaim {} \
                     ({} above empty)",
                    record.engine,
                    fmt_bytes(get("empty_space_bytes")),
                    fmt_bytes(get("loaded_space_bytes")),
                    fmt_bytes(get("deleted_space_bytes")),
                    fmt_bytes(get("reclaimed_space_bytes")),
                    fmt_bytes(get("above_empty_bytes")),
                );
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::Memory;

    fn config(dir: &Path) -> GcConfig {
        GcConfig {
            records: 500,
            overwrites: 2,
            delete_records: 300,
            threads: 2,
            layout: ValueLayout::Fields {
                fields: 1,
                field_bytes: 40,
            },
            load_batch: 16,
            seed: 3,
            engine: EngineConfig::default(),
            gc_space_amp: 1.5,
            more_gc_space_amps: Vec::new(),
            sample_interval: Duration::from_millis(1),
            settle: Duration::from_millis(5),
            dir: dir.to_path_buf(),
        }
    }

    #[test]
    fn operations_overwrite_the_data_set() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        // Half the operations are updates: 2 overwrites of 500 records = 1000 updates.
        assert_eq!(config.operations(), 2000);
    }

    #[test]
    fn a_target_of_one_or_less_is_refused() {
        let plan = GcPlanArgs {
            records: 10,
            overwrites: 1,
            space_amp: 1.0,
            delete_records: None,
            settle_secs: 15,
        };
        let layout = ValueLayout::Fields {
            fields: 1,
            field_bytes: 8,
        };
        let shape = RunShape {
            threads: 1,
            layout,
            load_batch: 1,
            seed: 1,
            engine: EngineConfig::default(),
            dir: PathBuf::from("."),
        };
        let config = |plan: &GcPlanArgs| plan.config(false, shape.clone());
        assert!(config(&plan).is_err());
        assert!(config(&GcPlanArgs {
            space_amp: f64::NAN,
            ..plan.clone()
        })
        .is_err());
        let quick = GcPlanArgs {
            records: 1_000_000,
            space_amp: 2.0,
            ..plan
        };
        let shrunk = quick.config(true, shape.clone()).unwrap();
        assert_eq!((shrunk.records, shrunk.delete_records), (2_000, 2_000));
        assert!(shrunk.settle.is_zero(), "quick runs do not wait");
    }

    #[test]
    fn runs_record_space_and_leave_no_files() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut records = Vec::new();
        run(&Memory, &config, &mut records).unwrap();
        let names: Vec<&str> = records.iter().map(|r| r.workload.as_str()).collect();
        // The memory engine has no GC switch: one overwrite run.
        assert_eq!(names, ["gc_load", "gc_ycsb_a", "delete_all"]);
        for record in &records {
            assert_eq!(record.get("dataset").unwrap(), DATASET);
            assert_eq!(record.get("gc").unwrap(), "on");
            assert!(record.ops_per_sec.unwrap() > 0.0);
        }
        let overwrite = &records[1];
        assert_eq!(overwrite.get("ops").unwrap(), 2000);
        assert!(overwrite.get("space_amp_max").is_some());
        assert!(overwrite.get("space_samples").unwrap().as_u64().unwrap() >= 1);
        assert!(overwrite.get("throughput_vs_gc_off").is_none());
        let delete = &records[2];
        assert_eq!(delete.get("records").unwrap(), 300);
        assert_eq!(delete.get("ops").unwrap(), 300);
        assert!(delete
            .get("reclaim")
            .unwrap()
            .as_str()
            .unwrap()
            .starts_with("nothing"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn tucana_runs_with_gc_on_and_off() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path());
        config.records = 2000;
        config.delete_records = 2000;
        config.more_gc_space_amps = vec![2.0];
        let mut records = Vec::new();
        run(&crate::engine::Tucana, &config, &mut records).unwrap();
        let runs: Vec<(&str, &str)> = records
            .iter()
            .map(|r| {
                (
                    r.workload.as_str(),
                    r.get("gc").and_then(Value::as_str).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            runs,
            [
                ("gc_load", "on"),
                ("gc_load", "on"),
                ("gc_load", "off"),
                ("gc_ycsb_a", "on"),
                ("gc_ycsb_a", "on"),
                ("gc_ycsb_a", "off"),
                ("delete_all", "on"),
            ]
        );
        // The second target's run is measured against the same GC-off run.
        let more = &records[4];
        assert_eq!(more.get("gc_space_amp_target").unwrap(), 2.0);
        assert!(more.get("throughput_vs_gc_off").unwrap().as_f64().unwrap() > 0.0);
        assert!(records[5].get("throughput_vs_gc_off").is_none());
        let on = &records[3];
        assert!(on.get("throughput_vs_gc_off").unwrap().as_f64().unwrap() > 0.0);
        assert!(on.get("cpu_per_op_vs_gc_off").unwrap().as_f64().unwrap() > 0.0);
        assert!(on.get("log_space_amp").is_some());
        assert!(on.get("gc_relocated_bytes").is_some());
        assert!(on.get("gc_paced_ns").is_some());
        assert!(on.get("commits").unwrap().as_u64().unwrap() > 0);
        assert!(on.get("space_amp_settled").is_some());
        assert!(on.get("log_space_amp_settled").is_some());
        assert_eq!(on.get("gc_space_amp_target").unwrap(), 1.5);
        let delete = &records[6];
        assert!(delete
            .get("reclaim")
            .unwrap()
            .as_str()
            .unwrap()
            .contains("gc"));
        let loaded = delete.get("loaded_space_bytes").unwrap().as_u64().unwrap();
        let empty = delete.get("empty_space_bytes").unwrap().as_u64().unwrap();
        assert!(loaded > empty, "loading 2000 records takes space");
    }
}
