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

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::db::DbInner;
use crate::error::{Error, Result};
use crate::index::NODE_BYTES;
use crate::log::record::{Header, RecordRef, HEADER_BYTES};
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

/// Where background GC starts, as a share of the room the target leaves for garbage
/// ([`Footprint::target_room_bytes`]): a region whose dead log bytes exceed it is
/// collected back under it. The rest of the room is for what the collector cannot steer
/// at once: segments retired but not given back yet (two commits away), frees being
/// punched, a burst between two steps. How much that is depends on how fast the data set
/// is rewritten, not on its size, so the share is steered from the space the volume
/// really takes ([`next_start_share`]) between these bounds; a store starts at the
/// lowest.
const START_SHARE_MIN: f64 = 0.5;
const START_SHARE_MAX: f64 = 0.85;

/// Over the start line plus `URGENT_ABOVE_START` of the target's room, background GC
/// may also copy `URGENT_COPY_RATIO` bytes for every byte foreground writers append, on
/// top of its rate limit: it follows a burst of overwrites, at a bounded cost to them.
const URGENT_ABOVE_START: f64 = 0.15;

/// Steering of the start share by the volume's measured space amplification (allocated
/// bytes, unpunched frees included, over user bytes): over `SHARE_BACK_OFF_ABOVE` of the
/// target it falls by `SHARE_BACK_OFF_PER_SEC` a second (from the highest share to the
/// lowest in a third of a second); under `SHARE_GROW_BELOW` of the target, while the
/// collector is working (its line, not idleness, keeps the space there), it rises by
/// `SHARE_GROW_PER_SEC`. Fast down and slow up, so a burst that the lowest share cannot
/// hold under the target keeps the lowest share, and one that leaves room uses it.
///
/// The share steers by the recent peak of the measured ratio ([`held_peak`]), since it
/// swings by several hundredths with every commit pair that gives space back.
///
/// Why (`tucana-bench gc --fields 10 --field-bytes 100 --overwrites 8`, 2 quiet cores):
/// with 300k records the writers rewrite the data set every half second, the space on
/// its way back takes 0.1-0.3 of the user bytes and the peak is over 1.6 whatever the
/// line; with 1M records it takes a few hundredths, and the fixed half share held the
/// peak at 1.44 while relocating 1.9 bytes per byte written, at 0.60 of the throughput
/// with GC off.
const SHARE_BACK_OFF_ABOVE: f64 = 0.975;
const SHARE_GROW_BELOW: f64 = 0.95;
const SHARE_BACK_OFF_PER_SEC: f64 = 1.0;
const SHARE_GROW_PER_SEC: f64 = 0.1;

/// The held peak of the measured space amplification falls by this much a second.
const AMP_PEAK_FALL_PER_SEC: f64 = 0.05;

/// The start and urgent lines as shares of the floor's room
/// ([`Footprint::floor_room_bytes`]), for regions whose records are too small for the
/// target's room to mean much.
const FLOOR_START_SHARE: f64 = 0.9;
const FLOOR_URGENT_SHARE: f64 = 1.2;

/// Bytes background GC may copy per byte foreground writers append while urgent: what GC
/// may take from the writers during a burst. Where it is not enough, space runs over the
/// target until the burst ends, then the rate limit works it back down.
///
/// The trade-off, `tucana-bench gc --gc-records 300000 --overwrites 8 --fields 10
/// --field-bytes 100` (YCSB A, 2 threads, 2 quiet cores; the peak is of the file's
/// allocated bytes over user bytes, the throughput a share of the same run with GC off):
/// start and urgent lines at 0.9 and 1.2 of the room with 0.4 bytes a byte peaked at 1.98
/// at 0.87; at 0.5 and 0.65 with 1.5 bytes, 1.61 at 0.70; with 2 bytes, 1.58 at 0.72;
/// with 2.5 bytes, 1.54 at 0.66. Below 1.5 a burst this fast needs garbage under a fifth
/// of the live bytes, victims then three quarters full.
const URGENT_COPY_RATIO: f64 = 2.0;

/// Unspent urgent budget kept for later steps, at most.
const URGENT_TOKENS_MAX_BYTES: f64 = (32 << 20) as f64;

/// Write pacing, a brake for when garbage collection falls behind for good (more writer
/// threads than cores starve the collector's one thread, and the log would grow without
/// bound): once the store's garbage (smoothed; space on its way back only beyond a whole
/// room) passes `PACE_SHARE` times its room, foreground writers sleep
/// `PACE_GAIN_NS_PER_KIB` per KiB they append for every room beyond that line, up to
/// `PACE_MAX_NS_PER_KIB` (which slows a writer of 1 KiB records to a few thousand writes
/// a second: a brake, never a stop). Proportional, so it settles where the collector keeps up instead of
/// swinging between full speed and a crawl.
///
/// Why not from the target itself: a burst that rewrites the data set every two seconds
/// holds commit pairs' worth of retired space (the two-commit delay of freeing) plus the
/// collector's lag at 1.6-1.9 on 2 cores whatever the collector does; pacing from the
/// target (tried) cut throughput by about a quarter for a peak barely lower.
const PACE_SHARE: f64 = 2.0;
const PACE_GAIN_NS_PER_KIB: f64 = 20_000.0;
const PACE_MAX_NS_PER_KIB: u64 = 50_000;

