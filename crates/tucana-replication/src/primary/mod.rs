//! The primary's side: for each configured backup, a link that dials it, says which
//! regions it replicates, ships their logs as they grow and each commit's index delta, and
//! takes the backup's acknowledgements (DESIGN.md, "Replication").
//!
//! Owns: the shipping cursor of each (backup, region) pair, the queue of commit deltas,
//! the ship horizon garbage collection must respect, and the acknowledgement board that
//! writers wait on. Does not own: reading the log or pinning commits (the engine's
//! `ShipSource`), the bytes on the wire (`frame`, `transport`).
//!
//! Thread-safety: each link is one tokio task (its sender and its receiver are two halves
//! of it); the shared state is behind short `parking_lot` mutexes. Writers wait on the
//! board from any thread (`Primary::wait_acked`), woken by a condition variable.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use tokio::sync::Notify;
use tucana::replication::{
    CommitDelta, CommitObserver, FoldedCommits, LogPosition, RegionDesc, ShipSource, NODE_BYTES,
};
use tucana::types::DiskOffset;
use tucana::Database;

use crate::transport::Dialer;

mod link;
mod ship;

/// How a primary replicates.
#[derive(Clone)]
pub struct PrimaryConfig {
    /// This server's name, as backups report it.
    pub id: String,
    /// The backups' replication addresses (`host:port`).
    pub backups: Vec<String>,
    /// Sent in `Open`; the backup refuses a wrong one.
    pub password: String,
    /// Backups acknowledge only what they synced.
    pub ack_durable: bool,
    /// How long a write waits for its acknowledgements before it fails.
    pub ack_timeout: Duration,
    /// Bytes per second at most for log the backup lacks when it (re)connects.
    pub catchup_bytes_per_sec: u64,
    /// How long a backup's index may lag: a commit whose nodes would cost more than
    /// `INDEX_SHARE` of the log bytes shipped since the backup's last commit is folded
    /// into a later one (`FoldedCommits`), for up to this long (zero: every commit is
    /// shipped as it is made).
    pub index_lag_max: Duration,
    /// ... and for up to this many log bytes (what a promoted backup replays).
    pub index_lag_max_bytes: u64,
    pub dialer: Dialer,
}

/// A commit's index is shipped at once when its nodes are at most this share of the log
/// bytes shipped since the backup's last commit (network bytes ≤ 1.3× the log, issue
/// 18, leaves room for frames and acknowledgements).
const INDEX_SHARE: f64 = 0.2;

/// Log bytes per `Log` frame.
const CHUNK_BYTES: usize = 256 << 10;
/// Log bytes a link ships per round before it looks at the other regions again.
const ROUND_BYTES: u64 = 8 << 20;
/// Node images per `Nodes` frame.
const NODES_PER_FRAME: usize = 256;
/// Deltas a backup may fall behind before its next commit comes in full.
const MAX_QUEUED_DELTAS: usize = 3;
/// A link with nothing to do looks again this often (for new keyspaces, drops).
const IDLE_TICK: Duration = Duration::from_millis(50);
/// A link that lost its backup dials again after this long.
const REDIAL: Duration = Duration::from_millis(500);

/// A commit's delta for one region, shared by every link that ships it.
struct QueuedDelta {
    epoch: u64,
    desc: RegionDesc,
    next_order: u64,
    nodes: Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)>,
    released: Vec<u64>,
}

