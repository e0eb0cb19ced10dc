//! The tail segment: the log segment a region appends to, held in memory until it is
//! closed, so that appends become large writes and readers of fresh records need no I/O.
//!
//! Thread-safety: one appender (the region's writer, under its lock); any number of
//! readers; flushes from any thread (serialised by an internal mutex). Bytes below
//! `published` never change again; the appender only writes above it. Readers keep a
//! `Tail` alive with a `crossbeam_epoch` guard while they read it.
//!
//! Buffers are recycled: a dropped tail's buffer goes to a small process-wide pool
//! and the next tail of the same size takes it back without zeroing. A fresh 2 MiB
//! buffer costs 512 page faults, each zeroing a page (about 5% of a random-insert
//! load's time before the pool). Stale bytes are harmless: nothing reads or writes a
//! tail above `published` except the appender, which overwrites them first.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Buffers kept for reuse, at most `SPARE_BUFFERS_MAX` (a region holds one tail at a time,
/// and a closed tail waits for readers' grace period before it is dropped).
static SPARE_BUFFERS: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());
const SPARE_BUFFERS_MAX: usize = 8;

/// Buffers allocated fresh (not taken from the pool) since the process started.
static FRESH_BUFFERS: AtomicU64 = AtomicU64::new(0);

/// How many tail buffers this process allocated fresh rather than reused: a diagnostic
/// (and the observable of the regression test for closed tails that were never freed).
pub fn fresh_buffers_allocated() -> u64 {
    FRESH_BUFFERS.load(Ordering::Relaxed)
}

/// A buffer of `size_bytes`: a spare one if there is one, else a fresh zeroed one.
fn take_buffer(size_bytes: usize) -> Box<[u8]> {
    let mut spare = SPARE_BUFFERS.lock();
    if let Some(i) = spare.iter().position(|b| b.len() == size_bytes) {
        return spare.swap_remove(i);
    }
    drop(spare);
    FRESH_BUFFERS.fetch_add(1, Ordering::Relaxed);
    let buf = vec![0u8; size_bytes].into_boxed_slice();
    #[cfg(all(target_os = "linux", not(miri)))]
    if size_bytes >= 2 << 20 {
        // SAFETY: `buf` is ours; MADV_HUGEPAGE only changes how the kernel backs the
        // pages (fewer faults and TLB misses for the appender); failure is harmless.
        unsafe {
            libc::madvise(
                buf.as_ptr() as *mut libc::c_void,
                size_bytes,
                libc::MADV_HUGEPAGE,
            )
        };
    }
    buf
}

fn give_back_buffer(buf: Box<[u8]>) {
    let mut spare = SPARE_BUFFERS.lock();
    if spare.len() < SPARE_BUFFERS_MAX {
        spare.push(buf);
    }
}

use crate::error::Result;
use crate::types::{DiskOffset, BLOCK_BYTES};
use crate::volume::Storage;

pub struct Tail {
    /// Where the segment starts in the volume.
    pub base: DiskOffset,
    /// Size of the segment (and of the buffer).
    pub size_bytes: u64,
    /// The segment's position among its region's segments (`SegmentStats::order`).
    pub order: u64,
    /// Start of the buffer: `size_bytes` bytes owned by this struct (from a `Box<[u8]>`).
    buf: *mut u8,
    /// Bytes appended and visible to readers.
    published: AtomicU64,
    /// Bytes written to storage (not necessarily synced).
    flushed: Mutex<u64>,
}

// SAFETY: the buffer is owned by the `Tail`. Bytes below `published` are immutable once
// published (Release store after they were written, Acquire load before they are read),
// and the single appender writes only at and above `published`, so no byte is written
// while any other thread may read it.
unsafe impl Send for Tail {}
// SAFETY: as for `Send` above: shared readers only read published, immutable bytes.
unsafe impl Sync for Tail {}

impl Tail {
    /// An empty tail for a fresh segment. Its buffer may hold stale bytes from an earlier
    /// tail; none of them is ever visible (see the module comment).
    pub fn new(base: DiskOffset, size_bytes: u64, order: u64) -> Tail {
        assert!(base.block_aligned() && size_bytes.is_multiple_of(BLOCK_BYTES) && size_bytes > 0);
        let buf = take_buffer(size_bytes as usize);
        Tail {
            base,
            size_bytes,
            order,
            buf: Box::into_raw(buf) as *mut u8,
            published: AtomicU64::new(0),
            flushed: Mutex::new(0),
        }
    }

