//! Slot headers as open reads them, and adding a member to a volume over several, closed
//! or open (DESIGN.md, "Adding a member").
//!
//! Owns: reading a slot's header (in slot 0, the newer of its two copies, blocks 6 and 7:
//! the member table's two places), the table check of `verify`, and the add: the new
//! member's slot-0 header written and synced, then the table naming it written to the
//! older copy with the next generation and synced. Does not own: the set's checks at open
//! (`MemberSet::open_with_blank`, which the add runs first) nor placement (`members.rs`).
//!
//! Crash during an add: before the table's write is durable, the volume is the old one
//! (open with the old paths works; with the new one it is refused as not in the table),
//! and the add can be run again (the new member's own header, whole or torn, is taken as
//! an add that did not finish). After it, the volume has the new member and open without
//! it says which member is missing. A torn table write leaves the other copy, the newest
//! before the add.
//!
//! An add to an open volume makes the same checks and writes, then publishes the member
//! (the list, then its group in the map): until the table naming it is durable, nothing
//! of the volume can be dispatched, placed or synced on it.
//!
//! Thread-safety: the offline add runs on the caller's thread over a volume no one else
//! has open (its members are locked as for open). The online add runs under the set's
//! `grow_lock` from its checks to its publication (adds and placements are serialised;
//! reads, writes into placed groups and syncs go on), and syncs member 0 through its
//! sync protocol, beside a commit's. Reading headers is plain I/O.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::sync::atomic::Ordering;

use super::{Member, MemberSet, Placement, SLOT_BITS};
use crate::error::{Error, Result};
use crate::types::BLOCK_BYTES;
use crate::volume::slot_header::{
    new_uuid, uuid_hex, SlotHeader, Uuid, HEADER_OFFSET, MEMBERS_MAX, REMOVED_UUID, SLOT_BYTES,
    TABLE_COPY_OFFSET,
};
use crate::volume::Storage;

/// Why a single-file volume takes no member.
pub(crate) const SINGLE_FILE: &str = "a member can be added only to a volume created over several members (a single-file volume has no slot headers to hold a member table)";

/// What an add did: the new member's position, uuid and the group its slot 0 holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddedMember {
    pub index: usize,
    pub uuid: String,
    pub group: u64,
    /// The member table's generation now.
    pub generation: u64,
}

/// Reads and decodes the header of `slot` of a member; `None` when it has none (a slot
/// past the member's end included). In slot 0, both copies are read and the valid one of
/// highest generation wins (the table's two places; a member other than 0 has no second
/// copy, whose block reads as zeros).
pub(crate) fn read_header(
    storage: &dyn Storage,
    slot: u64,
    name: &str,
) -> Result<Option<SlotHeader>> {
    if slot != 0 {
        return read_block(storage, slot * SLOT_BYTES + HEADER_OFFSET, name);
    }
    let [first, second] = slot0_copies(storage, name)?;
    Ok(match (first, second) {
        (Some(a), Some(b)) => Some(if b.generation > a.generation { b } else { a }),
        (a, b) => a.or(b),
    })
}

/// Slot 0's two header copies (blocks 6 and 7), each `None` where invalid.
pub(super) fn slot0_copies(storage: &dyn Storage, name: &str) -> Result<[Option<SlotHeader>; 2]> {
    Ok([
        read_block(storage, HEADER_OFFSET, name)?,
        read_block(storage, TABLE_COPY_OFFSET, name)?,
    ])
}

fn read_block(storage: &dyn Storage, at: u64, name: &str) -> Result<Option<SlotHeader>> {
    if storage.len_bytes()? < at + BLOCK_BYTES {
        return Ok(None);
    }
    let mut bytes = vec![0u8; BLOCK_BYTES as usize];
    storage.read_at(at, &mut bytes)?;
    SlotHeader::decode(&bytes, name)
}

/// Whether a member with no valid header is what an add leaves when it stopped before
/// the header was durable: one slot at most, and every block of slot 0's reserved
/// blocks but the header's (which may be torn) zero. Anything else is someone's data.
fn left_by_an_unfinished_add(storage: &dyn Storage) -> Result<bool> {
    let len = storage.len_bytes()?;
    if len > SLOT_BYTES {
        return Ok(false);
    }
    let reserved = (TABLE_COPY_OFFSET + BLOCK_BYTES).min(len);
    let mut bytes = vec![0u8; reserved as usize];
    storage.read_at(0, &mut bytes)?;
    let header = HEADER_OFFSET as usize..(HEADER_OFFSET + BLOCK_BYTES) as usize;
    Ok(bytes
        .iter()
        .enumerate()
        .all(|(i, &b)| b == 0 || header.contains(&i)))
}

