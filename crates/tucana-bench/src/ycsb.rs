//! YCSB's core workloads, as YCSB defines them, on any [`EngineKind`]: Load, A, B, C, F,
//! D, then a fresh database, Load again and E — the sequence of the Tucana paper's Table 1.
//!
//! What is YCSB's, exactly: key names (`"user"` + the FNV-1a 64 hash of the record number,
//! "hashed insert order"), the scrambled zipfian request distribution with constant 0.99
//! (YCSB's Gray et al. generator over 10^10 items, hashed onto the record space), the
//! skewed-latest distribution of D, uniform scan lengths 1..=100 for E, the operation
//! mixes, and the key chooser's item count (records plus twice the expected inserts).
//! What differs, and why: a record's value is its fields' bytes concatenated (no field
//! names, as a key-value store's binding would store them), an update writes the whole
//! record (a blind put; YCSB's default updates one field, which on a key-value store means
//! a read-modify-write, and F measures that), and the value sizes can follow Talos's mixes
//! (small 33 B, medium 123 B, large 1023 B key-value pairs, or SD = 60/20/20 of them).
//!
//! Checking: every value starts with a header naming its record number and generation and
//! continues with bytes derived from both, so any value read can be checked on its own: it
//! must rebuild exactly the key it was found under and its own bytes. A read of a record
//! whose insert was acknowledged must find it; scans must return ascending keys starting at
//! the key sought. (A read may legitimately return an older generation than the newest one
//! written while it ran, so generations are not compared.)
//!
//! Owns the generators, the phase logic and the per-phase record; the engines, clocks and
//! output format are other modules'. Each phase runs on `threads` scoped threads sharing
//! one `&dyn Engine`; the shared state (which records exist) is atomics only.

use std::ops::{Bound, ControlFlow};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use indicatif::ProgressBar;
use rand::rngs::StdRng;
use rand::Rng;

use crate::engine::{Direction, Engine, EngineConfig, EngineKind};
use crate::measure::{Latencies, Measurement, PhaseTimer};
use crate::results::{self, Record};
use crate::sys;
use crate::workload::{fill_stream, thread_rng, thread_share, GOLDEN};
use crate::Result;

/// YCSB's `zipfian_constant`.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// YCSB's ScrambledZipfianGenerator draws from this many items, then hashes onto the keys.
const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// zeta(SCRAMBLED_ITEM_COUNT, 0.99), precomputed by YCSB (ScrambledZipfianGenerator.ZETAN).
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;
/// YCSB workload E's `maxscanlength`.
pub const MAX_SCAN_LENGTH: u64 = 100;
/// Header of every value: record number (5 bytes) and generation (3 bytes), little-endian.
const VALUE_HEADER_BYTES: usize = 8;
/// Operations a worker does between two progress-bar updates.
const PROGRESS_STEP: u64 = 1024;

// ---------------------------------------------------------------------------------------
// YCSB's generators.

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-endian bytes, made non-negative as
/// Java's `Math.abs` does.
pub fn fnv_hash64(value: u64) -> u64 {
    const OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 1_099_511_628_211;
    let mut hash = OFFSET_BASIS;
    let mut rest = value;
    for _ in 0..8 {
        hash ^= rest & 0xff;
        rest >>= 8;
        hash = hash.wrapping_mul(PRIME);
    }
    // Math.abs(Long.MIN_VALUE) is Long.MIN_VALUE; its unsigned bits are 2^63, as here.
    (hash as i64).wrapping_abs() as u64
}

/// YCSB's key name for record `keynum` with hashed inserts and `zeropadding` 1.
pub fn key_name(keynum: u64, out: &mut Vec<u8>) {
    use std::io::Write;
    out.clear();
    // Writing into a Vec cannot fail.
    let _ = write!(out, "user{}", fnv_hash64(keynum));
}

fn zeta(from: u64, to: u64, theta: f64, initial: f64) -> f64 {
    let mut sum = initial;
    for i in from..to {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating billion-record synthetic
/// databases"): item `0` is the most popular. The item count may grow between draws (the
/// zeta sum is extended incrementally, as YCSB does), never shrink.
#[derive(Clone, Debug)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zeta2theta: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    pub fn new(items: u64, theta: f64) -> Zipfian {
        Zipfian::with_zetan(items, theta, zeta(0, items, theta, 0.0))
    }

    fn with_zetan(items: u64, theta: f64, zetan: f64) -> Zipfian {
        assert!(items >= 1);
        let zeta2theta = zeta(0, 2, theta, 0.0);
        let mut zipfian = Zipfian {
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2theta,
            zetan,
            eta: 0.0,
        };
        zipfian.eta = zipfian.eta_for(items);
        zipfian
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2theta / self.zetan)
    }

    /// A draw in `0..items`, extending the distribution to `items` first if it grew.
    pub fn next(&mut self, rng: &mut StdRng, items: u64) -> u64 {
        assert!(items >= self.items, "a zipfian's item count only grows");
        if items > self.items {
            self.zetan = zeta(self.items, items, self.theta, self.zetan);
            self.items = items;
            self.eta = self.eta_for(items);
        }
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let draw = (items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        draw.min(items - 1)
    }
}

