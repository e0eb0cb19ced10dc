//! [`ServerState`]: what every connection of one server shares (the store, the
//! configuration, the counters, the syncer, the shutdown signal).
//!
//! Owns the construction of that state (starting the syncer in sync mode) and the
//! numbering of clients. It does not own sockets, threads or the execution model
//! (`server`, `connection`) and knows nothing of commands (`commands`).
//!
//! Thread-safety: `ServerState` is `Send + Sync` and shared behind an `Arc` by the
//! listener and every connection; its parts are either immutable after start or
//! synchronise themselves (atomics, the store's locks, the watch channel).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tucana::Database;

use crate::cluster::Cluster;
use crate::config::{DurabilityMode, ServerConfig};
use crate::metrics::Metrics;
use crate::replication::Replication;
use crate::store::Store;
use crate::syncer::Syncer;

/// State shared by all connections of a server.
pub struct ServerState {
    pub store: Store,
    pub config: ServerConfig,
    /// What `CONFIG SET` may change while the server runs.
    pub settings: crate::settings::Settings,
    pub metrics: Metrics,
    pub started: Instant,
    /// The port actually bound (the configured one may be 0).
    pub local_port: u16,
    /// Connection threads (the configured count, or the default for this machine).
    pub threads: usize,
    /// Present when the server speaks TLS.
    pub tls: Option<TlsAcceptor>,
    /// With sync durability: makes the writes of connections durable, many per sync.
    pub syncer: Option<Syncer>,
    /// Replication to backups and from primaries, when configured.
    pub replication: Option<Arc<Replication>>,
    /// Cluster mode's state, when configured (`None`: standalone).
    pub cluster: Option<Arc<Cluster>>,
    /// Set to `true` once to stop the server (signals, `SHUTDOWN`, `ShutdownHandle`).
    pub shutdown: Arc<watch::Sender<bool>>,
    /// The clients blocked now, for `CLIENT UNBLOCK`.
    pub unblock: crate::waiters::UnblockTable,
    /// Pub/Sub's channels and patterns (`PUBLISH` reaches this server's subscribers).
    pub pubsub: Arc<crate::pubsub::PubSub>,
    next_client_id: AtomicU64,
}

impl ServerState {
    /// The state of a server bound to `local_port`; starts the syncer thread when the
    /// configuration asks for sync durability.
    pub fn new(
        db: Database,
        config: ServerConfig,
        metrics: Metrics,
        local_port: u16,
        tls: Option<TlsAcceptor>,
    ) -> io::Result<ServerState> {
        let resp_addr = std::net::SocketAddr::new(config.listen.ip(), local_port);
        let replication = Replication::start(&db, &config, resp_addr)?.map(Arc::new);
        let syncer = match config.durability {
            DurabilityMode::Sync => Some(Syncer::start(db.clone(), replication.clone())?),
            DurabilityMode::Buffered => None,
        };
        let cluster = match &config.cluster {
            Some(cluster) => {
                let client_addr = cluster
                    .announce
                    .clone()
                    .unwrap_or_else(|| client_addr_of(resp_addr));
                let repl_addr = match config.replication.listen_port {
                    Some(port) => client_addr_of(std::net::SocketAddr::new(resp_addr.ip(), port)),
                    None => String::new(),
                };
                Some(Arc::new(Cluster::new(
                    cluster.clone(),
                    client_addr,
                    repl_addr,
                )?))
            }
            None => None,
        };
        if let (Some(cluster), Some(replication)) = (&cluster, &replication) {
            let weak = Arc::downgrade(cluster);
            replication.set_ack_gate(Box::new(move |name| match weak.upgrade() {
                Some(cluster) => cluster.may_acknowledge(name),
                None => Err("CLUSTERDOWN the server is shutting down".into()),
            }));
            cluster.set_follower(crate::cluster_follow::follower(
                db.clone(),
                replication.clone(),
                Arc::downgrade(cluster),
            ));
        }
        let (shutdown, _) = watch::channel(false);
        Ok(ServerState {
            syncer,
            replication,
            cluster,
            store: Store::new(db, config.databases, config.max_scan_cursors),
            threads: config.thread_count(),
            settings: crate::settings::Settings::new(&config),
            config,
            metrics,
            started: Instant::now(),
            local_port,
            tls,
            shutdown: Arc::new(shutdown),
            unblock: Default::default(),
            pubsub: Default::default(),
            next_client_id: AtomicU64::new(1),
        })
    }

    /// Publishes keyspace notification `event` about `key` of database `db` to this
    /// server's subscribers, on the channels `flags` (`Settings::notify_flags`, loaded
    /// by the caller) ask for; the caller checked `notify::wants`.
    pub fn notify(&self, flags: u32, db: u32, event: &str, key: &[u8]) {
        let limit = self.settings.pubsub_limit();
        crate::notify::publish(flags, db, event, key, |channel, message| {
            self.pubsub.publish(channel, message, limit);
        });
    }

    /// A number for a new connection (`CLIENT ID`), never handed out before.
    pub fn new_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// `addr` as clients elsewhere can reach it: a wildcard address becomes loopback (pass
/// `--cluster-announce` to name the host's address).
fn client_addr_of(addr: std::net::SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() {
        std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
    } else {
        addr.ip()
    };
    std::net::SocketAddr::new(ip, addr.port()).to_string()
}

/// Resolves once shutdown was asked for on `shutdown` (a receiver of
/// [`ServerState::shutdown`]). A function rather than `wait_for` in place: the guard
/// `wait_for` returns is not `Send`.
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
