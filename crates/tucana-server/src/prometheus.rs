//! The Prometheus endpoint: `GET /metrics` over plain HTTP on its own port, answered with
//! the server's counters and the engine's stats in the Prometheus text format.
//!
//! Owns the endpoint's listener loop, its minimal HTTP (one request per connection,
//! anything but `GET /metrics` is a 404) and the metric names and help texts. The
//! counters are `metrics`'; the `INFO` command reads the same ones (`commands/info.rs`).
//!
//! Thread-safety: runs on the listener's runtime, one task per HTTP connection; the
//! text is built on tokio's blocking pool (`Database::stats` may take locks).

use std::fmt::Write as _;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tucana::Stats;
use tucana_replication::BackupStatus;

use crate::cluster_report::{RegionReport, Role};
use crate::commands::command_name;
use crate::metrics::get;
use crate::replication::Replication;
use crate::state::{stopped, ServerState};

/// Serves `GET /metrics` in the Prometheus text format until shutdown; anything else is
/// a 404.
pub async fn serve_metrics(
    state: Arc<ServerState>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => return,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), answer_http(state, stream)).await;
        });
    }
}

async fn answer_http(state: Arc<ServerState>, mut stream: TcpStream) -> io::Result<()> {
    // The request head must fit in 8 KiB; the body (if any) is ignored.
    let mut head = Vec::with_capacity(1024);
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        if stream.read_buf(&mut head).await? == 0 {
            break;
        }
    }
    let first_line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let (status, body) = if first_line.starts_with(b"GET /metrics ") {
        let text = {
            let state = state.clone();
            tokio::task::spawn_blocking(move || prometheus_text(&state))
                .await
                .unwrap_or_default()
        };
        ("200 OK", text)
    } else {
        (
            "404 Not Found",
            "only GET /metrics is served here\n".to_string(),
        )
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

const GAUGE: &str = "gauge";
const COUNTER: &str = "counter";

/// One metric: name (after `tucana_`), type, help text, value.
type Metric = (&'static str, &'static str, &'static str, u64);

/// The Prometheus text exposition of the server's counters and the engine's stats.
fn prometheus_text(state: &ServerState) -> String {
    let stats = state.store.db.stats();
    let mut out = String::new();
    for (name, kind, help, value) in server_metrics(state)
        .into_iter()
        .chain(engine_metrics(&stats))
    {
        let _ = write!(
            out,
            "# HELP tucana_{name} {help}\n# TYPE tucana_{name} {kind}\ntucana_{name} {value}\n"
        );
    }
    out.push_str("# HELP tucana_commands_total Commands processed, by command.\n# TYPE tucana_commands_total counter\n");
    for (i, count) in state.metrics.commands_by_index().enumerate() {
        let _ = writeln!(
            out,
            "tucana_commands_total{{cmd=\"{}\"}} {}",
            command_name(i),
            count
        );
    }
    member_text(&stats, &mut out);
    if let Some(replication) = &state.replication {
        replication_text(replication, &mut out);
    }
    cluster_text(state, &mut out);
    out
}

/// Per member of a volume over several (labelled with its index and file): bytes written
/// and read, requests and bytes in flight through the member set, its write queue (jobs,
/// bytes), the time its queue sat empty while another member's did not, and its trims
/// (queued, issued, forced, bytes pending). Absent for a
/// single-file volume.
fn member_text(stats: &Stats, out: &mut String) {
    if stats.members.is_empty() {
        return;
    }
    type Field = fn(&tucana::volume::MemberStats) -> f64;
    let metrics: [(&str, &str, &str, Field); 12] = [
        (
            "member_written_bytes_total",
            COUNTER,
            "Bytes written to the member since open.",
            |m| m.bytes_written as f64,
        ),
        (
            "member_read_bytes_total",
            COUNTER,
            "Bytes read from the member with explicit reads since open.",
            |m| m.bytes_read as f64,
        ),
        (
            "member_in_flight_requests",
            GAUGE,
            "Requests issued to the member and not completed.",
            |m| m.in_flight_requests as f64,
        ),
        (
            "member_in_flight_bytes",
            GAUGE,
            "Bytes of the requests issued to the member and not completed.",
            |m| m.in_flight_bytes as f64,
        ),
        (
            "member_queue_jobs",
            GAUGE,
            "Segment writes queued or running on the member's write queue.",
            |m| m.queue_jobs as f64,
        ),
        (
            "member_queue_running_jobs",
            GAUGE,
            "Of the member's queued segment writes, those running now (at most the depth).",
            |m| m.queue_running_jobs as f64,
        ),
        (
            "member_queue_bytes",
            GAUGE,
            "Bytes reserved, queued or being written on the member's write queue.",
            |m| m.queue_bytes as f64,
        ),
        (
            "member_idle_while_others_busy_seconds_total",
            COUNTER,
            "Time the member's write queue was empty while another member's was not.",
            |m| m.idle_while_others_busy_ns as f64 / 1e9,
        ),
        (
            "member_trims_queued_total",
            COUNTER,
            "Freed log segments of the member listed for a scheduled trim.",
            |m| m.trims_queued as f64,
        ),
        (
            "member_trims_issued_total",
            COUNTER,
            "Trims issued on the member with its queue quiet (or at close or release).",
            |m| m.trims_issued as f64,
        ),
        (
            "member_trims_forced_total",
            COUNTER,
            "Trims issued on the member because its device was short of free space.",
            |m| m.trims_forced as f64,
        ),
        (
            "member_trims_pending_bytes",
            GAUGE,
            "Bytes of freed log segments of the member listed and not trimmed yet.",
            |m| m.trims_pending_bytes as f64,
        ),
    ];
    for (name, kind, help, value) in metrics {
        let _ = writeln!(
            out,
            "# HELP tucana_{name} {help}\n# TYPE tucana_{name} {kind}"
        );
        for (i, m) in stats.members.iter().enumerate() {
            let _ = writeln!(
                out,
                "tucana_{name}{{member=\"{i}\",path=\"{}\"}} {}",
                label_value(&m.name),
                value(m)
            );
        }
    }
}

/// `text` as a Prometheus label value: backslash, double quote and newline escaped.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Cluster mode's metrics, per region of the map (labelled with its id): this server's
/// role, the epoch, in-sync backups, and on its primary the connected backups and the
/// largest backup lag; then the last failover. Absent outside cluster mode.
fn cluster_text(state: &ServerState, out: &mut String) {
    let (regions, failover) = crate::cluster_report::regions(state);
    if regions.is_empty() {
        return;
    }
    type PerRegion = (&'static str, &'static str, fn(&RegionReport) -> Option<u64>);
    let per_region: [PerRegion; 5] = [
        (
            "cluster_region_role",
            "This server's role in the region: 2 primary, 1 backup, 0 none.",
            |r| {
                Some(match r.role {
                    Role::Primary => 2,
                    Role::Backup => 1,
                    Role::None => 0,
                })
            },
        ),
        (
            "cluster_region_epoch",
            "The region's epoch (raised by every change of primary).",
            |r| Some(r.epoch),
        ),
        (
            "cluster_region_backups_in_sync",
            "Backups of the region known to hold every acknowledged write.",
            |r| Some(r.backups_in_sync as u64),
        ),
        (
            "cluster_region_backups_online",
            "On the region's primary: backups connected now.",
            |r| r.shipping.map(|(online, _)| online as u64),
        ),
        (
            "cluster_region_backup_lag_bytes",
            "On the region's primary: the most log bytes a backup has not acknowledged.",
            |r| r.shipping.map(|(_, lag)| lag),
        ),
    ];
    for (name, help, value) in per_region {
        let _ = writeln!(
            out,
            "# HELP tucana_{name} {help}\n# TYPE tucana_{name} {GAUGE}"
        );
        for r in &regions {
            if let Some(v) = value(r) {
                let _ = writeln!(
                    out,
                    "tucana_{name}{{region=\"{}\",slots=\"{}\"}} {v}",
                    r.id.0, r.slots
                );
            }
        }
    }
    if let Some((f, _, _)) = failover {
        let _ = writeln!(
            out,
            "# HELP tucana_cluster_last_failover_unix_ms When the coordinator wrote the last promotion.\n# TYPE tucana_cluster_last_failover_unix_ms {GAUGE}\ntucana_cluster_last_failover_unix_ms{{region=\"{}\"}} {}",
            f.region.0, f.at_unix_ms
        );
        let _ = writeln!(
            out,
            "# HELP tucana_cluster_last_failover_decided_ms From the coordinator seeing the dead primary gone to its submitting the promotion.\n# TYPE tucana_cluster_last_failover_decided_ms {GAUGE}\ntucana_cluster_last_failover_decided_ms{{region=\"{}\"}} {}",
            f.region.0, f.decided_ms
        );
    }
}

/// A metric with one sample per backup: name, type, help text, how to read it.
type PerBackup = (
    &'static str,
    &'static str,
    &'static str,
    fn(&BackupStatus) -> u64,
);

/// Replication's metrics: per backup (labelled with its address) on a primary, the
/// link's counters on a backup. Absent on a server that does not replicate.
fn replication_text(replication: &Replication, out: &mut String) {
    let status = replication.backup_status();
    let per_backup: [PerBackup; 5] = [
        (
            "replication_backup_connected",
            GAUGE,
            "1 while the link to this backup is up.",
            |b| u64::from(b.connected),
        ),
        (
            "replication_backup_lag_bytes",
            GAUGE,
            "Log bytes written here that this backup has not acknowledged.",
            |b| b.regions.iter().map(|r| r.lag_bytes).sum(),
        ),
        (
            "replication_backup_lag_milliseconds",
            GAUGE,
            "How long the oldest log bytes shipped to this backup and not acknowledged have waited.",
            |b| {
                let lag = b.regions.iter().map(|r| r.lag).max().unwrap_or_default();
                u64::try_from(lag.as_millis()).unwrap_or(u64::MAX)
            },
        ),
        (
            "replication_shipped_log_bytes_total",
            COUNTER,
            "Log bytes shipped to this backup.",
            |b| b.shipped_log_bytes,
        ),
        (
            "replication_shipped_index_bytes_total",
            COUNTER,
            "Index node bytes shipped to this backup.",
            |b| b.shipped_index_bytes,
        ),
    ];
    if !status.is_empty() {
        for (name, kind, help, value) in per_backup {
            let _ = writeln!(
                out,
                "# HELP tucana_{name} {help}\n# TYPE tucana_{name} {kind}"
            );
            for b in &status {
                let label = b.addr.replace(['\\', '"', '\n'], "_");
                let _ = writeln!(out, "tucana_{name}{{backup=\"{label}\"}} {}", value(b));
            }
        }
    }
    let Some(c) = replication.backup_counters() else {
        return;
    };
    let link: [Metric; 6] = [
        (
            "replication_link_up",
            GAUGE,
            "1 while this backup's link to its primary is up.",
            u64::from(c.connected),
        ),
        (
            "replication_received_log_bytes_total",
            COUNTER,
            "Log bytes received from the primary.",
            c.received_log_bytes,
        ),
        (
            "replication_received_index_bytes_total",
            COUNTER,
            "Index node bytes received from the primary.",
            c.received_index_bytes,
        ),
        (
            "replication_commits_applied_total",
            COUNTER,
            "Primary commits applied to the replicas.",
            c.commits_applied,
        ),
        (
            "replication_log_cpu_nanoseconds_total",
            COUNTER,
            "CPU time spent storing shipped log bytes.",
            c.log_cpu_ns,
        ),
        (
            "replication_index_cpu_nanoseconds_total",
            COUNTER,
            "CPU time spent applying shipped commits.",
            c.index_cpu_ns,
        ),
    ];
    for (name, kind, help, value) in link {
        let _ = write!(
            out,
            "# HELP tucana_{name} {help}\n# TYPE tucana_{name} {kind}\ntucana_{name} {value}\n"
        );
    }
}

fn server_metrics(state: &ServerState) -> Vec<Metric> {
    let m = &state.metrics;
    vec![
        (
            "uptime_seconds",
            GAUGE,
            "Seconds since the server started.",
            state.started.elapsed().as_secs(),
        ),
        (
            "connected_clients",
            GAUGE,
            "Open client connections.",
            m.connected_clients(),
        ),
        (
            "connections_received_total",
            COUNTER,
            "Connections accepted.",
            get(&m.connections_received),
        ),
        (
            "connections_rejected_total",
            COUNTER,
            "Connections refused at the max clients limit.",
            get(&m.connections_rejected),
        ),
        (
            "error_replies_total",
            COUNTER,
            "Error replies sent.",
            get(&m.error_replies),
        ),
        (
            "protocol_errors_total",
            COUNTER,
            "Connections closed for a malformed or oversized request.",
            get(&m.protocol_errors),
        ),
        (
            "idle_timeouts_total",
            COUNTER,
            "Connections closed for being idle.",
            get(&m.idle_timeouts),
        ),
        (
            "auth_failures_total",
            COUNTER,
            "Failed AUTH attempts.",
            get(&m.auth_failures),
        ),
        (
            "keyspace_hits_total",
            COUNTER,
            "Key lookups that found the key.",
            get(&m.keyspace_hits),
        ),
        (
            "keyspace_misses_total",
            COUNTER,
            "Key lookups that did not find the key.",
            get(&m.keyspace_misses),
        ),
        (
            "net_input_bytes_total",
            COUNTER,
            "Bytes read from clients.",
            get(&m.net_input_bytes),
        ),
        (
            "net_output_bytes_total",
            COUNTER,
            "Bytes written to clients.",
            get(&m.net_output_bytes),
        ),
    ]
}

fn engine_metrics(stats: &Stats) -> Vec<Metric> {
    vec![
        ("keys", GAUGE, "Live keys over all keyspaces.", stats.keys),
        (
            "index_bytes",
            GAUGE,
            "Heap bytes of index nodes.",
            stats.index_bytes,
        ),
        (
            "live_log_bytes",
            GAUGE,
            "Log bytes reachable from an index.",
            stats.live_log_bytes,
        ),
        (
            "dead_log_bytes",
            GAUGE,
            "Log bytes overwritten or deleted.",
            stats.dead_log_bytes,
        ),
        (
            "space_used_bytes",
            GAUGE,
            "Bytes the volume file occupies on disk (holes excluded).",
            stats.space_used_bytes,
        ),
        (
            "gc_passes_total",
            COUNTER,
            "Garbage-collection passes that did work since open.",
            stats.gc_passes,
        ),
        (
            "gc_relocated_bytes_total",
            COUNTER,
            "Live log bytes garbage collection copied since open.",
            stats.gc_relocated_bytes,
        ),
        (
            "gc_reclaimed_bytes_total",
            COUNTER,
            "Log bytes garbage collection gave back since open.",
            stats.gc_reclaimed_bytes,
        ),
        (
            "volume_bytes",
            GAUGE,
            "Length of the volume file.",
            stats.volume_bytes,
        ),
        (
            "commits_total",
            COUNTER,
            "Volume commits since open.",
            stats.commits,
        ),
        (
            "syncs_total",
            COUNTER,
            "Log flushes with fsync since open.",
            stats.syncs,
        ),
        (
            "disk_written_bytes_total",
            COUNTER,
            "Bytes written to the volume since open.",
            stats.bytes_written,
        ),
        (
            "trims_issued_total",
            COUNTER,
            "Trims of freed log segments issued since open (forced ones apart).",
            stats.trims_issued,
        ),
        (
            "trims_forced_total",
            COUNTER,
            "Trims forced by low free space since open.",
            stats.trims_forced,
        ),
        (
            "trims_pending_bytes",
            GAUGE,
            "Bytes of freed log segments listed and not trimmed yet.",
            stats.trims_pending_bytes,
        ),
        (
            "prefetch_calls_total",
            COUNTER,
            "Device read-ahead requests of scans, multi-gets and pipelined commands since open.",
            stats.prefetch_calls,
        ),
        (
            "prefetch_bytes_total",
            COUNTER,
            "Bytes those read-ahead requests named, page-rounded.",
            stats.prefetch_bytes,
        ),
        (
            "prefetch_skipped_total",
            COUNTER,
            "Records not asked for because their batch was found in memory.",
            stats.prefetch_skipped,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_have_labelled_series_and_a_single_file_has_none() {
        let mut stats = Stats::default();
        let mut out = String::new();
        member_text(&stats, &mut out);
        assert!(out.is_empty());
        stats.members = (0..3)
            .map(|i| tucana::volume::MemberStats {
                name: format!("/nvme{i}/\"v\""),
                bytes_written: 1000 * i,
                queue_jobs: i,
                queue_running_jobs: 2 * i,
                idle_while_others_busy_ns: 1_500_000_000,
                trims_pending_bytes: (256 << 10) * i,
                ..Default::default()
            })
            .collect();
        member_text(&stats, &mut out);
        assert!(
            out.contains(
                "tucana_member_written_bytes_total{member=\"2\",path=\"/nvme2/\\\"v\\\"\"} 2000\n"
            ),
            "{out}"
        );
        assert!(
            out.contains("tucana_member_queue_jobs{member=\"1\",path=\"/nvme1/\\\"v\\\"\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "tucana_member_queue_running_jobs{member=\"2\",path=\"/nvme2/\\\"v\\\"\"} 4\n"
            ),
            "{out}"
        );
        assert!(out.contains("} 1.5\n"), "{out}");
        assert_eq!(out.matches("# TYPE tucana_member_").count(), 12);
        assert!(
            out.contains("tucana_member_trims_pending_bytes{member=\"2\",path=\"/nvme2/\\\"v\\\"\"} 524288\n"),
            "{out}"
        );
    }
}
