//! The collection types through a real Redis client: hashes and sorted sets against an
//! in-memory model over thousands of random commands (some inside MULTI), transactions
//! that read their own collection writes, WATCH on collection writes, expiry of a
//! collection, collections across a restart, the collector of old versions, and the
//! values the string commands refuse. Where time matters, the test waits for a state
//! (never times it).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use redis::{Commands, Connection, RedisResult, Value};
use tucana::Database;
use tucana_server::RunningServer;

mod client;
use client::{connect, query, start_on};

fn start() -> (Database, RunningServer) {
    let db = Database::builder().open_in_memory().unwrap();
    let server = start_on(&db);
    (db, server)
}

/// Waits (up to a minute) until `done` holds; the wait is not measured.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < give_up, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A deterministic pseudo-random sequence (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

#[derive(Default)]
struct Model {
    hashes: HashMap<String, BTreeMap<String, String>>,
    zsets: HashMap<String, BTreeMap<String, i64>>,
}

impl Model {
    /// Members of a sorted set in Redis's order: by score, then by member.
    fn zsorted(&self, key: &str) -> Vec<(String, i64)> {
        let mut items: Vec<(String, i64)> = self
            .zsets
            .get(key)
            .map(|z| z.iter().map(|(m, s)| (m.clone(), *s)).collect())
            .unwrap_or_default();
        items.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
        items
    }

