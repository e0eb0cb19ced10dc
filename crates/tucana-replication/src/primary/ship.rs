//! A shipping round of one link: for every region the backup is ready for, the log bytes
//! it lacks by segment order, then the commit deltas queued for it, or the newest commit in
//! full (with the bytes of every segment that commit lists) when its node map is not
//! current.
//!
//! Owns: the shipping cursor's moves and the framing of log chunks and commits. Does not
//! own: reading the log or pinning a commit (`tucana::replication::ShipSource`).
//!
//! Thread-safety: runs in its link's task; reads the link state under its mutex, never
//! across an await.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tucana::replication::{LogPosition, RegionDesc, ShipSource, NODE_BYTES};
use tucana::types::DiskOffset;

use super::{Link, Shared, CHUNK_BYTES, NODES_PER_FRAME, ROUND_BYTES};
use crate::frame::Frame;
use crate::transport;

/// Ships what is new in every ready region: log bytes by segment order, then the
/// commit deltas queued (or a full index). Returns whether it stopped at its budget with
/// more to do.
pub(super) async fn ship_round<W: tokio::io::AsyncWrite + Unpin>(
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
    let (from, held, confirm_tail) = {
        let st = link.state.lock();
        let r = &st.regions[name];
        (r.lowest_open, r.held.clone(), r.confirm_tail)
    };
    const LISTED: usize = 1024;
    let segments = source.segments(from, LISTED);
    let mut lowest_open = segments.last().map_or(from, |s| s.order + 1);
    // The newest foreground segment, when the list reaches the log's end.
    let tail = (segments.len() < LISTED)
        .then(|| segments.iter().rfind(|s| !s.relocation).map(|s| s.order))
        .flatten();
    if confirm_tail && segments.len() < LISTED && tail.is_none() {
        // No foreground byte written yet: nothing to confirm.
        if let Some(r) = link.state.lock().regions.get_mut(name) {
            r.confirm_tail = false;
        }
    }
    for seg in &segments {
        let mut at = held.get(&seg.order).copied().unwrap_or(0);
        if confirm_tail && tail == Some(seg.order) {
            if at > 0 && at == seg.ready_bytes {
                // Nothing of it to send after a new connection: its last byte again (the
                // backup skips what it holds), so the backup acknowledges where it stands.
                at -= 1;
            }
            // Reached: asked for now, or its bytes go anyway (and are acknowledged).
            if let Some(r) = link.state.lock().regions.get_mut(name) {
                r.confirm_tail = false;
            }
        }
        while at < seg.ready_bytes {
            if *budget == 0 {
                record_held(link, name, seg.order, at, lowest_open.min(seg.order));
                return Ok(false);
            }
            let n = ((seg.ready_bytes - at) as usize).min(CHUNK_BYTES);
            let bytes = read_chunk(source, seg.base, at, n)?;
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
                    bytes,
                },
                scratch,
            )
            .await?;
            at += n as u64;
            *budget = budget.saturating_sub(n as u64);
            let mut st = link.state.lock();
            st.shipped_log_bytes += n as u64;
            if let Some(r) = st.regions.get_mut(name) {
                r.log_since_index += n as u64;
                if !seg.relocation {
                    r.shipped(LogPosition {
                        order: seg.order,
                        offset: at,
                    });
                }
            }
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

/// Ships the queued commit deltas of region `name` (or its newest commit in full): each
/// as it is, or folded into later ones while its index would cost too much network for
/// the log it covers (`RegionLink::defers`); folded commits go as one delta when they
/// no longer do, or when they grew too old.
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
    let config = &shared.config;
    let index_now = shared.index_now.load(Ordering::Acquire);
    loop {
        let (delta, alone) = {
            let mut st = link.state.lock();
            let Some(r) = st.regions.get_mut(name) else {
                return Ok(());
            };
            let delta = match r.deltas.pop_front() {
                Some(d) if d.epoch <= r.applied_epoch => continue,
                Some(d) => d,
                None => break,
            };
            let bytes = (delta.nodes.len() * NODE_BYTES) as u64;
            let now = delta.epoch <= index_now;
            let alone = r.folded.is_empty() && (now || !r.defers(bytes, config));
            if alone && !r.covers(&delta.desc) {
                // Its log goes first, next round.
                r.deltas.push_front(delta);
                break;
            }
            if !alone {
                r.fold(&delta);
            }
            (delta, alone)
        };
        if alone {
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
            let mut st = link.state.lock();
            st.shipped_index_bytes += bytes;
            if let Some(r) = st.regions.get_mut(name) {
                r.index_shipped();
            }
        }
    }
    let due = link.state.lock().regions.get(name).is_some_and(|r| {
        r.folded
            .epoch()
            .is_some_and(|e| e <= index_now || !r.defers(r.folded.node_bytes(), config))
    });
    if due {
        ship_folded(shared, link, source, name, term, writer, scratch).await?;
    }
    Ok(())
}

