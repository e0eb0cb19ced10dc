//! The primary and the link of the backup power-loss suite (`super`): a primary database
//! in memory running a random workload on its replicated keyspaces, every commit it makes
//! collected as a shipper's commit observer collects them, and the shipping of log bytes
//! and commits to a backup database (what `tucana-replication`'s shipper does, without a
//! network), with the bookkeeping a crashed backup is judged by.
//!
//! Owns: the primary; per replicated keyspace its history (every write unit in log order,
//! and how many units each primary commit holds) and what was shipped of it: the commits
//! handed to the backup's `apply`, the units whose records had been handed to
//! `write_log`, and the units and commit the backup had made durable. Does not own: the
//! backup's volume, its own keyspace and where the power goes (`super`), nor judging a
//! recovered backup (`super::verify`).
//!
//! What "durable" means on the backup (DESIGN.md, "Replication"; the `ReplicaHandle`
//! docs): a shipped commit is durable once its `apply` returned `Ok` (it commits the
//! backup's volume); shipped log bytes are durable once any commit of the backup's volume
//! (an `apply`, a `commit`, a forced GC pass, a replica drop) or a `Database::sync` of it
//! returned `Ok` after they were handed to `write_log` (what a backup acknowledging in
//! `--repl-ack durable` mode relies on).
//!
//! Thread-safety: single-threaded; neither database runs background threads.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::Rng;
use tucana::replication::{
    CommitDelta, CommitObserver, Delta, PinnedCommit, RegionDelta, ReplicaHandle,
};
use tucana::{Database, Durability, Error, Keyspace};

use crate::model::{self, DiffWalk, State, Write};
use crate::sim::{Fault, IoKind, SimStorage};
use crate::workload::{self, Op};

/// The replication term of every replica (promotion is at the next one).
pub const TERM: u64 = 1;

/// Collects every commit of the primary, as a shipper's observer does.
#[derive(Default)]
struct Deltas(Mutex<Vec<CommitDelta>>);

impl CommitObserver for Deltas {
    fn committed(&self, delta: CommitDelta) {
        self.0.lock().push(delta);
    }
}

/// What the backup was doing when its power went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nothing: the armed I/O never came, the power went after the life's last step.
    Idle,
    /// Writing shipped log bytes (`write_log`).
    Log,
    /// Applying a shipped commit, before its commit's first sync: node images, then the
    /// free log, descriptor and bitmaps of the backup's commit.
    ApplyWrites,
    /// Applying a shipped commit, at or after its commit's first sync: the superblock.
    ApplySuperblock,
    /// The backup's own work: its `commit` or `sync`, its own keyspace's writes.
    Backup,
    /// Dropping a replica (its primary dropped the keyspace).
    Drop,
}

/// Whether a replicated keyspace was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    No,
    /// The primary dropped it; the backup's `drop_replica` was called and did not return
    /// `Ok` (the power went): the replica may be there or not.
    Attempted,
    /// `drop_replica` returned `Ok`: the replica must be gone.
    Durably,
}

/// How a state compares with the prefixes of a history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefixMatch {
    /// Equal to the state after this many units, within the bounds asked.
    Within(usize),
    /// Equal only to the state after this many units, below the lower bound.
    Below(usize),
    /// Equal to no prefix up to the upper bound.
    Nothing,
}

/// One replicated keyspace: the primary's history of it and what was shipped of it.
pub struct Replicated {
    pub name: String,
    /// Every write unit (a put, a delete, a batch) of the primary's keyspace, in log order.
    units: Vec<Vec<Write>>,
    /// Primary commit epoch → units that commit holds.
    at_epoch: BTreeMap<u64, usize>,
    /// Commits handed to the backup's `apply` (whether it returned or not).
    pub shipped_epochs: BTreeSet<u64>,
    /// The newest commit whose `apply` returned `Ok` (0: none).
    pub durable_epoch: u64,
    /// Newest commit applied in this life (older deltas are skipped).
    applied: u64,
    /// The backup may have missed commits (it was reopened after a crash): the next
    /// commit goes in full, as the shipper sends it.
    needs_full: bool,
    /// Units written when the last shipping of log began: no record past them was ever
    /// handed to the backup.
    pub shipped_units: usize,
    /// Units written when the last shipping that completed began.
    received_units: usize,
    /// `received_units` at the backup's last durable point (see the module doc).
    pub durable_units: usize,
    pub dropped: Dropped,
    /// Commits of the primary not applied yet, oldest first.
    pending: Vec<(u64, RegionDelta)>,
}

impl Replicated {
    fn new(name: &str) -> Replicated {
        Replicated {
            name: name.to_string(),
            units: Vec::new(),
            at_epoch: BTreeMap::new(),
            shipped_epochs: BTreeSet::new(),
            durable_epoch: 0,
            applied: 0,
            needs_full: false,
            shipped_units: 0,
            received_units: 0,
            durable_units: 0,
            dropped: Dropped::No,
            pending: Vec::new(),
        }
    }

