//! Removing a member from a closed volume over several (DESIGN.md, "Removing a member"):
//! each group the member holds is copied, whole, to a slot of another member, under a
//! header that counts only once the table marks the member removed; then the table is
//! rewritten with the member's entry as `REMOVED_UUID`.
//!
//! Owns: the offline removal's refusals; and, for it and the open volume's removal
//! (`moving.rs`), clearing an unfinished removal's leftovers, the choice of a group's new
//! slot, the copy of a slot, and the table write. Does not own: open's checks (run first,
//! `MemberSet::open_with_blank`), what open accepts of a removed member's stand-in, moved
//! headers and live positions (`members.rs`, `checks.rs`), nor reading the table's two
//! copies (`table.rs`).
//!
//! Crash: before the table naming the removal is durable, the volume is the old one (the
//! copies' headers name a member the table does not mark removed: their slots are free,
//! and the next removal clears them first); after it, the member is gone and every group
//! it held is found on its new slot, whose bytes were synced before the table's write.
//!
//! Thread-safety: runs on the caller's thread over a volume no one else has open (its
//! members are locked as for open), under the set's `grow_lock`.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::paths::{file_identity, NamedStorage};
use super::rebalance::zero_header;
use super::{read_header, Member, MemberSet, Placement};
use crate::error::{Error, Result};
use crate::types::BLOCK_BYTES;
use crate::volume::slot_header::{
    SlotHeader, HEADER_OFFSET, REMOVED_UUID, SLOT_BYTES, TABLE_COPY_OFFSET,
};

/// Bytes read from the removed member at once (offline).
pub(super) const COPY_CHUNK_BYTES: usize = 16 << 20;

/// Bytes copied at once on the open volume: a write to a moving group waits for at most
/// one such piece (a read and a write of 4 MiB: a few ms on an SSD).
pub(super) const ONLINE_PIECE_BYTES: usize = 4 << 20;

/// Granularity at which all-zero bytes are left as holes in a freshly grown slot.
pub(super) const HOLE_BYTES: usize = 64 << 10;

/// What a removal did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemovedMember {
    /// The member's index in the table (kept, as a removed entry).
    pub index: usize,
    /// Groups copied onto the other members.
    pub groups_moved: u64,
    /// Bytes written by those copies (holes of a fresh slot are not written).
    pub bytes_moved: u64,
    /// The member table's generation now.
    pub generation: u64,
    /// On the open volume: bytes writers wrote a second time, to a group being moved
    /// (to its new slot) or moved while they wrote; 0 offline.
    pub rewritten_bytes: u64,
}

impl MemberSet {
    /// Removes the member given at `position` of `paths` (every current member in order,
    /// as open takes them) from the closed volume. `remove` must be one of `paths` (by
    /// file identity, or spelled the same). Refusals, each before anything is opened or
    /// written: a path not among `paths`, member 0 (it holds the superblock and the
    /// table), a removal that would leave one member (`Error::InvalidArgument` or
    /// `Error::Members`); then a volume open elsewhere (its lock) and open's checks.
    pub fn remove_member_paths(
        paths: &[PathBuf],
        remove: &Path,
        min_reservation_bytes: u64,
    ) -> Result<RemovedMember> {
        let identity = file_identity(remove);
        let Some(position) = paths
            .iter()
            .position(|p| p == remove || (identity.is_some() && file_identity(p) == identity))
        else {
            return Err(Error::Members(format!(
                "{} is not one of the {} members given: nothing to remove",
                remove.display(),
                paths.len()
            )));
        };
        refuse_position(paths.len(), position, &remove.display().to_string())?;
        let (members, _) = MemberSet::open_storages(paths, false, false, min_reservation_bytes)?;
        MemberSet::remove_member(members, position)
    }

