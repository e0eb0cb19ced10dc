//! End-to-end tests of online slot migration (issue 19; DESIGN.md, "Slot migration"):
//! an etcd, three `tucana serve --cluster-etcd` processes with one backup per region and
//! sync durability, the operator commands (`tucana cluster move-slots`, `split`,
//! `add-server`, `remove-server`), and the `redis` crate's cluster client and plain
//! connections watching `ASK`, `MOVED` and `TRYAGAIN` as Redis Cluster gives them.
//!
//! etcd must be installed (`scripts/cluster-deps.sh`). Waits are bounded so a bug hangs
//! no run; nothing asserts how long anything took. The harness is a small copy of
//! `tests/cluster.rs`'s (servers here take migration flags).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Commands;
use tempfile::TempDir;
use tucana_cluster::key_slot;
use tucana_cluster::testing::TestEtcd;

const PATIENCE: Duration = Duration::from_secs(90);

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{what}: still waiting after {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_port() -> u16 {
    // Below the ephemeral range: a restarted server binds its port again.
    tucana_cluster::testing::free_port("127.0.0.1")
}

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    /// A server with one backup listener, sync durability, a 2 s lease, migration
    /// batches of `batch` pairs with `pause_ms` between them, and `extra` flags.
    fn start(
        volume: &Path,
        etcd: &TestEtcd,
        batch: usize,
        pause_ms: u64,
        extra: &[&str],
    ) -> Server {
        let port = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tucana"))
            .arg("--db")
            .arg(volume)
            .args(["serve", "--port", &port.to_string(), "--durability", "sync"])
            .args(["--cluster-etcd", etcd.endpoint(), "--cluster-name", "test"])
            .args(["--cluster-lease-ms", "2000"])
            .args(["--repl-port", &free_port().to_string()])
            .args(["--cluster-migrate-batch", &batch.to_string()])
            .args(["--cluster-migrate-pause-ms", &pause_ms.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tucana serve");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        assert!(line.contains(" on 127.0.0.1:"), "start line {line:?}");
        std::thread::spawn(move || {
            let mut text = String::new();
            while stderr.read_line(&mut text).map(|n| n > 0).unwrap_or(false) {
                eprint!("[server {port}] {text}");
                text.clear();
            }
        });
        Server {
            child,
            addr: format!("127.0.0.1:{port}"),
        }
    }

    fn connect(&self) -> redis::Connection {
        let client = redis::Client::open(format!("redis://{}/", self.addr)).unwrap();
        let con = client.get_connection().unwrap();
        con.set_read_timeout(Some(PATIENCE)).unwrap();
        con
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Cluster {
    etcd: TestEtcd,
    servers: Vec<Server>,
    _dir: TempDir,
}

impl Cluster {
    /// Three servers; the map over the first `in_map` of them, one backup per region.
    fn start(in_map: usize, batch: usize, pause_ms: u64) -> Cluster {
        Cluster::start_with(in_map, batch, pause_ms, &[])
    }

    /// [`Cluster::start`] with `extra` flags for every server.
    fn start_with(in_map: usize, batch: usize, pause_ms: u64, extra: &[&str]) -> Cluster {
        let etcd = TestEtcd::start();
        let dir = tempfile::tempdir().unwrap();
        let servers: Vec<Server> = (0..3)
            .map(|i| {
                let volume = dir.path().join(format!("server{i}/volume.tucana"));
                Server::start(&volume, &etcd, batch, pause_ms, extra)
            })
            .collect();
        let cluster = Cluster {
            etcd,
            servers,
            _dir: dir,
        };
        let mut args = vec!["create", "--replicas", "1"];
        args.extend(cluster.servers[..in_map].iter().map(|s| s.addr.as_str()));
        cluster.tucana(&args).unwrap();
        for server in &cluster.servers {
            let mut con = server.connect();
            wait_until("the map reaching a server", || {
                (slot_ranges(&mut con).len() == in_map).then_some(())
            });
        }
        cluster
    }

    /// `tucana cluster ARGS --etcd .. --name test`: stdout, or stderr if it failed.
    fn tucana_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tucana"));
        command
            .arg("cluster")
            .arg(args[0])
            .args(["--etcd", self.etcd.endpoint(), "--name", "test"])
            .args(&args[1..]);
        command
    }

    fn tucana(&self, args: &[&str]) -> Result<String, String> {
        let output = self.tucana_command(args).output().unwrap();
        if output.status.success() {
            Ok(String::from_utf8(output.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    fn client(&self) -> redis::cluster::ClusterClient {
        let urls = self.servers.iter().map(|s| format!("redis://{}/", s.addr));
        redis::cluster::ClusterClientBuilder::new(urls)
            .retries(8)
            .build()
            .unwrap()
    }
}

/// `CLUSTER SLOTS` as `(start, end, primary address)`, by start.
fn slot_ranges(con: &mut redis::Connection) -> Vec<(u16, u16, String)> {
    let value: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(con).unwrap();
    let redis::Value::Array(ranges) = value else {
        panic!("CLUSTER SLOTS answered {value:?}");
    };
    let mut out = Vec::new();
    for range in ranges {
        let redis::Value::Array(items) = range else {
            panic!("CLUSTER SLOTS range {range:?}");
        };
        let (start, end, node): (u16, u16, Vec<redis::Value>) =
            redis::from_redis_value(redis::Value::Array(items[..3].to_vec())).unwrap();
        let (ip, port): (String, u16) =
            redis::from_redis_value(redis::Value::Array(node[..2].to_vec())).unwrap();
        out.push((start, end, format!("{ip}:{port}")));
    }
    out.sort();
    out
}

/// Slots each server leads, by address.
fn led_slots(con: &mut redis::Connection) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for (start, end, addr) in slot_ranges(con) {
        *out.entry(addr).or_default() += u32::from(end - start) + 1;
    }
    out
}

/// The error's code and text, or the value.
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

/// A hashtag whose keys hash into `start..=end`, other than those in `not`.
fn tag_in(start: u16, end: u16, not: &[&str]) -> String {
    (0..)
        .map(|n| format!("t{n}"))
        .find(|tag| {
            (start..=end).contains(&key_slot(tag.as_bytes())) && !not.contains(&tag.as_str())
        })
        .unwrap()
}

/// A cluster client writing `w:n = n` (keys over every slot) one sync write at a time,
/// recording every acknowledged `n`.
struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(client: redis::cluster::ClusterClient) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, acked) = (stop.clone(), acked.clone());
            std::thread::spawn(move || {
                let mut con = None;
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    if con.is_none() {
                        con = client.get_connection().ok();
                    }
                    let Some(c) = con.as_mut() else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    n += 1;
                    match c.set::<_, _, ()>(format!("w:{n}"), n) {
                        Ok(()) => acked.lock().unwrap().push(n),
                        Err(_) => con = None,
                    }
                }
            })
        };
        Writer {
            stop,
            acked,
            thread: Some(thread),
        }
    }

    fn count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    fn finish(mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Release);
        self.thread.take().unwrap().join().unwrap();
        self.acked.lock().unwrap().clone()
    }
}

