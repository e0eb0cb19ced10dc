//! Keyspace notifications (`notify-keyspace-events`): the flag string through CONFIG SET
//! and GET and at start, each event class published only when it is on (and nothing at
//! all when notifications are off), the database in the channel names, the `new` event,
//! expired keys notified once whether a write or the sweeper removed them, a
//! transaction's events after its EXEC, a blocked pop's events when it is served, and a
//! differential script against redis-server
//! (skipped where it is not installed) comparing every event of every write command
//! tucana has.
//!
//! Each test ends its commands with a PUBLISH of a marker: the events a subscriber got
//! before the marker are exactly those the commands raised (events are published before
//! the command's reply, so a later PUBLISH comes after them).

use tucana::Database;
use tucana_server::{RunningServer, ServerConfig};

mod client;
mod common;
mod wire;
use client::{connect, query, start, start_with};
use common::Raw;
use wire::{words, Frame, Wire};

/// A server with `flags` as its `notify-keyspace-events` at start.
fn start_notifying(flags: &str, active_expiry: bool) -> RunningServer {
    start_with(
        &Database::builder().open_in_memory().unwrap(),
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            notify_keyspace_events: flags.into(),
            active_expiry,
            ..ServerConfig::default()
        },
    )
}

/// A connection subscribed to every channel (`PSUBSCRIBE *`).
fn subscriber(wire: &mut Wire) {
    assert_eq!(
        wire.call(&["PSUBSCRIBE", "*"]).words(),
        words(&["psubscribe", "*", "1"])
    );
}

/// Publishes the marker through `publish`, then reads `sub`'s messages up to it: each
/// as "channel message".
fn events_until_marker(sub: &mut Wire, publish: impl FnOnce()) -> Vec<String> {
    publish();
    let mut events = Vec::new();
    loop {
        let frame = sub.read();
        let w = frame.words();
        assert_eq!(w[0], "pmessage", "{frame:?}");
        if w[2] == "marker" {
            return events;
        }
        events.push(format!("{} {}", w[2], w[3]));
    }
}

