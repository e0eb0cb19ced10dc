//! The key-value log: append-only records in log segments, one log per region.
//!
//! Owns: the record format (`record`), the in-memory tail segment (`tail`), and appending
//! to a region's log (`writer`: segment switches, link records, the relocation tail, and
//! exact live/dead byte counts per segment, `SegmentStats`, from the first record).
//! Replay is `crate::recovery`'s; the region applies each record to its index.

pub(crate) mod in_flight;
pub mod record;
pub mod tail;
pub(crate) mod writer;

/// Byte counts of one log segment. `written - live` bytes are dead (overwritten or
/// deleted records, tombstones, links): what garbage collection reclaims.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentStats {
    pub size_bytes: u64,
    pub written_bytes: u64,
    pub live_bytes: u64,
    /// Position of the segment among its region's segments: strictly increasing with
    /// allocation (foreground and relocation segments alike), never reused within a
    /// region. Replay numbers the segments it reaches after the newest one; victims of
    /// equal liveness are taken oldest first.
    pub order: u64,
}

/// Where a region's relocation tail stands (the segment garbage collection appends its
/// copies to): its segment and the bytes written to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcTailPos {
    pub base: crate::types::DiskOffset,
    pub size_bytes: u64,
    pub used_bytes: u64,
}

impl SegmentStats {
    pub fn dead_bytes(&self) -> u64 {
        self.written_bytes - self.live_bytes
    }
}
