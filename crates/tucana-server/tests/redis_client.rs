//! The server against a real Redis client (the `redis` crate) and against raw sockets:
//! each test starts a server on a free port over its own database, talks to it the way
//! applications do, and checks replies and what reached the engine.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use redis::{Commands, Connection, RedisResult, Value};
use tucana::Database;
use tucana_server::{spawn, DurabilityMode, RequestLimits, RunningServer, ServerConfig, TlsFiles};

fn config() -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ServerConfig::default()
    }
}

fn start_with(config: ServerConfig) -> (Database, RunningServer) {
    let db = Database::builder().open_in_memory().unwrap();
    let server = spawn(db.clone(), config).unwrap();
    (db, server)
}

fn start() -> (Database, RunningServer) {
    start_with(config())
}

fn connect(server: &RunningServer) -> Connection {
    connect_url(&format!("redis://{}/", server.addr))
}

fn connect_url(url: &str) -> Connection {
    let client = redis::Client::open(url).unwrap();
    let con = client.get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    con
}

fn error_text<T: std::fmt::Debug>(result: RedisResult<T>) -> String {
    match result {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

/// Sends raw bytes and reads until the server closes the connection or `want` bytes came.
fn raw_exchange(server: &RunningServer, request: &[u8]) -> String {
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply).into_owned()
}

#[test]
fn string_commands_behave_like_redis() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let _: () = con.set("k", "v1").unwrap();
    assert_eq!(
        con.get::<_, Option<String>>("k").unwrap().as_deref(),
        Some("v1")
    );
    assert_eq!(con.get::<_, Option<String>>("missing").unwrap(), None);

    // SET options: NX, XX, GET.
    let nx: Option<String> = redis::cmd("SET")
        .arg("k")
        .arg("v2")
        .arg("NX")
        .query(&mut con)
        .unwrap();
    assert_eq!(nx, None, "NX on an existing key does nothing");
    let xx: String = redis::cmd("SET")
        .arg("k")
        .arg("v2")
        .arg("XX")
        .query(&mut con)
        .unwrap();
    assert_eq!(xx, "OK");
    let old: Option<String> = redis::cmd("SET")
        .arg("k")
        .arg("v3")
        .arg("GET")
        .query(&mut con)
        .unwrap();
    assert_eq!(old.as_deref(), Some("v2"));
    let none: Option<String> = redis::cmd("SET")
        .arg("new")
        .arg("x")
        .arg("XX")
        .query(&mut con)
        .unwrap();
    assert_eq!(none, None);
    assert!(!con.exists::<_, bool>("new").unwrap());
    assert!(error_text(
        redis::cmd("SET")
            .arg("k")
            .arg("v")
            .arg("NX")
            .arg("XX")
            .query::<()>(&mut con)
    )
    .contains("syntax"));

    assert!(con.set_nx::<_, _, bool>("n", "1").unwrap());
    assert!(!con.set_nx::<_, _, bool>("n", "2").unwrap());
    assert_eq!(
        con.get_del::<_, Option<String>>("n").unwrap().as_deref(),
        Some("1")
    );
    assert_eq!(con.get_del::<_, Option<String>>("n").unwrap(), None);

    let _: () = con.mset(&[("a", "1"), ("b", "2"), ("c", "3")]).unwrap();
    let got: Vec<Option<String>> = con.mget(&["a", "zz", "c"]).unwrap();
    assert_eq!(got, vec![Some("1".into()), None, Some("3".into())]);
    assert_eq!(con.exists::<_, i64>(&["a", "b", "a", "zz"]).unwrap(), 3);
    assert_eq!(con.del::<_, i64>(&["a", "b", "b", "zz"]).unwrap(), 2);
    assert_eq!(con.strlen::<_, i64>("k").unwrap(), 2);
    assert_eq!(con.append::<_, _, i64>("k", "xyz").unwrap(), 5);
    assert_eq!(con.get::<_, String>("k").unwrap(), "v3xyz");

    assert_eq!(con.incr::<_, _, i64>("counter", 1).unwrap(), 1);
    assert_eq!(con.incr::<_, _, i64>("counter", 41).unwrap(), 42);
    assert_eq!(con.decr::<_, _, i64>("counter", 50).unwrap(), -8);
    assert_eq!(
        redis::cmd("DECR")
            .arg("counter")
            .query::<i64>(&mut con)
            .unwrap(),
        -9
    );
    assert!(error_text(con.incr::<_, _, i64>("k", 1)).contains("not an integer"));
    let _: () = con.set("big", i64::MAX).unwrap();
    assert!(error_text(con.incr::<_, _, i64>("big", 1)).contains("overflow"));

    // Binary keys and values round-trip.
    let key = b"\x00\xffkey\r\n".to_vec();
    let value: Vec<u8> = (0..=255u8).collect();
    let _: () = con.set(&key, &value).unwrap();
    assert_eq!(con.get::<_, Vec<u8>>(&key).unwrap(), value);
    server.stop().unwrap();
}

