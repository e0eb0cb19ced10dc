//! End-to-end tests of `tucana serve`: the real binary as a separate process, driven by
//! a Redis client, stopped by SIGTERM, `SHUTDOWN` or kill -9, and the volume checked
//! afterwards by opening it again.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Commands;
use tempfile::TempDir;

/// A running `tucana serve` child and where it listens.
struct Served {
    child: Child,
    addr: SocketAddr,
}

fn serve(volume: &Path, args: &[&str]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tucana"))
        .arg("--db")
        .arg(volume)
        .args(["serve", "--port", "0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tucana serve");
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("read the start line");
    // "tucana serve: PATH on ADDR (...)"
    let addr = line
        .split(" on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while stderr.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    Served { child, addr }
}

impl Served {
    fn connect(&self) -> redis::Connection {
        let client = redis::Client::open(format!("redis://{}/", self.addr)).unwrap();
        let con = client.get_connection().unwrap();
        con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        con
    }

    /// Sends `signal` (`-TERM`, `-INT`) and waits for the exit.
    fn signal(&mut self, signal: &str) -> ExitStatus {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        self.child.wait().expect("wait for tucana serve")
    }
}

fn volume() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("volume.tucana");
    (dir, path)
}

#[test]
fn acknowledged_sync_writes_survive_kill_9() {
    let (_dir, path) = volume();
    let mut served = serve(&path, &["--durability", "sync"]);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let mut con = served.connect();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("w{t}:{i:06}");
                    let value = format!("value {t} {i}");
                    match con.set::<_, _, ()>(&key, &value) {
                        Ok(()) => acked.push((key, value)),
                        // The server was killed mid-request: this one was not answered.
                        Err(_) => break,
                    }
                }
                acked
            })
        })
        .collect();
    // Let the writers get well into their work, then kill the server under them. A write
    // counts in DBSIZE before its answer reaches the writer, so each writer may have one
    // counted but unacknowledged: wait for 400 more than that.
    let mut watcher = served.connect();
    loop {
        let n: i64 = redis::cmd("DBSIZE").query(&mut watcher).unwrap();
        if n >= 400 + writers.len() as i64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    served.child.kill().expect("kill -9");
    served.child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<(String, String)> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    assert!(acked.len() >= 400, "only {} acknowledged", acked.len());

    let db = tucana::Database::open(&path).expect("reopen after kill -9");
    let ks = db.keyspace("default").unwrap();
    for (key, value) in &acked {
        assert_eq!(
            ks.get(key.as_bytes()).unwrap().as_deref(),
            Some(value.as_bytes()),
            "acknowledged {key} lost"
        );
    }
    // Every invariant and checksum of the recovered volume holds.
    let report = db.check().expect("check after kill -9");
    assert!(report.keys >= acked.len() as u64);
    db.close().unwrap();
}

/// Deadlines acknowledged in sync mode survive kill -9, and the server started again on
/// the volume answers them as before (deadlines are absolute, so nothing moves).
#[test]
fn acknowledged_deadlines_survive_kill_9() {
    let (_dir, path) = volume();
    let far_ms: i64 = 4_102_444_800_123; // 2100-01-01
    let mut served = serve(&path, &["--durability", "sync"]);
    let mut con = served.connect();
    let _: () = redis::cmd("SET")
        .arg("far")
        .arg("v")
        .arg("PXAT")
        .arg(far_ms)
        .query(&mut con)
        .unwrap();
    let _: () = con.set("kept", "v").unwrap();
    let _: i64 = con.pexpire_at("kept", far_ms).unwrap();
    let _: i64 = con.persist("kept").unwrap();
    let _: () = con.set("gone", "v").unwrap();
    let _: i64 = con.expire("gone", -1).unwrap();
    served.child.kill().expect("kill -9");
    served.child.wait().unwrap();

    let mut served = serve(&path, &["--durability", "sync"]);
    let mut con = served.connect();
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg("far")
        .query(&mut con)
        .unwrap();
    assert_eq!(at, far_ms);
    assert_eq!(con.ttl::<_, i64>("kept").unwrap(), -1);
    assert_eq!(con.ttl::<_, i64>("gone").unwrap(), -2);
    let n: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, 2);
    assert!(served.signal("-TERM").success());
}

