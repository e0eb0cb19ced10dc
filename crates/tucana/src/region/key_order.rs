//! Whether records lie in key order in the log, and the reports of live scans that found
//! them scattered: read-guided reorganisation (DESIGN.md "Reorganising the log in key
//! order", *Guided by scans*).
//!
//! A scan of records that are not in memory reads one page per record when the log holds
//! them in write order. The scan has paid those reads already, and holds each record as
//! it returns it. So a live forward range that read from the device keeps a copy of what
//! it returned (a *trail*), and reports it here when it ends if the records were
//! scattered (`Region::report_scattered_read`); the collector, on its next step, appends
//! those the index still points at to the relocation log in key order
//! (`gc::reorganise::rewrite_scattered_reads`). The next scan of that range reads a few
//! pages instead of one per record, and the page cache holds the range densely.
//!
//! Owns: `scattered` (the test the reorganiser's walk and the reports both apply), the run
//! gap it uses, and the region's bounded queue of reports with the count of segments
//! retired, by which a report whose pointers may name freed bytes is recognised and
//! dropped. Does not own: noticing (`crate::range`) nor copying (`crate::gc`).
//!
//! Thread-safety: reports come from reader threads, at most one per cold scan (or per
//! `SCATTERED_READ_MAX_RECORDS` records of a long one), under a mutex held for a push; the
//! collector pops under the same mutex. The retired count is bumped under the writer lock
//! when a segment is retired and read without a lock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::Region;

/// Records are in key order when they form at most one run (stretches that lie close
/// together in the log, in key order) per this many records; more runs, and a scan of
/// them reads that many separate places.
pub(crate) const RECORDS_PER_RUN_IN_ORDER: usize = 8;

/// A scan reports what it read once it has read at least this many records from the
/// device: a shorter one gains little from a rewrite, and the copy costs the same per
/// record.
pub(crate) const SCATTERED_READ_MIN_RECORDS: usize = 16;

/// A long scan reports every this many records, or this many bytes of them, so the
/// collector copies a full scan in pieces as it goes, and a live range holds at most this
/// much beside what it returns (a run of 256 KiB in key order is 64 pages read as one).
const SCATTERED_READ_MAX_RECORDS: usize = 1024;
const SCATTERED_READ_MAX_BYTES: usize = 256 << 10;

/// Bytes of records a region's queue holds, at most; later reports are dropped (and
/// counted) until the collector catches up: it copies within its rate budget, so a burst
/// of cold scans must not queue more work (or memory) than it gets through in a few
/// steps. At GC's default rate (64 MiB/s) this is half a second of copying.
const SCATTERED_READS_QUEUED_MAX_BYTES: usize = 32 << 20;

/// Whether records at `offsets` (in key order) are scattered: they form more runs than
/// one per `RECORDS_PER_RUN_IN_ORDER`, a run going on while each record starts after the
/// one before and less than `gap_bytes` past its start. Offsets alone, so that deciding
/// reads no record.
pub(crate) fn scattered(offsets: &[u64], gap_bytes: u64) -> bool {
    let breaks = offsets
        .windows(2)
        .filter(|pair| pair[1] <= pair[0] || pair[1] - pair[0] >= gap_bytes)
        .count();
    let runs = breaks + 1;
    runs > offsets.len().div_ceil(RECORDS_PER_RUN_IN_ORDER)
}

/// Records a live scan read from the device, in key order, with their bytes, and the
/// region's count of retired segments when the scan began. The scan copies each record
/// as it returns it: by the time the collector gets to a report the pages may be evicted
/// again (a cold scan churns the page cache), and reading them back one by one made the
/// collector copy a tenth of what the scans reported (session 23's first run).
pub(crate) struct ScatteredRead {
    /// `(offset, key length, value length)` of each record, its key and value back to
    /// back in `bytes`.
    records: Vec<(u64, u32, u32)>,
    bytes: Vec<u8>,
    retired_before: u64,
}

