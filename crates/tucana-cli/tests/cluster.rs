//! End-to-end tests of cluster mode (issue 19): an etcd and three `tucana serve
//! --cluster-etcd` processes, a map made by `tucana cluster create`, and the `redis`
//! crate's Redis Cluster client and plain connections against them.
//!
//! etcd must be installed (`scripts/cluster-deps.sh`; CI runs it): without it the test
//! fails, saying so, rather than pass having proved nothing.
//!
//! Waits for something that should happen (etcd answering, a server learning the map)
//! are bounded so a bug hangs no run, but nothing asserts how long anything took.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use redis::Commands;
use tempfile::TempDir;
use tucana_cluster::testing::TestEtcd;
use tucana_cluster::{key_slot, SLOTS};

use common::{
    assert_all_readable, free_port, run_tucana, slot_ranges, tag_in, urls, wait_until, Server,
    Writer,
};

/// An etcd, three servers registered in it (not yet in a map), and their addresses.
struct Cluster {
    etcd: TestEtcd,
    servers: Vec<Server>,
    addrs: Vec<String>,
    /// Backups per region `create` asks for (each server then listens for replication).
    replicas: usize,
    _dir: TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        Cluster::start_with(0)
    }

    fn start_with(replicas: usize) -> Cluster {
        Cluster::start_with_flags(replicas, &[])
    }

    /// Three servers with `replicas` backups per region to come, each given `flags`.
    fn start_with_flags(replicas: usize, flags: &[&str]) -> Cluster {
        let etcd = TestEtcd::start();
        let dir = tempfile::tempdir().unwrap();
        let servers: Vec<Server> = (0..3)
            .map(|i| {
                let volume = dir.path().join(format!("server{i}/volume.tucana"));
                let repl_port = (replicas > 0).then(free_port);
                let mut server = Server::new(&volume, free_port(), repl_port);
                server.extra_args = flags.iter().map(|f| f.to_string()).collect();
                server.spawn(&etcd);
                server
            })
            .collect();
        let addrs = servers.iter().map(Server::addr).collect();
        Cluster {
            etcd,
            servers,
            addrs,
            replicas,
            _dir: dir,
        }
    }

    /// `tucana cluster create` over the three servers: its stdout, or its stderr if it
    /// failed.
    fn create(&self) -> Result<String, String> {
        let replicas = self.replicas.to_string();
        let mut args = vec![
            "cluster",
            "create",
            "--etcd",
            self.etcd.endpoint(),
            "--name",
            "test",
            "--replicas",
            &replicas,
        ];
        args.extend(self.addrs.iter().map(String::as_str));
        let output = Command::new(env!("CARGO_BIN_EXE_tucana"))
            .args(&args)
            .output()
            .expect("run tucana cluster create");
        if output.status.success() {
            Ok(String::from_utf8(output.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// Waits until every server has the map; the slot ranges they report, which agree.
    fn wait_for_map(&self) -> Vec<(u16, u16, String)> {
        let mut layouts = Vec::new();
        for server in &self.servers {
            let mut con = server.connect();
            layouts.push(wait_until("the map reaching a server", || {
                let ranges = slot_ranges(&mut con);
                (ranges.len() == 3).then_some(ranges)
            }));
        }
        assert!(layouts.iter().all(|l| *l == layouts[0]), "{layouts:?}");
        layouts.swap_remove(0)
    }
}

#[test]
fn three_servers_route_by_the_map_in_etcd() {
    let mut cluster = Cluster::start();
    let addrs = cluster.addrs.clone();

    // Before the map, nothing is served.
    let err = cluster.servers[0]
        .connect()
        .get::<_, Option<String>>("k")
        .unwrap_err();
    assert_eq!(err.code(), Some("CLUSTERDOWN"), "{err}");

    cluster.create().unwrap();
    let refused = cluster.create().unwrap_err();
    assert!(refused.contains("already has a map"), "{refused}");

    // Every server learns the same map: three ranges covering every slot, in order.
    let ranges = &cluster.wait_for_map();
    let etcd = &cluster.etcd;
    let servers = &mut cluster.servers;
    assert_eq!(ranges[0].0, 0);
    assert_eq!(ranges[2].1, SLOTS - 1);
    assert_eq!(ranges[0].1 + 1, ranges[1].0);
    assert_eq!(ranges[1].1 + 1, ranges[2].0);
    let owner = |slot: u16| -> usize {
        let (_, _, addr) = ranges
            .iter()
            .find(|(s, e, _)| (*s..=*e).contains(&slot))
            .unwrap();
        addrs.iter().position(|a| a == addr).unwrap()
    };
    let status = run_tucana(&[
        "cluster",
        "status",
        "--etcd",
        etcd.endpoint(),
        "--name",
        "test",
    ]);
    assert!(status.contains("live servers: 3"), "{status}");

    // The cluster client writes and reads back keys spread over all slots.
    let keys: Vec<String> = (0..3000).map(|i| format!("key:{i}")).collect();
    let client =
        redis::cluster::ClusterClient::new(addrs.iter().map(|a| format!("redis://{a}/"))).unwrap();
    let mut ccon = client.get_connection().unwrap();
    for key in &keys {
        let _: () = ccon.set(key, format!("value of {key}")).unwrap();
    }
    for key in &keys {
        let value: Option<String> = ccon.get(key).unwrap();
        assert_eq!(value, Some(format!("value of {key}")));
    }
    let _: () = ccon.set("{user}:a", 1).unwrap();
    let n: i64 = ccon.incr("{user}:a", 41).unwrap();
    assert_eq!(n, 42);
    let _: () = ccon.del("{user}:a").unwrap();
    // A deadline through the cluster client: stored in its slot, read back, and gone
    // with its key (the listings below see only `keys`).
    let _: () = redis::cmd("SET")
        .arg("{user}:t")
        .arg("v")
        .arg("EX")
        .arg(100_000)
        .query(&mut ccon)
        .unwrap();
    let ttl: i64 = ccon.ttl("{user}:t").unwrap();
    assert!((1..=100_000).contains(&ttl), "{ttl}");
    let persisted: i64 = ccon.persist("{user}:t").unwrap();
    assert_eq!(persisted, 1);
    assert_eq!(ccon.ttl::<_, i64>("{user}:t").unwrap(), -1);
    let _: i64 = ccon.expire("{user}:t", 100_000).unwrap();
    let _: () = ccon.del("{user}:t").unwrap();
    assert_eq!(ccon.ttl::<_, i64>("{user}:t").unwrap(), -2);
    // Collections through the cluster client: their members are stored slot-prefixed
    // in their key's slot (`SlotKv`), read back by ranges, moved between two keys of one
    // slot, and deleted with their key (the listings below see only `keys`).
    let _: () = ccon
        .hset_multiple("{user}:h", &[("name", "ada"), ("year", "1815")])
        .unwrap();
    let h: Vec<String> = ccon.hgetall("{user}:h").unwrap();
    assert_eq!(h, vec!["name", "ada", "year", "1815"]);
    let _: () = ccon
        .zadd_multiple("{user}:z", &[(1, "a"), (2, "b"), (3, "c")])
        .unwrap();
    let z: Vec<String> = ccon.zrangebyscore("{user}:z", 2, "+inf").unwrap();
    assert_eq!(z, vec!["b", "c"]);
    let _: () = ccon.sadd("{user}:s1", &["x", "y"]).unwrap();
    let moved: i64 = ccon.smove("{user}:s1", "{user}:s2", "x").unwrap();
    assert_eq!(moved, 1);
    let _: () = ccon.rpush("{user}:l", &["1", "2", "3"]).unwrap();
    let l: Vec<String> = ccon.lrange("{user}:l", -2, -1).unwrap();
    assert_eq!(l, vec!["2", "3"]);
    let kind: String = redis::cmd("TYPE").arg("{user}:z").query(&mut ccon).unwrap();
    assert_eq!(kind, "zset");
    // The ordered commands within one hashtag, on the slot's owner: the keys of
    // `{user}` in key order (the collections' member records are not keys); elsewhere
    // MOVED; a range or prefix that could span slots is refused.
    let user_slot = key_slot(b"{user}");
    let mut con = servers[owner(user_slot)].connect();
    let listed: Vec<String> = redis::cmd("TPREFIX")
        .arg("{user}:")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        listed,
        ["{user}:h", "{user}:l", "{user}:s1", "{user}:s2", "{user}:z"],
        "{listed:?}"
    );
    let listed: Vec<String> = redis::cmd("TRANGE")
        .arg("({user}:h")
        .arg("[{user}:z")
        .arg("REV")
        .arg("LIMIT")
        .arg(2)
        .query(&mut con)
        .unwrap();
    assert_eq!(listed, ["{user}:z", "{user}:s2"]);
    let mut elsewhere = servers[(owner(user_slot) + 1) % 3].connect();
    let err = redis::cmd("TPREFIX")
        .arg("{user}:")
        .query::<Vec<String>>(&mut elsewhere)
        .unwrap_err();
    assert_eq!(
        err.redirect_node(),
        Some((addrs[owner(user_slot)].as_str(), user_slot)),
        "{err}"
    );
    for args in [
        &["TPREFIX", "user"][..],
        &["TRANGE", "-", "+"],
        &["TRANGE", "[{user}:a", "[{userb}"],
    ] {
        let err = send(&mut con, args).unwrap_err();
        assert!(err.contains("hashtag"), "{args:?}: {err}");
    }
    let deleted: i64 = ccon
        .del(&["{user}:h", "{user}:z", "{user}:s1", "{user}:s2", "{user}:l"])
        .unwrap();
    assert_eq!(deleted, 5);

    // A plain connection to a server that does not own a key's slot is redirected to
    // the one that does.
    let slot = key_slot(b"key:0");
    let home = owner(slot);
    let other = (home + 1) % 3;
    let mut con = servers[other].connect();
    let err = con.get::<_, Option<String>>("key:0").unwrap_err();
    assert_eq!(
        err.redirect_node(),
        Some((addrs[home].as_str(), slot)),
        "{err}"
    );
    // Keys of several slots in one command are refused, even on their owner.
    let mut con = servers[home].connect();
    let err = con
        .mset::<_, _, ()>(&[("key:0", "x"), ("key:1", "y"), ("key:2", "z")])
        .unwrap_err();
    assert_eq!(err.code(), Some("CROSSSLOT"), "{err}");
    let value: Option<String> = con.get("key:0").unwrap();
    assert_eq!(
        value.as_deref(),
        Some("value of key:0"),
        "nothing was written"
    );

    check_slot_listings(servers, &keys, &owner);

    // A restarted server keeps its id and still serves its keys.
    let mut con = servers[0].connect();
    let id: String = redis::cmd("CLUSTER").arg("MYID").query(&mut con).unwrap();
    drop(con);
    servers[0].kill();
    servers[0].spawn(etcd);
    let mut con = servers[0].connect();
    let again: String = redis::cmd("CLUSTER").arg("MYID").query(&mut con).unwrap();
    assert_eq!(again, id);
    let mine: Vec<&String> = keys
        .iter()
        .filter(|k| owner(key_slot(k.as_bytes())) == 0)
        .collect();
    assert!(!mine.is_empty());
    wait_until("the restarted server serving its slots", || {
        con.get::<_, Option<String>>(mine[0].as_str()).ok()
    });
    for key in mine {
        let value: Option<String> = con.get(key.as_str()).unwrap();
        assert_eq!(value, Some(format!("value of {key}")));
    }
    let mut ccon = client.get_connection().unwrap();
    for key in &keys {
        let value: Option<String> = ccon.get(key).unwrap();
        assert_eq!(value, Some(format!("value of {key}")));
    }
}

/// CLUSTER COUNTKEYSINSLOT and GETKEYSINSLOT on each slot's owner agree with the keys
/// written; DBSIZE and a full SCAN of every server together list each key once.
fn check_slot_listings(servers: &[Server], keys: &[String], owner: &dyn Fn(u16) -> usize) {
    let mut by_slot: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    for key in keys {
        by_slot
            .entry(key_slot(key.as_bytes()))
            .or_default()
            .insert(key.clone());
    }
    let mut cons: Vec<redis::Connection> = servers.iter().map(Server::connect).collect();
    for (slot, expected) in &by_slot {
        let con = &mut cons[owner(*slot)];
        let count: usize = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(con)
            .unwrap();
        assert_eq!(count, expected.len(), "slot {slot}");
        let listed: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(1000)
            .query(con)
            .unwrap();
        assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), *expected);
        let elsewhere = &mut cons[(owner(*slot) + 1) % servers.len()];
        let count: usize = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(elsewhere)
            .unwrap();
        assert_eq!(count, 0, "slot {slot} counted where it is not served");
    }
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for con in &mut cons {
        let size: usize = redis::cmd("DBSIZE").query(con).unwrap();
        total += size;
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(100)
                .query(con)
                .unwrap();
            for key in batch {
                assert!(seen.insert(key.clone()), "{key} listed twice");
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    assert_eq!(total, keys.len());
    assert_eq!(seen, keys.iter().cloned().collect::<BTreeSet<_>>());
}

/// Sends one command; its reply, or the error's code and text.
fn send(con: &mut redis::Connection, args: &[&str]) -> Result<redis::Value, String> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query::<redis::Value>(con).map_err(|e| {
        let code = e.code().unwrap_or("?").to_owned();
        format!("{code} {}", e.detail().unwrap_or(""))
    })
}

fn text(value: redis::Value) -> String {
    redis::from_redis_value(value).unwrap()
}

#[test]
fn cluster_commands_answer_as_redis_documents() {
    let cluster = Cluster::start();
    cluster.create().unwrap();
    let ranges = cluster.wait_for_map();
    let mut con = cluster.servers[0].connect();

    // The example of Redis's CLUSTER KEYSLOT documentation.
    assert_eq!(
        send(&mut con, &["CLUSTER", "KEYSLOT", "somekey"]),
        Ok(redis::Value::Int(11058))
    );
    let id = text(send(&mut con, &["CLUSTER", "MYID"]).unwrap());
    assert_eq!(id.len(), 40);
    let info = text(send(&mut con, &["CLUSTER", "INFO"]).unwrap());
    for line in [
        "cluster_state:ok",
        "cluster_slots_assigned:16384",
        "cluster_slots_ok:16384",
        "cluster_known_nodes:3",
        "cluster_size:3",
        "cluster_current_epoch:3",
    ] {
        assert!(info.contains(line), "{line} not in {info}");
    }

    // CLUSTER NODES: one line per server, `id ip:port@cport flags master ping pong epoch
    // link slots`, this server flagged `myself`, each owning its range.
    let nodes = text(send(&mut con, &["CLUSTER", "NODES"]).unwrap());
    let lines: Vec<Vec<&str>> = nodes.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 3, "{nodes}");
    for fields in &lines {
        assert_eq!(fields.len(), 9, "{fields:?}");
        let addr = fields[1].split('@').next().unwrap();
        let range = ranges
            .iter()
            .find(|r| r.2 == addr)
            .expect("a server of the map");
        assert_eq!(fields[8], format!("{}-{}", range.0, range.1));
        assert_eq!(fields[3], "-");
        assert_eq!(fields[7], "connected");
        let myself = fields[0] == id;
        assert_eq!(fields[2], if myself { "myself,master" } else { "master" });
    }

    // CLUSTER SHARDS: per shard a map of `slots` (start, end) and `nodes` (maps).
    let shards = send(&mut con, &["CLUSTER", "SHARDS"]).unwrap();
    let shards: Vec<redis::Value> = redis::from_redis_value(shards).unwrap();
    assert_eq!(shards.len(), 3);
    for shard in shards {
        let shard: std::collections::HashMap<String, redis::Value> =
            redis::from_redis_value(shard).unwrap();
        let (start, end): (u16, u16) = redis::from_redis_value(shard["slots"].clone()).unwrap();
        let nodes: Vec<std::collections::HashMap<String, redis::Value>> =
            redis::from_redis_value(shard["nodes"].clone()).unwrap();
        assert_eq!(nodes.len(), 1);
        let node = &nodes[0];
        let ip = text(node["ip"].clone());
        let port: u16 = redis::from_redis_value(node["port"].clone()).unwrap();
        assert!(ranges.contains(&(start, end, format!("{ip}:{port}"))));
        assert_eq!(text(node["role"].clone()), "master");
        assert_eq!(text(node["health"].clone()), "online");
    }

    let server_info = text(send(&mut con, &["INFO", "server"]).unwrap());
    assert!(server_info.contains("redis_mode:cluster"), "{server_info}");
    let cluster_info = text(send(&mut con, &["INFO", "cluster"]).unwrap());
    assert!(cluster_info.contains("cluster_enabled:1"), "{cluster_info}");
    assert_eq!(send(&mut con, &["SELECT", "0"]), Ok(redis::Value::Okay));
    assert_eq!(
        send(&mut con, &["SELECT", "1"]),
        Err("ERR SELECT is not allowed in cluster mode".to_owned())
    );
    assert_eq!(send(&mut con, &["READONLY"]), Ok(redis::Value::Okay));
    assert_eq!(send(&mut con, &["READWRITE"]), Ok(redis::Value::Okay));
    assert!(send(&mut con, &["TPREFIX", "a"]).is_err());

    // Transactions: one slot runs; two slots (both served here) fail at EXEC with
    // CROSSSLOT and write nothing; a key served elsewhere is redirected as it is queued
    // and aborts the transaction.
    let own = ranges
        .iter()
        .find(|r| r.2 == cluster.addrs[0])
        .unwrap()
        .clone();
    let here = |key: &String| (own.0..=own.1).contains(&key_slot(key.as_bytes()));
    let mine: Vec<String> = (0..)
        .map(|i| format!("k{i}"))
        .filter(here)
        .take(2)
        .collect();
    assert_ne!(key_slot(mine[0].as_bytes()), key_slot(mine[1].as_bytes()));
    let theirs = (0..).map(|i| format!("k{i}")).find(|k| !here(k)).unwrap();

    send(&mut con, &["MULTI"]).unwrap();
    let tagged = format!("{{{}}}:counter", mine[0]);
    send(&mut con, &["SET", &tagged, "1"]).unwrap();
    send(&mut con, &["INCR", &tagged]).unwrap();
    let replies = send(&mut con, &["EXEC"]).unwrap();
    assert_eq!(
        replies,
        redis::Value::Array(vec![redis::Value::Okay, redis::Value::Int(2)])
    );

    send(&mut con, &["MULTI"]).unwrap();
    send(&mut con, &["SET", &mine[0], "x"]).unwrap();
    send(&mut con, &["SET", &mine[1], "y"]).unwrap();
    let err = send(&mut con, &["EXEC"]).unwrap_err();
    assert!(err.starts_with("CROSSSLOT"), "{err}");
    assert_eq!(send(&mut con, &["GET", &mine[0]]), Ok(redis::Value::Nil));

    send(&mut con, &["MULTI"]).unwrap();
    let err = send(&mut con, &["SET", &theirs, "x"]).unwrap_err();
    assert!(err.starts_with("MOVED"), "{err}");
    let err = send(&mut con, &["EXEC"]).unwrap_err();
    assert!(err.starts_with("EXECABORT"), "{err}");

    check_keyspace_events(&cluster, &mine[0], &own.2);
}

