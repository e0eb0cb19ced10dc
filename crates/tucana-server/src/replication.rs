//! The server's replication: the primary side (this server's keyspaces shipped to its
//! backups, writes waiting for their acknowledgements) and the backup side (other
//! servers' keyspaces taken as replicas), both from `tucana-replication`, and what the
//! server's commands ask of them (`WAIT`, `REPLICAOF NO ONE`, `INFO replication`).
//!
//! Owns: starting and stopping them from the configuration, TLS for them (the server's
//! certificate; the configured roots to trust backups), the promotion of every replica.
//! Does not own: the protocol or the shipping (`tucana-replication`), when a write
//! waits (`syncer`, `connection`).
//!
//! Thread-safety: `Replication` is `Send + Sync`; waiting for acknowledgements blocks,
//! so it is called only from threads that may block (the syncer's acker, the blocking
//! pool).

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use tucana::replication::LogPosition;
use tucana::Database;
use tucana_replication::{
    Acceptor, AckError, Backup, BackupConfig, BackupCounters, BackupStatus, Dialer, Primary,
    PrimaryConfig,
};

use crate::config::ServerConfig;

/// Why a write's acknowledgement by the backups did not come, as its reply says.
pub fn ack_error_text(e: &AckError) -> String {
    match e {
        AckError::NoReplicas { acked, needed } => format!(
            "NOREPLICAS Not enough good replicas to write. ({acked} of {needed} backups acknowledged the write in time; it is applied here)"
        ),
        AckError::Fenced { term } => format!(
            "READONLY this server is no longer the primary of this keyspace (a backup was promoted at term {term})"
        ),
    }
}

/// A gate's refusal of a write that is applied here: `READONLY` (applied, not
/// acknowledged) in place of a code that says the write was not applied.
fn applied_not_acknowledged(refusal: &str) -> String {
    if refusal.starts_with("MOVED ") || refusal.starts_with("CLUSTERDOWN ") {
        format!("READONLY this server no longer leads this slot ({refusal}): the write is applied here but not acknowledged")
    } else {
        refusal.to_string()
    }
}

/// Whether this server may acknowledge a write to a keyspace (cluster mode: its lease is
/// valid and the map still names it the region's primary); `Err` is the reply.
pub type AckGate = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

pub struct Replication {
    pub primary: Option<Primary>,
    pub backup: Option<Backup>,
    db: Database,
    /// Cluster mode: the backups come from the map (`set_backups`), so writes always
    /// wait for them, even while there are none.
    follows_map: bool,
    gate: OnceLock<AckGate>,
}

impl Replication {
    /// Starts what `config.replication` asks for; `None` when it asks for nothing.
    pub fn start(
        db: &Database,
        config: &ServerConfig,
        resp_addr: SocketAddr,
    ) -> io::Result<Option<Replication>> {
        let rc = &config.replication;
        let follows_map = config.cluster.is_some();
        if !rc.enabled() && !follows_map {
            return Ok(None);
        }
        let id = rc
            .server_id
            .clone()
            .unwrap_or_else(|| resp_addr.to_string());
        let password = rc
            .password
            .clone()
            .or_else(|| config.requirepass.clone())
            .unwrap_or_default();
        let backup = match rc.listen_port {
            None => None,
            Some(port) => {
                let acceptor = match &config.tls {
                    None => Acceptor::Tcp,
                    Some(files) => Acceptor::Tls(crate::tls::acceptor(files)?),
                };
                let listen = SocketAddr::new(config.listen.ip(), port).to_string();
                Some(Backup::start(
                    db.clone(),
                    &listen,
                    BackupConfig {
                        id: id.clone(),
                        password: password.clone(),
                        build_index: rc.build_index,
                        acceptor,
                    },
                )?)
            }
        };
        let primary = if rc.backups.is_empty() && !follows_map {
            None
        } else {
            let dialer = match (&config.tls, &rc.tls_ca) {
                (Some(_), Some(ca)) => Dialer::Tls(crate::tls::client_config(ca)?),
                _ => Dialer::Tcp,
            };
            Some(Primary::start(
                db.clone(),
                PrimaryConfig {
                    id,
                    backups: rc.backups.clone(),
                    password,
                    ack_durable: rc.ack_durable,
                    ack_timeout: rc.ack_timeout,
                    catchup_bytes_per_sec: rc.catchup_bytes_per_sec,
                    index_lag_max: rc.index_lag_max,
                    index_lag_max_bytes: rc.index_lag_max_bytes,
                    dialer,
                },
            )?)
        };
        Ok(Some(Replication {
            primary,
            backup,
            db: db.clone(),
            follows_map,
            gate: OnceLock::new(),
        }))
    }

