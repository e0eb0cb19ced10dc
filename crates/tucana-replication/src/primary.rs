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

use parking_lot::{Condvar, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;
use tucana::replication::{
    CommitDelta, CommitObserver, LogPosition, RegionDesc, ShipSource, NODE_BYTES,
};
use tucana::types::DiskOffset;
use tucana::Database;

use crate::frame::{Frame, RegionInfo, PROTOCOL_VERSION};
use crate::transport::{self, Dialer};

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
    pub dialer: Dialer,
}

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
    /// The backup's newest applied commit.
    applied_epoch: u64,
    /// The foreground position the backup acknowledged.
    acked: LogPosition,
}

/// One backup, as the primary sees it.
struct Link {
    addr: String,
    state: Mutex<LinkState>,
    wake: Notify,
}

#[derive(Default)]
struct LinkState {
    connected: bool,
    backup_id: String,
    wants_index: bool,
    regions: HashMap<String, RegionLink>,
    last_error: Option<String>,
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
    /// Per region: (name, acknowledged position, lag in bytes behind the log's end,
    /// applied commit).
    pub regions: Vec<(String, LogPosition, u64, u64)>,
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
    links: Vec<Arc<Link>>,
    stop: AtomicBool,
    /// The newest commit epoch the observer saw.
    newest_epoch: AtomicU64,
    /// Writers waiting for acknowledgements sleep here.
    board: (Mutex<()>, Condvar),
}

/// The replication of a primary's keyspaces to its configured backups.
pub struct Primary {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Primary {
    /// Starts a link to every backup of `config`. Every keyspace of `db` is replicated;
    /// one at term 0 is raised to term 1.
    pub fn start(db: Database, config: PrimaryConfig) -> std::io::Result<Primary> {
        let links = config
            .backups
            .iter()
            .map(|addr| {
                Arc::new(Link {
                    addr: addr.clone(),
                    state: Mutex::new(LinkState::default()),
                    wake: Notify::new(),
                })
            })
            .collect();
        let shared = Arc::new(Shared {
            db: db.clone(),
            config,
            links,
            stop: AtomicBool::new(false),
            newest_epoch: AtomicU64::new(0),
            board: (Mutex::new(()), Condvar::new()),
        });
        db.set_commit_observer(Some(Arc::new(Observer(Arc::downgrade(&shared)))));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tucana-repl-primary")
            .enable_all()
            .build()?;
        for link in &shared.links {
            runtime.spawn(run_link(shared.clone(), link.clone()));
        }
        Ok(Primary {
            shared,
            runtime: Some(runtime),
        })
    }

    /// Whether any backup is configured (a primary without backups acknowledges alone).
    pub fn has_backups(&self) -> bool {
        !self.shared.links.is_empty()
    }

    /// Wakes the links: a write was made (they ship it).
    pub fn notify_write(&self) {
        for link in &self.shared.links {
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
            let needed = self.shared.links.len();
            if acked >= needed {
                return Ok(());
            }
            if cv.wait_until(&mut guard, deadline).timed_out() {
                let acked = self.acked_count(region, position);
                if acked >= needed {
                    return Ok(());
                }
                return Err(AckError::NoReplicas { acked, needed });
            }
        }
    }

