//! An etcd of a run's own on free loopback ports (and, if asked, on more local addresses
//! at the same port), its data and log in a given directory, killed when dropped: the
//! coordinator store of the Tucana clusters that the crash test (M8), the fault campaign
//! and the benchmark harness start. It can be killed and restarted on its data (the
//! campaign's etcd fault).
//!
//! Owns the etcd process; not what is stored in it. Not shared between threads.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::wait_for;

/// A running etcd, killed when dropped.
pub struct Etcd {
    child: Child,
    /// Its client URL, `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The client port, on every address it listens on.
    pub port: u16,
    binary: PathBuf,
    args: Vec<String>,
    log: PathBuf,
}

/// A free loopback TCP port (free when asked; another process may take it after).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Etcd {
    /// Starts etcd as member `name` with its data in `dir/etcd-data` and its log in
    /// `dir/etcd.log`, and waits (at most `patience`) until it answers `/health`.
    pub fn start(dir: &Path, name: &str, patience: Duration) -> Result<Etcd, String> {
        Etcd::start_on(dir, name, &[], patience)
    }

    /// As [`Etcd::start`], listening for clients on each of `hosts` too (local
    /// addresses, at the same port as on loopback).
    pub fn start_on(
        dir: &Path,
        name: &str,
        hosts: &[String],
        patience: Duration,
    ) -> Result<Etcd, String> {
        let binary = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or("etcd is not installed (scripts/cluster-deps.sh installs it)")?;
        let (client_port, peer_port) = (
            free_port().map_err(|e| e.to_string())?,
            free_port().map_err(|e| e.to_string())?,
        );
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let listen: Vec<String> = std::iter::once(client_url.clone())
            .chain(hosts.iter().map(|h| format!("http://{h}:{client_port}")))
            .collect();
        let args: Vec<String> = [
            "--name",
            name,
            "--data-dir",
            &dir.join("etcd-data").display().to_string(),
            "--listen-client-urls",
            &listen.join(","),
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("{name}={peer_url}"),
            "--initial-cluster-state",
            "new",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = dir.join("etcd.log");
        let child = spawn(&binary, &args, &log)?;
        let mut etcd = Etcd {
            child,
            endpoint: client_url,
            port: client_port,
            binary,
            args,
            log,
        };
        etcd.wait_healthy(patience)?;
        Ok(etcd)
    }

    fn wait_healthy(&mut self, patience: Duration) -> Result<(), String> {
        let port = self.port;
        wait_for("etcd answering /health", patience, || {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Some(false);
            }
            healthy(port).then_some(true)
        })?
        .then_some(())
        .ok_or_else(|| "etcd exited before answering".to_string())
    }

    /// `kill -9` of etcd (its data stays).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts etcd again on its data, addresses and ports, and waits until it answers.
    pub fn restart(&mut self, patience: Duration) -> Result<(), String> {
        self.child = spawn(&self.binary, &self.args, &self.log)?;
        self.wait_healthy(patience)
    }
}

fn spawn(binary: &Path, args: &[String], log: &Path) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let mut command = Command::new(binary);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    if std::env::consts::ARCH == "aarch64" {
        command.env("ETCD_UNSUPPORTED_ARCH", "arm64");
    }
    command
        .spawn()
        .map_err(|e| format!("starting {}: {e}", binary.display()))
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let mut response = String::new();
    stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_ok()
        && stream.read_to_string(&mut response).is_ok()
        && response.contains("\"health\":\"true\"")
}
