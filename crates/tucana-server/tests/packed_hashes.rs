//! Packed small hashes (DESIGN.md, "Packed small hashes") through a real Redis client:
//! every hash command answers alike on a packed hash and on one of the per-field layout
//! holding the same fields; the conversion at exactly 128/129 fields and at 4096/4097
//! bytes of fields and values, alone and inside MULTI; and the commands that move, copy,
//! unlink or expire a whole key, on a packed hash. Which layout a hash has is read from
//! the stored record itself (`types::packed::is_packed`), so the tests do not lean on
//! what OBJECT ENCODING answers.

use std::collections::HashMap;

use redis::{Connection, Value};
use tucana::Database;
use tucana_server::types::packed;
use tucana_server::RunningServer;

mod client;
use client::{connect, query, start_on, try_query};

fn start() -> (Database, RunningServer) {
    let db = Database::builder().open_in_memory().unwrap();
    let server = start_on(&db);
    (db, server)
}

/// Whether `key` is stored packed (`None`: missing).
fn is_packed(db: &Database, key: &str) -> Option<bool> {
    let ks = db.open_keyspace("default").unwrap();
    ks.get(key.as_bytes())
        .unwrap()
        .map(|v| packed::is_packed(&v))
}

fn cmd(con: &mut Connection, args: &[&str]) -> Value {
    query(con, args)
}

/// `n` fields `f000`.. with values `v000`.., as HSET's arguments after the key.
fn fields(range: std::ops::Range<usize>) -> Vec<String> {
    range
        .flat_map(|i| [format!("f{i:03}"), format!("v{i:03}")])
        .collect()
}

fn hset(con: &mut Connection, key: &str, pairs: &[String]) -> i64 {
    let mut args = vec!["HSET", key];
    args.extend(pairs.iter().map(String::as_str));
    query(con, &args)
}

/// The same five fields in a packed hash `p` and a per-field hash `s` (made by passing
/// 128 fields and deleting back: a hash never converts back).
fn both_layouts(db: &Database, con: &mut Connection) {
    let five = ["a", "1", "b", "2", "c", "x", "d", "-7", "e", "1.5"].map(String::from);
    hset(con, "p", &five);
    hset(con, "s", &five);
    hset(con, "s", &fields(0..124));
    let mut del = vec!["HDEL".to_string(), "s".to_string()];
    del.extend((0..124).map(|i| format!("f{i:03}")));
    let del: Vec<&str> = del.iter().map(String::as_str).collect();
    assert_eq!(query::<i64>(con, &del), 124);
    assert_eq!(is_packed(db, "p"), Some(true));
    assert_eq!(is_packed(db, "s"), Some(false));
}

