//! The campaign's cluster, of one [`Target`]: etcd and the Tucana servers, or six
//! Redis Cluster nodes (three masters, three replicas, made by `redis-cli --cluster
//! create`, run as [`tucana_clusterprobe::redis_cluster`] says); each server in a
//! network namespace of its own ([`tucana_clusterprobe::netns::Net`]) or, without root
//! or `ip netns`, all on loopback; each server killed, paused, restarted on its files;
//! the map as the servers report it; waiting until the cluster settled (Tucana: every
//! server registered, every slot served by a live primary, every region with a backup
//! in sync; Redis: every live node says `cluster_state:ok` and agrees on the map, every
//! slot is served by a live master, every master has an online replica).
//!
//! Owns the processes and the namespaces (stopped and removed when dropped: servers
//! first, then etcd, then the network). Driven from the nemesis thread only.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tucana_clusterprobe::etcd::Etcd;
use tucana_clusterprobe::netns::Net;
use tucana_clusterprobe::process::{free_port_pair, Process};
use tucana_clusterprobe::redis_cluster::{self, NodeConfig};
use tucana_clusterprobe::{
    backups_in_sync_with, cluster_info_with, connect_with, served, slot_ranges_with, Range,
};

use crate::serve::{free_port, Place, Server};

/// The cluster's name in etcd.
pub const NAME: &str = "campaign";
/// Every server's `--requirepass` (servers off loopback must have one).
pub const PASSWORD: &str = "campaign-pass";

/// The system a campaign runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// Tucana: etcd and 3 to 5 `tucana serve --durability sync` servers.
    Tucana,
    /// Redis Cluster: 6 `redis-server --cluster-enabled yes` nodes, 3 masters with one
    /// replica each, `appendonly yes`.
    Redis,
}

impl Target {
    /// The name the figure line carries.
    pub fn name(self) -> &'static str {
        match self {
            Target::Tucana => "tucana",
            Target::Redis => "redis-cluster",
        }
    }
}

/// Redis Cluster's nodes: 3 masters, each with one replica.
pub const REDIS_NODES: usize = 6;

/// One server of the fleet.
pub enum Member {
    Tucana(Server),
    Redis(Process),
}

impl Member {
    pub fn addr(&self) -> String {
        match self {
            Member::Tucana(s) => s.addr(),
            Member::Redis(p) => p.addr(),
        }
    }

    pub fn signal(&self, signal: i32) {
        match self {
            Member::Tucana(s) => s.signal(signal),
            Member::Redis(p) => p.signal(signal),
        }
    }

    pub fn kill9(&mut self) {
        match self {
            Member::Tucana(s) => s.kill9(),
            Member::Redis(p) => p.kill9(),
        }
    }
}

/// The programs a fleet runs.
pub struct Programs {
    pub tucana: PathBuf,
    pub redis_server: PathBuf,
    pub redis_cli: PathBuf,
}

pub struct Fleet {
    pub target: Target,
    /// Fields drop in order: servers, then etcd, then the namespaces.
    pub servers: Vec<Member>,
    /// Whether each server runs (not killed, not stopped).
    pub up: Vec<bool>,
    /// Tucana's coordinator (none for Redis Cluster).
    pub etcd: Option<Etcd>,
    pub net: Option<Net>,
    pub programs: Programs,
    pub log: PathBuf,
    pub password: Option<String>,
}

