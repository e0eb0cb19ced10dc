//! The slot header of a volume over several members: which volume, member and group a
//! 128 MiB slot of a member holds, and (in slot 0 of member 0) the member table.
//!
//! Owns: the header's byte format, its checksum and its validation. Does not own: where
//! slots are or which group goes where (`members.rs`), nor the meaning of the other
//! reserved blocks (`alloc`).
//!
//! Layout (block 6 of the slot, one of each group's spare reserved blocks; little-endian):
//!
//! ```text
//! offset bytes field
//!      0     8 magic b"TUCANAM\0"
//!      8     4 format version (1)
//!     12     4 member index (0-based, the order given at creation)
//!     16    16 volume uuid
//!     32    16 member uuid
//!     48     8 group held by this slot
//!     56     4 member count                  } slot 0 of member 0 only (the table);
//!     60 16×n  member uuids in member order   } zero in every other header
//!   4068     4 rebalance moves: 0, or the moves of the slot a rebalance copied this
//!              group from + 1 (which of two claimants is newer)
//!   4072     4 rebalanced from: 0, or 1 + the live member a rebalance copied this group
//!              from (such a header wins over its source's; see `members/rebalance.rs`)
//!   4076     4 moved from: 0, or 1 + the index of the removed member this group was
//!              copied from (valid only once the table marks that member removed)
//!   4080     4 zero
//!   4084     8 table generation (0 at creation; +1 per member added or removed)
//!   4092     4 crc32c of the block with this field zeroed
//! ```
//!
//! Slot 0 of member 0 has two copies of its header, the table's two places: block 6 and
//! block 7 (the group's second spare). Creation writes block 6 (generation 0); adding a
//! member writes the copy that is not the newest, with the next generation, so a torn
//! write leaves the newest one whole (`read_header` reads both in slot 0 and takes the
//! valid one of highest generation). Generation 0 was the field's zero bytes before it
//! existed, so headers written earlier decode unchanged.
//!
//! A removed member stays in the table as `REMOVED_UUID` (all zeros: member indexes never
//! shift, since every slot header carries one), and a group copied off it carries the
//! removed member's index in "moved from" (DESIGN.md, "Removing a member").
//!
//! Thread-safety: plain values and functions.

use crate::error::{Error, Result};
use crate::types::BLOCK_BYTES;

/// Bytes of a slot: one allocation group (`alloc::GROUP_BYTES` asserts it is the same).
pub const SLOT_BYTES: u64 = 32768 * BLOCK_BYTES;

/// Block of a slot that holds its header: the first of the group's two spare reserved
/// blocks (`alloc` asserts it is reserved and not a bitmap buddy).
pub const HEADER_BLOCK: u64 = 6;

/// Offset of the header inside its slot.
pub const HEADER_OFFSET: u64 = HEADER_BLOCK * BLOCK_BYTES;

/// Offset, inside slot 0, of the second copy of slot 0's header (the member table's other
/// place): block 7, the group's second spare reserved block.
pub const TABLE_COPY_OFFSET: u64 = (HEADER_BLOCK + 1) * BLOCK_BYTES;

/// Most members a volume has (the table must fit one block), removed ones included.
pub const MEMBERS_MAX: usize = 128;

/// The table entry of a removed member (`new_uuid` never returns it).
pub const REMOVED_UUID: Uuid = [0; 16];

const MAGIC: [u8; 8] = *b"TUCANAM\0";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = BLOCK_BYTES as usize;
const CRC_AT: usize = HEADER_BYTES - 4;
const GENERATION_AT: usize = CRC_AT - 8;
const MOVED_FROM_AT: usize = GENERATION_AT - 8;
const REBALANCED_FROM_AT: usize = MOVED_FROM_AT - 4;
const MOVES_AT: usize = REBALANCED_FROM_AT - 4;
const TABLE_AT: usize = 60;

const _: () = assert!(TABLE_AT + 16 * MEMBERS_MAX <= MOVES_AT);

/// A 128-bit random identity.
pub type Uuid = [u8; 16];

