//! Range iterators over a keyspace or a snapshot, in both directions, with the log
//! records ahead of each end asked for in batches (WiscKey §3.3.3 prefetch) and the
//! cache lines of the next records hinted, since the log is in write order, not key order.
//!
//! Owns: `Range`, the copied leaf each end works in, the prefetch windows, the windows of
//! records hinted to the CPU's cache (`hint_span`), lending pairs in place (`next_with`),
//! the registration that keeps what a reader's log pointers name alive (`SnapshotPin`),
//! and the trail of records a live forward scan read from the device, reported for a
//! rewrite in key order (`Trail`). Does not own: reading a record or a leaf (`Region`),
//! the index walk (`crate::index`), deciding whether a trail is scattered and queuing it
//! (`region/key_order.rs`).
//!
//! Thread-safety: a `Range` is `Send` and used by one thread at a time; it holds log
//! pointers between calls, which its registration (a snapshot's or a live reader's) keeps
//! readable.

use std::ops::Bound;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::index::{LeafCopy, Seek};
use crate::prefetch::ResidencyGate;
use crate::region::{ReaderTicket, Region, ScatteredRead};
use crate::types::DiskOffset;

/// Registration of a reader that holds log pointers between calls: a snapshot (`root` is
/// its sealed root) or a live-tree range (`root` unused). While it lives, log segments and
/// nodes retired after the ticket's epoch are not freed.
pub(crate) struct SnapshotPin {
    pub region: Arc<Region>,
    pub root: u64,
    pub ticket: ReaderTicket,
}

impl Drop for SnapshotPin {
    fn drop(&mut self) {
        self.region.close_snapshot(self.ticket);
    }
}

/// Records of each prefetch batch of a range probed for residency (see
/// `prefetch::ResidencyGate`): a cold scan usually stops at the first, a cached one pays two
/// `mincore` calls per half window.
const RANGE_PREFETCH_PROBES: usize = 2;

/// One side of a range iterator: a copied leaf and the position in it.
#[derive(Default)]
struct Side {
    leaf: LeafCopy,
    /// Next index to look at (front: counts up; back: counts down, exclusive).
    pos: usize,
    started: bool,
    exhausted: bool,
    /// Prefetch window edge in `leaf` (see `Range::prefetch_ahead`): the entries between
    /// `pos` and `fetched` (front: `pos..fetched`; back: `fetched..pos`) were asked for.
    fetched: usize,
    /// The leaf after `leaf` in this side's direction, copied ahead of time when the window
    /// reaches past the end of `leaf` (`next_ready`); taken instead of copying it again.
    next: LeafCopy,
    next_ready: bool,
    /// The key a cut `leaf` was copied from: the seek after it must be from a later key.
    cut_from: Vec<u8>,
    /// Entries of `next` asked for, counted from the end this side enters it by.
    next_fetched: usize,
    /// Edge of the records whose cache lines were asked for (see `Range::hint_ahead`):
    /// front `pos..hinted`, back `hinted..pos`.
    hinted: usize,
    /// Entries of `next` whose cache lines were asked for, counted like `next_fetched`.
    next_hinted: usize,
}

impl Side {
    /// Entries asked for and not yet read, in this leaf and the next one copied ahead.
    fn asked_ahead(&self, forward: bool) -> usize {
        let in_leaf = if forward {
            self.fetched.saturating_sub(self.pos)
        } else {
            self.pos.saturating_sub(self.fetched)
        };
        in_leaf
            + if self.next_ready {
                self.next_fetched
            } else {
                0
            }
    }

    /// Copies the next leaf into `next` early (`Range::prefetch_ahead`) by the seeks that
    /// move a side on; not past the bounds, nor after a cut copy (its leaf goes on).
    fn copy_next(
        &mut self,
        region: &Region,
        root: Option<u64>,
        forward: bool,
        (lo, hi): (&Bound<Vec<u8>>, &Bound<Vec<u8>>),
        left: Option<usize>,
    ) {
        if self.leaf.cut {
            return;
        }
        let copied = if forward {
            match &self.leaf.high {
                Some(high) if below_hi(high, hi) => {
                    region.copy_leaf_from(root, high, copy_cap(left), &mut self.next)
                }
                _ => return,
            }
        } else {
            match &self.leaf.low {
                Some(low) if above_lo(low, lo) => {
                    region.copy_leaf(root, Seek::Before(low), &mut self.next)
                }
                _ => return,
            }
        };
        self.next_ready = copied.is_ok();
        self.next_fetched = 0;
        self.next_hinted = 0;
    }

