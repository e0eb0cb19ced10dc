//! Server counters, and the two ways they are read: the `INFO` text (Redis's sections,
//! filled from these counters and the engine's `Stats`) and the Prometheus text format
//! served over HTTP.
//!
//! Counters are relaxed atomics: each is exact, a reading of several is not a consistent
//! snapshot (as in Redis). The per-command ones are counted per batch in a [`Tally`]
//! and added at the batch's end. Thread-safe.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::commands::{command_name, REDIS_COMPAT_VERSION};
use crate::state::ServerState;
use crate::store::keyspace_name;

/// Everything the server counts.
pub struct Metrics {
    pub connections_received: AtomicU64,
    pub connections_rejected: AtomicU64,
    pub connected_clients: AtomicU64,
    commands_by_index: Vec<AtomicU64>,
    pub error_replies: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub idle_timeouts: AtomicU64,
    pub auth_failures: AtomicU64,
    pub keyspace_hits: AtomicU64,
    pub keyspace_misses: AtomicU64,
    pub net_input_bytes: AtomicU64,
    pub net_output_bytes: AtomicU64,
}

impl Metrics {
    /// Counters for a server whose command table has `commands` entries.
    pub fn new(commands: usize) -> Metrics {
        Metrics {
            connections_received: AtomicU64::new(0),
            connections_rejected: AtomicU64::new(0),
            connected_clients: AtomicU64::new(0),
            commands_by_index: (0..commands).map(|_| AtomicU64::new(0)).collect(),
            error_replies: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            idle_timeouts: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            keyspace_hits: AtomicU64::new(0),
            keyspace_misses: AtomicU64::new(0),
            net_input_bytes: AtomicU64::new(0),
            net_output_bytes: AtomicU64::new(0),
        }
    }
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Metrics {
    pub fn count_command(&self, index: usize) {
        add(&self.commands_by_index[index], 1);
    }

    /// Adds what a batch counted locally (see [`Tally`]).
    pub fn add_tally(&self, tally: &Tally) {
        for &(index, n) in &tally.commands {
            add(&self.commands_by_index[index], n);
        }
        for (counter, n) in [
            (&self.error_replies, tally.errors),
            (&self.keyspace_hits, tally.hits),
            (&self.keyspace_misses, tally.misses),
        ] {
            if n > 0 {
                add(counter, n);
            }
        }
    }

    pub fn count_lookup(&self, hit: bool) {
        add(
            if hit {
                &self.keyspace_hits
            } else {
                &self.keyspace_misses
            },
            1,
        );
    }

    pub fn count_auth_failure(&self) {
        add(&self.auth_failures, 1);
    }

    pub fn connected_clients(&self) -> u64 {
        get(&self.connected_clients)
    }

    pub fn commands_processed(&self) -> u64 {
        self.commands_by_index.iter().map(get).sum()
    }
}

/// Counts of one pipelined batch, added to [`Metrics`] once at its end: the counters are
/// state by every connection, and an atomic add per command on a cache line that the
/// other cores also write costs more than the command's own bookkeeping.
#[derive(Debug, Default)]
pub struct Tally {
    /// (command index, count); a batch rarely has more than a couple of kinds.
    commands: Vec<(usize, u64)>,
    errors: u64,
    hits: u64,
    misses: u64,
}

impl Tally {
    pub fn command(&mut self, index: usize, n: u64) {
        match self.commands.iter_mut().find(|(i, _)| *i == index) {
            Some((_, count)) => *count += n,
            None => self.commands.push((index, n)),
        }
    }

    pub fn error(&mut self) {
        self.errors += 1;
    }

    /// Adds `other`'s counts of errors and lookups (not its commands).
    pub fn merge(&mut self, other: &Tally) {
        self.errors += other.errors;
        self.hits += other.hits;
        self.misses += other.misses;
    }

