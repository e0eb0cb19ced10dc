//! `tucana serve`: runs the RESP server (crate `tucana-server`) on the volume.
//!
//! Owns the command-line flags of the server and their translation into a
//! `ServerConfig` and engine `Options`; the server itself lives in `tucana-server`.
//! Runs on the calling thread until SIGINT, SIGTERM or `SHUTDOWN`, then commits and
//! closes the volume (exit 0).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use tucana_server::{
    ClusterConfig, DurabilityMode, ReplicationConfig, RequestLimits, ServerConfig, TlsFiles,
    DEFAULT_PORT,
};

use crate::{CliError, Outcome};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// Answer a write only once it is durable (concurrent writers share one fsync).
    Sync,
    /// Answer a write once it is in the log buffer; flushed every --flush-interval-ms.
    Buffered,
}

/// Flags of `tucana serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on; a non-loopback one requires --requirepass.
    #[arg(long, default_value = "127.0.0.1", value_name = "ADDR")]
    bind: String,
    /// TCP port (0: any free port, printed at start).
    #[arg(long, default_value_t = DEFAULT_PORT, value_name = "N")]
    port: u16,
    /// When a write is answered.
    #[arg(long, value_enum, default_value = "sync")]
    durability: DurabilityArg,
    /// With buffered durability, writes are flushed and synced at least this often.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    flush_interval_ms: u64,
    /// Once no write has come for this long, rewrite scattered records in key order in the
    /// background (within garbage collection's rate budget), so that scans of data not in
    /// memory read the device sequentially; each scattered record is written once more.
    /// Off unless given (`Options::reorganise_after_idle`).
    #[arg(long, value_name = "MS")]
    reorganise_after_idle_ms: Option<u64>,
    /// Require `AUTH PASSWORD` (or `HELLO 3 AUTH default PASSWORD`) before other commands.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "TUCANA_REQUIREPASS",
        hide_env_values = true
    )]
    requirepass: Option<String>,
    /// Speak TLS to clients with this PEM certificate chain (needs --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics on this port (same address).
    #[arg(long, value_name = "PORT")]
    metrics_port: Option<u16>,
    /// Connections beyond this many are refused with an error.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    max_clients: usize,
    /// Close a connection idle for this many seconds (0: never).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    idle_timeout: u64,
    /// Largest argument (key or value) of a request, in bytes.
    #[arg(long, default_value_t = RequestLimits::DEFAULT.max_bulk_bytes, value_name = "BYTES")]
    max_bulk_bytes: usize,
    /// Largest request (all its arguments), in bytes.
    #[arg(long, default_value_t = RequestLimits::DEFAULT.max_request_bytes, value_name = "BYTES")]
    max_request_bytes: usize,
    /// Most arguments in one request.
    #[arg(long, default_value_t = RequestLimits::DEFAULT.max_args, value_name = "N")]
    max_args: usize,
    /// Largest request before AUTH, in bytes (also bounds each argument then).
    #[arg(long, default_value_t = RequestLimits::PRE_AUTH.max_request_bytes, value_name = "BYTES")]
    pre_auth_max_request_bytes: usize,
    /// Connection threads, each an event loop serving its share of the connections
    /// (default: one per core but one, at least one).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
    /// After serving several connections, a connection thread polls its sockets this many
    /// microseconds before it sleeps (0: sleep at once). Saves the clients' wake-ups at
    /// the cost of the CPU the thread spins.
    #[arg(long, default_value_t = tucana_server::config::DEFAULT_BUSY_POLL.as_micros() as u64, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    busy_poll_us: u64,
    /// Serve DEBUG (SET-ACTIVE-EXPIRE, DIGEST, RELOAD, ...), which Redis's own test
    /// suite uses; off by default, as in Redis 7 (any client could stop expiry or have
    /// the whole volume verified).
    #[arg(long)]
    enable_debug_command: bool,
    /// Serve TUCANA.ADDMEMBER path, which adds a member to the served volume over several
    /// members while it serves (add `--member path` to the next start); off by default (any
    /// client could have the server create and write a file wherever it may).
    #[arg(long)]
    enable_add_member_command: bool,
    /// Serve TUCANA.REMOVEMEMBER path, which moves that member's groups onto the other
    /// members and takes it out of the served volume while it serves (leave its `--member`
    /// out of the next start); off by default.
    #[arg(long)]
    enable_remove_member_command: bool,
    /// Serve TUCANA.REBALANCE, which moves whole groups between the members of the
    /// served volume while it serves, until they hold as many groups within one (data
    /// written before a member was added is spread onto it); off by default.
    #[arg(long)]
    enable_rebalance_command: bool,
    /// Keyspace notifications to publish (Redis's `notify-keyspace-events` flags, e.g.
    /// `KEA`; empty: none). `CONFIG SET notify-keyspace-events` changes them at run time.
    #[arg(long, default_value = "", value_name = "FLAGS")]
    notify_keyspace_events: String,
    /// Number of databases for SELECT (0 is the keyspace `default`, n the keyspace `dbN`).
    #[arg(long, default_value_t = 16, value_name = "N")]
    databases: u32,
    /// Replicate every keyspace of this server to a backup at this replication address
    /// (another `tucana serve --repl-port`); repeat for more backups. Writes are then
    /// answered only once every backup has them (see --repl-ack).
    #[arg(long = "backup", value_name = "HOST:PORT")]
    backups: Vec<String>,
    /// Take replicas of other servers' keyspaces (their `--backup`) on this port.
    #[arg(long, value_name = "PORT")]
    repl_port: Option<u16>,
    /// What a backup acknowledges: a write it received (survives the death of either
    /// server) or one it synced (survives both at once).
    #[arg(long, value_enum, default_value = "received")]
    repl_ack: ReplAckArg,
    /// A write fails with NOREPLICAS after waiting this long for its backups.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    repl_timeout_ms: u64,
    /// Shared by a primary and its backups (default: --requirepass).
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "TUCANA_REPL_PASSWORD",
        hide_env_values = true
    )]
    repl_password: Option<String>,
    /// This server's name in replication (default: its address).
    #[arg(long, value_name = "NAME")]
    server_id: Option<String>,
    /// With TLS: the PEM roots a primary trusts for its backups' certificates.
    #[arg(long, value_name = "PEM")]
    tls_ca_cert: Option<PathBuf>,
    /// Bytes per second at most for the log a backup lacks when it connects (0: no limit).
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    repl_catchup_bytes_per_sec: u64,
    /// How long a backup's index may lag this primary's newest commit: a commit whose
    /// index would cost more network than a fifth of the log it covers is folded into a
    /// later one, up to this long (0: every commit is shipped as it is made).
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    repl_index_lag_ms: u64,
    /// ... and up to this many log bytes since the backup's last commit (what it replays
    /// if promoted).
    #[arg(long, default_value_t = 256 << 20, value_name = "BYTES")]
    repl_index_lag_bytes: u64,
    /// Benchmark baseline: as a backup, build an index from the shipped records (as Redis
    /// replicas do) instead of taking the primary's.
    #[arg(long)]
    repl_build_index: bool,
    /// Cluster mode: register in the etcd at these client URLs (comma-separated), follow
    /// the cluster map kept there and serve the hash slots of the regions this server
    /// leads (see `tucana cluster`). The server's id is kept in VOLUME.cluster-id.
    #[arg(
        long,
        value_name = "URL[,URL]",
        value_delimiter = ',',
        requires = "cluster_name"
    )]
    cluster_etcd: Vec<String>,
    /// The cluster's name (its keys in etcd are under /tucana/NAME/).
    #[arg(long, value_name = "NAME", requires = "cluster_etcd")]
    cluster_name: Option<String>,
    /// The address clients are redirected to for this server (MOVED, CLUSTER SLOTS);
    /// default: --bind and --port.
    #[arg(long, value_name = "HOST:PORT", requires = "cluster_etcd")]
    cluster_announce: Option<String>,
    /// The time to live of this server's registration in etcd: a server killed without
    /// shutting down stays listed this long, so a failover takes about this long plus a
    /// promotion (4 s: a failover's p99 within issue 19's 5 s; keepalives go every third
    /// of it, and a primary stops acknowledging a third before it ends).
    #[arg(long, default_value_t = 4000, value_name = "MS")]
    cluster_lease_ms: u64,
    /// Slot migration: stored pairs per batch copied to the target region.
    #[arg(long, default_value_t = 256, value_name = "N")]
    cluster_migrate_batch: usize,
    /// Slot migration: pause after each batch (for tests and to spare a busy server).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    cluster_migrate_pause_ms: u64,
    /// Split a region this server leads in two (the upper half of its slots into a new
    /// region on the same servers, moved online) once its live data passes this size;
    /// 0: never (split by hand with `tucana cluster split`).
    #[arg(long, default_value_t = 8192, value_name = "MIB")]
    cluster_split_mib: u64,
    /// As the cluster's coordinator, hand regions over (planned failovers) to even out how
    /// many slots each server leads once every backup is in sync, e.g. to a restarted
    /// server after its regions failed over. Off by default: with --durability buffered,
    /// a failover soon after a handoff lost up to a second of writes (DESIGN.md).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    cluster_balance_leaders: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReplAckArg {
    /// A backup acknowledges what it received (in its page cache).
    Received,
    /// A backup acknowledges only what it synced.
    Durable,
}

