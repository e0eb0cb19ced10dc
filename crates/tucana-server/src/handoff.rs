//! Planned failover (issue 19; DESIGN.md, "Planned failover"): `CLUSTER FAILOVER` on a
//! backup hands each region it backs in sync over to it without losing a write, even a
//! buffered one.
//!
//! The backup only asks: it sets the region's `handoff` in the map (a compare-and-swap,
//! refused unless it is in sync). The primary does the rest when its view shows the
//! request: it stops serving the region (`TRYAGAIN`, under the region's write lock, so a
//! command already past routing finishes first and none starts after), takes the
//! region's log end, waits until every backup acknowledged it, and writes the promotion
//! of the requester. The promoted backup then has every write the primary ever took for
//! the region. If the wait fails (a backup gone), the primary withdraws the request and
//! serves again. With `FORCE` or `TAKEOVER` the backup promotes itself at once, as the
//! coordinator would for a dead primary: nothing acknowledged with `--durability sync` is
//! lost (every such write waited for this in-sync backup), buffered writes not yet shipped
//! may be.
//!
//! Owns: both sides' steps. Does not own: the map's rules (`tucana-cluster`), routing
//! (`commands`; it asks `Cluster::draining`), promotion of the replica (`cluster_follow`,
//! with the view that names it primary).
//!
//! Thread-safety: the request runs as a task on the caller's runtime; the primary's side
//! on a thread of its own (it blocks on the write lock and on acknowledgements) that
//! talks to etcd through the runtime handle it was given.

use std::sync::Arc;

use tokio::runtime::Handle;
use tucana::Database;
use tucana_cluster::{ClusterMap, Error, RegionId, ServerId};

use crate::cluster::{region_keyspace_name, Cluster, View};
use crate::replication::Replication;

/// What `CLUSTER FAILOVER` was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// With the primary's help: nothing it took is lost.
    Planned,
    /// Without it (`FORCE`, `TAKEOVER`): promote at once.
    Force,
}