/// Every acknowledged `w:n` reads back as `n` through the cluster client.
fn assert_acked_readable(client: &redis::cluster::ClusterClient, acked: &[u64]) {
    let mut con = client.get_connection().unwrap();
    for n in acked {
        let value: Option<u64> = con.get(format!("w:{n}")).unwrap();
        assert_eq!(value, Some(*n), "acknowledged write w:{n} lost");
    }
}

#[test]
fn moved_slots_answer_ask_during_and_moved_after_with_nothing_lost() {
    // Small batches with a pause between them, so the migration is slow enough to watch.
    let cluster = Cluster::start(3, 4, 150);
    let (s0, s2) = (&cluster.servers[0], &cluster.servers[2]);
    let mut con0 = s0.connect();
    let ranges = slot_ranges(&mut con0);
    let (first, last, owner) = ranges[0].clone();
    assert_eq!(owner, s0.addr);
    // The upper 300 slots of server 0's region move to server 2.
    let (lo, hi) = (last - 299, last);
    assert!(lo > first);
    let client = cluster.client();
    let mut ccon = client.get_connection().unwrap();
    // Keys in the moving slots: a few per slot (with hashtags), one with a deadline, and
    // a pair `{late}a` in the last slot (moved last), for TRYAGAIN.
    let mut keys = Vec::new();
    for slot_tag in (0..).map(|n| format!("m{n}")) {
        if keys.len() >= 120 {
            break;
        }
        if (lo..=hi).contains(&key_slot(slot_tag.as_bytes())) {
            keys.push(format!("{{{slot_tag}}}:k"));
        }
    }
    for key in &keys {
        let _: () = ccon.set(key, format!("v-{key}")).unwrap();
    }
    let ttl_key = format!("{{{}}}:ttl", tag_in(lo, hi, &[]));
    let _: () = redis::cmd("SET")
        .arg(&ttl_key)
        .arg("t")
        .arg("EX")
        .arg(100_000)
        .query(&mut ccon)
        .unwrap();
    let late = (0..)
        .map(|n| format!("l{n}"))
        .find(|t| key_slot(t.as_bytes()) == hi)
        .unwrap();
    let late_a = format!("{{{late}}}a");
    let late_b = format!("{{{late}}}b");
    let late_c = format!("{{{late}}}c");
    let _: () = ccon.set(&late_a, "a").unwrap();
    let _: () = ccon.set(&late_c, "c").unwrap();

    let writer = Writer::start(cluster.client());
    wait_until("the writer writing", || (writer.count() > 20).then_some(()));
    let slots = format!("{lo}-{hi}");
    let mut mover = cluster
        .tucana_command(&["move-slots", "--from-region", "1", "--slots", &slots])
        .args(["--to", &s2.addr])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();

    // A moved key, asked for at the source, answers ASK to the target, which serves it
    // after ASKING only.
    let (asked, ask) = wait_until("a key answered with ASK at the source", || {
        keys.iter()
            .find_map(|key| match send(&mut con0, &["GET", key]) {
                Err(e) if e.starts_with("ASK") => Some((key.clone(), e)),
                _ => None,
            })
    });
    let slot = key_slot(asked.as_bytes());
    assert_eq!(ask, format!("ASK {slot} {}", s2.addr));
    let mut con2 = s2.connect();
    let moved = send(&mut con2, &["GET", &asked]).unwrap_err();
    assert_eq!(moved, format!("MOVED {slot} {}", s0.addr));
    assert_eq!(send(&mut con2, &["ASKING"]), Ok(redis::Value::Okay));
    let value: String =
        redis::from_redis_value(send(&mut con2, &["GET", &asked]).unwrap()).unwrap();
    assert_eq!(value, format!("v-{asked}"));
    // CLUSTER NODES marks the slots as Redis does, on each side's own line.
    let id = |con: &mut redis::Connection| -> String {
        redis::cmd("CLUSTER").arg("MYID").query(con).unwrap()
    };
    let (id0, id2) = (id(&mut con0), id(&mut con2));
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut con0).unwrap();
    let mine = nodes.lines().find(|l| l.contains("myself")).unwrap();
    assert!(mine.contains(&format!(" [{hi}->-{id2}]")), "{mine}");
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut con2).unwrap();
    let mine = nodes.lines().find(|l| l.contains("myself")).unwrap();
    assert!(mine.contains(&format!(" [{hi}-<-{id0}]")), "{mine}");
    // ASKING lasts one command.
    assert!(send(&mut con2, &["GET", &asked])
        .unwrap_err()
        .starts_with("MOVED"));
    // A new key in a migrating slot is created at the target (ASK), never here.
    let fresh = format!("{{{late}}}fresh");
    let ask = send(&mut con0, &["SET", &fresh, "x"]).unwrap_err();
    assert_eq!(ask, format!("ASK {hi} {}", s2.addr));
    // Keys split between the two sides: TRYAGAIN (`{late}a` is in the last slot, still
    // here while earlier slots move; `{late}b` does not exist).
    let split = send(&mut con0, &["MGET", &late_a, &late_b]).unwrap_err();
    assert!(split.starts_with("TRYAGAIN"), "{split}");
    // A key deleted at the source during the migration stays deleted, even if the
    // target holds a copy from a batch it applied but never acknowledged (made here by
    // hand: the import the source's migrator sends, with a stale value).
    let status = cluster.tucana(&["status"]).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("migrating:"))
        .unwrap();
    let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    let target = words[words.iter().position(|w| *w == "into").unwrap() + 2];
    let epoch = words[words.iter().position(|w| *w == "epoch").unwrap() + 1];
    let stored: Vec<u8> = [&hi.to_be_bytes()[..], late_c.as_bytes()].concat();
    wait_until("the target taking an import", || {
        redis::cmd("TUCANA.IMPORT")
            .arg(target)
            .arg(epoch)
            .arg(&stored)
            .arg("stale")
            .query::<()>(&mut con2)
            .ok()
    });
    assert_eq!(send(&mut con0, &["DEL", &late_c]), Ok(redis::Value::Int(1)));
    assert_eq!(send(&mut con0, &["GET", &late_c]), Ok(redis::Value::Nil));
    // Keys of several slots are still CROSSSLOT.
    let cross = send(&mut con0, &["MGET", &keys[0], &keys[1]]).unwrap_err();
    assert!(cross.starts_with("CROSSSLOT"), "{cross}");
    // The cluster client follows ASK by itself.
    let value: String = ccon.get(&asked).unwrap();
    assert_eq!(value, format!("v-{asked}"));

    let status = mover.wait().unwrap();
    assert!(status.success(), "move-slots failed");
    let acked = writer.finish();

    // After: the target owns the range; the source redirects with MOVED; the cluster
    // client reads every key (it follows MOVED and refreshes its map).
    let ranges = wait_until("the map with the moved range", || {
        let r = slot_ranges(&mut con0);
        (r.len() == 4).then_some(r)
    });
    assert!(ranges.contains(&(lo, hi, s2.addr.clone())), "{ranges:?}");
    assert!(
        ranges.contains(&(first, lo - 1, s0.addr.clone())),
        "{ranges:?}"
    );
    let moved = send(&mut con0, &["GET", &keys[0]]).unwrap_err();
    assert_eq!(
        moved,
        format!("MOVED {} {}", key_slot(keys[0].as_bytes()), s2.addr)
    );
    for key in &keys {
        let value: String = ccon.get(key).unwrap();
        assert_eq!(value, format!("v-{key}"));
    }
    let value: String = ccon.get(&late_a).unwrap();
    assert_eq!(value, "a");
    let gone: Option<String> = ccon.get(&late_c).unwrap();
    assert_eq!(gone, None, "a key deleted during the migration came back");
    let ttl: i64 = ccon.ttl(&ttl_key).unwrap();
    assert!(
        (1..=100_000).contains(&ttl),
        "the deadline moved with its key: {ttl}"
    );
    let count: usize = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(key_slot(keys[0].as_bytes()))
        .query(&mut con2)
        .unwrap();
    assert!(count >= 1);
    assert!(acked.len() > 20);
    assert_acked_readable(&cluster.client(), &acked);
}

