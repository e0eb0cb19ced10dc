//! The [`Kv`] trait the string commands are written against, and its stores: one that
//! reads the keyspace as it is ([`ReadKv`]), one that reads and writes under the
//! database's write lock ([`LockedKv`]), the overlay of `EXEC` and of a pipelined run
//! of collection writes ([`TxKv`]), whose writes become one atomic engine batch at the
//! end, and the reads of a replica's last applied commit on a backup ([`ReplicaKv`],
//! cluster mode's `READONLY`).
//!
//! Owns how a handler's reads and writes reach the engine (buffered: durability is the
//! batch's business, `batch::Written`), the keyspace hit and miss counts of those
//! reads, and when a handler's keyspace notifications are published ([`Kv::notify`]: at
//! once under the write lock, after the batch inside `EXEC`). It does not own the locks (`store`) or the handlers (`strings`).
//!
//! Thread-safety: a store lives for one command (or one `EXEC`, or one run) on one thread; the write
//! lock it may hold is released when it is dropped.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use tucana::{Durability, Keyspace};

use crate::state::ServerState;
use crate::store::WriteGuard;

/// Records read by [`Kv::range`]: stored key (as the handler names it) and value.
pub(super) type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The bounds of a [`Kv::range`].
pub(super) type Bounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// Writes for [`Kv::apply`]: a put (`Some(value)`) or a delete (`None`) per key.
pub(super) type Ops = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Reads and writes of the string commands; see the module doc for the three kinds.
pub(super) trait Kv {
    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>>;
    /// Length of the value, without copying it.
    fn value_len(&mut self, key: &[u8]) -> tucana::Result<Option<usize>> {
        Ok(self.get(key)?.map(|v| v.len()))
    }
    /// Applies puts (`Some`) and deletes (`None`) atomically.
    fn apply(&mut self, ops: Ops) -> tucana::Result<()>;

    /// The values of `keys`, in order. Stores override it to read them all at once.
    fn multi_get(&mut self, keys: &[Vec<u8>]) -> tucana::Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|key| self.get(key)).collect()
    }

    /// A read that is not counted as a keyspace hit or miss (deadline records, and
    /// values whose deadline decides whether they count, see `count_lookup`).
    fn lookup(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>>;
    /// Counts a client's lookup of `key` (as this store names it) as a keyspace hit or
    /// miss; a read-only command's miss also raises `keymiss` (see `ReadKv`).
    fn count_lookup(&mut self, key: &[u8], hit: bool);
    /// The records in `bounds`, in key order (`rev`: descending), at most `limit`; not
    /// counted as lookups (the collection commands read sub-records with it).
    fn range(&mut self, bounds: Bounds, rev: bool, limit: usize) -> tucana::Result<Pairs>;
    /// Whether keys here may have deadlines (`Slot::may_expire`); when not, none has.
    fn may_expire(&self) -> bool;
    /// The next `apply` writes a deadline: the store adds the keyspace's marker of
    /// deadlines to it if the keyspace has none yet.
    fn note_deadline(&mut self);
    /// The next `apply` may abandon a collection's version (`Slot::abandonments`): once
    /// it is applied, the store counts it, so the collector of old versions walks again.
    fn note_abandoned(&mut self);
    /// `key` (as this store names it) was modified by the last `apply`, though it wrote
    /// no record of it (a collection's sub-records under unchanged metadata): marked
    /// modified for WATCH and blocked clients, as a write of it is.
    fn touch(&mut self, key: &[u8]);

    /// The server's run-time settings (OBJECT ENCODING reads Redis's thresholds there).
    fn settings(&self) -> &crate::settings::Settings;

    /// The keyspace notification classes on for this command (`Settings::notify_flags`,
    /// loaded once when a writing store is made; 0 in the read-only ones).
    fn notify_flags(&self) -> u32 {
        0
    }

    /// Keyspace notification `event` of `class` (`notify`'s flags) about `key` (the
    /// client's): published when the class is on, after the write it reports (a handler
    /// calls it after its `apply`). Nothing in the read-only stores.
    fn notify(&mut self, _class: u32, _event: &'static str, _key: &[u8]) {}

    /// Cluster mode: the hash slot whose keys this store reads and writes (a command
    /// that would name keys of other slots refuses, e.g. SORT's BY, GET and STORE).
    fn hash_slot(&self) -> Option<u16> {
        None
    }
}

/// Appends the marker of deadlines to `ops` when a deadline is written to a keyspace that
/// has none yet; the caller marks the slot once the write succeeded.
fn with_marker(ops: &mut Ops, noted: bool, may_expire: bool) -> bool {
    let add = noted && !may_expire;
    if add {
        ops.push((crate::expiry::MARKER.to_vec(), Some(Vec::new())));
    }
    add
}

/// `Kv::range` on a keyspace (none yet: no records).
fn read_range(
    ks: Option<&Keyspace>,
    bounds: Bounds,
    rev: bool,
    limit: usize,
) -> tucana::Result<Pairs> {
    let Some(ks) = ks else {
        return Ok(Vec::new());
    };
    let range = ks.range::<Vec<u8>, _>(bounds);
    // Told how many it takes, the range copies no more of a leaf than that and asks the
    // device for no record past them; `usize::MAX` (all of it) says nothing.
    let range = if limit < usize::MAX {
        range.limit(limit)
    } else {
        range
    };
    if rev {
        range.rev().collect()
    } else {
        range.collect()
    }
}

/// Reads of a replica's last applied commit (a backup under `READONLY`); no writes.
pub(super) struct ReplicaKv<'a> {
    /// `None` while nothing of the region has reached this backup.
    pub(super) replica: Option<tucana::replication::ReplicaHandle>,
    pub(super) state: &'a ServerState,
}