/// Keyspace notifications in cluster mode, as Redis Cluster has them: the server that
/// owns a key publishes its events to its own subscribers only, naming the client's key
/// (not the slot-prefixed key it stores) in database 0; the other servers' subscribers
/// hear nothing of it.
fn check_keyspace_events(cluster: &Cluster, key: &str, owner: &str) {
    let owner = cluster.index_of(owner);
    let other = (owner + 1) % cluster.servers.len();
    let mut subscribers = Vec::new();
    for index in [owner, other] {
        let mut con = cluster.servers[index].connect();
        send(
            &mut con,
            &["CONFIG", "SET", "notify-keyspace-events", "KEA"],
        )
        .unwrap();
        subscribers.push(cluster.servers[index].connect());
    }
    let mut subs: Vec<redis::PubSub<'_>> = subscribers
        .iter_mut()
        .map(|con| {
            let mut sub = con.as_pubsub();
            sub.psubscribe("*").unwrap();
            sub
        })
        .collect();

    let hash = format!("{{{key}}}:h");
    let mut con = cluster.servers[owner].connect();
    send(&mut con, &["SET", key, "v"]).unwrap();
    send(&mut con, &["HSET", &hash, "f", "1"]).unwrap();
    send(&mut con, &["DEL", key]).unwrap();
    for index in [owner, other] {
        let mut con = cluster.servers[index].connect();
        send(&mut con, &["PUBLISH", "marker", "end"]).unwrap();
    }

    let events_until_marker = |sub: &mut redis::PubSub<'_>| {
        let mut events = Vec::new();
        loop {
            let msg = sub.get_message().unwrap();
            let payload: String = msg.get_payload().unwrap();
            if msg.get_channel_name() == "marker" {
                return events;
            }
            events.push(format!("{} {payload}", msg.get_channel_name()));
        }
    };
    let expected: Vec<String> = [
        format!("__keyspace@0__:{key} set"),
        format!("__keyevent@0__:set {key}"),
        format!("__keyspace@0__:{hash} hset"),
        format!("__keyevent@0__:hset {hash}"),
        format!("__keyspace@0__:{key} del"),
        format!("__keyevent@0__:del {key}"),
    ]
    .into();
    assert_eq!(events_until_marker(&mut subs[0]), expected);
    assert_eq!(events_until_marker(&mut subs[1]), Vec::<String>::new());
}