#[test]
fn servers_are_added_removed_and_regions_split_online() {
    // The map over servers 0 and 1; server 2 is added, then server 0 removed.
    let mut cluster = Cluster::start(2, 64, 0);
    let (s0, s2) = (
        cluster.servers[0].addr.clone(),
        cluster.servers[2].addr.clone(),
    );
    let client = cluster.client();
    let mut ccon = client.get_connection().unwrap();
    let keys: Vec<String> = (0..600).map(|i| format!("key:{i}")).collect();
    for key in &keys {
        let _: () = ccon.set(key, format!("v-{key}")).unwrap();
    }
    let writer = Writer::start(cluster.client());

    let out = cluster.tucana(&["add-server", &s2]).unwrap();
    assert!(out.contains("added"), "{out}");
    let mut con = cluster.servers[2].connect();
    let led = wait_until("server 2 leading slots", || {
        let led = led_slots(&mut con);
        (led.len() == 3).then_some(led)
    });
    assert_eq!(led.values().sum::<u32>(), 16384);
    assert!(led.values().all(|n| (5461..=5462).contains(n)), "{led:?}");

    let out = cluster.tucana(&["remove-server", &s0]).unwrap();
    assert!(out.contains("leads no region"), "{out}");
    let led = wait_until("server 0 leading nothing", || {
        let led = led_slots(&mut con);
        (!led.contains_key(&s0)).then_some(led)
    });
    assert_eq!(led.values().sum::<u32>(), 16384, "{led:?}");
    // Stopped, it leaves the backup lists too (the coordinator's repair, once its lease
    // expired); the two left lead even shares: nothing to rebalance.
    let id0: String = redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut cluster.servers[0].connect())
        .unwrap();
    cluster.servers[0].child.kill().unwrap();
    cluster.servers[0].child.wait().unwrap();
    wait_until("the map naming the stopped server nowhere", || {
        let status = cluster.tucana(&["status"]).unwrap();
        (!status.contains(&id0)).then_some(())
    });
    let out = cluster.tucana(&["rebalance"]).unwrap();
    assert!(out.contains("balanced; 0 handoffs, 0 moves"), "{out}");

    // Split the region that holds slot 16383 on its own servers.
    let before = slot_ranges(&mut con);
    let region = {
        let status = cluster.tucana(&["status"]).unwrap();
        status
            .lines()
            .find(|l| l.contains("-16383 "))
            .and_then(|l| l.strip_prefix("region "))
            .and_then(|l| l.split(':').next())
            .unwrap()
            .to_owned()
    };
    cluster.tucana(&["split", &region]).unwrap();
    let after = wait_until("the split in the map", || {
        let r = slot_ranges(&mut con);
        (r.len() == before.len() + 1).then_some(r)
    });
    let last = before.last().unwrap();
    assert!(
        after
            .iter()
            .any(|r| r.1 == 16383 && r.2 == last.2 && r.0 > last.0),
        "{after:?}"
    );

    let acked = writer.finish();
    let mut ccon = client.get_connection().unwrap();
    for key in &keys {
        let value: String = ccon.get(key).unwrap();
        assert_eq!(value, format!("v-{key}"));
    }
    assert!(!acked.is_empty());
    assert_acked_readable(&client, &acked);
}