fn resolve(bind: &str, port: u16) -> Result<SocketAddr, CliError> {
    if let Ok(ip) = bind.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (bind, port)
        .to_socket_addrs()
        .map_err(|e| CliError::msg(format!("cannot resolve --bind {bind}: {e}")))?
        .next()
        .ok_or_else(|| CliError::msg(format!("--bind {bind} resolves to no address")))
}

/// Where a server on the volume at `path` keeps its cluster id: next to the volume.
fn cluster_id_file(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".cluster-id");
    PathBuf::from(name)
}

impl ServeArgs {
    fn cluster(&self, path: &Path) -> Option<ClusterConfig> {
        let name = self.cluster_name.clone()?;
        Some(ClusterConfig {
            etcd: self.cluster_etcd.clone(),
            name,
            announce: self.cluster_announce.clone(),
            id_file: cluster_id_file(path),
            lease_ttl: Duration::from_millis(self.cluster_lease_ms),
            migrate_batch: self.cluster_migrate_batch.max(1),
            migrate_pause: Duration::from_millis(self.cluster_migrate_pause_ms),
            split_bytes: self.cluster_split_mib.saturating_mul(1 << 20),
            balance_leaders: self.cluster_balance_leaders,
        })
    }

    fn config(&self, path: &Path) -> Result<ServerConfig, CliError> {
        let listen = resolve(&self.bind, self.port)?;
        let pre_auth_bytes = self.pre_auth_max_request_bytes;
        let config = ServerConfig {
            listen,
            metrics_listen: self.metrics_port.map(|p| SocketAddr::new(listen.ip(), p)),
            durability: match self.durability {
                DurabilityArg::Sync => DurabilityMode::Sync,
                DurabilityArg::Buffered => DurabilityMode::Buffered,
            },
            requirepass: self.requirepass.clone(),
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(TlsFiles {
                    cert_chain: cert.clone(),
                    private_key: key.clone(),
                }),
                _ => None,
            },
            max_clients: self.max_clients,
            request_limits: RequestLimits {
                max_args: self.max_args,
                max_bulk_bytes: self.max_bulk_bytes,
                max_request_bytes: self.max_request_bytes,
                max_inline_bytes: RequestLimits::DEFAULT.max_inline_bytes,
            },
            pre_auth_limits: RequestLimits {
                max_bulk_bytes: RequestLimits::PRE_AUTH.max_bulk_bytes.min(pre_auth_bytes),
                max_request_bytes: pre_auth_bytes,
                max_inline_bytes: RequestLimits::PRE_AUTH.max_inline_bytes.min(pre_auth_bytes),
                ..RequestLimits::PRE_AUTH
            },
            idle_timeout: (self.idle_timeout > 0).then(|| Duration::from_secs(self.idle_timeout)),
            databases: self.databases,
            threads: self.threads.map(|n| n as usize),
            busy_poll: Duration::from_micros(self.busy_poll_us),
            replication: ReplicationConfig {
                server_id: self.server_id.clone(),
                backups: self.backups.clone(),
                listen_port: self.repl_port,
                ack_durable: self.repl_ack == ReplAckArg::Durable,
                ack_timeout: Duration::from_millis(self.repl_timeout_ms.max(1)),
                build_index: self.repl_build_index,
                password: self.repl_password.clone(),
                tls_ca: self.tls_ca_cert.clone(),
                catchup_bytes_per_sec: self.repl_catchup_bytes_per_sec,
                index_lag_max: Duration::from_millis(self.repl_index_lag_ms),
                index_lag_max_bytes: self.repl_index_lag_bytes,
            },
            cluster: self.cluster(path),
            enable_debug_command: self.enable_debug_command,
            enable_add_member_command: self.enable_add_member_command,
            enable_remove_member_command: self.enable_remove_member_command,
            enable_rebalance_command: self.enable_rebalance_command,
            notify_keyspace_events: self.notify_keyspace_events.clone(),
            ..ServerConfig::default()
        };
        // Refuse before touching the volume: a bad flag should not create one.
        config.validate().map_err(CliError::msg)?;
        Ok(config)
    }
}