    fn exists(&self, key: &str) -> bool {
        self.hashes.contains_key(key) || self.zsets.contains_key(key)
    }
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

fn flat(items: &[(String, i64)], with_scores: bool) -> Value {
    let mut out = Vec::new();
    for (m, s) in items {
        out.push(bulk(m));
        if with_scores {
            out.push(bulk(&s.to_string()));
        }
    }
    Value::Array(out)
}

/// One random command on the model: the command and the reply the model expects. The
/// model applies the command's effect.
fn step(rng: &mut Rng, model: &mut Model) -> (Vec<String>, Value) {
    let hkeys = ["h1", "h2", "h3"];
    let zkeys = ["z1", "z2", "z3"];
    let fields = ["a", "b", "c", "d", "e", "f"];
    let s = |v: &str| v.to_string();
    match rng.below(16) {
        0 | 1 => {
            let key = rng.pick(&hkeys);
            let mut args = vec![s("HSET"), s(key)];
            let mut added = 0;
            let hash = model.hashes.entry(s(key)).or_default();
            for _ in 0..=rng.below(3) {
                let (f, v) = (rng.pick(&fields), rng.below(100).to_string());
                if hash.insert(s(f), v.clone()).is_none() {
                    added += 1;
                }
                args.extend([s(f), v]);
            }
            (args, Value::Int(added))
        }
        2 => {
            let key = rng.pick(&hkeys);
            let (f1, f2) = (rng.pick(&fields), rng.pick(&fields));
            let mut n = 0;
            if let Some(hash) = model.hashes.get_mut(key) {
                n += hash.remove(f1).is_some() as i64;
                n += hash.remove(f2).is_some() as i64;
                if hash.is_empty() {
                    model.hashes.remove(key);
                }
            }
            (vec![s("HDEL"), s(key), s(f1), s(f2)], Value::Int(n))
        }
        3 => {
            let (key, f) = (rng.pick(&hkeys), rng.pick(&fields));
            let want = model
                .hashes
                .get(key)
                .and_then(|h| h.get(f))
                .map_or(Value::Nil, |v| bulk(v));
            (vec![s("HGET"), s(key), s(f)], want)
        }
        4 => {
            let key = rng.pick(&hkeys);
            let mut items = Vec::new();
            for (f, v) in model.hashes.get(key).into_iter().flatten() {
                items.push(bulk(f));
                items.push(bulk(v));
            }
            // tucana answers in field order, which the model's BTreeMap also has.
            (vec![s("HGETALL"), s(key)], Value::Array(items))
        }
        5 => {
            let (key, f) = (rng.pick(&hkeys), rng.pick(&fields));
            let by = rng.below(7) as i64 - 3;
            let hash = model.hashes.entry(s(key)).or_default();
            let v = hash.get(f).map_or(0, |v| v.parse::<i64>().unwrap()) + by;
            hash.insert(s(f), v.to_string());
            (
                vec![s("HINCRBY"), s(key), s(f), by.to_string()],
                Value::Int(v),
            )
        }
        6 => {
            let key = rng.pick(&hkeys);
            let n = model.hashes.get(key).map_or(0, |h| h.len() as i64);
            (vec![s("HLEN"), s(key)], Value::Int(n))
        }
        7 | 8 => {
            let key = rng.pick(&zkeys);
            let flag = rng.pick(&["", "NX", "XX", "CH"]);
            let mut args = vec![s("ZADD"), s(key)];
            if !flag.is_empty() {
                args.push(s(flag));
            }
            let existed = model.zsets.contains_key(key);
            let z = model.zsets.entry(s(key)).or_default();
            let (mut added, mut changed) = (0, 0);
            for _ in 0..=rng.below(3) {
                let (m, score) = (rng.pick(&fields), rng.below(10) as i64 - 5);
                args.extend([score.to_string(), s(m)]);
                match z.get(m).copied() {
                    None if flag != "XX" => {
                        z.insert(s(m), score);
                        added += 1;
                    }
                    Some(old) if flag != "NX" && old != score => {
                        z.insert(s(m), score);
                        changed += 1;
                    }
                    _ => {}
                }
            }
            if z.is_empty() && !existed {
                model.zsets.remove(key);
            }
            let n = if flag == "CH" { added + changed } else { added };
            (args, Value::Int(n))
        }
        9 => {
            let (key, m) = (rng.pick(&zkeys), rng.pick(&fields));
            let n = model
                .zsets
                .get_mut(key)
                .map_or(0, |z| z.remove(m).is_some() as i64);
            if model.zsets.get(key).is_some_and(|z| z.is_empty()) {
                model.zsets.remove(key);
            }
            (vec![s("ZREM"), s(key), s(m)], Value::Int(n))
        }
        10 => {
            let key = rng.pick(&zkeys);
            let items = model.zsorted(key);
            (
                vec![s("ZRANGE"), s(key), s("0"), s("-1"), s("WITHSCORES")],
                flat(&items, true),
            )
        }
        11 => {
            let key = rng.pick(&zkeys);
            let (lo, hi) = (rng.below(10) as i64 - 5, rng.below(10) as i64 - 5);
            let items: Vec<(String, i64)> = model
                .zsorted(key)
                .into_iter()
                .filter(|(_, s)| *s > lo && *s <= hi)
                .collect();
            (
                vec![s("ZRANGEBYSCORE"), s(key), format!("({lo}"), hi.to_string()],
                flat(&items, false),
            )
        }
        12 => {
            let (key, m) = (rng.pick(&zkeys), rng.pick(&fields));
            let rank = model.zsorted(key).iter().position(|(x, _)| x == m);
            (
                vec![s("ZRANK"), s(key), s(m)],
                rank.map_or(Value::Nil, |r| Value::Int(r as i64)),
            )
        }
        13 => {
            let (key, m) = (rng.pick(&zkeys), rng.pick(&fields));
            let by = rng.below(5) as i64 - 2;
            let z = model.zsets.entry(s(key)).or_default();
            let score = z.get(m).copied().unwrap_or(0) + by;
            z.insert(s(m), score);
            (
                vec![s("ZINCRBY"), s(key), by.to_string(), s(m)],
                bulk(&score.to_string()),
            )
        }
        14 => {
            let key = rng.pick(&zkeys);
            let items: Vec<(String, i64)> = model.zsorted(key).into_iter().take(2).collect();
            if let Some(z) = model.zsets.get_mut(key) {
                for (m, _) in &items {
                    z.remove(m);
                }
                if z.is_empty() {
                    model.zsets.remove(key);
                }
            }
            (vec![s("ZPOPMIN"), s(key), s("2")], flat(&items, true))
        }
        _ => {
            let key = rng.pick(&["h1", "h2", "z1", "z2"]);
            let n = model.exists(key) as i64;
            model.hashes.remove(key);
            model.zsets.remove(key);
            (vec![s("DEL"), s(key)], Value::Int(n))
        }
    }
}

fn send(con: &mut Connection, args: &[String]) -> Value {
    let mut cmd = redis::cmd(&args[0]);
    for a in &args[1..] {
        cmd.arg(a.as_str());
    }
    cmd.query(con).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Hashes and sorted sets follow an in-memory model over random commands on a few keys
/// (so fields come and go, keys empty out and are deleted, DEL and recreation mix
/// versions); every 50th step a run of commands goes through MULTI/EXEC, whose replies
/// must be the model's too. At the end every key is compared whole.
#[test]
fn hashes_and_sorted_sets_follow_a_model() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let mut model = Model::default();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..4000 {
        if i % 50 == 49 {
            let mut pipe = redis::pipe();
            pipe.atomic();
            let mut wants = Vec::new();
            for _ in 0..5 {
                let (args, want) = step(&mut rng, &mut model);
                let mut cmd = redis::cmd(&args[0]);
                for a in &args[1..] {
                    cmd.arg(a.as_str());
                }
                pipe.add_command(cmd);
                wants.push((args, want));
            }
            let got: Vec<Value> = pipe.query(&mut con).unwrap();
            for ((args, want), got) in wants.into_iter().zip(got) {
                assert_eq!(got, want, "in MULTI, step {i}: {args:?}");
            }
            continue;
        }
        let (args, want) = step(&mut rng, &mut model);
        assert_eq!(send(&mut con, &args), want, "step {i}: {args:?}");
    }
    for key in ["h1", "h2", "h3", "z1", "z2", "z3"] {
        let kind: String = query(&mut con, &["TYPE", key]);
        let want = if model.hashes.contains_key(key) {
            "hash"
        } else if model.zsets.contains_key(key) {
            "zset"
        } else {
            "none"
        };
        assert_eq!(kind, want, "{key}");
    }
    let dbsize: i64 = query(&mut con, &["DBSIZE"]);
    assert_eq!(dbsize, (model.hashes.len() + model.zsets.len()) as i64);
    server.stop().unwrap();
}

/// Inside EXEC a command reads the transaction's own writes of a collection, sub-records
/// included (the overlay's range reads), and the whole transaction is one batch.
#[test]
fn transactions_read_their_own_collection_writes() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let _: () = con.hset("h", "old", "1").unwrap();
    let (all, len, range, popped): (Vec<String>, i64, Vec<String>, Vec<String>) = redis::pipe()
        .atomic()
        .hset("h", "new", "2")
        .ignore()
        .hdel("h", "old")
        .ignore()
        .hgetall("h")
        .hlen("h")
        .zadd("z", "b", 2)
        .ignore()
        .zadd("z", "a", 1)
        .ignore()
        .zrange("z", 0, -1)
        .rpush("l", &["x", "y", "z"])
        .ignore()
        .lpop("l", None)
        .ignore()
        .lrange("l", 0, -1)
        .query(&mut con)
        .unwrap();
    assert_eq!(all, vec!["new", "2"]);
    assert_eq!(len, 1);
    assert_eq!(range, vec!["a", "b"]);
    assert_eq!(popped, vec!["y", "z"]);
    server.stop().unwrap();
}

