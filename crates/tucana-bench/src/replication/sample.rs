//! What the harness reads of a running cluster at the edges of a phase: per process its
//! CPU time (utime + stime of every thread, /proc/PID/stat), the bytes it made the block
//! device read and write (/proc/PID/io), and its INFO fields; per primary → backup link
//! what the primary says it shipped (INFO replication `slaveN`) and the TCP payload
//! bytes of the replication connection in each direction (`ss -ti`, the kernel's
//! `tcp_info`).
//!
//! Owns the readings and their parsers (pure, unit-tested); what a phase's figures are
//! is `figures`'. Single-threaded.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use crate::server::process::process_cpu_ticks;
use crate::server::resp::info;
use crate::sys::{self, ProcessIo};

/// The INFO sections whose numeric fields a sample keeps.
const SECTIONS: [&str; 2] = ["persistence", "replication"];

/// One process at one instant.
#[derive(Clone, Debug, Default)]
pub(super) struct NodeSample {
    pub(super) cpu_ticks: Option<u64>,
    pub(super) io: Option<ProcessIo>,
    /// Numeric fields of INFO persistence and replication (`commits`,
    /// `disk_bytes_written`, `tucana_log_cpu_ns`, ...).
    pub(super) fields: BTreeMap<String, u64>,
    /// The primary's commit epoch each replica region of a backup mirrors.
    pub(super) replica_commits: Vec<u64>,
}

impl NodeSample {
    pub(super) fn read(pid: u32, port: u16) -> NodeSample {
        let mut fields = BTreeMap::new();
        let mut replica_commits = Vec::new();
        for section in SECTIONS {
            if let Some(text) = info(port, section) {
                fields.extend(numeric_fields(&text));
                replica_commits.extend(upstream_commits(&text));
            }
        }
        NodeSample {
            cpu_ticks: process_cpu_ticks(pid),
            io: sys::process_io_of(pid),
            fields,
            replica_commits,
        }
    }

    pub(super) fn field(&self, name: &str) -> Option<u64> {
        self.fields.get(name).copied()
    }
}

/// One primary → backup link at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct LinkSample {
    pub(super) online: bool,
    pub(super) lag_bytes: u64,
    pub(super) shipped_log_bytes: u64,
    pub(super) shipped_index_bytes: u64,
    /// The replication connection's TCP payload bytes, `None` when `ss` could not tell.
    pub(super) tcp: Option<TcpBytes>,
}

/// TCP payload bytes of one connection as its primary end counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TcpBytes {
    /// The primary's local port: a different one later means a new connection.
    pub(super) local_port: u16,
    /// Sent by the primary and acknowledged by the backup (retransmissions not counted).
    pub(super) to_backup: u64,
    /// Received by the primary from the backup (acknowledgements, `Applied`).
    pub(super) from_backup: u64,
}

/// A whole cluster at one instant: the primary, each backup, each link (in the order of
/// the primary's `--backup` flags).
#[derive(Clone, Debug, Default)]
pub(super) struct ClusterSample {
    pub(super) primary: NodeSample,
    pub(super) backups: Vec<NodeSample>,
    pub(super) links: Vec<LinkSample>,
}

