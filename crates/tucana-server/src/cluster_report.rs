//! What this server reports of each region of the cluster map, for `INFO cluster` and
//! `/metrics` alike: its role in the region, the region's epoch and servers, which
//! backups are in sync and, where this server is the primary, how many backups are
//! connected and how far the furthest is behind.
//!
//! Owns: gathering that from the view and the replication primary. Does not own: the
//! formats (`commands/info.rs`, `prometheus.rs`).
//!
//! Thread-safety: reads one view and one replication status; plain values out.

use tucana_cluster::{Failover, RegionId, ServerId, SlotRange};

use crate::cluster::region_keyspace_name;
use crate::state::ServerState;

/// This server's role in a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Backup,
    None,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Backup => "backup",
            Role::None => "none",
        }
    }
}

/// One region, as this server sees it.
pub struct RegionReport {
    pub id: RegionId,
    pub slots: SlotRange,
    pub role: Role,
    pub epoch: u64,
    /// Client addresses (`?` for a server never seen registered).
    pub primary: String,
    pub backups: Vec<String>,
    pub backups_in_sync: usize,
    /// On the primary: backups connected now, and the most log bytes one of them has not
    /// acknowledged. `None` elsewhere.
    pub shipping: Option<(usize, u64)>,
}

/// The map's regions and its last failover (addresses for server ids), or nothing
/// outside cluster mode or before a map exists.
pub fn regions(state: &ServerState) -> (Vec<RegionReport>, Option<(Failover, String, String)>) {
    let Some(cluster) = &state.cluster else {
        return (Vec::new(), None);
    };
    let view = cluster.view();
    let Some(map) = &view.map else {
        return (Vec::new(), None);
    };
    let addr = |id: &ServerId| view.client_addr(id).unwrap_or("?").to_string();
    let shipping = state
        .replication
        .as_ref()
        .map(|r| r.backup_status())
        .unwrap_or_default();
    let reports = map
        .regions
        .iter()
        .map(|region| {
            let role = if region.primary == cluster.id {
                Role::Primary
            } else if region.backups.contains(&cluster.id) {
                Role::Backup
            } else {
                Role::None
            };
            let name = region_keyspace_name(region.id);
            let links: Vec<(bool, u64)> = shipping
                .iter()
                .flat_map(|b| {
                    b.regions
                        .iter()
                        .filter(|r| r.name == name)
                        .map(|r| (b.connected, r.lag_bytes))
                })
                .collect();
            RegionReport {
                id: region.id,
                slots: region.slots,
                role,
                epoch: region.epoch,
                primary: addr(&region.primary),
                backups: region.backups.iter().map(addr).collect(),
                backups_in_sync: region.in_sync.len(),
                shipping: (role == Role::Primary).then(|| {
                    (
                        links.iter().filter(|(c, _)| *c).count(),
                        links.iter().map(|(_, l)| *l).max().unwrap_or(0),
                    )
                }),
            }
        })
        .collect();
    let failover = map
        .last_failover
        .as_ref()
        .map(|f| (f.clone(), addr(&f.dead), addr(&f.promoted)));
    (reports, failover)
}
