//! The recovery benchmark: how long an engine takes to open after a crash, as a function
//! of the committed data set and of the log written since the last commit (the tail).
//!
//! Tucana's claim is that open time follows the tail, not the data set, because a commit
//! persists the index and only the log after it is replayed. Each case loads `committed`
//! keys and commits, writes `tail` more keys (buffered, then one sync, so they are durable
//! but not committed), abandons the engine as a crash would, evicts its files from the
//! page cache, and times the reopen. The reopened engine must then hold every key, tail
//! included, with the right values.
//!
//! Owns the case list and the procedure; the engine, clocks and output are other modules'.
//! Single-threaded.

use std::path::PathBuf;
use std::time::Instant;

use rand::Rng;

use crate::engine::{EngineConfig, EngineKind};
use crate::results::{self, Record};
use crate::sys;
use crate::workload::{phase_seed, thread_rng, Generation, KeySet};
use crate::Result;

/// Random committed keys read back after each reopen, besides the boundary keys.
const SPOT_CHECK_COUNT: u64 = 1000;

#[derive(Clone, Debug)]
pub struct RecoveryConfig {
    /// Committed data set sizes, each reopened with the first tail.
    pub data_sets: Vec<u64>,
    /// Tail lengths, each on the first data set.
    pub tails: Vec<u64>,
    pub key_bytes: usize,
    pub value_bytes: usize,
    pub seed: u64,
    /// Parent of each case's fresh, temporary engine directory.
    pub dir: PathBuf,
}

/// One reopen: a committed data set and a tail of records after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub committed_keys: u64,
    pub tail_records: u64,
}

/// Two series sharing their first case: growing data set at a fixed tail (open time
/// should stay flat), growing tail at a fixed data set (open time should grow).
pub fn cases(data_sets: &[u64], tails: &[u64]) -> Vec<Case> {
    assert!(!data_sets.is_empty() && !tails.is_empty());
    let by_data_set = data_sets.iter().map(|&committed_keys| Case {
        committed_keys,
        tail_records: tails[0],
    });
    let by_tail = tails.iter().map(|&tail_records| Case {
        committed_keys: data_sets[0],
        tail_records,
    });
    let mut cases: Vec<Case> = Vec::new();
    for case in by_data_set.chain(by_tail) {
        if !cases.contains(&case) {
            cases.push(case);
        }
    }
    cases
}

pub fn run(
    kind: &dyn EngineKind,
    config: &RecoveryConfig,
    records: &mut Vec<Record>,
) -> Result<()> {
    println!();
    println!(
        "{:<8} {:>14} {:>13} {:>10} {:>10} {:>10}",
        "engine", "committed keys", "tail records", "open ms", "cpu ms", "load s"
    );
    for case in cases(&config.data_sets, &config.tails) {
        let record = run_case(kind, config, case)?;
        println!(
            "{:<8} {:>14} {:>13} {:>10.1} {:>10.1} {:>10.1}",
            record.engine,
            case.committed_keys,
            case.tail_records,
            record
                .get("open_ms")
                .and_then(|v| v.as_f64())
                .unwrap_or(f64::NAN),
            record
                .get("open_cpu_ms")
                .and_then(|v| v.as_f64())
                .unwrap_or(f64::NAN),
            record
                .get("load_s")
                .and_then(|v| v.as_f64())
                .unwrap_or(f64::NAN),
        );
        if record.get("page_cache_dropped") == Some(&false.into()) {
            results::print_note("(the page cache could not be dropped: a warm open)");
        }
        records.push(record);
    }
    Ok(())
}

