//! The clusters the comparison starts on this machine, each process with its own
//! directory and ports: Redis Cluster (six `redis-server --cluster-enabled yes`, AOF with
//! `everysec`, joined by `redis-cli --cluster create --cluster-replicas 1`: three masters
//! with one replica each), and Tucana (an etcd of its own, three `tucana serve
//! --cluster-etcd` servers, the map made by `tucana cluster create --replicas 1`: three
//! regions with one backup each). Also kills a node with `kill -9`, restarts it on its
//! directory (it rejoins as a replica or backup), and waits until the cluster is whole
//! again.
//!
//! Owns the processes (every one still running is killed when the fleet is dropped)
//! and their directories' layout; what is run against them is the caller's.
//! Single-threaded.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::ValueEnum;
use tucana_clusterprobe::etcd::Etcd;
use tucana_clusterprobe::process::{free_port_pair, Process};
use tucana_clusterprobe::redis_cluster::{self, NodeConfig};
use tucana_clusterprobe::{backups_in_sync, connect, served, slot_ranges, wait_for, Range};

use crate::Result;

/// How long a wait for something that should happen may last before the run fails.
pub(super) const PATIENCE: Duration = Duration::from_secs(120);

/// The systems compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum System {
    /// Redis Cluster: 3 masters + 1 replica each, `appendonly yes`, `appendfsync everysec`.
    Redis,
    /// Tucana: 3 servers, 1 backup per region, `--durability sync` (the default).
    Tucana,
    /// Tucana as above with `--durability buffered --flush-interval-ms 1000`: writes
    /// answered before they are durable on the primary, as Redis's `everysec`.
    TucanaBuffered,
}

impl System {
    pub(super) const ALL: [System; 3] = [System::Redis, System::Tucana, System::TucanaBuffered];

