//! The block device backend: a volume (or a member of one) on a raw block device such as
//! `/dev/nvme1n1` or a loop device. Every write goes to the device through an `O_DIRECT`
//! descriptor; reads use `pread` and the read-only mapping as for a file (`mmap.rs`).
//!
//! Owns: recognising a block device (`S_ISBLK`), its length (`BLKGETSIZE64`, fixed: a
//! device cannot grow, so `grow` past its end is a clear error naming it), the exclusive
//! claim (`O_EXCL`, which the kernel refuses while the device is mounted or claimed, plus
//! the `flock` a file volume takes), aligned direct writes (a bounce buffer when the
//! caller's bytes are not aligned, and a read-modify-write of the partial blocks at the
//! edges of an unaligned write), discards of freed ranges (`BLKDISCARD`), and the device
//! cache flush of `sync` (`fdatasync` of a block device ends in a flush of its cache).
//! Does not own: the mapping's unsafe code (`mmap.rs`), what the bytes mean, nor when a
//! device may be formatted (`Options::format_block_devices`, checked by the openers).
//!
//! Coherence of direct writes with mapped reads (DESIGN.md, "Raw block devices"): a direct
//! write to a block device makes the kernel write back and then drop the cached pages of
//! its range (before and after the I/O), and the mapping shares those pages (one page
//! cache per device), so a later fault or `pread` reads the new bytes from the device. No
//! mapped view of a range is alive while it is written (`Storage::mapped`'s contract).
//!
//! Thread-safety: `Send + Sync`; every method takes `&self`. Writes to disjoint ranges run
//! in parallel; the read-modify-write of a partial edge block holds one of `EDGE_LOCKS`
//! locks (by block number), so two unaligned writes sharing a block never lose each
//! other's bytes.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::types::BLOCK_BYTES;
use crate::volume::file::{prefetch, with_path};
use crate::volume::mmap::GrowingMap;
use crate::volume::{AlignedBlock, Storage, StorageKind};

/// `_IOR(0x12, 114, size_t)`: the device's length in bytes (not in libc).
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;
/// `_IO(0x12, 119)`: discard a byte range `[start, len]` (not in libc).
const BLKDISCARD: libc::Ioctl = 0x1277;

/// Largest bounce buffer of one direct write (bigger writes go in pieces).
const BOUNCE_BYTES_MAX: usize = 1 << 20;
/// Locks serialising the read-modify-write of partial blocks, by block number.
const EDGE_LOCKS: usize = 16;

/// A volume (or member) on a raw block device. See the module doc.
pub struct BlockDevice {
    // Declared before `file` so the mapping is gone before the device is closed.
    map: GrowingMap,
    /// Opened `O_RDWR | O_EXCL` and `flock`ed: reads, `fdatasync`, discards, the claim.
    file: File,
    /// The same device opened `O_RDWR | O_DIRECT`: every write, and the edge reads of a
    /// read-modify-write.
    direct: File,
    path: PathBuf,
    /// The device's length rounded down to a block; never changes.
    len_bytes: u64,
    edge_locks: [Mutex<()>; EDGE_LOCKS],
    /// Cleared when the device refuses discards (`EOPNOTSUPP`): later punches are no-ops.
    discard_ok: AtomicBool,
    written_bytes: AtomicU64,
    read_bytes: AtomicU64,
    discarded_bytes: AtomicU64,
}

/// Whether `path` names a block device (following symlinks); `false` when it cannot be
/// stat'ed (a missing file is the file backend's to report).
pub fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// The length in bytes of the block device open as `file` (`BLKGETSIZE64`).
pub fn device_len_bytes(file: &File) -> io::Result<u64> {
    let mut len_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a u64 we
    // own for the call; the descriptor is ours for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut len_bytes as *mut u64) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(len_bytes)
}

fn logical_block_bytes(file: &File) -> io::Result<u32> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points to an int we own
    // for the call; the descriptor is ours for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut bytes as *mut _) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(bytes.max(0) as u32)
}

