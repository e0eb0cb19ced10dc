//! Garbage collection of the key-value log (WiscKey §3.3, adapted to per-region logs and
//! a durable index; DESIGN.md "Garbage collection" has the rules and the crash analysis).
//!
//! Owns: choosing victim segments from the exact per-segment live counts, driving their
//! relocation in small chunks, the background policy (space-amplification target, a
//! relocation budget that follows the garbage foreground writers create, with the fixed
//! rate as its floor), when GC asks the background loop for an early commit, and the
//! forced full pass behind `Database::gc`.
//!
//! Does not own: the relocation and retirement primitives (`Region::relocate`,
//! `Region::retire_segment`, under the region's writer lock), and freeing: a retired
//! segment is reclaimed by the commit that makes it unreachable from both durable commits
//! and every snapshot (`Region::reclaim_segments`), goes through the crossbeam grace
//! period like a node, and is punched when the next commit hands it to the allocator.
//!
//! Thread-safety: one pass at a time (`DbInner::gc`'s mutex); background steps run in a
//! thread of their own (`db.rs`, `gc_loop`), beside the committer, whose commits they
//! need; a pass holds a region's writer lock only for a chunk of `RELOCATE_CHUNK_RECORDS`
//! records, so foreground writers wait little. Readers are never blocked.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::db::DbInner;
use crate::error::{Error, Result};
use crate::log::record::{self, Header, RecordRef, HEADER_BYTES};
use crate::log::SegmentStats;
use crate::region::{Region, Retire};
use crate::types::{DiskOffset, RegionId, BLOCK_BYTES};

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

/// Over its target, a region's relocation budget is what keeps its log from growing
/// times `1 + OVER_TARGET_GAIN × (amp / target - 1)`: at twice the target GC copies twice
/// what merely holds the log still, so an excess left by a burst shrinks instead of
/// staying (a fixed factor of 1 would only stop the growth).
///
/// Why not more: `tucana-bench gc --engines tucana --gc-records 300000 --overwrites 8`
/// (1 KB values, 2 client threads, 2 cores) side by side: a gain of 4 held the peak space
/// amplification at 2.81 but kept 0.62 of GC-off throughput; a gain of 1 peaked at 3.08
/// and kept 0.75 (issue 5 asks for >= 0.65). Both settled under the target (1.41, 1.33).
const OVER_TARGET_GAIN: f64 = 1.0;

/// Most bytes one background step relocates. Under a burst a step's budget takes one
/// thread seconds to copy; short steps keep the foreground's bytes measured often (the
/// budget follows the burst, not what it was seconds ago) and let a forced pass, which
/// waits for the collector's lock, start soon. (When steps ran in the committer's
/// thread, long ones also kept the commits that give space back waiting.) Unspent budget
/// stays for the next step, which follows without a tick's wait.
const STEP_MAX_BYTES: f64 = (8 << 20) as f64;

/// How often the background loop commits while closed segments of a log over its target
/// wait only for commits to become candidates (segments after the older durable commit's
/// tail are still needed to replay either one). With `commit_interval` alone (5 s by
/// default) an overwrite-heavy load keeps about two intervals of log out of GC's reach.
const HELD_COMMIT_INTERVAL: Duration = Duration::from_millis(250);

/// Shortest interval between the commits GC asks for to give back the segments it
/// retired: each is back only after two commits and the start of a third, and until then
/// the disk holds it; a commit costs two fsyncs and writing the dirty index nodes (under
/// a burst of overwrites nearly every leaf: commits every 100 ms wrote 0.7 bytes of
/// index per byte of user writes).
const RETIRED_COMMIT_INTERVAL: Duration = Duration::from_millis(250);

/// Retired segments (and frees ready for the next commit) worth an early commit: this
/// share of the room the target leaves ((target - 1) × live bytes, all regions), so that
/// space GC already emptied never takes much of it; at least `RETIRED_COMMIT_MIN_BYTES`.
const RETIRED_COMMIT_SHARE: f64 = 1.0 / 4.0;
const RETIRED_COMMIT_MIN_BYTES: u64 = 4 << 20;

