//! How far a promotion's replay would reach through what a replica received: the
//! position a backup may acknowledge (DESIGN.md, "Replication", *Contiguous
//! acknowledgement*).
//!
//! A backup used to acknowledge the highest foreground position it had received. Bytes
//! arrive in order within a copy, but a copy whose bytes never came (session 16: a segment
//! garbage collection retired before a new backup took its copy) left a gap the
//! acknowledgement jumped over, and promotion's replay, which follows LINK records from
//! the last applied commit's tail, stopped at the gap: every write acknowledged past it was
//! lost. The frontier walks the same chain replay walks, with the same checks (record
//! checksum, generation, sequence number, a LINK's target found by origin, size and first
//! record), as bytes arrive, so what a backup acknowledges is what it would replay.
//!
//! Owns: the walk. Does not own: the copies (`Replica`'s state, under whose lock every
//! call runs), the protocol (`tucana-replication` sends the position), replay itself
//! (`region::open`, which this mirrors).
//!
//! Thread-safety: plain data, used under the replica's mutex.

use std::collections::BTreeMap;

use super::Copy;
use crate::descriptor::RegionDesc;
use crate::log::record::{Header, RecordRef, GENERATION_MASK, HEADER_BYTES};
use crate::shared::Shared;
use crate::types::{DiskOffset, SeqNo};

/// The next record replay would read, and what it must carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Frontier {
    /// The primary's order of the segment it is in.
    pub order: u64,
    /// Its offset in that segment: every foreground byte before it replays.
    pub offset: u64,
    seq: SeqNo,
    generation: u32,
    /// Complete bytes at the frontier that replay would stop at (another generation, out
    /// of sequence, a relocated copy, a bad checksum): they never change, so the walk is
    /// not tried again.
    stuck: bool,
}

impl Frontier {
    /// Where replay of the applied commit `desc` (translated: its tail is a copy's
    /// `at`) starts; `None` if no copy is its tail (a commit with no log yet).
    pub fn at_commit(desc: &RegionDesc, copies: &BTreeMap<u64, Copy>) -> Option<Frontier> {
        let (order, _) = copies.iter().find(|(_, c)| c.at == desc.tail)?;
        Some(Frontier {
            order: *order,
            offset: desc.tail_used_bytes,
            seq: desc.next_seq,
            generation: desc.generation & GENERATION_MASK,
            stuck: false,
        })
    }

    /// The position as the protocol compares it: (order, offset).
    pub fn position(&self) -> (u64, u64) {
        (self.order, self.offset)
    }

    /// Whether `other` is the same life of the log (generation) and at least as far.
    pub fn covers(&self, other: &Frontier) -> bool {
        self.generation == other.generation && self.position() >= other.position()
    }

    /// Moves as far as replay could go through `copies`: across every complete, verified
    /// record in sequence, and through each LINK whose target copy has arrived and begins
    /// with the record that follows. Stops (to be called again when more bytes arrive)
    /// at a record not entirely received, a LINK whose target has not arrived, or
    /// anything replay would stop at (then nothing later moves it: a backup that cannot
    /// replay acknowledges nothing more).
    pub fn advance(
        &mut self,
        shared: &Shared,
        seed: u32,
        copies: &BTreeMap<u64, Copy>,
        scratch: &mut Vec<u8>,
    ) {
        while let Some(copy) = copies.get(&self.order).filter(|_| !self.stuck) {
            if copy.received_bytes <= self.offset {
                return;
            }
            let len = (copy.received_bytes - self.offset) as usize;
            let start = copy.at.plus_bytes(self.offset);
            // SAFETY: received bytes of a copy are written once (`Replica::write_log`
            // writes only past them) and are neither rewritten nor freed while the
            // replica's lock, which the caller holds, is held.
            let Ok(bytes) = (unsafe { shared.volume.view(start.0, len, scratch) }) else {
                return;
            };
            let (used, link) = self.walk(bytes, seed, start);
            self.offset += used;
            let Some((next, next_size)) = link else {
                return;
            };
            // At the LINK: on into its target if it has arrived, else wait at the LINK.
            let first = (SeqNo(self.seq.0 + 1), self.generation);
            let Some(order) = follow(shared, copies, self.order, next, next_size, first) else {
                return;
            };
            self.order = order;
            self.offset = 0;
            self.seq = first.0;
        }
    }

    /// Walks the complete records of `bytes` (the received bytes from the frontier on,
    /// at volume offset `start`), moving `seq` past each. Returns the bytes walked and,
    /// if it stopped at a LINK, its target; the LINK itself is not walked (`seq` is its
    /// own), so that a target not arrived yet is looked for again from it.
    fn walk(
        &mut self,
        bytes: &[u8],
        seed: u32,
        start: DiskOffset,
    ) -> (u64, Option<(DiskOffset, u64)>) {
        let mut pos = 0usize;
        while bytes.len() - pos >= HEADER_BYTES {
            let at = start.plus_bytes(pos as u64);
            let Ok(header) = Header::decode(&bytes[pos..pos + HEADER_BYTES], at) else {
                self.stuck = true;
                break;
            };
            let Ok(len) = usize::try_from(header.total_bytes()) else {
                break;
            };
            if bytes.len() - pos < len {
                break;
            }
            let rec = RecordRef::parse(&bytes[pos..pos + len], seed, true, at);
            let Some(rec) = rec.ok().filter(|r| {
                r.header.generation == self.generation
                    && r.header.seq == self.seq
                    && !r.header.is_relocated()
            }) else {
                self.stuck = true;
                break;
            };
            if rec.header.is_link() {
                let target = rec.link_target(at).ok();
                self.stuck = target.is_none();
                return (pos as u64, target);
            }
            pos += len;
            self.seq = SeqNo(self.seq.0 + 1);
        }
        (pos as u64, None)
    }
}

/// The copy a LINK of the segment of order `from` names (`next`, `next_size`), as replay
/// would find it (`region::open::follow_link`): a later copy at that origin, of that size,
/// whose first record has sequence number and generation `first`.
fn follow(
    shared: &Shared,
    copies: &BTreeMap<u64, Copy>,
    from: u64,
    next: DiskOffset,
    next_size: u64,
    first: (SeqNo, u32),
) -> Option<u64> {
    let mut head = Vec::new();
    copies.range(from + 1..).find_map(|(order, c)| {
        if c.origin != next || c.size_bytes != next_size || c.received_bytes < HEADER_BYTES as u64 {
            return None;
        }
        // SAFETY: as in `Frontier::advance` (received bytes, the replica's lock held).
        let bytes = unsafe { shared.volume.view(c.at.0, HEADER_BYTES, &mut head) }.ok()?;
        let h = Header::decode(bytes, c.at).ok()?;
        (h.seq == first.0 && h.generation == first.1 && !h.is_relocated()).then_some(*order)
    })
}