    /// A side that has not started, reusing the buffers of two leaf copies.
    fn with_buffers(leaf: LeafCopy, next: LeafCopy) -> Side {
        Side {
            leaf,
            next,
            ..Side::default()
        }
    }

    /// Makes the leaf `seek` lands on current: the one copied ahead for the fence seek
    /// that moves this side on, else a fresh copy (forward: `max_entries` from the key).
    fn load_leaf(
        &mut self,
        region: &Region,
        root: Option<u64>,
        seek: Seek<'_>,
        forward: bool,
        max_entries: usize,
    ) -> Result<()> {
        if self.next_ready {
            std::mem::swap(&mut self.leaf, &mut self.next);
            self.next_ready = false;
            let len = self.leaf.ptrs.len();
            let fetched = self.next_fetched.min(len);
            let hinted = self.next_hinted.min(len);
            (self.fetched, self.hinted) = if forward {
                (fetched, hinted)
            } else {
                (len - fetched, len - hinted)
            };
        } else {
            match seek {
                // Forward: from the bound or fence on, no further than the limit takes it.
                Seek::AtOrAfter(key) if forward => {
                    region.copy_leaf_from(root, key, max_entries, &mut self.leaf)?
                }
                _ => region.copy_leaf(root, seek, &mut self.leaf)?,
            }
            let edge = if forward { 0 } else { self.leaf.ptrs.len() };
            (self.fetched, self.hinted) = (edge, edge);
        }
        self.next_fetched = 0;
        self.next_hinted = 0;
        Ok(())
    }
}

/// The buffers a range allocates as it goes (four leaf copies, the prefetch batch),
/// handed from a dropped range to the next one its thread makes. A seek and a few nexts
/// otherwise allocated them afresh each time, and with two threads seeking, glibc's
/// allocator fell back on an arena lock the threads shared: 40% of `seekrandom`'s CPU at
/// two threads went to malloc and free and their futex waits (session 20's profile).
#[derive(Default)]
struct Buffers {
    leaves: [LeafCopy; 4],
    batch: Vec<u64>,
}

/// Leaf copies grow to the leaves they held; one much bigger than a leaf's entries (a
/// bulk of pointers no leaf has) is not kept.
const SPARE_ENTRIES_MAX: usize = 4096;

thread_local! {
    /// The buffers of the last range this thread dropped (see `Buffers`).
    static SPARE: std::cell::Cell<Option<Buffers>> = const { std::cell::Cell::new(None) };
}

impl Drop for Range {
    fn drop(&mut self) {
        if let Some(trail) = self.trail.take() {
            self.region.report_scattered_read(trail);
        }
        if let Some(ticket) = self.live_ticket.take() {
            self.region.close_snapshot(ticket);
        }
        let mut leaves = [
            std::mem::take(&mut self.front.leaf),
            std::mem::take(&mut self.front.next),
            std::mem::take(&mut self.back.leaf),
            std::mem::take(&mut self.back.next),
        ];
        if leaves.iter().any(|l| l.ptrs.capacity() > SPARE_ENTRIES_MAX) {
            return;
        }
        for leaf in &mut leaves {
            leaf.clear();
        }
        let mut batch = std::mem::take(&mut self.prefetch_batch);
        batch.clear();
        let spare = Buffers { leaves, batch };
        // Gone while the thread exits: the buffers are freed instead.
        let _ = SPARE.try_with(|slot| slot.set(Some(spare)));
    }
}

/// Makes `bound` exclude exactly `key`, reusing its buffer: a range moves a bound past
/// every item it returns, and a fresh `Vec` per item was a measurable part of a scan.
fn exclude_up_to(bound: &mut Bound<Vec<u8>>, key: &[u8]) {
    match bound {
        Bound::Excluded(buf) => {
            buf.clear();
            buf.extend_from_slice(key);
        }
        other => *other = Bound::Excluded(key.to_vec()),
    }
}

/// The first batch of records a range asks the CPU for (the first items after a seek):
/// a seek that reads one item pays what it did when only these were hinted.
const HINT_FIRST_ITEMS: usize = 4;

