//! Redis Cluster as Tucana's comparisons run it (tucana-bench's side by side, the fault
//! campaign's `--target redis`): the arguments of one `redis-server --cluster-enabled
//! yes` node, durable as Redis's documentation recommends (`appendonly yes`, with the
//! `appendfsync` policy chosen: `everysec`, the recommended default, or `always`), the
//! cluster made by `redis-cli --cluster create --cluster-replicas 1` (three masters with
//! one replica each from six nodes), and whether a master's replicas are online and
//! caught up, read from its `INFO replication`.
//!
//! Owns no process (see [`crate::process`]); pure functions but [`create`], which runs
//! redis-cli. Thread-safe (no state).

use std::path::Path;
use std::process::{Command, Stdio};

/// One node's settings.
pub struct NodeConfig<'a> {
    pub port: &'a str,
    /// The address it binds (and announces to the cluster).
    pub bind: &'a str,
    /// Its working directory (AOF, `nodes.conf`, log).
    pub dir: &'a str,
    /// `cluster-node-timeout`: how long a node may be unreachable before it is failed.
    pub timeout_ms: u64,
    /// `appendfsync`: `everysec` or `always`.
    pub appendfsync: &'a str,
    /// `requirepass` and `masterauth` (nodes off loopback must have one).
    pub password: Option<&'a str>,
}

/// The arguments of `redis-server` for `node`.
pub fn server_args(node: &NodeConfig) -> Vec<String> {
    let log = format!("{}/redis.log", node.dir);
    let timeout = node.timeout_ms.to_string();
    let mut args: Vec<String> = [
        "--port",
        node.port,
        "--bind",
        node.bind,
        "--dir",
        node.dir,
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &timeout,
        "--appendonly",
        "yes",
        "--appendfsync",
        node.appendfsync,
        "--save",
        "",
        "--daemonize",
        "no",
        "--logfile",
        &log,
    ]
    .into_iter()
    .map(String::from)
    .collect();
    if let Some(p) = node.password {
        args.extend(["--requirepass", p, "--masterauth", p].map(String::from));
    }
    args
}

/// `redis-cli --cluster create ADDRS... --cluster-replicas 1 --cluster-yes`; its output
/// as the error if it failed.
pub fn create(redis_cli: &Path, addrs: &[String], password: Option<&str>) -> Result<(), String> {
    let mut command = Command::new(redis_cli);
    if let Some(p) = password {
        command.args(["--no-auth-warning", "-a", p]);
    }
    let output = command
        .args(["--cluster", "create"])
        .args(addrs)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", redis_cli.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "redis-cli --cluster create failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The `slaveN:ip=...` lines of an `INFO replication` answer, if there are some and all
/// say `state=online`.
pub fn online_replicas(info: &str) -> Option<Vec<&str>> {
    let replicas: Vec<&str> = info
        .lines()
        .filter(|l| l.starts_with("slave") && l.contains(":ip="))
        .collect();
    (!replicas.is_empty() && replicas.iter().all(|l| l.contains("state=online")))
        .then_some(replicas)
}

/// Whether a Redis master's `INFO replication` shows replicas, all online and at the
/// master's replication offset.
pub fn caught_up(info: &str) -> bool {
    let Some(replicas) = online_replicas(info) else {
        return false;
    };
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split([',', ':'])
            .find_map(|kv| kv.trim().strip_prefix(name)?.parse().ok())
    };
    let Some(master) = info.lines().find_map(|l| {
        l.trim()
            .strip_prefix("master_repl_offset:")?
            .parse::<u64>()
            .ok()
    }) else {
        return false;
    };
    replicas.iter().all(|l| field(l, "offset=") == Some(master))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_replicas_are_caught_up_at_the_masters_offset() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\
                    slave0:ip=127.0.0.1,port=7304,state=online,offset=1234,lag=0\r\n\
                    master_repl_offset:1234\r\n";
        assert!(caught_up(info));
        let behind = info.replace("offset=1234", "offset=1200");
        assert!(!caught_up(&behind));
        assert!(online_replicas(&behind).is_some(), "behind but online");
        let syncing = info.replace("state=online", "state=wait_bgsave");
        assert!(!caught_up(&syncing));
        assert!(online_replicas(&syncing).is_none());
        assert!(!caught_up("role:master\r\nconnected_slaves:0\r\n"));
    }

    #[test]
    fn nodes_are_durable_with_the_chosen_fsync_and_timeout() {
        let node = NodeConfig {
            port: "7301",
            bind: "10.215.3.2",
            dir: "/d",
            timeout_ms: 4000,
            appendfsync: "always",
            password: Some("pw"),
        };
        let args = server_args(&node).join(" ");
        assert!(
            args.contains("--appendonly yes --appendfsync always"),
            "{args}"
        );
        assert!(args.contains("--cluster-enabled yes"));
        assert!(args.contains("--cluster-node-timeout 4000"));
        assert!(args.contains("--bind 10.215.3.2"));
        assert!(args.ends_with("--requirepass pw --masterauth pw"), "{args}");
        let open = server_args(&NodeConfig {
            password: None,
            ..node
        })
        .join(" ");
        assert!(!open.contains("requirepass"), "{open}");
    }
}
