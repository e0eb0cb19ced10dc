//! WATCH through a real Redis client: EXEC answers a null array when a watched key was
//! written, deleted or expired by anyone since WATCH (also when written back to the same
//! value), and the redis crate's `transaction` loop (redis-py's `transaction()` pattern)
//! counts exactly under contention.

use std::time::{Duration, Instant};

use redis::{Commands, Connection, RedisResult, Value};
use tucana::Database;
use tucana_server::{spawn, RunningServer, ServerConfig};

mod client;
use client::connect;

fn start(active_expiry: bool) -> RunningServer {
    let db = Database::builder().open_in_memory().unwrap();
    spawn(
        db,
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            active_expiry,
            ..ServerConfig::default()
        },
    )
    .unwrap()
}

fn run(con: &mut Connection, args: &[&str]) -> RedisResult<Value> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con)
}

fn ok(con: &mut Connection, args: &[&str]) -> Value {
    run(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// `MULTI; SET key value; EXEC`: whether the transaction ran.
fn exec_set(con: &mut Connection, key: &str, value: &str) -> bool {
    ok(con, &["MULTI"]);
    ok(con, &["SET", key, value]);
    match ok(con, &["EXEC"]) {
        Value::Nil => false,
        Value::Array(replies) => {
            assert_eq!(replies.len(), 1);
            true
        }
        other => panic!("EXEC answered {other:?}"),
    }
}

#[test]
fn a_write_by_another_connection_aborts_exec() {
    let server = start(true);
    let (mut a, mut b) = (connect(&server), connect(&server));
    let writes: [&[&str]; 5] = [
        &["SET", "k", "other"],
        // The same value again: still a modification (no ABA).
        &["SET", "k", "v"],
        &["DEL", "k"],
        &["EXPIRE", "k", "100"],
        &["APPEND", "k", "x"],
    ];
    for write in writes {
        let _: () = a.set("k", "v").unwrap();
        ok(&mut a, &["WATCH", "k"]);
        let _ = run(&mut b, write);
        assert!(!exec_set(&mut a, "k", "mine"), "{write:?}");
        assert_ne!(
            a.get::<_, Option<String>>("k").unwrap().as_deref(),
            Some("mine")
        );
    }
    // FLUSHDB aborts, and so does a plain SET on the fast path (taken once FLUSHDB left
    // the database without deadlines).
    for write in [&["FLUSHDB"][..], &["SET", "k", "fast"]] {
        let _: () = a.set("k", "v").unwrap();
        ok(&mut a, &["WATCH", "k"]);
        ok(&mut b, write);
        assert!(!exec_set(&mut a, "k", "mine"), "{write:?}");
    }
    // Unmodified: EXEC runs. Writes to other keys do not count.
    ok(&mut a, &["WATCH", "k", "k2"]);
    let _: () = b.set("unrelated", "1").unwrap();
    assert!(exec_set(&mut a, "k", "mine"));
    // EXEC unwatched: a later write does not abort the next transaction.
    let _: () = b.set("k", "x").unwrap();
    assert!(exec_set(&mut a, "k", "again"));
    server.stop().unwrap();
}

#[test]
fn unwatch_discard_and_watch_inside_multi() {
    let server = start(true);
    let (mut a, mut b) = (connect(&server), connect(&server));
    ok(&mut a, &["WATCH", "k"]);
    assert_eq!(ok(&mut a, &["UNWATCH"]), Value::Okay);
    let _: () = b.set("k", "x").unwrap();
    assert!(exec_set(&mut a, "k", "mine"));

    ok(&mut a, &["WATCH", "k"]);
    ok(&mut a, &["MULTI"]);
    let e = run(&mut a, &["WATCH", "k"]).unwrap_err().to_string();
    assert!(e.contains("WATCH inside MULTI is not allowed"), "{e}");
    ok(&mut a, &["DISCARD"]);
    let _: () = b.set("k", "y").unwrap();
    assert!(exec_set(&mut a, "k", "mine"), "DISCARD unwatched");
    server.stop().unwrap();
}

/// A watched key that expires between WATCH and EXEC aborts it, whether the sweeper
/// deleted it (a write) or it is only hidden (lazy expiry, no write).
#[test]
fn a_watched_key_that_expires_aborts_exec() {
    for active_expiry in [false, true] {
        let server = start(active_expiry);
        let mut con = connect(&server);
        // The key must be live at WATCH: PTTL after WATCH proves it was.
        let mut px = 200;
        loop {
            let _: () = redis::cmd("SET")
                .arg("k")
                .arg("v")
                .arg("PX")
                .arg(px)
                .query(&mut con)
                .unwrap();
            ok(&mut con, &["WATCH", "k"]);
            if con.pttl::<_, i64>("k").unwrap() > 0 {
                break;
            }
            ok(&mut con, &["UNWATCH"]);
            px *= 4;
        }
        let give_up = Instant::now() + Duration::from_secs(60);
        while con.pttl::<_, i64>("k").unwrap() != -2 {
            assert!(Instant::now() < give_up);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!exec_set(&mut con, "k", "mine"), "active {active_expiry}");
        server.stop().unwrap();
    }
}

/// Regression (Redis's suite, "FLUSHDB while watching stale keys should not fail EXEC"):
/// FLUSHDB counted every watched key as modified, also one that had already expired
/// before WATCH, so the EXEC aborted where Redis 7 runs it. A flush modifies only the
/// watched keys that are live; a live one still aborts the EXEC.
#[test]
fn flushdb_modifies_only_the_watched_keys_that_are_live() {
    let server = start(false);
    let mut con = connect(&server);
    let _: () = redis::cmd("SET")
        .arg("stale")
        .arg("v")
        .arg("PX")
        .arg(1)
        .query(&mut con)
        .unwrap();
    let give_up = Instant::now() + Duration::from_secs(60);
    while con.pttl::<_, i64>("stale").unwrap() != -2 {
        assert!(Instant::now() < give_up);
        std::thread::sleep(Duration::from_millis(2));
    }
    ok(&mut con, &["WATCH", "stale"]);
    ok(&mut con, &["FLUSHDB"]);
    assert!(exec_set(&mut con, "other", "x"), "a stale watched key");

    let _: () = con.set("live", "v").unwrap();
    ok(&mut con, &["WATCH", "live"]);
    ok(&mut con, &["FLUSHDB"]);
    assert!(!exec_set(&mut con, "other", "x"), "a live watched key");
    server.stop().unwrap();
}

/// SORT ... STORE writes its destination: an empty result deletes it, which aborts an
/// EXEC watching it (Redis's suite: "EXEC fail on WATCHed key modified by SORT with
/// STORE even if the result is empty").
#[test]
fn sort_store_modifies_its_destination() {
    let server = start(true);
    let mut con = connect(&server);
    ok(&mut con, &["RPUSH", "foo", "bar"]);
    ok(&mut con, &["WATCH", "foo"]);
    assert_eq!(
        ok(&mut con, &["SORT", "emptylist", "STORE", "foo"]),
        Value::Int(0)
    );
    assert!(!exec_set(&mut con, "other", "x"));
    assert_eq!(ok(&mut con, &["EXISTS", "foo"]), Value::Int(0));
    server.stop().unwrap();
}

/// A collection's write that leaves its metadata as it was (a member's new score, an
/// element or a field overwritten) no longer writes the metadata record again, and that
/// record's write was what marked the key modified: such writes must still abort EXEC,
/// alone and in a pipelined run (another store, `TxKv`), while writes that change nothing
/// do not, as in Redis 7 (checked against redis-server: SADD of a member already there,
/// ZADD of the same score and LREM of nothing leave the watch alone; LSET and HSET of the
/// same value do not).
#[test]
fn collection_writes_abort_exec_exactly_when_redis_says_they_modify() {
    let server = start(true);
    let (mut a, mut b) = (connect(&server), connect(&server));
    let big = "x".repeat(5000); // per-field hash, not packed
    let cases: [(&[&str], &[&str], bool); 8] = [
        (&["ZADD", "z", "1", "m"], &["ZADD", "z", "2", "m"], true),
        (&["ZADD", "z", "1", "m"], &["ZINCRBY", "z", "1", "m"], true),
        (&["RPUSH", "l", "a", "b"], &["LSET", "l", "0", "a"], true),
        (
            &["HSET", "h", "f", "v", "g", &big],
            &["HSET", "h", "f", "w"],
            true,
        ),
        (
            &["HSET", "h", "f", "v", "g", &big],
            &["HSET", "h", "f", "v"],
            true,
        ),
        (&["SADD", "s", "m"], &["SADD", "s", "m"], false),
        (&["ZADD", "z", "1", "m"], &["ZADD", "z", "1", "m"], false),
        (&["RPUSH", "l", "a", "b"], &["LREM", "l", "0", "zz"], false),
    ];
    for pipelined in [false, true] {
        for (setup, write, aborts) in cases {
            ok(&mut a, &["DEL", setup[1]]);
            ok(&mut a, setup);
            ok(&mut a, &["WATCH", setup[1]]);
            if pipelined {
                // Two writes in one pipeline run under one store, committed together.
                let mut pipe = redis::pipe();
                for _ in 0..2 {
                    let mut cmd = redis::cmd(write[0]);
                    for arg in &write[1..] {
                        cmd.arg(*arg);
                    }
                    pipe.add_command(cmd);
                }
                let _: Vec<Value> = pipe.query(&mut b).unwrap();
            } else {
                ok(&mut b, write);
            }
            ok(&mut a, &["MULTI"]);
            ok(&mut a, &["PING"]);
            let ran = ok(&mut a, &["EXEC"]) != Value::Nil;
            assert_eq!(
                ran, !aborts,
                "{write:?} after {setup:?}, pipelined: {pipelined}"
            );
        }
    }
    server.stop().unwrap();
}

#[test]
fn optimistic_increments_from_many_threads_count_exactly() {
    let server = start(true);
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let mut con = connect(&server);
            std::thread::spawn(move || {
                for _ in 0..40 {
                    let _: () = redis::transaction(&mut con, &["counter"], |con, pipe| {
                        let n: i64 = con.get::<_, Option<i64>>("counter")?.unwrap_or(0);
                        pipe.set("counter", n + 1).ignore().query(con)
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut con = connect(&server);
    assert_eq!(con.get::<_, i64>("counter").unwrap(), 240);
    server.stop().unwrap();
}
