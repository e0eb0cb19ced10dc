//! Garbage collection of the key-value log (WiscKey §3.3, adapted to per-region logs and
//! a durable index; DESIGN.md "Garbage collection" has the rules and the crash analysis).
//!
//! Owns: the collector (`Collector`): its background step (which regions to collect and
//! with what budget: a relocation budget that follows the garbage foreground writers
//! create, with the fixed rate as its floor), the readings the control law steers by
//! (the volume's measured overhead and space amplification), write pacing, when GC asks
//! the background loop for an early commit pair, and the forced full pass behind
//! `Database::gc`. The control law itself is in `policy`, the mechanics of collecting a
//! victim in `collect`.
//!
//! Does not own: the relocation and retirement primitives (`Region::relocate`,
//! `Region::retire_segment`, under the region's writer lock), and freeing: a retired
//! segment is reclaimed by the commit that makes it unreachable from both durable commits
//! and every snapshot, goes through the crossbeam grace period like a node, and is punched
//! when it is handed back to the allocator (`Shared::release_extents`).
//!
//! Thread-safety: one pass at a time (the collector's mutex); background steps run in a
//! thread of their own (`crate::background`), beside the committer, whose commits they
//! need; a pass holds a region's writer lock only for a chunk of `RELOCATE_CHUNK_RECORDS`
//! records, so foreground writers wait little. Readers are never blocked.

mod collect;
mod policy;
mod reorganise;

pub use reorganise::ReorganiseReport;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::commit::Committer;
use crate::error::Result;
use crate::log::SegmentStats;
use crate::region::{Region, Regions};
use crate::shared::Shared;
use crate::types::{DiskOffset, RegionId, BLOCK_BYTES};
use collect::{collect_segment, victims, Collected, Policy};
use policy::*;

/// The rate limiter lets this many seconds of budget pile up while there is nothing to do.
const BURST_SECONDS: f64 = 0.5;

/// Times a commit pair for GC nudges crossbeam-epoch to run deferred releases before it
/// gives them back; readers pinned elsewhere may delay them, and then the committer's
/// next wake-up gives them back.
const GRACE_NUDGES: usize = 8;

/// Times a forced pass nudges crossbeam-epoch to run deferred releases before it commits
/// them; readers pinned elsewhere may delay them, and then a later commit frees them.
const GRACE_ATTEMPTS: usize = 64;

/// Blocks of frees in flight that make an otherwise idle store commit to give them back
/// (64 KiB: more than the descriptors every commit frees, a commit costs two fsyncs).
const IDLE_COMMIT_MIN_FREE_BLOCKS: u64 = 16;

/// Frees at least this long are punched when a commit applies them (the commit's
/// `PUNCH_MIN_BLOCKS`): only those give disk space back, so only those ask for a commit.
const PUNCHED_MIN_BLOCKS: u64 = 16;

/// State of the collector, under its lock.
struct GcState {
    /// Relocation budget of the background collector, bytes.
    tokens_bytes: f64,
    last_refill: Instant,
    /// Budget earned by foreground writes (`URGENT_COPY_RATIO`), spent only while urgent.
    urgent_tokens_bytes: f64,
    /// `Shared::foreground_bytes` when the last step looked.
    last_foreground_bytes: u64,
    /// Segments emptied but kept because an external pivot reads from them; skipped until
    /// the next forced pass (a later split may have moved the pivot).
    pinned: HashSet<(RegionId, u64)>,
    /// The store's smoothed garbage over its room, for write pacing, and when it was
    /// taken.
    pace_share: Option<(f64, Instant)>,
    /// When the overhead was last measured.
    overhead_at: Instant,
    /// The start line's share of the target's room ([`next_start_share`]).
    start_share: f64,
    /// Whether the last background step collected anything.
    collecting: bool,
    /// The volume's measured space amplification, its recent peak ([`held_peak`]).
    amp_peak: f64,
    /// Holds the victim being collected when the volume has no mapping; kept to spare an
    /// allocation per victim.
    buf: Vec<u8>,
    /// The background reorganiser (`Options::reorganise_after_idle`).
    idle_walk: reorganise::IdleWalk,
}

impl GcState {
    fn new() -> GcState {
        GcState {
            tokens_bytes: 0.0,
            last_refill: Instant::now(),
            urgent_tokens_bytes: 0.0,
            last_foreground_bytes: 0,
            pinned: HashSet::new(),
            pace_share: None,
            overhead_at: Instant::now(),
            start_share: START_SHARE_MIN,
            collecting: false,
            amp_peak: 0.0,
            buf: Vec::new(),
            idle_walk: reorganise::IdleWalk::new(),
        }
    }
}

