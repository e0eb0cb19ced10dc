//! Which member of a volume over several gets the next log segment: round-robin, or the
//! least weighted queue length (LOCS §3.3.2): per member, the bytes it has in flight by
//! request type, each weighted by the member's measured time per byte of that type.
//!
//! Owns: the policy, the weighted length and the choice (pure functions, unit-tested), and
//! the per-member load counters (`Load`) the member set keeps around each request,
//! including reads the engine announces without waiting for them (prefetches: a backlog
//! of read work that drains at the member's measured read speed). Does not own: issuing
//! I/O or placing groups (`members.rs`).
//!
//! Thread-safety: `Load` is atomics only, updated with relaxed ordering: the figures steer
//! a heuristic and feed statistics, they order nothing. Two racing updates of a latency
//! estimate may lose one sample, which the moving average absorbs; the announced-read
//! backlog is one `fetch_update`, so no announcement is lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// How a volume over several members picks the member of a new log segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DispatchPolicy {
    /// Members in turn.
    #[default]
    RoundRobin,
    /// The member whose in-flight bytes, weighted by its measured time per byte of each
    /// request type, are least; ties go round-robin.
    LeastWeightedQueue,
    /// Always this member (0-based), while it exists and is not the one to avoid;
    /// otherwise members in turn. For placing data on a known member (benchmarks: a hot
    /// range loaded onto one device; tests), not for serving.
    Member(usize),
}

/// Request types, as LOCS weighs them (its erase is our trim), and the wait for a
/// written range to reach the device (`Storage::write_back_and_wait`): with buffered
/// writes, the `pwrite` costs a copy and the device's time is spent in writeback, so the
/// two are measured apart and a queued segment weighs both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read = 0,
    Write = 1,
    Trim = 2,
    Writeback = 3,
}

const KINDS: usize = 4;

/// Time per byte a member starts with for each type before it has completed a request
/// of that type (ps per byte: ~1 GB/s reads, ~0.5 GB/s writes, trims 16× cheaper than
/// writes per byte). Only their ratios matter until measurements replace them. Writeback
/// starts at 0, "not measured": a member whose segment writes do not wait for the device
/// weighs none, and the first measurement replaces it whole.
const INITIAL_PS_PER_BYTE: [u64; KINDS] = [1_000, 2_000, 125, 0];

/// Weight of a new sample in the moving average of time per byte (1/8).
const EWMA_SHIFT: u32 = 3;

/// One member's load: bytes and requests in flight by type, completed bytes, and the
/// moving average of picoseconds per byte by type.
#[derive(Debug)]
pub struct Load {
    in_flight_bytes: [AtomicU64; KINDS],
    in_flight_requests: AtomicU64,
    ps_per_byte: [AtomicU64; KINDS],
    /// When the reads announced so far (`announce_read`) will be done, at the member's
    /// measured read speed, in nanoseconds since `clock_ns`'s start (0: never announced).
    /// Past deadlines weigh nothing.
    announced_reads_done_ns: AtomicU64,
}

impl Default for Load {
    fn default() -> Load {
        Load {
            in_flight_bytes: Default::default(),
            in_flight_requests: AtomicU64::new(0),
            ps_per_byte: INITIAL_PS_PER_BYTE.map(AtomicU64::new),
            announced_reads_done_ns: AtomicU64::new(0),
        }
    }
}

