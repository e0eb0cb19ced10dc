//! The commands that move or copy whole keys (RENAME, RENAMENX, COPY) and RANDOMKEY, on
//! what the differential test cannot show: collections bigger than the inline delete
//! limit, that a copy is independent of its source, across a restart, inside MULTI, and
//! the options tucana refuses; and MEMORY USAGE's estimates.

use std::collections::HashSet;
use std::time::Duration;

use tucana::Database;

mod client;
use client::{connect, query, start_on, try_query};

#[test]
fn big_collections_move_and_copy_whole_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.tucana");
    let db = Database::open(&path).unwrap();
    let server = start_on(&db);
    let mut con = connect(&server);
    // 300 fields: more than the 128 deleted inline, so the old records are left to the
    // collector and must not show through.
    for i in 0..300 {
        let (f, v) = (format!("f{i:03}"), format!("v{i}"));
        query::<i64>(&mut con, &["HSET", "h", &f, &v]);
    }
    query::<()>(&mut con, &["RENAME", "h", "h2"]);
    assert_eq!(query::<i64>(&mut con, &["EXISTS", "h"]), 0);
    assert_eq!(query::<i64>(&mut con, &["HLEN", "h2"]), 300);
    assert_eq!(query::<i64>(&mut con, &["COPY", "h2", "h3"]), 1);
    query::<i64>(&mut con, &["HDEL", "h3", "f000", "f001"]);
    query::<i64>(&mut con, &["HSET", "h3", "new", "x"]);
    // A key created again at the old name starts empty.
    query::<i64>(&mut con, &["HSET", "h", "only", "1"]);
    server.stop().unwrap();
    db.close().unwrap();

    let db = Database::open(&path).unwrap();
    let server = start_on(&db);
    let mut con = connect(&server);
    let h2: Vec<(String, String)> = query(&mut con, &["HGETALL", "h2"]);
    assert_eq!(h2.len(), 300);
    assert!(h2.iter().any(|(f, v)| f == "f000" && v == "v0"));
    assert_eq!(query::<i64>(&mut con, &["HLEN", "h3"]), 299);
    assert_eq!(
        query::<Option<String>>(&mut con, &["HGET", "h3", "f000"]),
        None
    );
    assert_eq!(query::<i64>(&mut con, &["HLEN", "h"]), 1);
    server.stop().unwrap();
}

#[test]
fn rename_in_a_transaction_and_refused_options() {
    let db = Database::builder().open_in_memory().unwrap();
    let server = start_on(&db);
    let mut con = connect(&server);
    query::<()>(&mut con, &["SET", "a", "1"]);
    query::<i64>(&mut con, &["RPUSH", "l", "x", "y"]);
    query::<()>(&mut con, &["MULTI"]);
    query::<String>(&mut con, &["RENAME", "a", "b"]);
    query::<String>(&mut con, &["RENAME", "l", "a"]);
    query::<String>(&mut con, &["LRANGE", "a", "0", "-1"]);
    let (_, _, moved): ((), (), Vec<String>) = query(&mut con, &["EXEC"]);
    assert_eq!(moved, ["x", "y"]);
    assert_eq!(query::<String>(&mut con, &["GET", "b"]), "1");
    assert_eq!(query::<i64>(&mut con, &["EXISTS", "l"]), 0);
    let err = try_query::<i64>(&mut con, &["COPY", "b", "c", "DB", "1"]).unwrap_err();
    assert!(
        err.to_string().contains("DB option is not supported"),
        "{err}"
    );
    assert_eq!(query::<i64>(&mut con, &["EXISTS", "c"]), 0);
    server.stop().unwrap();
}

#[test]
fn randomkey_finds_every_key_and_never_a_reserved_record() {
    let db = Database::builder().open_in_memory().unwrap();
    let server = start_on(&db);
    let mut con = connect(&server);
    assert_eq!(query::<Option<String>>(&mut con, &["RANDOMKEY"]), None);
    let keys = ["apple", "banana", "cherry", "zz"];
    for k in keys {
        query::<()>(&mut con, &["SET", k, "v", "EX", "1000"]);
    }
    // Collections and deadlines put records in the reserved family.
    query::<i64>(&mut con, &["HSET", "hash", "f", "v"]);
    query::<()>(&mut con, &["SET", "gone", "v", "PX", "1"]);
    std::thread::sleep(Duration::from_millis(5));
    let mut seen = HashSet::new();
    for _ in 0..2000 {
        let k: String = query(&mut con, &["RANDOMKEY"]);
        seen.insert(k);
    }
    let want: HashSet<String> = keys
        .iter()
        .map(|k| k.to_string())
        .chain(["hash".to_string()])
        .collect();
    assert_eq!(seen, want);
    server.stop().unwrap();
}

#[test]
fn memory_usage_estimates_grow_with_the_data() {
    let db = Database::builder().open_in_memory().unwrap();
    let server = start_on(&db);
    let mut con = connect(&server);
    assert_eq!(
        query::<Option<i64>>(&mut con, &["MEMORY", "USAGE", "none"]),
        None
    );
    query::<()>(&mut con, &["SET", "s", "value"]);
    let small: i64 = query(&mut con, &["MEMORY", "USAGE", "s"]);
    query::<()>(&mut con, &["SET", "s", &"v".repeat(1000)]);
    let big: i64 = query(&mut con, &["MEMORY", "USAGE", "s"]);
    assert!(small > 0 && big > small + 900, "{small} {big}");
    for i in 0..100 {
        query::<i64>(
            &mut con,
            &["HSET", "h", &format!("field{i:03}"), "0123456789"],
        );
    }
    let sampled: i64 = query(&mut con, &["MEMORY", "USAGE", "h"]);
    let whole: i64 = query(&mut con, &["MEMORY", "USAGE", "h", "SAMPLES", "0"]);
    // 100 fields of 18 bytes and more each: every estimate counts them all.
    assert!(sampled > 1800 && whole > 1800, "{sampled} {whole}");
    assert!(try_query::<i64>(&mut con, &["MEMORY", "DOCTOR"]).is_err());
    server.stop().unwrap();
}