/// What one link knows of one region.
#[derive(Default)]
struct RegionLink {
    /// The backup answered for it (its `Hello` lists it): shipping may start.
    ready: bool,
    term: u64,
    /// Bytes the backup holds of each segment, by the segment's order.
    held: BTreeMap<u64, u64>,
    /// Lowest order that may still have bytes to ship.
    lowest_open: u64,
    deltas: VecDeque<Arc<QueuedDelta>>,
    /// The next commit goes in full (a new or restarted backup, or one too far behind).
    need_full: bool,
    /// Commits made while `need_full` (their offsets only): those after the commit the
    /// full index ships are folded to follow it (`full_shipped`).
    while_full: Vec<Arc<QueuedDelta>>,
    /// The backup's newest applied commit.
    applied_epoch: u64,
    /// Commits the backup reported applied on this link (`Applied` frames).
    applied_count: u64,
    /// The foreground position the backup acknowledged on this connection (each `Hello`
    /// starts it again from nothing: a backup that restarted may hold less than it
    /// acknowledged before, and a region led again is another log).
    acked: LogPosition,
    /// The backup's first acknowledgement on this connection is still to be asked for:
    /// the next round re-sends the last byte of the newest foreground segment if it has
    /// nothing else of it to send, so a backup that holds everything says so.
    confirm_tail: bool,
    /// Foreground positions shipped and not yet acknowledged, with when they were
    /// shipped, oldest first: the age of the front is the backup's lag in time.
    unacked: VecDeque<(LogPosition, Instant)>,
    /// Commits not shipped yet, folded to go with a later one, and since when.
    folded: FoldedCommits,
    folded_since: Option<Instant>,
    /// Log bytes shipped since the last commit shipped.
    log_since_index: u64,
}

/// At most this many shipped positions wait for an acknowledgement; past it the newest
/// entry absorbs the next position (keeping its older time, so lag errs high).
const UNACKED_POSITIONS: usize = 1024;

impl RegionLink {
    /// Notes that the log up to `position` was shipped now.
    fn shipped(&mut self, position: LogPosition) {
        let now = Instant::now();
        if self.unacked.len() >= UNACKED_POSITIONS {
            if let Some(back) = self.unacked.back_mut() {
                back.0 = back.0.max(position);
            }
        } else {
            self.unacked.push_back((position, now));
        }
    }

    /// Takes an acknowledgement of `position`.
    fn acknowledged(&mut self, position: LogPosition) {
        self.acked = self.acked.max(position);
        while self.unacked.front().is_some_and(|(p, _)| *p <= self.acked) {
            self.unacked.pop_front();
        }
    }

    /// Whether a commit whose index costs `index_bytes` waits to be folded into a later
    /// one (see `PrimaryConfig::index_lag_max`).
    fn defers(&self, index_bytes: u64, config: &PrimaryConfig) -> bool {
        !config.index_lag_max.is_zero()
            && index_bytes as f64 > INDEX_SHARE * self.log_since_index as f64
            && self.log_since_index < config.index_lag_max_bytes
            && self
                .folded_since
                .is_none_or(|since| since.elapsed() < config.index_lag_max)
    }

    /// Takes commit `delta` (the commit observer): queued to ship alone or folded; while
    /// a full index is due, kept aside for after it; past `MAX_QUEUED_DELTAS` behind,
    /// the next commit goes in full instead.
    fn on_commit(&mut self, delta: &Arc<QueuedDelta>) {
        if self.need_full {
            self.while_full.push(delta.clone());
        } else if self.deltas.len() >= MAX_QUEUED_DELTAS {
            self.deltas.clear();
            self.index_shipped();
            self.need_full = true;
            self.while_full.clear();
            self.while_full.push(delta.clone());
        } else {
            self.deltas.push_back(delta.clone());
        }
    }

    /// The newest commit, `epoch`, was shipped in full: the commits made after it (while
    /// it was being read and sent) follow as one folded delta, so the backup hears of
    /// every node they wrote and let go of. (Dropping them instead left the nodes they
    /// let go of in the backup's node map for ever: leaked blocks once it was promoted.)
    fn full_shipped(&mut self, epoch: u64) {
        self.index_shipped();
        self.need_full = false;
        self.applied_epoch = self.applied_epoch.max(epoch);
        self.deltas.retain(|d| d.epoch > epoch);
        let mut after: Vec<Arc<QueuedDelta>> = std::mem::take(&mut self.while_full)
            .into_iter()
            .filter(|d| d.epoch > epoch)
            .collect();
        after.sort_by_key(|d| d.epoch);
        after.dedup_by_key(|d| d.epoch);
        for d in after {
            self.fold(&d);
        }
    }