// ---- backups and failover (issue 19, third slice) -----------------------------------

impl Cluster {
    /// The index of the server at `addr`.
    fn index_of(&self, addr: &str) -> usize {
        self.addrs.iter().position(|a| a == addr).unwrap()
    }

    /// Waits until server `asked` reports a primary other than `old` for the range that
    /// starts at slot `start`; the new primary's address.
    fn wait_for_new_primary(&self, asked: usize, start: u16, old: &str) -> String {
        let mut con = self.servers[asked].connect();
        wait_until("a backup promoted in the map", || {
            let ranges = slot_ranges(&mut con);
            let (_, _, primary) = ranges.iter().find(|r| r.0 == start)?;
            (primary != old).then(|| primary.clone())
        })
    }
}

/// The map's first region, as a failover test of it sees it: its slots, its primary
/// (the victim, and its index), another server to ask, and a hashtag of the region.
struct FirstRegion {
    start: u16,
    end: u16,
    old_primary: String,
    victim: usize,
    survivor: usize,
    tag: String,
}

impl Cluster {
    /// Waits for the map (made by `create`); its first region.
    fn first_region(&self) -> FirstRegion {
        let (start, end, old_primary) = self.wait_for_map()[0].clone();
        let victim = self.index_of(&old_primary);
        FirstRegion {
            start,
            end,
            victim,
            survivor: (victim + 1) % 3,
            tag: tag_in(start, end),
            old_primary,
        }
    }

