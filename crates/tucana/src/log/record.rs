//! The log record codec.
//!
//! ```text
//! byte 0        4          8            12      13            16         24
//!      +--------+----------+------------+-------+-------------+----------+-----+-------+
//!      | crc32c | key_len  | value_len  | flags | generation  |   seq    | key | value |
//!      |  u32   |   u32    |    u32     |  u8   |    u24      |   u64    |     |       |
//!      +--------+----------+------------+-------+-------------+----------+-----+-------+
//! ```
//!
//! All integers little-endian. The crc32c covers bytes 4.. to the end of the value and is
//! seeded with the region id, so a record of another region (a reused segment) never
//! verifies. `generation` is the region's log generation (bumped at every open) and `seq`
//! the record's sequence number: replay accepts a record only if both are the expected
//! ones, which tells the end of the log from stale bytes of an earlier life.
//!
//! A LINK record (empty key; value = next segment offset u64 + its size in bytes u64) ends
//! a segment and names the next one. Records never span segments.
//!
//! A RELOCATED record is a copy garbage collection made of a live put record into the
//! region's relocation log (segments apart from the foreground's chain, without LINKs);
//! its `seq` is 0 and replay never reads it.

use crate::error::{Error, Result};
use crate::types::{DiskOffset, RegionId, SeqNo};

pub const HEADER_BYTES: usize = 24;

/// The record is a deletion marker (empty value).
pub const FLAG_TOMBSTONE: u8 = 1;
/// The record belongs to a batch and more records of the batch follow.
pub const FLAG_BATCH_MORE: u8 = 2;
/// The record links to the next log segment.
pub const FLAG_LINK: u8 = 4;
/// A copy garbage collection made of a live record, in the region's relocation log
/// (sequence number 0): never replayed, so replay refuses it outright.
pub const FLAG_RELOCATED: u8 = 8;
const KNOWN_FLAGS: u8 = FLAG_TOMBSTONE | FLAG_BATCH_MORE | FLAG_LINK | FLAG_RELOCATED;

/// Bytes a LINK record takes; every segment keeps this much free at its end.
pub const LINK_RECORD_BYTES: usize = HEADER_BYTES + 16;

/// Largest log generation (24 bits); generations wrap, which is safe because `seq` must
/// match too.
pub const GENERATION_MASK: u32 = 0x00ff_ffff;

/// Decoded header of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub crc: u32,
    pub key_len: u32,
    pub value_len: u32,
    pub flags: u8,
    pub generation: u32,
    pub seq: SeqNo,
}

