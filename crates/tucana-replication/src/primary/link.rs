//! One link's connection to its backup: dialing, `Open` and the backup's `Hello`, then a
//! sender (announcements and shipping rounds) and a receiver (acknowledgements, applied
//! commits, `Superseded`, refusals) running side by side until either fails.
//!
//! Owns: the life of a connection and what each answer of the backup changes in the
//! link's state. Does not own: what a shipping round sends (`ship`).
//!
//! Thread-safety: one task per link on the primary's runtime; the link state is behind a
//! short mutex shared with the observer and with writers waiting on the board.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::AsyncWriteExt;
use tucana::replication::LogPosition;
use tucana::Database;

use super::ship::ship_round;
use super::{stall_limit, update_horizons, Link, Shared, IDLE_TICK, REDIAL};
use crate::frame::{Frame, RegionInfo, PROTOCOL_VERSION};
use crate::transport;

/// Dials the backup again and again, and runs a connection while it lasts.
pub(super) async fn run_link(shared: Arc<Shared>, link: Arc<Link>) {
    while !link.ended(&shared) {
        let result = run_connection(&shared, &link).await;
        {
            let mut st = link.state.lock();
            st.connected = false;
            st.down_since.get_or_insert_with(Instant::now);
            for r in st.regions.values_mut() {
                r.ready = false;
                r.deltas.clear();
                r.while_full.clear();
                r.index_shipped();
            }
            if let Err(e) = result {
                st.last_error = Some(e.to_string());
            }
        }
        shared.board.1.notify_all();
        tokio::time::sleep(REDIAL).await;
    }
}

/// The regions to replicate to `link` now: every keyspace it carries, each raised to
/// the term the link names (term 1 at least).
fn replicated_regions(db: &Database, link: &Link) -> Vec<RegionInfo> {
    let wanted = link.keyspaces.lock().clone();
    db.keyspace_names()
        .into_iter()
        .filter_map(|name| {
            let term = match &wanted {
                None => 1,
                Some(k) => *k.get(&name)?,
            };
            let source = db.ship_source(&name).ok()?;
            if source.term() < term.max(1) {
                source.raise_term(term.max(1));
            }
            Some(RegionInfo {
                name,
                seed: source.seed(),
                term: source.term(),
                generation: source.generation(),
            })
        })
        .collect()
}

async fn run_connection(shared: &Arc<Shared>, link: &Arc<Link>) -> std::io::Result<()> {
    let stream = shared.config.dialer.dial(&link.addr).await?;
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut scratch = Vec::new();
    let regions = replicated_regions(&shared.db, link);
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
        st.down_since = None;
        st.last_heard = Some(Instant::now());
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
                link.state.lock().last_heard = Some(Instant::now());
                on_backup_frame(&shared, &link, frame)?;
            }
            Err::<(), _>(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the backup closed the connection",
            ))
        }
    };
    let sender = async {
        let mut announced: Vec<(String, u32)> =
            regions.into_iter().map(|r| (r.name, r.seed)).collect();
        loop {
            if link.ended(shared) {
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
    let watchdog = async {
        let silence = stall_limit(&shared.config);
        loop {
            tokio::time::sleep(STALL_CHECK).await;
            if link.stalled(silence) {
                eprintln!(
                    "tucana: replication to {}: nothing heard for {} ms with log \
                     unacknowledged; dialing again",
                    link.addr,
                    silence.as_millis()
                );
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "nothing heard from the backup for {} ms with shipped log \
                         unacknowledged: the connection is dropped and dialed again",
                        silence.as_millis()
                    ),
                ));
            }
        }
    };
    tokio::select! {
        r = receiver => r,
        r = sender => r,
        r = watchdog => r,
    }
}

/// How often a connection checks that it is not stalled (`Link::stalled`).
const STALL_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// Announces keyspaces created since the connection opened, and drops those that are gone.
/// A keyspace is known by its name and its records' seed: one dropped and created again
/// between two rounds (`FLUSHALL` then a write) is a drop and a new keyspace. Taken for
/// the old one, its shipping state (acknowledged position, segments held) covered every
/// write of the new one, which was acknowledged shipped to nobody.
async fn announce_new_regions<W: tokio::io::AsyncWrite + Unpin>(
    shared: &Shared,
    link: &Link,
    announced: &mut Vec<(String, u32)>,
    writer: &mut W,
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    let now = replicated_regions(&shared.db, link);
    let new: Vec<RegionInfo> = now
        .iter()
        .filter(|r| !announced.contains(&(r.name.clone(), r.seed)))
        .cloned()
        .collect();
    let gone: Vec<(String, u32)> = announced
        .iter()
        .filter(|(name, seed)| !now.iter().any(|r| &r.name == name && r.seed == *seed))
        .cloned()
        .collect();
    // A keyspace this backup no longer carries is only forgotten here; one dropped from
    // the database (or replaced by a new one of its name) is dropped at the backup too.
    let (dropped, forgotten): (Vec<String>, Vec<String>) = gone
        .iter()
        .map(|(name, _)| name.clone())
        .partition(|name| link.carries(name));
    {
        let mut st = link.state.lock();
        for name in &forgotten {
            st.regions.remove(name);
        }
    }
    for name in &dropped {
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
    announced.retain(|entry| !gone.contains(entry));
    if !new.is_empty() {
        {
            let mut st = link.state.lock();
            for r in &new {
                // A fresh state: nothing held, shipped or acknowledged of this keyspace.
                st.regions.insert(
                    r.name.clone(),
                    super::RegionLink {
                        term: r.term,
                        ..Default::default()
                    },
                );
            }
        }
        announced.extend(new.iter().map(|r| (r.name.clone(), r.seed)));
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
            let mut rejoined = Vec::new();
            st.backup_id = backup.clone();
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
                r.acked = LogPosition::default();
                r.confirm_tail = true;
                r.unacked.clear();
                r.deltas.clear();
                r.while_full.clear();
                r.index_shipped();
                r.applied_epoch = state.upstream_epoch;
                // Current if it applied the newest commit that changed the region, or a
                // later one (those that changed nothing of it are not shipped).
                let last_change = shared
                    .changed
                    .lock()
                    .get(&state.name)
                    .map_or(newest, |(epoch, _)| *epoch);
                // (0: no commit seen since this primary started, so nothing to
                // compare with: the newest is sent in full.)
                let index_current = state.node_map_current
                    && state.upstream_epoch != 0
                    && last_change != 0
                    && state.upstream_epoch >= last_change;
                r.need_full = wants_index && !index_current;
                r.ready = true;
                if state.upstream_epoch != 0 || !state.segments.is_empty() {
                    // A backup that holds something of the region: what shipping resumes
                    // from (rare: once per reconnection; what a lost write is traced by).
                    let held: Vec<String> = state
                        .segments
                        .iter()
                        .map(|(order, origin, held)| format!("{order}@{origin}:{held}"))
                        .collect();
                    eprintln!(
                        "tucana: backup {} holds {} at term {}: the primary's commit {} (newest {newest}), segments [{}] (order@origin:bytes); index sent {}",
                        backup,
                        state.name,
                        state.term,
                        state.upstream_epoch,
                        held.join(" "),
                        if r.need_full { "in full" } else { "as deltas" }
                    );
                }
                rejoined.push((state.name.clone(), r.applied_count, index_current));
            }
            drop(st);
            link.rejoined(shared, &rejoined);
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
                    r.acknowledged(LogPosition { order, offset });
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
                r.applied_count += 1;
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