    /// A tail whose first bytes are already in storage (recovery).
    pub fn with_prefix(base: DiskOffset, size_bytes: u64, order: u64, prefix: &[u8]) -> Tail {
        let tail = Tail::new(base, size_bytes, order);
        assert!(prefix.len() as u64 <= size_bytes);
        // SAFETY: fresh buffer of `size_bytes`, nobody else can see it yet.
        unsafe { std::ptr::copy_nonoverlapping(prefix.as_ptr(), tail.buf, prefix.len()) };
        tail.published.store(prefix.len() as u64, Ordering::Release);
        *tail.flushed.lock() = prefix.len() as u64;
        tail
    }

    pub fn published_bytes(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Free bytes left in the segment.
    pub fn free_bytes(&self) -> u64 {
        self.size_bytes - self.published_bytes()
    }

    pub fn contains(&self, offset: u64) -> bool {
        offset >= self.base.0 && offset < self.base.0 + self.size_bytes
    }

    /// Appends `len` bytes filled in by `fill`; returns their volume offset.
    ///
    /// # Safety
    /// Only the region's writer may append (one appender at a time).
    pub unsafe fn append(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> DiskOffset {
        let start = self.published.load(Ordering::Relaxed);
        assert!(
            start + len as u64 <= self.size_bytes,
            "append past the segment end"
        );
        // SAFETY: [start, start+len) is inside the buffer and above `published`, so no
        // reader looks at it; the caller guarantees we are the only appender.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.buf.add(start as usize), len) };
        fill(dst);
        self.published.store(start + len as u64, Ordering::Release);
        DiskOffset(self.base.0 + start)
    }

    /// The published bytes at volume offset `offset`, `len` long, if they are in this tail.
    pub fn read(&self, offset: u64, len: usize) -> Option<&[u8]> {
        if offset < self.base.0 {
            return None;
        }
        let start = offset - self.base.0;
        let end = start.checked_add(len as u64)?;
        if end > self.published.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: [start, end) is below `published`: written before the Release store we
        // observed and never changed again while `self` lives.
        Some(unsafe { std::slice::from_raw_parts(self.buf.add(start as usize), len) })
    }

    /// The published bytes from the segment start (for replay-style scans).
    pub fn published(&self) -> &[u8] {
        let len = self.published.load(Ordering::Acquire) as usize;
        // SAFETY: as in `read`.
        unsafe { std::slice::from_raw_parts(self.buf, len) }
    }

    /// Writes the published bytes not yet written to storage. The last partial block is
    /// written again next time with the same leading bytes, so a torn rewrite never
    /// changes bytes that were already durable.
    pub fn flush(&self, storage: &dyn Storage) -> Result<u64> {
        let mut flushed = self.flushed.lock();
        let published = self.published.load(Ordering::Acquire);
        if published <= *flushed {
            return Ok(0);
        }
        let start = *flushed / BLOCK_BYTES * BLOCK_BYTES;
        // SAFETY: [start, published) is below `published` (immutable).
        let bytes = unsafe {
            std::slice::from_raw_parts(self.buf.add(start as usize), (published - start) as usize)
        };
        storage.write_at(self.base.0 + start, bytes)?;
        *flushed = published;
        Ok(published - start)
    }

    pub fn flushed_bytes(&self) -> u64 {
        *self.flushed.lock()
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        // SAFETY: `buf` came from `Box::into_raw` of a boxed slice of `size_bytes`.
        let buf = unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.buf,
                self.size_bytes as usize,
            ))
        };
        give_back_buffer(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_read_and_bounds() {
        let tail = Tail::new(DiskOffset(8192), 8192, 0);
        // SAFETY: single appender in this test.
        let at = unsafe { tail.append(5, |b| b.copy_from_slice(b"hello")) };
        assert_eq!(at, DiskOffset(8192));
        assert_eq!(tail.read(8192, 5), Some(&b"hello"[..]));
        assert_eq!(
            tail.read(8192, 6),
            None,
            "unpublished bytes are not readable"
        );
        assert_eq!(tail.read(4096, 1), None);
        assert!(tail.contains(8192 + 8191) && !tail.contains(8192 + 8192));
        assert_eq!(tail.free_bytes(), 8192 - 5);
    }

    #[test]
    fn a_recycled_buffer_shows_none_of_its_old_bytes() {
        let size = 64 << 10;
        for round in 0..3u8 {
            let tail = Tail::new(DiskOffset(0), size, 0);
            assert!(tail.published().is_empty(), "round {round}");
            assert_eq!(tail.read(0, 1), None, "round {round}");
            // SAFETY: single appender in this test.
            unsafe { tail.append(4096, |b| b.fill(0xA0 + round)) };
            assert!(tail
                .read(0, 4096)
                .unwrap()
                .iter()
                .all(|&b| b == 0xA0 + round));
            // Dropped here: the buffer goes back to the pool for the next round.
        }
    }
}