/// The `name:number` lines of an INFO text.
fn numeric_fields(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.trim_end().split_once(':')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The `upstream_commit` of each `tucana_replica_NAME:term=..,upstream_commit=..` line.
fn upstream_commits(text: &str) -> Vec<u64> {
    text.lines()
        .filter(|line| line.starts_with("tucana_replica_"))
        .filter_map(|line| {
            let (_, value) = line.trim_end().split_once(':')?;
            value
                .split(',')
                .find_map(|p| p.strip_prefix("upstream_commit="))?
                .parse()
                .ok()
        })
        .collect()
}

/// The links the primary's INFO replication lists (`slave0:ip=..,port=..,state=online,
/// lag_bytes=..,shipped_log_bytes=..,shipped_index_bytes=..`), as (replication port,
/// link) in the order listed.
pub(super) fn links_of(info_replication: &str) -> Vec<(u16, LinkSample)> {
    info_replication
        .lines()
        .filter_map(|line| {
            let (name, value) = line.trim_end().split_once(':')?;
            let index = name.strip_prefix("slave")?;
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let pairs: BTreeMap<&str, &str> =
                value.split(',').filter_map(|p| p.split_once('=')).collect();
            let number = |k: &str| pairs.get(k).and_then(|v| v.parse::<u64>().ok());
            let port = pairs.get("port")?.parse().ok()?;
            Some((
                port,
                LinkSample {
                    online: pairs.get("state") == Some(&"online"),
                    lag_bytes: number("lag_bytes")?,
                    shipped_log_bytes: number("shipped_log_bytes")?,
                    shipped_index_bytes: number("shipped_index_bytes")?,
                    tcp: None,
                },
            ))
        })
        .collect()
}

/// The TCP byte counts of the established connection to `127.0.0.1:repl_port` (the
/// primary's end), from `ss`; `None` without `ss` or without exactly one such connection.
pub(super) fn tcp_bytes_to(repl_port: u16) -> Option<TcpBytes> {
    let filter = format!("( dport = :{repl_port} )");
    let output = Command::new("ss")
        .args(["-tinH", "state", "established", &filter])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let found = parse_ss(&String::from_utf8_lossy(&output.stdout));
    match found.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// The connections of `ss -tinH` output: a line with the addresses, then a line of
/// `tcp_info` fields (`bytes_acked:N`, `bytes_received:N`; a zero count may be absent).
fn parse_ss(text: &str) -> Vec<TcpBytes> {
    let mut found = Vec::new();
    let mut local_port = None;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            // "0 0 127.0.0.1:42164 127.0.0.1:27381" (Recv-Q, Send-Q, local, peer).
            local_port = line
                .split_whitespace()
                .nth(2)
                .and_then(|addr| addr.rsplit_once(':'))
                .and_then(|(_, port)| port.parse().ok());
            continue;
        }
        let Some(port) = local_port.take() else {
            continue;
        };
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix(':')?.parse().ok())
                .unwrap_or(0)
        };
        found.push(TcpBytes {
            local_port: port,
            to_backup: field("bytes_acked"),
            from_backup: field("bytes_received"),
        });
    }
    found
}

/// INFO replication of the primary on `port`, parsed into its links, each with the
/// TCP bytes of its connection when `ss` can tell; `None` when the primary does not answer.
pub(super) fn read_links(port: u16) -> Option<Vec<(u16, LinkSample)>> {
    let text = info(port, "replication")?;
    let mut links = links_of(&text);
    for (repl_port, link) in &mut links {
        link.tcp = tcp_bytes_to(*repl_port);
    }
    Some(links)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_and_links_parse() {
        let text = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
            slave0:ip=127.0.0.1,port=27381,state=online,offset=9,lag_bytes=0,shipped_log_bytes=100,shipped_index_bytes=20\r\n\
            slave1:ip=127.0.0.1,port=27383,state=connecting,offset=0,lag_bytes=5,shipped_log_bytes=0,shipped_index_bytes=0\r\n\
            slave1_last_error:refused\r\ntucana_log_cpu_ns:42\r\n\
            tucana_replica_default:term=1,upstream_commit=6,segments=1\r\n";
        let fields = numeric_fields(text);
        assert_eq!(fields.get("connected_slaves"), Some(&2));
        assert_eq!(fields.get("tucana_log_cpu_ns"), Some(&42));
        assert!(!fields.contains_key("role"));
        assert_eq!(upstream_commits(text), [6]);
        let links = links_of(text);
        assert_eq!(links.len(), 2);
        assert_eq!(links[0].0, 27381);
        assert!(links[0].1.online);
        assert_eq!(
            (links[0].1.shipped_log_bytes, links[0].1.shipped_index_bytes),
            (100, 20)
        );
        assert_eq!(
            (links[1].0, links[1].1.online, links[1].1.lag_bytes),
            (27383, false, 5)
        );
    }

    #[test]
    fn ss_output_parses() {
        let text = "0      0      127.0.0.1:42164 127.0.0.1:27381\n\t bbr wscale:10,10 rto:204 mss:65483 \
            bytes_sent:209487668 bytes_retrans:58602 bytes_acked:209429067 bytes_received:588312 segs_out:18148\n\
            0      0      127.0.0.1:42170 127.0.0.1:27381\n\t cubic rto:204 bytes_sent:10 bytes_acked:10\n";
        let found = parse_ss(text);
        assert_eq!(
            found,
            [
                TcpBytes {
                    local_port: 42164,
                    to_backup: 209_429_067,
                    from_backup: 588_312
                },
                TcpBytes {
                    local_port: 42170,
                    to_backup: 10,
                    from_backup: 0
                }
            ]
        );
        assert!(parse_ss("").is_empty());
    }
}
