//! A region's closed segments whose write is in flight: their tails, still readable,
//! from the moment they stop being the region's tail until their bytes are in the
//! volume (DESIGN.md invariant 2 and "Writes in flight").
//!
//! Owns: up to `SLOTS` closed tails and the mask that says which slots hold one; finding
//! the tail that holds a log pointer; giving a tail back (to readers' grace period, then
//! the buffer pool) once its write is done. Does not own: the write itself or its
//! budget (`volume::write_queue`), nor choosing when a segment closes (`log::writer`).
//!
//! Thread-safety: one inserter at a time (the region's writer lock: every tail switch
//! holds it); any thread completes a slot (the job that wrote its tail, once); readers
//! take no lock, pin `crossbeam_epoch` and read the mask, then the slots it names. A
//! closed tail is inserted here *before* the tail slot stops naming it, and taken out
//! only after its write returned, so a reader that no longer finds a segment in a tail
//! slot finds it here, or finds its bytes in the volume.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_epoch::{self as epoch, Atomic};

use crate::log::tail::Tail;

/// Closed tails a region may have in flight at once (the bits of the mask).
pub(crate) const SLOTS: usize = 64;

pub(crate) struct InFlightTails {
    /// Bit `i` set: `slots[i]` holds a tail whose write is not done.
    mask: AtomicU64,
    slots: [Atomic<Tail>; SLOTS],
}

impl InFlightTails {
    pub fn new() -> InFlightTails {
        InFlightTails {
            mask: AtomicU64::new(0),
            slots: std::array::from_fn(|_| Atomic::null()),
        }
    }

    /// Whether a slot is free for one more closed tail.
    #[inline]
    pub fn has_free(&self) -> bool {
        self.mask.load(Ordering::Acquire) != u64::MAX
    }

    /// Closed tails here now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.mask.load(Ordering::Acquire).count_ones() as usize
    }

    /// Puts `tail` (still named by its tail slot) in a free slot and returns the slot.
    /// The caller holds the region's writer lock (the only inserter) and saw `has_free`;
    /// from here on the slot owns the tail: the tail slot must drop its claim (swap it
    /// out without destroying it).
    pub fn insert(&self, tail: epoch::Shared<'_, Tail>) -> usize {
        let mask = self.mask.load(Ordering::Acquire);
        assert!(mask != u64::MAX, "no free in-flight slot");
        // Only completions run meanwhile, and they only clear bits: a free bit stays free.
        let i = (!mask).trailing_zeros() as usize;
        self.slots[i].store(tail, Ordering::Release);
        self.mask.fetch_or(1 << i, Ordering::AcqRel);
        i
    }

    /// The tail of slot `i`, for its job (which alone completes the slot).
    ///
    /// # Safety
    /// The caller is slot `i`'s job, before it called `complete(i)`.
    pub unsafe fn get(&self, i: usize) -> &Tail {
        // SAFETY: the slot keeps its tail until `complete(i)`, which only the caller
        // calls; `unprotected` is sound because nothing destroys it meanwhile.
        unsafe {
            self.slots[i]
                .load(Ordering::Acquire, epoch::unprotected())
                .deref()
        }
    }

    /// The write of slot `i`'s tail is done (its bytes are in the volume): readers go to
    /// the volume from now on, and the tail is dropped (its buffer back to the pool) once
    /// no reader pinned before can hold it.
    pub fn complete(&self, i: usize) {
        let guard = epoch::pin();
        // The slot is emptied before its bit is cleared: the writer takes a clear bit for
        // an empty slot and fills it at once (`insert`), so clearing the bit first let a
        // new tail land in the slot before this swap, which then took (and destroyed)
        // that tail instead of this one, and the new tail's job read a null slot. A
        // reader that sees the bit set and the slot empty goes to the volume, which
        // holds this tail's bytes by now.
        let prev = self.slots[i].swap(epoch::Shared::null(), Ordering::AcqRel, &guard);
        self.mask.fetch_and(!(1 << i), Ordering::AcqRel);
        if !prev.is_null() {
            // SAFETY: unreachable for new readers (bit cleared, slot null); readers that
            // loaded it hold guards pinned before this point.
            unsafe { guard.defer_destroy(prev) };
            guard.flush();
        }
    }

    /// The closed tail that holds volume offset `ptr`, if its write is not done.
    #[inline]
    pub fn find<'g>(&self, ptr: u64, guard: &'g epoch::Guard) -> Option<&'g Tail> {
        let mut mask = self.mask.load(Ordering::Acquire);
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            // SAFETY: protected by the guard: a completed slot's tail is destroyed only
            // after every guard pinned before its completion is gone. A slot emptied (or
            // even filled again with a later segment) since the mask was read only sends
            // the reader to the volume, where a completed write's bytes are.
            if let Some(t) = unsafe { self.slots[i].load(Ordering::Acquire, guard).as_ref() } {
                if t.contains(ptr) {
                    return Some(t);
                }
            }
        }
        None
    }
}