/// Most items a side keeps asked for ahead of the one it reads: the hint window doubles
/// from `HINT_FIRST_ITEMS` at each top-up up to this. Enough that the hints of one
/// top-up (half of it) overlap their page walks and misses; few enough that the lines
/// are still in cache when their item comes. Measured 4, 8, 16 and 32 (DESIGN.md,
/// *Hint windows*): 16 and 32 cost more than they saved.
const HINT_AHEAD_MAX_ITEMS: usize = 8;

/// What a side asks the CPU for next (`Range::hint_ahead`), or `None` while more than
/// half of `window` is asked for already. A side at `pos` in a leaf of `len` entries,
/// whose records `pos..hinted` (forward) or `hinted..pos` (backward) and the first
/// `hinted_beyond` of the next leaf (counted from the end it is entered by) were asked
/// for, tops up to `window` items ahead: returns the entries of this leaf to ask for,
/// and how many of the next leaf should be asked for in all (entries `hinted_beyond..`
/// that, when the next leaf is known).
fn hint_span(
    forward: bool,
    pos: usize,
    hinted: usize,
    len: usize,
    window: usize,
    hinted_beyond: usize,
) -> Option<(std::ops::Range<usize>, usize)> {
    let pos = pos.min(len);
    let (ahead, within, beyond) = if forward {
        let ahead = hinted.saturating_sub(pos) + hinted_beyond;
        let from = hinted.clamp(pos, len);
        let to = (pos + window).min(len);
        (
            ahead,
            from..to.max(from),
            (pos + window).saturating_sub(len),
        )
    } else {
        let ahead = pos.saturating_sub(hinted) + hinted_beyond;
        let to = hinted.min(pos);
        let from = pos.saturating_sub(window).min(to);
        (ahead, from..to, window.saturating_sub(pos))
    };
    if ahead > window / 2 || (within.is_empty() && beyond <= hinted_beyond) {
        return None;
    }
    Some((within, beyond))
}

/// The first prefetch window of a range (see `Range::prefetch_window`).
const PREFETCH_FIRST_ENTRIES: usize = 8;

/// Where a forward prefetch window in `leaf` stops: one past the first entry certainly
/// above `hi` (its key prefix is greater than the bound's), which the iterator still
/// reads to find that the range ended. Prefixes only, no key read; entries whose prefix
/// equals the bound's may be prefetched needlessly.
fn prefetch_end_within_hi(leaf: &LeafCopy, hi: &Bound<Vec<u8>>) -> usize {
    match hi {
        Bound::Included(k) | Bound::Excluded(k) if leaf.prefixes.len() == leaf.ptrs.len() => {
            (leaf.tie_span(k).end + 1).min(leaf.ptrs.len())
        }
        _ => leaf.ptrs.len(),
    }
}

/// Where a backward prefetch window in `leaf` stops: at the last entry certainly below
/// `lo`, which the iterator reads to find that the range ended.
fn prefetch_start_within_lo(leaf: &LeafCopy, lo: &Bound<Vec<u8>>) -> usize {
    match lo {
        Bound::Included(k) | Bound::Excluded(k) if leaf.prefixes.len() == leaf.ptrs.len() => {
            leaf.tie_span(k).start.saturating_sub(1)
        }
        _ => 0,
    }
}

/// An iterator over `(key, value)` pairs of a range, both directions.
///
/// A range over the live keyspace keeps the log segments garbage collection empties after
/// its creation from being freed until it is dropped (like a snapshot does): drop
/// iterators you are done with.
pub struct Range {
    region: Arc<Region>,
    root: Option<u64>,
    /// Keeps what a snapshot range's log pointers name alive (see `SnapshotPin`).
    pub(crate) pin: Option<Arc<SnapshotPin>>,
    /// A live range's registration (`Region::register_live_reader`), closed on drop: the
    /// same as a `SnapshotPin`'s, without its allocation.
    live_ticket: Option<ReaderTicket>,
    /// Remaining bounds: shrink as items are returned from either end.
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    front: Side,
    back: Side,
    done: bool,
    /// `Options::scan_prefetch_entries`: the prefetch window of each end (0: off).
    prefetch_entries: usize,
    /// The window now: starts at `PREFETCH_FIRST_ENTRIES` and doubles with every batch up
    /// to `prefetch_entries`, so a short scan (YCSB E's, a seek and a few nexts) neither
    /// asks for records it will not read nor copies the next leaf ahead of time.
    prefetch_window: usize,
    /// Windows asked for so far (both ends).
    prefetch_batches: u32,
    /// Log pointers of one prefetch request being gathered; reused.
    prefetch_batch: Vec<u64>,
    /// Stops the prefetching of a range whose records are found in memory.
    prefetch_gate: ResidencyGate,
    /// Items each side keeps asked for in the CPU's cache (`hint_ahead`): starts at
    /// `HINT_FIRST_ITEMS`, doubles at each top-up up to `HINT_AHEAD_MAX_ITEMS`.
    hint_window: usize,
    /// Applying the region's deferred puts failed when the range began: returned by the
    /// first call, which ends the range (the live tree may lack acknowledged writes).
    failed: Option<Error>,
    /// The records the front returned since its prefetch probes first found the device
    /// read from, in key order, for `Region::report_scattered_read` (read-guided
    /// reorganisation); `None` for a range that does not report (snapshot ranges,
    /// `Options::reorganise_scanned` off). Started before the range's first leaf copy.
    trail: Option<ScatteredRead>,
    /// Items the caller may still take (`Range::limit`); `None`: no limit.
    left: Option<usize>,
}