    /// Backups that acknowledged keyspace `region`'s log up to `position`.
    pub fn acked_count(&self, region: &str, position: LogPosition) -> usize {
        self.shared
            .links
            .iter()
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
            .links
            .iter()
            .map(|link| {
                let st = link.state.lock();
                let mut regions: Vec<_> = st
                    .regions
                    .iter()
                    .map(|(name, r)| {
                        let lag = self
                            .shared
                            .db
                            .ship_source(name)
                            .map(|s| lag_bytes(&s, r.acked))
                            .unwrap_or(0);
                        (name.clone(), r.acked, lag, r.applied_epoch)
                    })
                    .collect();
                regions.sort_by(|a, b| a.0.cmp(&b.0));
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

    /// Stops every link (the backups see their connections close).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.db.set_commit_observer(None);
        for link in &self.shared.links {
            link.wake.notify_one();
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
        let (_, cv) = &self.shared.board;
        cv.notify_all();
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        self.shutdown();
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
            let queued = Arc::new(QueuedDelta {
                epoch: delta.epoch.0,
                released: region.released_nodes.iter().map(|o| o.0).collect(),
                desc: region.desc,
                next_order: region.next_order,
                nodes: region.nodes,
            });
            for link in &shared.links {
                let mut st = link.state.lock();
                if !st.connected || !st.wants_index {
                    continue;
                }
                if let Some(r) = st.regions.get_mut(&queued.desc.name) {
                    if r.deltas.len() >= MAX_QUEUED_DELTAS {
                        r.deltas.clear();
                        r.need_full = true;
                    } else if !r.need_full {
                        r.deltas.push_back(queued.clone());
                    }
                }
                drop(st);
                link.wake.notify_one();
            }
        }
    }
}

/// Dials the backup again and again, and runs a connection while it lasts.
async fn run_link(shared: Arc<Shared>, link: Arc<Link>) {
    while !shared.stop.load(Ordering::Acquire) {
        let result = run_connection(&shared, &link).await;
        {
            let mut st = link.state.lock();
            st.connected = false;
            for r in st.regions.values_mut() {
                r.ready = false;
                r.deltas.clear();
            }
            if let Err(e) = result {
                st.last_error = Some(e.to_string());
            }
        }
        shared.board.1.notify_all();
        tokio::time::sleep(REDIAL).await;
    }
}

/// The regions to replicate now: every keyspace, each raised to term 1 at least.
fn replicated_regions(db: &Database) -> Vec<RegionInfo> {
    db.keyspace_names()
        .into_iter()
        .filter_map(|name| {
            let source = db.ship_source(&name).ok()?;
            if source.term() == 0 {
                source.raise_term(1);
            }
            Some(RegionInfo {
                name,
                seed: source.seed(),
                term: source.term(),
            })
        })
        .collect()
}

async fn run_connection(shared: &Arc<Shared>, link: &Arc<Link>) -> std::io::Result<()> {
    let stream = shared.config.dialer.dial(&link.addr).await?;
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut scratch = Vec::new();
    let regions = replicated_regions(&shared.db);
    transport::write_frame(
        &mut writer,
        &Frame::Open {
            version: PROTOCOL_VERSION,
            primary: shared.config.id.clone(),
            password: shared.config.password.clone(),
            ack_durable: shared.config.ack_durable,
            regions: regions.clone(),
        },
        &mut scratch,
    )
    .await?;
    {
        let mut st = link.state.lock();
        st.connected = true;
        st.last_error = None;
        st.regions
            .retain(|name, _| regions.iter().any(|r| &r.name == name));
        for r in &regions {
            let entry = st.regions.entry(r.name.clone()).or_default();
            entry.term = r.term;
            entry.ready = false;
        }
    }
    let receiver = {
        let shared = shared.clone();
        let link = link.clone();
        async move {
            let mut scratch = Vec::new();
            while let Some(frame) = transport::read_frame(&mut reader, &mut scratch).await? {
                on_backup_frame(&shared, &link, frame)?;
            }
            Err::<(), _>(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the backup closed the connection",
            ))
        }
    };
    let sender = async {
        let mut announced: Vec<String> = regions.into_iter().map(|r| r.name).collect();
        loop {
            if shared.stop.load(Ordering::Acquire) {
                writer.shutdown().await.ok();
                return Ok(());
            }
            announce_new_regions(shared, link, &mut announced, &mut writer, &mut scratch).await?;
            let busy = ship_round(shared, link, &mut writer, &mut scratch).await?;
            writer.flush().await?;
            update_horizons(shared);
            if !busy {
                tokio::select! {
                    _ = link.wake.notified() => {}
                    _ = tokio::time::sleep(IDLE_TICK) => {}
                }
            }
        }
    };
    tokio::select! {
        r = receiver => r,
        r = sender => r,
    }
}

/// Announces keyspaces created since the connection opened, and drops those that are gone.
async fn announce_new_regions<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Shared,
    link: &Link,
    announced: &mut Vec<String>,
    writer: &mut W,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    let now = replicated_regions(&shared.db);
    let new: Vec<RegionInfo> = now
        .iter()
        .filter(|r| !announced.contains(&r.name))
        .cloned()
        .collect();
    let gone: Vec<String> = announced
        .iter()
        .filter(|name| !now.iter().any(|r| &r.name == *name))
        .cloned()
        .collect();
    for name in &gone {
        let term = link.state.lock().regions.remove(name).map_or(0, |r| r.term);
        transport::write_frame(
            writer,
            &Frame::Dropped {
                region: name.clone(),
                term,
            },
            scratch,
        )
        .await?;
    }
    announced.retain(|name| !gone.contains(name));
    if !new.is_empty() {
        {
            let mut st = link.state.lock();
            for r in &new {
                let entry = st.regions.entry(r.name.clone()).or_default();
                entry.term = r.term;
                entry.ready = false;
            }
        }
        announced.extend(new.iter().map(|r| r.name.clone()));
        transport::write_frame(writer, &Frame::Regions(new), scratch).await?;
    }
    Ok(())
}

fn on_backup_frame(shared: &Shared, link: &Link, frame: Frame) -> std::io::Result<()> {
    let newest = shared.newest_epoch.load(Ordering::Acquire);
    match frame {
        Frame::Hello {
            backup,
            wants_index,
            regions,
        } => {
            let mut st = link.state.lock();
            st.backup_id = backup;
            st.wants_index = wants_index;
            for state in regions {
                let Some(r) = st.regions.get_mut(&state.name) else {
                    continue;
                };
                r.held = state
                    .segments
                    .iter()
                    .map(|(order, _, held)| (*order, *held))
                    .collect();
                r.lowest_open = 0;
                r.deltas.clear();
                r.applied_epoch = state.upstream_epoch;
                r.need_full = wants_index
                    && !(state.node_map_current
                        && state.upstream_epoch != 0
                        && state.upstream_epoch == newest);
                r.ready = true;
            }
            drop(st);
            link.wake.notify_one();
        }
        Frame::Ack {
            region,
            term,
            order,
            offset,
            ..
        } => {
            let mut st = link.state.lock();
            if let Some(r) = st.regions.get_mut(&region) {
                if term == r.term {
                    r.acked = r.acked.max(LogPosition { order, offset });
                }
            }
            drop(st);
            shared.board.1.notify_all();
        }
        Frame::Applied {
            region,
            upstream_epoch,
            ..
        } => {
            if let Some(r) = link.state.lock().regions.get_mut(&region) {
                r.applied_epoch = r.applied_epoch.max(upstream_epoch);
            }
        }
        Frame::Superseded { region, term } => {
            if let Ok(source) = shared.db.ship_source(&region) {
                source.fence(term);
            }
            shared.board.1.notify_all();
        }
        Frame::Refused { reason } => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("the backup refused: {reason}"),
            ));
        }
        other => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a backup sent {other:?}"),
            ))
        }
    }
    Ok(())
}

