//! A phase's figures from the cluster's samples before and after it (each taken once the
//! backups had caught up with a commit, see `Cluster::settle`): the primary's CPU and
//! device bytes, each backup's CPU and its split, device bytes, log and index bytes
//! received and the network bytes of its link, and the ratios the document compares
//! (backup CPU per replicated byte, bytes per user byte, network bytes per log byte).
//!
//! A *replicated byte* is a log byte a backup received (`tucana_received_log_bytes`). A
//! backup's CPU is its process's user + system time, all threads; `log` is the thread CPU
//! it spent storing shipped log bytes (a build-index backup: applying their records to
//! its own index and log; the backup times one log frame in 16 and scales it), `index`
//! the thread CPU of applying shipped commits (rewriting and writing nodes), `other` the
//! rest: receiving and decoding frames, acknowledging, syncing, its own commits and
//! collector. Network bytes are the TCP payload bytes of the replication connection,
//! both directions (`ss`), or, when `ss` cannot tell, the log and index bytes the
//! primary says it shipped.
//!
//! Owns the arithmetic (pure, unit-tested); readings are `sample`'s. Thread-safe.

use serde_json::{json, Map, Value};

use super::cluster::Setup;
use super::sample::{ClusterSample, LinkSample, NodeSample};
use crate::sys;

/// What one phase did, for the ratios.
pub(super) struct Phase<'a> {
    pub(super) setup: Setup,
    pub(super) before: &'a ClusterSample,
    pub(super) after: &'a ClusterSample,
    /// Bytes of keys and values the clients wrote.
    pub(super) user_write_bytes: u64,
    /// Operations (requests) of the phase.
    pub(super) ops: u64,
}

/// `after - before` of a counter both samples have.
fn delta(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

fn cpu_seconds(before: &NodeSample, after: &NodeSample) -> Option<f64> {
    delta(before.cpu_ticks, after.cpu_ticks).map(|t| t as f64 / sys::clock_ticks_per_sec() as f64)
}

fn field_delta(before: &NodeSample, after: &NodeSample, name: &str) -> Option<u64> {
    delta(before.field(name), after.field(name))
}

/// `a / b`, `None` when `b` is 0.
fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// One backup's figures over the phase.
#[derive(Debug, Default, PartialEq)]
pub(super) struct BackupFigures {
    pub(super) cpu_s: f64,
    pub(super) log_cpu_s: f64,
    pub(super) index_cpu_s: f64,
    pub(super) received_log_bytes: u64,
    pub(super) received_index_bytes: u64,
    pub(super) commits_applied: u64,
    pub(super) device_read_bytes: u64,
    pub(super) device_write_bytes: u64,
    pub(super) shipped_log_bytes: u64,
    pub(super) shipped_index_bytes: u64,
    /// TCP payload bytes primary → backup and back; `None` when `ss` could not tell.
    pub(super) tcp: Option<(u64, u64)>,
}

impl BackupFigures {
    fn of(before: (&NodeSample, &LinkSample), after: (&NodeSample, &LinkSample)) -> Self {
        let (b, a) = (before.0, after.0);
        let ns = |name| field_delta(b, a, name).unwrap_or(0) as f64 / 1e9;
        let io = |f: fn(&sys::ProcessIo) -> u64| delta(b.io.as_ref().map(f), a.io.as_ref().map(f));
        let tcp = match (before.1.tcp, after.1.tcp) {
            // The same connection at both ends of the phase: a reconnection resets counts.
            (Some(x), Some(y)) if x.local_port == y.local_port => Some((
                y.to_backup.saturating_sub(x.to_backup),
                y.from_backup.saturating_sub(x.from_backup),
            )),
            _ => None,
        };
        BackupFigures {
            cpu_s: cpu_seconds(b, a).unwrap_or(0.0),
            log_cpu_s: ns("tucana_log_cpu_ns"),
            index_cpu_s: ns("tucana_index_cpu_ns"),
            received_log_bytes: field_delta(b, a, "tucana_received_log_bytes").unwrap_or(0),
            received_index_bytes: field_delta(b, a, "tucana_received_index_bytes").unwrap_or(0),
            commits_applied: field_delta(b, a, "tucana_commits_applied").unwrap_or(0),
            device_read_bytes: io(|io| io.read_bytes).unwrap_or(0),
            device_write_bytes: io(|io| io.write_bytes).unwrap_or(0),
            shipped_log_bytes: after
                .1
                .shipped_log_bytes
                .saturating_sub(before.1.shipped_log_bytes),
            shipped_index_bytes: after
                .1
                .shipped_index_bytes
                .saturating_sub(before.1.shipped_index_bytes),
            tcp,
        }
    }

    /// Network bytes of the link: TCP both ways, else what the primary shipped.
    fn network_bytes(&self) -> u64 {
        match self.tcp {
            Some((to, from)) => to + from,
            None => self.shipped_log_bytes + self.shipped_index_bytes,
        }
    }

    fn to_json(&self, mode: &str) -> Value {
        json!({
            "mode": mode,
            "cpu_s": self.cpu_s,
            "log_cpu_s": self.log_cpu_s,
            "index_cpu_s": self.index_cpu_s,
            "other_cpu_s": (self.cpu_s - self.log_cpu_s - self.index_cpu_s).max(0.0),
            "received_log_bytes": self.received_log_bytes,
            "received_index_bytes": self.received_index_bytes,
            "commits_applied": self.commits_applied,
            "device_read_bytes": self.device_read_bytes,
            "device_write_bytes": self.device_write_bytes,
            "shipped_log_bytes": self.shipped_log_bytes,
            "shipped_index_bytes": self.shipped_index_bytes,
            "network_to_backup_bytes": self.tcp.map(|t| t.0),
            "network_from_backup_bytes": self.tcp.map(|t| t.1),
            "network_bytes": self.network_bytes(),
        })
    }
}

/// The record fields of a phase: the primary's, each backup's (`backups`), and the
/// ratios over all backups.
pub(super) fn phase_fields(phase: &Phase) -> Map<String, Value> {
    let mut out = Map::new();
    let (b, a) = (&phase.before.primary, &phase.after.primary);
    let cpu_s = cpu_seconds(b, a);
    out.insert("primary_cpu_s".into(), json!(cpu_s));
    let io = |f: fn(&sys::ProcessIo) -> u64| delta(b.io.as_ref().map(f), a.io.as_ref().map(f));
    out.insert(
        "primary_device_read_bytes".into(),
        json!(io(|io| io.read_bytes)),
    );
    out.insert(
        "primary_device_write_bytes".into(),
        json!(io(|io| io.write_bytes)),
    );
    for (name, field) in [
        ("primary_engine_bytes_written", "disk_bytes_written"),
        ("primary_commits", "commits"),
        ("primary_syncs", "syncs"),
    ] {
        out.insert(name.into(), json!(field_delta(b, a, field)));
    }
    out.insert(
        "primary_space_used_bytes".into(),
        json!(a.field("space_used_bytes")),
    );
    out.insert("user_write_bytes".into(), json!(phase.user_write_bytes));
    if phase.setup.backups() == 0 {
        return out;
    }
    let mode = if phase.setup.builds_index() {
        "build-index"
    } else {
        "send-index"
    };
    let backups: Vec<BackupFigures> = (0..phase.setup.backups())
        .map(|i| {
            let at = |s: &'_ ClusterSample| -> (NodeSample, LinkSample) {
                (
                    s.backups.get(i).cloned().unwrap_or_default(),
                    s.links.get(i).cloned().unwrap_or_default(),
                )
            };
            let (before, after) = (at(phase.before), at(phase.after));
            BackupFigures::of((&before.0, &before.1), (&after.0, &after.1))
        })
        .collect();
    out.insert(
        "backups".into(),
        Value::Array(backups.iter().map(|f| f.to_json(mode)).collect()),
    );
    totals(&mut out, &backups, phase);
    out
}

