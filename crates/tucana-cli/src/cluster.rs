//! `tucana cluster create|status|move-slots|split|add-server|remove-server|rebalance`:
//! an operator's commands on a cluster's map in etcd (issue 19; DESIGN.md, "Cluster").
//! The migrations behind the last five are `cluster_ops`'.
//!
//! `create` waits until the named servers (`tucana serve --cluster-etcd`) are registered,
//! matching them by the client address they announce, splits the 16384 hash slots evenly
//! over them as primaries, gives each region `--replicas` backups on the servers after its
//! primary, and creates the map; it refuses when a map exists. `status`
//! prints the map (regions, slot ranges, primary, backups, epochs, running migrations)
//! and which servers are live.
//!
//! Owns the subcommand's flags and output; the map and its storage in etcd are
//! `tucana-cluster`'s. Runs a small tokio runtime on the calling thread for the etcd
//! client.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use tucana_cluster::{ClusterMap, ServerId, ServerInfo, Store};

use crate::{cluster_ops, CliError, Outcome};

/// Flags of `tucana cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub action: Action,
}

/// Where the cluster's map is kept.
#[derive(Debug, Args)]
pub struct EtcdArgs {
    /// etcd's client URLs, comma-separated (`http://host:port`).
    #[arg(long, value_name = "URL[,URL]", value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// The cluster's name (its servers' --cluster-name).
    #[arg(long, value_name = "NAME")]
    name: String,
}

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Waits for the servers at HOST:PORT... to register, then creates the map: the
    /// 16384 hash slots split evenly over them, one region each, in the order given.
    Create {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Backups per region, on the servers after its primary in the order given (fewer
        /// than the servers named).
        #[arg(long, default_value_t = 0, value_name = "N")]
        replicas: u32,
        /// How long to wait for the servers to register.
        #[arg(long, default_value_t = 60, value_name = "SECS")]
        wait_secs: u64,
        /// The servers' client addresses, as they announce them (--cluster-announce, or
        /// their --bind and --port).
        #[arg(value_name = "HOST:PORT", required = true)]
        servers: Vec<String>,
    },
    /// Prints the map and which servers are live.
    Status {
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Moves a region's slots (all, or a prefix or suffix) online into a new region led
    /// by the server at --to, and waits until it owns them.
    MoveSlots {
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(long, value_name = "REGION")]
        from_region: u64,
        /// A-B: a prefix or suffix of the region's slots (default: all of them).
        #[arg(long, value_name = "A-B", value_parser = crate::cluster_ops::parse_slots)]
        slots: Option<tucana_cluster::SlotRange>,
        /// The new primary's client address.
        #[arg(long, value_name = "HOST:PORT")]
        to: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Splits a region in two on the same servers: slots from --at (default: the middle)
    /// to its end move online into a new region.
    Split {
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(value_name = "REGION")]
        region: u64,
        #[arg(long, value_name = "SLOT")]
        at: Option<u16>,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Waits for the server at HOST:PORT to register, then moves slots to it until the
    /// live servers lead even shares.
    AddServer {
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(value_name = "HOST:PORT")]
        server: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Moves every slot the server at HOST:PORT leads to the other live servers (evenly);
    /// stop it afterwards: the coordinator then replaces it as a backup.
    RemoveServer {
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(value_name = "HOST:PORT")]
        server: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Evens out the slots the live servers lead: first by handing regions over to
    /// in-sync backups (planned failovers), then by moving slots.
    Rebalance {
        #[command(flatten)]
        etcd: EtcdArgs,
        #[command(flatten)]
        wait: WaitArgs,
    },
}

/// How long operator commands wait.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// How long to wait for a server to register, and for each migration to finish.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    wait_secs: u64,
}

impl WaitArgs {
    fn wait(&self) -> Duration {
        Duration::from_secs(self.wait_secs)
    }
}

