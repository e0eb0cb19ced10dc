//! Acknowledged writes through a Redis Cluster protocol cluster, Tucana's or Redis's:
//! a client that follows `MOVED` itself ([`Router`]), writer threads that write unique
//! keys and record every `OK` ([`Writers`]), the write that times a failover
//! ([`first_ack`]), the read back that counts acknowledged writes lost ([`lost_keys`]),
//! and the map as `CLUSTER SLOTS` shows it ([`slot_ranges`]; the `_with` variants
//! authenticate, for servers with `--requirepass`); an etcd of a run's own
//! ([`etcd::Etcd`]) for the Tucana clusters the callers start; and network namespaces
//! per server with the routes a partition cuts ([`netns::Net`]); a server process
//! started, signalled and restarted ([`process::Process`]); and how Redis Cluster is run
//! and made ([`redis_cluster`]).
//!
//! Shared by tucana-crashtest's cluster crash test (M8) and fault campaign (M10) and
//! tucana-bench's side by side with Redis Cluster, so that all measure with the same
//! client. Owns no server process but through [`process::Process`], and decides no verdict; the callers do.
//!
//! Thread-safety: a [`Client`] is one thread's (its connections are plain blocking
//! ones); [`Writers`] runs one thread per writer, each with a client of its own, and
//! shares only the map of acknowledged keys (behind a mutex) and the stop flag.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tucana_cluster::key_slot;

pub mod crate_client;
pub mod etcd;
pub mod netns;
pub mod process;
pub mod redis_cluster;

/// A client that writes and reads keys of a cluster: what [`Writers`] and [`first_ack`]
/// use. [`Router`] (ours, retries nothing) or [`crate_client::CrateCluster`] (the
/// `redis` crate's cluster client).
pub trait Client: Send {
    /// `SET key value`: `Ok` if acknowledged, else what was answered.
    fn set(&mut self, key: &str, value: &str) -> Result<(), String>;
    /// `GET key`: the value, `None` for nil (or a reply a GET should not give).
    fn get(&mut self, key: &str) -> Result<Option<String>, String>;
}

/// Which [`Client`] writers and probes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientKind {
    Router,
    RedisCrate,
}

impl ClientKind {
    /// A client of this kind for the cluster reached through `seeds`.
    pub fn make(self, seeds: &[String]) -> Box<dyn Client> {
        match self {
            ClientKind::Router => Box::new(Router::new(seeds.to_vec())),
            ClientKind::RedisCrate => Box::new(crate_client::CrateCluster::new(seeds.to_vec())),
        }
    }
}

/// Number of hash slots of the Redis Cluster protocol.
pub const SLOTS: u32 = tucana_cluster::SLOTS as u32;

/// Calls `f` every 50 ms until it returns `Some`, for at most `patience`; the error names
/// `what`.
pub fn wait_for<T>(
    what: &str,
    patience: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if started.elapsed() > patience {
            return Err(format!("{what}: still waiting after {patience:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connection to `addr` ("host:port"), 2 s to connect, 30 s to answer (long enough to
/// outlast a paused server: its answer after SIGCONT is the point).
pub fn connect(addr: &str) -> redis::RedisResult<redis::Connection> {
    connect_with(addr, None)
}

/// As [`connect`], authenticating with `password` (a server with `--requirepass`).
pub fn connect_with(addr: &str, password: Option<&str>) -> redis::RedisResult<redis::Connection> {
    let url = match password {
        Some(p) => format!("redis://:{p}@{addr}/"),
        None => format!("redis://{addr}/"),
    };
    let c = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(2))?;
    c.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(c)
}

/// A cluster client that follows `MOVED` and `ASK` itself: a connection per server, the
/// slots it learned from `MOVED`, and the servers to ask when it knows nothing. A failed
/// request is not retried: the caller sees every error, so an acknowledgement is exactly
/// an `OK` the owner of the slot (or, during a migration, its target) sent.
pub struct Router {
    seeds: Vec<String>,
    conns: HashMap<String, redis::Connection>,
    owner: HashMap<u16, String>,
    next_seed: usize,
}

impl Router {
    pub fn new(seeds: Vec<String>) -> Router {
        Router {
            seeds,
            conns: HashMap::new(),
            owner: HashMap::new(),
            next_seed: 0,
        }
    }

    /// Sends `cmd` (about `key`) to the server owning its slot, following up to four
    /// `MOVED` redirects, or one `ASK` (`ASKING` then `cmd` to the migration's target,
    /// as Redis Cluster clients do); an error otherwise (the write may or may not have
    /// been applied).
    pub fn query(
        &mut self,
        cmd: &redis::Cmd,
        key: &str,
    ) -> Result<redis::Value, redis::RedisError> {
        let slot = key_slot(key.as_bytes());
        let mut addr = self.owner.get(&slot).cloned().unwrap_or_else(|| {
            self.next_seed = (self.next_seed + 1) % self.seeds.len();
            self.seeds[self.next_seed].clone()
        });
        let mut hops = 0;
        loop {
            let conn = match self.conns.entry(addr.clone()) {
                std::collections::hash_map::Entry::Occupied(c) => c.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => match connect(&addr) {
                    Ok(c) => v.insert(c),
                    Err(e) => {
                        self.owner.remove(&slot);
                        return Err(e);
                    }
                },
            };
            match cmd.query::<redis::Value>(conn) {
                Ok(v) => {
                    self.owner.insert(slot, addr);
                    return Ok(v);
                }
                Err(e) if e.code() == Some("MOVED") && hops < 4 => {
                    let Some((to, _)) = e.redirect_node() else {
                        return Err(e);
                    };
                    addr = to.to_string();
                    hops += 1;
                }
                Err(e) if e.code() == Some("ASK") => {
                    let Some((to, _)) = e.redirect_node() else {
                        return Err(e);
                    };
                    return self.asking(cmd, to);
                }
                Err(e) => {
                    if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                        self.conns.remove(&addr);
                    }
                    self.owner.remove(&slot);
                    return Err(e);
                }
            }
        }
    }

    /// `ASKING` and `cmd` on one connection to `addr` (the slot's owner stays as it was).
    fn asking(&mut self, cmd: &redis::Cmd, addr: &str) -> Result<redis::Value, redis::RedisError> {
        let conn = match self.conns.entry(addr.to_owned()) {
            std::collections::hash_map::Entry::Occupied(c) => c.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(connect(addr)?),
        };
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").ignore().add_command(cmd.clone());
        match pipe.query::<Vec<redis::Value>>(conn) {
            Ok(mut answers) => Ok(answers.pop().unwrap_or(redis::Value::Nil)),
            Err(e) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                    self.conns.remove(addr);
                }
                Err(e)
            }
        }
    }

    /// `SET key value`: `Ok` if acknowledged, else what was answered.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value);
        match self.query(&cmd, key) {
            Ok(redis::Value::Okay) => Ok(()),
            Ok(other) => Err(format!("{other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn get(&mut self, key: &str) -> Result<Option<String>, redis::RedisError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        Ok(match self.query(&cmd, key)? {
            redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            // Nil, or anything a GET should not answer: not the value written.
            _ => None,
        })
    }
}

