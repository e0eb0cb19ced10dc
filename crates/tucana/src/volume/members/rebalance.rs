//! Rebalancing groups over the live members of a volume over several (DESIGN.md,
//! "Rebalancing onto a member"): groups move, whole, from fuller members to emptier ones
//! until they differ by one at most (devices: until each holds groups in proportion to
//! its capacity, to about a group), so data written before a member was added is spread
//! onto it.
//!
//! Owns: the plan (which group goes where), the rebalance's steps on a closed volume, the
//! rebalanced header (`rebalanced_from`, `rebalanced_moves`), and open's rule for two
//! slots claiming one group (`settle_claim`: the one rebalanced from the other's member,
//! one move newer, wins). Does not own: the copy of a slot, clearing leftovers and slot
//! choice (`remove.rs`, shared with the removal), nor open's other checks (`members.rs`).
//!
//! Crash: a group's copy is synced before its header is written, and its header synced
//! before the old slot's header is zeroed; at every point open finds each group exactly
//! once, on its old slot until the new header is durable, on its new slot after.
//!
//! Thread-safety: the offline rebalance runs on the caller's thread over a volume no one
//! else has open (its members are locked as for open), under the set's `grow_lock`;
//! `settle_claim` runs inside open, before the set is shared.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::paths::NamedStorage;
use super::remove::{copy_slot_piecewise, COPY_CHUNK_BYTES};
use super::{read_header, unpack, Member, MemberSet, Placement, SLOT_BITS};
use crate::error::{Error, Result};
use crate::types::BLOCK_BYTES;
use crate::volume::slot_header::{SlotHeader, HEADER_OFFSET, SLOT_BYTES};

/// Blocks at the start of a slot a rebalance leaves unpunched when it frees the slot: the
/// group's reserved blocks (bitmaps, the header, the table's second place). A discard on
/// a device may read back as old bytes, and the header block must stay the zeros written.
const KEPT_BLOCKS: u64 = 8;

/// What a rebalance did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rebalanced {
    /// Groups copied to another member.
    pub groups_moved: u64,
    /// Bytes written by those copies (holes of a fresh slot are not written).
    pub bytes_moved: u64,
    /// Groups per member afterwards, by member index (0 for a removed member).
    pub groups: Vec<u64>,
    /// On the open volume: bytes writers wrote a second time, to a group being moved;
    /// 0 offline.
    pub rewritten_bytes: u64,
}

/// One group a rebalance moves: from where, to where.
#[derive(Clone, Copy, Debug)]
struct Move {
    group: u64,
    from: usize,
    from_slot: u64,
    to: usize,
    slot: u64,
    fresh: bool,
}

impl MemberSet {
    /// Rebalances the closed volume over the member files at `paths` (every current
    /// member, in order, as open takes them). Refusals, before anything is written: a
    /// single file (`Error::InvalidArgument`), a volume open elsewhere (its lock), and
    /// open's checks. I/O errors leave a volume that opens (see the module doc), and the
    /// rebalance may be run again.
    pub fn rebalance_paths(paths: &[PathBuf], min_reservation_bytes: u64) -> Result<Rebalanced> {
        refuse_single(paths.len())?;
        let (members, _) = MemberSet::open_storages(paths, false, false, min_reservation_bytes)?;
        MemberSet::rebalance(members)
    }

    /// Rebalances the closed volume over `members` (any backends, in order); see
    /// `rebalance_paths`.
    pub fn rebalance(members: Vec<NamedStorage>) -> Result<Rebalanced> {
        refuse_single(members.len())?;
        let n = members.len();
        let set = MemberSet::open_with_blank(members, &vec![false; n], false)?;
        let mut placement = set.grow_lock.lock();
        set.rebalance_under_lock(&mut placement)
    }