    /// Whether writes wait for backups (this server is a primary with backups, or in
    /// cluster mode, where the map gives and takes backups).
    pub fn has_backups(&self) -> bool {
        self.follows_map || self.primary.as_ref().is_some_and(|p| p.has_backups())
    }

    /// Cluster mode: what a write's acknowledgement must also pass (set once).
    pub fn set_ack_gate(&self, gate: AckGate) {
        let _ = self.gate.set(gate);
    }

    /// Cluster mode: ship each keyspace to the backups the map names; see
    /// `Primary::set_backups`.
    pub fn set_backups(&self, backups: &BTreeMap<String, BTreeMap<String, u64>>) {
        if let Some(p) = &self.primary {
            p.set_backups(backups);
        }
    }

    /// See `Primary::stop_shipping`.
    pub fn stop_shipping(&self, name: &str) {
        if let Some(p) = &self.primary {
            p.stop_shipping(name);
        }
    }

    /// `SAVE`: see `Primary::ship_index_now`.
    pub fn ship_index_now(&self) {
        if let Some(p) = &self.primary {
            p.ship_index_now();
        }
    }

    /// Whether the backup at `addr` holds every acknowledged write of keyspace `name`
    /// (`Primary::in_sync`); false on a server that ships nothing.
    pub fn in_sync(&self, addr: &str, name: &str) -> bool {
        self.primary.as_ref().is_some_and(|p| p.in_sync(addr, name))
    }

    /// Wakes the shippers: writes were made.
    pub fn notify_write(&self) {
        if let Some(p) = &self.primary {
            p.notify_write();
        }
    }

    /// Blocks until every backup acknowledged keyspace `name`'s log up to `position`,
    /// then asks the gate (cluster mode) whether this server may still acknowledge it;
    /// `Err` is the write's reply.
    ///
    /// The write is applied here whatever the answer, and may have reached a backup that
    /// is the region's primary now, so a refusal is never one that says "not applied":
    /// the gate's `MOVED` or `CLUSTERDOWN` becomes `READONLY` (applied, not acknowledged,
    /// which clients and the fault campaign take as indeterminate). Answered `MOVED`, a
    /// write acknowledged by its backup just as the map moved the region was counted as
    /// never applied, and another client had read it (M10, seed 28).
    pub fn wait_acked(&self, name: &str, position: LogPosition) -> Result<(), String> {
        let gate = |name: &str| match self.gate.get() {
            Some(gate) => gate(name).map_err(|refusal| applied_not_acknowledged(&refusal)),
            None => Ok(()),
        };
        if let Some(p) = &self.primary {
            if let Err(e) = p.wait_acked(name, position) {
                // Fenced by a promoted backup: in cluster mode the map may say more.
                if matches!(e, AckError::Fenced { .. }) {
                    gate(name)?;
                }
                return Err(ack_error_text(&e));
            }
        }
        gate(name)
    }