/// The garbage collector of a volume: one pass at a time.
pub(crate) struct Collector {
    shared: Arc<Shared>,
    state: Mutex<GcState>,
    /// Disk bytes beyond the regions' logs and estimated index, per byte of their floor,
    /// its decaying peak (f64 bits): set by each background step (`measure_overhead`),
    /// read by `wants_commit`'s neighbours without the lock.
    overhead_share_bits: AtomicU64,
}

/// The footprint of `region` as the control law sees it.
fn footprint(region: &Region, overhead_share: f64) -> Footprint {
    Footprint::new(
        region.live_bytes(),
        region.dead_bytes(),
        region.keys(),
        overhead_share,
    )
}

impl Collector {
    pub fn new(shared: Arc<Shared>) -> Collector {
        Collector {
            shared,
            state: Mutex::new(GcState::new()),
            overhead_share_bits: AtomicU64::new(0),
        }
    }

    /// One background step: every region over its start line ([`urge`]) is collected
    /// back under it, best victims first ([`victim_score`]); gently (within the
    /// `gc_rate_bytes_per_sec` budget) while under the urgent line, at once over it.
    /// A step relocates at most `STEP_MAX_BYTES`.
    ///
    /// Returns true if it stopped at `STEP_MAX_BYTES` with work left: the background loop
    /// then runs the next step without waiting for its tick.
    pub fn background_step(&self, regions: &Regions) -> Result<bool> {
        let opts = &self.shared.options;
        if !opts.gc {
            return Ok(false);
        }
        // A forced pass is running: it does all there is to do.
        let Some(mut state) = self.state.try_lock() else {
            return Ok(false);
        };
        let state = &mut *state;
        self.measure_overhead(state, regions);
        let now = Instant::now();
        let rate = opts.gc_rate_bytes_per_sec as f64;
        let elapsed = now.duration_since(state.last_refill).as_secs_f64();
        state.last_refill = now;
        state.tokens_bytes = (state.tokens_bytes + rate * elapsed).min(rate * BURST_SECONDS);
        let foreground = self.shared.foreground_bytes.load(Ordering::Relaxed);
        let appended = foreground.saturating_sub(state.last_foreground_bytes);
        state.last_foreground_bytes = foreground;
        state.urgent_tokens_bytes = (state.urgent_tokens_bytes
            + URGENT_COPY_RATIO * appended as f64)
            .min(URGENT_TOKENS_MAX_BYTES);
        let target = opts.gc_space_amp;
        let policy = Policy::Background {
            // Segments fuller than halfway between "all live" and the target's average
            // fill (1 / target) cost too much copying for what they give back.
            max_live_ratio: (1.0 + 1.0 / target) / 2.0,
        };
        let mut step_bytes = STEP_MAX_BYTES;
        let mut worked = false;
        let mut cut_short = false;
        let mut victims_found = false;
        let regions = regions.list();
        for region in &regions {
            let region = &**region;
            let footprint = footprint(region, self.overhead_share());
            let urgent = match urge(footprint, target, state.start_share) {
                Urge::Idle => continue,
                Urge::Gentle { .. } => false,
                Urge::Urgent { .. } => true,
            };
            let available = if urgent {
                state.tokens_bytes.max(0.0) + state.urgent_tokens_bytes
            } else {
                state.tokens_bytes
            };
            if available <= 0.0 {
                continue;
            }
            let victims = victims(region, policy, &state.pinned);
            victims_found |= !victims.is_empty();
            let before = step_bytes;
            let mut budget = step_bytes.min(available);
            let granted = budget;
            worked |= self.collect_victims(region, policy, victims, &mut budget, state)?;
            let spent = granted - budget;
            step_bytes -= spent;
            // Urgent work spends what the writers earned first, then the rate's tokens.
            let from_urgent = if urgent {
                spent.min(state.urgent_tokens_bytes)
            } else {
                0.0
            };
            state.urgent_tokens_bytes -= from_urgent;
            state.tokens_bytes -= spent - from_urgent;
            if step_bytes <= 0.0 && before > 0.0 {
                cut_short = true;
                break;
            }
        }
        if worked {
            self.shared.gc_passes.fetch_add(1, Ordering::Relaxed);
        }
        if opts.reorganise_scanned {
            // What cold scans found scattered, within what is left of the step's budget.
            let budget = step_bytes.min(state.tokens_bytes).max(0.0) as u64;
            let spent = reorganise::rewrite_scattered_reads(&regions, budget)?;
            step_bytes -= spent as f64;
            state.tokens_bytes -= spent as f64;
        }
        if let (Some(idle_after), false) = (opts.reorganise_after_idle, worked) {
            // Idle time goes to the reorganiser, within what is left of the step's budget.
            let budget = step_bytes.min(state.tokens_bytes).max(0.0) as u64;
            let spent = state
                .idle_walk
                .step(&regions, foreground, appended, idle_after, budget)?;
            state.tokens_bytes -= spent as f64;
        }
        state.collecting = worked;
        self.update_write_pacing(state, &regions, victims_found);
        Ok(cut_short)
    }

