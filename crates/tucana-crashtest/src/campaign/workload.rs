//! The campaign's clients: threads, each with a Redis Cluster client of its own (the
//! `redis` crate's `ClusterConnection`, the client a Rust user would pick), doing `GET`,
//! `SET`, `SET NX`, `INCR` and `MULTI`/`EXEC` transactions within a hashtag on a small
//! set of keys and recording every operation's invocation and completion (the history
//! the checker reads), plus `SET`s of unique keys whose acknowledgements are kept for the
//! read-back at the end.
//!
//! The client is built with no retries of its own: a request it retried after a dropped
//! connection could be applied twice, which the checker would blame on the server. So a
//! `MOVED` ends the operation too (as refused), and the client is rebuilt (a fresh slot
//! map) after any error.
//!
//! What an answer means (`Status`): `ok`; `fail` only for answers given before anything
//! was applied (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, a connection refused, and
//! `EXECABORT`: a transaction refused while queued);
//! everything else (a timeout, a dropped connection, `READONLY` and `NOREPLICAS`, which
//! Tucana gives for a write applied but not acknowledged) is `info`, indeterminate.
//!
//! Owns its threads; shares the history and the acknowledged unique keys behind mutexes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClientBuilder, ClusterConnection};
use redis::ConnectionLike;
use serde::Serialize;
use tucana_cluster::key_slot;

use crate::Rng;

/// One operation of the history, as tools/lincheck reads it: a command, or (`op` is
/// `txn`) a transaction of `txn`'s commands, whose answers are `outputs`, on keys of the
/// hashtag `key`.
#[derive(Clone, Debug, Serialize)]
pub struct Op {
    pub client: usize,
    pub key: String,
    pub op: &'static str,
    pub value: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub txn: Vec<Command>,
    pub status: &'static str,
    pub output: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<Option<String>>,
    /// Why it is not `ok`: the error or the unexpected reply (for whoever reads the
    /// history; the checker does not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub call_ns: u64,
    pub return_ns: u64,
}

/// One command of a transaction.
#[derive(Clone, Debug, Serialize)]
pub struct Command {
    pub op: &'static str,
    pub key: String,
}

impl Op {
    fn is_write(&self) -> bool {
        if self.op == "txn" {
            self.txn.iter().any(|c| c.op != "get")
        } else {
            self.op != "get"
        }
    }

    /// The keys it touches.
    pub fn keys(&self) -> Vec<&str> {
        if self.op == "txn" {
            self.txn.iter().map(|c| c.key.as_str()).collect()
        } else {
            vec![self.key.as_str()]
        }
    }
}

/// An acknowledged write, for the availability figure: its key's slot and when.
#[derive(Clone, Copy)]
pub struct Ack {
    pub slot: u16,
    pub at_ns: u64,
}

#[derive(Default)]
struct Shared {
    history: Vec<Op>,
    unique: BTreeMap<String, String>,
    acks: Vec<Ack>,
}

pub struct Workload {
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<Shared>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// What the clients ended with.
pub struct Recorded {
    pub history: Vec<Op>,
    pub unique: BTreeMap<String, String>,
    pub acks: Vec<Ack>,
}

/// Keys of the history: registers (`SET`, `GET`) `r<bucket>-<k>`, a new set every 30 s;
/// counters (`INCR`, `GET`) `c<bucket>-<k>`, every 5 s; `SET NX` keys `x<bucket>-<k>`,
/// every 3 s, so that there are races to win. Short-lived keys keep each key's history
/// short and its indeterminate `INCR`s few: the checker's search doubles with each.
const REGISTERS: u64 = 6;
const REGISTER_S: u64 = 30;
const COUNTERS: u64 = 2;
const COUNTER_S: u64 = 5;
const SETNX_S: u64 = 3;
/// Transactions: keys `{t<bucket>-<g>}a` and `…b`, a new pair of groups every 5 s (each
/// indeterminate transaction that writes doubles the checker's search, as an `INCR`
/// does). A transaction increments both or reads both, so any reader that sees them
/// differ (but for the lone `INCR`s of `a`, which the model counts) saw half of one.
const TXN_GROUPS: u64 = 2;
const TXN_S: u64 = 5;

/// A cluster client with no retries of its own, or why not.
pub fn cluster_client(
    seeds: &[String],
    password: Option<&str>,
) -> Result<ClusterConnection, String> {
    let urls: Vec<String> = seeds.iter().map(|s| format!("redis://{s}/")).collect();
    let mut builder = ClusterClientBuilder::new(urls)
        .retries(0)
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(3));
    if let Some(p) = password {
        builder = builder.password(p);
    }
    builder
        .build()
        .and_then(|c| c.get_connection())
        .map_err(|e| e.to_string())
}