    /// A `Writer` of `{tag}:n` keys through the cluster, once 50 of its writes were
    /// acknowledged.
    fn writer_under_way(&self, tag: &str) -> Writer {
        let writer = Writer::start(&urls(&self.servers), tag);
        wait_until("writes acknowledged", || {
            (writer.acked().len() >= 50).then_some(())
        });
        writer
    }
}

/// `INFO replication` of a server.
fn replication_info(server: &Server) -> String {
    redis::cmd("INFO")
        .arg("replication")
        .query(&mut server.connect())
        .unwrap()
}

#[test]
fn each_region_is_replicated_to_its_backup_which_serves_readonly_reads() {
    let cluster = Cluster::start_with(1);
    let created = cluster.create().unwrap();
    assert!(created.contains("backups: 127.0.0.1:"), "{created}");
    cluster.wait_for_map();

    // CLUSTER SLOTS lists each range's backup after its primary, on another server.
    let value: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut cluster.servers[0].connect())
        .unwrap();
    let redis::Value::Array(ranges) = value else {
        panic!("{value:?}")
    };
    for range in ranges {
        let redis::Value::Array(items) = range else {
            panic!()
        };
        assert_eq!(items.len(), 4, "start, end, primary, one backup: {items:?}");
        assert_ne!(items[2], items[3]);
    }
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut cluster.servers[0].connect())
        .unwrap();
    assert_eq!(nodes.lines().count(), 3, "{nodes}");

    // Writes through the cluster client are acknowledged (so every backup has them) ...
    let urls: Vec<String> = cluster
        .addrs
        .iter()
        .map(|a| format!("redis://{a}/"))
        .collect();
    let mut con = redis::cluster::ClusterClient::new(urls)
        .unwrap()
        .get_connection()
        .unwrap();
    for i in 0..300 {
        let _: () = con.set(format!("key:{i}"), i).unwrap();
    }
    // ... and each server holds a replica of the region it backs.
    for server in &cluster.servers {
        let info = replication_info(server);
        assert!(info.contains("tucana_replica_region-"), "{info}");
    }
    // A backup serves reads from its last applied commit: SAVE on a primary ships its
    // index at once (most of the time; a commit that reaches a backup only with the fold
    // bound, 60 s, was seen, so the wait asks again each second). Then every key reads
    // back with READONLY from its region's backup; without READONLY (or after READWRITE)
    // the backup redirects to the primary.
    let save_all = || {
        for server in &cluster.servers {
            let _: () = redis::cmd("SAVE").query(&mut server.connect()).unwrap();
        }
    };
    save_all();
    let backup_of = backups_by_range(&mut cluster.servers[0].connect());
    let mut readers: BTreeMap<String, redis::Connection> = BTreeMap::new();
    for i in 0..300 {
        let key = format!("key:{i}");
        let slot = key_slot(key.as_bytes());
        let (_, backup) = backup_of
            .iter()
            .find(|((start, end), _)| (*start..=*end).contains(&slot))
            .unwrap();
        let con = readers.entry(backup.clone()).or_insert_with(|| {
            let server = &cluster.servers[cluster.index_of(backup)];
            let mut con = server.connect();
            let _: () = redis::cmd("READONLY").query(&mut con).unwrap();
            con
        });
        let mut asked = Instant::now();
        let value: u64 = wait_until("the backup applying the shipped commit", || {
            let found = con.get::<_, Option<u64>>(&key).unwrap();
            if found.is_none() && asked.elapsed() > Duration::from_secs(1) {
                save_all();
                asked = Instant::now();
            }
            found
        });
        assert_eq!(value, i);
    }
    let (_, backup) = backup_of.iter().next().unwrap();
    let con = readers.get_mut(backup).unwrap();
    let _: () = redis::cmd("READWRITE").query(con).unwrap();
    let key = (0..300)
        .map(|i| format!("key:{i}"))
        .find(|k| key_slot(k.as_bytes()) <= backup_of.keys().next().unwrap().1)
        .unwrap();
    let err = con.get::<_, Option<u64>>(&key).unwrap_err();
    assert_eq!(err.code(), Some("MOVED"), "{err}");
}