/// WATCH sees writes of collections: a field written by another client aborts EXEC, as
/// do a member added, an element pushed and the deletion of a collection.
#[test]
fn watch_aborts_on_collection_writes() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let mut other = connect(&server);
    let _: () = con.hset("h", "f", "1").unwrap();
    let writes: [&[&str]; 5] = [
        &["HSET", "h", "f", "2"],
        &["HINCRBY", "h", "n", "1"],
        &["ZADD", "h2", "1", "m"],
        &["LPUSH", "h3", "x"],
        &["DEL", "h"],
    ];
    for (i, write) in writes.iter().enumerate() {
        let key = write[1];
        let _: () = redis::cmd("WATCH").arg(key).query(&mut con).unwrap();
        let _: Value = query(&mut other, write);
        let result: Option<(i64,)> = redis::pipe()
            .atomic()
            .cmd("EXISTS")
            .arg(key)
            .query(&mut con)
            .unwrap();
        assert_eq!(result, None, "write {i} {write:?} must abort EXEC");
    }
    // Unwatched keys' writes do not abort.
    let _: () = redis::cmd("WATCH").arg("h2").query(&mut con).unwrap();
    let _: i64 = other.hset("h", "f", "3").unwrap();
    let result: Option<(i64,)> = redis::pipe()
        .atomic()
        .cmd("ZCARD")
        .arg("h2")
        .query(&mut con)
        .unwrap();
    assert_eq!(result, Some((1,)));
    server.stop().unwrap();
}

