//! The volume: one file (or block device, or memory) holding superblocks, allocator
//! bitmaps, index nodes and log segments.
//!
//! Owns: the `Storage` trait and its backends, the read-only mapping of the file, the
//! superblock slot format. Does not own: what is stored where (that is `alloc`, `log`,
//! `index`, `commit`).
//!
//! Layout (block = 4 KiB, group = 32768 blocks = 128 MiB):
//!
//! ```text
//! group 0: [sb slot 0][sb slot 1][bitmap buddy A (2 blocks)][bitmap buddy B (2 blocks)][2 spare][data ...]
//! group g: [  reserved x2       ][bitmap buddy A (2 blocks)][bitmap buddy B (2 blocks)][2 spare][data ...]
//! ```

pub mod file;
pub mod mem;
mod mmap;
pub mod storage;
pub mod superblock;

use std::sync::Arc;

use crate::error::Result;
pub use file::FileStorage;
pub use mem::{FailingSync, MemStorage};
pub(crate) use mmap::MIN_RESERVATION_BYTES as DEFAULT_MAPPING_RESERVATION_BYTES;
pub use storage::Storage;

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
