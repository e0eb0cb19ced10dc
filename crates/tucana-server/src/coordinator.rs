//! The coordinator (issue 19; DESIGN.md, "The coordinator and failover"): every server in
//! cluster mode campaigns; the one etcd elects watches the server list and, whenever it
//! changes (and every lease time, in case a write was missed), repairs the map
//! (`ClusterMap::repaired`: promotions of backups for dead primaries, dead servers out of
//! backup lists, new backups from the live servers) and writes it with `update_map_as`,
//! so a coordinator deposed while paused writes nothing. Once nothing needs repair and
//! every backup is in sync, it takes one step at a time that evens out how many slots
//! each server leads (`--cluster-balance-leaders`, off by default): a planned failover,
//! or an extra backup to hand a region to once it caught up; so a server restarted
//! after its regions failed over leads its share again.
//!
//! A server is dead when its key is gone from etcd, i.e. etcd expired (or it revoked) its
//! lease: a primary stops acknowledging writes before that (`Cluster::lease_valid`), so a
//! promotion never overlaps a primary that still acknowledges alone.
//!
//! Owns: the election loop and when repairs run. Does not own: the repair itself
//! (`tucana-cluster`), following the map (`cluster`, `cluster_follow`).
//!
//! Thread-safety: one task on the listener's runtime, alive as long as the registration
//! whose lease it campaigns on.

use std::collections::BTreeSet;
use std::time::Duration;

use tucana_cluster::{Balancing, Error, Failover, Leadership, Registration, ServerId, Store};

/// How long a failed coordinator round waits before it starts over.
const RETRY: Duration = Duration::from_millis(500);

/// Campaigns on `registration`'s lease and, while leading, repairs the map (and, with
/// `balance`, evens out leadership); starts over after any error. Never returns: the
/// caller drops it with the registration.
pub async fn coordinate(store: Store, registration: &Registration, balance: bool) {
    loop {
        if let Err(e) = lead(&store, registration, balance).await {
            eprintln!("tucana serve: coordinator: {e}");
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn lead(
    store: &Store,
    registration: &Registration,
    balance: bool,
) -> tucana_cluster::Result<()> {
    let leadership = store.campaign(registration).await?;
    eprintln!("tucana serve: this server is the cluster's coordinator");
    let every = registration.lease_ttl();
    loop {
        let revision = repair(store, &leadership).await?;
        if balance {
            balance_leaders(store, &leadership).await?;
        }
        let mut watch = store.watch_servers(Some(revision)).await?;
        tokio::select! {
            event = watch.next() => { event?; }
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Takes one step that evens out leadership, if the cluster is calm and uneven
/// (`ClusterMap::balancing_step`: a planned failover, or an extra backup that a later
/// one hands the region to). A conflicting write waits for the next round: the map
/// changed, so the plan is made again from it.
async fn balance_leaders(store: &Store, leadership: &Leadership) -> tucana_cluster::Result<()> {
    let Some((map, revision)) = store.map().await? else {
        return Ok(());
    };
    let (servers, _) = store.servers().await?;
    let live: BTreeSet<ServerId> = servers.into_iter().map(|s| s.id).collect();
    let Some((next, step)) = map.balancing_step(&live) else {
        return Ok(());
    };
    match store.update_map_as(leadership, revision, &next).await {
        Ok(_) => {
            match step {
                Balancing::Handoff { region, to } => eprintln!(
                    "tucana serve: coordinator: asked region {region} handed over to {to} to even out leadership"
                ),
                Balancing::Backup { region, server } => eprintln!(
                    "tucana serve: coordinator: {server} backs region {region} too, to take it over once in sync (evening out leadership)"
                ),
            }
            Ok(())
        }
        Err(Error::Conflict { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Reads the map, then the live servers, repairs the map for them and writes it if it
/// changed, again after a conflicting write; the server list's revision it last read.
///
/// The map is read first: every server it names registered before it was written, so a
/// server missing from the list read afterwards really lost its lease (reading the list
/// first could take a server that registered, and a map naming it, as dead).
async fn repair(
    store: &Store,
    leadership: &Leadership,
) -> tucana_cluster::Result<tucana_cluster::Revision> {
    loop {
        let map = store.map().await?;
        let (servers, servers_revision) = store.servers().await?;
        let listed = std::time::Instant::now();
        let Some((map, revision)) = map else {
            return Ok(servers_revision);
        };
        let live: BTreeSet<ServerId> = servers.into_iter().map(|s| s.id).collect();
        let mut repaired = map.repaired(&live)?.repaired_migrations(&live)?;
        if repaired == map {
            return Ok(servers_revision);
        }
        if let Some((old, new)) = map
            .regions
            .iter()
            .zip(&repaired.regions)
            .find(|(old, new)| old.primary != new.primary)
        {
            repaired.last_failover = Some(Failover {
                region: new.id,
                epoch: new.epoch,
                dead: old.primary.clone(),
                promoted: new.primary.clone(),
                at_unix_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                decided_ms: listed.elapsed().as_millis() as u64,
            });
        }
        match store.update_map_as(leadership, revision, &repaired).await {
            Ok(_) => {
                for (old, new) in map.regions.iter().zip(&repaired.regions) {
                    if old.primary != new.primary {
                        eprintln!(
                            "tucana serve: coordinator: region {} promoted {} (epoch {}) for dead {}",
                            new.id, new.primary, new.epoch, old.primary
                        );
                    }
                }
                return Ok(servers_revision);
            }
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
}
