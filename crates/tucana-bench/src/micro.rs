//! The db_bench-style micro-benchmark: one data set, a fixed sequence of phases, each
//! timed and verified.
//!
//! Phases, in order: `fillseq` (every key once, in ascending key order, into a store of
//! its own that is then closed and removed), `fillrandom` (every key once, in random
//! order), commit, `readrandom`
//! (random keys with replacement), `readseq` (full forward range), `readreverse`,
//! `overwrite` (every key once more, new value generation, another random order), commit,
//! `seekrandom` (seek to a random key and read it plus the next 10), `deleterandom`
//! (every key once, random order). The commits put the read phases on committed data;
//! their duration is reported but not part of any phase.
//!
//! Every read is checked against the value the workload says the key must hold; a wrong
//! or missing value ends the run with an error. Checks are outside the latency samples
//! but inside throughput and CPU time, the same for every engine.
//!
//! Owns the phase logic; the engine, clocks and output format are other modules'. Runs
//! phases on `threads` scoped threads sharing one `&dyn Engine`.

use std::ops::{Bound, ControlFlow};
use std::path::PathBuf;
use std::time::Instant;

use rand::Rng;

use crate::engine::{Direction, Engine, EngineConfig, EngineKind};
use crate::format::fmt_bytes;
use crate::measure::{Latencies, Measurement, PhaseTimer};
use crate::results::{self, Record};
use crate::sys;
use crate::workload::{
    phase_seed, scan_bounds, thread_rng, thread_share, Generation, KeySet, Permutation,
};
use crate::Result;

/// How many entries `seekrandom` reads after the one it seeks to.
const SEEK_NEXT_COUNT: usize = 10;

#[derive(Clone, Debug)]
pub struct MicroConfig {
    pub keys: u64,
    pub key_bytes: usize,
    /// Decimal keys after this prefix (see `KeySet::decimal`); `None`: random bytes.
    pub key_prefix: Option<Vec<u8>>,
    pub value_bytes: usize,
    pub threads: usize,
    pub seed: u64,
    pub sync_writes: bool,
    /// Parent of the run's fresh, temporary engine directory.
    pub dir: PathBuf,
    /// Skip the phases after this one.
    pub stop_after: Option<String>,
    /// Cache budget and flush interval (`sync_writes` above wins over the one in here).
    pub engine: EngineConfig,
}

/// Runs every phase on an engine of `kind`, printing a row per phase as it completes and
/// appending the records to `records`.
pub fn run(kind: &dyn EngineKind, config: &MicroConfig, records: &mut Vec<Record>) -> Result<()> {
    assert!(config.keys > 0 && config.threads > 0);
    let set = match &config.key_prefix {
        None => KeySet::new(
            config.seed,
            config.keys,
            config.key_bytes,
            config.value_bytes,
        )?,
        Some(prefix) => KeySet::decimal(
            config.seed,
            config.keys,
            config.key_bytes,
            config.value_bytes,
            prefix,
        )?,
    };
    let (engine, engine_dir) = open_fresh(kind, config, "")?;
    let run = Run {
        engine: engine.as_ref(),
        engine_name: kind.name(),
        set: &set,
        config,
    };
    results::print_phase_table_header();

    records.push(fill_sequential(kind, config, &set)?);
    if config.stop_after.as_deref() == Some("fillseq") {
        return finish(engine, engine_dir);
    }

    let fill = run.write_each_once("fillrandom", Generation(0), None)?;
    let mut fill = run.record("fillrandom", &fill);
    run.commit_and_describe(&mut fill, "after fill", engine_dir.path())?;
    records.push(fill);
    if config.stop_after.as_deref() == Some("fillrandom") {
        return finish(engine, engine_dir);
    }

    let m = run.read_random("readrandom", Generation(0))?;
    records.push(run.record("readrandom", &m));
    if config.stop_after.as_deref() == Some("readrandom") {
        return finish(engine, engine_dir);
    }
    let m = run.scan_all("readseq", Direction::Forward, Generation(0))?;
    records.push(run.record("readseq", &m));
    if config.stop_after.as_deref() == Some("readseq") {
        return finish(engine, engine_dir);
    }
    let m = run.scan_all("readreverse", Direction::Reverse, Generation(0))?;
    records.push(run.record("readreverse", &m));
    if config.stop_after.as_deref() == Some("readreverse") {
        return finish(engine, engine_dir);
    }

    let order = Permutation::new(config.keys, phase_seed(config.seed, "overwrite"));
    let m = run.write_each_once("overwrite", Generation(1), Some(&order))?;
    let mut overwrite = run.record("overwrite", &m);
    run.commit_and_describe(&mut overwrite, "after overwrite", engine_dir.path())?;
    records.push(overwrite);
    if config.stop_after.as_deref() == Some("overwrite") {
        return finish(engine, engine_dir);
    }

    let m = run.seek_random("seekrandom", Generation(1))?;
    records.push(run.record("seekrandom", &m));
    if config.stop_after.as_deref() == Some("seekrandom") {
        return finish(engine, engine_dir);
    }
    let m = run.delete_each_once("deleterandom")?;
    records.push(run.record("deleterandom", &m));
    if config.stop_after.as_deref() == Some("deleterandom") {
        return finish(engine, engine_dir);
    }
    run.expect_empty()?;
    finish(engine, engine_dir)
}

