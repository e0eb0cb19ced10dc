//! The superblock: two checksummed 4096-byte slots at volume offsets 0 and 4096, each
//! naming the descriptor of one commit. The slot with the higher valid epoch is the
//! volume's current state.
//!
//! Owns: the slot byte format, its validation, which slot an epoch goes to, and picking
//! the newest valid slot at open. Does not own: the descriptor's contents (that is
//! `commit`), when slots are written or synced (the commit protocol), or checking the
//! superblock against the rest of the volume (e.g. `volume_bytes` against the file
//! length: recovery and `check` do that).
//!
//! Why two slots: commit epoch `e` is written to slot `e % 2`, overwriting epoch `e - 2`
//! and leaving the slot of epoch `e - 1` untouched. A torn or lost slot write therefore
//! fails its crc and open falls back to the previous commit (LMDB's meta pages lost data
//! because they were not checksummed; ours are).
//!
//! Slot layout (all integers little-endian):
//!
//! ```text
//! offset  bytes  field
//!      0      8  magic            b"TUCANAV\0"              } stable in every format
//!      8      4  format version   u32, FORMAT_VERSION (1)   } version
//!     12      4  block size       u32, 4096
//!     16      8  epoch            u64, commit epoch; epoch % 2 == slot number
//!     24      8  descriptor       u64, volume offset of the commit descriptor (block aligned)
//!     32      8  descriptor bytes u64, its length
//!     40      4  descriptor crc   u32, crc32c of the descriptor's bytes
//!     44      4  reserved         zero
//!     48      8  volume bytes     u64, volume length at this commit (block multiple)
//!     56   4036  reserved         zero
//!   4092      4  slot crc         u32, crc32c of all 4096 bytes with this field zeroed
//! ```
//!
//! The slot crc covers every byte of the slot, so any single-bit flip anywhere is
//! detected (a flip in the magic reads as "not a volume", in the crc field as a crc
//! mismatch). The magic, the version and the crc's position are promised for all future
//! formats, so this build can tell a slot of a newer format (valid crc, higher version:
//! `Error::UnsupportedVersion`) from a corrupt one.
//!
//! Thread-safety: plain values and functions; `read_newest` only reads the storage.

use crate::error::{Error, Result};
use crate::types::{CommitEpoch, DiskOffset, BLOCK_BYTES};
use crate::volume::Storage;

/// Newest slot format this build reads and the one it writes.
pub const FORMAT_VERSION: u32 = 1;

/// Bytes of one slot.
pub const SLOT_BYTES: usize = 4096;

/// Number of slots (blocks 0 and 1 of the volume).
pub const SLOT_COUNT: usize = 2;

const MAGIC: [u8; 8] = *b"TUCANAV\0";

// Field offsets within a slot; see the diagram in the module doc.
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = 8;
const BLOCK_SIZE_AT: usize = 12;
const EPOCH_AT: usize = 16;
const DESCRIPTOR_AT: usize = 24;
const DESCRIPTOR_BYTES_AT: usize = 32;
const DESCRIPTOR_CRC_AT: usize = 40;
const RESERVED_A: std::ops::Range<usize> = 44..48;
const VOLUME_BYTES_AT: usize = 48;
const RESERVED_B: std::ops::Range<usize> = 56..CRC_AT;
const CRC_AT: usize = SLOT_BYTES - 4;

const _: () = assert!(SLOT_BYTES as u64 == BLOCK_BYTES);

/// The contents of one superblock slot: which commit is current and where its descriptor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The commit's epoch; also decides the slot (`epoch % 2`).
    pub epoch: CommitEpoch,
    /// Where the commit descriptor starts (block aligned, past the slots), or
    /// `DiskOffset::NONE` with `descriptor_bytes == 0` when the commit has none.
    pub descriptor: DiskOffset,
    /// Length of the descriptor in bytes.
    pub descriptor_bytes: u64,
    /// crc32c of the descriptor's bytes, checked by whoever reads it.
    pub descriptor_crc: u32,
    /// Volume length at this commit (a whole number of blocks, at least the two slots).
    pub volume_bytes: u64,
}

