//! The file backend: a volume in one file, read and written with `pread`/`pwrite`, read
//! zero-copy through a read-only mapping; index node images go past the page cache through
//! a second, `O_DIRECT` descriptor of the same file (`Storage::write_uncached_at`), and
//! records copied while the data set is larger than memory are read through a third,
//! read-only descriptor advised `POSIX_FADV_RANDOM` (`Storage::read_random_at`).
//!
//! Owns: opening (and creating) the volume file, the exclusive lock that makes this handle
//! the file's only writer, the file's length (it only grows), durability (`sync_data`),
//! hole punching, and I/O byte counters. Does not own: the mapping's unsafe code (that is
//! `mmap.rs`) nor what the bytes mean.
//!
//! Thread-safety: `Send + Sync`; every method takes `&self`. Reads and writes of disjoint
//! ranges run in parallel (positional I/O has no shared cursor); `grow` calls serialise on
//! a mutex. The length is an atomic published after the file was extended and mapped, so
//! a reader that sees a length can read (and, unless remapping failed, map) that far.
//!
//! Locking: `open` takes an exclusive `flock` (`File::try_lock`) for the life of the
//! handle. flock locks belong to the open file description, so a second `open` of the same
//! path fails with `Error::Locked` even inside this process, which is what the mapping's
//! soundness argument needs (no other handle writes or shrinks the file).

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::types::BLOCK_BYTES;
use crate::volume::mmap::{GrowingMap, MIN_RESERVATION_BYTES};
use crate::volume::Storage;

/// A volume stored in one file. See the module doc.
pub struct FileStorage {
    // Declared before `file` so the mapping is gone before the file (and its lock) is
    // closed.
    map: GrowingMap,
    file: File,
    /// The same file opened with `O_DIRECT`, for `write_uncached_at`; `None` where the
    /// file system refuses it (tmpfs) or after a direct write was refused.
    direct: Option<File>,
    /// Cleared when a direct write fails with `EINVAL` (an alignment this file system
    /// wants and we do not meet): later uncached writes go through the page cache.
    direct_ok: std::sync::atomic::AtomicBool,
    /// The same file opened read-only and advised `POSIX_FADV_RANDOM` (no readahead), for
    /// `read_random_at`; `None` where it could not be opened (then `file` serves). A
    /// descriptor of its own because the advice belongs to the open file description,
    /// and `file`'s large reads (GC's victims, recovery) want readahead.
    random: Option<File>,
    path: PathBuf,
    /// The file's length; changed only by `grow`, under `grow_lock`, after `set_len`.
    len_bytes: AtomicU64,
    grow_lock: Mutex<()>,
    written_bytes: AtomicU64,
    read_bytes: AtomicU64,
}

impl FileStorage {
    /// Opens the volume file at `path` for reading and writing and locks it.
    ///
    /// With `create_if_missing`, a missing file (and missing parent directories) is created
    /// empty, and the new directory entries are synced so the file survives a crash.
    ///
    /// Errors: `Error::Io` naming the path (NotFound when the file is missing and may not
    /// be created, PermissionDenied for a read-only file, ...); `Error::Locked` when another
    /// handle — in this or another process — holds the volume.
    pub fn open(path: &Path, create_if_missing: bool) -> Result<FileStorage> {
        FileStorage::open_with_min_reservation(path, create_if_missing, MIN_RESERVATION_BYTES)
    }

