//! An etcd of a run's own on free loopback ports, its data and log in a given directory,
//! killed when dropped: the coordinator store of the Tucana clusters that the crash
//! test (M8) and the benchmark harness start.
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
        let log = std::fs::File::create(dir.join("etcd.log")).map_err(|e| e.to_string())?;
        let mut command = Command::new(&binary);
        command
            .args(["--name", name, "--data-dir"])
            .arg(dir.join("etcd-data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("{name}={peer_url}")])
            .args(["--initial-cluster-state", "new"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        if std::env::consts::ARCH == "aarch64" {
            command.env("ETCD_UNSUPPORTED_ARCH", "arm64");
        }
        let child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let mut etcd = Etcd {
            child,
            endpoint: client_url,
        };
        wait_for("etcd answering /health", patience, || {
            if let Ok(Some(_)) = etcd.child.try_wait() {
                return Some(false);
            }
            healthy(client_port).then_some(true)
        })?
        .then_some(())
        .ok_or("etcd exited before answering")?;
        Ok(etcd)
    }
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
