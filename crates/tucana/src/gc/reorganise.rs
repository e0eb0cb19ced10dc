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

use crate::error::Result;
use crate::index::{LeafCopy, Seek};
use crate::log::record::HEADER_BYTES;
use crate::region::Region;

/// Records handed to one `Region::relocate` call, so that the writer lock is taken once
/// per chunk, not per leaf; a chunk also ends at `CHUNK_MAX_BYTES` of records, which
/// bounds the memory of a walk over large values.
const CHUNK_RECORDS: usize = 512;
const CHUNK_MAX_BYTES: u64 = 4 << 20;

/// A leaf is rewritten when its records break into more runs (stretches that lie back to
/// back in the log, in key order) than one per this many records: a scan of it would
/// read that many separate places.
const RECORDS_PER_RUN_IN_ORDER: usize = 8;

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

/// Whether records at `offsets` (in key order) with lengths `lens` are scattered: they
/// form more runs than one per `RECORDS_PER_RUN_IN_ORDER`.
fn scattered(offsets: &[u64], lens: &[u64]) -> bool {
    let breaks = offsets
        .windows(2)
        .zip(lens)
        .filter(|(pair, &len)| pair[1] != pair[0] + len)
        .count();
    let runs = breaks + 1;
    runs > offsets.len().div_ceil(RECORDS_PER_RUN_IN_ORDER)
}

/// Rewrites the scattered leaves of `region`'s live index in key order; adds what it did
/// to `report`. Records still in a tail buffer (written since the tail was opened) are
/// left where they are: their segment is not closed yet.
pub(super) fn reorganise_region(region: &Region, report: &mut ReorganiseReport) -> Result<()> {
    let mut leaf = LeafCopy::default();
    let mut seek_key: Option<Vec<u8>> = None;
    let mut chunk: Vec<Record> = Vec::with_capacity(CHUNK_RECORDS);
    let mut chunk_bytes = 0u64;
    loop {
        let seek = match &seek_key {
            Some(k) => Seek::AtOrAfter(k),
            None => Seek::First,
        };
        region.copy_leaf(None, seek, &mut leaf)?;
        report.leaves_seen += 1;
        let records = leaf_records(region, &leaf)?;
        let offsets: Vec<u64> = records.iter().map(|r| r.0).collect();
        let lens: Vec<u64> = records.iter().map(record_len).collect();
        if records.len() > 1 && scattered(&offsets, &lens) {
            report.leaves_rewritten += 1;
            for record in records {
                chunk_bytes += record_len(&record);
                chunk.push(record);
                if chunk.len() == CHUNK_RECORDS || chunk_bytes >= CHUNK_MAX_BYTES {
                    relocate_chunk(region, &mut chunk, report)?;
                    chunk_bytes = 0;
                }
            }
        }
        match leaf.high.take() {
            // A leaf's upper fence lies above every key in it, so the walk moves on.
            Some(high) if seek_key.as_ref().is_none_or(|k| high > *k) => seek_key = Some(high),
            Some(_) => {
                return Err(crate::error::Error::corruption(
                    "index",
                    crate::types::DiskOffset::NONE,
                    "leaf fences out of order (damaged pivots)",
                ))
            }
            None => break,
        }
    }
    relocate_chunk(region, &mut chunk, report)
}

fn record_len(record: &Record) -> u64 {
    (HEADER_BYTES + record.1.len() + record.2.len()) as u64
}

/// The records of `leaf` that lie in closed segments, in key order, read and verified.
fn leaf_records(region: &Region, leaf: &LeafCopy) -> Result<Vec<Record>> {
    let mut records = Vec::with_capacity(leaf.ptrs.len());
    for &ptr in &leaf.ptrs {
        if region.in_open_tail(ptr) {
            continue;
        }
        records.push(region.with_record(ptr, true, |r| (ptr, r.key.to_vec(), r.value.to_vec()))?);
    }
    Ok(records)
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
    report.bytes_taken += region.relocate(&borrowed)?;
    report.records_copied += chunk.len() as u64;
    chunk.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// An in-memory store committed only by hand, with 64 KiB log segments.
    fn small_segments() -> crate::Database {
        crate::Database::builder()
            .commit_interval(None)
            .flush_interval(None)
            .log_segment_bytes(64 << 10)
            .open_in_memory()
            .unwrap()
    }

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
        let lens = [100u64; 16];
        let in_order: Vec<u64> = (0..16).map(|i| 4096 + i * 100).collect();
        assert!(!scattered(&in_order, &lens));
        // Two runs of eight: still one run per eight records.
        let mut two_runs = in_order.clone();
        for o in &mut two_runs[8..] {
            *o += 1_000_000;
        }
        assert!(!scattered(&two_runs, &lens));
        // Every record somewhere else.
        let shuffled: Vec<u64> = (0..16).map(|i| 4096 + ((i * 7) % 16) * 100).collect();
        assert!(scattered(&shuffled, &lens));
    }
}
