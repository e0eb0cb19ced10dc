//! The volume: one file (or block device, or memory), or several members, holding
//! superblocks, allocator bitmaps, index nodes and log segments.
//!
//! Owns: the `Storage` trait and its backends, the read-only mapping of the file, the
//! superblock slot format, volumes over several members (`members.rs`, with the slot
//! header format in `slot_header.rs`). Does not own: what is stored where (that is `alloc`, `log`,
//! `index`, `commit`).
//!
//! Layout (block = 4 KiB, group = 32768 blocks = 128 MiB):
//!
//! ```text
//! group 0: [sb slot 0][sb slot 1][bitmap buddy A (2 blocks)][bitmap buddy B (2 blocks)][2 spare][data ...]
//! group g: [  reserved x2       ][bitmap buddy A (2 blocks)][bitmap buddy B (2 blocks)][2 spare][data ...]
//! ```

pub mod blockdev;
pub mod dispatch;
pub mod file;
pub mod mem;
mod member_stats;
pub mod members;
mod mmap;
pub mod slot_header;
pub mod storage;
pub mod superblock;
pub mod write_queue;

use std::sync::Arc;

use crate::error::Result;
use crate::types::{DiskOffset, BLOCK_BYTES};
pub use blockdev::BlockDevice;
pub use dispatch::DispatchPolicy;
pub use file::FileStorage;
pub use mem::{FailingSync, MemStorage};
pub use members::{AddedMember, MemberSet, MemberStats, Rebalanced, RemovedMember};
pub(crate) use mmap::MIN_RESERVATION_BYTES as DEFAULT_MAPPING_RESERVATION_BYTES;
use std::sync::atomic::Ordering;
pub use storage::{DeviceSpace, Storage, StorageKind};
pub use write_queue::QueueFigures;

/// Shared handle to the volume's storage with the engine's read helpers.
#[derive(Clone)]
pub struct Volume {
    storage: Arc<dyn Storage>,
}

impl Volume {
    pub fn new(storage: Arc<dyn Storage>) -> Volume {
        Volume { storage }
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Returns `len` bytes at `offset`: a slice of the mapping when the backend has one,
    /// else a copy read into `scratch`.
    ///
    /// # Safety
    /// As `Storage::mapped`: the range is committed or otherwise never written while
    /// the returned slice lives.
    pub unsafe fn view<'a>(
        &'a self,
        offset: u64,
        len: usize,
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8]> {
        // SAFETY: forwarded to the caller.
        if let Some(bytes) = unsafe { self.storage.mapped(offset, len) } {
            return Ok(bytes);
        }
        scratch.clear();
        scratch.resize(len, 0);
        self.storage.read_at(offset, scratch)?;
        Ok(&scratch[..])
    }
}

/// One block of memory aligned to a block: runs of them are what uncached (`O_DIRECT`)
/// writes take.
#[repr(C, align(4096))]
#[derive(Clone, Copy)]
pub(crate) struct AlignedBlock(pub(crate) [u8; BLOCK_BYTES as usize]);

const _: () = assert!(std::mem::size_of::<AlignedBlock>() == BLOCK_BYTES as usize);

/// Writes whole blocks (any order; index node images) with one write per run of adjacent
/// blocks, past the page cache (`Storage::write_uncached_at`): the index lives in memory
/// and only recovery reads its images, and a commit pair during GC rewrites every leaf
/// (copying them into the page cache took 40% of the committer's CPU). A backup writes
/// the nodes it is shipped the same way.
pub(crate) fn write_block_runs<'a>(
    storage: &dyn crate::volume::Storage,
    images: impl Iterator<Item = (DiskOffset, &'a [u8; BLOCK_BYTES as usize])>,
    bytes_written: &std::sync::atomic::AtomicU64,
) -> crate::error::Result<()> {
    let mut images: Vec<(DiskOffset, &[u8; BLOCK_BYTES as usize])> = images.collect();
    images.sort_by_key(|(off, _)| *off);
    let mut i = 0;
    let mut run: Vec<AlignedBlock> = Vec::new();
    while i < images.len() {
        let start = images[i].0;
        run.clear();
        let j = adjacent_run_end(&images, i, usize::MAX);
        run.extend(images[i..j].iter().map(|(_, image)| AlignedBlock(**image)));
        let bytes = run_bytes(&run);
        storage.write_uncached_at(start.0, bytes)?;
        bytes_written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        i = j;
    }
    Ok(())
}

/// Blocks per job of `queue_block_runs` at most (1 MiB): a long run is cut, so that a
/// member's several workers can write its pieces at once.
const QUEUED_RUN_BLOCKS_MAX: usize = 256;

/// `write_block_runs` through the write queue: each run of adjacent blocks (cut at
/// `QUEUED_RUN_BLOCKS_MAX`) is copied into aligned memory and becomes a job on the member
/// that holds its start, so a commit's node runs are written in flight, on every member at
/// once, while the committer goes on; the caller must `wait_queued` before it syncs
/// (DESIGN.md, *Writes in flight*, node runs). Waits only while the queue's budget is
/// full. Errors: an earlier job's failure (reported by `reserve`); a failure of these
/// jobs is reported by the queue later, as a segment's is.
pub(crate) fn queue_block_runs<'a>(
    queue: &write_queue::WriteQueue,
    storage: &Arc<dyn Storage>,
    images: impl Iterator<Item = (DiskOffset, &'a [u8; BLOCK_BYTES as usize])>,
) -> Result<()> {
    let mut images: Vec<(DiskOffset, &[u8; BLOCK_BYTES as usize])> = images.collect();
    images.sort_by_key(|(off, _)| *off);
    let mut i = 0;
    while i < images.len() {
        let start = images[i].0;
        let j = adjacent_run_end(&images, i, QUEUED_RUN_BLOCKS_MAX);
        let run: Vec<AlignedBlock> = images[i..j]
            .iter()
            .map(|(_, image)| AlignedBlock(**image))
            .collect();
        let len_bytes = (j - i) as u64 * BLOCK_BYTES;
        let member = storage.member_of(start.0).unwrap_or(0);
        let reservation = queue.reserve(member, len_bytes, &|| true)?;
        let storage = Arc::clone(storage);
        queue.push(
            reservation,
            Box::new(move || {
                storage.write_uncached_at(start.0, run_bytes(&run))?;
                Ok(len_bytes)
            }),
        );
        i = j;
    }
    Ok(())
}

/// The end (exclusive) of the run of adjacent blocks starting at `images[i]` in sorted
/// `images`, at most `blocks_max` long.
fn adjacent_run_end(
    images: &[(DiskOffset, &[u8; BLOCK_BYTES as usize])],
    i: usize,
    blocks_max: usize,
) -> usize {
    let start = images[i].0;
    let mut j = i;
    while j < images.len()
        && j - i < blocks_max
        && images[j].0 .0 == start.0 + (j - i) as u64 * BLOCK_BYTES
    {
        j += 1;
    }
    j
}

/// A run of aligned blocks as bytes.
fn run_bytes(run: &[AlignedBlock]) -> &[u8] {
    // SAFETY: `AlignedBlock` is a byte array with no padding (its size is its
    // alignment, asserted above), so the run's elements are
    // `run.len() * { BLOCK_BYTES as usize }` initialized bytes, borrowed no longer than `run`.
    unsafe { std::slice::from_raw_parts(run.as_ptr().cast::<u8>(), std::mem::size_of_val(run)) }
}