impl Superblock {
    /// The slot's 4096 bytes. Panics if the superblock breaks an invariant that `decode`
    /// checks: writing a slot that cannot be read back is a bug.
    pub fn encode(&self) -> Box<[u8; SLOT_BYTES]> {
        let slot = slot_number(self.epoch);
        if let Err(detail) = self.check(slot) {
            panic!("encoding an invalid superblock {self:?}: {detail}");
        }
        let mut bytes = Box::new([0u8; SLOT_BYTES]);
        bytes[MAGIC_AT..MAGIC_AT + 8].copy_from_slice(&MAGIC);
        put_u32(&mut bytes[..], VERSION_AT, FORMAT_VERSION);
        put_u32(&mut bytes[..], BLOCK_SIZE_AT, BLOCK_BYTES as u32);
        put_u64(&mut bytes[..], EPOCH_AT, self.epoch.0);
        put_u64(&mut bytes[..], DESCRIPTOR_AT, self.descriptor.0);
        put_u64(&mut bytes[..], DESCRIPTOR_BYTES_AT, self.descriptor_bytes);
        put_u32(&mut bytes[..], DESCRIPTOR_CRC_AT, self.descriptor_crc);
        put_u64(&mut bytes[..], VOLUME_BYTES_AT, self.volume_bytes);
        let crc = slot_crc(&bytes[..]);
        put_u32(&mut bytes[..], CRC_AT, crc);
        debug_assert_eq!(Superblock::decode(&bytes[..], slot).ok(), Some(*self));
        bytes
    }

    /// Parses and verifies the bytes of slot `slot` (0 or 1; read from `slot * 4096`).
    ///
    /// Errors: `Error::NotAVolume` when the magic is wrong and the slot is not all zeros;
    /// `Error::Corruption` naming the slot's offset for an all-zero (never written) slot, a
    /// crc mismatch, or a field that breaks an invariant (including an epoch that belongs
    /// in the other slot: a misdirected write); `Error::UnsupportedVersion` for a slot with
    /// a valid crc written by a newer format.
    pub fn decode(bytes: &[u8], slot: usize) -> Result<Superblock> {
        assert!(slot < SLOT_COUNT, "superblock slot {slot} does not exist");
        let offset = DiskOffset(slot as u64 * BLOCK_BYTES);
        let corrupt = |detail: String| Error::corruption("superblock slot", offset, detail);
        let bytes: &[u8; SLOT_BYTES] = bytes
            .try_into()
            .map_err(|_| corrupt(format!("{} bytes, a slot is {SLOT_BYTES}", bytes.len())))?;

        if bytes[MAGIC_AT..MAGIC_AT + 8] != MAGIC {
            if is_all_zero(bytes) {
                return Err(corrupt("empty (all zeros): never written".into()));
            }
            return Err(Error::NotAVolume(format!(
                "superblock slot {slot} at offset {offset} starts with {:02x?}, not the magic {:?}",
                &bytes[MAGIC_AT..MAGIC_AT + 8],
                String::from_utf8_lossy(&MAGIC[..7]),
            )));
        }
        let stored_crc = get_u32(bytes, CRC_AT);
        let computed_crc = slot_crc(bytes);
        if stored_crc != computed_crc {
            return Err(corrupt(format!(
                "crc32c mismatch: stored {stored_crc:#010x}, computed {computed_crc:#010x}"
            )));
        }
        let version = get_u32(bytes, VERSION_AT);
        if version > FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if version != FORMAT_VERSION {
            return Err(corrupt(format!("format version {version} never existed")));
        }
        let block_bytes = get_u32(bytes, BLOCK_SIZE_AT);
        if u64::from(block_bytes) != BLOCK_BYTES {
            return Err(corrupt(format!(
                "block size {block_bytes}, this build uses {BLOCK_BYTES}"
            )));
        }
        if !is_all_zero(&bytes[RESERVED_A]) || !is_all_zero(&bytes[RESERVED_B]) {
            return Err(corrupt("reserved bytes are not zero".into()));
        }
        let superblock = Superblock {
            epoch: CommitEpoch(get_u64(bytes, EPOCH_AT)),
            descriptor: DiskOffset(get_u64(bytes, DESCRIPTOR_AT)),
            descriptor_bytes: get_u64(bytes, DESCRIPTOR_BYTES_AT),
            descriptor_crc: get_u32(bytes, DESCRIPTOR_CRC_AT),
            volume_bytes: get_u64(bytes, VOLUME_BYTES_AT),
        };
        superblock.check(slot).map_err(corrupt)?;
        Ok(superblock)
    }

