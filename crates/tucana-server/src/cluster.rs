//! Cluster mode (issue 19; DESIGN.md, "Cluster"): this server's identity in the cluster,
//! its copy of the cluster map and of the server list kept in etcd, and the keyspaces of
//! the regions it serves.
//!
//! Owns: the server id (kept in a file next to the volume, so a restart keeps it), the
//! registration in etcd under a lease (kept alive, renewed when lost, revoked at
//! shutdown), the watches that keep [`View`] current, the answer to "who serves this hash
//! slot" ([`Cluster::route`]) and the keyspace of each region (`region-<id>`, whose keys
//! are slot-prefixed: `tucana_cluster::storage_key`). It does not own what commands do
//! with a route (`commands`), nor any change of the map (the operator's `tucana cluster
//! create` now, the coordinator later).
//!
//! Thread-safety: `Cluster` is `Send + Sync`, shared by every connection. Readers on the
//! request path take the [`View`] (an `Arc` behind a lock held only to clone it) and never
//! wait on etcd; the two etcd tasks (registration, watches) run on the listener's runtime
//! and replace the view as a whole.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tucana::Database;
use tucana_cluster::{
    ClusterMap, LeaseStatus, MapEvent, Region, RegionId, ServerEvent, ServerId, ServerInfo,
    SlotRange, Store,
};

use crate::config::ClusterConfig;
use crate::store::Slot;

/// How long a failed etcd session waits before it starts over.
const RETRY: Duration = Duration::from_millis(500);

/// What this server knows of the cluster at one moment.
#[derive(Default)]
pub struct View {
    /// `None` until a map exists (every slot is then unserved).
    pub map: Option<ClusterMap>,
    /// Every server seen registered, by id: a server whose lease expired keeps its
    /// address here (the map may still name it) but leaves `live`.
    pub servers: BTreeMap<ServerId, ServerInfo>,
    pub live: BTreeSet<ServerId>,
}

impl View {
    /// The client address of `server`, if it ever registered.
    pub fn client_addr(&self, server: &ServerId) -> Option<&str> {
        self.servers.get(server).map(|s| s.client_addr.as_str())
    }
}

/// Where a hash slot is served, from this server's point of view.
pub enum Route {
    /// In this server's region `RegionId`.
    Here(RegionId),
    /// By another server: `MOVED <slot> <addr>`.
    Moved(String),
    /// By nobody (no map, no region, or a primary whose address is unknown).
    Down,
}

/// What follows the map into storage and replication (promotions, backups shipped to),
/// run on a blocking thread with each new view *before* requests see it.
pub type Follower = Arc<dyn Fn(&View) + Send + Sync>;

