//! Server configuration: where to listen, durability, authentication and limits.
//!
//! Plain data with defaults; validated once by [`ServerConfig::validate`] when the server
//! binds. Owns no behaviour.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::resp::RequestLimits;

/// The port `tucana serve` listens on by default: not Redis's 6379, so both can run side
/// by side.
pub const DEFAULT_PORT: u16 = 7379;

/// How long a busy connection thread polls before it sleeps, by default.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

/// When a write is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurabilityMode {
    /// A write is answered only once it is durable (log flushed and synced). Concurrent
    /// connections share one sync (group commit in the engine), and the writes of one
    /// pipelined batch share one too.
    Sync,
    /// A write is answered once it is in the log buffer; the engine flushes and syncs
    /// every `flush_interval` (the `Options` of the opened database).
    Buffered,
}

impl DurabilityMode {
    pub fn name(self) -> &'static str {
        match self {
            DurabilityMode::Sync => "sync",
            DurabilityMode::Buffered => "buffered",
        }
    }
}

/// TLS for the RESP listener: PEM files with the certificate chain (leaf first) and its
/// private key (PKCS#8, PKCS#1 or SEC1).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert_chain: PathBuf,
    pub private_key: PathBuf,
}

/// Replication of this server's keyspaces to backups, and of other servers' to this one
/// (DESIGN.md, "Replication").
#[derive(Clone, Debug, Default)]
pub struct ReplicationConfig {
    /// This server's name in replication (default: its RESP address).
    pub server_id: Option<String>,
    /// Backups' replication addresses (`host:port`): this server is the primary of every
    /// keyspace it holds and ships each to all of them.
    pub backups: Vec<String>,
    /// Listen for primaries on this port (same address as the RESP listener): keyspaces
    /// they ship become replicas here.
    pub listen_port: Option<u16>,
    /// Backups acknowledge a write only once it is durable on them (default: once they
    /// received it).
    pub ack_durable: bool,
    /// A write waits at most this long for its backups' acknowledgements.
    pub ack_timeout: Duration,
    /// The baseline for benchmarks: as a backup, build an index of its own from the
    /// shipped records instead of taking the primary's.
    pub build_index: bool,
    /// Shared by a primary and its backups (default: `requirepass`).
    pub password: Option<String>,
    /// With TLS: the roots a primary trusts for its backups' certificates (PEM).
    pub tls_ca: Option<PathBuf>,
    /// Bytes per second at most for the log a backup lacks when it connects (0: no limit).
    pub catchup_bytes_per_sec: u64,
    /// How long, and for how many log bytes, a backup's index may lag the primary's
    /// newest commit when shipping each commit's index would cost too much network
    /// (zero: every commit is shipped as it is made). DESIGN.md, "Replication".
    pub index_lag_max: Duration,
    pub index_lag_max_bytes: u64,
}

impl ReplicationConfig {
    /// Whether this server replicates anything (as a primary or as a backup).
    pub fn enabled(&self) -> bool {
        !self.backups.is_empty() || self.listen_port.is_some()
    }
}

/// Cluster mode (issue 19; DESIGN.md, "Cluster"): the server registers in etcd, follows
/// the cluster map kept there and serves the regions it is primary of.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// etcd's client URLs (`http://host:port`).
    pub etcd: Vec<String>,
    /// The cluster's name: its keys in etcd are under `/tucana/<name>/`.
    pub name: String,
    /// The address clients are sent to (`MOVED`, `CLUSTER SLOTS`); default: the
    /// listener's address and port.
    pub announce: Option<String>,
    /// Where this server's id is kept, so a restart on the same volume keeps it.
    pub id_file: PathBuf,
    /// The time to live of this server's lease in etcd.
    pub lease_ttl: Duration,
    /// Slot migration (`migration`): at most this many stored pairs per batch sent to
    /// the target, and a pause after each batch (0 in production; tests slow a
    /// migration down to watch it).
    pub migrate_batch: usize,
    pub migrate_pause: Duration,
    /// A region this server leads is split in two once its live data passes this many
    /// bytes (`splitter`); 0: never.
    pub split_bytes: u64,
    /// As the coordinator, ask for planned failovers that even out leadership once the
    /// cluster is calm (`ClusterMap::balancing_handoff`).
    pub balance_leaders: bool,
}

/// Pub/Sub's output limit: Redis's default `client-output-buffer-limit pubsub 32mb 8mb 60`.
pub const DEFAULT_HARD_LIMIT_BYTES: u64 = 32 << 20;
pub const DEFAULT_SOFT_LIMIT_BYTES: u64 = 8 << 20;
pub const DEFAULT_SOFT_LIMIT_S: u64 = 60;

