//! Heap nodes: the seqlock on a node's version word, allocation from the node arena and
//! freeing, the writer's stores of multi-word fields (key area, stems), and copies of an
//! immutable node into a new epoch.
//!
//! Owns: the heap node's lifetime from `alloc_leaf`/`alloc_internal` to `free_node`, and
//! the protocol that makes relaxed loads of a changing node safe to use. Does not own: when
//! a node may be freed (`tree`), the memory behind it (`arena`), disk images (`image`).
//!
//! Thread safety: see the module doc of `node`. Readers call `read_begin`/`read_valid`;
//! only the tree's single writer calls `write_begin`/`write_end` and the field writers,
//! and only on nodes it owns. The `unsafe` here is the casts from a node's header to its
//! full type (`as_leaf`, `as_internal`), whose callers vouch that the node is live and of
//! that kind, and the hand-off of a slot back to the arena.

use std::mem::size_of;
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering::*};

use super::{
    Header, InternalNode, LeafNode, Meta, INT_HEADER_STEM_BYTES, KEY_AREA_BYTES, KIND_INTERNAL,
    KIND_LEAF, LEAF_STEM_WORDS, MAX_INT_STEM_BYTES, MAX_STEM_BYTES, W_DISK, W_EPOCH, W_META,
    W_REGION, W_STEM, W_VERSION,
};
use crate::types::RegionId;

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
    const { assert!(size_of::<T>() == crate::index::arena::SLOT_BYTES) };
    // A slot is 4096-byte aligned, more than any node type needs (64), and all-zero bytes
    // are a valid value of a node (it is only atomics).
    crate::index::arena::alloc_slot().cast::<T>()
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
    unsafe { crate::index::arena::free_slot(p.cast()) }
}

/// Frees heap nodes, under one lock of the arena.
///
/// # Safety
/// As [`free_node`], for each node.
pub(crate) unsafe fn free_nodes(nodes: impl IntoIterator<Item = NonNull<Header>>) {
    // SAFETY: the caller's promise, node by node.
    unsafe { crate::index::arena::free_slots(nodes.into_iter().map(NonNull::cast)) }
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
        // Only a range past the area's end (a torn descriptor) leaves bytes to clear; the
        // test keeps the common read from calling `memset` for nothing, which costs more
        // than the few bytes a pivot compare reads (`search::cmp_pivot`).
        if o < out.len() {
            out[o..].fill(0);
        }
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

    /// Writer: stores the stem's first `INT_HEADER_STEM_BYTES` in header words 5..7 (zero
    /// past `stem.len()`); the caller sets `Meta::stem_len` and the prefixes in the same
    /// seqlock section, and for a longer stem makes sure pivot 0 is inline (it holds the
    /// rest).
    pub fn set_stem(&self, stem: &[u8]) {
        assert!(
            stem.len() <= MAX_INT_STEM_BYTES,
            "internal stem of {} bytes",
            stem.len()
        );
        let head = stem.len().min(INT_HEADER_STEM_BYTES);
        let mut bytes = [0u8; INT_HEADER_STEM_BYTES];
        bytes[..head].copy_from_slice(&stem[..head]);
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
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            self.stem_word(i).store(
                u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
                Relaxed,
            );
        }
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
        for i in 0..LEAF_STEM_WORDS {
            d.stem_word(i).store(s.stem_word(i).load(Relaxed), Relaxed);
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
