//! Garbage collection of the key-value log (WiscKey §3.3, adapted to per-region logs and
//! a durable index; DESIGN.md "Garbage collection" has the rules and the crash analysis).
//!
//! Owns: choosing victim segments from the exact per-segment live counts, driving their
//! relocation in small chunks, the background policy (space-amplification target, rate
//! limit) and the forced full pass behind `Database::gc`.
//!
//! Does not own: the relocation and retirement primitives (`Region::relocate`,
//! `Region::retire_segment`, under the region's writer lock), and freeing: a retired
//! segment is reclaimed by the commit that makes it unreachable from both durable commits
//! and every snapshot (`Region::reclaim_segments`), goes through the crossbeam grace
//! period like a node, and is punched when the next commit hands it to the allocator.
//!
//! Thread-safety: one pass at a time (`DbInner::gc`'s mutex); a pass holds a region's
//! writer lock only for a chunk of `RELOCATE_CHUNK_RECORDS` records, so foreground writers
//! wait little. Readers are never blocked.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::db::DbInner;
use crate::error::{Error, Result};
use crate::log::record::{self, Header, RecordRef, HEADER_BYTES};
use crate::log::SegmentStats;
use crate::region::{Region, Retire};
use crate::types::{DiskOffset, RegionId};

/// Records relocated per writer-lock hold.
const RELOCATE_CHUNK_RECORDS: usize = 64;

/// A forced pass collects every eligible segment at most this full (live / size): more
/// would copy nearly a whole segment to win a few bytes.
const FORCED_MAX_LIVE_RATIO: f64 = 0.875;

/// The rate limiter lets this many seconds of budget pile up while there is nothing to do.
const BURST_SECONDS: f64 = 0.5;

/// Times a forced pass nudges crossbeam-epoch to run deferred releases before it commits
/// them; readers pinned elsewhere may delay them, and then a later commit frees them.
const GRACE_ATTEMPTS: usize = 64;

/// Blocks of frees in flight that make an otherwise idle store commit to give them back
/// (64 KiB: more than the descriptors every commit frees, a commit costs two fsyncs).
const IDLE_COMMIT_MIN_FREE_BLOCKS: u64 = 16;

/// State of the collector, under `DbInner::gc`.
pub(crate) struct GcState {
    /// Relocation budget of the background collector, bytes.
    tokens_bytes: f64,
    last_refill: Instant,
    /// Segments emptied but kept because an external pivot reads from them; skipped until
    /// the next forced pass (a later split may have moved the pivot).
    pinned: HashSet<(RegionId, u64)>,
}

impl GcState {
    pub fn new() -> GcState {
        GcState {
            tokens_bytes: 0.0,
            last_refill: Instant::now(),
            pinned: HashSet::new(),
        }
    }
}

/// How a pass picks its victims.
#[derive(Clone, Copy, Debug)]
enum Policy {
    /// Collect while the region's log is larger than `target` × its live bytes, taking
    /// segments at most `max_live_ratio` full, least full first.
    Background { target: f64, max_live_ratio: f64 },
    /// Collect every eligible segment at most `FORCED_MAX_LIVE_RATIO` full.
    Forced,
}

/// The segments of `region` to collect now, least full first.
fn victims(
    region: &Region,
    policy: Policy,
    pinned: &HashSet<(RegionId, u64)>,
) -> Vec<(DiskOffset, SegmentStats)> {
    let max_live_ratio = match policy {
        Policy::Background { max_live_ratio, .. } => max_live_ratio,
        Policy::Forced => FORCED_MAX_LIVE_RATIO,
    };
    let mut out: Vec<(DiskOffset, SegmentStats)> = region
        .gc_candidates()
        .into_iter()
        .filter(|(off, s)| {
            !pinned.contains(&(region.id, off.0))
                && (s.live_bytes as f64) <= max_live_ratio * s.size_bytes as f64
        })
        .collect();
    // Least live first: the most space back for the least copying.
    out.sort_by(|a, b| {
        let ra = a.1.live_bytes as f64 / a.1.size_bytes as f64;
        let rb = b.1.live_bytes as f64 / b.1.size_bytes as f64;
        ra.total_cmp(&rb).then(a.0.cmp(&b.0))
    });
    out
}

/// Space amplification of a region's log: segment bytes over live bytes.
fn space_amp(region: &Region) -> f64 {
    let live = region.live_bytes.load(Ordering::Relaxed);
    let size = region.log_size_bytes();
    if live == 0 {
        return if size == 0 { 1.0 } else { f64::INFINITY };
    }
    size as f64 / live as f64
}

