//! Index node layout: the 4096-byte format shared byte for byte by heap nodes and disk
//! images (drawn below), the heap node types, the packed header and descriptor words, and
//! the words that name a node (child and root words).
//!
//! The rest of the node's jobs, one file each:
//! - `heap`: heap nodes: the seqlock on the version word, allocation and freeing, field
//!   writers (key area, stems), copies of an immutable node into a new epoch;
//! - `view`: read-only views over a heap node or a disk image (`LeafRead`,
//!   `InternalRead`), which the search code is generic over, and the restart signal;
//! - `image`: disk images: checks (magic, checksum, own offset, region, kind, level,
//!   bounds), the views over them, encoding a heap node and loading an image into one.
//!
//! Owns: offsets and encodings of every node field. Does not own: search order, splits,
//! or which node is reachable from where (`tree`).
//!
//! Thread safety: a heap node is a struct of atomics, so a reader may load any field while
//! the single writer stores to it; loads are relaxed and a reader trusts what it loaded only
//! after [`Header::read_valid`] confirms the version did not move. The writer brackets every
//! in-place change of a published node with [`Header::write_begin`] / [`Header::write_end`].
//! Disk images are immutable `&[u8]`.
//!
//! ```text
//! header (64 bytes, 8 little-endian words)
//!   w0  heap: seqlock version (even = stable)   disk: crc32c (low 32) | magic "TNOD" (high 32)
//!   w1  kind u8 | level u8 | count u16 | key_area_used u16 | stem_len u16
//!   w2  tree epoch the node was created in
//!   w3  heap: disk offset assigned by a commit (0 = none)   disk: the node's own offset
//!   w4  region id
//!   w5..w7  leaf: stem bytes 32..56   internal: stem bytes 0..24; node bytes 40..64 in
//!           order (each word little-endian, so word 5's low byte is the first of them);
//!           zero past stem_len
//! leaf (kind 1, level 0)                       internal (kind 2, level >= 1)
//!   64    prefix [u64; 200]                      64    child [u64; 129]
//!   1664  ptr    [u64; 200]                      1096  pivot_prefix [u64; 128]
//!   3264  hash   [u32; 200]                      2120  pivot_desc [u64; 128]
//!   4064  stem   [u8; 32]     (ends 4096)        3144  key area (952 bytes)
//!           (stem bytes 0..32)
//! pivot_desc = len u32 | area_offset u16 << 32 | flags u16 << 48   (flag 1 = EXTERNAL)
//! leaf stem: the first stem_len (<= 56) bytes every key of the leaf starts with; a leaf
//!   entry's prefix is the 8 key bytes after the stem. Bytes 0..32 end the node, bytes
//!   32..56 fill header words 5..7, which leaves written before stems grew past 32 bytes
//!   kept zero: their images read the same
//! internal stem: the first stem_len (<= 56) bytes every pivot of the node starts with; a
//!   pivot's prefix is its 8 bytes after the stem. The key area and pivot_desc do not
//!   depend on the stem: they hold the pivot's bytes from its 8th on and its full length,
//!   so stem_len 0 is the layout of volumes written before internal stems existed. The
//!   header keeps the stem's first 24 bytes; a longer stem's bytes from the 24th on are
//!   stored nowhere else than in pivot 0, which must then be inline (its key area run
//!   holds them from area_at + 16 on). Nodes written before stems grew past 24 bytes
//!   read unchanged.
//! child / root word: 0 = none, heap pointer (low bit 0), disk offset | 1
//! ```

pub(super) mod heap;
pub(super) mod image;
pub(super) mod view;

