//! Bugs found by the backup power-loss suite (M9 of docs/reliability.md,
//! `tucana-torture replica-power-loss`), each kept as a named test that opens with its
//! story. A primary in memory ships its keyspace to a backup whose volume loses, at a
//! power cut, everything written since its last sync.

use std::sync::Arc;

use parking_lot::Mutex;
use tucana::replication::{CommitDelta, CommitObserver, Delta, ReplicaHandle};
use tucana::volume::{MemStorage, Storage};
use tucana::{Database, Options, Result};

/// An operation since the last sync.
enum Pending {
    Grow(u64),
    Write(u64, Vec<u8>),
    Punch(u64, u64),
}

/// Memory storage that keeps what the last `sync` made durable apart from what was done
/// since, so a power cut can be taken at any moment (`after_power_cut`).
#[derive(Default)]
struct PowerCut {
    live: MemStorage,
    durable: MemStorage,
    pending: Mutex<Vec<Pending>>,
}

impl PowerCut {
    /// A volume holding only what was durable: everything written since the last sync
    /// is lost.
    fn after_power_cut(&self) -> Arc<MemStorage> {
        let len = self.durable.len_bytes().unwrap();
        let mut bytes = vec![0u8; len as usize];
        self.durable.read_at(0, &mut bytes).unwrap();
        let out = MemStorage::new();
        out.grow(len).unwrap();
        out.write_at(0, &bytes).unwrap();
        Arc::new(out)
    }
}

impl Storage for PowerCut {
    fn len_bytes(&self) -> Result<u64> {
        self.live.len_bytes()
    }

    fn grow(&self, len_bytes: u64) -> Result<()> {
        self.pending.lock().push(Pending::Grow(len_bytes));
        self.live.grow(len_bytes)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.live.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.pending
            .lock()
            .push(Pending::Write(offset, data.to_vec()));
        self.live.write_at(offset, data)
    }

    fn sync(&self) -> Result<()> {
        for op in self.pending.lock().drain(..) {
            match op {
                Pending::Grow(len) => self.durable.grow(len)?,
                Pending::Write(offset, data) => self.durable.write_at(offset, &data)?,
                Pending::Punch(offset, len) => self.durable.punch_hole(offset, len)?,
            }
        }
        Ok(())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.pending.lock().push(Pending::Punch(offset, len));
        self.live.punch_hole(offset, len)
    }

    fn io_bytes(&self) -> (u64, u64) {
        self.live.io_bytes()
    }
}

#[derive(Default)]
struct Deltas(Mutex<Vec<CommitDelta>>);

impl CommitObserver for Deltas {
    fn committed(&self, delta: CommitDelta) {
        self.0.lock().push(delta);
    }
}

fn options() -> Options {
    Database::builder()
        .commit_interval(None)
        .flush_interval(None)
        .log_segment_bytes(64 << 10)
}

const NAME: &str = "t";

/// Ships every log byte of the primary's keyspace that `replica` lacks.
fn ship_log(primary: &Database, replica: &ReplicaHandle) {
    let source = primary.ship_source(NAME).unwrap();
    let have: std::collections::BTreeMap<u64, u64> = replica
        .state()
        .segments
        .iter()
        .map(|(order, _, got)| (*order, *got))
        .collect();
    for seg in source.segments(0, usize::MAX) {
        let from = have.get(&seg.order).copied().unwrap_or(0);
        if seg.ready_bytes > from {
            let mut bytes = vec![0u8; (seg.ready_bytes - from) as usize];
            source.read(seg.base, from, &mut bytes).unwrap();
            replica
                .write_log(seg.base, seg.size_bytes, seg.order, from, &bytes)
                .unwrap();
        }
    }
}

