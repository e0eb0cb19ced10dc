//! One member of a volume over several: its backend, name, identity, counters, and the
//! dirty flag and sync lock behind `MemberSet::sync`.
//!
//! Owns: the member's `fdatasync` protocol: a sync of a member waits for one already in
//! flight (a commit's beside a group sync's), then runs its own if a write completed since
//! that one began; so whoever asks for a sync returns only once every write to the member
//! that completed before the call is durable. And `MemberList`, the set's members: a
//! fixed array of `MEMBERS_MAX` slots, each filled once, and a published length, so a
//! member added to an open volume appears without a lock on any reader's path. Does not
//! own: routing or placement (`members.rs`), nor the add (`table.rs`).
//!
//! Thread-safety: `Send + Sync`; the counters and the dirty flag are atomics, `sync_lock`
//! is held for the length of one `fdatasync` of the member. `MemberList::push` is called
//! by one thread at a time (the set's `grow_lock`); readers take `len` (acquire) and index
//! below it, which sees each member whole (its slot was filled before the length's
//! release store).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::error::Result;
use crate::volume::dispatch::{Kind, Load};
use crate::volume::slot_header::{Uuid, MEMBERS_MAX, REMOVED_UUID};
use crate::volume::Storage;

/// One member: its backend, its name for messages, its identity and counters.
pub(super) struct Member {
    pub(super) storage: Arc<dyn Storage>,
    pub(super) name: String,
    pub(super) uuid: Uuid,
    /// The stand-in of a removed member (its table entry is `REMOVED_UUID`): it holds no
    /// group, takes none, and its storage refuses I/O.
    pub(super) removed: bool,
    /// Being removed from the open volume, or removed from it (`moving.rs`): placement
    /// and dispatch pass over it, as over a stand-in.
    pub(super) draining: AtomicBool,
    /// Written (or grown, or punched) since its last `fdatasync` began. Set after each
    /// write completes; cleared under `sync_lock` just before an `fdatasync`.
    pub(super) dirty: AtomicBool,
    /// Held while one `fdatasync` of this member runs.
    sync_lock: Mutex<()>,
    pub(super) written_bytes: AtomicU64,
    pub(super) read_bytes: AtomicU64,
    /// Requests in flight and measured speeds, for dispatch and statistics.
    pub(super) load: Load,
}

impl Member {
    pub(super) fn new(name: String, storage: Arc<dyn Storage>, uuid: Uuid) -> Member {
        Member {
            storage,
            name,
            uuid,
            removed: uuid == REMOVED_UUID,
            draining: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            sync_lock: Mutex::new(()),
            written_bytes: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            load: Load::default(),
        }
    }

    /// Whether placement and dispatch must pass over this member: a removed member's
    /// stand-in, or one being removed from the open volume.
    #[inline]
    pub(super) fn takes_nothing(&self) -> bool {
        self.removed || self.draining.load(Ordering::Relaxed)
    }

    /// Runs one request of `kind` and `bytes` on this member, counted in its load.
    pub(super) fn timed<T>(
        &self,
        kind: Kind,
        bytes: u64,
        io: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.load.start(kind, bytes);
        let started = std::time::Instant::now();
        let result = io();
        let elapsed_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.load.finish(kind, bytes, elapsed_ns);
        result
    }

    /// Whether a write to this member may not be durable yet: it is dirty, or an
    /// `fdatasync` of it is running. When neither holds, every write that completed before
    /// the call is durable: the flag, read clean, was cleared under the lock (the clear
    /// is ordered after the lock's acquisition), and the lock, read free afterwards, was
    /// released after that `fdatasync` returned.
    pub(super) fn needs_sync(&self) -> bool {
        self.dirty.load(Ordering::Acquire) || self.sync_lock.is_locked()
    }

    /// Makes every write to this member that completed before the call durable. Waits for
    /// an `fdatasync` in flight; runs one if the member was written since it began. A
    /// failed `fdatasync` leaves the member dirty (the next sync tries again; the store is
    /// poisoned by then, so nothing is acknowledged on its word).
    pub(super) fn sync(&self) -> Result<()> {
        let _one = self.sync_lock.lock();
        // Cleared before the `fdatasync`: a write that completes during it stays dirty.
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        self.storage.sync().inspect_err(|_| {
            self.dirty.store(true, Ordering::Release);
        })
    }
}

/// The members of a set, in order: `MEMBERS_MAX` slots filled once each, the first `len`
/// of them published. Indexing below `len` is one more acquire load than a `Vec` (the
/// slot's), which is what lets an open volume gain a member while readers, writers,
/// commits and the dispatcher run, with no lock and no reference count on their path.
pub(super) struct MemberList {
    slots: Box<[OnceLock<Member>]>,
    len: AtomicUsize,
}

impl MemberList {
    pub(super) fn new(members: Vec<Member>) -> MemberList {
        assert!(
            members.len() <= MEMBERS_MAX,
            "more members than a volume has"
        );
        let list = MemberList {
            slots: (0..MEMBERS_MAX).map(|_| OnceLock::new()).collect(),
            len: AtomicUsize::new(0),
        };
        for member in members {
            list.push(member);
        }
        list
    }

    /// Members published.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Publishes `member` as the next one. One caller at a time (the set's `grow_lock`,
    /// or the constructor); panics past `MEMBERS_MAX` (the add refuses that first).
    pub(super) fn push(&self, member: Member) {
        let at = self.len.load(Ordering::Acquire);
        if self.slots[at].set(member).is_err() {
            panic!("member slot {at} filled twice: two adds at once");
        }
        self.len.store(at + 1, Ordering::Release);
    }

    pub(super) fn get(&self, m: usize) -> Option<&Member> {
        if m < self.len() {
            self.slots[m].get()
        } else {
            None
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Member> {
        self.slots[..self.len()].iter().map(|slot| {
            slot.get()
                .expect("a member slot below the published length is filled")
        })
    }
}

impl std::ops::Index<usize> for MemberList {
    type Output = Member;

    /// Member `m`, which must be published (its index came from the group map or from
    /// below `len`, both written after the member was).
    #[inline]
    fn index(&self, m: usize) -> &Member {
        self.slots[m]
            .get()
            .expect("a member index from the map or below the length is published")
    }
}