    /// The measured overhead per byte of floor (`OVERHEAD_HALF_LIFE`).
    fn overhead_share(&self) -> f64 {
        f64::from_bits(self.overhead_share_bits.load(Ordering::Relaxed))
    }

    /// Measures what the volume holds beyond the regions' logs and estimated index, per
    /// byte of their floor, and keeps its decaying peak for [`footprint`]; from the
    /// same reading, steers the start line's share ([`next_start_share`]).
    fn measure_overhead(&self, state: &mut GcState, regions: &Regions) {
        // Segments released but not punched yet (`release_extents`) are free in the bitmap
        // and still on the disk.
        let allocated = (self.shared.allocator.allocated_blocks() * BLOCK_BYTES
            + self.shared.allocator.deferred_bytes()) as f64;
        let (mut disk, mut floor, mut user) = (0.0, 0.0, 0.0);
        for region in regions.list() {
            let f = footprint(&region, 0.0);
            disk += f.disk_bytes;
            floor += f.floor_bytes();
            user += f.user_bytes;
        }
        let now = Instant::now();
        let elapsed = now.duration_since(state.overhead_at).as_secs_f64();
        state.overhead_at = now;
        // A small store's ratio is its fixed costs (a tail segment): nothing to steer by.
        if allocated >= PACE_MIN_DISK_BYTES && user > 0.0 {
            state.amp_peak = held_peak(state.amp_peak, allocated / user, elapsed);
            state.start_share = next_start_share(
                state.start_share,
                state.amp_peak,
                self.shared.options.gc_space_amp,
                state.collecting,
                elapsed,
            );
        }
        let measured = if floor > 0.0 {
            ((allocated - disk).max(0.0) / floor).min(OVERHEAD_MAX_SHARE)
        } else {
            0.0
        };
        let decayed =
            self.overhead_share() * 0.5f64.powf(elapsed / OVERHEAD_HALF_LIFE.as_secs_f64());
        self.overhead_share_bits
            .store(measured.max(decayed).to_bits(), Ordering::Relaxed);
    }

    /// Sets the foreground writers' pacing delay from the whole store's garbage: its
    /// regions' (see [`Footprint`]) plus, beyond one room, what is on its way back to the
    /// file system (retired segments waiting only for commits, frees waiting for readers
    /// or for their punch), over the room its regions' target leaves.
    fn update_write_pacing(
        &self,
        state: &mut GcState,
        regions: &[std::sync::Arc<Region>],
        victims_found: bool,
    ) {
        let target = self.shared.options.gc_space_amp;
        let mut disk_bytes = 0.0;
        let mut garbage_bytes = 0.0;
        let mut room_bytes = 0.0;
        let mut returning_bytes = 0u64;
        for region in regions {
            let f = footprint(region, self.overhead_share());
            disk_bytes += f.disk_bytes;
            garbage_bytes += f.garbage_bytes;
            room_bytes += f.room_bytes(target).max(0.0);
            returning_bytes += region.reclaimable_retired_bytes();
        }
        {
            let frees = self.shared.frees.lock();
            returning_bytes += frees
                .limbo
                .iter()
                .chain(&frees.releasable)
                .map(|(_, blocks)| blocks * BLOCK_BYTES)
                .sum::<u64>();
        }
        garbage_bytes = pacing_garbage_bytes(garbage_bytes, returning_bytes as f64, room_bytes);
        disk_bytes += returning_bytes as f64;
        let share = if garbage_bytes <= 0.0 {
            0.0
        } else if room_bytes <= 0.0 {
            f64::INFINITY
        } else {
            garbage_bytes / room_bytes
        };
        let now = Instant::now();
        let smoothed = match state.pace_share {
            Some((last, at)) if share.is_finite() && last.is_finite() => {
                let dt = now.duration_since(at).as_secs_f64();
                let keep = (-dt / PACE_SMOOTHING_SECONDS).exp();
                last * keep + share * (1.0 - keep)
            }
            _ => share,
        };
        state.pace_share = Some((smoothed, now));
        let delay = write_delay(
            smoothed,
            (victims_found || returning_bytes > 0) && disk_bytes >= PACE_MIN_DISK_BYTES,
        );
        self.shared
            .write_delay_ns_per_kib
            .store(delay, Ordering::Relaxed);
    }