    /// The offline rebalance's steps, batched: leftovers cleared; the plan; every copy,
    /// then the targets synced; every header, synced; every old header zeroed, synced;
    /// then the old slots' data punched.
    fn rebalance_under_lock(&self, placement: &mut Placement) -> Result<Rebalanced> {
        self.clear_unfinished_moves(placement, None)?;
        let mut moves = Vec::new();
        while let Some((group, from, from_slot, to)) = self.next_move(placement) {
            let (slot, fresh) = self.take_slot(placement, to)?;
            let entry = self.entry(group).expect("a placed group has an entry");
            entry.store(((to as u64 + 1) << SLOT_BITS) | slot, Ordering::Release);
            placement.groups[from] -= 1;
            placement.groups[to] += 1;
            moves.push(Move {
                group,
                from,
                from_slot,
                to,
                slot,
                fresh,
            });
        }
        let mut bytes_moved = 0;
        for mv in &moves {
            bytes_moved += copy_slot_piecewise(
                &self.members[mv.from],
                mv.from_slot,
                &self.members[mv.to],
                mv.slot,
                mv.fresh,
                COPY_CHUNK_BYTES,
                &|| (),
            )?;
        }
        self.sync_each(moves.iter().map(|mv| mv.to))?;
        for mv in &moves {
            let header = self.rebalanced_header(mv.group, mv.from, mv.from_slot, mv.to)?;
            let target = &self.members[mv.to];
            target
                .storage
                .write_at(mv.slot * SLOT_BYTES + HEADER_OFFSET, &header.encode())?;
            target.dirty.store(true, Ordering::Release);
        }
        self.sync_each(moves.iter().map(|mv| mv.to))?;
        for mv in &moves {
            zero_header(&self.members[mv.from], mv.from_slot)?;
        }
        self.sync_each(moves.iter().map(|mv| mv.from))?;
        for mv in &moves {
            let source = &self.members[mv.from];
            let start = mv.from_slot * SLOT_BYTES + KEPT_BLOCKS * BLOCK_BYTES;
            let end = ((mv.from_slot + 1) * SLOT_BYTES).min(source.storage.len_bytes()?);
            if end > start {
                source.storage.punch_hole(start, end - start)?;
            }
        }
        Ok(Rebalanced {
            groups_moved: moves.len() as u64,
            bytes_moved,
            groups: placement.groups.clone(),
            rewritten_bytes: 0,
        })
    }

    /// The next move of the plan, `(group, from, from slot, to)`; `None` when no move
    /// brings the live members closer to holding groups in proportion to their weights
    /// ([`MemberSet::rebalance_weights`]: equal, or a device's slots).
    ///
    /// The plan lowers `Σ groups² / weight` over the live members, whose minimum (for a
    /// fixed number of groups) is groups in proportion to weight, by the move that lowers
    /// it most: a group from `f` to `t` lowers it by `(2·g_f − 1)/w_f − (2·g_t + 1)/w_t`.
    /// Each move lowers it, so the plan ends. With equal weights the best move is from
    /// the member with the most groups to the one with the fewest, made while they differ
    /// by two or more: what the rebalance did before weights (ties: the lowest `f`, then
    /// the lowest `t`). `t` must have room; `f` moves the lowest group it holds outside
    /// its slot 0 (a member's identity), so it needs two groups.
    pub(super) fn next_move(&self, placement: &Placement) -> Option<(u64, usize, u64, usize)> {
        let live: Vec<usize> = (0..self.members.len())
            .filter(|&m| !self.members[m].takes_nothing())
            .collect();
        let weights = self.rebalance_weights(&live);
        let weight = |m: usize| i128::from(weights[live.binary_search(&m).unwrap()]);
        // The best gain so far as a fraction `num / den` (den > 0), and its pair.
        let mut best: Option<(i128, i128, usize, usize)> = None;
        for &f in &live {
            let g_f = i128::from(placement.groups[f]);
            if g_f < 2 {
                continue;
            }
            for &t in &live {
                if t == f || !self.has_room(placement, t) {
                    continue;
                }
                let g_t = i128::from(placement.groups[t]);
                let (w_f, w_t) = (weight(f), weight(t));
                let num = (2 * g_f - 1) * w_t - (2 * g_t + 1) * w_f;
                let den = w_f * w_t;
                if num <= 0 {
                    continue;
                }
                if best.is_none_or(|(b_num, b_den, _, _)| num * b_den > b_num * den) {
                    best = Some((num, den, f, t));
                }
            }
        }
        let (_, _, from, to) = best?;
        let (group, slot) = (0..placement.placed_groups).find_map(|g| {
            self.lookup(g)
                .filter(|&(m, s)| m == from && s != 0)
                .map(|(_, s)| (g, s))
        })?;
        Some((group, from, slot, to))
    }

    /// Each live member's weight in the plan (`live`'s order): when every live member is
    /// a device, the slots its capacity holds, so that devices of different sizes fill
    /// to the same share; otherwise 1 each (equal groups). A file has no capacity: it
    /// grows sparsely on a file system whose free space other files share, so a share of
    /// it means nothing, and a mix of files and devices is balanced by count.
    fn rebalance_weights(&self, live: &[usize]) -> Vec<u64> {
        let capacities: Option<Vec<u64>> = live
            .iter()
            .map(|&m| self.members[m].storage.capacity_bytes())
            .collect();
        match capacities {
            Some(caps) => caps.iter().map(|&c| (c / SLOT_BYTES).max(1)).collect(),
            None => vec![1; live.len()],
        }
    }