#[test]
fn unknown_and_malformed_commands_get_errors_and_the_connection_stays_usable() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let e = error_text(
        redis::cmd("XADD")
            .arg("k")
            .arg("*")
            .arg("f")
            .arg("10")
            .query::<String>(&mut con),
    );
    assert!(e.contains("unknown command"), "{e}");
    let e = error_text(
        redis::cmd("SET")
            .arg("k")
            .arg("v")
            .arg("EVERY")
            .arg("10")
            .query::<()>(&mut con),
    );
    assert!(e.contains("syntax error"), "{e}");
    let e = error_text(redis::cmd("GET").query::<()>(&mut con));
    assert!(e.contains("wrong number of arguments"), "{e}");
    assert_eq!(
        redis::cmd("PING").query::<String>(&mut con).unwrap(),
        "PONG"
    );
    // TTL of a key without a deadline, and of a missing key.
    let _: () = con.set("k", "v").unwrap();
    assert_eq!(con.ttl::<_, i64>("k").unwrap(), -1);
    assert_eq!(con.ttl::<_, i64>("nope").unwrap(), -2);
    server.stop().unwrap();
}

#[test]
fn protocol_errors_answer_and_close_without_harming_the_server() {
    let limits = RequestLimits {
        max_args: 8,
        max_bulk_bytes: 1024,
        max_request_bytes: 4096,
        max_inline_bytes: 256,
    };
    let (_db, server) = start_with(ServerConfig {
        request_limits: limits,
        ..config()
    });
    for (request, expect) in [
        (
            &b"*1\r\n$4\r\nPING\r\n*x\r\n"[..],
            "+PONG\r\n-ERR Protocol error: invalid multibulk length",
        ),
        (b"*2\r\n:3\r\n", "-ERR Protocol error: expected '$'"),
        (
            b"*1\r\n$2000\r\n",
            "-ERR Protocol error: invalid bulk length: argument of 2000 bytes",
        ),
        (
            b"*9\r\n",
            "-ERR Protocol error: invalid multibulk length: too many arguments",
        ),
        (&[b'x'; 300], "-ERR Protocol error: too big inline request"),
        (
            b"GET \"unbalanced\r\n",
            "-ERR Protocol error: unbalanced quotes",
        ),
        (
            b"*1\r\n$4\r\nPINGxx",
            "-ERR Protocol error: bulk argument not followed by CRLF",
        ),
    ] {
        let reply = raw_exchange(&server, request);
        assert!(
            reply.starts_with(expect),
            "{:?} -> {reply:?}",
            String::from_utf8_lossy(request)
        );
    }
    // A request whose arguments each fit but together do not is cut off too.
    let mut big = b"*6\r\n$3\r\nSET".to_vec();
    for _ in 0..5 {
        big.extend_from_slice(b"\r\n$1000\r\n");
        big.extend(std::iter::repeat_n(b'v', 1000));
    }
    big.extend_from_slice(b"\r\n");
    let reply = raw_exchange(&server, &big);
    assert!(
        reply.starts_with("-ERR Protocol error: request larger than 4096"),
        "{reply}"
    );
    // Inline commands work (telnet style).
    let reply = raw_exchange(&server, b"SET  word \"two words\"\r\nGET word\r\nQUIT\r\n");
    assert_eq!(reply, "+OK\r\n$9\r\ntwo words\r\n+OK\r\n");
    // The server still serves everybody else.
    let mut con = connect(&server);
    assert_eq!(
        redis::cmd("PING").query::<String>(&mut con).unwrap(),
        "PONG"
    );
    server.stop().unwrap();
}

#[test]
fn pipelines_are_answered_in_order() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.set(format!("p{i:03}"), i).ignore();
    }
    for i in 0..500 {
        pipe.get(format!("p{i:03}"));
    }
    let values: Vec<i64> = pipe.query(&mut con).unwrap();
    assert_eq!(values, (0..500).collect::<Vec<i64>>());
    server.stop().unwrap();
}

/// Pipelined GETs go to the engine in groups (`Keyspace::get_many_with`): answers stay
/// in order across groups, missing keys are nil between found ones, and a database whose
/// keyspace does not exist yet answers nil for all of them.
#[test]
fn pipelined_gets_mix_found_and_missing_keys_across_groups() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let mut pipe = redis::pipe();
    for i in (0..300).step_by(3) {
        pipe.set(format!("g{i:03}"), i).ignore();
    }
    for i in 0..300 {
        pipe.get(format!("g{i:03}"));
    }
    let values: Vec<Option<i64>> = pipe.query(&mut con).unwrap();
    let want: Vec<Option<i64>> = (0..300).map(|i| (i % 3 == 0).then_some(i)).collect();
    assert_eq!(values, want);

    redis::cmd("SELECT").arg(5).query::<()>(&mut con).unwrap();
    let mut pipe = redis::pipe();
    for i in 0..100 {
        pipe.get(format!("g{i:03}"));
    }
    let values: Vec<Option<i64>> = pipe.query(&mut con).unwrap();
    assert_eq!(values, vec![None; 100]);
    server.stop().unwrap();
}

