//! Disk images of nodes: checking one read from the volume, reading it through the node
//! views, listing what it holds for whole-volume walks, and converting between image and
//! heap node.
//!
//! Owns: the checksum and magic word, every check an image passes before its bytes are
//! trusted (`DiskNode::open` eagerly for the header, `verify_structure` for the whole
//! node, lazily for fields a search touches), `encode_image` (heap node to image) and
//! `heap_from_image` (image to heap node). Does not own: reading or writing blocks (the
//! caller, through `Ctx` or the commit), the layout's offsets (`node`).
//!
//! Thread safety: an image is an immutable `&[u8]`; bad bytes are an `Err`, never a panic.
//! `encode_image` reads an immutable heap node (a sealed one); its `unsafe` turns the node's
//! word into a reference, which the caller vouches is live.

use std::ptr::NonNull;
use std::sync::atomic::Ordering::*;

use super::heap::{alloc_internal, alloc_leaf, as_internal, as_leaf};
use super::view::{inline_pivot, no_restart, InternalRead, LeafRead, SResult, SearchErr};
use super::{
    is_disk_word, leaf_stem_word_at, Header, Meta, PivotDesc, C_INT, C_LEAF, INT_AREA_AT,
    INT_CHILD_AT, INT_HEADER_STEM_BYTES, INT_PIVOT_DESC_AT, INT_PIVOT_PREFIX_AT, INT_STEM_AT,
    KEY_AREA_BYTES, KIND_INTERNAL, KIND_LEAF, LEAF_HASH_AT, LEAF_PREFIX_AT, LEAF_PTR_AT,
    LEAF_STEM_WORDS, LEAF_TAIL_STEM_BYTES, MAX_INLINE_PIVOT, MAX_INT_STEM_BYTES, MAX_STEM_BYTES,
    NODE_BYTES, NODE_MAGIC, PIVOT_EXTERNAL, W_DISK, W_EPOCH, W_META, W_REGION, W_STEM,
};
use crate::error::{Error, Result};
use crate::types::{DiskOffset, RegionId};

fn rd64(img: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&img[at..at + 8]);
    u64::from_le_bytes(b)
}

fn rd32(img: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&img[at..at + 4]);
    u32::from_le_bytes(b)
}