/// The bound on a subscriber's outbound bytes (queued, or taken by its connection and
/// not written yet). 0 turns a limit off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputLimit {
    /// Past this, the subscriber is dropped at once.
    pub hard_bytes: u64,
    /// Above this for `soft_s` seconds in a row, the subscriber is dropped.
    pub soft_bytes: u64,
    pub soft_s: u64,
}

impl Default for OutputLimit {
    fn default() -> OutputLimit {
        OutputLimit {
            hard_bytes: DEFAULT_HARD_LIMIT_BYTES,
            soft_bytes: DEFAULT_SOFT_LIMIT_BYTES,
            soft_s: DEFAULT_SOFT_LIMIT_S,
        }
    }
}

/// Everything the server needs besides the opened database.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address and port of the RESP listener (port 0: any free port).
    pub listen: SocketAddr,
    /// Address and port of the Prometheus `/metrics` endpoint, if any.
    pub metrics_listen: Option<SocketAddr>,
    pub durability: DurabilityMode,
    /// `AUTH` is required when set. Listening on a non-loopback address requires it.
    pub requirepass: Option<String>,
    /// Clients must speak TLS when set (the metrics endpoint stays plain HTTP).
    pub tls: Option<TlsFiles>,
    /// Connections beyond this are answered with an error and closed.
    pub max_clients: usize,
    /// Limits on requests of authenticated clients (or of all, without a password).
    pub request_limits: RequestLimits,
    /// Limits on requests before `AUTH` succeeded.
    pub pre_auth_limits: RequestLimits,
    /// A connection that sends nothing for this long is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// `SELECT` accepts 0..databases.
    pub databases: u32,
    /// How long a shutdown waits for connections to finish their requests in flight.
    pub shutdown_grace: Duration,
    /// How many `SCAN` cursors the server remembers; older ones are forgotten and answer
    /// `ERR invalid cursor`.
    pub max_scan_cursors: usize,
    /// Connection threads, each running its share of the connections on an event loop of
    /// its own (`None`: [`default_threads`] for this machine's cores).
    pub threads: Option<usize>,
    /// After serving several connections, a connection thread keeps polling its sockets
    /// this long before it sleeps (see `busy_poll`; zero: sleep at once).
    pub busy_poll: Duration,
    pub replication: ReplicationConfig,
    /// Cluster mode, when set (`None`: a standalone server, as without clusters).
    pub cluster: Option<ClusterConfig>,
    /// Delete expired keys in the background (`sweeper`); off, they are only hidden
    /// (lazy expiry) until written or deleted. Tests turn it off to see lazy expiry alone.
    pub active_expiry: bool,
    /// Serve `DEBUG` (Redis's test suite needs it). Off by default, as in Redis 7: it
    /// lets any client stop expiry, verify the whole volume (`DEBUG RELOAD`, O(volume))
    /// or hold its connection.
    pub enable_debug_command: bool,
    /// Serve `TUCANA.ADDMEMBER path` (adds a member to the open volume over several).
    /// Off by default: it lets a client have the server create and write a file at any
    /// path the server may write.
    pub enable_add_member_command: bool,
    /// Serve `TUCANA.REMOVEMEMBER path` (moves a member's groups onto the others and
    /// takes it out of the open volume). Off by default: it lets a client start a copy of
    /// a whole member and change which paths the next start needs.
    pub enable_remove_member_command: bool,
    /// Serve `TUCANA.REBALANCE` (moves whole groups between the members of the open
    /// volume until they hold as many, within one). Off by default: it lets a client start
    /// copies of whole groups (128 MiB each) on the served volume.
    pub enable_rebalance_command: bool,
    /// The bound on a Pub/Sub subscriber's queued output (Redis's
    /// `client-output-buffer-limit pubsub`; `CONFIG SET` changes it at run time).
    pub pubsub_limit: OutputLimit,
    /// Keyspace notifications at start (Redis's `notify-keyspace-events` flag string,
    /// e.g. `KEA`; empty: none). `CONFIG SET notify-keyspace-events` changes them.
    pub notify_keyspace_events: String,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT),
            metrics_listen: None,
            durability: DurabilityMode::Sync,
            requirepass: None,
            tls: None,
            max_clients: 10_000,
            request_limits: RequestLimits::DEFAULT,
            pre_auth_limits: RequestLimits::PRE_AUTH,
            idle_timeout: None,
            databases: 16,
            shutdown_grace: Duration::from_secs(10),
            max_scan_cursors: 16_384,
            threads: None,
            busy_poll: DEFAULT_BUSY_POLL,
            replication: ReplicationConfig {
                ack_timeout: Duration::from_secs(5),
                index_lag_max: Duration::from_secs(60),
                index_lag_max_bytes: 256 << 20,
                ..ReplicationConfig::default()
            },
            cluster: None,
            active_expiry: true,
            enable_debug_command: false,
            enable_add_member_command: false,
            enable_remove_member_command: false,
            enable_rebalance_command: false,
            pubsub_limit: OutputLimit::default(),
            notify_keyspace_events: String::new(),
        }
    }
}

