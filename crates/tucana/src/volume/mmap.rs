//! A read-only, growable memory mapping of the volume file: the ONE module with unsafe
//! mapping code.
//!
//! Owns: reserving address space for the file (`MAP_SHARED`, `PROT_READ`), remapping when
//! the file outgrows the reservation, and handing out slices of bytes below the file
//! length. Does not own: the file, its lock, its length or any I/O (`file.rs` does), nor
//! the decision of which bytes are safe to look at (the engine's callers of
//! `Storage::mapped` do; see the `SAFETY` argument on [`GrowingMap::slice`]).
//!
//! Why a reservation larger than the file: the file grows by whole allocation groups while
//! readers hold slices of it. Mapping `max(64 GiB, 2 × file length)` up front means growth
//! almost never needs a new mapping, and when it does, the old mapping is kept (not
//! unmapped) until the `GrowingMap` drops, so every slice handed out stays valid. The
//! reservation doubles each time, so a volume that grows to N bytes holds at most
//! `log2(N / 64 GiB) + 1` mappings. Address space on 64-bit Linux is 128 TiB and a
//! read-only shared file mapping reserves no memory or swap, so the reservation is free.
//!
//! Why `MmapRaw` and raw pointers: the pages of the reservation past the end of the file
//! raise SIGBUS when touched, so this module never forms a reference over the whole
//! reservation (which `memmap2::Mmap`'s `Deref` would do); it forms `&[u8]` only over
//! ranges below the published file length.
//!
//! Thread-safety: `slice` is lock-free (two atomic loads) and may run on any thread,
//! concurrently with `grew`. `grew` serialises itself with a mutex. Publication order:
//! `grew` stores the new mapping before the new readable length (both `Release`), and
//! `slice` loads the length before the mapping (both `Acquire`), so a reader that sees a
//! length also sees a mapping that covers it.

use std::fs::File;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use parking_lot::Mutex;

use crate::error::Result;

/// Smallest reservation: enough that typical volumes never remap.
pub(crate) const MIN_RESERVATION_BYTES: u64 = 64 << 30;

/// One mapping of the file from offset 0, `reserved_bytes` long (possibly past EOF).
struct Mapping {
    raw: MmapRaw,
    reserved_bytes: u64,
}

/// The volume file's mapping, growing with the file. See the module doc.
pub(crate) struct GrowingMap {
    /// Bytes that `slice` may hand out: the file length as of the last successful `grew`.
    /// Never more than the current mapping's `reserved_bytes`, never decreases.
    readable_bytes: AtomicU64,
    /// The newest mapping; points into an `Arc` owned by `mappings`.
    current: AtomicPtr<Mapping>,
    /// Every mapping ever made, oldest first. Owning them here (and freeing them only when
    /// the `GrowingMap` drops) is what keeps old slices valid across remaps. `Arc` rather
    /// than `Box` so that moving the owners (when the `Vec` reallocates) never asserts
    /// uniqueness over memory that readers reach through `current`.
    mappings: Mutex<Vec<Arc<Mapping>>>,
    /// Floor of every reservation; `MIN_RESERVATION_BYTES` except in tests of remapping.
    min_reservation_bytes: u64,
}

impl GrowingMap {
    /// Maps `file`, whose current length is `file_len_bytes`, reserving at least
    /// `min_reservation_bytes` (`MIN_RESERVATION_BYTES` outside tests that force remapping
    /// with small files).
    pub(crate) fn with_min_reservation(
        file: &File,
        file_len_bytes: u64,
        min_reservation_bytes: u64,
    ) -> Result<GrowingMap> {
        assert!(min_reservation_bytes > 0);
        let first = Arc::new(map_file(
            file,
            reservation_for(file_len_bytes, min_reservation_bytes),
        )?);
        let current = AtomicPtr::new(Arc::as_ptr(&first).cast_mut());
        Ok(GrowingMap {
            readable_bytes: AtomicU64::new(file_len_bytes),
            current,
            mappings: Mutex::new(vec![first]),
            min_reservation_bytes,
        })
    }

    /// Records that the file has grown to `file_len_bytes` (the caller has already
    /// extended it), mapping a larger reservation first if the current one is too small.
    ///
    /// On error (the new mapping failed) the readable length stays where it was: `slice`
    /// keeps working for old ranges and returns `None` for new ones, so readers fall back
    /// to copying with `read_at`.
    pub(crate) fn grew(&self, file: &File, file_len_bytes: u64) -> Result<()> {
        let mut mappings = self.mappings.lock();
        let readable_bytes = self.readable_bytes.load(Ordering::Relaxed);
        assert!(
            file_len_bytes >= readable_bytes,
            "the volume file never shrinks while mapped ({file_len_bytes} < {readable_bytes})"
        );
        let newest = mappings.last().expect("GrowingMap always holds a mapping");
        if file_len_bytes > newest.reserved_bytes {
            let mapping = Arc::new(map_file(
                file,
                reservation_for(file_len_bytes, self.min_reservation_bytes),
            )?);
            self.current
                .store(Arc::as_ptr(&mapping).cast_mut(), Ordering::Release);
            mappings.push(mapping);
        }
        self.readable_bytes.store(file_len_bytes, Ordering::Release);
        Ok(())
    }

