//! Pub/Sub through the `redis` crate and over raw RESP: channels and patterns, the
//! counts PUBLISH returns, the unsubscribe-all replies, RESP3 push frames, what a
//! subscribed RESP2 connection may run, RESET, message order around an unsubscribe,
//! PUBSUB's introspection, and a subscriber that stops reading being disconnected past
//! its output limit while PUBLISH keeps answering. Plus a differential script against
//! redis-server (skipped where it is not installed).

use std::time::{Duration, Instant};

use tucana::Database;
use tucana_server::{spawn, ServerConfig};

mod client;
mod common;
mod wire;
use client::{connect, query, start};
use wire::{words, Frame, Wire};

fn publish(con: &mut redis::Connection, channel: &str, message: &str) -> i64 {
    query(con, &["PUBLISH", channel, message])
}

#[test]
fn channels_and_patterns_through_the_redis_crate() {
    let server = start();
    let mut publisher = connect(&server);
    let mut sub_con = connect(&server);
    let mut sub = sub_con.as_pubsub();
    sub.subscribe("news").unwrap();
    sub.psubscribe("news.*").unwrap();

    assert_eq!(publish(&mut publisher, "news", "first"), 1);
    assert_eq!(publish(&mut publisher, "news.sport", "second"), 1);
    assert_eq!(publish(&mut publisher, "weather", "nobody"), 0);

    let msg = sub.get_message().unwrap();
    assert_eq!(msg.get_channel_name(), "news");
    assert_eq!(msg.get_payload::<String>().unwrap(), "first");
    assert!(!msg.from_pattern());
    let msg = sub.get_message().unwrap();
    assert_eq!(msg.get_channel_name(), "news.sport");
    assert_eq!(msg.get_pattern::<String>().unwrap(), "news.*");
    assert_eq!(msg.get_payload::<String>().unwrap(), "second");

    sub.unsubscribe("news").unwrap();
    sub.punsubscribe("news.*").unwrap();
    assert_eq!(publish(&mut publisher, "news", "late"), 0);
    assert_eq!(publish(&mut publisher, "news.sport", "late"), 0);
}

#[test]
fn publish_counts_every_subscription_it_reached() {
    let server = start();
    let mut a = Wire::connect(&server);
    let mut b = Wire::connect(&server);
    let mut c = Wire::connect(&server);
    assert_eq!(
        a.call(&["SUBSCRIBE", "k"]).words(),
        words(&["subscribe", "k", "1"])
    );
    assert_eq!(
        b.call(&["SUBSCRIBE", "k"]).words(),
        words(&["subscribe", "k", "1"])
    );
    // Subscribed to the channel and to a pattern matching it: two deliveries.
    assert_eq!(
        c.call(&["SUBSCRIBE", "k"]).words(),
        words(&["subscribe", "k", "1"])
    );
    assert_eq!(
        c.call(&["PSUBSCRIBE", "?"]).words(),
        words(&["psubscribe", "?", "2"])
    );
    let mut publisher = connect(&server);
    assert_eq!(publish(&mut publisher, "k", "v"), 4);
    assert_eq!(publish(&mut publisher, "x", "v"), 1, "only the pattern");
    assert_eq!(publish(&mut publisher, "kk", "v"), 0);
    assert_eq!(a.read().words(), words(&["message", "k", "v"]));
    assert_eq!(b.read().words(), words(&["message", "k", "v"]));
    let mut got = vec![c.read().words(), c.read().words(), c.read().words()];
    got.sort();
    assert_eq!(
        got,
        vec![
            words(&["message", "k", "v"]),
            words(&["pmessage", "?", "k", "v"]),
            words(&["pmessage", "?", "x", "v"]),
        ]
    );
    // Subscribing twice to one channel is one subscription.
    assert_eq!(
        a.call(&["SUBSCRIBE", "k"]).words(),
        words(&["subscribe", "k", "1"])
    );
    assert_eq!(publish(&mut publisher, "k", "w"), 4);
}