    pub fn lookup(&mut self, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }
}

/// Resident set size of this process in bytes, where the OS tells it.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The `INFO` text: the sections asked for (all when none, or `all`/`everything`).
pub fn info_text(state: &ServerState, sections: &[String], connected: u64) -> String {
    let want = |name: &str| {
        sections.is_empty()
            || sections
                .iter()
                .any(|s| s == name || s == "all" || s == "everything" || s == "default")
    };
    let m = &state.metrics;
    let stats = state.store.db.stats();
    let config = &state.config;
    let uptime = state.started.elapsed();
    let mut out = String::new();
    let mut section = |title: &str, lines: Vec<(&str, String)>| {
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        let _ = write!(out, "# {title}\r\n");
        for (k, v) in lines {
            let _ = write!(out, "{k}:{v}\r\n");
        }
    };
    if want("server") {
        section(
            "Server",
            vec![
                ("redis_version", REDIS_COMPAT_VERSION.into()),
                ("tucana_version", env!("CARGO_PKG_VERSION").into()),
                ("redis_mode", "standalone".into()),
                ("os", std::env::consts::OS.into()),
                ("arch_bits", (usize::BITS).to_string()),
                ("process_id", std::process::id().to_string()),
                ("tcp_port", state.local_port.to_string()),
                ("connection_threads", state.threads.to_string()),
                (
                    "busy_poll_us",
                    state.config.busy_poll.as_micros().to_string(),
                ),
                ("uptime_in_seconds", uptime.as_secs().to_string()),
                ("uptime_in_days", (uptime.as_secs() / 86_400).to_string()),
            ],
        );
    }
    if want("clients") {
        section(
            "Clients",
            vec![
                ("connected_clients", connected.to_string()),
                ("maxclients", config.max_clients.to_string()),
                ("blocked_clients", "0".into()),
            ],
        );
    }
    if want("memory") {
        let rss = resident_bytes().unwrap_or(0);
        section(
            "Memory",
            vec![
                // The index is what the store keeps in memory; values live on the device.
                ("used_memory", stats.index_bytes.to_string()),
                ("used_memory_rss", rss.to_string()),
                ("index_bytes", stats.index_bytes.to_string()),
                ("index_nodes", stats.index_nodes.to_string()),
                ("maxmemory", "0".into()),
                ("maxmemory_policy", "noeviction".into()),
            ],
        );
    }
    if want("persistence") {
        section(
            "Persistence",
            vec![
                ("loading", "0".into()),
                ("durability", config.durability.name().into()),
                ("aof_enabled", "1".into()),
                ("rdb_bgsave_in_progress", "0".into()),
                ("commits", stats.commits.to_string()),
                ("commit_epoch", stats.commit_epoch.to_string()),
                ("syncs", stats.syncs.to_string()),
                ("live_log_bytes", stats.live_log_bytes.to_string()),
                ("dead_log_bytes", stats.dead_log_bytes.to_string()),
                ("volume_bytes", stats.volume_bytes.to_string()),
                ("space_used_bytes", stats.space_used_bytes.to_string()),
                ("disk_bytes_written", stats.bytes_written.to_string()),
                ("disk_bytes_read", stats.bytes_read.to_string()),
                ("gc_passes", stats.gc_passes.to_string()),
                ("gc_relocated_bytes", stats.gc_relocated_bytes.to_string()),
                ("gc_reclaimed_bytes", stats.gc_reclaimed_bytes.to_string()),
                ("gc_paced_ns", stats.gc_paced_ns.to_string()),
            ],
        );
    }
    if want("stats") {
        section(
            "Stats",
            vec![
                (
                    "total_connections_received",
                    get(&m.connections_received).to_string(),
                ),
                (
                    "total_commands_processed",
                    m.commands_processed().to_string(),
                ),
                ("total_net_input_bytes", get(&m.net_input_bytes).to_string()),
                (
                    "total_net_output_bytes",
                    get(&m.net_output_bytes).to_string(),
                ),
                (
                    "rejected_connections",
                    get(&m.connections_rejected).to_string(),
                ),
                ("keyspace_hits", get(&m.keyspace_hits).to_string()),
                ("keyspace_misses", get(&m.keyspace_misses).to_string()),
                ("total_error_replies", get(&m.error_replies).to_string()),
                ("protocol_errors", get(&m.protocol_errors).to_string()),
                ("idle_timeouts", get(&m.idle_timeouts).to_string()),
                ("auth_failures", get(&m.auth_failures).to_string()),
                ("expired_keys", "0".into()),
                ("evicted_keys", "0".into()),
            ],
        );
    }
    if want("keyspace") {
        let mut lines = Vec::new();
        let names: Vec<String> = (0..state.store.databases()).map(keyspace_name).collect();
        let mut labels = Vec::new();
        for ks in &stats.keyspaces {
            if let Some(index) = names.iter().position(|n| *n == ks.name) {
                if ks.keys > 0 {
                    labels.push((format!("db{index}"), ks.keys));
                }
            }
        }
        for (label, keys) in &labels {
            lines.push((label.as_str(), format!("keys={keys},expires=0,avg_ttl=0")));
        }
        section("Keyspace", lines);
    }
    out
}

/// The Prometheus text exposition of the server's counters and the engine's stats.
pub fn prometheus_text(state: &ServerState) -> String {
    let m = &state.metrics;
    let stats = state.store.db.stats();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = write!(
            out,
            "# HELP tucana_{name} {help}\n# TYPE tucana_{name} {kind}\ntucana_{name} {value}\n"
        );
    };
    metric(
        "uptime_seconds",
        "gauge",
        "Seconds since the server started.",
        state.started.elapsed().as_secs(),
    );
    metric(
        "connected_clients",
        "gauge",
        "Open client connections.",
        m.connected_clients(),
    );
    metric(
        "connections_received_total",
        "counter",
        "Connections accepted.",
        get(&m.connections_received),
    );
    metric(
        "connections_rejected_total",
        "counter",
        "Connections refused at the max clients limit.",
        get(&m.connections_rejected),
    );
    metric(
        "error_replies_total",
        "counter",
        "Error replies sent.",
        get(&m.error_replies),
    );
    metric(
        "protocol_errors_total",
        "counter",
        "Connections closed for a malformed or oversized request.",
        get(&m.protocol_errors),
    );
    metric(
        "idle_timeouts_total",
        "counter",
        "Connections closed for being idle.",
        get(&m.idle_timeouts),
    );
    metric(
        "auth_failures_total",
        "counter",
        "Failed AUTH attempts.",
        get(&m.auth_failures),
    );
    metric(
        "keyspace_hits_total",
        "counter",
        "Key lookups that found the key.",
        get(&m.keyspace_hits),
    );
    metric(
        "keyspace_misses_total",
        "counter",
        "Key lookups that did not find the key.",
        get(&m.keyspace_misses),
    );
    metric(
        "net_input_bytes_total",
        "counter",
        "Bytes read from clients.",
        get(&m.net_input_bytes),
    );
    metric(
        "net_output_bytes_total",
        "counter",
        "Bytes written to clients.",
        get(&m.net_output_bytes),
    );
    metric("keys", "gauge", "Live keys over all keyspaces.", stats.keys);
    metric(
        "index_bytes",
        "gauge",
        "Heap bytes of index nodes.",
        stats.index_bytes,
    );
    metric(
        "live_log_bytes",
        "gauge",
        "Log bytes reachable from an index.",
        stats.live_log_bytes,
    );
    metric(
        "dead_log_bytes",
        "gauge",
        "Log bytes overwritten or deleted.",
        stats.dead_log_bytes,
    );
    metric(
        "space_used_bytes",
        "gauge",
        "Bytes the volume file occupies on disk (holes excluded).",
        stats.space_used_bytes,
    );
    metric(
        "gc_passes_total",
        "counter",
        "Garbage-collection passes that did work since open.",
        stats.gc_passes,
    );
    metric(
        "gc_relocated_bytes_total",
        "counter",
        "Live log bytes garbage collection copied since open.",
        stats.gc_relocated_bytes,
    );
    metric(
        "gc_reclaimed_bytes_total",
        "counter",
        "Log bytes garbage collection gave back since open.",
        stats.gc_reclaimed_bytes,
    );
    metric(
        "volume_bytes",
        "gauge",
        "Length of the volume file.",
        stats.volume_bytes,
    );
    metric(
        "commits_total",
        "counter",
        "Volume commits since open.",
        stats.commits,
    );
    metric(
        "syncs_total",
        "counter",
        "Log flushes with fsync since open.",
        stats.syncs,
    );
    metric(
        "disk_written_bytes_total",
        "counter",
        "Bytes written to the volume since open.",
        stats.bytes_written,
    );
    out.push_str("# HELP tucana_commands_total Commands processed, by command.\n# TYPE tucana_commands_total counter\n");
    for (i, c) in m.commands_by_index.iter().enumerate() {
        let _ = writeln!(
            out,
            "tucana_commands_total{{cmd=\"{}\"}} {}",
            command_name(i),
            get(c)
        );
    }
    out
}
