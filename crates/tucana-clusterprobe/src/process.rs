//! A server process of a test cluster (a `redis-server`, a `tucana serve`): its program
//! and arguments, started (inside a network namespace of its own with `ip netns exec`, if
//! given, so its pid is the server's and signals reach it), waited for until it answers
//! `PING`, signalled (`kill -9`, `SIGSTOP`/`SIGCONT`), stopped, and started again with
//! the same arguments (on the same files: restarting is the caller's fault to inject);
//! and [`free_port_pair`] for loopback servers that take a second port.
//!
//! Owns its child (killed when dropped); not what is asked of it. Not shared between
//! threads: the callers drive their processes from one thread.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::etcd::free_port;
use crate::{connect_with, wait_for};

/// One server process.
pub struct Process {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Where it listens.
    pub host: String,
    pub port: u16,
    /// Run inside this network namespace.
    pub netns: Option<String>,
    /// Sent by [`Process::wait_ping`] (a server with `--requirepass`).
    pub password: Option<String>,
    /// Its stdout and stderr, appended to.
    pub log: PathBuf,
    pub child: Option<Child>,
}

impl Process {
    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the program (not waiting for it to answer).
    pub fn spawn(&mut self) -> Result<(), String> {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|e| format!("{}: {e}", self.log.display()))
        };
        let mut command = match &self.netns {
            Some(netns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", netns]).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        let child = command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(open()?)
            .stderr(open()?)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits (at most `patience`) until the process answers PING; an error at once if
    /// it exited.
    pub fn wait_ping(&mut self, patience: Duration) -> Result<(), String> {
        let addr = self.addr();
        let log = self.log.display().to_string();
        let password = self.password.clone();
        let child = self.child.as_mut().ok_or("the process is not running")?;
        wait_for(&format!("{addr} answering PING"), patience, || {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(Err(format!(
                    "{addr} exited ({status}) before answering; its log: {log}"
                )));
            }
            let mut c = connect_with(&addr, password.as_deref()).ok()?;
            redis::cmd("PING")
                .query::<String>(&mut c)
                .ok()
                .map(|_| Ok(()))
        })?
    }

    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on a pid we started and have not reaped yet (the child is
            // reaped only by `wait` below, after which it is dropped); no memory is touched.
            unsafe {
                libc::kill(child.id() as libc::pid_t, signal);
            }
        }
    }

    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL after 30 s.
    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        if let Some(child) = self.child.as_mut() {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill9();
    }
}

/// A loopback port `p` such that `p` and `p + 10000` are free (Redis Cluster's bus,
/// Tucana's replication port).
pub fn free_port_pair() -> Result<u16, String> {
    for _ in 0..1000 {
        let port = free_port().map_err(|e| e.to_string())?;
        if port < 55536 && std::net::TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free pair of ports P, P+10000".into())
}

impl Drop for Process {
    fn drop(&mut self) {
        // A stopped (SIGSTOP) process still dies of SIGKILL.
        self.kill9();
    }
}