#[test]
fn unsubscribe_without_arguments_answers_one_frame_per_subscription_then_a_null() {
    let server = start();
    let mut wire = Wire::connect(&server);
    wire.send(&["SUBSCRIBE", "c", "a", "b"]);
    for (i, name) in ["c", "a", "b"].iter().enumerate() {
        let count = (i + 1).to_string();
        assert_eq!(wire.read().words(), words(&["subscribe", name, &count]));
    }
    assert_eq!(
        wire.call(&["PSUBSCRIBE", "p*"]).words(),
        words(&["psubscribe", "p*", "4"])
    );
    wire.send(&["UNSUBSCRIBE"]);
    let mut names = Vec::new();
    for left in ["3", "2", "1"] {
        let frame = wire.read().words();
        assert_eq!(
            (frame[0].as_str(), frame[2].as_str()),
            ("unsubscribe", left)
        );
        names.push(frame[1].clone());
    }
    names.sort();
    assert_eq!(names, words(&["a", "b", "c"]));
    // No channel left: a null name and the count (the pattern still counts).
    assert_eq!(
        wire.call(&["UNSUBSCRIBE"]).words(),
        words(&["unsubscribe", "nil", "1"])
    );
    assert_eq!(
        wire.call(&["PUNSUBSCRIBE"]).words(),
        words(&["punsubscribe", "p*", "0"])
    );
    assert_eq!(
        wire.call(&["PUNSUBSCRIBE"]).words(),
        words(&["punsubscribe", "nil", "0"])
    );
    // Unsubscribed from everything: the connection runs any command again.
    assert_eq!(wire.call(&["SET", "k", "v"]), Frame::Simple("OK".into()));
    // Names never subscribed to answer with the count.
    wire.send(&["UNSUBSCRIBE", "x", "y"]);
    assert_eq!(wire.read().words(), words(&["unsubscribe", "x", "0"]));
    assert_eq!(wire.read().words(), words(&["unsubscribe", "y", "0"]));
}

#[test]
fn resp3_subscriptions_and_messages_are_push_frames_and_any_command_runs() {
    let server = start();
    let mut wire = Wire::connect(&server);
    assert_eq!(wire.call(&["HELLO", "3"]).kind(), '%');
    let frame = wire.call(&["SUBSCRIBE", "c"]);
    assert_eq!(frame.kind(), '>');
    assert_eq!(frame.words(), words(&["subscribe", "c", "1"]));
    // RESP3 has no restricted context: ordinary commands answer ordinarily.
    assert_eq!(wire.call(&["SET", "k", "v"]), Frame::Simple("OK".into()));
    assert_eq!(wire.call(&["GET", "k"]), Frame::Simple("v".into()));
    assert_eq!(wire.call(&["PING"]), Frame::Simple("PONG".into()));
    let mut publisher = connect(&server);
    assert_eq!(publish(&mut publisher, "c", "hello"), 1);
    let message = wire.read();
    assert_eq!(message.kind(), '>');
    assert_eq!(message.words(), words(&["message", "c", "hello"]));
    let frame = wire.call(&["UNSUBSCRIBE"]);
    assert_eq!(frame.kind(), '>');
    assert_eq!(frame.words(), words(&["unsubscribe", "c", "0"]));
    // RESP3 nulls in the no-subscription reply.
    assert_eq!(
        wire.call(&["UNSUBSCRIBE"]).words(),
        words(&["unsubscribe", "nil", "0"])
    );
}

#[test]
fn a_subscribed_resp2_connection_runs_only_pubsub_ping_quit_and_reset() {
    let server = start();
    let mut wire = Wire::connect(&server);
    wire.call(&["SUBSCRIBE", "c"]);
    for command in [
        &["GET", "k"][..],
        &["MULTI"],
        &["HELLO", "3"],
        &["PUBLISH", "c", "x"],
    ] {
        let name = command[0].to_ascii_lowercase();
        assert_eq!(
            wire.call(command),
            Frame::Error(format!(
                "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
            ))
        );
    }
    assert_eq!(
        wire.call(&["CLIENT", "ID"]),
        Frame::Error("ERR Can't execute 'client|id': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context".into())
    );
    // PING answers as a message would.
    assert_eq!(wire.call(&["PING"]).words(), words(&["pong", ""]));
    assert_eq!(wire.call(&["PING", "hi"]).words(), words(&["pong", "hi"]));
    // RESET leaves every subscription without an unsubscribe frame.
    assert_eq!(wire.call(&["RESET"]), Frame::Simple("RESET".into()));
    let mut other = connect(&server);
    let numsub: Vec<redis::Value> = query(&mut other, &["PUBSUB", "NUMSUB", "c"]);
    assert_eq!(numsub[1], redis::Value::Int(0));
    assert_eq!(publish(&mut other, "c", "x"), 0);
    assert_eq!(wire.call(&["GET", "k"]), Frame::Simple("nil".into()));
    assert_eq!(wire.call(&["PING"]), Frame::Simple("PONG".into()));
}