impl MemberSet {
    /// Checks that the newest member table names exactly this set's members, in order
    /// (part of `verify`).
    pub(super) fn verify_table(&self) -> Result<()> {
        let first = &self.members[0];
        let header = read_header(first.storage.as_ref(), 0, &first.name)?
            .ok_or_else(|| self.corrupt(0, 0, "has no slot header".into()))?;
        let ours: Vec<_> = self.members.iter().map(|m| m.uuid).collect();
        // A member being removed from the open volume is named until the table's write,
        // and removed after it.
        let matches = header.table.len() == ours.len()
            && self.members.iter().zip(&header.table).all(|(m, t)| {
                *t == m.uuid || (*t == REMOVED_UUID && m.draining.load(Ordering::Relaxed))
            });
        if !matches {
            return Err(self.corrupt(
                0,
                0,
                format!(
                    "the member table (generation {}) names {} members, {} are open",
                    header.generation,
                    header.table.len(),
                    ours.len()
                ),
            ));
        }
        Ok(())
    }

    /// Adds a member to the closed volume over `members` (every current member, in
    /// order): `new` becomes member `members.len()`. `new_blank`: it holds nothing and
    /// may be written (an empty file, or a device formatting was asked for that carries
    /// nothing of ours). The volume is first opened as `open` would (every check of the
    /// set), nothing written before they pass.
    ///
    /// Errors: a single-file volume (no slot headers to hold a table) or one already of
    /// `MEMBERS_MAX` members (`Error::InvalidArgument`); open's errors; a new member that
    /// is already a member, belongs to another volume or holds data (`Error::Members`,
    /// naming it); I/O errors (the add may then be run again).
    pub fn add_member(
        members: Vec<(String, Arc<dyn Storage>)>,
        new: (String, Arc<dyn Storage>),
        new_blank: bool,
    ) -> Result<AddedMember> {
        let n = members.len();
        if n < 2 {
            return Err(Error::InvalidArgument(SINGLE_FILE.into()));
        }
        let set = MemberSet::open_with_blank(members, &vec![false; n], false)?;
        let mut placement = set.grow_lock.lock();
        let (added, ..) = set.add_under_lock(&mut placement, new, new_blank, &|| {})?;
        Ok(added)
    }

    /// Adds `new` as the next member of this set while the volume is open (DESIGN.md,
    /// "Adding a member", online): the same checks and writes as `add_member`, under
    /// `grow_lock` (no group is placed meanwhile, so the next group is still the one the
    /// new header names), then the member is published: first in the list, then group
    /// G in the map, so from then on dispatch and growth see it. `table_unsure` is called
    /// when the table's write or sync failed (what of it is durable is then unknown: the
    /// engine stops acknowledging, as after any failed sync).
    ///
    /// Errors: as `add_member` (nothing written on a refusal).
    pub fn add_member_online(
        &self,
        new: (String, Arc<dyn Storage>),
        new_blank: bool,
        table_unsure: &dyn Fn(),
    ) -> Result<AddedMember> {
        let mut placement = self.grow_lock.lock();
        let (added, uuid, slots) =
            self.add_under_lock(&mut placement, new.clone(), new_blank, table_unsure)?;
        // Nothing below can fail: the table naming the member is durable, and the set
        // must now use it (an error here would leave the two apart).
        let (name, storage) = new;
        placement.free_slots.push((1..slots).rev().collect());
        placement.slot_counts.push(slots);
        placement.groups.push(1);
        self.members.push(Member::new(name, storage, uuid));
        let entry = self
            .entry(added.group)
            .expect("the add checked the group has a map entry");
        entry.store((added.index as u64 + 1) << SLOT_BITS, Ordering::Release);
        placement.placed_groups = added.group + 1;
        Ok(added)
    }

