//! Our slot function against a live redis-server's `CLUSTER KEYSLOT`, on binary keys with
//! and without hashtags. redis-server is optional here (`scripts/server-deps.sh --bench`
//! installs it): without it the test says so and passes, since the unit tests in
//! `slot.rs` already pin values redis-server answers.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tucana_cluster::key_slot;

struct RedisServer {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn redis_server_on_path() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn key_slot_matches_redis_cluster_keyslot() {
    if !redis_server_on_path() {
        eprintln!("skipped: redis-server is not installed (scripts/server-deps.sh --bench)");
        return;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--cluster-enabled",
            "yes",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--cluster-config-file")
        .arg(dir.path().join("nodes.conf"))
        .arg("--dir")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = RedisServer { child, _dir: dir };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let started = Instant::now();
    let mut connection = loop {
        match client.get_connection() {
            Ok(connection) => break connection,
            Err(e) if started.elapsed() > Duration::from_secs(60) => {
                panic!("redis-server does not answer on port {port}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };

    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let alphabet = b"{}ab\x00\xff";
    for i in 0..400 {
        let len = rng.random_range(0..24);
        // Half the keys from a few bytes that make hashtags likely (braces, empty tags,
        // nested ones), half any bytes.
        let key: Vec<u8> = (0..len)
            .map(|_| {
                if i % 2 == 0 {
                    alphabet[rng.random_range(0..alphabet.len())]
                } else {
                    rng.random()
                }
            })
            .collect();
        let theirs: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key[..])
            .query(&mut connection)
            .unwrap();
        assert_eq!(key_slot(&key), theirs, "key {key:?}");
    }
}