impl Client for Router {
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        Router::set(self, key, value)
    }

    fn get(&mut self, key: &str) -> Result<Option<String>, String> {
        Router::get(self, key).map_err(|e| e.to_string())
    }
}

/// Writers: each writes unique keys through a client of its own until stopped, keeping
/// the keys answered `OK` with their values.
pub struct Writers {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<BTreeMap<String, String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Writers {
    /// `count` writers over the cluster reached through `seeds`, each with a [`Router`];
    /// writer `w`'s keys are `PREFIX-wW-I` for I = 0, 1, ...
    pub fn start(seeds: &[String], prefix: &str, count: usize) -> Writers {
        Writers::start_with(ClientKind::Router, seeds, prefix, count)
    }

    /// As [`Writers::start`], each writer with a client of `kind`.
    pub fn start_with(kind: ClientKind, seeds: &[String], prefix: &str, count: usize) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeMap::new()));
        let threads = (0..count)
            .map(|w| {
                let (stop, acked) = (stop.clone(), acked.clone());
                let mut client = kind.make(seeds);
                let prefix = format!("{prefix}-w{w}");
                std::thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("{prefix}-{i}");
                        let value = format!("v{i}-{}", "x".repeat((i % 100) as usize));
                        if client.set(&key, &value).is_ok() {
                            acked.lock().expect("not poisoned").insert(key, value);
                        } else {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        Writers {
            stop,
            acked,
            threads,
        }
    }

    /// Stops the writers; every key acknowledged, with its value.
    pub fn stop(self) -> BTreeMap<String, String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        Arc::try_unwrap(self.acked)
            .map(|m| m.into_inner().expect("not poisoned"))
            .unwrap_or_default()
    }
}

