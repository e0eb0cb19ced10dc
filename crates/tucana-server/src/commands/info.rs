//! The `INFO` command's text: Redis's sections (Server, Clients, Memory, Persistence,
//! Stats, Replication, Cluster, Keyspace) and ours (Members, on a volume over several),
//! filled from the server's counters, the engine's `Stats`, the replication's state and
//! the cluster map this server follows.
//!
//! Owns which fields each section shows and their Redis names; the counters themselves
//! are `metrics`'. The Prometheus text is the other reader of the same counters
//! (`prometheus`).
//!
//! Thread-safety: reads relaxed atomics and one `Database::stats` call; any thread.

use std::fmt::Write as _;

use tucana::Stats;

use crate::expiry::now_ms;
use crate::metrics::get;
use crate::resp::Reply;
use crate::state::ServerState;
use crate::store::keyspace_name;

use super::expire::deadline_counts;

use super::{Call, REDIS_COMPAT_VERSION};

/// `INFO [section ...]`
pub(super) fn cmd_info(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let sections: Vec<String> = args[1..]
        .iter()
        .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
        .collect();
    let connected = call.state.metrics.connected_clients();
    Ok(Reply::Bulk(
        info_text(call.state, &sections, connected).into_bytes(),
    ))
}

/// Fields of one section, in order.
type Lines<'a> = Vec<(&'a str, String)>;

/// The `INFO` text: the sections asked for (all when none, or `all`/`everything`).
fn info_text(state: &ServerState, sections: &[String], connected: u64) -> String {
    let want = |name: &str| {
        sections.is_empty()
            || sections
                .iter()
                .any(|s| s == name || s == "all" || s == "everything" || s == "default")
    };
    let stats = state.store.db.stats();
    let mut out = String::new();
    if want("server") {
        section(&mut out, "Server", server_lines(state));
    }
    if want("clients") {
        let lines = vec![
            ("connected_clients", connected.to_string()),
            ("maxclients", state.settings.max_clients().to_string()),
            (
                "blocked_clients",
                crate::metrics::get(&state.metrics.blocked_clients).to_string(),
            ),
        ];
        section(&mut out, "Clients", lines);
    }
    if want("memory") {
        section(&mut out, "Memory", memory_lines(&stats));
    }
    if want("persistence") {
        section(&mut out, "Persistence", persistence_lines(state, &stats));
    }
    // Only on a volume over several members, so a single file's INFO is as it was.
    if !stats.members.is_empty() && want("members") {
        let owned = member_lines(&stats);
        let lines = owned.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        section(&mut out, "Members", lines);
    }
    if want("stats") {
        section(&mut out, "Stats", stats_lines(state));
    }
    if want("cpu") {
        section(&mut out, "CPU", cpu_lines());
    }
    if want("replication") {
        let owned = match &state.replication {
            Some(r) => r.info_lines(),
            None => vec![
                ("role".to_string(), "master".to_string()),
                ("connected_slaves".to_string(), "0".to_string()),
            ],
        };
        let lines = owned.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        section(&mut out, "Replication", lines);
    }
    // Only in cluster mode, so a standalone server's INFO is as it was.
    if state.cluster.is_some() && want("cluster") {
        let owned = cluster_lines(state);
        let mut lines: Lines<'_> = vec![("cluster_enabled", "1".into())];
        lines.extend(owned.iter().map(|(k, v)| (k.as_str(), v.clone())));
        section(&mut out, "Cluster", lines);
    }
    if want("keyspace") {
        let labels = keyspace_labels(state, &stats);
        let lines = labels
            .iter()
            .map(|(label, keys, expires)| {
                let value = format!("keys={keys},expires={expires},avg_ttl=0");
                (label.as_str(), value)
            })
            .collect();
        section(&mut out, "Keyspace", lines);
    }
    out
}

/// `INFO cpu`: the process's CPU time in seconds, all threads (Redis's
/// `used_cpu_sys`/`used_cpu_user`), and its waited-for children's, from
/// `/proc/self/stat` (in clock ticks of `USER_HZ`, 100 per second on Linux's
/// architectures); empty where that file cannot be read.
fn cpu_lines() -> Lines<'static> {
    let Some(ticks) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|text| stat_cpu_ticks(&text))
    else {
        return Vec::new();
    };
    let seconds = |t: u64| format!("{:.6}", t as f64 / 100.0);
    vec![
        ("used_cpu_sys", seconds(ticks[1])),
        ("used_cpu_user", seconds(ticks[0])),
        ("used_cpu_sys_children", seconds(ticks[3])),
        ("used_cpu_user_children", seconds(ticks[2])),
    ]
}

/// utime, stime, cutime, cstime of a `/proc/PID/stat` line (fields 14 to 17; the
/// command name, field 2, may hold spaces and parentheses, so fields are counted from
/// its last `)`).
fn stat_cpu_ticks(text: &str) -> Option<[u64; 4]> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (the state).
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some([field(14)?, field(15)?, field(16)?, field(17)?])
}