fn wr64(img: &mut [u8], at: usize, v: u64) {
    img[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn wr32(img: &mut [u8], at: usize, v: u32) {
    img[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// crc32c of a 4096-byte image with word 0 taken as zero.
fn image_crc(img: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&[0u8; 8]), &img[8..])
}

/// A checked disk image of a node. `open` verifies the header and checksum; field bounds
/// are checked lazily as the search touches them.
pub(crate) struct DiskNode<'a> {
    img: &'a [u8],
    off: DiskOffset,
    meta: Meta,
}

impl<'a> DiskNode<'a> {
    /// Checks length, magic, checksum, own offset (misdirected writes), region, kind and
    /// level (`expect_level`: the parent's level minus one), and counts.
    pub fn open(
        img: &'a [u8],
        off: DiskOffset,
        region: RegionId,
        expect_level: Option<u8>,
    ) -> Result<DiskNode<'a>> {
        let bad = |detail: String| Error::corruption("index node", off, detail);
        if img.len() != NODE_BYTES {
            return Err(bad(format!(
                "image is {} bytes, expected {NODE_BYTES}",
                img.len()
            )));
        }
        let w0 = rd64(img, 0);
        if (w0 >> 32) as u32 != NODE_MAGIC {
            return Err(bad(format!("bad magic {:#010x}", w0 >> 32)));
        }
        let crc = image_crc(img);
        if crc != w0 as u32 {
            return Err(bad(format!(
                "checksum mismatch: stored {:#010x}, computed {crc:#010x}",
                w0 as u32
            )));
        }
        let own = rd64(img, W_DISK * 8);
        if own != off.0 {
            return Err(bad(format!(
                "node says it lives at {own:#x} (misdirected write)"
            )));
        }
        let reg = rd64(img, W_REGION * 8);
        if reg != region.0 {
            return Err(bad(format!(
                "node belongs to region {reg}, expected {}",
                region.0
            )));
        }
        let meta = Meta::unpack(rd64(img, W_META * 8));
        match meta.kind {
            KIND_LEAF => {
                if meta.level != 0
                    || meta.count as usize > C_LEAF
                    || meta.area_used != 0
                    || meta.stem_len as usize > MAX_STEM_BYTES
                {
                    return Err(bad(format!("bad leaf header {meta:?}")));
                }
                // A leaf's stem past its first 32 bytes is in header words 5..7, zero
                // past the stem.
                let past_stem =
                    INT_STEM_AT + (meta.stem_len as usize).saturating_sub(LEAF_TAIL_STEM_BYTES);
                if img[past_stem..INT_STEM_AT + INT_HEADER_STEM_BYTES]
                    .iter()
                    .any(|&b| b != 0)
                {
                    return Err(bad(format!(
                        "leaf with non-zero header bytes past its {}-byte stem",
                        meta.stem_len
                    )));
                }
            }
            KIND_INTERNAL => {
                if meta.level == 0
                    || meta.count as usize > C_INT
                    || meta.area_used as usize > KEY_AREA_BYTES
                    || meta.stem_len as usize > MAX_INT_STEM_BYTES
                {
                    return Err(bad(format!("bad internal node header {meta:?}")));
                }
                let stem_len = meta.stem_len as usize;
                let past_stem = INT_STEM_AT + stem_len.min(INT_HEADER_STEM_BYTES);
                if img[past_stem..INT_STEM_AT + INT_HEADER_STEM_BYTES]
                    .iter()
                    .any(|&b| b != 0)
                {
                    return Err(bad(format!(
                        "non-zero bytes past the {}-byte stem",
                        meta.stem_len
                    )));
                }
                // A stem longer than the header holds has its other bytes in pivot 0.
                let d0 = PivotDesc::unpack(rd64(img, INT_PIVOT_DESC_AT));
                if stem_len > INT_HEADER_STEM_BYTES
                    && (meta.count == 0 || d0.is_external() || (d0.len_bytes as usize) < stem_len)
                {
                    return Err(bad(format!(
                        "a {stem_len}-byte stem without an inline pivot 0 that long to hold it"
                    )));
                }
            }
            k => return Err(bad(format!("unknown node kind {k}"))),
        }
        if let Some(level) = expect_level {
            if meta.level != level {
                return Err(bad(format!(
                    "node is at level {}, its parent expects {level}",
                    meta.level
                )));
            }
        }
        Ok(DiskNode { img, off, meta })
    }

    pub fn meta(&self) -> Meta {
        self.meta
    }

    fn bad(&self, detail: String) -> Error {
        Error::corruption("index node", self.off, detail)
    }

    /// Full structural check beyond `open`: every pointer non-zero, every child a disk word,
    /// every pivot inside the used key area, prefixes non-decreasing.
    pub fn verify_structure(&self) -> Result<()> {
        let n = self.meta.count as usize;
        if self.meta.is_leaf() {
            for i in 0..n {
                if LeafRead::ptr(self, i) == 0 {
                    return Err(self.bad(format!("entry {i} has a zero log pointer")));
                }
                if i > 0 && LeafRead::prefix(self, i - 1) > LeafRead::prefix(self, i) {
                    return Err(self.bad(format!("entry {i} is out of order")));
                }
            }
            return Ok(());
        }
        for i in 0..=n {
            let w = InternalRead::child(self, i);
            if !is_disk_word(w) {
                return Err(self.bad(format!("child {i} is not a disk node word ({w:#x})")));
            }
        }
        let used = self.meta.area_used as usize;
        for i in 0..n {
            let d = InternalRead::pivot_desc(self, i);
            let end = d.area_at as usize + d.area_bytes();
            let ok = if d.is_external() {
                end <= used && d.flags == PIVOT_EXTERNAL
            } else {
                d.len_bytes as usize <= MAX_INLINE_PIVOT
                    && d.flags == 0
                    && (d.area_bytes() == 0 || end <= used)
            };
            if !ok {
                return Err(self.bad(format!("pivot {i} has a bad descriptor {d:?}")));
            }
            if i > 0
                && InternalRead::pivot_prefix(self, i - 1) > InternalRead::pivot_prefix(self, i)
            {
                return Err(self.bad(format!("pivot {i} is out of order")));
            }
            self.verify_pivot_stem(i, d)?;
        }
        Ok(())
    }

    /// Pivot `i` against the node's stem: at least as long, and an inline pivot starts with
    /// the stem and its prefix is its 8 bytes after it (an EXTERNAL pivot's bytes are in
    /// the log: `check` reads them). `d` was checked to lie inside the used key area.
    fn verify_pivot_stem(&self, i: usize, d: PivotDesc) -> Result<()> {
        let stem_len = self.meta.stem_len as usize;
        if (d.len_bytes as usize) < stem_len {
            return Err(self.bad(format!(
                "pivot {i} ({} bytes) is shorter than the {stem_len}-byte stem",
                d.len_bytes
            )));
        }
        if d.is_external() {
            return Ok(());
        }
        let mut buf = [0u8; MAX_INLINE_PIVOT];
        let len = no_restart(inline_pivot(self, i, d, &mut buf))?;
        let stem = no_restart(InternalRead::stem(self))?;
        if !buf[..len].starts_with(&stem[..stem_len]) {
            return Err(self.bad(format!("pivot {i} does not start with the node's stem")));
        }
        if crate::index::key_prefix(&buf[stem_len..len]) != InternalRead::pivot_prefix(self, i) {
            return Err(self.bad(format!("pivot {i}: prefix is not its bytes after the stem")));
        }
        Ok(())
    }
}

