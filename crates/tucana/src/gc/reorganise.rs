//! The reorganiser: rewrites a region's live records in key order, so that a scan of data
//! that is not in memory reads the device sequentially instead of one random page per
//! record (issue 22, item 3; DESIGN.md "Reorganising the log in key order").
//!
//! Owns: which leaves are worth rewriting (`scattered`) and the walk over the live index,
//! leaf by leaf in key order, that hands their records to relocation in that order.
//! Does not own: the copies and pointer swaps (`Region::relocate`, the same primitive
//! garbage collection uses, with its crash analysis), nor reclaiming the segments the
//! originals leave mostly dead (the collector's full pass that follows).
//!
//! Thread-safety: runs under the collector's mutex (the relocation tail has one appender);
//! readers are never blocked, writers only for the pointer swaps of a chunk, as in a
//! garbage collection pass. A key written while its record is being copied keeps the new
//! write (the swap finds the pointer changed and leaves the copy dead).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::index::{LeafCopy, Seek};
use crate::log::record::HEADER_BYTES;
use crate::region::Region;
use crate::types::RegionId;

/// Records handed to one `Region::relocate` call, so that the writer lock is taken once
/// per chunk, not per leaf; a chunk also ends at `CHUNK_MAX_BYTES` of records, which
/// bounds the memory of a walk over large values.
const CHUNK_RECORDS: usize = 512;
const CHUNK_MAX_BYTES: u64 = 4 << 20;

/// A leaf is rewritten when its records break into more runs (stretches that lie close
/// together in the log, in key order) than one per this many records: a scan of it would
/// read that many separate places.
const RECORDS_PER_RUN_IN_ORDER: usize = 8;

/// Leaves one background step looks at, at most: a step reads only the leaves (copies of
/// index nodes in memory) and the records of scattered ones, but a walk over a large
/// store in order must not hold the collector for long.
const IDLE_STEP_MAX_LEAVES: u64 = 256;

/// What a reorganisation did, summed over regions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReorganiseReport {
    /// Leaves of the live indexes looked at.
    pub leaves_seen: u64,
    /// Leaves whose records were scattered, and were rewritten.
    pub leaves_rewritten: u64,
    /// Records copied in key order (including copies a concurrent write made dead).
    pub records_copied: u64,
    /// Bytes of those copies the index took.
    pub bytes_taken: u64,
}

/// One record of a leaf, read for its copy: `(offset, key, value)`.
type Record = (u64, Vec<u8>, Vec<u8>);

/// Whether records at `offsets` (in key order) are scattered: they form more runs than
/// one per `RECORDS_PER_RUN_IN_ORDER`, a run going on while each record starts after the
/// one before and less than `gap_bytes` past its start. Offsets alone, so that a walk
/// reads no record of a leaf in order.
fn scattered(offsets: &[u64], gap_bytes: u64) -> bool {
    let breaks = offsets
        .windows(2)
        .filter(|pair| pair[1] <= pair[0] || pair[1] - pair[0] >= gap_bytes)
        .count();
    let runs = breaks + 1;
    runs > offsets.len().div_ceil(RECORDS_PER_RUN_IN_ORDER)
}

/// The `gap_bytes` of `scattered` for `region`: a page, or two average records if
/// that is more (so records longer than a page, back to back, count as in order).
fn run_gap_bytes(region: &Region) -> u64 {
    let average = region.live_bytes() / region.keys().max(1);
    (2 * average).max(crate::types::BLOCK_BYTES)
}

/// Rewrites the scattered leaves of `region`'s live index in key order, from the leaf
/// holding `from` (the first leaf for `None`) until the walk has copied `max_bytes` or
/// reached the last leaf; adds what it did to `report`. Returns where the next walk of
/// this region resumes, `None` once the last leaf was done. Records still in a tail buffer
/// (written since the tail was opened) are left where they are: their segment is not
/// closed yet.
pub(super) fn reorganise_leaves(
    region: &Region,
    from: Option<Vec<u8>>,
    (max_bytes, max_leaves): (u64, u64),
    report: &mut ReorganiseReport,
) -> Result<Option<Vec<u8>>> {
    let gap_bytes = run_gap_bytes(region);
    let mut leaves = 0u64;
    let mut leaf = LeafCopy::default();
    let mut seek_key = from;
    let mut chunk: Vec<Record> = Vec::with_capacity(CHUNK_RECORDS);
    let mut chunk_bytes = 0u64;
    let mut walked_bytes = 0u64;
    loop {
        let seek = match &seek_key {
            Some(k) => Seek::AtOrAfter(k),
            None => Seek::First,
        };
        region.copy_leaf(None, seek, &mut leaf)?;
        report.leaves_seen += 1;
        leaves += 1;
        let closed: Vec<u64> = leaf
            .ptrs
            .iter()
            .copied()
            .filter(|&ptr| !region.in_open_tail(ptr))
            .collect();
        if closed.len() > 1 && scattered(&closed, gap_bytes) {
            report.leaves_rewritten += 1;
            for ptr in closed {
                let record =
                    region.with_record(ptr, true, |r| (ptr, r.key.to_vec(), r.value.to_vec()))?;
                walked_bytes += record_len(&record);
                chunk_bytes += record_len(&record);
                chunk.push(record);
                if chunk.len() == CHUNK_RECORDS || chunk_bytes >= CHUNK_MAX_BYTES {
                    relocate_chunk(region, &mut chunk, report)?;
                    chunk_bytes = 0;
                }
            }
        }
        let next = match leaf.high.take() {
            // A leaf's upper fence lies above every key in it, so the walk moves on.
            Some(high) if seek_key.as_ref().is_none_or(|k| high > *k) => Some(high),
            Some(_) => {
                return Err(crate::error::Error::corruption(
                    "index",
                    crate::types::DiskOffset::NONE,
                    "leaf fences out of order (damaged pivots)",
                ))
            }
            None => None,
        };
        seek_key = next;
        if seek_key.is_none() || walked_bytes >= max_bytes || leaves >= max_leaves {
            break;
        }
    }
    relocate_chunk(region, &mut chunk, report)?;
    Ok(seek_key)
}