    /// As `open`, with a chosen floor for the mapping's reservation
    /// (`Options::mapping_reservation_bytes`; tests use a small one to exercise
    /// remapping).
    pub(crate) fn open_with_min_reservation(
        path: &Path,
        create_if_missing: bool,
        min_reservation_bytes: u64,
    ) -> Result<FileStorage> {
        let file = open_file(path, create_if_missing)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(Error::Locked),
            Err(TryLockError::Error(e)) => return Err(with_path(path, "lock", e)),
        }
        let metadata = file.metadata().map_err(|e| with_path(path, "stat", e))?;
        if !metadata.is_file() {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file", path.display()),
            )));
        }
        let len_bytes = metadata.len();
        let map = GrowingMap::with_min_reservation(&file, len_bytes, min_reservation_bytes)?;
        let direct = open_direct(path);
        let random = open_random(path);
        Ok(FileStorage {
            map,
            file,
            direct_ok: std::sync::atomic::AtomicBool::new(direct.is_some()),
            direct,
            random,
            path: path.to_path_buf(),
            len_bytes: AtomicU64::new(len_bytes),
            grow_lock: Mutex::new(()),
            written_bytes: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
        })
    }

    /// The path the volume was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes moved by `write_at` and `read_at` since `open`: `(written, read)`.
    pub fn io_bytes(&self) -> (u64, u64) {
        (
            self.written_bytes.load(Ordering::Relaxed),
            self.read_bytes.load(Ordering::Relaxed),
        )
    }

    /// `read_at` through `file` (this handle's main descriptor or its random-read one).
    fn read_through(&self, file: &File, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len_bytes = self.len_bytes.load(Ordering::Acquire);
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > len_bytes)
        {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: read of {} bytes at {offset:#x} past the end of the volume ({len_bytes} bytes)",
                    self.path.display(),
                    buf.len()
                ),
            )));
        }
        file.read_exact_at(buf, offset)
            .map_err(|e| with_path(&self.path, "read", e))?;
        self.read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Panics unless `offset..offset+len` lies inside the volume: the engine writes only
    /// inside space it has grown, so anything else is a bug, not bad data.
    fn assert_inside(&self, offset: u64, len: usize) {
        let len_bytes = self.len_bytes.load(Ordering::Acquire);
        let end = offset.checked_add(len as u64);
        assert!(
            end.is_some_and(|end| end <= len_bytes),
            "write of {len} bytes at {offset:#x} past the end of the volume ({len_bytes} bytes)"
        );
    }
}

