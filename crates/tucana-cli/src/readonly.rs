//! Opening a volume for the commands that only read (`get`, `scan`, `stats`, `check`,
//! `keyspaces`) without changing its file: a storage backend that reads the file and
//! keeps whatever the engine writes in memory, dropped at exit.
//!
//! Why: opening a volume runs recovery and closing it commits, so each read-only call
//! used to advance the commit epoch by 2 and rewrite superblocks and index nodes; a
//! volume on read-only media, or owned by another user, could not even be inspected.
//! The engine has no read-only mode, so the CLI gives it a copy-on-write view: the file
//! is opened read-only and locked *shared* (several readers at once; a server or a
//! writing command, which lock it exclusively, make this fail with the engine's
//! `Locked`, and a reader makes them fail), pages the engine writes (recovery's replay
//! of a log written after the last commit, the commit at close) live in a map here and
//! are read back from it. So a volume that was not closed cleanly is still inspected as
//! recovery sees it, and the file is left as it was.
//!
//! Owns the overlay of written pages. Does not own the volume's format: every byte's
//! meaning is the engine's. Volumes over several members (`--member`) are opened as
//! before, read-write. A volume on a raw block device is read the same way (its length is
//! the device's).
//!
//! Thread-safety: the overlay is behind a mutex; the file is read with `pread`, which
//! needs no shared position, so any thread may call any method.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tucana::volume::Storage;
use tucana::{Database, Error, Result};

/// Granularity of the overlay: the engine's block size.
const PAGE_BYTES: u64 = 4096;

/// A volume file seen read-only, with the engine's writes kept in memory.
pub struct ReadOnlyFile {
    file: File,
    path: PathBuf,
    /// The file's length when opened.
    file_len: u64,
    /// A raw block device rather than a file.
    device: bool,
    overlay: Mutex<Overlay>,
}

#[derive(Default)]
struct Overlay {
    /// The volume's length as the engine sees it (it may grow the volume).
    len: u64,
    /// Pages written, by page number.
    pages: HashMap<u64, Box<[u8]>>,
}

/// Opens the volume at `path` for reading (see the module doc); `Err` as `Options::open`
/// would (naming the path), and for a member of a volume over several.
pub fn open(path: &Path, options: tucana::Options) -> Result<Database> {
    let storage = ReadOnlyFile::open(path)?;
    tucana::volume::members::refuse_lone_member(&storage, &path.display().to_string())?;
    options.open_storage(Arc::new(storage))
}

fn io_error(path: &Path, what: &str, e: io::Error) -> Error {
    Error::Io(io::Error::new(
        e.kind(),
        format!("{}: {what}: {e}", path.display()),
    ))
}

impl ReadOnlyFile {
    pub fn open(path: &Path) -> Result<ReadOnlyFile> {
        let file = File::open(path).map_err(|e| io_error(path, "open", e))?;
        match file.try_lock_shared() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(Error::Locked),
            Err(TryLockError::Error(e)) => return Err(io_error(path, "lock", e)),
        }
        let metadata = file.metadata().map_err(|e| io_error(path, "stat", e))?;
        let file_len = if metadata.file_type().is_block_device() {
            // A volume on a raw device spans the whole device, in whole blocks.
            tucana::volume::blockdev::device_len_bytes(&file)
                .map_err(|e| io_error(path, "BLKGETSIZE64", e))?
                / PAGE_BYTES
                * PAGE_BYTES
        } else if metadata.is_file() {
            metadata.len()
        } else {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file or block device", path.display()),
            )));
        };
        Ok(ReadOnlyFile {
            file,
            path: path.to_path_buf(),
            file_len,
            device: metadata.file_type().is_block_device(),
            overlay: Mutex::new(Overlay {
                len: file_len,
                pages: HashMap::new(),
            }),
        })
    }

    /// Fills `buf` with the file's bytes at `offset` (zeros past its end).
    fn read_file(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let in_file = self.file_len.saturating_sub(offset).min(buf.len() as u64) as usize;
        self.file
            .read_exact_at(&mut buf[..in_file], offset)
            .map_err(|e| io_error(&self.path, "read", e))?;
        buf[in_file..].fill(0);
        Ok(())
    }

    fn out_of_range(&self, offset: u64, len: usize, volume_len: u64) -> Error {
        Error::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "{}: {len} bytes at {offset} are past the volume's end ({volume_len})",
                self.path.display()
            ),
        ))
    }
}

