//! Replicated servers in one process, spoken to with a real Redis client: a primary
//! (`--backup`) answers a write only once its backup has it, `WAIT` counts backups,
//! `INFO replication` says who is who, and `REPLICAOF NO ONE` on the backup makes it
//! serve every acknowledged write (and refuse its old primary).

use std::time::{Duration, Instant};

use redis::{Commands, Connection};
use tucana::Database;
use tucana_server::{spawn, RunningServer, ServerConfig};

fn free_port() -> u16 {
    // Below the ephemeral range: no server of another test, bound to port 0, can hold it.
    tucana_cluster::testing::free_port("127.0.0.1")
}

fn config() -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..ServerConfig::default()
    }
}

fn connect(server: &RunningServer) -> Connection {
    let client = redis::Client::open(format!("redis://{}/", server.addr)).unwrap();
    let con = client.get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    con
}

/// A backup taking replicas on a free port, and a primary shipping to it.
fn pair(ack_timeout: Duration) -> (Database, RunningServer, Database, RunningServer) {
    let repl_port = free_port();
    let backup_db = Database::builder().open_in_memory().unwrap();
    let mut backup_config = config();
    backup_config.replication.listen_port = Some(repl_port);
    let backup = spawn(backup_db.clone(), backup_config).unwrap();
    let primary_db = Database::builder().open_in_memory().unwrap();
    let mut primary_config = config();
    primary_config.replication.backups = vec![format!("127.0.0.1:{repl_port}")];
    primary_config.replication.ack_timeout = ack_timeout;
    let primary = spawn(primary_db.clone(), primary_config).unwrap();
    (primary_db, primary, backup_db, backup)
}

/// The server's Prometheus text.
fn scrape(server: &RunningServer) -> String {
    use std::io::{Read, Write};
    let mut http = std::net::TcpStream::connect(server.metrics_addr.unwrap()).unwrap();
    http.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut body = String::new();
    http.read_to_string(&mut body).unwrap();
    body
}

/// The value of the sample line that starts with `series ` (a name with its labels).
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn info_field(con: &mut Connection, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO").arg("replication").query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(str::to_string))
}

#[test]
fn a_primary_answers_writes_its_backup_has_and_the_promoted_backup_serves_them() {
    let (_pdb, primary, _bdb, backup) = pair(Duration::from_secs(10));
    let mut p = connect(&primary);
    for i in 0..300 {
        let _: () = p.set(format!("k{i}"), format!("v{i}")).unwrap();
    }
    let mut b = connect(&backup);
    assert_eq!(info_field(&mut p, "role").as_deref(), Some("master"));
    assert_eq!(info_field(&mut p, "connected_slaves").as_deref(), Some("1"));
    assert_eq!(info_field(&mut b, "role").as_deref(), Some("slave"));
    assert_eq!(
        info_field(&mut b, "master_link_status").as_deref(),
        Some("up")
    );
    let waited: i64 = redis::cmd("WAIT").arg(1).arg(1000).query(&mut p).unwrap();
    assert_eq!(waited, 1, "the one backup acknowledged the last write");
    // The primary goes away; the backup is promoted and serves every acknowledged write.
    primary.stop().unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut b)
        .unwrap();
    for i in 0..300 {
        let v: Option<String> = b.get(format!("k{i}")).unwrap();
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_str()), "key {i}");
    }
    let _: () = b.set("written", "after promotion").unwrap();
    assert_eq!(info_field(&mut b, "role").as_deref(), Some("master"));
    backup.stop().unwrap();
}

#[test]
fn without_its_backup_a_primary_answers_noreplicas_and_wait_counts_none() {
    let (_pdb, primary, _bdb, backup) = pair(Duration::from_millis(300));
    let mut p = connect(&primary);
    let _: () = p.set("before", "x").unwrap();
    backup.stop().unwrap();
    let err = p.set::<_, _, ()>("after", "y").unwrap_err();
    assert!(err.to_string().contains("NOREPLICAS"), "{err}");
    let waited: i64 = redis::cmd("WAIT").arg(1).arg(200).query(&mut p).unwrap();
    assert_eq!(waited, 0);
    // INFO says how far behind the backup is, in bytes and (Redis's `lag`) seconds.
    let line = info_field(&mut p, "slave0").unwrap();
    let field = |name: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    assert!(field("lag_bytes") > 0, "{line}");
    field("lag");
    assert!(
        field("applied_commit") > 0,
        "the first commit came in full: {line}"
    );
    primary.stop().unwrap();
}