impl Load {
    /// A request of `bytes` of `kind` is about to be issued.
    pub fn start(&self, kind: Kind, bytes: u64) {
        self.in_flight_bytes[kind as usize].fetch_add(bytes, Ordering::Relaxed);
        self.in_flight_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The request `start` announced completed after `elapsed_ns`.
    pub fn finish(&self, kind: Kind, bytes: u64, elapsed_ns: u64) {
        self.in_flight_bytes[kind as usize].fetch_sub(bytes, Ordering::Relaxed);
        self.in_flight_requests.fetch_sub(1, Ordering::Relaxed);
        if bytes >= 4096 {
            // Small requests are dominated by fixed costs: they would skew a per-byte
            // estimate meant for segments.
            let slot = &self.ps_per_byte[kind as usize];
            let old = slot.load(Ordering::Relaxed);
            let sample = elapsed_ns.saturating_mul(1000) / bytes;
            let new = if old == 0 { sample } else { ewma(old, sample) };
            slot.store(new, Ordering::Relaxed);
        }
    }

    /// The engine asked the member to read `bytes` ahead (a prefetch: `madvise` or
    /// readahead, which returns at once and reports no completion). Counted as read work
    /// queued behind what was announced before, at the member's measured time per byte
    /// of a read, draining in real time: a prefetch weighs from its request until the
    /// member could have read it, since the device's own completion is not seen.
    pub fn announce_read(&self, bytes: u64) {
        self.announce_read_at(bytes, clock_ns());
    }

    /// `announce_read` at `now_ns` (`clock_ns`'s scale), for tests.
    pub(crate) fn announce_read_at(&self, bytes: u64, now_ns: u64) {
        let work_ns = self.ps_per_byte(Kind::Read).saturating_mul(bytes) / 1000;
        // The closure always returns `Some`: the update cannot fail.
        let _ = self.announced_reads_done_ns.fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |done| Some(done.max(now_ns).saturating_add(work_ns)),
        );
    }

    /// `Σ ps_per_byte[type] × in-flight bytes[type]`, plus what is left of the announced
    /// reads: picoseconds of queued work.
    pub fn weighted_length(&self) -> u64 {
        self.weighted_length_at(clock_ns())
    }

    /// `weighted_length` at `now_ns` (`clock_ns`'s scale), for tests.
    pub(crate) fn weighted_length_at(&self, now_ns: u64) -> u64 {
        let announced_ps = self
            .announced_reads_done_ns
            .load(Ordering::Relaxed)
            .saturating_sub(now_ns)
            .saturating_mul(1000);
        (0..KINDS)
            .map(|k| {
                self.ps_per_byte[k]
                    .load(Ordering::Relaxed)
                    .saturating_mul(self.in_flight_bytes[k].load(Ordering::Relaxed))
            })
            .fold(announced_ps, u64::saturating_add)
    }

    /// `weighted_length` with `queued_write_bytes` more of segment writes: the member's
    /// segments waiting in the write queue (reserved or queued, their job not started),
    /// which the member set does not see until their job issues them. Each will cost a
    /// write and, where segment writes wait for the device, a writeback: both weigh.
    /// Saturates.
    pub fn weighted_length_with_queued(&self, queued_write_bytes: u64) -> u64 {
        let ps_per_byte = self.ps_per_byte[Kind::Write as usize]
            .load(Ordering::Relaxed)
            .saturating_add(self.ps_per_byte[Kind::Writeback as usize].load(Ordering::Relaxed));
        self.weighted_length()
            .saturating_add(ps_per_byte.saturating_mul(queued_write_bytes))
    }

    /// Bytes in flight over every type.
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }

    /// Bytes in flight of one type.
    pub fn in_flight_bytes_of(&self, kind: Kind) -> u64 {
        self.in_flight_bytes[kind as usize].load(Ordering::Relaxed)
    }

    pub fn in_flight_requests(&self) -> u64 {
        self.in_flight_requests.load(Ordering::Relaxed)
    }

    /// Measured (or initial) picoseconds per byte of `kind`.
    pub fn ps_per_byte(&self, kind: Kind) -> u64 {
        self.ps_per_byte[kind as usize].load(Ordering::Relaxed)
    }
}

/// Nanoseconds since the first call in this process (a monotonic clock for the
/// announced-read deadlines; starts above 0 so that 0 means "never announced").
fn clock_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// Moving average: `old + (sample - old) / 8`.
fn ewma(old: u64, sample: u64) -> u64 {
    if sample >= old {
        old + ((sample - old) >> EWMA_SHIFT)
    } else {
        old - ((old - sample) >> EWMA_SHIFT)
    }
}