impl Storage for ReadOnlyFile {
    fn kind(&self) -> tucana::volume::StorageKind {
        if self.device {
            tucana::volume::StorageKind::BlockDevice
        } else {
            tucana::volume::StorageKind::File
        }
    }

    fn len_bytes(&self) -> Result<u64> {
        Ok(self.overlay.lock().unwrap().len)
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        let mut overlay = self.overlay.lock().unwrap();
        overlay.len = overlay.len.max(len_bytes);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let overlay = self.overlay.lock().unwrap();
        let end = offset.saturating_add(buf.len() as u64);
        if end > overlay.len {
            return Err(self.out_of_range(offset, buf.len(), overlay.len));
        }
        let mut at = offset;
        while at < end {
            let page = at / PAGE_BYTES;
            let within = (at % PAGE_BYTES) as usize;
            let take = (PAGE_BYTES as usize - within).min((end - at) as usize);
            let dest = &mut buf[(at - offset) as usize..][..take];
            match overlay.pages.get(&page) {
                Some(bytes) => dest.copy_from_slice(&bytes[within..within + take]),
                None => self.read_file(at, dest)?,
            }
            at += take as u64;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut overlay = self.overlay.lock().unwrap();
        let end = offset.saturating_add(data.len() as u64);
        if end > overlay.len {
            return Err(self.out_of_range(offset, data.len(), overlay.len));
        }
        let mut at = offset;
        while at < end {
            let page = at / PAGE_BYTES;
            let within = (at % PAGE_BYTES) as usize;
            let take = (PAGE_BYTES as usize - within).min((end - at) as usize);
            let bytes = match overlay.pages.entry(page) {
                Entry::Occupied(entry) => entry.into_mut(),
                Entry::Vacant(entry) => {
                    let mut bytes = vec![0u8; PAGE_BYTES as usize].into_boxed_slice();
                    // A partial write keeps the rest of the page as it was.
                    if take < PAGE_BYTES as usize {
                        self.read_file(page * PAGE_BYTES, &mut bytes)?;
                    }
                    entry.insert(bytes)
                }
            };
            bytes[within..within + take].copy_from_slice(&data[(at - offset) as usize..][..take]);
            at += take as u64;
        }
        Ok(())
    }

    /// Nothing reaches the file, so there is nothing to make durable.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn space_used_bytes(&self) -> Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let metadata = self
            .file
            .metadata()
            .map_err(|e| io_error(&self.path, "stat", e))?;
        Ok(metadata.blocks() * 512)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_read_back_and_never_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let original: Vec<u8> = (0..3 * PAGE_BYTES).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &original).unwrap();
        let storage = ReadOnlyFile::open(&path).unwrap();
        // A write across a page boundary, then one past the file's end after a grow.
        storage.write_at(PAGE_BYTES - 2, &[9, 9, 9, 9]).unwrap();
        storage.grow(5 * PAGE_BYTES).unwrap();
        storage.write_at(4 * PAGE_BYTES + 1, &[7]).unwrap();
        let mut all = vec![0u8; 5 * PAGE_BYTES as usize];
        storage.read_at(0, &mut all).unwrap();
        let mut expected = original.clone();
        expected[(PAGE_BYTES - 2) as usize..(PAGE_BYTES + 2) as usize].fill(9);
        expected.resize(5 * PAGE_BYTES as usize, 0);
        expected[(4 * PAGE_BYTES + 1) as usize] = 7;
        assert_eq!(all, expected);
        assert!(storage.read_at(5 * PAGE_BYTES - 1, &mut [0; 2]).is_err());
        assert!(storage.write_at(5 * PAGE_BYTES, &[1]).is_err());
        drop(storage);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            original,
            "the file is untouched"
        );
    }

    #[test]
    fn a_writer_and_a_reader_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v");
        let db = Database::builder().open(&path).unwrap();
        assert!(matches!(ReadOnlyFile::open(&path), Err(Error::Locked)));
        db.close().unwrap();
        let reader = ReadOnlyFile::open(&path).unwrap();
        let second = ReadOnlyFile::open(&path).unwrap();
        assert!(matches!(
            Database::builder().open(&path),
            Err(Error::Locked)
        ));
        drop((reader, second));
    }
}