/// What collecting one victim came to.
enum Collected {
    /// Retired: it will be freed once unreachable.
    Retired,
    /// Budget ran out part way; what was relocated stays relocated.
    OutOfBudget,
    /// Emptied but kept (an external pivot reads it), or gone (region dropped).
    Kept,
}

/// Relocates the live records of `victim` and retires it. `budget_bytes` is decreased by
/// what is appended; the victim is left part way when it runs out.
fn collect_segment(
    db: &DbInner,
    region: &Region,
    victim: DiskOffset,
    stats: SegmentStats,
    budget_bytes: &mut f64,
    pinned: &mut HashSet<(RegionId, u64)>,
) -> Result<Collected> {
    if stats.live_bytes > 0 {
        // The victim is closed and flushed, and only this pass retires it: its bytes up to
        // `written` are immutable while we read them.
        let mut buf = vec![0u8; stats.written_bytes as usize];
        db.shared.volume.storage().read_at(victim.0, &mut buf)?;
        let puts = parse_puts(region, victim, &buf)?;
        for chunk in puts.chunks(RELOCATE_CHUNK_RECORDS) {
            if *budget_bytes <= 0.0 {
                return Ok(Collected::OutOfBudget);
            }
            let records: Vec<(u64, &[u8], &[u8])> = chunk
                .iter()
                .map(|p| (p.at, &buf[p.key.clone()], &buf[p.value.clone()]))
                .collect();
            let appended = match region.relocate(&records) {
                Ok(n) => n,
                // Dropped meanwhile: its segments go with it.
                Err(Error::KeyspaceNotFound(_)) => return Ok(Collected::Kept),
                Err(e) => return Err(e),
            };
            *budget_bytes -= appended as f64;
            db.shared
                .gc_relocated_bytes
                .fetch_add(appended, Ordering::Relaxed);
        }
    }
    match region.retire_segment(victim)? {
        Retire::Retired(_) => Ok(Collected::Retired),
        Retire::PinnedByPivot => {
            pinned.insert((region.id, victim.0));
            Ok(Collected::Kept)
        }
        Retire::Gone => Ok(Collected::Kept),
        Retire::Live => Err(Error::corruption(
            "log segment",
            victim,
            "live bytes remain after every record the index points at was relocated",
        )),
    }
}

/// A put record found in a victim: its offset and where its key and value lie in the
/// buffer holding the segment.
struct PutAt {
    at: u64,
    key: std::ops::Range<usize>,
    value: std::ops::Range<usize>,
}

/// The put records of a segment's first `buf.len()` bytes, verified (crc, region seed).
fn parse_puts(region: &Region, base: DiskOffset, buf: &[u8]) -> Result<Vec<PutAt>> {
    let seed = record::region_seed(region.id);
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < buf.len() {
        let at = base.plus_bytes(pos as u64);
        if buf.len() - pos < HEADER_BYTES {
            return Err(Error::corruption(
                "log segment",
                at,
                "record header past the segment's written bytes",
            ));
        }
        let header = Header::decode(&buf[pos..pos + HEADER_BYTES], at)?;
        let len = header.total_bytes() as usize;
        if len > buf.len() - pos {
            return Err(Error::corruption(
                "log segment",
                at,
                "record past the segment's written bytes",
            ));
        }
        let rec = RecordRef::parse(&buf[pos..pos + len], seed, true, at)?;
        if !rec.header.is_tombstone() && !rec.header.is_link() {
            let key_at = pos + HEADER_BYTES;
            let value_at = key_at + rec.key.len();
            out.push(PutAt {
                at: at.0,
                key: key_at..value_at,
                value: value_at..value_at + rec.value.len(),
            });
        }
        pos += len;
    }
    Ok(out)
}

