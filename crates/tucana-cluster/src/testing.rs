//! A real etcd for tests: one process of its own per test, on free ports (loopback, or a
//! client address the test names) and a fresh data directory, killed when dropped. Built only with the `testing` feature (the
//! crates whose tests start etcd enable it in their dev-dependencies).
//!
//! Owns: finding the `etcd` binary, starting it, waiting until its `/health` answers, and
//! its log. Does not own anything a test does with it.
//!
//! Threads: `TestEtcd` is `Send + Sync`; `start` blocks the calling thread until etcd
//! answers (call it from a test's thread, or before a runtime's work begins).
//!
//! etcd must be installed (`scripts/cluster-deps.sh`; CI runs it): without it `start`
//! panics saying so, so a test fails rather than pass having proved nothing.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long `start` waits for etcd to answer before failing the test as a hang.
const PATIENCE: Duration = Duration::from_secs(60);

/// An etcd server of a test's own.
pub struct TestEtcd {
    child: Mutex<Child>,
    /// How it was started (`restart` starts it the same way, on the same data).
    command: Vec<std::ffi::OsString>,
    host: String,
    client_port: u16,
    endpoint: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestEtcd {
    /// Starts etcd and waits until it reports itself healthy. Panics (with its log) if it
    /// exits or does not answer within a minute.
    pub fn start() -> TestEtcd {
        TestEtcd::start_on("127.0.0.1")
    }

    /// `start`, with the client URL on `host` (an IPv4 address of this machine), so that
    /// a test can reach etcd through a route of its own and cut it (the peer URL stays on
    /// loopback).
    pub fn start_on(host: &str) -> TestEtcd {
        let dir = tempfile::tempdir().expect("a temporary directory for etcd");
        let client_port = free_port(host);
        let peer_port = loop {
            let port = free_port("127.0.0.1");
            if port != client_port {
                break port;
            }
        };
        let client_url = format!("http://{host}:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let log = dir.path().join("etcd.log");
        let mut command: Vec<std::ffi::OsString> = vec![
            etcd_binary().into(),
            "--name".into(),
            "test".into(),
            "--data-dir".into(),
            dir.path().join("data").into(),
        ];
        for (flag, value) in [
            ("--listen-client-urls", &client_url),
            ("--advertise-client-urls", &client_url),
            ("--listen-peer-urls", &peer_url),
            ("--initial-advertise-peer-urls", &peer_url),
            ("--initial-cluster", &format!("test={peer_url}")),
            ("--initial-cluster-state", &"new".to_owned()),
        ] {
            command.push(flag.into());
            command.push(value.into());
        }
        let child = spawn(&command, &log);
        let etcd = TestEtcd {
            child: Mutex::new(child),
            command,
            host: host.to_owned(),
            client_port,
            endpoint: client_url,
            log,
            _dir: dir,
        };
        etcd.wait_healthy();
        etcd
    }

    /// Kills etcd (`kill -9`), waits `down`, and starts it again on its data, at the same
    /// address; returns once it answers. Leases it held come back (etcd extends them by
    /// their time to live when it starts).
    pub fn restart_after(&self, down: Duration) {
        {
            let mut child = self.child.lock().unwrap();
            let _ = child.kill();
            let _ = child.wait();
        }
        std::thread::sleep(down);
        *self.child.lock().unwrap() = spawn(&self.command, &self.log);
        self.wait_healthy();
    }

    fn wait_healthy(&self) {
        let started = Instant::now();
        while !healthy(&self.host, self.client_port) {
            if let Some(status) = self.child.lock().unwrap().try_wait().unwrap() {
                panic!(
                    "etcd exited ({status}) before answering:\n{}",
                    self.log_text()
                );
            }
            if started.elapsed() > PATIENCE {
                panic!(
                    "etcd does not answer at {}:\n{}",
                    self.endpoint,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// What etcd has logged so far (for a failing test's message).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        if let Ok(child) = self.child.get_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `command` (the binary first) with its output appended to `log`.
fn spawn(command: &[std::ffi::OsString], log: &PathBuf) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("etcd's log file");
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("etcd's log file"))
        .stderr(out);
    if std::env::consts::ARCH == "aarch64" {
        // etcd 3.4 refuses to start on arm64 unless told it may.
        cmd.env("ETCD_UNSUPPORTED_ARCH", "arm64");
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", command[0]))
}

/// `etcd` on the PATH, or Debian's `/usr/bin/etcd`; panics with the installing hint.
fn etcd_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file());
    let debian = PathBuf::from("/usr/bin/etcd");
    match on_path {
        Some(found) => found,
        None if debian.is_file() => debian,
        None => panic!(
            "etcd is not installed: run scripts/cluster-deps.sh (it installs Debian's \
             etcd-server and protobuf-compiler), then run the tests again"
        ),
    }
}

/// A port free on `host` now, chosen below the kernel's ephemeral range, so that a server
/// a test restarts can bind it again.
///
/// The story: a test that restarted etcd after three seconds down found its peer port
/// taken ("bind: address already in use", CI). The port had come from binding port 0, which
/// draws from the ephemeral range, the same range the kernel gives outgoing connections
/// their source ports from, and clients were reconnecting to etcd all the while. No
/// connection is ever given a port below that range, and ports there are only taken by
/// binding them by number, so one that is free now stays free unless another test draws
/// the same number (tried at random among ~20,000, and checked by binding it).
pub fn free_port(host: &str) -> u16 {
    use std::hash::{BuildHasher, Hasher};
    const LOWEST: u16 = 10_000;
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|&from| from > LOWEST + 1_000)
        .unwrap_or(32_768);
    let span = u64::from(ephemeral_from - LOWEST);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let start = hasher.finish();
    for attempt in 0..span {
        let port = LOWEST + ((start + attempt * 7_919) % span) as u16;
        if TcpListener::bind((host, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on {host} between {LOWEST} and {ephemeral_from}")
}

/// Whether etcd's `/health` endpoint at `host:port` says it is healthy.
fn healthy(host: &str, port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((host, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    let mut response = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut response).is_ok()
        && response.contains("\"health\":\"true\"")
}