/// The events `commands` raise on a tucana server, read by a `PSUBSCRIBE *` subscriber.
fn events_of(server: &RunningServer, commands: &[&[&str]]) -> Vec<String> {
    let mut sub = Wire::connect(server);
    subscriber(&mut sub);
    let mut con = Wire::connect(server);
    for args in commands {
        if let Frame::Error(e) = con.call(args) {
            panic!("{args:?}: {e}");
        }
    }
    events_until_marker(&mut sub, || {
        con.call(&["PUBLISH", "marker", "end"]);
    })
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn flags_are_set_and_read_back_as_redis_writes_them() {
    let server = start();
    let mut con = connect(&server);
    let get = |con: &mut redis::Connection| -> String {
        let pair: Vec<String> = query(con, &["CONFIG", "GET", "notify-keyspace-events"]);
        assert_eq!(pair[0], "notify-keyspace-events");
        pair[1].clone()
    };
    assert_eq!(get(&mut con), "", "off by default");
    for (set, read) in [
        ("gKE", "gKE"),
        ("$lshzxeKE", "$lshzxeKE"),
        ("KA", "AK"),
        ("EA", "AE"),
        ("Egn$", "g$nE"),
        ("KEAm", "AKEm"),
        ("KEA n", ""),
        ("", ""),
    ] {
        let result: redis::RedisResult<String> =
            client::try_query(&mut con, &["CONFIG", "SET", "notify-keyspace-events", set]);
        if set.contains(' ') {
            // A space is no class: Redis's error, and the flags are unchanged.
            let e = result.unwrap_err().to_string();
            assert!(
                e.contains("CONFIG SET failed (possibly related to argument 'notify-keyspace-events') - Invalid event class character. Use 'Ag$lshzxeKEtmdn'."),
                "{e}"
            );
            assert_eq!(get(&mut con), "AKEm");
            continue;
        }
        assert_eq!(result.unwrap(), "OK");
        assert_eq!(get(&mut con), read, "after CONFIG SET {set:?}");
    }
    // Set with other settings: all or nothing.
    let refused: redis::RedisResult<String> = client::try_query(
        &mut con,
        &[
            "CONFIG",
            "SET",
            "notify-keyspace-events",
            "KEA",
            "timeout",
            "x",
        ],
    );
    assert!(refused.is_err());
    assert_eq!(get(&mut con), "");
}

#[test]
fn flags_given_at_start_apply_and_bad_ones_are_refused() {
    let server = start_notifying("Kg$", true);
    let mut con = connect(&server);
    let pair: Vec<String> = query(&mut con, &["CONFIG", "GET", "notify-keyspace-events"]);
    assert_eq!(pair[1], "g$K");
    drop(con);
    assert_eq!(
        events_of(&server, &[&["SET", "k", "v"], &["DEL", "k"]]),
        strings(&["__keyspace@0__:k set", "__keyspace@0__:k del"])
    );
    let config = ServerConfig {
        notify_keyspace_events: "KEq".into(),
        ..ServerConfig::default()
    };
    let e = config.validate().unwrap_err();
    assert!(e.contains("Invalid event class character"), "{e}");
}

/// Writes of every type: each class's flag lets through its events only.
const EVERY_TYPE: &[&[&str]] = &[
    &["SET", "s", "v"],
    &["LPUSH", "l", "a"],
    &["SADD", "st", "a"],
    &["HSET", "h", "f", "v"],
    &["ZADD", "z", "1", "a"],
    &["EXPIRE", "s", "100"],
    &["DEL", "l"],
];

#[test]
fn each_class_publishes_only_its_events() {
    for (flags, want) in [
        ("E$", &["__keyevent@0__:set s"][..]),
        ("El", &["__keyevent@0__:lpush l"]),
        ("Es", &["__keyevent@0__:sadd st"]),
        ("Eh", &["__keyevent@0__:hset h"]),
        ("Ez", &["__keyevent@0__:zadd z"]),
        ("Eg", &["__keyevent@0__:expire s", "__keyevent@0__:del l"]),
        (
            "En",
            &[
                "__keyevent@0__:new s",
                "__keyevent@0__:new l",
                "__keyevent@0__:new st",
                "__keyevent@0__:new h",
                "__keyevent@0__:new z",
            ],
        ),
        ("Kl", &["__keyspace@0__:l lpush"]),
    ] {
        let server = start_notifying(flags, true);
        assert_eq!(
            events_of(&server, EVERY_TYPE),
            strings(want),
            "flags {flags}"
        );
    }
}

#[test]
fn nothing_is_published_while_notifications_are_off() {
    // Off by default; classes without K or E publish nothing either; and turned off
    // after being on.
    for flags in ["", "A", "gn$lshzxe"] {
        let server = start_notifying(flags, true);
        assert_eq!(
            events_of(&server, EVERY_TYPE),
            Vec::<String>::new(),
            "{flags:?}"
        );
    }
    let server = start_notifying("KEA", true);
    let mut con = connect(&server);
    let _: String = query(&mut con, &["CONFIG", "SET", "notify-keyspace-events", ""]);
    assert_eq!(events_of(&server, EVERY_TYPE), Vec::<String>::new());
}

#[test]
fn channels_name_the_selected_database() {
    let server = start_notifying("KE$", true);
    assert_eq!(
        events_of(&server, &[&["SELECT", "5"], &["SET", "k", "v"]]),
        strings(&["__keyspace@5__:k set", "__keyevent@5__:set k"])
    );
}

#[test]
fn a_transaction_s_events_are_published_once_it_is_applied() {
    let server = start_notifying("Kgl$", true);
    let mut sub = Wire::connect(&server);
    subscriber(&mut sub);
    let mut con = Wire::connect(&server);
    con.call(&["MULTI"]);
    con.call(&["SET", "a", "1"]);
    con.call(&["RPUSH", "l", "x"]);
    con.call(&["INCR", "a"]);
    con.call(&["DEL", "a", "l"]);
    assert_eq!(con.call(&["EXEC"]).kind(), '*');
    // A transaction WATCH aborted raises nothing.
    con.call(&["WATCH", "w"]);
    let _: String = query(&mut connect(&server), &["SET", "w", "changed"]);
    con.call(&["MULTI"]);
    con.call(&["SET", "t", "1"]);
    // A null array (`*-1`), which `Wire` reads as an empty one: aborted.
    assert_eq!(con.call(&["EXEC"]), Frame::Aggregate('*', Vec::new()));
    let events = events_until_marker(&mut sub, || {
        con.call(&["PUBLISH", "marker", "end"]);
    });
    assert_eq!(
        events,
        strings(&[
            "__keyspace@0__:a set",
            "__keyspace@0__:l rpush",
            "__keyspace@0__:a incrby",
            "__keyspace@0__:a del",
            "__keyspace@0__:l del",
            "__keyspace@0__:w set",
        ])
    );
}

#[test]
fn a_blocked_pop_served_later_raises_its_pop_after_the_push() {
    let server = start_notifying("Kgl", true);
    let mut sub = Wire::connect(&server);
    subscriber(&mut sub);
    let mut blocked = Wire::connect(&server);
    blocked.send(&["BLPOP", "q", "0"]);
    let mut con = connect(&server);
    // The BLPOP is waiting once INFO counts it (a hang guard bounds the wait).
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !query::<String>(&mut con, &["INFO", "clients"]).contains("blocked_clients:1\r\n") {
        assert!(std::time::Instant::now() < give_up, "BLPOP never blocked");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let _: i64 = query(&mut con, &["RPUSH", "q", "job"]);
    assert_eq!(blocked.read().words(), words(&["q", "job"]));
    let events = events_until_marker(&mut sub, || {
        let _: i64 = query(&mut con, &["PUBLISH", "marker", "end"]);
    });
    assert_eq!(
        events,
        strings(&[
            "__keyspace@0__:q rpush",
            "__keyspace@0__:q lpop",
            "__keyspace@0__:q del",
        ])
    );
}

/// Waits until `key` has expired (a hang guard bounds the wait; no timing is asserted).
fn wait_expired(con: &mut redis::Connection, key: &str) {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while query::<i64>(con, &["PTTL", key]) != -2 {
        assert!(std::time::Instant::now() < give_up, "{key} never expired");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_write_over_an_expired_key_notifies_it_expired_once() {
    // The sweeper off: only the writes remove expired keys here.
    let server = start_notifying("Exng$l", false);
    let mut con = connect(&server);
    for key in ["a", "b", "c", "l"] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("v")
            .arg("PX")
            .arg(1)
            .query(&mut con)
            .unwrap();
    }
    for key in ["a", "b", "c", "l"] {
        wait_expired(&mut con, key);
    }
    // A read hides an expired key without deleting it: no event.
    let events = events_of(
        &server,
        &[
            &["GET", "a"],
            &["EXISTS", "b"],
            &["SET", "a", "w"],
            &["DEL", "b"],
            &["DEL", "b"],
            &["APPEND", "c", "x"],
            &["RPUSH", "l", "x"],
        ],
    );
    assert_eq!(
        events,
        strings(&[
            "__keyevent@0__:expired a",
            "__keyevent@0__:new a",
            "__keyevent@0__:set a",
            "__keyevent@0__:expired b",
            "__keyevent@0__:expired c",
            "__keyevent@0__:new c",
            "__keyevent@0__:append c",
            "__keyevent@0__:expired l",
            "__keyevent@0__:new l",
            "__keyevent@0__:rpush l",
        ]),
        "each expired key once, before the write's own events; DEL of an expired key \
         deletes nothing a client could see (no del)"
    );
}

#[test]
fn the_sweeper_notifies_each_key_it_expires() {
    let server = start_notifying("KEx", true);
    let mut sub = Wire::connect(&server);
    subscriber(&mut sub);
    let mut con = connect(&server);
    let _: () = query(&mut con, &["SELECT", "3"]);
    let _: () = redis::cmd("SET")
        .arg("gone")
        .arg("v")
        .arg("PX")
        .arg(1)
        .query(&mut con)
        .unwrap();
    // Nobody touches the key: only the sweeper can delete it.
    assert_eq!(
        sub.read().words(),
        words(&["pmessage", "*", "__keyspace@3__:gone", "expired"])
    );
    assert_eq!(
        sub.read().words(),
        words(&["pmessage", "*", "__keyevent@3__:expired", "gone"])
    );
    let _: i64 = query(&mut con, &["PUBLISH", "marker", "end"]);
    assert_eq!(
        sub.read().words(),
        words(&["pmessage", "*", "marker", "end"]),
        "one event per kind, not two"
    );
}

/// Every write command tucana has, with the cases that change which events Redis
/// raises (a key created, emptied, unchanged, replaced; a rotation; an empty `*STORE`).
const EVENTS_SCRIPT: &str = "
SET s1 v
SET s1 w
SET s2 v EX 100
SET s1 v XX GET
SET s6 v NX
SET s6 v NX
SETEX s3 100 v
PSETEX s4 100000 v
SETNX s5 v
SETNX s5 v
GETSET s5 x
GETSET s7 x
MSET m1 a m2 b m1 c
MSETNX m3 a m4 b
MSETNX m3 a m9 b
APPEND s1 xyz
APPEND newapp abc
INCR counter
DECR counter
INCRBY counter 5
DECRBY counter 2
INCRBYFLOAT flt 1.5
SETRANGE s1 1 QQ
SETRANGE newrange 2 ab
SETRANGE s1 1 \"\"
SETBIT bits 7 1
SETBIT bits 7 1
GETEX s1 EX 100
GETEX s1 PERSIST
GETEX s1 PERSIST
GETEX s1
GETDEL s5
GETDEL s5
EXPIRE s1 100
PEXPIRE s1 100000
EXPIREAT s1 4102444800
EXPIRE s1 100 NX
EXPIRE nokey 100
PERSIST s1
PERSIST s1
EXPIRE s2 0
PEXPIREAT s3 1
SET s8 v EXAT 1
GETEX s4 PXAT 1
DEL s1 nokey m1
UNLINK m2
RENAME m3 m3renamed
SET dst x
RENAME m4 dst
RENAMENX m3renamed dst
RENAMENX m3renamed dst2
COPY dst dstcopy
COPY dst dstcopy
COPY dst dstcopy REPLACE
RPUSH l a b c
LPUSH l z
LPUSHX l y
RPUSHX nolist y
LPOP l
RPOP l
LPOP l 1
LPOP nolist
LSET l 0 Q
LINSERT l BEFORE Q P
LINSERT l BEFORE nothere P
LREM l 1 P
LREM l 1 nothere
LTRIM l 0 0
RPUSH l2 1 2 3 4
LMOVE l2 l3 LEFT RIGHT
RPOPLPUSH l2 l3
LMOVE l3 l3 LEFT RIGHT
LMOVE l2 l2 RIGHT LEFT
LMOVE l2 l3 LEFT LEFT
LTRIM l 1 0
LMPOP 2 nolist l3 LEFT COUNT 5
RPUSH l4 a
BLPOP l4 0
RPUSH l5 a b
BRPOP l5 0
BLMOVE l5 l6 LEFT LEFT 0
SADD set a b c
SADD set a
SREM set a
SREM set nothere
SMOVE set set2 b
SMOVE set set2 c
SMOVE set2 set2 c
SADD set3 x y b
SMOVE set3 set2 b
SINTERSTORE dsti set2 nokey
SUNIONSTORE dstu set2 set3
SINTERSTORE dstu set2 set3
SUNIONSTORE dstu set2 set3
SDIFFSTORE dstu set3 set3
sort SPOP set3 5
SPOP set3
HSET h f1 v1 f2 v2
HSET h f1 v1
HMSET h f1 x
HSETNX h f1 y
HSETNX h f3 y
HINCRBY h n 5
HINCRBYFLOAT h fl 1.5
HDEL h f1 nothere
HDEL h nothere
HDEL h f2 f3 n fl
ZADD z 1 a 2 b
ZADD z 1 a
ZADD z XX 1 new
ZADD z INCR 5 a
ZADD z CH 9 a 9 b
ZINCRBY z 1 b
ZINCRBY z 0 b
ZINCRBY znew 1 b
ZREM z nothere
ZREM z a
ZADD z 1 c 2 d 3 e 4 f
ZREMRANGEBYSCORE z 1 1
ZREMRANGEBYSCORE z 100 200
ZREMRANGEBYRANK z 0 0
ZADD zl 0 a 0 b 0 c
ZREMRANGEBYLEX zl [a [b
ZPOPMIN z
ZPOPMAX z
ZPOPMAX z 10
ZPOPMIN nokey
ZADD za 1 a 2 b
ZADD zb 1 b
ZUNIONSTORE zu 2 za zb
ZINTERSTORE zi 2 za zb
ZDIFFSTORE zd 2 za za
ZDIFFSTORE zu 2 za za
ZRANGESTORE zr za 0 -1
ZMPOP 1 za MIN
BZPOPMIN zr 0
BZPOPMAX zr 0
ZADD zc 1 a
BZMPOP 0 1 zc MAX
RPUSH sl 3 1 2
SORT sl STORE sorted
SORT nolist STORE sorted
SORT nolist STORE sorted
MULTI
SET t1 a
LPUSH t2 x
DEL t1
EXEC
SELECT 2
SET indb2 v
DEL indb2
SELECT 0
FLUSHDB
";

/// Runs [`EVENTS_SCRIPT`] against redis-server and tucana with every notification on
/// (`KEA` and `n`), replies compared as the differential tests compare them; returns
/// both servers' events.
fn script_events() -> Option<(Vec<String>, Vec<String>)> {
    let (_redis, port) = common::start_redis_server()?;
    let server = common::start_tucana_for_comparison();
    let redis_addr = format!("127.0.0.1:{port}");
    // `Raw::connect` waits for redis-server to listen.
    let mut theirs = Raw::connect(&redis_addr);
    let mut ours = Raw::connect(&server.addr.to_string());
    let mut their_sub = Wire::connect_to(&redis_addr);
    let mut our_sub = Wire::connect(&server);
    subscriber(&mut their_sub);
    subscriber(&mut our_sub);
    let mut differences = Vec::new();
    for line in ["CONFIG SET notify-keyspace-events KEAn"]
        .into_iter()
        .chain(EVENTS_SCRIPT.lines().filter(|l| !l.trim().is_empty()))
    {
        let line = line.replace("\"\"", "");
        // An empty argument (`""`) is spelled out: whitespace splitting would drop it.
        let diff = if line.ends_with(' ') {
            let mut args: Vec<Vec<u8>> = line.split_whitespace().map(|w| w.into()).collect();
            args.push(Vec::new());
            (theirs.call(&args).0 != ours.call(&args).0).then(|| line.clone())
        } else {
            common::compare(&mut theirs, &mut ours, &line)
        };
        differences.extend(diff);
    }
    assert!(
        differences.is_empty(),
        "replies differ:\n{}",
        differences.join("\n")
    );
    let marker = vec![b"PUBLISH".to_vec(), b"marker".to_vec(), b"end".to_vec()];
    let theirs_events = events_until_marker(&mut their_sub, || {
        theirs.call(&marker);
    });
    let ours_events = events_until_marker(&mut our_sub, || {
        ours.call(&marker);
    });
    server.stop().unwrap();
    Some((theirs_events, ours_events))
}

#[test]
fn every_write_command_raises_redis_s_events() {
    let Some((theirs, ours)) = script_events() else {
        return;
    };
    assert!(
        theirs.len() > 200,
        "the script raises events: {}",
        theirs.len()
    );
    let first_difference = theirs
        .iter()
        .zip(&ours)
        .position(|(a, b)| a != b)
        .unwrap_or(theirs.len().min(ours.len()));
    let around = |events: &[String]| {
        events[first_difference.saturating_sub(4)..(first_difference + 6).min(events.len())]
            .join("\n    ")
    };
    assert!(
        theirs == ours,
        "events differ from #{first_difference} ({} vs {} events)\n  redis-server:\n    {}\n  tucana:\n    {}",
        theirs.len(),
        ours.len(),
        around(&theirs),
        around(&ours)
    );
}

/// Read commands over missing, present and expired keys of every type, for the `m`
/// (keymiss) class: Redis raises `keymiss` for each key a read command looks up and
/// does not find (a missing field or member of a present key is not a key miss).
const KEYMISS_SCRIPT: &str = "
SET s v
HSET h f v
RPUSH l a
SADD st a
ZADD z 1 a
SET gone v PX 1
GET missing
GET s
MGET s missing1 missing2 s
STRLEN missing
GETRANGE missing 0 1
EXISTS missing s
TYPE missing
TTL missing
PTTL s
HGET h nofield
HGET missing f
HGETALL missing
HLEN missing
LRANGE missing 0 -1
LLEN l
LINDEX missing 0
SMEMBERS missing
SISMEMBER st nomember
SCARD missing
ZSCORE z nomember
ZRANGE missing 0 -1
ZCARD missing
GET gone
";

/// The `m` class (keymiss), which no test covered and tucana did not raise: the events
/// of [`KEYMISS_SCRIPT`] with `Em` on, against redis-server's.
#[test]
fn read_commands_raise_keymiss_as_redis_server() {
    let Some((_redis, port)) = common::start_redis_server() else {
        return;
    };
    let server = common::start_tucana_for_comparison();
    let redis_addr = format!("127.0.0.1:{port}");
    let mut theirs = Raw::connect(&redis_addr);
    let mut ours = Raw::connect(&server.addr.to_string());
    let mut their_sub = Wire::connect_to(&redis_addr);
    let mut our_sub = Wire::connect(&server);
    subscriber(&mut their_sub);
    subscriber(&mut our_sub);
    let call = |raw: &mut Raw, line: &str| {
        let args: Vec<Vec<u8>> = line.split_whitespace().map(|w| w.into()).collect();
        raw.call(&args);
    };
    for line in KEYMISS_SCRIPT.lines().filter(|l| !l.trim().is_empty()) {
        call(&mut theirs, line);
        call(&mut ours, line);
        if line.starts_with("SET gone") {
            // Past its deadline before anything reads it; then the events start.
            std::thread::sleep(std::time::Duration::from_millis(20));
            call(&mut theirs, "CONFIG SET notify-keyspace-events Em");
            call(&mut ours, "CONFIG SET notify-keyspace-events Em");
        }
    }
    let marker = |raw: &mut Raw| call(raw, "PUBLISH marker end");
    let theirs_events = events_until_marker(&mut their_sub, || marker(&mut theirs));
    let ours_events = events_until_marker(&mut our_sub, || marker(&mut ours));
    server.stop().unwrap();
    assert!(
        theirs_events.len() >= 15,
        "the script raises keymiss events: {theirs_events:?}"
    );
    assert_eq!(ours_events, theirs_events);
}

/// The `m` class is off in `A` (as in Redis): `KEA` raises no keymiss.
#[test]
fn keymiss_is_not_in_class_a() {
    let server = start_notifying("KEA", true);
    let events = events_of(&server, &[&["GET", "missing"], &["SET", "k", "v"]]);
    assert_eq!(
        events,
        strings(&["__keyspace@0__:k set", "__keyevent@0__:set k",])
    );
    let server = start_notifying("Km", true);
    let events = events_of(&server, &[&["GET", "missing"], &["MGET", "a", "missing"]]);
    assert_eq!(
        events,
        strings(&[
            "__keyspace@0__:missing keymiss",
            "__keyspace@0__:a keymiss",
            "__keyspace@0__:missing keymiss",
        ])
    );
}
