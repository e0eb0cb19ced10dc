//! The memory backend: a volume in a `Vec<u8>`, for tests and the in-memory mode.
//!
//! Owns: the bytes and their length, I/O byte counters. Does not own: durability (there is
//! none: `sync` is a no-op and everything is lost on drop) nor a mapping (`mapped` returns
//! `None`, so readers copy with `read_at`; handing out slices into a `Vec` that `grow` may
//! reallocate would need the very care `mmap.rs` takes, for no gain in tests).
//!
//! Thread-safety: `Send + Sync`; the bytes sit behind a `RwLock`, so reads run in parallel
//! and writes, grows and punches take it exclusively.
//!
//! Memory: `grow` allocates the new buffer zeroed (`vec![0; n]`, which the allocator serves
//! from fresh, lazily zeroed pages for large sizes) and copies the old bytes, so a volume
//! grown to many allocation groups costs memory only for the pages written.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::volume::Storage;

/// A volume held in memory. See the module doc.
pub struct MemStorage {
    bytes: RwLock<Vec<u8>>,
    written_bytes: AtomicU64,
    read_bytes: AtomicU64,
}

impl MemStorage {
    /// An empty volume (length 0).
    pub fn new() -> MemStorage {
        MemStorage {
            bytes: RwLock::new(Vec::new()),
            written_bytes: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
        }
    }

    /// Bytes moved by `write_at` and `read_at` since creation: `(written, read)`.
    pub fn io_bytes(&self) -> (u64, u64) {
        (
            self.written_bytes.load(Ordering::Relaxed),
            self.read_bytes.load(Ordering::Relaxed),
        )
    }
}

impl Default for MemStorage {
    fn default() -> MemStorage {
        MemStorage::new()
    }
}

/// `offset..offset+len` as a `usize` range when it lies inside `len_bytes`.
fn range_inside(offset: u64, len: usize, len_bytes: usize) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(len)?;
    (end <= len_bytes).then_some(start..end)
}

impl Storage for MemStorage {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.bytes.read().len() as u64)
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        let new_len = usize::try_from(len_bytes).map_err(|_| {
            Error::Io(std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("an in-memory volume cannot hold {len_bytes} bytes"),
            ))
        })?;
        let mut bytes = self.bytes.write();
        if new_len <= bytes.len() {
            return Ok(());
        }
        // Not `resize`: that writes every new zero and so commits memory the volume may
        // never use. A fresh zeroed allocation stays untouched until written.
        let mut grown = vec![0u8; new_len];
        grown[..bytes.len()].copy_from_slice(&bytes);
        *bytes = grown;
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let bytes = self.bytes.read();
        let Some(range) = range_inside(offset, buf.len(), bytes.len()) else {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at {offset:#x} past the end of the in-memory volume ({} bytes)",
                    buf.len(),
                    bytes.len()
                ),
            )));
        };
        buf.copy_from_slice(&bytes[range]);
        self.read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut bytes = self.bytes.write();
        let len_bytes = bytes.len();
        // The engine writes only inside space it has grown: anything else is a bug.
        let range = range_inside(offset, data.len(), len_bytes).unwrap_or_else(|| {
            panic!(
                "write of {} bytes at {offset:#x} past the end of the volume ({len_bytes} bytes)",
                data.len()
            )
        });
        bytes[range].copy_from_slice(data);
        self.written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        // Zero the part inside the volume, as a file system that punches holes would.
        let mut bytes = self.bytes.write();
        let len_bytes = bytes.len() as u64;
        let start = offset.min(len_bytes);
        let end = offset.saturating_add(len).min(len_bytes);
        // Both are at most `bytes.len()`, so they fit in `usize`.
        bytes[start as usize..end as usize].fill(0);
        Ok(())
    }

    fn io_bytes(&self) -> (u64, u64) {
        MemStorage::io_bytes(self)
    }

    fn kind(&self) -> crate::volume::StorageKind {
        crate::volume::StorageKind::Memory
    }
}

