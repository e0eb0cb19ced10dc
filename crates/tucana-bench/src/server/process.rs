//! A running server, ours to stop: start it (inside a memory cgroup if asked) and wait
//! for PING, let it finish what the load left it to do, sample what it used around each
//! test (CPU time, sleeps and peak RSS from /proc, log syncs from INFO, device traffic),
//! and stop it (SIGTERM, then SIGKILL), also on drop.
//!
//! Owns the server processes and the /proc readings; the wire is `resp`'s. Single-threaded.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::kind::{Programs, ServerKind};
use super::resp::{command, connect, info_field, ping};
use crate::{cgroup, measure, sys, Result};

/// How long a server may take to answer its first PING (a large volume's recovery included).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a server may take to stop after SIGTERM (it commits first) before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a server may take to finish what the load left it to do.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(300);

/// A running server: ours to stop.
pub(super) struct Server {
    pub(super) kind: ServerKind,
    pub(super) port: u16,
    pub(super) child: Child,
    stopped: bool,
}

/// What a server has used so far, read around each test.
pub(super) struct Sample {
    pub(super) cpu_ticks: Option<u64>,
    /// Voluntary context switches of the server's threads (see `process_sleeps`).
    pub(super) sleeps: Option<u64>,
    pub(super) peak_rss_bytes: Option<u64>,
    pub(super) syncs: Option<u64>,
    pub(super) device: Option<sys::ProcessIo>,
}

impl Server {
    /// Starts `kind` on a free port with its data in `data_dir` (inside `group` if given) and
    /// waits until it answers PING.
    pub(super) fn start(
        kind: ServerKind,
        programs: &Programs,
        data_dir: &Path,
        group: Option<&cgroup::MemoryCgroup>,
    ) -> Result<Server> {
        let port = free_port()?;
        let log = std::fs::File::create(data_dir.join("server.stderr"))?;
        let mut flags = kind.flags(data_dir, port);
        if let (true, Some(threads)) = (kind.is_tucana(), programs.tucana_threads) {
            flags.extend(["--threads".to_string(), threads.to_string()]);
        }
        let child = Command::new(programs.program(kind))
            .args(flags)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", programs.program(kind).display()))?;
        let mut server = Server {
            kind,
            port,
            child,
            stopped: false,
        };
        if let Some(group) = group {
            // Right after the spawn: the server has done nothing yet worth charging elsewhere.
            group.add_process(server.child.id())?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = server.child.try_wait()? {
                server.stopped = true;
                let log =
                    std::fs::read_to_string(data_dir.join("server.stderr")).unwrap_or_default();
                return Err(format!("{} exited at start ({status}): {log}", kind.name()).into());
            }
            if ping(port).is_ok() {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not answer PING on port {port}", kind.name()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the server has finished the work the load left behind, so that the first
    /// test does not pay for it: Tucana's commit of the loaded keys (`SAVE`: commit now; the
    /// committer would otherwise do it during the first test), redis-server's automatic AOF
    /// rewrite if one is running or scheduled. How long it took.
    pub(super) fn settle(&self) -> Result<Duration> {
        let started = Instant::now();
        if self.kind.is_tucana() {
            let mut stream = connect(self.port)?;
            stream.set_read_timeout(Some(SETTLE_TIMEOUT))?;
            stream.write_all(&command(&[b"SAVE"]))?;
            let mut line = String::new();
            BufReader::new(stream).read_line(&mut line)?;
            if line != "+OK\r\n" {
                return Err(format!("SAVE answered {line:?}").into());
            }
            return Ok(started.elapsed());
        }
        loop {
            let busy = ["aof_rewrite_in_progress", "aof_rewrite_scheduled"]
                .iter()
                .any(|field| info_field(self.port, "persistence", field) != Some(0));
            if !busy {
                return Ok(started.elapsed());
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err("redis-server's AOF rewrite did not finish".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(super) fn sample(&self) -> Sample {
        let pid = self.child.id();
        Sample {
            cpu_ticks: process_cpu_ticks(pid),
            sleeps: process_sleeps(pid),
            peak_rss_bytes: process_peak_rss_bytes(pid),
            syncs: if self.kind.is_tucana() {
                info_field(self.port, "persistence", "syncs")
            } else {
                None
            },
            device: measure::device_io_now(),
        }
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
                return Err(format!("{} did not stop on SIGTERM", self.kind.name()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            eprintln!("stopping {}: {error}", self.kind.name());
        }
    }
}

/// A port nobody listens on now. Another program could take it before the server does;
/// the server then fails to start and says so.
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// utime + stime of every thread of `pid` so far, in clock ticks, from /proc/PID/stat.
pub(crate) fn process_cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu_ticks(&text)
}

fn parse_stat_cpu_ticks(text: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces or ')': the fields
    // after the last ')' start at field 3 (state); utime and stime are fields 14 and 15.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Voluntary context switches of all the threads of `pid`: each is a thread going to
/// sleep (on `epoll_wait`, a lock, a condition, I/O), and each is woken again by someone,
/// on loopback often the client's `send`. Threads that ended are not counted.
fn process_sleeps(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        // A thread may end between the listing and the read.
        if let Ok(text) = std::fs::read_to_string(task.path().join("status")) {
            total += parse_voluntary_switches(&text).unwrap_or(0);
        }
    }
    Some(total)
}

fn parse_voluntary_switches(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// Peak RSS of `pid` since the last reset, then resets it so that the next reading is
/// the next test's own peak (best effort: without the reset it is the peak so far).
fn process_peak_rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut words = line.split_whitespace().skip(1);
    let amount: u64 = words.next()?.parse().ok()?;
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), b"5");
    match words.next() {
        Some("kB") => Some(amount * 1024),
        _ => None,
    }
}

/// The 1, 5 and 15-minute load averages, from /proc/loadavg.
pub(crate) fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_ticks_survive_odd_command_names() {
        // Fields 14 and 15 (utime 7, stime 5) after a name holding ") (".
        let stat = "42 (a) (b) S 1 42 42 0 -1 4194304 100 0 0 0 7 5 0 0 20 0 3 0 100 1000 50";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(12));
        assert_eq!(parse_stat_cpu_ticks("42 (a) S 1"), None);
    }

    #[test]
    fn voluntary_switches_are_not_confused_with_involuntary_ones() {
        let status = "Name:\tx\nnonvoluntary_ctxt_switches:\t9\nvoluntary_ctxt_switches:\t41\n";
        assert_eq!(parse_voluntary_switches(status), Some(41));
        assert_eq!(
            parse_voluntary_switches("nonvoluntary_ctxt_switches:\t9\n"),
            None
        );
    }

    #[test]
    fn own_process_is_measurable() {
        let pid = std::process::id();
        assert!(process_cpu_ticks(pid).is_some());
        // A sleep of this thread is counted.
        let sleeps = process_sleeps(pid).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(process_sleeps(pid).unwrap() > sleeps, "a sleep is counted");
        assert!(process_peak_rss_bytes(pid).unwrap() > 0);
        assert!(load_average().is_some());
    }
}