/// Ships region `name`'s folded commits as one delta, read at the newest of them; if a
/// newer commit is already durable (its delta is on its way to the queue), waits for it.
async fn ship_folded<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Shared,
    link: &Link,
    source: &ShipSource,
    name: &str,
    term: u64,
    writer: &mut W,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    let other = |e: tucana::Error| std::io::Error::other(e.to_string());
    let Some(folded) = link
        .state
        .lock()
        .regions
        .get_mut(name)
        .map(|r| std::mem::take(&mut r.folded))
    else {
        return Ok(());
    };
    // The newest commit that changed the region: commits after it that did not are not
    // queued, and one of them being the newest does not mean a delta is on its way.
    let last_change = shared.changed.lock().get(name).map(|(epoch, _)| *epoch);
    let source = source.clone();
    let (folded, delta) = tokio::task::spawn_blocking(move || {
        let delta = match source.pin_newest_commit() {
            Ok(Some(pinned))
                if Some(pinned.epoch) == folded.epoch()
                    || (folded.epoch().is_some() && folded.epoch() == last_change) =>
            {
                folded.delta(&pinned, term).map(Some)
            }
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        };
        (folded, delta)
    })
    .await
    .map_err(std::io::Error::other)?;
    let delta = delta.map_err(other)?;
    let covered = delta.as_ref().is_some_and(|d| {
        link.state
            .lock()
            .regions
            .get(name)
            .is_some_and(|r| r.covers(&d.desc))
    });
    let Some(delta) = delta.filter(|_| covered) else {
        // A newer commit is on its way, or the newest lists log not shipped yet: the
        // folded commits wait for a later round.
        if let Some(r) = link.state.lock().regions.get_mut(name) {
            r.folded = folded;
        }
        return Ok(());
    };
    let bytes = send_commit(
        writer,
        scratch,
        name,
        term,
        delta.upstream_epoch,
        false,
        &delta.desc,
        delta.next_order,
        &delta.nodes,
        delta.released_nodes.iter().map(|off| off.0).collect(),
    )
    .await?;
    let mut st = link.state.lock();
    st.shipped_index_bytes += bytes;
    if let Some(r) = st.regions.get_mut(name) {
        r.index_shipped();
    }
    Ok(())
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
    let throttle = Throttle::new(shared.config.catchup_bytes_per_sec);
    for (origin, stats) in &pinned.desc.segments {
        let mut at = held.get(&stats.order).copied().unwrap_or(0);
        while at < stats.written_bytes {
            let n = ((stats.written_bytes - at) as usize).min(CHUNK_BYTES);
            let bytes = read_chunk(source, *origin, at, n)?;
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
                    bytes,
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
        r.full_shipped(pinned.epoch);
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

/// Reads `len` log bytes at `offset` of the segment at `base` into a buffer of exactly that
/// size, which becomes the frame's payload: no 256 KiB buffer per round for the few
/// hundred bytes a round ships under small writes, and no second copy out of it.
fn read_chunk(
    source: &ShipSource,
    base: DiskOffset,
    offset: u64,
    len: usize,
) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0u8; len];
    source
        .read(base, offset, &mut bytes)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(bytes)
}