impl LeafRead for DiskNode<'_> {
    fn count(&self) -> usize {
        self.meta.count as usize
    }
    fn prefix(&self, i: usize) -> u64 {
        rd64(self.img, LEAF_PREFIX_AT + 8 * i)
    }
    fn hash(&self, i: usize) -> u32 {
        rd32(self.img, LEAF_HASH_AT + 4 * i)
    }
    fn ptr(&self, i: usize) -> u64 {
        rd64(self.img, LEAF_PTR_AT + 8 * i)
    }
    fn stem_len(&self) -> usize {
        // `open` checked it.
        self.meta.stem_len as usize
    }
    fn stem(&self) -> [u8; MAX_STEM_BYTES] {
        let mut out = [0u8; MAX_STEM_BYTES];
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&rd64(self.img, leaf_stem_word_at(i)).to_le_bytes());
        }
        out
    }
    fn validate(&self) -> SResult<()> {
        Ok(())
    }
    fn corrupt(&self, detail: &str) -> SearchErr {
        SearchErr::Fail(self.bad(detail.to_string()))
    }
}

impl InternalRead for DiskNode<'_> {
    fn level(&self) -> u8 {
        self.meta.level
    }
    fn count(&self) -> usize {
        self.meta.count as usize
    }
    fn child(&self, i: usize) -> u64 {
        rd64(self.img, INT_CHILD_AT + 8 * i)
    }
    fn stem_len(&self) -> usize {
        // `open` checked it.
        self.meta.stem_len as usize
    }
    fn stem_head(&self) -> [u8; INT_HEADER_STEM_BYTES] {
        let mut out = [0u8; INT_HEADER_STEM_BYTES];
        out.copy_from_slice(&self.img[INT_STEM_AT..INT_STEM_AT + INT_HEADER_STEM_BYTES]);
        out
    }
    fn pivot_prefix(&self, i: usize) -> u64 {
        rd64(self.img, INT_PIVOT_PREFIX_AT + 8 * i)
    }
    fn pivot_desc(&self, i: usize) -> PivotDesc {
        PivotDesc::unpack(rd64(self.img, INT_PIVOT_DESC_AT + 8 * i))
    }
    fn area_read(&self, at: usize, out: &mut [u8]) -> SResult<()> {
        let end = at + out.len();
        if end > self.meta.area_used as usize {
            return Err(SearchErr::Fail(self.bad(format!(
                "pivot bytes {at}..{end} lie outside the used key area ({} bytes)",
                self.meta.area_used
            ))));
        }
        out.copy_from_slice(&self.img[INT_AREA_AT + at..INT_AREA_AT + end]);
        Ok(())
    }
    fn validate(&self) -> SResult<()> {
        Ok(())
    }
    fn corrupt(&self, detail: &str) -> SearchErr {
        SearchErr::Fail(self.bad(detail.to_string()))
    }
    fn check_child(&self, word: u64) -> SResult<()> {
        if !is_disk_word(word) {
            return Err(InternalRead::corrupt(
                self,
                &format!("child word {word:#x} is not a disk node"),
            ));
        }
        Ok(())
    }
}

