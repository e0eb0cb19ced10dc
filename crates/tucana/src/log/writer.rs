//! A region's log as its writer sees it: the foreground tail and the relocation tail
//! (the segment garbage collection copies into), allocating log segments and switching
//! to them (a LINK record closes the foreground's), closing a segment (written out,
//! writeback started), and the exact live and written byte counts of every segment.
//!
//! Owns: appending records (`Log::append`, and `Log::append_copies` for relocated
//! copies), segment allocation and switches, tail flushes, and the per-segment accounting
//! in `Writer::segments` with its region-wide totals. Does not own: the index (the region
//! applies each appended record to its tree), retiring or freeing segments (the region and
//! the commit), or replay (`crate::recovery`).
//!
//! Thread-safety: `Writer` is the state under the region's writer lock; every method that
//! appends or switches takes it as `&mut Writer`, so there is one appender per tail (the
//! collector appends relocated copies to the relocation tail outside the lock, being its
//! only appender; it switches that tail under the lock). Readers take no lock: they pin
//! `crossbeam_epoch` and read a tail's published bytes (`Log::buffered_tail`); a
//! replaced tail is dropped once no reader pinned before can hold it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Atomic, Owned};

use crate::error::Result;
use crate::log::in_flight::InFlightTails;
use crate::log::record::{self, HEADER_BYTES, LINK_RECORD_BYTES};
use crate::log::tail::Tail;
use crate::log::{GcTailPos, SegmentStats};
use crate::shared::Shared;
use crate::types::{DiskOffset, SeqNo, BLOCK_BYTES};

/// What the writer owns (under the region's writer lock).
pub(crate) struct Writer {
    /// Log generation of this process's life of the region (see `log::record`).
    pub generation: u32,
    pub next_seq: SeqNo,
    /// Every log segment of the region, by start offset.
    pub segments: BTreeMap<u64, SegmentStats>,
    /// `order` of the next segment allocated (see `SegmentStats::order`).
    pub next_order: u64,
    /// The region was sealed by the running commit: segments allocated now must not
    /// appear in that commit's bitmap image.
    pub sealed_for_commit: bool,
    /// Where the dead put records of segments this process created lie (offsets from the
    /// segment's start, in the order they died), for garbage collection: a record listed
    /// is dead for good (no index entry ever points back at an older record), one not
    /// listed is live, so collecting the segment needs no index walk per record to tell
    /// (`Region::dead_records_of`). Segments from before the open have no entry: their
    /// dead records are known only to the index. Kept only with background GC on (with
    /// it off nothing bounds the garbage, nor these lists); 4 bytes a dead record until
    /// its segment is retired.
    pub dead_records: HashMap<u64, Vec<u32>>,
    /// The segments by `order` (start offset, and whether it was opened as a relocation
    /// segment): what a replication shipper walks (`Region::ship_segments`). Segments
    /// from before the open count as foreground ones, except the committed relocation
    /// tail; only the ordering of foreground bytes matters to it, and every segment from
    /// before the open lies below any position written since.
    by_order: BTreeMap<u64, (u64, bool)>,
    /// How many `segments` there are and their total size, readable without the lock.
    totals: Arc<SegmentTotals>,
}

/// The count and total size of a region's log segments, kept beside `Writer::segments`
/// (changed only with it, under the writer lock) so that statistics read them without
/// that lock: `stats()`, and `INFO` with it, used to wait behind a writer that held the
/// lock while the device drained a full budget of writes in flight.
#[derive(Default)]
pub(crate) struct SegmentTotals {
    count: AtomicU64,
    size_bytes: AtomicU64,
}

impl SegmentTotals {
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Relaxed)
    }
}

impl Writer {
    pub fn new(generation: u32, next_seq: SeqNo, next_order: u64) -> Writer {
        Writer {
            generation,
            next_seq,
            segments: BTreeMap::new(),
            next_order,
            sealed_for_commit: false,
            dead_records: HashMap::new(),
            by_order: BTreeMap::new(),
            totals: Arc::default(),
        }
    }

    /// The segments' count and size, for reading without the writer lock.
    pub fn totals(&self) -> Arc<SegmentTotals> {
        self.totals.clone()
    }

