//! A primary and its backups as separate `tucana serve` processes on this machine, each
//! on a fresh volume and free ports: the setups compared, their command lines, starting
//! them (backups first, then the primary, then the link), waiting until the backups
//! have caught up with a commit, sampling every process, and stopping them (SIGTERM,
//! SIGKILL after a timeout, also on drop) or killing the primary for a failover.
//!
//! Owns the processes and the setups' flags; what is read of them is `sample`'s.
//! Single-threaded.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::ValueEnum;

use super::sample::{read_links, ClusterSample, LinkSample, NodeSample};
use crate::server::process::free_port;
use crate::server::resp::{command, connect, ping};
use crate::{sys, Result};

/// How long a server may take to answer its first PING, and a primary to see its backups.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long backups may take to catch up after a phase (a large load's last commit
/// included), and a `SAVE` to return.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a server may take to stop after SIGTERM (it commits first) before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(120);

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(20);

/// The setups compared: how many backups the primary ships to, what kind, and two
/// variants of one send-index backup that differ from `send-index-1` in one flag of the
/// primary each, measured beside it (a variant's name is its default's plus a suffix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Setup {
    /// The primary alone.
    Unreplicated,
    /// One backup that stores the shipped log and applies the shipped index (Talos).
    #[value(name = "send-index-1")]
    SendIndex1,
    /// As `send-index-1`, with the backup acknowledging only what it synced
    /// (`--repl-ack durable` on the primary; the default acknowledges what it received).
    #[value(name = "send-index-1-durable")]
    SendIndex1Durable,
    /// As `send-index-1`, with every commit's index shipped as it is made
    /// (`--repl-index-lag-ms 0` on the primary; by default a commit whose index would cost
    /// more than a fifth of its log is folded into later ones).
    #[value(name = "send-index-1-every-commit")]
    SendIndex1EveryCommit,
    /// One backup that builds its own index from the shipped records (`--repl-build-index`).
    #[value(name = "build-index-1")]
    BuildIndex1,
    /// Two send-index backups.
    #[value(name = "send-index-2")]
    SendIndex2,
    /// Two build-index backups.
    #[value(name = "build-index-2")]
    BuildIndex2,
}

impl Setup {
    /// Every setup, in the order a default run takes them: the one-backup setups next to
    /// each other (the variants right after the default they vary), then the two-backup.
    pub(super) const ALL: [Setup; 7] = [
        Setup::Unreplicated,
        Setup::SendIndex1,
        Setup::SendIndex1Durable,
        Setup::SendIndex1EveryCommit,
        Setup::BuildIndex1,
        Setup::SendIndex2,
        Setup::BuildIndex2,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Setup::Unreplicated => "unreplicated",
            Setup::SendIndex1 => "send-index-1",
            Setup::SendIndex1Durable => "send-index-1-durable",
            Setup::SendIndex1EveryCommit => "send-index-1-every-commit",
            Setup::BuildIndex1 => "build-index-1",
            Setup::SendIndex2 => "send-index-2",
            Setup::BuildIndex2 => "build-index-2",
        }
    }

    pub(super) fn backups(self) -> usize {
        match self {
            Setup::Unreplicated => 0,
            Setup::SendIndex1
            | Setup::SendIndex1Durable
            | Setup::SendIndex1EveryCommit
            | Setup::BuildIndex1 => 1,
            Setup::SendIndex2 | Setup::BuildIndex2 => 2,
        }
    }

    pub(super) fn builds_index(self) -> bool {
        matches!(self, Setup::BuildIndex1 | Setup::BuildIndex2)
    }

    /// The backups' flags after `serve --port PORT`.
    fn backup_flags(self, repl_port: u16) -> Vec<String> {
        let mut flags = vec!["--repl-port".to_string(), repl_port.to_string()];
        if self.builds_index() {
            flags.push("--repl-build-index".into());
        }
        flags
    }

    /// The primary's flags besides its `--backup`s (the server's defaults otherwise).
    fn primary_flags(self) -> &'static [&'static str] {
        match self {
            Setup::SendIndex1Durable => &["--repl-ack", "durable"],
            Setup::SendIndex1EveryCommit => &["--repl-index-lag-ms", "0"],
            _ => &[],
        }
    }

    /// Each process's command line, for the results file (`DIR`, `PORT`, `RPORT`: the
    /// run's own).
    pub(super) fn command_lines(self) -> Vec<String> {
        let mut lines: Vec<String> = (0..self.backups())
            .map(|i| {
                let build = if self.builds_index() {
                    " --repl-build-index"
                } else {
                    ""
                };
                format!("tucana --db DIR/backup{i}.tucana serve --port PORT --repl-port RPORT{i}{build}")
            })
            .collect();
        let backups: String = (0..self.backups())
            .map(|i| format!(" --backup 127.0.0.1:RPORT{i}"))
            .collect();
        let extra: String = self
            .primary_flags()
            .iter()
            .map(|flag| format!(" {flag}"))
            .collect();
        lines.push(format!(
            "tucana --db DIR/primary.tucana serve --port PORT{backups}{extra}"
        ));
        lines
    }
}