/// Checks a committed node image completely: header, checksum, own offset, region, and the
/// bounds of every field. For `check` and for loading a node before copying it on write.
pub fn verify_image(img: &[u8], off: DiskOffset, region: RegionId) -> Result<()> {
    DiskNode::open(img, off, region, None)?.verify_structure()
}

/// What a verified committed node holds, for walks over a whole volume (`check`, dropping
/// a region): a leaf's stem and (prefix, hash, log pointer) entries, or an internal node's
/// stem, pivots and children.
pub enum ImageContents {
    Leaf {
        stem: Vec<u8>,
        entries: Vec<(u64, u32, u64)>,
    },
    Internal {
        stem: Vec<u8>,
        pivots: Vec<ImagePivot>,
        /// One more than `pivots`: child `i` holds the keys from pivot `i - 1` (inclusive)
        /// to pivot `i` (exclusive).
        children: Vec<DiskOffset>,
    },
}

/// A pivot of a verified internal node image.
pub enum ImagePivot {
    /// Its bytes; verified to start with the node's stem, with its prefix the 8 bytes after.
    Inline(Vec<u8>),
    /// A pivot kept by log pointer: the full key of the record at `ptr`. The image says it
    /// is `len_bytes` long and `prefix` is its 8 bytes after the node's stem; only the key
    /// in the log can confirm that (`check` reads it).
    External {
        ptr: u64,
        len_bytes: u32,
        prefix: u64,
    },
}

/// Verifies a committed node image completely and returns its contents.
pub fn image_contents(img: &[u8], off: DiskOffset, region: RegionId) -> Result<ImageContents> {
    let d = DiskNode::open(img, off, region, None)?;
    d.verify_structure()?;
    let n = d.meta().count as usize;
    if d.meta().is_leaf() {
        Ok(ImageContents::Leaf {
            stem: LeafRead::stem(&d)[..LeafRead::stem_len(&d)].to_vec(),
            entries: (0..n)
                .map(|i| {
                    (
                        LeafRead::prefix(&d, i),
                        LeafRead::hash(&d, i),
                        LeafRead::ptr(&d, i),
                    )
                })
                .collect(),
        })
    } else {
        let mut pivots = Vec::with_capacity(n);
        for i in 0..n {
            let desc = InternalRead::pivot_desc(&d, i);
            pivots.push(if desc.is_external() {
                let mut b = [0u8; 8];
                no_restart(InternalRead::area_read(&d, desc.area_at as usize, &mut b))?;
                ImagePivot::External {
                    ptr: u64::from_le_bytes(b),
                    len_bytes: desc.len_bytes,
                    prefix: InternalRead::pivot_prefix(&d, i),
                }
            } else {
                let mut buf = [0u8; MAX_INLINE_PIVOT];
                let len = no_restart(inline_pivot(&d, i, desc, &mut buf))?;
                ImagePivot::Inline(buf[..len].to_vec())
            });
        }
        Ok(ImageContents::Internal {
            stem: no_restart(InternalRead::stem(&d))?[..InternalRead::stem_len(&d)].to_vec(),
            pivots,
            children: (0..=n)
                .map(|i| DiskOffset(InternalRead::child(&d, i) & !1))
                .collect(),
        })
    }
}

// ---------------------------------------------------------------------------------------
// Copies and images

/// Copies a verified disk image into a new heap node of `epoch` (not yet published).
pub(crate) fn heap_from_image(d: &DiskNode<'_>, epoch: u64, region: RegionId) -> NonNull<Header> {
    let m = d.meta();
    let n = m.count as usize;
    if m.is_leaf() {
        let p = alloc_leaf(epoch, region);
        // SAFETY: just allocated as a leaf, not yet shared.
        let leaf = unsafe { as_leaf(p) };
        for i in 0..n {
            leaf.prefix[i].store(LeafRead::prefix(d, i), Relaxed);
            leaf.ptr[i].store(LeafRead::ptr(d, i), Relaxed);
            leaf.hash[i].store(LeafRead::hash(d, i), Relaxed);
        }
        leaf.set_stem(&LeafRead::stem(d)[..LeafRead::stem_len(d)]);
        leaf.hdr.set_meta(m);
        p
    } else {
        let p = alloc_internal(epoch, region, m.level);
        // SAFETY: just allocated as an internal node, not yet shared.
        let node = unsafe { as_internal(p) };
        for i in 0..=n {
            node.child[i].store(InternalRead::child(d, i), Relaxed);
        }
        for i in 0..n {
            node.pivot_prefix[i].store(InternalRead::pivot_prefix(d, i), Relaxed);
            node.pivot_desc[i].store(rd64(d.img, INT_PIVOT_DESC_AT + 8 * i), Relaxed);
        }
        for (w, slot) in node.area.iter().enumerate() {
            slot.store(rd64(d.img, INT_AREA_AT + 8 * w), Relaxed);
        }
        // The header's part: the rest of a longer stem came with the key area (pivot 0).
        let head = InternalRead::stem_len(d).min(INT_HEADER_STEM_BYTES);
        node.set_stem(&InternalRead::stem_head(d)[..head]);
        node.hdr.set_meta(m);
        p
    }
}