impl Drop for InFlightTails {
    /// Frees what is left: tails whose write failed (kept readable, since their bytes
    /// never reached the volume). Nobody can reach them: the region's log is gone and
    /// no job holds this any more.
    fn drop(&mut self) {
        for slot in &self.slots {
            // SAFETY: `&mut self`: no reader or job is left (see above).
            unsafe {
                let t = slot.swap(
                    epoch::Shared::null(),
                    Ordering::AcqRel,
                    epoch::unprotected(),
                );
                if !t.is_null() {
                    drop(t.into_owned());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DiskOffset;
    use crossbeam_epoch::Owned;

    #[test]
    fn a_tail_is_found_until_its_slot_completes() {
        let slots = InFlightTails::new();
        let guard = epoch::pin();
        let tail = Owned::new(Tail::new(DiskOffset(1 << 20), 64 << 10, 3)).into_shared(&guard);
        // SAFETY: single appender in this test.
        unsafe { tail.deref().append(5, |b| b.copy_from_slice(b"hello")) };
        assert!(slots.find(1 << 20, &guard).is_none());
        let i = slots.insert(tail);
        assert_eq!(slots.len(), 1);
        let found = slots.find(1 << 20, &guard).expect("in flight");
        assert_eq!(found.read(1 << 20, 5), Some(&b"hello"[..]));
        assert!(slots.find(2 << 20, &guard).is_none(), "another segment");
        slots.complete(i);
        assert!(slots.find(1 << 20, &guard).is_none());
        assert_eq!(slots.len(), 0);
    }

    /// The story: kill -9 cycle 60 of a CI run (M3, GC-heavy writer) ended with the
    /// writer's own segfault, in a write-queue worker locking a null address. `complete`
    /// cleared a slot's bit before emptying the slot; the writer, inserting the next
    /// closed tail at that moment, took the free bit and stored its tail in the slot, and
    /// the completion's swap then took that new tail and destroyed it: the new tail's job
    /// found its slot empty. Here one thread inserts while others complete, each job
    /// checking that its slot still holds its own tail until it completes it.
    #[test]
    fn a_completion_never_takes_the_tail_inserted_after_it() {
        use std::sync::mpsc;
        let slots = std::sync::Arc::new(InFlightTails::new());
        let (jobs, queue) = mpsc::channel::<(usize, u64)>();
        let queue = std::sync::Arc::new(std::sync::Mutex::new(queue));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let (slots, queue) = (slots.clone(), queue.clone());
                std::thread::spawn(move || loop {
                    let Ok((i, order)) = queue.lock().unwrap().recv() else {
                        return;
                    };
                    // SAFETY: this thread is slot `i`'s job until `complete(i)`.
                    let tail = unsafe { slots.get(i) };
                    assert_eq!(tail.order, order, "slot {i} holds another job's tail");
                    slots.complete(i);
                })
            })
            .collect();
        for order in 0..200_000u64 {
            while !slots.has_free() {
                std::hint::spin_loop();
            }
            let guard = epoch::pin();
            let tail =
                Owned::new(Tail::new(DiskOffset(order << 16), 4096, order)).into_shared(&guard);
            let i = slots.insert(tail);
            jobs.send((i, order)).unwrap();
        }
        drop(jobs);
        for w in workers {
            w.join().expect("a job found its slot holding another tail");
        }
    }

    #[test]
    fn slots_fill_up_and_free_again() {
        let slots = InFlightTails::new();
        let guard = epoch::pin();
        for k in 0..SLOTS as u64 {
            let t = Owned::new(Tail::new(DiskOffset(k << 16), 64 << 10, k)).into_shared(&guard);
            slots.insert(t);
        }
        assert!(!slots.has_free());
        slots.complete(17);
        assert!(slots.has_free());
        assert!(slots.find(17 << 16, &guard).is_none());
        assert!(slots.find(18 << 16, &guard).is_some());
        // The rest are freed by Drop.
    }
}