/// The ratios over all backups of a phase (sums over sums, so each backup weighs its bytes).
fn totals(out: &mut Map<String, Value>, backups: &[BackupFigures], phase: &Phase) {
    let n = backups.len() as f64;
    let sum = |f: &dyn Fn(&BackupFigures) -> f64| backups.iter().map(f).sum::<f64>();
    let log = sum(&|f| f.received_log_bytes as f64);
    let shipped_log = sum(&|f| f.shipped_log_bytes as f64);
    let cpu = sum(&|f| f.cpu_s);
    let log_cpu = sum(&|f| f.log_cpu_s);
    let index_cpu = sum(&|f| f.index_cpu_s);
    let user = phase.user_write_bytes as f64 * n;
    let network = sum(&|f| f.network_bytes() as f64);
    let mut put = |name: &str, value: Option<f64>| {
        out.insert(name.into(), json!(value));
    };
    put("log_bytes_per_backup", Some(log / n));
    put("backup_cpu_ns_per_log_byte", ratio(cpu * 1e9, log));
    put("backup_log_cpu_ns_per_log_byte", ratio(log_cpu * 1e9, log));
    put(
        "backup_index_cpu_ns_per_log_byte",
        ratio(index_cpu * 1e9, log),
    );
    put(
        "backup_other_cpu_ns_per_log_byte",
        ratio((cpu - log_cpu - index_cpu).max(0.0) * 1e9, log),
    );
    put(
        "backup_cpu_us_per_op",
        ratio(cpu * 1e6 / n, phase.ops as f64),
    );
    put(
        "backup_device_write_bytes_per_user_byte",
        ratio(sum(&|f| f.device_write_bytes as f64), user),
    );
    put(
        "backup_device_read_bytes_per_user_byte",
        ratio(sum(&|f| f.device_read_bytes as f64), user),
    );
    put(
        "backup_device_read_bytes",
        Some(sum(&|f| f.device_read_bytes as f64) / n),
    );
    put("network_bytes_per_log_byte", ratio(network, shipped_log));
    put("network_bytes_per_user_byte", ratio(network, user));
    put(
        "index_bytes_per_log_byte",
        ratio(sum(&|f| f.shipped_index_bytes as f64), shipped_log),
    );
    let source = if backups.iter().all(|f| f.tcp.is_some()) {
        "tcp"
    } else {
        "shipped"
    };
    out.insert("network_source".into(), json!(source));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::sample::TcpBytes;
    use std::collections::BTreeMap;

    fn node(ticks: u64, fields: &[(&str, u64)], read: u64, write: u64) -> NodeSample {
        NodeSample {
            cpu_ticks: Some(ticks),
            io: Some(sys::ProcessIo {
                read_bytes: read,
                write_bytes: write,
            }),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect::<BTreeMap<_, _>>(),
            replica_commits: Vec::new(),
        }
    }

    fn link(log: u64, index: u64, to: u64) -> LinkSample {
        LinkSample {
            online: true,
            lag_bytes: 0,
            shipped_log_bytes: log,
            shipped_index_bytes: index,
            tcp: Some(TcpBytes {
                local_port: 5,
                to_backup: to,
                from_backup: to / 100,
            }),
        }
    }

    #[test]
    fn backup_cpu_splits_and_ratios() {
        let hz = sys::clock_ticks_per_sec();
        let backup = |ticks, log_ns, index_ns, received| {
            node(
                ticks,
                &[
                    ("tucana_log_cpu_ns", log_ns),
                    ("tucana_index_cpu_ns", index_ns),
                    ("tucana_received_log_bytes", received),
                ],
                0,
                received,
            )
        };
        let before = ClusterSample {
            primary: node(0, &[("commits", 1)], 0, 0),
            backups: vec![backup(0, 0, 0, 0)],
            links: vec![link(0, 0, 0)],
        };
        // One second of backup CPU for 1e9 log bytes: 0.2 s storing log, 0.3 s index.
        let after = ClusterSample {
            primary: node(2 * hz, &[("commits", 3)], 0, 2_000_000_000),
            backups: vec![backup(hz, 200_000_000, 300_000_000, 1_000_000_000)],
            links: vec![link(1_000_000_000, 100_000_000, 1_100_000_000)],
        };
        let fields = phase_fields(&Phase {
            setup: Setup::SendIndex1,
            before: &before,
            after: &after,
            user_write_bytes: 500_000_000,
            ops: 1_000_000,
        });
        let f = |name: &str| fields[name].as_f64().unwrap();
        assert_eq!(f("primary_cpu_s"), 2.0);
        assert_eq!(fields["primary_commits"], 2);
        assert!((f("backup_cpu_ns_per_log_byte") - 1.0).abs() < 1e-9);
        assert!((f("backup_log_cpu_ns_per_log_byte") - 0.2).abs() < 1e-9);
        assert!((f("backup_index_cpu_ns_per_log_byte") - 0.3).abs() < 1e-9);
        assert!((f("backup_other_cpu_ns_per_log_byte") - 0.5).abs() < 1e-9);
        assert!((f("backup_cpu_us_per_op") - 1.0).abs() < 1e-9);
        assert!((f("backup_device_write_bytes_per_user_byte") - 2.0).abs() < 1e-9);
        assert_eq!(f("backup_device_read_bytes_per_user_byte"), 0.0);
        // TCP: 1.1e9 out and 1.1e7 back, over 1e9 log bytes.
        assert!((f("network_bytes_per_log_byte") - 1.111).abs() < 1e-9);
        assert!((f("index_bytes_per_log_byte") - 0.1).abs() < 1e-9);
        assert_eq!(fields["network_source"], "tcp");
        assert_eq!(fields["backups"][0]["mode"], "send-index");
    }

    #[test]
    fn a_new_connection_falls_back_to_shipped_bytes() {
        let mut before = ClusterSample {
            backups: vec![NodeSample::default()],
            links: vec![link(0, 0, 0)],
            ..ClusterSample::default()
        };
        let after = ClusterSample {
            backups: vec![NodeSample::default()],
            links: vec![link(100, 30, 999)],
            ..ClusterSample::default()
        };
        before.links[0].tcp.as_mut().unwrap().local_port = 6;
        let fields = phase_fields(&Phase {
            setup: Setup::BuildIndex1,
            before: &before,
            after: &after,
            user_write_bytes: 65,
            ops: 1,
        });
        assert_eq!(fields["network_source"], "shipped");
        assert_eq!(fields["network_bytes_per_user_byte"].as_f64(), Some(2.0));
        assert_eq!(fields["backups"][0]["mode"], "build-index");
        assert!(phase_fields(&Phase {
            setup: Setup::Unreplicated,
            before: &before,
            after: &after,
            user_write_bytes: 65,
            ops: 1,
        })
        .get("backups")
        .is_none());
    }
}