fn run_case(kind: &dyn EngineKind, config: &RecoveryConfig, case: Case) -> Result<Record> {
    let total_keys = case.committed_keys + case.tail_records;
    let set = KeySet::new(
        config.seed,
        total_keys,
        config.key_bytes,
        config.value_bytes,
    )?;
    let engine_dir = tempfile::Builder::new()
        .prefix(&format!("tucana-bench-{}-recovery-", kind.name()))
        .tempdir_in(&config.dir)
        .map_err(|e| format!("cannot create a directory in {}: {e}", config.dir.display()))?;
    let engine_config = EngineConfig {
        sync_writes: false,
        background_commit: false,
        ..EngineConfig::default()
    };

    let load_start = Instant::now();
    let engine = kind.open(engine_dir.path(), &engine_config)?;
    let (mut key, mut value) = (set.key_buf(), set.value_buf());
    for index in 0..total_keys {
        if index == case.committed_keys {
            engine.commit()?;
        }
        set.key_into(index, &mut key);
        set.value_into(&key, Generation(0), &mut value);
        engine.put(&key, &value)?;
    }
    if case.tail_records == 0 {
        engine.commit()?;
    }
    // The tail is durable in the log but not in any commit: exactly what recovery replays.
    engine.sync()?;
    let load_s = load_start.elapsed().as_secs_f64();
    engine.abandon();

    let mut page_cache_dropped = true;
    for file in sys::files_under(engine_dir.path())? {
        if sys::drop_from_page_cache(&file).is_err() {
            page_cache_dropped = false;
        }
    }

    let cpu_start = sys::process_cpu_time();
    let open_start = Instant::now();
    let engine = kind.open(engine_dir.path(), &engine_config)?;
    let open_ms = open_start.elapsed().as_secs_f64() * 1e3;
    let open_cpu_ms = sys::process_cpu_time()
        .saturating_sub(cpu_start)
        .as_secs_f64()
        * 1e3;

    // Everything written must be back: the boundaries of both parts and a random sample.
    if let Some(keys) = engine.footprint().keys {
        if keys != total_keys {
            return Err(format!(
                "recovery of {case:?}: engine counts {keys} keys, not {total_keys}"
            )
            .into());
        }
    }
    let mut rng = thread_rng(phase_seed(config.seed, "recovery"), "spot-check", 0);
    let boundaries = [
        0,
        case.committed_keys.saturating_sub(1),
        case.committed_keys,
        total_keys - 1,
    ];
    let sample = (0..SPOT_CHECK_COUNT).map(|_| rng.random_range(0..total_keys));
    for index in boundaries
        .into_iter()
        .filter(|&i| i < total_keys)
        .chain(sample)
    {
        set.key_into(index, &mut key);
        set.value_into(&key, Generation(0), &mut value);
        match engine.get(&key, &mut |v| v == value.as_slice())? {
            Some(true) => {}
            Some(false) => {
                return Err(format!("recovery of {case:?}: wrong value for key #{index}").into())
            }
            None => return Err(format!("recovery of {case:?}: key #{index} was lost").into()),
        }
    }
    engine.close()?;
    drop(engine_dir);

    let mut record = Record::unmeasured(kind.name(), "recovery");
    record.set("committed_keys", case.committed_keys);
    record.set("tail_records", case.tail_records);
    record.set("open_ms", open_ms);
    record.set("open_cpu_ms", open_cpu_ms);
    record.set("load_s", load_s);
    record.set("page_cache_dropped", page_cache_dropped);
    record.set("key_bytes", config.key_bytes as u64);
    record.set("value_bytes", config.value_bytes as u64);
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::Memory;

    #[test]
    fn every_case_reopens_with_all_keys() {
        let dir = tempfile::tempdir().unwrap();
        let config = RecoveryConfig {
            data_sets: vec![50, 200],
            tails: vec![10, 0, 30],
            key_bytes: 8,
            value_bytes: 16,
            seed: 3,
            dir: dir.path().to_path_buf(),
        };
        let mut records = Vec::new();
        run(&Memory, &config, &mut records).unwrap();
        let shape: Vec<(u64, u64)> = records
            .iter()
            .map(|r| {
                (
                    r.get("committed_keys").unwrap().as_u64().unwrap(),
                    r.get("tail_records").unwrap().as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(shape, [(50, 10), (200, 10), (50, 0), (50, 30)]);
        assert!(records.iter().all(|r| r.get("open_ms").is_some()));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    fn case(committed_keys: u64, tail_records: u64) -> Case {
        Case {
            committed_keys,
            tail_records,
        }
    }

    #[test]
    fn default_cases_are_the_two_series_without_repeats() {
        let cases = cases(&[100_000, 1_000_000], &[10_000, 100_000, 300_000]);
        assert_eq!(
            cases,
            vec![
                case(100_000, 10_000),
                case(1_000_000, 10_000),
                case(100_000, 100_000),
                case(100_000, 300_000),
            ]
        );
    }
}
