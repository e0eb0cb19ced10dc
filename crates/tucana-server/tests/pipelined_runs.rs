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

include!("common/pipelined_runs_script.rs");

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