#[test]
fn every_hash_command_answers_alike_on_both_layouts() {
    let (db, server) = start();
    let mut con = connect(&server);
    both_layouts(&db, &mut con);
    let script: &[&[&str]] = &[
        &["HGET", "K", "a"],
        &["HGET", "K", "zz"],
        &["HMGET", "K", "a", "zz", "e"],
        &["HGETALL", "K"],
        &["HKEYS", "K"],
        &["HVALS", "K"],
        &["HLEN", "K"],
        &["HEXISTS", "K", "c"],
        &["HEXISTS", "K", "zz"],
        &["HSTRLEN", "K", "e"],
        &["HSCAN", "K", "0"],
        &["HSCAN", "K", "0", "MATCH", "[a-c]"],
        &["HSETNX", "K", "a", "no"],
        &["HSETNX", "K", "n", "new"],
        &["HSET", "K", "a", "10", "g", "7", "g", "8"],
        &["HMSET", "K", "h", "9"],
        &["HINCRBY", "K", "a", "5"],
        &["HINCRBY", "K", "d", "-3"],
        &["HINCRBY", "K", "c", "1"],
        &["HINCRBY", "K", "new-int", "2"],
        &["HINCRBYFLOAT", "K", "e", "0.25"],
        &["HINCRBYFLOAT", "K", "new-float", "1.5"],
        &["HINCRBYFLOAT", "K", "c", "1"],
        &["HDEL", "K", "b", "b", "zz"],
        &["HGETALL", "K"],
        &["HLEN", "K"],
        &["TYPE", "K"],
        &["LPUSH", "K", "x"],
    ];
    for step in script {
        fn on<'a>(step: &[&'a str], key: &'a str) -> Vec<&'a str> {
            step.iter()
                .map(|&w| if w == "K" { key } else { w })
                .collect()
        }
        let p: redis::RedisResult<Value> = try_query(&mut con, &on(step, "p"));
        let s: redis::RedisResult<Value> = try_query(&mut con, &on(step, "s"));
        assert_eq!(format!("{p:?}"), format!("{s:?}"), "{step:?}");
    }
    // HRANDFIELD: picks are fields of the hash, distinct for a positive count.
    for key in ["p", "s"] {
        let all: Vec<String> = query(&mut con, &["HKEYS", key]);
        let one: String = query(&mut con, &["HRANDFIELD", key]);
        assert!(all.contains(&one));
        let mut some: Vec<String> = query(&mut con, &["HRANDFIELD", key, "100"]);
        some.sort();
        assert_eq!(some, all, "a count past the size answers every field once");
        let repeated: Vec<String> = query(&mut con, &["HRANDFIELD", key, "-20"]);
        assert_eq!(repeated.len(), 20);
        assert!(repeated.iter().all(|f| all.contains(f)));
        let with: Vec<String> = query(&mut con, &["HRANDFIELD", key, "2", "WITHVALUES"]);
        let map: HashMap<String, String> = query(&mut con, &["HGETALL", key]);
        assert_eq!(map.get(&with[0]), Some(&with[1]));
    }
    assert_eq!(is_packed(&db, "p"), Some(true), "edits keep it packed");
    assert_eq!(is_packed(&db, "s"), Some(false));
    let enc = |con: &mut Connection, key| query::<String>(con, &["OBJECT", "ENCODING", key]);
    assert_eq!(enc(&mut con, "p"), "listpack");
    assert_eq!(enc(&mut con, "s"), "hashtable");
    // HDEL of the last field deletes the key, in both layouts.
    for key in ["p", "s"] {
        let keys: Vec<String> = query(&mut con, &["HKEYS", key]);
        let mut del = vec!["HDEL", key];
        del.extend(keys.iter().map(String::as_str));
        assert_eq!(query::<i64>(&mut con, &del), keys.len() as i64);
        assert_eq!(query::<i64>(&mut con, &["EXISTS", key]), 0);
        assert_eq!(is_packed(&db, key), None);
    }
    server.stop().unwrap();
}

#[test]
fn conversion_at_128_and_129_fields() {
    let (db, server) = start();
    let mut con = connect(&server);
    // One field at a time: the 129th converts.
    assert_eq!(hset(&mut con, "h", &fields(0..128)), 128);
    assert_eq!(is_packed(&db, "h"), Some(true));
    assert_eq!(
        hset(&mut con, "h", &fields(0..128)),
        0,
        "overwrites stay packed"
    );
    assert_eq!(is_packed(&db, "h"), Some(true));
    assert_eq!(hset(&mut con, "h", &fields(128..129)), 1);
    assert_eq!(is_packed(&db, "h"), Some(false));
    assert_eq!(query::<i64>(&mut con, &["HLEN", "h"]), 129);
    let all: HashMap<String, String> = query(&mut con, &["HGETALL", "h"]);
    assert_eq!(all.len(), 129);
    assert_eq!(all.get("f128").map(String::as_str), Some("v128"));
    assert_eq!(all.get("f000").map(String::as_str), Some("v000"));
    // Never back: down to one field, still per-field.
    let mut del = vec!["HDEL".to_string(), "h".to_string()];
    del.extend((1..129).map(|i| format!("f{i:03}")));
    let del: Vec<&str> = del.iter().map(String::as_str).collect();
    assert_eq!(query::<i64>(&mut con, &del), 128);
    assert_eq!(is_packed(&db, "h"), Some(false));
    assert_eq!(query::<String>(&mut con, &["HGET", "h", "f000"]), "v000");
    // A new hash given 129 fields in one HSET is per-field at once; 128 packed.
    assert_eq!(hset(&mut con, "big", &fields(0..129)), 129);
    assert_eq!(is_packed(&db, "big"), Some(false));
    assert_eq!(hset(&mut con, "edge", &fields(0..128)), 128);
    assert_eq!(is_packed(&db, "edge"), Some(true));
    // HSETNX and HINCRBY convert too.
    assert_eq!(query::<i64>(&mut con, &["HSETNX", "edge", "n", "1"]), 1);
    assert_eq!(is_packed(&db, "edge"), Some(false));
    assert_eq!(hset(&mut con, "inc", &fields(0..128)), 128);
    assert_eq!(query::<i64>(&mut con, &["HINCRBY", "inc", "n", "3"]), 3);
    assert_eq!(is_packed(&db, "inc"), Some(false));
    assert_eq!(query::<i64>(&mut con, &["HLEN", "inc"]), 129);
    server.stop().unwrap();
}