impl Kv for ReplicaKv<'_> {
    fn settings(&self) -> &crate::settings::Settings {
        &self.state.settings
    }

    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        let value = match &self.replica {
            Some(replica) => replica.get(key)?,
            None => None,
        };
        self.state.metrics.count_lookup(value.is_some());
        Ok(value)
    }

    fn apply(&mut self, _ops: Ops) -> tucana::Result<()> {
        debug_assert!(false, "a read-only command wrote");
        Err(tucana::Error::InvalidArgument(
            "internal error: write in a read-only command".into(),
        ))
    }

    fn lookup(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        match &self.replica {
            Some(replica) => replica.get(key),
            None => Ok(None),
        }
    }

    fn count_lookup(&mut self, _key: &[u8], hit: bool) {
        self.state.metrics.count_lookup(hit);
    }

    fn range(&mut self, _bounds: Bounds, _rev: bool, _limit: usize) -> tucana::Result<Pairs> {
        Err(tucana::Error::InvalidArgument(
            "reading a collection's members from a backup (READONLY) is not supported yet".into(),
        ))
    }

    /// The primary's marker of deadlines is not at hand here; answering yes makes every
    /// read look for the key's deadline record, so a backup never serves an expired key.
    fn may_expire(&self) -> bool {
        true
    }

    fn note_deadline(&mut self) {}

    fn note_abandoned(&mut self) {}

    /// Read-only: `apply` refused before anything could be touched.
    fn touch(&mut self, _key: &[u8]) {}
}

/// Reads on the keyspace as it is; no writes.
pub(super) struct ReadKv<'a> {
    pub(super) ks: Option<&'a Keyspace>,
    pub(super) state: &'a ServerState,
    /// `Slot::may_expire` when the read started.
    pub(super) may_expire: bool,
    /// A read-only command's store: the database whose misses raise `keymiss` (Redis's
    /// `m` class; `None` for the server's own reads, such as WATCH's).
    pub(super) misses_of: Option<u32>,
}

impl ReadKv<'_> {
    /// A client's read of `key` (stored name) found nothing: `keymiss`, when the `m`
    /// class is on (one atomic load per miss). In cluster mode the event names the
    /// client's key, without the slot prefix, in database 0.
    fn missed(&self, key: &[u8]) {
        let Some(db) = self.misses_of else {
            return;
        };
        let flags = self.state.settings.notify_flags();
        if !crate::notify::wants(flags, crate::notify::KEY_MISS) {
            return;
        }
        let key = match self.state.cluster {
            Some(_) => match tucana_cluster::split_storage_key(key) {
                Ok((_, key)) => key,
                Err(_) => return,
            },
            None => key,
        };
        self.state.notify(flags, db, "keymiss", key);
    }
}