/// Connection threads when not configured, for a machine with `cores` cores: one per
/// core but one, at least one. The spare core runs what the connection threads hand off
/// or leave behind: the engine's committer, flusher and garbage collector, sync-mode
/// writes on the blocking pool, and on a benchmark machine the load generator (on 2
/// cores, one connection thread beside redis-benchmark served more requests, at less CPU
/// per request, than two: docs/server-bench.md).
pub fn default_threads(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

impl ServerConfig {
    /// The connection threads to run: the configured count, else [`default_threads`] of
    /// the cores this process may use.
    pub fn thread_count(&self) -> usize {
        self.threads.unwrap_or_else(|| {
            default_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
        })
    }

    /// Refuses configurations that would be unsafe or cannot work.
    pub fn validate(&self) -> Result<(), String> {
        let exposed = |addr: &SocketAddr| !addr.ip().is_loopback();
        let has_password = self.requirepass.as_deref().is_some_and(|p| !p.is_empty());
        if exposed(&self.listen) && !has_password {
            return Err(format!(
                "refusing to listen on non-loopback address {} without a password: set --requirepass",
                self.listen.ip()
            ));
        }
        if self.requirepass.as_deref() == Some("") {
            return Err("the password must not be empty".into());
        }
        if self.max_clients == 0 {
            return Err("max clients must be at least 1".into());
        }
        if self.databases == 0 {
            return Err("databases must be at least 1".into());
        }
        if self.threads == Some(0) {
            return Err("threads must be at least 1".into());
        }
        if self.max_scan_cursors == 0 {
            return Err("max scan cursors must be at least 1".into());
        }
        if crate::notify::parse(self.notify_keyspace_events.as_bytes()).is_none() {
            return Err(format!(
                "notify-keyspace-events {:?}: {}",
                self.notify_keyspace_events,
                crate::notify::INVALID
            ));
        }
        if self.tls.is_some()
            && !self.replication.backups.is_empty()
            && self.replication.tls_ca.is_none()
        {
            return Err("with TLS, a primary needs --tls-ca-cert to trust its backups".into());
        }
        if self.replication.listen_port.is_some() && exposed(&self.listen) && !has_password {
            return Err("a replication listener on a public address needs a password".into());
        }
        if let Some(cluster) = &self.cluster {
            if cluster.etcd.is_empty() {
                return Err("cluster mode needs at least one etcd endpoint".into());
            }
            if cluster.lease_ttl < Duration::from_secs(1) {
                return Err("the cluster lease must last at least 1 s".into());
            }
        }
        for (name, l) in [
            ("request", &self.request_limits),
            ("pre-auth", &self.pre_auth_limits),
        ] {
            if l.max_args == 0 || l.max_bulk_bytes == 0 || l.max_request_bytes == 0 {
                return Err(format!("{name} limits must be positive"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_listen_on_loopback_off_the_redis_port() {
        let c = ServerConfig::default();
        assert!(c.listen.ip().is_loopback());
        assert_ne!(c.listen.port(), 6379);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn default_threads_leave_a_core_and_are_at_least_one() {
        assert_eq!(default_threads(0), 1);
        assert_eq!(default_threads(1), 1);
        assert_eq!(default_threads(2), 1);
        assert_eq!(default_threads(8), 7);
        assert!(ServerConfig::default().thread_count() >= 1);
        let c = ServerConfig {
            threads: Some(3),
            ..ServerConfig::default()
        };
        assert_eq!(c.thread_count(), 3);
    }

    #[test]
    fn zero_threads_are_refused() {
        let c = ServerConfig {
            threads: Some(0),
            ..ServerConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("threads"));
    }

    #[test]
    fn a_public_address_needs_a_password() {
        let mut c = ServerConfig {
            listen: "0.0.0.0:7379".parse().unwrap(),
            ..ServerConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("requirepass"));
        c.requirepass = Some(String::new());
        assert!(c.validate().is_err());
        c.requirepass = Some("secret".into());
        assert!(c.validate().is_ok());
    }
}