    /// Collects `victims` of one region (best first) under `policy` while the budget
    /// lasts (and, in the background, while the region is over its start line); returns
    /// whether it did anything.
    fn collect_victims(
        &self,
        region: &Region,
        policy: Policy,
        victims: Vec<(DiskOffset, SegmentStats)>,
        budget_bytes: &mut f64,
        state: &mut GcState,
    ) -> Result<bool> {
        let target = self.shared.options.gc_space_amp;
        let mut worked = false;
        for (victim, stats) in victims {
            if matches!(policy, Policy::Background { .. })
                && urge(
                    footprint(region, self.overhead_share()),
                    target,
                    state.start_share,
                ) == Urge::Idle
            {
                break;
            }
            // A segment with nothing live costs no copying: an exhausted budget does not
            // keep it.
            if *budget_bytes <= 0.0 && stats.live_bytes > 0 {
                break;
            }
            worked = true;
            let collected = collect_segment(
                &self.shared,
                region,
                victim,
                stats,
                budget_bytes,
                &mut state.buf,
                &mut state.pinned,
            )?;
            match collected {
                Collected::Retired | Collected::Kept => {}
                Collected::OutOfBudget => break,
            }
        }
        Ok(worked)
    }

    /// A full pass: a commit pair (everything written before the pass is durable in both
    /// slots), collects every eligible segment of every region, then commits until the
    /// emptied segments are back in the allocator and punched (unless a snapshot or live
    /// iterator still needs them: then a later commit frees them).
    pub fn full_pass(&self, regions: &Regions, committer: &Committer) -> Result<()> {
        let mut state = self.state.lock();
        let state = &mut *state;
        committer.commit_pair(regions)?;
        state.pinned.clear();
        let mut budget = f64::INFINITY;
        for region in regions.list() {
            region.close_dead_gc_tail()?;
            let victims = victims(&region, Policy::Forced, &state.pinned);
            self.collect_victims(&region, Policy::Forced, victims, &mut budget, state)?;
        }
        // The first commit seals the epoch the segments were retired in; its repeat makes
        // that seal the older durable one too, so its end reclaims them.
        committer.commit_pair(regions)?;
        self.shared.nudge_readers_grace(GRACE_ATTEMPTS, true);
        // Hands what is releasable to the allocator, punching holes (deferred ones too).
        committer.commit(regions)?;
        self.shared.flush_trims();
        self.shared.gc_passes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Copies every scattered read the scans reported (`reorganise::rewrite_scattered_reads`)
    /// at once, without a budget: what the background step does over its next steps.
    #[cfg(test)]
    pub fn rewrite_scattered_reads_now(&self, regions: &Regions) -> Result<u64> {
        let _one_pass = self.state.lock();
        reorganise::rewrite_scattered_reads(&regions.list(), u64::MAX)
    }

    /// Rewrites every region's scattered leaves in key order (`reorganise`), then runs a
    /// full pass, which gives back the segments the originals left dead.
    pub fn reorganise(&self, regions: &Regions, committer: &Committer) -> Result<ReorganiseReport> {
        let mut report = ReorganiseReport::default();
        {
            let _one_pass = self.state.lock();
            for region in regions.list() {
                if region.is_dropped() {
                    continue;
                }
                reorganise::reorganise_leaves(&region, None, (u64::MAX, u64::MAX), &mut report)?;
            }
        }
        self.full_pass(regions, committer)?;
        Ok(report)
    }

    /// Whether writes that have stopped left garbage over the start line that the
    /// collector cannot reach before a commit: at least a segment's worth of dead bytes
    /// in segments the last durable commit replays (`Region::dead_bytes_awaiting_commit`),
    /// in a region over its line. The background committer then commits at once instead
    /// of at `commit_interval`, so a burst's garbage is collected while the store is quiet,
    /// not during the next burst (DESIGN.md, "Garbage collection", "After a burst").
    pub fn garbage_awaits_commit(&self, regions: &Regions) -> bool {
        let opts = &self.shared.options;
        if !opts.gc {
            return false;
        }
        let start_share = self
            .state
            .try_lock()
            .map_or(START_SHARE_MIN, |state| state.start_share);
        regions.list().iter().any(|region| {
            !matches!(
                urge(
                    footprint(region, self.overhead_share()),
                    opts.gc_space_amp,
                    start_share
                ),
                Urge::Idle
            ) && region.dead_bytes_awaiting_commit() >= opts.log_segment_bytes
        })
    }

    /// Whether a commit would move freed space along. Space comes back only after two
    /// commits (the one that stops referencing it and the one after, which lets go of the
    /// older durable commit) and a reader grace period, so an idle store that never
    /// commits would keep it for ever: frees waiting in any of those steps, segments
    /// retired by GC, nodes replaced by copy-on-write.
    pub fn wants_commit(&self, regions: &Regions, committer: &Committer) -> bool {
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
        if committer
            .try_lock()
            .is_some_and(|cs| cs.has_frees_waiting())
        {
            return true;
        }
        regions
            .list()
            .iter()
            .any(|r| r.has_reclaimable_segments() || r.has_retired_nodes())
    }

    /// Whether the background loop should make a pair of commits now for GC's sake,
    /// `since_commit` after the last one (sooner than `commit_interval`): segments GC
    /// retired, and freed extents not yet given back to the file system, add up to
    /// `RETIRED_COMMIT_SHARE` of the room the target leaves. They are off the disk only
    /// after two commits sealed after their retirement, and at the rate GC follows a
    /// burst they would otherwise hold more than that room (at most every
    /// `RETIRED_COMMIT_INTERVAL`). Never for less than the index nodes the commit would
    /// write: under random writes to small records nearly every leaf is dirty, and a
    /// pair every 50 ms wrote the whole index (18 MiB for 630k keys) to give back a
    /// few MiB, a third of the server's CPU in the SET benchmark. An idle store asks
    /// for nothing.
    pub fn commit_due(&self, regions: &Regions, since_commit: Duration) -> bool {
        if since_commit < RETIRED_COMMIT_INTERVAL {
            return false;
        }
        let target = self.shared.options.gc_space_amp;
        let regions = regions.list();
        let mut room_bytes = 0.0;
        let mut held_bytes = 0u64;
        let mut dirty_bytes = 0u64;
        for region in &regions {
            room_bytes += footprint(region, self.overhead_share())
                .room_bytes(target)
                .max(0.0);
            held_bytes += region.reclaimable_retired_bytes();
            dirty_bytes += region.dirty_node_bytes();
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
        let threshold_bytes = (room_bytes * RETIRED_COMMIT_SHARE)
            .max(RETIRED_COMMIT_MIN_BYTES as f64)
            .max(dirty_bytes as f64);
        held_bytes as f64 >= threshold_bytes
    }

    /// A pair of commits for GC's sake, then the space they free given back at once: the
    /// first commit seals the epoch GC retired segments in, its repeat makes that seal
    /// the older durable one, so its end hands them to the reader grace period; the
    /// repeat writes no node. Space retired just after a lone commit would wait for two
    /// more commit intervals instead.
    pub fn commit_pair(&self, regions: &Regions, committer: &Committer) -> Result<()> {
        committer.commit_pair(regions)?;
        // No yield between nudges: on a busy machine each yield gave the core away for a
        // time slice (tens of milliseconds for the eight, with a hundred MiB waiting);
        // what is still in limbo goes at the committer's next wake-up. Segments rarely
        // wait here: their grace period began when they were retired.
        self.shared.nudge_readers_grace(GRACE_NUDGES, false);
        committer.release_frees_now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::record::HEADER_BYTES;
    use crate::region::Retire;

    /// Walks the records of every segment of the region `name`: per segment, how many
    /// are relocated copies and how many are not.
    fn records_by_segment(db: &crate::Database, name: &str) -> Vec<(u64, usize, usize)> {
        let (region, segments) = written_segments(db, name);
        let mut out = Vec::new();
        for (base, written) in segments {
            let (mut relocated, mut other, mut pos) = (0, 0, 0);
            while pos < written {
                let header = region.record_header(base + pos).unwrap();
                if header.is_relocated() {
                    relocated += 1;
                } else {
                    other += 1;
                }
                pos += header.total_bytes();
            }
            out.push((base, relocated, other));
        }
        out
    }

    /// The region `name` and its segments: start offset and written bytes of each.
    fn written_segments(
        db: &crate::Database,
        name: &str,
    ) -> (std::sync::Arc<Region>, Vec<(u64, u64)>) {
        let region = db.engine.regions.get(name).unwrap();
        let segments = region
            .segments()
            .iter()
            .map(|(off, s)| (*off, s.written_bytes))
            .collect();
        (region, segments)
    }

    /// An in-memory store committed only by hand, with 64 KiB log segments.
    pub(super) fn manual_small_segments() -> crate::Database {
        crate::Database::builder()
            .commit_interval(None)
            .flush_interval(None)
            .log_segment_bytes(64 << 10)
            .open_in_memory()
            .unwrap()
    }

    /// Fills a store with 64 KiB segments, overwrites half the keys, and damages one
    /// value byte of a put record of the first segment that is `live` (or dead), in the
    /// volume's bytes. Returns the store and the keys with their expected values.
    fn store_with_a_damaged_record(live: bool) -> (crate::Database, Vec<(String, Vec<u8>)>) {
        let db = manual_small_segments();
        let ks = db.keyspace("t").unwrap();
        let mut expected = Vec::new();
        for i in 0..600u32 {
            let key = format!("k{i:04}");
            let value = vec![(i % 251) as u8; 200];
            ks.put(key.as_bytes(), &value).unwrap();
            expected.push((key, value));
        }
        for (i, (key, value)) in expected.iter_mut().enumerate() {
            if i % 2 == 0 {
                *value = vec![7; 200];
                ks.put(key.as_bytes(), value).unwrap();
            }
        }
        db.commit().unwrap();
        let (region, segments) = written_segments(&db, "t");
        let (base, written) = segments[0];
        let mut pos = 0;
        let target = loop {
            assert!(pos < written, "no {} record in the first segment", live);
            let at = base + pos;
            let (header, key) = region
                .with_record(at, true, |r| (r.header, r.key.to_vec()))
                .unwrap();
            if !header.is_tombstone()
                && !header.is_link()
                && region.is_live(&key, at).unwrap() == live
            {
                break at;
            }
            pos += header.total_bytes();
        };
        let storage = db.engine.shared.volume.storage().clone();
        let byte_at = target + HEADER_BYTES as u64 + 5 + 100;
        let mut byte = [0u8];
        storage.read_at(byte_at, &mut byte).unwrap();
        storage.write_at(byte_at, &[byte[0] ^ 0x10]).unwrap();
        (db, expected)
    }

    /// A bit flip in a dead record neither stops a collection nor keeps its segment: only
    /// the records copied are verified.
    #[test]
    fn a_damaged_dead_record_does_not_keep_its_segment() {
        let (db, expected) = store_with_a_damaged_record(false);
        let first = written_segments(&db, "t").1[0].0;
        db.gc().unwrap();
        assert!(
            written_segments(&db, "t")
                .1
                .iter()
                .all(|&(base, _)| base != first),
            "the damaged segment was collected"
        );
        let ks = db.keyspace("t").unwrap();
        for (key, value) in &expected {
            assert_eq!(ks.get(key.as_bytes()).unwrap().as_deref(), Some(&value[..]));
        }
    }

    /// A bit flip in a live record is reported, not copied under a fresh crc that would
    /// make the damage look like data.
    #[test]
    fn a_damaged_live_record_stops_the_collection_with_corruption() {
        let (db, _) = store_with_a_damaged_record(true);
        let err = db.gc().unwrap_err();
        assert!(
            matches!(err, crate::Error::Corruption { .. }),
            "expected corruption, got {err:?}"
        );
    }

    /// A commit that seals while the collector has copies in the relocation tail that no
    /// tree points at yet (they are appended before the writer lock is taken, `relocate`)
    /// records only the bytes accounted to the segment: the volume reopens (its
    /// relocation tail position must match its segment's written bytes), every key reads
    /// its value, and `check` passes.
    #[test]
    fn a_commit_between_a_copy_and_its_swap_records_only_accounted_bytes() {
        let storage = std::sync::Arc::new(crate::volume::MemStorage::new());
        let open = || {
            crate::Database::builder()
                .commit_interval(None)
                .flush_interval(None)
                .log_segment_bytes(64 << 10)
                .open_storage(storage.clone())
                .unwrap()
        };
        let db = open();
        let ks = db.keyspace("t").unwrap();
        for round in 0..3u8 {
            for i in 0..1500u32 {
                if round == 0 || i % 3 == 0 {
                    ks.put(format!("k{i:05}").as_bytes(), &[round; 100])
                        .unwrap();
                }
            }
        }
        db.gc().unwrap();
        assert!(
            db.stats().gc_relocated_bytes > 0,
            "the pass made a relocation tail"
        );
        let region = db.engine.regions.get("t").unwrap();
        {
            // What `relocate` does before it takes the writer lock: a copy in the tail.
            let guard = crossbeam_epoch::pin();
            let mut copies = Vec::new();
            let value = [7u8; 100];
            let copied = region
                .log()
                .append_copies(&[(0, b"k00001", &value)], &mut copies, &guard)
                .unwrap();
            assert_eq!(copied, 1, "a relocation tail with room for the copy");
        }
        db.commit().unwrap();
        db.commit().unwrap();
        drop(region);
        drop(ks);
        db.close().unwrap();
        let db = open();
        let ks = db.keyspace("t").unwrap();
        for i in 0..1500u32 {
            let want = if i % 3 == 0 { 2 } else { 0 };
            assert_eq!(
                ks.get(format!("k{i:05}").as_bytes()).unwrap(),
                Some(vec![want; 100]),
                "key {i}"
            );
        }
        db.check().unwrap();
    }

    /// The writers' lists of dead records say exactly what the index says: in every
    /// segment this process made, a put record is listed dead if and only if the index no
    /// longer points at it (after overwrites, deletes, batches, relocation, commits). A
    /// reopened store has lists only for segments made since.
    #[test]
    fn dead_record_lists_agree_with_the_index() {
        let check = |db: &crate::Database, expect_tracked: bool| {
            let (region, segments) = written_segments(db, "t");
            let (mut tracked, mut untracked, mut dead_seen, mut live_seen) = (0, 0, 0, 0);
            for (base, written) in segments {
                let Some(dead) = region.dead_records_of(DiskOffset(base)) else {
                    untracked += 1;
                    continue;
                };
                tracked += 1;
                let mut pos = 0;
                while pos < written {
                    let at = base + pos;
                    let (header, key) = region
                        .with_record(at, true, |r| (r.header, r.key.to_vec()))
                        .unwrap();
                    if !header.is_tombstone() && !header.is_link() {
                        let listed = dead.binary_search(&(pos as u32)).is_ok();
                        let live = region.is_live(&key, at).unwrap();
                        assert_eq!(listed, !live, "record at {at} of segment {base}");
                        if live {
                            live_seen += 1
                        } else {
                            dead_seen += 1
                        }
                    }
                    pos += header.total_bytes();
                }
            }
            assert_eq!(tracked > 0, expect_tracked);
            (tracked, untracked, dead_seen, live_seen)
        };
        let storage = std::sync::Arc::new(crate::volume::MemStorage::new());
        let open = || {
            crate::Database::builder()
                .commit_interval(None)
                .flush_interval(None)
                .log_segment_bytes(64 << 10)
                .open_storage(storage.clone())
                .unwrap()
        };
        let db = open();
        let ks = db.keyspace("t").unwrap();
        let mut rng = 7u64;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) as u32
        };
        for step in 0..12_000u32 {
            let k = format!("k{:05}", next() % 1500);
            match next() % 10 {
                0 => {
                    ks.delete(k.as_bytes()).unwrap();
                }
                1 => {
                    let mut batch = ks.batch();
                    batch.put(k.as_bytes(), &[1; 90]);
                    batch.put(k.as_bytes(), &[2; 90]);
                    batch.delete(format!("k{:05}", next() % 1500).as_bytes());
                    batch.commit().unwrap();
                }
                _ => ks
                    .put(
                        k.as_bytes(),
                        &vec![step as u8; 60 + (next() % 200) as usize],
                    )
                    .unwrap(),
            }
            if step % 3000 == 1499 {
                db.gc().unwrap();
            }
        }
        let (tracked, _, dead, live) = check(&db, true);
        assert!(
            tracked > 3 && dead > 100 && live > 100,
            "{tracked} {dead} {live}"
        );
        db.close().unwrap();
        // After a reopen, the old segments have no list; new ones do.
        let db = open();
        let ks = db.keyspace("t").unwrap();
        check(&db, false);
        for i in 0..3000u32 {
            ks.put(format!("k{:05}", i % 1500).as_bytes(), &[9; 100])
                .unwrap();
        }
        let (tracked, untracked, _, _) = check(&db, true);
        assert!(tracked > 0 && untracked > 0);
        db.gc().unwrap();
        check(&db, true);
    }

    /// Relocated copies fill segments of their own: no segment holds both a copy and a
    /// foreground record (the point of the relocation tail: survivors are mostly cold,
    /// and mixed with fresh writes they were copied again at every pass).
    #[test]
    fn relocation_and_foreground_never_share_a_segment() {
        let db = manual_small_segments();
        let ks = db.keyspace("t").unwrap();
        for round in 0..4u8 {
            for i in 0..3000u32 {
                if round > 0 && i % 4 != round as u32 {
                    continue;
                }
                ks.put(format!("k{i:05}").as_bytes(), &[round; 120])
                    .unwrap();
            }
            db.gc().unwrap();
        }
        assert!(db.stats().gc_relocated_bytes > 0);
        let segments = records_by_segment(&db, "t");
        assert!(
            segments.iter().any(|s| s.1 > 0),
            "no relocated copies: {segments:?}"
        );
        for (base, relocated, other) in &segments {
            assert!(
                *relocated == 0 || *other == 0,
                "segment at {base} holds {relocated} copies and {other} other records"
            );
        }
    }

    /// A segment's reader grace period starts when it is retired: a reader pinned before
    /// then holds it back (it may still read through a pointer it loaded before the
    /// relocation), one pinned after does not, and once the early reader is gone the
    /// segment is free the moment both durable commits are past it.
    #[test]
    fn a_retired_segment_waits_only_for_readers_pinned_before_it() -> Result<()> {
        let db = manual_small_segments();
        let ks = db.keyspace("t").unwrap();
        for round in 0..2u8 {
            for i in 0..2000u32 {
                ks.put(format!("k{i:05}").as_bytes(), &[round; 120])
                    .unwrap();
            }
        }
        // Past the newest commit's replay window (segments at or after its tail stay).
        db.commit()?;
        let region = db.engine.regions.get("t").unwrap();
        let dead: Vec<DiskOffset> = region
            .segments()
            .iter()
            .filter(|(_, s)| s.live_bytes == 0 && s.written_bytes > 0)
            .map(|(off, _)| DiskOffset(*off))
            .take(2)
            .collect();
        assert_eq!(dead.len(), 2, "the first round's segments are all dead");
        let readers_gone = |base: DiskOffset| region.retired_readers_gone(base);
        let nudge = || {
            for _ in 0..256 {
                crossbeam_epoch::pin().flush();
            }
        };
        // A reader pinned before the retirement holds its grace period open.
        let early_reader = crossbeam_epoch::pin();
        assert!(matches!(
            region.retire_segment(dead[0])?,
            Retire::Retired(_)
        ));
        nudge();
        assert!(!readers_gone(dead[0]));
        let (now, after) = region.reclaim_segments(region.tree().running_epoch());
        assert!(now.is_empty(), "{now:?}");
        assert_eq!(after, vec![(dead[0], 16)]);
        drop(early_reader);
        // Without one, the grace period ends while commits are still due.
        assert!(matches!(
            region.retire_segment(dead[1])?,
            Retire::Retired(_)
        ));
        let mut rounds = 0;
        while !readers_gone(dead[1]) {
            rounds += 1;
            assert!(rounds < 1000, "the grace period never ended");
            nudge();
        }
        let (now, after) = region.reclaim_segments(region.tree().running_epoch());
        assert_eq!(now, vec![(dead[1], 16)]);
        assert!(after.is_empty(), "{after:?}");
        Ok(())
    }

    /// A victim can be closed so recently that its write is still in flight (a
    /// relocation segment GC itself just filled); its bytes are then only in its closed
    /// tail's buffer. Read from the volume (an in-memory volume reads zeros where nothing
    /// was written), it parsed as nothing to copy or as corruption, and the pass failed
    /// or left the segment behind.
    #[test]
    fn a_victim_whose_write_is_in_flight_is_collected_from_its_buffer() -> Result<()> {
        // No background thread: closed segments wait in the queue until a sync, a commit
        // or a full budget runs them, so the last ones GC closes are in flight below.
        let db = manual_small_segments();
        let ks = db.keyspace("t").unwrap();
        let key = |i: u32| format!("k{i:05}").into_bytes();
        for i in 0..3000u32 {
            ks.put(&key(i), &[0; 120])?;
        }
        db.commit()?;
        for i in (0..3000u32).step_by(2) {
            ks.put(&key(i), &[1; 120])?;
        }
        db.commit()?;
        let shared = &db.engine.shared;
        let (region, _) = written_segments(&db, "t");
        let mut pinned = Default::default();
        let collect = |victim, stats, pinned: &mut _| {
            collect::collect_segment(
                shared,
                &region,
                victim,
                stats,
                &mut { f64::INFINITY },
                &mut Vec::new(),
                pinned,
            )
        };
        for (victim, stats) in victims(&region, Policy::Forced, &pinned) {
            let collected = collect(victim, stats, &mut pinned)?;
            assert!(matches!(collected, Collected::Retired), "{victim:?}");
        }
        assert!(db.stats().writes_in_flight_bytes > 0);
        let segments = region.segments();
        let guard = crossbeam_epoch::pin();
        let in_flight: Vec<(DiskOffset, SegmentStats)> = region
            .ship_segments(0, usize::MAX)
            .into_iter()
            .filter(|s| {
                s.relocation
                    && !s.open
                    && region
                        .buffered_segment(s.base, s.ready_bytes as usize, &guard)
                        .is_some()
            })
            .map(|s| (s.base, segments[&s.base.0]))
            .collect();
        drop(guard);
        let &(victim, stats) = in_flight
            .first()
            .expect("a closed relocation segment whose write is in flight");
        assert!(stats.live_bytes > 0);
        let collected = collect(victim, stats, &mut pinned)?;
        assert!(
            matches!(collected, Collected::Retired),
            "its live records were copied and it was retired"
        );
        for i in 0..3000u32 {
            let want = if i % 2 == 0 { 1 } else { 0 };
            assert_eq!(ks.get(&key(i))?, Some(vec![want; 120]), "k{i:05}");
        }
        db.commit()?;
        db.check()?;
        Ok(())
    }
}