impl Kv for ReadKv<'_> {
    fn settings(&self) -> &crate::settings::Settings {
        &self.state.settings
    }

    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        let value = match self.ks {
            Some(ks) => ks.get(key)?,
            None => None,
        };
        self.state.metrics.count_lookup(value.is_some());
        if value.is_none() {
            self.missed(key);
        }
        Ok(value)
    }

    fn value_len(&mut self, key: &[u8]) -> tucana::Result<Option<usize>> {
        match self.ks {
            Some(ks) => ks.get_with(key, |v| v.len()),
            None => Ok(None),
        }
    }

    /// One `Keyspace::multi_get`: the records not in memory are read in parallel.
    fn multi_get(&mut self, keys: &[Vec<u8>]) -> tucana::Result<Vec<Option<Vec<u8>>>> {
        let values = match self.ks {
            Some(ks) => ks.multi_get(keys)?,
            None => vec![None; keys.len()],
        };
        for (key, value) in keys.iter().zip(&values) {
            self.state.metrics.count_lookup(value.is_some());
            if value.is_none() {
                self.missed(key);
            }
        }
        Ok(values)
    }

    fn apply(&mut self, _ops: Ops) -> tucana::Result<()> {
        // The command table marks every command that writes; reaching this is a bug.
        debug_assert!(false, "a read-only command wrote");
        Err(tucana::Error::InvalidArgument(
            "internal error: write in a read-only command".into(),
        ))
    }

    fn lookup(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        match self.ks {
            Some(ks) => ks.get(key),
            None => Ok(None),
        }
    }

    fn count_lookup(&mut self, key: &[u8], hit: bool) {
        self.state.metrics.count_lookup(hit);
        if !hit {
            self.missed(key);
        }
    }

    fn range(&mut self, bounds: Bounds, rev: bool, limit: usize) -> tucana::Result<Pairs> {
        read_range(self.ks, bounds, rev, limit)
    }

    fn may_expire(&self) -> bool {
        self.may_expire
    }

    fn note_deadline(&mut self) {}

    fn note_abandoned(&mut self) {}

    /// Read-only: `apply` refused before anything could be touched.
    fn touch(&mut self, _key: &[u8]) {}
}

/// Applies `ops` to `ks` as one atomic, buffered write (durability is the batch's, see
/// `execute_batch`), from `ops`' own buffers; a lone put or delete without a vector.
fn write_ops(ks: &Keyspace, ops: &Ops) -> tucana::Result<()> {
    if let [(key, value)] = ops.as_slice() {
        match value {
            Some(v) => ks.put_with(key, v, Durability::Buffered)?,
            None => ks.delete_with(key, Durability::Buffered).map(|_| ())?,
        };
        return Ok(());
    }
    ks.write_all(ops, Durability::Buffered)
}

/// What follows an applied write of `ops`: the marker of deadlines noted (`marking`), an
/// abandoned version counted (`abandons`, `Slot::abandonments`), and the keys marked
/// modified for WATCH and blocked clients.
fn applied(guard: &WriteGuard<'_>, ops: &Ops, marking: bool, abandons: bool, slot_prefixed: bool) {
    if marking {
        guard.set_may_expire();
    }
    if abandons {
        guard.note_abandoned();
    }
    guard.modified(ops.iter().map(|(k, _)| k.as_slice()), slot_prefixed);
}

/// Reads and writes under the database's write lock.
pub(super) struct LockedKv<'a> {
    pub(super) guard: WriteGuard<'a>,
    pub(super) state: &'a ServerState,
    pub(super) wrote: bool,
    /// `note_deadline` was called: the next `apply` writes a deadline.
    pub(super) deadline_noted: bool,
    /// `note_abandoned` was called: the next `apply` may abandon a version.
    abandon_noted: bool,
    /// `Settings::notify_flags` when the command started.
    notify_flags: u32,
}

