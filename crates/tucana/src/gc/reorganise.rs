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
use crate::region::{scattered, Region};
use crate::types::RegionId;

/// Records handed to one `Region::relocate` call, so that the writer lock is taken once
/// per chunk, not per leaf; a chunk also ends at `CHUNK_MAX_BYTES` of records, which
/// bounds the memory of a walk over large values.
const CHUNK_RECORDS: usize = 512;
const CHUNK_MAX_BYTES: u64 = 4 << 20;

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
    let gap_bytes = region.run_gap_bytes();
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

/// Copies in key order the records live scans reported reading scattered from the device
/// (`Region::report_scattered_read`, read-guided reorganisation), oldest report first,
/// until `budget_bytes` of copies were taken; returns the bytes taken. A report carries
/// its records' bytes, so nothing is read here. It is dropped when a segment was retired
/// since its scan began: its segment may have been freed and reused since, and a record
/// of the same key written at the same offset would pass for the one the scan read. Of
/// the records it names, those in an open tail and those the index no longer points at
/// (overwritten, deleted, or copied already for an earlier report of the same range) are
/// left alone, so a range scanned many times is copied once. Reports left over wait for
/// the next step.
pub(super) fn rewrite_scattered_reads(regions: &[Arc<Region>], budget_bytes: u64) -> Result<u64> {
    let mut report = ReorganiseReport::default();
    for region in regions {
        while report.bytes_taken < budget_bytes && !region.is_dropped() {
            let Some(read) = region.next_scattered_read() else {
                break;
            };
            if read.retired_before() != region.segments_retired() {
                continue;
            }
            let mut live = Vec::new();
            for (ptr, key, value) in read.records() {
                if !region.in_open_tail(ptr) && region.is_live(key, ptr)? {
                    live.push((ptr, key, value));
                }
            }
            // One record alone is in order with itself: not worth a copy.
            if live.len() > 1 {
                relocate_in_order(region, &live, &mut report)?;
            }
        }
    }
    Ok(report.bytes_taken)
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
    relocate_in_order(region, &borrowed, report)?;
    chunk.clear();
    Ok(())
}