/// `INFO members`: per member of a volume over several (`member<i>`), its file, the groups
/// placed on it, bytes written and read, requests and bytes in flight, its weighted
/// queue (what least-weighted-queue dispatch compares; DESIGN.md, "Volumes over several
/// devices"), its write queue (jobs queued or running, of those the ones running now,
/// their bytes, jobs done) and the
/// time its write queue was empty while another member's was not, and its trims (queued,
/// issued, forced by low free space, bytes pending: `tucana::trim`).
fn member_lines(stats: &Stats) -> Vec<(String, String)> {
    stats
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            (
                format!("member{i}"),
                format!(
                    "path={},kind={},state={},groups={},bytes_written={},bytes_read={},in_flight_requests={},in_flight_bytes={},weighted_queue_ps={},queue_jobs={},queue_running_jobs={},queue_bytes={},queue_done_jobs={},idle_while_others_busy_ns={},trims_queued={},trims_issued={},trims_forced={},trims_pending_bytes={}",
                    m.name,
                    m.kind,
                    m.state,
                    m.groups,
                    m.bytes_written,
                    m.bytes_read,
                    m.in_flight_requests,
                    m.in_flight_bytes,
                    m.weighted_queue_ps,
                    m.queue_jobs,
                    m.queue_running_jobs,
                    m.queue_bytes,
                    m.queue_done_jobs,
                    m.idle_while_others_busy_ns,
                    m.trims_queued,
                    m.trims_issued,
                    m.trims_forced,
                    m.trims_pending_bytes
                ),
            )
        })
        .collect()
}

/// `INFO cluster`'s fields after Redis's `cluster_enabled`: per region of the map
/// (`tucana_region_<id>`) its slots, this server's role in it (`primary`, `backup` or
/// `none`), its epoch, its primary's and backups' client addresses, how many backups are
/// in sync and, on its primary, how many backups are connected and the largest of their
/// lags (log bytes not yet
/// acknowledged; `-` where this server does not ship the region); then the last failover
/// the coordinator recorded in the map (`tucana_last_failover`).
fn cluster_lines(state: &ServerState) -> Vec<(String, String)> {
    let (regions, failover) = crate::cluster_report::regions(state);
    let mut out = Vec::new();
    for r in regions {
        let (online, lag) = match r.shipping {
            Some((online, lag)) => (online.to_string(), lag.to_string()),
            None => ("-".into(), "-".into()),
        };
        out.push((
            format!("tucana_region_{}", r.id.0),
            format!(
                "slots={},role={},epoch={},primary={},backups={},backups_in_sync={},backups_online={online},backup_lag_bytes={lag}",
                r.slots,
                r.role.as_str(),
                r.epoch,
                r.primary,
                r.backups.join(";"),
                r.backups_in_sync,
            ),
        ));
    }
    if let Some((f, dead, promoted)) = failover {
        out.push((
            "tucana_last_failover".into(),
            format!(
                "region={},epoch={},dead={dead},promoted={promoted},at_unix_ms={},decided_ms={}",
                f.region.0, f.epoch, f.at_unix_ms, f.decided_ms
            ),
        ));
    }
    out
}

/// Appends a section: its title line, then `name:value` lines (CRLF, as Redis).
fn section(out: &mut String, title: &str, lines: Lines<'_>) {
    if !out.is_empty() {
        out.push_str("\r\n");
    }
    let _ = write!(out, "# {title}\r\n");
    for (k, v) in lines {
        let _ = write!(out, "{k}:{v}\r\n");
    }
}

fn server_lines(state: &ServerState) -> Lines<'static> {
    let uptime = state.started.elapsed();
    vec![
        ("redis_version", REDIS_COMPAT_VERSION.into()),
        ("tucana_version", env!("CARGO_PKG_VERSION").into()),
        (
            "redis_mode",
            if state.cluster.is_some() {
                "cluster"
            } else {
                "standalone"
            }
            .into(),
        ),
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
    ]
}

/// Resident set size of this process in bytes, where the OS tells it.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn memory_lines(stats: &Stats) -> Lines<'static> {
    let rss = resident_bytes().unwrap_or(0);
    vec![
        // The index is what the store keeps in memory; values live on the device.
        ("used_memory", stats.index_bytes.to_string()),
        ("used_memory_rss", rss.to_string()),
        ("index_bytes", stats.index_bytes.to_string()),
        ("index_nodes", stats.index_nodes.to_string()),
        ("maxmemory", "0".into()),
        ("maxmemory_policy", "noeviction".into()),
    ]
}