impl Storage for FileStorage {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.len_bytes.load(Ordering::Acquire))
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        let _guard = self.grow_lock.lock();
        if len_bytes <= self.len_bytes.load(Ordering::Acquire) {
            return Ok(());
        }
        // The new bytes read as zeros (a sparse extension); `sync` (fdatasync) makes the
        // new length durable together with the data written into it.
        self.file
            .set_len(len_bytes)
            .map_err(|e| with_path(&self.path, "grow", e))?;
        // Map before publishing the length, so that `mapped` covers every range below a
        // length a reader has seen. If mapping fails the volume has still grown: reads of
        // the new range fall back from `mapped` to `read_at`, and the caller hears of it.
        let mapped = self.map.grew(&self.file, len_bytes);
        self.len_bytes.store(len_bytes, Ordering::Release);
        mapped
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_through(&self.file, offset, buf)
    }

    fn read_random_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_through(self.random.as_ref().unwrap_or(&self.file), offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.assert_inside(offset, data.len());
        self.file
            .write_all_at(data, offset)
            .map_err(|e| with_path(&self.path, "write", e))?;
        self.written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn write_uncached_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let aligned = offset.is_multiple_of(BLOCK_BYTES)
            && (data.len() as u64).is_multiple_of(BLOCK_BYTES)
            && (data.as_ptr() as usize).is_multiple_of(BLOCK_BYTES as usize);
        let direct = self
            .direct
            .as_ref()
            .filter(|_| aligned && self.direct_ok.load(Ordering::Relaxed));
        let Some(direct) = direct else {
            return self.write_at(offset, data);
        };
        self.assert_inside(offset, data.len());
        // The kernel writes back and drops any cached page of the range first, so the
        // mapping and `read_at` see these bytes afterwards; `sync` (fdatasync on the other
        // descriptor of the same file) makes them durable like any other write.
        match direct.write_all_at(data, offset) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // Nothing was written (the request was refused before any I/O): this file
                // system wants another alignment. The page cache from now on.
                self.direct_ok.store(false, Ordering::Relaxed);
                return self.write_at(offset, data);
            }
            Err(e) => return Err(with_path(&self.path, "write", e)),
        }
        self.written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        // fdatasync also flushes the metadata needed to read the data back, which includes
        // the file length set by `grow`.
        self.file
            .sync_data()
            .map_err(|e| with_path(&self.path, "sync", e))
    }

    unsafe fn mapped(&self, offset: u64, len: usize) -> Option<&[u8]> {
        // SAFETY: the caller's guarantee (`Storage::mapped`) is exactly what
        // `GrowingMap::slice` requires; this handle holds the volume's exclusive lock and
        // never shrinks the file.
        unsafe { self.map.slice(offset, len) }
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        punch_hole(&self.file, offset, len).map_err(|e| with_path(&self.path, "punch hole", e))
    }

    fn prefetch(&self, offset: u64, len_bytes: u64) {
        if len_bytes > 0 {
            prefetch(&self.file, offset, len_bytes);
        }
    }

    fn start_writeback(&self, offset: u64, len_bytes: u64) {
        if len_bytes > 0 {
            start_writeback(&self.file, offset, len_bytes);
        }
    }

    fn write_back_and_wait(&self, offset: u64, len_bytes: u64) -> Result<()> {
        if len_bytes == 0 {
            return Ok(());
        }
        write_back_and_wait(&self.file, offset, len_bytes)
            .map_err(|e| with_path(&self.path, "sync_file_range", e))
    }

    fn resident(&self, offset: u64) -> Option<bool> {
        // mincore through the mapping: for a file we own it reports the page cache.
        self.map.resident(offset)
    }

    fn space_used_bytes(&self) -> Result<u64> {
        let metadata = self
            .file
            .metadata()
            .map_err(|e| with_path(&self.path, "stat", e))?;
        // `st_blocks` counts 512-byte units whatever the file system's block size.
        Ok(metadata.blocks().saturating_mul(512))
    }

    fn io_bytes(&self) -> (u64, u64) {
        FileStorage::io_bytes(self)
    }

    fn kind(&self) -> crate::volume::StorageKind {
        crate::volume::StorageKind::File
    }

    fn device_space(&self, member: usize) -> Option<crate::volume::DeviceSpace> {
        (member == 0).then(|| device_space(&self.file)).flatten()
    }
}

/// Opens `path` read+write, creating it (and its missing parent directories, all synced)
/// when allowed.
fn open_file(path: &Path, create_if_missing: bool) -> Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    match options.open(path) {
        Ok(file) => return Ok(file),
        Err(e) if e.kind() == io::ErrorKind::NotFound && create_if_missing => {}
        Err(e) => return Err(with_path(path, "open", e)),
    }

    // Directories that do not exist yet, innermost first; each needs its entry synced in
    // its parent once created.
    let mut missing_dirs = Vec::new();
    let mut ancestor = path.parent();
    while let Some(dir) = ancestor.filter(|dir| !dir.as_os_str().is_empty() && !dir.exists()) {
        missing_dirs.push(dir);
        ancestor = dir.parent();
    }
    if let Some(&innermost) = missing_dirs.first() {
        std::fs::create_dir_all(innermost)
            .map_err(|e| with_path(innermost, "create directory", e))?;
    }
    // `truncate(false)`: if another process created the file in the meantime, keep it.
    let file = options
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| with_path(path, "create", e))?;

    // Make the new file's entry, and the entries of the directories created for it,
    // durable: fsync of a file does not cover its name in the parent directory.
    sync_dir(parent_or_dot(path))?;
    for dir in &missing_dirs {
        sync_dir(parent_or_dot(dir))?;
    }
    Ok(file)
}