impl Fleet {
    /// Starts etcd and `count` servers (in namespaces if `net` is given), and creates
    /// the map with one backup per region.
    pub fn start(
        programs: Programs,
        dir: &Path,
        count: usize,
        lease_ms: u64,
        net: Option<Net>,
    ) -> Result<Fleet, String> {
        let tucana = &programs.tucana;
        let etcd_hosts: Vec<String> = net
            .as_ref()
            .map(|n| n.nodes.iter().map(|node| node.etcd_ip()).collect())
            .unwrap_or_default();
        let etcd = Etcd::start_on(dir, NAME, &etcd_hosts, Duration::from_secs(60))?;
        let log = dir.join("servers.log");
        let password = net.as_ref().map(|_| PASSWORD.to_string());
        let mut servers = Vec::new();
        for i in 0..count {
            let (place, etcd_url, port, repl) = match &net {
                Some(net) => {
                    let node = &net.nodes[i];
                    let place = Place {
                        host: node.server_ip(),
                        netns: Some(node.netns.clone()),
                        password: password.clone(),
                    };
                    (
                        place,
                        format!("http://{}:{}", node.etcd_ip(), etcd.port),
                        7000,
                        7100,
                    )
                }
                None => {
                    let place = Place {
                        host: "127.0.0.1".into(),
                        netns: None,
                        password: None,
                    };
                    let port = free_port().map_err(|e| e.to_string())?;
                    let repl = free_port().map_err(|e| e.to_string())?;
                    (place, etcd.endpoint.clone(), port, repl)
                }
            };
            let args: Vec<String> = [
                "--durability",
                "sync",
                "--cluster-etcd",
                &etcd_url,
                "--cluster-name",
                NAME,
                "--cluster-lease-ms",
                &lease_ms.to_string(),
                "--repl-port",
                &repl.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let db = dir.join(format!("server{i}.tucana"));
            servers.push(Member::Tucana(Server::start_at(
                tucana, &db, place, port, &args, &log,
            )?));
        }
        let fleet = Fleet {
            target: Target::Tucana,
            up: vec![true; servers.len()],
            servers,
            etcd: Some(etcd),
            net,
            programs,
            log,
            password,
        };
        let addrs = fleet.addrs();
        let out = fleet.tucana_cli(
            &[
                &["cluster", "create", "--replicas", "1"][..],
                &addrs.iter().map(String::as_str).collect::<Vec<_>>(),
            ]
            .concat(),
        )?;
        let _ = out;
        Ok(fleet)
    }

    /// Starts [`REDIS_NODES`] Redis Cluster nodes (in namespaces if `net` is given) with
    /// `cluster-node-timeout` `timeout_ms` and `appendfsync` `fsync`, each with its files
    /// in a directory of its own under `dir`, and makes the cluster (3 masters, one
    /// replica each).
    pub fn start_redis(
        programs: Programs,
        dir: &Path,
        timeout_ms: u64,
        fsync: &str,
        net: Option<Net>,
    ) -> Result<Fleet, String> {
        let log = dir.join("servers.log");
        let password = net.as_ref().map(|_| PASSWORD.to_string());
        let mut servers = Vec::new();
        for i in 0..REDIS_NODES {
            let (host, netns, port) = match &net {
                Some(net) => (
                    net.nodes[i].server_ip(),
                    Some(net.nodes[i].netns.clone()),
                    7000,
                ),
                None => ("127.0.0.1".to_string(), None, free_port_pair()?),
            };
            let node_dir = dir.join(format!("redis{i}"));
            std::fs::create_dir_all(&node_dir)
                .map_err(|e| format!("{}: {e}", node_dir.display()))?;
            let dir_text = node_dir.display().to_string();
            let port_text = port.to_string();
            let args = redis_cluster::server_args(&NodeConfig {
                port: &port_text,
                bind: &host,
                dir: &dir_text,
                timeout_ms,
                appendfsync: fsync,
                password: password.as_deref(),
            });
            let mut node = Process {
                program: programs.redis_server.clone(),
                args,
                host,
                port,
                netns,
                password: password.clone(),
                log: log.clone(),
                child: None,
            };
            node.spawn()?;
            servers.push(Member::Redis(node));
        }
        for server in &mut servers {
            if let Member::Redis(node) = server {
                node.wait_ping(Duration::from_secs(30))?;
            }
        }
        let fleet = Fleet {
            target: Target::Redis,
            up: vec![true; servers.len()],
            servers,
            etcd: None,
            net,
            programs,
            log,
            password,
        };
        redis_cluster::create(&fleet.programs.redis_cli, &fleet.addrs(), fleet.password())?;
        Ok(fleet)
    }

    /// Starts server `i` again on its files (it was killed) and waits until it answers.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        match &mut self.servers[i] {
            Member::Tucana(s) => s.restart(&self.programs.tucana, &self.log)?,
            Member::Redis(p) => {
                p.spawn()?;
                p.wait_ping(Duration::from_secs(30))?;
            }
        }
        self.up[i] = true;
        Ok(())
    }

    pub fn addrs(&self) -> Vec<String> {
        self.servers.iter().map(Member::addr).collect()
    }

    pub fn live(&self) -> Vec<String> {
        self.servers
            .iter()
            .zip(&self.up)
            .filter(|(_, up)| **up)
            .map(|(s, _)| s.addr())
            .collect()
    }

    pub fn index_of(&self, addr: &str) -> Option<usize> {
        self.servers.iter().position(|s| s.addr() == addr)
    }

    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// `tucana cluster SUBCOMMAND --etcd E --name N ARGS...` (the subcommand first in
    /// `args`); its stdout, or its stderr as the error.
    pub fn tucana_cli(&self, args: &[&str]) -> Result<String, String> {
        let output = self
            .tucana_cli_command(args)?
            .output()
            .map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "tucana {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// The `tucana cluster` command for `args` (the subcommand's two words first), with
    /// this cluster's etcd and name, not started.
    pub fn tucana_cli_command(&self, args: &[&str]) -> Result<Command, String> {
        let etcd = self.etcd.as_ref().ok_or("no etcd: not a Tucana cluster")?;
        let mut command = Command::new(&self.programs.tucana);
        command
            .args(&args[..2])
            .args(["--etcd", &etcd.endpoint, "--name", NAME])
            .args(&args[2..])
            .stdin(Stdio::null());
        Ok(command)
    }

    /// The map as the first live server asked (other than `besides`) reports it, if it
    /// covers every slot with a live primary.
    pub fn served_map(&self, besides: Option<&str>) -> Option<Vec<Range>> {
        let live = self.live();
        let live_refs: Vec<&str> = live.iter().map(String::as_str).collect();
        live.iter()
            .filter(|a| Some(a.as_str()) != besides)
            .filter_map(|a| slot_ranges_with(a, self.password()))
            .find(|r| served(r, &live_refs))
    }

    /// Waits (at most `patience`) until every live server is registered (`CLUSTER INFO`
    /// says its lease is valid: a restarted server takes itself out of the in-sync lists before
    /// it registers, so the map is only then what the next fault meets), every slot is
    /// served by a live primary and every region has a backup, all in sync; the map then.
    pub fn settle(&self, patience: Duration) -> Result<Vec<Range>, String> {
        if self.target == Target::Redis {
            return self.settle_redis(patience);
        }
        tucana_clusterprobe::wait_for("the cluster settled", patience, || {
            let registered = self.live().iter().all(|a| {
                cluster_info_with(a, self.password())
                    .is_some_and(|info| info.contains("tucana_lease_valid:1"))
            });
            if !registered {
                return None;
            }
            let ranges = self.served_map(None)?;
            if ranges.iter().any(|r| r.backups.is_empty()) {
                return None;
            }
            backups_in_sync_with(&ranges[0].primary, self.password())?.then_some(ranges)
        })
    }

    /// Redis Cluster's settle: waits (at most `patience`) until every live node says
    /// `cluster_state:ok` and serves the same map, every slot is served by a live master
    /// and every master has replicas, all online (`INFO replication`); the map then.
    fn settle_redis(&self, patience: Duration) -> Result<Vec<Range>, String> {
        tucana_clusterprobe::wait_for("the Redis cluster settled", patience, || {
            let live = self.live();
            let live_refs: Vec<&str> = live.iter().map(String::as_str).collect();
            let mut maps = Vec::new();
            for a in &live {
                let info = cluster_info_with(a, self.password())?;
                if !info.contains("cluster_state:ok") {
                    return None;
                }
                let map = slot_ranges_with(a, self.password())?;
                if !served(&map, &live_refs) {
                    return None;
                }
                maps.push(map);
            }
            let ranges = maps.pop()?;
            let same = |m: &Vec<Range>| {
                m.len() == ranges.len()
                    && m.iter()
                        .zip(&ranges)
                        .all(|(x, y)| (x.start, x.end, &x.primary) == (y.start, y.end, &y.primary))
            };
            if !maps.iter().all(same) {
                return None;
            }
            for r in &ranges {
                if r.backups.is_empty() {
                    return None;
                }
                let mut c = connect_with(&r.primary, self.password()).ok()?;
                let info: String = redis::cmd("INFO").arg("replication").query(&mut c).ok()?;
                redis_cluster::online_replicas(&info)?;
            }
            Some(ranges)
        })
    }
}
