//! Open's checks of a member set against the member table, each refusal naming the member:
//! not a member, another volume's, a copy of one member, swapped, removed, not in the
//! table, a foreign uuid; a single member 0 opened alone; and an interrupted creation.
//!
//! Owns: those checks and their messages, and the table's live positions (a removed
//! member stays in the table as `REMOVED_UUID`, so the paths given are the live entries
//! in table order). Does not own: reading headers (`table.rs`), nor assembling the set
//! (`members.rs`).
//!
//! Thread-safety: plain functions over values read by the opening thread.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::volume::slot_header::{uuid_hex, SlotHeader, Uuid, REMOVED_UUID, SLOT_BYTES};
use crate::volume::Storage;

use super::read_header;

/// Table positions of the members not removed, in order: the `k`-th path given is member
/// `live(table)[k]`.
pub(super) fn live(table: &[Uuid]) -> Vec<usize> {
    (0..table.len())
        .filter(|&i| table[i] != REMOVED_UUID)
        .collect()
}

/// Whether a single-file volume's storage is in fact member 0 of a volume over several:
/// then an error naming the missing members. `Ok(())` for a plain single-file volume.
pub fn refuse_lone_member(storage: &dyn Storage, name: &str) -> Result<()> {
    match read_header(storage, 0, name)? {
        Some(h) if !h.table.is_empty() || h.member_index != 0 => {
            let missing: Vec<String> = live(&h.table)
                .into_iter()
                .filter(|&i| i != h.member_index as usize)
                .map(|i| format!("member {i} (uuid {})", uuid_hex(&h.table[i])))
                .collect();
            Err(Error::Members(format!(
                "{name} is member {} of a volume over several members; open it with all of them ({} missing)",
                h.member_index,
                if missing.is_empty() { "the others".into() } else { missing.join(", ") }
            )))
        }
        _ => Ok(()),
    }
}

/// Whether a creation was interrupted after member 0's table was written but before the
/// first commit, and every other member is either ours or still untouched: then creation
/// is done again (nothing was ever committed). A member holding anything else is left to
/// open's checks, which refuse it.
pub(super) fn resumable_creation(
    members: &[(String, Arc<dyn Storage>)],
    headers: &[Option<SlotHeader>],
    lens: &[u64],
    blank: &[bool],
    volume_uuid: Uuid,
) -> Result<bool> {
    if !crate::volume::superblock::creation_was_interrupted(members[0].1.as_ref())? {
        return Ok(false);
    }
    let table_len = headers[0].as_ref().map_or(0, |h| h.table.len());
    Ok(members.len() == table_len
        && headers
            .iter()
            .zip(lens)
            .zip(blank)
            .all(|((h, &len), &blank)| match h {
                Some(h) => h.volume_uuid == volume_uuid,
                None => blank || len == SLOT_BYTES,
            }))
}

/// Open's checks of the member given at position `i` against its slot-0 header and the
/// table; `expected`: the member the table has at that position (`live(table)[i]`), or
/// `None` past the table's live members.
pub(super) fn check_member(
    i: usize,
    expected: Option<usize>,
    members: &[(String, Arc<dyn Storage>)],
    headers: &[Option<SlotHeader>],
    table_header: &SlotHeader,
) -> Result<()> {
    let (table, volume_uuid) = (&table_header.table, table_header.volume_uuid);
    let name = &members[i].0;
    let Some(h) = &headers[i] else {
        return Err(Error::Members(format!(
            "member {i} ({name}) is not a member of a Tucana volume (no slot header)"
        )));
    };
    if h.volume_uuid != volume_uuid {
        return Err(Error::Members(format!(
            "member {i} ({name}) belongs to another volume ({}, this one is {})",
            uuid_hex(&h.volume_uuid),
            uuid_hex(&volume_uuid)
        )));
    }
    if let Some(j) = headers[..i]
        .iter()
        .position(|o| o.as_ref().is_some_and(|o| o.member_index == h.member_index))
    {
        return Err(Error::Members(format!(
                "member {i} ({name}) holds member {} of the volume, as does member {j} ({}): a copy of one member",
                h.member_index, members[j].0
            )));
    }
    if table.get(h.member_index as usize) == Some(&REMOVED_UUID) {
        return Err(Error::Members(format!(
            "{name} is not in the volume's member table: it was member {} of this volume and was removed (member table generation {}); leave it out",
            h.member_index, table_header.generation
        )));
    }
    let Some(expected) = expected else {
        return Err(Error::Members(format!(
                "member {i} ({name}) is not in the volume's member table of {} members: a member whose add did not finish (run the add again)",
                live(table).len()
            )));
    };
    if h.member_index as usize != expected {
        return Err(swapped(i, name, h.member_index));
    }
    if table.get(expected) != Some(&h.member_uuid) {
        return Err(Error::Members(format!(
            "member {i} ({name}) has member uuid {}, the volume's table says {}",
            uuid_hex(&h.member_uuid),
            table.get(expected).map_or("nothing".into(), uuid_hex)
        )));
    }
    Ok(())
}

pub(super) fn swapped(i: usize, name: &str, holds: u32) -> Error {
    Error::Members(format!(
        "member {i} ({name}) holds member {holds} of the volume: given at the wrong position (swapped?)"
    ))
}

/// The members given (the table's live ones, checked) with their uuids, and a stand-in
/// for each removed one, in table order; and their lengths (a stand-in's is 0).
#[allow(clippy::type_complexity)]
pub(super) fn with_removed(
    members: Vec<(String, Arc<dyn Storage>)>,
    headers: &[Option<SlotHeader>],
    lens: &[u64],
    table: &[Uuid],
) -> (Vec<(String, Arc<dyn Storage>, Uuid)>, Vec<u64>) {
    let mut given = members.into_iter().zip(headers).zip(lens);
    table
        .iter()
        .enumerate()
        .map(|(i, uuid)| {
            if *uuid == REMOVED_UUID {
                let stand_in: Arc<dyn Storage> = Arc::new(RemovedStorage { index: i });
                ((format!("member {i} (removed)"), stand_in, REMOVED_UUID), 0)
            } else {
                let (((name, storage), header), &len) =
                    given.next().expect("open checked a path per live member");
                let uuid = header.as_ref().expect("checked").member_uuid;
                ((name, storage, uuid), len)
            }
        })
        .unzip()
}

/// What stands for a removed member in the set's list, so member indexes keep their
/// meaning: no bytes, no room (a device of capacity 0, so placement passes over it), and
/// an error for any I/O (nothing maps a group to it: open never reads its slots).
struct RemovedStorage {
    index: usize,
}

impl RemovedStorage {
    fn refuse(&self) -> Error {
        Error::Members(format!(
            "member {} was removed from the volume: it holds nothing",
            self.index
        ))
    }
}

impl Storage for RemovedStorage {
    fn len_bytes(&self) -> Result<u64> {
        Ok(0)
    }

    fn grow(&self, _len_bytes: u64) -> Result<()> {
        Err(self.refuse())
    }

    fn read_at(&self, _offset: u64, _buf: &mut [u8]) -> Result<()> {
        Err(self.refuse())
    }

    fn write_at(&self, _offset: u64, _data: &[u8]) -> Result<()> {
        Err(self.refuse())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn capacity_bytes(&self) -> Option<u64> {
        Some(0)
    }

    fn kind(&self) -> crate::volume::StorageKind {
        crate::volume::StorageKind::Removed
    }
}