/// Ships what is new in every ready region: log bytes by segment order, then the
/// commit deltas queued (or a full index). Returns whether it stopped at its budget with
/// more to do.
async fn ship_round<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Shared,
    link: &Link,
    writer: &mut W,
    scratch: &mut Vec<u8>,
) -> std::io::Result<bool> {
    let names: Vec<(String, u64)> = {
        let st = link.state.lock();
        st.regions
            .iter()
            .filter(|(_, r)| r.ready)
            .map(|(n, r)| (n.clone(), r.term))
            .collect()
    };
    let mut budget = ROUND_BYTES;
    for (name, term) in names {
        let Ok(source) = shared.db.ship_source(&name) else {
            continue;
        };
        if source.fenced_by().is_some() {
            continue;
        }
        let caught_up = ship_log(link, &source, &name, term, &mut budget, writer, scratch).await?;
        if !caught_up {
            return Ok(true);
        }
        ship_commits(shared, link, &source, &name, term, writer, scratch).await?;
    }
    Ok(false)
}

/// Ships the log bytes of region `name` the backup lacks, while `budget` lasts. Returns
/// whether it shipped all that was ready.
async fn ship_log<W: tokio::io::AsyncWrite + Unpin>(
    link: &Link,
    source: &ShipSource,
    name: &str,
    term: u64,
    budget: &mut u64,
    writer: &mut W,
    scratch: &mut Vec<u8>,
) -> std::io::Result<bool> {
    let (from, held) = {
        let st = link.state.lock();
        let r = &st.regions[name];
        (r.lowest_open, r.held.clone())
    };
    let segments = source.segments(from, 1024);
    let mut lowest_open = segments.last().map_or(from, |s| s.order + 1);
    let mut buf = vec![0u8; CHUNK_BYTES];
    for seg in &segments {
        let mut at = held.get(&seg.order).copied().unwrap_or(0);
        while at < seg.ready_bytes {
            if *budget == 0 {
                record_held(link, name, seg.order, at, lowest_open.min(seg.order));
                return Ok(false);
            }
            let n = ((seg.ready_bytes - at) as usize).min(CHUNK_BYTES);
            source
                .read(seg.base, at, &mut buf[..n])
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            transport::write_frame(
                writer,
                &Frame::Log {
                    region: name.to_string(),
                    term,
                    order: seg.order,
                    origin: seg.base.0,
                    size_bytes: seg.size_bytes,
                    offset: at,
                    relocation: seg.relocation,
                    bytes: buf[..n].to_vec(),
                },
                scratch,
            )
            .await?;
            at += n as u64;
            *budget = budget.saturating_sub(n as u64);
            link.state.lock().shipped_log_bytes += n as u64;
        }
        if seg.open {
            lowest_open = lowest_open.min(seg.order);
        }
        record_held(link, name, seg.order, at, u64::MAX);
    }
    if let Some(r) = link.state.lock().regions.get_mut(name) {
        r.lowest_open = lowest_open;
        // What lies below the lowest open segment is complete on the backup.
        r.held = r
            .held
            .split_off(&lowest_open.min(r.held.keys().next_back().copied().unwrap_or(0)));
    }
    Ok(true)
}

