//! Regions: one keyspace's tree, log and writer.
//!
//! Owns: appending records to the region's log (segment switches, link records), applying
//! writes to the tree, exact live/dead byte counts per log segment, resolving log pointers
//! to records for readers and for the tree (`index::Ctx`), snapshot and live-iterator
//! registration, and the garbage-collection primitives: relocating a victim segment's live
//! records to the tail and retiring the emptied segment until nothing can read it
//! (policy and passes live in `crate::gc`).
//!
//! Thread-safety: one writer at a time per region (`Region::writer` mutex, held for an
//! append plus its tree update); readers take no lock: they pin `crossbeam_epoch`, read the
//! tree optimistically and read records from the tail buffer or the volume. Regions never
//! share a lock on the write path except the allocator's, taken once per log segment.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Atomic, Owned};
use parking_lot::{Mutex, MutexGuard};

use crate::db::Shared;
use crate::error::{Error, Result};
use crate::index::{self, Ctx, Tree};
use crate::log::record::{self, Header, RecordRef, HEADER_BYTES, LINK_RECORD_BYTES};
use crate::log::tail::Tail;
use crate::log::{GcTailPos, SegmentStats};
use crate::prefetch::ResidencyGate;
use crate::types::{DiskOffset, RegionId, SeqNo, TreeEpoch, BLOCK_BYTES};

/// One write of a batch: a put (`Some(value)`) or a delete (`None`).
pub(crate) struct Op<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// What the writer owns (under `Region::writer`).
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
        }
    }
}

/// The sealed state of a region, captured by a commit.
pub(crate) struct SealedRegion {
    pub root_word: u64,
    pub tree_epoch: TreeEpoch,
    pub generation: u32,
    pub next_seq: SeqNo,
    pub tail: DiskOffset,
    pub tail_size_bytes: u64,
    pub tail_used_bytes: u64,
    /// The relocation tail and its bytes at the seal: every copy the sealed tree points
    /// at lies below that position.
    pub gc_tail: Option<GcTailPos>,
    pub keys: u64,
    pub segments: Vec<(DiskOffset, SegmentStats)>,
}

/// A log segment garbage collection emptied and took out of the region's segment map in
/// tree epoch `epoch`. Trees sealed before `epoch` (older commits, snapshots, live
/// iterators registered before it) may still point into it; it is freed like a node
/// retired in that epoch (DESIGN.md, "Garbage collection").
///
/// Its reader grace period starts at retirement, not when the commits let it go: every
/// pointer into it left the live tree before it was retired (relocation replaced them,
/// and a segment with live bytes is never retired), so only readers pinned before then
/// can hold one. By the time two commits have passed (tens of milliseconds at least),
/// that grace period has nearly always passed too, and the segment's bytes go back to
/// the file system with the commit pair that frees it instead of waiting for readers
/// in another round of nudges and wake-ups.
#[derive(Debug)]
pub(crate) struct RetiredSegment {
    pub epoch: TreeEpoch,
    pub base: DiskOffset,
    pub size_bytes: u64,
    /// Set (by crossbeam-epoch) once no reader pinned before the retirement is left.
    pub readers_gone: Arc<AtomicBool>,
}

impl RetiredSegment {
    pub fn extent(&self) -> (DiskOffset, u64) {
        (self.base, self.size_bytes / BLOCK_BYTES)
    }
}

/// A run of blocks: where it starts and how many.
pub(crate) type Extent = (DiskOffset, u64);

/// What `Region::retire_segment` did with a victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retire {
    /// Taken out of the region; its size in bytes.
    Retired(u64),
    /// Still holds live records (the caller did not relocate them all).
    Live,
    /// An external pivot of the live tree reads its key from this segment.
    PinnedByPivot,
    /// No longer a segment of the region (already retired, or the region was dropped).
    Gone,
}

