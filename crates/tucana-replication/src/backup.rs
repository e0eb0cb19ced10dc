//! The backup's side: a listener that takes primaries' connections and turns each
//! stream into replica regions (log bytes into their copies, each commit's nodes rewritten
//! and applied), acknowledging what it holds (DESIGN.md, "Replication").
//!
//! Owns: the handshake (password, terms: a region this server holds at a higher term is
//! answered `Superseded`), acknowledgements (coalesced: one per region per batch of frames
//! read, after a group sync in durable mode), and the build-index baseline, which applies
//! every shipped foreground record to a keyspace of its own instead. Does not own: what a
//! replica does with bytes and commits (the engine's `ReplicaHandle`).
//!
//! Thread-safety: one tokio task per connection; applying a commit and syncing run on the
//! blocking pool.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tucana::log::record::{Header, RecordRef, HEADER_BYTES};
use tucana::replication::{Delta, NODE_BYTES};
use tucana::types::DiskOffset;
use tucana::{Database, Error, Keyspace};

use crate::frame::{Frame, RegionInfo, RegionState, PROTOCOL_VERSION};
use crate::transport::{self, Acceptor, BoxStream};

/// The longest a backup goes without acknowledging while frames keep arriving.
const ACK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);
/// How a backup takes replication.
#[derive(Clone)]
pub struct BackupConfig {
    /// This server's name, as it tells primaries.
    pub id: String,
    /// A primary must present it in `Open`.
    pub password: String,
    /// The baseline: build an index of its own from every shipped record (as Redis,
    /// Kvrocks and Pika replicas do) instead of applying the primary's. For benchmarks: it
    /// must be attached before the data is written.
    pub build_index: bool,
    pub acceptor: Acceptor,
}

/// Replication figures of a backup, for `INFO` and metrics.
#[derive(Clone, Debug, Default)]
pub struct BackupCounters {
    pub connections: u64,
    pub received_log_bytes: u64,
    /// CPU time (of the threads that did it) spent storing shipped log bytes (for the
    /// baseline: applying its records to its own index), ns; estimated from one frame
    /// in `LOG_CPU_SAMPLE`.
    pub log_cpu_ns: u64,
    /// CPU time spent applying commits (rewriting and writing nodes, the commit), ns.
    pub index_cpu_ns: u64,
    pub received_index_bytes: u64,
    pub commits_applied: u64,
    /// The primary of the last connection.
    pub primary: String,
    pub connected: bool,
    /// Why the last connection ended, if it failed.
    pub last_error: Option<String>,
}

struct Shared {
    db: Database,
    config: BackupConfig,
    stop: AtomicBool,
    counters: Mutex<BackupCounters>,
    /// Commits applied, for tests and metrics without the lock.
    applied: AtomicU64,
    /// `Log` frames taken, for sampling their CPU time.
    log_frames: AtomicU64,
}

/// One `Log` frame in this many has its CPU time measured (and counted this many times).
const LOG_CPU_SAMPLE: u64 = 16;

/// A running replication listener.
pub struct Backup {
    shared: Arc<Shared>,
    addr: SocketAddr,
    runtime: parking_lot::Mutex<Option<tokio::runtime::Runtime>>,
}