    /// The add's checks and its two writes, each synced (`grow_lock` held by the caller,
    /// so the group placed next is fixed). Returns what was added, the new member's uuid
    /// and its slots as open would count them (a device holds only whole slots; all but
    /// slot 0 free); publishes nothing.
    fn add_under_lock(
        &self,
        placement: &mut Placement,
        new: (String, Arc<dyn Storage>),
        new_blank: bool,
        table_unsure: &dyn Fn(),
    ) -> Result<(AddedMember, Uuid, u64)> {
        let n = self.members.len();
        if n >= MEMBERS_MAX {
            return Err(Error::InvalidArgument(format!(
                "the volume has {n} members, the most a volume has"
            )));
        }
        let (new_name, new_storage) = new;
        let first = &self.members[0];
        let copies = slot0_copies(first.storage.as_ref(), &first.name)?;
        let newest = read_header(first.storage.as_ref(), 0, &first.name)?
            .ok_or_else(|| self.corrupt(0, 0, "has no slot header".into()))?;
        self.check_new_member(n, &new_name, new_storage.as_ref(), new_blank, &newest)?;
        // The next group: placed on the new member, so new segments dispatched to it
        // find a group there as soon as the allocator grows into it.
        let group = placement.placed_groups;
        if self.entry(group).is_none() {
            return Err(Error::InvalidArgument(format!(
                "group {group} is past the most a volume has"
            )));
        }
        let uuid = new_uuid()?;
        if new_storage.len_bytes()? < SLOT_BYTES {
            new_storage.grow(SLOT_BYTES)?;
        }
        let len = new_storage.len_bytes()?;
        let slots = match new_storage.capacity_bytes() {
            Some(_) => len / SLOT_BYTES,
            None => len.div_ceil(SLOT_BYTES),
        }
        .max(1);
        let header = SlotHeader {
            member_index: n as u32,
            volume_uuid: self.volume_uuid,
            member_uuid: uuid,
            group,
            table: Vec::new(),
            generation: 0,
            moved_from: None,
            rebalanced_from: None,
            rebalanced_moves: 0,
        };
        new_storage.write_at(HEADER_OFFSET, &header.encode())?;
        new_storage.sync()?;
        // The table naming it, over the older copy: a torn write leaves the newest whole.
        let mut table = newest.clone();
        table.table.push(uuid);
        table.generation = newest.generation + 1;
        let older_at = match &copies {
            [Some(a), Some(b)] if b.generation > a.generation => HEADER_OFFSET,
            [Some(_), _] => TABLE_COPY_OFFSET,
            [None, _] => HEADER_OFFSET,
        };
        first
            .storage
            .write_at(older_at, &table.encode())
            .and_then(|()| {
                first.dirty.store(true, Ordering::Release);
                first.sync()
            })
            .inspect_err(|_| table_unsure())?;
        let added = AddedMember {
            index: n,
            uuid: uuid_hex(&uuid),
            group,
            generation: table.generation,
        };
        Ok((added, uuid, slots))
    }

    /// Refuses a new member `n` that is already a member, of another volume, or holds
    /// data; accepts a blank one and what an unfinished add left (see the module doc).
    fn check_new_member(
        &self,
        n: usize,
        new_name: &str,
        new_storage: &dyn Storage,
        new_blank: bool,
        newest: &SlotHeader,
    ) -> Result<()> {
        match read_header(new_storage, 0, new_name)? {
            None if new_blank => Ok(()),
            None if left_by_an_unfinished_add(new_storage)? => Ok(()),
            None => Err(Error::Members(format!(
                "new member {n} ({new_name}) holds data and no slot header: never formatted over; give an empty file{}",
                if new_storage.capacity_bytes().is_some() {
                    " or a device with formatting asked for"
                } else {
                    ""
                }
            ))),
            // A header of this volume at this position that the table does not name:
            // an earlier add stopped before the table; it is written again.
            Some(h)
                if h.volume_uuid == self.volume_uuid
                    && h.member_index as usize == n
                    && !newest.table.contains(&h.member_uuid) =>
            {
                Ok(())
            }
            Some(h)
                if h.volume_uuid == self.volume_uuid
                    && newest.table.get(h.member_index as usize) == Some(&REMOVED_UUID) =>
            {
                Err(Error::Members(format!(
                    "new member {n} ({new_name}) was member {} of this volume, since removed: wipe its first slot to add it again",
                    h.member_index
                )))
            }
            Some(h) if h.volume_uuid == self.volume_uuid => Err(Error::Members(format!(
                "new member {n} ({new_name}) is already member {} of this volume",
                h.member_index
            ))),
            Some(h) => Err(Error::Members(format!(
                "new member {n} ({new_name}) belongs to another volume ({})",
                uuid_hex(&h.volume_uuid)
            ))),
        }
    }

    /// `add_member` by paths: `paths` every current member in order, `new` the member to
    /// add (a file is created if missing; a block device is written only with
    /// `format_block_devices` and when it carries nothing of Tucana's). The files are
    /// locked as open locks them, so a volume open elsewhere is refused.
    pub fn add_member_paths(
        paths: &[PathBuf],
        new: &Path,
        format_block_devices: bool,
        min_reservation_bytes: u64,
    ) -> Result<AddedMember> {
        if paths.len() < 2 {
            return Err(Error::InvalidArgument(SINGLE_FILE.into()));
        }
        super::paths::create_if_missing(new)?;
        let mut all = paths.to_vec();
        all.push(new.to_path_buf());
        let (mut members, blank) =
            MemberSet::open_storages(&all, false, format_block_devices, min_reservation_bytes)?;
        let new_member = members.pop().expect("the new path is last");
        MemberSet::add_member(members, new_member, blank[paths.len()])
    }
}

#[cfg(test)]
mod tests;
