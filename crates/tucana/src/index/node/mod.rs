//! Index node layout: the 4096-byte format shared byte for byte by heap nodes and disk
//! images, the heap node types, read-only views over both, and the image codec.
//!
//! Owns: offsets and encodings of every node field, allocation and freeing of heap nodes,
//! the seqlock protocol on a heap node's version word, checks of disk images (magic,
//! checksum, own offset, region, kind, level, bounds), and conversion between heap node and
//! image. Does not own: search order, splits, or which node is reachable from where (`tree`).
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
//!   w5..w7  leaf: zero   internal: the stem, node bytes 40..64 in order (each word
//!           little-endian, so word 5's low byte is stem byte 0); zero past stem_len
//! leaf (kind 1, level 0)                       internal (kind 2, level >= 1)
//!   64    prefix [u64; 200]                      64    child [u64; 129]
//!   1664  ptr    [u64; 200]                      1096  pivot_prefix [u64; 128]
//!   3264  hash   [u32; 200]                      2120  pivot_desc [u64; 128]
//!   4064  stem   [u8; 32]     (ends 4096)        3144  key area (952 bytes)
//! pivot_desc = len u32 | area_offset u16 << 32 | flags u16 << 48   (flag 1 = EXTERNAL)
//! leaf stem: the first stem_len (<= 32) bytes every key of the leaf starts with; a leaf
//!   entry's prefix is the 8 key bytes after the stem
//! internal stem: the first stem_len (<= 24) bytes every pivot of the node starts with; a
//!   pivot's prefix is its 8 bytes after the stem. The key area and pivot_desc do not
//!   depend on the stem: they hold the pivot's bytes from its 8th on and its full length,
//!   so stem_len 0 is the layout of volumes written before internal stems existed.
//! child / root word: 0 = none, heap pointer (low bit 0), disk offset | 1
//! ```

use std::mem::{offset_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};

use crate::error::{Error, Result};
use crate::types::{DiskOffset, RegionId, BLOCK_BYTES};

/// Bytes of one node, in memory and on disk.
pub const NODE_BYTES: usize = 4096;
/// Entries a leaf holds.
pub const C_LEAF: usize = 200;
/// Pivots an internal node holds (it has one more child).
pub const C_INT: usize = 128;
/// Longest stem a leaf keeps (bytes every key of the leaf starts with, left out of the
/// entries' prefixes so that keys with long common beginnings still differ in them).
pub const MAX_STEM_BYTES: usize = 32;
/// Longest stem an internal node keeps (bytes every pivot of the node starts with, left
/// out of the pivots' prefixes). Three header words, which were zero before internal
/// nodes had stems: the stem shares the cache line a search reads first anyway.
pub const MAX_INT_STEM_BYTES: usize = 24;
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
    /// `MAX_STEM_BYTES` bytes in order (word `i` holds bytes `8i..8i+8`, little-endian);
    /// the first `Meta::stem_len` are the stem, the rest zero.
    pub stem: [AtomicU64; MAX_STEM_BYTES / 8],
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
    assert!(INT_STEM_AT + MAX_INT_STEM_BYTES == size_of::<Header>());
};

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
// Node words

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

// ---------------------------------------------------------------------------------------
// Heap nodes

impl Header {
    pub fn meta(&self) -> Meta {
        Meta::unpack(self.w[W_META].load(Relaxed))
    }

    pub fn set_meta(&self, m: Meta) {
        self.w[W_META].store(m.pack(), Relaxed);
    }

    /// Epoch the node was created in; written before the node is published, never changed.
    pub fn epoch(&self) -> u64 {
        self.w[W_EPOCH].load(Relaxed)
    }

    /// Disk offset assigned by `persist` (0 = not persisted).
    pub fn disk_offset(&self) -> u64 {
        self.w[W_DISK].load(Acquire)
    }