    /// Number of mappings made so far (1 until the file outgrows the first reservation).
    #[cfg(test)]
    pub(crate) fn mapping_count(&self) -> usize {
        self.mappings.lock().len()
    }

    /// The mapped bytes `offset..offset+len`, or `None` when the range is not below the
    /// readable length.
    ///
    /// # Safety
    /// The caller guarantees what `Storage::mapped` asks of its caller: nothing writes,
    /// punches or otherwise changes the bytes of `offset..offset+len` in the file while the
    /// returned slice is alive (rewriting a byte with its own value is allowed).
    pub(crate) unsafe fn slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(u64::try_from(len).ok()?)?;
        // Length first, then mapping: see the module doc for why this order matters.
        if end > self.readable_bytes.load(Ordering::Acquire) {
            return None;
        }
        let mapping_ptr = self.current.load(Ordering::Acquire);
        // SAFETY: (the pointer) `current` always points at a `Mapping` owned by an `Arc`
        // in `self.mappings`, and nothing is removed from that list before `self` drops;
        // the returned slice borrows `self`, so the mapping outlives it.
        let mapping = unsafe { &*mapping_ptr };
        assert!(
            end <= mapping.reserved_bytes,
            "readable length {end} past the reservation of {}",
            mapping.reserved_bytes
        );
        // `end <= reserved_bytes`, and a reservation fits in `usize` (it was mapped), so the
        // offset does too.
        let offset_in_map = offset as usize;
        // SAFETY: soundness of a `&[u8]` into a shared file mapping. Creating it requires
        // that the bytes are readable (no SIGBUS) and do not change while the slice lives.
        //
        // Readable: `offset..end` lies below `readable_bytes`, which is at most the file's
        // length (`grew` is called only after the file was extended) and within this
        // mapping's reservation (checked above). The file is never shrunk while mapped:
        // `FileStorage` never calls `set_len` with a smaller length (`grow` only grows), and
        // the exclusive lock `FileStorage::open` takes on the volume (an flock held for the
        // life of the handle) keeps every other cooperating opener — any other Tucana
        // process or handle, even in this process — away from the file. Pages of the
        // reservation past EOF are legal to map and are never touched, because no slice
        // reaches them.
        //
        // Unchanging: the only writer of the file is this process's `FileStorage`, again
        // because of the exclusive lock. Through it, the engine never writes bytes that a
        // live slice covers: index nodes and bitmaps of committed epochs are never rewritten
        // in place (copy-on-write), a freed block is reused only once no reader can still
        // hold a slice of it (the engine defers reuse behind crossbeam-epoch guards, which
        // also bound how long a slice lives); log bytes are written once, and when a
        // partial last page is rewritten it is rewritten with identical bytes below the
        // append point, while readers only read below the append point. The kernel performs
        // those rewrites by copying equal bytes into the shared page-cache page, so no value
        // a reader can observe ever changes. Hole punching of freed ranges follows the same
        // rule as writes. This is the caller contract of `Storage::mapped`, which is
        // `unsafe` to call for exactly this reason.
        //
        // Assumed, not enforced: flock is advisory, so a non-cooperating program that
        // writes or truncates the file behind our back breaks this argument (as it would
        // for any mmap-based store, e.g. LMDB); with the checksums on every structure such
        // a change shows up as corruption rather than wrong answers, but it is outside
        // what this module can promise.
        Some(unsafe { std::slice::from_raw_parts(mapping.raw.as_ptr().add(offset_in_map), len) })
    }
}

impl GrowingMap {
    /// Whether the page holding byte `offset` of the file is in the page cache
    /// (`mincore`), or `None` when the offset is not mapped or the kernel would not say.
    /// A point-in-time answer: the page may be evicted or read in right after. Used to
    /// skip prefetch requests for data that is already in memory.
    pub(crate) fn resident(&self, offset: u64) -> Option<bool> {
        const PAGE_BYTES: u64 = 4096;
        // Length first, then mapping, as in `slice`.
        if offset >= self.readable_bytes.load(Ordering::Acquire) {
            return None;
        }
        let mapping_ptr = self.current.load(Ordering::Acquire);
        // SAFETY: as in `slice`: `current` points at a mapping owned by `self.mappings`.
        let mapping = unsafe { &*mapping_ptr };
        let page_offset = (offset / PAGE_BYTES * PAGE_BYTES) as usize;
        let mut status = 0u8;
        // SAFETY: mincore reads no memory of the mapping (it asks the kernel about the page
        // at that address; `offset` is below the readable length and inside the
        // reservation, and the mapping is page-aligned, so the address is too) and writes
        // one status byte per page into `status`, which holds one page's.
        let rc = unsafe {
            libc::mincore(
                mapping.raw.as_ptr().add(page_offset).cast_mut().cast(),
                PAGE_BYTES as usize,
                &mut status,
            )
        };
        (rc == 0).then_some(status & 1 == 1)
    }
}