/// The store's garbage is smoothed over about this long before pacing acts on it: it
/// swings by a tenth of the room with every commit pair that gives space back.
const PACE_SMOOTHING_SECONDS: f64 = 0.3;

/// Stores smaller than this on disk are never paced: a few dozen MiB over a ratio is not
/// worth slowing anybody, and a small store's ratio is dominated by fixed costs (a tail
/// segment).
const PACE_MIN_DISK_BYTES: f64 = (64 << 20) as f64;

/// Estimated bytes of index on disk per key: the committed tree (about 30 bytes per key,
/// DESIGN.md "Memory per key") counts against the target like the log does.
const INDEX_BYTES_PER_KEY: u64 = 32;

/// The floor's room for garbage: this share of `(target - 1)` times what a region takes
/// with no garbage at all (its live records, headers included, and its index), less
/// half of what the target leaves above that floor. The target counts disk bytes over
/// the keys and values users stored; small records cost more than that on their own (a
/// record of a 16-byte key and a 100-byte value takes 172 bytes with its header and
/// index entry, 1.48 times its user bytes), and chasing a line under that floor would
/// copy full segments for ever to win nothing: with the floor's room, victims of
/// uniformly overwritten small records are about half garbage. The larger the records,
/// the more the target leaves and the less the floor's room counts: for 1 KB values
/// both lines meet, beyond that the target's room decides.
const MIN_ROOM_SHARE: f64 = 0.8;

/// What the volume holds beyond the regions' logs and estimated index is measured at
/// every background step (`DbInner::measure_overhead`): index nodes copied on write
/// and not freed yet, retired segments, frees on their way back, tails written ahead.
/// It swings with every commit pair, so its peak is kept and decays by half every
/// `OVERHEAD_HALF_LIFE`.
const OVERHEAD_HALF_LIFE: Duration = Duration::from_secs(1);

/// The measured overhead counts at most this share of the regions' floor: a snapshot
/// holding a large part of the disk is not something relocation can give back.
const OVERHEAD_MAX_SHARE: f64 = 0.25;

/// Most bytes one background step relocates. Under a burst a step's budget takes one
/// thread seconds to copy; short steps keep the foreground's bytes measured often (the
/// budget follows the burst, not what it was seconds ago) and let a forced pass, which
/// waits for the collector's lock, start soon. (When steps ran in the committer's
/// thread, long ones also kept the commits that give space back waiting.) Unspent budget
/// stays for the next step, which follows without a tick's wait.
const STEP_MAX_BYTES: f64 = (8 << 20) as f64;

/// Shortest interval between the commit pairs GC asks for to give back the segments it
/// retired: each is back only after two commits sealed after its retirement, and until
/// then the disk holds it. A pair is one full commit (two fsyncs and the dirty index
/// nodes, under a burst nearly every leaf) and a repeat that writes no node.
const RETIRED_COMMIT_INTERVAL: Duration = Duration::from_millis(50);

/// Retired segments (and frees ready for the next commit) worth an early commit: this
/// share of the room the target leaves ((target - 1) × live bytes, all regions), so that
/// space GC already emptied never takes much of it; at least `RETIRED_COMMIT_MIN_BYTES`.
///
/// A fifth rather than a tenth: each pair seals the index, and every leaf written after
/// is copied again, by writers and collector under the writer lock. Alternating
/// `tucana-bench gc --gc-records 1000000 --overwrites 8 --fields 10 --field-bytes 100`
/// runs made 650-658 commits instead of 921-961 and ran at 284-303k ops/s instead of
/// 248-260k, peak 1.47-1.48 both ways (the start share gives the room back); with 300k
/// records the index's dirty nodes set the pace and nothing changed.
const RETIRED_COMMIT_SHARE: f64 = 0.2;
const RETIRED_COMMIT_MIN_BYTES: u64 = 4 << 20;

/// Frees at least this long are punched when a commit applies them (the commit's
/// `PUNCH_MIN_BLOCKS`): only those give disk space back, so only those ask for a commit.
const PUNCHED_MIN_BLOCKS: u64 = 16;

/// State of the collector, under `DbInner::gc`.
pub(crate) struct GcState {
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
}

impl GcState {
    pub fn new() -> GcState {
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
        }
    }
}

/// What a region holds on disk against what it holds for users, as the background
/// policy steers it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Footprint {
    /// Estimated bytes on disk that collecting can reduce, and the index: written log
    /// bytes of its segments (a tail's unwritten end is a hole in the file) and
    /// `INDEX_BYTES_PER_KEY` per key. Segments retired but not given back yet are left
    /// out: they come back with the next commit pair whatever GC does, and counting them
    /// made GC collect ever fuller victims during a burst.
    pub disk_bytes: f64,
    /// The part of `disk_bytes` collecting can give back: dead log bytes.
    pub garbage_bytes: f64,
    /// Keys and values of its live records (record headers excluded): what the user
    /// stored.
    pub user_bytes: f64,
    /// Its share (by floor) of what the volume holds beyond every region's log and
    /// estimated index (`DbInner::measure_overhead`): counted against the target, never
    /// collectable.
    pub overhead_bytes: f64,
}

