//! Collecting one victim segment: reading it in place, telling its live records from its
//! dead ones (from the writers' lists of dead records, or by asking the index), verifying
//! and relocating the live ones in chunks, then retiring the segment; and choosing which
//! segments are victims under a policy.
//!
//! Owns: the mechanics of a pass over victims. Does not own: budgets and when to run
//! (`super`, `super::policy`), the region's primitives (`Region::relocate`,
//! `Region::retire_segment`).
//!
//! Thread-safety: runs under the collector's lock (one pass at a time); reads the victim
//! through the volume's mapping while pinned, so a segment freed meanwhile (its region
//! dropped) stays mapped and allocated until the pin is released.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::policy::victim_score;
use crate::error::{Error, Result};
use crate::log::record::{Header, RecordRef, HEADER_BYTES};
use crate::log::SegmentStats;
use crate::region::{Region, Retire};
use crate::shared::Shared;
use crate::types::{DiskOffset, RegionId};

/// Records relocated per writer-lock hold.
pub(super) const RELOCATE_CHUNK_RECORDS: usize = 64;

/// A forced pass collects every eligible segment at most this full (live / size): more
/// would copy nearly a whole segment to win a few bytes.
const FORCED_MAX_LIVE_RATIO: f64 = 0.875;

/// How a pass picks its victims.
#[derive(Clone, Copy, Debug)]
pub(super) enum Policy {
    /// Segments at most `max_live_ratio` full, best [`victim_score`] first.
    Background { max_live_ratio: f64 },
    /// Every eligible segment at most `FORCED_MAX_LIVE_RATIO` full, least full first.
    Forced,
}

/// The segments of `region` to collect, best first.
pub(super) fn victims(
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
            !pinned.contains(&(region.id(), off.0))
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
pub(super) enum Collected {
    /// Retired: it will be freed once unreachable.
    Retired,
    /// Budget ran out part way; what was relocated stays relocated.
    OutOfBudget,
    /// Emptied but kept (an external pivot reads it), or gone (region dropped).
    Kept,
}

/// Relocates the live records of `victim` and retires it. `budget_bytes` is decreased by
/// what is appended; the victim is left part way when it runs out. `buf` holds the
/// victim when the volume has no mapping; a victim an external pivot keeps is added to
/// `pinned`.
pub(super) fn collect_segment(
    shared: &Shared,
    region: &Region,
    victim: DiskOffset,
    stats: SegmentStats,
    budget_bytes: &mut f64,
    buf: &mut Vec<u8>,
    pinned: &mut HashSet<(RegionId, u64)>,
) -> Result<Collected> {
    if stats.live_bytes > 0 {
        // A deferred put (`region/deferred.rs`) is in no tree yet, so the checks below
        // would take its record for dead: apply them first. Later ones are records
        // appended after this, never in a closed victim.
        region.apply_deferred(true)?;
        // Read in place through the volume's mapping when it has one (a copy into the
        // pass's buffer otherwise). The pin keeps the segment allocated while we read it
        // even if the region is dropped meanwhile: a dropped region's segments are freed
        // through the same reader grace period.
        let pin = crossbeam_epoch::pin();
        // A victim closed so recently that its write is still in flight is read from its
        // buffer (it may not be in the volume yet); the pin keeps the buffer too.
        let buf = match region.buffered_segment(victim, stats.written_bytes as usize, &pin) {
            Some(bytes) => bytes,
            // SAFETY: the victim is closed and written, and only this pass retires it:
            // its bytes up to `written` are never written again while the region can
            // reach it, and the pin outlives `buf`.
            None => unsafe {
                shared
                    .volume
                    .view(victim.0, stats.written_bytes as usize, buf)?
            },
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
            shared
                .gc_relocated_bytes
                .fetch_add(appended, Ordering::Relaxed);
        }
    }
    match region.retire_segment(victim)? {
        Retire::Retired(_) => Ok(Collected::Retired),
        Retire::PinnedByPivot => {
            pinned.insert((region.id(), victim.0));
            Ok(Collected::Kept)
        }
        Retire::Gone | Retire::NotShipped | Retire::InReplayWindow => Ok(Collected::Kept),
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
    let rec = RecordRef::parse(bytes, region.seed(), true, DiskOffset(put.at))?;
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