/// One `tucana serve` process, ours to stop.
pub(super) struct Node {
    name: String,
    pub(super) port: u16,
    /// The replication port of a backup.
    pub(super) repl_port: Option<u16>,
    child: Child,
    log: PathBuf,
    stopped: bool,
}

impl Node {
    /// Starts `tucana --db DIR/NAME.tucana serve --port P FLAGS` and waits for PING.
    fn start(tucana: &Path, dir: &Path, name: &str, flags: &[String]) -> Result<Node> {
        let port = free_port()?;
        let log = dir.join(format!("{name}.stderr"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(tucana)
            .arg("--db")
            .arg(dir.join(format!("{name}.tucana")))
            .args(["serve", "--port", &port.to_string()])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", tucana.display()))?;
        let mut node = Node {
            name: name.to_string(),
            port,
            repl_port: None,
            child,
            log,
            stopped: false,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while ping(port).is_err() {
            node.check_running()?;
            if Instant::now() > deadline {
                return Err(format!("{name} did not answer PING on port {port}").into());
            }
            std::thread::sleep(POLL);
        }
        Ok(node)
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error with the process's log if it has exited.
    fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            self.stopped = true;
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(format!("{} exited ({status}): {log}", self.name).into());
        }
        Ok(())
    }

    /// Sends `args` on a fresh connection and returns the reply's first line.
    pub(super) fn request(&self, args: &[&[u8]], timeout: Duration) -> Result<String> {
        let mut stream = connect(self.port)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(&command(args))?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line)?;
        Ok(line.trim_end().to_string())
    }

    /// `SAVE`: commit now; returns once the commit is durable.
    fn save(&self) -> Result<()> {
        let reply = self.request(&[b"SAVE"], SETTLE_TIMEOUT)?;
        if reply != "+OK" {
            return Err(format!("SAVE on {} answered {reply:?}", self.name).into());
        }
        Ok(())
    }

    fn sample(&self) -> NodeSample {
        NodeSample::read(self.pid(), self.port)
    }

    /// SIGKILL, as a crash: nothing more is written.
    pub(super) fn kill(&mut self) -> Result<()> {
        self.stopped = true;
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM, then SIGKILL if the server does not exit in time. Also run on drop.
    pub(super) fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        sys::send_sigterm(self.child.id())?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                self.child.kill()?;
                self.child.wait()?;
                return Err(format!("{} did not stop on SIGTERM", self.name).into());
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}

/// Whether `backup` has applied the primary's commit `epoch` in every replica it holds;
/// true of a backup with no replica yet when the primary shipped it nothing (no region).
fn mirrors(backup: &Node, epoch: u64, link: &LinkSample) -> bool {
    let commits = backup.sample().replica_commits;
    if commits.is_empty() {
        return link.shipped_log_bytes == 0;
    }
    commits.iter().all(|&c| c >= epoch)
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            eprintln!("stopping {}: {error}", self.name);
        }
    }
}

/// A primary and its backups, started for one setup.
pub(super) struct Cluster {
    pub(super) setup: Setup,
    pub(super) primary: Node,
    pub(super) backups: Vec<Node>,
}