    /// Whether the backup holds every log byte commit `desc` lists (else the commit waits
    /// for the next round's log: a commit made after this round shipped the log may list
    /// bytes written since, and the backup refuses a commit whose log it lacks).
    fn covers(&self, desc: &RegionDesc) -> bool {
        desc.segments.iter().all(|(_, stats)| {
            stats.written_bytes == 0
                || stats.order < self.lowest_open
                || self
                    .held
                    .get(&stats.order)
                    .is_some_and(|&held| held >= stats.written_bytes)
        })
    }

    /// Folds commit `d` into the ones waiting to ship as one delta.
    fn fold(&mut self, d: &QueuedDelta) {
        self.folded.fold(
            d.epoch,
            d.desc.clone(),
            d.next_order,
            d.nodes.iter().map(|(off, _)| *off),
            d.released.iter().map(|&off| DiskOffset(off)),
        );
        self.folded_since.get_or_insert_with(Instant::now);
    }

    /// Forgets what was folded and shipped (a new connection, or a commit shipped).
    fn index_shipped(&mut self) {
        self.folded = FoldedCommits::default();
        self.folded_since = None;
        self.log_since_index = 0;
    }

    /// How long the oldest shipped, unacknowledged bytes have waited.
    fn lag(&self) -> Duration {
        self.unacked
            .front()
            .map_or(Duration::ZERO, |(_, at)| at.elapsed())
    }
}

/// One backup, as the primary sees it.
struct Link {
    addr: String,
    /// The keyspaces shipped to this backup with the term each is shipped at, or `None`:
    /// every keyspace, at its own term (the static configuration). Cluster mode sets it
    /// from the map (`Primary::set_backups`).
    keyspaces: Mutex<Option<BTreeMap<String, u64>>>,
    /// Where each carried keyspace stood when this link began to carry it (at its
    /// term): every write acknowledged before lies at or below that position.
    joined: Mutex<HashMap<String, Joined>>,
    /// Set when the backup left the set: the link closes and ends.
    retired: AtomicBool,
    state: Mutex<LinkState>,
    wake: Notify,
}

/// See `Link::joined`.
#[derive(Clone, Copy, Debug)]
struct Joined {
    term: u64,
    /// The keyspace's log end when the link began to carry it.
    position: LogPosition,
    /// The link's `applied_count` then.
    applied_count: u64,
    /// The backup answered then that it had applied the newest commit (a connection
    /// again, to a backup whose index is current): it need not apply another one.
    index_current: bool,
}

impl Link {
    fn new(addr: String, keyspaces: Option<BTreeMap<String, u64>>) -> Arc<Link> {
        Arc::new(Link {
            addr,
            keyspaces: Mutex::new(keyspaces),
            joined: Mutex::new(HashMap::new()),
            retired: AtomicBool::new(false),
            state: Mutex::new(LinkState::default()),
            wake: Notify::new(),
        })
    }

    /// The backup answered a new connection for `regions` (each with the link's applied
    /// count now, and whether the backup's index is the newest commit's): what it held
    /// before may be gone (a restart keeps only what its last commit recorded), so it is
    /// in sync again only once it has acknowledged where each region stands now, and
    /// applied a commit since unless its index was current (`Primary::in_sync`).
    fn rejoined(&self, shared: &Shared, regions: &[(String, u64, bool)]) {
        let mut joined = self.joined.lock();
        for (name, applied_count, index_current) in regions {
            let Some(j) = joined.get_mut(name) else {
                continue;
            };
            j.position = shared
                .db
                .ship_source(name)
                .map(|s| s.log_position())
                .unwrap_or_default();
            j.applied_count = *applied_count;
            j.index_current = *index_current;
        }
    }

    /// Whether keyspace `name` is shipped to this backup.
    fn carries(&self, name: &str) -> bool {
        self.keyspaces
            .lock()
            .as_ref()
            .is_none_or(|k| k.contains_key(name))
    }