/// This server's part in a cluster; see the module doc.
pub struct Cluster {
    pub id: ServerId,
    /// What clients are told to connect to for this server (`host:port`).
    pub client_addr: String,
    repl_addr: String,
    config: ClusterConfig,
    view: RwLock<Arc<View>>,
    regions: RwLock<HashMap<RegionId, Arc<Slot>>>,
    /// The status of the current registration's lease (`None` while unregistered).
    lease: Mutex<Option<watch::Receiver<LeaseStatus>>>,
    /// Registrations made so far, and the count when the view was last read whole: a
    /// server that lost its lease and registered again acknowledges nothing until it
    /// has read the map again (it may have missed a promotion while it was away).
    registrations: AtomicU64,
    view_registration: AtomicU64,
    /// Tells the following task to read everything again (a new registration).
    reread: Notify,
    /// Regions the map says this server leads whose replica it could not promote: not
    /// served (a write must not create an empty keyspace in their place).
    unpromoted: RwLock<BTreeSet<RegionId>>,
    /// Slot migration: the stored keys this server is copying out of its regions now
    /// (`migration`).
    pub in_flight: crate::in_flight::InFlight,
    follower: OnceLock<Follower>,
    /// Regions being handed over by a planned failover (with the epoch it was asked at):
    /// their commands answer `TRYAGAIN` (`handoff`).
    draining: RwLock<BTreeMap<RegionId, u64>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// The server id kept in `path`, or a fresh one written there (durably) if it has none.
fn load_or_create_id(path: &Path) -> io::Result<ServerId> {
    match std::fs::read_to_string(path) {
        Ok(text) => ServerId::parse(text.trim()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not a server id (40 hex characters)", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let id = ServerId::random();
            let tmp = path.with_extension("tmp");
            {
                use std::io::Write;
                let mut file = std::fs::File::create(&tmp)?;
                writeln!(file, "{id}")?;
                file.sync_all()?;
            }
            std::fs::rename(&tmp, path)?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// The keyspace name of a region.
pub fn region_keyspace_name(id: RegionId) -> String {
    format!("region-{id}")
}

impl Cluster {
    /// This server's cluster state: its id read from (or written to) the configured file.
    /// `client_addr` is where clients reach it, `repl_addr` where primaries ship to it
    /// (empty without a replication listener).
    pub fn new(
        config: ClusterConfig,
        client_addr: String,
        repl_addr: String,
    ) -> io::Result<Cluster> {
        let id = load_or_create_id(&config.id_file)?;
        Ok(Cluster {
            id,
            client_addr,
            repl_addr,
            config,
            view: RwLock::new(Arc::new(View::default())),
            regions: RwLock::new(HashMap::new()),
            lease: Mutex::new(None),
            registrations: AtomicU64::new(0),
            view_registration: AtomicU64::new(0),
            reread: Notify::new(),
            unpromoted: RwLock::new(BTreeSet::new()),
            in_flight: Default::default(),
            follower: OnceLock::new(),
            draining: RwLock::new(BTreeMap::new()),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// Sets what follows each new view into storage and replication (once, before
    /// `start`).
    pub fn set_follower(&self, follower: Follower) {
        let _ = self.follower.set(follower);
    }

    /// Whether this server's lease is valid now with a third of its time to live to
    /// spare (DESIGN.md, "Fencing by lease"): only then may it acknowledge writes.
    pub fn lease_valid(&self) -> bool {
        let current = self.view_registration.load(Ordering::Acquire)
            == self.registrations.load(Ordering::Acquire);
        current && self.lease_alive()
    }

    /// Whether the current registration's lease is valid now with a third of its time to
    /// live to spare.
    fn lease_alive(&self) -> bool {
        let margin = self.config.lease_ttl / 3;
        self.lease
            .lock()
            .as_ref()
            .is_some_and(|status| status.borrow().valid_at(Instant::now(), margin))
    }

    /// Whether this server's view of the map may be stale: it registered before, and its
    /// lease is not valid now (cut off from etcd, or paused past it). Such a server must not tell clients where slots are: a cluster
    /// client that learns the layout from it keeps coming back to a primary that was
    /// replaced (found by the etcd partition test, where it did so for a minute).
    pub fn view_may_be_stale(&self) -> bool {
        // The lease itself, not `lease_valid`'s comparison of registrations: just after a
        // (re)registration the view is read again within milliseconds, and refusing then
        // would only make clients at startup retry.
        self.registrations.load(Ordering::Acquire) > 0 && !self.lease_alive()
    }

    /// Marks region `id` as one this server leads but could not promote (`true`), or
    /// as served again.
    pub fn set_unpromoted(&self, id: RegionId, unpromoted: bool) {
        let mut set = self.unpromoted.write();
        if unpromoted {
            set.insert(id);
        } else {
            set.remove(&id);
        }
    }

    /// Whether region `id` is one this server leads but could not promote (not served).
    pub fn is_unpromoted(&self, id: RegionId) -> bool {
        self.unpromoted.read().contains(&id)
    }

    /// The cluster's configuration (etcd, lease, migration batches).
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Whether region `id` is being handed over (its commands answer `TRYAGAIN`).
    pub fn draining(&self, id: RegionId) -> bool {
        self.draining.read().contains_key(&id)
    }

    /// Marks region `id` as being handed over at `epoch`; false if it already was.
    pub fn start_draining(&self, id: RegionId, epoch: u64) -> bool {
        let mut draining = self.draining.write();
        if draining.get(&id) == Some(&epoch) {
            return false;
        }
        draining.insert(id, epoch);
        true
    }

    /// Region `id` is served again (its handoff failed or was withdrawn).
    pub fn stop_draining(&self, id: RegionId) {
        self.draining.write().remove(&id);
    }

    /// Keeps only the drains `keep(region, epoch)` still asks for.
    pub fn keep_draining(&self, keep: impl Fn(RegionId, u64) -> bool) {
        self.draining.write().retain(|id, epoch| keep(*id, *epoch));
    }

    /// Forgets the cached keyspace handle of region `id` (a promotion made its keyspace).
    pub fn forget_region(&self, id: RegionId) {
        self.regions.write().remove(&id);
    }

    /// Whether this server may acknowledge a write to keyspace `name` now: its lease is
    /// valid (else `READONLY`), and the map still names it the primary of that region
    /// (else `MOVED` to the one it names). Keyspaces not of a region pass.
    pub fn may_acknowledge(&self, name: &str) -> Result<(), String> {
        let Some(id) = name
            .strip_prefix("region-")
            .and_then(|id| id.parse().ok())
            .map(RegionId)
        else {
            return Ok(());
        };
        if !self.lease_valid() {
            // READONLY, not CLUSTERDOWN: cluster clients (the redis crate, go-redis)
            // take READONLY as "this node is no longer the master", refresh the slot map
            // and retry elsewhere; CLUSTERDOWN they retry on the same node, which kept a
            // client on a primary cut off from etcd for a minute (the partition test).
            return Err("READONLY this server's cluster lease is not valid (it may no longer lead this slot): the write is applied here but not acknowledged".into());
        }
        let view = self.view();
        let region = view.map.as_ref().and_then(|m| m.region(id));
        match region {
            Some(r) if r.primary == self.id => Ok(()),
            Some(r) => match view.client_addr(&r.primary) {
                Some(addr) => Err(format!("MOVED {} {addr}", r.slots.start)),
                None => Err("CLUSTERDOWN Hash slot not served".into()),
            },
            None => Err("CLUSTERDOWN Hash slot not served".into()),
        }
    }

    /// The cluster as this server sees it now.
    pub fn view(&self) -> Arc<View> {
        self.view.read().clone()
    }

    /// Who serves `slot`.
    pub fn route(&self, slot: u16) -> Route {
        let view = self.view();
        let Some(region) = view.map.as_ref().and_then(|m| m.region_of_slot(slot)) else {
            return Route::Down;
        };
        if region.primary == self.id {
            if self.unpromoted.read().contains(&region.id) {
                return Route::Down;
            }
            return Route::Here(region.id);
        }
        match view.client_addr(&region.primary) {
            Some(addr) => Route::Moved(addr.to_owned()),
            None => Route::Down,
        }
    }

    /// The region of `slot`, if the map makes this server one of its backups (where a
    /// `READONLY` connection's reads of the slot are served from the replica).
    pub fn backs(&self, slot: u16) -> Option<RegionId> {
        let view = self.view();
        let region = view.map.as_ref()?.region_of_slot(slot)?;
        region.backups.contains(&self.id).then_some(region.id)
    }

    /// The keyspace of region `id` (opened, or to be created by its first write).
    pub fn region(&self, db: &Database, id: RegionId) -> Arc<Slot> {
        if let Some(slot) = self.regions.read().get(&id) {
            return slot.clone();
        }
        self.regions
            .write()
            .entry(id)
            .or_insert_with(|| Arc::new(Slot::named(db, region_keyspace_name(id))))
            .clone()
    }

    /// The regions this server is primary of now, by first slot, with their keyspaces.
    pub fn led_regions(&self, db: &Database) -> Vec<(SlotRange, Arc<Slot>)> {
        let view = self.view();
        let Some(map) = &view.map else {
            return Vec::new();
        };
        map.regions_led_by(&self.id)
            .map(|r: &Region| (r.slots, self.region(db, r.id)))
            .collect()
    }

    /// Starts the etcd tasks on the current tokio runtime; they end at `shutdown`.
    pub fn start(self: &Arc<Self>, shutdown: watch::Receiver<bool>) {
        let registering = tokio::spawn(stay_registered(self.clone(), shutdown.clone()));
        let watching = tokio::spawn(follow(self.clone(), shutdown));
        self.tasks.lock().extend([registering, watching]);
    }

    /// Adds a task that `stopped` waits for (one that ends at the same shutdown).
    pub fn add_task(&self, task: JoinHandle<()>) {
        self.tasks.lock().push(task);
    }

    /// Waits (at most `grace`) for the etcd tasks to end after shutdown was signalled:
    /// the registration is revoked, so a restarted server need not wait out its lease.
    pub async fn stopped(&self, grace: Duration) {
        let tasks: Vec<_> = self.tasks.lock().drain(..).collect();
        for task in tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(grace, task).await.is_err() {
                abort.abort();
            }
        }
    }

    /// Makes the next view with `change`, lets the follower act on it (promotions
    /// happen before any request routes by the new map), then installs it. Only the
    /// following task calls it, so views are made one after another.
    async fn set_view(&self, change: impl FnOnce(&mut View)) {
        let view = {
            let old = self.view();
            let mut view = View {
                map: old.map.clone(),
                servers: old.servers.clone(),
                live: old.live.clone(),
            };
            change(&mut view);
            Arc::new(view)
        };
        if let Some(follower) = self.follower.get() {
            let (follower, next) = (follower.clone(), view.clone());
            let _ = tokio::task::spawn_blocking(move || follower(&next)).await;
        }
        *self.view.write() = view;
    }

    pub(crate) async fn connect(&self) -> tucana_cluster::Result<Store> {
        Store::connect(&self.config.etcd, &self.config.name).await
    }

    /// Reads the map, applies `change` and writes the result if it differs (a
    /// compare-and-swap), again after a conflicting write. No map: nothing to change.
    pub(crate) async fn change_map(
        &self,
        change: impl Fn(&ClusterMap) -> tucana_cluster::Result<ClusterMap>,
    ) -> tucana_cluster::Result<()> {
        let store = self.connect().await?;
        loop {
            let Some((map, revision)) = store.map().await? else {
                return Ok(());
            };
            let next = change(&map)?;
            if next == map {
                return Ok(());
            }
            match store.update_map(revision, &next).await {
                Ok(_) => return Ok(()),
                Err(tucana_cluster::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Resolves once shutdown was asked for (as `state::stopped`, which this module cannot
/// use: `state` holds the `Cluster`).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Keeps this server registered: registers (waiting out the lease of a previous run of
/// this id, if it is still there), and again whenever the lease is lost; revokes it at
/// shutdown.
async fn stay_registered(cluster: Arc<Cluster>, mut shutdown: watch::Receiver<bool>) {
    let info = ServerInfo {
        id: cluster.id.clone(),
        client_addr: cluster.client_addr.clone(),
        repl_addr: cluster.repl_addr.clone(),
    };
    // First out of every in-sync list: a backup holds, after a restart, only what its
    // last commit recorded, maybe less than it acknowledged, and must not be promoted
    // before its primary has seen it catch up again (`ClusterMap::out_of_sync`).
    loop {
        let left = tokio::select! {
            r = cluster.change_map(|map| map.out_of_sync(&cluster.id)) => r,
            _ = stopped(&mut shutdown) => return,
        };
        match left {
            Ok(()) => break,
            Err(e) => eprintln!("tucana serve: leaving the in-sync lists: {e}"),
        }
        tokio::time::sleep(RETRY).await;
    }
    loop {
        let registered = tokio::select! {
            r = register(&cluster, &info) => r,
            _ = stopped(&mut shutdown) => return,
        };
        match registered {
            Ok(registration) => {
                cluster.registrations.fetch_add(1, Ordering::AcqRel);
                *cluster.lease.lock() = Some(registration.subscribe());
                cluster.reread.notify_one();
                let coordinating = async {
                    loop {
                        match cluster.connect().await {
                            Ok(store) => {
                                crate::coordinator::coordinate(
                                    store,
                                    &registration,
                                    cluster.config.balance_leaders,
                                )
                                .await
                            }
                            Err(e) => eprintln!("tucana serve: coordinator cannot reach etcd: {e}"),
                        }
                        tokio::time::sleep(RETRY).await;
                    }
                };
                tokio::select! {
                    _ = coordinating => {}
                    _ = registration.lost() => {
                        *cluster.lease.lock() = None;
                        eprintln!("tucana serve: cluster lease lost; registering again");
                    }
                    _ = stopped(&mut shutdown) => {
                        let _ = registration.revoke().await;
                        return;
                    }
                }
            }
            Err(e) => eprintln!("tucana serve: cannot register in etcd: {e}"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn register(
    cluster: &Cluster,
    info: &ServerInfo,
) -> tucana_cluster::Result<tucana_cluster::Registration> {
    let store = cluster.connect().await?;
    loop {
        match store.register(info, cluster.config.lease_ttl).await {
            // The lease of this id's previous run has not expired yet.
            Err(tucana_cluster::Error::AlreadyRegistered(_)) => tokio::time::sleep(RETRY).await,
            other => return other,
        }
    }
}

/// Keeps the view current: reads the map and the servers, then follows their watches;
/// starts over after any error (a canceled watch, etcd unreachable).
async fn follow(cluster: Arc<Cluster>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            result = follow_once(&cluster) => match result {
                // A new registration: read everything again at once.
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => eprintln!("tucana serve: following the cluster map: {e}"),
            },
            _ = stopped(&mut shutdown) => return,
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Reads the map and the servers, then follows their watches; `Ok(true)` when a new
/// registration asks for everything to be read again, `Ok(false)` when a watch ended.
async fn follow_once(cluster: &Cluster) -> tucana_cluster::Result<bool> {
    let registration = cluster.registrations.load(Ordering::Acquire);
    let store = cluster.connect().await?;
    let (servers, servers_revision) = store.servers().await?;
    let map = store.map().await?;
    let map_revision = map.as_ref().map(|(_, r)| *r);
    let mut map_watch = store
        .watch_map(map_revision.or(Some(servers_revision)))
        .await?;
    let mut server_watch = store.watch_servers(Some(servers_revision)).await?;
    cluster
        .set_view(|view| {
            view.map = map.map(|(m, _)| m);
            view.live.clear();
            for info in servers {
                view.live.insert(info.id.clone());
                view.servers.insert(info.id.clone(), info);
            }
        })
        .await;
    cluster
        .view_registration
        .store(registration, Ordering::Release);
    loop {
        tokio::select! {
            // Servers first: a map that names a server should find its address.
            biased;
            _ = cluster.reread.notified() => return Ok(true),
            event = server_watch.next() => match event? {
                Some(ServerEvent::Up { info, .. }) => cluster.set_view(|v| {
                    v.live.insert(info.id.clone());
                    v.servers.insert(info.id.clone(), info);
                }).await,
                Some(ServerEvent::Down { id, .. }) => cluster.set_view(|v| {
                    v.live.remove(&id);
                }).await,
                None => return Ok(false),
            },
            event = map_watch.next() => match event? {
                Some(MapEvent::Updated { map, .. }) => {
                    let view = cluster.view();
                    let unknown = map.regions.iter().any(|r| {
                        std::iter::once(&r.primary)
                            .chain(&r.backups)
                            .any(|s| !view.servers.contains_key(s))
                    });
                    if unknown {
                        // Its registration may be in a server event not read yet.
                        let (servers, _) = store.servers().await?;
                        cluster.set_view(|v| {
                            for info in servers {
                                v.live.insert(info.id.clone());
                                v.servers.insert(info.id.clone(), info);
                            }
                        }).await;
                    }
                    cluster.set_view(|v| v.map = Some(map)).await;
                }
                Some(MapEvent::Deleted { .. }) => cluster.set_view(|v| v.map = None).await,
                None => return Ok(false),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(dir: &Path) -> Cluster {
        let config = ClusterConfig {
            etcd: vec!["http://127.0.0.1:1".into()],
            name: "test".into(),
            announce: None,
            lease_ttl: Duration::from_secs(3),
            migrate_batch: 100,
            migrate_pause: Duration::ZERO,
            split_bytes: 0,
            balance_leaders: false,
            id_file: dir.join("volume.cluster-id"),
        };
        Cluster::new(config, "127.0.0.1:7001".into(), String::new()).unwrap()
    }

    fn lease(deadline: Instant) -> watch::Receiver<LeaseStatus> {
        let (_tx, rx) = watch::channel(LeaseStatus {
            deadline,
            keepalive_ok: true,
            lost: false,
        });
        rx
    }

    #[test]
    fn writes_are_acknowledged_only_with_a_valid_lease_and_the_region_led_here() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = cluster(dir.path());
        let other = ServerId::random();
        let map = ClusterMap::even(&[cluster.id.clone(), other.clone()]).unwrap();
        let mut servers = BTreeMap::new();
        servers.insert(
            other.clone(),
            ServerInfo {
                id: other.clone(),
                client_addr: "127.0.0.1:7002".into(),
                repl_addr: String::new(),
            },
        );
        *cluster.view.write() = Arc::new(View {
            map: Some(map),
            servers,
            live: BTreeSet::new(),
        });
        // Keyspaces outside the regions pass; without a lease nothing else does.
        assert_eq!(cluster.may_acknowledge("default"), Ok(()));
        let refused = cluster.may_acknowledge("region-1").unwrap_err();
        assert!(refused.starts_with("READONLY"), "{refused}");
        // A lease valid for longer than the margin (a third of 3 s): region 1 is ours,
        // region 2 is redirected to its primary.
        *cluster.lease.lock() = Some(lease(Instant::now() + Duration::from_secs(60)));
        assert_eq!(cluster.may_acknowledge("region-1"), Ok(()));
        let moved = cluster.may_acknowledge("region-2").unwrap_err();
        assert_eq!(moved, "MOVED 8192 127.0.0.1:7002");
        // Within the margin of its deadline the lease no longer counts.
        *cluster.lease.lock() = Some(lease(Instant::now() + Duration::from_millis(500)));
        let refused = cluster.may_acknowledge("region-1").unwrap_err();
        assert!(refused.starts_with("READONLY"), "{refused}");
        // Registered before and the lease gone: the view may be stale (no slot map given).
        assert!(
            !cluster.view_may_be_stale(),
            "never registered: nothing to distrust"
        );
        cluster.registrations.fetch_add(1, Ordering::AcqRel);
        assert!(cluster.view_may_be_stale());
        *cluster.lease.lock() = Some(lease(Instant::now() + Duration::from_secs(60)));
        assert!(!cluster.view_may_be_stale());
    }

    #[test]
    fn the_server_id_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("volume.cluster-id");
        let first = load_or_create_id(&path).unwrap();
        assert_eq!(load_or_create_id(&path).unwrap(), first);
        std::fs::write(&path, "not an id\n").unwrap();
        assert!(load_or_create_id(&path).is_err());
    }
}
