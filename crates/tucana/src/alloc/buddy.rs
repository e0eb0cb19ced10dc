//! The on-disk format of a bitmap buddy and where buddies live.
//!
//! Owns: encoding and verified decoding of one 8 KiB buddy, the byte offset of each
//! group's two buddies. Does not own: which buddy is current (the commit descriptor's
//! `slots`), nor the in-memory allocator.
//!
//! Thread-safety: pure functions.
//!
//! ```text
//! buddy (8192 bytes, 2 blocks; A at group block 2, B at group block 4):
//!   0 .. 4096     bitmap: bit i = block i of the group, LSB-first in little-endian u64 words
//!   4096 .. 4104  magic  u64 LE  "TCNBUDDY"
//!   4104 .. 4112  group  u64 LE  (catches a buddy written to or read from the wrong place)
//!   4112 .. 4120  epoch  u64 LE  commit epoch that wrote this image
//!   4120 .. 4124  crc    u32 LE  crc32c of all 8192 bytes with these 4 bytes zeroed
//!   4124 .. 8192  zero
//! ```

use super::bitmap::{self, BitmapWords, BITMAP_WORDS};
use super::{GROUP_BLOCKS, GROUP_BYTES};
use crate::error::{Error, Result};
use crate::types::{CommitEpoch, DiskOffset, BLOCK_BYTES};

/// Bytes of one buddy.
pub const BUDDY_BYTES: usize = 8192;

/// First bytes of a buddy's header: "TCNBUDDY".
pub const BUDDY_MAGIC: u64 = u64::from_le_bytes(*b"TCNBUDDY");

/// Group-relative block of buddy A (slot 0); buddy B (slot 1) follows it.
pub const BUDDY_A_BLOCK: u64 = 2;

const BITMAP_BYTES: usize = BITMAP_WORDS * 8;
const MAGIC_AT: usize = BITMAP_BYTES;
const GROUP_AT: usize = MAGIC_AT + 8;
const EPOCH_AT: usize = GROUP_AT + 8;
const CRC_AT: usize = EPOCH_AT + 8;
const CRC_END: usize = CRC_AT + 4;

/// What a verified buddy says.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Buddy {
    pub group: u64,
    pub epoch: CommitEpoch,
    pub bitmap: Box<BitmapWords>,
}

/// Byte offset of `group`'s buddy in `slot` (0 = A, 1 = B).
pub fn buddy_offset(group: u64, slot: u8) -> DiskOffset {
    assert!(slot <= 1, "buddy slot {slot} is neither A (0) nor B (1)");
    let block =
        group * GROUP_BLOCKS + BUDDY_A_BLOCK + u64::from(slot) * (BUDDY_BYTES as u64 / BLOCK_BYTES);
    DiskOffset(block * BLOCK_BYTES)
}

/// Byte offset where `group` starts.
pub fn group_offset(group: u64) -> DiskOffset {
    DiskOffset(group * GROUP_BYTES)
}