/// Whether `storage` carries anything Tucana writes at the start of a volume or member: a
/// superblock (valid, corrupt, or of a newer format), the creation marker, or a member's
/// slot header. Such a device is never formatted; a device without any of them is never
/// written unless formatting was asked for (`Options::format_block_devices`).
pub fn carries_tucana(storage: &dyn Storage, name: &str) -> Result<bool> {
    use crate::volume::superblock;
    let superblock = match superblock::read_newest(storage) {
        Ok(found) => found.is_some(),
        Err(Error::NotAVolume(_)) => false,
        // Corrupt or newer: it looks like ours, so it is not somebody else's free space.
        Err(_) => true,
    };
    Ok(superblock
        || superblock::creation_was_interrupted(storage)?
        || !matches!(
            crate::volume::members::read_header(storage, 0, name),
            Ok(None)
        ))
}

/// Opens the block device at `path` as a volume of its own (`Options::open`): a device
/// carrying a Tucana volume (or a member's slot header, which the caller then refuses,
/// naming the missing members) opens as it is; any other device is refused with an error
/// naming it, unless `format`, which writes the creation marker (and syncs it) so that
/// recovery creates a volume over the whole device.
pub fn open_single(path: &Path, format: bool, min_reservation_bytes: u64) -> Result<BlockDevice> {
    let device = BlockDevice::open(path, min_reservation_bytes)?;
    let name = path.display().to_string();
    if carries_tucana(&device, &name)? {
        return Ok(device);
    }
    if !format {
        return Err(Error::NotAVolume(format!(
            "{name}: a block device with no Tucana volume on it; it is formatted only when \
             formatting is asked for (Options::format_block_devices, tucana --format-device), \
             which erases what it holds"
        )));
    }
    crate::volume::superblock::write_creation_marker(&device)?;
    device.sync()?;
    Ok(device)
}