/// Frees at least this long are punched when a commit applies them (the commit's
/// `PUNCH_MIN_BLOCKS`): only those give disk space back, so only those ask for a commit.
const PUNCHED_MIN_BLOCKS: u64 = 16;

/// What the background step remembers of one region between steps, to tell the bytes
/// foreground writers appended since from those GC appended and took away itself.
#[derive(Clone, Copy, Debug, Default)]
struct Pace {
    /// The region's live + dead log bytes (bytes written to its segments still in its
    /// map) when the last step looked.
    log_bytes: u64,
    /// Written bytes of the segments GC retired since then (they left `log_bytes`).
    retired_bytes: u64,
    /// Bytes GC relocated since then (they joined `log_bytes`).
    relocated_bytes: u64,
}

/// State of the collector, under `DbInner::gc`.
pub(crate) struct GcState {
    /// Relocation budget of the background collector, bytes.
    tokens_bytes: f64,
    last_refill: Instant,
    /// Segments emptied but kept because an external pivot reads from them; skipped until
    /// the next forced pass (a later split may have moved the pivot).
    pinned: HashSet<(RegionId, u64)>,
    /// Per region, for the foreground's bytes since the last step.
    pace: HashMap<RegionId, Pace>,
}

impl GcState {
    pub fn new() -> GcState {
        GcState {
            tokens_bytes: 0.0,
            last_refill: Instant::now(),
            pinned: HashSet::new(),
            pace: HashMap::new(),
        }
    }

    /// Books what collecting a segment of `region` did to its log bytes.
    fn note_collected(&mut self, region: RegionId, relocated_bytes: u64, retired_bytes: u64) {
        let pace = self.pace.entry(region).or_default();
        pace.relocated_bytes += relocated_bytes;
        pace.retired_bytes += retired_bytes;
    }
}

/// What the background budget of one region is computed from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BudgetInput {
    /// The fixed rate's share of this step: `gc_rate_bytes_per_sec` × seconds since the
    /// last step. Always granted.
    pub floor_bytes: f64,
    /// Log bytes foreground writers appended to the region since the last step.
    pub foreground_bytes: f64,
    /// The region's space amplification now (`space_amp`).
    pub space_amp: f64,
    /// `gc_space_amp`.
    pub target: f64,
    /// Live share (live / size) of the region's best victim; clamped below 1.
    pub victim_live_ratio: f64,
}