impl<'a> LockedKv<'a> {
    /// A store for one command holding `guard`.
    pub(super) fn new(guard: WriteGuard<'a>, state: &'a ServerState) -> LockedKv<'a> {
        LockedKv {
            guard,
            state,
            wrote: false,
            deadline_noted: false,
            abandon_noted: false,
            notify_flags: state.settings.notify_flags(),
        }
    }
}

impl Kv for LockedKv<'_> {
    fn settings(&self) -> &crate::settings::Settings {
        &self.state.settings
    }

    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        let value = match self.guard.existing() {
            Some(ks) => ks.get(key)?,
            None => None,
        };
        self.state.metrics.count_lookup(value.is_some());
        Ok(value)
    }

    fn apply(&mut self, mut ops: Ops) -> tucana::Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let noted = std::mem::take(&mut self.deadline_noted);
        let abandons = std::mem::take(&mut self.abandon_noted);
        let marking = with_marker(&mut ops, noted, self.guard.may_expire());
        let ks = self.guard.keyspace(&self.state.store.db)?;
        self.wrote = true;
        // Durability is handled per batch by `execute_batch` (one sync for the batch).
        write_ops(&ks, &ops)?;
        applied(
            &self.guard,
            &ops,
            marking,
            abandons,
            self.state.cluster.is_some(),
        );
        Ok(())
    }

    fn lookup(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        match self.guard.existing() {
            Some(ks) => ks.get(key),
            None => Ok(None),
        }
    }

    fn count_lookup(&mut self, _key: &[u8], hit: bool) {
        self.state.metrics.count_lookup(hit);
    }

    fn range(&mut self, bounds: Bounds, rev: bool, limit: usize) -> tucana::Result<Pairs> {
        read_range(self.guard.existing().as_ref(), bounds, rev, limit)
    }

    fn may_expire(&self) -> bool {
        self.guard.may_expire()
    }

    fn note_deadline(&mut self) {
        self.deadline_noted = true;
    }

    fn note_abandoned(&mut self) {
        self.abandon_noted = true;
    }

    /// At once: the write it follows is applied, and the lock is still held.
    fn touch(&mut self, key: &[u8]) {
        self.guard.modified([key], self.state.cluster.is_some());
    }

    fn notify_flags(&self) -> u32 {
        self.notify_flags
    }

    /// Published at once, under the write lock: subscribers see a database's events in
    /// the order of its writes.
    fn notify(&mut self, class: u32, event: &'static str, key: &[u8]) {
        if crate::notify::wants(self.notify_flags, class) {
            self.state
                .notify(self.notify_flags, self.guard.index(), event, key);
        }
    }
}

/// Inside `EXEC`, and for a pipelined run of collection writes (`runs`): reads see the
/// store's own writes, writes wait in an overlay that becomes one atomic batch at the end.
///
/// The database's write lock is held from construction to drop, so the keyspace handle
/// (taken once) and every record outside the overlay stay as they were: no other writer,
/// FLUSHDB or reload can run meanwhile.
pub(super) struct TxKv<'a> {
    guard: WriteGuard<'a>,
    state: &'a ServerState,
    /// The keyspace when the store was made (`None`: not created yet; the commit creates it).
    ks: Option<Keyspace>,
    /// Writes not applied yet, by key: a put (`Some`) or a delete (`None`), which hides the
    /// stored record. Ordered, so that `range` merges it with the keyspace's records lazily.
    overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Deadline records read from the keyspace since the last commit, by key. The write
    /// lock keeps the keyspace as it was until the commit, so a second read of the same
    /// record answers from here: a run of 16 pops of one list reads its deadline once,
    /// not 16 times (each engine lookup of a reserved key is a descent whose pivots tie
    /// on their prefixes, DESIGN.md "Data types"). `None`: not kept (EXEC, whose
    /// queued commands of other kinds may reach the keyspace outside this store).
    deadlines_read: Option<HashMap<Vec<u8>, Option<Vec<u8>>>>,
    /// A queued command wrote a deadline: the batch at the end carries the marker.
    deadline_noted: bool,
    /// A queued command may have abandoned a collection's version: counted once the
    /// batch at the end is applied.
    abandon_noted: bool,
    /// `apply` was called with writes since the last `take_wrote`.
    wrote: bool,
    /// Keys `touch`ed since the last commit: marked modified with the overlay's.
    touched: Vec<Vec<u8>>,
    /// `Settings::notify_flags` when EXEC started.
    notify_flags: u32,
    /// The transaction's keyspace notifications, published once its batch is applied.
    events: Vec<(&'static str, Vec<u8>)>,
}