impl Cluster {
    /// Starts `setup` with its volumes in `dir` (fresh): the backups, then the primary
    /// pointing at them; returns once the primary reports every link online.
    pub(super) fn start(setup: Setup, tucana: &Path, dir: &Path) -> Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        let mut backups = Vec::new();
        for i in 0..setup.backups() {
            let repl_port = free_port()?;
            let mut node = Node::start(
                tucana,
                dir,
                &format!("backup{i}"),
                &setup.backup_flags(repl_port),
            )?;
            node.repl_port = Some(repl_port);
            backups.push(node);
        }
        let mut flags: Vec<String> = backups
            .iter()
            .flat_map(|b| {
                let port = b.repl_port.unwrap_or(0);
                ["--backup".to_string(), format!("127.0.0.1:{port}")]
            })
            .collect();
        flags.extend(setup.primary_flags().iter().map(|f| f.to_string()));
        let primary = Node::start(tucana, dir, "primary", &flags)?;
        let mut cluster = Cluster {
            setup,
            primary,
            backups,
        };
        cluster.wait_links(START_TIMEOUT, |link| link.online)?;
        Ok(cluster)
    }

    /// Waits until every link satisfies `ready` (checking that every process still runs).
    fn wait_links(&mut self, timeout: Duration, ready: impl Fn(&LinkSample) -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let links = read_links(self.primary.port).unwrap_or_default();
            if links.len() == self.backups.len() && links.iter().all(|(_, l)| ready(l)) {
                return Ok(());
            }
            self.primary.check_running()?;
            for backup in &mut self.backups {
                backup.check_running()?;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: the primary's links did not get there in {timeout:?}: {links:?}",
                    self.setup.name()
                )
                .into());
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until every link is online and no backup lags.
    pub(super) fn wait_caught_up(&mut self) -> Result<()> {
        self.wait_links(SETTLE_TIMEOUT, |l| l.online && l.lag_bytes == 0)
    }

    /// Makes what a phase wrote reach every backup as it would after a commit: waits
    /// until no link lags, commits the primary (`SAVE`), waits until every send-index
    /// backup mirrors that commit (each commit ships once the primary has a region) and
    /// commits every build-index backup (`SAVE`: its own index, persisted as the
    /// send-index backup's is by the shipped nodes), then waits for no lag again. How
    /// long it took.
    pub(super) fn settle(&mut self) -> Result<Duration> {
        let started = Instant::now();
        self.wait_caught_up()?;
        self.primary.save()?;
        if self.setup.builds_index() {
            for backup in &self.backups {
                backup.save()?;
            }
        } else {
            let epoch = self
                .primary
                .sample()
                .field("commit_epoch")
                .ok_or("the primary reports no commit_epoch")?;
            let deadline = Instant::now() + SETTLE_TIMEOUT;
            for (i, backup) in self.backups.iter().enumerate() {
                while !mirrors(backup, epoch, &self.sample()?.links[i]) {
                    if Instant::now() > deadline {
                        return Err(format!(
                            "{}: backup{i} did not apply commit {epoch}",
                            self.setup.name()
                        )
                        .into());
                    }
                    std::thread::sleep(POLL);
                }
            }
        }
        self.wait_caught_up()?;
        Ok(started.elapsed())
    }

    /// Every process and link now.
    pub(super) fn sample(&self) -> Result<ClusterSample> {
        let links = read_links(self.primary.port).ok_or("the primary did not answer INFO")?;
        Ok(ClusterSample {
            primary: self.primary.sample(),
            backups: self.backups.iter().map(Node::sample).collect(),
            links: self
                .backups
                .iter()
                .map(|b| {
                    links
                        .iter()
                        .find(|(port, _)| Some(*port) == b.repl_port)
                        .map(|(_, link)| link.clone())
                        .unwrap_or_default()
                })
                .collect(),
        })
    }

    /// Stops the primary first (its final commit ships to live backups), then the backups.
    pub(super) fn stop(&mut self) -> Result<()> {
        let mut result = self.primary.stop();
        for backup in &mut self.backups {
            let stopped = backup.stop();
            if result.is_ok() {
                result = stopped;
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setups_have_their_flags() {
        assert_eq!(Setup::Unreplicated.backups(), 0);
        assert_eq!(
            Setup::BuildIndex2.backup_flags(7),
            ["--repl-port", "7", "--repl-build-index"]
        );
        assert_eq!(Setup::SendIndex1.backup_flags(7), ["--repl-port", "7"]);
        let lines = Setup::BuildIndex2.command_lines();
        assert_eq!(
            lines[0],
            "tucana --db DIR/backup0.tucana serve --port PORT --repl-port RPORT0 --repl-build-index"
        );
        assert_eq!(
            lines[2],
            "tucana --db DIR/primary.tucana serve --port PORT --backup 127.0.0.1:RPORT0 --backup 127.0.0.1:RPORT1"
        );
        assert_eq!(
            Setup::Unreplicated.command_lines(),
            ["tucana --db DIR/primary.tucana serve --port PORT"]
        );
    }

    #[test]
    fn variants_differ_from_send_index_1_in_one_primary_flag() {
        let base = Setup::SendIndex1.command_lines();
        for (setup, flag) in [
            (Setup::SendIndex1Durable, " --repl-ack durable"),
            (Setup::SendIndex1EveryCommit, " --repl-index-lag-ms 0"),
        ] {
            assert_eq!(setup.backups(), 1);
            assert!(!setup.builds_index());
            assert_eq!(setup.backup_flags(7), Setup::SendIndex1.backup_flags(7));
            let lines = setup.command_lines();
            assert_eq!(lines[0], base[0]);
            assert_eq!(lines[1], format!("{}{flag}", base[1]));
            assert!(setup.name().starts_with("send-index-1-"));
        }
        assert!(Setup::ALL
            .iter()
            .all(|s| Setup::from_str(s.name(), false) == Ok(*s)));
    }
}