fn record_held(link: &Link, name: &str, order: u64, held: u64, lowest_open: u64) {
    if let Some(r) = link.state.lock().regions.get_mut(name) {
        r.held.insert(order, held);
        if lowest_open != u64::MAX {
            r.lowest_open = lowest_open;
        }
    }
}

/// Ships the queued commit deltas of region `name` (or its newest commit in full).
async fn ship_commits<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Shared,
    link: &Link,
    source: &ShipSource,
    name: &str,
    term: u64,
    writer: &mut W,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    let need_full = link
        .state
        .lock()
        .regions
        .get(name)
        .is_some_and(|r| r.need_full);
    if need_full {
        return ship_full(shared, link, source, name, term, writer, scratch).await;
    }
    loop {
        let delta = {
            let mut st = link.state.lock();
            let Some(r) = st.regions.get_mut(name) else {
                return Ok(());
            };
            match r.deltas.pop_front() {
                Some(d) if d.epoch <= r.applied_epoch => continue,
                Some(d) => d,
                None => return Ok(()),
            }
        };
        let bytes = send_commit(
            writer,
            scratch,
            name,
            term,
            delta.epoch,
            false,
            &delta.desc,
            delta.next_order,
            &delta.nodes,
            delta.released.clone(),
        )
        .await?;
        link.state.lock().shipped_index_bytes += bytes;
    }
}