/// YCSB's `ScrambledZipfianGenerator`: zipfian popularity, but the popular items spread over
/// the key space by hashing, so they are not the first records inserted.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    item_count: u64,
    zipfian: Zipfian,
}

impl ScrambledZipfian {
    pub fn new(item_count: u64) -> ScrambledZipfian {
        assert!(item_count >= 1);
        ScrambledZipfian {
            item_count,
            zipfian: Zipfian::with_zetan(SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    pub fn next(&mut self, rng: &mut StdRng) -> u64 {
        let draw = self.zipfian.next(rng, SCRAMBLED_ITEM_COUNT);
        fnv_hash64(draw) % self.item_count
    }
}

// ---------------------------------------------------------------------------------------
// Records: sizes and values.

/// Talos's key-value pair sizes (key and value together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SizeMix {
    /// 33-byte pairs.
    Small,
    /// 123-byte pairs.
    Medium,
    /// 1023-byte pairs.
    Large,
    /// 60% small, 20% medium, 20% large.
    Sd,
}

impl SizeMix {
    fn pair_bytes(self, keynum: u64) -> usize {
        match self {
            SizeMix::Small => 33,
            SizeMix::Medium => 123,
            SizeMix::Large => 1023,
            SizeMix::Sd => match hash_u64(keynum ^ 0x5D5D) % 10 {
                0..=5 => 33,
                6 | 7 => 123,
                _ => 1023,
            },
        }
    }
}

/// How large a record's value is.
#[derive(Clone, Copy, Debug)]
pub enum ValueLayout {
    /// YCSB's `fieldcount` fields of `fieldlength` bytes each.
    Fields { fields: u32, field_bytes: usize },
    /// Talos's pair sizes: the value is the pair size less the key.
    Mix(SizeMix),
}

impl ValueLayout {
    pub fn describe(&self) -> String {
        match self {
            ValueLayout::Fields {
                fields,
                field_bytes,
            } => format!("{fields} field(s) x {field_bytes} B"),
            ValueLayout::Mix(mix) => format!("Talos size mix {mix:?}"),
        }
    }

    fn value_bytes(&self, keynum: u64, key_bytes: usize) -> usize {
        let bytes = match *self {
            ValueLayout::Fields {
                fields,
                field_bytes,
            } => fields as usize * field_bytes,
            ValueLayout::Mix(mix) => mix.pair_bytes(keynum).saturating_sub(key_bytes),
        };
        bytes.max(VALUE_HEADER_BYTES)
    }
}

fn hash_u64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Builds and checks keys and values of one data set. Immutable, so shared by all threads.
#[derive(Clone, Debug)]
pub struct Records {
    layout: ValueLayout,
    seed: u64,
}

impl Records {
    pub fn new(layout: ValueLayout, seed: u64) -> Records {
        Records {
            layout,
            seed: hash_u64(seed),
        }
    }

    /// Writes the value of record `keynum` at `generation` (taken modulo 2^24) after `key`.
    pub fn value_into(&self, keynum: u64, key_bytes: usize, generation: u32, out: &mut Vec<u8>) {
        assert!(keynum < 1 << 40, "record numbers fit in 40 bits");
        let generation = generation & 0xFF_FFFF;
        out.clear();
        out.resize(self.layout.value_bytes(keynum, key_bytes), 0);
        out[..5].copy_from_slice(&keynum.to_le_bytes()[..5]);
        out[5..8].copy_from_slice(&generation.to_le_bytes()[..3]);
        let stream_seed = self.seed ^ keynum.wrapping_mul(GOLDEN) ^ (u64::from(generation) << 40);
        fill_stream(stream_seed, &mut out[VALUE_HEADER_BYTES..]);
    }

    /// Checks that `value`, found under `key`, is a value this data set wrote for that key.
    /// `scratch` buffers avoid allocating per check.
    pub fn check(
        &self,
        key: &[u8],
        value: &[u8],
        scratch: &mut (Vec<u8>, Vec<u8>),
    ) -> std::result::Result<u64, String> {
        if value.len() < VALUE_HEADER_BYTES {
            return Err(format!(
                "value of {} bytes under {} is too short",
                value.len(),
                show(key)
            ));
        }
        let mut keynum_bytes = [0u8; 8];
        keynum_bytes[..5].copy_from_slice(&value[..5]);
        let keynum = u64::from_le_bytes(keynum_bytes);
        let mut generation_bytes = [0u8; 4];
        generation_bytes[..3].copy_from_slice(&value[5..8]);
        let generation = u32::from_le_bytes(generation_bytes);
        key_name(keynum, &mut scratch.0);
        if scratch.0 != key {
            return Err(format!(
                "value under {} belongs to {}",
                show(key),
                show(&scratch.0)
            ));
        }
        self.value_into(keynum, key.len(), generation, &mut scratch.1);
        if scratch.1 != value {
            return Err(format!("wrong value under {}", show(key)));
        }
        Ok(keynum)
    }
}

fn show(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

// ---------------------------------------------------------------------------------------
// Workloads.

/// Request distribution of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    Zipfian,
    Latest,
}

/// One of YCSB's core workloads: proportions of each operation (summing to 1).
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub name: &'static str,
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub read_modify_write: f64,
    pub distribution: Distribution,
}

const fn workload(
    name: &'static str,
    [read, update, insert, scan, read_modify_write]: [f64; 5],
    distribution: Distribution,
) -> Workload {
    Workload {
        name,
        read,
        update,
        insert,
        scan,
        read_modify_write,
        distribution,
    }
}

pub const A: Workload = workload("ycsb_a", [0.5, 0.5, 0.0, 0.0, 0.0], Distribution::Zipfian);
pub const B: Workload = workload("ycsb_b", [0.95, 0.05, 0.0, 0.0, 0.0], Distribution::Zipfian);
pub const C: Workload = workload("ycsb_c", [1.0, 0.0, 0.0, 0.0, 0.0], Distribution::Zipfian);
pub const F: Workload = workload("ycsb_f", [0.5, 0.0, 0.0, 0.0, 0.5], Distribution::Zipfian);
pub const D: Workload = workload("ycsb_d", [0.95, 0.0, 0.05, 0.0, 0.0], Distribution::Latest);
pub const E: Workload = workload("ycsb_e", [0.0, 0.0, 0.05, 0.95, 0.0], Distribution::Zipfian);

#[cfg(test)]
/// The phases in the order they run: "ycsb_load", A, B, C, F, D, "ycsb_reload", E.
pub const PHASES: [&str; 8] = [
    "ycsb_load",
    "ycsb_a",
    "ycsb_b",
    "ycsb_c",
    "ycsb_f",
    "ycsb_d",
    "ycsb_reload",
    "ycsb_e",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

impl Workload {
    fn assert_valid(&self) {
        let total = self.read + self.update + self.insert + self.scan + self.read_modify_write;
        assert!(
            (total - 1.0).abs() < 1e-9,
            "{}: proportions sum to {total}",
            self.name
        );
    }

    /// Draws the next operation by the workload's proportions.
    pub(crate) fn pick(&self, rng: &mut StdRng) -> Op {
        let mut u: f64 = rng.random();
        for (share, op) in [
            (self.read, Op::Read),
            (self.update, Op::Update),
            (self.insert, Op::Insert),
            (self.scan, Op::Scan),
        ] {
            if u < share {
                return op;
            }
            u -= share;
        }
        Op::ReadModifyWrite
    }
}

// ---------------------------------------------------------------------------------------
// Running.

#[derive(Clone, Debug)]
pub struct YcsbConfig {
    /// Records loaded before the workloads (YCSB's `recordcount`).
    pub records: u64,
    /// Operations per workload (YCSB's `operationcount`).
    pub operations: u64,
    pub threads: usize,
    pub layout: ValueLayout,
    /// Records per write batch in the load phases (1: one put per record, as YCSB's load).
    pub load_batch: usize,
    pub seed: u64,
    /// Name of the data set in the records ("in-memory", "larger-than-memory", "quick").
    pub dataset: String,
    pub engine: EngineConfig,
    /// Parent of the run's fresh, temporary engine directories.
    pub dir: PathBuf,
}

/// Which records exist: shared by a database's phases and threads.
struct State {
    present: Vec<AtomicBool>,
    generation: Vec<AtomicU32>,
    /// Record numbers below this were issued to an insert (maybe not acknowledged yet).
    issued: AtomicU64,
    live_user_bytes: AtomicU64,
}

impl State {
    fn new(capacity: u64) -> State {
        State {
            present: (0..capacity).map(|_| AtomicBool::new(false)).collect(),
            generation: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            issued: AtomicU64::new(0),
            live_user_bytes: AtomicU64::new(0),
        }
    }

    fn capacity(&self) -> u64 {
        self.present.len() as u64
    }

    fn is_present(&self, keynum: u64) -> bool {
        // Acquire: pairs with the Release after the put, so the put happened before.
        self.present[keynum as usize].load(Ordering::Acquire)
    }
}

/// Runs the whole sequence on an engine of `kind`, appending one record per phase and
/// calling `after_phase` with all records after each (to save them as the run goes).
pub fn run(
    kind: &dyn EngineKind,
    config: &YcsbConfig,
    records: &mut Vec<Record>,
    after_phase: &mut dyn FnMut(&[Record]) -> Result<()>,
) -> Result<()> {
    assert!(config.records > 0 && config.threads > 0);
    let data = Records::new(config.layout, config.seed);
    // D and E insert at most 5% of their operations; leave room for all of them anyway.
    let capacity = config.records + config.operations;
    results::print_phase_table_header();
    {
        let db = Database::open(kind, config)?;
        let state = State::new(capacity);
        let run = Run {
            engine: db.engine(),
            engine_name: kind.name(),
            data: &data,
            config,
            state: &state,
            dir: db.dir.path(),
        };
        records.push(run.load("ycsb_load")?);
        after_phase(records)?;
        for workload in [A, B, C, F, D] {
            records.push(run.workload(&workload)?);
            after_phase(records)?;
        }
        db.close()?;
    }
    // "Reload": E runs on a fresh database, as in the paper.
    let db = Database::open(kind, config)?;
    let state = State::new(capacity);
    let run = Run {
        engine: db.engine(),
        engine_name: kind.name(),
        data: &data,
        config,
        state: &state,
        dir: db.dir.path(),
    };
    records.push(run.load("ycsb_reload")?);
    after_phase(records)?;
    records.push(run.workload(&E)?);
    after_phase(records)?;
    db.close()
}

/// What a caller of [`load_and_run`] does around the measured workload.
pub trait PhaseWatch {
    /// Called after the load, just before the workload's first operation; `dir` holds
    /// the engine's files, `live_user_bytes` the keys and values loaded.
    fn start(&mut self, dir: &Path, live_user_bytes: u64) -> Result<()>;

    /// Called after the workload's last operation, engine still open; may add to its record.
    fn finish(&mut self, engine: &dyn Engine, record: &mut Record) -> Result<()>;
}

/// Loads a fresh database of `config.records` records (phase `load_phase`) and runs
/// `workload` on it once, with `watch` around it; returns the load's and the workload's
/// records. For runs of one workload with their own measurements (garbage collection).
pub fn load_and_run(
    kind: &dyn EngineKind,
    config: &YcsbConfig,
    load_phase: &str,
    workload: &Workload,
    watch: &mut dyn PhaseWatch,
) -> Result<(Record, Record)> {
    assert!(config.records > 0 && config.threads > 0);
    assert!(
        workload.insert == 0.0,
        "{}: only workloads without inserts",
        workload.name
    );
    let data = Records::new(config.layout, config.seed);
    let db = Database::open(kind, config)?;
    let state = State::new(config.records);
    let run = Run {
        engine: db.engine(),
        engine_name: kind.name(),
        data: &data,
        config,
        state: &state,
        dir: db.dir.path(),
    };
    let load = run.load(load_phase)?;
    watch.start(db.dir.path(), state.live_user_bytes.load(Ordering::Relaxed))?;
    let mut record = run.workload(workload)?;
    watch.finish(db.engine(), &mut record)?;
    db.close()?;
    Ok((load, record))
}

/// An open engine in its own temporary directory, removed after the engine closes.
struct Database {
    engine: Option<Box<dyn Engine>>,
    dir: tempfile::TempDir,
}

impl Database {
    fn open(kind: &dyn EngineKind, config: &YcsbConfig) -> Result<Database> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("tucana-bench-{}-", kind.name()))
            .tempdir_in(&config.dir)
            .map_err(|e| format!("cannot create a directory in {}: {e}", config.dir.display()))?;
        let engine = kind.open(dir.path(), &config.engine)?;
        Ok(Database {
            engine: Some(engine),
            dir,
        })
    }