/// A collection with a deadline is missing once it passed (to reads and writes), and the
/// sweeper then deletes it; a new collection under the key starts empty.
#[test]
fn an_expired_collection_is_missing_and_swept() {
    let (db, server) = start();
    let mut con = connect(&server);
    let _: () = con.hset_multiple("h", &[("a", "1"), ("b", "2")]).unwrap();
    let _: () = con.zadd("z", "m", 1).unwrap();
    let _: bool = con.pexpire("h", 1).unwrap();
    let _: bool = con.pexpire("z", 1).unwrap();
    wait_until("h expires", || {
        query::<i64>(&mut con, &["EXISTS", "h", "z"]) == 0
    });
    assert_eq!(query::<Option<String>>(&mut con, &["HGET", "h", "a"]), None);
    assert_eq!(query::<i64>(&mut con, &["ZCARD", "z"]), 0);
    assert_eq!(query::<i64>(&mut con, &["HSET", "h", "c", "3"]), 1);
    let all: Vec<String> = query(&mut con, &["HGETALL", "h"]);
    assert_eq!(all, vec!["c", "3"], "the old fields are not seen again");
    assert_eq!(query::<i64>(&mut con, &["TTL", "h"]), -1);
    // The sweeper deletes z (key, deadline, index entry) and the collector the records
    // of z's member. Left: the marker and h, a packed hash (its field inside it).
    let ks = db.open_keyspace("default").unwrap();
    wait_until("z and the old records are deleted", || ks.len() == 2);
    assert_eq!(ks.get(b"z").unwrap(), None);
    server.stop().unwrap();
}

/// A big collection's DEL leaves its records to the collector, which deletes them all in
/// the background; a new collection under the same key does not see them meanwhile.
#[test]
fn old_versions_are_collected() {
    let (db, server) = start();
    let mut con = connect(&server);
    let fields: Vec<(String, String)> = (0..1000)
        .map(|i| (format!("f{i}"), i.to_string()))
        .collect();
    let _: () = con.hset_multiple("big", &fields).unwrap();
    let ks = db.open_keyspace("default").unwrap();
    assert!(ks.len() > 1000);
    assert_eq!(query::<i64>(&mut con, &["DEL", "big"]), 1);
    assert_eq!(query::<i64>(&mut con, &["HSET", "big", "new", "1"]), 1);
    assert_eq!(query::<i64>(&mut con, &["HLEN", "big"]), 1);
    let keys: Vec<String> = query(&mut con, &["HKEYS", "big"]);
    assert_eq!(keys, vec!["new"]);
    // A SET over a big sorted set leaves garbage too, without reading it.
    let members: Vec<(i64, String)> = (0..500).map(|i| (i, format!("m{i}"))).collect();
    let _: () = con.zadd_multiple("zbig", &members).unwrap();
    let _: () = con.set("zbig", "now a string").unwrap();
    // Left: the marker, big (now a packed hash: one record), zbig's string.
    wait_until("the collector deletes the old versions", || ks.len() == 3);
    assert_eq!(query::<i64>(&mut con, &["DBSIZE"]), 2);
    server.stop().unwrap();
}