impl ScatteredRead {
    /// An empty trail of a scan that began when `retired_before` segments were retired.
    pub fn new(retired_before: u64) -> ScatteredRead {
        ScatteredRead {
            records: Vec::new(),
            bytes: Vec::new(),
            retired_before,
        }
    }

    pub fn retired_before(&self) -> u64 {
        self.retired_before
    }

    /// Adds the record at `ptr`, the next in key order.
    pub fn push(&mut self, ptr: u64, key: &[u8], value: &[u8]) {
        self.records
            .push((ptr, key.len() as u32, value.len() as u32));
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
    }

    /// Whether the trail should be reported now and another started.
    pub fn is_full(&self) -> bool {
        self.records.len() >= SCATTERED_READ_MAX_RECORDS
            || self.bytes.len() >= SCATTERED_READ_MAX_BYTES
    }

    /// The records, `(offset, key, value)`, in key order.
    pub fn records(&self) -> impl Iterator<Item = (u64, &[u8], &[u8])> + '_ {
        let mut at = 0usize;
        self.records.iter().map(move |&(ptr, key_len, value_len)| {
            let key = &self.bytes[at..at + key_len as usize];
            at += key_len as usize;
            let value = &self.bytes[at..at + value_len as usize];
            at += value_len as usize;
            (ptr, key, value)
        })
    }

    fn offsets(&self) -> Vec<u64> {
        self.records.iter().map(|r| r.0).collect()
    }
}

/// A region's queue of scattered reads and its count of retired segments.
#[derive(Default)]
pub(crate) struct ScatteredReads {
    queue: Mutex<Queue>,
    /// Segments retired so far (`Region::retire_segment`).
    segments_retired: AtomicU64,
}

#[derive(Default)]
struct Queue {
    reads: VecDeque<ScatteredRead>,
    bytes: usize,
}

impl ScatteredReads {
    /// Counts a retired segment; called under the region's writer lock.
    pub(super) fn segment_retired(&self) {
        self.segments_retired.fetch_add(1, Ordering::AcqRel);
    }
}

impl Region {
    /// The `gap_bytes` of `scattered` for this region: a page, or two average records if
    /// that is more (so records longer than a page, back to back, count as in order).
    pub fn run_gap_bytes(&self) -> u64 {
        let average = self.live_bytes() / self.keys().max(1);
        (2 * average).max(crate::types::BLOCK_BYTES)
    }

    /// Segments retired so far. A live scan reads it before it copies its first leaf: a
    /// pointer it then copies names a record in a segment retired later, if at all, so
    /// when the count has not moved by the time the collector looks, every such segment
    /// still holds the bytes the scan read (invariant 2).
    pub fn segments_retired(&self) -> u64 {
        self.scattered_reads
            .segments_retired
            .load(Ordering::Acquire)
    }

    /// Reports the records a live scan read from the device (`read`): queued for the
    /// collector when they are enough and scattered, dropped (and counted) when the queue
    /// is full. Returns whether it was queued.
    pub fn report_scattered_read(&self, read: ScatteredRead) -> bool {
        if read.records.len() < SCATTERED_READ_MIN_RECORDS
            || !scattered(&read.offsets(), self.run_gap_bytes())
        {
            return false;
        }
        let mut queue = self.scattered_reads.queue.lock();
        if queue.bytes + read.bytes.len() > SCATTERED_READS_QUEUED_MAX_BYTES {
            drop(queue);
            self.shared
                .scattered_reads_dropped
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        queue.bytes += read.bytes.len();
        queue.reads.push_back(read);
        drop(queue);
        self.shared.scattered_reads.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The oldest scattered read waiting, if any.
    pub fn next_scattered_read(&self) -> Option<ScatteredRead> {
        let mut queue = self.scattered_reads.queue.lock();
        let read = queue.reads.pop_front()?;
        queue.bytes -= read.bytes.len();
        Some(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