    /// Removes the member at `position` of `members` (every current member in order, as
    /// `open` takes them) from the closed volume over them; see `remove_member_paths`.
    pub fn remove_member(members: Vec<NamedStorage>, position: usize) -> Result<RemovedMember> {
        let name = members
            .get(position)
            .map(|(name, _)| name.clone())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "member position {position} past the {} members given",
                    members.len()
                ))
            })?;
        refuse_position(members.len(), position, &name)?;
        let n = members.len();
        let set = MemberSet::open_with_blank(members, &vec![false; n], false)?;
        let index = (0..set.members.len())
            .filter(|&m| !set.is_removed(m))
            .nth(position)
            .expect("open checked a member per path");
        let mut placement = set.grow_lock.lock();
        set.remove_under_lock(&mut placement, index)
    }

    /// The removal's writes (see the module doc): leftovers of an earlier attempt
    /// cleared, every group of member `r` copied and headed, the copies synced, then the
    /// table with `r` removed over its older copy, synced.
    fn remove_under_lock(&self, placement: &mut Placement, r: usize) -> Result<RemovedMember> {
        self.clear_unfinished_moves(placement, Some(r))?;
        let groups: Vec<(u64, u64)> = (0..placement.placed_groups)
            .filter_map(|g| self.lookup(g).filter(|&(m, _)| m == r).map(|(_, s)| (g, s)))
            .collect();
        let mut bytes_moved = 0;
        let mut targets = Vec::new();
        for &(group, from_slot) in &groups {
            let (t, slot, fresh) = self.slot_for_move(placement, r, group)?;
            let source = &self.members[r];
            let target = &self.members[t];
            bytes_moved += copy_slot_piecewise(
                source,
                from_slot,
                target,
                slot,
                fresh,
                COPY_CHUNK_BYTES,
                &|| (),
            )?;
            let header = SlotHeader {
                member_index: t as u32,
                volume_uuid: self.volume_uuid,
                member_uuid: target.uuid,
                group,
                table: Vec::new(),
                generation: 0,
                moved_from: Some(r as u32),
                rebalanced_from: None,
                rebalanced_moves: 0,
            };
            target
                .storage
                .write_at(slot * SLOT_BYTES + HEADER_OFFSET, &header.encode())?;
            target.dirty.store(true, Ordering::Release);
            placement.groups[t] += 1;
            placement.groups[r] -= 1;
            targets.push(t);
        }
        targets.sort_unstable();
        targets.dedup();
        for t in targets {
            self.members[t].sync()?;
        }
        let generation = self.write_table_without(r)?;
        Ok(RemovedMember {
            index: r,
            groups_moved: groups.len() as u64,
            bytes_moved,
            generation,
            rewritten_bytes: 0,
        })
    }

    /// Zeroes every header of this volume on a free slot of the members other than
    /// `skip`: copies of an earlier removal whose table never became durable, and the
    /// losing copy of a rebalance interrupted before it zeroed it (`rebalance.rs`); so
    /// the next table or header written cannot make two slots claim one group that open
    /// does not resolve. Each member is synced before any copy is written.
    pub(super) fn clear_unfinished_moves(
        &self,
        placement: &Placement,
        skip: Option<usize>,
    ) -> Result<()> {
        for (m, member) in self.members.iter().enumerate() {
            if Some(m) == skip || member.removed {
                continue;
            }
            for &slot in &placement.free_slots[m] {
                let left = read_header(member.storage.as_ref(), slot, &member.name)?;
                if left.is_some_and(|h| h.volume_uuid == self.volume_uuid) {
                    zero_header(member, slot)?;
                }
            }
            member.sync()?;
        }
        Ok(())
    }

    /// Where `group` goes: the member other than `r` holding the fewest groups that has
    /// room (the lowest index on a tie), its lowest free slot or a new one grown at its
    /// end (`fresh`: it reads as zeros). Errors when no member has room (full devices).
    pub(super) fn slot_for_move(
        &self,
        placement: &mut Placement,
        r: usize,
        group: u64,
    ) -> Result<(usize, u64, bool)> {
        let t = (0..self.members.len())
            .filter(|&m| m != r && !self.is_removed(m) && self.has_room(placement, m))
            .min_by_key(|&m| (placement.groups[m], m))
            .ok_or_else(|| {
                Error::Io(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!("no other member has room for group {group} of the member removed"),
                ))
            })?;
        let (slot, fresh) = self.take_slot(placement, t)?;
        Ok((t, slot, fresh))
    }

    /// Writes the table with member `r`'s entry removed and the next generation over the
    /// older of its two copies, and syncs member 0; returns the generation.
    pub(super) fn write_table_without(&self, r: usize) -> Result<u64> {
        let first = &self.members[0];
        let copies = super::table::slot0_copies(first.storage.as_ref(), &first.name)?;
        let mut table = read_header(first.storage.as_ref(), 0, &first.name)?
            .ok_or_else(|| self.corrupt(0, 0, "has no slot header".into()))?;
        table.table[r] = REMOVED_UUID;
        table.generation += 1;
        let older_at = match &copies {
            [Some(a), Some(b)] if b.generation > a.generation => HEADER_OFFSET,
            [Some(_), _] => TABLE_COPY_OFFSET,
            [None, _] => HEADER_OFFSET,
        };
        first.storage.write_at(older_at, &table.encode())?;
        first.dirty.store(true, Ordering::Release);
        first.sync()?;
        Ok(table.generation)
    }
}