/// Copies `records` (`(offset, key, value)`, in key order) into the relocation log and
/// counts what the index took.
fn relocate_in_order(
    region: &Region,
    records: &[(u64, &[u8], &[u8])],
    report: &mut ReorganiseReport,
) -> Result<()> {
    let taken = region.relocate(records)?;
    report.bytes_taken += taken;
    region
        .shared()
        .reorganised_bytes
        .fetch_add(taken, std::sync::atomic::Ordering::Relaxed);
    report.records_copied += records.len() as u64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gc::tests::manual_small_segments as small_segments;
    use crate::region::ScatteredRead;

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

    /// The closed-segment records of keys `from..to` of `region`, in key order: how many,
    /// and in how many runs (back to back in the log) they lie.
    fn runs_between(ks: &crate::Keyspace, region: &Region, from: u64, to: u64) -> (usize, usize) {
        let mut offsets = Vec::new();
        for i in from..to {
            let ptr = region.lookup(None, &key(i)).unwrap().expect("a loaded key");
            if !region.in_open_tail(ptr) {
                offsets.push((ptr, region.record_header(ptr).unwrap().total_bytes()));
            }
        }
        assert!(ks.get(&key(from)).unwrap().is_some());
        let breaks = offsets
            .windows(2)
            .filter(|pair| pair[1].0 != pair[0].0 + pair[0].1)
            .count();
        (offsets.len(), breaks + 1)
    }

    /// A store whose background collector never steps on its own (a tick of an hour), so
    /// a test decides when reports are copied.
    fn quiet_collector() -> crate::Database {
        crate::Database::builder()
            .commit_interval(None)
            .flush_interval(None)
            .log_segment_bytes(64 << 10)
            .gc_tick(Duration::from_secs(3600))
            .open_in_memory()
            .unwrap()
    }

    #[test]
    fn a_cold_scan_of_scattered_records_has_them_rewritten_in_key_order_once() {
        let db = quiet_collector();
        let ks = db.keyspace("t").unwrap();
        load_scrambled(&ks, 4000);
        db.commit().unwrap();
        let region: Arc<Region> = db.engine.regions.get("t").unwrap();
        let (records, runs_before) = runs_between(&ks, &region, 1000, 1300);
        assert!(records > 250, "{records} records outside the tail");
        assert!(runs_before > records / 2, "{runs_before} runs before");

        // The in-memory volume cannot tell what is resident, so its scans count as cold.
        let scanned = |from: u64, to: u64| {
            ks.range(key(from)..key(to))
                .map(|item| item.unwrap())
                .collect::<Vec<_>>()
        };
        let items = scanned(1000, 1300);
        assert_eq!(items.len(), 300);
        assert_eq!(db.stats().scattered_reads, 1);
        // The same range scanned again before the collector gets to it: two reports.
        assert_eq!(scanned(1000, 1300), items);
        assert_eq!(db.stats().scattered_reads, 2);

        let taken = db
            .engine
            .collector
            .rewrite_scattered_reads_now(&db.engine.regions)
            .unwrap();
        // The second report found every record copied already: nothing copied twice.
        let record_bytes = (HEADER_BYTES + key(0).len() + value(0, 0).len()) as u64;
        assert_eq!(taken, records as u64 * record_bytes);
        assert_eq!(db.stats().reorganised_bytes, taken);
        let (_, runs_after) = runs_between(&ks, &region, 1000, 1300);
        assert!(runs_after <= 2, "{runs_after} runs after");
        assert_eq!(scanned(1000, 1300), items);
        // In order now: a scan reports nothing more.
        assert_eq!(db.stats().scattered_reads, 2);
        // A scan of fewer than `SCATTERED_READ_MIN_RECORDS` reports nothing.
        assert_eq!(scanned(2000, 2010).len(), 10);
        assert_eq!(db.stats().scattered_reads, 2);
        db.commit().unwrap();
        db.check().unwrap();
    }

    #[test]
    fn a_scan_report_is_dropped_once_a_segment_was_retired_after_its_scan_began() {
        // A report's pointers were read from the live index while its scan ran. If a
        // segment was retired since, it may have been freed and reused, and a newer
        // record of the same key may sit at the very offset the report names: the index
        // points there, so "still live" would pass, and the report's older bytes would
        // replace the newer value. Such a report must be dropped whole. Here the report
        // is forged so that every pointer is live and every value differs.
        let db = quiet_collector();
        let ks = db.keyspace("t").unwrap();
        load_scrambled(&ks, 4000);
        db.commit().unwrap();
        let region: Arc<Region> = db.engine.regions.get("t").unwrap();
        let before = region.segments_retired();
        let forged = b"bytes a scan read before the segment was reused".to_vec();
        let mut read = ScatteredRead::new(before);
        for i in 1000..1100 {
            let ptr = region.lookup(None, &key(i)).unwrap().unwrap();
            if !region.in_open_tail(ptr) {
                read.push(ptr, &key(i), &forged);
            }
        }
        // Other keys written twice: the segments of their first round empty, and a pass
        // retires them; the loaded segments keep no garbage, so the pass leaves them be.
        for round in 1..3 {
            for i in 10_000..11_000 {
                ks.put(&key(i), &value(i, round)).unwrap();
            }
        }
        db.gc().unwrap();
        assert!(region.segments_retired() > before, "no segment was retired");
        let still = region.lookup(None, &key(1000)).unwrap().unwrap();
        assert_eq!(Some(still), read.records().next().map(|r| r.0), "key moved");
        assert!(region.report_scattered_read(read));
        let taken = db
            .engine
            .collector
            .rewrite_scattered_reads_now(&db.engine.regions)
            .unwrap();
        assert_eq!(taken, 0);
        for i in 1000..1100 {
            assert_eq!(ks.get(&key(i)).unwrap(), Some(value(i, 0)), "key {i}");
        }
        db.check().unwrap();
    }

    #[test]
    fn scans_report_nothing_with_reorganise_scanned_off_or_from_a_snapshot() {
        let db = crate::Database::builder()
            .commit_interval(None)
            .flush_interval(None)
            .log_segment_bytes(64 << 10)
            .reorganise_scanned(false)
            .open_in_memory()
            .unwrap();
        let ks = db.keyspace("t").unwrap();
        load_scrambled(&ks, 2000);
        db.commit().unwrap();
        assert_eq!(ks.range(key(0)..key(500)).count(), 500);
        assert_eq!(db.stats().scattered_reads, 0);

        let db = quiet_collector();
        let ks = db.keyspace("t").unwrap();
        load_scrambled(&ks, 2000);
        db.commit().unwrap();
        let snapshot = ks.snapshot().unwrap();
        assert_eq!(snapshot.range(key(0)..key(500)).count(), 500);
        assert_eq!(db.stats().scattered_reads, 0);
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
}