/// The reservation for a file of `file_len_bytes`: `max(floor, 2 × length)`.
fn reservation_for(file_len_bytes: u64, min_reservation_bytes: u64) -> u64 {
    file_len_bytes.saturating_mul(2).max(min_reservation_bytes)
}

fn map_file(file: &File, reserved_bytes: u64) -> Result<Mapping> {
    let len = usize::try_from(reserved_bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("cannot map {reserved_bytes} bytes on this platform"),
        )
    })?;
    // A read-only raw mapping: `map_raw_read_only` itself is safe because it hands out no
    // references; the unsafe step is `slice` above. Mapping a length past the end of the
    // file is legal (POSIX: the pages past EOF fault on access; we never access them).
    let raw = MmapOptions::new().len(len).map_raw_read_only(file)?;
    // Reads through the mapping are random by nature: index nodes, and log records that
    // sit in insertion order, not key order. The kernel's default readahead turned each
    // fault into a large read when the data set did not fit in memory (the harness saw
    // the device read ~300x the bytes written), so ask for no readahead. Advisory only:
    // a failure changes nothing but speed.
    #[cfg(unix)]
    let _ = raw.advise(memmap2::Advice::Random);
    Ok(Mapping {
        raw,
        reserved_bytes,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    fn temp_file(len_bytes: u64) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("v"))
            .unwrap();
        file.set_len(len_bytes).unwrap();
        (dir, file)
    }

    #[test]
    fn maps_far_more_than_the_file_and_reads_only_below_its_end() {
        // The default 64 GiB reservation over a one-page file: this kernel must accept a
        // mapping longer than the file.
        let (_dir, file) = temp_file(4096);
        file.write_all_at(b"hello", 100).unwrap();
        let map = GrowingMap::with_min_reservation(&file, 4096, MIN_RESERVATION_BYTES).unwrap();
        assert_eq!(map.mapping_count(), 1);
        // SAFETY: nothing writes the file while the slices live.
        unsafe {
            assert_eq!(map.slice(100, 5), Some(&b"hello"[..]));
            assert_eq!(map.slice(4096, 0), Some(&b""[..]));
            assert_eq!(map.slice(4090, 7), None);
            assert_eq!(map.slice(u64::MAX, 1), None);
        }
    }

    #[test]
    fn empty_file_maps() {
        let (_dir, file) = temp_file(0);
        let map = GrowingMap::with_min_reservation(&file, 0, MIN_RESERVATION_BYTES).unwrap();
        // SAFETY: nothing writes the file.
        unsafe {
            assert_eq!(map.slice(0, 1), None);
        }
    }

    #[test]
    fn sees_writes_made_after_mapping() {
        let (_dir, file) = temp_file(8192);
        let map = GrowingMap::with_min_reservation(&file, 8192, MIN_RESERVATION_BYTES).unwrap();
        file.write_all_at(&[7u8; 10], 5000).unwrap();
        // SAFETY: the write finished before the slice was made, nothing writes after.
        unsafe {
            assert_eq!(map.slice(5000, 10), Some(&[7u8; 10][..]));
        }
    }

    #[test]
    fn growth_past_the_reservation_remaps_and_old_slices_stay_valid() {
        let (_dir, file) = temp_file(4096);
        file.write_all_at(b"first", 0).unwrap();
        let map = GrowingMap::with_min_reservation(&file, 4096, 16384).unwrap();
        // SAFETY: bytes 0..5 are never written again in this test.
        let old = unsafe { map.slice(0, 5) }.unwrap();

        // Inside the reservation: no new mapping.
        file.set_len(16384).unwrap();
        map.grew(&file, 16384).unwrap();
        assert_eq!(map.mapping_count(), 1);

        // Past it: a new mapping of 2 × the length.
        file.set_len(40960).unwrap();
        file.write_all_at(b"far", 40000).unwrap();
        // SAFETY: the file has grown but `grew` has not been told yet.
        assert_eq!(unsafe { map.slice(40000, 3) }, None);
        map.grew(&file, 40960).unwrap();
        assert_eq!(map.mapping_count(), 2);
        // SAFETY: these bytes are not written again.
        unsafe {
            assert_eq!(map.slice(40000, 3), Some(&b"far"[..]));
            assert_eq!(map.slice(0, 5), Some(&b"first"[..]));
        }
        // The slice taken from the first mapping still reads the file.
        assert_eq!(old, b"first");

        // Growth within the new (81920-byte) reservation does not remap again.
        file.set_len(81920).unwrap();
        map.grew(&file, 81920).unwrap();
        assert_eq!(map.mapping_count(), 2);
        file.set_len(81921).unwrap();
        map.grew(&file, 81921).unwrap();
        assert_eq!(map.mapping_count(), 3);
        assert_eq!(old, b"first");
    }

    #[test]
    #[should_panic(expected = "never shrinks")]
    fn shrinking_is_a_programmer_error() {
        let (_dir, file) = temp_file(8192);
        let map = GrowingMap::with_min_reservation(&file, 8192, MIN_RESERVATION_BYTES).unwrap();
        let _ = map.grew(&file, 4096);
    }
}
