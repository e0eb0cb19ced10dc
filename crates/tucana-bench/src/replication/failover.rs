//! Failover timing: a primary with one send-index backup is loaded with a data set of a
//! given size, commits (`SAVE`, applied by the backup), takes a tail of writes that no
//! commit covers, and is killed (`kill -9`); the backup is promoted (`REPLICAOF NO ONE`)
//! and the time from sending that to the first `SET` it acknowledges is the failover
//! time. The promotion replays the tail: the log bytes the backup received after the
//! last commit it applied, whose count and implied rate the record gives.
//!
//! The tail must not be committed: the primary's committer commits whatever is dirty
//! every 5 s (counted from its own last commit, which a `SAVE` does not restart), so the
//! tail is written again, over the same keys, until no commit happened while it was
//! written (the first try's writes usually make a timed commit due at once; the next try
//! then has the committer's whole interval).
//!
//! Owns the failover's steps and its record; the processes are `cluster`'s.
//! Single-threaded (the loader's connections aside).

use std::ops::Range;
use std::path::Path;
use std::time::{Duration, Instant};

use super::client::RespKind;
use super::cluster::{Cluster, Node, Setup};
use crate::engine::{EngineConfig, EngineKind};
use crate::results::Record;
use crate::server::resp::{key, load_keys, KEY_BYTES};
use crate::Result;

/// How many times the tail is written before the run gives up on an uncommitted one.
const TAIL_TRIES: u32 = 5;

/// How long the promotion may take before the run calls it failed.
const PROMOTION_TIMEOUT: Duration = Duration::from_secs(600);

/// What the failover run loads and writes.
pub(super) struct FailoverPlan {
    /// Bytes of keys and values loaded and committed before the kill.
    pub(super) data_bytes: u64,
    pub(super) value_bytes: u64,
    /// Bytes of keys and values written after the last commit.
    pub(super) tail_bytes: u64,
}

/// The tail as the backup holds it.
struct Tail {
    /// Log bytes the backup received after the last commit it applied; `None` when a
    /// commit took part of the tail on every try.
    replay_log_bytes: Option<u64>,
    tries: u32,
    /// The backup's applied commits and received log bytes when the tail was complete.
    applied: Option<u64>,
    received_before: Option<u64>,
}

/// Runs the failover in `dir` and returns its record.
pub(super) fn run(tucana: &Path, dir: &Path, plan: &FailoverPlan) -> Result<Record> {
    let mut cluster = Cluster::start(Setup::SendIndex1, tucana, dir)?;
    let result = failover(&mut cluster, plan);
    let stopped = cluster.stop();
    let record = result?;
    stopped?;
    Ok(record)
}