/// A primary with keyspace `NAME` holding key000..key009, committed, shipped and applied
/// to a fresh backup on `storage`.
fn primary_and_backup(storage: Arc<PowerCut>) -> (Database, Database) {
    let primary = options().open_in_memory().unwrap();
    let ks = primary.keyspace(NAME).unwrap();
    let deltas = Arc::new(Deltas::default());
    primary.set_commit_observer(Some(deltas.clone()));
    let source = primary.ship_source(NAME).unwrap();
    source.raise_term(1);
    let backup = options().open_storage(storage).unwrap();
    let replica = backup.replica(NAME, source.seed(), 1).unwrap();
    for i in 0..10 {
        ks.put(format!("key{i:03}").as_bytes(), b"committed")
            .unwrap();
    }
    primary.commit().unwrap();
    ship_log(&primary, &replica);
    for commit in std::mem::take(&mut *deltas.0.lock()) {
        let region = commit.regions.into_iter().next().unwrap();
        replica
            .apply(Delta {
                term: 1,
                upstream_epoch: commit.epoch.0,
                full: false,
                desc: region.desc,
                next_order: region.next_order,
                nodes: region.nodes,
                released_nodes: region.released_nodes,
            })
            .unwrap();
    }
    (primary, backup)
}

/// The backup, after a power cut, promoted: its keyspace's keys.
fn promoted_keys_after_power_cut(storage: &PowerCut) -> Vec<Vec<u8>> {
    let backup = options().open_storage(storage.after_power_cut()).unwrap();
    backup.check().unwrap();
    let ks = backup.open_replica(NAME).unwrap().promote(2).unwrap();
    let keys = ks.range::<&[u8], _>(..).map(|kv| kv.unwrap().0).collect();
    backup.check().unwrap();
    keys
}

/// Found by M9 (seed 1, case 1). A backup acknowledging in `--repl-ack durable` mode
/// calls `Database::sync` before it acknowledges, and `ReplicaHandle::write_log` says
/// that sync makes every replica's received bytes durable. It did nothing at all on a
/// backup with no keyspace of its own: `write_log` took no write ticket, so the sync's
/// group-commit fast path ("everything up to the newest ticket is synced") returned at
/// once, without a single I/O, and a power cut after the acknowledgement lost the log.
/// Received bytes now take a ticket, so the sync covers them.
#[test]
fn a_backup_sync_makes_received_log_durable() {
    let storage = Arc::new(PowerCut::default());
    let (primary, backup) = primary_and_backup(storage.clone());
    let ks = primary.keyspace(NAME).unwrap();
    // A few small records: they stay in the segment the applied commit lists.
    for i in 10..20 {
        ks.put(format!("key{i:03}").as_bytes(), b"shipped as log")
            .unwrap();
    }
    ship_log(&primary, &backup.open_replica(NAME).unwrap());
    backup.sync().unwrap();
    let keys = promoted_keys_after_power_cut(&storage);
    assert_eq!(
        keys.len(),
        20,
        "received and synced log lost at a power cut"
    );
    backup.abandon();
}

/// Found by M9 (seed 1, case 133), once the sync above did sync. A backup persists its
/// segment map (primary segment → its copy) only in its commits' descriptors; a segment
/// received since the backup's last commit is in no descriptor, so after a power cut the
/// reopened backup does not know the copy exists, and promotion's replay stops at the
/// LINK record that names it, however durable the copy's bytes were. `Database::sync`
/// now commits when a replica holds such a segment (a commit implies a sync), so what a
/// sync returned for is reachable after any crash.
#[test]
fn a_backup_sync_makes_log_in_newly_received_segments_durable() {
    let storage = Arc::new(PowerCut::default());
    let (primary, backup) = primary_and_backup(storage.clone());
    let ks = primary.keyspace(NAME).unwrap();
    // 4 KiB records: the 64 KiB segment the commit lists fills, and the log goes on
    // in segments the backup receives after its last commit.
    for i in 10..60 {
        ks.put(format!("key{i:03}").as_bytes(), &[7u8; 4096])
            .unwrap();
    }
    ship_log(&primary, &backup.open_replica(NAME).unwrap());
    assert!(backup.open_replica(NAME).unwrap().state().segments.len() >= 3);
    backup.sync().unwrap();
    let keys = promoted_keys_after_power_cut(&storage);
    assert_eq!(
        keys.len(),
        60,
        "received and synced log lost at a power cut"
    );
    backup.abandon();
}