/// Whether the error is an answer given before anything was applied.
fn refused(e: &redis::RedisError) -> bool {
    refused_code(e.code()) || e.is_connection_refusal()
}

/// Whether an error of this code is given before anything was applied.
fn refused_code(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "EXECABORT")
    )
}

impl Workload {
    pub fn start(
        seeds: &[String],
        password: Option<&str>,
        clients: usize,
        seed: u64,
        epoch: Instant,
    ) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Mutex::new(Shared::default()));
        let threads = (0..clients)
            .map(|client| {
                let (stop, shared) = (stop.clone(), shared.clone());
                let seeds = seeds.to_vec();
                let password = password.map(str::to_string);
                let mut rng =
                    Rng::new(seed ^ (client as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f));
                std::thread::spawn(move || {
                    let mut conn: Option<ClusterConnection> = None;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if conn.is_none() {
                            match cluster_client(&seeds, password.as_deref()) {
                                Ok(c) => conn = Some(c),
                                Err(_) => {
                                    std::thread::sleep(Duration::from_millis(100));
                                    continue;
                                }
                            }
                        }
                        n += 1;
                        let c = conn.as_mut().expect("made above");
                        let status = one_op(c, client, n, &mut rng, epoch, &shared);
                        if status != "ok" {
                            conn = None;
                            // After an indeterminate answer, longer: every indeterminate
                            // write adds to the checker's search.
                            let ms = if status == "info" { 250 } else { 50 };
                            std::thread::sleep(Duration::from_millis(ms));
                        }
                    }
                })
            })
            .collect();
        Workload {
            stop,
            shared,
            threads,
        }
    }

    /// Stops the clients (each finishes its operation) and hands over what they
    /// recorded.
    pub fn stop(self) -> Recorded {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let shared = std::mem::take(&mut *self.shared.lock().expect("not poisoned"));
        Recorded {
            history: shared.history,
            unique: shared.unique,
            acks: shared.acks,
        }
    }
}

fn since(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Does one operation chosen by `rng` and records it; its status (`ok`, `fail`, `info`).
fn one_op(
    c: &mut ClusterConnection,
    client: usize,
    n: u64,
    rng: &mut Rng,
    epoch: Instant,
    shared: &Mutex<Shared>,
) -> &'static str {
    let roll = rng.below(100);
    let secs = since(epoch) / 1_000_000_000;
    if roll < 10 {
        // A unique key: checked by reading it back at the end, not by the checker.
        let key = format!("u{client}-{n}");
        let value = format!("v{n}");
        let answer = redis::cmd("SET")
            .arg(&key)
            .arg(&value)
            .query::<redis::Value>(c);
        let ok = matches!(answer, Ok(redis::Value::Okay));
        let status = match &answer {
            Ok(_) => "ok",
            Err(e) if refused(e) => "fail",
            Err(_) => "info",
        };
        if ok {
            let mut s = shared.lock().expect("not poisoned");
            s.acks.push(Ack {
                slot: key_slot(key.as_bytes()),
                at_ns: since(epoch),
            });
            s.unique.insert(key, value);
        }
        return status;
    }
    if roll >= 90 {
        return group_op(c, client, rng, epoch, shared);
    }
    let (op, key, value, cmd) = if roll < 40 {
        let key = if rng.below(2) == 0 {
            format!("r{}-{}", secs / REGISTER_S, rng.below(REGISTERS))
        } else {
            format!("c{}-{}", secs / COUNTER_S, rng.below(COUNTERS))
        };
        let mut cmd = redis::cmd("GET");
        cmd.arg(&key);
        ("get", key, String::new(), cmd)
    } else if roll < 60 {
        let key = format!("r{}-{}", secs / REGISTER_S, rng.below(REGISTERS));
        let value = format!("{client}-{n}");
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key).arg(&value);
        ("set", key, value, cmd)
    } else if roll < 75 {
        let key = format!("c{}-{}", secs / COUNTER_S, rng.below(COUNTERS));
        let mut cmd = redis::cmd("INCR");
        cmd.arg(&key);
        ("incr", key, String::new(), cmd)
    } else {
        let key = format!("x{}-{}", secs / SETNX_S, rng.below(2));
        let value = format!("{client}-{n}");
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key).arg(&value).arg("NX");
        ("setnx", key, value, cmd)
    };
    one_command(c, client, (op, key, value, cmd), epoch, shared)
}

