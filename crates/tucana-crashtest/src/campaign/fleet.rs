//! The campaign's cluster: etcd and the Tucana servers, each server in a network
//! namespace of its own ([`tucana_clusterprobe::netns::Net`]) or, without root or `ip
//! netns`, all on loopback; the map as the servers report it; waiting until the cluster
//! settled (every slot served by a live primary, every region with a backup in sync).
//!
//! Owns the processes and the namespaces (stopped and removed when dropped: servers
//! first, then etcd, then the network). Driven from the nemesis thread only.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tucana_clusterprobe::etcd::Etcd;
use tucana_clusterprobe::netns::Net;
use tucana_clusterprobe::{
    backups_in_sync_with, cluster_info_with, served, slot_ranges_with, Range,
};

use crate::serve::{free_port, Place, Server};

/// The cluster's name in etcd.
pub const NAME: &str = "campaign";
/// Every server's `--requirepass` (servers off loopback must have one).
pub const PASSWORD: &str = "campaign-pass";

pub struct Fleet {
    /// Fields drop in order: servers, then etcd, then the namespaces.
    pub servers: Vec<Server>,
    /// Whether each server runs (not killed, not stopped).
    pub up: Vec<bool>,
    pub etcd: Etcd,
    pub net: Option<Net>,
    pub tucana: PathBuf,
    pub log: PathBuf,
    pub password: Option<String>,
}

impl Fleet {
    /// Starts etcd and `count` servers (in namespaces if `net` is given), and creates
    /// the map with one backup per region.
    pub fn start(
        tucana: &Path,
        dir: &Path,
        count: usize,
        lease_ms: u64,
        net: Option<Net>,
    ) -> Result<Fleet, String> {
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
            servers.push(Server::start_at(tucana, &db, place, port, &args, &log)?);
        }
        let fleet = Fleet {
            up: vec![true; servers.len()],
            servers,
            etcd,
            net,
            tucana: tucana.to_path_buf(),
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

    pub fn addrs(&self) -> Vec<String> {
        self.servers.iter().map(Server::addr).collect()
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
        let mut command = Command::new(&self.tucana);
        command
            .args(&args[..2])
            .args(["--etcd", &self.etcd.endpoint, "--name", NAME])
            .args(&args[2..])
            .stdin(Stdio::null());
        let output = command.output().map_err(|e| e.to_string())?;
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
}