    fn ended(&self, shared: &Shared) -> bool {
        shared.stop.load(Ordering::Acquire) || self.retired.load(Ordering::Acquire)
    }

    /// Whether the connection looks stalled: the backup has said nothing for `silence`,
    /// and log shipped at least that long ago is still unacknowledged (a quiet link with
    /// nothing outstanding is not stalled).
    fn stalled(&self, silence: Duration) -> bool {
        let st = self.state.lock();
        let now = Instant::now();
        let long_ago = |at: Instant| now.saturating_duration_since(at) >= silence;
        st.last_heard.is_some_and(long_ago)
            && st
                .regions
                .values()
                .any(|r| r.unacked.front().is_some_and(|(_, at)| long_ago(*at)))
    }
}

/// How long a link may hear nothing from its backup while shipped log waits for an
/// acknowledgement before it drops the connection and dials again: the write timeout
/// (at least a second). A connection through a link that was slow or cut and came back
/// can sit in TCP's retransmission backoff for a minute or two; writes meanwhile fail
/// (`NoReplicas`) and a planned failover gives up. A new connection starts at once.
fn stall_limit(config: &PrimaryConfig) -> Duration {
    config.ack_timeout.max(Duration::from_secs(1))
}

#[derive(Default)]
struct LinkState {
    connected: bool,
    backup_id: String,
    wants_index: bool,
    regions: HashMap<String, RegionLink>,
    last_error: Option<String>,
    /// Since when the link has been down (None while it is up or before it first fails).
    down_since: Option<Instant>,
    /// When this connection opened or last brought a frame from the backup.
    last_heard: Option<Instant>,
    shipped_log_bytes: u64,
    shipped_index_bytes: u64,
}

/// Replication figures of one backup, for `INFO` and metrics.
#[derive(Clone, Debug, Default)]
pub struct BackupStatus {
    pub addr: String,
    pub backup_id: String,
    pub connected: bool,
    pub last_error: Option<String>,
    pub shipped_log_bytes: u64,
    pub shipped_index_bytes: u64,
    /// Per region, by name.
    pub regions: Vec<RegionStatus>,
}

/// Replication figures of one region at one backup.
#[derive(Clone, Debug, Default)]
pub struct RegionStatus {
    pub name: String,
    /// The foreground position the backup acknowledged.
    pub acked: LogPosition,
    /// The region's foreground log end here.
    pub end: LogPosition,
    /// Log bytes written here that the backup has not acknowledged.
    pub lag_bytes: u64,
    /// How long the oldest shipped bytes the backup has not acknowledged have waited.
    pub lag: Duration,
    /// The backup's newest applied commit.
    pub applied_epoch: u64,
}

/// Why a write's acknowledgements did not come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckError {
    /// Not every backup acknowledged within the timeout.
    NoReplicas { acked: usize, needed: usize },
    /// A backup holds the region at a higher term: this server is not its primary.
    Fenced { term: u64 },
}

struct Shared {
    db: Database,
    config: PrimaryConfig,
    /// The backups now; replaced as a whole by `Primary::set_backups`.
    links: RwLock<Vec<Arc<Link>>>,
    stop: AtomicBool,
    /// The newest commit epoch the observer saw.
    newest_epoch: AtomicU64,
    /// Per keyspace, the newest commit that changed it: its epoch and its descriptor
    /// entry. A commit that changed nothing of a keyspace is not shipped: between two
    /// servers backing each other, every applied commit is a commit of the backup's own
    /// volume, which it shipped back, unchanged, to be applied and answered by a commit
    /// again (a thousand commits a second each, for ever: M10, seed 116).
    changed: Mutex<HashMap<String, (u64, RegionDesc)>>,
    /// Commits up to this epoch ship their index without being folded (`ship_index_now`).
    index_now: AtomicU64,
    /// Writers waiting for acknowledgements sleep here.
    board: (Mutex<()>, Condvar),
}