impl<'a> TxKv<'a> {
    /// The store of one `EXEC` (or one run) holding `guard`.
    pub(super) fn new(guard: WriteGuard<'a>, state: &'a ServerState) -> TxKv<'a> {
        TxKv {
            ks: guard.existing(),
            guard,
            state,
            overlay: BTreeMap::new(),
            deadlines_read: None,
            deadline_noted: false,
            abandon_noted: false,
            wrote: false,
            touched: Vec::new(),
            notify_flags: state.settings.notify_flags(),
            events: Vec::new(),
        }
    }

    /// The store of a pipelined run of collection writes (`runs`): as [`TxKv::new`], and
    /// deadline records read once per key (every command of a run is a handler reading
    /// and writing through this store).
    pub(super) fn for_run(guard: WriteGuard<'a>, state: &'a ServerState) -> TxKv<'a> {
        TxKv {
            deadlines_read: Some(HashMap::new()),
            ..TxKv::new(guard, state)
        }
    }

    /// Whether `apply` was given writes since the last call (a run's command that wrote:
    /// in sync mode its reply waits for the sync).
    pub(super) fn take_wrote(&mut self) -> bool {
        std::mem::take(&mut self.wrote)
    }

    /// The overlay as one atomic engine batch (with the marker of deadlines if one was
    /// written), then the transaction's keyspace notifications, in the order its
    /// commands raised them (none if the batch failed: nothing happened); `Ok(false)`
    /// when there was nothing to write.
    pub(super) fn commit(&mut self) -> tucana::Result<bool> {
        let wrote = self.commit_batch()?;
        for (event, key) in std::mem::take(&mut self.events) {
            self.state
                .notify(self.notify_flags, self.guard.index(), event, &key);
        }
        Ok(wrote)
    }

    fn commit_batch(&mut self) -> tucana::Result<bool> {
        if self.overlay.is_empty() {
            // A touch comes with writes of other keys, and those are in the overlay.
            debug_assert!(self.touched.is_empty());
            return Ok(false);
        }
        // After the batch the keyspace holds the overlay's writes: what was read before
        // may no longer be what is stored.
        if let Some(read) = &mut self.deadlines_read {
            read.clear();
        }
        let mut ops: Ops = std::mem::take(&mut self.overlay).into_iter().collect();
        let marking = with_marker(&mut ops, self.deadline_noted, self.guard.may_expire());
        let ks = self.guard.keyspace(&self.state.store.db)?;
        write_ops(&ks, &ops)?;
        let abandons = std::mem::take(&mut self.abandon_noted);
        let slot_prefixed = self.state.cluster.is_some();
        applied(&self.guard, &ops, marking, abandons, slot_prefixed);
        let touched = std::mem::take(&mut self.touched);
        self.guard
            .modified(touched.iter().map(Vec::as_slice), slot_prefixed);
        Ok(true)
    }

    /// A record as this store sees it: the overlay's write, else the keyspace's.
    fn read(&self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        if let Some(v) = self.overlay.get(key) {
            return Ok(v.clone());
        }
        match &self.ks {
            Some(ks) => ks.get(key),
            None => Ok(None),
        }
    }
}