/// Ships region `name`'s newest commit in full: first the bytes the backup lacks of
/// every segment it lists (segments retired since are still there: the pin keeps them),
/// then every node of its tree, then the commit.
async fn ship_full<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Shared,
    link: &Link,
    source: &ShipSource,
    name: &str,
    term: u64,
    writer: &mut W,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    let other = |e: tucana::Error| std::io::Error::other(e.to_string());
    let source_clone = source.clone();
    let pinned = tokio::task::spawn_blocking(move || source_clone.pin_newest_commit())
        .await
        .map_err(std::io::Error::other)?
        .map_err(other)?;
    let Some(pinned) = pinned else {
        return Ok(());
    };
    let held = link.state.lock().regions[name].held.clone();
    let mut buf = vec![0u8; CHUNK_BYTES];
    let throttle = Throttle::new(shared.config.catchup_bytes_per_sec);
    for (origin, stats) in &pinned.desc.segments {
        let mut at = held.get(&stats.order).copied().unwrap_or(0);
        while at < stats.written_bytes {
            let n = ((stats.written_bytes - at) as usize).min(CHUNK_BYTES);
            source.read(*origin, at, &mut buf[..n]).map_err(other)?;
            transport::write_frame(
                writer,
                &Frame::Log {
                    region: name.to_string(),
                    term,
                    order: stats.order,
                    origin: origin.0,
                    size_bytes: stats.size_bytes,
                    offset: at,
                    relocation: false,
                    bytes: buf[..n].to_vec(),
                },
                scratch,
            )
            .await?;
            at += n as u64;
            throttle.pace(n as u64).await;
        }
        record_held(link, name, stats.order, at, u64::MAX);
    }
    let (pinned, nodes) = tokio::task::spawn_blocking(move || {
        let mut nodes = Vec::new();
        let result = pinned.for_each_node(&mut |off, image| {
            nodes.push((off, image));
            Ok(())
        });
        result.map(|()| (pinned, nodes))
    })
    .await
    .map_err(std::io::Error::other)?
    .map_err(other)?;
    let bytes = send_commit(
        writer,
        scratch,
        name,
        term,
        pinned.epoch,
        true,
        &pinned.desc,
        pinned.next_order,
        &nodes,
        Vec::new(),
    )
    .await?;
    let mut st = link.state.lock();
    st.shipped_index_bytes += bytes;
    if let Some(r) = st.regions.get_mut(name) {
        r.need_full = false;
        r.applied_epoch = r.applied_epoch.max(pinned.epoch);
        let epoch = pinned.epoch;
        r.deltas.retain(|d| d.epoch > epoch);
    }
    Ok(())
}

/// Sends a commit's nodes and then the commit; returns the bytes of node images sent.
#[allow(clippy::too_many_arguments)]
async fn send_commit<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    scratch: &mut Vec<u8>,
    name: &str,
    term: u64,
    epoch: u64,
    full: bool,
    desc: &RegionDesc,
    next_order: u64,
    nodes: &[(DiskOffset, Box<[u8; NODE_BYTES]>)],
    released: Vec<u64>,
) -> std::io::Result<u64> {
    for chunk in nodes.chunks(NODES_PER_FRAME) {
        transport::write_frame(
            writer,
            &Frame::Nodes {
                region: name.to_string(),
                term,
                upstream_epoch: epoch,
                nodes: chunk
                    .iter()
                    .map(|(off, image)| (off.0, image.clone()))
                    .collect(),
            },
            scratch,
        )
        .await?;
    }
    transport::write_frame(
        writer,
        &Frame::Commit {
            region: name.to_string(),
            term,
            upstream_epoch: epoch,
            full,
            next_order,
            node_count: nodes.len() as u64,
            released,
            desc: Box::new(desc.clone()),
        },
        scratch,
    )
    .await?;
    Ok((nodes.len() * NODE_BYTES) as u64)
}

/// Sets every region's ship horizon: the lowest order any connected backup may still lack.
fn update_horizons(shared: &Shared) {
    let mut horizons: HashMap<String, u64> = HashMap::new();
    for link in &shared.links {
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

/// Paces bytes to a rate (0: no limit).
struct Throttle {
    bytes_per_sec: u64,
    start: Instant,
    sent: std::sync::atomic::AtomicU64,
}

impl Throttle {
    fn new(bytes_per_sec: u64) -> Throttle {
        Throttle {
            bytes_per_sec,
            start: Instant::now(),
            sent: std::sync::atomic::AtomicU64::new(0),
        }
    }

    async fn pace(&self, bytes: u64) {
        if self.bytes_per_sec == 0 {
            return;
        }
        let sent = self.sent.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let due = Duration::from_secs_f64(sent as f64 / self.bytes_per_sec as f64);
        let elapsed = self.start.elapsed();
        if due > elapsed {
            tokio::time::sleep(due - elapsed).await;
        }
    }
}
