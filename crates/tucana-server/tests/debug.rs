//! DEBUG, RESET and CLIENT UNBLOCK through a real client: the commands Redis's own test
//! suite uses to look at a server (`docs/redis-suite.md`). DEBUG SET-ACTIVE-EXPIRE stops
//! the sweeper and lazy expiry alone hides a key; DEBUG DIGEST-VALUE and DIGEST digest
//! content (equal for equal content whatever its history, different when it changes);
//! DEBUG RELOAD and LOADAOF verify the committed volume and keep every key, member and
//! deadline; RESET leaves a connection as new; CLIENT UNBLOCK ends a blocking pop with a
//! null or an UNBLOCKED error. DEBUG needs `--enable-debug-command`. Nothing is timed:
//! waits poll INFO until a state shows.

use std::time::{Duration, Instant};

use redis::{Connection, Value};
use tucana::Database;
use tucana_server::{RunningServer, ServerConfig};

mod client;
mod common;
use client::{connect, query, start, start_with, try_query};

/// A server over `db` that serves DEBUG (`--enable-debug-command`).
fn debug_server(db: &Database) -> RunningServer {
    start_with(
        db,
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            enable_debug_command: true,
            ..ServerConfig::default()
        },
    )
}

#[test]
fn debug_is_refused_unless_enabled() {
    let server = start();
    let mut con = connect(&server);
    let err = try_query::<()>(&mut con, &["DEBUG", "SET-ACTIVE-EXPIRE", "0"]).unwrap_err();
    assert!(err.to_string().contains("--enable-debug-command"), "{err}");
    server.stop().unwrap();
}