    /// Writes this superblock to its slot (`slot_offset(self.epoch)`). Does not sync: the
    /// commit protocol decides when the slot must be durable (after the descriptor and
    /// everything it names).
    pub fn write_to(&self, storage: &dyn Storage) -> Result<()> {
        storage.write_at(slot_offset(self.epoch).0, &self.encode()[..])
    }

    /// The invariants every slot holds, for a superblock stored in slot `slot`.
    fn check(&self, slot: usize) -> std::result::Result<(), String> {
        if slot_number(self.epoch) != slot {
            return Err(format!(
                "epoch {} belongs in slot {}, found in slot {slot} (misdirected write)",
                self.epoch.0,
                slot_number(self.epoch)
            ));
        }
        let slots_bytes = SLOT_COUNT as u64 * BLOCK_BYTES;
        if !self.volume_bytes.is_multiple_of(BLOCK_BYTES) || self.volume_bytes < slots_bytes {
            return Err(format!(
                "volume of {} bytes is not a whole number of blocks holding both slots",
                self.volume_bytes
            ));
        }
        if self.descriptor.is_none() {
            if self.descriptor_bytes != 0 {
                return Err(format!(
                    "no descriptor but descriptor bytes {}",
                    self.descriptor_bytes
                ));
            }
            return Ok(());
        }
        if !self.descriptor.block_aligned() || self.descriptor.0 < slots_bytes {
            return Err(format!(
                "descriptor offset {} is not a block past the slots",
                self.descriptor
            ));
        }
        match self.descriptor.0.checked_add(self.descriptor_bytes) {
            Some(end) if end <= self.volume_bytes => Ok(()),
            _ => Err(format!(
                "descriptor of {} bytes at {} runs past the volume's {} bytes",
                self.descriptor_bytes, self.descriptor, self.volume_bytes
            )),
        }
    }
}

/// Volume offset of the slot that commit `epoch` is written to: `(epoch % 2) * 4096`.
pub fn slot_offset(epoch: CommitEpoch) -> DiskOffset {
    DiskOffset(slot_number(epoch) as u64 * BLOCK_BYTES)
}

fn slot_number(epoch: CommitEpoch) -> usize {
    (epoch.0 % SLOT_COUNT as u64) as usize
}

/// The newest valid superblock of the volume.
///
/// `Ok(None)` for a fresh volume: both slots all zeros, or a file shorter than the two
/// slots that holds only zeros. (A crash while a volume is first formatted leaves exactly
/// that, so the caller formats it again.) Otherwise the valid slot with the higher epoch;
/// one bad slot is normal after a torn superblock write, and the other one wins.
///
/// Errors: when neither slot is valid, an error saying what is wrong with each —
/// `Error::NotAVolume` if neither slot carries the magic (or the file is too short to hold
/// the slots and not empty), else `Error::Corruption` at offset 0. `Error::UnsupportedVersion`
/// whenever either slot was written by a newer format, even if the other slot is valid:
/// falling back to an older commit of a volume that a newer build has written would lose
/// its newer commits.
pub fn read_newest(storage: &dyn Storage) -> Result<Option<Superblock>> {
    let len_bytes = storage.len_bytes()?;
    let slots_bytes = SLOT_COUNT * SLOT_BYTES;
    if len_bytes < slots_bytes as u64 {
        // `len_bytes < 8192`, so it fits in `usize`.
        let mut head = vec![0u8; len_bytes as usize];
        storage.read_at(0, &mut head)?;
        if is_all_zero(&head) {
            return Ok(None);
        }
        return Err(Error::NotAVolume(format!(
            "{len_bytes} bytes, too short for the two superblock slots ({slots_bytes} bytes), and not empty"
        )));
    }

    let mut bytes = vec![0u8; slots_bytes];
    storage.read_at(0, &mut bytes)?;
    if is_all_zero(&bytes) {
        return Ok(None);
    }
    let [first, second] = [0, 1].map(|slot| {
        let start = slot * SLOT_BYTES;
        Superblock::decode(&bytes[start..start + SLOT_BYTES], slot)
    });
    match (first, second) {
        (Err(e @ Error::UnsupportedVersion { .. }), _)
        | (_, Err(e @ Error::UnsupportedVersion { .. })) => Err(e),
        (Ok(a), Ok(b)) => Ok(Some(if a.epoch > b.epoch { a } else { b })),
        (Ok(only), Err(_)) | (Err(_), Ok(only)) => Ok(Some(only)),
        (Err(first), Err(second)) => {
            let detail = format!("no valid superblock slot: slot 0: {first}; slot 1: {second}");
            // "Not a volume" only if no slot looks like ours: each is foreign or empty.
            let foreign_or_empty = |e: &Error, slot: usize| {
                matches!(e, Error::NotAVolume(_))
                    || is_all_zero(&bytes[slot * SLOT_BYTES..(slot + 1) * SLOT_BYTES])
            };
            if foreign_or_empty(&first, 0) && foreign_or_empty(&second, 1) {
                Err(Error::NotAVolume(detail))
            } else {
                Err(Error::corruption("superblock", DiskOffset(0), detail))
            }
        }
    }
}

