//! What a replication shipper reads from a primary region (DESIGN.md, "Replication"):
//! its segments by order with the bytes ready to ship, those bytes, the foreground log
//! position a write must see acknowledged, and the ship horizon below which garbage
//! collection may retire segments.
//!
//! Owns: reading the log for shipping, from a tail's buffer or from the volume. Does not
//! own: the protocol, connections or acknowledgements (the `tucana-replication` crate).
//!
//! Thread-safety: listing takes the writer lock briefly; reads take no lock (an epoch pin
//! while a tail's buffer is read). A segment whose order is at or above the ship horizon
//! is never retired, so bytes a shipper has not read yet are never freed under it.

use std::sync::atomic::Ordering;

use crossbeam_epoch as epoch;

use super::Region;
use crate::error::{Error, Result};
use crate::types::DiskOffset;

/// A log segment as a shipper sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShipSegment {
    /// Position among the region's segments: a shipper ships in this order.
    pub order: u64,
    pub base: DiskOffset,
    pub size_bytes: u64,
    /// Bytes that can be shipped now: what a tail has published, all of a closed
    /// segment's written bytes.
    pub ready_bytes: u64,
    /// Still a tail: more bytes will come.
    pub open: bool,
    /// Opened for garbage collection's copies (no user write waits for its bytes).
    pub relocation: bool,
}

/// A position in a region's foreground log: a segment's order and an offset in it.
/// Positions of one region compare in log order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition {
    pub order: u64,
    pub offset: u64,
}

impl Region {
    /// The region's segments from order `from` on, at most `max` of them.
    pub fn ship_segments(&self, from: u64, max: usize) -> Vec<ShipSegment> {
        let w = self.writer.lock();
        let guard = epoch::pin();
        let (tail, gc_tail) = self.log.tails(&guard);
        w.segments_from(from, max)
            .into_iter()
            .map(|(order, base, stats, relocation)| {
                // Under the writer lock neither tail switches; the relocation tail's
                // published bytes may grow meanwhile (copies are appended outside it).
                let open_tail = [tail, gc_tail]
                    .into_iter()
                    .flatten()
                    .find(|t| t.base == base);
                ShipSegment {
                    order,
                    base,
                    size_bytes: stats.size_bytes,
                    ready_bytes: open_tail.map_or(stats.written_bytes, |t| t.published_bytes()),
                    open: open_tail.is_some(),
                    relocation,
                }
            })
            .collect()
    }

    /// Copies `buf.len()` bytes of the segment at `base` from `offset` into `buf`: from
    /// its buffer while it is a tail or its write is in flight, else from the volume. The
    /// bytes must be ready (`ShipSegment::ready_bytes`).
    pub fn read_log(&self, base: DiskOffset, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_usable()?;
        let at = base.0 + offset;
        {
            let guard = epoch::pin();
            if let Some(t) = self.log.buffered_segment(base, &guard) {
                let bytes = t.read(at, buf.len()).ok_or_else(|| {
                    Error::corruption("log segment", base, "shipping bytes not published yet")
                })?;
                buf.copy_from_slice(bytes);
                return Ok(());
            }
        }
        self.shared.volume.storage().read_at(at, buf)
    }

    /// Where the foreground log ends now: a write that returned before this call lies
    /// at or below it.
    pub fn log_position(&self) -> LogPosition {
        let guard = epoch::pin();
        let (tail, _) = self.log.tails(&guard);
        let t = tail.expect("a region always has a foreground tail");
        LogPosition {
            order: t.order,
            offset: t.published_bytes(),
        }
    }

    /// Garbage collection retires no segment of order `horizon` or more (`u64::MAX`: no
    /// limit, the default): what the slowest backup has not received entirely yet.
    pub fn set_ship_horizon(&self, horizon: u64) {
        self.ship_horizon.store(horizon, Ordering::Release);
    }
}