    /// Units primary commit `epoch` holds, if the link saw that commit.
    pub fn units_at(&self, epoch: u64) -> Option<usize> {
        self.at_epoch.get(&epoch).copied()
    }

    /// The keyspace's contents after its first `n` units.
    pub fn state_after(&self, n: usize) -> State {
        let mut s = State::new();
        for unit in &self.units[..n] {
            model::apply(&mut s, unit);
        }
        s
    }

    /// Whether `target` is the keyspace's contents after some `n` units, `lo <= n <= hi`.
    pub fn prefix_of(&self, target: &State, lo: usize, hi: usize) -> PrefixMatch {
        let mut walk = DiffWalk::new(&State::new(), target);
        let mut below = None;
        for n in 0..=hi.min(self.units.len()) {
            if n > 0 {
                walk.apply(&self.units[n - 1], target);
            }
            if walk.diff == 0 {
                if n >= lo {
                    return PrefixMatch::Within(n);
                }
                below = Some(n);
            }
        }
        below.map_or(PrefixMatch::Nothing, PrefixMatch::Below)
    }

    /// The backup reopened after a crash holds this keyspace's replica at `upstream`:
    /// the next life starts from it (the node map is gone: the next commit comes in full).
    pub fn resume_at(&mut self, upstream: u64) {
        self.durable_epoch = upstream;
        self.applied = 0;
        self.needs_full = true;
        self.received_units = 0;
        self.durable_units = 0;
    }
}

/// Counts of what the link did.
#[derive(Default)]
pub struct LinkStats {
    pub deltas_applied: u64,
    pub full_applied: u64,
    pub log_bytes: u64,
    pub log_writes: u64,
}

/// The primary, its replicated keyspaces and the link's state. See the module doc.
pub struct Link {
    primary: Database,
    deltas: Arc<Deltas>,
    handles: Vec<Keyspace>,
    pub keyspaces: Vec<Replicated>,
    /// What the backup was doing at its last call, and the I/O number it began at.
    pub phase: Phase,
    pub phase_io: u64,
    /// Set by the suite: the next `apply`, once its log is shipped, arms the power loss
    /// at a random one of the I/Os applying its commits makes (`armed_at` says which).
    pub aim_in_commits: bool,
    pub armed_at: Option<u64>,
    /// I/Os the last `apply` that applied commits made after its shipping (a guess
    /// until one was measured).
    commit_ios: u64,
    pub stats: LinkStats,
}

impl Link {
    /// A primary in memory with `names` replicated to `backup` (replicas created there
    /// durably, at `TERM`).
    pub fn new(names: &[String], backup: &Database) -> tucana::Result<Link> {
        let primary = workload::options(false).open_in_memory()?;
        let handles: Vec<Keyspace> = names
            .iter()
            .map(|n| primary.keyspace(n))
            .collect::<tucana::Result<_>>()?;
        let deltas = Arc::new(Deltas::default());
        primary.set_commit_observer(Some(deltas.clone()));
        for name in names {
            let source = primary.ship_source(name)?;
            source.raise_term(TERM);
            // Nothing is retired before the link shipped it.
            source.set_horizon(0);
            backup.replica(name, source.seed(), TERM)?;
        }
        let mut link = Link {
            primary,
            deltas,
            handles,
            keyspaces: names.iter().map(|n| Replicated::new(n)).collect(),
            phase: Phase::Idle,
            phase_io: 0,
            aim_in_commits: false,
            armed_at: None,
            commit_ios: 40,
            stats: LinkStats::default(),
        };
        // A first commit at the raised term, for the first delta to carry.
        link.primary.commit()?;
        link.collect_commits();
        Ok(link)
    }

    /// Runs a primary operation (on keyspace 0 if the one it names was dropped), records
    /// its unit, and collects the commits it made.
    pub fn run_primary(&mut self, op: Op) -> tucana::Result<()> {
        let live = |ks: usize| {
            if self.keyspaces[ks].dropped == Dropped::No {
                ks
            } else {
                0
            }
        };
        let durability = |sync: bool| {
            if sync {
                Durability::Sync
            } else {
                Durability::Buffered
            }
        };
        match op {
            Op::Put {
                ks,
                key,
                value,
                sync,
            } => {
                let ks = live(ks);
                self.handles[ks].put_with(&key, &value, durability(sync))?;
                self.keyspaces[ks].units.push(vec![(key, Some(value))]);
            }
            Op::Delete { ks, key, sync } => {
                let ks = live(ks);
                self.handles[ks].delete_with(&key, durability(sync))?;
                self.keyspaces[ks].units.push(vec![(key, None)]);
            }
            Op::Batch { ks, writes, sync } => {
                let ks = live(ks);
                let mut b = self.handles[ks].batch();
                for (k, v) in &writes {
                    match v {
                        Some(v) => b.put(k, v),
                        None => b.delete(k),
                    };
                }
                b.commit_with(durability(sync))?;
                self.keyspaces[ks].units.push(writes);
            }
            Op::Sync => self.primary.sync()?,
            Op::Commit => self.primary.commit()?,
            Op::Gc => self.primary.gc()?,
        }
        self.collect_commits();
        Ok(())
    }