/// `CLUSTER SLOTS` as (start, end) → the address of the range's first backup.
fn backups_by_range(con: &mut redis::Connection) -> BTreeMap<(u16, u16), String> {
    let value: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(con).unwrap();
    let redis::Value::Array(ranges) = value else {
        panic!("{value:?}")
    };
    ranges
        .into_iter()
        .map(|range| {
            let redis::Value::Array(items) = range else {
                panic!()
            };
            let (start, end): (u16, u16) =
                redis::from_redis_value(redis::Value::Array(items[..2].to_vec())).unwrap();
            let redis::Value::Array(node) = &items[3] else {
                panic!("no backup in {items:?}")
            };
            let (ip, port): (String, u16) =
                redis::from_redis_value(redis::Value::Array(node[..2].to_vec())).unwrap();
            ((start, end), format!("{ip}:{port}"))
        })
        .collect()
}

#[test]
fn a_killed_primary_is_replaced_by_its_backup_and_no_acknowledged_write_is_lost() {
    let mut cluster = Cluster::start_with_flags(1, &["--cluster-balance-leaders", "true"]);
    cluster.create().unwrap();
    let FirstRegion {
        start,
        end,
        old_primary,
        victim,
        survivor,
        tag,
    } = cluster.first_region();

    let writer = cluster.writer_under_way(&tag);
    cluster.servers[victim].kill();
    let killed_at = Instant::now();
    let new_primary = cluster.wait_for_new_primary(survivor, start, &old_primary);
    wait_until("a write acknowledged by the new primary", || {
        writer
            .acked()
            .iter()
            .any(|(_, at)| *at > killed_at)
            .then_some(())
    });
    // Let a few more through, then stop.
    let count = writer.acked().len();
    wait_until("more writes", || {
        (writer.acked().len() > count + 20).then_some(())
    });
    let acked = writer.finish();
    let first_after = acked.iter().find(|(_, at)| *at > killed_at).unwrap().1;
    eprintln!(
        "failover: {} writes acknowledged; from kill -9 to the first acknowledged write on the new primary: {:?} (information only)",
        acked.len(),
        first_after - killed_at
    );
    assert_all_readable(
        &cluster.servers[cluster.index_of(&new_primary)],
        &tag,
        &acked,
    );

    // INFO cluster on the new primary: its role and the new epoch for the region, and the
    // failover the coordinator recorded; `tucana cluster status` shows the same record.
    let promoted = &cluster.servers[cluster.index_of(&new_primary)];
    let info = wait_until("the new primary's INFO cluster", || {
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query(&mut promoted.connect())
            .unwrap();
        info.contains(&format!("slots={start}-{end},role=primary,"))
            .then_some(info)
    });
    assert!(info.contains("cluster_enabled:1"), "{info}");
    assert!(
        info.contains(&format!("dead={old_primary},promoted={new_primary},")),
        "{info}"
    );
    let status = run_tucana(&[
        "cluster",
        "status",
        "--etcd",
        cluster.etcd.endpoint(),
        "--name",
        "test",
    ]);
    assert!(
        status.contains("last failover: region ") && status.contains(&new_primary),
        "{status}"
    );
    // `/metrics` says the same: this server leads the region, and when the failover was.
    let metrics = promoted.metrics();
    let role = metrics
        .lines()
        .find(|l| {
            l.starts_with("tucana_cluster_region_role{")
                && l.contains(&format!("slots=\"{start}-{end}\""))
        })
        .unwrap_or_else(|| panic!("no role of the region in {metrics}"));
    assert!(role.ends_with(" 2"), "primary is 2: {role}");
    assert!(
        metrics.contains("tucana_cluster_last_failover_unix_ms{"),
        "{metrics}"
    );

    // The killed server restarted on its volume is not a primary again: the map stays,
    // and a write to the region through it is redirected to the new primary.
    let etcd = &cluster.etcd;
    let server = &mut cluster.servers[victim];
    server.spawn(etcd);
    let mut con = server.connect();
    assert_redirects(&mut con, &format!("{{{tag}}}:after-restart"), &new_primary);
    let ranges = slot_ranges(&mut cluster.servers[survivor].connect());
    assert!(
        ranges.iter().all(|(_, _, p)| *p != old_primary),
        "the restarted server leads nothing: {ranges:?}"
    );
    assert_all_readable(
        &cluster.servers[cluster.index_of(&new_primary)],
        &tag,
        &acked,
    );

    // The coordinator gave the region a new backup, which catches up; its primary then
    // reports it in sync (only such a backup may be promoted), and the map says so.
    let status = wait_until("every backup reported in sync", || {
        let status = run_tucana(&[
            "cluster",
            "status",
            "--etcd",
            cluster.etcd.endpoint(),
            "--name",
            "test",
        ]);
        (!status.contains("catching up") && !status.contains("backups: none")).then_some(status)
    });
    assert!(status.contains("in sync"), "{status}");
    // Each live primary's lag to its backups, as it reports it.
    assert!(status.contains("backups online 1, backup lag "), "{status}");
    let shards = redis::cmd("CLUSTER")
        .arg("SHARDS")
        .query::<redis::Value>(&mut cluster.servers[survivor].connect())
        .unwrap();
    assert!(
        !format!("{shards:?}").contains("loading"),
        "no backup is still loading: {shards:?}"
    );

    // With every backup in sync, the coordinator evens leadership out by planned
    // failovers (`--cluster-balance-leaders`): each server leads one region again, and
    // the region's writes are all there, wherever it is led now.
    let ranges = wait_until("each server leading one region again", || {
        let ranges = slot_ranges(&mut cluster.servers[survivor].connect());
        let leaders: std::collections::BTreeSet<&String> = ranges.iter().map(|r| &r.2).collect();
        (leaders.len() == 3).then_some(ranges)
    });
    let (_, _, leader) = ranges.iter().find(|r| r.0 == start).unwrap();
    assert_all_readable(&cluster.servers[cluster.index_of(leader)], &tag, &acked);
}