#[test]
fn multi_exec_is_one_atomic_batch_that_sees_its_own_writes() {
    let (db, server) = start();
    let mut con = connect(&server);
    let (incr, got): (i64, String) = redis::pipe()
        .atomic()
        .set("t", "41")
        .ignore()
        .incr("t", 1)
        .get("t")
        .query(&mut con)
        .unwrap();
    assert_eq!((incr, got.as_str()), (42, "42"));
    assert_eq!(
        db.keyspace("default")
            .unwrap()
            .get(b"t")
            .unwrap()
            .as_deref(),
        Some(&b"42"[..])
    );

    // A command that cannot be queued aborts the whole transaction.
    let e = error_text(
        redis::pipe()
            .atomic()
            .set("u", "1")
            .cmd("NOSUCHCOMMAND")
            .query::<Value>(&mut con),
    );
    assert!(e.contains("aborted"), "{e}");
    assert_eq!(con.get::<_, Option<String>>("u").unwrap(), None);
    let reply = raw_exchange(&server, b"MULTI\r\nSET u 1\r\nNOSUCH\r\nEXEC\r\nQUIT\r\n");
    assert!(
        reply.starts_with("+OK\r\n+QUEUED\r\n-ERR unknown command 'NOSUCH'"),
        "{reply}"
    );
    assert!(
        reply.ends_with("-EXECABORT Transaction discarded because of previous errors.\r\n+OK\r\n"),
        "{reply}"
    );

    // A run-time error answers in its place; the other writes apply.
    let e = error_text(
        redis::pipe()
            .atomic()
            .set("v", "x")
            .incr("v", 1)
            .set("w", "y")
            .query::<Value>(&mut con),
    );
    assert!(e.contains("not an integer"), "{e}");
    assert_eq!(con.get::<_, String>("w").unwrap(), "y");

    // Commands that are not part of a write batch are refused inside MULTI.
    let e = error_text(
        redis::pipe()
            .atomic()
            .cmd("SCAN")
            .arg(0)
            .query::<Value>(&mut con),
    );
    assert!(e.contains("not allowed inside a transaction"), "{e}");
    assert!(error_text(redis::cmd("EXEC").query::<()>(&mut con)).contains("EXEC without MULTI"));
    assert!(
        error_text(redis::cmd("DISCARD").query::<()>(&mut con)).contains("DISCARD without MULTI")
    );
    server.stop().unwrap();
}

#[test]
fn without_cluster_mode_cluster_commands_answer_as_redis_with_cluster_support_disabled() {
    let (_db, server) = start();
    let mut con = connect(&server);
    for args in [&["CLUSTER", "SLOTS"][..], &["READONLY"], &["READWRITE"]] {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let err = cmd.query::<Value>(&mut con).unwrap_err();
        assert_eq!(err.code(), Some("ERR"), "{args:?}: {err}");
        assert_eq!(
            err.detail(),
            Some("This instance has cluster support disabled"),
            "{args:?}"
        );
    }
    // Standalone INFO is as before: no Cluster section, redis_mode standalone.
    let info: String = redis::cmd("INFO").query(&mut con).unwrap();
    assert!(info.contains("redis_mode:standalone"), "{info}");
    assert!(!info.contains("# Cluster"), "{info}");
    let _: () = redis::cmd("SELECT").arg(3).query(&mut con).unwrap();
    server.stop().unwrap();
}

#[test]
fn select_maps_databases_to_keyspaces_and_flushdb_drops_one() {
    let (db, server) = start();
    let mut con = connect_url(&format!("redis://{}/3", server.addr));
    let _: () = con.set("k", "in db3").unwrap();
    assert_eq!(
        db.keyspace("db3").unwrap().get(b"k").unwrap().as_deref(),
        Some(&b"in db3"[..])
    );
    let _: () = redis::cmd("SELECT").arg(0).query(&mut con).unwrap();
    assert_eq!(con.get::<_, Option<String>>("k").unwrap(), None);
    let _: () = con.set("k", "in default").unwrap();
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 1);
    assert!(
        error_text(redis::cmd("SELECT").arg(16).query::<()>(&mut con)).contains("out of range")
    );

    let _: () = redis::cmd("SELECT").arg(3).query(&mut con).unwrap();
    let _: () = redis::cmd("FLUSHDB").query(&mut con).unwrap();
    assert!(!db.keyspace_names().contains(&"db3".to_string()));
    assert_eq!(redis::cmd("DBSIZE").query::<i64>(&mut con).unwrap(), 0);
    assert_eq!(con.get::<_, Option<String>>("k").unwrap(), None);
    let _: () = con.set("k", "again").unwrap();
    assert_eq!(con.get::<_, String>("k").unwrap(), "again");
    let _: () = redis::cmd("SELECT").arg(0).query(&mut con).unwrap();
    assert_eq!(con.get::<_, String>("k").unwrap(), "in default");
    server.stop().unwrap();
}

#[test]
fn scan_returns_every_key_once_and_filters_by_match() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let mut pipe = redis::pipe();
    for i in 0..120 {
        pipe.set(format!("user:{i:03}"), i).ignore();
        pipe.set(format!("item:{i:03}"), i).ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();

    let mut cursor = 0u64;
    let mut seen = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(7)
            .query(&mut con)
            .unwrap();
        // Keys written during the iteration may or may not be seen; those there
        // throughout must be seen.
        let _: () = con.set(format!("late:{cursor}"), 1).unwrap();
        seen.extend(keys);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let mut users: Vec<&String> = seen.iter().filter(|k| k.starts_with("user:")).collect();
    assert_eq!(users.len(), 120);
    users.dedup();
    assert_eq!(users.len(), 120, "no duplicates");

    let matched: Vec<String> = con
        .scan_match("item:0?5")
        .unwrap()
        .collect::<RedisResult<_>>()
        .unwrap();
    assert_eq!(matched.len(), 10, "{matched:?}");
    let mut keys: Vec<String> = con.keys("user:11*").unwrap();
    keys.sort();
    assert_eq!(keys.len(), 10);
    assert_eq!(keys[0], "user:110");
    assert!(
        error_text(redis::cmd("SCAN").arg(987654).query::<Value>(&mut con))
            .contains("invalid cursor")
    );
    server.stop().unwrap();
}