/// The value of `field` in INFO's text.
fn info_field(con: &mut Connection, field: &str) -> String {
    let info: String = query(con, &["INFO"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO"))
        .trim()
        .to_string()
}

/// Waits (up to a minute; not measured) until INFO's `field` reads `want`.
fn wait_info(con: &mut Connection, field: &str, want: &str) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while info_field(con, field) != want {
        assert!(Instant::now() < give_up, "{field} never became {want}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn active_expiry_stops_and_starts_and_lazy_expiry_still_hides_keys() {
    let server = debug_server(&Database::builder().open_in_memory().unwrap());
    let mut con = connect(&server);
    query::<()>(&mut con, &["DEBUG", "SET-ACTIVE-EXPIRE", "0"]);
    query::<()>(&mut con, &["SET", "gone", "v", "PX", "1"]);
    query::<()>(&mut con, &["SET", "kept", "v"]);
    // Several sweeper ticks (100 ms each) pass with the sweeper off: nothing is swept.
    std::thread::sleep(Duration::from_millis(350));
    assert_eq!(info_field(&mut con, "expired_keys"), "0");
    // The key is still stored but expired: every command sees it missing.
    assert_eq!(query::<i64>(&mut con, &["DEL", "gone"]), 0);
    assert_eq!(query::<i64>(&mut con, &["EXISTS", "gone"]), 0);
    query::<()>(&mut con, &["SET", "swept", "v", "PX", "1"]);
    query::<()>(&mut con, &["DEBUG", "SET-ACTIVE-EXPIRE", "1"]);
    wait_info(&mut con, "expired_keys", "1");
    assert_eq!(query::<String>(&mut con, &["GET", "kept"]), "v");
    assert!(try_query::<()>(&mut con, &["DEBUG", "SET-ACTIVE-EXPIRE", "2"]).is_err());
    server.stop().unwrap();
}

fn digest(con: &mut Connection, key: &str) -> String {
    let digests: Vec<String> = query(con, &["DEBUG", "DIGEST-VALUE", key]);
    assert_eq!(digests.len(), 1);
    assert_eq!(digests[0].len(), 40, "{digests:?}");
    digests[0].clone()
}

#[test]
fn digests_follow_content_not_history() {
    let server = debug_server(&Database::builder().open_in_memory().unwrap());
    let mut con = connect(&server);
    let zeros = "0".repeat(40);
    assert_eq!(query::<String>(&mut con, &["DEBUG", "DIGEST"]), zeros);
    assert_eq!(digest(&mut con, "nokey"), zeros);

    // One list built from the left, one from the right: same elements, same digest.
    query::<i64>(&mut con, &["LPUSH", "left", "c", "b", "a"]);
    query::<i64>(&mut con, &["RPUSH", "right", "a", "b", "c"]);
    assert_eq!(digest(&mut con, "left"), digest(&mut con, "right"));
    query::<i64>(&mut con, &["RPUSH", "other", "c", "b", "a"]);
    assert_ne!(digest(&mut con, "left"), digest(&mut con, "other"));

    // A copy of each type digests as its source; a change does not.
    query::<i64>(&mut con, &["HSET", "h", "f", "1", "g", "2"]);
    query::<i64>(&mut con, &["SADD", "s", "1", "2", "3"]);
    query::<i64>(&mut con, &["ZADD", "z", "1", "a", "2", "b"]);
    query::<()>(&mut con, &["SET", "str", "value"]);
    for key in ["left", "h", "s", "z", "str"] {
        let copy = format!("{key}-copy");
        assert_eq!(query::<i64>(&mut con, &["COPY", key, &copy]), 1);
        assert_eq!(digest(&mut con, key), digest(&mut con, &copy), "{key}");
    }
    let before = digest(&mut con, "z");
    query::<f64>(&mut con, &["ZINCRBY", "z", "1", "a"]);
    assert_ne!(digest(&mut con, "z"), before);
    // A string and a one-element list of the same bytes differ.
    query::<i64>(&mut con, &["RPUSH", "l1", "value"]);
    assert_ne!(digest(&mut con, "l1"), digest(&mut con, "str"));

    // The database's digest moves with a value and with a deadline.
    let whole = query::<String>(&mut con, &["DEBUG", "DIGEST"]);
    assert_ne!(whole, zeros);
    query::<i64>(&mut con, &["EXPIRE", "str", "1000"]);
    let with_ttl = query::<String>(&mut con, &["DEBUG", "DIGEST"]);
    assert_ne!(with_ttl, whole);
    query::<i64>(&mut con, &["PERSIST", "str"]);
    assert_eq!(query::<String>(&mut con, &["DEBUG", "DIGEST"]), whole);
    server.stop().unwrap();
}

#[test]
fn reload_verifies_the_volume_and_keeps_keys_members_and_deadlines() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path().join("v.tucana")).unwrap();
    let server = debug_server(&db);
    let mut con = connect(&server);
    query::<i64>(&mut con, &["RPUSH", "l", "a", "b", "c"]);
    query::<i64>(&mut con, &["HSET", "h", "f", "v"]);
    query::<()>(&mut con, &["SET", "t", "v", "EX", "1000"]);
    let before = query::<String>(&mut con, &["DEBUG", "DIGEST"]);
    for reload in ["RELOAD", "LOADAOF"] {
        query::<()>(&mut con, &["DEBUG", reload]);
        assert_eq!(query::<String>(&mut con, &["DEBUG", "DIGEST"]), before);
        assert_eq!(
            query::<Vec<String>>(&mut con, &["LRANGE", "l", "0", "-1"]),
            ["a", "b", "c"]
        );
        let ttl: i64 = query(&mut con, &["TTL", "t"]);
        assert!(ttl > 900 && ttl <= 1000, "{ttl}");
    }
    // Writes go on after a reload.
    query::<i64>(&mut con, &["RPUSH", "l", "d"]);
    assert_eq!(query::<i64>(&mut con, &["LLEN", "l"]), 4);
    // Not inside MULTI: it takes the write locks EXEC holds.
    query::<()>(&mut con, &["MULTI"]);
    let err = try_query::<()>(&mut con, &["DEBUG", "RELOAD"]).unwrap_err();
    assert!(err.to_string().contains("not allowed inside a transaction"));
    assert!(
        try_query::<Value>(&mut con, &["EXEC"]).is_err(),
        "EXECABORT"
    );
    server.stop().unwrap();
}

#[test]
fn debug_object_names_the_encoding() {
    let server = debug_server(&Database::builder().open_in_memory().unwrap());
    let mut con = connect(&server);
    query::<i64>(&mut con, &["HSET", "small", "f", "v"]);
    let text: String = query(&mut con, &["DEBUG", "OBJECT", "small"]);
    assert!(text.contains("encoding:listpack"), "{text}");
    query::<i64>(&mut con, &["HSET", "small", "big", &"x".repeat(1024)]);
    let text: String = query(&mut con, &["DEBUG", "OBJECT", "small"]);
    assert!(text.contains("encoding:hashtable"), "{text}");
    assert!(try_query::<String>(&mut con, &["DEBUG", "OBJECT", "nokey"]).is_err());
    server.stop().unwrap();
}

#[test]
fn reset_leaves_the_connection_as_new() {
    let server = start();
    let (mut con, mut other) = (connect(&server), connect(&server));
    query::<()>(&mut con, &["SET", "w", "1"]);
    query::<()>(&mut con, &["WATCH", "w"]);
    query::<()>(&mut con, &["SELECT", "3"]);
    query::<()>(&mut con, &["CLIENT", "SETNAME", "me"]);
    query::<()>(&mut con, &["MULTI"]);
    query::<()>(&mut con, &["SET", "queued", "1"]);
    assert_eq!(query::<String>(&mut con, &["RESET"]), "RESET");
    // No transaction, nothing queued ran, database 0, no name, no watch.
    assert!(try_query::<Value>(&mut con, &["EXEC"]).is_err());
    assert_eq!(query::<i64>(&mut con, &["EXISTS", "queued"]), 0);
    assert_eq!(query::<String>(&mut con, &["GET", "w"]), "1", "database 0");
    assert_eq!(
        query::<Option<String>>(&mut con, &["CLIENT", "GETNAME"]),
        None
    );
    query::<()>(&mut other, &["SET", "w", "2"]);
    query::<()>(&mut con, &["MULTI"]);
    query::<()>(&mut con, &["PING"]);
    assert_eq!(
        query::<Value>(&mut con, &["EXEC"]),
        Value::Array(vec![Value::SimpleString("PONG".into())]),
        "the watch went with RESET"
    );
    server.stop().unwrap();
}

#[test]
fn reset_signs_out_where_a_password_is_required() {
    let db = Database::builder().open_in_memory().unwrap();
    let server = start_with(
        &db,
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            requirepass: Some("secret".into()),
            ..ServerConfig::default()
        },
    );
    let mut con = connect(&server);
    query::<()>(&mut con, &["AUTH", "secret"]);
    query::<()>(&mut con, &["SET", "k", "v"]);
    assert_eq!(query::<String>(&mut con, &["RESET"]), "RESET");
    let err = try_query::<String>(&mut con, &["GET", "k"]).unwrap_err();
    assert!(err.to_string().contains("NOAUTH"), "{err}");
    server.stop().unwrap();
}

