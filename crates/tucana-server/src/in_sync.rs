//! The primary's reports of caught-up backups (DESIGN.md, "In-sync backups"): for each
//! region this server leads, a backup the map names but does not list as in sync is
//! asked about (`Replication::in_sync`: it acknowledged the log up to where the region
//! stood when this server began to ship to it, and applied a commit since), and once it
//! is, the map is changed with `ClusterMap::mark_in_sync` in a compare-and-swap. The
//! coordinator promotes only in-sync backups, so a backup still catching up never takes
//! over a region whose acknowledged writes it lacks.
//!
//! Owns: when to ask and the write of the report. Does not own: what in sync means
//! (`tucana-replication`), the map's rules (`tucana-cluster`), promotion (the
//! coordinator).
//!
//! Thread-safety: one task on the listener's runtime; it reads the view and asks the
//! replication primary (short locks), and talks to etcd only when there is news.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tucana_cluster::{ClusterMap, Error, RegionId, ServerId, Store};

use crate::cluster::{region_keyspace_name, Cluster};
use crate::replication::Replication;

/// How often the regions led here are looked at.
const TICK: Duration = Duration::from_millis(250);

/// Reports caught-up backups until shutdown.
pub async fn report(
    cluster: Arc<Cluster>,
    replication: Arc<Replication>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut store: Option<Store> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let caught_up = caught_up(&cluster, &replication);
        if caught_up.is_empty() {
            continue;
        }
        if store.is_none() {
            match cluster.connect().await {
                Ok(s) => store = Some(s),
                Err(e) => {
                    eprintln!("tucana serve: reporting in-sync backups: {e}");
                    continue;
                }
            }
        }
        let Some(s) = &store else { continue };
        if let Err(e) = write_report(s, &caught_up).await {
            eprintln!("tucana serve: reporting in-sync backups: {e}");
            store = None;
        }
    }
}

/// The backups of regions led here, at the region's epoch, that are not in sync in
/// the map but are by this server's replication.
fn caught_up(cluster: &Cluster, replication: &Replication) -> Vec<(RegionId, u64, ServerId)> {
    let view = cluster.view();
    let Some(map) = &view.map else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for region in map.regions_led_by(&cluster.id) {
        let keyspace = region_keyspace_name(region.id);
        for backup in region
            .backups
            .iter()
            .filter(|b| !region.in_sync.contains(b))
        {
            let Some(info) = view.servers.get(backup) else {
                continue;
            };
            if replication.in_sync(&info.repl_addr, &keyspace) {
                found.push((region.id, region.epoch, backup.clone()));
            }
        }
    }
    found
}

/// Marks `caught_up` in sync in the map read now, again after a conflicting write. A
/// report the map no longer fits (another epoch, a backup removed) is dropped.
async fn write_report(
    store: &Store,
    caught_up: &[(RegionId, u64, ServerId)],
) -> tucana_cluster::Result<()> {
    loop {
        let Some((map, revision)) = store.map().await? else {
            return Ok(());
        };
        let mut next: ClusterMap = map.clone();
        let mut marked = Vec::new();
        for (id, epoch, backup) in caught_up {
            match next.mark_in_sync(*id, *epoch, backup) {
                Ok(m) => {
                    if m != next {
                        marked.push((*id, backup));
                    }
                    next = m;
                }
                Err(Error::Refused(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if next == map {
            return Ok(());
        }
        match store.update_map(revision, &next).await {
            Ok(_) => {
                for (id, backup) in marked {
                    eprintln!("tucana serve: backup {backup} of region {id} is in sync");
                }
                return Ok(());
            }
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
}
