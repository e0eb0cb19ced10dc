//! What the cluster tests share (`cluster.rs`, `cluster_partition.rs`): bounded waits,
//! a `tucana serve --cluster-etcd` process, `CLUSTER SLOTS` parsed, and a cluster-client
//! writer that records every acknowledged write.
//!
//! Owns: starting and killing server processes (killed when dropped) and the writer's
//! thread. Does not own etcd (`tucana_cluster::testing::TestEtcd`) or any network setup.
//!
//! Each test binary uses only part of this module, hence `dead_code` is allowed here.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Commands;
use tucana_cluster::key_slot;
use tucana_cluster::testing::TestEtcd;

/// A bound on waits for something that should happen; reaching it fails the test as a
/// hang, not as slowness.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{what}: still waiting after {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn free_port() -> u16 {
    // Below the ephemeral range: a restarted server binds its port again.
    tucana_cluster::testing::free_port("127.0.0.1")
}

/// One `tucana serve --cluster-etcd` process, on a fixed port so a restart keeps its
/// address.
pub struct Server {
    pub child: Option<Child>,
    pub volume: PathBuf,
    /// `--bind`: where it listens, for clients and (with `repl_port`) for replication;
    /// it announces this address too. Loopback unless set before `spawn`.
    pub host: String,
    pub port: u16,
    /// `--repl-port`: where primaries ship this server the regions it backs.
    pub repl_port: Option<u16>,
    /// `--requirepass` (a server listening off loopback must have one).
    pub password: Option<String>,
    /// Run inside this network namespace (`ip netns exec NAME`).
    pub netns: Option<String>,
    /// `--metrics-port`: its Prometheus endpoint (on `host`).
    pub metrics_port: u16,
    /// More flags for `tucana serve`.
    pub extra_args: Vec<String>,
}