/// The story: in the fault campaign (seed 1301) a server's disk filled. Its store,
/// refused a write, was poisoned and acknowledged nothing more, but the server kept
/// renewing its lease in etcd, so the coordinator saw it alive: the regions it led took
/// no write and did not fail over until the campaign ended. A server whose store failed
/// now leaves the cluster (revoking its lease) and exits, and a backup takes over.
///
/// The failure here is a real refused write: the primary's file size limit (`prlimit`)
/// is set to its volume's length, so the next time the volume must grow the file system
/// refuses (EFBIG, as a full disk refuses with ENOSPC).
#[test]
fn a_primary_whose_store_fails_leaves_the_cluster_and_its_backup_takes_over() {
    let mut cluster = Cluster::start_with(1);
    cluster.create().unwrap();
    let FirstRegion {
        start,
        old_primary,
        victim,
        survivor,
        tag,
        ..
    } = cluster.first_region();

    let writer = cluster.writer_under_way(&tag);
    let volume_len_bytes = std::fs::metadata(&cluster.servers[victim].volume)
        .unwrap()
        .len();
    let limited = Command::new("prlimit")
        .arg("--pid")
        .arg(cluster.servers[victim].pid())
        .arg(format!("--fsize={volume_len_bytes}"))
        .status()
        .expect("run prlimit (util-linux)");
    assert!(limited.success(), "prlimit failed");

    // Large writes straight to the primary until its store refuses one.
    let value = vec![b'v'; 64 << 10];
    let mut con = cluster.servers[victim].connect();
    let mut big_acked = Vec::new();
    let refused = (0..4096)
        .find_map(|i| {
            let key = format!("{{{tag}}}:big:{i}");
            match con.set::<_, _, ()>(&key, &value[..]) {
                Ok(()) => {
                    big_acked.push(key);
                    None
                }
                Err(e) => Some(e),
            }
        })
        .expect("256 MiB written past a file size limit, and no write refused");
    let failed_at = Instant::now();
    eprintln!(
        "the primary refused a write after {} large ones: {refused}",
        big_acked.len()
    );

    // It leaves the cluster and exits by itself, saying it failed.
    let status = wait_until("the failed primary exiting", || {
        cluster.servers[victim]
            .child
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
    });
    assert!(
        !status.success(),
        "a failed store exits with an error: {status}"
    );
    let new_primary = cluster.wait_for_new_primary(survivor, start, &old_primary);
    assert_ne!(new_primary, old_primary);
    wait_until("a write acknowledged by the new primary", || {
        writer
            .acked()
            .iter()
            .any(|(_, at)| *at > failed_at)
            .then_some(())
    });
    let acked = writer.finish();
    let promoted = &cluster.servers[cluster.index_of(&new_primary)];
    assert_all_readable(promoted, &tag, &acked);
    let mut con = promoted.connect();
    for key in &big_acked {
        let read: Option<Vec<u8>> = con.get(key).unwrap();
        assert_eq!(read.as_deref(), Some(&value[..]), "acknowledged {key} lost");
    }
}