/// Writes `key` through `client` until it is acknowledged (every 20 ms, for at most
/// `patience`): the first write a new primary of the key's slot acknowledges after a
/// kill. The error carries the last answer.
pub fn first_ack(client: &mut dyn Client, key: &str, patience: Duration) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let last = match client.set(key, "p") {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if started.elapsed() > patience {
            return Err(format!(
                "no write of {key} acknowledged after {patience:?}; last answer: {last}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The keys of `acked` that do not read back with their value through the cluster
/// reached at `seeds` (missing, or holding another value). A read that fails is retried
/// for at most `patience`, then is an error.
pub fn lost_keys(
    seeds: &[String],
    acked: &BTreeMap<String, String>,
    patience: Duration,
) -> Result<Vec<String>, String> {
    let mut router = Router::new(seeds.to_vec());
    let mut lost = Vec::new();
    for (key, value) in acked {
        let got = wait_for("a read of an acknowledged key", patience, || {
            router.get(key).ok()
        })?;
        if got.as_deref() != Some(value.as_str()) {
            lost.push(key.clone());
        }
    }
    Ok(lost)
}

/// A range of slots as `CLUSTER SLOTS` shows it: its primary and its backups (replicas).
#[derive(Clone, Debug)]
pub struct Range {
    pub start: u16,
    pub end: u16,
    pub primary: String,
    pub backups: Vec<String>,
}

fn node_addr(node: &redis::Value) -> Option<String> {
    let redis::Value::Array(items) = node else {
        return None;
    };
    let ip: String = redis::from_redis_value(items.first()?.clone()).ok()?;
    let port: u16 = redis::from_redis_value(items.get(1)?.clone()).ok()?;
    Some(format!("{ip}:{port}"))
}

/// `CLUSTER SLOTS` of the server at `addr`, by start; `None` if it did not answer.
pub fn slot_ranges(addr: &str) -> Option<Vec<Range>> {
    slot_ranges_with(addr, None)
}

/// As [`slot_ranges`], authenticating with `password`.
pub fn slot_ranges_with(addr: &str, password: Option<&str>) -> Option<Vec<Range>> {
    let mut c = connect_with(addr, password).ok()?;
    let value: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c).ok()?;
    let redis::Value::Array(ranges) = value else {
        return None;
    };
    let mut out = Vec::new();
    for range in ranges {
        let redis::Value::Array(items) = range else {
            return None;
        };
        out.push(Range {
            start: redis::from_redis_value(items.first()?.clone()).ok()?,
            end: redis::from_redis_value(items.get(1)?.clone()).ok()?,
            primary: node_addr(items.get(2)?)?,
            backups: items[3..].iter().filter_map(node_addr).collect(),
        });
    }
    out.sort_by_key(|r| r.start);
    Some(out)
}

/// Whether the map, as the server at `addr` gives it in `CLUSTER SHARDS`, lists every
/// backup in sync (a Tucana backup still catching up is `loading`, as a Redis replica
/// still syncing; only an in-sync one may be promoted); `None` if it does not answer.
pub fn backups_in_sync(addr: &str) -> Option<bool> {
    backups_in_sync_with(addr, None)
}

/// `CLUSTER INFO` of the server at `addr`, if it answers.
pub fn cluster_info_with(addr: &str, password: Option<&str>) -> Option<String> {
    let mut c = connect_with(addr, password).ok()?;
    redis::cmd("CLUSTER").arg("INFO").query(&mut c).ok()
}

/// As [`backups_in_sync`], authenticating with `password`.
pub fn backups_in_sync_with(addr: &str, password: Option<&str>) -> Option<bool> {
    let mut c = connect_with(addr, password).ok()?;
    let shards: redis::Value = redis::cmd("CLUSTER").arg("SHARDS").query(&mut c).ok()?;
    Some(!mentions(&shards, b"loading"))
}

/// Whether `value` holds the bulk or simple string `text` anywhere inside.
fn mentions(value: &redis::Value, text: &[u8]) -> bool {
    match value {
        redis::Value::BulkString(b) => b == text,
        redis::Value::SimpleString(s) => s.as_bytes() == text,
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().any(|v| mentions(v, text))
        }
        redis::Value::Map(pairs) => pairs
            .iter()
            .any(|(k, v)| mentions(k, text) || mentions(v, text)),
        _ => false,
    }
}

/// Whether `ranges` cover every slot, each with a primary in `live`.
pub fn served(ranges: &[Range], live: &[&str]) -> bool {
    let mut next = 0u32;
    for r in ranges {
        if u32::from(r.start) != next || !live.contains(&r.primary.as_str()) {
            return false;
        }
        next = u32::from(r.end) + 1;
    }
    next == SLOTS
}

/// A hash tag whose slot is in `start..=end`.
pub fn tag_in(start: u16, end: u16) -> String {
    (0..)
        .map(|n| format!("t{n}"))
        .find(|tag| (start..=end).contains(&key_slot(tag.as_bytes())))
        .expect("every slot has a tag")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u16, end: u16, primary: &str) -> Range {
        Range {
            start,
            end,
            primary: primary.into(),
            backups: Vec::new(),
        }
    }

    #[test]
    fn served_needs_every_slot_with_a_live_primary() {
        let ranges = [range(0, 8000, "a:1"), range(8001, 16383, "b:1")];
        assert!(served(&ranges, &["a:1", "b:1"]));
        assert!(!served(&ranges, &["a:1"]), "b is not live");
        assert!(!served(&ranges[..1], &["a:1", "b:1"]), "a gap at the end");
        let gap = [range(0, 8000, "a:1"), range(8002, 16383, "b:1")];
        assert!(!served(&gap, &["a:1", "b:1"]), "slot 8001 is missing");
    }

    #[test]
    fn a_tag_lands_in_its_range() {
        for (start, end) in [(0, 0), (5461, 10922), (16383, 16383)] {
            let slot = key_slot(format!("{{{}}}:k", tag_in(start, end)).as_bytes());
            assert!(
                (start..=end).contains(&slot),
                "{slot} not in {start}..={end}"
            );
        }
    }
}