/// Messages published to a subscriber before it unsubscribes reach it before the
/// unsubscribe reply, and none after. The subscriber reads nothing while they are
/// published, so they wait in its queue, behind a write to its full socket, when its
/// UNSUBSCRIBE arrives.
#[test]
fn messages_published_before_an_unsubscribe_come_before_its_reply() {
    let server = start();
    let mut publisher = connect(&server);
    let _: () = query(
        &mut publisher,
        &[
            "CONFIG",
            "SET",
            "client-output-buffer-limit",
            "pubsub 256mb 0 0",
        ],
    );
    let mut wire = Wire::connect(&server);
    wire.send(&["SUBSCRIBE", "c", "d"]);
    assert_eq!(wire.read().words(), words(&["subscribe", "c", "1"]));
    assert_eq!(wire.read().words(), words(&["subscribe", "d", "2"]));
    let padding = "x".repeat(64 << 10);
    let count = 400; // 25 MiB: more than loopback sockets buffer
    for i in 0..count {
        assert_eq!(publish(&mut publisher, "c", &format!("{i} {padding}")), 1);
    }
    wire.send(&["UNSUBSCRIBE", "c"]);
    for i in 0..count {
        let got = wire.read().words();
        assert_eq!(got[..2], words(&["message", "c"])[..], "message {i}");
        assert_eq!(got[2], format!("{i} {padding}"), "message {i}");
    }
    assert_eq!(wire.read().words(), words(&["unsubscribe", "c", "1"]));
    assert_eq!(publish(&mut publisher, "c", "late"), 0);
    assert_eq!(publish(&mut publisher, "d", "on time"), 1);
    assert_eq!(wire.read().words(), words(&["message", "d", "on time"]));
    // The last one goes the same way (the subscription is dropped with it).
    assert_eq!(publish(&mut publisher, "d", "before"), 1);
    assert_eq!(
        wire.call(&["UNSUBSCRIBE"]).words(),
        words(&["message", "d", "before"])
    );
    assert_eq!(wire.read().words(), words(&["unsubscribe", "d", "0"]));
    assert_eq!(wire.call(&["PING"]), Frame::Simple("PONG".into()));
}

