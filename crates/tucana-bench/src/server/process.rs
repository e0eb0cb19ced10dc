//! A running server, ours to stop: start it (inside a memory cgroup if asked) and wait
//! for PING, let it finish what the load left it to do, sample what it used around each
//! test (CPU time of the process and of its whole process tree, sleeps and peak RSS from
//! /proc, log syncs from INFO, device traffic), and stop it (SIGTERM, then SIGKILL), also
//! on drop.
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

/// After a test, a server's process tree counts as quiet once it used at most
/// `QUIET_TICKS` clock ticks (10 ms each) of CPU in one `QUIET_WINDOW`: 4% of a core, what
/// an idle server's timers and a committer's periodic empty commit cost.
const QUIET_WINDOW: Duration = Duration::from_millis(500);
const QUIET_TICKS: u64 = 2;

/// How long `wait_until_quiet` waits for background work to finish before it gives up
/// (and the next test pays for the rest).
const QUIET_TIMEOUT: Duration = Duration::from_secs(60);

/// A running server: ours to stop.
pub(super) struct Server {
    pub(super) kind: ServerKind,
    pub(super) port: u16,
    pub(super) child: Child,
    stopped: bool,
}

/// What a server has used so far, read around each test.
pub(super) struct Sample {
    /// The server process's own threads (`/proc/PID/stat` utime + stime).
    pub(super) cpu_ticks: Option<u64>,
    /// The process and every descendant, live or reaped (`process_tree_cpu_ticks`):
    /// redis-server's forked AOF-rewrite and snapshot children included.
    pub(super) tree_cpu_ticks: Option<u64>,
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
            tree_cpu_ticks: process_tree_cpu_ticks(pid),
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
    let stat = parse_stat(text)?;
    Some(stat.own_ticks)
}

/// The fields of one `/proc/PID/stat` that the process-tree sum needs.
#[derive(Clone, Copy, Debug, PartialEq)]
struct StatCpu {
    parent_pid: u32,
    /// utime + stime: the process's threads, live and ended.
    own_ticks: u64,
    /// cutime + cstime: children the process has waited for (and their own reaped ones).
    reaped_children_ticks: u64,
}

fn parse_stat(text: &str) -> Option<StatCpu> {
    // The command name (field 2) is in parentheses and may hold spaces or ')': the fields
    // after the last ')' start at field 3 (state); ppid is field 4, utime, stime, cutime
    // and cstime are fields 14 to 17.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Option<u64> { fields.get(i)?.parse().ok() };
    Some(StatCpu {
        parent_pid: u32::try_from(field(1)?).ok()?,
        own_ticks: field(11)? + field(12)?,
        reaped_children_ticks: field(13)? + field(14)?,
    })
}

fn read_stat(proc_dir: &Path, pid: u32) -> Option<StatCpu> {
    parse_stat(&std::fs::read_to_string(proc_dir.join(pid.to_string()).join("stat")).ok()?)
}

/// How often the process-tree sum is tried before giving up on a tree whose children keep
/// being reaped while it is read (each try takes well under a millisecond).
const TREE_READ_ATTEMPTS: usize = 20;

/// The CPU of `pid`'s whole process tree so far, in clock ticks: its own threads, the
/// children it has waited for (cutime + cstime, which the kernel adds at the wait and
/// which hold those children's own reaped children), and every live descendant (found by
/// parent pid in /proc; each counted with its own reaped children). redis-server's AOF
/// rewrite runs in a forked child that redis waits for, so its CPU is in one of the two
/// terms, live or reaped, never both: a child reaped while the tree is read would move
/// from one to the other, so the root is read before and after the walk and the sum is
/// taken again if its reaped total changed. Exact to the tick for a parent that waits
/// for its children (a parent that ignores SIGCHLD loses an ended child's time; neither
/// server does).
/// Waits until the process tree of `pid` is quiet (`QUIET_TICKS` per `QUIET_WINDOW`), or
/// `QUIET_TIMEOUT` passed; how long it waited, and whether it timed out. Between tests, so
/// that what a test leaves a server to do in the background (Tucana's log collection of
/// the records a write test made dead, redis-server's AOF rewrite in its forked child) is
/// charged to that test's CPU, and does not slow the next test down.
pub(crate) fn wait_until_quiet(pid: u32) -> (Duration, bool) {
    let started = Instant::now();
    let Some(mut last) = process_tree_cpu_ticks(pid) else {
        return (started.elapsed(), false);
    };
    loop {
        std::thread::sleep(QUIET_WINDOW);
        let Some(now) = process_tree_cpu_ticks(pid) else {
            return (started.elapsed(), false);
        };
        if now.saturating_sub(last) <= QUIET_TICKS {
            return (started.elapsed(), false);
        }
        if started.elapsed() > QUIET_TIMEOUT {
            return (started.elapsed(), true);
        }
        last = now;
    }
}

pub(crate) fn process_tree_cpu_ticks(pid: u32) -> Option<u64> {
    tree_cpu_ticks(Path::new("/proc"), pid)
}