impl Header {
    pub fn total_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + self.key_len as u64 + self.value_len as u64
    }

    pub fn is_tombstone(&self) -> bool {
        self.flags & FLAG_TOMBSTONE != 0
    }

    pub fn is_link(&self) -> bool {
        self.flags & FLAG_LINK != 0
    }

    pub fn is_relocated(&self) -> bool {
        self.flags & FLAG_RELOCATED != 0
    }

    pub fn batch_more(&self) -> bool {
        self.flags & FLAG_BATCH_MORE != 0
    }

    /// Decodes a header; checks only what can be checked without the body.
    pub fn decode(bytes: &[u8], at: DiskOffset) -> Result<Header> {
        if bytes.len() < HEADER_BYTES {
            return Err(Error::corruption("log record", at, "truncated header"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let gen_flags = u32_at(12);
        let header = Header {
            crc: u32_at(0),
            key_len: u32_at(4),
            value_len: u32_at(8),
            flags: (gen_flags & 0xff) as u8,
            generation: gen_flags >> 8,
            seq: SeqNo(u64::from_le_bytes(bytes[16..24].try_into().unwrap())),
        };
        if header.flags & !KNOWN_FLAGS != 0 {
            return Err(Error::corruption("log record", at, "unknown flags"));
        }
        if header.key_len as usize > crate::types::MAX_KEY_BYTES
            || header.value_len as usize > crate::types::MAX_VALUE_BYTES
        {
            return Err(Error::corruption("log record", at, "length beyond limits"));
        }
        Ok(header)
    }
}

/// Crc seed of the records of a region of a volume written before seeds were recorded
/// in the descriptor (`TDESC004`): the region id's alone.
pub fn region_seed(region: RegionId) -> u32 {
    crc32c::crc32c(&region.0.to_le_bytes())
}

/// Crc seed of a region created now: its id's seed mixed with 32 bits that differ from
/// one creation to the next (std's per-process random hash keys), so that regions of the
/// same id in two volumes never share a seed and a reformatted device's old records never
/// verify in the new volume (DESIGN.md, "Raw block devices"). The descriptor records
/// it, so nothing recomputes it.
pub fn fresh_region_seed(region: RegionId) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write(&region.0.to_le_bytes());
    region_seed(region) ^ hasher.finish() as u32
}

/// Writes a record into `out` (exactly `HEADER_BYTES + key.len() + value.len()` bytes).
pub fn encode_into(
    out: &mut [u8],
    seed: u32,
    flags: u8,
    generation: u32,
    seq: SeqNo,
    key: &[u8],
    value: &[u8],
) {
    let total = HEADER_BYTES + key.len() + value.len();
    assert_eq!(out.len(), total, "record buffer of the wrong size");
    assert!(flags & !KNOWN_FLAGS == 0);
    out[4..8].copy_from_slice(&(key.len() as u32).to_le_bytes());
    out[8..12].copy_from_slice(&(value.len() as u32).to_le_bytes());
    let gen_flags = ((generation & GENERATION_MASK) << 8) | flags as u32;
    out[12..16].copy_from_slice(&gen_flags.to_le_bytes());
    out[16..24].copy_from_slice(&seq.0.to_le_bytes());
    out[HEADER_BYTES..HEADER_BYTES + key.len()].copy_from_slice(key);
    out[HEADER_BYTES + key.len()..].copy_from_slice(value);
    let crc = crc32c::crc32c_append(seed, &out[4..]);
    out[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// A whole record in memory.
#[derive(Clone, Copy, Debug)]
pub struct RecordRef<'a> {
    pub header: Header,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

impl<'a> RecordRef<'a> {
    /// Splits `bytes` (exactly one record) into its parts, verifying the crc if asked.
    pub fn parse(
        bytes: &'a [u8],
        seed: u32,
        verify: bool,
        at: DiskOffset,
    ) -> Result<RecordRef<'a>> {
        let header = Header::decode(bytes, at)?;
        if bytes.len() as u64 != header.total_bytes() {
            return Err(Error::corruption("log record", at, "length does not match"));
        }
        if verify && crc32c::crc32c_append(seed, &bytes[4..]) != header.crc {
            return Err(Error::corruption("log record", at, "checksum mismatch"));
        }
        let key_end = HEADER_BYTES + header.key_len as usize;
        Ok(RecordRef {
            header,
            key: &bytes[HEADER_BYTES..key_end],
            value: &bytes[key_end..],
        })
    }

    /// The (offset, bytes) a LINK record points at.
    pub fn link_target(&self, at: DiskOffset) -> Result<(DiskOffset, u64)> {
        if !self.header.is_link() || self.value.len() != 16 || !self.key.is_empty() {
            return Err(Error::corruption("log record", at, "malformed link"));
        }
        let next = u64::from_le_bytes(self.value[0..8].try_into().unwrap());
        let size = u64::from_le_bytes(self.value[8..16].try_into().unwrap());
        Ok((DiskOffset(next), size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(seed: u32, flags: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut buf = vec![0; HEADER_BYTES + key.len() + value.len()];
        encode_into(&mut buf, seed, flags, 7, SeqNo(42), key, value);
        buf
    }

    #[test]
    fn round_trip() {
        let seed = region_seed(RegionId(3));
        let buf = encode(seed, FLAG_BATCH_MORE, b"key", b"value");
        let rec = RecordRef::parse(&buf, seed, true, DiskOffset(4096)).unwrap();
        assert_eq!(rec.key, b"key");
        assert_eq!(rec.value, b"value");
        assert_eq!(rec.header.seq, SeqNo(42));
        assert_eq!(rec.header.generation, 7);
        assert!(rec.header.batch_more());
        assert!(!rec.header.is_tombstone());
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let seed = region_seed(RegionId(9));
        let buf = encode(seed, 0, b"some key", b"some value bytes");
        for bit in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                RecordRef::parse(&bad, seed, true, DiskOffset(0)).is_err(),
                "flip of bit {bit} not detected"
            );
        }
    }

    #[test]
    fn another_regions_record_does_not_verify() {
        let buf = encode(region_seed(RegionId(1)), 0, b"k", b"v");
        assert!(RecordRef::parse(&buf, region_seed(RegionId(2)), true, DiskOffset(0)).is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let seed = region_seed(RegionId(1));
        for len in 0..64 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let _ = Header::decode(&bytes, DiskOffset(0));
            let _ = RecordRef::parse(&bytes, seed, true, DiskOffset(0));
        }
    }
}