    /// Registers a segment of the region (`relocation`: opened for garbage collection's
    /// copies).
    pub fn add_segment(&mut self, base: DiskOffset, stats: SegmentStats, relocation: bool) {
        if let Some(replaced) = self.segments.insert(base.0, stats) {
            self.count_out(&replaced);
        }
        self.by_order.insert(stats.order, (base.0, relocation));
        self.totals.count.fetch_add(1, Ordering::Relaxed);
        self.totals
            .size_bytes
            .fetch_add(stats.size_bytes, Ordering::Relaxed);
    }

    /// Takes a segment out of the region; its counts.
    pub fn remove_segment(&mut self, base: DiskOffset) -> Option<SegmentStats> {
        let stats = self.segments.remove(&base.0)?;
        self.by_order.remove(&stats.order);
        self.dead_records.remove(&base.0);
        self.count_out(&stats);
        Some(stats)
    }

    fn count_out(&self, stats: &SegmentStats) {
        self.totals.count.fetch_sub(1, Ordering::Relaxed);
        self.totals
            .size_bytes
            .fetch_sub(stats.size_bytes, Ordering::Relaxed);
    }

    /// Whether the segment of order `order` was opened for garbage collection's copies.
    pub fn is_relocation(&self, order: u64) -> bool {
        self.by_order
            .get(&order)
            .is_some_and(|(_, relocation)| *relocation)
    }

    /// The segments whose order is at least `order`, in order: `(order, start, stats,
    /// relocation)`, at most `max` of them.
    pub fn segments_from(
        &self,
        order: u64,
        max: usize,
    ) -> Vec<(u64, DiskOffset, SegmentStats, bool)> {
        self.by_order
            .range(order..)
            .take(max)
            .map(|(&o, &(base, relocation))| {
                (o, DiskOffset(base), self.segments[&base], relocation)
            })
            .collect()
    }
}

/// Where a region's tails stood at a seal: the foreground tail's segment and the bytes
/// published in it (replay starts there), and the relocation tail's position.
pub(crate) struct TailPositions {
    pub tail: DiskOffset,
    pub tail_size_bytes: u64,
    pub tail_used_bytes: u64,
    /// The relocation tail and its bytes at the seal: every copy the sealed tree points
    /// at lies below that position.
    pub gc_tail: Option<GcTailPos>,
}

/// A region's log: its two tails and the totals of its segments' byte counts.
pub(crate) struct Log {
    shared: Arc<Shared>,
    /// crc seed of the region's records (`record::region_seed`).
    seed: u32,
    /// `Writer::generation`, which never changes while the region is open: relocated
    /// copies are encoded with it outside the writer lock.
    generation: u32,
    tail: Atomic<Tail>,
    /// The relocation tail: the segment garbage collection appends the records it
    /// relocates to, apart from the foreground's tail, so that records which survived a
    /// collection (mostly cold ones) fill segments of their own instead of diluting the
    /// foreground's, which then die fast and cheaply. Null until this life's first
    /// relocation, or the committed one after an open. Never replayed: a crash drops the
    /// copies made since the last commit and the index keeps pointing at the originals,
    /// which stay until two commits sealed after their segment's retirement.
    gc_tail: Atomic<Tail>,
    /// Closed tails (of either kind) whose write is in flight: readers find them here
    /// until their bytes are in the volume.
    in_flight: Arc<InFlightTails>,
    /// Bytes of the records the index points at, over all segments.
    live_bytes: AtomicU64,
    /// Bytes written and dead (overwritten, deleted, tombstones, links), over all segments.
    dead_bytes: AtomicU64,
}

impl Drop for Log {
    /// Frees the current tail buffers (foreground and relocation): an `Atomic` does not
    /// own its pointee, so without this every region dropped (each close, each failed
    /// open) leaked its tail, one log segment of memory (regression test
    /// `a_closed_region_frees_its_tail_buffer`).
    fn drop(&mut self) {
        // Closed segments still in flight are written before the tails go (their jobs
        // hold the in-flight slots, not this log; errors stay with the queue).
        if let Some(queue) = &self.shared.writes {
            queue.drain();
        }
        for slot in [&self.tail, &self.gc_tail] {
            // SAFETY: `&mut self` means no `Arc<Region>` (the only owner of a `Log`) is
            // left, so no reader or writer can still reach either tail; tails swapped out
            // earlier went to `defer_destroy`.
            unsafe {
                let tail = slot.swap(
                    epoch::Shared::null(),
                    Ordering::AcqRel,
                    epoch::unprotected(),
                );
                if !tail.is_null() {
                    drop(tail.into_owned());
                }
            }
        }
    }
}