/// The member with the least weighted length among `lengths`; among equals, the first at
/// or after `turn` (mod the member count), so equal members take turns.
pub fn least_weighted(lengths: &[u64], turn: usize) -> usize {
    assert!(!lengths.is_empty(), "no member to dispatch to");
    let n = lengths.len();
    (0..n)
        .map(|step| (turn + step) % n)
        .min_by_key(|&m| lengths[m])
        .expect("at least one member")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_members_take_turns() {
        let lengths = [5, 5, 5];
        let picks: Vec<usize> = (0..6).map(|turn| least_weighted(&lengths, turn)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn the_least_loaded_member_wins_whatever_the_turn() {
        for turn in 0..4 {
            assert_eq!(
                least_weighted(&[9, 3, 7, 3], turn),
                if turn >= 2 { 3 } else { 1 }
            );
            assert_eq!(least_weighted(&[9, 8, 0, 7], turn), 2);
        }
    }

    #[test]
    fn the_pick_is_always_a_minimum() {
        // A small exhaustive sweep in place of a property test: every vector of lengths
        // 0..4 over three members, every turn.
        for a in 0..4u64 {
            for b in 0..4u64 {
                for c in 0..4u64 {
                    let lengths = [a, b, c];
                    for turn in 0..3 {
                        let pick = least_weighted(&lengths, turn);
                        assert_eq!(lengths[pick], a.min(b).min(c), "{lengths:?} turn {turn}");
                    }
                }
            }
        }
    }

    #[test]
    fn reads_queued_on_a_member_weigh_by_its_measured_speed() {
        // LOCS's Figure 3: a member busy reading is passed over for writes; a slow member
        // (twice the time per byte) counts its queue twice.
        let fast = Load::default();
        let slow = Load::default();
        for _ in 0..64 {
            fast.start(Kind::Write, 1 << 20);
            fast.finish(Kind::Write, 1 << 20, 1_000_000); // ~1 GB/s
            slow.start(Kind::Write, 1 << 20);
            slow.finish(Kind::Write, 1 << 20, 2_000_000);
        }
        assert!(slow.ps_per_byte(Kind::Write) > fast.ps_per_byte(Kind::Write) * 3 / 2);
        fast.start(Kind::Write, 2 << 20);
        slow.start(Kind::Write, 2 << 20);
        assert!(slow.weighted_length() > fast.weighted_length());
        assert_eq!(
            least_weighted(&[slow.weighted_length(), fast.weighted_length()], 0),
            1
        );
        // Reads in flight on the fast member tip the choice back.
        fast.start(Kind::Read, 8 << 20);
        assert_eq!(
            least_weighted(&[slow.weighted_length(), fast.weighted_length()], 0),
            0
        );
        assert_eq!(fast.in_flight_requests(), 2);
        assert_eq!(fast.in_flight_bytes(), 10 << 20);
        fast.finish(Kind::Read, 8 << 20, 100);
        fast.finish(Kind::Write, 2 << 20, 100);
        assert_eq!((fast.in_flight_bytes(), fast.in_flight_requests()), (0, 0));
        assert_eq!(fast.weighted_length(), 0);
    }

    #[test]
    fn announced_reads_weigh_until_the_member_could_have_read_them() {
        // A prefetch (a scan's window, a `multi_get` batch) returns before the device
        // reads anything and reports no completion, so the member set never saw it in
        // flight: a member serving a hot range through prefetches looked idle to
        // least-weighted dispatch. Now an announced read is a backlog of read work that
        // drains in real time at the member's measured speed.
        let load = Load::default();
        let ps = load.ps_per_byte(Kind::Read); // 1000 ps per byte: 1 MiB is ~1.05 ms
        let mib = 1u64 << 20;
        let now = 1_000_000;
        assert_eq!(load.weighted_length_at(now), 0);
        load.announce_read_at(mib, now);
        assert_eq!(load.weighted_length_at(now), mib * ps);
        // A second announcement queues behind the first.
        load.announce_read_at(mib, now);
        assert_eq!(load.weighted_length_at(now), 2 * mib * ps);
        // Half a read's time later, one and a half reads are left.
        let half_ns = mib * ps / 1000 / 2;
        assert_eq!(load.weighted_length_at(now + half_ns), 3 * mib * ps / 2);
        // Once they could all have been read, nothing is left; a later announcement
        // starts from its own time, not from the old deadline.
        let later = now + 10 * mib * ps / 1000;
        assert_eq!(load.weighted_length_at(later), 0);
        load.announce_read_at(mib, later);
        assert_eq!(load.weighted_length_at(later), mib * ps);
        // In-flight requests add to it, and least-weighted dispatch passes over it.
        let idle = Load::default();
        assert_eq!(
            least_weighted(
                &[
                    load.weighted_length_at(later),
                    idle.weighted_length_at(later)
                ],
                0
            ),
            1
        );
        // A slower reader (measured) drains the same bytes more slowly.
        let slow = Load::default();
        for _ in 0..64 {
            slow.start(Kind::Read, mib);
            slow.finish(Kind::Read, mib, 4 * mib); // 4000 ps per byte
        }
        slow.announce_read_at(mib, now);
        assert!(
            slow.weighted_length_at(now) > 3 * mib * ps,
            "{}",
            slow.weighted_length_at(now)
        );
    }

    #[test]
    fn the_average_moves_an_eighth_toward_each_sample() {
        assert_eq!(ewma(800, 1600), 900);
        assert_eq!(ewma(800, 0), 700);
        assert_eq!(ewma(800, 800), 800);
        // Small requests leave the estimate alone.
        let load = Load::default();
        load.start(Kind::Read, 100);
        load.finish(Kind::Read, 100, 1_000_000_000);
        assert_eq!(load.ps_per_byte(Kind::Read), INITIAL_PS_PER_BYTE[0]);
    }

    #[test]
    fn queued_segments_weigh_their_write_and_their_writeback() {
        // Buffered writes: the pwrite is a copy at memory speed on every member, and the
        // device's time is in the writeback. Mixed into one estimate, a slow device's
        // time per byte came out about half of what it is (one copy sample per writeback
        // sample), and least-weighted dispatch gave the 10 MiB/s member of 10/20/40 more
        // than its share. Apart, a queued segment weighs both.
        let slow = Load::default();
        let fast = Load::default();
        assert_eq!(slow.ps_per_byte(Kind::Writeback), 0, "not measured yet");
        for _ in 0..64 {
            for load in [&slow, &fast] {
                load.start(Kind::Write, 2 << 20);
                load.finish(Kind::Write, 2 << 20, 1_000_000); // ~2 GB/s copy
            }
            slow.start(Kind::Writeback, 2 << 20);
            slow.finish(Kind::Writeback, 2 << 20, 200_000_000); // 10 MiB/s
            fast.start(Kind::Writeback, 2 << 20);
            fast.finish(Kind::Writeback, 2 << 20, 50_000_000); // 40 MiB/s
        }
        let (slow_ps, fast_ps) = (
            slow.ps_per_byte(Kind::Writeback),
            fast.ps_per_byte(Kind::Writeback),
        );
        assert!(
            slow_ps > 3 * fast_ps && slow_ps < 5 * fast_ps,
            "{slow_ps} {fast_ps}"
        );
        // One segment queued on the slow member weighs about as much as four on the fast.
        let one_slow = slow.weighted_length_with_queued(2 << 20);
        let four_fast = fast.weighted_length_with_queued(8 << 20);
        let three_fast = fast.weighted_length_with_queued(6 << 20);
        assert!(
            three_fast < one_slow && one_slow < four_fast * 5 / 4,
            "{one_slow} {three_fast} {four_fast}"
        );
        // The first writeback measured replaces "not measured" whole.
        let fresh = Load::default();
        fresh.start(Kind::Writeback, 1 << 20);
        fresh.finish(Kind::Writeback, 1 << 20, 1_048_576);
        assert_eq!(fresh.ps_per_byte(Kind::Writeback), 1000);
    }
}
