//! Garbage collection's primitives on a region: which segments may be victims, whether a
//! record is still live, relocating live records into the relocation log, retiring an
//! emptied segment, and reclaiming retired segments once nothing can reach them.
//!
//! Owns: the rules of DESIGN.md "Garbage collection" that need the region's writer lock
//! or its retired list (relocation's pointer swaps, retirement, the freeing rule for
//! segments). Does not own: choosing victims or budgets (`crate::gc`), appending the
//! copies (`log::writer::Log::append_copies`).
//!
//! Thread-safety: relocation appends its copies outside the writer lock (the collector
//! is the relocation tail's only appender, under the collector's own mutex) and takes the
//! lock only to swap pointers; retirement runs under the writer lock, so a seal cannot
//! slip in between; the retired list has its own short mutex.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_epoch as epoch;

use super::{Extent, Region};
use crate::error::Result;
use crate::log::record::HEADER_BYTES;
use crate::log::SegmentStats;
use crate::types::{DiskOffset, TreeEpoch, BLOCK_BYTES};

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
pub(super) struct RetiredSegment {
    pub epoch: TreeEpoch,
    pub base: DiskOffset,
    pub size_bytes: u64,
    /// Set (by crossbeam-epoch) once no reader pinned before the retirement is left.
    pub readers_gone: Arc<AtomicBool>,
}

impl RetiredSegment {
    pub fn extent(&self) -> Extent {
        (self.base, self.size_bytes / BLOCK_BYTES)
    }
}

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
    /// A backup has not received all of it yet (`Region::set_ship_horizon`).
    NotShipped,
    /// A foreground segment at or after the newest durable commit's tail: a backup that
    /// joins now replays through it (`Region::gc_candidates`).
    InReplayWindow,
}

impl Region {
    /// Closes the relocation tail if nothing live is left in it, so that a forced pass
    /// can give its segment back like any other (`Log::close_dead_gc_tail`).
    pub fn close_dead_gc_tail(&self) -> Result<()> {
        let w = self.writer.lock();
        self.log.close_dead_gc_tail(&w)
    }

    /// Closed segments garbage collection may take, with their counts: every segment but
    /// the tails, those a backup has not received entirely, and the foreground segments
    /// of the newest durable commit's replay window (at or after its tail segment).
    ///
    /// Local recovery would not need that window kept: a retired segment's bytes stay
    /// until two commits sealed after its retirement, whose tails both lie past it
    /// (DESIGN.md, "Garbage collection"). A backup that joins does: it takes the newest
    /// commit in full and then the log from that commit's tail on, segment by segment
    /// as the primary lists them, and a retired segment is no longer listed. Its bytes
    /// written after the commit (the link to the next segment among them) never reached
    /// the backup, whose promotion then stopped at the commit's tail and lost every
    /// acknowledged write after it (M10 seed 213, and the pattern of seeds 81 and 102).
    /// The cost: segments written since the last commit wait for the next one (5 s by
    /// default, sooner under load: `commit_dirty_bytes`) before garbage collection may
    /// take them.
    pub fn gc_candidates(&self) -> Vec<(DiskOffset, SegmentStats)> {
        let w = self.writer.lock();
        let (tail, gc_tail) = self.log.tail_segments();
        // Segments a backup has not received entirely are kept until it has.
        let horizon = self.ship_horizon.load(Ordering::Acquire);
        let replay_from = self.replay_from_order.load(Ordering::Acquire);
        w.segments
            .iter()
            .filter(|(off, s)| {
                **off != tail.0
                    && Some(DiskOffset(**off)) != gc_tail
                    && s.order < horizon
                    && (s.order < replay_from || w.is_relocation(s.order))
            })
            .map(|(off, s)| (DiskOffset(*off), *s))
            .collect()
    }