use std::mem::{offset_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::types::{DiskOffset, BLOCK_BYTES};

/// Bytes of one node, in memory and on disk.
pub const NODE_BYTES: usize = 4096;
/// Entries a leaf holds.
pub const C_LEAF: usize = 200;
/// Pivots an internal node holds (it has one more child).
pub const C_INT: usize = 128;
/// Longest stem a leaf keeps (bytes every key of the leaf starts with, left out of the
/// entries' prefixes so that keys with long common beginnings still differ in them).
/// The server's collection sub-keys share 31 bytes before their field or member begins
/// (reserved tag, family, key length, `rec-index`, version), and a member like
/// `rec:000000012345` 11 more: 56 bytes reach past both (DESIGN.md, "Stems of 56 bytes").
pub const MAX_STEM_BYTES: usize = LEAF_TAIL_STEM_BYTES + INT_HEADER_STEM_BYTES;
/// Stem bytes a leaf keeps at its end (the first ones); the rest are in header words 5..7.
pub(crate) const LEAF_TAIL_STEM_BYTES: usize = 32;
/// Longest stem an internal node keeps (bytes every pivot of the node starts with, left
/// out of the pivots' prefixes): as long as a leaf's, for the same keys tie one level up.
pub const MAX_INT_STEM_BYTES: usize = 56;
/// Bytes of an internal node's stem kept in the header: three words, which were zero
/// before internal nodes had stems, in the cache line a search reads first. The rest of
/// a longer stem is pivot 0's (see the layout above).
pub(crate) const INT_HEADER_STEM_BYTES: usize = 24;
/// Longest separator stored inline; longer ones are EXTERNAL (a log pointer to the full key).
pub const MAX_INLINE_PIVOT: usize = 256;
/// Bytes of an internal node's key area (pivot bytes beyond the 8-byte prefix).
pub const KEY_AREA_BYTES: usize = 952;
/// An internal node with less free key area than this is full: any one more pivot
/// (at most `MAX_INLINE_PIVOT - 8` bytes inline, or 8 bytes external) must fit.
pub const AREA_FREE_MIN_BYTES: usize = 264;
/// High half of word 0 of a disk image: "TNOD" in little-endian byte order.
pub const NODE_MAGIC: u32 = 0x444F_4E54;
pub const KIND_LEAF: u8 = 1;
pub const KIND_INTERNAL: u8 = 2;
/// `pivot_desc` flag: the pivot is the full key of the log record whose pointer is in the area.
pub const PIVOT_EXTERNAL: u16 = 1;

const LEAF_PREFIX_AT: usize = 64;
const LEAF_PTR_AT: usize = 1664;
const LEAF_HASH_AT: usize = 3264;
const LEAF_STEM_AT: usize = 4064;
const INT_CHILD_AT: usize = 64;
const INT_PIVOT_PREFIX_AT: usize = 1096;
const INT_PIVOT_DESC_AT: usize = 2120;
const INT_AREA_AT: usize = 3144;
const AREA_WORDS: usize = KEY_AREA_BYTES / 8;

/// Header words, by index.
pub(crate) const W_VERSION: usize = 0;
pub(crate) const W_META: usize = 1;
pub(crate) const W_EPOCH: usize = 2;
pub(crate) const W_DISK: usize = 3;
pub(crate) const W_REGION: usize = 4;
/// First of the three words of an internal node's stem.
const W_STEM: usize = 5;
const INT_STEM_AT: usize = W_STEM * 8;

#[repr(C, align(64))]
pub(crate) struct Header {
    pub w: [AtomicU64; 8],
}

#[repr(C, align(64))]
pub(crate) struct LeafNode {
    pub hdr: Header,
    pub prefix: [AtomicU64; C_LEAF],
    pub ptr: [AtomicU64; C_LEAF],
    pub hash: [AtomicU32; C_LEAF],
    /// The stem's first `LEAF_TAIL_STEM_BYTES` bytes in order (word `i` holds bytes
    /// `8i..8i+8`, little-endian), zero past `Meta::stem_len`; bytes from the 32nd on are
    /// in header words 5..7 (`W_STEM`).
    pub stem: [AtomicU64; LEAF_TAIL_STEM_BYTES / 8],
}

#[repr(C, align(64))]
pub(crate) struct InternalNode {
    pub hdr: Header,
    pub child: [AtomicU64; C_INT + 1],
    pub pivot_prefix: [AtomicU64; C_INT],
    pub pivot_desc: [AtomicU64; C_INT],
    pub area: [AtomicU64; AREA_WORDS],
}

// The heap layout is the disk layout: check every offset at compile time.
const _: () = {
    assert!(size_of::<Header>() == 64);
    assert!(size_of::<LeafNode>() == NODE_BYTES);
    assert!(size_of::<InternalNode>() == NODE_BYTES);
    assert!(offset_of!(LeafNode, prefix) == LEAF_PREFIX_AT);
    assert!(offset_of!(LeafNode, ptr) == LEAF_PTR_AT);
    assert!(offset_of!(LeafNode, hash) == LEAF_HASH_AT);
    assert!(offset_of!(LeafNode, stem) == LEAF_STEM_AT);
    assert!(offset_of!(InternalNode, child) == INT_CHILD_AT);
    assert!(offset_of!(InternalNode, pivot_prefix) == INT_PIVOT_PREFIX_AT);
    assert!(offset_of!(InternalNode, pivot_desc) == INT_PIVOT_DESC_AT);
    assert!(offset_of!(InternalNode, area) == INT_AREA_AT);
    assert!(NODE_BYTES as u64 == BLOCK_BYTES);
    assert!(KEY_AREA_BYTES.is_multiple_of(8));
    assert!(AREA_FREE_MIN_BYTES >= MAX_INLINE_PIVOT - 8);
    assert!(INT_STEM_AT + INT_HEADER_STEM_BYTES == size_of::<Header>());
    assert!(MAX_INT_STEM_BYTES >= INT_HEADER_STEM_BYTES && INT_HEADER_STEM_BYTES >= 8);
    assert!(LEAF_STEM_AT + LEAF_TAIL_STEM_BYTES == NODE_BYTES);
    assert!(MAX_STEM_BYTES.is_multiple_of(8) && LEAF_TAIL_STEM_BYTES.is_multiple_of(8));
};

/// Words of a leaf's stem (8 stem bytes each, little-endian).
pub(crate) const LEAF_STEM_WORDS: usize = MAX_STEM_BYTES / 8;

/// Byte offset in the node of leaf stem word `i` (stem bytes `8i..8i+8`): the first
/// `LEAF_TAIL_STEM_BYTES` at the node's end, the rest in header words 5..7.
pub(crate) const fn leaf_stem_word_at(i: usize) -> usize {
    if i < LEAF_TAIL_STEM_BYTES / 8 {
        LEAF_STEM_AT + 8 * i
    } else {
        INT_STEM_AT + 8 * (i - LEAF_TAIL_STEM_BYTES / 8)
    }
}

impl LeafNode {
    /// Stem word `i` (`i < LEAF_STEM_WORDS`), wherever the layout keeps it.
    pub(crate) fn stem_word(&self, i: usize) -> &AtomicU64 {
        match self.stem.get(i) {
            Some(w) => w,
            None => &self.hdr.w[W_STEM + i - self.stem.len()],
        }
    }
}

/// Word 1 of the header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Meta {
    pub kind: u8,
    pub level: u8,
    pub count: u16,
    pub area_used: u16,
    /// Bytes of the stem: at most [`MAX_STEM_BYTES`] in a leaf, [`MAX_INT_STEM_BYTES`] in
    /// an internal node.
    pub stem_len: u16,
}

