//! Cluster mode's storage and replication follow the map (DESIGN.md, "Backups per
//! region"): for each region this server leads, its keyspace `region-<id>` exists at the
//! region's epoch as its term (a replica of it held here is promoted first) and is shipped
//! to the region's backups at their replication addresses; a keyspace of a region another
//! server now leads is fenced at that region's epoch, so no write to it is acknowledged
//! here again, and dropped if the map makes this server a backup of that region (so it
//! can take the replica; the promoted backup has every write it acknowledged). Backing a region needs nothing here: the replication listener takes what
//! the region's primary ships, and refuses terms older than what it holds.
//!
//! Owns: turning one view of the map into promotions, terms, fences and the set of
//! backups each keyspace is shipped to. Does not own: the view (`cluster`), the protocol
//! or the shipping (`replication`, `tucana-replication`), changing the map (the
//! coordinator).
//!
//! Thread-safety: the follower runs on a blocking thread (a promotion replays log), one
//! view at a time, before requests route by that view.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use tucana::Database;

use crate::cluster::{region_keyspace_name, Cluster, Follower, View};
use crate::replication::{promote_replica, Replication};

/// The follower that `Cluster` runs with every new view.
pub fn follower(db: Database, replication: Arc<Replication>, cluster: Weak<Cluster>) -> Follower {
    Arc::new(move |view: &View| {
        if let Some(cluster) = cluster.upgrade() {
            follow(&db, &replication, &cluster, view);
            crate::handoff::follow(&db, &replication, &cluster, view);
        }
    })
}

/// Backups to ship to: replication address → keyspace → term.
type Backups = BTreeMap<String, BTreeMap<String, u64>>;

fn follow(db: &Database, replication: &Replication, cluster: &Cluster, view: &View) {
    let mut backups = Backups::new();
    // Migration targets too: their primary takes imports and ships them to its backups.
    let regions: Vec<&tucana_cluster::Region> =
        view.map.iter().flat_map(|m| m.all_regions()).collect();
    for region in regions {
        let name = region_keyspace_name(region.id);
        if region.primary != cluster.id {
            // Led elsewhere now: whatever this server still has of it acknowledges nothing.
            if let Ok(source) = db.ship_source(&name) {
                if source.term() < region.epoch && source.fenced_by().is_none() {
                    source.fence(region.epoch);
                }
                if source.term() < region.epoch && region.backups.contains(&cluster.id) {
                    // A former primary made a backup: its old keyspace would make it
                    // refuse the replica. Every write it acknowledged is on the backup
                    // that was promoted, so the old copy goes; unannounced, or its
                    // shipper would tell that backup to drop its replica.
                    replication.stop_shipping(&name);
                    match db.drop_keyspace(&name) {
                        Ok(()) => {
                            cluster.forget_region(region.id);
                            eprintln!(
                                "tucana serve: dropped stale {name} to back it at epoch {}",
                                region.epoch
                            );
                        }
                        Err(e) => eprintln!("tucana serve: cannot drop stale {name}: {e}"),
                    }
                }
            }
            continue;
        }
        match promote_replica(db, &name, region.epoch) {
            Ok(Some(how)) => {
                eprintln!(
                    "tucana serve: promoted replica {name} to primary at epoch {} ({how})",
                    region.epoch
                );
                cluster.forget_region(region.id);
            }
            Ok(None) if region.has_had_another_primary() && db.open_keyspace(&name).is_err() => {
                // Named primary since the region's birth, and nothing of it here: its
                // data is elsewhere (or was lost before this), and serving it empty
                // would answer every read of an acknowledged write with nothing.
                eprintln!(
                    "tucana serve: made primary of region {} at epoch {}, but this server holds neither its keyspace nor a replica: not serving it empty",
                    region.id, region.epoch
                );
                cluster.set_unpromoted(region.id, true);
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                // Not served (CLUSTERDOWN) rather than served empty; tried again with
                // the next view.
                eprintln!("tucana serve: cannot promote replica {name}: {e}");
                cluster.set_unpromoted(region.id, true);
                continue;
            }
        }
        cluster.set_unpromoted(region.id, false);
        // The keyspace exists from now on, at the region's epoch as its term, so its
        // first write is shipped at that term.
        match db.keyspace(&name).and_then(|_| db.ship_source(&name)) {
            Ok(source) if source.term() < region.epoch => source.raise_term(region.epoch),
            Ok(_) => {}
            Err(e) => eprintln!("tucana serve: cannot open {name}: {e}"),
        }
        for backup in &region.backups {
            // A backup whose address is unknown still counts: writes then fail with
            // NOREPLICAS instead of being acknowledged without it.
            let addr = match view.servers.get(backup) {
                Some(info) if !info.repl_addr.is_empty() => info.repl_addr.clone(),
                _ => format!("unknown-replication-address-of-{backup}:0"),
            };
            backups
                .entry(addr)
                .or_default()
                .insert(name.clone(), region.epoch);
        }
    }
    replication.set_backups(&backups);
}