fn crc_of(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&bytes[..CRC_AT]);
    let crc = crc32c::crc32c_append(crc, &[0u8; CRC_END - CRC_AT]);
    crc32c::crc32c_append(crc, &bytes[CRC_END..])
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Encodes `group`'s bitmap as written by commit `epoch`.
pub fn encode_buddy(
    group: u64,
    epoch: CommitEpoch,
    bitmap: &BitmapWords,
) -> Box<[u8; BUDDY_BYTES]> {
    let bytes: Box<[u8]> = vec![0u8; BUDDY_BYTES].into_boxed_slice();
    let mut bytes: Box<[u8; BUDDY_BYTES]> = match bytes.try_into() {
        Ok(bytes) => bytes,
        Err(_) => unreachable!("the vector has exactly BUDDY_BYTES bytes"),
    };
    for (chunk, word) in bytes[..BITMAP_BYTES].chunks_exact_mut(8).zip(bitmap.iter()) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    bytes[MAGIC_AT..GROUP_AT].copy_from_slice(&BUDDY_MAGIC.to_le_bytes());
    bytes[GROUP_AT..EPOCH_AT].copy_from_slice(&group.to_le_bytes());
    bytes[EPOCH_AT..CRC_AT].copy_from_slice(&epoch.0.to_le_bytes());
    let crc = crc_of(&bytes[..]);
    bytes[CRC_AT..CRC_END].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// Verifies and decodes the buddy `bytes` read at `offset`, expected to belong to `group`.
///
/// Errors (`Error::Corruption` naming `offset`): wrong length, bad magic (e.g. a block
/// never written), crc mismatch (torn write, bit rot), or another group's buddy
/// (misdirected write). Whether the bitmap's contents make sense for the volume
/// (reserved blocks set, the epoch not from the future) is for the caller to check.
pub fn decode_buddy(bytes: &[u8], group: u64, offset: DiskOffset) -> Result<Buddy> {
    const WHAT: &str = "allocator bitmap buddy";
    if bytes.len() != BUDDY_BYTES {
        return Err(Error::corruption(
            WHAT,
            offset,
            format!(
                "group {group}: {} bytes instead of {BUDDY_BYTES}",
                bytes.len()
            ),
        ));
    }
    let magic = u64_at(bytes, MAGIC_AT);
    if magic != BUDDY_MAGIC {
        return Err(Error::corruption(
            WHAT,
            offset,
            format!("group {group}: bad magic {magic:#018x}"),
        ));
    }
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&bytes[CRC_AT..CRC_END]);
    let stored = u32::from_le_bytes(stored);
    let computed = crc_of(bytes);
    if stored != computed {
        return Err(Error::corruption(
            WHAT,
            offset,
            format!("group {group}: crc32c {stored:#010x} stored, {computed:#010x} computed"),
        ));
    }
    let found_group = u64_at(bytes, GROUP_AT);
    if found_group != group {
        return Err(Error::corruption(
            WHAT,
            offset,
            format!("expected the buddy of group {group}, found group {found_group}'s"),
        ));
    }
    let mut words = bitmap::zeroed();
    for (word, chunk) in words.iter_mut().zip(bytes[..BITMAP_BYTES].chunks_exact(8)) {
        let mut le = [0u8; 8];
        le.copy_from_slice(chunk);
        *word = u64::from_le_bytes(le);
    }
    Ok(Buddy {
        group,
        epoch: CommitEpoch(u64_at(bytes, EPOCH_AT)),
        bitmap: words,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Box<BitmapWords> {
        let mut words = bitmap::zeroed();
        bitmap::set_range(&mut words, 0, 8);
        bitmap::set_range(&mut words, 100, 612);
        bitmap::set_range(&mut words, GROUP_BLOCKS - 3, GROUP_BLOCKS);
        words
    }

    #[test]
    fn offsets_follow_the_layout() {
        assert_eq!(buddy_offset(0, 0), DiskOffset(2 * 4096));
        assert_eq!(buddy_offset(0, 1), DiskOffset(4 * 4096));
        assert_eq!(buddy_offset(3, 1), DiskOffset(3 * GROUP_BYTES + 4 * 4096));
    }

    #[test]
    fn round_trip() {
        let words = sample();
        let bytes = encode_buddy(7, CommitEpoch(42), &words);
        assert_eq!(&bytes[..8], &words[0].to_le_bytes());
        assert!(bytes[CRC_END..].iter().all(|&b| b == 0));
        let buddy = decode_buddy(&bytes[..], 7, buddy_offset(7, 0)).expect("valid buddy");
        assert_eq!(buddy.group, 7);
        assert_eq!(buddy.epoch, CommitEpoch(42));
        assert_eq!(buddy.bitmap, words);
    }

    fn assert_corrupt(result: Result<Buddy>, offset: DiskOffset) {
        match result {
            Err(Error::Corruption { offset: at, .. }) => assert_eq!(at, offset),
            other => panic!("expected a corruption error, got {other:?}"),
        }
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let offset = buddy_offset(1, 1);
        let mut bytes = encode_buddy(1, CommitEpoch(9), &sample());
        for bit in 0..BUDDY_BYTES * 8 {
            bytes[bit / 8] ^= 1 << (bit % 8);
            assert_corrupt(decode_buddy(&bytes[..], 1, offset), offset);
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        decode_buddy(&bytes[..], 1, offset).expect("restored buddy decodes");
    }

    #[test]
    fn zeroed_short_and_misdirected_buddies_are_rejected() {
        let offset = buddy_offset(2, 0);
        assert_corrupt(decode_buddy(&[0u8; BUDDY_BYTES], 2, offset), offset);
        let bytes = encode_buddy(5, CommitEpoch(1), &sample());
        assert_corrupt(decode_buddy(&bytes[..4096], 2, offset), offset);
        assert_corrupt(decode_buddy(&bytes[..], 2, offset), offset);
    }
}
