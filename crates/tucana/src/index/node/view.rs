//! Read-only views of a node: search code is generic over heap node and disk image
//! (`LeafRead`, `InternalRead`, monomorphised for each), and a search on a changing heap
//! node may have to start again (`SearchErr::Restart`).
//!
//! Owns: the view traits, the heap views (`HeapLeaf`, `HeapInternal`) and assembling an
//! inline pivot from stem, prefix and key area. Does not own: the disk image's views (in
//! `image`, beside the checks that make them safe), what a search does (`search`).
//!
//! Thread safety: a reader's heap view (`version: Some`) loads fields with relaxed atomics
//! while the writer may change them; counts and stem lengths are clamped so a torn value
//! cannot index out of bounds, and nothing read is trusted before `validate`. The writer's
//! own view (`version: None`) never restarts. No `unsafe` here.

use std::sync::atomic::Ordering::*;

use super::{
    InternalNode, LeafNode, PivotDesc, C_INT, C_LEAF, INT_HEADER_STEM_BYTES, MAX_INLINE_PIVOT,
    MAX_INT_STEM_BYTES, MAX_STEM_BYTES, W_STEM,
};
use crate::error::{Error, Result};

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
    /// The `INT_HEADER_STEM_BYTES` stem bytes of the header (a stem's first ones, zero
    /// past it).
    fn stem_head(&self) -> [u8; INT_HEADER_STEM_BYTES];
    /// All `MAX_INT_STEM_BYTES` stem bytes (the first `stem_len` are the stem): the
    /// header's, then for a longer stem the same bytes of pivot 0 from the key area. A
    /// node whose stem is longer than its header holds without an inline pivot 0 long
    /// enough to hold the rest is corrupt.
    fn stem(&self) -> SResult<[u8; MAX_INT_STEM_BYTES]> {
        let mut out = [0u8; MAX_INT_STEM_BYTES];
        out[..INT_HEADER_STEM_BYTES].copy_from_slice(&self.stem_head());
        let tail: &mut [u8; INT_STEM_TAIL_BYTES] = (&mut out[INT_HEADER_STEM_BYTES..])
            .try_into()
            .expect("the stem's bytes past the header");
        self.stem_tail(tail)?;
        Ok(out)
    }
    /// Copies the stem's bytes past the header (`stem_len - INT_HEADER_STEM_BYTES` of
    /// them, none for a stem the header holds) from pivot 0 into `out`; returns how many.
    #[inline]
    fn stem_tail(&self, out: &mut [u8; INT_STEM_TAIL_BYTES]) -> SResult<usize> {
        let len = self.stem_len();
        if len <= INT_HEADER_STEM_BYTES {
            return Ok(0);
        }
        let d = self.pivot_desc(0);
        if self.count() == 0 || d.is_external() || (d.len_bytes as usize) < len {
            self.validate()?;
            return Err(self.corrupt(&format!(
                "a {len}-byte stem without an inline pivot 0 that long to hold it"
            )));
        }
        // The key area holds an inline pivot's bytes from its 8th on.
        let n = len - INT_HEADER_STEM_BYTES;
        self.area_read(
            d.area_at as usize + INT_HEADER_STEM_BYTES - 8,
            &mut out[..n],
        )?;
        Ok(n)
    }
    fn pivot_prefix(&self, i: usize) -> u64;
    fn pivot_desc(&self, i: usize) -> PivotDesc;
    /// Copies key-area bytes; a disk image with a range outside its used area is corrupt.
    fn area_read(&self, at: usize, out: &mut [u8]) -> SResult<()>;
    fn validate(&self) -> SResult<()>;
    fn corrupt(&self, detail: &str) -> SearchErr;
    /// Checks a validated child word: non-zero, and for a disk image a disk word.
    fn check_child(&self, word: u64) -> SResult<()>;
}

/// Most stem bytes an internal node keeps past its header (in pivot 0).
pub(crate) const INT_STEM_TAIL_BYTES: usize = MAX_INT_STEM_BYTES - INT_HEADER_STEM_BYTES;

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
    head[..from_stem].copy_from_slice(&v.stem_head()[..from_stem]);
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
        // Only the words the stem reaches: most stems end in the first four (at the
        // node's end), and the header words past them are zero.
        let mut out = [0u8; MAX_STEM_BYTES];
        let words = self.stem_len().div_ceil(8);
        for (i, chunk) in out.chunks_exact_mut(8).take(words).enumerate() {
            chunk.copy_from_slice(&self.node.stem_word(i).load(Relaxed).to_le_bytes());
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
    fn stem_head(&self) -> [u8; INT_HEADER_STEM_BYTES] {
        // Atomic loads like every field: a reader's copy may be torn until validated.
        let mut out = [0u8; INT_HEADER_STEM_BYTES];
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
