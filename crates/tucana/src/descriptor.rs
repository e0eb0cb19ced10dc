//! The commit descriptor: everything a commit makes durable besides nodes and bitmaps.
//!
//! Written copy-on-write to a fresh extent at every commit and named by the superblock
//! slot (offset, length, crc32c). Layout (little-endian):
//!
//! ```text
//! "TDESC004" | epoch u64 | next_region_id u64 | volume_bytes u64
//! group_count u32 | bitmap slot per group u8 × group_count
//! free_count u32  | (offset u64, blocks u64) × free_count           -- the free log
//! region_count u32 | region × region_count
//!
//! region: id u64 | name_len u16 | name | tree_epoch u64 | root u64
//!         generation u32 | next_seq u64 | tail u64 | tail_size u64 | tail_used u64
//!         gc_tail u64 | gc_tail_size u64 | gc_tail_used u64     -- all 0: none
//!         keys u64 | seed u32 | term u64 | role u8 (0 local, 1 replica)
//!         [replica: upstream_epoch u64 | upstream_next_order u64]
//!         segment_count u32 | (offset u64, size u64, written u64, live u64, order u64
//!         [replica: origin u64 | received u64]) × n
//! ```
//!
//! `seed` is the crc seed of the region's records (the primary's, for a replica region),
//! `term` its replication term (0: never replicated). A replica region (DESIGN.md,
//! "Replication") mirrors commit `upstream_epoch` of its primary, whose `next_order` was
//! `upstream_next_order` at that seal, and lists for each segment its `origin` (the offset
//! of the primary's segment it copies) and the bytes of it received and synced. A replica's
//! segment counts (`written`, `live`) are the primary's at that commit; segments of a
//! higher order than `upstream_next_order` arrived after it (counts 0).
//!
//! `TDESC003` is the same without `seed`, `term` and `role` (seed `region_seed(id)`, term
//! 0, local); `TDESC002` (volumes written before the relocation tail) also lacks the three
//! `gc_tail` words. Both still decode.

use crate::error::{Error, Result};
use crate::log::{GcTailPos, SegmentStats};
use crate::types::{CommitEpoch, DiskOffset, RegionId, SeqNo, TreeEpoch};

const MAGIC: &[u8; 8] = b"TDESC004";
/// The format before replication (no seed, term or role).
const MAGIC_003: &[u8; 8] = b"TDESC003";
/// The format before the relocation tail.
const MAGIC_002: &[u8; 8] = b"TDESC002";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub epoch: CommitEpoch,
    pub next_region_id: u64,
    pub volume_bytes: u64,
    pub bitmap_slots: Vec<u8>,
    /// Extents allocated in this commit's bitmap but referenced by nothing in it; recovery
    /// frees them (paper §3.3: frees wait until the commit that made them safe is durable).
    pub free_log: Vec<(DiskOffset, u64)>,
    pub regions: Vec<RegionDesc>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionDesc {
    pub id: RegionId,
    pub name: String,
    pub tree_epoch: TreeEpoch,
    pub root: DiskOffset,
    pub generation: u32,
    pub next_seq: SeqNo,
    pub tail: DiskOffset,
    pub tail_size_bytes: u64,
    pub tail_used_bytes: u64,
    /// The relocation tail (garbage collection's copies); `None` before the first.
    pub gc_tail: Option<GcTailPos>,
    pub keys: u64,
    pub segments: Vec<(DiskOffset, SegmentStats)>,
    /// crc seed of the region's records.
    pub seed: u32,
    /// Replication term (0: never replicated).
    pub term: u64,
    /// Set for a replica region (a backup's copy of a primary's region).
    pub replica: Option<ReplicaDesc>,
    /// For a replica region, what it received of each segment, in the order of
    /// `segments`; empty for a local region.
    pub received: Vec<ReceivedSegment>,
}

/// A replica region's copy of one of its primary's segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceivedSegment {
    /// Where the primary's segment starts in the primary's volume.
    pub origin: DiskOffset,
    /// Bytes of it received (from its start) and made durable by this commit.
    pub received_bytes: u64,
}

/// What a replica region records beside a region's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaDesc {
    /// The primary's commit epoch the region's tree and positions mirror.
    pub upstream_epoch: u64,
    /// The primary's `next_order` at that commit's seal: segments of a higher order
    /// arrived after it.
    pub upstream_next_order: u64,
}