impl Backup {
    /// Listens on `listen` (`host:port`; port 0 picks one) for primaries.
    pub fn start(db: Database, listen: &str, config: BackupConfig) -> std::io::Result<Backup> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tucana-repl-backup")
            .enable_all()
            .build()?;
        // Bound here, not on the runtime: the caller may be inside another runtime (the
        // server binds its listeners in one), where `block_on` is not allowed.
        let std_listener = std::net::TcpListener::bind(listen)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(std_listener)?
        };
        let shared = Arc::new(Shared {
            db,
            config,
            stop: AtomicBool::new(false),
            counters: Mutex::new(BackupCounters::default()),
            applied: AtomicU64::new(0),
            log_frames: AtomicU64::new(0),
        });
        runtime.spawn(accept_loop(shared.clone(), listener));
        Ok(Backup {
            shared,
            addr,
            runtime: parking_lot::Mutex::new(Some(runtime)),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn counters(&self) -> BackupCounters {
        self.shared.counters.lock().clone()
    }

    /// Stops listening and closes every connection, waiting for them a little. Blocks:
    /// not from an async context (`Drop` is safe there).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(runtime) = self.runtime.lock().take() {
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

impl Drop for Backup {
    fn drop(&mut self) {
        // Without waiting: a drop may happen inside an async context.
        self.shared.stop.store(true, Ordering::Release);
        if let Some(runtime) = self.runtime.lock().take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let Ok(stream) = shared.config.acceptor.accept(tcp).await else {
                return;
            };
            shared.counters.lock().connections += 1;
            let result = serve_primary(&shared, stream).await;
            let mut c = shared.counters.lock();
            c.connected = false;
            if let Err(e) = result {
                c.last_error = Some(e.to_string());
            }
        });
    }
}

fn other(e: Error) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// What a connection keeps per region.
#[derive(Default)]
struct Incoming {
    term: u64,
    seed: u32,
    /// The primary's log generation on this connection.
    generation: u32,
    /// Node images of the commit being shipped.
    nodes: Vec<(DiskOffset, Box<[u8; NODE_BYTES]>)>,
    /// The foreground position received and not acknowledged yet.
    unacked: Option<(u64, u64)>,
    /// The last position acknowledged on this connection.
    acked: Option<(u64, u64)>,
    /// Build-index baseline: bytes received per segment order, a record cut by the end of
    /// a frame, and a batch whose last record has not come.
    held: HashMap<u64, u64>,
    partial: HashMap<u64, Vec<u8>>,
    batch: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

async fn serve_primary(shared: &Arc<Shared>, stream: BoxStream) -> std::io::Result<()> {
    let (reader, mut writer) = tokio::io::split(stream);
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let mut scratch = Vec::new();
    let mut out = Vec::new();
    let Some(Frame::Open {
        version,
        primary,
        password,
        ack_durable,
        regions,
    }) = transport::read_frame(&mut reader, &mut scratch).await?
    else {
        return Ok(());
    };
    let refuse = |reason: String| Frame::Refused { reason };
    if version != PROTOCOL_VERSION {
        let frame = refuse(format!(
            "protocol version {version}, this server speaks {PROTOCOL_VERSION}"
        ));
        return transport::write_frame(&mut writer, &frame, &mut out).await;
    }
    if password != shared.config.password {
        return transport::write_frame(&mut writer, &refuse("wrong password".into()), &mut out)
            .await;
    }
    {
        let mut c = shared.counters.lock();
        c.primary = primary;
        c.connected = true;
    }
    let mut incoming: HashMap<String, Incoming> = HashMap::new();
    let hello = open_regions(shared, &regions, &mut incoming, &mut writer, &mut out).await?;
    transport::write_frame(&mut writer, &hello, &mut out).await?;
    writer.flush().await?;
    let mut acked_at = std::time::Instant::now();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(frame) = transport::read_frame(&mut reader, &mut scratch).await? else {
            return Ok(());
        };
        on_frame(shared, frame, &mut incoming, &mut writer, &mut out).await?;
        // Acknowledged when nothing more is buffered (one sync for a burst), and at least
        // every ACK_INTERVAL while frames keep coming: with acknowledgements sent only
        // on an empty buffer, a primary that never stopped sending (two servers backing
        // each other, each applied commit answered by a commit) got none for minutes,
        // and its writes waited all that time (M10, seed 116).
        if reader.buffer().is_empty() || acked_at.elapsed() >= ACK_INTERVAL {
            send_acks(shared, ack_durable, &mut incoming, &mut writer, &mut out).await?;
            writer.flush().await?;
            acked_at = std::time::Instant::now();
        }
    }
}