/// Builds the disk image of an immutable heap node that will live at `off`.
/// `child_word(i)` gives the disk word of child `i` (internal nodes only).
pub(crate) fn encode_image(
    p: NonNull<Header>,
    off: DiskOffset,
    region: RegionId,
    mut child_word: impl FnMut(usize) -> u64,
) -> Box<[u8; NODE_BYTES]> {
    assert!(!off.is_none() && off.block_aligned());
    let mut img = Box::new([0u8; NODE_BYTES]);
    // SAFETY: the caller passes a live, immutable node.
    let hdr = unsafe { p.as_ref() };
    let m = hdr.meta();
    let n = m.count as usize;
    if m.is_leaf() {
        // SAFETY: kind checked.
        let leaf = unsafe { as_leaf(p) };
        for i in 0..n {
            let ptr = leaf.ptr[i].load(Relaxed);
            assert!(ptr != 0, "leaf entry without a log pointer");
            wr64(
                &mut img[..],
                LEAF_PREFIX_AT + 8 * i,
                leaf.prefix[i].load(Relaxed),
            );
            wr64(&mut img[..], LEAF_PTR_AT + 8 * i, ptr);
            wr32(
                &mut img[..],
                LEAF_HASH_AT + 4 * i,
                leaf.hash[i].load(Relaxed),
            );
        }
        for i in 0..LEAF_STEM_WORDS {
            wr64(
                &mut img[..],
                leaf_stem_word_at(i),
                leaf.stem_word(i).load(Relaxed),
            );
        }
    } else {
        // SAFETY: kind checked.
        let node = unsafe { as_internal(p) };
        for i in 0..=n {
            let w = child_word(i);
            assert!(
                is_disk_word(w),
                "child {i} of a persisted node is not on disk"
            );
            wr64(&mut img[..], INT_CHILD_AT + 8 * i, w);
        }
        for i in 0..n {
            wr64(
                &mut img[..],
                INT_PIVOT_PREFIX_AT + 8 * i,
                node.pivot_prefix[i].load(Relaxed),
            );
            wr64(
                &mut img[..],
                INT_PIVOT_DESC_AT + 8 * i,
                node.pivot_desc[i].load(Relaxed),
            );
        }
        let used = m.area_used as usize;
        let mut area = [0u8; KEY_AREA_BYTES];
        node.area_read(0, &mut area[..used]);
        img[INT_AREA_AT..INT_AREA_AT + used].copy_from_slice(&area[..used]);
        for w in W_STEM..W_STEM + INT_HEADER_STEM_BYTES / 8 {
            wr64(&mut img[..], w * 8, node.hdr.w[w].load(Relaxed));
        }
    }
    wr64(&mut img[..], W_META * 8, m.pack());
    wr64(&mut img[..], W_EPOCH * 8, hdr.epoch());
    wr64(&mut img[..], W_DISK * 8, off.0);
    wr64(&mut img[..], W_REGION * 8, region.0);
    let crc = image_crc(&img[..]);
    wr64(&mut img[..], 0, crc as u64 | (NODE_MAGIC as u64) << 32);
    img
}