    /// Takes the commits the observer was told of: each live keyspace's delta is queued
    /// for shipping, and the commit holds the units written so far (nothing writes while
    /// the primary commits).
    fn collect_commits(&mut self) {
        let commits = std::mem::take(&mut *self.deltas.0.lock());
        for commit in commits {
            for region in commit.regions {
                let Some(k) = self
                    .keyspaces
                    .iter_mut()
                    .find(|k| k.name == region.desc.name && k.dropped == Dropped::No)
                else {
                    continue;
                };
                k.at_epoch.insert(commit.epoch.0, k.units.len());
                k.pending.push((commit.epoch.0, region));
            }
        }
    }

    /// Sets what the backup is about to do.
    fn enter(&mut self, phase: Phase, sim: &SimStorage) {
        self.phase = phase;
        self.phase_io = sim.io_count();
    }

    /// Where the power went, if it froze `sim` at I/O `crash_io` during the backup's last
    /// call: an apply whose I/Os since it began include a sync was at its superblock.
    pub fn crash_phase(&self, sim: &SimStorage, crash_io: Option<u64>) -> Phase {
        match (self.phase, crash_io) {
            (Phase::ApplyWrites, Some(at)) => {
                let kinds = sim.io_kinds();
                let end = (at as usize).min(kinds.len());
                let start = (self.phase_io as usize).min(end);
                if kinds[start..end].contains(&IoKind::Sync) {
                    Phase::ApplySuperblock
                } else {
                    Phase::ApplyWrites
                }
            }
            (phase, Some(_)) => phase,
            (_, None) => Phase::Idle,
        }
    }

    /// A durable point of the backup (see the module doc): every replica's received log
    /// is durable.
    pub fn backup_durable(&mut self) {
        for k in &mut self.keyspaces {
            k.durable_units = k.received_units;
        }
    }

    /// Ships every log byte of every live keyspace that the backup lacks, in chunks of
    /// random sizes, then sets each keyspace's ship horizon (the lowest order of a
    /// segment still open, or any new one).
    pub fn ship(
        &mut self,
        backup: &Database,
        sim: &SimStorage,
        rng: &mut StdRng,
    ) -> tucana::Result<()> {
        self.enter(Phase::Log, sim);
        for k in &mut self.keyspaces {
            k.shipped_units = k.units.len();
        }
        for k in self
            .keyspaces
            .iter_mut()
            .filter(|k| k.dropped == Dropped::No)
        {
            let source = self.primary.ship_source(&k.name)?;
            let replica = replica_of(backup, &k.name)?;
            let have: BTreeMap<u64, u64> = replica
                .state()
                .segments
                .iter()
                .map(|(order, _, got)| (*order, *got))
                .collect();
            let segments = source.segments(0, usize::MAX);
            let mut horizon = segments.iter().map(|s| s.order + 1).max().unwrap_or(0);
            for seg in &segments {
                let mut from = have.get(&seg.order).copied().unwrap_or(0);
                while seg.ready_bytes > from {
                    let left = seg.ready_bytes - from;
                    let n = if rng.random_bool(0.5) {
                        left
                    } else {
                        rng.random_range(1..=left)
                    };
                    let mut bytes = vec![0u8; n as usize];
                    source.read(seg.base, from, &mut bytes)?;
                    replica.write_log(seg.base, seg.size_bytes, seg.order, from, &bytes)?;
                    from += n;
                    self.stats.log_bytes += n;
                    self.stats.log_writes += 1;
                }
                if seg.open {
                    horizon = horizon.min(seg.order);
                }
            }
            source.set_horizon(horizon);
            k.received_units = k.shipped_units;
        }
        Ok(())
    }