/// Starts `BLPOP key 0` on a new connection; its client id and the thread with its reply.
fn blocked_pop(
    server: &RunningServer,
    key: &str,
) -> (i64, std::thread::JoinHandle<redis::RedisResult<Value>>) {
    let mut con = connect(server);
    let id: i64 = query(&mut con, &["CLIENT", "ID"]);
    let key = key.to_string();
    let handle = std::thread::spawn(move || try_query::<Value>(&mut con, &["BLPOP", &key, "0"]));
    (id, handle)
}

#[test]
fn client_unblock_ends_a_blocking_pop_with_a_null_or_an_error() {
    let server = start();
    let mut con = connect(&server);
    let (id, waiter) = blocked_pop(&server, "empty");
    wait_info(&mut con, "blocked_clients", "1");
    assert_eq!(
        query::<i64>(&mut con, &["CLIENT", "UNBLOCK", &id.to_string()]),
        1
    );
    assert_eq!(waiter.join().unwrap().unwrap(), Value::Nil);
    wait_info(&mut con, "blocked_clients", "0");
    assert_eq!(
        query::<i64>(&mut con, &["CLIENT", "UNBLOCK", &id.to_string()]),
        0,
        "no longer blocked"
    );

    let (id, waiter) = blocked_pop(&server, "empty");
    wait_info(&mut con, "blocked_clients", "1");
    assert_eq!(
        query::<i64>(&mut con, &["CLIENT", "UNBLOCK", &id.to_string(), "ERROR"]),
        1
    );
    let err = waiter.join().unwrap().unwrap_err();
    assert!(err.to_string().contains("UNBLOCKED"), "{err}");
    // The list was never touched; a later push is still there.
    query::<i64>(&mut con, &["RPUSH", "empty", "x"]);
    assert_eq!(query::<i64>(&mut con, &["LLEN", "empty"]), 1);
    assert!(try_query::<i64>(&mut con, &["CLIENT", "UNBLOCK", "1", "LATER"]).is_err());
    server.stop().unwrap();
}

#[test]
fn config_runs_inside_multi_and_its_error_takes_its_place() {
    let server = start();
    // Raw RESP: the redis crate turns an array holding an error into an error.
    let mut raw = common::Raw::connect(&server.addr.to_string());
    let mut call = |words: &[&str]| {
        let args: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        String::from_utf8(raw.call(&args).0).unwrap()
    };
    call(&["MULTI"]);
    call(&["SET", "foo", "bar"]);
    assert_eq!(call(&["CONFIG", "SET", "maxmemory", "bla"]), "+QUEUED\r\n");
    let replies = call(&["EXEC"]);
    assert!(
        replies.starts_with(
            "*2\r\n+OK\r\n-ERR CONFIG SET failed (possibly related to argument 'maxmemory')"
        ),
        "{replies}"
    );
    assert_eq!(call(&["GET", "foo"]), "$3\r\nbar\r\n");
    server.stop().unwrap();
}