    /// The header of `group`'s copy on member `to`: rebalanced from `from`, one move more
    /// than the header of its slot there.
    pub(super) fn rebalanced_header(
        &self,
        group: u64,
        from: usize,
        from_slot: u64,
        to: usize,
    ) -> Result<SlotHeader> {
        let source = &self.members[from];
        let old = read_header(source.storage.as_ref(), from_slot, &source.name)?
            .filter(|h| h.group == group)
            .ok_or_else(|| self.corrupt(from, from_slot, format!("lost group {group}'s header")))?;
        Ok(SlotHeader {
            member_index: to as u32,
            volume_uuid: self.volume_uuid,
            member_uuid: self.members[to].uuid,
            group,
            table: Vec::new(),
            generation: 0,
            moved_from: None,
            rebalanced_from: Some(from as u32),
            rebalanced_moves: old.rebalanced_moves.wrapping_add(1),
        })
    }

    /// A slot of member `t` for a group moved there: its lowest free slot, or a new one
    /// grown at its end (`true`: it reads as zeros).
    pub(super) fn take_slot(&self, placement: &mut Placement, t: usize) -> Result<(u64, bool)> {
        if let Some(slot) = placement.free_slots[t].pop() {
            return Ok((slot, false));
        }
        let slot = placement.slot_counts[t];
        self.members[t].storage.grow((slot + 1) * SLOT_BYTES)?;
        placement.slot_counts[t] = slot + 1;
        Ok((slot, true))
    }

    /// Syncs each member named (once each).
    fn sync_each(&self, members: impl Iterator<Item = usize>) -> Result<()> {
        let mut members: Vec<usize> = members.collect();
        members.sort_unstable();
        members.dedup();
        members.into_iter().try_for_each(|m| self.members[m].sync())
    }

    /// At open: slot `slot` of member `m` (header `h`) claims a group whose map `entry`
    /// already holds `held`. The slot whose header says it was rebalanced from the other's
    /// member, one move after it, keeps the group (its copy was durable before its header,
    /// and writes after its switch went to it only); the other slot is free. Any other
    /// pair is corruption, naming both.
    pub(super) fn settle_claim(
        &self,
        placement: &mut Placement,
        entry: &AtomicU64,
        held: u64,
        (m, slot, h): (usize, u64, &SlotHeader),
    ) -> Result<()> {
        let (om, oslot) = unpack(held);
        let other = &self.members[om];
        let newer = |a: &SlotHeader, a_member: usize, b: &SlotHeader, b_member: usize| {
            a_member != b_member
                && a.rebalanced_from == Some(b_member as u32)
                && a.rebalanced_moves == b.rebalanced_moves.wrapping_add(1)
        };
        match read_header(other.storage.as_ref(), oslot, &other.name)? {
            Some(o) if newer(h, m, &o, om) => {
                entry.store(((m as u64 + 1) << SLOT_BITS) | slot, Ordering::Release);
                placement.groups[om] -= 1;
                placement.groups[m] += 1;
                free_slot(placement, om, oslot);
            }
            Some(o) if newer(&o, om, h, m) => free_slot(placement, m, slot),
            _ => {
                return Err(self.corrupt(
                    m,
                    slot,
                    format!(
                        "holds group {}, as does slot {oslot} of member {om} ({})",
                        h.group, other.name
                    ),
                ))
            }
        }
        Ok(())
    }
}

/// Puts `slot` among member `m`'s free slots, keeping them lowest last.
fn free_slot(placement: &mut Placement, m: usize, slot: u64) {
    let free = &mut placement.free_slots[m];
    let at = free.partition_point(|&s| s > slot);
    free.insert(at, slot);
}

/// Zeroes the header of `slot` of `member` (its group is elsewhere, or never was).
pub(super) fn zero_header(member: &Member, slot: u64) -> Result<()> {
    member.storage.write_at(
        slot * SLOT_BYTES + HEADER_OFFSET,
        &vec![0u8; BLOCK_BYTES as usize],
    )?;
    member.dirty.store(true, Ordering::Release);
    Ok(())
}

fn refuse_single(members: usize) -> Result<()> {
    if members < 2 {
        return Err(Error::InvalidArgument(
            "a single-file volume has one member: there is nothing to rebalance".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