/// Does one command and records it; its status.
fn one_command(
    c: &mut ClusterConnection,
    client: usize,
    (op, key, value, cmd): (&'static str, String, String, redis::Cmd),
    epoch: Instant,
    shared: &Mutex<Shared>,
) -> &'static str {
    let call_ns = since(epoch);
    let answer = cmd.query::<redis::Value>(c);
    let return_ns = since(epoch);
    let (status, output) = match (&answer, op) {
        (Ok(redis::Value::Okay), "set") => ("ok", None),
        (Ok(redis::Value::Okay), "setnx") => ("ok", Some("1".to_string())),
        (Ok(redis::Value::Nil), "setnx") => ("ok", Some("0".to_string())),
        (Ok(redis::Value::Nil), "get") => ("ok", None),
        (Ok(redis::Value::BulkString(b)), "get") => {
            ("ok", Some(String::from_utf8_lossy(b).into_owned()))
        }
        (Ok(redis::Value::Int(i)), "incr") => ("ok", Some(i.to_string())),
        // A reply of the wrong kind: nothing is known of what it did.
        (Ok(_), _) => ("info", None),
        (Err(e), _) if refused(e) => ("fail", None),
        (Err(_), _) => ("info", None),
    };
    let record = Op {
        client,
        key,
        op,
        value,
        txn: Vec::new(),
        status,
        output,
        outputs: Vec::new(),
        error: (status != "ok").then(|| format!("{answer:?}")),
        call_ns,
        return_ns,
    };
    record_op(shared, record)
}

/// Adds `record` to the history (and an acknowledged write to the acks); its status.
fn record_op(shared: &Mutex<Shared>, record: Op) -> &'static str {
    let (status, return_ns) = (record.status, record.return_ns);
    let mut s = shared.lock().expect("not poisoned");
    if status == "ok" && record.is_write() {
        s.acks.push(Ack {
            slot: key_slot(record.key.as_bytes()),
            at_ns: return_ns,
        });
    }
    s.history.push(record);
    status
}

/// An operation on one hashtag's two keys: mostly a transaction that increments both or
/// reads both, sometimes a lone `GET` of one or `INCR` of the first. Records it; its
/// status.
fn group_op(
    c: &mut ClusterConnection,
    client: usize,
    rng: &mut Rng,
    epoch: Instant,
    shared: &Mutex<Shared>,
) -> &'static str {
    let secs = since(epoch) / 1_000_000_000;
    let tag = format!("{{t{}-{}}}", secs / TXN_S, rng.below(TXN_GROUPS));
    let keys = [format!("{tag}a"), format!("{tag}b")];
    let roll = rng.below(10);
    if roll < 2 {
        let (op, key) = if roll == 0 {
            ("get", keys[rng.below(2) as usize].clone())
        } else {
            ("incr", keys[0].clone())
        };
        let mut cmd = redis::cmd(if op == "get" { "GET" } else { "INCR" });
        cmd.arg(&key);
        return one_command(c, client, (op, key, String::new(), cmd), epoch, shared);
    }
    let op = if roll < 6 { "incr" } else { "get" };
    let txn: Vec<Command> = keys.into_iter().map(|key| Command { op, key }).collect();
    let mut pipe = redis::pipe();
    pipe.atomic();
    for command in &txn {
        pipe.cmd(if op == "get" { "GET" } else { "INCR" })
            .arg(&command.key);
    }
    // The cluster client routes a MULTI by the command after it; the EXEC's answer is
    // the one reply asked for (the queueing replies before it are checked by the
    // client: an error among them is EXECABORT).
    let call_ns = since(epoch);
    let answer = c.req_packed_commands(&pipe.get_packed_pipeline(), txn.len() + 1, 1);
    let return_ns = since(epoch);
    let error = format!("{answer:?}");
    let (status, outputs) = exec_outcome(answer, txn.len());
    let record = Op {
        client,
        key: tag,
        op: "txn",
        value: String::new(),
        txn,
        status,
        output: None,
        outputs,
        error: (status != "ok").then_some(error),
        call_ns,
        return_ns,
    };
    record_op(shared, record)
}