    /// A read of keyspace `name` that saw its log up to `position` may be answered now:
    /// `Some(Ok)` if every backup acknowledged `position` and the gate (cluster mode)
    /// passes, `Some(Err(reply))` if the gate refuses, `None` if the read must wait for
    /// the acknowledgement (`wait_acked`) first.
    pub fn read_answerable(&self, name: &str, position: LogPosition) -> Option<Result<(), String>> {
        // No primary side: no backup holds anything, the read waits for a local sync.
        if !self.primary.as_ref()?.acked_by_all(name, position) {
            return None;
        }
        Some(match self.gate.get() {
            Some(gate) => gate(name),
            None => Ok(()),
        })
    }

    /// `WAIT`: how many backups acknowledged `position` within `timeout` (0 without any).
    pub fn wait_count(
        &self,
        name: &str,
        position: LogPosition,
        needed: usize,
        timeout: Duration,
    ) -> usize {
        match &self.primary {
            Some(p) => p.wait_count(name, position, needed, timeout),
            None => 0,
        }
    }

    /// `REPLICAOF NO ONE`: see [`promote_replicas`].
    pub fn promote_all(&self) -> tucana::Result<Vec<String>> {
        promote_replicas(&self.db)
    }

    /// The primary's view of each backup (empty on a server with no backups).
    pub fn backup_status(&self) -> Vec<BackupStatus> {
        self.primary
            .as_ref()
            .map(|p| p.status())
            .unwrap_or_default()
    }

    /// The backup link's counters, on a server that listens for a primary.
    pub fn backup_counters(&self) -> Option<BackupCounters> {
        self.backup.as_ref().map(|b| b.counters())
    }

    /// The `INFO replication` fields (Redis's names where they exist).
    pub fn info_lines(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        let mut put = |k: String, v: String| out.push((k, v));
        let replicas = self.db.replica_names();
        let role = if self.primary.is_some() || replicas.is_empty() {
            "master"
        } else {
            "slave"
        };
        put("role".into(), role.into());
        let status = self.backup_status();
        put(
            "connected_slaves".into(),
            status.iter().filter(|b| b.connected).count().to_string(),
        );
        for (i, b) in status.iter().enumerate() {
            let (ip, port) = b.addr.rsplit_once(':').unwrap_or((&b.addr, "0"));
            let lag: u64 = b.regions.iter().map(|r| r.lag_bytes).sum();
            let offset: u64 = b.regions.iter().map(|r| r.acked.offset).sum();
            let lag_seconds = b.regions.iter().map(|r| r.lag).max().unwrap_or_default();
            // The oldest of its regions' commits the backup applied (folding lets it lag).
            let applied = b.regions.iter().map(|r| r.applied_epoch).min().unwrap_or(0);
            put(
                format!("slave{i}"),
                format!(
                    "ip={ip},port={port},state={},offset={offset},lag={},lag_bytes={lag},applied_commit={applied},shipped_log_bytes={},shipped_index_bytes={}",
                    if b.connected { "online" } else { "connecting" },
                    lag_seconds.as_secs(),
                    b.shipped_log_bytes,
                    b.shipped_index_bytes
                ),
            );
            if let Some(e) = &b.last_error {
                put(format!("slave{i}_last_error"), e.replace(['\r', '\n'], " "));
            }
            for r in &b.regions {
                // Positions are (segment order, offset): what the backup acknowledged
                // and where the region's log ends here.
                put(
                    format!("tucana_slave{i}_{}", r.name),
                    format!(
                        "acked={}:{},end={}:{},lag_bytes={},applied_commit={}",
                        r.acked.order,
                        r.acked.offset,
                        r.end.order,
                        r.end.offset,
                        r.lag_bytes,
                        r.applied_epoch
                    ),
                );
            }
        }
        if let Some(c) = self.backup_counters() {
            put("master_host".into(), c.primary);
            put(
                "master_link_status".into(),
                if c.connected { "up" } else { "down" }.into(),
            );
            put(
                "tucana_received_log_bytes".into(),
                c.received_log_bytes.to_string(),
            );
            put(
                "tucana_received_index_bytes".into(),
                c.received_index_bytes.to_string(),
            );
            put(
                "tucana_commits_applied".into(),
                c.commits_applied.to_string(),
            );
            put("tucana_log_cpu_ns".into(), c.log_cpu_ns.to_string());
            put("tucana_index_cpu_ns".into(), c.index_cpu_ns.to_string());
            put("tucana_link_connections".into(), c.connections.to_string());
            if let Some(e) = &c.last_error {
                // Why the last link from a primary ended (a backup that keeps refusing or
                // failing a primary otherwise shows only `master_link_status:down`).
                put(
                    "tucana_link_last_error".into(),
                    e.replace(['\r', '\n'], " "),
                );
            }
        }
        out.extend(replica_info_lines(&self.db));
        out
    }