/// Takes the regions a primary replicates: each becomes (or already is) a replica, or a
/// keyspace of its own for the baseline; one this server holds at a higher term is
/// answered `Superseded`. Returns the `Hello` that says what it holds of each.
async fn open_regions<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Arc<Shared>,
    regions: &[RegionInfo],
    incoming: &mut HashMap<String, Incoming>,
    writer: &mut W,
    out: &mut Vec<u8>,
) -> std::io::Result<Frame> {
    let mut states = Vec::new();
    for info in regions {
        let db = shared.db.clone();
        let build_index = shared.config.build_index;
        let info2 = info.clone();
        let state = tokio::task::spawn_blocking(move || open_region(&db, &info2, build_index))
            .await
            .map_err(std::io::Error::other)?;
        match state {
            Ok(state) => {
                incoming.insert(
                    info.name.clone(),
                    Incoming {
                        term: info.term,
                        seed: info.seed,
                        generation: info.generation,
                        ..Incoming::default()
                    },
                );
                states.push(state);
            }
            Err(Opened::Superseded(term)) => {
                let frame = Frame::Superseded {
                    region: info.name.clone(),
                    term,
                };
                transport::write_frame(writer, &frame, out).await?;
            }
            Err(Opened::Refused(reason)) => {
                transport::write_frame(writer, &Frame::Refused { reason }, out).await?;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "refused",
                ));
            }
        }
    }
    Ok(Frame::Hello {
        backup: shared.config.id.clone(),
        wants_index: !shared.config.build_index,
        regions: states,
    })
}

enum Opened {
    Superseded(u64),
    Refused(String),
}

fn open_region(db: &Database, info: &RegionInfo, build_index: bool) -> Result<RegionState, Opened> {
    let empty = |term| RegionState {
        name: info.name.clone(),
        term,
        upstream_epoch: 0,
        node_map_current: true,
        segments: Vec::new(),
    };
    if build_index {
        let ks = db
            .keyspace(&info.name)
            .map_err(|e| Opened::Refused(e.to_string()))?;
        if ks.term() > info.term {
            return Err(Opened::Superseded(ks.term()));
        }
        return Ok(empty(info.term));
    }
    if let Ok(ks) = db.open_keyspace(&info.name) {
        // A keyspace of this server: a promoted replica (a higher term) or a clash.
        if ks.term() > info.term {
            return Err(Opened::Superseded(ks.term()));
        }
        return Err(Opened::Refused(format!(
            "keyspace {:?} is this server's own (term {}), not a replica",
            info.name,
            ks.term()
        )));
    }
    let mut replica = db
        .replica(&info.name, info.seed, info.term)
        .map_err(|e| Opened::Refused(e.to_string()))?;
    let mut state = replica.state();
    if state.term > info.term {
        return Err(Opened::Superseded(state.term));
    }
    if state.term < info.term && (state.upstream_epoch > 0 || !state.segments.is_empty()) {
        // A copy shipped by an earlier primary of the region (this server backed it, died
        // or was dropped from it, and is now assigned to the backup promoted since). The
        // new primary's segments are not that one's: kept, the copy would refuse them
        // ("segment 0 changed size or place") on every connection and the region would
        // acknowledge nothing. Every acknowledged write is on the new primary, so the copy
        // goes and this backup catches up from nothing, as a new one does.
        eprintln!(
            "tucana: replica {}: dropped the copy of an earlier primary (term {}, its commit {}, {} segments) to take the primary of term {} from nothing",
            info.name,
            state.term,
            state.upstream_epoch,
            state.segments.len(),
            info.term
        );
        replica
            .drop_replica()
            .map_err(|e| Opened::Refused(e.to_string()))?;
        replica = db
            .replica(&info.name, info.seed, info.term)
            .map_err(|e| Opened::Refused(e.to_string()))?;
        state = replica.state();
    }
    if state.seed != info.seed {
        return Err(Opened::Refused(format!(
            "replica {:?} holds records of another seed: not this primary's region",
            info.name
        )));
    }
    if !state.segments.is_empty() && state.committed_generation != Some(info.generation) {
        // The primary reopened the region since the last commit applied here (or none
        // was): what it shipped after that commit may be lost on its side and replaced
        // by other records. Kept, those bytes were skipped over when the new ones came,
        // acknowledged for them, and broke the log at promotion.
        eprintln!(
            "tucana: replica {}: the primary's log is of generation {} now, {:?} at its commit {} here: keeping only what that commit covers",
            info.name, info.generation, state.committed_generation, state.upstream_epoch
        );
        replica
            .keep_committed()
            .map_err(|e| Opened::Refused(e.to_string()))?;
        state = replica.state();
    }
    replica.raise_term(info.term);
    Ok(RegionState {
        name: state.name,
        term: info.term,
        upstream_epoch: state.upstream_epoch,
        node_map_current: state.node_map_current,
        segments: state
            .segments
            .iter()
            .map(|(order, origin, held)| (*order, origin.0, *held))
            .collect(),
    })
}