#[test]
fn a_paused_primary_acknowledges_nothing_once_its_backup_is_promoted() {
    let cluster = Cluster::start_with(1);
    cluster.create().unwrap();
    let FirstRegion {
        start,
        old_primary,
        victim,
        survivor,
        tag,
        ..
    } = cluster.first_region();

    let mut con = cluster.servers[victim].connect();
    let mut acked = Vec::new();
    for n in 1..=100u64 {
        let _: () = con.set(format!("{{{tag}}}:{n}"), n).unwrap();
        acked.push((n, Instant::now()));
    }
    cluster.servers[victim].signal("-STOP");
    let new_primary = cluster.wait_for_new_primary(survivor, start, &old_primary);
    cluster.servers[victim].signal("-CONT");

    // Whatever it learned by now, the old primary acknowledges no write of the region.
    for n in 101..=110u64 {
        let result: redis::RedisResult<()> = con.set(format!("{{{tag}}}:{n}"), n);
        let err = result
            .expect_err("a paused primary acknowledged a write after its backup was promoted");
        if n == 101 {
            eprintln!("the resumed old primary answered: {err}");
        }
        assert!(
            matches!(
                err.code(),
                Some("MOVED" | "CLUSTERDOWN" | "READONLY" | "NOREPLICAS")
            ),
            "{err}"
        );
    }
    assert_all_readable(
        &cluster.servers[cluster.index_of(&new_primary)],
        &tag,
        &acked,
    );
}