impl Kv for TxKv<'_> {
    fn settings(&self) -> &crate::settings::Settings {
        &self.state.settings
    }

    /// Counted as a hit or miss also when the overlay answers, as the command would be
    /// counted alone.
    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        let value = self.read(key)?;
        self.state.metrics.count_lookup(value.is_some());
        Ok(value)
    }

    fn apply(&mut self, ops: Ops) -> tucana::Result<()> {
        self.wrote |= !ops.is_empty();
        for (key, value) in ops {
            self.overlay.insert(key, value);
        }
        Ok(())
    }

    fn lookup(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        if self.deadlines_read.is_none()
            || !crate::expiry::is_deadline_key(key)
            || self.overlay.contains_key(key)
        {
            return self.read(key);
        }
        if let Some(value) = self.deadlines_read.as_ref().and_then(|r| r.get(key)) {
            return Ok(value.clone());
        }
        let value = self.read(key)?;
        if let Some(read) = &mut self.deadlines_read {
            read.insert(key.to_vec(), value.clone());
        }
        Ok(value)
    }

    fn count_lookup(&mut self, _key: &[u8], hit: bool) {
        self.state.metrics.count_lookup(hit);
    }

    /// The keyspace's records with the overlay's writes laid over them, merged as they
    /// are read: O(limit + the overlay's writes in the bounds) records, not the bounds'.
    fn range(&mut self, bounds: Bounds, rev: bool, limit: usize) -> tucana::Result<Pairs> {
        if limit == 0 || bounds_empty(&bounds) {
            return Ok(Vec::new());
        }
        // Each overlay write in the bounds consumes at most one stored record besides the
        // `limit` returned, so the stored walk needs no more: told so, a cold range asks
        // the device for no record past them (`Range::limit`).
        let stored_max =
            limit.saturating_add(self.overlay.range::<Vec<u8>, _>(bounds.clone()).count());
        let stored: Box<StoredRecords<'_>> = match &self.ks {
            None => Box::new(std::iter::empty()),
            Some(ks) if rev => Box::new(
                ks.range::<Vec<u8>, _>(bounds.clone())
                    .limit(stored_max)
                    .rev(),
            ),
            Some(ks) => Box::new(ks.range::<Vec<u8>, _>(bounds.clone()).limit(stored_max)),
        };
        let written = self.overlay.range::<Vec<u8>, _>(bounds);
        let written: Box<OverlayWrites<'_>> = if rev {
            Box::new(written.rev())
        } else {
            Box::new(written)
        };
        merge_overlay(stored, written, rev, limit)
    }

    fn may_expire(&self) -> bool {
        self.deadline_noted || self.guard.may_expire()
    }

    fn note_deadline(&mut self) {
        self.deadline_noted = true;
    }

    fn note_abandoned(&mut self) {
        self.abandon_noted = true;
    }

    /// At the commit, with the overlay's keys.
    fn touch(&mut self, key: &[u8]) {
        self.touched.push(key.to_vec());
    }

    fn notify_flags(&self) -> u32 {
        self.notify_flags
    }

    fn notify(&mut self, class: u32, event: &'static str, key: &[u8]) {
        if crate::notify::wants(self.notify_flags, class) {
            self.events.push((event, key.to_vec()));
        }
    }
}

/// Records read from the keyspace for [`TxKv::range`], in the walk's order.
type StoredRecords<'a> = dyn Iterator<Item = tucana::Result<(Vec<u8>, Vec<u8>)>> + 'a;

/// The overlay's writes in a range, in the walk's order: a put or (`None`) a delete.
type OverlayWrites<'a> = dyn Iterator<Item = (&'a Vec<u8>, &'a Option<Vec<u8>>)> + 'a;

/// Whether `bounds` hold no key (a range a `BTreeMap` would refuse: start past end, or
/// equal with either end excluded).
fn bounds_empty(bounds: &Bounds) -> bool {
    match bounds {
        (Bound::Included(lo), Bound::Included(hi)) => lo > hi,
        (Bound::Included(lo) | Bound::Excluded(lo), Bound::Excluded(hi))
        | (Bound::Excluded(lo), Bound::Included(hi)) => lo >= hi,
        _ => false,
    }
}