async fn on_frame<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Arc<Shared>,
    frame: Frame,
    incoming: &mut HashMap<String, Incoming>,
    writer: &mut W,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    match frame {
        Frame::Regions(regions) => {
            let hello = open_regions(shared, &regions, incoming, writer, out).await?;
            transport::write_frame(writer, &hello, out).await?;
        }
        Frame::Log { .. } => on_log(shared, frame, incoming)?,
        Frame::Nodes { region, nodes, .. } => {
            if let Some(inc) = incoming.get_mut(&region) {
                shared.counters.lock().received_index_bytes += (nodes.len() * NODE_BYTES) as u64;
                inc.nodes.extend(
                    nodes
                        .into_iter()
                        .map(|(off, image)| (DiskOffset(off), image)),
                );
            }
            // The failover harness's kill in the middle of an index's shipping.
            #[cfg(feature = "failpoints")]
            fail::fail_point!("backup-nodes", |_| tucana::failpoints::kill_self());
        }
        Frame::Commit { .. } => on_commit(shared, frame, incoming, writer, out).await?,
        Frame::Dropped { region, term } => {
            incoming.remove(&region);
            let db = shared.db.clone();
            let build_index = shared.config.build_index;
            tokio::task::spawn_blocking(move || {
                if build_index {
                    return db.drop_keyspace(&region);
                }
                match db.open_replica(&region) {
                    // Held at a newer term: another primary leads the region now and
                    // ships it here; a former primary that let its copy go (to become a
                    // backup itself) does not drop this one.
                    Some(r) if r.state().term > term => Ok(()),
                    Some(r) => r.drop_replica(),
                    None => Ok(()),
                }
            })
            .await
            .map_err(std::io::Error::other)?
            .map_err(other)?;
        }
        other_frame => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a primary sent {other_frame:?}"),
            ))
        }
    }
    Ok(())
}

/// Log bytes: into the replica's copy of their segment (or, for the baseline, applied as
/// writes); a foreground chunk moves the position to acknowledge.
fn on_log(
    shared: &Arc<Shared>,
    frame: Frame,
    incoming: &mut HashMap<String, Incoming>,
) -> std::io::Result<()> {
    let Frame::Log {
        region,
        term,
        order,
        origin,
        size_bytes,
        offset,
        relocation,
        bytes,
    } = frame
    else {
        return Ok(());
    };
    let Some(inc) = incoming.get_mut(&region) else {
        return Ok(());
    };
    if term < inc.term {
        return Ok(());
    }
    let end = offset + bytes.len() as u64;
    let received = bytes.len() as u64;
    // Reading a thread's CPU clock is a system call (~0.5 µs here), a real cost per
    // frame of small writes: one frame in LOG_CPU_SAMPLE is timed, counted for all.
    let sampled = shared
        .log_frames
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(LOG_CPU_SAMPLE);
    let cpu = if sampled { thread_cpu_ns() } else { 0 };
    if shared.config.build_index {
        build_index_apply(&shared.db, &region, inc, order, offset, relocation, bytes)?;
    } else {
        let replica = shared
            .db
            .open_replica(&region)
            .ok_or_else(|| other(Error::KeyspaceNotFound(region.clone())))?;
        replica
            .write_log(DiskOffset(origin), size_bytes, order, offset, &bytes)
            .map_err(other)?;
    }
    // The failover harness's kill in the middle of a segment's shipping.
    #[cfg(feature = "failpoints")]
    fail::fail_point!("backup-log", |_| tucana::failpoints::kill_self());
    {
        let mut c = shared.counters.lock();
        c.received_log_bytes += received;
        if sampled {
            c.log_cpu_ns += thread_cpu_ns().saturating_sub(cpu) * LOG_CPU_SAMPLE;
        }
    }
    if !relocation {
        inc.unacked = Some((order, end).max(inc.unacked.unwrap_or((0, 0))));
    }
    Ok(())
}