/// What a slot header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotHeader {
    pub member_index: u32,
    pub volume_uuid: Uuid,
    pub member_uuid: Uuid,
    /// The volume group this slot holds.
    pub group: u64,
    /// The member table (every member's uuid, in order): in slot 0 of member 0 only.
    pub table: Vec<Uuid>,
    /// The table's generation: 0 as created, one more per member added or removed (0
    /// where there is no table).
    pub generation: u64,
    /// The removed member this slot's group was copied from, if it was; such a header
    /// counts only once the table marks that member removed.
    pub moved_from: Option<u32>,
    /// The live member a rebalance copied this slot's group from, if one did; such a
    /// header wins over its source's when both claim the group (`rebalanced_moves`).
    pub rebalanced_from: Option<u32>,
    /// Rebalance moves of the group up to this slot: the source slot's + 1 (0 for a
    /// header no rebalance wrote).
    pub rebalanced_moves: u32,
}

impl SlotHeader {
    /// The header's 4096 bytes. Panics on a table too long for the block (a bug: creation
    /// refuses more than `MEMBERS_MAX` members).
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.table.len() <= MEMBERS_MAX, "member table too long");
        let mut bytes = vec![0u8; HEADER_BYTES];
        bytes[0..8].copy_from_slice(&MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.member_index.to_le_bytes());
        bytes[16..32].copy_from_slice(&self.volume_uuid);
        bytes[32..48].copy_from_slice(&self.member_uuid);
        bytes[48..56].copy_from_slice(&self.group.to_le_bytes());
        bytes[56..60].copy_from_slice(&(self.table.len() as u32).to_le_bytes());
        for (i, uuid) in self.table.iter().enumerate() {
            bytes[TABLE_AT + 16 * i..TABLE_AT + 16 * (i + 1)].copy_from_slice(uuid);
        }
        let moved_from = self.moved_from.map_or(0, |m| m + 1);
        bytes[MOVED_FROM_AT..MOVED_FROM_AT + 4].copy_from_slice(&moved_from.to_le_bytes());
        let rebalanced_from = self.rebalanced_from.map_or(0, |m| m + 1);
        bytes[REBALANCED_FROM_AT..MOVED_FROM_AT].copy_from_slice(&rebalanced_from.to_le_bytes());
        bytes[MOVES_AT..REBALANCED_FROM_AT].copy_from_slice(&self.rebalanced_moves.to_le_bytes());
        bytes[GENERATION_AT..CRC_AT].copy_from_slice(&self.generation.to_le_bytes());
        let crc = header_crc(&bytes);
        bytes[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Parses a header block. `Ok(None)`: not a header (all zeros, another magic, a crc
    /// mismatch: a slot never given a group, or whose header write did not reach the
    /// device: free). Errors: a header with a valid crc but a newer version or a field
    /// out of range (`Error::UnsupportedVersion`, `Error::NotAVolume` naming `what`).
    pub fn decode(bytes: &[u8], what: &str) -> Result<Option<SlotHeader>> {
        if bytes.len() != HEADER_BYTES || bytes[0..8] != MAGIC {
            return Ok(None);
        }
        let stored = u32::from_le_bytes(bytes[CRC_AT..].try_into().expect("4 bytes"));
        if stored != header_crc(bytes) {
            return Ok(None);
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let version = u32_at(8);
        if version > VERSION {
            return Err(Error::UnsupportedVersion {
                found: version,
                supported: VERSION,
            });
        }
        let count = u32_at(56) as usize;
        let moved_from = u32_at(MOVED_FROM_AT).checked_sub(1);
        let rebalanced_from = u32_at(REBALANCED_FROM_AT).checked_sub(1);
        if version != VERSION
            || count > MEMBERS_MAX
            || moved_from.is_some_and(|m| m as usize >= MEMBERS_MAX)
            || rebalanced_from.is_some_and(|m| m as usize >= MEMBERS_MAX)
        {
            return Err(Error::NotAVolume(format!(
                "{what}: slot header of version {version} with a table of {count} members (moved from {moved_from:?}, rebalanced from {rebalanced_from:?})"
            )));
        }
        let uuid_at = |at: usize| -> Uuid { bytes[at..at + 16].try_into().expect("16 bytes") };
        Ok(Some(SlotHeader {
            member_index: u32_at(12),
            volume_uuid: uuid_at(16),
            member_uuid: uuid_at(32),
            group: u64::from_le_bytes(bytes[48..56].try_into().expect("8 bytes")),
            table: (0..count).map(|i| uuid_at(TABLE_AT + 16 * i)).collect(),
            generation: u64::from_le_bytes(
                bytes[GENERATION_AT..CRC_AT].try_into().expect("8 bytes"),
            ),
            moved_from,
            rebalanced_from,
            rebalanced_moves: u32_at(MOVES_AT),
        }))
    }
}

/// A uuid as 32 hex digits, for messages.
pub fn uuid_hex(uuid: &Uuid) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh random uuid (the kernel's random source), never `REMOVED_UUID`.
pub fn new_uuid() -> Result<Uuid> {
    let mut uuid = [0u8; 16];
    let mut filled = 0;
    while filled < uuid.len() || uuid == REMOVED_UUID {
        if filled == uuid.len() {
            filled = 0;
        }
        // SAFETY: getrandom writes at most `len - filled` bytes into the buffer we pass,
        // which lives for the call.
        let n =
            unsafe { libc::getrandom(uuid[filled..].as_mut_ptr().cast(), uuid.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::Io(e));
        }
        filled += n as usize;
    }
    Ok(uuid)
}

fn header_crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&bytes[..CRC_AT]), &[0u8; 4])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(table: usize) -> SlotHeader {
        SlotHeader {
            member_index: 2,
            volume_uuid: [7; 16],
            member_uuid: [9; 16],
            group: 41,
            table: (0..table).map(|i| [i as u8; 16]).collect(),
            generation: table as u64,
            moved_from: (table == 3).then_some(1),
            rebalanced_from: (table == 0).then_some(0),
            rebalanced_moves: table as u32 + 1,
        }
    }

    #[test]
    fn round_trip_with_and_without_a_table() {
        for table in [0, 3, MEMBERS_MAX] {
            let h = sample(table);
            assert_eq!(SlotHeader::decode(&h.encode(), "t").unwrap(), Some(h));
        }
    }

    #[test]
    fn zeros_flips_and_foreign_bytes_are_no_header() {
        assert_eq!(SlotHeader::decode(&[0u8; 4096], "t").unwrap(), None);
        let good = sample(3).encode();
        for bit in [0usize, 70, 8 * 100, 8 * 4095] {
            let mut bad = good.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(SlotHeader::decode(&bad, "t").unwrap(), None, "bit {bit}");
        }
        assert_eq!(SlotHeader::decode(&good[..100], "t").unwrap(), None);
    }

    #[test]
    fn a_header_written_before_the_generation_field_decodes_as_generation_0() {
        // Headers of volumes made before members could be added have zeros where the
        // generation now is; they must decode unchanged, as generation 0.
        let mut h = sample(3);
        h.generation = 0;
        let bytes = h.encode();
        assert!(bytes[GENERATION_AT..CRC_AT].iter().all(|&b| b == 0));
        assert_eq!(
            SlotHeader::decode(&bytes, "t").unwrap().unwrap().generation,
            0
        );
    }

    #[test]
    fn a_header_no_rebalance_wrote_has_zeros_where_its_fields_are() {
        // Builds before the rebalance neither write nor read bytes 4068..4076: their
        // headers must decode as never rebalanced, and a plain header must keep them zero
        // (so an older build's view of one is unchanged).
        let mut h = sample(3);
        h.rebalanced_from = None;
        h.rebalanced_moves = 0;
        let bytes = h.encode();
        assert!(bytes[MOVES_AT..MOVED_FROM_AT].iter().all(|&b| b == 0));
        let back = SlotHeader::decode(&bytes, "t").unwrap().unwrap();
        assert_eq!((back.rebalanced_from, back.rebalanced_moves), (None, 0));
    }

    #[test]
    fn newer_version_is_unsupported() {
        let mut bytes = sample(0).encode();
        bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = header_crc(&bytes);
        bytes[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            SlotHeader::decode(&bytes, "t"),
            Err(Error::UnsupportedVersion { found: 2, .. })
        ));
    }

    #[test]
    fn uuids_are_random() {
        assert_ne!(new_uuid().unwrap(), new_uuid().unwrap());
        assert_eq!(uuid_hex(&[0xab; 16]).len(), 32);
    }
}