impl Footprint {
    fn of(region: &Region, overhead_share: f64) -> Footprint {
        let live = region.live_bytes.load(Ordering::Relaxed);
        let dead = region.dead_bytes.load(Ordering::Relaxed);
        let keys = region.keys.load(Ordering::Relaxed);
        let intrinsic = (live + keys * INDEX_BYTES_PER_KEY) as f64;
        Footprint {
            disk_bytes: intrinsic + dead as f64,
            garbage_bytes: dead as f64,
            user_bytes: live.saturating_sub(keys * HEADER_BYTES as u64) as f64,
            overhead_bytes: intrinsic * overhead_share,
        }
    }

    /// What the region takes without garbage: live records and estimated index.
    fn floor_bytes(&self) -> f64 {
        self.disk_bytes - self.garbage_bytes
    }

    /// The garbage the space-amplification `target` leaves room for: what keeps disk
    /// bytes, overhead included, at `target` times user bytes (negative when small
    /// records alone exceed the target).
    pub fn target_room_bytes(&self, target: f64) -> f64 {
        target * self.user_bytes - self.floor_bytes() - self.overhead_bytes
    }

    /// The least room for garbage: `MIN_ROOM_SHARE × (target - 1)` times the floor,
    /// less half of what the target leaves above the floor (overhead not counted).
    pub fn floor_room_bytes(&self, target: f64) -> f64 {
        let floor = self.floor_bytes();
        let above = (target * self.user_bytes - floor).max(0.0);
        (MIN_ROOM_SHARE * (target - 1.0) * floor - above / 2.0).max(0.0)
    }

    /// The room for garbage: the target's, but never under the floor's.
    pub fn room_bytes(&self, target: f64) -> f64 {
        self.target_room_bytes(target)
            .max(self.floor_room_bytes(target))
    }

    /// Garbage bytes where background GC starts and where it turns urgent, with the
    /// start line at `start_share` of the target's room.
    fn lines_bytes(&self, target: f64, start_share: f64) -> (f64, f64) {
        let room = self.target_room_bytes(target);
        let floor_room = self.floor_room_bytes(target);
        (
            (start_share * room).max(FLOOR_START_SHARE * floor_room),
            ((start_share + URGENT_ABOVE_START) * room).max(FLOOR_URGENT_SHARE * floor_room),
        )
    }
}

/// The start line's share of the target's room after `elapsed_secs` at a measured
/// space amplification of `amp` (the volume's allocated bytes over user bytes), from
/// `share`; `collecting` tells whether the collector is working (see
/// `SHARE_BACK_OFF_ABOVE`).
pub(crate) fn next_start_share(
    share: f64,
    amp: f64,
    target: f64,
    collecting: bool,
    elapsed_secs: f64,
) -> f64 {
    let elapsed_secs = elapsed_secs.clamp(0.0, 1.0);
    let next = if amp > SHARE_BACK_OFF_ABOVE * target {
        share - SHARE_BACK_OFF_PER_SEC * elapsed_secs
    } else if collecting && amp < SHARE_GROW_BELOW * target {
        share + SHARE_GROW_PER_SEC * elapsed_secs
    } else {
        share
    };
    // NaN (an amp of 0/0) keeps the share where it was.
    if next.is_nan() {
        return share;
    }
    next.clamp(START_SHARE_MIN, START_SHARE_MAX)
}

/// The recent peak of a ratio measured at `amp` now, `elapsed_secs` after it was `peak`:
/// the higher of the two, the old one fallen by `AMP_PEAK_FALL_PER_SEC`.
pub(crate) fn held_peak(peak: f64, amp: f64, elapsed_secs: f64) -> f64 {
    let fallen = peak - AMP_PEAK_FALL_PER_SEC * elapsed_secs.max(0.0);
    if amp.is_nan() {
        fallen
    } else {
        amp.max(fallen)
    }
}

/// How hard background GC works on one region this step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Urge {
    /// Under the start line: nothing to do.
    Idle,
    /// Between the start line and the urgent one: collect down to the start line,
    /// within the rate limit.
    Gentle { excess_bytes: f64 },
    /// Over the urgent line: collect down to the start line now, whatever the rate.
    Urgent { excess_bytes: f64 },
}

/// What the background collector should do for a region with `footprint`, given the
/// space-amplification `target` and the start line's share of its room: the bytes over
/// its start line, and whether the rate limit applies.
pub(crate) fn urge(footprint: Footprint, target: f64, start_share: f64) -> Urge {
    let garbage = footprint.garbage_bytes;
    let (start_bytes, urgent_bytes) = footprint.lines_bytes(target, start_share);
    // NaN counts as under: nothing to measure, nothing to chase.
    if garbage <= 0.0 || garbage.partial_cmp(&start_bytes) != Some(std::cmp::Ordering::Greater) {
        return Urge::Idle;
    }
    let excess_bytes = garbage - start_bytes;
    if garbage > urgent_bytes {
        Urge::Urgent { excess_bytes }
    } else {
        Urge::Gentle { excess_bytes }
    }
}

