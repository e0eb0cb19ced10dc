//! The expiry commands and WATCH, sent alike to redis-server and to tucana: the replies
//! must be the same. Deadlines are absolute and far in the future so replies do not
//! depend on time; a relative TTL is compared by its sign only. Skipped, with a message,
//! where `redis-server` is not installed (`bash scripts/server-deps.sh --bench`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use tucana::Database;
use tucana_server::{spawn, ServerConfig};

struct RedisServer(Child);

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    // Below the ephemeral range: no server of another test, bound to port 0, can hold it.
    tucana_cluster::testing::free_port("127.0.0.1")
}

fn connect(url: &str) -> Connection {
    let client = redis::Client::open(url).unwrap();
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        match client.get_connection() {
            Ok(con) => return con,
            Err(e) if Instant::now() < give_up => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("cannot connect to {url}: {e}"),
        }
    }
}

/// A reply with relative times replaced by their sign (TTL, PTTL).
fn normalized(command: &str, reply: Value) -> Value {
    match (command, reply) {
        ("TTL" | "PTTL", Value::Int(n)) if n > 0 => Value::Int(1),
        (_, reply) => reply,
    }
}

fn send(con: &mut Connection, args: &[String]) -> Value {
    let mut cmd = redis::cmd(&args[0]);
    for a in &args[1..] {
        cmd.arg(a.as_str());
    }
    match cmd.query::<Value>(con) {
        Ok(v) => normalized(&args[0], v),
        // Error text compared whole (code and message).
        Err(e) => Value::SimpleString(format!("error: {e}")),
    }
}

#[test]
fn expiry_and_watch_replies_match_redis_server() {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: redis-server is not installed (scripts/server-deps.sh --bench)");
        return;
    }
    let port = free_port();
    let _redis = RedisServer(
        Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let db = Database::builder().open_in_memory().unwrap();
    let server = spawn(
        db,
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut theirs = connect(&format!("redis://127.0.0.1:{port}/"));
    let mut ours = connect(&format!("redis://{}/", server.addr));
    let far_s = "4102444800"; // 2100-01-01
    let far_ms = "4102444800123";
    let script = format!(
        "FLUSHDB
        SET k v
        TTL k
        PTTL nope
        EXPIRETIME k
        PEXPIRETIME nope
        EXPIREAT k {far_s}
        EXPIRETIME k
        PEXPIRETIME k
        TTL k
        EXPIREAT k {far_s} NX
        EXPIREAT k {far_s} XX
        PEXPIREAT k {far_ms} GT
        PEXPIRETIME k
        PEXPIREAT k 4102444800000 GT
        PEXPIREAT k 4102444800000 LT
        PEXPIRETIME k
        EXPIREAT k 1 NX XX
        EXPIREAT k 1 GT LT
        EXPIREAT k 1 XY
        EXPIRE k abc
        EXPIRE k abc XY
        EXPIRE k abc NX GT
        EXPIRE k 9223372036854775807
        PEXPIRE k 9223372036854775807
        EXPIREAT k 9223372036854775807
        PERSIST k
        PERSIST k
        TTL k
        EXPIRE k 100 GT
        EXPIRE k 100 XX
        EXPIRE nope 100
        PERSIST nope
        SET n 10 PXAT {far_ms}
        INCR n
        PEXPIRETIME n
        APPEND n 0
        PEXPIRETIME n
        GETSET n 1
        PEXPIRETIME n
        SET n 2 EXAT {far_s} GET
        SET n 3 KEEPTTL
        EXPIRETIME n
        SET n 4
        EXPIRETIME n
        SET n 5 EX 0
        SET n 5 PX -1
        SET n 5 EX x
        SET n 5 EX
        SET n 5 EX 10 PX 10
        SET n 5 KEEPTTL PXAT {far_ms}
        SET n 5 EX 9223372036854775807
        SET n 5 PXAT 1
        EXISTS n
        SET n 6 NX EXAT {far_s}
        EXPIRETIME n
        SETEX s 0 v
        PSETEX s -5 v
        SETEX s 100 v
        TTL s
        PSETEX s 100000 w
        GET s
        GETEX s
        GETEX s PERSIST
        TTL s
        GETEX s EXAT {far_s}
        EXPIRETIME s
        GETEX s EX 0
        GETEX s EX 1 PX 1
        GETEX s KEEPTTL
        GETEX nope EX 10
        GETEX s PXAT 1
        EXISTS s
        SET d v
        EXPIRE d -1
        EXISTS d
        SET d v
        PEXPIRE d 0
        GET d
        SET d v
        EXPIREAT d {far_s}
        DEL d
        SET d v
        TTL d
        MSET a 1 b 2
        EXPIREAT a {far_s}
        MSET a 3
        TTL a
        SET g 1 GET EXAT {far_s}
        GETDEL g
        TTL g
        SETNX a 5
        EXISTS a a nope
        WATCH a
        SET a 9
        MULTI
        SET a 10
        EXEC
        GET a
        WATCH a
        MULTI
        SET a 11
        EXPIRE a 100
        EXEC
        WATCH a
        PERSIST a
        MULTI
        GET a
        EXEC
        WATCH a b
        UNWATCH
        MULTI
        WATCH a
        DISCARD"
    );
    for line in script.lines() {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        let (want, got) = (send(&mut theirs, &args), send(&mut ours, &args));
        assert_eq!(got, want, "{line}");
    }
    server.stop().unwrap();
}