thread_local! {
    /// The candidate records of a group of gets, for `prefetch_records` (kept per thread so
    /// a group allocates nothing).
    static GROUP_PTRS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keys of a write whose index path is warmed before the writer lock (`Region::lock_warm`):
/// a large batch holds the lock long anyway, and warming all of it would double its
/// descents.
const WARM_OPS_MAX: usize = 32;

/// Writes that warm their index path after a writer found the lock taken (`lock_warm`).
const WARM_AFTER_CONTENTION: u32 = 64;

pub(crate) struct Region {
    pub id: RegionId,
    pub name: String,
    pub tree: Tree,
    pub shared: Arc<Shared>,
    pub(crate) seed: u32,
    /// Writes left that warm their index path before taking the writer lock
    /// (`lock_warm`): set when a writer finds the lock taken, 0 for a lone writer.
    warm_writes: std::sync::atomic::AtomicU32,
    /// `Writer::generation`, which never changes while the region is open: relocated
    /// copies are encoded with it outside the writer lock.
    pub(crate) generation: u32,
    tail: Atomic<Tail>,
    /// The relocation tail: the segment garbage collection appends the records it
    /// relocates to, apart from the foreground's tail, so that records which survived a
    /// collection (mostly cold ones) fill segments of their own instead of diluting the
    /// foreground's, which then die fast and cheaply. Null until this life's first
    /// relocation, or the committed one after an open. Never replayed: a crash drops the
    /// copies made since the last commit and the index keeps pointing at the originals,
    /// which stay until two commits sealed after their segment's retirement.
    pub(crate) gc_tail: Atomic<Tail>,
    pub writer: Mutex<Writer>,
    pub keys: AtomicU64,
    pub live_bytes: AtomicU64,
    /// The residency streak of the last prefetch batch any reader probed (see
    /// `prefetch::ResidencyGate`); new ranges start from it.
    prefetch_streak: std::sync::atomic::AtomicUsize,
    pub dead_bytes: AtomicU64,
    /// Tree epochs of live snapshots (with counts).
    snapshots: Mutex<BTreeMap<TreeEpoch, usize>>,
    /// Sealed tree epochs of the last two durable commits (older first).
    pub durable_epochs: Mutex<[Option<TreeEpoch>; 2]>,
    /// Segments emptied by garbage collection, not yet handed to the allocator.
    pub retired_segments: Mutex<Vec<RetiredSegment>>,
    /// Root of the tree in the newest durable commit.
    pub committed_root: Mutex<DiskOffset>,
    pub dropped: AtomicBool,
}

impl Drop for Region {
    /// Frees the current tail buffers (foreground and relocation): an `Atomic` does not
    /// own its pointee, so without this every region dropped (each close, each failed open) leaked its tail, one log
    /// segment of memory (regression test `a_closed_region_frees_its_tail_buffer`).
    fn drop(&mut self) {
        for slot in [&self.tail, &self.gc_tail] {
            // SAFETY: `&mut self` means no `Arc<Region>` is left, so no reader or writer
            // can still reach either tail; tails swapped out earlier went to
            // `defer_destroy`.
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

impl Region {
    pub fn new(
        shared: Arc<Shared>,
        id: RegionId,
        name: String,
        tree: Tree,
        tail: Tail,
        writer: Writer,
        keys: u64,
    ) -> Region {
        let live: u64 = writer.segments.values().map(|s| s.live_bytes).sum();
        let written: u64 = writer.segments.values().map(|s| s.written_bytes).sum();
        Region {
            id,
            name,
            tree,
            shared,
            seed: record::region_seed(id),
            warm_writes: std::sync::atomic::AtomicU32::new(0),
            generation: writer.generation,
            tail: Atomic::new(tail),
            gc_tail: Atomic::null(),
            writer: Mutex::new(writer),
            keys: AtomicU64::new(keys),
            live_bytes: AtomicU64::new(live),
            prefetch_streak: std::sync::atomic::AtomicUsize::new(0),
            dead_bytes: AtomicU64::new(written - live),
            snapshots: Mutex::new(BTreeMap::new()),
            durable_epochs: Mutex::new([None, None]),
            retired_segments: Mutex::new(Vec::new()),
            committed_root: Mutex::new(DiskOffset::NONE),
            dropped: AtomicBool::new(false),
        }
    }

    /// The region with the relocation tail a commit left it (recovery).
    pub fn with_gc_tail(self, gc_tail: Option<Tail>) -> Region {
        if let Some(t) = gc_tail {
            self.gc_tail.store(Owned::new(t), Ordering::Release);
        }
        self
    }

    fn check_usable(&self) -> Result<()> {
        if self.dropped.load(Ordering::Acquire) {
            return Err(Error::KeyspaceNotFound(self.name.clone()));
        }
        Ok(())
    }

    // ----- writes --------------------------------------------------------------------

    /// Appends the ops as one atomic unit and applies them to the tree. Returns the
    /// write ticket to wait for when the caller wants durability, and how many of the
    /// ops replaced or removed an existing key.
    pub fn write(&self, ops: &[Op<'_>]) -> Result<(u64, usize)> {
        self.check_usable()?;
        let shared = &self.shared;
        shared.check_writable()?;
        let mut w = self.lock_warm(ops.iter().take(WARM_OPS_MAX).map(|op| op.key));
        // Checked again under the lock: a drop or close may have drained writers meanwhile.
        self.check_usable()?;
        shared.check_writable()?;
        let mut ptrs = [DiskOffset::NONE; 1];
        let mut many = Vec::new();
        let ptrs: &mut [DiskOffset] = if ops.len() == 1 {
            &mut ptrs
        } else {
            many.resize(ops.len(), DiskOffset::NONE);
            &mut many
        };
        let mut appended = 0u64;
        for (i, op) in ops.iter().enumerate() {
            let mut flags = 0;
            if op.value.is_none() {
                flags |= record::FLAG_TOMBSTONE;
            }
            if i + 1 < ops.len() {
                flags |= record::FLAG_BATCH_MORE;
            }
            let at = self
                .append(&mut w, flags, op.key, op.value.unwrap_or(&[]))
                .inspect_err(|_| shared.poison())?;
            appended += (HEADER_BYTES + op.key.len() + op.value.map_or(0, |v| v.len())) as u64;
            ptrs[i] = at;
        }
        let mut existed = 0;
        for (op, ptr) in ops.iter().zip(ptrs.iter()) {
            if self
                .apply(&mut w, op.key, op.value.is_some(), *ptr)
                .inspect_err(|_| shared.poison())?
            {
                existed += 1;
            }
        }
        let ticket = shared.write_ticket.fetch_add(1, Ordering::AcqRel) + 1;
        drop(w);
        shared
            .log_bytes_since_commit
            .fetch_add(appended, Ordering::Relaxed);
        shared
            .foreground_bytes
            .fetch_add(appended, Ordering::Relaxed);
        shared.maybe_wake_committer();
        // Outside every lock: a paced writer holds nobody up but itself.
        shared.pace_writer(appended);
        Ok((ticket, existed))
    }

    /// The writer lock, for a write of `keys`. When another writer holds it, the index
    /// nodes these keys go to are first brought into the cache, reading only (a lookup
    /// that compares no key, `CandidateCtx`; its answer is not used): a region's writers
    /// take turns under the lock, and a cache miss taken under it (random keys miss on
    /// their leaf) makes every one of them wait, while one taken here, instead of waiting,
    /// costs nobody. A lone writer takes the lock at once: warming would only double its
    /// descents (a single-threaded random fill ran 25% slower). Once a writer found the
    /// lock taken, the next `WARM_AFTER_CONTENTION` writes warm whether or not they would
    /// wait: under steady contention the lock is usually free for an instant between two
    /// holders, and a writer that takes it then still takes its misses under it.
    fn lock_warm<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> MutexGuard<'_, Writer> {
        let warm_left = self.warm_writes.load(Ordering::Relaxed);
        if warm_left == 0 {
            if let Some(w) = self.writer.try_lock() {
                return w;
            }
            self.warm_writes
                .store(WARM_AFTER_CONTENTION, Ordering::Relaxed);
        } else {
            // Racy between writers, and harmless: a count, not an invariant.
            self.warm_writes.store(warm_left - 1, Ordering::Relaxed);
        }
        let guard = epoch::pin();
        let ctx = CandidateCtx {
            region: self,
            compares: std::cell::Cell::new(0),
            last: std::cell::Cell::new(0),
        };
        for key in keys {
            let _ = self.tree.get(&ctx, None, key, &guard);
        }
        self.writer.lock()
    }

    /// Applies one logged write to the tree and the byte counts (also used by replay).
    /// Returns whether the key existed.
    pub fn apply(&self, w: &mut Writer, key: &[u8], put: bool, ptr: DiskOffset) -> Result<bool> {
        let old = if put {
            let old = self.tree.insert(self, key, ptr.0)?;
            if old.is_none() {
                self.keys.fetch_add(1, Ordering::Relaxed);
            }
            old
        } else {
            let old = self.tree.remove(self, key)?;
            if old.is_some() {
                self.keys.fetch_sub(1, Ordering::Relaxed);
            }
            old
        };
        if let Some(old) = old {
            let len = self.record_header(old)?.total_bytes();
            self.account_dead(w, DiskOffset(old), len);
        }
        Ok(old.is_some())
    }

    fn account_dead(&self, w: &mut Writer, at: DiskOffset, len: u64) {
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

    /// Appends one record; switches to a new segment when it does not fit.
    fn append(&self, w: &mut Writer, flags: u8, key: &[u8], value: &[u8]) -> Result<DiskOffset> {
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

    /// Closes the relocation tail if nothing live is left in it (everything it copied was
    /// overwritten or deleted since), so that a forced pass can give its segment back
    /// like any other: a store emptied by deletes otherwise kept it for good. The next
    /// relocation opens a fresh one.
    pub fn close_dead_gc_tail(&self) -> Result<()> {
        let w = self.writer.lock();
        let guard = epoch::pin();
        let tail = self.gc_tail.load(Ordering::Acquire, &guard);
        // SAFETY: protected by the guard; replaced only under the writer lock, held.
        let Some(t) = (unsafe { tail.as_ref() }) else {
            return Ok(());
        };
        if w.segments.get(&t.base.0).is_none_or(|s| s.live_bytes != 0) {
            return Ok(());
        }
        self.close_segment(t)?;
        let prev = self
            .gc_tail
            .swap(epoch::Shared::null(), Ordering::AcqRel, &guard);
        // SAFETY: unreachable for new readers; in-flight readers hold guards.
        unsafe { guard.defer_destroy(prev) };
        guard.flush();
        drop(w);
        Ok(())
    }

    /// Closes the relocation tail (flushed, writeback started, like a foreground segment)
    /// and opens a fresh segment for it, big enough for a record of `record_len`. Unlike
    /// the foreground's, its segments end without a LINK: nothing walks them as a chain.
    fn switch_gc_segment(
        &self,
        w: &mut Writer,
        record_len: usize,
        guard: &epoch::Guard,
    ) -> Result<()> {
        let (base, size) = self.allocate_segment(w, record_len as u64)?;
        let old = self.gc_tail.load(Ordering::Acquire, guard);
        // SAFETY: protected by the guard.
        if let Some(old_tail) = unsafe { old.as_ref() } {
            self.close_segment(old_tail)?;
        }
        self.install_tail(&self.gc_tail, w, base, size, guard);
        Ok(())
    }

    fn switch_segment(
        &self,
        w: &mut Writer,
        record_len: usize,
        guard: &epoch::Guard,
    ) -> Result<()> {
        let (base, size) = self.allocate_segment(w, (record_len + LINK_RECORD_BYTES) as u64)?;
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
        self.close_segment(old_tail)?;
        self.install_tail(&self.tail, w, base, size, guard);
        Ok(())
    }

    /// Allocates a log segment of the standard size, or bigger (block-rounded) for
    /// `needed_bytes`; standard ones are aligned to their size.
    fn allocate_segment(&self, w: &Writer, needed_bytes: u64) -> Result<(DiskOffset, u64)> {
        let shared = &self.shared;
        let standard = shared.options.log_segment_bytes;
        let size = standard.max(needed_bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES);
        let blocks = size / BLOCK_BYTES;
        let align = if size == standard { blocks } else { 1 };
        let storage = shared.volume.storage();
        let base =
            shared
                .allocator
                .allocate(storage.as_ref(), blocks, align, w.sealed_for_commit)?;
        Ok((base, size))
    }

    /// A tail's segment is read from the volume once it is no longer the tail: writes it
    /// all, and has the kernel start putting it on the device now, as RocksDB's
    /// `bytes_per_sync` does (left dirty until the next commit's sync, a fast writer's log
    /// filled the page cache, and inside a memory cgroup the writer stalled in reclaim
    /// waiting for writeback: a 3 GB load ran at a third of the LSMs' rate).
    fn close_segment(&self, tail: &Tail) -> Result<()> {
        let storage = self.shared.volume.storage();
        let written = tail.flush(storage.as_ref())?;
        self.shared
            .bytes_written
            .fetch_add(written, Ordering::Relaxed);
        storage.start_writeback(tail.base.0, tail.size_bytes);
        Ok(())
    }

    /// Registers the fresh segment at `base` and makes a new tail over it the one `slot`
    /// (the foreground's or the relocation tail) holds; the old tail is dropped once no
    /// reader can hold it.
    fn install_tail(
        &self,
        slot: &Atomic<Tail>,
        w: &mut Writer,
        base: DiskOffset,
        size: u64,
        guard: &epoch::Guard,
    ) {
        w.segments.insert(
            base.0,
            SegmentStats {
                size_bytes: size,
                written_bytes: 0,
                live_bytes: 0,
                order: w.next_order,
            },
        );
        if self.shared.options.gc && size <= u64::from(u32::MAX) {
            w.dead_records.insert(base.0, Vec::new());
        }
        w.next_order += 1;
        let prev = slot.swap(Owned::new(Tail::new(base, size)), Ordering::AcqRel, guard);
        if !prev.is_null() {
            // SAFETY: `prev` is unreachable for new readers; in-flight readers hold guards.
            unsafe { guard.defer_destroy(prev) };
            // Hand the deferred drop to the global queue now. Left in this thread's bag it
            // waits for 63 more deferred items: a bulk load kept up to 64 closed 2 MiB
            // buffers per writer thread alive (128 MiB of a load's resident memory), and
            // the buffer pool never saw them come back.
            guard.flush();
        }
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

    /// Seals the region for a commit (writer lock held by the caller).
    pub fn seal(&self, w: &mut Writer) -> SealedRegion {
        let sealed = self.tree.seal();
        w.sealed_for_commit = true;
        let guard = epoch::pin();
        // SAFETY: non-null, protected by the guard.
        let t = unsafe { self.tail.load(Ordering::Acquire, &guard).deref() };
        debug_assert!(
            w.segments.contains_key(&t.base.0),
            "the tail segment is registered"
        );
        SealedRegion {
            root_word: sealed.root,
            tree_epoch: sealed.epoch,
            generation: w.generation,
            next_seq: w.next_seq,
            tail: t.base,
            tail_size_bytes: t.size_bytes,
            tail_used_bytes: t.published_bytes(),
            // SAFETY: protected by the guard; the writer lock (held) keeps it in place.
            gc_tail: unsafe { self.gc_tail.load(Ordering::Acquire, &guard).as_ref() }.map(|g| {
                // The bytes accounted to its segment, not all it holds: the collector
                // appends copies before it takes the writer lock to point the index at
                // them (`relocate`), and those are in no sealed tree.
                GcTailPos {
                    base: g.base,
                    size_bytes: g.size_bytes,
                    used_bytes: w.segments.get(&g.base.0).map_or(0, |s| s.written_bytes),
                }
            }),
            keys: self.keys.load(Ordering::Relaxed),
            segments: w
                .segments
                .iter()
                .map(|(off, s)| (DiskOffset(*off), *s))
                .collect(),
        }
    }

    // ----- garbage collection ----------------------------------------------------------

    /// Closed segments garbage collection may take, with their counts: every segment but
    /// the tail.
    ///
    /// Segments inside a durable commit's replay window (at or after its tail segment)
    /// are candidates too: retiring one only takes it out of the segment map; its bytes
    /// stay until the freeing rule lets it go, two commits sealed after the retirement,
    /// and both of those have their tails after it (it was closed before it was retired),
    /// so neither superblock slot replays through a freed segment (DESIGN.md, "Garbage
    /// collection"). Waiting for segments to leave both windows kept about two commit
    /// intervals of a fast writer's log out of GC's reach.
    pub fn gc_candidates(&self) -> Vec<(DiskOffset, SegmentStats)> {
        let w = self.writer.lock();
        let (tail_base, gc_tail_base) = {
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
        };
        w.segments
            .iter()
            .filter(|(off, _)| **off != tail_base.0 && Some(DiskOffset(**off)) != gc_tail_base)
            .map(|(off, s)| (DiskOffset(*off), *s))
            .collect()
    }

    /// Total size of the region's log segments (what the log occupies in the volume).
    pub fn log_size_bytes(&self) -> u64 {
        self.writer
            .lock()
            .segments
            .values()
            .map(|s| s.size_bytes)
            .sum()
    }

    /// Whether the live index still points at the record at `at` holding `key`: a test
    /// without the writer lock and without reading the log, for garbage collection to
    /// leave out dead records before `relocate`. A record found dead stays dead (a key
    /// never points back at an older record), so the answer can only go stale one way.
    pub fn is_live(&self, key: &[u8], at: u64) -> Result<bool> {
        let guard = epoch::pin();
        self.tree.points_at(self, None, key, at, &guard)
    }

    /// Copies into the relocation log those of `records` (`(offset, key, value)` of put
    /// records read from one closed segment, believed live) and points the index at each
    /// copy whose original the live index still names. Returns the bytes of the copies
    /// the index took.
    ///
    /// The copies are made outside the writer lock (the collector, one at a time under
    /// `DbInner::gc`, is the only appender of the relocation tail): the lock is held only
    /// to swap pointers and count bytes. Copying under it (encode, checksum, memcpy) held
    /// it for a third of a burst, with the foreground writers queued behind. A copy whose
    /// original was overwritten meanwhile is left in the relocation log as dead. Until its
    /// swap a copy is in no tree: a seal records only the bytes accounted to the segment.
    /// Copies carry `FLAG_RELOCATED` and sequence number 0: replay never follows the
    /// relocation log, so nothing there may ever pass for a record of the foreground's
    /// chain.
    pub fn relocate(&self, records: &[(u64, &[u8], &[u8])]) -> Result<u64> {
        let shared = &self.shared;
        self.check_usable()?;
        shared.check_writable()?;
        let guard = epoch::pin();
        let mut took = 0u64;
        let mut copies: Vec<(u64, &[u8], DiskOffset, u64)> = Vec::with_capacity(records.len());
        let mut next = 0;
        while next < records.len() {
            copies.clear();
            let tail = self.gc_tail.load(Ordering::Acquire, &guard);
            // SAFETY: protected by the guard; replaced only by this collector (under the
            // writer lock, below) or a forced pass, which holds the collector's lock too.
            let tail = unsafe { tail.as_ref() };
            if let Some(t) = tail {
                while let Some(&(at, key, value)) = records.get(next) {
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
                    next += 1;
                }
            }
            if let (Some(t), Some(_)) = (tail, records.get(next)) {
                // Full: nothing more is appended to it, so its bytes go to the volume
                // here rather than in the switch below, under the lock (a 2 MiB write
                // for every segment the collector fills).
                let written = t
                    .flush(shared.volume.storage().as_ref())
                    .inspect_err(|_| shared.poison())?;
                shared.bytes_written.fetch_add(written, Ordering::Relaxed);
            }
            let mut w = self.lock_warm(copies.iter().map(|c| c.1));
            self.check_usable()?;
            shared.check_writable()?;
            for &(at, key, copy, len) in &copies {
                let swapped = self
                    .tree
                    .replace_ptr(self, key, at, || Ok(copy.0))
                    .inspect_err(|_| shared.poison())?;
                let (&base, _) = w
                    .segments
                    .range(..=copy.0)
                    .next_back()
                    .expect("the relocation tail's segment is registered");
                self.account_written(&mut w, DiskOffset(base), len, swapped);
                if swapped {
                    // The old record's length is the copy's: no need to read its header.
                    self.account_dead(&mut w, DiskOffset(at), len);
                    took += len;
                } else if let Some(dead) = w.dead_records.get_mut(&base) {
                    dead.push(u32::try_from(copy.0 - base).expect("segments are under 4 GiB"));
                }
            }
            if let Some(&(_, key, value)) = records.get(next) {
                // The next record does not fit: a fresh segment, still under the lock. A
                // failure poisons, as any failed write does (the segment it may have
                // allocated is in no list; a later commit would record it as a leak).
                self.switch_gc_segment(&mut w, HEADER_BYTES + key.len() + value.len(), &guard)
                    .inspect_err(|_| shared.poison())?;
            }
        }
        drop(guard);
        if took > 0 {
            shared
                .log_bytes_since_commit
                .fetch_add(took, Ordering::Relaxed);
            shared.maybe_wake_committer();
        }
        Ok(took)
    }

    /// The dead put records of the segment at `base`, ascending offsets from its start, if
    /// this process has tracked them since the segment was created (`Writer::dead_records`):
    /// any other put record of the segment was live at the time of the call.
    pub fn dead_records_of(&self, base: DiskOffset) -> Option<Vec<u32>> {
        let mut dead = self.writer.lock().dead_records.get(&base.0)?.clone();
        dead.sort_unstable();
        Some(dead)
    }

    /// Takes the segment at `base` out of the region if nothing live is left in it and no
    /// external pivot reads from it, and lists it as retired in the running tree epoch.
    pub fn retire_segment(&self, base: DiskOffset) -> Result<Retire> {
        let mut w = self.writer.lock();
        if self.dropped.load(Ordering::Acquire) {
            return Ok(Retire::Gone);
        }
        let Some(seg) = w.segments.get(&base.0).copied() else {
            return Ok(Retire::Gone);
        };
        {
            let guard = epoch::pin();
            // SAFETY: non-null, protected by the guard.
            let t = unsafe { self.tail.load(Ordering::Acquire, &guard).deref() };
            assert!(t.base != base, "garbage collection chose the tail segment");
            // SAFETY: protected by the guard.
            let gc = unsafe { self.gc_tail.load(Ordering::Acquire, &guard).as_ref() };
            assert!(
                gc.is_none_or(|g| g.base != base),
                "garbage collection chose its own tail segment"
            );
        }
        if seg.live_bytes != 0 {
            return Ok(Retire::Live);
        }
        let end = base.0 + seg.size_bytes;
        let mut pinned = false;
        self.tree.external_pivots(self, &mut |ptr| {
            pinned |= (base.0..end).contains(&ptr);
        })?;
        if pinned {
            return Ok(Retire::PinnedByPivot);
        }
        w.segments.remove(&base.0);
        w.dead_records.remove(&base.0);
        self.dead_bytes
            .fetch_sub(seg.written_bytes, Ordering::Relaxed);
        // Read under the writer lock: a seal (which takes it) cannot slip in between, so
        // every tree sealed at this epoch or later is free of pointers into the segment.
        let epoch = self.tree.running_epoch();
        let readers_gone = Arc::new(AtomicBool::new(false));
        {
            let flag = Arc::clone(&readers_gone);
            let guard = crossbeam_epoch::pin();
            guard.defer(move || flag.store(true, Ordering::Release));
            guard.flush();
        }
        self.retired_segments.lock().push(RetiredSegment {
            epoch,
            base,
            size_bytes: seg.size_bytes,
            readers_gone,
        });
        Ok(Retire::Retired(seg.size_bytes))
    }

    /// Bytes of retired segments not yet handed back.
    pub fn retired_segment_bytes(&self) -> u64 {
        self.retired_segments
            .lock()
            .iter()
            .map(|r| r.size_bytes)
            .sum()
    }

    /// Whether some retired segment waits only for commits (not for a snapshot).
    pub fn has_reclaimable_segments(&self) -> bool {
        let oldest = self.oldest_snapshot();
        self.retired_segments
            .lock()
            .iter()
            .any(|r| oldest.is_none_or(|s| s >= r.epoch))
    }

    /// Retired segments sealed trees up to `upto` no longer reference (for a commit's
    /// free log: allocated in its bitmap, referenced by nothing in it).
    pub fn retired_segment_extents(&self, upto: TreeEpoch) -> Vec<(DiskOffset, u64)> {
        self.retired_segments
            .lock()
            .iter()
            .filter(|r| r.epoch <= upto)
            .map(|r| r.extent())
            .collect()
    }

    /// Takes out the retired segments neither durable commit (`durable`: the older one's
    /// sealed tree epoch) nor any snapshot or live iterator can reach, same rule as
    /// `Tree::reclaim`, as `(free now, after readers)`: the first are past their reader
    /// grace period (`RetiredSegment::readers_gone`), the caller still waits for in-flight
    /// readers before reusing the second.
    pub fn reclaim_segments(&self, durable: TreeEpoch) -> (Vec<Extent>, Vec<Extent>) {
        // Snapshots first: a reader registering after this reading holds no pointer into
        // a segment retired before it registered.
        let oldest = self.oldest_snapshot();
        let mut list = self.retired_segments.lock();
        let (mut now, mut after_readers) = (Vec::new(), Vec::new());
        list.retain(|r| {
            let free = r.epoch <= durable && oldest.is_none_or(|s| s >= r.epoch);
            if free {
                if r.readers_gone.load(Ordering::Acquire) {
                    now.push(r.extent());
                } else {
                    after_readers.push(r.extent());
                }
            }
            !free
        });
        (now, after_readers)
    }

    // ----- reads ---------------------------------------------------------------------

    /// Calls `f` with the record at `ptr`, from the tail buffer or the volume.
    pub fn with_record<R>(
        &self,
        ptr: u64,
        verify: bool,
        f: impl FnOnce(RecordRef<'_>) -> R,
    ) -> Result<R> {
        self.with_record_ahead(ptr, 0, verify, f)
    }

    /// `with_record`, first asking the CPU for the first cache lines of the record at
    /// `ahead` (0: none), one an iterator will read a few items later. An in-memory scan
    /// otherwise waits for one cache and TLB miss per record, one after the other: the
    /// log is in write order, not key order.
    pub fn with_record_ahead<R>(
        &self,
        ptr: u64,
        ahead: u64,
        verify: bool,
        f: impl FnOnce(RecordRef<'_>) -> R,
    ) -> Result<R> {
        let at = DiskOffset(ptr);
        let guard = epoch::pin();
        if ahead != 0 {
            self.hint_record_lines(ahead, self.buffered_tail(ahead, &guard));
        }
        {
            if let Some(t) = self.buffered_tail(ptr, &guard) {
                let head = t.read(ptr, HEADER_BYTES).ok_or_else(|| {
                    Error::corruption("log record", at, "pointer past the log end")
                })?;
                let header = Header::decode(head, at)?;
                let bytes = t.read(ptr, header.total_bytes() as usize).ok_or_else(|| {
                    Error::corruption("log record", at, "record past the log end")
                })?;
                return Ok(f(RecordRef::parse(bytes, self.seed, verify, at)?));
            }
        }
        with_scratch(|scratch| {
            let volume = &self.shared.volume;
            // SAFETY: records outside the tail belong to closed segments, which are
            // never written again while the region can reach them.
            let head = unsafe { volume.view(ptr, HEADER_BYTES, scratch)? };
            let header = Header::decode(head, at)?;
            let total = header.total_bytes() as usize;
            if verify {
                self.prefetch_long_record(ptr, total as u64);
            }
            // SAFETY: as above.
            let bytes = unsafe { volume.view(ptr, total, scratch)? };
            Ok(f(RecordRef::parse(bytes, self.seed, verify, at)?))
        })
    }

    /// The tail buffer, the foreground's or the relocation one, that holds `ptr`: its
    /// bytes may not be in the volume yet. `None`: read the volume.
    fn buffered_tail<'g>(&self, ptr: u64, guard: &'g epoch::Guard) -> Option<&'g Tail> {
        // SAFETY: both are protected by the guard; the tail is never null after
        // construction, the relocation tail may be.
        unsafe {
            if let Some(t) = self.tail.load(Ordering::Acquire, guard).as_ref() {
                if t.contains(ptr) {
                    return Some(t);
                }
            }
            self.gc_tail
                .load(Ordering::Acquire, guard)
                .as_ref()
                .filter(|t| t.contains(ptr))
        }
    }

    /// Starts loading the header line and the next line of the record at `ptr`, when it
    /// is in memory without I/O (the tail buffer or the volume's mapping).
    fn hint_record_lines(&self, ptr: u64, tail: Option<&Tail>) {
        let bytes = match tail {
            Some(t) => t.read(ptr, 1),
            // SAFETY: `ptr` names a record of a closed segment that the caller's reader
            // can reach, never written while reachable; the slice is dropped at once
            // (only its address is used).
            _ => unsafe { self.shared.volume.storage().mapped(ptr, 1) },
        };
        if let Some(bytes) = bytes {
            crate::prefetch::cache_lines(bytes.as_ptr(), [0, 64]);
        }
    }

    /// Before a record is read whole (`verify`: its checksum covers every byte) from the
    /// volume: if it reaches past the page after its first, asks for all of it in one
    /// request. Through the mapping (MADV_RANDOM, no readahead) each page would otherwise
    /// be one synchronous fault, and a prefetch window asked only for about an average
    /// record. Records of one or two pages never pay the extra call. Off with
    /// `scan_prefetch_entries == 0`, like all prefetching.
    fn prefetch_long_record(&self, ptr: u64, total_bytes: u64) {
        if ptr % BLOCK_BYTES + total_bytes <= 2 * BLOCK_BYTES
            || self.shared.options.scan_prefetch_entries == 0
        {
            return;
        }
        let start = ptr / BLOCK_BYTES * BLOCK_BYTES;
        let len_bytes = (ptr + total_bytes).div_ceil(BLOCK_BYTES) * BLOCK_BYTES - start;
        self.shared.volume.storage().prefetch(start, len_bytes);
        self.shared.prefetch_calls.fetch_add(1, Ordering::Relaxed);
        self.shared
            .prefetch_bytes
            .fetch_add(len_bytes, Ordering::Relaxed);
    }

    pub fn record_header(&self, ptr: u64) -> Result<Header> {
        self.with_record(ptr, false, |r| r.header)
    }

    /// The value of `key` under `root` (the live root or a snapshot's).
    pub fn get_with<R>(
        &self,
        root: Option<u64>,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        // The index would confirm the key by reading the record, and then the value read
        // would read it again: take the prefix + hash match as a candidate and confirm it
        // with the one read that fetches the value. A collision (another key with the same
        // prefix and hash) or anything unusual falls back to the exact lookup. One epoch
        // pin spans the lookup and the read, so the record cannot be freed in between.
        let _guard = epoch::pin();
        match self.lookup_candidate(root, key)? {
            Candidate::Absent => Ok(None),
            Candidate::Maybe(ptr) => {
                let mut f = Some(f);
                if let Some(value) = self.value_at_if_key(ptr, key, |v| f.take().map(|f| f(v)))? {
                    return Ok(value);
                }
                let f = f.expect("a record of another key leaves `f` unused");
                self.get_exact(root, key, f)
            }
            Candidate::Unsure => self.get_exact(root, key, f),
        }
    }

    /// `get_with` for several keys at once, `f(i, value of keys[i])` in order: what a
    /// pipeline of GETs or a multi-get asks. One key alone waits for each of its cache
    /// misses in turn (the leaf, then the record, which lies in write order, not key
    /// order); a group looks every key up in the index first, asks the CPU for every
    /// record's first lines, and only then reads them, so the records' misses overlap.
    /// Errors are per key; one does not stop the others. No allocation.
    pub fn get_many_with(
        &self,
        root: Option<u64>,
        keys: &[&[u8]],
        mut f: impl FnMut(usize, Result<Option<&[u8]>>),
    ) {
        // Enough records in flight to cover a miss; more only lengthens the time the
        // first record's lines must stay in cache.
        const GROUP: usize = 16;
        let guard = epoch::pin();
        // Records on the device are asked for as a group too (one `posix_fadvise` per run
        // of pages, as `multi_get` does), so their reads overlap instead of faulting in one
        // at a time; the gate keeps data in memory from paying a system call.
        let device_prefetch = self.shared.options.scan_prefetch_entries > 0;
        let mut gate = ResidencyGate::with_streak(self.prefetch_streak());
        for (g, group) in keys.chunks(GROUP).enumerate() {
            let mut found = [const { None::<Result<Candidate>> }; GROUP];
            for (slot, key) in found.iter_mut().zip(group) {
                *slot = Some(self.lookup_candidate(root, key));
            }
            // A group of one reads its record at once: a hint would only cost.
            if group.len() > 1 {
                if device_prefetch {
                    GROUP_PTRS.with_borrow_mut(|ptrs| {
                        ptrs.clear();
                        ptrs.extend(found.iter().filter_map(|slot| match slot {
                            Some(Ok(Candidate::Maybe(ptr))) => Some(*ptr),
                            _ => None,
                        }));
                        self.prefetch_records(ptrs, &mut gate, 2);
                    });
                }
                for slot in found.iter().take(group.len()) {
                    if let Some(Ok(Candidate::Maybe(ptr))) = slot {
                        self.hint_record_lines(*ptr, self.buffered_tail(*ptr, &guard));
                    }
                }
            }
            for (j, (slot, key)) in found.iter_mut().zip(group).enumerate() {
                let i = g * GROUP + j;
                // Whether `f` was handed the value.
                let answered = match slot.take().expect("looked up above") {
                    Err(e) => Err(e),
                    Ok(Candidate::Absent) => Ok(false),
                    Ok(Candidate::Maybe(ptr)) => {
                        match self.value_at_if_key(ptr, key, |v| f(i, Ok(Some(v)))) {
                            Ok(Some(())) => Ok(true),
                            // Another key with the same prefix and hash: look up exactly.
                            Ok(None) => self
                                .get_exact(root, key, |v| f(i, Ok(Some(v))))
                                .map(|found| found.is_some()),
                            Err(e) => Err(e),
                        }
                    }
                    Ok(Candidate::Unsure) => self
                        .get_exact(root, key, |v| f(i, Ok(Some(v))))
                        .map(|found| found.is_some()),
                };
                match answered {
                    Ok(true) => {}
                    Ok(false) => f(i, Ok(None)),
                    Err(e) => f(i, Err(e)),
                }
            }
        }
    }

    /// `get_with` by the index's own confirmation (a record read per key compare).
    fn get_exact<R>(
        &self,
        root: Option<u64>,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        let guard = epoch::pin();
        let Some(ptr) = self.tree.get(self, root, key, &guard)? else {
            return Ok(None);
        };
        self.value_at(ptr, key, f).map(Some)
    }

    /// The log pointer the index holds for `key` under `root` (index only, no record read).
    /// The caller keeps the pointer valid after the call returns (a snapshot or a
    /// registered live reader, see `register_live_reader`).
    pub fn lookup(&self, root: Option<u64>, key: &[u8]) -> Result<Option<u64>> {
        self.check_usable()?;
        let guard = epoch::pin();
        self.tree.get(self, root, key, &guard)
    }

    /// Looks `key` up without reading any record: the index confirms a key whose prefix and
    /// hash match by reading its record (`Ctx::key_cmp`), which is exactly the read a
    /// batch of lookups wants to prefetch first. The leaf's match is taken as a candidate
    /// the caller confirms when it reads the record; anything else that needed a key
    /// (a long pivot kept in the log, a restart) makes the answer `Unsure`.
    pub fn lookup_candidate(&self, root: Option<u64>, key: &[u8]) -> Result<Candidate> {
        self.check_usable()?;
        let guard = epoch::pin();
        let ctx = CandidateCtx {
            region: self,
            compares: std::cell::Cell::new(0),
            last: std::cell::Cell::new(0),
        };
        let found = self.tree.get(&ctx, root, key, &guard)?;
        Ok(match (found, ctx.compares.get()) {
            (None, 0) => Candidate::Absent,
            (Some(ptr), 1) if ptr == ctx.last.get() => Candidate::Maybe(ptr),
            _ => Candidate::Unsure,
        })
    }

    /// Calls `f` with the value of the put record at `ptr`, which the index named for `key`
    /// (verified: a record of another key or a tombstone is corruption).
    pub fn value_at<R>(&self, ptr: u64, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        self.value_at_if_key(ptr, key, f)?.ok_or_else(|| {
            Error::corruption(
                "index entry",
                DiskOffset(ptr),
                "points at a record of another key",
            )
        })
    }

    /// As `value_at`, but `None` when the record at `ptr` holds another key (a
    /// `Candidate::Maybe` that collided); a tombstone of `key` is still corruption.
    pub fn value_at_if_key<R>(
        &self,
        ptr: u64,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        self.with_record(ptr, true, |rec| {
            if rec.key != key {
                return Ok(None);
            }
            if rec.header.is_tombstone() {
                return Err(Error::corruption(
                    "index entry",
                    DiskOffset(ptr),
                    "points at a tombstone",
                ));
            }
            Ok(Some(f(rec.value)))
        })?
    }

    /// Asks the volume to start reading the records at `ptrs` (any order, duplicates
    /// allowed; left sorted, the caller clears it) and returns without waiting. Records in
    /// a tail buffer are skipped (they are in memory). Each record is asked for from its
    /// start for about the region's average record size (at least its header's page); a
    /// longer one reads the rest when it is read. Adjacent pages go in one request.
    ///
    /// `gate` (the caller's, kept across its batches) probes `probes` records first and
    /// skips the batch once the data looks resident (see `prefetch::ResidencyGate`).
    pub fn prefetch_records(&self, ptrs: &mut Vec<u64>, gate: &mut ResidencyGate, probes: usize) {
        {
            let guard = epoch::pin();
            // SAFETY: protected by the guard; never null after construction. A tail
            // switched right after this reading only makes us skip records that were just
            // written out (resident) or ask for bytes not yet written (harmless).
            ptrs.retain(|&ptr| self.buffered_tail(ptr, &guard).is_none());
        }
        if ptrs.is_empty() {
            return;
        }
        let storage = self.shared.volume.storage();
        let issue = gate.issue(ptrs, probes, |ptr| storage.resident(ptr));
        self.prefetch_streak.store(gate.streak(), Ordering::Relaxed);
        if !issue {
            self.shared
                .prefetch_skipped
                .fetch_add(ptrs.len() as u64, Ordering::Relaxed);
            return;
        }
        let keys = self.keys.load(Ordering::Relaxed).max(1);
        let record_bytes = (self.live_bytes.load(Ordering::Relaxed) / keys).clamp(
            HEADER_BYTES as u64,
            crate::prefetch::MAX_RECORD_PREFETCH_BYTES,
        );
        let mut bytes = 0;
        let calls = crate::prefetch::page_runs(ptrs, record_bytes, |offset, len_bytes| {
            storage.prefetch(offset, len_bytes);
            bytes += len_bytes;
        });
        self.shared
            .prefetch_calls
            .fetch_add(calls, Ordering::Relaxed);
        self.shared
            .prefetch_bytes
            .fetch_add(bytes, Ordering::Relaxed);
    }

    /// Where a new reader's `ResidencyGate` starts.
    pub fn prefetch_streak(&self) -> usize {
        self.prefetch_streak.load(Ordering::Relaxed)
    }

    /// Copies the leaf `seek` lands on (for range iteration).
    pub fn copy_leaf(
        &self,
        root: Option<u64>,
        seek: index::Seek<'_>,
        out: &mut index::LeafCopy,
    ) -> Result<()> {
        self.check_usable()?;
        let guard = epoch::pin();
        self.tree.copy_leaf(self, root, seek, &guard, out)
    }

    // ----- snapshots -----------------------------------------------------------------

    /// Seals the running tree epoch and pins the sealed root for a snapshot.
    pub fn open_snapshot(&self) -> (u64, TreeEpoch) {
        let _w = self.writer.lock();
        let sealed = self.tree.seal();
        *self.snapshots.lock().entry(sealed.epoch).or_insert(0) += 1;
        (sealed.root, sealed.epoch)
    }

    /// Registers a live-tree iterator: it holds log pointers between calls without an
    /// epoch guard, so nothing retired from now on may be freed while it lives. It counts
    /// as a snapshot of the epoch before the running one (anything retired in the running
    /// epoch or later waits). Returns the epoch to pass to `close_snapshot`.
    pub fn register_live_reader(&self) -> TreeEpoch {
        let mut snaps = self.snapshots.lock();
        // Read under the snapshots lock: a reclaim deciding now sees this registration or
        // ran before it, when this reader held no pointer yet.
        let epoch = TreeEpoch(self.tree.running_epoch().0.saturating_sub(1));
        *snaps.entry(epoch).or_insert(0) += 1;
        epoch
    }

    pub fn close_snapshot(&self, epoch: TreeEpoch) {
        let mut snaps = self.snapshots.lock();
        let count = snaps.get_mut(&epoch).expect("snapshot was registered");
        *count -= 1;
        if *count == 0 {
            snaps.remove(&epoch);
        }
    }

    pub fn oldest_snapshot(&self) -> Option<TreeEpoch> {
        self.snapshots.lock().keys().next().copied()
    }

    pub fn segment_count(&self) -> u64 {
        self.writer.lock().segments.len() as u64
    }
}

impl Ctx for Region {
    fn key_cmp(&self, ptr: u64, key: &[u8]) -> Result<CmpOrdering> {
        self.with_record(ptr, false, |r| r.key.cmp(key))
    }

    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()> {
        self.with_record(ptr, false, |r| {
            out.clear();
            out.extend_from_slice(r.key);
        })
    }

    fn with_node<R>(&self, off: DiskOffset, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        with_scratch(|scratch| {
            // SAFETY: committed nodes are never written again while reachable; their
            // blocks are released only after every reader that could see them is gone.
            let bytes = unsafe {
                self.shared
                    .volume
                    .view(off.0, BLOCK_BYTES as usize, scratch)?
            };
            f(bytes)
        })
    }
}

/// What `Region::lookup_candidate` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Candidate {
    /// The key is not in the index (no record was needed to tell).
    Absent,
    /// The entry whose key prefix and hash match the key's: its record holds the key
    /// unless two keys collide on both (then look up exactly).
    Maybe(u64),
    /// Look up exactly (`Region::lookup`).
    Unsure,
}

/// A `Ctx` that answers every key comparison with "equal" without reading the record,
/// and counts them (see `Region::lookup_candidate`).
struct CandidateCtx<'a> {
    region: &'a Region,
    compares: std::cell::Cell<u32>,
    last: std::cell::Cell<u64>,
}

impl Ctx for CandidateCtx<'_> {
    fn key_cmp(&self, ptr: u64, _key: &[u8]) -> Result<CmpOrdering> {
        self.compares.set(self.compares.get() + 1);
        self.last.set(ptr);
        Ok(CmpOrdering::Equal)
    }

    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()> {
        self.region.key_into(ptr, out)
    }

    fn with_node<R>(&self, off: DiskOffset, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        self.region.with_node(off, f)
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with a scratch buffer for backends without a mapping. A small per-thread
/// stack of buffers, so nested calls (a node view that compares a key) each get one.
fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let mut buf = SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default();
    let out = f(&mut buf);
    if buf.capacity() <= 1 << 20 {
        SCRATCH.with(|s| s.borrow_mut().push(buf));
    }
    out
}
