//! Memory for heap index nodes: 4 KiB slots carved out of 2 MiB chunks that the kernel is
//! asked to back with transparent huge pages.
//!
//! Why not the global allocator: a lookup visits one node per level and then the log, and
//! with nodes in separate 4 KiB pages an index of tens of MiB misses the TLB on nearly
//! every node visit; in a virtual machine each such miss is a two-dimensional page walk.
//! Packing nodes into huge pages leaves a few TLB entries covering the whole index. (The
//! kernel here runs THP in `madvise` mode, so nothing gets huge pages without asking.)
//!
//! Owns: the chunks and the list of free slots. Chunks are never returned to the system:
//! freed slots go back on the list and the next node takes the most recently freed one
//! (still warm in cache). The memory held is the peak of heap nodes, rounded up to 2 MiB.
//! Does not own: what a slot holds (`node`), when a node may be freed (`tree`).
//!
//! Thread safety: one process-wide mutex. Writers take slots on splits and copy-on-write
//! and reclamation returns them; both are far rarer than operations, and readers never
//! come here.

use std::alloc::Layout;
use std::ptr::NonNull;

use parking_lot::Mutex;

/// Bytes of one slot (one node).
pub(crate) const SLOT_BYTES: usize = 4096;
/// Bytes of one chunk: one x86-64 huge page.
const CHUNK_BYTES: usize = 2 << 20;

struct Arena {
    /// Free slots by address (a `NonNull` is not `Send`; the addresses are owned here).
    free: Vec<usize>,
}

static ARENA: Mutex<Arena> = Mutex::new(Arena { free: Vec::new() });

/// A zeroed, 4096-byte-aligned slot of `SLOT_BYTES`, owned by the caller until it is
/// handed to [`free_slot`].
pub(crate) fn alloc_slot() -> NonNull<u8> {
    let addr = {
        let mut arena = ARENA.lock();
        match arena.free.pop() {
            Some(addr) => addr,
            None => {
                let chunk = new_chunk();
                // The chunk's other slots, highest first, so slots are handed out in
                // address order.
                arena.free.extend(
                    (1..CHUNK_BYTES / SLOT_BYTES)
                        .rev()
                        .map(|i| chunk + i * SLOT_BYTES),
                );
                chunk
            }
        }
    };
    let p = std::ptr::with_exposed_provenance_mut::<u8>(addr);
    // SAFETY: `addr` is a slot of a live chunk (chunks are never freed) that nobody else
    // owns: it was just taken off the free list or carved from a new chunk.
    unsafe { p.write_bytes(0, SLOT_BYTES) };
    NonNull::new(p).expect("slot addresses are not null")
}

/// Gives a slot back.
///
/// # Safety
/// `p` came from [`alloc_slot`], is freed once, and nobody uses it any more.
pub(crate) unsafe fn free_slot(p: NonNull<u8>) {
    // SAFETY: the caller's promise, for one slot.
    unsafe { free_slots([p]) }
}

/// Gives slots back under one lock of the arena (a batch of retired nodes).
///
/// # Safety
/// Each of `slots` came from [`alloc_slot`], is freed once, and nobody uses it any more.
pub(crate) unsafe fn free_slots(slots: impl IntoIterator<Item = NonNull<u8>>) {
    let mut arena = ARENA.lock();
    for p in slots {
        let addr = p.as_ptr().expose_provenance();
        debug_assert!(addr.is_multiple_of(SLOT_BYTES));
        arena.free.push(addr);
    }
}

/// Allocates one chunk and asks for huge pages; returns its address.
fn new_chunk() -> usize {
    let layout = Layout::from_size_align(CHUNK_BYTES, CHUNK_BYTES).expect("a valid layout");
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    #[cfg(all(target_os = "linux", not(miri)))]
    // SAFETY: `p` is the start of `CHUNK_BYTES` bytes we own; MADV_HUGEPAGE only changes how
    // the kernel backs them. Failure (THP disabled) leaves ordinary pages: ignored.
    unsafe {
        libc::madvise(p.cast(), CHUNK_BYTES, libc::MADV_HUGEPAGE);
    }
    p.expose_provenance()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_zeroed_and_reused() {
        let a = alloc_slot();
        assert!((a.as_ptr() as usize).is_multiple_of(SLOT_BYTES));
        // SAFETY: we own the slot.
        unsafe { a.as_ptr().write_bytes(0xAB, SLOT_BYTES) };
        // SAFETY: allocated above, freed once.
        unsafe { free_slot(a) };
        // Tests run in parallel and share the arena, so the slot we get back may be another
        // one; it must be zeroed whichever it is.
        let b = alloc_slot();
        // SAFETY: we own the slot.
        let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), SLOT_BYTES) };
        assert!(bytes.iter().all(|&x| x == 0));
        // SAFETY: allocated above, freed once.
        unsafe { free_slot(b) };
    }
}