#[test]
fn an_old_primary_is_refused_once_its_backup_was_promoted() {
    let (_pdb, primary, _bdb, backup) = pair(Duration::from_millis(500));
    let mut p = connect(&primary);
    let _: () = p.set("k", "v").unwrap();
    let mut b = connect(&backup);
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut b)
        .unwrap();
    // The primary's link breaks, dials again, and is told the keyspace is at a higher
    // term: from then on it refuses writes outright.
    let start = Instant::now();
    loop {
        let err = p.set::<_, _, ()>("k", "late").unwrap_err();
        if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly) {
            break;
        }
        let err = err.to_string();
        assert!(err.contains("NOREPLICAS"), "{err}");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "never fenced: {err}"
        );
    }
    let v: Option<String> = b.get("k").unwrap();
    assert_eq!(
        v.as_deref(),
        Some("v"),
        "the late write never reached the new primary"
    );
    primary.stop().unwrap();
    backup.stop().unwrap();
}

#[test]
fn prometheus_shows_each_backup_on_the_primary_and_the_link_on_the_backup() {
    let (_pdb, primary, _bdb, backup) = pair(Duration::from_secs(10));
    let mut p = connect(&primary);
    for i in 0..100 {
        let _: () = p.set(format!("k{i}"), "v".repeat(100)).unwrap();
    }
    let text = scrape(&primary);
    let addr = primary_backup_addr(&text);
    let series = |name: &str| format!("tucana_{name}{{backup=\"{addr}\"}}");
    assert_eq!(
        sample(&text, &series("replication_backup_connected")),
        Some(1)
    );
    let shipped = sample(&text, &series("replication_shipped_log_bytes_total")).unwrap();
    assert!(
        shipped >= 100 * 100,
        "{shipped} log bytes shipped for 10,000 value bytes"
    );
    assert!(text.contains("# TYPE tucana_replication_backup_lag_bytes gauge"));
    assert!(
        !text.contains("tucana_replication_link_up"),
        "a primary has no link up"
    );

    let text = scrape(&backup);
    assert_eq!(sample(&text, "tucana_replication_link_up"), Some(1));
    let received = sample(&text, "tucana_replication_received_log_bytes_total").unwrap();
    assert!(received >= 100 * 100, "{received}");
    // Every SET was acknowledged, and a backup acknowledges only after a commit applied.
    assert!(sample(&text, "tucana_replication_commits_applied_total").unwrap() >= 1);
    assert!(!text.contains("replication_backup_connected"));
    primary.stop().unwrap();
    backup.stop().unwrap();
}

/// The one backup label in a primary's metrics.
fn primary_backup_addr(text: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.starts_with("tucana_replication_backup_connected{"))
        .unwrap_or_else(|| panic!("no backup in {text}"));
    line.split('"').nth(1).unwrap().to_string()
}

/// A primary folds commits whose index would cost more than the log they cover (the
/// default: up to 60 s), but `SAVE` ships its commit's index at once: the backup's
/// replica reaches the primary's commit without waiting for the bound.
#[test]
fn save_brings_the_backups_index_to_the_primarys_commit() {
    let (_pdb, primary, _bdb, backup) = pair(Duration::from_secs(10));
    let mut p = connect(&primary);
    let mut b = connect(&backup);
    for round in 0..3 {
        for i in 0..200 {
            let _: () = p.set(format!("k{i}"), round).unwrap();
        }
        let _: () = redis::cmd("SAVE").query(&mut p).unwrap();
        let persistence: String = redis::cmd("INFO").arg("persistence").query(&mut p).unwrap();
        let epoch: u64 = persistence
            .lines()
            .find_map(|l| l.strip_prefix("commit_epoch:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
        let start = Instant::now();
        loop {
            let line = info_field(&mut b, "tucana_replica_default").unwrap_or_default();
            let applied: u64 = line
                .split(',')
                .find_map(|kv| kv.strip_prefix("upstream_commit="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if applied >= epoch {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the backup never applied commit {epoch}: {line}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    primary.stop().unwrap();
    backup.stop().unwrap();
}