/// What the start line says of replication.
fn describe_replication(config: &ServerConfig) -> String {
    let r = &config.replication;
    let mut out = String::new();
    if !r.backups.is_empty() {
        out.push_str(&format!(", replicating to {}", r.backups.join(", ")));
    }
    if let Some(port) = r.listen_port {
        out.push_str(&format!(", taking replicas on port {port}"));
    }
    if let Some(cluster) = &config.cluster {
        out.push_str(&format!(
            ", cluster {} through etcd {}",
            cluster.name,
            cluster.etcd.join(",")
        ));
    }
    out
}

/// Refuses, naming the address, when one of the server's ports is taken, before the
/// volume is opened (or created): a second `tucana serve` on a busy port used to create
/// its volume, print "stopped", then `Address already in use` without the address.
/// A check, not a reservation: another program may still take a port before the server
/// binds it, which then fails the same way, naming the address too.
fn check_ports_free(config: &ServerConfig) -> Result<(), CliError> {
    let mut addrs = vec![("port", config.listen)];
    if let Some(metrics) = config.metrics_listen {
        addrs.push(("--metrics-port", metrics));
    }
    if let Some(port) = config.replication.listen_port {
        addrs.push(("--repl-port", SocketAddr::new(config.listen.ip(), port)));
    }
    for (what, addr) in addrs {
        if addr.port() == 0 {
            continue;
        }
        if let Err(e) = std::net::TcpListener::bind(addr) {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                " (another server listens there: stop it, or pick another with --port)"
            } else {
                ""
            };
            return Err(CliError::msg(format!(
                "cannot serve: {what} {addr} is not available: {e}{hint}"
            )));
        }
    }
    Ok(())
}