#[test]
fn a_planned_failover_hands_a_region_to_its_backup_and_loses_nothing() {
    let cluster = Cluster::start_with(1);
    cluster.create().unwrap();
    let ranges = cluster.wait_for_map();
    let (start, end, old_primary) = ranges[0].clone();
    let backups = backups_by_range(&mut cluster.servers[0].connect());
    let backup = backups[&(start, end)].clone();
    let tag = tag_in(start, end);

    let mut primary_con = cluster.servers[cluster.index_of(&old_primary)].connect();
    let mut backup_con = cluster.servers[cluster.index_of(&backup)].connect();
    assert!(send(&mut backup_con, &["CLUSTER", "FAILOVER", "NOW"])
        .unwrap_err()
        .contains("syntax error"));

    let writer = Writer::start(&urls(&cluster.servers), &tag);
    wait_until("writes acknowledged before the failover", || {
        (writer.acked().len() >= 50).then_some(())
    });
    let asked_at = Instant::now();
    assert_eq!(
        text(send(&mut backup_con, &["CLUSTER", "FAILOVER"]).unwrap()),
        "OK"
    );
    let new_primary = cluster.wait_for_new_primary(0, start, &old_primary);
    assert_eq!(new_primary, backup, "the backup asked took over");
    // The old primary backs the region in the same change of the map: no moment in which
    // the new primary acknowledges writes with one copy (M10, seed 57).
    let backups = backups_by_range(&mut cluster.servers[0].connect());
    assert_eq!(
        backups.get(&(start, end)),
        Some(&old_primary),
        "the region's backup once handed over: {backups:?}"
    );
    wait_until("a write acknowledged by the new primary", || {
        writer
            .acked()
            .iter()
            .any(|(_, at)| *at > asked_at + Duration::from_millis(200))
            .then_some(())
    });
    let acked = writer.finish();
    assert_all_readable(
        &cluster.servers[cluster.index_of(&new_primary)],
        &tag,
        &acked,
    );
    // The old primary no longer serves the region: a write through it is redirected.
    assert_redirects(&mut primary_con, &format!("{{{tag}}}:after"), &new_primary);

    // The new primary leads two regions now. Once the region it took over has an
    // in-sync backup again, `rebalance` evens it out: by another planned failover if the
    // server leading nothing backs one of them in sync (no data moves), else by moving
    // slots; either way every server leads one region.
    let etcd_args = ["--etcd", cluster.etcd.endpoint(), "--name", "test"];
    wait_until("the region's new backup in sync", || {
        let status = run_tucana(&[&["cluster", "status"][..], &etcd_args[..]].concat());
        (!status.contains("catching up") && !status.contains("backups: none")).then_some(())
    });
    let out = run_tucana(&[&["cluster", "rebalance"][..], &etcd_args[..]].concat());
    assert!(
        out.contains("balanced; 1 handoffs, 0 moves")
            || out.contains("balanced; 0 handoffs, 1 moves"),
        "{out}"
    );
    let ranges = slot_ranges(&mut cluster.servers[0].connect());
    let leaders: BTreeSet<&String> = ranges.iter().map(|(_, _, p)| p).collect();
    assert_eq!(leaders.len(), 3, "each server leads one region: {ranges:?}");
}

/// Waits until a write of `key` through `con` (a server that led its region) is
/// answered `MOVED` to `new_primary`, as it must be once that server learned the map.
fn assert_redirects(con: &mut redis::Connection, key: &str, new_primary: &str) {
    let err = wait_until("the old primary redirecting", || {
        match con.set::<_, _, ()>(key, 1) {
            Err(e) if e.code() == Some("MOVED") => Some(e),
            _ => {
                std::thread::sleep(Duration::from_millis(50));
                None
            }
        }
    });
    assert!(err.to_string().contains(new_primary), "{err}");
}

/// The story (the fault campaign, M10, seed 2): a primary answered `GET` with a write its
/// backup had not acknowledged; cut off, it was replaced by that backup, which lacked the
/// write, and a client that had read the new value then read the old one. With sync
/// durability a read of a region is answered only once its backups acknowledged what the
/// read saw (and while this server may still lead it); else it is refused.
#[test]
fn a_read_never_shows_a_write_the_backups_have_not_acknowledged() {
    let cluster = Cluster::start_with_flags(1, &["--repl-timeout-ms", "300"]);
    cluster.create().unwrap();
    let ranges = cluster.wait_for_map();
    let (start, end, primary) = ranges[0].clone();
    let backup = wait_until("the region's backup listed", || {
        backups_by_range(&mut cluster.servers[0].connect())
            .get(&(start, end))
            .cloned()
    });
    let key = format!("{{{}}}:k", tag_in(start, end));
    let mut con = cluster.servers[cluster.index_of(&primary)].connect();
    let _: () = con.set(&key, "old").unwrap();
    assert_eq!(con.get::<_, String>(&key).unwrap(), "old");

    // The backup paused for less than its lease (it stays the region's backup).
    let paused = &cluster.servers[cluster.index_of(&backup)];
    paused.signal("-STOP");
    let write = con.set::<_, _, ()>(&key, "new");
    let read = con.get::<_, String>(&key);
    paused.signal("-CONT");
    let err = write.expect_err("a write acknowledged without its backup");
    assert_eq!(err.code(), Some("NOREPLICAS"), "{err}");
    // Applied here, so a read sees it, and waits for the backup, which is silent.
    let err = read.expect_err("a read showed a write its backup had not acknowledged");
    assert_eq!(err.code(), Some("NOREPLICAS"), "{err}");
    // Once the backup has it, it reads back.
    wait_until("the backup acknowledging the write", || {
        (con.get::<_, String>(&key).ok()? == "new").then_some(())
    });
}