#[test]
fn pubsub_channels_numsub_and_numpat() {
    let server = start();
    let mut a = Wire::connect(&server);
    let mut b = Wire::connect(&server);
    a.send(&["SUBSCRIBE", "news.1", "news.2", "sport"]);
    for _ in 0..3 {
        a.read();
    }
    b.call(&["SUBSCRIBE", "news.1"]);
    a.call(&["PSUBSCRIBE", "n*"]);
    b.call(&["PSUBSCRIBE", "n*"]);
    b.call(&["PSUBSCRIBE", "s*"]);
    let mut con = connect(&server);
    let channels: Vec<String> = query(&mut con, &["PUBSUB", "CHANNELS"]);
    assert_eq!(channels, words(&["news.1", "news.2", "sport"]));
    let channels: Vec<String> = query(&mut con, &["PUBSUB", "CHANNELS", "news.*"]);
    assert_eq!(channels, words(&["news.1", "news.2"]));
    let numsub: Vec<redis::Value> =
        query(&mut con, &["PUBSUB", "NUMSUB", "news.1", "sport", "none"]);
    assert_eq!(
        numsub,
        vec![
            redis::Value::BulkString(b"news.1".to_vec()),
            redis::Value::Int(2),
            redis::Value::BulkString(b"sport".to_vec()),
            redis::Value::Int(1),
            redis::Value::BulkString(b"none".to_vec()),
            redis::Value::Int(0),
        ]
    );
    let numpat: i64 = query(&mut con, &["PUBSUB", "NUMPAT"]);
    assert_eq!(numpat, 2, "distinct patterns");
    // A connection that closes leaves its channels.
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let channels: Vec<String> = query(&mut con, &["PUBSUB", "CHANNELS"]);
        if channels == words(&["news.1"]) {
            break;
        }
        assert!(Instant::now() < deadline, "still listed: {channels:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let numsub: Vec<redis::Value> = query(&mut con, &["PUBSUB", "NUMSUB", "news.1"]);
    assert_eq!(numsub[1], redis::Value::Int(1));
}

/// A subscriber that stops reading: its queue grows until it passes the output limit,
/// then it is dropped (its queue freed) and its connection closed, while PUBLISH keeps
/// answering throughout and the other subscriber gets every message.
#[test]
fn a_subscriber_that_stops_reading_is_disconnected_past_its_limit() {
    let db = Database::builder().open_in_memory().unwrap();
    let server = spawn(
        db,
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let mut publisher = connect(&server);
    let _: () = query(
        &mut publisher,
        &[
            "CONFIG",
            "SET",
            "client-output-buffer-limit",
            "pubsub 1mb 0 0",
        ],
    );
    let mut slow = Wire::connect(&server);
    slow.call(&["SUBSCRIBE", "c"]);
    let mut reader = connect(&server);
    let mut reading = reader.as_pubsub();
    reading.subscribe("c").unwrap();
    let message = "x".repeat(64 << 10);
    // Far more than the socket buffers and the limit can hold (256 MiB).
    let mut counts = Vec::new();
    for _ in 0..4096 {
        let n = publish(&mut publisher, "c", &message);
        counts.push(n);
        // The reading subscriber keeps up.
        let got = reading.get_message().unwrap();
        assert_eq!(got.get_payload::<String>().unwrap().len(), message.len());
        if n == 1 {
            break;
        }
    }
    assert_eq!(
        counts.last(),
        Some(&1),
        "the slow subscriber is never dropped"
    );
    assert!(counts[..counts.len() - 1].iter().all(|&n| n == 2));
    // The slow connection ends: what was written before the drop, then end of stream.
    slow.read_to_end();
    let info: String = query(&mut publisher, &["INFO", "stats"]);
    assert!(
        info.contains("client_output_buffer_limit_disconnections:1\r\n"),
        "{info}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let numsub: Vec<redis::Value> = query(&mut publisher, &["PUBSUB", "NUMSUB", "c"]);
        if numsub[1] == redis::Value::Int(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped subscriber is still listed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CLIENT REPLY OFF withholds replies, not Pub/Sub's push frames (RESP3).
#[test]
fn client_reply_off_still_gets_push_frames() {
    let server = start();
    let mut wire = Wire::connect(&server);
    wire.call(&["HELLO", "3"]);
    wire.send(&["CLIENT", "REPLY", "OFF"]);
    wire.send(&["SET", "k", "v"]);
    assert_eq!(
        wire.call(&["SUBSCRIBE", "c"]).words(),
        words(&["subscribe", "c", "1"])
    );
    let mut publisher = connect(&server);
    assert_eq!(publish(&mut publisher, "c", "m"), 1);
    assert_eq!(wire.read().words(), words(&["message", "c", "m"]));
    wire.send(&["CLIENT", "REPLY", "SKIP"]);
    assert_eq!(
        wire.call(&["CLIENT", "REPLY", "ON"]),
        Frame::Simple("OK".into())
    );
    assert_eq!(wire.call(&["GET", "k"]), Frame::Simple("v".into()));
    wire.send(&["CLIENT", "REPLY", "SKIP"]);
    wire.send(&["GET", "k"]);
    assert_eq!(wire.call(&["ECHO", "after"]), Frame::Simple("after".into()));
}

/// A message a connection publishes to itself comes before PUBLISH's reply (as in
/// Redis 7.0); inside MULTI, after EXEC's reply (Redis 7.0 puts it inside the array).
#[test]
fn messages_to_itself_come_before_publish_s_reply_and_after_exec_s() {
    let server = start();
    let mut wire = Wire::connect(&server);
    wire.call(&["HELLO", "3"]);
    wire.call(&["SUBSCRIBE", "c"]);
    let message = wire.call(&["PUBLISH", "c", "x"]);
    assert_eq!(
        (message.kind(), message.words()),
        ('>', words(&["message", "c", "x"]))
    );
    assert_eq!(wire.read(), Frame::Simple("1".into()));
    wire.call(&["MULTI"]);
    wire.call(&["PUBLISH", "c", "y"]);
    wire.call(&["PING", "z"]);
    assert_eq!(wire.call(&["EXEC"]).words(), words(&["1", "z"]));
    assert_eq!(wire.read().words(), words(&["message", "c", "y"]));
    // Unsubscribed inside EXEC: the last messages still come, after EXEC's reply.
    wire.call(&["MULTI"]);
    wire.call(&["PUBLISH", "c", "last"]);
    wire.call(&["UNSUBSCRIBE", "c"]);
    let exec = wire.call(&["EXEC"]);
    let Frame::Aggregate('*', items) = exec else {
        panic!("EXEC answered {exec:?}");
    };
    assert_eq!(items[0], Frame::Simple("1".into()));
    assert_eq!(items[1].words(), words(&["unsubscribe", "c", "0"]));
    assert_eq!(wire.read().words(), words(&["message", "c", "last"]));
    assert_eq!(wire.call(&["PING"]), Frame::Simple("PONG".into()));
}

/// A subscribed RESP3 connection blocked in BLPOP gets its messages while it waits,
/// then BLPOP's reply.
#[test]
fn a_blocked_resp3_subscriber_gets_its_messages_while_it_waits() {
    let server = start();
    let mut wire = Wire::connect(&server);
    wire.call(&["HELLO", "3"]);
    wire.call(&["SUBSCRIBE", "c"]);
    wire.send(&["BLPOP", "list", "0"]);
    let mut other = connect(&server);
    // The BLPOP is waiting once INFO counts it (a hang guard bounds the wait).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !query::<String>(&mut other, &["INFO", "clients"]).contains("blocked_clients:1\r\n") {
        assert!(Instant::now() < deadline, "BLPOP never blocked");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(publish(&mut other, "c", "while blocked"), 1);
    assert_eq!(
        wire.read().words(),
        words(&["message", "c", "while blocked"])
    );
    let _: i64 = query(&mut other, &["LPUSH", "list", "x"]);
    assert_eq!(wire.read().words(), words(&["list", "x"]));
}

/// One connection's Pub/Sub session in RESP2, reply for reply against redis-server
/// (each line answers exactly one frame).
const PUBSUB: &str = "
PUBSUB NUMPAT
PUBSUB NUMSUB a b
PUBSUB CHANNELS
PUBSUB CHANNELS x y
PUBSUB NUMPAT x
PUBSUB FOO
PUBLISH a nobody
UNSUBSCRIBE
PUNSUBSCRIBE
UNSUBSCRIBE a
SUBSCRIBE a
SUBSCRIBE a
GET k
SET k v
CLIENT ID
PUBSUB NUMSUB a
PING
PING hello
PING a b
PSUBSCRIBE a*
PSUBSCRIBE b[x-z]
UNSUBSCRIBE a
PUNSUBSCRIBE a*
PUNSUBSCRIBE nope
PUNSUBSCRIBE
PING
PUBSUB NUMSUB a
SUBSCRIBE c
RESET
PUBSUB NUMSUB c
PING
CLIENT REPLY ON
MULTI
SUBSCRIBE a
UNSUBSCRIBE a
EXEC
GET k
MULTI
SUBSCRIBE a
EXEC
GET k
PUBSUB NUMSUB a
RESET
";

#[test]
fn pubsub_replies_match_redis_server() {
    common::assert_same_replies(PUBSUB);
}