impl Descriptor {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(MAGIC);
        put64(&mut out, self.epoch.0);
        put64(&mut out, self.next_region_id);
        put64(&mut out, self.volume_bytes);
        put32(&mut out, self.bitmap_slots.len() as u32);
        out.extend_from_slice(&self.bitmap_slots);
        put32(&mut out, self.free_log.len() as u32);
        for (off, blocks) in &self.free_log {
            put64(&mut out, off.0);
            put64(&mut out, *blocks);
        }
        put32(&mut out, self.regions.len() as u32);
        for r in &self.regions {
            r.encode_into(&mut out);
        }
        out
    }

    /// Decodes a descriptor read at `at`; any inconsistency is `Error::Corruption`.
    pub fn decode(bytes: &[u8], at: DiskOffset) -> Result<Descriptor> {
        let mut r = Reader { bytes, pos: 0, at };
        let (has_gc_tail, has_replication) = match r.take(8)? {
            m if m == MAGIC => (true, true),
            m if m == MAGIC_003 => (true, false),
            m if m == MAGIC_002 => (false, false),
            _ => return Err(r.bad("bad magic")),
        };
        let epoch = CommitEpoch(r.u64()?);
        let next_region_id = r.u64()?;
        let volume_bytes = r.u64()?;
        let groups = r.u32()? as usize;
        let bitmap_slots = r.take(groups)?.to_vec();
        if bitmap_slots.iter().any(|s| *s > 1) {
            return Err(r.bad("bitmap slot is neither 0 nor 1"));
        }
        let free_count = r.count(16)?;
        let mut free_log = Vec::with_capacity(free_count);
        for _ in 0..free_count {
            free_log.push((DiskOffset(r.u64()?), r.u64()?));
        }
        let region_count = r.count(8)?;
        let mut regions = Vec::with_capacity(region_count);
        for _ in 0..region_count {
            regions.push(decode_region(&mut r, has_gc_tail, has_replication)?);
        }
        // A commit pads its descriptor with zeros to the blocks it allocated for it, and
        // the superblock counts the padding (so the extent freed later is the whole one).
        if bytes[r.pos..].iter().any(|b| *b != 0) {
            return Err(r.bad("trailing bytes"));
        }
        Ok(Descriptor {
            epoch,
            next_region_id,
            volume_bytes,
            bitmap_slots,
            free_log,
            regions,
        })
    }
}

impl RegionDesc {
    /// Appends the entry's bytes (the layout in the module doc) to `out`: how a commit
    /// writes it, and how a primary ships it to a backup.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let r = self;
        put64(out, r.id.0);
        assert!(r.name.len() <= u16::MAX as usize);
        out.extend_from_slice(&(r.name.len() as u16).to_le_bytes());
        out.extend_from_slice(r.name.as_bytes());
        put64(out, r.tree_epoch.0);
        put64(out, r.root.0);
        put32(out, r.generation);
        put64(out, r.next_seq.0);
        put64(out, r.tail.0);
        put64(out, r.tail_size_bytes);
        put64(out, r.tail_used_bytes);
        let gc = r.gc_tail.unwrap_or(GcTailPos {
            base: DiskOffset(0),
            size_bytes: 0,
            used_bytes: 0,
        });
        assert!(r.gc_tail.is_none() || !gc.base.is_none());
        put64(out, gc.base.0);
        put64(out, gc.size_bytes);
        put64(out, gc.used_bytes);
        put64(out, r.keys);
        put32(out, r.seed);
        put64(out, r.term);
        match r.replica {
            None => out.push(0),
            Some(rep) => {
                out.push(1);
                put64(out, rep.upstream_epoch);
                put64(out, rep.upstream_next_order);
            }
        }
        assert_eq!(
            r.received.len(),
            if r.replica.is_some() {
                r.segments.len()
            } else {
                0
            },
            "a replica region lists one origin per segment, a local one none"
        );
        put32(out, r.segments.len() as u32);
        for (i, (off, s)) in r.segments.iter().enumerate() {
            put64(out, off.0);
            put64(out, s.size_bytes);
            put64(out, s.written_bytes);
            put64(out, s.live_bytes);
            put64(out, s.order);
            if let Some(got) = r.received.get(i) {
                put64(out, got.origin.0);
                put64(out, got.received_bytes);
            }
        }
    }

    /// Decodes one entry (`TDESC004` layout) that fills `bytes` exactly; any
    /// inconsistency is `Error::Corruption` at `at`.
    pub fn decode(bytes: &[u8], at: DiskOffset) -> Result<RegionDesc> {
        let mut r = Reader { bytes, pos: 0, at };
        let rd = decode_region(&mut r, true, true)?;
        if r.pos != bytes.len() {
            return Err(r.bad("trailing bytes after a region entry"));
        }
        Ok(rd)
    }
}