fn failover(cluster: &mut Cluster, plan: &FailoverPlan) -> Result<Record> {
    let pair_bytes = KEY_BYTES + plan.value_bytes;
    let keys = (plan.data_bytes / pair_bytes).max(1);
    let tail_keys = (plan.tail_bytes / pair_bytes).max(1);
    let started = Instant::now();
    load_keys(
        cluster.primary.port,
        0..keys,
        &vec![b'x'; plan.value_bytes as usize],
    )?;
    let load_s = started.elapsed().as_secs_f64();
    let settle_s = cluster.settle()?.as_secs_f64();
    let tail_value = vec![b'y'; plan.value_bytes as usize];
    let tail_range = keys..keys + tail_keys;
    let mut tail = write_tail(cluster, tail_range.clone(), &tail_value)?;
    cluster.primary.kill()?;
    let backup = &cluster.backups[0];
    // A commit between the last look and the kill would have taken the tail.
    let after_kill = backup_counters(backup);
    if after_kill.0 != tail.applied {
        tail.replay_log_bytes = None;
    } else if let (Some(received), Some(before)) = (after_kill.1, tail.received_before) {
        tail.replay_log_bytes = Some(received.saturating_sub(before));
    }

    let promote_started = Instant::now();
    let reply = backup.request(&[b"REPLICAOF", b"NO", b"ONE"], PROMOTION_TIMEOUT)?;
    let promote_s = promote_started.elapsed().as_secs_f64();
    if reply != "+OK" {
        return Err(format!("REPLICAOF NO ONE answered {reply:?}").into());
    }
    let reply = backup.request(&[b"SET", b"failover:first", b"1"], PROMOTION_TIMEOUT)?;
    let failover_s = promote_started.elapsed().as_secs_f64();
    if reply != "+OK" {
        return Err(format!("the promoted backup answered the first SET with {reply:?}").into());
    }
    verify_tail(backup.port, tail_range, &tail_value)?;

    let mut record = Record::unmeasured(Setup::SendIndex1.name(), "failover");
    record.set("dataset", "failover");
    record.set("data_bytes", keys * pair_bytes);
    record.set("keys", keys);
    record.set("value_bytes", plan.value_bytes);
    record.set("load_s", load_s);
    record.set(
        "load_bytes_per_sec",
        (keys * pair_bytes) as f64 / load_s.max(1e-9),
    );
    record.set("settle_s", settle_s);
    record.set("tail_user_bytes", tail_keys * pair_bytes);
    record.set("tail_tries", tail.tries);
    record.set("replay_log_bytes", tail.replay_log_bytes);
    record.set("promote_ms", promote_s * 1e3);
    record.set("failover_ms", failover_s * 1e3);
    record.set(
        "replay_bytes_per_sec",
        tail.replay_log_bytes
            .map(|b| b as f64 / failover_s.max(1e-9)),
    );
    record.set("verified", true);
    Ok(record)
}

/// The backup's applied commits and received log bytes.
fn backup_counters(backup: &Node) -> (Option<u64>, Option<u64>) {
    let sample = super::sample::NodeSample::read(backup.pid(), backup.port);
    (
        sample.field("tucana_commits_applied"),
        sample.field("tucana_received_log_bytes"),
    )
}

/// Writes the tail (SETs of `keys` to `value`) until no commit happened on the primary
/// while it was written and shipped.
fn write_tail(cluster: &mut Cluster, keys: Range<u64>, value: &[u8]) -> Result<Tail> {
    let primary_commits = |cluster: &Cluster| {
        super::sample::NodeSample::read(cluster.primary.pid(), cluster.primary.port)
            .field("commits")
    };
    for tries in 1..=TAIL_TRIES {
        let commits = primary_commits(cluster);
        let (applied, received) = backup_counters(&cluster.backups[0]);
        load_keys(cluster.primary.port, keys.clone(), value)?;
        cluster.wait_caught_up()?;
        let (applied_after, received_after) = backup_counters(&cluster.backups[0]);
        if primary_commits(cluster) == commits && applied_after == applied {
            return Ok(Tail {
                replay_log_bytes: received_after
                    .zip(received)
                    .map(|(a, b)| a.saturating_sub(b)),
                tries,
                applied,
                received_before: received,
            });
        }
    }
    let (applied, received) = backup_counters(&cluster.backups[0]);
    println!("WARNING: failover: a commit took part of the tail on each of {TAIL_TRIES} tries");
    Ok(Tail {
        replay_log_bytes: None,
        tries: TAIL_TRIES,
        applied,
        received_before: received,
    })
}

/// The promoted backup must hold the tail: its first and last key, with the tail's value.
fn verify_tail(port: u16, keys: Range<u64>, value: &[u8]) -> Result<()> {
    let engine = RespKind { port }.open(Path::new("."), &EngineConfig::default())?;
    for index in [keys.start, keys.end - 1] {
        let name = key(index);
        match engine.get(name.as_bytes(), &mut |found| found == value)? {
            Some(true) => {}
            Some(false) => {
                return Err(format!("{name}: the promoted backup holds another value").into())
            }
            None => {
                return Err(
                    format!("{name}: the promoted backup lost an acknowledged write").into(),
                )
            }
        }
    }
    engine.close()
}
