//! The blocking pops (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BZPOPMIN, BZPOPMAX, BLMPOP,
//! BZMPOP) through a real client: a client blocked on an empty key is served by another
//! connection's push, clients blocked on one key are served in the order they blocked,
//! a timeout answers nil, and inside MULTI nothing blocks. Nothing is timed: a test waits
//! until INFO's `blocked_clients` shows the clients blocked before it pushes.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use tucana_server::RunningServer;

mod client;
use client::{connect, query, start};

/// Runs `args` on a new connection in a thread; its reply comes back on join.
fn blocked(server: &RunningServer, args: &[&str]) -> JoinHandle<Value> {
    let mut con = connect(server);
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        query(&mut con, &refs)
    })
}

/// Waits (up to a minute; not measured) until `n` clients are blocked.
fn wait_blocked(con: &mut Connection, n: usize) {
    let want = format!("blocked_clients:{n}\r");
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        let info: String = query(con, &["INFO", "clients"]);
        if info.contains(&want) {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "never {n} blocked clients: {info}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

#[test]
fn a_blocked_client_is_served_by_another_connections_push() {
    let server = start();
    let mut con = connect(&server);
    let waiter = blocked(&server, &["BLPOP", "empty", "list", "0"]);
    wait_blocked(&mut con, 1);
    query::<i64>(&mut con, &["RPUSH", "list", "a", "b"]);
    assert_eq!(
        waiter.join().unwrap(),
        Value::Array(vec![bulk("list"), bulk("a")])
    );
    wait_blocked(&mut con, 0);
    assert_eq!(
        query::<Vec<String>>(&mut con, &["LRANGE", "list", "0", "-1"]),
        ["b"]
    );

    // The other blocking pops, each served by a write from this connection.
    let cases: [(&[&str], &[&str], Value); 6] = [
        (
            &["BRPOP", "l2", "0"],
            &["RPUSH", "l2", "x", "y"],
            Value::Array(vec![bulk("l2"), bulk("y")]),
        ),
        (
            &["BLMOVE", "src", "dst", "LEFT", "RIGHT", "0"],
            &["RPUSH", "src", "m"],
            bulk("m"),
        ),
        (
            &["BRPOPLPUSH", "src2", "dst", "0"],
            &["LPUSH", "src2", "n"],
            bulk("n"),
        ),
        (
            &["BZPOPMIN", "z", "0"],
            &["ZADD", "z", "2", "two", "1", "one"],
            Value::Array(vec![bulk("z"), bulk("one"), bulk("1")]),
        ),
        (
            &["BLMPOP", "0", "2", "nothing", "l3", "RIGHT", "COUNT", "2"],
            &["RPUSH", "l3", "p", "q", "r"],
            Value::Array(vec![bulk("l3"), Value::Array(vec![bulk("r"), bulk("q")])]),
        ),
        (
            &["BZMPOP", "0", "1", "z2", "MAX"],
            &["ZADD", "z2", "5", "five", "7", "seven"],
            Value::Array(vec![
                bulk("z2"),
                Value::Array(vec![Value::Array(vec![bulk("seven"), bulk("7")])]),
            ]),
        ),
    ];
    for (block, push, want) in cases {
        let waiter = blocked(&server, block);
        wait_blocked(&mut con, 1);
        query::<Value>(&mut con, push);
        assert_eq!(waiter.join().unwrap(), want, "{block:?}");
        wait_blocked(&mut con, 0);
    }
    assert_eq!(
        query::<Vec<String>>(&mut con, &["LRANGE", "dst", "0", "-1"]),
        ["n", "m"]
    );
    server.stop().unwrap();
}

#[test]
fn clients_blocked_on_one_key_are_served_in_the_order_they_blocked() {
    let server = start();
    let mut con = connect(&server);
    let mut waiters = Vec::new();
    for i in 0..3 {
        waiters.push(blocked(&server, &["BLPOP", "q", "0"]));
        wait_blocked(&mut con, i + 1);
    }
    // One push of three elements serves all three, first come first served.
    query::<i64>(&mut con, &["RPUSH", "q", "first", "second", "third"]);
    let got: Vec<Value> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(
        got,
        ["first", "second", "third"].map(|e| Value::Array(vec![bulk("q"), bulk(e)]))
    );
    // And one element at a time: only the first waiter is served by the first push.
    let a = blocked(&server, &["BRPOP", "q", "0"]);
    wait_blocked(&mut con, 1);
    let b = blocked(&server, &["BRPOP", "q", "0"]);
    wait_blocked(&mut con, 2);
    query::<i64>(&mut con, &["RPUSH", "q", "one"]);
    assert_eq!(
        a.join().unwrap(),
        Value::Array(vec![bulk("q"), bulk("one")])
    );
    wait_blocked(&mut con, 1);
    query::<i64>(&mut con, &["RPUSH", "q", "two"]);
    assert_eq!(
        b.join().unwrap(),
        Value::Array(vec![bulk("q"), bulk("two")])
    );
    server.stop().unwrap();
}

#[test]
fn a_key_of_another_type_does_not_serve_a_blocked_client() {
    let server = start();
    let mut con = connect(&server);
    let waiter = blocked(&server, &["BLPOP", "k", "0"]);
    wait_blocked(&mut con, 1);
    // The list exists only inside the transaction; after it, k is a string.
    query::<()>(&mut con, &["MULTI"]);
    query::<String>(&mut con, &["LPUSH", "k", "a"]);
    query::<String>(&mut con, &["DEL", "k"]);
    query::<String>(&mut con, &["SET", "k", "foo"]);
    query::<Value>(&mut con, &["EXEC"]);
    // Woken by the write, the waiter meets a string and keeps waiting.
    query::<i64>(&mut con, &["DEL", "k"]);
    query::<i64>(&mut con, &["LPUSH", "k", "b"]);
    assert_eq!(
        waiter.join().unwrap(),
        Value::Array(vec![bulk("k"), bulk("b")])
    );
    // A destination of another type is the blocked BRPOPLPUSH's answer (as in Redis),
    // and the element stays where it was.
    query::<()>(&mut con, &["SET", "target", "nolist"]);
    let mut rd = connect(&server);
    let waiter = std::thread::spawn(move || {
        redis::cmd("BRPOPLPUSH")
            .arg("src")
            .arg("target")
            .arg("0")
            .query::<Value>(&mut rd)
            .unwrap_err()
            .to_string()
    });
    wait_blocked(&mut con, 1);
    query::<i64>(&mut con, &["RPUSH", "src", "foo"]);
    assert!(waiter.join().unwrap().contains("WRONGTYPE"));
    assert_eq!(
        query::<Vec<String>>(&mut con, &["LRANGE", "src", "0", "-1"]),
        ["foo"]
    );
    server.stop().unwrap();
}

#[test]
fn a_timeout_answers_nil_and_multi_never_blocks() {
    let server = start();
    let mut con = connect(&server);
    assert_eq!(
        query::<Value>(&mut con, &["BLPOP", "none", "0.01"]),
        Value::Nil
    );
    assert_eq!(
        query::<Value>(&mut con, &["BLMOVE", "none", "d", "LEFT", "LEFT", "0.01"]),
        Value::Nil
    );
    assert_eq!(
        query::<Value>(&mut con, &["BZMPOP", "0.01", "1", "none", "MIN"]),
        Value::Nil
    );
    // Inside MULTI a blocking pop answers at once, as on timeout, even with timeout 0.
    query::<()>(&mut con, &["MULTI"]);
    query::<String>(&mut con, &["BLPOP", "none", "0"]);
    query::<String>(&mut con, &["RPUSH", "later", "x"]);
    query::<String>(&mut con, &["BRPOP", "later", "0"]);
    let replies: Vec<Value> = query(&mut con, &["EXEC"]);
    assert_eq!(
        replies,
        [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![bulk("later"), bulk("x")])
        ]
    );
    // Bad arguments are refused before anything blocks.
    let err = redis::cmd("BLPOP")
        .arg("k")
        .arg("-1")
        .query::<Value>(&mut con)
        .unwrap_err();
    assert!(err.to_string().contains("timeout is negative"), "{err}");
    server.stop().unwrap();
}

#[test]
fn pipelined_requests_after_a_blocked_one_wait_for_it() {
    let server = start();
    let mut con = connect(&server);
    let mut client = connect(&server);
    let waiter = std::thread::spawn(move || {
        let mut pipe = redis::pipe();
        pipe.cmd("SET").arg("before").arg("1");
        pipe.cmd("BLPOP").arg("p").arg("0");
        pipe.cmd("GET").arg("after");
        pipe.query::<(String, Value, Option<String>)>(&mut client)
            .unwrap()
    });
    wait_blocked(&mut con, 1);
    // The request after the blocked one has not run yet: it would read "after" unset,
    // but runs after the push below, which also sets it.
    assert_eq!(query::<String>(&mut con, &["GET", "before"]), "1");
    query::<()>(&mut con, &["SET", "after", "2"]);
    query::<i64>(&mut con, &["RPUSH", "p", "v"]);
    let (set, popped, after) = waiter.join().unwrap();
    assert_eq!(set, "OK");
    assert_eq!(popped, Value::Array(vec![bulk("p"), bulk("v")]));
    assert_eq!(after.as_deref(), Some("2"));
    server.stop().unwrap();
}

#[test]
fn a_client_that_hangs_up_while_blocked_is_forgotten() {
    let server = start();
    let mut con = connect(&server);
    use std::io::Write;
    let mut gone = std::net::TcpStream::connect(server.addr).unwrap();
    gone.write_all(b"*3\r\n$5\r\nBLPOP\r\n$4\r\ngone\r\n$1\r\n0\r\n")
        .unwrap();
    wait_blocked(&mut con, 1);
    drop(gone);
    wait_blocked(&mut con, 0);
    // Nobody pops what is pushed now.
    query::<i64>(&mut con, &["RPUSH", "gone", "kept"]);
    assert_eq!(query::<i64>(&mut con, &["LLEN", "gone"]), 1);
    server.stop().unwrap();
}

/// A list SORT ... STORE creates serves a client blocked on it (Redis's suite: "BLPOP
/// when result key is created by SORT..STORE").
#[test]
fn a_list_stored_by_sort_serves_a_blocked_client() {
    let server = start();
    let mut con = connect(&server);
    let waiter = blocked(&server, &["BLPOP", "sorted", "0"]);
    wait_blocked(&mut con, 1);
    query::<i64>(&mut con, &["RPUSH", "src", "hola", "aguacate", "zanzibar"]);
    assert_eq!(
        query::<i64>(&mut con, &["SORT", "src", "ALPHA", "STORE", "sorted"]),
        3
    );
    assert_eq!(
        waiter.join().unwrap(),
        Value::Array(vec![bulk("sorted"), bulk("aguacate")])
    );
    assert_eq!(
        query::<Vec<String>>(&mut con, &["LRANGE", "sorted", "0", "-1"]),
        ["hola", "zanzibar"]
    );
    server.stop().unwrap();
}