/// An engine of `kind` on a fresh temporary directory under `config.dir` (named with
/// `tag`), removed when the returned handle is dropped after the engine closed.
fn open_fresh(
    kind: &dyn EngineKind,
    config: &MicroConfig,
    tag: &str,
) -> Result<(Box<dyn Engine>, tempfile::TempDir)> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("tucana-bench-{}-{tag}", kind.name()))
        .tempdir_in(&config.dir)
        .map_err(|e| format!("cannot create a directory in {}: {e}", config.dir.display()))?;
    let engine = kind.open(
        dir.path(),
        &EngineConfig {
            sync_writes: config.sync_writes,
            ..config.engine
        },
    )?;
    Ok((engine, dir))
}

/// `fillseq`: every key of `set` once, in ascending key order (each thread a contiguous
/// run of the sorted keys), into a fresh store that is closed and removed afterwards, so
/// the phases after it run on the random-order data set as before. Sorting the keys
/// happens before the clock starts.
fn fill_sequential(kind: &dyn EngineKind, config: &MicroConfig, set: &KeySet) -> Result<Record> {
    let mut sorted: Vec<Vec<u8>> = (0..config.keys)
        .map(|index| {
            let mut key = set.key_buf();
            set.key_into(index, &mut key);
            key
        })
        .collect();
    sorted.sort_unstable();
    let (engine, dir) = open_fresh(kind, config, "fillseq-")?;
    let run = Run {
        engine: engine.as_ref(),
        engine_name: kind.name(),
        set,
        config,
    };
    let m = run.parallel(|thread, lat| {
        let mut value = set.value_buf();
        let share = run.share(thread);
        for position in share.clone() {
            let key = &sorted[position as usize];
            set.value_into(key, Generation(0), &mut value);
            lat.time(|| run.engine.put(key, &value))?;
        }
        Ok(share.end - share.start)
    })?;
    assert_eq!(m.ops, config.keys, "fillseq: every key written once");
    let mut record = run.record("fillseq", &m);
    run.commit_and_describe(&mut record, "after fillseq", dir.path())?;
    finish(engine, dir)?;
    Ok(record)
}

fn finish(engine: Box<dyn Engine>, engine_dir: tempfile::TempDir) -> Result<()> {
    engine.close()?;
    // `engine_dir` is removed here, after the engine let go of its files.
    drop(engine_dir);
    Ok(())
}

struct Run<'a> {
    engine: &'a dyn Engine,
    engine_name: &'static str,
    set: &'a KeySet,
    config: &'a MicroConfig,
}