/// Collections written in sync mode survive kill -9 whole: after the restart every
/// collection has the members its acknowledged writes gave it, its count agrees with
/// them (metadata and members are one batch), and the volume checks clean. `h` passed
/// from the packed layout to the per-field one at its 129th field; `p` stayed packed.
#[test]
fn acknowledged_collection_writes_survive_kill_9() {
    let (_dir, path) = volume();
    let mut served = serve(&path, &["--durability", "sync"]);
    let mut con = served.connect();
    for i in 0..200 {
        let _: i64 = con.hset("h", format!("f{i}"), i).unwrap();
        let _: i64 = con.zadd("z", format!("m{i}"), i).unwrap();
        let _: i64 = con.rpush("l", i).unwrap();
        let _: i64 = con.sadd("s", i % 50).unwrap();
        if i < 100 {
            let _: i64 = con.hset("p", format!("f{i}"), i).unwrap();
        }
    }
    let _: i64 = con.hdel("h", "f0").unwrap();
    let _: i64 = con.hdel("p", "f0").unwrap();
    let _: Vec<String> = redis::cmd("ZPOPMIN")
        .arg("z")
        .arg(10)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("LTRIM")
        .arg("l")
        .arg(5)
        .arg(-6)
        .query(&mut con)
        .unwrap();
    served.child.kill().expect("kill -9");
    served.child.wait().unwrap();

    let mut served = serve(&path, &["--durability", "sync"]);
    let mut con = served.connect();
    let h: std::collections::HashMap<String, i64> = con.hgetall("h").unwrap();
    assert_eq!(h.len(), 199);
    assert_eq!(con.hlen::<_, i64>("h").unwrap(), 199);
    assert_eq!(h.get("f199"), Some(&199));
    let p: std::collections::HashMap<String, i64> = con.hgetall("p").unwrap();
    assert_eq!(p.len(), 99);
    assert_eq!(con.hlen::<_, i64>("p").unwrap(), 99);
    assert_eq!(p.get("f99"), Some(&99));
    let z: Vec<(String, i64)> = con.zrange_withscores("z", 0, -1).unwrap();
    assert_eq!(z.len(), 190);
    assert_eq!(z[0], ("m10".to_string(), 10));
    assert_eq!(con.zcard::<_, i64>("z").unwrap(), 190);
    let l: Vec<i64> = con.lrange("l", 0, -1).unwrap();
    assert_eq!(l, (5..195).collect::<Vec<i64>>());
    assert_eq!(con.scard::<_, i64>("s").unwrap(), 50);
    let n: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, 5);
    assert!(served.signal("-TERM").success());
    // The records are exactly the collections' (nothing left behind): 199 fields, 190
    // members twice, 190 elements, 50 members, 5 metadata records (the packed hash is
    // one: its 99 fields are in it) and the marker.
    let db = tucana::Database::open(&path).expect("reopen after kill -9");
    assert_eq!(
        db.keyspace("default").unwrap().len(),
        199 + 380 + 190 + 50 + 5 + 1
    );
    db.check().expect("check after kill -9");
    db.close().unwrap();
}