impl BlockDevice {
    /// Opens the block device at `path` for reading and writing, claims it exclusively
    /// and locks it. Never writes.
    ///
    /// Errors (`Error::Io`, naming the path): not a block device; busy (mounted, or held
    /// by another opener: the kernel's `O_EXCL` claim, which lasts while any copy of the
    /// open file does, so a child forked by this process between a close and this open
    /// holds it until it execs); a logical block size that does
    /// not divide 4 KiB; a device shorter than two blocks. `Error::Locked` when another
    /// handle holds the `flock`.
    pub fn open(path: &Path, min_reservation_bytes: u64) -> Result<BlockDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_EXCL)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => invalid(
                    path,
                    io::ErrorKind::ResourceBusy,
                    "the block device is busy (mounted, or claimed by another opener)",
                ),
                _ => with_path(path, "open", e),
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(Error::Locked),
            Err(TryLockError::Error(e)) => return Err(with_path(path, "lock", e)),
        }
        let metadata = file.metadata().map_err(|e| with_path(path, "stat", e))?;
        if !metadata.file_type().is_block_device() {
            return Err(invalid(
                path,
                io::ErrorKind::InvalidInput,
                "not a block device",
            ));
        }
        let device_bytes =
            device_len_bytes(&file).map_err(|e| with_path(path, "BLKGETSIZE64", e))?;
        let sector_bytes =
            logical_block_bytes(&file).map_err(|e| with_path(path, "BLKSSZGET", e))?;
        if sector_bytes == 0 || !(BLOCK_BYTES as u32).is_multiple_of(sector_bytes) {
            return Err(invalid(
                path,
                io::ErrorKind::InvalidInput,
                &format!("logical blocks of {sector_bytes} bytes do not divide the volume's 4096-byte blocks"),
            ));
        }
        let len_bytes = device_bytes / BLOCK_BYTES * BLOCK_BYTES;
        if len_bytes < 2 * BLOCK_BYTES {
            return Err(invalid(
                path,
                io::ErrorKind::InvalidInput,
                &format!("a block device of {device_bytes} bytes is too small for a volume"),
            ));
        }
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| with_path(path, "open with O_DIRECT", e))?;
        let map = GrowingMap::with_min_reservation(&file, len_bytes, min_reservation_bytes)?;
        Ok(BlockDevice {
            map,
            file,
            direct,
            path: path.to_path_buf(),
            len_bytes,
            edge_locks: std::array::from_fn(|_| Mutex::new(())),
            discard_ok: AtomicBool::new(true),
            written_bytes: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            discarded_bytes: AtomicU64::new(0),
        })
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes given to `BLKDISCARD` since `open` (0 where the device refuses discards).
    pub fn discarded_bytes(&self) -> u64 {
        self.discarded_bytes.load(Ordering::Relaxed)
    }

    /// One direct write of whole blocks from an aligned buffer.
    fn write_direct(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        debug_assert!(offset.is_multiple_of(BLOCK_BYTES));
        debug_assert!((bytes.len() as u64).is_multiple_of(BLOCK_BYTES));
        debug_assert!((bytes.as_ptr() as usize).is_multiple_of(BLOCK_BYTES as usize));
        self.direct
            .write_all_at(bytes, offset)
            .map_err(|e| with_path(&self.path, "direct write", e))
    }

    /// Writes `data` at `offset` (any alignment) through the direct descriptor: whole
    /// blocks through a bounce buffer of at most `BOUNCE_BYTES_MAX`, the partial blocks
    /// at the two edges read from the device first, under their edge locks.
    fn write_bounced(&self, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset + data.len() as u64;
        let first_block = offset / BLOCK_BYTES;
        let last_block = (end - 1) / BLOCK_BYTES;
        let head_partial = !offset.is_multiple_of(BLOCK_BYTES)
            || (first_block == last_block && !end.is_multiple_of(BLOCK_BYTES));
        let tail_partial = !end.is_multiple_of(BLOCK_BYTES);
        // Lock the edge blocks' stripes in ascending order (one lock when they share one).
        let mut stripes: Vec<usize> = Vec::with_capacity(2);
        for (partial, block) in [(head_partial, first_block), (tail_partial, last_block)] {
            let stripe = (block % EDGE_LOCKS as u64) as usize;
            if partial && !stripes.contains(&stripe) {
                stripes.push(stripe);
            }
        }
        stripes.sort_unstable();
        let _guards: Vec<_> = stripes.iter().map(|&s| self.edge_locks[s].lock()).collect();

        let blocks_per_bounce = BOUNCE_BYTES_MAX / BLOCK_BYTES as usize;
        let mut bounce: Vec<AlignedBlock> = Vec::new();
        let mut block = first_block;
        while block <= last_block {
            let count = ((last_block - block + 1) as usize).min(blocks_per_bounce);
            bounce.clear();
            bounce.resize(count, AlignedBlock([0; BLOCK_BYTES as usize]));
            let piece_start = block * BLOCK_BYTES;
            let piece_end = piece_start + count as u64 * BLOCK_BYTES;
            // Edge blocks this piece does not wholly overwrite keep their other bytes.
            if block == first_block && head_partial {
                self.read_block_direct(block, &mut bounce[0])?;
            }
            let tail_read_already = last_block == first_block && head_partial;
            if block + count as u64 - 1 == last_block && tail_partial && !tail_read_already {
                self.read_block_direct(last_block, &mut bounce[count - 1])?;
            }
            // SAFETY: `AlignedBlock` is a byte array with no padding (asserted in
            // `volume/mod.rs`), so `count` initialised elements are that many blocks of
            // initialised bytes, borrowed mutably no longer than `bounce`.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(
                    bounce.as_mut_ptr().cast::<u8>(),
                    count * BLOCK_BYTES as usize,
                )
            };
            let copy_from = offset.max(piece_start);
            let copy_to = end.min(piece_end);
            bytes[(copy_from - piece_start) as usize..(copy_to - piece_start) as usize]
                .copy_from_slice(&data[(copy_from - offset) as usize..(copy_to - offset) as usize]);
            self.write_direct(piece_start, bytes)?;
            block += count as u64;
        }
        Ok(())
    }

    /// Reads block `block` from the device itself (not the page cache) into `into`.
    fn read_block_direct(&self, block: u64, into: &mut AlignedBlock) -> Result<()> {
        self.direct
            .read_exact_at(&mut into.0, block * BLOCK_BYTES)
            .map_err(|e| with_path(&self.path, "direct read", e))
    }

    /// Panics unless `offset..offset+len` lies inside the device: the engine writes only
    /// inside space `grow` accepted, and `grow` refuses anything past the device's end.
    fn assert_inside(&self, offset: u64, len: usize) {
        let end = offset.checked_add(len as u64);
        assert!(
            end.is_some_and(|end| end <= self.len_bytes),
            "write of {len} bytes at {offset:#x} past the end of the device ({} bytes)",
            self.len_bytes
        );
    }
}