/// What a range reports when the fences its path gave a leaf are impossible: the leaf it
/// moved to does not lie beyond the one before, or holds a key outside them. Only a
/// damaged index (pivots out of order) does that; going on would loop or skip keys.
/// A forward leaf copy's cap for `left` more items (+1: a bound may exclude its key).
fn copy_cap(left: Option<usize>) -> usize {
    left.map_or(usize::MAX, |l| l.saturating_add(1))
}

fn fences_broken() -> Error {
    Error::corruption(
        "index",
        DiskOffset::NONE,
        "leaf fences out of order (damaged pivots)",
    )
}

fn above_lo(key: &[u8], lo: &Bound<Vec<u8>>) -> bool {
    match lo {
        Bound::Included(l) => key >= l.as_slice(),
        Bound::Excluded(l) => key > l.as_slice(),
        Bound::Unbounded => true,
    }
}

fn below_hi(key: &[u8], hi: &Bound<Vec<u8>>) -> bool {
    match hi {
        Bound::Included(h) => key <= h.as_slice(),
        Bound::Excluded(h) => key < h.as_slice(),
        Bound::Unbounded => true,
    }
}

impl Range {
    pub(crate) fn new(
        region: Arc<Region>,
        root: Option<u64>,
        (lo, hi): (Bound<Vec<u8>>, Bound<Vec<u8>>),
    ) -> Range {
        let empty = match (&lo, &hi) {
            (Bound::Included(l), Bound::Included(h)) => l > h,
            (Bound::Included(l), Bound::Excluded(h))
            | (Bound::Excluded(l), Bound::Included(h))
            | (Bound::Excluded(l), Bound::Excluded(h)) => l >= h,
            _ => false,
        };
        // A live range reads the tree, so deferred puts go into it first
        // (`region/deferred.rs`).
        let failed = match root {
            None => region.apply_deferred(true).err(),
            Some(_) => None,
        };
        // A live range copies log pointers out of leaves and reads the records later,
        // without an epoch guard in between: register it like a snapshot.
        let live_ticket = root.is_none().then(|| region.register_live_reader());
        let trail = (root.is_none() && region.shared().options.reorganise_scanned)
            .then(|| ScatteredRead::new(region.segments_retired()));
        let prefetch_entries = region.shared().options.scan_prefetch_entries;
        let prefetch_gate = ResidencyGate::with_streak(region.prefetch_streak());
        let spare = SPARE
            .try_with(|spare| spare.take())
            .ok()
            .flatten()
            .unwrap_or_default();
        let Buffers {
            leaves: [front_leaf, front_next, back_leaf, back_next],
            batch,
        } = spare;
        Range {
            region,
            root,
            pin: None,
            live_ticket,
            lo,
            hi,
            front: Side::with_buffers(front_leaf, front_next),
            back: Side::with_buffers(back_leaf, back_next),
            done: empty,
            prefetch_entries,
            prefetch_window: prefetch_entries.min(PREFETCH_FIRST_ENTRIES),
            prefetch_batches: 0,
            prefetch_batch: batch,
            prefetch_gate,
            hint_window: HINT_FIRST_ITEMS,
            failed,
            trail,
            left: None,
        }
    }