impl Log {
    /// The log of a region whose records have crc seed `seed`, appending at `tail`, with `writer`'s segments (their counts
    /// become the totals) and, after an open, the relocation tail its commit left.
    pub fn new(
        shared: Arc<Shared>,
        seed: u32,
        tail: Tail,
        gc_tail: Option<Tail>,
        writer: &Writer,
    ) -> Log {
        let live: u64 = writer.segments.values().map(|s| s.live_bytes).sum();
        let written: u64 = writer.segments.values().map(|s| s.written_bytes).sum();
        Log {
            shared,
            seed,
            generation: writer.generation,
            tail: Atomic::new(tail),
            gc_tail: gc_tail.map_or_else(Atomic::null, Atomic::new),
            in_flight: Arc::new(InFlightTails::new()),
            live_bytes: AtomicU64::new(live),
            dead_bytes: AtomicU64::new(written - live),
        }
    }

    /// crc seed of the region's records.
    #[inline]
    pub fn seed(&self) -> u32 {
        self.seed
    }

    #[inline]
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Ordering::Relaxed)
    }

    #[inline]
    pub fn dead_bytes(&self) -> u64 {
        self.dead_bytes.load(Ordering::Relaxed)
    }

    /// Appends one record; switches to a new segment when it does not fit.
    pub fn append(
        &self,
        w: &mut Writer,
        flags: u8,
        key: &[u8],
        value: &[u8],
    ) -> Result<DiskOffset> {
        let len = HEADER_BYTES + key.len() + value.len();
        let guard = epoch::pin();
        let mut tail = self.tail.load(Ordering::Acquire, &guard);
        // SAFETY: the tail is never null after construction and is freed only through
        // the guard's epoch after being replaced.
        let mut t = unsafe { tail.deref() };
        if t.free_bytes() < (len + LINK_RECORD_BYTES) as u64 {
            self.switch_segment(w, len, &guard)?;
            tail = self.tail.load(Ordering::Acquire, &guard);
            // SAFETY: as above.
            t = unsafe { tail.deref() };
        }
        let seq = w.next_seq;
        // SAFETY: we hold the writer lock: the only appender.
        let at = unsafe {
            t.append(len, |buf| {
                record::encode_into(buf, self.seed, flags, w.generation, seq, key, value)
            })
        };
        w.next_seq = SeqNo(seq.0 + 1);
        let live = flags & record::FLAG_TOMBSTONE == 0;
        self.account_written(w, t.base, len as u64, live);
        Ok(at)
    }

    pub fn account_dead(&self, w: &mut Writer, at: DiskOffset, len: u64) {
        let (&base, seg) = w
            .segments
            .range_mut(..=at.0)
            .next_back()
            .expect("a live record lies in a segment of its region");
        if let Some(dead) = w.dead_records.get_mut(&base) {
            dead.push(u32::try_from(at.0 - base).expect("segments are under 4 GiB"));
        }
        assert!(
            seg.live_bytes >= len,
            "live bytes of a segment went negative"
        );
        seg.live_bytes -= len;
        self.live_bytes.fetch_sub(len, Ordering::Relaxed);
        self.dead_bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// Counts a replayed record as written in the segment that holds it.
    pub fn account_replayed(&self, w: &mut Writer, at: DiskOffset, len: u64, live: bool) {
        let seg = *w
            .segments
            .range(..=at.0)
            .next_back()
            .expect("a replayed record lies in a segment of its region")
            .0;
        self.account_written(w, DiskOffset(seg), len, live);
    }

    fn account_written(&self, w: &mut Writer, segment: DiskOffset, len: u64, live: bool) {
        let seg = w
            .segments
            .get_mut(&segment.0)
            .expect("the tail segment is registered");
        seg.written_bytes += len;
        if live {
            seg.live_bytes += len;
            self.live_bytes.fetch_add(len, Ordering::Relaxed);
        } else {
            self.dead_bytes.fetch_add(len, Ordering::Relaxed);
        }
    }

    fn switch_segment(
        &self,
        w: &mut Writer,
        record_len: usize,
        guard: &epoch::Guard,
    ) -> Result<()> {
        let (base, size) =
            self.allocate_segment(w, (record_len + LINK_RECORD_BYTES) as u64, None)?;
        let old = self.tail.load(Ordering::Acquire, guard);
        // SAFETY: non-null, protected by the guard.
        let old_tail = unsafe { old.deref() };
        let mut link = [0u8; 16];
        link[..8].copy_from_slice(&base.0.to_le_bytes());
        link[8..].copy_from_slice(&size.to_le_bytes());
        let seq = w.next_seq;
        // SAFETY: writer lock held; the segment always keeps room for its link record.
        unsafe {
            old_tail.append(LINK_RECORD_BYTES, |buf| {
                record::encode_into(
                    buf,
                    self.seed,
                    record::FLAG_LINK,
                    w.generation,
                    seq,
                    &[],
                    &link,
                )
            })
        };
        w.next_seq = SeqNo(seq.0 + 1);
        self.account_written(w, old_tail.base, LINK_RECORD_BYTES as u64, false);
        self.install_tail(&self.tail, w, base, size, guard)
    }

    /// Closes the relocation tail (flushed, writeback started, like a foreground segment)
    /// and opens a fresh segment for it, big enough for a record of `record_len`. Unlike
    /// the foreground's, its segments end without a LINK: nothing walks them as a chain.
    fn switch_gc_segment(
        &self,
        w: &mut Writer,
        record_len: usize,
        away_from: Option<DiskOffset>,
        guard: &epoch::Guard,
    ) -> Result<()> {
        let (base, size) = self.allocate_segment(w, record_len as u64, away_from)?;
        self.install_tail(&self.gc_tail, w, base, size, guard)
    }

    /// Allocates a log segment of the standard size, or bigger (block-rounded) for
    /// `needed_bytes`; standard ones are aligned to their size.
    fn allocate_segment(
        &self,
        w: &Writer,
        needed_bytes: u64,
        away_from: Option<DiskOffset>,
    ) -> Result<(DiskOffset, u64)> {
        let shared = &self.shared;
        let standard = shared.options.log_segment_bytes;
        let size = standard.max(needed_bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES);
        let blocks = size / BLOCK_BYTES;
        let align = if size == standard { blocks } else { 1 };
        let storage = shared.volume.storage();
        // On a volume over several members, the member the dispatch policy names (not
        // the one holding `away_from`, when another will do).
        let avoid = away_from.and_then(|at| storage.member_of(at.0));
        // Segments waiting in the write queue count as writes on their member (LWQL).
        let queued = shared.queued_write_bytes();
        let base = shared.allocator.allocate_on(
            storage.as_ref(),
            blocks,
            align,
            w.sealed_for_commit,
            storage.dispatch_member(avoid, &queued),
        )?;
        Ok((base, size))
    }

    /// A tail's segment is read from the volume once it is no longer the tail: writes it
    /// all, and has the kernel start putting it on the device now, as RocksDB's
    /// `bytes_per_sync` does (left dirty until the next commit's sync, a fast writer's log
    /// filled the page cache, and inside a memory cgroup the writer stalled in reclaim
    /// waiting for writeback: a 3 GB load ran at a third of the LSMs' rate). The
    /// synchronous path (`writes_in_flight_segments == 0`); `replace_tail` queues the
    /// same work otherwise.
    fn close_segment(&self, tail: &Tail) -> Result<()> {
        let storage = self.shared.volume.storage();
        let written = tail.flush(storage.as_ref())?;
        self.shared
            .bytes_written
            .fetch_add(written, Ordering::Relaxed);
        storage.start_writeback(tail.base.0, tail.size_bytes);
        Ok(())
    }

    /// Closes the tail `slot` holds (if any) and puts `new` (or nothing) in its place
    /// (writer lock held). With writes in flight, the closed tail goes to the in-flight
    /// slots *before* `slot` stops naming it, and its write is queued on its member
    /// (waiting here only while the budget is full); its job writes it, starts its
    /// writeback and then lets it go. Without, it is written now and dropped after the
    /// readers' grace period. Errors: a failed write (now, or an earlier queued one);
    /// `slot` is left as it was.
    fn replace_tail(
        &self,
        slot: &Atomic<Tail>,
        new: Option<Tail>,
        guard: &epoch::Guard,
    ) -> Result<()> {
        let old = slot.load(Ordering::Acquire, guard);
        // SAFETY: protected by the guard; only the writer (us) replaces it.
        let Some(old_tail) = (unsafe { old.as_ref() }) else {
            if let Some(new) = new {
                slot.store(Owned::new(new), Ordering::Release);
            }
            return Ok(());
        };
        let Some(queue) = self.shared.writes.as_ref() else {
            self.close_segment(old_tail)?;
            let new = new.map_or_else(epoch::Shared::null, |t| Owned::new(t).into_shared(guard));
            slot.store(new, Ordering::Release);
            // SAFETY: `old` is unreachable for new readers; in-flight readers hold guards.
            unsafe { guard.defer_destroy(old) };
            // Hand the deferred drop to the global queue now. Left in this thread's bag it
            // waits for 63 more deferred items: a bulk load kept up to 64 closed 2 MiB
            // buffers per writer thread alive (128 MiB of a load's resident memory), and
            // the buffer pool never saw them come back.
            guard.flush();
            return Ok(());
        };
        let storage = self.shared.volume.storage();
        let member = storage.member_of(old_tail.base.0).unwrap_or(0);
        let reservation =
            queue.reserve(member, old_tail.size_bytes, &|| self.in_flight.has_free())?;
        // Findable in one place or the other at every instant: in flight first, then
        // out of the tail slot (a reader that loads the new tail from `slot` sees the
        // insertion, which happened before the store it read).
        let i = self.in_flight.insert(old);
        let new = new.map_or_else(epoch::Shared::null, |t| Owned::new(t).into_shared(guard));
        slot.store(new, Ordering::Release);
        let in_flight = Arc::clone(&self.in_flight);
        let storage = Arc::clone(storage);
        let wait_for_device = self.shared.options.segment_writes_wait_for_device;
        queue.push(
            reservation,
            Box::new(move || {
                // SAFETY: this is slot `i`'s job, before its `complete`.
                let t = unsafe { in_flight.get(i) };
                // A failed write keeps the tail in its slot: readers keep reading its
                // buffer (the bytes are not in the volume), and the store is poisoned.
                let written = t.flush(storage.as_ref())?;
                if wait_for_device {
                    storage.write_back_and_wait(t.base.0, t.size_bytes)?;
                } else {
                    storage.start_writeback(t.base.0, t.size_bytes);
                }
                in_flight.complete(i);
                Ok(written)
            }),
        );
        Ok(())
    }

    /// Closes the tail `slot` holds (`replace_tail`), registers the fresh segment at
    /// `base` and makes a new tail over it the one `slot` (the foreground's or the
    /// relocation tail) holds.
    fn install_tail(
        &self,
        slot: &Atomic<Tail>,
        w: &mut Writer,
        base: DiskOffset,
        size: u64,
        guard: &epoch::Guard,
    ) -> Result<()> {
        let relocation = std::ptr::eq(slot, &self.gc_tail);
        let tail = Tail::new(base, size, w.next_order);
        self.replace_tail(slot, Some(tail), guard)?;
        w.add_segment(
            base,
            SegmentStats {
                size_bytes: size,
                written_bytes: 0,
                live_bytes: 0,
                order: w.next_order,
            },
            relocation,
        );
        if self.shared.options.gc && size <= u64::from(u32::MAX) {
            w.dead_records.insert(base.0, Vec::new());
        }
        w.next_order += 1;
        Ok(())
    }

    /// Writes the tail's pending bytes to the volume (not synced).
    pub fn flush_tail(&self) -> Result<()> {
        let guard = epoch::pin();
        let tail = self.tail.load(Ordering::Acquire, &guard);
        // SAFETY: non-null, protected by the guard.
        let t = unsafe { tail.deref() };
        let written = t.flush(self.shared.volume.storage().as_ref())?;
        self.shared
            .bytes_written
            .fetch_add(written, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the relocation tail's pending bytes to the volume (not synced): a commit
    /// does, since the tree it persists may point at them. Syncs need not: no user write
    /// waits for a relocated copy.
    pub fn flush_gc_tail(&self) -> Result<()> {
        let guard = epoch::pin();
        // SAFETY: protected by the guard.
        if let Some(t) = unsafe { self.gc_tail.load(Ordering::Acquire, &guard).as_ref() } {
            let written = t.flush(self.shared.volume.storage().as_ref())?;
            self.shared
                .bytes_written
                .fetch_add(written, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Closes the relocation tail if nothing live is left in it (everything it copied was
    /// overwritten or deleted since), so that a forced pass can give its segment back
    /// like any other: a store emptied by deletes otherwise kept it for good. The next
    /// relocation opens a fresh one.
    pub fn close_dead_gc_tail(&self, w: &Writer) -> Result<()> {
        let guard = epoch::pin();
        let tail = self.gc_tail.load(Ordering::Acquire, &guard);
        // SAFETY: protected by the guard; replaced only under the writer lock, held.
        let Some(t) = (unsafe { tail.as_ref() }) else {
            return Ok(());
        };
        if w.segments.get(&t.base.0).is_none_or(|s| s.live_bytes != 0) {
            return Ok(());
        }
        self.replace_tail(&self.gc_tail, None, &guard)
    }

    /// The buffer that holds `ptr`: the foreground's or the relocation tail's, or that of
    /// a closed segment whose write is in flight; its bytes may not be in the volume yet.
    /// `None`: read the volume.
    #[inline]
    pub fn buffered_tail<'g>(&self, ptr: u64, guard: &'g epoch::Guard) -> Option<&'g Tail> {
        // SAFETY: both are protected by the guard; the tail is never null after
        // construction, the relocation tail may be.
        unsafe {
            if let Some(t) = self.tail.load(Ordering::Acquire, guard).as_ref() {
                if t.contains(ptr) {
                    return Some(t);
                }
            }
            if let Some(t) = self.gc_tail.load(Ordering::Acquire, guard).as_ref() {
                if t.contains(ptr) {
                    return Some(t);
                }
            }
        }
        // After both tail slots: a tail switched since is in flight (inserted there
        // before its slot let go of it) or written.
        self.in_flight.find(ptr, guard)
    }

    /// The buffer of the segment starting at `base` while it is a tail or its write is
    /// in flight (shipping and GC read a whole segment from there); `None`: the volume.
    pub fn buffered_segment<'g>(
        &self,
        base: DiskOffset,
        guard: &'g epoch::Guard,
    ) -> Option<&'g Tail> {
        self.buffered_tail(base.0, guard).filter(|t| t.base == base)
    }

    /// Where the tails stand, for a seal (writer lock held: nothing is appended to the
    /// foreground tail and no copy is accounted meanwhile).
    pub fn positions(&self, w: &Writer) -> TailPositions {
        let guard = epoch::pin();
        // SAFETY: non-null, protected by the guard.
        let t = unsafe { self.tail.load(Ordering::Acquire, &guard).deref() };
        debug_assert!(
            w.segments.contains_key(&t.base.0),
            "the tail segment is registered"
        );
        TailPositions {
            tail: t.base,
            tail_size_bytes: t.size_bytes,
            tail_used_bytes: t.published_bytes(),
            // SAFETY: protected by the guard; the writer lock (held) keeps it in place.
            gc_tail: unsafe { self.gc_tail.load(Ordering::Acquire, &guard).as_ref() }.map(|g| {
                // The bytes accounted to its segment, not all it holds: the collector
                // appends copies before it takes the writer lock to point the index at
                // them (`Region::relocate`), and those are in no sealed tree.
                GcTailPos {
                    base: g.base,
                    size_bytes: g.size_bytes,
                    used_bytes: w.segments.get(&g.base.0).map_or(0, |s| s.written_bytes),
                }
            }),
        }
    }

    /// The foreground tail and the relocation tail (if any), as long as `guard` lives.
    #[inline]
    pub fn tails<'g>(&self, guard: &'g epoch::Guard) -> (Option<&'g Tail>, Option<&'g Tail>) {
        // SAFETY: both are protected by the guard (a replaced tail is destroyed only
        // after every guard pinned before its replacement is gone).
        unsafe {
            (
                self.tail.load(Ordering::Acquire, guard).as_ref(),
                self.gc_tail.load(Ordering::Acquire, guard).as_ref(),
            )
        }
    }

    /// The segments of the foreground tail and of the relocation tail (if any): never
    /// garbage collection's victims.
    pub fn tail_segments(&self) -> (DiskOffset, Option<DiskOffset>) {
        let guard = epoch::pin();
        // SAFETY: protected by the guard; the tail is non-null.
        unsafe {
            (
                self.tail.load(Ordering::Acquire, &guard).deref().base,
                self.gc_tail
                    .load(Ordering::Acquire, &guard)
                    .as_ref()
                    .map(|t| t.base),
            )
        }
    }

    /// Appends copies of `records` (`(offset, key, value)` of live put records) to the
    /// relocation tail while they fit, outside the writer lock: the collector, one at a
    /// time, is that tail's only appender. Each copy is `(original offset, key, copy
    /// offset, length)` in `copies`. Returns how many records were copied; fewer than
    /// all when the tail filled up (then its bytes are written out here, off the lock:
    /// nothing more is appended to it) or when there is no relocation tail yet. Copies
    /// carry `FLAG_RELOCATED` and sequence number 0: replay never follows the relocation
    /// log, so nothing there may ever pass for a record of the foreground's chain.
    pub fn append_copies<'r>(
        &self,
        records: &[(u64, &'r [u8], &[u8])],
        copies: &mut Vec<(u64, &'r [u8], DiskOffset, u64)>,
        guard: &epoch::Guard,
    ) -> Result<usize> {
        let tail = self.gc_tail.load(Ordering::Acquire, guard);
        // SAFETY: protected by the guard; replaced only by the collector (under the
        // writer lock) or a forced pass, which holds the collector's lock too.
        let Some(t) = (unsafe { tail.as_ref() }) else {
            return Ok(0);
        };
        let mut copied = 0;
        for &(at, key, value) in records {
            let len = HEADER_BYTES + key.len() + value.len();
            if t.free_bytes() < len as u64 {
                break;
            }
            // SAFETY: the collector is the only appender of the relocation tail.
            let copy = unsafe {
                t.append(len, |buf| {
                    record::encode_into(
                        buf,
                        self.seed,
                        record::FLAG_RELOCATED,
                        self.generation,
                        SeqNo(0),
                        key,
                        value,
                    )
                })
            };
            copies.push((at, key, copy, len as u64));
            copied += 1;
        }
        if copied < records.len() && self.shared.writes.is_none() {
            // Full: nothing more is appended to it, so its bytes go to the volume here
            // rather than in the switch, under the lock (a 2 MiB write for every segment
            // the collector fills). With writes in flight the switch only queues it.
            let written = t.flush(self.shared.volume.storage().as_ref())?;
            self.shared
                .bytes_written
                .fetch_add(written, Ordering::Relaxed);
        }
        Ok(copied)
    }

    /// Accounts a relocated copy of `len` bytes at `copy` (writer lock held): live if the
    /// index took it (`swapped`; its original at `original` dies), else dead at once.
    pub fn account_copy(
        &self,
        w: &mut Writer,
        original: DiskOffset,
        copy: DiskOffset,
        len: u64,
        swapped: bool,
    ) {
        let (&base, _) = w
            .segments
            .range(..=copy.0)
            .next_back()
            .expect("the relocation tail's segment is registered");
        self.account_written(w, DiskOffset(base), len, swapped);
        if swapped {
            // The old record's length is the copy's: no need to read its header.
            self.account_dead(w, original, len);
        } else if let Some(dead) = w.dead_records.get_mut(&base) {
            dead.push(u32::try_from(copy.0 - base).expect("segments are under 4 GiB"));
        }
    }

    /// Opens a fresh relocation tail big enough for a record of `record_len` (writer lock
    /// held), closing the full one; on a volume over several members, away from the member
    /// of `victim` (the segment being collected) when another will do, so that the copies
    /// are written where the victim is not being read (LOCS §3.3.3).
    pub fn next_gc_segment(
        &self,
        w: &mut Writer,
        record_len: usize,
        victim: DiskOffset,
    ) -> Result<()> {
        let guard = epoch::pin();
        self.switch_gc_segment(w, record_len, Some(victim), &guard)
    }

    /// Takes a retired segment's bytes out of the totals (writer lock held).
    pub fn forget_segment(&self, w: &mut Writer, base: DiskOffset) -> Option<SegmentStats> {
        let seg = w.remove_segment(base)?;
        self.dead_bytes
            .fetch_sub(seg.written_bytes, Ordering::Relaxed);
        Some(seg)
    }
}