#[test]
fn a_region_grown_past_the_split_size_is_split_online_on_its_own_servers() {
    // Servers split a region they lead once its live data passes 1 MiB. About 3 MiB go
    // into the first region (slots 0-5460) while a writer runs over every slot: the
    // region splits (and its halves again while they are too large) with nothing lost,
    // the other regions stay whole, and the new regions keep the same primary.
    let cluster = Cluster::start_with(3, 64, 0, &["--cluster-split-mib", "1"]);
    let mut con = cluster.servers[0].connect();
    let before = slot_ranges(&mut con);
    assert_eq!(before.len(), 3, "{before:?}");
    let (first_start, first_end, first_primary) = before[0].clone();
    let client = cluster.client();
    let writer = Writer::start(cluster.client());
    let mut ccon = client.get_connection().unwrap();
    let value = "v".repeat(1000);
    let keys: Vec<String> = (0..)
        .map(|i| format!("big:{i}"))
        .filter(|k| (first_start..=first_end).contains(&key_slot(k.as_bytes())))
        .take(3000)
        .collect();
    for key in &keys {
        let _: () = ccon.set(key, format!("{key}{value}")).unwrap();
    }
    let after = wait_until("the first region split", || {
        let r = slot_ranges(&mut con);
        (r.iter().filter(|r| r.1 <= first_end).count() > 1).then_some(r)
    });
    for (start, end, primary) in after.iter().filter(|r| r.1 <= first_end) {
        assert_eq!(
            primary, &first_primary,
            "{start}-{end} moved away: {after:?}"
        );
    }
    assert_eq!(
        &after[after.len() - 2..],
        &before[1..],
        "other regions changed"
    );

    let acked = writer.finish();
    assert!(!acked.is_empty());
    assert_acked_readable(&client, &acked);
    let mut ccon = client.get_connection().unwrap();
    for key in &keys {
        let read: String = ccon.get(key).unwrap();
        assert_eq!(read, format!("{key}{value}"), "{key} lost in the split");
    }
    // A split key-space still splits no further than its data asks: the halves of
    // 3 MiB over 1 MiB are at most 4 regions (8 if GC lags on the moved records).
    let parts = slot_ranges(&mut con)
        .iter()
        .filter(|r| r.1 <= first_end)
        .count();
    assert!(parts <= 8, "split into {parts} regions");
}