    /// Keeps the cache lines of the next `hint_window` records of one end asked for
    /// (`prefetch::cache_lines` through `Region::hint_records`): once half the window was
    /// read, asks for the rest in one go, into the next leaf when it was copied ahead
    /// (`prefetch_ahead`). The records are in write order, one cache miss and one page
    /// walk each; asked for together, the misses and walks overlap.
    fn hint_ahead(&mut self, forward: bool) {
        let Range {
            region,
            front,
            back,
            hint_window,
            ..
        } = self;
        let side = if forward { front } else { back };
        let hinted_beyond = if side.next_ready { side.next_hinted } else { 0 };
        let Some((within, beyond)) = hint_span(
            forward,
            side.pos,
            side.hinted,
            side.leaf.ptrs.len(),
            *hint_window,
            hinted_beyond,
        ) else {
            return;
        };
        region.hint_records(&side.leaf.ptrs[within.clone()]);
        side.hinted = if forward { within.end } else { within.start };
        if side.next_ready && beyond > hinted_beyond {
            let next = &side.next.ptrs;
            let (done, want) = (hinted_beyond.min(next.len()), beyond.min(next.len()));
            let entries = if forward {
                &next[done..want]
            } else {
                &next[next.len() - want..next.len() - done]
            };
            region.hint_records(entries);
            side.next_hinted = want;
        }
        *hint_window = (*hint_window * 2).min(HINT_AHEAD_MAX_ITEMS);
    }

    /// Index of the first entry of the front leaf that is not below `lo`.
    fn first_not_below_lo(&self) -> Result<usize> {
        match &self.lo {
            Bound::Unbounded => Ok(0),
            Bound::Included(k) => self.partition(&self.front.leaf, k, |key, k| key < k),
            Bound::Excluded(k) => self.partition(&self.front.leaf, k, |key, k| key <= k),
        }
    }

    /// One past the last entry of the back leaf that is not above `hi`.
    fn end_not_above_hi(&self) -> Result<usize> {
        match &self.hi {
            Bound::Unbounded => Ok(self.back.leaf.ptrs.len()),
            Bound::Included(k) => self.partition(&self.back.leaf, k, |key, k| key <= k),
            Bound::Excluded(k) => self.partition(&self.back.leaf, k, |key, k| key < k),
        }
    }