/// Pipelined runs of collection writes (consecutive LPUSH, LPOP, ZADD, HSET, ... run as
/// one engine batch per run, `commands/runs.rs`) in sync mode survive kill -9 as they
/// were acknowledged: every pipeline's pushes, pops, members and fields are there, a list
/// emptied and pushed again inside one run is its new incarnation alone, counts agree
/// with the records, nothing else is left behind, and the volume checks clean.
#[test]
fn acknowledged_pipelined_collection_runs_survive_kill_9() {
    let (_dir, path) = volume();
    let mut served = serve(&path, &["--durability", "sync"]);
    let mut con = served.connect();
    for round in 0..20 {
        let mut pipe = redis::pipe();
        for i in 0..50 {
            let n = round * 50 + i;
            pipe.cmd("RPUSH").arg("l").arg(n).ignore();
            pipe.cmd("ZADD")
                .arg("z")
                .arg(n)
                .arg(format!("m{n}"))
                .ignore();
            pipe.cmd("HSET")
                .arg(format!("h{round}"))
                .arg(format!("f{i}"))
                .arg(i)
                .ignore();
        }
        for _ in 0..10 {
            pipe.cmd("LPOP").arg("l").ignore();
        }
        let () = pipe.query(&mut con).unwrap();
    }
    let mut pipe = redis::pipe();
    pipe.cmd("LPOP").arg("l").arg(800);
    pipe.cmd("RPUSH").arg("l").arg("last");
    pipe.cmd("ZREM").arg("z").arg("m0");
    let (popped, len, removed): (Vec<i64>, i64, i64) = pipe.query(&mut con).unwrap();
    assert_eq!(popped, (200..1000).collect::<Vec<i64>>());
    assert_eq!((len, removed), (1, 1));
    served.child.kill().expect("kill -9");
    served.child.wait().unwrap();

    let mut served = serve(&path, &["--durability", "sync"]);
    let mut con = served.connect();
    let l: Vec<String> = con.lrange("l", 0, -1).unwrap();
    assert_eq!(l, ["last"]);
    assert_eq!(con.zcard::<_, i64>("z").unwrap(), 999);
    let z: Vec<(String, i64)> = con.zrange_withscores("z", 0, 1).unwrap();
    assert_eq!(z, [("m1".to_string(), 1), ("m2".to_string(), 2)]);
    for round in 0..20 {
        let h: std::collections::HashMap<String, i64> = con.hgetall(format!("h{round}")).unwrap();
        assert_eq!(h.len(), 50, "h{round}");
        assert_eq!(h.get("f49"), Some(&49));
    }
    let n: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, 22);
    assert!(served.signal("-TERM").success());
    // The list's one element and metadata, 999 members twice and the sorted set's
    // metadata, 20 packed hashes, and the marker.
    let db = tucana::Database::open(&path).expect("reopen after kill -9");
    assert_eq!(db.keyspace("default").unwrap().len(), 2 + 1999 + 20 + 1);
    db.check().expect("check after kill -9");
    db.close().unwrap();
}

#[test]
fn sigterm_and_sigint_stop_gracefully_and_keep_buffered_writes() {
    for signal in ["-TERM", "-INT"] {
        let (_dir, path) = volume();
        // A flush interval far away: only the graceful stop can make the writes durable.
        let mut served = serve(
            &path,
            &["--durability", "buffered", "--flush-interval-ms", "600000"],
        );
        let mut con = served.connect();
        let _: () = con.set("before-stop", "kept").unwrap();
        let _: () = redis::cmd("SELECT").arg(2).query(&mut con).unwrap();
        let _: () = con.set("in-db2", "kept too").unwrap();
        let status = served.signal(signal);
        assert!(status.success(), "{signal}: exit status {status:?}");
        let db = tucana::Database::open(&path).unwrap();
        let get = |ks: &str, key: &[u8]| db.keyspace(ks).unwrap().get(key).unwrap();
        assert_eq!(
            get("default", b"before-stop").as_deref(),
            Some(&b"kept"[..])
        );
        assert_eq!(get("db2", b"in-db2").as_deref(), Some(&b"kept too"[..]));
        db.close().unwrap();
    }
}