impl Server {
    /// The text of its `GET /metrics`.
    pub fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let mut http =
            std::net::TcpStream::connect((self.host.as_str(), self.metrics_port)).unwrap();
        http.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut text = String::new();
        http.read_to_string(&mut text).unwrap();
        text
    }

    /// A server on loopback, not started yet.
    pub fn new(volume: &Path, port: u16, repl_port: Option<u16>) -> Server {
        Server {
            child: None,
            volume: volume.to_owned(),
            host: "127.0.0.1".to_owned(),
            port,
            repl_port,
            password: None,
            netns: None,
            metrics_port: free_port(),
            extra_args: Vec::new(),
        }
    }

    pub fn start(volume: &Path, port: u16, repl_port: Option<u16>, etcd: &TestEtcd) -> Server {
        let mut server = Server::new(volume, port, repl_port);
        server.spawn(etcd);
        server
    }

    pub fn spawn(&mut self, etcd: &TestEtcd) {
        let port = self.port.to_string();
        let mut command = match &self.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", netns])
                    .arg(env!("CARGO_BIN_EXE_tucana"));
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_tucana")),
        };
        command
            .arg("--db")
            .arg(&self.volume)
            .args(["serve", "--bind", &self.host, "--port", &port])
            .args(["--durability", "sync"])
            .args(["--cluster-etcd", etcd.endpoint(), "--cluster-name", "test"])
            // A killed server's registration goes soon, so its restart registers soon.
            .args(["--cluster-lease-ms", "2000"])
            .args(["--metrics-port", &self.metrics_port.to_string()]);
        if let Some(repl_port) = self.repl_port {
            command.args(["--repl-port", &repl_port.to_string()]);
        }
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        command.args(&self.extra_args);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tucana serve");
        let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
        let mut line = String::new();
        stderr.read_line(&mut line).expect("read the start line");
        assert!(
            line.contains(&format!(" on {}:", self.host)),
            "start line {line:?}"
        );
        // Keep draining stderr so the child never blocks on a full pipe; echo it so a
        // failing test shows what the servers said.
        let name = self.addr();
        std::thread::spawn(move || {
            let mut text = String::new();
            while stderr.read_line(&mut text).map(|n| n > 0).unwrap_or(false) {
                eprint!("[server {name}] {text}");
                text.clear();
            }
        });
        self.child = Some(child);
    }

    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The URL a client opens, with the password if there is one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@{}/", self.addr()),
            None => format!("redis://{}/", self.addr()),
        }
    }

    pub fn connect(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).unwrap();
        let con = client.get_connection().unwrap();
        con.set_read_timeout(Some(PATIENCE)).unwrap();
        con
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn pid(&self) -> String {
        self.child.as_ref().expect("running").id().to_string()
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The URLs of `servers`, for a cluster client.
pub fn urls(servers: &[Server]) -> Vec<String> {
    servers.iter().map(Server::url).collect()
}

/// `CLUSTER SLOTS` as `(start, end, primary address)`, by start.
pub fn slot_ranges(con: &mut redis::Connection) -> Vec<(u16, u16, String)> {
    let value: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(con).unwrap();
    let redis::Value::Array(ranges) = value else {
        panic!("CLUSTER SLOTS answered {value:?}");
    };
    let mut out = Vec::new();
    for range in ranges {
        // start, end, the primary, then its backups.
        let redis::Value::Array(items) = range else {
            panic!("CLUSTER SLOTS range {range:?}");
        };
        let (start, end, node): (u16, u16, Vec<redis::Value>) =
            redis::from_redis_value(redis::Value::Array(items[..3].to_vec())).unwrap();
        let (ip, port, _id): (String, u16, String) =
            redis::from_redis_value(redis::Value::Array(node[..3].to_vec())).unwrap();
        out.push((start, end, format!("{ip}:{port}")));
    }
    out.sort();
    out
}

pub fn run_tucana(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tucana"))
        .args(args)
        .output()
        .expect("run tucana");
    assert!(
        output.status.success(),
        "tucana {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// A hashtag whose keys hash into `start..=end`.
pub fn tag_in(start: u16, end: u16) -> String {
    (0..)
        .map(|n| format!("t{n}"))
        .find(|tag| (start..=end).contains(&key_slot(tag.as_bytes())))
        .unwrap()
}

/// A client writing `{tag}:n = n` through the cluster client, one sync write at a time,
/// recording every acknowledged `n` with when it was acknowledged.
pub struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(u64, Instant)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    /// Writes through a cluster client seeded with `urls` (see `urls`).
    pub fn start(urls: &[String], tag: &str) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let client = redis::cluster::ClusterClientBuilder::new(urls.to_vec())
            .retries(2)
            .connection_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let thread = {
            let (stop, acked, tag) = (stop.clone(), acked.clone(), tag.to_owned());
            std::thread::spawn(move || {
                let mut con = None;
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    if con.is_none() {
                        con = client.get_connection().ok();
                    }
                    let Some(c) = con.as_mut() else {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    };
                    n += 1;
                    let result: redis::RedisResult<()> = c.set(format!("{{{tag}}}:{n}"), n);
                    match result {
                        Ok(()) => acked.lock().unwrap().push((n, Instant::now())),
                        Err(_) => {
                            // Not acknowledged: it may or may not be applied; a new
                            // connection learns the map again.
                            con = None;
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
        };
        Writer {
            stop,
            acked,
            thread: Some(thread),
        }
    }

    pub fn acked(&self) -> Vec<(u64, Instant)> {
        self.acked.lock().unwrap().clone()
    }

    pub fn finish(mut self) -> Vec<(u64, Instant)> {
        self.stop.store(true, Ordering::Release);
        self.thread.take().unwrap().join().unwrap();
        self.acked()
    }
}

/// Every acknowledged `{tag}:n` reads back as `n` from `server`.
pub fn assert_all_readable(server: &Server, tag: &str, acked: &[(u64, Instant)]) {
    let mut con = server.connect();
    for (n, _) in acked {
        let value: Option<u64> = con.get(format!("{{{tag}}}:{n}")).unwrap();
        assert_eq!(value, Some(*n), "acknowledged write {n} lost");
    }
}