impl Meta {
    pub fn pack(self) -> u64 {
        self.kind as u64
            | (self.level as u64) << 8
            | (self.count as u64) << 16
            | (self.area_used as u64) << 32
            | (self.stem_len as u64) << 48
    }

    pub fn unpack(w: u64) -> Meta {
        Meta {
            kind: w as u8,
            level: (w >> 8) as u8,
            count: (w >> 16) as u16,
            area_used: (w >> 32) as u16,
            stem_len: (w >> 48) as u16,
        }
    }

    pub fn is_leaf(self) -> bool {
        self.kind == KIND_LEAF
    }

    /// Full nodes are split before the writer descends into them, so that the parent of any
    /// node being changed always has room for one more pivot.
    pub fn is_full(self) -> bool {
        if self.is_leaf() {
            self.count as usize >= C_LEAF
        } else {
            self.count as usize >= C_INT
                || KEY_AREA_BYTES - (self.area_used as usize) < AREA_FREE_MIN_BYTES
        }
    }
}

/// A pivot descriptor (`pivot_desc` word).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct PivotDesc {
    /// Full length of the pivot in bytes (for EXTERNAL: of the referenced key).
    pub len_bytes: u32,
    /// Where the bytes after the prefix (or the 8-byte log pointer) start in the key area.
    pub area_at: u16,
    pub flags: u16,
}