/// What slot 0 holds while a volume is being created, before its first commit: a volume
/// whose slots hold exactly this was never committed and may be created again.
const CREATING_MAGIC: &[u8; 8] = b"TUCANAC\0";

/// Writes the creation marker over both slots (not synced).
pub fn write_creation_marker(storage: &dyn Storage) -> Result<()> {
    let mut marker = vec![0u8; SLOT_BYTES];
    marker[..8].copy_from_slice(CREATING_MAGIC);
    storage.write_at(0, &marker)?;
    storage.write_at(SLOT_BYTES as u64, &[0u8; SLOT_BYTES])
}

/// Whether the slots hold the creation marker: creation began and never committed.
pub fn creation_was_interrupted(storage: &dyn Storage) -> Result<bool> {
    let slot = SLOT_BYTES;
    if storage.len_bytes()? < 2 * slot as u64 {
        return Ok(false);
    }
    let mut slots = vec![0u8; 2 * slot];
    storage.read_at(0, &mut slots)?;
    Ok(&slots[..8] == CREATING_MAGIC
        && slots[8..slot].iter().all(|b| *b == 0)
        && slots[slot..].iter().all(|b| *b == 0))
}

/// crc32c of a slot with its crc field taken as zero.
fn slot_crc(bytes: &[u8]) -> u32 {
    debug_assert_eq!(bytes.len(), SLOT_BYTES);
    crc32c::crc32c_append(crc32c::crc32c(&bytes[..CRC_AT]), &[0u8; 4])
}

fn is_all_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(bytes: &[u8; SLOT_BYTES], at: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(field)
}