    /// Reader: waits until no change is in progress and returns the version to validate.
    pub fn read_begin(&self) -> u64 {
        let mut spins = 0u32;
        loop {
            let v = self.w[W_VERSION].load(Acquire);
            if v & 1 == 0 {
                return v;
            }
            // The writer never does I/O while a version is odd, so this is short unless the
            // writer thread was preempted; then let it run.
            spins += 1;
            if spins < 128 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Reader: true if nothing changed since `read_begin` returned `v`, which makes every
    /// relaxed load made in between a consistent view.
    pub fn read_valid(&self, v: u64) -> bool {
        fence(Acquire);
        self.w[W_VERSION].load(Relaxed) == v
    }

    /// Writer: starts an in-place change of a published node.
    pub fn write_begin(&self) {
        let v = self.w[W_VERSION].load(Relaxed);
        assert!(v & 1 == 0, "index node changed twice at once");
        self.w[W_VERSION].store(v + 1, Relaxed);
        // Orders the odd version before the data stores that follow (pairs with the
        // reader's acquire fence in `read_valid`).
        fence(Release);
    }

    /// Writer: ends the change started by `write_begin`.
    pub fn write_end(&self) {
        let v = self.w[W_VERSION].load(Relaxed);
        debug_assert!(v & 1 == 1);
        self.w[W_VERSION].store(v + 1, Release);
    }
}

/// # Safety
/// `p` must point to a live heap node whose kind is leaf.
pub(crate) unsafe fn as_leaf<'a>(p: NonNull<Header>) -> &'a LeafNode {
    // SAFETY: `Header` is the first field of the `repr(C)` `LeafNode`; the caller
    // guarantees the node is a live leaf.
    unsafe { p.cast::<LeafNode>().as_ref() }
}

/// # Safety
/// `p` must point to a live heap node whose kind is internal.
pub(crate) unsafe fn as_internal<'a>(p: NonNull<Header>) -> &'a InternalNode {
    // SAFETY: as in `as_leaf`.
    unsafe { p.cast::<InternalNode>().as_ref() }
}

/// A zeroed heap node from the node arena, owned by the caller (freed with `free_node`).
fn alloc_zeroed<T>() -> NonNull<T> {
    const { assert!(size_of::<T>() == super::arena::SLOT_BYTES) };
    // A slot is 4096-byte aligned, more than any node type needs (64), and all-zero bytes
    // are a valid value of a node (it is only atomics).
    super::arena::alloc_slot().cast::<T>()
}

pub(crate) fn alloc_leaf(epoch: u64, region: RegionId) -> NonNull<Header> {
    let p = alloc_zeroed::<LeafNode>();
    // SAFETY: a zeroed slot is a valid leaf, owned by us until published.
    let node = unsafe { p.as_ref() };
    node.hdr.set_meta(Meta {
        kind: KIND_LEAF,
        level: 0,
        count: 0,
        area_used: 0,
        stem_len: 0,
    });
    node.hdr.w[W_EPOCH].store(epoch, Relaxed);
    node.hdr.w[W_REGION].store(region.0, Relaxed);
    p.cast()
}

pub(crate) fn alloc_internal(epoch: u64, region: RegionId, level: u8) -> NonNull<Header> {
    assert!(level >= 1);
    let p = alloc_zeroed::<InternalNode>();
    // SAFETY: a zeroed slot is a valid internal node, owned by us until published.
    let node = unsafe { p.as_ref() };
    node.hdr.set_meta(Meta {
        kind: KIND_INTERNAL,
        level,
        count: 0,
        area_used: 0,
        stem_len: 0,
    });
    node.hdr.w[W_EPOCH].store(epoch, Relaxed);
    node.hdr.w[W_REGION].store(region.0, Relaxed);
    p.cast()
}

/// Frees one heap node (not its children).
///
/// # Safety
/// `p` came from `alloc_leaf`/`alloc_internal`, is freed once, and nobody can reach it any more.
pub(crate) unsafe fn free_node(p: NonNull<Header>) {
    // SAFETY: the caller guarantees `p` is a slot of the arena nobody uses any more. Nodes
    // are only atomics: nothing to drop.
    unsafe { super::arena::free_slot(p.cast()) }
}

impl InternalNode {
    /// Copies key-area bytes `[at, at + out.len())` into `out`; bytes past the area read as
    /// zero (only a torn read asks for them, and validation then fails).
    pub fn area_read(&self, at: usize, out: &mut [u8]) {
        let end = (at + out.len()).min(KEY_AREA_BYTES);
        let mut pos = at;
        let mut o = 0;
        while pos < end {
            let word = self.area[pos / 8].load(Relaxed).to_le_bytes();
            let from = pos % 8;
            let n = (8 - from).min(end - pos);
            out[o..o + n].copy_from_slice(&word[from..from + n]);
            pos += n;
            o += n;
        }
        out[o..].fill(0);
    }

    /// Writer: stores `bytes` at key-area offset `at`.
    pub fn area_write(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= KEY_AREA_BYTES, "key area overflow");
        let mut pos = at;
        let mut src = bytes;
        while !src.is_empty() {
            let slot = &self.area[pos / 8];
            let mut word = slot.load(Relaxed).to_le_bytes();
            let from = pos % 8;
            let n = (8 - from).min(src.len());
            word[from..from + n].copy_from_slice(&src[..n]);
            slot.store(u64::from_le_bytes(word), Relaxed);
            pos += n;
            src = &src[n..];
        }
    }

    /// Writer: stores the stem bytes in header words 5..7 (zero past `stem.len()`); the
    /// caller sets `Meta::stem_len` and the prefixes in the same seqlock section.
    pub fn set_stem(&self, stem: &[u8]) {
        assert!(
            stem.len() <= MAX_INT_STEM_BYTES,
            "internal stem of {} bytes",
            stem.len()
        );
        let mut bytes = [0u8; MAX_INT_STEM_BYTES];
        bytes[..stem.len()].copy_from_slice(stem);
        for (w, chunk) in self.hdr.w[W_STEM..].iter().zip(bytes.chunks_exact(8)) {
            w.store(
                u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
                Relaxed,
            );
        }
    }
}

impl LeafNode {
    /// Writer: stores the stem bytes (zero past `stem.len()`); the caller sets
    /// `Meta::stem_len` in the same seqlock section.
    pub fn set_stem(&self, stem: &[u8]) {
        assert!(stem.len() <= MAX_STEM_BYTES, "stem of {} bytes", stem.len());
        let mut bytes = [0u8; MAX_STEM_BYTES];
        bytes[..stem.len()].copy_from_slice(stem);
        for (w, chunk) in self.stem.iter().zip(bytes.chunks_exact(8)) {
            w.store(
                u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
                Relaxed,
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Read views: search code is generic over heap node / disk image.

/// Why a search attempt stopped early.
#[derive(Debug)]
pub(crate) enum SearchErr {
    /// A heap node changed under the reader: start again from the root.
    Restart,
    Fail(Error),
}

impl From<Error> for SearchErr {
    fn from(e: Error) -> SearchErr {
        SearchErr::Fail(e)
    }
}

pub(crate) type SResult<T> = std::result::Result<T, SearchErr>;

/// Converts the result of a search that cannot restart (disk nodes, or the writer on its own
/// nodes) into a plain result.
pub(crate) fn no_restart<T>(r: SResult<T>) -> Result<T> {
    match r {
        Ok(v) => Ok(v),
        Err(SearchErr::Fail(e)) => Err(e),
        Err(SearchErr::Restart) => {
            unreachable!("immutable or writer-owned node asked for a restart")
        }
    }
}

/// A leaf, read field by field. Values from a heap leaf are trusted only after `validate`.
pub(crate) trait LeafRead {
    /// Number of entries, clamped to capacity so a torn read can't index out of bounds.
    fn count(&self) -> usize;
    fn prefix(&self, i: usize) -> u64;
    fn hash(&self, i: usize) -> u32;
    fn ptr(&self, i: usize) -> u64;
    /// Bytes of the stem, clamped to `MAX_STEM_BYTES`.
    fn stem_len(&self) -> usize;
    /// All `MAX_STEM_BYTES` stem bytes (the first `stem_len` are the stem).
    fn stem(&self) -> [u8; MAX_STEM_BYTES];
    /// Confirms every load made so far (heap: the version did not move).
    fn validate(&self) -> SResult<()>;
    /// A validated field is impossible: corruption for a disk image, a bug (panic) for a heap node.
    fn corrupt(&self, detail: &str) -> SearchErr;
}

/// An internal node, read field by field. Values from a heap node are trusted only after
/// `validate`.
pub(crate) trait InternalRead {
    fn level(&self) -> u8;
    /// Number of pivots, clamped to capacity.
    fn count(&self) -> usize;
    fn child(&self, i: usize) -> u64;
    /// Bytes of the stem, clamped to `MAX_INT_STEM_BYTES`.
    fn stem_len(&self) -> usize;
    /// All `MAX_INT_STEM_BYTES` stem bytes (the first `stem_len` are the stem).
    fn stem(&self) -> [u8; MAX_INT_STEM_BYTES];
    fn pivot_prefix(&self, i: usize) -> u64;
    fn pivot_desc(&self, i: usize) -> PivotDesc;
    /// Copies key-area bytes; a disk image with a range outside its used area is corrupt.
    fn area_read(&self, at: usize, out: &mut [u8]) -> SResult<()>;
    fn validate(&self) -> SResult<()>;
    fn corrupt(&self, detail: &str) -> SearchErr;
    /// Checks a validated child word: non-zero, and for a disk image a disk word.
    fn check_child(&self, word: u64) -> SResult<()>;
}

/// Copies inline pivot `i` (descriptor `d`, length at most `MAX_INLINE_PIVOT`) into `out`
/// as the node stores it and returns its length: the first 8 bytes from the stem and the
/// prefix (the stem's first `min(stem_len, 8)`, then the prefix's), the rest from the key
/// area. So the stem's bytes past the 8th and the prefix's past `8 - stem_len` are the
/// key area's too: a pivot that does not start with its stem, or whose prefix is not its
/// bytes after it, shows as a mismatch (`verify_structure`, `Tree::check`). On a reader's
/// heap view the bytes may be torn until validated; lengths are clamped.
pub(crate) fn inline_pivot<V: InternalRead>(
    v: &V,
    i: usize,
    d: PivotDesc,
    out: &mut [u8; MAX_INLINE_PIVOT],
) -> SResult<usize> {
    let len = (d.len_bytes as usize).min(MAX_INLINE_PIVOT);
    let stem_len = v.stem_len();
    let from_stem = stem_len.min(8);
    let mut head = [0u8; 16];
    head[..from_stem].copy_from_slice(&v.stem()[..from_stem]);
    head[from_stem..from_stem + 8].copy_from_slice(&v.pivot_prefix(i).to_be_bytes());
    let n = len.min(8);
    out[..n].copy_from_slice(&head[..n]);
    if len > 8 {
        v.area_read(d.area_at as usize, &mut out[8..len])?;
    }
    Ok(len)
}

/// A heap leaf seen by a reader (`version: Some`) or by the writer that owns it (`None`).
pub(crate) struct HeapLeaf<'a> {
    pub node: &'a LeafNode,
    pub version: Option<u64>,
}

impl LeafRead for HeapLeaf<'_> {
    fn count(&self) -> usize {
        (self.node.hdr.meta().count as usize).min(C_LEAF)
    }
    fn prefix(&self, i: usize) -> u64 {
        self.node.prefix[i].load(Relaxed)
    }
    fn hash(&self, i: usize) -> u32 {
        self.node.hash[i].load(Relaxed)
    }
    fn ptr(&self, i: usize) -> u64 {
        self.node.ptr[i].load(Relaxed)
    }
    fn stem_len(&self) -> usize {
        (self.node.hdr.meta().stem_len as usize).min(MAX_STEM_BYTES)
    }
    fn stem(&self) -> [u8; MAX_STEM_BYTES] {
        let mut out = [0u8; MAX_STEM_BYTES];
        for (chunk, w) in out.chunks_exact_mut(8).zip(&self.node.stem) {
            chunk.copy_from_slice(&w.load(Relaxed).to_le_bytes());
        }
        out
    }
    fn validate(&self) -> SResult<()> {
        match self.version {
            Some(v) if !self.node.hdr.read_valid(v) => Err(SearchErr::Restart),
            _ => Ok(()),
        }
    }
    fn corrupt(&self, detail: &str) -> SearchErr {
        panic!("index: heap leaf invariant broken: {detail}")
    }
}

/// A heap internal node seen by a reader (`version: Some`) or by its writer (`None`).
pub(crate) struct HeapInternal<'a> {
    pub node: &'a InternalNode,
    pub version: Option<u64>,
}

impl InternalRead for HeapInternal<'_> {
    fn level(&self) -> u8 {
        self.node.hdr.meta().level
    }
    fn count(&self) -> usize {
        (self.node.hdr.meta().count as usize).min(C_INT)
    }
    fn child(&self, i: usize) -> u64 {
        self.node.child[i].load(Acquire)
    }
    fn stem_len(&self) -> usize {
        (self.node.hdr.meta().stem_len as usize).min(MAX_INT_STEM_BYTES)
    }
    fn stem(&self) -> [u8; MAX_INT_STEM_BYTES] {
        // Atomic loads like every field: a reader's copy may be torn until validated.
        let mut out = [0u8; MAX_INT_STEM_BYTES];
        for (chunk, w) in out.chunks_exact_mut(8).zip(&self.node.hdr.w[W_STEM..]) {
            chunk.copy_from_slice(&w.load(Relaxed).to_le_bytes());
        }
        out
    }
    fn pivot_prefix(&self, i: usize) -> u64 {
        self.node.pivot_prefix[i].load(Relaxed)
    }
    fn pivot_desc(&self, i: usize) -> PivotDesc {
        PivotDesc::unpack(self.node.pivot_desc[i].load(Relaxed))
    }
    fn area_read(&self, at: usize, out: &mut [u8]) -> SResult<()> {
        self.node.area_read(at, out);
        Ok(())
    }
    fn validate(&self) -> SResult<()> {
        match self.version {
            Some(v) if !self.node.hdr.read_valid(v) => Err(SearchErr::Restart),
            _ => Ok(()),
        }
    }
    fn corrupt(&self, detail: &str) -> SearchErr {
        panic!("index: heap internal node invariant broken: {detail}")
    }
    fn check_child(&self, word: u64) -> SResult<()> {
        if word == 0 {
            return Err(self.corrupt("empty child slot"));
        }
        Ok(())
    }
}

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
                // A leaf's stem lives at its end; the header words stay zero.
                if img[INT_STEM_AT..INT_STEM_AT + MAX_INT_STEM_BYTES]
                    .iter()
                    .any(|&b| b != 0)
                {
                    return Err(bad("leaf with non-zero header words 5..7".to_string()));
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
                let past_stem = INT_STEM_AT + meta.stem_len as usize;
                if img[past_stem..INT_STEM_AT + MAX_INT_STEM_BYTES]
                    .iter()
                    .any(|&b| b != 0)
                {
                    return Err(bad(format!(
                        "non-zero bytes past the {}-byte stem",
                        meta.stem_len
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
        let stem = InternalRead::stem(self);
        if !buf[..len].starts_with(&stem[..stem_len]) {
            return Err(self.bad(format!("pivot {i} does not start with the node's stem")));
        }
        if super::key_prefix(&buf[stem_len..len]) != InternalRead::pivot_prefix(self, i) {
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
        out.copy_from_slice(&self.img[LEAF_STEM_AT..LEAF_STEM_AT + MAX_STEM_BYTES]);
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
    fn stem(&self) -> [u8; MAX_INT_STEM_BYTES] {
        let mut out = [0u8; MAX_INT_STEM_BYTES];
        out.copy_from_slice(&self.img[INT_STEM_AT..INT_STEM_AT + MAX_INT_STEM_BYTES]);
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
            stem: InternalRead::stem(&d)[..InternalRead::stem_len(&d)].to_vec(),
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
        node.set_stem(&InternalRead::stem(d)[..InternalRead::stem_len(d)]);
        node.hdr.set_meta(m);
        p
    }
}

/// Copies an immutable heap node (an older epoch) into a new heap node of `epoch`.
/// Children are shared, not copied.
pub(crate) fn heap_copy(src: NonNull<Header>, epoch: u64, region: RegionId) -> NonNull<Header> {
    // SAFETY: the caller passes a live node; it is immutable (older epoch), so plain
    // relaxed loads read a stable value.
    let m = unsafe { src.as_ref() }.meta();
    let n = m.count as usize;
    if m.is_leaf() {
        // SAFETY: kind checked above.
        let s = unsafe { as_leaf(src) };
        let p = alloc_leaf(epoch, region);
        // SAFETY: just allocated as a leaf.
        let d = unsafe { as_leaf(p) };
        for i in 0..n {
            d.prefix[i].store(s.prefix[i].load(Relaxed), Relaxed);
            d.ptr[i].store(s.ptr[i].load(Relaxed), Relaxed);
            d.hash[i].store(s.hash[i].load(Relaxed), Relaxed);
        }
        for (dw, sw) in d.stem.iter().zip(&s.stem) {
            dw.store(sw.load(Relaxed), Relaxed);
        }
        d.hdr.set_meta(m);
        p
    } else {
        // SAFETY: kind checked above.
        let s = unsafe { as_internal(src) };
        let p = alloc_internal(epoch, region, m.level);
        // SAFETY: just allocated as an internal node.
        let d = unsafe { as_internal(p) };
        for i in 0..=n {
            d.child[i].store(s.child[i].load(Relaxed), Relaxed);
        }
        for i in 0..n {
            d.pivot_prefix[i].store(s.pivot_prefix[i].load(Relaxed), Relaxed);
            d.pivot_desc[i].store(s.pivot_desc[i].load(Relaxed), Relaxed);
        }
        for (dw, sw) in d.area.iter().zip(s.area.iter()) {
            dw.store(sw.load(Relaxed), Relaxed);
        }
        for (dw, sw) in d.hdr.w[W_STEM..].iter().zip(&s.hdr.w[W_STEM..]) {
            dw.store(sw.load(Relaxed), Relaxed);
        }
        d.hdr.set_meta(m);
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
        for (i, w) in leaf.stem.iter().enumerate() {
            wr64(&mut img[..], LEAF_STEM_AT + 8 * i, w.load(Relaxed));
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
        for w in W_STEM..W_STEM + MAX_INT_STEM_BYTES / 8 {
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
    let stem = img[INT_STEM_AT..INT_STEM_AT + stem_len].to_vec();
    for i in 0..m.count as usize {
        let d = PivotDesc::unpack(rd64(img, INT_PIVOT_DESC_AT + 8 * i));
        let prefix = rd64(img, INT_PIVOT_PREFIX_AT + 8 * i);
        let first = if d.is_external() {
            let ptr = rd64(img, INT_AREA_AT + d.area_at as usize);
            super::key_prefix(&key_of(ptr))
        } else {
            let mut head = stem.clone();
            head.extend_from_slice(&prefix.to_be_bytes());
            super::key_prefix(&head[..(d.len_bytes as usize).min(8)])
        };
        wr64(img, INT_PIVOT_PREFIX_AT + 8 * i, first);
    }
    m.stem_len = 0;
    wr64(img, W_META * 8, m.pack());
    img[INT_STEM_AT..INT_STEM_AT + MAX_INT_STEM_BYTES].fill(0);
    let crc = image_crc(img);
    wr64(img, 0, crc as u64 | (NODE_MAGIC as u64) << 32);
}