/// The refusals that need no I/O: member 0, and a removal that would leave one member.
fn refuse_position(given: usize, position: usize, name: &str) -> Result<()> {
    if given < 2 {
        return Err(Error::InvalidArgument(
            "a single-file volume has no member to remove".into(),
        ));
    }
    if position == 0 {
        return Err(Error::Members(format!(
            "{name} is member 0, which holds the superblock and the member table: it cannot be removed"
        )));
    }
    if given == 2 {
        return Err(Error::Members(format!(
            "removing {name} would leave member 0 alone: a volume over several members keeps two at least"
        )));
    }
    Ok(())
}

/// Copies slot `from_slot` of `source` to slot `to_slot` of `target`, all but the slot
/// header's block (the caller writes the target's own), in pieces of `piece_bytes`, each
/// read and written while `hold()`'s guard lives (the open volume's removal orders them
/// with writes to the group that way; offline nothing else writes). In a `fresh` target
/// slot (zeros) runs of `HOLE_BYTES` that are zero in the source are left unwritten;
/// elsewhere every byte is written, since a reused slot may hold anything. Returns the
/// bytes written.
pub(super) fn copy_slot_piecewise<G>(
    source: &Member,
    from_slot: u64,
    target: &Member,
    to_slot: u64,
    fresh: bool,
    piece_bytes: usize,
    hold: &dyn Fn() -> G,
) -> Result<u64> {
    let start = from_slot * SLOT_BYTES;
    let end = (start + SLOT_BYTES).min(source.storage.len_bytes()?);
    let mut buf = vec![0u8; piece_bytes];
    let header = HEADER_OFFSET as usize..(HEADER_OFFSET + BLOCK_BYTES) as usize;
    let mut written = 0u64;
    let mut at = start;
    while at < end {
        let len = ((end - at) as usize).min(piece_bytes);
        let within = (at - start) as usize;
        let to = to_slot * SLOT_BYTES + within as u64;
        let chunk = &mut buf[..len];
        let _held = hold();
        source.storage.read_at(at, chunk)?;
        // The source's own header (the piece holding block 6 starts at the slot's start).
        if within == 0 {
            let upto = header.end.min(len);
            chunk[header.start.min(upto)..upto].fill(0);
        }
        let mut piece = 0;
        while piece < len {
            let mut run_end = piece;
            while run_end < len {
                let next = (run_end + HOLE_BYTES).min(len);
                if fresh && chunk[run_end..next].iter().all(|&b| b == 0) {
                    break;
                }
                run_end = next;
            }
            if run_end > piece {
                target
                    .storage
                    .write_at(to + piece as u64, &chunk[piece..run_end])?;
                written += (run_end - piece) as u64;
                piece = run_end;
            } else {
                piece = (piece + HOLE_BYTES).min(len);
            }
        }
        at += len as u64;
    }
    target.dirty.store(true, Ordering::Release);
    Ok(written)
}

#[cfg(test)]
mod tests;