/// An expired big collection that no sweep deleted (active expiry off), written again:
/// the write starts a new version over the expired one without reading its records, and
/// the collector (which had finished its round and rested) must wake and delete them.
#[test]
fn an_expired_collection_written_again_leaves_its_records_to_the_collector() {
    let db = Database::builder().open_in_memory().unwrap();
    let server = client::start_with(
        &db,
        tucana_server::ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            enable_debug_command: true,
            ..tucana_server::ServerConfig::default()
        },
    );
    let mut con = connect(&server);
    query::<()>(&mut con, &["DEBUG", "SET-ACTIVE-EXPIRE", "0"]);
    let members: Vec<(i64, String)> = (0..300).map(|i| (i, format!("m{i}"))).collect();
    let _: () = con.zadd_multiple("z", &members).unwrap();
    let ks = db.open_keyspace("default").unwrap();
    // Each member has two records (by member, by score).
    assert!(ks.len() > 600);
    let _: bool = con.pexpire("z", 1).unwrap();
    wait_until("z expires", || {
        query::<i64>(&mut con, &["EXISTS", "z"]) == 0
    });
    // Rounds of the collector pass over the expired records and keep them: z's metadata
    // still names their version.
    std::thread::sleep(Duration::from_millis(300));
    assert!(ks.len() > 600);
    assert_eq!(query::<i64>(&mut con, &["ZADD", "z", "1", "new"]), 1);
    // Left: the marker, z's metadata and its new member's two records.
    wait_until("the collector deletes the expired version", || {
        ks.len() == 4
    });
    let all: Vec<String> = query(&mut con, &["ZRANGE", "z", "0", "-1"]);
    assert_eq!(all, vec!["new"]);
    server.stop().unwrap();
}

/// Collections written before a restart are all there after it, with their deadlines.
#[test]
fn collections_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.tucana");
    let far_s: i64 = 4_102_444_800; // 2100-01-01
    {
        let db = Database::open(&path).unwrap();
        let server = start_on(&db);
        let mut con = connect(&server);
        let _: () = con.hset_multiple("h", &[("a", "1"), ("b", "2")]).unwrap();
        let _: () = con.zadd_multiple("z", &[(1.5, "x"), (-2.0, "y")]).unwrap();
        let _: () = con.sadd("s", &["p", "q"]).unwrap();
        let _: () = con.rpush("l", &["1", "2", "3"]).unwrap();
        let _: String = con.lpop("l", None).unwrap();
        let _: bool = con.expire_at("h", far_s).unwrap();
        server.stop().unwrap();
        db.close().unwrap();
    }
    let db = Database::open(&path).unwrap();
    let server = start_on(&db);
    let mut con = connect(&server);
    let h: Vec<String> = query(&mut con, &["HGETALL", "h"]);
    assert_eq!(h, vec!["a", "1", "b", "2"]);
    assert_eq!(query::<i64>(&mut con, &["EXPIRETIME", "h"]), far_s);
    let z: Vec<String> = query(&mut con, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]);
    assert_eq!(z, vec!["y", "-2", "x", "1.5"]);
    let s: Vec<String> = query(&mut con, &["SMEMBERS", "s"]);
    assert_eq!(s, vec!["p", "q"]);
    let l: Vec<String> = query(&mut con, &["LRANGE", "l", "0", "-1"]);
    assert_eq!(l, vec!["2", "3"]);
    assert_eq!(query::<i64>(&mut con, &["RPUSH", "l", "4"]), 3);
    assert_eq!(query::<i64>(&mut con, &["DBSIZE"]), 4);
    server.stop().unwrap();
}