impl Run<'_> {
    /// Runs `body(thread, latencies)` on every thread; `body` returns its op count.
    fn parallel<F>(&self, body: F) -> Result<Measurement>
    where
        F: Fn(usize, &mut Latencies) -> Result<u64> + Sync,
    {
        // Histograms are allocated before the clocks start.
        let mut latencies: Vec<Latencies> =
            (0..self.config.threads).map(|_| Latencies::new()).collect();
        let timer = PhaseTimer::start();
        let results: Vec<Result<u64>> = std::thread::scope(|scope| {
            let handles: Vec<_> = latencies
                .iter_mut()
                .enumerate()
                .map(|(thread, lat)| {
                    let body = &body;
                    crate::measure::spawn_client(scope, thread, move || body(thread, lat))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut ops = 0;
        for result in results {
            ops += result?;
        }
        Ok(timer.finish(ops, &latencies))
    }

    fn share(&self, thread: usize) -> std::ops::Range<u64> {
        thread_share(self.config.keys, self.config.threads, thread)
    }

    /// Writes every key once at `generation`: in index order (the keys themselves are in
    /// random order) or in the order of `order`.
    fn write_each_once(
        &self,
        phase: &str,
        generation: Generation,
        order: Option<&Permutation>,
    ) -> Result<Measurement> {
        let m = self.parallel(|thread, lat| {
            let (mut key, mut value) = (self.set.key_buf(), self.set.value_buf());
            let share = self.share(thread);
            for position in share.clone() {
                let index = order.map_or(position, |o| o.at(position));
                self.set.key_into(index, &mut key);
                self.set.value_into(&key, generation, &mut value);
                lat.time(|| self.engine.put(&key, &value))?;
            }
            Ok(share.end - share.start)
        })?;
        assert_eq!(m.ops, self.config.keys, "{phase}: every key written once");
        Ok(m)
    }

    fn read_random(&self, phase: &str, generation: Generation) -> Result<Measurement> {
        self.parallel(|thread, lat| {
            let mut rng = thread_rng(self.config.seed, phase, thread);
            let (mut key, mut expected) = (self.set.key_buf(), self.set.value_buf());
            let share = self.share(thread);
            for _ in share.clone() {
                let index = rng.random_range(0..self.config.keys);
                self.set.key_into(index, &mut key);
                self.set.value_into(&key, generation, &mut expected);
                let found = lat.time(|| {
                    self.engine
                        .get(&key, &mut |value| value == expected.as_slice())
                })?;
                match found {
                    Some(true) => {}
                    Some(false) => {
                        return Err(format!("{phase}: wrong value for key {}", hex(&key)).into())
                    }
                    None => return Err(format!("{phase}: key {} is missing", hex(&key)).into()),
                }
            }
            Ok(share.end - share.start)
        })
    }

    /// Scans the whole key space, one contiguous piece per thread; one op per entry.
    fn scan_all(
        &self,
        phase: &str,
        direction: Direction,
        generation: Generation,
    ) -> Result<Measurement> {
        let bounds = scan_bounds(self.config.threads);
        let m = self.parallel(|thread, lat| {
            let lower = bounds[thread]
                .as_deref()
                .map_or(Bound::Unbounded, Bound::Included);
            let upper = bounds[thread + 1]
                .as_deref()
                .map_or(Bound::Unbounded, Bound::Excluded);
            let mut check = OrderedCheck::new(self.set, generation, direction);
            let mut last = Instant::now();
            self.engine
                .scan(lower, upper, direction, &mut |key, value| {
                    lat.record(last.elapsed());
                    let flow = check.visit(key, value);
                    // The check's own time is not the engine's latency.
                    last = Instant::now();
                    flow
                })?;
            check.finish(phase)
        })?;
        if m.ops != self.config.keys {
            return Err(format!("{phase}: saw {} entries of {}", m.ops, self.config.keys).into());
        }
        Ok(m)
    }

    /// Seeks to a random existing key and reads it and the next `SEEK_NEXT_COUNT` entries;
    /// one op per seek.
    fn seek_random(&self, phase: &str, generation: Generation) -> Result<Measurement> {
        self.parallel(|thread, lat| {
            let mut rng = thread_rng(self.config.seed, phase, thread);
            let mut key = self.set.key_buf();
            // Entries are copied out during the timed seek and checked after it.
            let mut seen: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(SEEK_NEXT_COUNT + 1);
            let share = self.share(thread);
            for _ in share.clone() {
                let index = rng.random_range(0..self.config.keys);
                self.set.key_into(index, &mut key);
                let mut seen_count = 0;
                lat.time(|| {
                    self.engine.scan(
                        Bound::Included(&key),
                        Bound::Unbounded,
                        Direction::Forward,
                        &mut |k, v| {
                            if seen.len() <= seen_count {
                                seen.push((Vec::new(), Vec::new()));
                            }
                            let slot = &mut seen[seen_count];
                            slot.0.clear();
                            slot.0.extend_from_slice(k);
                            slot.1.clear();
                            slot.1.extend_from_slice(v);
                            seen_count += 1;
                            if seen_count > SEEK_NEXT_COUNT {
                                ControlFlow::Break(())
                            } else {
                                ControlFlow::Continue(())
                            }
                        },
                    )
                })?;
                let entries = &seen[..seen_count];
                if entries.first().map(|(k, _)| k.as_slice()) != Some(key.as_slice()) {
                    return Err(format!("{phase}: seek to {} did not find it", hex(&key)).into());
                }
                let mut check = OrderedCheck::new(self.set, generation, Direction::Forward);
                for (k, v) in entries {
                    if check.visit(k, v).is_break() {
                        break;
                    }
                }
                check.finish(phase)?;
            }
            Ok(share.end - share.start)
        })
    }

    fn delete_each_once(&self, phase: &str) -> Result<Measurement> {
        let order = Permutation::new(self.config.keys, phase_seed(self.config.seed, phase));
        self.parallel(|thread, lat| {
            let mut key = self.set.key_buf();
            let share = self.share(thread);
            for position in share.clone() {
                self.set.key_into(order.at(position), &mut key);
                if !lat.time(|| self.engine.delete(&key))? {
                    return Err(format!("{phase}: key {} was not present", hex(&key)).into());
                }
            }
            Ok(share.end - share.start)
        })
    }

    /// After `deleterandom` nothing may be left.
    fn expect_empty(&self) -> Result<()> {
        let mut left = 0u64;
        self.engine.scan(
            Bound::Unbounded,
            Bound::Unbounded,
            Direction::Forward,
            &mut |_, _| {
                left += 1;
                ControlFlow::Continue(())
            },
        )?;
        if left != 0 {
            return Err(format!("{left} entries left after deleting every key").into());
        }
        Ok(())
    }

    /// Commits (timed), then adds what the engine holds to `record` and prints it.
    fn commit_and_describe(
        &self,
        record: &mut Record,
        when: &str,
        engine_dir: &std::path::Path,
    ) -> Result<()> {
        let start = Instant::now();
        self.engine.commit()?;
        let commit_ms = start.elapsed().as_secs_f64() * 1e3;
        record.set("commit_ms", commit_ms);

        let keys = self.config.keys;
        let footprint = self.engine.footprint();
        if let Some(engine_keys) = footprint.keys {
            if engine_keys != keys {
                return Err(format!("{when}: engine counts {engine_keys} keys, not {keys}").into());
            }
        }
        let space_used_bytes = sys::dir_space_used_bytes(engine_dir)?;
        let user_bytes = keys * (self.config.key_bytes + self.config.value_bytes) as u64;
        record.set_space_amp(space_used_bytes, user_bytes);
        let mut note = format!("{when}: commit {commit_ms:.1} ms");
        if let Some(index_bytes) = footprint.index_bytes {
            let per_key = index_bytes as f64 / keys as f64;
            record.set("index_bytes", index_bytes);
            record.set("index_bytes_per_key", per_key);
            note += &format!(", index {per_key:.2} B/key ({})", fmt_bytes(index_bytes));
        }
        if let (Some(live), Some(dead)) = (footprint.live_log_bytes, footprint.dead_log_bytes) {
            record.set("live_log_bytes", live);
            record.set("dead_log_bytes", dead);
            record.set("log_bytes", live + dead);
            note += &format!(", log {} live + {} dead", fmt_bytes(live), fmt_bytes(dead));
        }
        note += &format!(
            ", space used {} ({:.2}x user data)",
            fmt_bytes(space_used_bytes),
            space_used_bytes as f64 / user_bytes as f64
        );
        results::print_note(&note);
        Ok(())
    }

    /// A phase's record with the run's parameters, printed as a table row.
    fn record(&self, phase: &str, m: &Measurement) -> Record {
        let mut record = Record::measured(self.engine_name, phase, m);
        // Every phase moves whole pairs per op, but deletes write keys only.
        let pair_bytes = (self.config.key_bytes + self.config.value_bytes) as u64;
        let (read_bytes, write_bytes) = match phase {
            "fillseq" | "fillrandom" | "overwrite" => (0, m.ops * pair_bytes),
            "deleterandom" => (0, m.ops * self.config.key_bytes as u64),
            "seekrandom" => (m.ops * (SEEK_NEXT_COUNT as u64 + 1) * pair_bytes, 0),
            _ => (m.ops * pair_bytes, 0),
        };
        record.set_io_amp(m, read_bytes, write_bytes);
        record.set("keys", self.config.keys);
        record.set("key_bytes", self.config.key_bytes as u64);
        record.set("value_bytes", self.config.value_bytes as u64);
        record.set("threads", self.config.threads as u64);
        record.set("sync", self.config.sync_writes);
        results::print_phase_row(&record);
        record
    }
}

/// Checks a run of scanned entries: strictly ordered in the scan's direction, keys of the
/// right length, each holding its expected value. Counts them.
struct OrderedCheck<'a> {
    set: &'a KeySet,
    generation: Generation,
    direction: Direction,
    previous: Vec<u8>,
    expected: Vec<u8>,
    count: u64,
    error: Option<String>,
}

impl<'a> OrderedCheck<'a> {
    fn new(set: &'a KeySet, generation: Generation, direction: Direction) -> OrderedCheck<'a> {
        OrderedCheck {
            set,
            generation,
            direction,
            previous: Vec::new(),
            expected: set.value_buf(),
            count: 0,
            error: None,
        }
    }

    fn visit(&mut self, key: &[u8], value: &[u8]) -> ControlFlow<()> {
        let in_order = match self.direction {
            Direction::Forward => self.previous.as_slice() < key,
            Direction::Reverse => key < self.previous.as_slice(),
        };
        if self.count > 0 && !in_order {
            self.error = Some(format!(
                "key {} came after {} in a {:?} scan",
                hex(key),
                hex(&self.previous),
                self.direction
            ));
            return ControlFlow::Break(());
        }
        if key.len() != self.set.key_bytes() {
            self.error = Some(format!("unknown key {} of {} bytes", hex(key), key.len()));
            return ControlFlow::Break(());
        }
        self.set
            .value_into(key, self.generation, &mut self.expected);
        if value != self.expected.as_slice() {
            self.error = Some(format!("wrong value for key {}", hex(key)));
            return ControlFlow::Break(());
        }
        self.previous.clear();
        self.previous.extend_from_slice(key);
        self.count += 1;
        ControlFlow::Continue(())
    }

    /// The number of entries checked, or the first problem.
    fn finish(self, phase: &str) -> Result<u64> {
        match self.error {
            Some(error) => Err(format!("{phase}: {error}").into()),
            None => Ok(self.count),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::Memory;
    use crate::engine::Footprint;

    fn config(keys: u64, threads: usize) -> (tempfile::TempDir, MicroConfig) {
        let dir = tempfile::tempdir().unwrap();
        let config = MicroConfig {
            keys,
            key_bytes: 16,
            key_prefix: None,
            value_bytes: 24,
            threads,
            seed: 9,
            sync_writes: false,
            dir: dir.path().to_path_buf(),
            stop_after: None,
            engine: EngineConfig::default(),
        };
        (dir, config)
    }

    #[test]
    fn every_phase_runs_and_verifies_on_a_correct_engine() {
        for threads in [1, 3] {
            let (dir, config) = config(2000, threads);
            let mut records = Vec::new();
            run(&Memory, &config, &mut records).unwrap();
            let phases: Vec<&str> = records.iter().map(|r| r.workload.as_str()).collect();
            assert_eq!(
                phases,
                [
                    "fillseq",
                    "fillrandom",
                    "readrandom",
                    "readseq",
                    "readreverse",
                    "overwrite",
                    "seekrandom",
                    "deleterandom"
                ]
            );
            for record in &records {
                assert_eq!(record.get("ops").unwrap(), 2000, "{}", record.workload);
                assert!(record.ops_per_sec.unwrap() > 0.0);
            }
            assert_eq!(records[0].get("index_bytes_per_key").unwrap(), 48.0);
            assert!(records[0].get("space_used_bytes").is_some());
            // The engine's directory is gone after the run.
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        }
    }

    /// Decimal keys share their first bytes, so the scan pieces of several threads are
    /// unbalanced; every phase must still see every key once.
    #[test]
    fn every_phase_runs_on_decimal_keys() {
        for threads in [1, 3] {
            let (_dir, mut config) = config(2000, threads);
            config.key_prefix = Some(b"key:".to_vec());
            let mut records = Vec::new();
            run(&Memory, &config, &mut records).unwrap();
            assert_eq!(records.len(), 8);
            for record in &records {
                assert_eq!(record.get("ops").unwrap(), 2000, "{}", record.workload);
            }
        }
    }

    /// An engine that silently drops one write in 64: the run must notice.
    struct Forgetful(Box<dyn Engine>);

    impl Engine for Forgetful {
        fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
            if key[0].is_multiple_of(64) {
                return Ok(());
            }
            self.0.put(key, value)
        }
        fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
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
        fn footprint(&self) -> Footprint {
            // Hide the count so that the reads, not the footprint check, find the loss.
            Footprint::default()
        }
        fn close(self: Box<Self>) -> Result<()> {
            self.0.close()
        }
        fn abandon(self: Box<Self>) {
            self.0.abandon()
        }
    }

    struct ForgetfulKind;

    impl EngineKind for ForgetfulKind {
        fn name(&self) -> &'static str {
            "forgetful"
        }
        fn open(&self, dir: &std::path::Path, config: &EngineConfig) -> Result<Box<dyn Engine>> {
            Ok(Box::new(Forgetful(Memory.open(dir, config)?)))
        }
        fn configuration(&self, _config: &EngineConfig) -> serde_json::Value {
            serde_json::Value::Null
        }
    }

    #[test]
    fn lost_writes_fail_the_run() {
        let (_dir, config) = config(2000, 2);
        let error = run(&ForgetfulKind, &config, &mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("readrandom: key"), "{error}");
        assert!(error.ends_with("is missing"), "{error}");
    }

    fn keys(set: &KeySet, indexes: &[u64]) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = indexes
            .iter()
            .map(|&i| {
                let mut k = set.key_buf();
                set.key_into(i, &mut k);
                k
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn ordered_check_accepts_a_correct_scan_and_counts_it() {
        let set = KeySet::new(1, 100, 16, 20).unwrap();
        let mut check = OrderedCheck::new(&set, Generation(0), Direction::Reverse);
        for key in keys(&set, &[1, 2, 3, 4]).iter().rev() {
            let mut value = set.value_buf();
            set.value_into(key, Generation(0), &mut value);
            assert!(check.visit(key, &value).is_continue());
        }
        assert_eq!(check.finish("t").unwrap(), 4);
    }

    #[test]
    fn ordered_check_rejects_disorder_and_stale_values() {
        let set = KeySet::new(1, 100, 16, 20).unwrap();
        let sorted = keys(&set, &[1, 2]);
        let mut value = set.value_buf();

        let mut check = OrderedCheck::new(&set, Generation(0), Direction::Forward);
        set.value_into(&sorted[1], Generation(0), &mut value);
        assert!(check.visit(&sorted[1], &value).is_continue());
        set.value_into(&sorted[0], Generation(0), &mut value);
        assert!(check.visit(&sorted[0], &value).is_break());
        assert!(check.finish("t").is_err());

        let mut check = OrderedCheck::new(&set, Generation(1), Direction::Forward);
        set.value_into(&sorted[0], Generation(0), &mut value);
        assert!(check.visit(&sorted[0], &value).is_break());
        let error = check.finish("seekrandom").unwrap_err().to_string();
        assert!(error.contains("seekrandom: wrong value"), "{error}");
    }
}