/// `tucana serve --member …` over three member files (first with `--member-dispatch
/// lwql --segment-writes-wait-for-device`): writes through RESP spread over the members
/// (INFO members shows each one written), survive a restart over the same members, a restart with two members swapped is refused naming them before anything
/// is served, and the volume checks clean over its members afterwards.
#[test]
fn serve_over_three_members_writes_restarts_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("member{i}.tucana")))
        .collect();
    let member_args = |order: [usize; 2]| -> Vec<String> {
        order
            .iter()
            .flat_map(|&i| ["--member".to_string(), paths[i].display().to_string()])
            .collect()
    };
    let args: Vec<String> = member_args([1, 2])
        .into_iter()
        .chain(["--durability".to_string(), "sync".to_string()])
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The first run with least-weighted dispatch over device-paced writes; the policy is
    // not stored, so the restart (round-robin) opens the same volume.
    let mut first_args = args.clone();
    first_args.extend([
        "--member-dispatch",
        "lwql",
        "--segment-writes-wait-for-device",
    ]);
    // 8000 values of 1 KB: four 2 MiB segments at least, so every member gets one.
    let keys = 8000u32;
    let mut served = serve(&paths[0], &first_args);
    let mut con = served.connect();
    put_kilobyte_values(&mut con, 0..keys);
    let info: String = redis::cmd("INFO").arg("members").query(&mut con).unwrap();
    for (m, path) in paths.iter().enumerate() {
        let line = info
            .lines()
            .find(|l| l.starts_with(&format!("member{m}:")))
            .unwrap_or_else(|| panic!("no member{m} in {info}"));
        assert!(line.contains(&format!("path={}", path.display())), "{line}");
        assert!(line.contains("queue_jobs="), "{line}");
        assert!(line.contains("queue_running_jobs="), "{line}");
        let written: u64 = line
            .split(',')
            .find_map(|f| f.strip_prefix("bytes_written="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no bytes_written in {line}"));
        assert!(written > 1 << 20, "{line}");
    }
    let status = served.signal("-TERM");
    assert!(status.success(), "exit status {status:?}");

    // Restarted over the same members: everything is there.
    let mut served = serve(&paths[0], &args);
    let mut con = served.connect();
    let n: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, i64::from(keys));
    for i in (0..keys).step_by(7) {
        let got: String = con.get(format!("key{i:06}")).unwrap();
        assert_eq!(got, kilobyte_value(i), "key{i:06}");
    }
    let status = served.signal("-TERM");
    assert!(status.success(), "exit status {status:?}");

    // Members given swapped: refused, naming the member, and nothing is served.
    let swapped = Command::new(env!("CARGO_BIN_EXE_tucana"))
        .arg("--db")
        .arg(&paths[0])
        .args(member_args([2, 1]))
        .args(["serve", "--port", "0"])
        .output()
        .unwrap();
    assert!(!swapped.status.success());
    let stderr = String::from_utf8_lossy(&swapped.stderr);
    assert!(
        stderr.contains("swapped") && stderr.contains("member 1"),
        "{stderr}"
    );

    let db = tucana::Database::builder().open_members(&paths).unwrap();
    assert_eq!(db.check().unwrap().keys, u64::from(keys));
    assert_eq!(db.stats().members.len(), 3);
    db.close().unwrap();
}

/// The value of `key{i:06}` in the member tests: 1 KB, so a few thousand fill segments on
/// every member.
fn kilobyte_value(i: u32) -> String {
    format!("{i:06}:{}", "v".repeat(1000))
}

/// SETs `key{i:06}` to `kilobyte_value(i)` for every `i` of `keys`, 500 to a pipeline.
fn put_kilobyte_values(con: &mut redis::Connection, keys: std::ops::Range<u32>) {
    for chunk in keys.collect::<Vec<_>>().chunks(500) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            pipe.set(format!("key{i:06}"), kilobyte_value(i)).ignore();
        }
        let _: () = pipe.query(con).unwrap();
    }
}