/// A string value that starts like a collection's metadata could not be told from one:
/// every string write refuses it, the pipelined SET path included, and a pipelined GET
/// of a collection answers WRONGTYPE.
#[test]
fn reserved_values_are_refused_and_fast_gets_see_types() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let reserved = b"\xff\xfftucana\x00Thello".to_vec();
    for cmd in [
        redis::cmd("SET").arg("k").arg(&reserved[..]).clone(),
        redis::cmd("MSET").arg("k").arg(&reserved[..]).clone(),
        redis::cmd("SETEX")
            .arg("k")
            .arg(10)
            .arg(&reserved[..])
            .clone(),
        redis::cmd("GETSET").arg("k").arg(&reserved[..]).clone(),
    ] {
        let r: RedisResult<Value> = cmd.query(&mut con);
        let e = r.expect_err("refused");
        assert!(e.to_string().contains("reserved"), "{e}");
    }
    let _: () = con.set("k", b"\xff\xfftucana\x00".to_vec()).unwrap();
    let r: RedisResult<i64> = con.append("k", "T");
    assert!(r.is_err(), "APPEND may not make a reserved value");
    let mut pipe = redis::pipe();
    pipe.cmd("SET").arg("a").arg("1");
    pipe.cmd("SET").arg("b").arg(&reserved[..]);
    pipe.cmd("SET").arg("c").arg("3");
    let r: RedisResult<Value> = pipe.query(&mut con);
    assert!(r.is_err(), "the middle SET is refused");
    assert_eq!(con.get::<_, Option<String>>("a").unwrap(), Some("1".into()));
    assert_eq!(con.get::<_, Option<String>>("b").unwrap(), None);
    assert_eq!(con.get::<_, Option<String>>("c").unwrap(), Some("3".into()));
    let _: () = con.hset("h", "f", "v").unwrap();
    let mut pipe = redis::pipe();
    pipe.get("a").get("h").get("c");
    let r: RedisResult<Vec<Option<String>>> = pipe.query(&mut con);
    let e = r.expect_err("a GET of a hash is an error");
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    server.stop().unwrap();
}

/// Records damaged on disk answer errors that say so, never a panic or a wrong answer:
/// a truncated metadata record, and a list whose metadata counts more elements than are
/// stored. DEL still deletes a key whose metadata is damaged, and the server keeps
/// serving.
#[test]
fn damaged_collection_records_answer_errors() {
    let (db, server) = start();
    let mut con = connect(&server);
    let _: () = con.rpush("l", &["a", "b"]).unwrap();
    let _: () = con.set("plain", "1").unwrap();
    let ks = db.open_keyspace("default").unwrap();
    // A hash's metadata cut short.
    ks.put(b"h", b"\xff\xfftucana\x00Th\x00\x01").unwrap();
    // The list's metadata, made to count 3 elements (head one lower) over its 2 records.
    let meta = ks.get(b"l").unwrap().unwrap();
    let mut bad = meta.clone();
    let head_at = bad.len() - 16;
    let head = u64::from_be_bytes(bad[head_at..head_at + 8].try_into().unwrap()) - 1;
    bad[head_at..head_at + 8].copy_from_slice(&head.to_be_bytes());
    let count_at = bad.len() - 24;
    bad[count_at..count_at + 8].copy_from_slice(&3u64.to_be_bytes());
    ks.put(b"l", &bad).unwrap();
    for (args, what) in [
        (&["HGET", "h", "f"][..], "damaged metadata record"),
        (&["HSET", "h", "f", "v"], "damaged metadata record"),
        (&["LPOP", "l"], "damaged list"),
        (&["LMOVE", "l", "l2", "LEFT", "LEFT"], "damaged list"),
    ] {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let r: RedisResult<Value> = cmd.query(&mut con);
        let e = r.expect_err("an error");
        assert!(e.to_string().contains(what), "{args:?}: {e}");
    }
    assert_eq!(query::<i64>(&mut con, &["DEL", "h"]), 1);
    assert_eq!(query::<String>(&mut con, &["GET", "plain"]), "1");
    server.stop().unwrap();
}