/// The background reorganiser's memory (`Options::reorganise_after_idle`), kept in the
/// collector's state: when foreground writes were last seen, where each region's walk
/// resumes, and the foreground byte count at which each region's last whole walk ended.
pub(super) struct IdleWalk {
    last_write: Instant,
    resume: HashMap<RegionId, Vec<u8>>,
    walked_at_foreground: HashMap<RegionId, u64>,
}

impl IdleWalk {
    pub fn new() -> IdleWalk {
        IdleWalk {
            last_write: Instant::now(),
            resume: HashMap::new(),
            walked_at_foreground: HashMap::new(),
        }
    }

    /// One background step: once no foreground bytes were appended for `idle_after`
    /// (`appended`: since the last step; `foreground`: the running total), walks regions
    /// on from where their walks stopped until `budget_bytes` of records were rewritten.
    /// A region whose whole walk ended at this same `foreground` total is skipped: nothing
    /// was written since, so nothing can have been scattered. Returns the bytes rewritten.
    pub fn step(
        &mut self,
        regions: &[Arc<Region>],
        foreground: u64,
        appended: u64,
        idle_after: Duration,
        budget_bytes: u64,
    ) -> Result<u64> {
        if appended > 0 {
            self.last_write = Instant::now();
            return Ok(0);
        }
        if self.last_write.elapsed() < idle_after {
            return Ok(0);
        }
        let mut report = ReorganiseReport::default();
        for region in regions {
            let id = region.id();
            let from = self.resume.remove(&id);
            if from.is_none() && self.walked_at_foreground.get(&id) == Some(&foreground) {
                continue;
            }
            let left = budget_bytes.saturating_sub(report.bytes_taken);
            if left == 0 || region.is_dropped() {
                break;
            }
            match reorganise_leaves(region, from, (left, IDLE_STEP_MAX_LEAVES), &mut report)? {
                Some(next) => {
                    self.resume.insert(id, next);
                }
                None => {
                    self.walked_at_foreground.insert(id, foreground);
                }
            }
        }
        Ok(report.bytes_taken)
    }
}

fn record_len(record: &Record) -> u64 {
    (HEADER_BYTES + record.1.len() + record.2.len()) as u64
}