impl PivotDesc {
    pub fn pack(self) -> u64 {
        self.len_bytes as u64 | (self.area_at as u64) << 32 | (self.flags as u64) << 48
    }

    pub fn unpack(w: u64) -> PivotDesc {
        PivotDesc {
            len_bytes: w as u32,
            area_at: (w >> 32) as u16,
            flags: (w >> 48) as u16,
        }
    }

    pub fn is_external(self) -> bool {
        self.flags & PIVOT_EXTERNAL != 0
    }

    /// Bytes this pivot occupies in the key area.
    pub fn area_bytes(self) -> usize {
        if self.is_external() {
            8
        } else {
            (self.len_bytes as usize).saturating_sub(8)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Node words: what a child or root word holds (0, a heap pointer, or a disk offset | 1).

/// What a child or root word names.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NodeRef {
    Heap(NonNull<Header>),
    Disk(DiskOffset),
}

impl NodeRef {
    pub fn decode(word: u64) -> Option<NodeRef> {
        if word == 0 {
            None
        } else if word & 1 == 1 {
            Some(NodeRef::Disk(DiskOffset(word & !1)))
        } else {
            // The word came from `heap_word` of a live node (callers validate before use).
            NonNull::new(std::ptr::with_exposed_provenance_mut::<Header>(
                word as usize,
            ))
            .map(NodeRef::Heap)
        }
    }
}

pub(crate) fn heap_word(p: NonNull<Header>) -> u64 {
    let word = p.as_ptr().expose_provenance() as u64;
    debug_assert!(word != 0 && word & 63 == 0);
    word
}

/// Asks the CPU to start loading the lines of the heap leaf at child word `word` that a
/// search reads first: the header (count, version), the stem, and the prefix array. The
/// search itself would take them one dependent miss at a time (header, then stem, then
/// the first and last prefixes, then the interpolated guess); started together they
/// arrive in about one miss's time. A hint: a torn or stale `word` wastes a fetch.
#[inline(always)]
pub(crate) fn prefetch_leaf_word(word: u64) {
    if word == 0 || word & 1 == 1 {
        return;
    }
    let lines = [0, LEAF_STEM_AT]
        .into_iter()
        .chain((LEAF_PREFIX_AT..LEAF_PTR_AT).step_by(64));
    crate::prefetch::cache_lines(std::ptr::without_provenance(word as usize), lines);
}

pub(crate) fn disk_word(off: DiskOffset) -> u64 {
    assert!(
        !off.is_none() && off.block_aligned(),
        "index node offset {off:?} is not a block"
    );
    off.0 | 1
}

/// True if `word` is a well-formed disk child word (non-zero, block aligned, low bit set).
fn is_disk_word(word: u64) -> bool {
    word & 1 == 1 && word & !1 != 0 && (word & !1).is_multiple_of(BLOCK_BYTES)
}