/// The replication of a primary's keyspaces to its configured backups.
pub struct Primary {
    shared: Arc<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl Shared {
    /// The backups now (a copy: links may come and go meanwhile).
    fn links(&self) -> Vec<Arc<Link>> {
        self.links.read().clone()
    }
}

impl Primary {
    /// Starts a link to every backup of `config`. Every keyspace of `db` is replicated;
    /// one at term 0 is raised to term 1.
    pub fn start(db: Database, config: PrimaryConfig) -> std::io::Result<Primary> {
        let links = config
            .backups
            .iter()
            .map(|addr| Link::new(addr.clone(), None))
            .collect();
        let shared = Arc::new(Shared {
            db: db.clone(),
            config,
            links: RwLock::new(links),
            stop: AtomicBool::new(false),
            newest_epoch: AtomicU64::new(0),
            changed: Mutex::new(HashMap::new()),
            index_now: AtomicU64::new(0),
            board: (Mutex::new(()), Condvar::new()),
        });
        db.set_commit_observer(Some(Arc::new(Observer(Arc::downgrade(&shared)))));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tucana-repl-primary")
            .enable_all()
            .build()?;
        for link in shared.links() {
            runtime.spawn(link::run_link(shared.clone(), link));
        }
        Ok(Primary {
            shared,
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// Whether any backup is configured (a primary without backups acknowledges alone).
    pub fn has_backups(&self) -> bool {
        !self.shared.links.read().is_empty()
    }

    /// Makes the backups exactly `backups`: replication address → the keyspaces shipped
    /// there, each with its term (cluster mode, from the map). A backup that stays keeps
    /// its connection and learns its new keyspaces on its next round; a keyspace it no
    /// longer carries is simply not shipped any more (its replica there is left alone: the
    /// backup may have been promoted); a backup that left is disconnected. A keyspace's
    /// term is raised to the one given when it is announced. Writes wait only for the
    /// backups that carry their keyspace.
    pub fn set_backups(&self, backups: &BTreeMap<String, BTreeMap<String, u64>>) {
        let runtime = self.runtime.lock();
        let Some(runtime) = runtime.as_ref() else {
            return;
        };
        let mut links = self.shared.links.write();
        links.retain(|link| {
            let stays = backups.contains_key(&link.addr);
            if !stays {
                link.retired.store(true, Ordering::Release);
                link.wake.notify_one();
            }
            stays
        });
        for (addr, keyspaces) in backups {
            match links.iter().find(|l| &l.addr == addr) {
                Some(link) => {
                    self.note_joins(link, keyspaces);
                    *link.keyspaces.lock() = Some(keyspaces.clone());
                    link.wake.notify_one();
                }
                None => {
                    let link = Link::new(addr.clone(), Some(keyspaces.clone()));
                    self.note_joins(&link, keyspaces);
                    runtime.spawn(link::run_link(self.shared.clone(), link.clone()));
                    links.push(link);
                }
            }
        }
        drop(links);
        // Writers waiting on a backup that left (or on a keyspace it no longer carries)
        // count again.
        self.shared.board.1.notify_all();
    }

    /// Stops shipping keyspace `name` to every backup, before this server drops it for a
    /// reason that is not the region's end (cluster mode: an old primary let its copy go
    /// to back the region itself). A keyspace that disappears while a link still carries
    /// it is announced `Dropped`, and the backup drops its replica: a backup promoted
    /// since, whose follower had not yet promoted that replica, then had nothing to
    /// promote and served the region empty (M10, seed 2579796793: 44,619 writes lost).
    /// Called before the drop, the shipper finds the keyspace gone and not carried, and
    /// only forgets it.
    pub fn stop_shipping(&self, name: &str) {
        for link in self.shared.links() {
            if let Some(keyspaces) = link.keyspaces.lock().as_mut() {
                keyspaces.remove(name);
            }
            link.joined.lock().remove(name);
            link.wake.notify_one();
        }
        self.shared.board.1.notify_all();
    }

    /// Records where each keyspace `link` begins to carry (or carries at a new term)
    /// stands now, and forgets the ones it no longer carries.
    fn note_joins(&self, link: &Link, keyspaces: &BTreeMap<String, u64>) {
        let applied: HashMap<String, u64> = {
            let st = link.state.lock();
            st.regions
                .iter()
                .map(|(name, r)| (name.clone(), r.applied_count))
                .collect()
        };
        let mut joined = link.joined.lock();
        joined.retain(|name, _| keyspaces.contains_key(name));
        for (name, &term) in keyspaces {
            if joined.get(name).is_some_and(|j| j.term == term) {
                continue;
            }
            let position = self
                .shared
                .db
                .ship_source(name)
                .map(|s| s.log_position())
                .unwrap_or_default();
            joined.insert(
                name.clone(),
                Joined {
                    term,
                    position,
                    applied_count: applied.get(name).copied().unwrap_or(0),
                    index_current: false,
                },
            );
        }
    }

    /// Whether the backup at `addr` holds every write of keyspace `name` this server
    /// ever acknowledged: it acknowledged the log up to where the keyspace stood when
    /// the link began to carry it (anything acknowledged later waited for it), and
    /// applied a commit since then (so it can be promoted: a tree and the log after it).
    /// False for a backup or keyspace this server does not ship to.
    pub fn in_sync(&self, addr: &str, name: &str) -> bool {
        let Some(link) = self.shared.links().into_iter().find(|l| l.addr == addr) else {
            return false;
        };
        if !link.carries(name) {
            return false;
        }
        let Some(joined) = link.joined.lock().get(name).copied() else {
            return false;
        };
        let st = link.state.lock();
        st.regions.get(name).is_some_and(|r| {
            r.ready
                && r.term == joined.term
                && !r.need_full
                && (joined.index_current || r.applied_count > joined.applied_count)
                && r.acked >= joined.position
        })
    }

    /// Ships the index of every commit made so far without folding it into later ones
    /// (`SAVE`: the backups' indexes become current as soon as they apply it).
    pub fn ship_index_now(&self) {
        let newest = self.shared.newest_epoch.load(Ordering::Acquire);
        self.shared.index_now.fetch_max(newest, Ordering::AcqRel);
        self.notify_write();
    }

    /// Wakes the links: a write was made (they ship it).
    pub fn notify_write(&self) {
        for link in self.shared.links() {
            link.wake.notify_one();
        }
    }

    /// Blocks until every backup acknowledged keyspace `region`'s log up to `position`,
    /// or the timeout passes, or the region is found fenced.
    pub fn wait_acked(&self, region: &str, position: LogPosition) -> Result<(), AckError> {
        self.notify_write();
        let deadline = Instant::now() + self.shared.config.ack_timeout;
        let (lock, cv) = &self.shared.board;
        let mut guard = lock.lock();
        loop {
            if let Some(term) = self.fenced(region) {
                return Err(AckError::Fenced { term });
            }
            let acked = self.acked_count(region, position);
            let needed = self.needed(region);
            if acked >= needed {
                return Ok(());
            }
            if cv.wait_until(&mut guard, deadline).timed_out() {
                let acked = self.acked_count(region, position);
                let needed = self.needed(region);
                if acked >= needed {
                    return Ok(());
                }
                return Err(AckError::NoReplicas { acked, needed });
            }
        }
    }

    /// Whether every backup keyspace `region` is shipped to acknowledged its log up to
    /// `position` on the connection it is on now (a read's fast path: nothing the read saw
    /// can be lost in a failover). A backup whose link is down does not count: what the
    /// link last heard may be of another incarnation of the region (one this server led
    /// before), whose positions mean nothing in this one; the fault campaign (M10, seed
    /// 26) read a value so, and saw it gone after the failover.
    ///
    /// False when no backup carries the region (the map names none, as between a planned
    /// failover and the coordinator's next repair): then only the local log holds what the
    /// read saw, maybe not synced yet, and the read waits for a sync like a write.
    pub fn acked_by_all(&self, region: &str, position: LogPosition) -> bool {
        let needed = self.needed(region);
        needed > 0 && self.acked_count(region, position) >= needed
    }

    /// Backups that keyspace `region` is shipped to.
    fn needed(&self, region: &str) -> usize {
        let links = self.shared.links.read();
        links.iter().filter(|link| link.carries(region)).count()
    }

    /// Backups that acknowledged keyspace `region`'s log up to `position`.
    pub fn acked_count(&self, region: &str, position: LogPosition) -> usize {
        self.shared
            .links()
            .iter()
            .filter(|link| link.carries(region))
            .filter(|link| {
                let st = link.state.lock();
                st.connected
                    && st
                        .regions
                        .get(region)
                        .is_some_and(|r| r.ready && r.acked >= position)
            })
            .count()
    }

    /// Blocks until `needed` backups acknowledged `position` or `timeout` passes; returns
    /// how many did (Redis's `WAIT`).
    pub fn wait_count(
        &self,
        region: &str,
        position: LogPosition,
        needed: usize,
        timeout: Duration,
    ) -> usize {
        self.notify_write();
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &self.shared.board;
        let mut guard = lock.lock();
        loop {
            let acked = self.acked_count(region, position);
            if acked >= needed || cv.wait_until(&mut guard, deadline).timed_out() {
                return self.acked_count(region, position);
            }
        }
    }

    fn fenced(&self, region: &str) -> Option<u64> {
        self.shared
            .db
            .ship_source(region)
            .ok()
            .and_then(|s| s.fenced_by())
    }

    pub fn status(&self) -> Vec<BackupStatus> {
        self.shared
            .links()
            .iter()
            .map(|link| {
                let st = link.state.lock();
                let mut regions: Vec<_> = st
                    .regions
                    .iter()
                    .map(|(name, r)| {
                        let source = self.shared.db.ship_source(name).ok();
                        let lag = source.as_ref().map_or(0, |s| lag_bytes(s, r.acked));
                        RegionStatus {
                            name: name.clone(),
                            acked: r.acked,
                            end: source.map(|s| s.log_position()).unwrap_or_default(),
                            lag_bytes: lag,
                            // Nothing is shipped while the link is down, so the
                            // backup is behind since it went down.
                            lag: match st.down_since {
                                Some(since) if lag > 0 => r.lag().max(since.elapsed()),
                                _ => r.lag(),
                            },
                            applied_epoch: r.applied_epoch,
                        }
                    })
                    .collect();
                regions.sort_by(|a, b| a.name.cmp(&b.name));
                BackupStatus {
                    addr: link.addr.clone(),
                    backup_id: st.backup_id.clone(),
                    connected: st.connected,
                    last_error: st.last_error.clone(),
                    shipped_log_bytes: st.shipped_log_bytes,
                    shipped_index_bytes: st.shipped_index_bytes,
                    regions,
                }
            })
            .collect()
    }

    /// Stops every link (the backups see their connections close) and waits for them,
    /// a little. Blocks: not from an async context (`Drop` is safe there).
    pub fn stop(&self) {
        if let Some(runtime) = self.halt() {
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }

    /// Tells the links to stop; the runtime they run on, if still there.
    fn halt(&self) -> Option<tokio::runtime::Runtime> {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.db.set_commit_observer(None);
        for link in self.shared.links() {
            link.wake.notify_one();
        }
        let (_, cv) = &self.shared.board;
        cv.notify_all();
        self.runtime.lock().take()
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        // Without waiting: a drop may happen inside an async context.
        if let Some(runtime) = self.halt() {
            runtime.shutdown_background();
        }
    }
}

/// Bytes of the foreground log past `acked` (an estimate when they lie in different
/// segments: the tail's offset).
fn lag_bytes(source: &ShipSource, acked: LogPosition) -> u64 {
    let end = source.log_position();
    if end.order == acked.order {
        end.offset.saturating_sub(acked.offset)
    } else {
        end.offset
    }
}

/// The commit observer: queues each replicated region's delta on every link.
struct Observer(std::sync::Weak<Shared>);

impl CommitObserver for Observer {
    fn committed(&self, delta: CommitDelta) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        shared.newest_epoch.store(delta.epoch.0, Ordering::Release);
        for region in delta.regions {
            {
                let mut changed = shared.changed.lock();
                let same = |(_, before): &(u64, RegionDesc)| {
                    // The tree's epoch moves with every commit; with no node written it
                    // names nothing a backup holds.
                    RegionDesc {
                        tree_epoch: region.desc.tree_epoch,
                        ..before.clone()
                    } == region.desc
                };
                if region.nodes.is_empty()
                    && region.released_nodes.is_empty()
                    && changed.get(&region.desc.name).is_some_and(same)
                {
                    continue;
                }
                changed.insert(
                    region.desc.name.clone(),
                    (delta.epoch.0, region.desc.clone()),
                );
            }
            let queued = Arc::new(QueuedDelta {
                epoch: delta.epoch.0,
                released: region.released_nodes.iter().map(|o| o.0).collect(),
                desc: region.desc,
                next_order: region.next_order,
                nodes: region.nodes,
            });
            for link in shared.links() {
                let mut st = link.state.lock();
                if !st.connected || !st.wants_index {
                    continue;
                }
                if let Some(r) = st.regions.get_mut(&queued.desc.name) {
                    r.on_commit(&queued);
                }
                drop(st);
                link.wake.notify_one();
            }
        }
    }
}

/// Sets every region's ship horizon: the lowest order any connected backup may still lack.
fn update_horizons(shared: &Shared) {
    let mut horizons: HashMap<String, u64> = HashMap::new();
    for link in shared.links() {
        let st = link.state.lock();
        if !st.connected {
            continue;
        }
        for (name, r) in &st.regions {
            let h = if r.ready { r.lowest_open } else { 0 };
            let e = horizons.entry(name.clone()).or_insert(u64::MAX);
            *e = (*e).min(h);
        }
    }
    for name in shared.db.keyspace_names() {
        if let Ok(source) = shared.db.ship_source(&name) {
            source.set_horizon(horizons.get(&name).copied().unwrap_or(u64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(order: u64, offset: u64) -> LogPosition {
        LogPosition { order, offset }
    }

    #[test]
    fn acknowledgements_retire_the_shipped_positions_they_cover() {
        let mut r = RegionLink::default();
        r.shipped(at(1, 100));
        r.shipped(at(1, 200));
        r.shipped(at(2, 50));
        r.acknowledged(at(1, 150));
        assert_eq!(r.acked, at(1, 150));
        let left: Vec<_> = r.unacked.iter().map(|(p, _)| *p).collect();
        assert_eq!(left, [at(1, 200), at(2, 50)]);
        // An older acknowledgement (reordered) moves nothing back.
        r.acknowledged(at(1, 10));
        assert_eq!(r.acked, at(1, 150));
        r.acknowledged(at(2, 50));
        assert!(r.unacked.is_empty());
        assert_eq!(r.lag(), Duration::ZERO);
    }

    #[test]
    fn past_its_bound_the_queue_stretches_its_newest_entry_and_keeps_its_time() {
        let mut r = RegionLink::default();
        for i in 0..UNACKED_POSITIONS as u64 {
            r.shipped(at(1, i));
        }
        let newest_time = r.unacked.back().unwrap().1;
        r.shipped(at(3, 7));
        assert_eq!(r.unacked.len(), UNACKED_POSITIONS);
        assert_eq!(*r.unacked.back().unwrap(), (at(3, 7), newest_time));
        r.acknowledged(at(3, 6));
        assert_eq!(r.unacked.len(), 1, "only the stretched entry is left");
        r.acknowledged(at(3, 7));
        assert!(r.unacked.is_empty());
    }
}