/// Memory storage whose `sync` fails while it is set broken: for tests of what a failed
/// sync does (the store poisons itself; a server turns the affected replies into errors).
pub struct FailingSync {
    inner: MemStorage,
    broken: AtomicBool,
}

impl FailingSync {
    /// An empty volume whose syncs succeed until [`FailingSync::set_broken`].
    pub fn new() -> FailingSync {
        FailingSync {
            inner: MemStorage::new(),
            broken: AtomicBool::new(false),
        }
    }

    /// From now on every `sync` fails (`true`) or works again (`false`).
    pub fn set_broken(&self, broken: bool) {
        self.broken.store(broken, Ordering::SeqCst);
    }
}

impl Default for FailingSync {
    fn default() -> FailingSync {
        FailingSync::new()
    }
}

impl Storage for FailingSync {
    fn len_bytes(&self) -> Result<u64> {
        self.inner.len_bytes()
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        self.inner.grow(len_bytes)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.inner.write_at(offset, data)
    }

    fn sync(&self) -> Result<()> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::other("injected sync failure")));
        }
        self.inner.sync()
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.punch_hole(offset, len)
    }

    fn io_bytes(&self) -> (u64, u64) {
        self.inner.io_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_grow_round_trip() {
        let storage = MemStorage::default();
        assert_eq!(storage.len_bytes().unwrap(), 0);
        storage.grow(8192).unwrap();
        storage.grow(100).unwrap();
        assert_eq!(storage.len_bytes().unwrap(), 8192);
        storage.write_at(4090, b"straddle").unwrap();
        storage.sync().unwrap();

        // Growth keeps the old bytes and adds zeros.
        storage.grow(3 * 4096).unwrap();
        let mut buf = [0u8; 8];
        storage.read_at(4090, &mut buf).unwrap();
        assert_eq!(&buf, b"straddle");
        let mut zeros = [1u8; 4096];
        storage.read_at(8192, &mut zeros).unwrap();
        assert_eq!(zeros, [0u8; 4096]);
        assert_eq!(storage.io_bytes(), (8, 8 + 4096));
        assert_eq!(Storage::io_bytes(&storage), (8, 8 + 4096));
    }

    #[test]
    fn reading_past_the_end_is_an_error() {
        let storage = MemStorage::new();
        let mut buf = [0u8; 4];
        assert!(storage.read_at(0, &mut buf).is_err());
        storage.grow(4096).unwrap();
        assert!(storage.read_at(4093, &mut buf).is_err());
        assert!(storage.read_at(u64::MAX, &mut buf).is_err());
        storage.read_at(4092, &mut buf).unwrap();
        storage.read_at(4096, &mut []).unwrap();
    }

    #[test]
    #[should_panic(expected = "past the end of the volume")]
    fn writing_past_the_end_is_a_programmer_error() {
        let storage = MemStorage::new();
        storage.grow(4096).unwrap();
        let _ = storage.write_at(4096, b"x");
    }

    #[test]
    fn has_no_mapping() {
        let storage = MemStorage::new();
        storage.grow(4096).unwrap();
        // SAFETY: nothing writes while the (absent) slice lives.
        assert_eq!(unsafe { storage.mapped(0, 10) }, None);
    }

    #[test]
    fn punch_hole_zeros_the_range_inside_the_volume() {
        let storage = MemStorage::new();
        storage.grow(8192).unwrap();
        storage.write_at(0, &[0xFF; 8192]).unwrap();
        storage.punch_hole(4096, 1 << 40).unwrap();
        assert_eq!(storage.len_bytes().unwrap(), 8192);
        let mut buf = [0u8; 8192];
        storage.read_at(0, &mut buf).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0xFF));
        assert!(buf[4096..].iter().all(|&b| b == 0));
        storage.punch_hole(u64::MAX, 10).unwrap();
    }

    #[test]
    fn is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<MemStorage>();
    }
}