/// A commit, after its nodes: applied and made durable (the baseline commits on its own),
/// then answered `Applied`.
async fn on_commit<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Arc<Shared>,
    frame: Frame,
    incoming: &mut HashMap<String, Incoming>,
    writer: &mut W,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    let Frame::Commit {
        region,
        term,
        upstream_epoch,
        full,
        next_order,
        node_count,
        released,
        desc,
    } = frame
    else {
        return Ok(());
    };
    let Some(inc) = incoming.get_mut(&region) else {
        return Ok(());
    };
    let nodes = std::mem::take(&mut inc.nodes);
    if !shared.config.build_index {
        if nodes.len() as u64 != node_count {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "commit {upstream_epoch} of {region:?}: {} nodes, {node_count} announced",
                    nodes.len()
                ),
            ));
        }
        if full {
            // Once per join: where the replica's log stands against the commit it now
            // starts from (what a promotion replays from; M10's lost writes are traced by
            // it).
            let tail_order = desc
                .segments
                .iter()
                .find(|(at, _)| *at == desc.tail)
                .map(|(_, s)| s.order);
            let held = shared.db.open_replica(&region).and_then(|r| {
                let order = tail_order?;
                r.state()
                    .segments
                    .iter()
                    .find(|(o, _, _)| *o == order)
                    .map(|(_, _, held)| *held)
            });
            eprintln!(
                "tucana: replica {region}: the primary's commit {upstream_epoch} in full (generation {}): tail segment {tail_order:?} at {} of which {held:?} received here",
                desc.generation, desc.tail_used_bytes
            );
        }
        let delta = Delta {
            term,
            upstream_epoch,
            full,
            desc: *desc,
            next_order,
            nodes,
            released_nodes: released.into_iter().map(DiskOffset).collect(),
        };
        apply_commit(shared, &region, delta).await?;
    }
    let frame = Frame::Applied {
        region,
        term,
        upstream_epoch,
    };
    transport::write_frame(writer, &frame, out).await
}

async fn apply_commit(shared: &Arc<Shared>, region: &str, delta: Delta) -> std::io::Result<()> {
    let replica = shared
        .db
        .open_replica(region)
        .ok_or_else(|| other(Error::KeyspaceNotFound(region.to_string())))?;
    let cpu_ns = tokio::task::spawn_blocking(move || {
        let cpu = thread_cpu_ns();
        replica
            .apply(delta)
            .map(|()| thread_cpu_ns().saturating_sub(cpu))
    })
    .await
    .map_err(std::io::Error::other)?
    .map_err(|e| {
        // The connection ends and the primary sends a full index next time; say why,
        // as nothing else shows a backup that keeps refusing its primary's commits.
        eprintln!("tucana: replica {region}: a commit of the primary was not applied: {e}");
        other(e)
    })?;
    shared.applied.fetch_add(1, Ordering::Relaxed);
    let mut c = shared.counters.lock();
    c.commits_applied += 1;
    c.index_cpu_ns += cpu_ns;
    Ok(())
}