/// `CLUSTER FAILOVER` on this server: the regions it backs in sync are asked to be
/// handed over (or, `Force`, taken over). `Err` is the reply when nothing can be done;
/// `Ok` once the request is under way (it completes asynchronously, as Redis's does).
pub fn request(cluster: &Arc<Cluster>, mode: Mode) -> Result<(), String> {
    let view = cluster.view();
    let Some(map) = &view.map else {
        return Err("ERR the cluster has no map yet".into());
    };
    let backed: Vec<_> = map
        .regions
        .iter()
        .filter(|r| r.backups.contains(&cluster.id))
        .collect();
    if backed.is_empty() {
        return Err("ERR You should send CLUSTER FAILOVER to a replica".into());
    }
    let ready: Vec<(RegionId, u64)> = backed
        .iter()
        .filter(|r| r.in_sync.contains(&cluster.id))
        .map(|r| (r.id, r.epoch))
        .collect();
    if ready.is_empty() {
        return Err("ERR this replica is still catching up with its primary (not in sync): it cannot take over yet".into());
    }
    if mode == Mode::Planned
        && backed
            .iter()
            .any(|r| ready.contains(&(r.id, r.epoch)) && !view.live.contains(&r.primary))
    {
        return Err("ERR Master is down or failed, please use CLUSTER FAILOVER FORCE".into());
    }
    let Ok(handle) = Handle::try_current() else {
        return Err("ERR no runtime to run the failover on".into());
    };
    let cluster = cluster.clone();
    handle.spawn(async move {
        let me = cluster.id.clone();
        let change = |map: &ClusterMap| -> tucana_cluster::Result<ClusterMap> {
            let mut next = map.clone();
            for (id, epoch) in &ready {
                let step = match mode {
                    Mode::Planned => next.request_handoff(*id, *epoch, Some(&me)),
                    Mode::Force => match next.region(*id) {
                        Some(r) if r.epoch == *epoch => next.promote(*id, &me),
                        _ => continue,
                    },
                };
                match step {
                    Ok(m) => next = m,
                    Err(Error::Refused(why)) => {
                        eprintln!("tucana serve: CLUSTER FAILOVER of region {id}: {why}")
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(next)
        };
        if let Err(e) = cluster.change_map(change).await {
            eprintln!("tucana serve: CLUSTER FAILOVER: {e}");
        }
    });
    Ok(())
}

/// The primary's side, with each new view (from `cluster_follow`, on a blocking thread of
/// the runtime): starts handing over each region this server leads whose handoff was
/// asked for, and stops draining the ones whose request is gone (done or withdrawn).
pub fn follow(db: &Database, replication: &Arc<Replication>, cluster: &Arc<Cluster>, view: &View) {
    let Some(map) = &view.map else {
        return;
    };
    let asked: Vec<(RegionId, u64, ServerId)> = map
        .regions_led_by(&cluster.id)
        .filter_map(|r| r.handoff.clone().map(|to| (r.id, r.epoch, to)))
        .collect();
    // A region handed over stays draining until a later view: this one is not routed by
    // yet (the follower runs first), and a command routed by the previous one, which
    // still named this server, must keep getting TRYAGAIN. Cleared here, it went on,
    // created the keyspace the follower had just dropped (to take the replica), and was
    // acknowledged with no backup (M10 5-server seed 1132: the stray keyspace then made
    // this server refuse the new primary's replica, and the region's writes waited for
    // minutes). Draining a region this server does not lead changes nothing else.
    let led: Vec<RegionId> = map.regions_led_by(&cluster.id).map(|r| r.id).collect();
    cluster.keep_draining(|id, epoch| {
        asked.iter().any(|(i, e, _)| *i == id && *e == epoch) || !led.contains(&id)
    });
    let Ok(handle) = Handle::try_current() else {
        return;
    };
    for (id, epoch, to) in asked {
        if !cluster.start_draining(id, epoch) {
            continue; // Under way already.
        }
        let (db, replication, cluster, handle) = (
            db.clone(),
            replication.clone(),
            cluster.clone(),
            handle.clone(),
        );
        std::thread::spawn(move || hand_over(&db, &replication, &cluster, &handle, id, epoch, &to));
    }
}

/// Drains region `id` and promotes `to` if every backup acknowledged everything; else
/// withdraws the request (and serves again).
fn hand_over(
    db: &Database,
    replication: &Replication,
    cluster: &Arc<Cluster>,
    handle: &Handle,
    id: RegionId,
    epoch: u64,
    to: &ServerId,
) {
    let name = region_keyspace_name(id);
    let slot = cluster.region(db, id);
    // Commands that routed before the drain began finish under the lock; those after
    // see `draining` under it and answer TRYAGAIN. So nothing is appended after `end`.
    let end = {
        let _quiet = slot.lock_writes();
        slot.existing().map(|ks| ks.log_position())
    };
    let acked = match end {
        Some(end) => replication.wait_acked(&name, end),
        None => Ok(()),
    };
    let promote = acked.is_ok();
    if let Err(why) = &acked {
        eprintln!("tucana serve: handing region {id} over to {to} failed, serving it again: {why}");
    }
    let to = to.clone();
    let me = cluster.id.clone();
    let result = handle.block_on(cluster.change_map(move |map| {
        let wanted = match map.region(id) {
            Some(r) if r.epoch == epoch && r.handoff.as_ref() == Some(&to) => {
                map.replicas.unwrap_or(r.backups.len())
            }
            _ => return Ok(map.clone()), // Withdrawn, or decided by someone else.
        };
        if !promote {
            return map.request_handoff(id, epoch, None);
        }
        // This server backs the region from now on when it would otherwise be short of
        // backups (the promoted one leaves the list): until the coordinator's next repair
        // the new primary would acknowledge writes with one copy (a suspect of M10's
        // lost writes, seed 57).
        let next = map.promote(id, &to)?;
        match next.region(id) {
            Some(r) if r.backups.len() < wanted => next.assign_backup(id, &me).or(Ok(next)),
            _ => Ok(next),
        }
    }));
    match result {
        Ok(()) if promote => {
            eprintln!("tucana serve: handed region {id} over (planned failover)");
            // Draining ends with the view that names the new primary.
        }
        Ok(()) => cluster.stop_draining(id),
        Err(e) => {
            eprintln!("tucana serve: handing region {id} over: {e}");
            cluster.stop_draining(id);
        }
    }
}