/// The volume file opened a second time with `O_DIRECT`, or `None` where the platform or
/// file system does not offer it (then uncached writes are ordinary ones).
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Opens `path` read-only for `read_random_at`, advised `POSIX_FADV_RANDOM`: a read through
/// it brings in exactly the pages it names, in one request, and no readahead around them.
#[cfg(target_os = "linux")]
fn open_random(path: &Path) -> Option<File> {
    use std::os::fd::AsRawFd;
    let file = OpenOptions::new().read(true).open(path).ok()?;
    // SAFETY: posix_fadvise takes a descriptor we own for the duration of the call and
    // plain integers; it touches no memory of ours. A failure only leaves readahead on.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    Some(file)
}

#[cfg(not(target_os = "linux"))]
fn open_random(_path: &Path) -> Option<File> {
    None
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}

fn parent_or_dot(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| with_path(dir, "sync directory", e))
}

/// An `Error::Io` of the same kind whose message names the path and the operation.
pub(super) fn with_path(path: &Path, operation: &str, e: io::Error) -> Error {
    Error::Io(io::Error::new(
        e.kind(),
        format!("{}: {operation}: {e}", path.display()),
    ))
}

#[cfg(target_os = "linux")]
fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;

    let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "hole range beyond off_t");
    let offset = libc::off_t::try_from(offset).map_err(|_| too_large())?;
    let len = libc::off_t::try_from(len).map_err(|_| too_large())?;
    loop {
        // SAFETY: fallocate takes a file descriptor we own for the duration of the call
        // and plain integers; it touches no memory of ours.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // The file system cannot punch holes: the space stays used, which is allowed.
            Some(libc::EOPNOTSUPP) => return Ok(()),
            _ => return Err(e),
        }
    }
}

/// Starts reading a range of the file into the page cache: `posix_fadvise(WILLNEED)`.
///
/// Why fadvise on the file rather than `madvise(MADV_WILLNEED)` on the mapping: on Linux
/// both end in the same page-cache readahead of the file (madvise of a shared file mapping
/// calls the file's fadvise), but fadvise needs no mapping (reads that fell back to
/// `read_at` because a remap failed benefit too), no page-aligned address, and keeps
/// `mmap.rs` the only module with mapping code. The kernel submits the reads and returns
/// without waiting for them, so one thread puts many reads in flight. The mapping's
/// MADV_RANDOM only turns off readahead on faults; pages this brings in are found by the
/// faults that follow (minor faults).
#[cfg(target_os = "linux")]
pub(super) fn prefetch(file: &File, offset: u64, len_bytes: u64) {
    use std::os::fd::AsRawFd;

    let (Ok(offset), Ok(len)) = (
        libc::off_t::try_from(offset),
        libc::off_t::try_from(len_bytes),
    ) else {
        return;
    };
    // SAFETY: posix_fadvise takes a file descriptor we own for the duration of the call
    // and plain integers; it touches no memory of ours. Its result is ignored: a hint
    // that fails costs only the speed-up (the read that follows does the I/O itself).
    let _ =
        unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_WILLNEED) };
}

#[cfg(not(target_os = "linux"))]
pub(super) fn prefetch(_file: &File, _offset: u64, _len_bytes: u64) {}

#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len_bytes: u64) {
    use std::os::fd::AsRawFd;

    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len_bytes),
    ) else {
        return;
    };
    // SAFETY: sync_file_range takes a file descriptor we own for the duration of the call
    // and plain integers; it touches no memory of ours. SYNC_FILE_RANGE_WRITE only starts
    // writeback of dirty pages in the range and returns; its result is ignored (a hint:
    // the `sync` that makes these bytes durable reports any I/O error).
    let _ = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len_bytes: u64) {}