#[test]
fn a_source_primary_killed_mid_migration_is_succeeded_by_its_backup_which_finishes_it() {
    let mut cluster = Cluster::start(3, 4, 150);
    let mut con1 = cluster.servers[1].connect();
    let ranges = slot_ranges(&mut con1);
    let (_, last, owner) = ranges[0].clone();
    assert_eq!(owner, cluster.servers[0].addr);
    let (lo, hi) = (last - 299, last);
    let client = cluster.client();
    let mut ccon = client.get_connection().unwrap();
    let keys: Vec<String> = (0..)
        .map(|n| format!("{{m{n}}}:k"))
        .filter(|k| (lo..=hi).contains(&key_slot(k.as_bytes())))
        .take(120)
        .collect();
    for key in &keys {
        let _: () = ccon.set(key, format!("v-{key}")).unwrap();
    }
    let writer = Writer::start(cluster.client());
    let slots = format!("{lo}-{hi}");
    let target = cluster.servers[2].addr.clone();
    let mut mover = cluster
        .tucana_command(&["move-slots", "--from-region", "1", "--slots", &slots])
        .args(["--to", &target])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut con0 = cluster.servers[0].connect();
    wait_until("the migration under way", || {
        keys.iter()
            .any(|key| matches!(send(&mut con0, &["GET", key]), Err(e) if e.starts_with("ASK")))
            .then_some(())
    });
    // kill -9 of the source's primary in the middle of the migration.
    let victim = &mut cluster.servers[0];
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    // Its backup is promoted, finds the migration in the map and finishes it.
    assert!(mover.wait().unwrap().success(), "move-slots failed");
    let ranges = wait_until("the moved range owned by the target", || {
        let r = slot_ranges(&mut con1);
        r.iter()
            .any(|x| *x == (lo, hi, target.clone()))
            .then_some(r)
    });
    assert!(
        ranges.iter().all(|r| r.2 != cluster.servers[0].addr),
        "{ranges:?}"
    );
    let acked = writer.finish();
    let client = redis::cluster::ClusterClientBuilder::new(
        cluster.servers[1..]
            .iter()
            .map(|s| format!("redis://{}/", s.addr)),
    )
    .retries(8)
    .build()
    .unwrap();
    let mut ccon = client.get_connection().unwrap();
    for key in &keys {
        let value: String = ccon.get(key).unwrap();
        assert_eq!(value, format!("v-{key}"));
    }
    assert_acked_readable(&client, &acked);
}

