//! Failover cycles of replicated `tucana serve` processes (row M7 of docs/reliability.md).
//!
//! Each cycle starts a backup (`--repl-port`) and a primary that ships to it (`--backup`),
//! both real processes on fresh volumes, and has Redis clients (the `redis` crate) write
//! unique keys with sync durability, recording every `OK`. Then, by the cycle's plan:
//!
//! - **kill the primary**: `kill -9` at a random instant (commits and GC passes are
//!   forced now and then so the kill can land inside a segment ship, an index ship, a
//!   commit or a GC pass); the backup is promoted (`REPLICAOF NO ONE`) and must hold every
//!   acknowledged write; the time from the kill to the first write acknowledged by the
//!   promoted backup is the failover time;
//! - **kill the backup**: `kill -9` of the backup while writes go on (they fail with
//!   `NOREPLICAS` meanwhile, never `OK`), restart, catch-up; then the primary is shut down
//!   and the promoted backup must equal it key for key;
//! - **crash the backup at a point**: the backup runs armed (`FAILPOINTS`, in a binary
//!   built with `--features failpoints`) to die as `kill -9` kills after a random number
//!   of passes of one point: a log frame stored (mid segment shipping), an index frame
//!   received (mid index shipping), or a commit's nodes written but not its descriptor
//!   (mid its own commit); then as above;
//! - **fence the primary**: `SIGSTOP` the primary, promote the backup, `SIGCONT` the
//!   primary: it must acknowledge no write afterwards.
//!
//! Even cycles acknowledge writes the backup received, odd ones writes it synced
//! (`--repl-ack durable`); half the cycles let the backup's index lag the primary's
//! commits (folded, the default), the others ship every commit's index at once. Every cycle ends with `tucana check` on the backup's volume. Owns only the cycle's
//! plan, processes and verdict; the servers are the real binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::serve::{check, free_port, Server};
use crate::Rng;

pub struct Config {
    pub cycles: u64,
    pub seed: u64,
    pub dir: PathBuf,
    pub tucana: PathBuf,
}

/// What a run of cycles found.
#[derive(Default)]
pub struct Summary {
    pub cycles: u64,
    pub primary_kills: u64,
    pub backup_kills: u64,
    /// Backups killed at each of `CRASH_POINTS`.
    pub crash_points: [u64; 3],
    pub fences: u64,
    pub acked_writes: u64,
    pub lost_writes: u64,
    /// Writes an old primary acknowledged after its backup was promoted.
    pub acked_after_fence: u64,
    pub check_failures: u64,
    /// Kill of the primary → first write acknowledged by the promoted backup, ms.
    pub failover_ms: Vec<f64>,
    pub failure: Option<String>,
}

impl Summary {
    pub fn failed(&self) -> bool {
        self.failure.is_some()
            || self.lost_writes > 0
            || self.acked_after_fence > 0
            || self.check_failures > 0
    }