    /// The name records and the document carry.
    pub(super) fn name(self) -> &'static str {
        match self {
            System::Redis => "redis-cluster",
            System::Tucana => "tucana-sync",
            System::TucanaBuffered => "tucana-buffered",
        }
    }

    fn is_redis(self) -> bool {
        self == System::Redis
    }

    /// The processes' command lines, for the results file (`DIR` and `PORT` stand for
    /// each process's own; `ETCD` for the run's etcd).
    pub(super) fn command_lines(self, timeout_ms: u64) -> Vec<String> {
        let node = |port: &str, dir: &str| {
            self.node_args(port, dir, "ETCD", timeout_ms)
                .iter()
                .map(|a| {
                    if a.is_empty() {
                        "''".to_string()
                    } else {
                        a.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        match self {
            System::Redis => vec![
                format!("redis-server {} (6 processes)", node("PORT", "DIR")),
                "redis-cli --cluster create ADDRESSES... --cluster-replicas 1 --cluster-yes"
                    .to_string(),
            ],
            System::Tucana | System::TucanaBuffered => vec![
                "etcd (one member, its own data directory)".to_string(),
                format!("tucana {} (3 processes)", node("PORT", "DIR")),
                "tucana cluster create --etcd ETCD --name compare --replicas 1 ADDRESSES..."
                    .to_string(),
            ],
        }
    }

    /// Arguments of one node listening on `port` with its files in `dir`.
    fn node_args(self, port: &str, dir: &str, etcd: &str, timeout_ms: u64) -> Vec<String> {
        let mut args: Vec<String> = match self {
            System::Redis => redis_cluster::server_args(&NodeConfig {
                port,
                bind: "127.0.0.1",
                dir,
                timeout_ms,
                appendfsync: "everysec",
                password: None,
            }),
            System::Tucana | System::TucanaBuffered => {
                let repl = port
                    .parse::<u32>()
                    .map_or("PORT+10000".to_string(), |p| (p + 10000).to_string());
                vec![
                    "--db",
                    &format!("{dir}/volume.tucana"),
                    "serve",
                    "--port",
                    port,
                    "--repl-port",
                    &repl,
                    "--cluster-etcd",
                    etcd,
                    "--cluster-name",
                    "compare",
                    "--cluster-lease-ms",
                    &timeout_ms.to_string(),
                ]
                .into_iter()
                .map(String::from)
                .collect()
            }
        };
        match self {
            System::Redis => {}
            System::Tucana => args.extend(["--durability".into(), "sync".into()]),
            System::TucanaBuffered => args.extend([
                "--durability".into(),
                "buffered".into(),
                "--flush-interval-ms".into(),
                "1000".into(),
            ]),
        }
        args
    }
}

/// The programs a fleet runs.
pub(super) struct Programs {
    pub(super) tucana: PathBuf,
    pub(super) redis_server: PathBuf,
    pub(super) redis_cli: PathBuf,
}

/// A running cluster of one system.
pub(super) struct Fleet {
    pub(super) system: System,
    nodes: Vec<Process>,
    /// Kept running for the fleet's life (dropped after the nodes: fields drop in order).
    _etcd: Option<Etcd>,
}

impl Fleet {
    /// Starts `system` with its files under `dir` (created), the Redis node timeout or
    /// the Tucana lease `timeout_ms`, and waits until every slot is served and every
    /// master or primary has a caught-up replica or backup.
    pub(super) fn start(
        system: System,
        programs: &Programs,
        dir: &Path,
        timeout_ms: u64,
    ) -> Result<Fleet> {
        std::fs::create_dir_all(dir)?;
        let etcd = if system.is_redis() {
            None
        } else {
            Some(Etcd::start(dir, "compare", PATIENCE)?)
        };
        let endpoint = etcd
            .as_ref()
            .map_or("", |e| e.endpoint.as_str())
            .to_string();
        let count = if system.is_redis() { 6 } else { 3 };
        let mut nodes = Vec::new();
        for _ in 0..count {
            let port = free_port_pair()?;
            let node_dir = dir.join(format!("node-{port}"));
            std::fs::create_dir_all(&node_dir)?;
            let dir_text = node_dir.display().to_string();
            let mut node = Process {
                program: if system.is_redis() {
                    programs.redis_server.clone()
                } else {
                    programs.tucana.clone()
                },
                args: system.node_args(&port.to_string(), &dir_text, &endpoint, timeout_ms),
                host: "127.0.0.1".into(),
                port,
                netns: None,
                password: None,
                log: node_dir.join("stderr.log"),
                child: None,
            };
            node.spawn()?;
            nodes.push(node);
        }
        for node in &mut nodes {
            node.wait_ping(PATIENCE)?;
        }
        let addrs: Vec<String> = nodes.iter().map(Process::addr).collect();
        if system.is_redis() {
            redis_cluster::create(&programs.redis_cli, &addrs, None)?;
        } else {
            let output = Command::new(&programs.tucana)
                .args([
                    "cluster", "create", "--etcd", &endpoint, "--name", "compare",
                ])
                .args(["--replicas", "1"])
                .args(&addrs)
                .stdin(Stdio::null())
                .output()?;
            if !output.status.success() {
                return Err(format!(
                    "creating the {} cluster failed ({}): {}{}",
                    system.name(),
                    output.status,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                )
                .into());
            }
        }
        let fleet = Fleet {
            system,
            nodes,
            _etcd: etcd,
        };
        fleet.settle()?;
        Ok(fleet)
    }

    /// Every node's address, running or not.
    pub(super) fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(Process::addr).collect()
    }

    /// The running nodes' addresses.
    pub(super) fn live(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(Process::addr)
            .collect()
    }

    /// A port of a running node (for redis-benchmark).
    pub(super) fn any_port(&self) -> Result<u16> {
        Ok(self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .ok_or("no node is running")?
            .port)
    }

    pub(super) fn index_of(&self, addr: &str) -> Result<usize> {
        Ok(self
            .nodes
            .iter()
            .position(|n| n.addr() == addr)
            .ok_or_else(|| format!("{addr} is not a node of the run"))?)
    }

    pub(super) fn kill9(&mut self, index: usize) {
        self.nodes[index].kill9();
    }

    /// Starts node `index` again on its directory and waits until it answers PING.
    pub(super) fn restart(&mut self, index: usize) -> Result<()> {
        self.nodes[index].spawn()?;
        Ok(self.nodes[index].wait_ping(PATIENCE)?)
    }

    /// The map once every slot is served by a running primary (any node's view).
    pub(super) fn served_map(&self) -> Result<Vec<Range>> {
        let live = self.live();
        let live_refs: Vec<&str> = live.iter().map(String::as_str).collect();
        Ok(wait_for(
            "every slot served by a live primary",
            PATIENCE,
            || {
                live.iter()
                    .filter_map(|a| slot_ranges(a))
                    .find(|r| served(r, &live_refs))
            },
        )?)
    }

    /// Waits until every running node says `cluster_state:ok`, every slot is served by
    /// a running primary, every range has a replica or backup, and every primary's
    /// replicas are online and caught up (Redis: the replica's offset is the master's;
    /// Tucana: no bytes left to ship, after a `SAVE` so that the index reached them too);
    /// the map then.
    pub(super) fn settle(&self) -> Result<Vec<Range>> {
        let live = self.live();
        let live_refs: Vec<&str> = live.iter().map(String::as_str).collect();
        let mut polls = 0u64;
        let system = self.system;
        Ok(wait_for(
            &format!("{}: every range with a caught-up replica", system.name()),
            PATIENCE,
            || {
                polls += 1;
                for addr in &live {
                    let mut c = connect(addr).ok()?;
                    let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).ok()?;
                    if !info.contains("cluster_state:ok") {
                        return None;
                    }
                }
                let ranges = live
                    .iter()
                    .filter_map(|a| slot_ranges(a))
                    .find(|r| served(r, &live_refs))?;
                for r in &ranges {
                    if r.backups.is_empty() {
                        return None;
                    }
                    let mut c = connect(&r.primary).ok()?;
                    if !system.is_redis() && polls % 20 == 1 {
                        let _ = redis::cmd("SAVE").query::<redis::Value>(&mut c);
                    }
                    let info: String = redis::cmd("INFO").arg("replication").query(&mut c).ok()?;
                    if !caught_up(system, &info) {
                        return None;
                    }
                }
                // Tucana promotes only backups its map lists in sync.
                if !system.is_redis() && !backups_in_sync(&live[0])? {
                    return None;
                }
                Some(ranges)
            },
        )?)
    }

    /// Stops every node (SIGTERM), then etcd.
    pub(super) fn stop(mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
    }
}

/// Whether a primary's `INFO replication` shows replicas, all online and caught up
/// (Redis: at the master's offset; Tucana: no bytes left to ship).
fn caught_up(system: System, info: &str) -> bool {
    if system.is_redis() {
        return redis_cluster::caught_up(info);
    }
    redis_cluster::online_replicas(info)
        .is_some_and(|replicas| replicas.iter().all(|l| l.contains("lag_bytes=0,")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tucana_backups_are_caught_up_with_no_bytes_to_ship() {
        let info =
            "role:master\r\nslave0:ip=127.0.0.1,port=7404,state=online,lag_bytes=0,offset=9\r\n";
        assert!(caught_up(System::Tucana, info));
        assert!(!caught_up(
            System::Tucana,
            &info.replace("lag_bytes=0,", "lag_bytes=17,")
        ));
    }

    #[test]
    fn redis_nodes_run_with_aof_everysec_and_the_chosen_timeout() {
        let args = System::Redis.node_args("7301", "/d", "", 5000).join(" ");
        assert!(args.contains("--appendonly yes --appendfsync everysec"));
        assert!(args.contains("--cluster-enabled yes"));
        assert!(args.contains("--cluster-node-timeout 5000"));
        let tucana = System::Tucana
            .node_args("7401", "/d", "http://e", 5000)
            .join(" ");
        assert!(tucana.contains("--repl-port 17401"));
        assert!(tucana.contains("--cluster-lease-ms 5000"));
        assert!(tucana.ends_with("--durability sync"));
        let shown = System::Redis.command_lines(5000).join("\n");
        assert!(shown.contains("--save '' --daemonize no"), "{shown}");
    }
}