impl DbInner {
    /// One background step: refills the rate limiter and collects regions over their
    /// space-amplification target until the budget is spent.
    pub(crate) fn background_gc(&self) -> Result<()> {
        let opts = &self.shared.options;
        if !opts.gc {
            return Ok(());
        }
        // A forced pass is running: it does all there is to do.
        let Some(mut state) = self.gc.try_lock() else {
            return Ok(());
        };
        let now = Instant::now();
        let rate = opts.gc_rate_bytes_per_sec as f64;
        let elapsed = now.duration_since(state.last_refill).as_secs_f64();
        state.last_refill = now;
        state.tokens_bytes = (state.tokens_bytes + rate * elapsed).min(rate * BURST_SECONDS);
        let target = opts.gc_space_amp;
        let policy = Policy::Background {
            target,
            // Segments fuller than halfway between "all live" and the target's average
            // fill (1 / target) cost too much copying for what they give back.
            max_live_ratio: (1.0 + 1.0 / target) / 2.0,
        };
        let mut budget = state.tokens_bytes;
        let mut worked = false;
        for region in self.region_list() {
            if budget <= 0.0 {
                break;
            }
            worked |= self.collect_region(&region, policy, &mut budget, &mut state.pinned)?;
        }
        state.tokens_bytes = budget;
        if worked {
            self.shared.gc_passes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Collects victims of one region under `policy`; returns whether it did anything.
    fn collect_region(
        &self,
        region: &Region,
        policy: Policy,
        budget_bytes: &mut f64,
        pinned: &mut HashSet<(RegionId, u64)>,
    ) -> Result<bool> {
        let mut worked = false;
        for (victim, stats) in victims(region, policy, pinned) {
            if let Policy::Background { target, .. } = policy {
                if space_amp(region) <= target {
                    break;
                }
            }
            if *budget_bytes <= 0.0 {
                break;
            }
            worked = true;
            match collect_segment(self, region, victim, stats, budget_bytes, pinned)? {
                Collected::Retired | Collected::Kept => {}
                Collected::OutOfBudget => break,
            }
        }
        Ok(worked)
    }

    /// A full pass: commits twice (so every closed segment lies before both durable
    /// commits' replay windows), collects every eligible segment of every region, then
    /// commits until the emptied segments are back in the allocator and punched (unless
    /// a snapshot or live iterator still needs them: then a later commit frees them).
    pub(crate) fn gc_full(&self) -> Result<()> {
        let mut state = self.gc.lock();
        self.commit()?;
        self.commit()?;
        state.pinned.clear();
        let mut budget = f64::INFINITY;
        for region in self.region_list() {
            self.collect_region(&region, Policy::Forced, &mut budget, &mut state.pinned)?;
        }
        // The first commit seals the epoch the segments were retired in; the second makes
        // that seal the older durable one, so its end reclaims them.
        self.commit()?;
        self.commit()?;
        for _ in 0..GRACE_ATTEMPTS {
            if self.shared.frees.lock().limbo.is_empty() {
                break;
            }
            crossbeam_epoch::pin().flush();
            std::thread::yield_now();
        }
        // Hands what is releasable to the allocator, punching holes.
        self.commit()?;
        self.shared.gc_passes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether a commit would move freed space along. Space comes back only after three
    /// commits (the one that stops referencing it, the one after, which lets go of the
    /// older durable commit, and the one that applies the frees to the bitmap) with a
    /// reader grace period in between, so an idle store that never commits would keep
    /// it for ever: frees waiting in any of those steps, segments retired by GC, nodes
    /// replaced by copy-on-write, or a log over its target whose closed segments only
    /// wait for commits to become collectable ([`DbInner::gc_is_held_by_commits`]).
    pub(crate) fn gc_wants_commit(&self) -> bool {
        {
            // Every commit frees its predecessor's descriptor (a block or two) through
            // the same steps: counting those would make an idle store commit for ever.
            let frees = self.shared.frees.lock();
            let pending_blocks: u64 = frees
                .releasable
                .iter()
                .chain(&frees.limbo)
                .map(|(_, blocks)| blocks)
                .sum();
            if pending_blocks >= IDLE_COMMIT_MIN_FREE_BLOCKS {
                return true;
            }
        }
        if let Some(cs) = self.commit_state.try_lock() {
            // A commit always defers its predecessor's descriptor: that one alone is
            // the resting state, not work.
            let resting = cs.descriptors[0];
            if !cs.dropped.is_empty() || cs.deferred.iter().any(|e| Some(*e) != resting) {
                return true;
            }
        }
        self.region_list()
            .iter()
            .any(|r| r.has_reclaimable_segments() || r.tree.has_retired())
            || self.gc_is_held_by_commits()
    }

    /// True if some log is over the space-amplification target while closed segments of
    /// it wait only for commits to become candidates: the background loop then commits
    /// sooner than `commit_interval` (see `GC_COMMIT_INTERVAL`).
    pub(crate) fn gc_is_held_by_commits(&self) -> bool {
        let target = self.shared.options.gc_space_amp;
        self.region_list()
            .iter()
            .any(|r| space_amp(r) > target && r.has_segments_awaiting_commits())
    }
}