/// The pacing delay (ns per KiB a foreground writer appends) for a store whose smoothed
/// garbage (everything on its way back included) is `garbage_share` times its room.
/// `gc_can_help`: the collector has victims or space on its way back; when it has neither
/// (a snapshot holds the garbage, or what is left costs too much to collect), slowing
/// writers would buy nothing and there is no pacing.
pub fn write_delay(garbage_share: f64, gc_can_help: bool) -> u64 {
    if !gc_can_help || garbage_share.partial_cmp(&PACE_SHARE) != Some(std::cmp::Ordering::Greater) {
        return 0;
    }
    let excess = garbage_share - PACE_SHARE;
    (PACE_GAIN_NS_PER_KIB * excess).min(PACE_MAX_NS_PER_KIB as f64) as u64
}

/// The garbage pacing weighs: the regions' `garbage_bytes` and, of the `returning_bytes`
/// on their way back to the file system, what exceeds one `room_bytes`. The returning
/// space is already in the measured overhead, which shrinks the room; counting all of it
/// as garbage too paced writers for space a commit pair was about to give back (they
/// slept a quarter of a burst). A pile beyond a whole room means commits fall behind the
/// collector, and that does call for the brake.
pub(crate) fn pacing_garbage_bytes(
    garbage_bytes: f64,
    returning_bytes: f64,
    room_bytes: f64,
) -> f64 {
    garbage_bytes + (returning_bytes - room_bytes.max(0.0)).max(0.0)
}

/// Background victims go best first by LFS's cost-benefit rule: the space a segment gives
/// back (`1 - u`) times how long its data has been left alone, over what collecting it
/// costs (reading it, `1`, and writing its live share `u` again). Age is in segments
/// allocated since (`newest_order - order`). Least-live-first would take young
/// segments whose hot records die on their own a moment later, and copy records
/// that survived once (cold ones, which fill relocation segments) again and again;
/// simulated on 8 overwrites of zipfian updates with a relocation log, it copied 1.23
/// records per update against 0.78 for cost-benefit.
pub(crate) fn victim_score(stats: &SegmentStats, newest_order: u64) -> f64 {
    let u = stats.live_bytes as f64 / stats.size_bytes.max(1) as f64;
    let age = newest_order.saturating_sub(stats.order) as f64 + 1.0;
    (1.0 - u) * age / (1.0 + u)
}

/// How a pass picks its victims.
#[derive(Clone, Copy, Debug)]
enum Policy {
    /// Segments at most `max_live_ratio` full, best [`victim_score`] first.
    Background { max_live_ratio: f64 },
    /// Every eligible segment at most `FORCED_MAX_LIVE_RATIO` full, least full first.
    Forced,
}

