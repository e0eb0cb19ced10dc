//! Trims off the critical path (LOCS §3.3.4, adapted; DESIGN.md, "Volumes over several
//! devices", *Trims*): freed log segments wait, listed per member, and a pass issues a
//! member's trims (hole punches) when that member's queue is quiet of writes, at most
//! `trim_pass_bytes_max` per pass, or all of them, whatever its load, when the free
//! space of the device holding it runs low.
//!
//! Owns: the decision (`decide`, a pure function of one member's queue figures, its
//! device's free space and the policy), the per-member counters (`TrimCounters`), and
//! the figures statistics show. Does not own: the list of runs waiting (the allocator's
//! deferred runs, `alloc/punch.rs`, which also lets new segments reuse them before any
//! trim), the system call (`Storage::punch_hole`), nor the queue figures it reads (the
//! member set's `Load`, the write queue). `Shared::schedule_trims` ties them together.
//!
//! Thread-safety: `decide` is pure; the counters are relaxed atomics (statistics, not
//! invariants). Passes are serialised by the allocator's lock, which `punch_deferred_selected`
//! holds throughout a pass.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::volume::slot_header::MEMBERS_MAX;
use crate::volume::DeviceSpace;

/// When freed log segments are punched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TrimSchedule {
    /// Listed per member and issued by the background loop's passes when the member's
    /// queue has few writes, or forced by low free space (the default).
    #[default]
    Scheduled,
    /// Punched as they are released, by whoever releases them (the behaviour before
    /// deferred punches; kept for comparison).
    AtRelease,
}

/// What a pass weighs, from the options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrimPolicy {
    /// A member's trims go when writes are at most this share of its queued bytes.
    pub max_write_share: f64,
    /// Most bytes of trims one pass issues per member (forced ones aside).
    pub pass_bytes_max: u64,
    /// A member whose device has less than this share of its bytes available has its
    /// trims forced.
    pub force_below_free_fraction: f64,
}

/// One member's queue as a pass sees it: bytes of writes (segments reserved, queued or
/// being written, their writeback waits included) and of reads in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberQueue {
    pub write_bytes: u64,
    pub read_bytes: u64,
}

/// What a pass does with one member's trims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Leave them listed: the member is busy writing.
    Hold,
    /// Issue up to this many bytes of them.
    Issue { bytes_max: u64 },
    /// Issue all of them now: the device is short of space.
    Force,
}

/// Writes' share of the member's queued bytes; an empty queue has none.
pub fn write_share(queue: MemberQueue) -> f64 {
    let total = queue.write_bytes.saturating_add(queue.read_bytes);
    if total == 0 {
        return 0.0;
    }
    queue.write_bytes as f64 / total as f64
}

/// Whether the device is short of space: available bytes under the policy's share of
/// its size. Unknown space is never short.
pub fn space_low(space: Option<DeviceSpace>, policy: &TrimPolicy) -> bool {
    space.is_some_and(|s| {
        (s.available_bytes as f64) < policy.force_below_free_fraction * s.total_bytes as f64
    })
}

/// The pass's decision for one member.
pub fn decide(queue: MemberQueue, space: Option<DeviceSpace>, policy: &TrimPolicy) -> Decision {
    if space_low(space, policy) {
        Decision::Force
    } else if write_share(queue) <= policy.max_write_share {
        Decision::Issue {
            bytes_max: policy.pass_bytes_max,
        }
    } else {
        Decision::Hold
    }
}

/// One member's trim figures for statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrimFigures {
    /// Freed segments listed for a later trim (reused ones included: those never get one).
    pub queued: u64,
    /// Listed segments a pass issued with the member's queue quiet (or the close flushed).
    pub issued: u64,
    /// Listed segments a pass issued because the device was short of space.
    pub forced: u64,
    /// Bytes listed now, not issued nor reused yet.
    pub pending_bytes: u64,
}

#[derive(Default)]
struct Counters {
    queued: AtomicU64,
    issued: AtomicU64,
    forced: AtomicU64,
}

/// Per-member trim counters (member 0 for one file). Room for `MEMBERS_MAX` members from
/// the start, `member_count` of them counted: a member added to the open volume
/// (`grow_to`) gets counters without a lock on the counting paths.
pub struct TrimCounters {
    members: Box<[Counters]>,
    count: AtomicUsize,
}

impl TrimCounters {
    pub fn new(members: usize) -> TrimCounters {
        TrimCounters {
            members: (0..MEMBERS_MAX).map(|_| Counters::default()).collect(),
            count: AtomicUsize::new(members.clamp(1, MEMBERS_MAX)),
        }
    }

    /// Members counted.
    pub fn member_count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Counts `members` members from now on (never fewer than before).
    pub fn grow_to(&self, members: usize) {
        self.count
            .fetch_max(members.min(MEMBERS_MAX), Ordering::AcqRel);
    }

    fn at(&self, member: usize) -> &Counters {
        // An offset outside every group (not expected) counts on the last member rather
        // than panicking in a statistics path.
        &self.members[member.min(self.member_count() - 1)]
    }

    pub fn add_queued(&self, member: usize) {
        self.at(member).queued.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_issued(&self, member: usize) {
        self.at(member).issued.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_forced(&self, member: usize) {
        self.at(member).forced.fetch_add(1, Ordering::Relaxed);
    }

    /// The figures of `member`, with `pending_bytes` as given.
    pub fn figures(&self, member: usize, pending_bytes: u64) -> TrimFigures {
        let c = self.at(member);
        TrimFigures {
            queued: c.queued.load(Ordering::Relaxed),
            issued: c.issued.load(Ordering::Relaxed),
            forced: c.forced.load(Ordering::Relaxed),
            pending_bytes,
        }
    }
}

#[cfg(test)]
mod tests;