/// Relocation bytes a background step may spend on one region.
///
/// At or under the target: the floor only (the fixed rate), so a quiet store stays
/// gentle. Over it: the relocation that keeps the log from growing while foreground
/// writers append `foreground_bytes` (collecting a victim with live share `u` copies
/// `u` of its size to take back `1 - u`, so holding the log still costs
/// `foreground × u / (1 - u)`), times a factor growing with how far over the target the
/// region is, so that the log shrinks back to the target; never less than the floor.
pub(crate) fn step_budget_bytes(input: BudgetInput) -> f64 {
    let floor = input.floor_bytes.max(0.0);
    // NaN counts as under: nothing to measure, nothing to chase.
    if input.space_amp.partial_cmp(&input.target) != Some(std::cmp::Ordering::Greater) {
        return floor;
    }
    // A victim all live gives nothing back: no finite budget holds the log still, and
    // `victims` never offers one that full anyway.
    let u = input.victim_live_ratio.clamp(0.0, FORCED_MAX_LIVE_RATIO);
    let keep_up = input.foreground_bytes.max(0.0) * u / (1.0 - u);
    let over = if input.space_amp.is_finite() {
        input.space_amp / input.target - 1.0
    } else {
        // No live bytes at all: everything is garbage; as far over as it gets.
        1.0
    };
    let factor = 1.0 + OVER_TARGET_GAIN * over.min(1.0);
    floor.max(keep_up * factor)
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

/// Space amplification of a region's log as the background policy steers it: its
/// segments, and those GC retired that commits have not given back yet (the disk still
/// holds them), over its live bytes.
fn space_amp(region: &Region) -> f64 {
    let live = region.live_bytes.load(Ordering::Relaxed);
    let size = region.log_size_bytes() + region.retired_segment_bytes();
    if live == 0 {
        return if size == 0 { 1.0 } else { f64::INFINITY };
    }
    size as f64 / live as f64
}

/// Bytes written to a region's segments still in its map (live and dead records).
fn log_bytes(region: &Region) -> u64 {
    region.live_bytes.load(Ordering::Relaxed) + region.dead_bytes.load(Ordering::Relaxed)
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
/// what is appended; the victim is left part way when it runs out. What it appends and
/// retires is booked in `state`'s pace of the region.
fn collect_segment(
    db: &DbInner,
    region: &Region,
    victim: DiskOffset,
    stats: SegmentStats,
    budget_bytes: &mut f64,
    state: &mut GcState,
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
            state.note_collected(region.id, appended, 0);
            db.shared
                .gc_relocated_bytes
                .fetch_add(appended, Ordering::Relaxed);
        }
    }
    match region.retire_segment(victim)? {
        Retire::Retired(_) => {
            // Nothing is appended to a closed segment: what it had written is what left
            // the region's log bytes.
            state.note_collected(region.id, 0, stats.written_bytes);
            Ok(Collected::Retired)
        }
        Retire::PinnedByPivot => {
            state.pinned.insert((region.id, victim.0));
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
    /// One background step: grants each region over its target a relocation budget that
    /// follows what foreground writers appended to it since the last step
    /// ([`step_budget_bytes`]; the fixed rate is the floor), then collects regions over
    /// their target until the budget is spent.
    ///
    /// Returns true if it stopped at `STEP_MAX_BYTES` with budget and victims left: the
    /// background loop then runs the next step without waiting for its tick.
    pub(crate) fn background_gc(&self) -> Result<bool> {
        let opts = &self.shared.options;
        if !opts.gc {
            return Ok(false);
        }
        // A forced pass is running: it does all there is to do.
        let Some(mut state) = self.gc.try_lock() else {
            return Ok(false);
        };
        let state = &mut *state;
        let now = Instant::now();
        let rate = opts.gc_rate_bytes_per_sec as f64;
        let elapsed = now.duration_since(state.last_refill).as_secs_f64();
        state.last_refill = now;
        let target = opts.gc_space_amp;
        let policy = Policy::Background {
            target,
            // Segments fuller than halfway between "all live" and the target's average
            // fill (1 / target) cost too much copying for what they give back.
            max_live_ratio: (1.0 + 1.0 / target) / 2.0,
        };
        let regions = self.region_list();
        state
            .pace
            .retain(|id, _| regions.iter().any(|r| r.id == *id));
        let mut work = Vec::with_capacity(regions.len());
        // Over the floor, summed over regions: the floor is the whole store's rate.
        let mut extra_bytes = 0.0;
        for region in &regions {
            let log_bytes_now = log_bytes(region);
            let pace = state.pace.entry(region.id).or_insert(Pace {
                log_bytes: log_bytes_now,
                ..Pace::default()
            });
            // What GC appended joined the log bytes and what it retired left them; the
            // rest came from foreground writers (links between segments included).
            let foreground_bytes = (log_bytes_now + pace.retired_bytes) as f64
                - (pace.log_bytes + pace.relocated_bytes) as f64;
            *pace = Pace {
                log_bytes: log_bytes_now,
                ..Pace::default()
            };
            let amp = space_amp(region);
            if amp <= target {
                continue;
            }
            let victims = victims(region, policy, &state.pinned);
            let Some((_, best)) = victims.first() else {
                continue;
            };
            let budget = step_budget_bytes(BudgetInput {
                floor_bytes: 0.0,
                foreground_bytes,
                space_amp: amp,
                target,
                victim_live_ratio: best.live_bytes as f64 / best.size_bytes.max(1) as f64,
            });
            extra_bytes += budget;
            work.push((region, victims));
        }
        // Tokens left over pile up to half a second of the floor, or one step of what the
        // foreground asks for: a burst is followed, not banked.
        let grant = (rate * elapsed).max(extra_bytes);
        state.tokens_bytes = (state.tokens_bytes + grant).min((rate * BURST_SECONDS).max(grant));
        // This step spends at most `STEP_MAX_BYTES` of the tokens; the rest stays.
        let held_back = (state.tokens_bytes - STEP_MAX_BYTES).max(0.0);
        let mut budget = state.tokens_bytes - held_back;
        let mut worked = false;
        let mut left_over = false;
        for (region, victims) in work {
            if budget <= 0.0 {
                left_over = true;
                break;
            }
            worked |= self.collect_victims(region, policy, victims, &mut budget, state)?;
        }
        // Cut short by the step's cap, not by the target or the victims.
        let behind = held_back > 0.0 && (left_over || budget <= 0.0);
        budget += held_back;
        state.tokens_bytes = budget;
        if worked {
            self.shared.gc_passes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(behind)
    }

    /// Collects `victims` of one region (least live first) under `policy`; returns
    /// whether it did anything.
    fn collect_victims(
        &self,
        region: &Region,
        policy: Policy,
        victims: Vec<(DiskOffset, SegmentStats)>,
        budget_bytes: &mut f64,
        state: &mut GcState,
    ) -> Result<bool> {
        let mut worked = false;
        for (victim, stats) in victims {
            if let Policy::Background { target, .. } = policy {
                if space_amp(region) <= target {
                    break;
                }
            }
            // A segment with nothing live costs no copying: an exhausted budget does not
            // keep it.
            if *budget_bytes <= 0.0 && stats.live_bytes > 0 {
                break;
            }
            worked = true;
            match collect_segment(self, region, victim, stats, budget_bytes, state)? {
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
        let state = &mut *state;
        self.commit()?;
        self.commit()?;
        state.pinned.clear();
        let mut budget = f64::INFINITY;
        for region in self.region_list() {
            let victims = victims(&region, Policy::Forced, &state.pinned);
            self.collect_victims(&region, Policy::Forced, victims, &mut budget, state)?;
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

    /// Whether the background loop should commit now for GC's sake, `since_commit` after
    /// the last commit (sooner than `commit_interval`):
    ///
    /// - segments GC retired, or emptied segments ready for the next commit, add up to
    ///   `RETIRED_COMMIT_SHARE` of the room the target leaves: they are off the disk only
    ///   after commits, and at the rate GC follows a burst they would otherwise hold more
    ///   than that room (at most every `RETIRED_COMMIT_INTERVAL`);
    /// - or a log over its target has closed segments that wait only for commits to
    ///   become candidates ([`DbInner::gc_is_held_by_commits`], every
    ///   `HELD_COMMIT_INTERVAL`).
    ///
    /// An idle store under its target asks for nothing.
    pub(crate) fn gc_commit_due(&self, since_commit: Duration) -> bool {
        if since_commit < RETIRED_COMMIT_INTERVAL {
            return false;
        }
        let target = self.shared.options.gc_space_amp;
        let regions = self.region_list();
        let mut room_bytes = 0.0;
        let mut held_bytes = 0u64;
        for region in &regions {
            room_bytes += (target - 1.0) * region.live_bytes.load(Ordering::Relaxed) as f64;
            held_bytes += reclaimable_retired_bytes(region);
        }
        held_bytes += self
            .shared
            .frees
            .lock()
            .releasable
            .iter()
            .filter(|(_, blocks)| *blocks >= PUNCHED_MIN_BLOCKS)
            .map(|(_, blocks)| blocks * BLOCK_BYTES)
            .sum::<u64>();
        let threshold_bytes =
            (room_bytes * RETIRED_COMMIT_SHARE).max(RETIRED_COMMIT_MIN_BYTES as f64);
        if held_bytes as f64 >= threshold_bytes {
            return true;
        }
        since_commit >= HELD_COMMIT_INTERVAL && self.gc_is_held_by_commits()
    }

    /// True if some log is over the space-amplification target while closed segments of
    /// it wait only for commits to become candidates: the background loop then commits
    /// sooner than `commit_interval` ([`DbInner::gc_commit_due`]).
    pub(crate) fn gc_is_held_by_commits(&self) -> bool {
        let target = self.shared.options.gc_space_amp;
        self.region_list()
            .iter()
            .any(|r| space_amp(r) > target && r.has_segments_awaiting_commits())
    }
}

/// Bytes of the segments GC retired in `region` that wait only for commits (not for a
/// snapshot or live iterator opened before they were retired).
fn reclaimable_retired_bytes(region: &Region) -> u64 {
    let oldest = region.oldest_snapshot();
    region
        .retired_segments
        .lock()
        .iter()
        .filter(|r| oldest.is_none_or(|s| s >= r.epoch))
        .map(|r| r.size_bytes)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(foreground_bytes: f64, space_amp: f64) -> BudgetInput {
        BudgetInput {
            floor_bytes: 1000.0,
            foreground_bytes,
            space_amp,
            target: 1.5,
            victim_live_ratio: 0.5,
        }
    }

    #[test]
    fn under_the_target_only_the_floor() {
        for foreground in [0.0, 1e6, 1e9] {
            assert_eq!(step_budget_bytes(input(foreground, 1.2)), 1000.0);
            assert_eq!(step_budget_bytes(input(foreground, 1.5)), 1000.0);
        }
    }

    #[test]
    fn over_the_target_the_budget_follows_the_foreground() {
        // Barely over: about what holds the log still. A victim half live copies one byte
        // for every byte it gives back, so as many bytes as the foreground appended.
        let barely = step_budget_bytes(input(1e6, 1.5 + 1e-9));
        assert!((barely - 1e6).abs() < 1.0, "{barely}");
        // Proportional to the foreground's bytes.
        let twice = step_budget_bytes(input(2e6, 1.5 + 1e-9));
        assert!((twice - 2e6).abs() < 2.0, "{twice}");
        // Nothing appended: the floor still works the excess down.
        assert_eq!(step_budget_bytes(input(0.0, 3.0)), 1000.0);
        // Little appended: never under the floor.
        assert_eq!(step_budget_bytes(input(10.0, 1.6)), 1000.0);
    }

    #[test]
    fn the_further_over_the_target_the_larger_the_budget() {
        let mut last = 0.0;
        for amp in [1.6, 1.8, 2.2, 2.9] {
            let budget = step_budget_bytes(input(1e6, amp));
            assert!(budget > last, "{amp}: {budget} after {last}");
            last = budget;
        }
        // Capped at twice the target, and so is "no live bytes".
        let cap = step_budget_bytes(input(1e6, 3.0));
        let keep_up = step_budget_bytes(input(1e6, 1.5 + 1e-12));
        assert!(
            (cap - (1.0 + OVER_TARGET_GAIN) * keep_up).abs() < 5.0,
            "{cap} {keep_up}"
        );
        assert_eq!(step_budget_bytes(input(1e6, 30.0)), cap);
        assert_eq!(step_budget_bytes(input(1e6, f64::INFINITY)), cap);
    }

    #[test]
    fn fuller_victims_cost_more_copying() {
        let budget = |u: f64| {
            step_budget_bytes(BudgetInput {
                victim_live_ratio: u,
                ..input(1e6, 1.5 + 1e-9)
            })
        };
        // All dead: emptying costs nothing, the floor is enough.
        assert_eq!(budget(0.0), 1000.0);
        assert!(budget(0.25) < budget(0.5) && budget(0.5) < budget(0.75));
        // A victim reported all live stays finite.
        assert!(budget(1.0).is_finite());
    }
}