fn tree_cpu_ticks(proc_dir: &Path, pid: u32) -> Option<u64> {
    for _ in 0..TREE_READ_ATTEMPTS {
        let first = read_stat(proc_dir, pid)?;
        let live = live_descendants_ticks(proc_dir, pid);
        let again = read_stat(proc_dir, pid)?;
        if again.reaped_children_ticks == first.reaped_children_ticks {
            return Some(again.own_ticks + again.reaped_children_ticks + live);
        }
    }
    None
}

/// own + reaped ticks of every live descendant of `root` (children, their children, ...).
/// A process that ends between the listing and its read is skipped: its parent's reaped
/// total has it, or will once it is waited for.
fn live_descendants_ticks(proc_dir: &Path, root: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir(proc_dir) else {
        return 0;
    };
    let processes: Vec<(u32, StatCpu)> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, read_stat(proc_dir, pid)?)))
        .collect();
    let mut ancestors = vec![root];
    let mut counted = std::collections::HashSet::from([root]);
    let mut total = 0;
    // Down the tree by parent pid; each process once, should a pid be reused mid-listing.
    while let Some(parent) = ancestors.pop() {
        for (pid, stat) in &processes {
            if stat.parent_pid == parent && counted.insert(*pid) {
                total += stat.own_ticks + stat.reaped_children_ticks;
                ancestors.push(*pid);
            }
        }
    }
    total
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

    /// A /proc/PID/stat line with the fields the tree sum reads.
    fn stat_line(pid: u32, ppid: u32, utime: u64, stime: u64, cutime: u64, cstime: u64) -> String {
        format!(
            "{pid} (a b) S {ppid} {pid} {pid} 0 -1 4194304 100 0 0 0 {utime} {stime} \
             {cutime} {cstime} 20 0 1 0 100 1000 50"
        )
    }

    #[test]
    fn tree_sum_counts_live_descendants_and_reaped_children_once() {
        // 100 is the server: own 10 + 3, reaped children 40 + 2 (an AOF rewrite that
        // ended); 101 its live forked child (own 5 + 1, its own reaped 7 + 0); 102 the
        // child's child; 103 and 104 are not in the tree (104's parent is 1, 103 is the
        // harness beside it); "self" and a file are not processes.
        let dir = tempfile::tempdir().unwrap();
        let write = |pid: u32, line: String| {
            std::fs::create_dir(dir.path().join(pid.to_string())).unwrap();
            std::fs::write(dir.path().join(pid.to_string()).join("stat"), line).unwrap();
        };
        write(100, stat_line(100, 99, 10, 3, 40, 2));
        write(101, stat_line(101, 100, 5, 1, 7, 0));
        write(102, stat_line(102, 101, 2, 2, 0, 0));
        write(103, stat_line(103, 99, 50, 50, 0, 0));
        write(104, stat_line(104, 1, 50, 50, 0, 0));
        std::fs::create_dir(dir.path().join("self")).unwrap();
        std::fs::write(dir.path().join("uptime"), "1 1").unwrap();
        assert_eq!(tree_cpu_ticks(dir.path(), 100), Some(13 + 42 + 13 + 4));
        assert_eq!(tree_cpu_ticks(dir.path(), 101), Some(13 + 4));
        assert_eq!(tree_cpu_ticks(dir.path(), 105), None, "no such process");
        assert_eq!(
            parse_stat(&stat_line(7, 1, 1, 2, 3, 4)),
            Some(StatCpu {
                parent_pid: 1,
                own_ticks: 3,
                reaped_children_ticks: 7
            })
        );
    }

    #[test]
    fn tree_sum_counts_a_real_forked_child_while_it_runs_and_after_it_is_reaped() {
        // The redis case: a child forked to burn CPU, first live, then killed and waited
        // for. Process CPU never sees it; the tree does, both times. Our own threads keep
        // running (other tests), so only lower bounds on the child's share are asserted.
        let pid = std::process::id();
        let reaped_before = read_stat(Path::new("/proc"), pid)
            .unwrap()
            .reaped_children_ticks;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let child_ticks = loop {
            let ticks = process_cpu_ticks(child.id()).unwrap();
            if ticks >= 10 || Instant::now() > deadline {
                break ticks;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(child_ticks >= 10, "the child burnt CPU");
        let live = live_descendants_ticks(Path::new("/proc"), pid);
        assert!(
            live >= child_ticks,
            "live child counted: {live} < {child_ticks}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        let after = read_stat(Path::new("/proc"), pid).unwrap();
        assert!(
            after.reaped_children_ticks >= reaped_before + child_ticks,
            "reaped child counted"
        );
        let tree = process_tree_cpu_ticks(pid).unwrap();
        assert!(tree >= after.own_ticks + reaped_before + child_ticks);
    }

    #[test]
    fn waiting_until_quiet_outlasts_a_childs_burst_of_cpu() {
        // A child that burns CPU for two seconds, marks the end of its burst in a file, and
        // then sleeps: the wait must not return before the mark is there.
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("burst-done");
        let script = format!(
            "end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do :; done; touch {}; sleep 30",
            mark.display()
        );
        let mut child = std::process::Command::new("sh")
            .args(["-c", &script])
            .spawn()
            .unwrap();
        let (_, timed_out) = wait_until_quiet(child.id());
        let done = mark.exists();
        let _ = child.kill();
        let _ = child.wait();
        assert!(!timed_out, "the child went quiet");
        assert!(done, "the wait returned during the child's burst");
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