/// Decodes one region entry of a descriptor of the format the flags say.
fn decode_region(
    r: &mut Reader<'_>,
    has_gc_tail: bool,
    has_replication: bool,
) -> Result<RegionDesc> {
    let id = RegionId(r.u64()?);
    let name_len = u16::from_le_bytes(r.take(2)?.try_into().unwrap()) as usize;
    let name = std::str::from_utf8(r.take(name_len)?)
        .map_err(|_| r.bad("region name is not UTF-8"))?
        .to_string();
    let tree_epoch = TreeEpoch(r.u64()?);
    let root = DiskOffset(r.u64()?);
    // Trees hold node offsets as tagged words that must be whole blocks.
    if !root.is_none() && !root.block_aligned() {
        return Err(r.bad("index root is not a block"));
    }
    let generation = r.u32()?;
    let next_seq = SeqNo(r.u64()?);
    let tail = DiskOffset(r.u64()?);
    let tail_size_bytes = r.u64()?;
    let tail_used_bytes = r.u64()?;
    let gc_tail = if has_gc_tail {
        let pos = GcTailPos {
            base: DiskOffset(r.u64()?),
            size_bytes: r.u64()?,
            used_bytes: r.u64()?,
        };
        if pos.base.is_none() {
            if pos.size_bytes != 0 || pos.used_bytes != 0 {
                return Err(r.bad("relocation tail position without a segment"));
            }
            None
        } else {
            if pos.used_bytes > pos.size_bytes {
                return Err(r.bad("relocation tail position past its segment"));
            }
            Some(pos)
        }
    } else {
        None
    };
    let keys = r.u64()?;
    let (seed, term, replica) = if has_replication {
        let seed = r.u32()?;
        let term = r.u64()?;
        let replica = match r.take(1)?[0] {
            0 => None,
            1 => Some(ReplicaDesc {
                upstream_epoch: r.u64()?,
                upstream_next_order: r.u64()?,
            }),
            _ => return Err(r.bad("region role is neither local nor replica")),
        };
        (seed, term, replica)
    } else {
        (crate::log::record::region_seed(id), 0, None)
    };
    let seg_count = r.count(if replica.is_some() { 56 } else { 40 })?;
    let mut segments = Vec::with_capacity(seg_count);
    let mut received = Vec::new();
    for _ in 0..seg_count {
        let off = DiskOffset(r.u64()?);
        let s = SegmentStats {
            size_bytes: r.u64()?,
            written_bytes: r.u64()?,
            live_bytes: r.u64()?,
            order: r.u64()?,
        };
        if s.live_bytes > s.written_bytes || s.written_bytes > s.size_bytes {
            return Err(r.bad("segment byte counts are inconsistent"));
        }
        if replica.is_some() {
            let got = ReceivedSegment {
                origin: DiskOffset(r.u64()?),
                received_bytes: r.u64()?,
            };
            if got.received_bytes > s.size_bytes {
                return Err(r.bad("received bytes past the segment's size"));
            }
            received.push(got);
        }
        segments.push((off, s));
    }
    if tail_used_bytes > tail_size_bytes {
        return Err(r.bad("tail position past the tail segment"));
    }
    Ok(RegionDesc {
        id,
        name,
        tree_epoch,
        root,
        generation,
        next_seq,
        tail,
        tail_size_bytes,
        tail_used_bytes,
        gc_tail,
        keys,
        segments,
        seed,
        term,
        replica,
        received,
    })
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A bounds-checked cursor: every read of a short buffer is an error, never a panic.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    at: DiskOffset,
}