    fn engine(&self) -> &dyn Engine {
        self.engine.as_deref().expect("open until closed")
    }

    fn close(mut self) -> Result<()> {
        if let Some(engine) = self.engine.take() {
            engine.close()?;
        }
        Ok(())
    }
}

struct Run<'a> {
    engine: &'a dyn Engine,
    engine_name: &'static str,
    data: &'a Records,
    config: &'a YcsbConfig,
    state: &'a State,
    dir: &'a Path,
}

/// What one thread did besides its latencies.
#[derive(Default)]
struct Tally {
    ops: u64,
    /// Operations that wrote (updates, read-modify-writes, inserts).
    writes: u64,
    user_read_bytes: u64,
    user_write_bytes: u64,
}

impl Run<'_> {
    /// Runs `body(thread, latencies, progress)` on every thread with a progress bar.
    fn parallel<F>(&self, phase: &str, total_ops: u64, body: F) -> Result<(Measurement, Tally)>
    where
        F: Fn(usize, &mut Latencies, &ProgressBar) -> Result<Tally> + Sync,
    {
        let progress =
            results::progress_bar(self.engine_name, &self.config.dataset, phase, total_ops);
        let mut latencies: Vec<Latencies> =
            (0..self.config.threads).map(|_| Latencies::new()).collect();
        let timer = PhaseTimer::start();
        let results: Vec<Result<Tally>> = std::thread::scope(|scope| {
            let handles: Vec<_> = latencies
                .iter_mut()
                .enumerate()
                .map(|(thread, lat)| {
                    let body = &body;
                    let progress = &progress;
                    crate::measure::spawn_client(scope, thread, move || body(thread, lat, progress))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut total = Tally::default();
        for result in results {
            let tally = result.map_err(|e| format!("{phase}: {e}"))?;
            total.ops += tally.ops;
            total.writes += tally.writes;
            total.user_read_bytes += tally.user_read_bytes;
            total.user_write_bytes += tally.user_write_bytes;
        }
        let m = timer.finish(total.ops, &latencies);
        progress.finish_and_clear();
        Ok((m, total))
    }

    /// Inserts records `0..records`, each thread a contiguous share of record numbers (the
    /// keys themselves are hashed, so every thread writes all over the key space).
    fn load(&self, phase: &str) -> Result<Record> {
        let records = self.config.records;
        self.state.issued.store(records, Ordering::Release);
        let batch_size = self.config.load_batch.max(1);
        let (m, tally) = self.parallel(phase, records, |thread, lat, progress| {
            let (mut key, mut value) = (Vec::new(), Vec::new());
            let mut tally = Tally::default();
            if batch_size == 1 {
                for keynum in thread_share(records, self.config.threads, thread) {
                    self.insert(keynum, &mut key, &mut value, lat)?;
                    tally.ops += 1;
                    tally.user_write_bytes += (key.len() + value.len()) as u64;
                    if tally.ops % PROGRESS_STEP == 0 {
                        progress.inc(PROGRESS_STEP);
                    }
                }
                return Ok(tally);
            }
            let share = thread_share(records, self.config.threads, thread);
            let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(batch_size);
            let mut start = share.start;
            while start < share.end {
                let end = (start + batch_size as u64).min(share.end);
                batch.resize_with((end - start) as usize, Default::default);
                for (slot, keynum) in batch.iter_mut().zip(start..end) {
                    key_name(keynum, &mut slot.0);
                    self.data.value_into(keynum, slot.0.len(), 0, &mut slot.1);
                }
                // One latency sample per batch.
                lat.time(|| self.engine.put_batch(&batch))?;
                for ((k, v), keynum) in batch.iter().zip(start..end) {
                    let bytes = (k.len() + v.len()) as u64;
                    tally.user_write_bytes += bytes;
                    self.state
                        .live_user_bytes
                        .fetch_add(bytes, Ordering::Relaxed);
                    self.state.present[keynum as usize].store(true, Ordering::Release);
                }
                tally.ops += end - start;
                progress.inc(end - start);
                start = end;
            }
            Ok(tally)
        })?;
        let mut record = self.record(phase, &m, &tally)?;
        record.set("load_batch", batch_size as u64);
        if batch_size > 1 {
            record.set("latency_unit", format!("one batch of {batch_size} records"));
        }
        Ok(record)
    }

    fn insert(
        &self,
        keynum: u64,
        key: &mut Vec<u8>,
        value: &mut Vec<u8>,
        lat: &mut Latencies,
    ) -> Result<()> {
        key_name(keynum, key);
        self.data.value_into(keynum, key.len(), 0, value);
        lat.time(|| self.engine.put(key, value))?;
        self.state
            .live_user_bytes
            .fetch_add((key.len() + value.len()) as u64, Ordering::Relaxed);
        self.state.present[keynum as usize].store(true, Ordering::Release);
        Ok(())
    }

    fn workload(&self, workload: &Workload) -> Result<Record> {
        workload.assert_valid();
        let phase = workload.name;
        let operations = self.config.operations;
        // YCSB: the key chooser covers the records plus twice the expected inserts.
        let records_at_start = self.state.issued.load(Ordering::Acquire);
        let expected_inserts = (operations as f64 * workload.insert * 2.0) as u64;
        let chooser_items = records_at_start + expected_inserts;
        let syncs_before = self.engine.footprint().syncs;
        let (m, tally) = self.parallel(phase, operations, |thread, lat, progress| {
            let mut rng = thread_rng(self.config.seed, phase, thread);
            let mut scrambled = ScrambledZipfian::new(chooser_items);
            let mut latest = (workload.distribution == Distribution::Latest)
                .then(|| Zipfian::new(records_at_start, ZIPFIAN_CONSTANT));
            let (mut key, mut value) = (Vec::new(), Vec::new());
            let mut scratch = (Vec::new(), Vec::new());
            let mut scanned: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            // Samples of the read and write inside a read-modify-write, discarded: the
            // pair is one sample in `lat`.
            let mut inner = Latencies::new();
            let mut tally = Tally::default();
            let share = thread_share(operations, self.config.threads, thread);
            for _ in share {
                let mut choose = |rng: &mut StdRng| -> u64 {
                    loop {
                        let issued = self.state.issued.load(Ordering::Acquire);
                        let keynum = match latest.as_mut() {
                            // YCSB's SkewedLatestGenerator: the newest records are the
                            // most popular.
                            Some(zipfian) => issued - 1 - zipfian.next(rng, issued),
                            None => scrambled.next(rng),
                        };
                        // YCSB redraws numbers past the last acknowledged insert.
                        if keynum < issued && self.state.is_present(keynum) {
                            return keynum;
                        }
                    }
                };
                let op = workload.pick(&mut rng);
                tally.writes += u64::from(!matches!(op, Op::Read | Op::Scan));
                match op {
                    Op::Read => {
                        let keynum = choose(&mut rng);
                        tally.user_read_bytes += self.read(keynum, &mut key, &mut scratch, lat)?;
                    }
                    Op::Update => {
                        let keynum = choose(&mut rng);
                        tally.user_write_bytes += self.update(keynum, &mut key, &mut value, lat)?;
                    }
                    Op::ReadModifyWrite => {
                        let keynum = choose(&mut rng);
                        // One latency sample for the pair, as YCSB times it.
                        let start = std::time::Instant::now();
                        tally.user_read_bytes +=
                            self.read(keynum, &mut key, &mut scratch, &mut inner)?;
                        tally.user_write_bytes +=
                            self.update(keynum, &mut key, &mut value, &mut inner)?;
                        lat.record(start.elapsed());
                    }
                    Op::Insert => {
                        let keynum = self.state.issued.fetch_add(1, Ordering::AcqRel);
                        if keynum >= self.state.capacity() {
                            return Err("more inserts than the run has room for".into());
                        }
                        self.insert(keynum, &mut key, &mut value, lat)?;
                        tally.user_write_bytes += (key.len() + value.len()) as u64;
                    }
                    Op::Scan => {
                        let keynum = choose(&mut rng);
                        let length = rng.random_range(1..=MAX_SCAN_LENGTH);
                        tally.user_read_bytes +=
                            self.scan(keynum, length, &mut key, &mut scanned, &mut scratch, lat)?;
                    }
                }
                tally.ops += 1;
                if tally.ops % PROGRESS_STEP == 0 {
                    progress.inc(PROGRESS_STEP);
                }
            }
            Ok(tally)
        })?;
        let mut record = self.record(phase, &m, &tally)?;
        let syncs = syncs_before.zip(self.engine.footprint().syncs);
        let sync = self.config.engine.sync_writes;
        results::set_syncs(&mut record, syncs, tally.writes, sync);
        Ok(record)
    }

    /// Reads record `keynum`, which must exist; returns the user bytes read.
    fn read(
        &self,
        keynum: u64,
        key: &mut Vec<u8>,
        scratch: &mut (Vec<u8>, Vec<u8>),
        lat: &mut Latencies,
    ) -> Result<u64> {
        key_name(keynum, key);
        let mut checked: Option<std::result::Result<u64, String>> = None;
        let mut value_bytes = 0;
        // The check runs inside the engine's callback (the value may be borrowed from the
        // engine), so it is inside the latency sample, the same for every engine.
        let found = lat.time(|| {
            self.engine.get(key, &mut |value| {
                value_bytes = value.len();
                let result = self.data.check(key, value, scratch);
                let ok = result.is_ok();
                checked = Some(result);
                ok
            })
        })?;
        match (found, checked) {
            (Some(true), _) => Ok((key.len() + value_bytes) as u64),
            (Some(false), Some(Err(error))) => Err(error.into()),
            (None, _) => Err(format!("record {} ({}) is missing", keynum, show(key)).into()),
            _ => Err(format!("engine misreported the check of {}", show(key)).into()),
        }
    }

    /// Writes a new generation of record `keynum`; returns the user bytes written.
    fn update(
        &self,
        keynum: u64,
        key: &mut Vec<u8>,
        value: &mut Vec<u8>,
        lat: &mut Latencies,
    ) -> Result<u64> {
        key_name(keynum, key);
        let generation = self.state.generation[keynum as usize].fetch_add(1, Ordering::Relaxed) + 1;
        self.data.value_into(keynum, key.len(), generation, value);
        lat.time(|| self.engine.put(key, value))?;
        Ok((key.len() + value.len()) as u64)
    }

    /// Reads `length` records from record `keynum` on; returns the user bytes read.
    fn scan(
        &self,
        keynum: u64,
        length: u64,
        key: &mut Vec<u8>,
        scanned: &mut Vec<(Vec<u8>, Vec<u8>)>,
        scratch: &mut (Vec<u8>, Vec<u8>),
        lat: &mut Latencies,
    ) -> Result<u64> {
        key_name(keynum, key);
        let mut count = 0usize;
        lat.time(|| {
            self.engine.scan_at_most(
                Bound::Included(key),
                Bound::Unbounded,
                Direction::Forward,
                length as usize,
                &mut |k, v| {
                    if scanned.len() <= count {
                        scanned.push((Vec::new(), Vec::new()));
                    }
                    let slot = &mut scanned[count];
                    slot.0.clear();
                    slot.0.extend_from_slice(k);
                    slot.1.clear();
                    slot.1.extend_from_slice(v);
                    count += 1;
                    if count as u64 >= length {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            )
        })?;
        let entries = &scanned[..count];
        if entries.first().map(|(k, _)| k.as_slice()) != Some(key.as_slice()) {
            return Err(format!("scan from {} did not start at it", show(key)).into());
        }
        let mut bytes = 0u64;
        for (i, (k, v)) in entries.iter().enumerate() {
            if i > 0 && entries[i - 1].0 >= *k {
                return Err(
                    format!("scan: {} came after {}", show(k), show(&entries[i - 1].0)).into(),
                );
            }
            self.data.check(k, v, scratch)?;
            bytes += (k.len() + v.len()) as u64;
        }
        Ok(bytes)
    }

    fn record(&self, phase: &str, m: &Measurement, tally: &Tally) -> Result<Record> {
        let mut record = Record::measured(self.engine_name, phase, m);
        record.set_io_amp(m, tally.user_read_bytes, tally.user_write_bytes);
        let space_used_bytes = sys::dir_space_used_bytes(self.dir)?;
        record.set_space_amp(
            space_used_bytes,
            self.state.live_user_bytes.load(Ordering::Relaxed),
        );
        record.set("dataset", self.config.dataset.clone());
        record.set("threads", self.config.threads as u64);
        record.set("records", self.config.records);
        record.set("operations", self.config.operations);
        record.set("value_layout", self.config.layout.describe());
        record.set("sync", self.config.engine.sync_writes);
        results::print_phase_row(&record);
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::Memory;
    use rand::SeedableRng;

    #[test]
    fn fnv_and_key_names_match_ycsb() {
        // Expected values from an independent transcription of YCSB's Utils.fnvhash64
        // (Java long arithmetic, Math.abs) in Python.
        assert_eq!(fnv_hash64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnv_hash64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnv_hash64(12345), 1_792_800_413_050_876_852);
        let mut key = Vec::new();
        key_name(0, &mut key);
        assert_eq!(key, b"user6284781860667377211");
    }

    #[test]
    fn zipfian_favours_small_items_and_stays_in_range() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut zipfian = Zipfian::new(1000, ZIPFIAN_CONSTANT);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[zipfian.next(&mut rng, 1000) as usize] += 1;
        }
        // Item 0 draws 1/zeta(1000) ≈ 13% of the requests; the tail item almost none.
        assert!(counts[0] > 10_000 && counts[0] < 16_000, "{}", counts[0]);
        assert!(counts[0] > counts[1] && counts[1] > counts[10]);
        assert!(counts[999] < 100);
        // Growing keeps working and covers the new items.
        assert!((0..1000).all(|_| zipfian.next(&mut rng, 2000) < 2000));
    }

    #[test]
    fn scrambled_zipfian_spreads_the_hot_keys() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut scrambled = ScrambledZipfian::new(10_000);
        let mut counts = vec![0u32; 10_000];
        for _ in 0..100_000 {
            counts[scrambled.next(&mut rng) as usize] += 1;
        }
        let hottest = (0..10_000).max_by_key(|&i| counts[i]).unwrap();
        // Skewed (the hottest item gets far more than the 10 of a uniform draw) but not
        // at record 0.
        assert!(counts[hottest] > 1000, "{}", counts[hottest]);
        assert_ne!(hottest, 0);
    }

    #[test]
    fn values_check_themselves() {
        let records = Records::new(ValueLayout::Mix(SizeMix::Sd), 3);
        let mut scratch = (Vec::new(), Vec::new());
        let (mut key, mut value) = (Vec::new(), Vec::new());
        let mut sizes = std::collections::BTreeSet::new();
        for keynum in 0..200 {
            key_name(keynum, &mut key);
            records.value_into(keynum, key.len(), 7, &mut value);
            sizes.insert(key.len() + value.len());
            assert_eq!(records.check(&key, &value, &mut scratch), Ok(keynum));
        }
        assert_eq!(sizes.into_iter().collect::<Vec<_>>(), [33, 123, 1023]);
        // Another record's value, or a flipped byte, is caught.
        let mut other = Vec::new();
        key_name(1, &mut other);
        assert!(records.check(&other, &value, &mut scratch).is_err());
        let last = value.len() - 1;
        value[last] ^= 1;
        assert!(records.check(&key, &value, &mut scratch).is_err());
    }

    #[test]
    fn the_whole_sequence_runs_and_verifies() {
        let dir = tempfile::tempdir().unwrap();
        for threads in [1, 2] {
            let config = YcsbConfig {
                records: 2000,
                operations: 3000,
                threads,
                layout: ValueLayout::Fields {
                    fields: 2,
                    field_bytes: 20,
                },
                load_batch: if threads == 1 { 1 } else { 64 },
                seed: 5,
                dataset: "test".into(),
                engine: EngineConfig::default(),
                dir: dir.path().to_path_buf(),
            };
            let mut records = Vec::new();
            run(&Memory, &config, &mut records, &mut |_| Ok(())).unwrap();
            let phases: Vec<&str> = records.iter().map(|r| r.workload.as_str()).collect();
            assert_eq!(phases, PHASES);
            for record in &records {
                assert!(record.ops_per_sec.unwrap() > 0.0);
                assert!(record.space_amp.is_some(), "{}", record.workload);
            }
            assert_eq!(records[0].get("ops").unwrap(), 2000);
            assert_eq!(records[1].get("ops").unwrap(), 3000);
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        }
    }

    /// An engine that returns another key's value for one key in 16.
    struct Confused(Box<dyn Engine>);

    impl Engine for Confused {
        fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
            self.0.put(key, value)
        }
        fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
            if key.last().is_some_and(|b| b % 16 == 0) {
                let mut other = Vec::new();
                key_name(0, &mut other);
                return self.0.get(&other, check);
            }
            self.0.get(key, check)
        }
        fn delete(&self, key: &[u8]) -> Result<bool> {
            self.0.delete(key)
        }
        fn scan(
            &self,
            lower: Bound<&[u8]>,
            upper: Bound<&[u8]>,
            direction: Direction,
            visit: &mut crate::engine::Visit<'_>,
        ) -> Result<()> {
            self.0.scan(lower, upper, direction, visit)
        }
        fn sync(&self) -> Result<()> {
            self.0.sync()
        }
        fn commit(&self) -> Result<()> {
            self.0.commit()
        }
        fn footprint(&self) -> crate::engine::Footprint {
            self.0.footprint()
        }
        fn close(self: Box<Self>) -> Result<()> {
            self.0.close()
        }
        fn abandon(self: Box<Self>) {
            self.0.abandon()
        }
    }

    struct ConfusedKind;

    impl EngineKind for ConfusedKind {
        fn name(&self) -> &'static str {
            "confused"
        }
        fn open(&self, dir: &Path, config: &EngineConfig) -> Result<Box<dyn Engine>> {
            Ok(Box::new(Confused(Memory.open(dir, config)?)))
        }
        fn configuration(&self, _config: &EngineConfig) -> serde_json::Value {
            serde_json::Value::Null
        }
    }

    #[test]
    fn wrong_answers_fail_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let config = YcsbConfig {
            records: 500,
            operations: 500,
            threads: 1,
            layout: ValueLayout::Mix(SizeMix::Small),
            load_batch: 1,
            seed: 1,
            dataset: "test".into(),
            engine: EngineConfig::default(),
            dir: dir.path().to_path_buf(),
        };
        let error = run(&ConfusedKind, &config, &mut Vec::new(), &mut |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("ycsb_a: value under user"), "{error}");
    }
}