#[test]
fn ordered_range_and_prefix_commands() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let _: () = con
        .mset(&[
            ("a", "1"),
            ("b", "2"),
            ("c", "3"),
            ("d", "4"),
            ("pa", "5"),
            ("pb", "6"),
        ])
        .unwrap();
    let keys: Vec<String> = redis::cmd("TRANGE")
        .arg("[b")
        .arg("(d")
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["b", "c"]);
    let keys: Vec<String> = redis::cmd("TRANGE")
        .arg("-")
        .arg("+")
        .arg("REV")
        .arg("LIMIT")
        .arg(3)
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["pb", "pa", "d"]);
    let pairs: Vec<String> = redis::cmd("TRANGE")
        .arg("(c")
        .arg("+")
        .arg("WITHVALUES")
        .arg("LIMIT")
        .arg(2)
        .query(&mut con)
        .unwrap();
    assert_eq!(pairs, ["d", "4", "pa", "5"]);
    let keys: Vec<String> = redis::cmd("TPREFIX")
        .arg("p")
        .arg("REV")
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["pb", "pa"]);
    assert!(error_text(
        redis::cmd("TRANGE")
            .arg("b")
            .arg("+")
            .query::<Value>(&mut con)
    )
    .contains("start and end"));
    // A hash's field records are stored under the reserved prefix, after every key a
    // client may write: a range reaching past the last key lists only the hash's key.
    let _: () = con.hset("h", "field", "v").unwrap();
    let keys: Vec<Vec<u8>> = redis::cmd("TRANGE")
        .arg("(pb")
        .arg("+")
        .query(&mut con)
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    let keys: Vec<Vec<u8>> = redis::cmd("TRANGE")
        .arg("(d")
        .arg("+")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        keys,
        [b"h".to_vec(), b"pa".to_vec(), b"pb".to_vec()],
        "{keys:?}"
    );
    // An empty database is an empty range, not an error.
    let _: () = redis::cmd("SELECT").arg(5).query(&mut con).unwrap();
    let keys: Vec<String> = redis::cmd("TPREFIX").arg("").query(&mut con).unwrap();
    assert!(keys.is_empty());
    server.stop().unwrap();
}