/// `TUCANA.ADDMEMBER` on a server over two members: refused unless the server was started
/// with `--enable-add-member-command`; then it adds a third member while the server
/// serves (a member of the set is refused, naming it), later writes reach the new member
/// (INFO members), a restart without the new `--member` is refused naming it missing,
/// and a restart with it serves every value.
#[test]
fn tucana_addmember_grows_a_served_volume_and_a_restart_takes_the_new_member() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("member{i}.tucana")))
        .collect();
    let p = |i: usize| paths[i].display().to_string();
    let two = [
        "--member".to_string(),
        p(1),
        "--durability".into(),
        "sync".into(),
    ];
    let two: Vec<&str> = two.iter().map(String::as_str).collect();
    let add = |con: &mut redis::Connection, path: &str| -> redis::RedisResult<String> {
        redis::cmd("TUCANA.ADDMEMBER").arg(path).query(con)
    };

    let mut served = serve(&paths[0], &two);
    let mut con = served.connect();
    put_kilobyte_values(&mut con, 0..2000);
    let err = add(&mut con, &p(2)).unwrap_err().to_string();
    assert!(err.contains("--enable-add-member-command"), "{err}");
    assert!(!paths[2].exists(), "a refused add created the file");
    assert!(served.signal("-TERM").success());

    let mut with_flag = two.clone();
    with_flag.push("--enable-add-member-command");
    let mut served = serve(&paths[0], &with_flag);
    let mut con = served.connect();
    let err = add(&mut con, &p(1)).unwrap_err().to_string();
    assert!(err.contains("same file as member 1"), "{err}");
    let reply = add(&mut con, &p(2)).unwrap();
    assert!(reply.starts_with("index=2 "), "{reply}");
    // 8000 values of 1 KB after the add: four 2 MiB segments at least, one for each member.
    put_kilobyte_values(&mut con, 2000..10_000);
    let info: String = redis::cmd("INFO").arg("members").query(&mut con).unwrap();
    let line = info
        .lines()
        .find(|l| l.starts_with("member2:"))
        .unwrap_or_else(|| panic!("no member2 in {info}"));
    assert!(line.contains(&format!("path={}", p(2))), "{line}");
    let written: u64 = line
        .split(',')
        .find_map(|f| f.strip_prefix("bytes_written="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no bytes_written in {line}"));
    assert!(written > 1 << 20, "{line}");
    assert!(served.signal("-TERM").success());

    // The old command line is refused now, naming the missing member.
    let old = Command::new(env!("CARGO_BIN_EXE_tucana"))
        .arg("--db")
        .arg(&paths[0])
        .args(["--member", &p(1), "serve", "--port", "0"])
        .output()
        .unwrap();
    assert!(!old.status.success());
    let stderr = String::from_utf8_lossy(&old.stderr);
    assert!(
        stderr.contains("missing") && stderr.contains("member 2"),
        "{stderr}"
    );
    let third = p(2);
    let mut three = two.clone();
    three.extend(["--member", &third]);
    let mut served = serve(&paths[0], &three);
    let mut con = served.connect();
    for i in (0..10_000).step_by(7) {
        let got: String = con.get(format!("key{i:06}")).unwrap();
        assert_eq!(got, kilobyte_value(i), "key{i:06}");
    }
    assert!(served.signal("-TERM").success());
    let db = tucana::Database::builder().open_members(&paths).unwrap();
    assert_eq!(db.check().unwrap().keys, 10_000);
    db.close().unwrap();
}

/// `TUCANA.REMOVEMEMBER` on a server over three members: refused unless the server was
/// started with `--enable-remove-member-command`; member 0 and a path that is no member
/// are refused by name; then member 1 leaves while the server serves (INFO members says
/// so), writes go on, a restart with the old command line is refused naming the removed
/// member, and a restart over the two left serves every value.
#[test]
fn tucana_rebalance_is_refused_without_its_flag_and_reports_groups_per_member() {
    // A served volume over two members and one added: one group each, balanced, so
    // nothing moves (groups moving while a server writes is `tucana`'s
    // `tests/rebalance.rs`); what is tested here is the gate, the reply and INFO.
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("member{i}.tucana")))
        .collect();
    let p = |i: usize| paths[i].display().to_string();
    let args = [
        "--member".to_string(),
        p(1),
        "--durability".into(),
        "sync".into(),
        "--enable-add-member-command".into(),
    ];
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rebalance = |con: &mut redis::Connection| -> redis::RedisResult<String> {
        redis::cmd("TUCANA.REBALANCE").query(con)
    };
    let mut served = serve(&paths[0], &args);
    let mut con = served.connect();
    let err = rebalance(&mut con).unwrap_err().to_string();
    assert!(err.contains("--enable-rebalance-command"), "{err}");
    assert!(served.signal("-TERM").success());

    args.push("--enable-rebalance-command");
    let mut served = serve(&paths[0], &args);
    let mut con = served.connect();
    put_kilobyte_values(&mut con, 0..2000);
    let added: String = redis::cmd("TUCANA.ADDMEMBER")
        .arg(p(2))
        .query(&mut con)
        .unwrap();
    assert!(added.starts_with("index=2 "), "{added}");
    let reply = rebalance(&mut con).unwrap();
    assert_eq!(
        reply, "groups_moved=0 bytes_moved=0 rewritten_bytes=0 groups=1,1,1",
        "{reply}"
    );
    let info: String = redis::cmd("INFO").arg("members").query(&mut con).unwrap();
    for m in 0..3 {
        let line = info
            .lines()
            .find(|l| l.starts_with(&format!("member{m}:")))
            .unwrap_or_else(|| panic!("no member{m} in {info}"));
        assert!(line.contains("groups=1"), "{line}");
    }
    put_kilobyte_values(&mut con, 2000..3000);
    assert!(served.signal("-TERM").success());
}