/// Rewrites the committed image `src` of the node at `from` (offset and region: a
/// primary's) into `dst` for the node at `to` (a backup's copy of it, DESIGN.md
/// "Replication"): every log pointer (leaf entries, EXTERNAL pivots) through `log`, every
/// child through `node`, then its own offset, its region and its checksum. `src` is
/// verified completely before and `dst` after; a pointer a map does not know is an error,
/// so a damaged or misdirected image never becomes a wrong node.
pub fn rewrite_image(
    src: &[u8],
    from: (DiskOffset, RegionId),
    dst: &mut [u8],
    to: (DiskOffset, RegionId),
    log: &dyn Fn(u64) -> Option<u64>,
    node: &dyn Fn(u64) -> Option<u64>,
) -> Result<()> {
    let d = DiskNode::open(src, from.0, from.1, None)?;
    d.verify_structure()?;
    if dst.len() != NODE_BYTES || to.0.is_none() || !to.0.block_aligned() {
        return Err(Error::InvalidArgument(format!(
            "a node rewritten to {} must be one block at a block",
            to.0
        )));
    }
    let unknown = |what: &str, value: u64| {
        Error::corruption(
            "shipped index node",
            from.0,
            format!("{what} {value:#x} is not among what its commit lists"),
        )
    };
    dst.copy_from_slice(src);
    let m = d.meta();
    let n = m.count as usize;
    if m.is_leaf() {
        for i in 0..n {
            let at = LEAF_PTR_AT + 8 * i;
            let ptr = rd64(src, at);
            wr64(
                dst,
                at,
                log(ptr).ok_or_else(|| unknown("log pointer", ptr))?,
            );
        }
    } else {
        for i in 0..=n {
            let at = INT_CHILD_AT + 8 * i;
            let child = rd64(src, at) & !1;
            let copy = node(child).ok_or_else(|| unknown("child", child))?;
            wr64(dst, at, copy | 1);
        }
        for i in 0..n {
            let desc = PivotDesc::unpack(rd64(src, INT_PIVOT_DESC_AT + 8 * i));
            if desc.is_external() {
                let at = INT_AREA_AT + desc.area_at as usize;
                let ptr = rd64(src, at);
                wr64(
                    dst,
                    at,
                    log(ptr).ok_or_else(|| unknown("pivot's log pointer", ptr))?,
                );
            }
        }
    }
    wr64(dst, W_DISK * 8, to.0 .0);
    wr64(dst, W_REGION * 8, to.1 .0);
    let crc = image_crc(dst);
    wr64(dst, 0, crc as u64 | (NODE_MAGIC as u64) << 32);
    verify_image(dst, to.0, to.1)
}

/// Rewrites a committed internal node image in the layout written before internal nodes
/// had stems (stem length 0, header words 5..7 zero, each prefix the pivot's first 8
/// bytes; descriptors and key area are the same in both) and re-stamps its checksum.
/// `key_of` gives the key of an EXTERNAL pivot's record. Leaves are left as they are.
#[cfg(test)]
pub(crate) fn destem_image(img: &mut [u8], mut key_of: impl FnMut(u64) -> Vec<u8>) {
    let mut m = Meta::unpack(rd64(img, W_META * 8));
    if m.kind != KIND_INTERNAL {
        return;
    }
    let stem_len = m.stem_len as usize;
    // Only a prefix's first 8 bytes are taken from the stem: the header holds them.
    let stem = img[INT_STEM_AT..INT_STEM_AT + stem_len.min(INT_HEADER_STEM_BYTES)].to_vec();
    for i in 0..m.count as usize {
        let d = PivotDesc::unpack(rd64(img, INT_PIVOT_DESC_AT + 8 * i));
        let prefix = rd64(img, INT_PIVOT_PREFIX_AT + 8 * i);
        let first = if d.is_external() {
            let ptr = rd64(img, INT_AREA_AT + d.area_at as usize);
            crate::index::key_prefix(&key_of(ptr))
        } else {
            let mut head = stem.clone();
            head.extend_from_slice(&prefix.to_be_bytes());
            crate::index::key_prefix(&head[..(d.len_bytes as usize).min(8)])
        };
        wr64(img, INT_PIVOT_PREFIX_AT + 8 * i, first);
    }
    m.stem_len = 0;
    wr64(img, W_META * 8, m.pack());
    img[INT_STEM_AT..INT_STEM_AT + INT_HEADER_STEM_BYTES].fill(0);
    let crc = image_crc(img);
    wr64(img, 0, crc as u64 | (NODE_MAGIC as u64) << 32);
}