    /// Ships the log, then applies to each replica the commits queued for it, oldest
    /// first, or, when its node map is not current (a reopened backup), the primary's
    /// newest commit in full (pinned before the log is shipped, so its segments are sent).
    pub fn apply(
        &mut self,
        backup: &Database,
        sim: &SimStorage,
        rng: &mut StdRng,
    ) -> tucana::Result<()> {
        let mut pins: Vec<Option<PinnedCommit>> = Vec::with_capacity(self.keyspaces.len());
        for k in &self.keyspaces {
            let pin = if k.dropped == Dropped::No
                && (k.needs_full || !replica_of(backup, &k.name)?.state().node_map_current)
            {
                let pinned = self.primary.ship_source(&k.name)?.pin_newest_commit()?;
                Some(pinned.ok_or_else(|| no_commit(&k.name))?)
            } else {
                None
            };
            pins.push(pin);
        }
        self.ship(backup, sim, rng)?;
        if std::mem::take(&mut self.aim_in_commits) {
            let at_io = sim.io_count() + rng.random_range(0..self.commit_ios);
            sim.arm(Fault::Crash { at_io });
            self.armed_at = Some(at_io);
        }
        let (commits_from, applied_before) = (sim.io_count(), self.stats.deltas_applied);
        for (i, pin) in pins.into_iter().enumerate() {
            if self.keyspaces[i].dropped != Dropped::No {
                continue;
            }
            let replica = replica_of(backup, &self.keyspaces[i].name)?;
            if let Some(pinned) = pin {
                let mut nodes = Vec::new();
                pinned.for_each_node(&mut |off, image| {
                    nodes.push((off, image));
                    Ok(())
                })?;
                let delta = Delta {
                    term: TERM,
                    upstream_epoch: pinned.epoch,
                    full: true,
                    desc: pinned.desc.clone(),
                    next_order: pinned.next_order,
                    nodes,
                    released_nodes: Vec::new(),
                };
                self.apply_one(i, &replica, delta, sim)?;
                self.stats.full_applied += 1;
            }
            let k = &mut self.keyspaces[i];
            let queued = std::mem::take(&mut k.pending);
            let applied = k.applied;
            for (epoch, region) in queued.into_iter().filter(|(e, _)| *e > applied) {
                let delta = Delta {
                    term: TERM,
                    upstream_epoch: epoch,
                    full: false,
                    desc: region.desc,
                    next_order: region.next_order,
                    nodes: region.nodes,
                    released_nodes: region.released_nodes,
                };
                self.apply_one(i, &replica, delta, sim)?;
            }
        }
        if self.stats.deltas_applied > applied_before {
            self.commit_ios = (sim.io_count() - commits_from).max(1);
        }
        Ok(())
    }

    /// Applies one commit to keyspace `i`'s replica; once it returned, that commit and
    /// the log received before it are durable.
    fn apply_one(
        &mut self,
        i: usize,
        replica: &ReplicaHandle,
        delta: Delta,
        sim: &SimStorage,
    ) -> tucana::Result<()> {
        let epoch = delta.upstream_epoch;
        self.keyspaces[i].shipped_epochs.insert(epoch);
        self.enter(Phase::ApplyWrites, sim);
        replica.apply(delta)?;
        let k = &mut self.keyspaces[i];
        k.applied = epoch;
        k.needs_full = false;
        k.durable_epoch = epoch;
        self.stats.deltas_applied += 1;
        self.backup_durable();
        Ok(())
    }

    /// The primary drops keyspace `i`; the backup drops its replica.
    pub fn drop_keyspace(
        &mut self,
        i: usize,
        backup: &Database,
        sim: &SimStorage,
    ) -> tucana::Result<()> {
        let name = self.keyspaces[i].name.clone();
        self.primary.drop_keyspace(&name)?;
        self.collect_commits();
        let k = &mut self.keyspaces[i];
        k.dropped = Dropped::Attempted;
        k.pending.clear();
        self.drop_replica(i, backup, sim)
    }

    /// Drops keyspace `i`'s replica on the backup (again, after a crash that may have
    /// kept it) if it is there.
    pub fn drop_replica(
        &mut self,
        i: usize,
        backup: &Database,
        sim: &SimStorage,
    ) -> tucana::Result<()> {
        self.enter(Phase::Drop, sim);
        if let Some(replica) = backup.open_replica(&self.keyspaces[i].name) {
            replica.drop_replica()?;
            // The drop committed the backup's volume.
            self.backup_durable();
        }
        self.keyspaces[i].dropped = Dropped::Durably;
        Ok(())
    }

    /// The primary's forced GC passes so far, and the bytes they relocated (shipped to
    /// the backup as relocation segments).
    pub fn primary_gc(&self) -> (u64, u64) {
        let stats = self.primary.stats();
        (stats.gc_passes, stats.gc_relocated_bytes)
    }

    /// Sets the phase of the backup's own work (its commits, syncs and keyspace).
    pub fn enter_backup_work(&mut self, sim: &SimStorage) {
        self.enter(Phase::Backup, sim);
    }
}

fn replica_of(backup: &Database, name: &str) -> tucana::Result<ReplicaHandle> {
    backup
        .open_replica(name)
        .ok_or_else(|| Error::KeyspaceNotFound(format!("replica {name}")))
}

fn no_commit(name: &str) -> Error {
    Error::InvalidArgument(format!("no commit of the primary lists {name}"))
}
