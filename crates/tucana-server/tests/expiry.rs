//! Key deadlines through a real Redis client: the EXPIRE family, TTL and its family, SET's
//! expiry options, SETEX, PSETEX, GETEX, lazy expiry on every read path, the background
//! sweeper, and deadlines across a restart. Where time matters, deadlines are far in the
//! future (replies compared in ranges) or already passed (waited for, never timed).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Commands, Connection, RedisResult, Value};
use tucana::Database;
use tucana_server::{spawn, RunningServer, ServerConfig};

fn config() -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ServerConfig::default()
    }
}

fn start_on(db: &Database, active_expiry: bool) -> RunningServer {
    spawn(
        db.clone(),
        ServerConfig {
            active_expiry,
            ..config()
        },
    )
    .unwrap()
}

fn start(active_expiry: bool) -> (Database, RunningServer) {
    let db = Database::builder().open_in_memory().unwrap();
    let server = start_on(&db, active_expiry);
    (db, server)
}

fn connect(server: &RunningServer) -> Connection {
    let client = redis::Client::open(format!("redis://{}/", server.addr)).unwrap();
    let con = client.get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    con
}

fn int(con: &mut Connection, args: &[&str]) -> i64 {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn error_text(con: &mut Connection, args: &[&str]) -> String {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let result: RedisResult<Value> = cmd.query(con);
    match result {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{args:?}: expected an error, got {v:?}"),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Waits (up to a minute) until `done` holds; the wait is not measured.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < give_up, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn expire_family_sets_reads_and_clears_deadlines() {
    let (_db, server) = start(true);
    let mut con = connect(&server);
    let _: () = con.set("k", "v").unwrap();
    assert_eq!(int(&mut con, &["TTL", "k"]), -1);
    assert_eq!(int(&mut con, &["PTTL", "missing"]), -2);
    assert_eq!(int(&mut con, &["EXPIRETIME", "k"]), -1);
    assert_eq!(int(&mut con, &["EXPIRE", "missing", "100"]), 0);

    assert_eq!(int(&mut con, &["EXPIRE", "k", "100"]), 1);
    let ttl = int(&mut con, &["TTL", "k"]);
    assert!((1..=100).contains(&ttl), "{ttl}");
    let pttl = int(&mut con, &["PTTL", "k"]);
    assert!((1..=100_000).contains(&pttl), "{pttl}");
    let at = int(&mut con, &["PEXPIRETIME", "k"]);
    assert!(at > now_ms() && at <= now_ms() + 100_000, "{at}");
    assert_eq!(int(&mut con, &["EXPIRETIME", "k"]), (at + 500) / 1000);

    // NX, XX, GT, LT.
    assert_eq!(int(&mut con, &["EXPIRE", "k", "200", "NX"]), 0);
    assert_eq!(int(&mut con, &["EXPIRE", "k", "200", "XX"]), 1);
    assert_eq!(int(&mut con, &["EXPIRE", "k", "100", "GT"]), 0);
    assert_eq!(int(&mut con, &["EXPIRE", "k", "300", "GT"]), 1);
    assert_eq!(int(&mut con, &["EXPIRE", "k", "400", "LT"]), 0);
    assert_eq!(int(&mut con, &["PEXPIRE", "k", "150000", "lt"]), 1);
    let ttl = int(&mut con, &["TTL", "k"]);
    assert!((1..=150).contains(&ttl), "{ttl}");

    // PERSIST, then the conditions on a key without a deadline.
    assert_eq!(int(&mut con, &["PERSIST", "k"]), 1);
    assert_eq!(int(&mut con, &["TTL", "k"]), -1);
    assert_eq!(int(&mut con, &["PERSIST", "k"]), 0);
    assert_eq!(int(&mut con, &["PERSIST", "missing"]), 0);
    assert_eq!(int(&mut con, &["EXPIRE", "k", "100", "XX"]), 0);
    assert_eq!(int(&mut con, &["EXPIRE", "k", "100", "GT"]), 0);
    assert_eq!(int(&mut con, &["EXPIRE", "k", "100", "LT"]), 1);
    let far_s = now_ms() / 1000 + 86_400;
    assert_eq!(int(&mut con, &["EXPIREAT", "k", &far_s.to_string()]), 1);
    assert_eq!(int(&mut con, &["EXPIRETIME", "k"]), far_s);
    assert_eq!(
        int(
            &mut con,
            &["PEXPIREAT", "k", &(far_s * 1000 + 7).to_string()]
        ),
        1
    );
    assert_eq!(int(&mut con, &["PEXPIRETIME", "k"]), far_s * 1000 + 7);

    // Errors, in Redis's words.
    assert!(error_text(&mut con, &["EXPIRE", "k", "soon"]).contains("not an integer"));
    assert!(error_text(&mut con, &["EXPIRE", "k", "1", "NX", "XX"])
        .contains("NX and XX, GT or LT options at the same time are not compatible"));
    assert!(error_text(&mut con, &["EXPIRE", "k", "1", "GT", "LT"])
        .contains("GT and LT options at the same time are not compatible"));
    assert!(error_text(&mut con, &["EXPIRE", "k", "1", "YY"]).contains("Unsupported option YY"));
    assert!(
        error_text(&mut con, &["EXPIRE", "k", "9223372036854775807"])
            .contains("invalid expire time in 'expire' command")
    );
    assert!(
        error_text(&mut con, &["PEXPIRE", "k", "9223372036854775807"])
            .contains("invalid expire time in 'pexpire' command")
    );
    assert_eq!(
        int(&mut con, &["PEXPIRETIME", "k"]),
        far_s * 1000 + 7,
        "unchanged"
    );

    // A deadline at or before now deletes the key.
    assert_eq!(int(&mut con, &["EXPIRE", "k", "-1"]), 1);
    assert_eq!(int(&mut con, &["EXISTS", "k"]), 0);
    let _: () = con.set("k", "v").unwrap();
    assert_eq!(int(&mut con, &["EXPIRE", "k", "0"]), 1);
    assert_eq!(int(&mut con, &["TTL", "k"]), -2);
    let _: () = con.set("k", "v").unwrap();
    assert_eq!(int(&mut con, &["PEXPIREAT", "k", "1"]), 1);
    assert_eq!(int(&mut con, &["TTL", "k"]), -2);
    server.stop().unwrap();
}

#[test]
fn set_setex_getex_and_the_writes_that_keep_or_drop_a_deadline() {
    let (_db, server) = start(true);
    let mut con = connect(&server);
    let ok: String = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .arg("EX")
        .arg(100)
        .query(&mut con)
        .unwrap();
    assert_eq!(ok, "OK");
    assert!((1..=100).contains(&int(&mut con, &["TTL", "k"])));
    // KEEPTTL keeps it, a plain SET drops it.
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v2")
        .arg("KEEPTTL")
        .query(&mut con)
        .unwrap();
    assert!((1..=100).contains(&int(&mut con, &["TTL", "k"])));
    let _: () = con.set("k", "v3").unwrap();
    assert_eq!(int(&mut con, &["TTL", "k"]), -1);
    // GET with PX, EXAT, PXAT.
    let old: String = redis::cmd("SET")
        .arg("k")
        .arg("v4")
        .arg("GET")
        .arg("PX")
        .arg(50_000)
        .query(&mut con)
        .unwrap();
    assert_eq!(old, "v3");
    assert!((1..=50_000).contains(&int(&mut con, &["PTTL", "k"])));
    let far_s = now_ms() / 1000 + 3600;
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .arg("EXAT")
        .arg(far_s)
        .query(&mut con)
        .unwrap();
    assert_eq!(int(&mut con, &["EXPIRETIME", "k"]), far_s);
    // A PXAT already past: OK, and the key is gone.
    let ok: String = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .arg("PXAT")
        .arg(1)
        .query(&mut con)
        .unwrap();
    assert_eq!(ok, "OK");
    assert_eq!(int(&mut con, &["EXISTS", "k"]), 0);
    // NX and XX see through an expiring key's deadline only once it passed.
    let set_nx: Option<String> = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .arg("NX")
        .arg("EX")
        .arg(100)
        .query(&mut con)
        .unwrap();
    assert_eq!(set_nx.as_deref(), Some("OK"));
    assert!(int(&mut con, &["TTL", "k"]) > 0);

    for (args, want) in [
        (
            &["SET", "k", "v", "EX", "0"][..],
            "invalid expire time in 'set' command",
        ),
        (
            &["SET", "k", "v", "PX", "-5"],
            "invalid expire time in 'set' command",
        ),
        (
            &["SET", "k", "v", "EX", "9223372036854775807"],
            "invalid expire time in 'set' command",
        ),
        (&["SET", "k", "v", "EX", "x"], "not an integer"),
        (&["SET", "k", "v", "EX"], "syntax error"),
        (&["SET", "k", "v", "EX", "1", "PX", "1"], "syntax error"),
        (&["SET", "k", "v", "KEEPTTL", "EX", "1"], "syntax error"),
        (&["SET", "k", "v", "EX", "1", "KEEPTTL"], "syntax error"),
        (
            &["SETEX", "k", "0", "v"],
            "invalid expire time in 'setex' command",
        ),
        (
            &["PSETEX", "k", "-1", "v"],
            "invalid expire time in 'psetex' command",
        ),
        (
            &["GETEX", "k", "EX", "0"],
            "invalid expire time in 'getex' command",
        ),
        (&["GETEX", "k", "EX", "1", "PERSIST"], "syntax error"),
        (&["GETEX", "k", "KEEPTTL"], "syntax error"),
    ] {
        let text = error_text(&mut con, args);
        assert!(text.contains(want), "{args:?}: {text}");
    }
    assert!(
        int(&mut con, &["TTL", "k"]) > 0,
        "failed commands change nothing"
    );

    // SETEX, PSETEX.
    let _: () = redis::cmd("SETEX")
        .arg("s")
        .arg(100)
        .arg("v")
        .query(&mut con)
        .unwrap();
    assert!((1..=100).contains(&int(&mut con, &["TTL", "s"])));
    let _: () = redis::cmd("PSETEX")
        .arg("s")
        .arg(100_000)
        .arg("w")
        .query(&mut con)
        .unwrap();
    assert_eq!(con.get::<_, String>("s").unwrap(), "w");
    assert!((1..=100_000).contains(&int(&mut con, &["PTTL", "s"])));

    // GETEX: without options it changes nothing; PERSIST; EX; a missing key is nil.
    let v: String = redis::cmd("GETEX").arg("s").query(&mut con).unwrap();
    assert_eq!(v, "w");
    assert!(int(&mut con, &["PTTL", "s"]) > 0);
    let v: String = redis::cmd("GETEX")
        .arg("s")
        .arg("PERSIST")
        .query(&mut con)
        .unwrap();
    assert_eq!(v, "w");
    assert_eq!(int(&mut con, &["TTL", "s"]), -1);
    let _: String = redis::cmd("GETEX")
        .arg("s")
        .arg("EX")
        .arg(77)
        .query(&mut con)
        .unwrap();
    assert!((1..=77).contains(&int(&mut con, &["TTL", "s"])));
    let missing: Option<String> = redis::cmd("GETEX")
        .arg("nope")
        .arg("EX")
        .arg(5)
        .query(&mut con)
        .unwrap();
    assert_eq!(missing, None);
    let v: String = redis::cmd("GETEX")
        .arg("s")
        .arg("PXAT")
        .arg(1)
        .query(&mut con)
        .unwrap();
    assert_eq!(v, "w", "answers the value, then the key is gone");
    assert_eq!(int(&mut con, &["EXISTS", "s"]), 0);

    // INCR and APPEND keep the deadline; GETSET, MSET and DEL drop it.
    let _: () = redis::cmd("SET")
        .arg("n")
        .arg(1)
        .arg("EX")
        .arg(100)
        .query(&mut con)
        .unwrap();
    assert_eq!(int(&mut con, &["INCRBY", "n", "4"]), 5);
    assert!(int(&mut con, &["TTL", "n"]) > 0);
    assert_eq!(int(&mut con, &["APPEND", "n", "0"]), 2);
    assert!(int(&mut con, &["TTL", "n"]) > 0);
    assert_eq!(con.get::<_, i64>("n").unwrap(), 50);
    let _: String = con.getset("n", 7).unwrap();
    assert_eq!(int(&mut con, &["TTL", "n"]), -1);
    assert_eq!(int(&mut con, &["EXPIRE", "n", "100"]), 1);
    let _: () = con.mset(&[("n", "1"), ("m", "2")]).unwrap();
    assert_eq!(int(&mut con, &["TTL", "n"]), -1);
    assert_eq!(int(&mut con, &["EXPIRE", "n", "100"]), 1);
    assert_eq!(int(&mut con, &["DEL", "n", "n", "m"]), 2);
    let _: () = con.set("n", "again").unwrap();
    assert_eq!(
        int(&mut con, &["TTL", "n"]),
        -1,
        "a deleted key's deadline is gone"
    );
    server.stop().unwrap();
}

/// A key that expired, with the sweeper off: still in the engine, missing to every
/// command.
#[test]
fn an_expired_key_is_missing_to_every_read_and_write() {
    let (db, server) = start(false);
    let mut con = connect(&server);
    let _: () = con.set("live", "1").unwrap();
    let _: () = redis::cmd("SET")
        .arg("gone")
        .arg("5")
        .arg("PX")
        .arg(1)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("long")
        .arg("x")
        .arg("EX")
        .arg(1000)
        .query(&mut con)
        .unwrap();
    wait_until("gone expires", || int(&mut con, &["PTTL", "gone"]) == -2);
    let ks = db.open_keyspace("default").unwrap();
    assert!(
        ks.get(b"gone").unwrap().is_some(),
        "not deleted: lazy expiry hides it"
    );

    assert_eq!(con.get::<_, Option<String>>("gone").unwrap(), None);
    // A pipelined run of GETs (the fast path) looks the deadlines up too.
    let mut pipe = redis::pipe();
    for key in ["live", "gone", "long", "nope", "gone"] {
        pipe.get(key);
    }
    let got: Vec<Option<String>> = pipe.query(&mut con).unwrap();
    assert_eq!(
        got,
        vec![Some("1".into()), None, Some("x".into()), None, None]
    );
    let got: Vec<Option<String>> = con.mget(&["live", "gone", "long"]).unwrap();
    assert_eq!(got, vec![Some("1".into()), None, Some("x".into())]);
    assert_eq!(int(&mut con, &["EXISTS", "gone", "live", "long"]), 2);
    assert_eq!(int(&mut con, &["TTL", "gone"]), -2);
    assert_eq!(int(&mut con, &["EXPIRETIME", "gone"]), -2);
    assert_eq!(int(&mut con, &["STRLEN", "gone"]), 0);
    let t: String = redis::cmd("TYPE").arg("gone").query(&mut con).unwrap();
    assert_eq!(t, "none");
    assert_eq!(int(&mut con, &["DBSIZE"]), 2);
    let mut keys: Vec<String> = con.keys("*").unwrap();
    keys.sort();
    assert_eq!(keys, vec!["live", "long"]);
    let mut scanned: Vec<String> = con.scan().unwrap().map(|k| k.unwrap()).collect();
    scanned.sort();
    assert_eq!(scanned, vec!["live", "long"]);
    let ranged: Vec<String> = redis::cmd("TRANGE")
        .arg("-")
        .arg("+")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        ranged,
        vec!["live", "long"],
        "no expired key, no deadline record"
    );
    let prefixed: Vec<String> = redis::cmd("TPREFIX").arg("g").query(&mut con).unwrap();
    assert!(prefixed.is_empty());
    assert_eq!(int(&mut con, &["EXPIRE", "gone", "100"]), 0);
    assert_eq!(int(&mut con, &["PERSIST", "gone"]), 0);
    let getex: Option<String> = redis::cmd("GETEX").arg("gone").query(&mut con).unwrap();
    assert_eq!(getex, None);

    // Writes see it missing: INCR starts from 0 and leaves no deadline behind.
    assert_eq!(int(&mut con, &["INCR", "gone"]), 1);
    assert_eq!(int(&mut con, &["TTL", "gone"]), -1);
    server.stop().unwrap();
}

#[test]
fn the_sweeper_deletes_expired_keys_nobody_reads() {
    let (db, server) = start(true);
    let mut con = connect(&server);
    let _: () = con.set("stays", "1").unwrap();
    let mut pipe = redis::pipe();
    for i in 0..1000 {
        pipe.cmd("SET")
            .arg(format!("k{i}"))
            .arg(i)
            .arg("PX")
            .arg(1)
            .ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();
    let ks = db.open_keyspace("default").unwrap();
    // The sweeper counts what it deleted once it is deleted.
    wait_until("the sweeper deletes every expired key", || {
        let info: String = redis::cmd("INFO").arg("stats").query(&mut con).unwrap();
        info.contains("expired_keys:1000\r\n")
    });
    // Left: the key without a deadline and the keyspace's marker of deadlines.
    assert_eq!(ks.len(), 2);
    assert_eq!(con.get::<_, String>("stays").unwrap(), "1");
    assert_eq!(int(&mut con, &["DBSIZE"]), 1);
    server.stop().unwrap();
}

/// Pipelined plain SETs (the fast path) in a database with deadlines drop the deadlines
/// of the keys they overwrite, wherever those keys are in the run.
#[test]
fn pipelined_sets_drop_the_deadlines_they_overwrite() {
    let (_db, server) = start(true);
    let mut con = connect(&server);
    for first_has_deadline in [true, false] {
        let _: () = con.set("plain", "0").unwrap();
        for key in ["d1", "d2"] {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg("0")
                .arg("EX")
                .arg(1000)
                .query(&mut con)
                .unwrap();
        }
        let order: &[&str] = if first_has_deadline {
            &["d1", "plain", "new", "d2", "d1", "tail"]
        } else {
            &["plain", "new", "d2", "tail", "d1"]
        };
        let mut pipe = redis::pipe();
        for (i, key) in order.iter().enumerate() {
            pipe.set(*key, i).ignore();
        }
        let _: () = pipe.query(&mut con).unwrap();
        for key in ["plain", "new", "d1", "d2", "tail"] {
            assert_eq!(int(&mut con, &["TTL", key]), -1, "{key}");
        }
        let last = order.iter().rposition(|k| *k == "d1").unwrap();
        assert_eq!(con.get::<_, usize>("d1").unwrap(), last);
    }
    server.stop().unwrap();
}

#[test]
fn deadlines_are_kept_in_transactions() {
    let (_db, server) = start(true);
    let mut con = connect(&server);
    let (a, b, c): (String, i64, i64) = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg("t")
        .arg("v")
        .arg("EX")
        .arg(100)
        .cmd("TTL")
        .arg("t")
        .cmd("PERSIST")
        .arg("t")
        .query(&mut con)
        .unwrap();
    assert_eq!((a.as_str(), c), ("OK", 1));
    assert!((1..=100).contains(&b), "{b}");
    assert_eq!(int(&mut con, &["TTL", "t"]), -1);
    server.stop().unwrap();
}

#[test]
fn keys_in_the_reserved_family_are_refused() {
    let (_db, server) = start(true);
    let mut con = connect(&server);
    let reserved = b"\xff\xfftucana\x00dk".to_vec();
    let set: RedisResult<()> = con.set(&reserved, "x");
    assert!(set.unwrap_err().to_string().contains("reserved"));
    let get: RedisResult<Option<Vec<u8>>> = con.get(&reserved);
    assert!(get.unwrap_err().to_string().contains("reserved"));
    server.stop().unwrap();
}

#[test]
fn deadlines_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.tucana");
    let far_ms = now_ms() + 86_400_000;
    {
        let db = Database::open(&path).unwrap();
        let server = start_on(&db, false);
        let mut con = connect(&server);
        let _: () = con.set("plain", "p").unwrap();
        let _: () = redis::cmd("SET")
            .arg("far")
            .arg("f")
            .arg("PXAT")
            .arg(far_ms)
            .query(&mut con)
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg("soon")
            .arg("s")
            .arg("PX")
            .arg(1)
            .query(&mut con)
            .unwrap();
        server.stop().unwrap();
        db.close().unwrap();
    }
    let db = Database::open(&path).unwrap();
    let server = start_on(&db, false);
    let mut con = connect(&server);
    assert_eq!(int(&mut con, &["PEXPIRETIME", "far"]), far_ms);
    assert_eq!(int(&mut con, &["TTL", "plain"]), -1);
    wait_until("soon expires", || int(&mut con, &["TTL", "soon"]) == -2);
    assert_eq!(con.get::<_, Option<String>>("soon").unwrap(), None);
    assert_eq!(int(&mut con, &["DBSIZE"]), 2);
    server.stop().unwrap();
}