#[test]
fn conversion_at_4096_and_4097_bytes() {
    let (db, server) = start();
    let mut con = connect(&server);
    // 4 fields of 1 byte and values of 1023: 4096 bytes in all.
    let value = "x".repeat(1023);
    for f in ["a", "b", "c", "d"] {
        hset(&mut con, "h", &[f.to_string(), value.clone()]);
    }
    assert_eq!(is_packed(&db, "h"), Some(true));
    // One byte more in a value converts.
    hset(&mut con, "h", &["d".to_string(), format!("{value}y")]);
    assert_eq!(is_packed(&db, "h"), Some(false));
    assert_eq!(query::<i64>(&mut con, &["HSTRLEN", "h", "d"]), 1024);
    assert_eq!(query::<i64>(&mut con, &["HLEN", "h"]), 4);
    // HINCRBYFLOAT growing a value past the bound converts too.
    let near = "1".to_string() + &"0".repeat(4090); // 4091 bytes, with field "n": 4092
    hset(&mut con, "f", &["n".to_string(), "1".to_string()]);
    hset(&mut con, "f", &["m".to_string(), near]);
    assert_eq!(is_packed(&db, "f"), Some(true));
    query::<String>(&mut con, &["HINCRBYFLOAT", "f", "n", "1234.5"]);
    assert_eq!(is_packed(&db, "f"), Some(false), "4092 - 1 + 6 bytes");
    assert_eq!(query::<String>(&mut con, &["HGET", "f", "n"]), "1235.5");
    server.stop().unwrap();
}

#[test]
fn conversion_inside_multi_is_seen_by_the_rest_of_the_transaction() {
    let (db, server) = start();
    let mut con = connect(&server);
    hset(&mut con, "h", &fields(0..127));
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("HSET")
        .arg("h")
        .arg(fields(127..128))
        .cmd("HLEN")
        .arg("h")
        .cmd("HSET")
        .arg("h")
        .arg(fields(128..130))
        .cmd("HGET")
        .arg("h")
        .arg("f129")
        .cmd("HGET")
        .arg("h")
        .arg("f000")
        .cmd("HLEN")
        .arg("h")
        .cmd("HDEL")
        .arg("h")
        .arg("f000");
    let replies: (i64, i64, i64, String, String, i64, i64) = pipe.query(&mut con).unwrap();
    assert_eq!(replies, (1, 128, 2, "v129".into(), "v000".into(), 130, 1));
    assert_eq!(is_packed(&db, "h"), Some(false));
    assert_eq!(query::<i64>(&mut con, &["HLEN", "h"]), 129);
    server.stop().unwrap();
}