#[test]
fn concurrent_increments_lose_nothing() {
    // Connection threads that busy-poll before they sleep (the default) and that do not.
    for (durability, busy_poll) in [
        (DurabilityMode::Sync, ServerConfig::default().busy_poll),
        (DurabilityMode::Buffered, ServerConfig::default().busy_poll),
        (DurabilityMode::Buffered, Duration::ZERO),
    ] {
        assert!(!ServerConfig::default().busy_poll.is_zero());
        let (_db, server) = start_with(ServerConfig {
            durability,
            busy_poll,
            threads: Some(2),
            ..config()
        });
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let mut con = connect(&server);
                std::thread::spawn(move || {
                    for i in 0..100 {
                        let _: i64 = con.incr("counter", 1).unwrap();
                        // Blind writes to the same keyspace interleave with the increments.
                        let _: () = con.set(format!("t{t}:{i}"), i).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut con = connect(&server);
        assert_eq!(
            con.get::<_, i64>("counter").unwrap(),
            800,
            "{durability:?}, busy poll {busy_poll:?}"
        );
        server.stop().unwrap();
    }
}

#[test]
fn auth_is_required_when_a_password_is_set() {
    let (_db, server) = start_with(ServerConfig {
        requirepass: Some("s3cret".into()),
        ..config()
    });
    // Without the password: NOAUTH, and the stricter limits before AUTH.
    let reply = raw_exchange(
        &server,
        b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nQUIT\r\n",
    );
    assert!(reply.starts_with("-NOAUTH"), "{reply}");
    let mut big = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100000\r\n".to_vec();
    big.extend(std::iter::repeat_n(b'v', 100_000));
    let reply = raw_exchange(&server, &big);
    assert!(
        reply.starts_with("-ERR Protocol error: invalid bulk length: argument of 100000 bytes"),
        "{reply}"
    );

    let bad = redis::Client::open(format!("redis://:wrong@{}/", server.addr)).unwrap();
    let refused = bad.get_connection().err().expect("wrong password refused");
    assert!(
        refused
            .to_string()
            .to_lowercase()
            .contains("authentication"),
        "{refused}"
    );
    let mut con = connect_url(&format!("redis://:s3cret@{}/", server.addr));
    let _: () = con.set("k", "v").unwrap();
    // After AUTH the large value is fine.
    let _: () = con.set("big", vec![7u8; 100_000]).unwrap();
    assert_eq!(con.strlen::<_, i64>("big").unwrap(), 100_000);
    // RESP3 with HELLO 3 AUTH.
    let mut con3 = connect_url(&format!(
        "redis://default:s3cret@{}/?protocol=resp3",
        server.addr
    ));
    assert_eq!(con3.get::<_, String>("k").unwrap(), "v");
    server.stop().unwrap();
}

#[test]
fn resp3_clients_get_resp3_replies() {
    let (_db, server) = start();
    let mut con = connect_url(&format!("redis://{}/?protocol=resp3", server.addr));
    let hello: Value = redis::cmd("HELLO").arg(3).query(&mut con).unwrap();
    assert!(matches!(hello, Value::Map(_)), "{hello:?}");
    let missing: Value = redis::cmd("GET").arg("nope").query(&mut con).unwrap();
    assert_eq!(missing, Value::Nil);
    let mut raw = TcpStream::connect(server.addr).unwrap();
    raw.write_all(b"HELLO 3\r\nGET nope\r\nQUIT\r\n").unwrap();
    let mut reply = Vec::new();
    raw.read_to_end(&mut reply).unwrap();
    let reply = String::from_utf8(reply).unwrap();
    assert!(reply.starts_with("%7\r\n"), "{reply}");
    assert!(reply.ends_with("_\r\n+OK\r\n"), "{reply}");
    server.stop().unwrap();
}

#[test]
fn max_clients_refuses_extra_connections_with_an_error() {
    let (_db, server) = start_with(ServerConfig {
        max_clients: 2,
        ..config()
    });
    let mut a = connect(&server);
    let mut b = connect(&server);
    assert_eq!(redis::cmd("PING").query::<String>(&mut a).unwrap(), "PONG");
    assert_eq!(redis::cmd("PING").query::<String>(&mut b).unwrap(), "PONG");
    let reply = raw_exchange(&server, b"PING\r\n");
    assert!(
        reply.starts_with("-ERR max number of clients reached"),
        "{reply}"
    );
    drop(a);
    // The slot frees once the server saw the close; retry until it has.
    let mut reply = String::new();
    for _ in 0..500 {
        reply = raw_exchange(&server, b"PING\r\nQUIT\r\n");
        if reply.starts_with("+PONG") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(reply, "+PONG\r\n+OK\r\n");
    server.stop().unwrap();
}

#[test]
fn idle_connections_are_closed() {
    let (_db, server) = start_with(ServerConfig {
        idle_timeout: Some(Duration::from_millis(100)),
        ..config()
    });
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 16];
    // Nothing sent: the server closes; read returns end of stream (not our timeout).
    assert_eq!(s.read(&mut buf).unwrap(), 0);
    server.stop().unwrap();
}

#[test]
fn info_command_and_prometheus_metrics() {
    let (_db, server) = start_with(ServerConfig {
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config()
    });
    let mut con = connect(&server);
    let _: () = con.set("k", "v").unwrap();
    let _: Option<String> = con.get("k").unwrap();
    let _: Option<String> = con.get("nope").unwrap();
    let info: String = redis::cmd("INFO").query(&mut con).unwrap();
    for needle in [
        "# Server",
        "redis_version:",
        "connection_threads:",
        "# Clients",
        "connected_clients:1",
        "# Memory",
        "used_memory:",
        "# Persistence",
        "durability:sync",
        "# Stats",
        "keyspace_hits:1",
        "keyspace_misses:1",
        "# Keyspace",
        "db0:keys=1,expires=0",
    ] {
        assert!(info.contains(needle), "{needle} not in {info}");
    }
    let only: String = redis::cmd("INFO").arg("keyspace").query(&mut con).unwrap();
    assert!(
        only.starts_with("# Keyspace") && !only.contains("# Server"),
        "{only}"
    );

    let metrics = server.metrics_addr.unwrap();
    let mut http = TcpStream::connect(metrics).unwrap();
    http.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    http.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(body.contains("tucana_keys 1\n"), "{body}");
    assert!(
        body.contains("tucana_commands_total{cmd=\"set\"} 1\n"),
        "{body}"
    );
    let mut http = TcpStream::connect(metrics).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut body = String::new();
    http.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 404"), "{body}");
    server.stop().unwrap();
}

/// BGREWRITEAOF, Redis's compaction of its log, is a forced garbage collection here: the
/// overwritten values' space comes back, INFO counts it, and the newest values stay.
#[test]
fn bgrewriteaof_collects_the_log_and_info_counts_it() {
    let db = Database::builder()
        .log_segment_bytes(64 * 1024)
        .open_in_memory()
        .unwrap();
    let server = spawn(db.clone(), config()).unwrap();
    let mut con = connect(&server);
    for round in 0..20u8 {
        for k in 0..20 {
            let _: () = con.set(format!("k{k}"), vec![round; 4000]).unwrap();
        }
    }
    let gc_field = |con: &mut Connection, name: &str| -> u64 {
        let info: String = redis::cmd("INFO").arg("persistence").query(con).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("{name} not in {info}"))
            .parse()
            .unwrap()
    };
    assert_eq!(gc_field(&mut con, "gc_reclaimed_bytes"), 0);
    let reply: String = redis::cmd("BGREWRITEAOF").query(&mut con).unwrap();
    assert!(reply.contains("rewriting"), "{reply}");
    assert!(gc_field(&mut con, "gc_passes") >= 1);
    // 19 of every 20 versions were garbage: most of 1.5 MB comes back.
    let reclaimed = gc_field(&mut con, "gc_reclaimed_bytes");
    assert!(reclaimed > 1_000_000, "{reclaimed}");
    assert!(gc_field(&mut con, "dead_log_bytes") < 200_000);
    for k in 0..20 {
        let v: Vec<u8> = con.get(format!("k{k}")).unwrap();
        assert_eq!(v, vec![19u8; 4000]);
    }
    server.stop().unwrap();
}

#[test]
fn handshake_commands_answer_as_clients_expect() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg("app1")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        redis::cmd("CLIENT")
            .arg("GETNAME")
            .query::<String>(&mut con)
            .unwrap(),
        "app1"
    );
    let _: () = redis::cmd("CLIENT")
        .arg("SETINFO")
        .arg("LIB-NAME")
        .arg("x")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        redis::cmd("ECHO")
            .arg("hi")
            .query::<String>(&mut con)
            .unwrap(),
        "hi"
    );
    let n: i64 = redis::cmd("COMMAND").arg("COUNT").query(&mut con).unwrap();
    let all: Vec<Value> = redis::cmd("COMMAND").query(&mut con).unwrap();
    assert_eq!(all.len() as i64, n);
    let cfg: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("append*")
        .query(&mut con)
        .unwrap();
    assert_eq!(cfg, ["appendonly", "yes", "appendfsync", "always"]);
    let cfg: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query(&mut con)
        .unwrap();
    assert_eq!(cfg, ["save", ""]);
    // `save ""` is what tucana does (no snapshots): accepted; the port is not settable.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("save")
        .arg("")
        .query(&mut con)
        .unwrap();
    assert!(error_text(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("port")
            .arg("1")
            .query::<()>(&mut con)
    )
    .contains("not supported"));
    assert_eq!(
        redis::cmd("TYPE")
            .arg("nope")
            .query::<String>(&mut con)
            .unwrap(),
        "none"
    );
    let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
    server.stop().unwrap();
}