/// Copies `chunk` (in key order) into the relocation log and empties it.
fn relocate_chunk(
    region: &Region,
    chunk: &mut Vec<Record>,
    report: &mut ReorganiseReport,
) -> Result<()> {
    if chunk.is_empty() {
        return Ok(());
    }
    let borrowed: Vec<(u64, &[u8], &[u8])> = chunk
        .iter()
        .map(|(at, key, value)| (*at, key.as_slice(), value.as_slice()))
        .collect();
    let taken = region.relocate(&borrowed)?;
    report.bytes_taken += taken;
    region
        .shared()
        .reorganised_bytes
        .fetch_add(taken, std::sync::atomic::Ordering::Relaxed);
    report.records_copied += chunk.len() as u64;
    chunk.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gc::tests::manual_small_segments as small_segments;

    fn key(i: u64) -> Vec<u8> {
        format!("key{i:08}").into_bytes()
    }

    fn value(i: u64, round: u64) -> Vec<u8> {
        let mut v = format!("value {i} round {round} ").into_bytes();
        v.resize(100, b'.');
        v
    }

    /// Loads `n` keys in a scrambled order (so the log is out of key order).
    fn load_scrambled(ks: &crate::Keyspace, n: u64) {
        for j in 0..n {
            let i = (j * 7919) % n;
            ks.put(&key(i), &value(i, 0)).unwrap();
        }
    }

    /// Walks the live index of `region` in key order: how many records lie in closed
    /// segments, and in how many runs (back to back in the log) they lie.
    fn runs(region: &Region) -> (usize, usize) {
        let mut leaf = LeafCopy::default();
        let mut seek_key: Option<Vec<u8>> = None;
        let (mut offsets, mut lens) = (Vec::new(), Vec::new());
        loop {
            let seek = match &seek_key {
                Some(k) => Seek::AtOrAfter(k),
                None => Seek::First,
            };
            region.copy_leaf(None, seek, &mut leaf).unwrap();
            for &ptr in &leaf.ptrs {
                if !region.in_open_tail(ptr) {
                    offsets.push(ptr);
                    lens.push(region.record_header(ptr).unwrap().total_bytes());
                }
            }
            match leaf.high.take() {
                Some(high) => seek_key = Some(high),
                None => break,
            }
        }
        let breaks = offsets
            .windows(2)
            .zip(&lens)
            .filter(|(pair, &len)| pair[1] != pair[0] + len)
            .count();
        (offsets.len(), breaks + 1)
    }

    #[test]
    fn a_reorganised_keyspace_lies_in_key_order_and_reads_back() {
        let db = small_segments();
        let ks = db.keyspace("t").unwrap();
        let n = 4000;
        load_scrambled(&ks, n);
        db.commit().unwrap();
        let region: Arc<Region> = db.engine.regions.get("t").unwrap();
        let (records, runs_before) = runs(&region);
        assert!(records > 3000, "{records} records outside the tail");
        assert!(runs_before > records / 2, "{runs_before} runs before");

        let report = db.reorganise().unwrap();
        assert!(report.leaves_rewritten > 0, "{report:?}");
        assert!(report.records_copied >= records as u64 / 2, "{report:?}");
        let (records_after, runs_after) = runs(&region);
        // Runs break only where a relocation segment ends (about 500 records each here)
        // and around the records left in the tails.
        assert!(
            runs_after * 50 < records_after,
            "{runs_after} runs of {records_after}"
        );
        for i in 0..n {
            assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i, 0)), "key {i}");
        }
        let scanned: Vec<Vec<u8>> = ks
            .range::<&[u8], _>(..)
            .map(|item| item.unwrap().0)
            .collect();
        assert_eq!(scanned, (0..n).map(key).collect::<Vec<_>>());
        db.check().unwrap();

        // In order now: a second walk finds nothing to rewrite.
        let again = db.reorganise().unwrap();
        assert_eq!(again.leaves_rewritten, 0, "{again:?}");
    }

    #[test]
    fn an_idle_store_is_reorganised_in_the_background() {
        let db = crate::Database::builder()
            .commit_interval(Some(Duration::from_millis(50)))
            .flush_interval(Some(Duration::from_millis(10)))
            .log_segment_bytes(64 << 10)
            .reorganise_after_idle(Some(Duration::from_millis(100)))
            .open_in_memory()
            .unwrap();
        let ks = db.keyspace("t").unwrap();
        let n = 4000;
        load_scrambled(&ks, n);
        let region: Arc<Region> = db.engine.regions.get("t").unwrap();
        // Waits for the condition, not for a time: the collector ticks every 100 ms and
        // a step rewrites at most 256 leaves, so a minute is far more than it needs.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (records, runs) = runs(&region);
            if records > 3000 && runs * 50 < records {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "still {runs} runs of {records} records; {:?}",
                db.stats().reorganised_bytes
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(db.stats().reorganised_bytes > 0);
        for i in 0..n {
            assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i, 0)), "key {i}");
        }
        db.commit().unwrap();
        db.check().unwrap();
    }

    #[test]
    fn writes_during_a_reorganisation_keep_their_new_values() {
        let db = small_segments();
        let ks = db.keyspace("t").unwrap();
        let n = 3000;
        load_scrambled(&ks, n);
        db.commit().unwrap();
        let writer = {
            let ks = ks.clone();
            std::thread::spawn(move || {
                for round in 1..=3 {
                    for i in (0..n).step_by(3) {
                        ks.put(&key(i), &value(i, round)).unwrap();
                    }
                }
            })
        };
        let report = db.reorganise().unwrap();
        writer.join().unwrap();
        assert!(report.records_copied > 0, "{report:?}");
        for i in 0..n {
            let round = if i % 3 == 0 { 3 } else { 0 };
            assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i, round)), "key {i}");
        }
        db.commit().unwrap();
        db.check().unwrap();
    }

    #[test]
    fn records_back_to_back_are_in_order_and_a_shuffle_is_scattered() {
        let in_order: Vec<u64> = (0..16).map(|i| 4096 + i * 100).collect();
        assert!(!scattered(&in_order, 4096));
        // Two runs of eight: still one run per eight records.
        let mut two_runs = in_order.clone();
        for o in &mut two_runs[8..] {
            *o += 1_000_000;
        }
        assert!(!scattered(&two_runs, 4096));
        // Every record somewhere else, backwards as often as not.
        let shuffled: Vec<u64> = (0..16).map(|i| 4096 + ((i * 7) % 16) * 100).collect();
        assert!(scattered(&shuffled, 4096));
        // Ascending but a page or more apart: each record a read of its own.
        let spread: Vec<u64> = (0..16).map(|i| i * 8192).collect();
        assert!(scattered(&spread, 4096));
        // The same spacing is a run where records are that long.
        assert!(!scattered(&spread, 16384));
    }
}