#[test]
fn whole_key_commands_on_a_packed_hash() {
    let (db, server) = start();
    let mut con = connect(&server);
    let map = |con: &mut Connection, key| query::<HashMap<String, String>>(con, &["HGETALL", key]);
    hset(&mut con, "h", &fields(0..3));
    let want = map(&mut con, "h");
    // RENAME moves it as it is (still packed), RENAME over a per-field hash replaces it.
    assert_eq!(query::<String>(&mut con, &["RENAME", "h", "r"]), "OK");
    assert_eq!(is_packed(&db, "r"), Some(true));
    assert_eq!(is_packed(&db, "h"), None);
    assert_eq!(map(&mut con, "r"), want);
    hset(&mut con, "big", &fields(0..200));
    assert_eq!(query::<String>(&mut con, &["RENAME", "r", "big"]), "OK");
    assert_eq!(map(&mut con, "big"), want);
    assert_eq!(query::<i64>(&mut con, &["HLEN", "big"]), 3);
    // COPY: two independent hashes.
    assert_eq!(query::<i64>(&mut con, &["COPY", "big", "c"]), 1);
    hset(&mut con, "c", &["f000".into(), "changed".into()]);
    assert_eq!(map(&mut con, "big"), want);
    assert_eq!(query::<String>(&mut con, &["HGET", "c", "f000"]), "changed");
    // A per-field hash renamed onto a packed one, and copied: both readable.
    hset(&mut con, "big2", &fields(0..130));
    assert_eq!(query::<String>(&mut con, &["RENAME", "big2", "c"]), "OK");
    assert_eq!(query::<i64>(&mut con, &["HLEN", "c"]), 130);
    // MOVE to another database: not served (an error) or moved; the hash stays whole.
    match try_query::<i64>(&mut con, &["MOVE", "big", "1"]) {
        Ok(1) => {
            query::<String>(&mut con, &["SELECT", "1"]);
            assert_eq!(map(&mut con, "big"), want);
            query::<String>(&mut con, &["SELECT", "0"]);
            assert_eq!(query::<i64>(&mut con, &["EXISTS", "big"]), 0);
        }
        Ok(n) => panic!("MOVE answered {n}"),
        Err(_) => assert_eq!(map(&mut con, "big"), want),
    }
    // UNLINK and DEL delete it whole; nothing but the marker of other writes is left.
    hset(&mut con, "u", &fields(0..5));
    assert_eq!(query::<i64>(&mut con, &["UNLINK", "u"]), 1);
    assert_eq!(is_packed(&db, "u"), None);
    assert_eq!(query::<i64>(&mut con, &["EXISTS", "u"]), 0);
    // Expiry: the deadline holds, then the key is missing to every hash command.
    hset(&mut con, "e", &fields(0..5));
    assert_eq!(query::<i64>(&mut con, &["PEXPIRE", "e", "50"]), 1);
    assert!(query::<i64>(&mut con, &["PTTL", "e"]) > 0);
    std::thread::sleep(std::time::Duration::from_millis(120));
    assert_eq!(query::<i64>(&mut con, &["HLEN", "e"]), 0);
    assert_eq!(map(&mut con, "e").len(), 0);
    assert_eq!(query::<i64>(&mut con, &["HSET", "e", "a", "1"]), 1);
    assert_eq!(query::<i64>(&mut con, &["HLEN", "e"]), 1);
    assert_eq!(
        query::<i64>(&mut con, &["TTL", "e"]),
        -1,
        "a new hash has no deadline"
    );
    // TYPE and SCAN TYPE see a packed hash as a hash.
    assert_eq!(query::<String>(&mut con, &["TYPE", "e"]), "hash");
    let (_, keys): (String, Vec<String>) =
        query(&mut con, &["SCAN", "0", "TYPE", "hash", "COUNT", "1000"]);
    assert!(keys.contains(&"e".to_string()) && keys.contains(&"c".to_string()));
    server.stop().unwrap();
}

#[test]
fn damaged_packed_hashes_answer_errors() {
    let (db, server) = start();
    let mut con = connect(&server);
    hset(&mut con, "h", &fields(0..3));
    let ks = db.open_keyspace("default").unwrap();
    let good = ks.get(b"h").unwrap().unwrap();
    let mut other_format = good.clone();
    other_format[tucana_server::types::TYPED.len() + 1] = 9;
    ks.put(b"h", &other_format).unwrap();
    let err = try_query::<Value>(&mut con, &["HGETALL", "h"]).unwrap_err();
    assert!(err.to_string().contains("unknown format 9"), "{err}");
    ks.put(b"h", &good[..good.len() - 1]).unwrap();
    assert!(try_query::<Value>(&mut con, &["HGET", "h", "f000"]).is_err());
    assert!(try_query::<Value>(&mut con, &["HSET", "h", "a", "b"]).is_err());
    // DEL still deletes what the client names.
    assert_eq!(query::<i64>(&mut con, &["DEL", "h"]), 1);
    let _ = cmd(&mut con, &["PING"]);
    server.stop().unwrap();
}