/// What an `EXEC` of `n` commands answered: its status and, when `ok`, each command's
/// answer (a value, or none for a missing key).
fn exec_outcome(
    answer: redis::RedisResult<Vec<redis::Value>>,
    n: usize,
) -> (&'static str, Vec<Option<String>>) {
    let exec = match answer {
        Err(e) if refused(&e) => return ("fail", Vec::new()),
        Err(_) => return ("info", Vec::new()),
        Ok(mut replies) if replies.len() == 1 => replies.remove(0),
        Ok(_) => return ("info", Vec::new()),
    };
    match exec {
        redis::Value::Array(items) if items.len() == n => {
            let mut outputs = Vec::with_capacity(n);
            for item in items {
                outputs.push(match item {
                    redis::Value::Nil => None,
                    redis::Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                    redis::Value::Int(i) => Some(i.to_string()),
                    // A command's error, or a reply of the wrong kind: nothing is
                    // known of what the transaction did.
                    _ => return ("info", Vec::new()),
                });
            }
            ("ok", outputs)
        }
        // A null EXEC: aborted (a WATCH, which the workload does not use).
        redis::Value::Nil => ("fail", Vec::new()),
        redis::Value::ServerError(e) if refused_code(Some(e.code())) => ("fail", Vec::new()),
        _ => ("info", Vec::new()),
    }
}

/// How long to retry a read at the end after `failures` reads could not be done: the
/// full `patience` for the first, then 1 s, then (a region down for good) one try.
fn patience_after(failures: usize, patience: Duration) -> Duration {
    match failures {
        0 => patience,
        1..=20 => Duration::from_secs(1),
        _ => Duration::ZERO,
    }
}

/// Reads every key of `history` once more through a fresh client, appended to the
/// history as client `client`'s operations (so a write acknowledged and then lost
/// shows as a violation); each retried as [`patience_after`] says. The keys that could
/// not be read (they get no final read).
pub fn final_reads(
    seeds: &[String],
    password: Option<&str>,
    history: &mut Vec<Op>,
    client: usize,
    epoch: Instant,
    patience: Duration,
) -> Vec<String> {
    let mut keys: Vec<String> = history
        .iter()
        .flat_map(|o| o.keys())
        .map(str::to_string)
        .collect();
    keys.sort();
    keys.dedup();
    let mut unread = Vec::new();
    for key in keys {
        let wait = patience_after(unread.len(), patience);
        let read = tucana_clusterprobe::wait_for("a final read", wait, || {
            let mut c = cluster_client(seeds, password).ok()?;
            let call_ns = since(epoch);
            let v: Option<String> = redis::cmd("GET").arg(&key).query(&mut c).ok()?;
            Some((v, call_ns, since(epoch)))
        });
        let Ok((output, call_ns, return_ns)) = read else {
            unread.push(key);
            continue;
        };
        history.push(Op {
            client,
            key,
            op: "get",
            value: String::new(),
            txn: Vec::new(),
            status: "ok",
            output,
            outputs: Vec::new(),
            error: None,
            call_ns,
            return_ns,
        });
    }
    unread
}

/// The unique keys of `unique` that do not read back with their value, and those that
/// could not be read (retried as [`patience_after`] says).
pub fn lost_unique(
    seeds: &[String],
    password: Option<&str>,
    unique: &BTreeMap<String, String>,
    patience: Duration,
) -> (Vec<String>, Vec<String>) {
    let (mut lost, mut unreadable) = (Vec::new(), Vec::new());
    let mut conn: Option<ClusterConnection> = None;
    for (key, value) in unique {
        let wait = patience_after(unreadable.len(), patience);
        let got = tucana_clusterprobe::wait_for("a read of an acknowledged key", wait, || {
            if conn.is_none() {
                conn = cluster_client(seeds, password).ok();
            }
            let c = conn.as_mut()?;
            match redis::cmd("GET").arg(key).query::<Option<String>>(c) {
                Ok(v) => Some(v),
                Err(_) => {
                    conn = None;
                    None
                }
            }
        });
        match got {
            Ok(got) if got.as_deref() == Some(value.as_str()) => {}
            Ok(_) => lost.push(key.clone()),
            Err(_) => unreadable.push(key.clone()),
        }
    }
    (lost, unreadable)
}