#[test]
fn shutdown_command_stops_the_server_after_committing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.tucana");
    let db = Database::builder()
        .commit_interval(None)
        .open(&path)
        .unwrap();
    let server = spawn(db.clone(), config()).unwrap();
    let mut con = connect(&server);
    let _: () = con.set("k", "v").unwrap();
    let epoch = db.stats().commit_epoch;
    let _ = redis::cmd("SHUTDOWN").query::<Value>(&mut con);
    server.join().unwrap();
    assert!(db.stats().commit_epoch > epoch, "the shutdown committed");
    db.close().unwrap();
    let db = Database::open(&path).unwrap();
    assert_eq!(
        db.keyspace("default")
            .unwrap()
            .get(b"k")
            .unwrap()
            .as_deref(),
        Some(&b"v"[..])
    );
}

#[test]
fn a_public_address_without_a_password_is_refused() {
    let db = Database::builder().open_in_memory().unwrap();
    let err = spawn(
        db,
        ServerConfig {
            listen: "0.0.0.0:0".parse().unwrap(),
            ..ServerConfig::default()
        },
    )
    .err()
    .expect("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("requirepass"), "{err}");
}

#[test]
fn tls_clients_are_served_and_plain_ones_are_not() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use std::sync::Arc;

    // A test CA and a leaf for localhost and 127.0.0.1 (see tests/fixtures/README.md).
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let cert = fixtures.join("tls-cert.pem");
    let (_db, server) = start_with(ServerConfig {
        tls: Some(TlsFiles {
            cert_chain: cert.clone(),
            private_key: fixtures.join("tls-key.pem"),
        }),
        ..config()
    });
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(fixtures.join("tls-ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let session =
        rustls::ClientConnection::new(Arc::new(client), ServerName::try_from("localhost").unwrap())
            .unwrap();
    let tcp = TcpStream::connect(server.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut tls = rustls::StreamOwned::new(session, tcp);
    tls.write_all(b"SET k v\r\nGET k\r\nQUIT\r\n").unwrap();
    let mut reply = Vec::new();
    tls.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, b"+OK\r\n$1\r\nv\r\n+OK\r\n");

    // A client without TLS gets no RESP answer; the server goes on serving TLS ones.
    let reply = raw_exchange(&server, b"PING\r\n");
    assert!(!reply.contains("PONG"), "{reply}");
    server.stop().unwrap();
}

#[test]
fn bad_tls_files_are_refused_at_bind() {
    let db = Database::builder().open_in_memory().unwrap();
    let err = spawn(
        db,
        ServerConfig {
            tls: Some(TlsFiles {
                cert_chain: "/nonexistent/cert.pem".into(),
                private_key: "/nonexistent/key.pem".into(),
            }),
            ..config()
        },
    )
    .err()
    .expect("refused");
    assert!(err.to_string().contains("TLS certificate"), "{err}");
}

/// One request in RESP multibulk form.
fn multibulk(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Checks that `rest` starts with `want` (a line starting with it when `want` ends with
/// '…') and moves past it.
fn expect_reply(rest: &mut &str, want: &str, context: &str) {
    let len = match want.strip_suffix('…') {
        Some(prefix) => {
            assert!(
                rest.starts_with(prefix),
                "{context}: want {want:?} at {rest:?}"
            );
            rest.find("\r\n").expect("a complete line") + 2
        }
        None => {
            assert!(
                rest.starts_with(want),
                "{context}: want {want:?} at {rest:?}"
            );
            want.len()
        }
    };
    *rest = &rest[len..];
}

/// Runs of plain GETs and SETs take a fast path (one engine batch per run of SETs); a
/// pipelined batch that mixes them with errors, other commands, MULTI and a protocol
/// switch still answers every request, in order, with what it alone would have answered.
#[test]
fn a_pipelined_batch_with_errors_in_the_middle_answers_every_command_in_order() {
    let huge_key = vec![b'k'; tucana::MAX_KEY_BYTES + 1];
    for durability in [DurabilityMode::Sync, DurabilityMode::Buffered] {
        let (db, server) = start_with(ServerConfig {
            durability,
            ..config()
        });
        let syncs_before = db.stats().syncs;
        let requests: Vec<Vec<&[u8]>> = vec![
            vec![b"SET", b"a", b"1"],
            vec![b"set", b"b", b"2"],
            // The engine refuses this key: the run's batch fails and each SET is retried
            // alone, so only this one answers an error.
            vec![b"SET", &huge_key, b"3"],
            vec![b"SeT", b"c", b"4"],
            vec![b"GET", b"a"],
            vec![b"GET", &huge_key],
            vec![b"get", b"missing"],
            vec![b"GET", b"c"],
            vec![b"INCR", b"a"],
            vec![b"BOGUS", b"x"],
            vec![b"GET", b"a", b"extra"],
            vec![b"SET", b"d", b"5", b"NX"],
            vec![b"MULTI"],
            vec![b"SET", b"e", b"6"],
            vec![b"GET", b"e"],
            vec![b"EXEC"],
            vec![b"HELLO", b"3"],
            vec![b"GET", b"missing"],
            vec![b"SET", b"f", b"7"],
            vec![b"GET", b"f"],
            vec![b"QUIT"],
        ];
        let wire: Vec<u8> = requests.iter().flat_map(|r| multibulk(r)).collect();
        let reply = raw_exchange(&server, &wire);
        let mut rest = reply.as_str();
        let context = format!("{durability:?}");
        for want in [
            "+OK\r\n",
            "+OK\r\n",
            "-ERR key of 65537 bytes is larger than the limit of 65536 bytes\r\n",
            "+OK\r\n",
            "$1\r\n1\r\n",
            "-ERR key of 65537 bytes…",
            "$-1\r\n",
            "$1\r\n4\r\n",
            ":2\r\n",
            "-ERR unknown command 'BOGUS'…",
            "-ERR wrong number of arguments for 'get' command\r\n",
            "+OK\r\n",
            "+OK\r\n",
            "+QUEUED\r\n",
            "+QUEUED\r\n",
            "*2\r\n+OK\r\n$1\r\n6\r\n",
            "%7\r\n…",
        ] {
            expect_reply(&mut rest, want, &context);
        }
        // The HELLO map's other entries, then RESP3's null for the missing key.
        let null = rest.find("_\r\n").expect("RESP3 null");
        rest = &rest[null..];
        for want in ["_\r\n", "+OK\r\n", "$1\r\n7\r\n", "+OK\r\n"] {
            expect_reply(&mut rest, want, &context);
        }
        assert_eq!(rest, "", "{durability:?}: nothing after QUIT's reply");
        let ks = db.keyspace("default").unwrap();
        for (key, value) in [
            ("a", "2"),
            ("b", "2"),
            ("c", "4"),
            ("d", "5"),
            ("e", "6"),
            ("f", "7"),
        ] {
            assert_eq!(
                ks.get(key.as_bytes()).unwrap().as_deref(),
                Some(value.as_bytes()),
                "{durability:?}: {key}"
            );
        }
        assert_eq!(
            ks.len(),
            6,
            "{durability:?}: the refused key was not written"
        );
        if durability == DurabilityMode::Sync {
            // Replies are sent after the batch's sync.
            assert!(
                db.stats().syncs > syncs_before,
                "sync mode synced before answering"
            );
        }
        server.stop().unwrap();
    }
}

/// A long run of pipelined SETs over few keys (repeats included) leaves the last value
/// of each key, as the SETs one after another would.
#[test]
fn a_run_of_pipelined_sets_applies_in_order() {
    let (db, server) = start_with(ServerConfig {
        durability: DurabilityMode::Buffered,
        ..config()
    });
    let mut wire = Vec::new();
    for i in 0..3000u32 {
        let key = format!("k{}", i % 7);
        wire.extend(multibulk(&[
            b"SET",
            key.as_bytes(),
            i.to_string().as_bytes(),
        ]));
    }
    wire.extend(multibulk(&[b"QUIT"]));
    let reply = raw_exchange(&server, &wire);
    assert_eq!(reply, "+OK\r\n".repeat(3001));
    let ks = db.keyspace("default").unwrap();
    assert_eq!(ks.len(), 7);
    for k in 0..7u32 {
        let last = (0..3000u32).filter(|i| i % 7 == k).max().unwrap();
        assert_eq!(
            ks.get(format!("k{k}").as_bytes()).unwrap(),
            Some(last.to_string().into_bytes())
        );
    }
    server.stop().unwrap();
}

/// Pipelined SETs of large values are cut into several engine batches; every one is
/// answered and applied.
#[test]
fn pipelined_sets_of_large_values_are_all_applied() {
    let (db, server) = start_with(ServerConfig {
        durability: DurabilityMode::Buffered,
        ..config()
    });
    let value = |i: u8| vec![b'a' + i; 300 << 10];
    let mut wire = Vec::new();
    for i in 0..10u8 {
        wire.extend(multibulk(&[b"SET", &[b'k', b'0' + i], &value(i)]));
    }
    wire.extend(multibulk(&[b"QUIT"]));
    assert_eq!(raw_exchange(&server, &wire), "+OK\r\n".repeat(11));
    let ks = db.keyspace("default").unwrap();
    for i in 0..10u8 {
        assert_eq!(ks.get(&[b'k', b'0' + i]).unwrap(), Some(value(i)));
    }
    server.stop().unwrap();
}

/// A client that sends its requests and then shuts down its sending side still gets every
/// reply: replies wait in the connection's outbox until its thread is about to sleep, and
/// the end of the client's stream must not drop them.
#[test]
fn a_client_that_half_closes_after_its_requests_gets_every_reply() {
    let (_db, server) = start_with(ServerConfig {
        durability: DurabilityMode::Buffered,
        ..config()
    });
    let mut wire = Vec::new();
    wire.extend(multibulk(&[b"SET", b"k", b"v"]));
    wire.extend(multibulk(&[b"GET", b"k"]));
    wire.extend(multibulk(&[b"PING"]));
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&wire).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "+OK\r\n$1\r\nv\r\n+PONG\r\n"
    );
    server.stop().unwrap();
}

/// A client that pipelines far more than it reads: small replies pile up in the outbox
/// until the socket cannot take them (the connection's task then writes the rest itself,
/// waiting for the socket), and large replies, written at once, must come after the small
/// ones queued before them. Every reply arrives, in request order.
#[test]
fn a_slow_reader_gets_every_reply_in_order_small_and_large() {
    let (_db, server) = start_with(ServerConfig {
        durability: DurabilityMode::Buffered,
        threads: Some(1),
        ..config()
    });
    let big = vec![b'b'; 200 << 10];
    {
        let mut con = connect(&server);
        let _: () = con.set("big", &big).unwrap();
    }
    const ROUNDS: usize = 60;
    const SMALL_PER_ROUND: usize = 500;
    let mut wire = Vec::new();
    for round in 0..ROUNDS {
        for i in 0..SMALL_PER_ROUND {
            wire.extend(multibulk(&[b"ECHO", format!("{round}:{i}").as_bytes()]));
        }
        wire.extend(multibulk(&[b"GET", b"big"]));
    }
    wire.extend(multibulk(&[b"QUIT"]));
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut writer = s.try_clone().unwrap();
    // A writer of its own: the server stops reading while the client does not read, so
    // one thread writing everything before reading would wait forever.
    let sender = std::thread::spawn(move || writer.write_all(&wire).unwrap());
    // Let the replies pile up before reading any (the test holds whatever the timing).
    std::thread::sleep(Duration::from_millis(200));
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    sender.join().unwrap();
    let mut want = Vec::new();
    for round in 0..ROUNDS {
        for i in 0..SMALL_PER_ROUND {
            let text = format!("{round}:{i}");
            want.extend(format!("${}\r\n{text}\r\n", text.len()).into_bytes());
        }
        want.extend(format!("${}\r\n", big.len()).into_bytes());
        want.extend_from_slice(&big);
        want.extend_from_slice(b"\r\n");
    }
    want.extend_from_slice(b"+OK\r\n");
    assert_eq!(reply.len(), want.len());
    assert!(reply == want, "replies out of order or corrupted");
    server.stop().unwrap();
}

/// With one connection thread every connection shares one event loop; many concurrent
/// clients are all served, and INFO reports the thread count.
#[test]
fn one_connection_thread_serves_many_concurrent_clients() {
    let (db, server) = start_with(ServerConfig {
        durability: DurabilityMode::Buffered,
        threads: Some(1),
        ..config()
    });
    let url = format!("redis://{}/", server.addr);
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut con = connect_url(&url);
                for i in 0..200 {
                    let key = format!("c{c}:{i}");
                    let _: () = con.set(&key, i).unwrap();
                    assert_eq!(con.get::<_, i64>(&key).unwrap(), i);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let mut con = connect(&server);
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
    assert!(info.contains("connection_threads:1\r\n"), "{info}");
    let stats = db.stats();
    let ks = stats
        .keyspaces
        .iter()
        .find(|k| k.name == "default")
        .unwrap();
    assert_eq!(ks.keys, 1600);
    server.stop().unwrap();
}

/// In sync mode a reply waits for its write's sync; when that sync fails, the write's
/// reply says it is not known to be durable (never OK), the other replies of the batch
/// are unaffected, and the server keeps answering.
#[test]
fn a_failed_sync_turns_the_replies_of_its_writes_into_errors() {
    let storage = Arc::new(tucana::volume::FailingSync::new());
    // No background flusher: the server's syncs are the only ones.
    let db = Database::builder()
        .flush_interval(None)
        .commit_interval(None)
        .open_storage(storage.clone())
        .unwrap();
    let server = spawn(
        db,
        ServerConfig {
            durability: DurabilityMode::Sync,
            ..config()
        },
    )
    .unwrap();
    let mut con = connect(&server);
    let _: () = con.set("before", "v").unwrap();
    storage.set_broken(true);
    let error = error_text(con.set::<_, _, ()>("k", "v"));
    assert!(error.contains("could not be made durable"), "{error}");
    assert!(error.contains("injected sync failure"), "{error}");
    // A pipelined batch: the write's reply is an error, the PING after it is answered.
    let reply = raw_exchange(
        &server,
        b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nQUIT\r\n",
    );
    assert!(reply.starts_with("-ERR "), "{reply}");
    assert!(!reply.starts_with("+OK"), "{reply}");
    assert!(reply.contains("\r\n+PONG\r\n"), "{reply}");
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    // The final commit cannot succeed on a store whose sync failed; stopping says so.
    assert!(server.stop().is_err());
}
