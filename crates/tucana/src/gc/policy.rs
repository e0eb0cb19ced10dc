//! The background collector's control law: when a region's garbage is worth collecting
//! and how urgently, how the start line follows the space the volume really takes, when
//! foreground writers are paced, and which victims go first. Pure functions of the
//! readings the collector takes, and the constants they were tuned with (each with the
//! measurement behind it).
//!
//! Owns: the numbers and the decisions (DESIGN.md "Garbage collection", "Background
//! policy"). Does not own: taking the readings, collecting, committing (`super`).
//!
//! Thread-safety: no state; everything here is a function of its arguments.

use std::time::Duration;

use crate::log::record::HEADER_BYTES;
use crate::log::SegmentStats;

/// Where background GC starts, as a share of the room the target leaves for garbage
/// ([`Footprint::target_room_bytes`]): a region whose dead log bytes exceed it is
/// collected back under it. The rest of the room is for what the collector cannot steer
/// at once: segments retired but not given back yet (two commits away), frees being
/// punched, a burst between two steps. How much that is depends on how fast the data set
/// is rewritten, not on its size, so the share is steered from the space the volume
/// really takes ([`next_start_share`]) between these bounds; a store starts at the
/// lowest.
pub(super) const START_SHARE_MIN: f64 = 0.5;
pub(super) const START_SHARE_MAX: f64 = 0.85;

/// Over the start line plus `URGENT_ABOVE_START` of the target's room, background GC
/// may also copy `URGENT_COPY_RATIO` bytes for every byte foreground writers append, on
/// top of its rate limit: it follows a burst of overwrites, at a bounded cost to them.
pub(super) const URGENT_ABOVE_START: f64 = 0.15;

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
pub(super) const SHARE_BACK_OFF_ABOVE: f64 = 0.975;
pub(super) const SHARE_GROW_BELOW: f64 = 0.95;
pub(super) const SHARE_BACK_OFF_PER_SEC: f64 = 1.0;
pub(super) const SHARE_GROW_PER_SEC: f64 = 0.1;

/// The held peak of the measured space amplification falls by this much a second.
pub(super) const AMP_PEAK_FALL_PER_SEC: f64 = 0.05;

/// The start and urgent lines as shares of the floor's room
/// ([`Footprint::floor_room_bytes`]), for regions whose records are too small for the
/// target's room to mean much.
pub(super) const FLOOR_START_SHARE: f64 = 0.9;
pub(super) const FLOOR_URGENT_SHARE: f64 = 1.2;

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
pub(super) const URGENT_COPY_RATIO: f64 = 2.0;

/// Unspent urgent budget kept for later steps, at most.
pub(super) const URGENT_TOKENS_MAX_BYTES: f64 = (32 << 20) as f64;

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
pub(super) const PACE_SHARE: f64 = 2.0;
pub(super) const PACE_GAIN_NS_PER_KIB: f64 = 20_000.0;
pub(super) const PACE_MAX_NS_PER_KIB: u64 = 50_000;

/// The store's garbage is smoothed over about this long before pacing acts on it: it
/// swings by a tenth of the room with every commit pair that gives space back.
pub(super) const PACE_SMOOTHING_SECONDS: f64 = 0.3;

/// Stores smaller than this on disk are never paced: a few dozen MiB over a ratio is not
/// worth slowing anybody, and a small store's ratio is dominated by fixed costs (a tail
/// segment).
pub(super) const PACE_MIN_DISK_BYTES: f64 = (64 << 20) as f64;

/// Estimated bytes of index on disk per key: the committed tree (about 30 bytes per key,
/// DESIGN.md "Memory per key") counts against the target like the log does.
pub(super) const INDEX_BYTES_PER_KEY: u64 = 32;

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
pub(super) const MIN_ROOM_SHARE: f64 = 0.8;

/// What the volume holds beyond the regions' logs and estimated index is measured at
/// every background step (`Collector::measure_overhead`): index nodes copied on write
/// and not freed yet, retired segments, frees on their way back, tails written ahead.
/// It swings with every commit pair, so its peak is kept and decays by half every
/// `OVERHEAD_HALF_LIFE`.
pub(super) const OVERHEAD_HALF_LIFE: Duration = Duration::from_secs(1);

/// The measured overhead counts at most this share of the regions' floor: a snapshot
/// holding a large part of the disk is not something relocation can give back.
pub(super) const OVERHEAD_MAX_SHARE: f64 = 0.25;