    /// Dead bytes of closed foreground segments that are not GC candidates only because
    /// the last durable commit replays them (`gc_candidates`' replay window): the next
    /// commit makes them victims.
    pub fn dead_bytes_awaiting_commit(&self) -> u64 {
        let w = self.writer.lock();
        let (tail, _) = self.log.tail_segments();
        let replay_from = self.replay_from_order.load(Ordering::Acquire);
        w.segments
            .iter()
            .filter(|(off, s)| {
                **off != tail.0 && s.order >= replay_from && !w.is_relocation(s.order)
            })
            .map(|(_, s)| s.written_bytes.saturating_sub(s.live_bytes))
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
    /// `gc::Collector`, is the only appender of the relocation tail): the lock is held only
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
            next += self
                .log
                .append_copies(&records[next..], &mut copies, &guard)
                .inspect_err(|_| shared.poison())?;
            let mut w = self.lock_warm(copies.iter().map(|c| c.1));
            self.check_usable()?;
            shared.check_writable()?;
            for &(at, key, copy, len) in &copies {
                let swapped = self
                    .tree
                    .replace_ptr(self, key, at, || Ok(copy.0))
                    .inspect_err(|_| shared.poison())?;
                self.log
                    .account_copy(&mut w, DiskOffset(at), copy, len, swapped);
                if swapped {
                    took += len;
                }
            }
            if let Some(&(at, key, value)) = records.get(next) {
                // The next record does not fit: a fresh segment, still under the lock. A
                // failure poisons, as any failed write does (the segment it may have
                // allocated is in no list; a later commit would record it as a leak).
                self.log
                    .next_gc_segment(
                        &mut w,
                        HEADER_BYTES + key.len() + value.len(),
                        DiskOffset(at),
                    )
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
        if self.is_dropped() {
            return Ok(Retire::Gone);
        }
        let Some(seg) = w.segments.get(&base.0).copied() else {
            return Ok(Retire::Gone);
        };
        let (tail, gc_tail) = self.log.tail_segments();
        assert!(tail != base, "garbage collection chose the tail segment");
        assert!(
            gc_tail != Some(base),
            "garbage collection chose its own tail segment"
        );
        if seg.live_bytes != 0 {
            return Ok(Retire::Live);
        }
        if seg.order >= self.ship_horizon.load(Ordering::Acquire) {
            return Ok(Retire::NotShipped);
        }
        if seg.order >= self.replay_from_order.load(Ordering::Acquire)
            && !w.is_relocation(seg.order)
        {
            return Ok(Retire::InReplayWindow);
        }
        let end = base.0 + seg.size_bytes;
        let mut pinned = false;
        self.tree.external_pivots(self, &mut |ptr| {
            pinned |= (base.0..end).contains(&ptr);
        })?;
        if pinned {
            return Ok(Retire::PinnedByPivot);
        }
        self.log.forget_segment(&mut w, base);
        // Before the segment can be freed: scans' reports that may name it are dropped.
        self.scattered_reads.segment_retired();
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

    /// Bytes of the retired segments that wait only for commits (not for a snapshot or
    /// live iterator opened before they were retired).
    pub fn reclaimable_retired_bytes(&self) -> u64 {
        let oldest = self.oldest_snapshot();
        self.retired_segments
            .lock()
            .iter()
            .filter(|r| oldest.is_none_or(|s| s >= r.epoch))
            .map(|r| r.size_bytes)
            .sum()
    }

    /// Retired segments sealed trees up to `upto` no longer reference (for a commit's
    /// free log: allocated in its bitmap, referenced by nothing in it).
    pub(super) fn retired_segment_extents(&self, upto: TreeEpoch) -> Vec<Extent> {
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

    /// Whether the reader grace period of the retired segment at `base` is over.
    #[cfg(test)]
    pub fn retired_readers_gone(&self, base: DiskOffset) -> bool {
        let list = self.retired_segments.lock();
        let r = list.iter().find(|r| r.base == base).expect("retired");
        r.readers_gone.load(Ordering::Acquire)
    }
}
