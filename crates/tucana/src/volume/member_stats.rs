//! Per-member figures of a volume over several members (`Stats::members`): what the
//! member set counts itself, plus what the engine adds from its write queue and its trim
//! scheduler (`Engine::stats` sets the trim fields).
//!
//! Owns: the plain-data struct and the merging of the engine's figures into it. Does not
//! own: counting any of them (`members.rs`, `write_queue.rs`, `crate::trim`).
//!
//! Thread-safety: plain data (`Clone + Send + Sync`).

/// Per-member figures for `Stats` and `check`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberStats {
    pub name: String,
    /// What the member is: `file` or `block-device` (`StorageKind::as_str`); `removed`
    /// for the place of a member removed from the volume.
    pub kind: String,
    /// `live`; `draining` while a removal on the open volume moves its groups away;
    /// `removed` once the table marks it removed (DESIGN.md, "Removing a member").
    pub state: String,
    pub uuid: String,
    /// Groups placed on this member.
    pub groups: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Requests issued through the member set and not yet completed, and their bytes;
    /// of those bytes, reads, and writes (their copy or their writeback wait).
    pub in_flight_requests: u64,
    pub in_flight_bytes: u64,
    pub in_flight_read_bytes: u64,
    pub in_flight_write_bytes: u64,
    /// In-flight bytes weighted by the member's time per byte of each type, in
    /// picoseconds: what least-weighted-queue dispatch compares.
    pub weighted_queue_ps: u64,
    /// Moving averages of the member's time per byte written and read (picoseconds).
    pub write_ps_per_byte: u64,
    pub read_ps_per_byte: u64,
    /// Moving average of the time per byte of waiting for written segments to reach the
    /// device (0 until measured: only with `Options::segment_writes_wait_for_device`).
    pub writeback_ps_per_byte: u64,
    /// The member's write queue (writes in flight; 0 without): jobs queued or running,
    /// bytes reserved, queued or being written, jobs done.
    pub queue_jobs: u64,
    /// Of `queue_jobs`, those running now (at most `Options::writes_in_flight_depth`).
    pub queue_running_jobs: u64,
    pub queue_bytes: u64,
    pub queue_done_jobs: u64,
    /// Nanoseconds the member's write queue was empty while another member's was not.
    pub idle_while_others_busy_ns: u64,
    /// Trims (punches of freed log segments) on this member: listed for later, issued by
    /// a pass that found the member's queue quiet, forced by low free space; and bytes
    /// listed, not issued yet (`crate::trim`).
    pub trims_queued: u64,
    pub trims_issued: u64,
    pub trims_forced: u64,
    pub trims_pending_bytes: u64,
}

impl MemberStats {
    /// Adds the member's write-queue figures.
    pub fn with_queue(mut self, q: &crate::volume::QueueFigures) -> MemberStats {
        self.queue_jobs = q.jobs;
        self.queue_running_jobs = q.running_jobs;
        self.queue_bytes = q.in_flight_bytes;
        self.queue_done_jobs = q.done_jobs;
        self.idle_while_others_busy_ns = q.idle_while_others_busy_ns;
        self
    }
}