/// Most bytes one background step relocates. Under a burst a step's budget takes one
/// thread seconds to copy; short steps keep the foreground's bytes measured often (the
/// budget follows the burst, not what it was seconds ago) and let a forced pass, which
/// waits for the collector's lock, start soon. (When steps ran in the committer's
/// thread, long ones also kept the commits that give space back waiting.) Unspent budget
/// stays for the next step, which follows without a tick's wait.
pub(super) const STEP_MAX_BYTES: f64 = (8 << 20) as f64;

/// Shortest interval between the commit pairs GC asks for to give back the segments it
/// retired: each is back only after two commits sealed after its retirement, and until
/// then the disk holds it. A pair is one full commit (two fsyncs and the dirty index
/// nodes, under a burst nearly every leaf) and a repeat that writes no node.
pub(super) const RETIRED_COMMIT_INTERVAL: Duration = Duration::from_millis(50);

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
pub(super) const RETIRED_COMMIT_SHARE: f64 = 0.2;
pub(super) const RETIRED_COMMIT_MIN_BYTES: u64 = 4 << 20;

/// What a region holds on disk against what it holds for users, as the background
/// policy steers it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Footprint {
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
    /// estimated index (`Collector::measure_overhead`): counted against the target, never
    /// collectable.
    pub overhead_bytes: f64,
}

impl Footprint {
    /// A region holding `live_bytes` of live records (`keys` of them) and `dead_bytes`
    /// of garbage, charged `overhead_share` of its floor for what the volume holds beyond
    /// every region's log and estimated index.
    pub(super) fn new(
        live_bytes: u64,
        dead_bytes: u64,
        keys: u64,
        overhead_share: f64,
    ) -> Footprint {
        let intrinsic = (live_bytes + keys * INDEX_BYTES_PER_KEY) as f64;
        Footprint {
            disk_bytes: intrinsic + dead_bytes as f64,
            garbage_bytes: dead_bytes as f64,
            user_bytes: live_bytes.saturating_sub(keys * HEADER_BYTES as u64) as f64,
            overhead_bytes: intrinsic * overhead_share,
        }
    }

    /// What the region takes without garbage: live records and estimated index.
    pub(super) fn floor_bytes(&self) -> f64 {
        self.disk_bytes - self.garbage_bytes
    }

    /// The garbage the space-amplification `target` leaves room for: what keeps disk
    /// bytes, overhead included, at `target` times user bytes (negative when small
    /// records alone exceed the target).
    pub(super) fn target_room_bytes(&self, target: f64) -> f64 {
        target * self.user_bytes - self.floor_bytes() - self.overhead_bytes
    }

    /// The least room for garbage: `MIN_ROOM_SHARE × (target - 1)` times the floor,
    /// less half of what the target leaves above the floor (overhead not counted).
    pub(super) fn floor_room_bytes(&self, target: f64) -> f64 {
        let floor = self.floor_bytes();
        let above = (target * self.user_bytes - floor).max(0.0);
        (MIN_ROOM_SHARE * (target - 1.0) * floor - above / 2.0).max(0.0)
    }

    /// The room for garbage: the target's, but never under the floor's.
    pub(super) fn room_bytes(&self, target: f64) -> f64 {
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
pub(super) fn next_start_share(
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
pub(super) fn held_peak(peak: f64, amp: f64, elapsed_secs: f64) -> f64 {
    let fallen = peak - AMP_PEAK_FALL_PER_SEC * elapsed_secs.max(0.0);
    if amp.is_nan() {
        fallen
    } else {
        amp.max(fallen)
    }
}

/// How hard background GC works on one region this step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Urge {
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
pub(super) fn urge(footprint: Footprint, target: f64, start_share: f64) -> Urge {
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
pub(super) fn write_delay(garbage_share: f64, gc_can_help: bool) -> u64 {
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
pub(super) fn pacing_garbage_bytes(
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
pub(super) fn victim_score(stats: &SegmentStats, newest_order: u64) -> f64 {
    let u = stats.live_bytes as f64 / stats.size_bytes.max(1) as f64;
    let age = newest_order.saturating_sub(stats.order) as f64 + 1.0;
    (1.0 - u) * age / (1.0 + u)
}

#[cfg(test)]
mod tests {
    use super::*;

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