    /// Stops shipping and listening, waiting for both a little. Blocks: the server calls
    /// it on a blocking thread at shutdown.
    pub fn stop(&self) {
        if let Some(p) = &self.primary {
            p.stop();
        }
        if let Some(b) = &self.backup {
            b.stop();
        }
    }
}

/// Promotes every replica `db` holds to a keyspace of its own, at its term plus one (a
/// primary of a lower term is refused from then on), and returns the names promoted:
/// what `REPLICAOF NO ONE` does on a server and `tucana replication promote` on a
/// volume that is not served.
pub fn promote_replicas(db: &Database) -> tucana::Result<Vec<String>> {
    let mut promoted = Vec::new();
    for name in db.replica_names() {
        if let Some(replica) = db.open_replica(&name) {
            let term = replica.state().term + 1;
            replica.promote(term)?;
            promoted.push(name);
        }
    }
    Ok(promoted)
}

/// Cluster mode: makes the replica `name` this server's keyspace at `term` (the region's
/// new epoch), if this volume holds that replica; what it started from and what replay
/// found, for the log (`None`: no such replica).
pub fn promote_replica(db: &Database, name: &str, term: u64) -> tucana::Result<Option<String>> {
    match db.open_replica(name) {
        Some(replica) => {
            let state = replica.state();
            let term = term.max(state.term + 1);
            let (_, replay) = replica.promote_reporting(term)?;
            let copies: Vec<String> = state
                .segments
                .iter()
                .map(|(order, origin, held)| format!("{order}@{}:{held}", origin.0))
                .collect();
            Ok(Some(format!(
                "from the primary's commit {} and segment copies [{}] (order@origin:bytes): {replay}",
                state.upstream_epoch,
                copies.join(" ")
            )))
        }
        None => Ok(None),
    }
}

/// One `INFO replication` field per replica `db` holds: `tucana_replica_<name>` with its
/// term, the primary's commit it last applied and its segment count.
pub fn replica_info_lines(db: &Database) -> Vec<(String, String)> {
    db.replica_names()
        .into_iter()
        .filter_map(|name| {
            let s = db.open_replica(&name)?.state();
            Some((
                format!("tucana_replica_{name}"),
                format!(
                    "term={},upstream_commit={},segments={}",
                    s.term,
                    s.upstream_epoch,
                    s.segments.len()
                ),
            ))
        })
        .collect()
}

#[cfg(test)]
mod gate_tests {
    use super::*;

    #[test]
    fn a_refused_write_that_is_applied_is_never_answered_as_not_applied() {
        let moved = applied_not_acknowledged("MOVED 3999 127.0.0.1:7001");
        assert!(moved.starts_with("READONLY "), "{moved}");
        assert!(moved.contains("MOVED 3999 127.0.0.1:7001"), "{moved}");
        let down = applied_not_acknowledged("CLUSTERDOWN Hash slot not served");
        assert!(down.starts_with("READONLY "), "{down}");
        let readonly = "READONLY this server's cluster lease is not valid";
        assert_eq!(applied_not_acknowledged(readonly), readonly);
    }
}