impl<'a> Reader<'a> {
    fn bad(&self, detail: &str) -> Error {
        Error::corruption(
            "commit descriptor",
            self.at,
            format!("{detail} (byte {})", self.pos),
        )
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() - self.pos < n {
            return Err(self.bad("truncated"));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    /// A count of items of at least `item_bytes` each that must fit in what is left.
    fn count(&mut self, item_bytes: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item_bytes) > self.bytes.len() - self.pos {
            return Err(self.bad("count larger than the descriptor"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Descriptor {
        Descriptor {
            epoch: CommitEpoch(7),
            next_region_id: 3,
            volume_bytes: 128 << 20,
            bitmap_slots: vec![0, 1, 1],
            free_log: vec![(DiskOffset(8192 * 4), 2)],
            regions: vec![RegionDesc {
                id: RegionId(2),
                name: "users".into(),
                tree_epoch: TreeEpoch(9),
                root: DiskOffset(40960),
                generation: 4,
                next_seq: SeqNo(1000),
                tail: DiskOffset(2 << 20),
                tail_size_bytes: 2 << 20,
                tail_used_bytes: 777,
                gc_tail: Some(GcTailPos {
                    base: DiskOffset(4 << 20),
                    size_bytes: 2 << 20,
                    used_bytes: 4096,
                }),
                keys: 12,
                segments: vec![(
                    DiskOffset(2 << 20),
                    SegmentStats {
                        size_bytes: 2 << 20,
                        written_bytes: 777,
                        live_bytes: 500,
                        order: 3,
                    },
                )],
                seed: 0x5eed,
                term: 2,
                replica: None,
                received: Vec::new(),
            }],
        }
    }

    #[test]
    fn round_trip() {
        let d = sample();
        assert_eq!(Descriptor::decode(&d.encode(), DiskOffset(0)).unwrap(), d);
        let mut replica = sample();
        replica.regions[0].replica = Some(ReplicaDesc {
            upstream_epoch: 41,
            upstream_next_order: 4,
        });
        replica.regions[0].received = vec![ReceivedSegment {
            origin: DiskOffset(6 << 20),
            received_bytes: 900,
        }];
        assert_eq!(
            Descriptor::decode(&replica.encode(), DiskOffset(0)).unwrap(),
            replica
        );
    }

    /// A volume written before replication (`TDESC003`) opens: its regions are local,
    /// never replicated, and their records' seed is the one derived from their id.
    #[test]
    fn a_descriptor_from_before_replication_decodes_as_local_regions() {
        let mut d = sample();
        d.regions[0].seed = crate::log::record::region_seed(d.regions[0].id);
        d.regions[0].term = 0;
        let v4 = d.encode();
        // Take out seed (4), term (8) and role (1): they sit just before the segment count.
        let segments_bytes = 4 + d.regions[0].segments.len() * 40;
        let cut = v4.len() - segments_bytes - 13;
        let mut v3 = [&v4[..cut], &v4[cut + 13..]].concat();
        v3[..8].copy_from_slice(MAGIC_003);
        assert_eq!(Descriptor::decode(&v3, DiskOffset(0)).unwrap(), d);
    }

    /// A commit pads its descriptor to whole blocks and the superblock counts the
    /// padding: zeros after the last region decode; anything else there is corruption.
    #[test]
    fn zero_padding_decodes_and_other_trailing_bytes_do_not() {
        let d = sample();
        let mut bytes = d.encode();
        bytes.resize(bytes.len() + 5000, 0);
        assert_eq!(Descriptor::decode(&bytes, DiskOffset(0)).unwrap(), d);
        let last = bytes.len() - 1;
        bytes[last] = 1;
        assert!(matches!(
            Descriptor::decode(&bytes, DiskOffset(0)),
            Err(Error::Corruption { .. })
        ));
    }

    #[test]
    fn a_region_without_a_relocation_tail_round_trips() {
        let mut d = sample();
        d.regions[0].gc_tail = None;
        assert_eq!(Descriptor::decode(&d.encode(), DiskOffset(0)).unwrap(), d);
    }

    /// Volumes written before the relocation tail carry `TDESC002` descriptors: the same
    /// bytes without the three `gc_tail` words. They still open.
    #[test]
    fn decodes_the_format_before_the_relocation_tail() {
        let mut d = sample();
        d.regions[0].gc_tail = None;
        d.regions[0].seed = crate::log::record::region_seed(d.regions[0].id);
        d.regions[0].term = 0;
        let mut bytes = d.encode();
        // Without seed, term and role (`TDESC003` and older), just before the segments.
        let role_end = bytes.len() - 4 - d.regions[0].segments.len() * 40;
        bytes.drain(role_end - 13..role_end);
        let region = &d.regions[0];
        let gc_words_at = 8
            + 3 * 8
            + 4
            + d.bitmap_slots.len()
            + 4
            + 16 * d.free_log.len()
            + 4
            + 8
            + 2
            + region.name.len()
            + 8
            + 8
            + 4
            + 8
            + 3 * 8;
        assert!(bytes[gc_words_at..gc_words_at + 24].iter().all(|b| *b == 0));
        bytes.drain(gc_words_at..gc_words_at + 24);
        bytes[..8].copy_from_slice(MAGIC_002);
        assert_eq!(Descriptor::decode(&bytes, DiskOffset(0)).unwrap(), d);
        // The same bytes under the next magic are short by the three words.
        bytes[..8].copy_from_slice(MAGIC_003);
        assert!(Descriptor::decode(&bytes, DiskOffset(0)).is_err());
    }

    #[test]
    fn a_relocation_tail_position_past_its_segment_is_corruption() {
        let mut d = sample();
        if let Some(gc) = &mut d.regions[0].gc_tail {
            gc.used_bytes = gc.size_bytes + 1;
        }
        assert!(Descriptor::decode(&d.encode(), DiskOffset(0)).is_err());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = sample().encode();
        for len in 0..bytes.len() {
            assert!(Descriptor::decode(&bytes[..len], DiskOffset(0)).is_err());
        }
    }

    #[test]
    fn garbage_never_panics() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            for v in [0u8, 0xff, 0x80] {
                let mut b = bytes.clone();
                b[i] = v;
                let _ = Descriptor::decode(&b, DiskOffset(0));
            }
        }
    }
}