    pub fn figure_line(&self, seed: u64) -> String {
        let mut ms = self.failover_ms.clone();
        ms.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            if ms.is_empty() {
                0.0
            } else {
                ms[((ms.len() - 1) as f64 * p).round() as usize]
            }
        };
        format!(
            "M7 failover cycles: {}, primary kills: {}, backup kills: {} (+ at crash points: {}), fenced primaries: {}, \
             acknowledged writes: {}, lost: {}, acknowledged after the fence: {}, check failures: {}, \
             failover p50: {:.0} ms, p99: {:.0} ms, seed: {seed}",
            self.cycles,
            self.primary_kills,
            self.backup_kills,
            CRASH_POINTS
                .iter()
                .zip(self.crash_points)
                .map(|((point, _), n)| format!("{point} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            self.fences,
            self.acked_writes,
            self.lost_writes,
            self.acked_after_fence,
            self.check_failures,
            pct(0.5),
            pct(0.99),
        )
    }
}

/// Writers: each writes unique keys with `SET` until stopped or its connection breaks,
/// keeping the keys the server answered `OK`.
struct Writers {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<BTreeMap<String, String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Writers {
    fn start(server: &Server, cycle: u64, count: usize) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeMap::new()));
        let threads = (0..count)
            .map(|w| {
                let (stop, acked) = (stop.clone(), acked.clone());
                let conn = server.connect();
                std::thread::spawn(move || {
                    let Ok(mut conn) = conn else { return };
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("c{cycle}-w{w}-{i}");
                        let value = format!("v{i}-{}", "x".repeat((i % 200) as usize));
                        match redis::cmd("SET")
                            .arg(&key)
                            .arg(&value)
                            .query::<String>(&mut conn)
                        {
                            Ok(ok) if ok == "OK" => {
                                acked.lock().expect("not poisoned").insert(key, value);
                            }
                            // NOREPLICAS, READONLY: applied or not, never acknowledged.
                            Ok(_) | Err(_) if stop.load(Ordering::Relaxed) => break,
                            Ok(_) => {}
                            Err(e) if e.is_io_error() || e.is_connection_dropped() => break,
                            Err(_) => {}
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        Writers {
            stop,
            acked,
            threads,
        }
    }

    fn stop(self) -> BTreeMap<String, String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        Arc::try_unwrap(self.acked)
            .map(|m| m.into_inner().expect("not poisoned"))
            .unwrap_or_default()
    }
}

/// Every key and value of a server's database 0, through `SCAN` and `MGET`.
fn contents(server: &Server) -> Result<BTreeMap<String, String>, String> {
    let mut c = server.connect().map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query(&mut c)
            .map_err(|e| e.to_string())?;
        if !keys.is_empty() {
            let values: Vec<Option<String>> = redis::cmd("MGET")
                .arg(&keys)
                .query(&mut c)
                .map_err(|e| e.to_string())?;
            for (k, v) in keys.into_iter().zip(values) {
                if let Some(v) = v {
                    out.insert(k, v);
                }
            }
        }
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

fn promote(server: &Server) -> Result<(), String> {
    let mut c = server.connect().map_err(|e| e.to_string())?;
    redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query::<String>(&mut c)
        .map(|_| ())
        .map_err(|e| format!("REPLICAOF NO ONE: {e}"))
}

/// Counts the acknowledged writes `acked` that `server` lacks or holds another value of.
fn lost(server: &Server, acked: &BTreeMap<String, String>) -> Result<u64, String> {
    let mut c = server.connect().map_err(|e| e.to_string())?;
    let keys: Vec<&String> = acked.keys().collect();
    let mut lost = 0;
    for chunk in keys.chunks(500) {
        let values: Vec<Option<String>> = redis::cmd("MGET")
            .arg(chunk)
            .query(&mut c)
            .map_err(|e| e.to_string())?;
        for (k, v) in chunk.iter().zip(values) {
            if v.as_ref() != acked.get(*k) {
                if lost < 5 {
                    eprintln!("failover: acknowledged {k} is {v:?} on the promoted backup");
                }
                lost += 1;
            }
        }
    }
    Ok(lost)
}

/// Ends a cycle: shuts the backup down and checks its volume; the cycle's directory is
/// removed unless the check failed (then it is kept for a look).
fn finish(
    config: &Config,
    summary: &mut Summary,
    mut backup: Server,
    dir: &Path,
) -> Result<(), String> {
    backup.shutdown();
    if check(&config.tucana, &backup.db) {
        let _ = std::fs::remove_dir_all(dir);
    } else {
        summary.check_failures += 1;
    }
    Ok(())
}

/// Forces a commit (`SAVE`) or a GC pass (`BGREWRITEAOF`) on the primary now and then, so
/// kills land inside index ships and GC passes too.
fn stir(server: &Server, rng: &mut Rng) {
    if let Ok(mut c) = server.connect() {
        let cmd = if rng.below(3) == 0 {
            "BGREWRITEAOF"
        } else {
            "SAVE"
        };
        let _ = redis::cmd(cmd).query::<String>(&mut c);
    }
}

pub fn run(config: &Config) -> Summary {
    let mut summary = Summary::default();
    for cycle in 0..config.cycles {
        // One generator per cycle: how long a cycle's loops run depends on timing, and the
        // next cycle's plan must not.
        let mut rng = Rng::new(config.seed ^ cycle.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let plan = rng.below(12);
        let result = match plan {
            0..=5 => kill_primary(config, cycle, &mut rng, &mut summary),
            6..=7 => kill_backup(config, cycle, &mut rng, &mut summary),
            8..=9 => crash_backup(config, cycle, &mut rng, &mut summary),
            _ => fence_primary(config, cycle, &mut rng, &mut summary),
        };
        summary.cycles += 1;
        if let Err(e) = result {
            summary.failure = Some(format!("cycle {cycle}: {e}"));
            return summary;
        }
        if summary.failed() {
            summary.failure = Some(format!("cycle {cycle} (see above)"));
            return summary;
        }
    }
    summary
}

/// A backup (with `failpoints` armed, if given) and a primary shipping to it, on fresh
/// volumes of cycle `cycle`; odd cycles run `--repl-ack durable`, cycles 4k and 4k+1
/// without crash points let the backup's index lag (`--repl-index-lag-ms`).
fn pair(
    config: &Config,
    cycle: u64,
    failpoints: Option<&str>,
) -> Result<(Server, Server, PathBuf), String> {
    let dir = config.dir.join(format!("cycle-{cycle}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let log = dir.join("servers.log");
    let (bp, rp, pp) = (
        free_port().map_err(|e| e.to_string())?,
        free_port().map_err(|e| e.to_string())?,
        free_port().map_err(|e| e.to_string())?,
    );
    let backup = Server::start(
        &config.tucana,
        &dir.join("backup.tucana"),
        bp,
        &["--repl-port".into(), rp.to_string()],
        failpoints,
        &log,
    )?;
    let primary = Server::start(
        &config.tucana,
        &dir.join("primary.tucana"),
        pp,
        &[
            "--backup".into(),
            format!("127.0.0.1:{rp}"),
            "--repl-timeout-ms".into(),
            "2000".into(),
            // Odd cycles acknowledge once the backup synced what it received.
            "--repl-ack".into(),
            if cycle % 2 == 1 {
                "durable"
            } else {
                "received"
            }
            .into(),
            // Half the cycles (and every crash-point one) ship each commit's index as it
            // is made; the others fold commits (60 s, 256 MiB), so a promoted backup
            // replays across several commits and GC passes.
            "--repl-index-lag-ms".into(),
            if failpoints.is_some() || cycle % 4 >= 2 {
                "0"
            } else {
                "60000"
            }
            .into(),
        ],
        None,
        &log,
    )?;
    Ok((primary, backup, dir))
}

fn kill_primary(
    config: &Config,
    cycle: u64,
    rng: &mut Rng,
    summary: &mut Summary,
) -> Result<(), String> {
    let (mut primary, backup, dir) = pair(config, cycle, None)?;
    let writers = Writers::start(&primary, cycle, 2);
    let run_ms = 100 + rng.below(900);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(run_ms) {
        std::thread::sleep(Duration::from_millis(20 + rng.below(100)));
        if rng.below(4) == 0 {
            stir(&primary, rng);
        }
    }
    let killed = Instant::now();
    primary.kill9();
    let acked = writers.stop();
    promote(&backup)?;
    let mut c = backup.connect().map_err(|e| e.to_string())?;
    redis::cmd("SET")
        .arg(format!("c{cycle}-after-failover"))
        .arg("x")
        .query::<String>(&mut c)
        .map_err(|e| format!("the promoted backup refused a write: {e}"))?;
    summary
        .failover_ms
        .push(killed.elapsed().as_secs_f64() * 1000.0);
    summary.primary_kills += 1;
    summary.acked_writes += acked.len() as u64;
    summary.lost_writes += lost(&backup, &acked)?;
    finish(config, summary, backup, &dir)
}

fn kill_backup(
    config: &Config,
    cycle: u64,
    rng: &mut Rng,
    summary: &mut Summary,
) -> Result<(), String> {
    let (primary, mut backup, dir) = pair(config, cycle, None)?;
    let writers = Writers::start(&primary, cycle, 2);
    std::thread::sleep(Duration::from_millis(100 + rng.below(500)));
    if rng.below(2) == 0 {
        stir(&primary, rng);
    }
    backup.kill9();
    summary.backup_kills += 1;
    std::thread::sleep(Duration::from_millis(rng.below(300)));
    restart_and_compare(config, cycle, rng, summary, (primary, backup, dir), writers)
}

/// Where a backup is made to die by a crash point (a `failpoints` build, armed through
/// `FAILPOINTS`), and at most how many passes before it: a log frame stored, an index
/// frame received, a commit's nodes written but not its descriptor.
pub const CRASH_POINTS: [(&str, u64); 3] = [
    ("backup-log", 400),
    ("backup-nodes", 6),
    ("backup-commit", 6),
];

/// Kills the backup at a crash point (as `kill -9` does) under writes, with commits forced
/// on the primary so index frames and commits reach it; then as `kill_backup`.
fn crash_backup(
    config: &Config,
    cycle: u64,
    rng: &mut Rng,
    summary: &mut Summary,
) -> Result<(), String> {
    let which = rng.below(CRASH_POINTS.len() as u64) as usize;
    let (point, most) = CRASH_POINTS[which];
    let passes = rng.below(most);
    let armed = format!("{point}={passes}*off->return");
    let (primary, mut backup, dir) = pair(config, cycle, Some(&armed))?;
    let writers = Writers::start(&primary, cycle, 2);
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = backup.child.try_wait() {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "the backup never died at {armed} (is {} built with --features failpoints?)",
                config.tucana.display()
            ));
        }
        if let Ok(mut c) = primary.connect() {
            let _ = redis::cmd("SAVE").query::<String>(&mut c);
        }
        std::thread::sleep(Duration::from_millis(20 + rng.below(80)));
    }
    summary.crash_points[which] += 1;
    restart_and_compare(config, cycle, rng, summary, (primary, backup, dir), writers)
}

/// Restarts a killed backup under the writers, waits until it caught up, then shuts the
/// primary down and promotes the backup: it must hold every acknowledged write and equal
/// the primary key for key, and its volume must pass `tucana check`.
fn restart_and_compare(
    config: &Config,
    cycle: u64,
    rng: &mut Rng,
    summary: &mut Summary,
    (mut primary, mut backup, dir): (Server, Server, PathBuf),
    writers: Writers,
) -> Result<(), String> {
    let log = dir.join("servers.log");
    backup.restart(&config.tucana, &log)?;
    std::thread::sleep(Duration::from_millis(100 + rng.below(500)));
    let acked = writers.stop();
    // Everything the primary holds must reach the restarted backup: a commit, then wait
    // until a write made after it is acknowledged (the backup caught up).
    {
        let mut c = primary.connect().map_err(|e| e.to_string())?;
        let _ = redis::cmd("SAVE").query::<String>(&mut c);
        let start = Instant::now();
        loop {
            match redis::cmd("SET")
                .arg(format!("c{cycle}-caught-up"))
                .arg("x")
                .query::<String>(&mut c)
            {
                Ok(ok) if ok == "OK" => break,
                _ if start.elapsed() > Duration::from_secs(60) => {
                    return Err("the restarted backup never caught up".into());
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    let expected = contents(&primary)?;
    primary.shutdown();
    promote(&backup)?;
    let got = contents(&backup)?;
    summary.acked_writes += acked.len() as u64;
    summary.lost_writes += lost(&backup, &acked)?;
    if got != expected {
        let missing = expected.keys().filter(|k| !got.contains_key(*k)).count();
        let extra = got.keys().filter(|k| !expected.contains_key(*k)).count();
        return Err(format!(
            "after catching up, the backup differs from its primary: {missing} keys missing, {extra} extra, {} in all",
            expected.len()
        ));
    }
    finish(config, summary, backup, &dir)
}

fn fence_primary(
    config: &Config,
    cycle: u64,
    rng: &mut Rng,
    summary: &mut Summary,
) -> Result<(), String> {
    let (primary, backup, dir) = pair(config, cycle, None)?;
    let writers = Writers::start(&primary, cycle, 1);
    std::thread::sleep(Duration::from_millis(100 + rng.below(300)));
    let acked = writers.stop();
    primary.signal(libc::SIGSTOP);
    promote(&backup)?;
    primary.signal(libc::SIGCONT);
    // Writes to the old primary now: none may be acknowledged.
    let late = Writers::start(&primary, cycle + 1_000_000, 2);
    std::thread::sleep(Duration::from_millis(2500 + rng.below(1000)));
    let late_acked = late.stop();
    summary.acked_after_fence += late_acked.len() as u64;
    if !late_acked.is_empty() {
        eprintln!(
            "failover: the fenced primary acknowledged {} writes, e.g. {:?}",
            late_acked.len(),
            late_acked.keys().next()
        );
    }
    summary.fences += 1;
    summary.acked_writes += acked.len() as u64;
    summary.lost_writes += lost(&backup, &acked)?;
    drop(primary);
    finish(config, summary, backup, &dir)
}