/// Serves the volume at `path` (with its further `members`, if any), opened with
/// `volume_options` (the member flags) applied.
pub fn run(
    path: &Path,
    members: &[std::path::PathBuf],
    volume_options: &dyn Fn(tucana::Options) -> tucana::Options,
    args: &ServeArgs,
) -> Result<Outcome, CliError> {
    let config = args.config(path)?;
    check_ports_free(&config)?;
    let listen = config.listen;
    let options = volume_options(tucana::Database::builder())
        .flush_interval(Some(Duration::from_millis(args.flush_interval_ms.max(1))))
        .reorganise_after_idle(args.reorganise_after_idle_ms.map(Duration::from_millis));
    let db = crate::open_members_with(path, members, true, options)?;
    let durability = config.durability.name();
    let tls = if config.tls.is_some() { ", TLS" } else { "" };
    let replication = describe_replication(&config);
    let started = std::cell::Cell::new(false);
    let served = tucana_server::serve_until_signal(db.clone(), config, |addr, metrics| {
        started.set(true);
        eprintln!(
            "tucana serve: {} on {addr} ({durability} durability{tls}){replication}{}",
            path.display(),
            metrics
                .map(|m| format!(", metrics at http://{m}/metrics"))
                .unwrap_or_default()
        );
    });
    let result = match served {
        Err(e) => Err(CliError::msg(format!("cannot serve on {listen}: {e}"))),
        Ok(Err(e)) => Err(CliError::from(e).context("final commit")),
        Ok(Ok(())) => Ok(Outcome::Done),
    };
    let closed = db.close();
    if started.get() {
        eprintln!("tucana serve: stopped");
    }
    match (result, closed) {
        (Ok(outcome), Ok(())) => Ok(outcome),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(CliError::from(e).context("closing the volume")),
    }
}