fn get_u64(bytes: &[u8; SLOT_BYTES], at: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::MemStorage;

    fn sample(epoch: u64) -> Superblock {
        Superblock {
            epoch: CommitEpoch(epoch),
            descriptor: DiskOffset(8 * BLOCK_BYTES + epoch * BLOCK_BYTES),
            descriptor_bytes: 1234,
            descriptor_crc: 0xDEAD_BEEF,
            volume_bytes: 128 << 20,
        }
    }

    fn volume_with(slots: &[Superblock]) -> MemStorage {
        let storage = MemStorage::new();
        storage.grow(16 * BLOCK_BYTES).unwrap();
        for superblock in slots {
            superblock.write_to(&storage).unwrap();
        }
        storage
    }

    /// Re-seals a hand-edited slot so only the edited field is wrong.
    fn reseal(bytes: &mut [u8; SLOT_BYTES]) {
        let crc = slot_crc(&bytes[..]);
        put_u32(&mut bytes[..], CRC_AT, crc);
    }

    #[test]
    fn round_trip() {
        for superblock in [
            sample(0),
            sample(7),
            Superblock {
                epoch: CommitEpoch(u64::MAX),
                descriptor: DiskOffset::NONE,
                descriptor_bytes: 0,
                descriptor_crc: 0,
                volume_bytes: 2 * BLOCK_BYTES,
            },
        ] {
            let bytes = superblock.encode();
            let slot = slot_number(superblock.epoch);
            assert_eq!(Superblock::decode(&bytes[..], slot).unwrap(), superblock);
            assert_eq!(&bytes[..8], b"TUCANAV\0");
            assert_eq!(get_u32(&bytes, VERSION_AT), FORMAT_VERSION);
        }
    }

    #[test]
    fn slot_offset_alternates() {
        assert_eq!(slot_offset(CommitEpoch(0)), DiskOffset(0));
        assert_eq!(slot_offset(CommitEpoch(1)), DiskOffset(4096));
        assert_eq!(slot_offset(CommitEpoch(10)), DiskOffset(0));
        assert_eq!(slot_offset(CommitEpoch(u64::MAX)), DiskOffset(4096));
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let superblock = sample(5);
        let good = superblock.encode();
        let mut bytes = good.clone();
        for bit in 0..SLOT_BYTES * 8 {
            bytes[bit / 8] ^= 1 << (bit % 8);
            let result = Superblock::decode(&bytes[..], 1);
            assert!(
                matches!(result, Err(Error::Corruption { .. } | Error::NotAVolume(_))),
                "flip of bit {bit} gave {result:?}"
            );
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        assert_eq!(bytes, good);
    }

    #[test]
    fn bad_magic_is_not_a_volume_but_zeros_are_empty() {
        let mut bytes = sample(0).encode();
        bytes[..8].copy_from_slice(b"SQLite f");
        assert!(matches!(
            Superblock::decode(&bytes[..], 0),
            Err(Error::NotAVolume(_))
        ));
        let err = Superblock::decode(&[0u8; SLOT_BYTES], 1).unwrap_err();
        match &err {
            Error::Corruption { offset, detail, .. } => {
                assert_eq!(*offset, DiskOffset(4096));
                assert!(detail.contains("all zeros"), "{detail}");
            }
            other => panic!("expected corruption, got {other}"),
        }
    }

    #[test]
    fn crc_mismatch_names_the_slot_offset() {
        let mut bytes = sample(3).encode();
        bytes[100] = 1;
        match Superblock::decode(&bytes[..], 1) {
            Err(Error::Corruption { offset, detail, .. }) => {
                assert_eq!(offset, DiskOffset(4096));
                assert!(detail.contains("crc32c"), "{detail}");
            }
            other => panic!("expected corruption, got {other:?}"),
        }
    }

    #[test]
    fn newer_version_is_unsupported() {
        let mut bytes = sample(0).encode();
        put_u32(&mut bytes[..], VERSION_AT, FORMAT_VERSION + 1);
        reseal(&mut bytes);
        assert!(matches!(
            Superblock::decode(&bytes[..], 0),
            Err(Error::UnsupportedVersion {
                found: 2,
                supported: 1
            })
        ));
    }

    #[test]
    fn invalid_fields_with_a_valid_crc_are_corruption() {
        type Edit = fn(&mut [u8; SLOT_BYTES]);
        let edits: [(&str, Edit); 6] = [
            ("version 0", |b| put_u32(&mut b[..], VERSION_AT, 0)),
            ("block size", |b| put_u32(&mut b[..], BLOCK_SIZE_AT, 512)),
            ("reserved", |b| b[2000] = 1),
            ("misdirected epoch", |b| put_u64(&mut b[..], EPOCH_AT, 4)),
            ("unaligned descriptor", |b| {
                put_u64(&mut b[..], DESCRIPTOR_AT, 3 * BLOCK_BYTES + 1)
            }),
            ("descriptor past the volume", |b| {
                put_u64(&mut b[..], DESCRIPTOR_BYTES_AT, u64::MAX - 10)
            }),
        ];
        for (what, edit) in edits {
            let mut bytes = sample(3).encode();
            edit(&mut bytes);
            reseal(&mut bytes);
            let result = Superblock::decode(&bytes[..], 1);
            assert!(
                matches!(result, Err(Error::Corruption { .. })),
                "{what}: {result:?}"
            );
        }
        assert!(Superblock::decode(&[0u8; 100], 0).is_err());
    }

    #[test]
    #[should_panic(expected = "invalid superblock")]
    fn encoding_an_invalid_superblock_is_a_programmer_error() {
        let mut superblock = sample(2);
        superblock.volume_bytes = 4097;
        superblock.encode();
    }

    #[test]
    fn fresh_volumes_have_no_superblock() {
        assert_eq!(read_newest(&MemStorage::new()).unwrap(), None);
        let short = MemStorage::new();
        short.grow(100).unwrap();
        assert_eq!(read_newest(&short).unwrap(), None);
        assert_eq!(read_newest(&volume_with(&[])).unwrap(), None);
    }

    #[test]
    fn short_file_with_data_is_not_a_volume() {
        let storage = MemStorage::new();
        storage.grow(100).unwrap();
        storage.write_at(50, b"x").unwrap();
        assert!(matches!(read_newest(&storage), Err(Error::NotAVolume(_))));
    }

    #[test]
    fn newest_of_two_wins() {
        let storage = volume_with(&[sample(4), sample(5)]);
        assert_eq!(read_newest(&storage).unwrap(), Some(sample(5)));
        sample(6).write_to(&storage).unwrap();
        assert_eq!(read_newest(&storage).unwrap(), Some(sample(6)));
        // Only one slot written so far (the first commit).
        let storage = volume_with(&[sample(0)]);
        assert_eq!(read_newest(&storage).unwrap(), Some(sample(0)));
    }

    #[test]
    fn one_corrupt_slot_falls_back_to_the_other() {
        // A torn write of the newer slot: the older commit wins.
        let storage = volume_with(&[sample(8), sample(9)]);
        storage.write_at(4096 + 2000, &[0xFF; 16]).unwrap();
        assert_eq!(read_newest(&storage).unwrap(), Some(sample(8)));

        // The older slot is garbage (magic gone too): the newer one still wins.
        let storage = volume_with(&[sample(8), sample(9)]);
        storage.write_at(0, &[0x5A; SLOT_BYTES]).unwrap();
        assert_eq!(read_newest(&storage).unwrap(), Some(sample(9)));

        // Every single-bit flip of the newer slot falls back to the older one.
        let storage = volume_with(&[sample(8), sample(9)]);
        for bit in (0..SLOT_BYTES * 8).step_by(97) {
            let at = 4096 + (bit / 8) as u64;
            let mut byte = [0u8];
            storage.read_at(at, &mut byte).unwrap();
            storage.write_at(at, &[byte[0] ^ (1 << (bit % 8))]).unwrap();
            assert_eq!(read_newest(&storage).unwrap(), Some(sample(8)), "bit {bit}");
            storage.write_at(at, &byte).unwrap();
        }
    }

    #[test]
    fn both_corrupt_is_an_error_naming_each_slot() {
        let storage = volume_with(&[sample(2), sample(3)]);
        storage.write_at(100, &[1]).unwrap();
        storage.write_at(4096 + 100, &[1]).unwrap();
        match read_newest(&storage) {
            Err(Error::Corruption { detail, .. }) => {
                assert!(detail.contains("slot 0: "), "{detail}");
                assert!(detail.contains("slot 1: "), "{detail}");
                assert!(detail.contains("crc32c"), "{detail}");
            }
            other => panic!("expected corruption, got {other:?}"),
        }

        // One slot empty, the other corrupt: still corruption, not a fresh volume.
        let storage = volume_with(&[sample(0)]);
        storage.write_at(100, &[1]).unwrap();
        assert!(matches!(
            read_newest(&storage),
            Err(Error::Corruption { .. })
        ));
    }

    #[test]
    fn foreign_file_is_not_a_volume() {
        let storage = MemStorage::new();
        storage.grow(16 * BLOCK_BYTES).unwrap();
        storage.write_at(0, b"SQLite format 3\0").unwrap();
        match read_newest(&storage) {
            Err(Error::NotAVolume(detail)) => {
                assert!(detail.contains("slot 0"), "{detail}");
                assert!(detail.contains("slot 1"), "{detail}");
            }
            other => panic!("expected NotAVolume, got {other:?}"),
        }
    }

    #[test]
    fn a_newer_format_slot_is_never_skipped() {
        // Slot 1 holds a valid commit of this format, slot 0 a valid slot of a newer one:
        // opening the older commit would lose the newer build's work.
        let storage = volume_with(&[sample(3)]);
        let mut bytes = sample(4).encode();
        put_u32(&mut bytes[..], VERSION_AT, FORMAT_VERSION + 1);
        reseal(&mut bytes);
        storage.write_at(0, &bytes[..]).unwrap();
        assert!(matches!(
            read_newest(&storage),
            Err(Error::UnsupportedVersion { found: 2, .. })
        ));
    }
}