/// Merges stored records with the overlay's writes of the same bounds, both in the
/// order `rev` says: an overlay entry replaces (put) or hides (delete) the stored record
/// of its key. Stops after `limit` records.
fn merge_overlay<'o>(
    stored: impl Iterator<Item = tucana::Result<(Vec<u8>, Vec<u8>)>>,
    written: impl Iterator<Item = (&'o Vec<u8>, &'o Option<Vec<u8>>)>,
    rev: bool,
    limit: usize,
) -> tucana::Result<Pairs> {
    let mut stored = stored.peekable();
    let mut written = written.peekable();
    let mut out = Vec::new();
    // Whether `a` comes before `b` in the walk's order.
    let before = |a: &[u8], b: &[u8]| if rev { a > b } else { a < b };
    while out.len() < limit {
        let next_stored = match stored.peek() {
            Some(Err(_)) => return Err(stored.next().expect("peeked").unwrap_err()),
            Some(Ok((k, _))) => Some(k.as_slice()),
            None => None,
        };
        let take_written = match (next_stored, written.peek()) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(s), Some((w, _))) => !before(s, w),
        };
        if take_written {
            let (key, value) = written.next().expect("peeked");
            // The overlay's write replaces a stored record of the same key.
            if next_stored == Some(key.as_slice()) {
                stored.next();
            }
            if let Some(value) = value {
                out.push((key.clone(), value.clone()));
            }
            continue;
        }
        match stored.next() {
            Some(Ok(pair)) => out.push(pair),
            Some(Err(e)) => return Err(e),
            None => break,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Pairs {
        list.iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    /// `merge_overlay` of stored `a b c d` and an overlay that replaces `b`, deletes `c`,
    /// adds `bb` and `e`, walked as `rev` says, at most `limit`.
    fn merged(rev: bool, limit: usize) -> Pairs {
        let stored = pairs(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]);
        let overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>> = [
            ("b", Some("B")),
            ("bb", Some("BB")),
            ("c", None),
            ("e", Some("E")),
        ]
        .into_iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec())))
        .collect();
        let stored: Vec<tucana::Result<(Vec<u8>, Vec<u8>)>> = if rev {
            stored.into_iter().rev().map(Ok).collect()
        } else {
            stored.into_iter().map(Ok).collect()
        };
        let written: Vec<_> = if rev {
            overlay.iter().rev().collect()
        } else {
            overlay.iter().collect()
        };
        merge_overlay(stored.into_iter(), written.into_iter(), rev, limit).unwrap()
    }

    #[test]
    fn the_overlay_replaces_hides_and_adds_records_in_walk_order() {
        let all = pairs(&[("a", "1"), ("b", "B"), ("bb", "BB"), ("d", "4"), ("e", "E")]);
        assert_eq!(merged(false, usize::MAX), all);
        let mut reversed = all.clone();
        reversed.reverse();
        assert_eq!(merged(true, usize::MAX), reversed);
        assert_eq!(merged(false, 3), all[..3].to_vec());
        assert_eq!(merged(true, 2), reversed[..2].to_vec());
    }

    #[test]
    fn a_failed_read_of_the_stored_records_is_the_merges_error() {
        let stored = vec![
            Ok((b"a".to_vec(), b"1".to_vec())),
            Err(tucana::Error::InvalidArgument("damaged".into())),
        ];
        let overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let merged = merge_overlay(stored.into_iter(), overlay.iter(), false, 10);
        assert!(merged.is_err());
    }

    #[test]
    fn bounds_that_hold_no_key_are_seen_before_a_btreemap_refuses_them() {
        let b = |s: &str| s.as_bytes().to_vec();
        assert!(bounds_empty(&(
            Bound::Included(b("b")),
            Bound::Included(b("a"))
        )));
        assert!(bounds_empty(&(
            Bound::Excluded(b("a")),
            Bound::Excluded(b("a"))
        )));
        assert!(bounds_empty(&(
            Bound::Included(b("a")),
            Bound::Excluded(b("a"))
        )));
        assert!(!bounds_empty(&(
            Bound::Included(b("a")),
            Bound::Included(b("a"))
        )));
        assert!(!bounds_empty(&(Bound::Unbounded, Bound::Excluded(b("a")))));
        assert!(!bounds_empty(&(Bound::Included(b("a")), Bound::Unbounded)));
    }
}
