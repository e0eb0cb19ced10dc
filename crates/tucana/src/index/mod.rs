//! The index of a region: an in-memory B-tree of log pointers (Tucana §3.1) with
//! copy-on-write by tree epoch (§3.3) and readers that never block (§3.4).
//!
//! **Owns.** The node format (heap nodes and disk images share it byte for byte, see
//! `node`), search, insert and remove with top-down splits, sealing an epoch, building disk
//! images of a sealed tree ([`Tree::persist`]), and keeping replaced nodes alive until no
//! commit, snapshot or reader can reach them ([`Tree::reclaim`]).
//!
//! **Does not own.** Keys and values live in the region's log; leaves hold an 8-byte prefix,
//! a 4-byte hash and an 8-byte log pointer per key, and full keys are read through [`Ctx`]
//! only when prefixes tie. Block allocation, writing images, the free log, and deciding when
//! to seal, persist or reclaim belong to the commit.
//!
//! **Thread safety.**
//! - One writer per tree: [`Tree::insert`], [`Tree::remove`], [`Tree::seal`] take `&self`
//!   and must be serialised by the caller (the region's writer lock); overlapping calls
//!   panic. Nodes of the running epoch are changed in place inside a per-node seqlock;
//!   nodes of older epochs and disk nodes are copied first and the old one retired.
//! - Readers ([`Tree::get`], [`Tree::copy_leaf`]) run on any thread and never block: they
//!   validate node versions (optimistic lock coupling) and restart from the root if a node
//!   they read changed. They must hold a `crossbeam_epoch` guard for the whole call.
//! - [`Tree::persist`] (commit thread) only reads sealed, immutable nodes and records each
//!   node's assigned block; [`Tree::reclaim`] and [`Tree::retired_disk_blocks`] may run on
//!   any thread.
//! - A reader may use a sealed root while the writer goes on; the nodes stay alive until
//!   `reclaim` is told that no snapshot and no commit needs that epoch.
//!
//! **Files.**
//! - `node/`: the node format. `mod.rs` the layout and the header, descriptor and child
//!   words; `heap.rs` heap nodes (seqlock, allocation, field writers, copies); `view.rs`
//!   read views over heap nodes and disk images; `image.rs` disk images (checks, codec).
//! - `arena.rs`: 4 KiB slots in huge pages for heap nodes.
//! - `search.rs`: search inside one node: child choice, leaf lookup, insert position.
//! - `tree/`: the tree of a region. `mod.rs` its state and shared types; `write.rs` the
//!   writer's changes and copy-on-write; `split.rs` splits and stems; `read.rs` readers'
//!   descents; `persist.rs` disk images of sealed trees, retired nodes, reclaim;
//!   `check.rs` full verification against the log.
//! - `tests.rs`: the tree against a `BTreeMap` model, with a fake [`Ctx`].
//!
//! **Not yet.** Nodes never merge: removes delete leaf entries, and a leaf they empty leaves
//! the tree (with any ancestor left childless), but half-empty leaves stay until a future
//! rebalancing. Disk nodes are checksummed on every read (about 4 KiB of
//! crc32c per disk node visited); a cache of verified blocks would remove that cost.

mod arena;
mod node;
mod search;
mod tree;

#[cfg(test)]
mod tests;

pub use node::image::{image_contents, rewrite_image, verify_image, ImageContents, ImagePivot};
pub use node::{C_INT, C_LEAF, KEY_AREA_BYTES, MAX_INLINE_PIVOT, NODE_BYTES};
pub use tree::{
    Finger, HeapNode, LeafCopy, Retired, RetiredNode, Sealed, Seek, Tree, TreeCheck, WriteCounts,
};

use crate::error::Result;
use crate::types::DiskOffset;

/// What the tree needs from the rest of the engine. Implemented by the region (log + volume).
pub trait Ctx {
    /// Compares the full key of the log record at `ptr` with `key` (`record_key.cmp(key)`).
    fn key_cmp(&self, ptr: u64, key: &[u8]) -> Result<std::cmp::Ordering>;
    /// Copies the full key of the record at `ptr` into `out` (cleared first).
    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()>;
    /// Calls `f` with the 4096-byte committed image of the node at `off` (mapped or read).
    fn with_node<R>(&self, off: DiskOffset, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R>;
}

/// The 4-byte hash kept per leaf entry: crc32c of the key (hardware accelerated).
pub fn key_hash(key: &[u8]) -> u32 {
    crc32c::crc32c(key)
}

/// The 8-byte prefix kept per leaf entry and pivot: the key's first 8 bytes, big-endian,
/// zero padded. Non-decreasing in key order; equal prefixes need a full compare.
pub fn key_prefix(key: &[u8]) -> u64 {
    // Most keys have 8 bytes or more: one load. The copy of a variable length below is a
    // `memcpy` call, and this runs at every node of every descent.
    if let Some(head) = key.first_chunk::<8>() {
        return u64::from_be_bytes(*head);
    }
    let mut b = [0u8; 8];
    b[..key.len()].copy_from_slice(key);
    u64::from_be_bytes(b)
}

/// Calls `f` with the offset of every node of the committed tree of region `region` at
/// `root` (none for `DiskOffset::NONE`), reading each internal node's image with `read`
/// (one block, verified as it is decoded): what a dropped region frees.
pub fn committed_nodes(
    root: DiskOffset,
    region: crate::types::RegionId,
    read: &mut dyn FnMut(DiskOffset, &mut [u8]) -> Result<()>,
    f: &mut dyn FnMut(DiskOffset),
) -> Result<()> {
    if root.is_none() {
        return Ok(());
    }
    let mut stack = vec![root];
    let mut image = vec![0u8; NODE_BYTES];
    while let Some(off) = stack.pop() {
        f(off);
        read(off, &mut image)?;
        if let ImageContents::Internal { children, .. } = image_contents(&image, off, region)? {
            stack.extend(children);
        }
    }
    Ok(())
}