    /// The first entry of `leaf` whose key fails `before(key, bound)`, for a predicate
    /// true on a prefix of the (sorted) entries and settled by the prefix wherever the
    /// entry's prefix differs from the bound's: a binary search on prefixes, then on keys
    /// (read from the log) only among prefixes equal to the bound's.
    fn partition(
        &self,
        leaf: &LeafCopy,
        bound: &[u8],
        before: impl Fn(&[u8], &[u8]) -> bool,
    ) -> Result<usize> {
        let std::ops::Range {
            start: mut lo,
            end: mut hi,
        } = leaf.tie_span(bound);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self
                .region
                .with_record(leaf.ptrs[mid], false, |r| before(r.key, bound))?
            {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// Keeps the records of the next `prefetch_entries` entries of one end (in iteration
    /// order) asked for: once half the window was consumed, tops it up to full in one
    /// request, reaching into the next leaf (copied ahead for it) when this one ends inside
    /// the window and the range goes on. Stops at entries certainly out of the range. A
    /// hint only: a failure to copy the next leaf ahead is not reported here (the move to
    /// that leaf copies it again and reports it).
    fn prefetch_ahead(&mut self, forward: bool) {
        let Range {
            region,
            root,
            lo,
            hi,
            front,
            back,
            prefetch_entries,
            prefetch_window,
            prefetch_batches,
            prefetch_batch: batch,
            prefetch_gate: gate,
            left,
            ..
        } = self;
        let mut n = *prefetch_window;
        if n == 0 {
            return;
        }
        // A caller that said how many items it takes needs no doubling to find out: the
        // window covers them all at once (up to `prefetch_entries`), so a short cold scan
        // waits for one round of reads, with all of them in flight, not four.
        if let Some(left) = *left {
            n = n.max(left.min(*prefetch_entries));
        }
        let side = if forward { front } else { back };
        let len = side.leaf.ptrs.len();
        let ahead = side.asked_ahead(forward);
        if ahead > n / 2 {
            return;
        }
        // Half the window was read: the scan goes on, so the window grows (not at the
        // first batch, which is all a short scan needs).
        if *prefetch_batches > 0 {
            n = (n * 2).min(*prefetch_entries);
            *prefetch_window = n;
        }
        *prefetch_batches += 1;
        let full_window = n == *prefetch_entries;
        // No record past the last item the caller will take.
        let mut want = match left {
            Some(left) => (n - ahead).min(left.saturating_sub(ahead)),
            None => n - ahead,
        };
        if want == 0 {
            return;
        }
        batch.clear();
        let leaf_done = if forward {
            let from = side.fetched.max(side.pos);
            let to = prefetch_end_within_hi(&side.leaf, hi)
                .min(from + want)
                .max(from);
            batch.extend_from_slice(&side.leaf.ptrs[from..to]);
            want -= to - from;
            side.fetched = to;
            to == len
        } else {
            let to = side.fetched.min(side.pos);
            let from = to
                .saturating_sub(want)
                .max(prefetch_start_within_lo(&side.leaf, lo))
                .min(to);
            batch.extend_from_slice(&side.leaf.ptrs[from..to]);
            want -= to - from;
            side.fetched = from;
            from == 0
        };
        // The next leaf is copied early only once the scan has shown it is a long one, or
        // its caller said it takes items past this leaf.
        let long = full_window || side.next_ready || left.is_some();
        if want > 0 && leaf_done && !side.exhausted && long {
            if !side.next_ready {
                side.copy_next(region, *root, forward, (lo, hi), *left);
            }
            if side.next_ready {
                let next = &side.next;
                let len = next.ptrs.len();
                if forward {
                    let from = side.next_fetched;
                    let to = prefetch_end_within_hi(next, hi).min(from + want).max(from);
                    batch.extend_from_slice(&next.ptrs[from..to]);
                    side.next_fetched = to;
                } else {
                    let to = len - side.next_fetched;
                    let from = to
                        .saturating_sub(want)
                        .max(prefetch_start_within_lo(next, lo))
                        .min(to);
                    batch.extend_from_slice(&next.ptrs[from..to]);
                    side.next_fetched = len - from;
                }
            }
        }
        if !batch.is_empty() {
            region.prefetch_records(batch, gate, RANGE_PREFETCH_PROBES);
        }
    }

    /// Reports the trail once it is full and starts another.
    fn report_full_trail(&mut self) {
        if let Some(trail) = &mut self.trail {
            if trail.is_full() {
                let fresh = ScatteredRead::new(trail.retired_before());
                let full = std::mem::replace(trail, fresh);
                self.region.report_scattered_read(full);
            }
        }
    }

    fn next_front<R>(&mut self, f: impl FnOnce(&[u8], &[u8]) -> R) -> Result<Option<R>> {
        let mut f = Some(f);
        loop {
            if self.front.started && self.front.pos < self.front.leaf.ptrs.len() {
                self.prefetch_ahead(true);
                self.hint_ahead(true);
                let ptr = self.front.leaf.ptrs[self.front.pos];
                self.front.pos += 1;
                let Range {
                    region,
                    front,
                    lo,
                    hi,
                    trail,
                    prefetch_gate,
                    ..
                } = self;
                // Once the range has read from the device, what it returns joins the trail.
                let trail = trail.as_mut().filter(|_| prefetch_gate.missed());
                let step = region.with_record(ptr, true, |r| {
                    if !front.leaf.holds(r.key) {
                        return Err(fences_broken());
                    }
                    if !above_lo(r.key, lo) {
                        return Ok(None);
                    }
                    if !below_hi(r.key, hi) {
                        return Ok(Some(None));
                    }
                    exclude_up_to(lo, r.key);
                    if let Some(trail) = trail {
                        trail.push(ptr, r.key, r.value);
                    }
                    let f = f.take().expect("an item is lent once");
                    Ok(Some(Some(f(r.key, r.value))))
                })??;
                match step {
                    // Below the bound (the bound's own key, excluded): the next entry.
                    None => continue,
                    Some(item) => {
                        self.report_full_trail();
                        return Ok(item);
                    }
                }
            }
            if self.front.exhausted {
                return Ok(None);
            }
            // Load the next leaf: the one holding the lower bound, then by fences.
            let seek_key = if self.front.started && self.front.leaf.cut {
                // The rest of a cut copy's leaf, from the last key read (the bound moved
                // there: the copy held a key above its seek's, unless the index is damaged).
                match &self.lo {
                    Bound::Included(k) | Bound::Excluded(k) if *k > self.front.cut_from => {
                        Some(k.clone())
                    }
                    _ => return Err(fences_broken()),
                }
            } else if self.front.started {
                // Keys of the next leaf are >= this leaf's upper fence.
                match self.front.leaf.high.take() {
                    Some(high) if below_hi(&high, &self.hi) => Some(high),
                    _ => {
                        self.front.exhausted = true;
                        return Ok(None);
                    }
                }
            } else {
                match &self.lo {
                    Bound::Included(k) | Bound::Excluded(k) => Some(k.clone()),
                    Bound::Unbounded => None,
                }
            };
            let seek = match &seek_key {
                Some(k) => Seek::AtOrAfter(k),
                None => Seek::First,
            };
            self.front
                .load_leaf(&self.region, self.root, seek, true, copy_cap(self.left))?;
            // The leaf holding `k` ends after `k`: a damaged index whose fences do not
            // advance would otherwise send this loop round the same leaves for ever.
            if let (Some(k), Some(high)) = (&seek_key, &self.front.leaf.high) {
                if high <= k {
                    return Err(fences_broken());
                }
            }
            if let (Some(k), true) = (&seek_key, self.front.leaf.cut) {
                self.front.cut_from.clear();
                self.front.cut_from.extend_from_slice(k);
            }
            self.front.started = true;
            // The first records are asked for before the bound's own record is read to
            // place the side (when its prefix ties), so that read's miss overlaps theirs.
            self.front.pos = match &self.lo {
                Bound::Included(k) | Bound::Excluded(k) => self.front.leaf.tie_span(k).start,
                Bound::Unbounded => 0,
            };
            self.hint_ahead(true);
            self.front.pos = self.first_not_below_lo()?;
        }
    }

    fn next_back_inner<R>(&mut self, f: impl FnOnce(&[u8], &[u8]) -> R) -> Result<Option<R>> {
        let mut f = Some(f);
        loop {
            if self.back.started && self.back.pos > 0 {
                self.prefetch_ahead(false);
                self.hint_ahead(false);
                self.back.pos -= 1;
                let ptr = self.back.leaf.ptrs[self.back.pos];
                let Range {
                    region,
                    back,
                    lo,
                    hi,
                    ..
                } = self;
                let step = region.with_record(ptr, true, |r| {
                    if !back.leaf.holds(r.key) {
                        return Err(fences_broken());
                    }
                    if !below_hi(r.key, hi) {
                        return Ok(None);
                    }
                    if !above_lo(r.key, lo) {
                        return Ok(Some(None));
                    }
                    exclude_up_to(hi, r.key);
                    let f = f.take().expect("an item is lent once");
                    Ok(Some(Some(f(r.key, r.value))))
                })??;
                match step {
                    None => continue,
                    Some(item) => return Ok(item),
                }
            }
            if self.back.exhausted {
                return Ok(None);
            }
            let seek_key = if self.back.started {
                // Keys of the previous leaf are < this leaf's lower fence.
                match self.back.leaf.low.take() {
                    Some(low) if above_lo(&low, &self.lo) => Some((low, false)),
                    _ => {
                        self.back.exhausted = true;
                        return Ok(None);
                    }
                }
            } else {
                match &self.hi {
                    Bound::Included(k) => Some((k.clone(), true)),
                    Bound::Excluded(k) => Some((k.clone(), false)),
                    Bound::Unbounded => None,
                }
            };
            let seek = match &seek_key {
                Some((k, true)) => Seek::AtOrAfter(k),
                Some((k, false)) => Seek::Before(k),
                None => Seek::Last,
            };
            self.back
                .load_leaf(&self.region, self.root, seek, false, usize::MAX)?;
            // The leaf holding `k` starts at or before it, the leaf before `k` before it
            // (see `next_front`).
            if let (Some((k, at_or_after)), Some(low)) = (&seek_key, &self.back.leaf.low) {
                if low > k || (!at_or_after && low == k) {
                    return Err(fences_broken());
                }
            }
            self.back.started = true;
            // As in `next_front`: hinted before the bound's record is read.
            self.back.pos = match &self.hi {
                Bound::Included(k) | Bound::Excluded(k) => self.back.leaf.tie_span(k).end,
                Bound::Unbounded => self.back.leaf.ptrs.len(),
            };
            self.hint_ahead(false);
            self.back.pos = self.end_not_above_hi()?;
        }
    }
}

impl Range {
    /// Ends the range after `items` more pairs (from either end, together), and tells
    /// prefetching so: a window never asks for a record past the last of them. A caller
    /// that knows how many it will take (YCSB's scan, `SCAN … COUNT`, `LRANGE`) saves the
    /// device the reads of a window's overshoot (up to 64 records; a short cold scan asked
    /// for about 1.8 times the records it read without it). `Iterator::take` ends the
    /// iteration too but cannot tell the prefetch.
    pub fn limit(mut self, items: usize) -> Range {
        self.left = Some(items);
        self.done |= items == 0;
        self
    }

    /// The next pair from the front, lent to `f` rather than copied into two vectors (what
    /// `Iterator::next` does): `f` sees the record's bytes in place, inside the read's
    /// epoch pin, so keep it short. `None` once the range is done.
    pub fn next_with<R>(&mut self, f: impl FnOnce(&[u8], &[u8]) -> R) -> Option<Result<R>> {
        if let Some(e) = self.failed.take() {
            self.done = true;
            return Some(Err(e));
        }
        if self.done {
            return None;
        }
        let step = self.next_front(f);
        self.finish(step)
    }

    /// `next_with` from the back.
    pub fn next_back_with<R>(&mut self, f: impl FnOnce(&[u8], &[u8]) -> R) -> Option<Result<R>> {
        if let Some(e) = self.failed.take() {
            self.done = true;
            return Some(Err(e));
        }
        if self.done {
            return None;
        }
        let step = self.next_back_inner(f);
        self.finish(step)
    }

    /// An end's step as an iterator's item: the range is done at its end or an error.
    fn finish<R>(&mut self, step: Result<Option<R>>) -> Option<Result<R>> {
        match step {
            Ok(Some(item)) => {
                if let Some(left) = &mut self.left {
                    *left -= 1;
                    self.done |= *left == 0;
                }
                Some(Ok(item))
            }
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl Iterator for Range {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_with(|key, value| (key.to_vec(), value.to_vec()))
    }
}

impl DoubleEndedIterator for Range {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.next_back_with(|key, value| (key.to_vec(), value.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::hint_span;

    #[test]
    fn the_hint_window_tops_up_at_half_and_stops_at_the_leaf_end_forward() {
        // Nothing asked for yet at 10 of 100: the whole window.
        assert_eq!(hint_span(true, 10, 10, 100, 8, 0), Some((10..18, 0)));
        // More than half of it still ahead: nothing.
        assert_eq!(hint_span(true, 13, 18, 100, 8, 0), None);
        // Half read: top up to a full window from the hinted edge.
        assert_eq!(hint_span(true, 14, 18, 100, 8, 0), Some((18..22, 0)));
        // Near the end: up to the end, the rest counted against the next leaf.
        assert_eq!(hint_span(true, 96, 98, 100, 8, 0), Some((98..100, 4)));
        // All of this leaf asked for, and enough of the next: nothing.
        assert_eq!(hint_span(true, 99, 100, 100, 8, 4), None);
        // At the end with nothing of the next leaf asked for.
        assert_eq!(hint_span(true, 100, 100, 100, 8, 0), Some((100..100, 8)));
        // A hinted edge behind the position (items skipped) counts as nothing ahead.
        assert_eq!(hint_span(true, 30, 20, 100, 8, 0), Some((30..38, 0)));
        // An empty leaf.
        assert_eq!(hint_span(true, 0, 0, 0, 4, 0), Some((0..0, 4)));
        // A position past the leaf (a damaged count) never slices out of it.
        assert_eq!(hint_span(true, 7, 0, 5, 4, 0), Some((5..5, 4)));
    }

    #[test]
    fn the_hint_window_runs_backward_from_the_position() {
        // Back side at 50 (the next item is 49), nothing asked for.
        assert_eq!(hint_span(false, 50, 50, 100, 8, 0), Some((42..50, 0)));
        assert_eq!(hint_span(false, 47, 42, 100, 8, 0), None);
        assert_eq!(hint_span(false, 46, 42, 100, 8, 0), Some((38..42, 0)));
        // Near the start: down to 0, the rest from the end of the previous leaf.
        assert_eq!(hint_span(false, 3, 3, 100, 8, 0), Some((0..3, 5)));
        assert_eq!(hint_span(false, 2, 0, 100, 8, 5), None);
        assert_eq!(hint_span(false, 0, 0, 100, 8, 2), Some((0..0, 8)));
        // Items skipped past the hinted edge.
        assert_eq!(hint_span(false, 10, 20, 100, 4, 0), Some((6..10, 0)));
    }
}