#[test]
fn a_target_primary_killed_mid_migration_is_succeeded_by_its_backup() {
    let mut cluster = Cluster::start(3, 4, 150);
    let mut con0 = cluster.servers[0].connect();
    let ranges = slot_ranges(&mut con0);
    let (_, last, _) = ranges[0].clone();
    let (lo, hi) = (last - 299, last);
    let client = cluster.client();
    let mut ccon = client.get_connection().unwrap();
    let keys: Vec<String> = (0..)
        .map(|n| format!("{{m{n}}}:k"))
        .filter(|k| (lo..=hi).contains(&key_slot(k.as_bytes())))
        .take(120)
        .collect();
    for key in &keys {
        let _: () = ccon.set(key, format!("v-{key}")).unwrap();
    }
    let writer = Writer::start(cluster.client());
    let slots = format!("{lo}-{hi}");
    let target = cluster.servers[2].addr.clone();
    let mut mover = cluster
        .tucana_command(&["move-slots", "--from-region", "1", "--slots", &slots])
        .args(["--to", &target])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the migration under way", || {
        keys.iter()
            .any(|key| matches!(send(&mut con0, &["GET", key]), Err(e) if e.starts_with("ASK")))
            .then_some(())
    });
    // kill -9 of the target's primary: its backup is promoted and takes the rest.
    let victim = &mut cluster.servers[2];
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    assert!(mover.wait().unwrap().success(), "move-slots failed");
    let ranges = wait_until("the moved range owned by the target", || {
        let r = slot_ranges(&mut con0);
        r.iter()
            .find(|x| (x.0, x.1) == (lo, hi))
            .map(|x| x.2.clone())
    });
    assert_ne!(
        ranges, target,
        "the dead server still leads the moved range"
    );
    let acked = writer.finish();
    let client = redis::cluster::ClusterClientBuilder::new(
        cluster.servers[..2]
            .iter()
            .map(|s| format!("redis://{}/", s.addr)),
    )
    .retries(8)
    .build()
    .unwrap();
    let mut ccon = client.get_connection().unwrap();
    for key in &keys {
        let value: String = ccon.get(key).unwrap();
        assert_eq!(value, format!("v-{key}"));
    }
    assert_acked_readable(&client, &acked);
}