fn persistence_lines(state: &ServerState, stats: &Stats) -> Lines<'static> {
    vec![
        ("loading", "0".into()),
        ("durability", state.config.durability.name().into()),
        ("aof_enabled", "1".into()),
        ("rdb_bgsave_in_progress", "0".into()),
        ("commits", stats.commits.to_string()),
        ("commit_epoch", stats.commit_epoch.to_string()),
        ("syncs", stats.syncs.to_string()),
        ("live_log_bytes", stats.live_log_bytes.to_string()),
        ("dead_log_bytes", stats.dead_log_bytes.to_string()),
        ("volume_bytes", stats.volume_bytes.to_string()),
        ("space_used_bytes", stats.space_used_bytes.to_string()),
        ("volume_kind", stats.volume_kind.clone()),
        ("disk_bytes_written", stats.bytes_written.to_string()),
        ("disk_bytes_read", stats.bytes_read.to_string()),
        ("gc_passes", stats.gc_passes.to_string()),
        ("gc_relocated_bytes", stats.gc_relocated_bytes.to_string()),
        ("gc_reclaimed_bytes", stats.gc_reclaimed_bytes.to_string()),
        ("gc_paced_ns", stats.gc_paced_ns.to_string()),
        ("trims_queued", stats.trims_queued.to_string()),
        ("trims_issued", stats.trims_issued.to_string()),
        ("trims_forced", stats.trims_forced.to_string()),
        ("trims_pending_bytes", stats.trims_pending_bytes.to_string()),
        ("prefetch_calls", stats.prefetch_calls.to_string()),
        ("prefetch_bytes", stats.prefetch_bytes.to_string()),
        ("prefetch_skipped", stats.prefetch_skipped.to_string()),
    ]
}

fn stats_lines(state: &ServerState) -> Lines<'static> {
    let m = &state.metrics;
    let (channels, patterns) = state.pubsub.counts();
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
        ("expired_keys", get(&m.expired_keys).to_string()),
        ("evicted_keys", "0".into()),
        ("pubsub_channels", channels.to_string()),
        ("pubsub_patterns", patterns.to_string()),
        (
            "client_output_buffer_limit_disconnections",
            get(&state.pubsub.limit_disconnections).to_string(),
        ),
    ]
}

/// `db<n>`, its key count and its keys with a deadline, for every numbered database that
/// has keys. Cluster mode counts the regions' records (deadline records included, for
/// now).
fn keyspace_labels(state: &ServerState, stats: &Stats) -> Vec<(String, u64, u64)> {
    if let Some(cluster) = &state.cluster {
        // Cluster mode has database 0 only: the keys of the regions this server leads.
        let led: Vec<String> = cluster
            .led_regions(&state.store.db)
            .iter()
            .map(|(_, slot)| slot.name().to_owned())
            .collect();
        let keys: u64 = stats
            .keyspaces
            .iter()
            .filter(|ks| led.contains(&ks.name))
            .map(|ks| ks.keys)
            .sum();
        return if keys > 0 {
            vec![("db0".to_owned(), keys, 0)]
        } else {
            Vec::new()
        };
    }
    let names: Vec<String> = (0..state.store.databases()).map(keyspace_name).collect();
    let mut labels = Vec::new();
    for ks in &stats.keyspaces {
        if let Some(index) = names.iter().position(|n| *n == ks.name) {
            let (keys, expires) = live_counts(state.store.slot(index as u32), ks.keys);
            if keys > 0 {
                labels.push((format!("db{index}"), keys, expires));
            }
        }
    }
    labels
}

/// A database's live keys and keys with a deadline, from its record count `records`
/// (a scan of the reserved family when it may hold deadlines; on a read error the record
/// count stands, INFO does not fail).
fn live_counts(slot: &crate::store::Slot, records: u64) -> (u64, u64) {
    if !slot.may_expire() {
        return (records, 0);
    }
    let counted = slot.read(|ks| match ks {
        Some(ks) => deadline_counts(ks, &[], now_ms()),
        None => Ok((0, 0)),
    });
    match counted {
        Ok((hidden, expires)) => (records.saturating_sub(hidden), expires),
        Err(_) => (records, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_listed_one_line_each() {
        let mut stats = Stats::default();
        assert!(member_lines(&stats).is_empty());
        stats.members = (0..2)
            .map(|i| tucana::volume::MemberStats {
                name: format!("/nvme{i}/v"),
                kind: if i == 0 { "block-device" } else { "file" }.to_string(),
                state: "live".to_string(),
                groups: 3 + i,
                bytes_written: 100 * i,
                in_flight_requests: i,
                queue_jobs: 2 * i,
                queue_running_jobs: i,
                queue_bytes: 4096 * i,
                idle_while_others_busy_ns: 7,
                trims_forced: i,
                trims_pending_bytes: (256 << 10) * i,
                ..Default::default()
            })
            .collect();
        let lines = member_lines(&stats);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].0, "member1");
        assert_eq!(
            lines[1].1,
            "path=/nvme1/v,kind=file,state=live,groups=4,bytes_written=100,bytes_read=0,in_flight_requests=1,in_flight_bytes=0,weighted_queue_ps=0,queue_jobs=2,queue_running_jobs=1,queue_bytes=4096,queue_done_jobs=0,idle_while_others_busy_ns=7,trims_queued=0,trims_issued=0,trims_forced=1,trims_pending_bytes=262144"
        );
    }

    #[test]
    fn cpu_ticks_are_read_past_a_command_name_with_spaces() {
        let line = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 1 0 5 0 0";
        assert_eq!(stat_cpu_ticks(line), Some([250, 75, 3, 4]));
        assert_eq!(stat_cpu_ticks("42 (x) S 1"), None);
        assert!(
            !cpu_lines().is_empty(),
            "this process's /proc/self/stat reads"
        );
    }
}