fn invalid(path: &Path, kind: io::ErrorKind, why: &str) -> Error {
    Error::Io(io::Error::new(kind, format!("{}: {why}", path.display())))
}

impl Storage for BlockDevice {
    fn len_bytes(&self) -> Result<u64> {
        Ok(self.len_bytes)
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        if len_bytes <= self.len_bytes {
            return Ok(());
        }
        Err(Error::Io(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "{}: block device full: the volume needs {len_bytes} bytes, the device holds {}",
                self.path.display(),
                self.len_bytes
            ),
        )))
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > self.len_bytes)
        {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: read of {} bytes at {offset:#x} past the end of the device ({} bytes)",
                    self.path.display(),
                    buf.len(),
                    self.len_bytes
                ),
            )));
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| with_path(&self.path, "read", e))?;
        self.read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.assert_inside(offset, data.len());
        let aligned = offset.is_multiple_of(BLOCK_BYTES)
            && (data.len() as u64).is_multiple_of(BLOCK_BYTES)
            && (data.as_ptr() as usize).is_multiple_of(BLOCK_BYTES as usize);
        if aligned {
            self.write_direct(offset, data)?;
        } else {
            self.write_bounced(offset, data)?;
        }
        self.written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn write_uncached_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        // Every write to a device is uncached.
        self.write_at(offset, data)
    }

    fn sync(&self) -> Result<()> {
        // On a block device, fdatasync writes back any dirty cached page (none: every write
        // is direct and the mapping is read-only) and flushes the device's write cache.
        self.file
            .sync_data()
            .map_err(|e| with_path(&self.path, "sync", e))
    }

    unsafe fn mapped(&self, offset: u64, len: usize) -> Option<&[u8]> {
        // SAFETY: the caller's guarantee (`Storage::mapped`) is what `GrowingMap::slice`
        // requires; this handle holds the device's exclusive claim and lock, and a block
        // device never shrinks under it (resizing a device under an open volume, e.g.
        // `losetup -c` after truncating its file, is outside what we support).
        unsafe { self.map.slice(offset, len) }
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        // Whole blocks inside the range only; afterwards the range may read as zeros or
        // as its old bytes (the device decides): nothing may rely on either.
        let start = offset.next_multiple_of(BLOCK_BYTES);
        let end = offset.saturating_add(len).min(self.len_bytes) / BLOCK_BYTES * BLOCK_BYTES;
        if end <= start || !self.discard_ok.load(Ordering::Relaxed) {
            return Ok(());
        }
        let range: [u64; 2] = [start, end - start];
        loop {
            // SAFETY: BLKDISCARD reads two u64 (start, length) through the pointer, which
            // points to an array we own for the call; the descriptor is ours (opened
            // `O_EXCL`, so the kernel may drop the range's cached pages).
            let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKDISCARD, range.as_ptr()) };
            if rc == 0 {
                self.discarded_bytes
                    .fetch_add(end - start, Ordering::Relaxed);
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // The device cannot discard: the range keeps its bytes, which is allowed.
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) => {
                    self.discard_ok.store(false, Ordering::Relaxed);
                    return Ok(());
                }
                _ => return Err(with_path(&self.path, "discard", e)),
            }
        }
    }

    fn prefetch(&self, offset: u64, len_bytes: u64) {
        if len_bytes > 0 {
            prefetch(&self.file, offset, len_bytes);
        }
    }

    fn start_writeback(&self, _offset: u64, _len_bytes: u64) {
        // Direct writes are on the device when they return: nothing to start.
    }

    fn write_back_and_wait(&self, _offset: u64, _len_bytes: u64) -> Result<()> {
        // As above: the direct write already waited for the device.
        Ok(())
    }

    fn resident(&self, offset: u64) -> Option<bool> {
        self.map.resident(offset)
    }

    fn space_used_bytes(&self) -> Result<u64> {
        // The whole device is the volume's.
        Ok(self.len_bytes)
    }

    fn io_bytes(&self) -> (u64, u64) {
        (
            self.written_bytes.load(Ordering::Relaxed),
            self.read_bytes.load(Ordering::Relaxed),
        )
    }

    fn kind(&self) -> StorageKind {
        StorageKind::BlockDevice
    }

    fn capacity_bytes(&self) -> Option<u64> {
        Some(self.len_bytes)
    }
}