#[test]
fn tucana_removemember_shrinks_a_served_volume_and_a_restart_leaves_it_out() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("member{i}.tucana")))
        .collect();
    let p = |i: usize| paths[i].display().to_string();
    let three = [
        "--member".to_string(),
        p(1),
        "--member".into(),
        p(2),
        "--durability".into(),
        "sync".into(),
    ];
    let three: Vec<&str> = three.iter().map(String::as_str).collect();
    let remove = |con: &mut redis::Connection, path: &str| -> redis::RedisResult<String> {
        redis::cmd("TUCANA.REMOVEMEMBER").arg(path).query(con)
    };

    let mut served = serve(&paths[0], &three);
    let mut con = served.connect();
    // 6000 values of 1 KB: three 2 MiB segments at least, so every member holds data.
    put_kilobyte_values(&mut con, 0..6000);
    let err = remove(&mut con, &p(1)).unwrap_err().to_string();
    assert!(err.contains("--enable-remove-member-command"), "{err}");
    assert!(served.signal("-TERM").success());

    let mut with_flag = three.clone();
    with_flag.push("--enable-remove-member-command");
    let mut served = serve(&paths[0], &with_flag);
    let mut con = served.connect();
    let err = remove(&mut con, &p(0)).unwrap_err().to_string();
    assert!(err.contains("member 0"), "{err}");
    let stranger = dir.path().join("stranger.tucana").display().to_string();
    let err = remove(&mut con, &stranger).unwrap_err().to_string();
    assert!(err.contains("stranger.tucana"), "{err}");
    let reply = remove(&mut con, &p(1)).unwrap();
    assert!(reply.starts_with("index=1 "), "{reply}");
    let moved: u64 = reply
        .split(' ')
        .find_map(|f| f.strip_prefix("groups_moved="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no groups_moved in {reply}"));
    assert!(moved >= 1, "{reply}");
    let info: String = redis::cmd("INFO").arg("members").query(&mut con).unwrap();
    let line = info
        .lines()
        .find(|l| l.starts_with("member1:"))
        .unwrap_or_else(|| panic!("no member1 in {info}"));
    assert!(line.contains("state=removed"), "{line}");
    put_kilobyte_values(&mut con, 6000..8000);
    assert!(served.signal("-TERM").success());

    // The old command line names the removed member now.
    let old = Command::new(env!("CARGO_BIN_EXE_tucana"))
        .arg("--db")
        .arg(&paths[0])
        .args(["--member", &p(1), "--member", &p(2), "serve", "--port", "0"])
        .output()
        .unwrap();
    assert!(!old.status.success());
    let stderr = String::from_utf8_lossy(&old.stderr);
    assert!(stderr.contains("removed"), "{stderr}");
    let left = p(2);
    let two = ["--member", left.as_str()];
    let mut served = serve(&paths[0], &two);
    let mut con = served.connect();
    for i in (0..8000).step_by(7) {
        let got: String = con.get(format!("key{i:06}")).unwrap();
        assert_eq!(got, kilobyte_value(i), "key{i:06}");
    }
    assert!(served.signal("-TERM").success());
    let db = tucana::Database::builder()
        .open_members(&[&paths[0], &paths[2]])
        .unwrap();
    assert_eq!(db.check().unwrap().keys, 8000);
    db.close().unwrap();
}

#[test]
fn shutdown_command_exits_zero() {
    let (_dir, path) = volume();
    let mut served = serve(&path, &[]);
    let mut con = served.connect();
    let _: () = con.set("k", "v").unwrap();
    let _ = redis::cmd("SHUTDOWN").query::<redis::Value>(&mut con);
    let status = served.child.wait().unwrap();
    assert!(status.success(), "exit status {status:?}");
}

/// Issue 23: `serve` on a busy port created the volume, printed "stopped", then
/// "Address already in use" without the address. Now the port is checked first.
#[test]
fn a_busy_port_is_named_and_no_volume_is_created() {
    let (_dir, path) = volume();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_tucana"))
        .arg("--db")
        .arg(&path)
        .args(["serve", "--port", &port])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
    assert!(stderr.contains("in use"), "{stderr}");
    assert!(!stderr.contains("stopped"), "it never started: {stderr}");
    assert!(!path.exists(), "no volume created");
}

#[test]
fn a_public_address_without_a_password_is_refused_before_the_volume_is_touched() {
    let (_dir, path) = volume();
    let output = Command::new(env!("CARGO_BIN_EXE_tucana"))
        .arg("--db")
        .arg(&path)
        .args(["serve", "--bind", "0.0.0.0", "--port", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--requirepass"), "{stderr}");
    assert!(!path.exists(), "no volume created");
}

#[test]
fn threads_and_busy_poll_are_set_by_flags_and_zero_threads_are_refused() {
    let (_dir, path) = volume();
    let mut served = serve(&path, &["--threads", "2", "--durability", "buffered"]);
    let mut con = served.connect();
    let _: () = con.set("k", "v").unwrap();
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
    assert!(info.contains("connection_threads:2\r\n"), "{info}");
    assert!(info.contains("busy_poll_us:50\r\n"), "the default: {info}");
    assert!(served.signal("-TERM").success());

    let mut served = serve(&path, &["--busy-poll-us", "0"]);
    let mut con = served.connect();
    assert_eq!(con.get::<_, String>("k").unwrap(), "v");
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
    assert!(info.contains("busy_poll_us:0\r\n"), "{info}");
    assert!(served.signal("-TERM").success());

    let (_dir, path) = volume();
    let output = Command::new(env!("CARGO_BIN_EXE_tucana"))
        .arg("--db")
        .arg(&path)
        .args(["serve", "--threads", "0", "--port", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--threads"), "{stderr}");
    assert!(!path.exists(), "no volume created");
}

/// Runs `scripts/test-redis-cli.sh` (Debian's redis-cli against the binary). CI installs
/// redis-cli with `scripts/server-deps.sh`; elsewhere the test is skipped when it is
/// missing.
#[test]
fn redis_cli_script() {
    let have_cli = Command::new("redis-cli")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_cli {
        assert!(
            std::env::var_os("CI").is_none(),
            "redis-cli missing in CI: scripts/server-deps.sh should have installed it"
        );
        eprintln!("skipped: redis-cli not installed (scripts/server-deps.sh installs it)");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = Command::new("bash")
        .arg(root.join("scripts/test-redis-cli.sh"))
        .env("TUCANA_BIN", env!("CARGO_BIN_EXE_tucana"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A backup taking replicas on a free port, and a primary (`--backup`) shipping to it.
fn replicated_pair(primary: &Path, backup: &Path) -> (Served, Served) {
    let port = free_port().to_string();
    let backup = serve(backup, &["--repl-port", &port]);
    let primary = serve(
        primary,
        &[
            "--backup",
            &format!("127.0.0.1:{port}"),
            "--server-id",
            "p1",
        ],
    );
    (primary, backup)
}

/// Runs `tucana ARGS` and returns its stdout, asserting it succeeded.
fn tucana(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tucana"))
        .args(args)
        .output()
        .expect("run tucana");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tucana {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn replication_status_and_promote_through_a_running_backup() {
    let (_pdir, ppath) = volume();
    let (_bdir, bpath) = volume();
    let (mut primary, mut backup) = replicated_pair(&ppath, &bpath);
    let mut p = primary.connect();
    for i in 0..50 {
        let _: () = p.set(format!("k{i}"), i).unwrap();
    }
    let status = tucana(&[
        "replication",
        "status",
        "--server",
        &primary.addr.to_string(),
    ]);
    assert!(status.contains("role:master\n"), "{status}");
    assert!(status.contains("state=online"), "{status}");
    let baddr = backup.addr.to_string();
    let status = tucana(&["replication", "status", "--server", &baddr]);
    assert!(status.contains("role:slave\n"), "{status}");
    assert!(status.contains("master_link_status:up"), "{status}");
    assert!(
        status.contains("tucana_replica_default:term=1,"),
        "{status}"
    );

    assert!(primary.signal("-TERM").success());
    let after = tucana(&["replication", "promote", "--server", &baddr]);
    assert!(after.contains("role:master\n"), "{after}");
    assert!(!after.contains("tucana_replica_"), "{after}");
    // The promoted backup serves what the primary acknowledged, and takes writes.
    let mut b = backup.connect();
    let v: Option<i64> = b.get("k49").unwrap();
    assert_eq!(v, Some(49));
    let _: () = b.set("new", "write").unwrap();
    assert!(backup.signal("-TERM").success());
}

#[test]
fn replication_status_and_promote_on_a_volume_no_server_holds() {
    let (_pdir, ppath) = volume();
    let (_bdir, bpath) = volume();
    let (mut primary, mut backup) = replicated_pair(&ppath, &bpath);
    let mut p = primary.connect();
    for i in 0..50 {
        let _: () = p.set(format!("k{i}"), i).unwrap();
    }
    assert!(primary.signal("-TERM").success());
    assert!(backup.signal("-TERM").success());
    let bdb = bpath.to_str().unwrap();
    let status = tucana(&["--db", bdb, "replication", "status"]);
    assert!(status.contains("role:slave\n"), "{status}");
    assert!(
        status.contains("tucana_replica_default:term=1,"),
        "{status}"
    );
    let promoted = tucana(&["--db", bdb, "replication", "promote"]);
    assert!(
        promoted.starts_with("promoted:default\nrole:master\n"),
        "{promoted}"
    );
    assert_eq!(tucana(&["--db", bdb, "get", "k49"]), "49\n");
    assert_eq!(tucana(&["--db", bdb, "keyspaces"]), "default\n");
}