pub fn run(args: &ClusterArgs) -> Result<Outcome, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::msg(format!("cannot start a runtime: {e}")))?;
    runtime.block_on(async {
        match &args.action {
            Action::Create {
                etcd,
                replicas,
                wait_secs,
                servers,
            } => create(etcd, *replicas, Duration::from_secs(*wait_secs), servers).await,
            Action::Status { etcd } => status(etcd).await,
            Action::MoveSlots {
                etcd,
                from_region,
                slots,
                to,
                wait,
            } => {
                let store = connect(etcd).await?;
                let region = tucana_cluster::RegionId(*from_region);
                cluster_ops::move_to(&store, region, *slots, to, wait.wait()).await
            }
            Action::Split {
                etcd,
                region,
                at,
                wait,
            } => {
                let store = connect(etcd).await?;
                let region = tucana_cluster::RegionId(*region);
                cluster_ops::split(&store, region, *at, wait.wait()).await
            }
            Action::AddServer { etcd, server, wait } => {
                let store = connect(etcd).await?;
                let id = cluster_ops::server_at(&store, server, wait.wait()).await?;
                let moves = cluster_ops::plan(
                    &store,
                    |live| {
                        let mut servers = live.clone();
                        servers.insert(id.clone());
                        servers
                    },
                    wait.wait(),
                )
                .await?;
                println!("{server} added; {moves} moves");
                Ok(())
            }
            Action::RemoveServer { etcd, server, wait } => {
                let store = connect(etcd).await?;
                let id = cluster_ops::server_at(&store, server, Duration::ZERO).await?;
                let (others, _) = store
                    .servers()
                    .await
                    .map_err(etcd_error("reading servers"))?;
                if others.iter().all(|s| s.id == id) {
                    return Err(CliError::msg(format!(
                        "{server} is the only live server: nowhere to move its slots"
                    )));
                }
                let moves = cluster_ops::plan(
                    &store,
                    |live| live.iter().filter(|s| **s != id).cloned().collect(),
                    wait.wait(),
                )
                .await?;
                println!(
                    "{server} leads no region now ({moves} moves); stop it, and the coordinator replaces it as a backup once its lease expires"
                );
                Ok(())
            }
            Action::Rebalance { etcd, wait } => {
                let store = connect(etcd).await?;
                let handoffs = cluster_ops::balance_leaders(&store, wait.wait()).await?;
                let moves = cluster_ops::plan(&store, Clone::clone, wait.wait()).await?;
                println!("balanced; {handoffs} handoffs, {moves} moves");
                Ok(())
            }
        }
    })?;
    Ok(Outcome::Done)
}

fn etcd_error(what: &str) -> impl Fn(tucana_cluster::Error) -> CliError + '_ {
    move |e| CliError::msg(format!("{what}: {e}"))
}

async fn connect(etcd: &EtcdArgs) -> Result<Store, CliError> {
    Store::connect(&etcd.etcd, &etcd.name)
        .await
        .map_err(etcd_error("connecting to etcd"))
}