/// The story: the migrator moved stored pairs in key order, and a collection's metadata
/// (at its key) sorts far from its members (in the reserved family), so a hash could be
/// half moved: `HLEN` through `ASK` counted the members that had arrived, and the
/// source's collector could delete members whose metadata had already gone as garbage.
/// Now a collection moves whole, with its metadata, in one batch.
#[test]
fn collections_move_whole_and_are_never_seen_half_moved() {
    let cluster = Cluster::start(2, 4, 100);
    let mut con1 = cluster.servers[1].connect();
    let ranges = slot_ranges(&mut con1);
    let (first, last, owner) = ranges[0].clone();
    assert_eq!(owner, cluster.servers[0].addr);
    let client = cluster.client();
    let mut ccon = client.get_connection().unwrap();
    let tags: Vec<String> = (0..)
        .map(|n| format!("{{c{n}}}"))
        .filter(|k| (first..=last).contains(&key_slot(k.as_bytes())))
        .take(6)
        .collect();
    for tag in &tags {
        for f in 0..40 {
            let _: () = ccon.hset(format!("{tag}:h"), format!("f{f}"), f).unwrap();
            let _: () = ccon.zadd(format!("{tag}:z"), format!("m{f}"), f).unwrap();
        }
        let _: () = ccon.set(format!("{tag}:s"), "plain").unwrap();
    }
    let slots = format!("{first}-{last}");
    let target = cluster.servers[1].addr.clone();
    let mut mover = cluster
        .tucana_command(&["move-slots", "--from-region", "1", "--slots", &slots])
        .args(["--to", &target])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // While it moves (4 pairs a batch, 100 ms apart), every read through the cluster
    // client (which follows ASK) sees each collection whole.
    let mut reads = 0;
    while mover.try_wait().unwrap().is_none() {
        for tag in &tags {
            let hlen: usize = ccon.hlen(format!("{tag}:h")).unwrap();
            assert_eq!(hlen, 40, "{tag}:h seen half moved");
            let zcard: usize = ccon.zcard(format!("{tag}:z")).unwrap();
            assert_eq!(zcard, 40, "{tag}:z seen half moved");
            reads += 1;
        }
    }
    assert!(mover.wait().unwrap().success(), "move-slots failed");
    eprintln!("{reads} reads of collections during the migration");
    let mut con = cluster.servers[1].connect();
    for tag in &tags {
        let all: BTreeMap<String, i64> = redis::cmd("HGETALL")
            .arg(format!("{tag}:h"))
            .query(&mut con)
            .unwrap();
        assert_eq!(all.len(), 40);
        assert_eq!(all["f39"], 39);
        let score: f64 = redis::cmd("ZSCORE")
            .arg(format!("{tag}:z"))
            .arg("m7")
            .query(&mut con)
            .unwrap();
        assert_eq!(score, 7.0);
    }
}