/// The segments of `region` to collect, best first.
fn victims(
    region: &Region,
    policy: Policy,
    pinned: &HashSet<(RegionId, u64)>,
) -> Vec<(DiskOffset, SegmentStats)> {
    let max_live_ratio = match policy {
        Policy::Background { max_live_ratio } => max_live_ratio,
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
    match policy {
        Policy::Background { .. } => {
            let newest = out.iter().map(|(_, s)| s.order).max().unwrap_or(0);
            out.sort_by(|a, b| {
                victim_score(&b.1, newest)
                    .total_cmp(&victim_score(&a.1, newest))
                    .then(a.0.cmp(&b.0))
            });
        }
        Policy::Forced => {
            // Least live first: the most space back for the least copying.
            out.sort_by(|a, b| {
                let ra = a.1.live_bytes as f64 / a.1.size_bytes as f64;
                let rb = b.1.live_bytes as f64 / b.1.size_bytes as f64;
                ra.total_cmp(&rb).then(a.0.cmp(&b.0))
            });
        }
    }
    out
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
    state: &mut GcState,
) -> Result<Collected> {
    if stats.live_bytes > 0 {
        // Read in place through the volume's mapping when it has one (a copy into the
        // pass's buffer otherwise). The pin keeps the segment allocated while we read it
        // even if the region is dropped meanwhile: a dropped region's segments are freed
        // through the same reader grace period.
        let _pin = crossbeam_epoch::pin();
        // SAFETY: the victim is closed and flushed, and only this pass retires it: its
        // bytes up to `written` are never written again while the region can reach it,
        // and the pin outlives `buf`.
        let buf = unsafe {
            db.shared
                .volume
                .view(victim.0, stats.written_bytes as usize, &mut state.buf)?
        };
        let puts = parse_puts(victim, buf)?;
        // Where the writers listed the segment's dead records (a segment this process
        // made), those are skipped and the rest go straight to relocation, which checks
        // each against the index anyway; otherwise each record is looked up.
        let dead = region.dead_records_of(victim);
        let mut dead_next = 0usize;
        let mut records: Vec<(u64, &[u8], &[u8])> = Vec::with_capacity(RELOCATE_CHUNK_RECORDS);
        let mut puts = puts.iter();
        loop {
            // Dead records are left out without the writer lock, so foreground writers
            // wait only for the copies.
            records.clear();
            for p in puts.by_ref() {
                let key = &buf[p.key.clone()];
                let live = match &dead {
                    Some(dead) => {
                        let offset = p.at - victim.0;
                        while dead.get(dead_next).is_some_and(|&d| u64::from(d) < offset) {
                            dead_next += 1;
                        }
                        dead.get(dead_next).is_none_or(|&d| u64::from(d) != offset)
                    }
                    None => region.is_live(key, p.at)?,
                };
                if live {
                    let (key, value) = verified(region, p, buf)?;
                    records.push((p.at, key, value));
                    if records.len() == RELOCATE_CHUNK_RECORDS {
                        break;
                    }
                }
            }
            if records.is_empty() {
                break;
            }
            if *budget_bytes <= 0.0 {
                return Ok(Collected::OutOfBudget);
            }
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

/// The key and value of `put`, once its crc (seeded with `region`'s id) is checked: a
/// damaged live record is reported, never copied under a fresh crc that would hide it.
fn verified<'b>(region: &Region, put: &PutAt, buf: &'b [u8]) -> Result<(&'b [u8], &'b [u8])> {
    let bytes = &buf[put.key.start - HEADER_BYTES..put.value.end];
    let rec = RecordRef::parse(bytes, region.seed, true, DiskOffset(put.at))?;
    Ok((rec.key, rec.value))
}

/// The put records of a segment's first `buf.len()` bytes, their headers checked but not
/// their crcs: only the records that are copied are verified ([`verified`]), so a
/// collection reads each dead byte once (to step over it) and a damaged dead record does
/// not keep its segment's space.
fn parse_puts(base: DiskOffset, buf: &[u8]) -> Result<Vec<PutAt>> {
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
        if !header.is_tombstone() && !header.is_link() {
            let key_at = pos + HEADER_BYTES;
            let value_at = key_at + header.key_len as usize;
            out.push(PutAt {
                at: at.0,
                key: key_at..value_at,
                value: value_at..pos + len,
            });
        }
        pos += len;
    }
    Ok(out)
}

impl DbInner {
    /// One background step: every region over its start line ([`urge`]) is collected
    /// back under it, best victims first ([`victim_score`]); gently (within the
    /// `gc_rate_bytes_per_sec` budget) while under the urgent line, at once over it.
    /// A step relocates at most `STEP_MAX_BYTES`.
    ///
    /// Returns true if it stopped at `STEP_MAX_BYTES` with work left: the background loop
    /// then runs the next step without waiting for its tick.
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
        self.measure_overhead(state);
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
        let regions = self.region_list();
        for region in &regions {
            let region = &**region;
            let footprint = Footprint::of(region, self.overhead_share());
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
        state.collecting = worked;
        self.update_write_pacing(state, &regions, victims_found);
        Ok(cut_short)
    }

    /// The measured overhead per byte of floor (`OVERHEAD_HALF_LIFE`).
    fn overhead_share(&self) -> f64 {
        f64::from_bits(self.shared.gc_overhead_share_bits.load(Ordering::Relaxed))
    }

    /// Measures what the volume holds beyond the regions' logs and estimated index, per
    /// byte of their floor, and keeps its decaying peak for [`Footprint::of`]; from the
    /// same reading, steers the start line's share ([`next_start_share`]).
    fn measure_overhead(&self, state: &mut GcState) {
        // Segments released but not punched yet (`release_extents`) are free in the bitmap
        // and still on the disk.
        let allocated = (self.shared.allocator.allocated_blocks() * BLOCK_BYTES
            + self.shared.allocator.deferred_bytes()) as f64;
        let (mut disk, mut floor, mut user) = (0.0, 0.0, 0.0);
        for region in self.region_list() {
            let f = Footprint::of(&region, 0.0);
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
        self.shared
            .gc_overhead_share_bits
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
            let f = Footprint::of(region, self.overhead_share());
            disk_bytes += f.disk_bytes;
            garbage_bytes += f.garbage_bytes;
            room_bytes += f.room_bytes(target).max(0.0);
            returning_bytes += reclaimable_retired_bytes(region);
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
                    Footprint::of(region, self.overhead_share()),
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
            match collect_segment(self, region, victim, stats, budget_bytes, state)? {
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
    pub(crate) fn gc_full(&self) -> Result<()> {
        let mut state = self.gc.lock();
        let state = &mut *state;
        self.commit_pair()?;
        state.pinned.clear();
        let mut budget = f64::INFINITY;
        for region in self.region_list() {
            region.close_dead_gc_tail()?;
            let victims = victims(&region, Policy::Forced, &state.pinned);
            self.collect_victims(&region, Policy::Forced, victims, &mut budget, state)?;
        }
        // The first commit seals the epoch the segments were retired in; its repeat makes
        // that seal the older durable one too, so its end reclaims them.
        self.commit_pair()?;
        for _ in 0..GRACE_ATTEMPTS {
            if self.shared.frees.lock().limbo.is_empty() {
                break;
            }
            crossbeam_epoch::pin().flush();
            std::thread::yield_now();
        }
        // Hands what is releasable to the allocator, punching holes (deferred ones too).
        self.commit()?;
        crate::commit::punch_deferred(&self.shared, Duration::ZERO);
        self.shared.gc_passes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether a commit would move freed space along. Space comes back only after two
    /// commits (the one that stops referencing it and the one after, which lets go of the
    /// older durable commit) and a reader grace period, so an idle store that never
    /// commits would keep it for ever: frees waiting in any of those steps, segments
    /// retired by GC, nodes replaced by copy-on-write.
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
    pub(crate) fn gc_commit_due(&self, since_commit: Duration) -> bool {
        if since_commit < RETIRED_COMMIT_INTERVAL {
            return false;
        }
        let target = self.shared.options.gc_space_amp;
        let regions = self.region_list();
        let mut room_bytes = 0.0;
        let mut held_bytes = 0u64;
        let mut dirty_bytes = 0u64;
        for region in &regions {
            room_bytes += Footprint::of(region, self.overhead_share())
                .room_bytes(target)
                .max(0.0);
            held_bytes += reclaimable_retired_bytes(region);
            dirty_bytes += region.tree.dirty_nodes() * NODE_BYTES as u64;
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
    pub(crate) fn gc_commit_pair(&self) -> Result<()> {
        self.commit_pair()?;
        // No yield between nudges: on a busy machine each yield gave the core away for a
        // time slice (tens of milliseconds for the eight, with a hundred MiB waiting);
        // what is still in limbo goes at the committer's next wake-up. Segments rarely
        // wait here: their grace period began when they were retired.
        for _ in 0..GRACE_NUDGES {
            if self.shared.frees.lock().limbo.is_empty() {
                break;
            }
            crossbeam_epoch::pin().flush();
        }
        self.release_frees_now();
        Ok(())
    }

    /// Hands the frees that passed the reader grace period to the allocator now, punching
    /// the file's holes, instead of at the start of the next commit: the bytes go back
    /// to the file system as soon as nothing can read them. Skipped while a commit runs
    /// (its first step takes them). Equivalent to that first step: both durable commits'
    /// free logs or bitmaps already count these blocks as unreferenced, and the next
    /// commit's bitmap image shows them free either way.
    pub(crate) fn release_frees_now(&self) {
        let Some(_cs) = self.commit_state.try_lock() else {
            return;
        };
        if self.shared.is_poisoned() {
            return;
        }
        let releasable = std::mem::take(&mut self.shared.frees.lock().releasable);
        crate::commit::release_extents(&self.shared, &releasable);
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
    use crate::log::record;

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
        let region = db.inner.regions.read().get(name).cloned().unwrap();
        let segments = region
            .writer
            .lock()
            .segments
            .iter()
            .map(|(off, s)| (*off, s.written_bytes))
            .collect();
        (region, segments)
    }

    /// An in-memory store committed only by hand, with 64 KiB log segments.
    fn manual_small_segments() -> crate::Database {
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
        let storage = db.inner.shared.volume.storage().clone();
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
        let region = db.inner.regions.read().get("t").cloned().unwrap();
        {
            // What `relocate` does before it takes the writer lock: a copy in the tail.
            let guard = crossbeam_epoch::pin();
            let tail = region.gc_tail.load(Ordering::Acquire, &guard);
            // SAFETY: protected by the guard; nothing else appends here (no pass runs).
            let t = unsafe { tail.as_ref() }.expect("a relocation tail");
            assert!(t.free_bytes() > 200);
            // SAFETY: the collector is idle: this test is the only appender.
            unsafe {
                t.append(HEADER_BYTES + 6 + 100, |buf| {
                    record::encode_into(
                        buf,
                        record::region_seed(region.id),
                        record::FLAG_RELOCATED,
                        region.generation,
                        crate::types::SeqNo(0),
                        b"k00001",
                        &[7; 100],
                    )
                })
            };
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
        let region = db.inner.regions.read().get("t").cloned().unwrap();
        let dead: Vec<DiskOffset> = region
            .writer
            .lock()
            .segments
            .iter()
            .filter(|(_, s)| s.live_bytes == 0 && s.written_bytes > 0)
            .map(|(off, _)| DiskOffset(*off))
            .take(2)
            .collect();
        assert_eq!(dead.len(), 2, "the first round's segments are all dead");
        let readers_gone = |base: DiskOffset| {
            let list = region.retired_segments.lock();
            let r = list.iter().find(|r| r.base == base).expect("retired");
            r.readers_gone.load(Ordering::Acquire)
        };
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
        let (now, after) = region.reclaim_segments(region.tree.running_epoch());
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
        let (now, after) = region.reclaim_segments(region.tree.running_epoch());
        assert_eq!(now, vec![(dead[1], 16)]);
        assert!(after.is_empty(), "{after:?}");
        Ok(())
    }

    /// A region of large records (headers and index left out) at space amplification
    /// `amp`, with `overhead` bytes of the volume's beyond its log.
    fn footprint_with(amp: f64, overhead: f64) -> Footprint {
        Footprint {
            disk_bytes: amp * 1e8,
            garbage_bytes: (amp - 1.0) * 1e8,
            user_bytes: 1e8,
            overhead_bytes: overhead,
        }
    }

    fn footprint(amp: f64) -> Footprint {
        footprint_with(amp, 0.0)
    }

    /// [`urge`] with the start line where a store starts: the lowest share.
    fn urge_min(footprint: Footprint, target: f64) -> Urge {
        urge(footprint, target, START_SHARE_MIN)
    }

    #[test]
    fn under_the_start_line_nothing_to_do() {
        // Start line for a target of 1.5: half the target's room (0.5 × user bytes),
        // 1.25.
        for amp in [1.0, 1.2, 1.25] {
            assert_eq!(urge_min(footprint(amp), 1.5), Urge::Idle, "{amp}");
        }
        let empty = Footprint {
            disk_bytes: 0.0,
            garbage_bytes: 0.0,
            user_bytes: 0.0,
            overhead_bytes: 0.0,
        };
        assert_eq!(urge_min(empty, 1.5), Urge::Idle);
    }

    #[test]
    fn between_the_lines_gently_then_urgently_back_to_the_start_line() {
        // Urgent line for 1.5: 0.65 of the room, 1.325.
        match urge_min(footprint(1.3), 1.5) {
            Urge::Gentle { excess_bytes } => assert!((excess_bytes - 0.05e8).abs() < 1.0),
            other => panic!("{other:?}"),
        }
        match urge_min(footprint(2.0), 1.5) {
            Urge::Urgent { excess_bytes } => assert!((excess_bytes - 0.75e8).abs() < 1.0),
            other => panic!("{other:?}"),
        }
        // Garbage without live data: as urgent as it gets.
        let garbage_only = Footprint {
            disk_bytes: 1e6,
            garbage_bytes: 1e6,
            user_bytes: 0.0,
            overhead_bytes: 0.0,
        };
        assert!(matches!(urge_min(garbage_only, 1.5), Urge::Urgent { .. }));
    }

    #[test]
    fn a_looser_target_starts_later() {
        assert_eq!(urge_min(footprint(1.45), 2.0), Urge::Idle);
        assert!(matches!(
            urge_min(footprint(1.45), 1.5),
            Urge::Urgent { .. }
        ));
        assert!(matches!(urge_min(footprint(1.3), 1.5), Urge::Gentle { .. }));
    }

    #[test]
    fn what_the_disk_holds_beyond_the_log_shrinks_the_room() {
        // 0.2 of the user bytes in copied index nodes and segments on their way back:
        // the target's room is 0.3, the start line 0.15 (the floor's line: 0.9 × (0.4 -
        // 0.5 / 2), 0.135).
        assert_eq!(urge_min(footprint(1.18), 1.5), Urge::Idle);
        match urge_min(footprint_with(1.18, 0.2e8), 1.5) {
            Urge::Gentle { excess_bytes } => assert!((excess_bytes - 0.03e8).abs() < 1.0),
            other => panic!("{other:?}"),
        }
        assert!((footprint_with(1.0, 0.2e8).room_bytes(1.5) - 0.3e8).abs() < 1.0);
        // However much it holds, the floor's room stays.
        assert!((footprint_with(1.0, 1e9).room_bytes(1.5) - 0.15e8).abs() < 1.0);
    }

    #[test]
    fn a_higher_start_share_lets_more_garbage_wait() {
        // Target 1.5, room 0.5 × user bytes: at the highest share GC starts at 1.425 and
        // turns urgent past the target's own room.
        assert!(matches!(urge_min(footprint(1.3), 1.5), Urge::Gentle { .. }));
        assert_eq!(urge(footprint(1.3), 1.5, START_SHARE_MAX), Urge::Idle);
        match urge(footprint(1.45), 1.5, START_SHARE_MAX) {
            Urge::Gentle { excess_bytes } => assert!((excess_bytes - 0.025e8).abs() < 1.0),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            urge(footprint(1.51), 1.5, START_SHARE_MAX),
            Urge::Urgent { .. }
        ));
    }

    #[test]
    fn the_start_share_rises_slowly_while_space_is_well_under_the_target() {
        let mut share = START_SHARE_MIN;
        // Collecting at 1.3 against 1.5: up by the grow rate, never past the highest.
        share = next_start_share(share, 1.3, 1.5, true, 1.0);
        assert!((share - (START_SHARE_MIN + SHARE_GROW_PER_SEC)).abs() < 1e-9);
        for _ in 0..100 {
            share = next_start_share(share, 1.3, 1.5, true, 1.0);
        }
        assert_eq!(share, START_SHARE_MAX);
        // Not collecting, or close to the target: no evidence that more would fit.
        let mid = 0.6;
        assert_eq!(next_start_share(mid, 1.3, 1.5, false, 1.0), mid);
        assert_eq!(next_start_share(mid, 1.44, 1.5, true, 1.0), mid);
        // A long gap counts as one second at most.
        assert!(
            (next_start_share(mid, 1.3, 1.5, true, 60.0) - (mid + SHARE_GROW_PER_SEC)).abs() < 1e-9
        );
    }

    #[test]
    fn the_start_share_falls_fast_once_space_nears_the_target() {
        // Over 0.97 of the target, collecting or not: the lowest share within a second.
        for collecting in [false, true] {
            let mut share = START_SHARE_MAX;
            share = next_start_share(share, 1.47, 1.5, collecting, 0.1);
            assert!(share < START_SHARE_MAX - 0.05, "{share}");
            share = next_start_share(share, 1.6, 1.5, collecting, 1.0);
            assert_eq!(share, START_SHARE_MIN);
        }
        // Nothing measurable leaves it where it was.
        assert_eq!(next_start_share(0.6, f64::NAN, 1.5, true, 1.0), 0.6);
    }

    #[test]
    fn the_peak_steered_by_holds_a_swing_and_falls_slowly() {
        // A commit pair gives space back: 1.46 then 1.40 a tenth of a second later.
        let peak = held_peak(0.0, 1.46, 0.1);
        assert_eq!(peak, 1.46);
        let peak = held_peak(peak, 1.40, 0.1);
        assert!((peak - (1.46 - AMP_PEAK_FALL_PER_SEC * 0.1)).abs() < 1e-9);
        // A new high replaces it at once.
        assert_eq!(held_peak(peak, 1.48, 0.1), 1.48);
        // Long after, the ratio itself.
        assert_eq!(held_peak(1.46, 1.40, 10.0), 1.40);
    }

    #[test]
    fn overhead_of_small_records_is_not_garbage() {
        // 100k keys of 16 bytes with 100-byte values: 172 bytes each on disk with header
        // and index entry, 1.48 times the 116 user bytes, before any garbage.
        let keys = 1e5;
        let small = |garbage_per_key: f64| Footprint {
            disk_bytes: (172.0 + garbage_per_key) * keys,
            garbage_bytes: garbage_per_key * keys,
            user_bytes: 116.0 * keys,
            overhead_bytes: 0.0,
        };
        // The target leaves 2 bytes a key; the floor's room is 0.4 of 172 less 1, its
        // lines at 0.9 and 1.2 of that.
        let room = 0.8 * 0.5 * 172.0 - 1.0;
        assert!((small(0.0).room_bytes(1.5) - room * keys).abs() < 1.0);
        assert_eq!(urge_min(small(0.0), 1.5), Urge::Idle);
        assert_eq!(urge_min(small(0.85 * room), 1.5), Urge::Idle);
        match urge_min(small(room), 1.5) {
            Urge::Gentle { excess_bytes } => {
                assert!((excess_bytes - 0.1 * room * keys).abs() < 1.0)
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            urge_min(small(1.3 * room), 1.5),
            Urge::Urgent { .. }
        ));
        // Large records: the target decides, the floor does not.
        assert!((footprint(1.0).room_bytes(1.5) - 0.5e8).abs() < 1.0);
    }

    fn segment(live_bytes: u64, order: u64) -> SegmentStats {
        SegmentStats {
            size_bytes: 1000,
            written_bytes: 1000,
            live_bytes,
            order,
        }
    }

    #[test]
    fn no_pacing_below_twice_the_room_or_when_gc_cannot_help() {
        for share in [0.0, 1.0, 1.99, 2.0] {
            assert_eq!(write_delay(share, true), 0, "{share}");
        }
        assert_eq!(write_delay(3.0, false), 0);
        assert_eq!(write_delay(f64::NAN, true), 0);
    }

    #[test]
    fn space_on_its_way_back_counts_for_pacing_only_beyond_one_room() {
        let room = 100.0;
        assert_eq!(pacing_garbage_bytes(50.0, 0.0, room), 50.0);
        assert_eq!(pacing_garbage_bytes(50.0, 100.0, room), 50.0);
        assert_eq!(pacing_garbage_bytes(50.0, 180.0, room), 130.0);
        // No room at all: everything on its way back weighs.
        assert_eq!(pacing_garbage_bytes(50.0, 30.0, -20.0), 80.0);
        // A pile of commits falling behind alone can cross the pacing line.
        let share = pacing_garbage_bytes(0.0, 400.0, room) / room;
        assert!(write_delay(share, true) > 0);
        assert_eq!(
            write_delay(pacing_garbage_bytes(0.0, 250.0, room) / room, true),
            0
        );
    }

    #[test]
    fn pacing_grows_with_the_excess_up_to_a_cap() {
        let mut last = 0;
        for share in [2.1, 2.4, 3.0, 3.8] {
            let delay = write_delay(share, true);
            assert!(delay > last, "{share}: {delay} after {last}");
            last = delay;
        }
        // One room past the line: the gain.
        assert_eq!(write_delay(3.0, true), PACE_GAIN_NS_PER_KIB as u64);
        assert_eq!(write_delay(100.0, true), PACE_MAX_NS_PER_KIB);
        assert_eq!(write_delay(f64::INFINITY, true), PACE_MAX_NS_PER_KIB);
    }

    #[test]
    fn emptier_segments_score_higher_at_equal_age() {
        let newest = 100;
        let mut last = f64::INFINITY;
        for live in [0, 100, 400, 700, 1000] {
            let score = victim_score(&segment(live, 50), newest);
            assert!(score < last, "{live}: {score} after {last}");
            last = score;
        }
        assert_eq!(victim_score(&segment(1000, 50), newest), 0.0);
    }

    #[test]
    fn older_segments_score_higher_at_equal_fill() {
        // A young segment still loses records on its own; an old one has settled.
        assert!(victim_score(&segment(400, 10), 100) > victim_score(&segment(400, 90), 100));
        // Age can outweigh fill: an old half-live segment before a young 30%-live one.
        assert!(victim_score(&segment(500, 0), 100) > victim_score(&segment(300, 95), 100));
    }
}
