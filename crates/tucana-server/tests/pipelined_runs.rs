//! Pipelined runs of collection writes (`commands/runs.rs`: consecutive LPUSH, LPOP,
//! ZADD, HSET, ... run under one lock hold as one engine batch) answer what the same
//! commands answer one at a time, and what redis-server answers to the same pipeline:
//! pops past the end of a list, WRONGTYPE and a change of type inside a run, an expired
//! key met inside a run, errors that end a run, runs past the length bound; in buffered
//! and in sync mode (where the replies of a run's writes wait for the sync). The
//! comparison with redis-server is skipped, with a message, where it is not installed.

mod common;

use common::Raw;
use tucana_server::{spawn, DurabilityMode, ServerConfig};

/// Sets up a list `e` and a sorted set `ez` that expire 1 ms later.
const SETUP: &[&str] = &["RPUSH e 1 2", "PEXPIRE e 1", "ZADD ez 1 a", "PEXPIRE ez 1"];

fn words(line: &str) -> Vec<Vec<u8>> {
    line.split_whitespace()
        .map(|w| w.as_bytes().to_vec())
        .collect()
}

/// The pipeline: runs of collection writes mixed with what ends a run.
fn script() -> Vec<String> {
    let mut lines: Vec<String> = [
        "LPUSH l a b c",
        "RPUSH l d",
        "LPOP l",
        "RPOP l",
        "LPOP l 2",
        "LPOP l",
        "LPOP l 3",
        "RPOP l",
        "RPUSH l e",
        "LPUSHX nope x",
        "RPUSHX l f",
        "ZADD l 1 m",
        "LPOP e",
        "RPUSH e x",
        "LPUSH ez y",
        "LLEN l",
        "ZADD z 1 a 2 b 3 c",
        "ZADD z 5 a",
        "ZADD z NX 9 a",
        "ZADD z XX CH 7 b",
        "ZADD z INCR 1 c",
        "ZINCRBY z 2.5 a",
        "ZADD z 1 x y",
        "ZREM z a b c",
        "ZADD z 1 q",
        "LPUSH z x",
        "ZREM z q",
        "LPUSH z x",
        "RPUSH z y",
        "HSET h f v g w",
        "HSETNX h f x",
        "HINCRBY h n 5",
        "HINCRBY h f 1",
        "HDEL h f g n",
        "HMSET h a 1",
        "SADD s a b a",
        "SREM s a",
        "SADD h x",
        "SET str v",
        "LPUSH str x",
        "SADD str x",
        "LPUSH",
        "LPOP l -1",
        "LPOP l",
        "DEL l",
        "LPOP l",
        "RPUSH l after-del",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    lines.extend((0..300).map(|i| format!("RPUSH big {i}")));
    lines.extend((0..150).map(|_| "LPOP big".to_string()));
    lines.push("LPOP big 200".into());
    lines.extend((0..5).map(|_| "RPOP big".to_string()));
    lines.extend((0..40).map(|i| format!("ZADD rec-index {} m{}", (i * 7) % 23, i % 31)));
    lines.extend(
        [
            "LRANGE l 0 -1",
            "LRANGE e 0 -1",
            "LRANGE ez 0 -1",
            "LRANGE z 0 -1",
            "ZRANGE rec-index 0 -1 WITHSCORES",
            "HGETALL h",
            "SMEMBERS s",
            "EXISTS big",
            "TYPE z",
            "DBSIZE",
        ]
        .map(String::from),
    );
    lines
}

/// `SETUP` one command at a time, 5 ms for its deadlines to pass, then the script: as one
/// pipeline, or one command at a time.
fn replies(addr: &str, pipelined: bool) -> Vec<Vec<u8>> {
    let mut raw = Raw::connect(addr);
    for line in SETUP {
        raw.call(&words(line));
    }
    std::thread::sleep(std::time::Duration::from_millis(5));
    let requests: Vec<Vec<Vec<u8>>> = script().iter().map(|l| words(l)).collect();
    if pipelined {
        raw.pipeline(&requests)
    } else {
        requests.iter().map(|r| raw.call(r).0).collect()
    }
}

/// The lines whose replies differ, with both replies.
fn differences(want: &[Vec<u8>], got: &[Vec<u8>]) -> Vec<String> {
    assert_eq!(want.len(), got.len());
    script()
        .iter()
        .zip(want.iter().zip(got))
        .filter(|(_, (w, g))| w != g)
        .map(|(line, (w, g))| {
            format!(
                "{line}: want {:?}, got {:?}",
                String::from_utf8_lossy(w),
                String::from_utf8_lossy(g)
            )
        })
        .collect()
}

fn tucana(durability: DurabilityMode) -> tucana_server::RunningServer {
    let db = tucana::Database::builder().open_in_memory().unwrap();
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        durability,
        ..ServerConfig::default()
    };
    spawn(db, config).unwrap()
}

#[test]
fn pipelined_collection_writes_answer_as_one_at_a_time_in_both_durability_modes() {
    let alone = tucana(DurabilityMode::Buffered);
    let want = replies(&alone.addr.to_string(), false);
    alone.stop().unwrap();
    for durability in [DurabilityMode::Buffered, DurabilityMode::Sync] {
        let piped = tucana(durability);
        let got = replies(&piped.addr.to_string(), true);
        piped.stop().unwrap();
        let diff = differences(&want, &got);
        assert!(diff.is_empty(), "{durability:?}:\n{}", diff.join("\n"));
    }
    let text: Vec<String> = want
        .iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .collect();
    assert!(text.iter().any(|r| r.starts_with("-WRONGTYPE")));
    assert!(
        text.contains(&"*-1\r\n".to_string()),
        "LPOP l 3 of a gone list"
    );
}

#[test]
fn pipelined_collection_writes_match_redis_server() {
    let Some((_redis, port)) = common::start_redis_server() else {
        return;
    };
    let ours = tucana(DurabilityMode::Buffered);
    let got = replies(&ours.addr.to_string(), true);
    ours.stop().unwrap();
    let want = replies(&format!("127.0.0.1:{port}"), true);
    let diff = differences(&want, &got);
    assert!(diff.is_empty(), "{}", diff.join("\n"));
}