/// Acknowledges, for every region with foreground bytes received since the last
/// acknowledgement, how far promotion's replay would reach through what this backup holds
/// (`ReplicaHandle::replayable_position`: contiguous from the last applied commit, so a
/// segment that never arrived holds the acknowledgement back instead of being jumped
/// over), after one sync of the volume in durable mode. The baseline (`build_index`)
/// acknowledges what it applied.
async fn send_acks<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Arc<Shared>,
    durable: bool,
    incoming: &mut HashMap<String, Incoming>,
    writer: &mut W,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    if !incoming.values().any(|inc| inc.unacked.is_some()) {
        return Ok(());
    }
    // Positions are taken before the sync: it covers every byte they count.
    let mut acks = Vec::new();
    for (name, inc) in incoming.iter_mut() {
        if inc.unacked.is_none() {
            continue;
        }
        let position = if shared.config.build_index {
            inc.unacked.take()
        } else {
            let Some(replica) = shared.db.open_replica(name) else {
                continue;
            };
            if replica.state().committed_generation != Some(inc.generation) {
                // No commit of this opening of the primary's region applied yet: nothing
                // to promote from (the position waits for its first commit, which comes
                // in full). Replay from an older one would stop at the first record of
                // the new generation, so the bytes after it would be acknowledged and
                // lost.
                continue;
            }
            inc.unacked = None;
            replica
                .replayable_position()
                .filter(|p| inc.acked.is_none_or(|acked| *p > acked))
        };
        if let Some(position) = position {
            inc.acked = Some(position);
            acks.push((name.clone(), inc.term, position));
        }
    }
    if acks.is_empty() {
        return Ok(());
    }
    if durable {
        let db = shared.db.clone();
        tokio::task::spawn_blocking(move || db.sync())
            .await
            .map_err(std::io::Error::other)?
            .map_err(other)?;
    }
    for (region, term, (order, offset)) in acks {
        let frame = Frame::Ack {
            region,
            term,
            order,
            offset,
            durable,
        };
        transport::write_frame(writer, &frame, out).await?;
    }
    Ok(())
}

/// The baseline: parses the shipped foreground records and applies each as a write to
/// keyspace `region` (batches whole). Relocated copies are skipped: they carry no new
/// write, and a backup attached before the data was written has every original.
fn build_index_apply(
    db: &Database,
    region: &str,
    inc: &mut Incoming,
    order: u64,
    offset: u64,
    relocation: bool,
    bytes: Vec<u8>,
) -> std::io::Result<()> {
    let held = inc.held.entry(order).or_insert(0);
    if offset > *held {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("segment {order}: bytes from {offset}, {held} received"),
        ));
    }
    // Bytes sent again (a primary asking for an acknowledgement) are applied once.
    let skip = (*held - offset) as usize;
    if skip >= bytes.len() {
        return Ok(());
    }
    let bytes = if skip > 0 {
        bytes[skip..].to_vec()
    } else {
        bytes
    };
    *held += bytes.len() as u64;
    if relocation {
        return Ok(());
    }
    let ks: Keyspace = db.keyspace(region).map_err(other)?;
    let mut data = inc.partial.remove(&order).unwrap_or_default();
    data.extend_from_slice(&bytes);
    let mut pos = 0;
    while data.len() - pos >= HEADER_BYTES {
        let at = DiskOffset(pos as u64);
        let header = Header::decode(&data[pos..pos + HEADER_BYTES], at).map_err(other)?;
        let len = header.total_bytes() as usize;
        if data.len() - pos < len {
            break;
        }
        let rec = RecordRef::parse(&data[pos..pos + len], inc.seed, true, at).map_err(other)?;
        pos += len;
        if rec.header.is_link() || rec.header.is_relocated() {
            continue;
        }
        let value = (!rec.header.is_tombstone()).then(|| rec.value.to_vec());
        inc.batch.push((rec.key.to_vec(), value));
        if rec.header.batch_more() {
            continue;
        }
        let mut batch = ks.batch();
        for (key, value) in inc.batch.drain(..) {
            match value {
                Some(v) => batch.put(&key, &v),
                None => batch.delete(&key),
            };
        }
        batch.commit().map_err(other)?;
    }
    if pos < data.len() {
        inc.partial.insert(order, data[pos..].to_vec());
    }
    Ok(())
}

/// CPU time of the calling thread, ns (what a backup's work costs, apart from the
/// network's: the benchmark splits the process's CPU by it).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel
    // knows. On failure `ts` stays zero, which only makes the figure 0.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