#[cfg(target_os = "linux")]
fn write_back_and_wait(file: &File, offset: u64, len_bytes: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;

    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len_bytes),
    ) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "range past what sync_file_range takes",
        ));
    };
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: sync_file_range takes a file descriptor we own for the duration of the call
    // and plain integers; it touches no memory of ours.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn write_back_and_wait(file: &File, _offset: u64, _len_bytes: u64) -> io::Result<()> {
    file.sync_data()
}

#[cfg(not(target_os = "linux"))]
fn punch_hole(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

/// The free and total bytes of the file system holding `file` (`fstatvfs`); `None` when
/// the call fails.
#[cfg(unix)]
// The fields are `u64` here, narrower on some other targets.
#[allow(clippy::unnecessary_cast)]
fn device_space(file: &File) -> Option<crate::volume::DeviceSpace> {
    use std::os::fd::AsRawFd;

    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: fstatvfs writes one `statvfs` into the pointer we pass, which points to
    // uninitialised memory of that type we own; the descriptor is ours for the call.
    let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: fstatvfs returned 0, so it filled the whole struct.
    let st = unsafe { st.assume_init() };
    let unit = st.f_frsize as u64;
    Some(crate::volume::DeviceSpace {
        available_bytes: (st.f_bavail as u64).saturating_mul(unit),
        total_bytes: (st.f_blocks as u64).saturating_mul(unit),
    })
}

#[cfg(not(unix))]
fn device_space(_file: &File) -> Option<crate::volume::DeviceSpace> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume_path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("volume.tucana")
    }

    #[test]
    fn read_write_grow_sync_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = volume_path(&dir);
        {
            let storage = FileStorage::open(&path, true).unwrap();
            assert_eq!(storage.len_bytes().unwrap(), 0);
            storage.grow(8192).unwrap();
            assert_eq!(storage.len_bytes().unwrap(), 8192);
            storage.write_at(4000, b"across a block edge").unwrap();
            storage.sync().unwrap();
            // Growing to a smaller length never shrinks.
            storage.grow(4096).unwrap();
            assert_eq!(storage.len_bytes().unwrap(), 8192);

            let mut buf = [0u8; 19];
            storage.read_at(4000, &mut buf).unwrap();
            assert_eq!(&buf, b"across a block edge");
            // New bytes read as zeros.
            let mut zeros = [1u8; 100];
            storage.read_at(8000, &mut zeros).unwrap();
            assert_eq!(zeros, [0u8; 100]);
            assert_eq!(storage.io_bytes(), (19, 119));
            assert_eq!(Storage::io_bytes(&storage), (19, 119));
        }
        // Reopen: the bytes and the length are on disk.
        let storage = FileStorage::open(&path, false).unwrap();
        assert_eq!(storage.len_bytes().unwrap(), 8192);
        let mut buf = [0u8; 19];
        storage.read_at(4000, &mut buf).unwrap();
        assert_eq!(&buf, b"across a block edge");
        assert_eq!(storage.path(), path);
    }

    #[test]
    fn reading_past_the_end_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FileStorage::open(&volume_path(&dir), true).unwrap();
        storage.grow(4096).unwrap();
        let mut buf = [0u8; 10];
        let err = storage.read_at(4090, &mut buf).unwrap_err();
        assert!(
            matches!(&err, Error::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{err}"
        );
        assert!(storage.read_at(u64::MAX - 2, &mut buf).is_err());
        // A read ending exactly at the end is fine.
        storage.read_at(4086, &mut buf).unwrap();
    }

    #[test]
    #[should_panic(expected = "past the end of the volume")]
    fn writing_past_the_end_is_a_programmer_error() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FileStorage::open(&volume_path(&dir), true).unwrap();
        storage.grow(4096).unwrap();
        let _ = storage.write_at(4095, b"xx");
    }

    #[test]
    fn missing_file_is_not_found_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = volume_path(&dir);
        let Err(err) = FileStorage::open(&path, false) else {
            panic!("opened a missing file");
        };
        match &err {
            Error::Io(e) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            other => panic!("expected NotFound, got {other}"),
        }
        assert!(err.to_string().contains("volume.tucana"), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn creates_missing_parent_directories() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a").join("b").join("volume.tucana");
        let storage = FileStorage::open(&path, true).unwrap();
        assert_eq!(storage.len_bytes().unwrap(), 0);
        assert!(path.is_file());
    }

    #[test]
    fn second_open_is_locked_even_in_the_same_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = volume_path(&dir);
        let first = FileStorage::open(&path, true).unwrap();
        assert!(matches!(
            FileStorage::open(&path, false),
            Err(Error::Locked)
        ));
        assert!(matches!(FileStorage::open(&path, true), Err(Error::Locked)));
        drop(first);
        // The lock goes with the handle.
        FileStorage::open(&path, false).unwrap();
    }

    #[test]
    fn mapped_view_sees_pwritten_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FileStorage::open(&volume_path(&dir), true).unwrap();
        // Nothing is mapped below an empty file.
        // SAFETY: nothing writes while these slices live.
        assert_eq!(unsafe { storage.mapped(0, 1) }, None);
        storage.grow(3 * 4096).unwrap();
        storage.write_at(5000, b"mapped").unwrap();
        // SAFETY: bytes 5000..5006 are not written again while the slice lives.
        let view = unsafe { storage.mapped(5000, 6) }.unwrap();
        assert_eq!(view, b"mapped");
        // SAFETY: as above; past the end is not mapped.
        assert_eq!(unsafe { storage.mapped(3 * 4096 - 2, 3) }, None);
        // Mapped views are not I/O.
        assert_eq!(storage.io_bytes(), (6, 0));
    }

    #[test]
    fn uncached_writes_replace_cached_bytes_for_every_reader() {
        #[repr(C, align(4096))]
        struct Pages([u8; 2 * 4096]);
        let dir = tempfile::tempdir().unwrap();
        let storage = FileStorage::open(&volume_path(&dir), true).unwrap();
        storage.grow(4 * 4096).unwrap();
        // Cached (and mapped) first: the uncached write must not leave these behind.
        storage.write_at(4096, &[1; 2 * 4096]).unwrap();
        // SAFETY: nothing writes while the view lives.
        assert!(unsafe { storage.mapped(4096, 2 * 4096) }
            .unwrap()
            .iter()
            .all(|&b| b == 1));
        let pages = Box::new(Pages([2; 2 * 4096]));
        storage.write_uncached_at(4096, &pages.0).unwrap();
        let mut back = vec![0; 2 * 4096];
        storage.read_at(4096, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 2));
        // SAFETY: as above.
        let view = unsafe { storage.mapped(4096, 2 * 4096) }.unwrap();
        assert!(view.iter().all(|&b| b == 2));
        // Unaligned offset, length or buffer: an ordinary write, same result.
        storage.write_uncached_at(3 * 4096 + 100, b"tail").unwrap();
        storage.write_uncached_at(0, &pages.0[1..4097]).unwrap();
        let mut back = [0u8; 4];
        storage.read_at(3 * 4096 + 100, &mut back).unwrap();
        assert_eq!(&back, b"tail");
        storage.sync().unwrap();
        drop(storage);
        // The same bytes after reopening.
        let storage = FileStorage::open(&volume_path(&dir), false).unwrap();
        let mut back = vec![0; 4 * 4096];
        storage.read_at(0, &mut back).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 2));
        assert!(back[4096..3 * 4096].iter().all(|&b| b == 2));
        assert_eq!(&back[3 * 4096 + 100..3 * 4096 + 104], b"tail");
    }

    #[test]
    fn mapping_survives_growth_past_the_reservation() {
        let dir = tempfile::tempdir().unwrap();
        let storage =
            FileStorage::open_with_min_reservation(&volume_path(&dir), true, 4 * 4096).unwrap();
        storage.grow(4096).unwrap();
        storage.write_at(0, b"old bytes").unwrap();
        // SAFETY: bytes 0..9 are never written again in this test.
        let old = unsafe { storage.mapped(0, 9) }.unwrap();
        for blocks in [4u64, 5, 17, 64] {
            storage.grow(blocks * 4096).unwrap();
            let offset = blocks * 4096 - 16;
            storage.write_at(offset, b"new").unwrap();
            // SAFETY: these bytes are not written again in this test.
            assert_eq!(unsafe { storage.mapped(offset, 3) }, Some(&b"new"[..]));
        }
        assert!(storage.map.mapping_count() >= 3);
        assert_eq!(old, b"old bytes");
    }

    #[test]
    fn readers_racing_growth_always_find_the_mapping() {
        // A small reservation forces several remaps while a reader keeps mapping the last
        // byte of whatever length it sees: the mapping is published before the length.
        let dir = tempfile::tempdir().unwrap();
        let storage =
            FileStorage::open_with_min_reservation(&volume_path(&dir), true, 2 * 4096).unwrap();
        storage.grow(4096).unwrap();
        let final_len_bytes = 256 * 4096;
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for blocks in 2..=256 {
                    storage.grow(blocks * 4096).unwrap();
                }
            });
            scope.spawn(|| loop {
                let len_bytes = storage.len_bytes().unwrap();
                // SAFETY: nothing writes the file in this test; growth only adds bytes.
                let view = unsafe { storage.mapped(len_bytes - 1, 1) };
                assert_eq!(view, Some(&[0u8][..]), "length {len_bytes}");
                if len_bytes == final_len_bytes {
                    break;
                }
            });
        });
        assert!(storage.map.mapping_count() >= 5);
    }

    #[test]
    fn punch_hole_reduces_space_used_and_reads_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FileStorage::open(&volume_path(&dir), true).unwrap();
        let len_bytes = 1 << 20;
        storage.grow(len_bytes).unwrap();
        assert!(
            storage.space_used_bytes().unwrap() < len_bytes,
            "grow is sparse"
        );
        storage
            .write_at(0, &vec![0xAB; len_bytes as usize])
            .unwrap();
        storage.sync().unwrap();
        let before = storage.space_used_bytes().unwrap();
        assert!(before >= len_bytes, "{before}");

        storage.punch_hole(0, len_bytes / 2).unwrap();
        let after = storage.space_used_bytes().unwrap();
        assert_eq!(storage.len_bytes().unwrap(), len_bytes, "KEEP_SIZE");
        // File systems without hole punching (EOPNOTSUPP) keep the space; the ones this
        // runs on (ext4, xfs, btrfs, tmpfs) give it back.
        assert!(after <= before - len_bytes / 2, "{before} -> {after}");
        let mut buf = vec![1u8; 4096];
        storage.read_at(4096, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        storage.read_at(len_bytes - 4096, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0xAB));
        storage.punch_hole(0, 0).unwrap();
    }

    #[test]
    fn prefetch_and_residency_hints() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FileStorage::open(&volume_path(&dir), true).unwrap();
        // Nothing mapped yet: residency unknown; prefetch of anything is harmless.
        assert_eq!(storage.resident(0), None);
        storage.prefetch(0, 1 << 20);
        storage.grow(4 * 4096).unwrap();
        storage.write_at(4096, &[7u8; 4096]).unwrap();
        // Just written: in the page cache.
        assert_eq!(storage.resident(4096 + 100), Some(true));
        assert_eq!(storage.resident(4 * 4096), None, "past the end");
        storage.prefetch(0, 4 * 4096);
        storage.prefetch(3 * 4096, 1 << 30);
        storage.prefetch(u64::MAX - 10, 100);
        let mut buf = [0u8; 4];
        storage.read_at(4096, &mut buf).unwrap();
        assert_eq!(buf, [7; 4]);
    }

    #[test]
    fn is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<FileStorage>();
    }
}