/// The registered server whose client address is each of `addrs`, once all are.
async fn wait_for_servers(
    store: &Store,
    addrs: &[String],
    wait: Duration,
) -> Result<Vec<ServerId>, CliError> {
    let deadline = Instant::now() + wait;
    let mut told = false;
    loop {
        let (servers, _) = store
            .servers()
            .await
            .map_err(etcd_error("reading servers"))?;
        let found: Vec<Option<&ServerInfo>> = addrs
            .iter()
            .map(|a| servers.iter().find(|s| &s.client_addr == a))
            .collect();
        if found.iter().all(Option::is_some) {
            return Ok(found.into_iter().flatten().map(|s| s.id.clone()).collect());
        }
        let missing: Vec<&str> = addrs
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(a, _)| a.as_str())
            .collect();
        if Instant::now() >= deadline {
            let registered: Vec<&str> = servers.iter().map(|s| s.client_addr.as_str()).collect();
            return Err(CliError::msg(format!(
                "not registered after {wait:?}: {} (registered: {})",
                missing.join(", "),
                if registered.is_empty() {
                    "none".to_owned()
                } else {
                    registered.join(", ")
                }
            )));
        }
        if !told {
            eprintln!("waiting for {} to register", missing.join(", "));
            told = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn create(
    etcd: &EtcdArgs,
    replicas: u32,
    wait: Duration,
    addrs: &[String],
) -> Result<(), CliError> {
    let distinct: BTreeSet<&String> = addrs.iter().collect();
    if distinct.len() != addrs.len() {
        return Err(CliError::msg("a server is named twice"));
    }
    let store = connect(etcd).await?;
    if let Some((_, revision)) = store.map().await.map_err(etcd_error("reading the map"))? {
        return Err(CliError::msg(format!(
            "cluster {} already has a map (revision {revision}); `tucana cluster status` shows it",
            etcd.name
        )));
    }
    let ids = wait_for_servers(&store, addrs, wait).await?;
    let map = ClusterMap::even_with_backups(&ids, replicas as usize)
        .map_err(etcd_error("building the map"))?;
    store
        .create_map(&map)
        .await
        .map_err(etcd_error("creating the map"))?;
    println!("created the map of cluster {}:", etcd.name);
    let addr_of = |id: &ServerId| {
        ids.iter()
            .position(|i| i == id)
            .map_or("?", |at| addrs[at].as_str())
    };
    for region in &map.regions {
        let backups: Vec<&str> = region.backups.iter().map(addr_of).collect();
        println!(
            "  region {}: slots {} on {} ({}), backups: {}",
            region.id,
            region.slots,
            addr_of(&region.primary),
            region.primary,
            if backups.is_empty() {
                "none".to_owned()
            } else {
                backups.join(", ")
            }
        );
    }
    Ok(())
}

async fn status(etcd: &EtcdArgs) -> Result<(), CliError> {
    let store = connect(etcd).await?;
    let (servers, _) = store
        .servers()
        .await
        .map_err(etcd_error("reading servers"))?;
    let map = store.map().await.map_err(etcd_error("reading the map"))?;
    let live: BTreeSet<&ServerId> = servers.iter().map(|s| &s.id).collect();
    let addr = |id: &ServerId| {
        servers
            .iter()
            .find(|s| &s.id == id)
            .map_or("(not registered)", |s| s.client_addr.as_str())
    };
    let health = |id: &ServerId| if live.contains(id) { "live" } else { "DOWN" };
    println!("cluster {}", etcd.name);
    match &map {
        None => println!("no map yet (`tucana cluster create` makes one)"),
        Some((map, revision)) => {
            println!(
                "map: version {}, config epoch {}, etcd revision {revision}",
                map.version, map.config_epoch
            );
            let mut assigned = 0u32;
            // A region's epoch, primary and backups, each with its address and health.
            let members = |region: &tucana_cluster::Region| {
                let backups: Vec<String> = region
                    .backups
                    .iter()
                    .map(|b| {
                        let sync = if region.handoff.as_ref() == Some(b) {
                            "in sync, taking over (planned failover)"
                        } else if region.in_sync.contains(b) {
                            "in sync"
                        } else {
                            "catching up"
                        };
                        format!("{b} {} {} {sync}", addr(b), health(b))
                    })
                    .collect();
                format!(
                    "epoch {}, primary {} {} {}, backups: {}",
                    region.epoch,
                    region.primary,
                    addr(&region.primary),
                    health(&region.primary),
                    if backups.is_empty() {
                        "none".to_owned()
                    } else {
                        backups.join(", ")
                    }
                )
            };
            // Each live primary's own view of its backups' lag (from its INFO cluster).
            let asked: Vec<(tucana_cluster::RegionId, String)> = map
                .regions
                .iter()
                .filter(|r| live.contains(&r.primary))
                .map(|r| (r.id, addr(&r.primary).to_owned()))
                .collect();
            let lags = tokio::task::spawn_blocking(move || backup_lags(&asked))
                .await
                .unwrap_or_default();
            for region in &map.regions {
                assigned += region.slots.len();
                println!(
                    "region {}: slots {} ({} slots), {}{}",
                    region.id,
                    region.slots,
                    region.slots.len(),
                    members(region),
                    lags.get(&region.id)
                        .map(|lag| format!(", {lag}"))
                        .unwrap_or_default()
                );
            }
            for m in &map.migrations {
                println!(
                    "migrating: slots {} of region {} into region {}, {}",
                    m.target.slots,
                    m.source,
                    m.target.id,
                    members(&m.target)
                );
            }
            let unassigned = u32::from(tucana_cluster::SLOTS) - assigned;
            if unassigned > 0 {
                println!("unassigned slots: {unassigned}");
            }
            if let Some(f) = &map.last_failover {
                // decided: from the coordinator seeing the dead primary's lease expired to
                // its submitting the map that promotes (the lease's own time comes first).
                println!(
                    "last failover: region {} to {} {} at epoch {} (dead: {} {}), at unix ms {}, decided in {} ms",
                    f.region,
                    f.promoted,
                    addr(&f.promoted),
                    f.epoch,
                    f.dead,
                    addr(&f.dead),
                    f.at_unix_ms,
                    f.decided_ms
                );
            }
        }
    }
    println!("live servers: {}", servers.len());
    for server in &servers {
        println!("  {} {}", server.id, server.client_addr);
    }
    Ok(())
}

/// For each region, what its primary (at the given client address) says of its backups
/// in `INFO cluster`: `backups online N, backup lag B bytes`. Regions whose primary does
/// not answer within a second are left out.
fn backup_lags(
    primaries: &[(tucana_cluster::RegionId, String)],
) -> std::collections::HashMap<tucana_cluster::RegionId, String> {
    let mut out = std::collections::HashMap::new();
    for (id, addr) in primaries {
        let Ok(client) = redis::Client::open(format!("redis://{addr}/")) else {
            continue;
        };
        let Ok(mut con) = client.get_connection_with_timeout(std::time::Duration::from_secs(1))
        else {
            continue;
        };
        let _ = con.set_read_timeout(Some(std::time::Duration::from_secs(1)));
        let Ok(info) = redis::cmd("INFO").arg("cluster").query::<String>(&mut con) else {
            continue;
        };
        let prefix = format!("tucana_region_{}:", id.0);
        let Some(line) = info.lines().find(|l| l.starts_with(&prefix)) else {
            continue;
        };
        let field = |name: &str| {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or("?")
                .to_owned()
        };
        out.insert(
            *id,
            format!(
                "backups online {}, backup lag {} bytes",
                field("backups_online"),
                field("backup_lag_bytes")
            ),
        );
    }
    out
}
