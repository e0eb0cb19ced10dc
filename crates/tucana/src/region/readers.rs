//! Who still reads old tree epochs: snapshots, live ranges and pinned commits register the
//! epoch they read, and the reclaim of retired nodes and emptied log segments frees nothing
//! retired after the oldest registered epoch (DESIGN.md, "Two seeking threads").
//!
//! Owns: the registrations, counted per epoch in shards. Does not own: what a registration
//! protects or when it is freed (`Tree::reclaim`, `relocate`), nor which epoch a reader
//! registers (the region: the sealed epoch of a snapshot, the one before the running epoch
//! for a live range).
//!
//! Thread-safety: every method may be called from any thread. Each shard is a mutex of its
//! own on its own cache lines; a thread registers in the shard it was given at its first
//! registration (round robin), so two threads making ranges share neither a lock nor a
//! line, where one mutex per region moved its line between the cores twice per range.
//! [`Readers::oldest`] takes the shards' locks one after the other. That is enough: a
//! registration made in a shard after `oldest` looked at it reads the tree after the
//! reclaim began, and everything the reclaim may free was retired, so unreachable from the
//! tree, before that (retired in an epoch at or below the durable one, which is below the
//! running epoch any reader can still find it in); the argument the single mutex made.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::types::TreeEpoch;

/// Shards per region: more than the threads that make ranges at once on most machines;
/// two threads given the same shard only share a lock again.
const SHARDS: usize = 8;

/// A registration, handed back to [`Readers::close`].
#[derive(Clone, Copy, Debug)]
pub struct ReaderTicket {
    pub epoch: TreeEpoch,
    shard: usize,
}

/// Registrations of one shard: readers per epoch. An epoch whose count fell to zero keeps
/// its entry until [`Readers::oldest`] prunes it: live ranges register and close at the
/// same epoch between two commits, and removing the only entry and inserting it again
/// freed and allocated a map node per range.
#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<BTreeMap<TreeEpoch, usize>>);

pub struct Readers {
    shards: [Shard; SHARDS],
}

/// The next shard a thread is given.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, given at its first registration.
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
}

impl Readers {
    pub fn new() -> Readers {
        Readers {
            shards: Default::default(),
        }
    }

    /// Registers a reader of `epoch` in this thread's shard.
    pub fn register(&self, epoch: TreeEpoch) -> ReaderTicket {
        self.register_with(|| epoch)
    }

    /// Registers a reader of the epoch `epoch` names, called under the shard's lock (so
    /// that a reclaim deciding now sees the registration, or ran before the reader
    /// read anything).
    pub fn register_with(&self, epoch: impl FnOnce() -> TreeEpoch) -> ReaderTicket {
        // A thread being destroyed (its locals gone) uses shard 0.
        let shard = SHARD.try_with(|s| *s).unwrap_or(0);
        let mut counts = self.shards[shard].0.lock();
        let epoch = epoch();
        *counts.entry(epoch).or_insert(0) += 1;
        ReaderTicket { epoch, shard }
    }

    /// Ends a registration.
    pub fn close(&self, ticket: ReaderTicket) {
        let mut counts = self.shards[ticket.shard].0.lock();
        let count = counts
            .get_mut(&ticket.epoch)
            .expect("reader was registered");
        *count -= 1;
    }

    /// The oldest epoch a registered reader reads; prunes epochs nobody reads any more.
    pub fn oldest(&self) -> Option<TreeEpoch> {
        let mut oldest: Option<TreeEpoch> = None;
        for shard in &self.shards {
            let mut counts = shard.0.lock();
            counts.retain(|_, count| *count > 0);
            if let Some(&first) = counts.keys().next() {
                oldest = Some(oldest.map_or(first, |o| o.min(first)));
            }
        }
        oldest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_open_registration_of_any_shard_and_thread_is_reported() {
        let readers = std::sync::Arc::new(Readers::new());
        assert_eq!(readers.oldest(), None);
        let a = readers.register(TreeEpoch(7));
        // Other threads register in other shards.
        let tickets: Vec<ReaderTicket> = (0..SHARDS as u64 + 2)
            .map(|i| {
                let readers = readers.clone();
                std::thread::spawn(move || readers.register(TreeEpoch(10 + i)))
                    .join()
                    .unwrap()
            })
            .collect();
        assert_eq!(readers.oldest(), Some(TreeEpoch(7)));
        let b = readers.register(TreeEpoch(3));
        assert_eq!(readers.oldest(), Some(TreeEpoch(3)));
        readers.close(b);
        assert_eq!(readers.oldest(), Some(TreeEpoch(7)));
        readers.close(a);
        assert_eq!(readers.oldest(), Some(TreeEpoch(10)));
        // Closed on another thread than the one that registered.
        let readers2 = readers.clone();
        std::thread::spawn(move || {
            for t in tickets {
                readers2.close(t);
            }
        })
        .join()
        .unwrap();
        assert_eq!(readers.oldest(), None);
    }

    #[test]
    fn two_readers_of_one_epoch_keep_it_until_both_close() {
        let readers = Readers::new();
        let a = readers.register(TreeEpoch(5));
        let b = readers.register(TreeEpoch(5));
        readers.close(a);
        assert_eq!(readers.oldest(), Some(TreeEpoch(5)));
        readers.close(b);
        assert_eq!(readers.oldest(), None);
    }
}