/// Random picks from collections too big to read whole (past 512 members they start at
/// random points): distinct when asked, always members, values belonging to their
/// fields, and SPOP until empty pops every member exactly once.
#[test]
fn random_picks_from_big_collections() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let members: Vec<String> = (0..2000).map(|i| format!("member:{i}")).collect();
    let _: () = con.sadd("s", &members).unwrap();
    let fields: Vec<(String, String)> = (0..2000)
        .map(|i| (format!("f{i}"), format!("v{i}")))
        .collect();
    let _: () = con.hset_multiple("h", &fields).unwrap();
    let all: std::collections::HashSet<String> = members.iter().cloned().collect();
    for _ in 0..20 {
        let picked: Vec<String> = query(&mut con, &["SRANDMEMBER", "s", "10"]);
        let distinct: std::collections::HashSet<&String> = picked.iter().collect();
        assert_eq!((picked.len(), distinct.len()), (10, 10), "{picked:?}");
        assert!(picked.iter().all(|m| all.contains(m)));
        let repeated: Vec<String> = query(&mut con, &["SRANDMEMBER", "s", "-15"]);
        assert_eq!(repeated.len(), 15);
        assert!(repeated.iter().all(|m| all.contains(m)));
        let one: String = query(&mut con, &["SRANDMEMBER", "s"]);
        assert!(all.contains(&one));
        let pairs: Vec<String> = query(&mut con, &["HRANDFIELD", "h", "5", "WITHVALUES"]);
        assert_eq!(pairs.len(), 10);
        for pair in pairs.chunks(2) {
            assert_eq!(pair[1], format!("v{}", &pair[0][1..]), "{pair:?}");
        }
    }
    let mut popped = std::collections::HashSet::new();
    while query::<i64>(&mut con, &["SCARD", "s"]) > 0 {
        let batch: Vec<String> = query(&mut con, &["SPOP", "s", "7"]);
        assert!(!batch.is_empty());
        for m in batch {
            assert!(all.contains(&m));
            assert!(popped.insert(m.clone()), "{m} popped twice");
        }
    }
    assert_eq!(popped.len(), 2000);
    assert_eq!(query::<i64>(&mut con, &["EXISTS", "s"]), 0);
    server.stop().unwrap();
}

/// SCAN and KEYS pass a big collection's members in one seek: a full SCAN iteration with
/// COUNT 10 over 20 keys and a 5000-field hash takes a handful of calls (not 500), and
/// still returns every key once, including one that sorts after the reserved family.
#[test]
fn scan_and_keys_skip_collection_members() {
    let (_db, server) = start();
    let mut con = connect(&server);
    let fields: Vec<(String, i64)> = (0..5000).map(|i| (format!("f{i}"), i)).collect();
    let _: () = con.hset_multiple("big", &fields).unwrap();
    let mut want: Vec<Vec<u8>> = (0..18).map(|i| format!("k{i:02}").into_bytes()).collect();
    let after = b"\xff\xffzz".to_vec();
    want.push(after.clone());
    for key in &want {
        let _: () = con.set(key.as_slice(), "v").unwrap();
    }
    want.push(b"big".to_vec());
    want.sort();
    let mut cursor = "0".to_string();
    let (mut got, mut calls) = (Vec::new(), 0);
    loop {
        let (next, keys): (String, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(&cursor)
            .arg("COUNT")
            .arg(10)
            .query(&mut con)
            .unwrap();
        calls += 1;
        got.extend(keys);
        if next == "0" {
            break;
        }
        cursor = next;
    }
    got.sort();
    assert_eq!(got, want);
    assert!(calls <= 4, "{calls} SCAN calls");
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    keys.sort();
    assert_eq!(keys, want);
    server.stop().unwrap();
}
