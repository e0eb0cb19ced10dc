//! Failover cycles of a whole cluster (row M8 of docs/reliability.md, its first part).
//!
//! Starts an etcd and `--servers` `tucana serve --cluster-etcd` processes (sync
//! durability, a replication port each, a short `--cluster-lease-ms`), creates the map
//! with `tucana cluster create --replicas 1`, then runs cycles. In each, writers (plain
//! connections that follow `MOVED` themselves: tucana-clusterprobe's `Router`, which
//! tucana-bench's side by side with Redis Cluster uses too) write unique keys with sync
//! durability and record every `OK`; at a seeded moment (mid-burst, right after a burst,
//! right after a `SAVE` on the victim so an index ship is in flight, during a forced
//! garbage collection pass over overwritten keys, or while one of its regions is being
//! split) the primary of a random region is killed with `kill -9`. The cycle waits until a write to a key of each
//! of the victim's regions is acknowledged (the kill → first acknowledged write time, per
//! region, is the failover time) and until the survivors' `CLUSTER SLOTS` covers every
//! slot with a live primary; restarts the victim on its volume and sends it writes
//! directly (no redirect followed) for the regions it led: each must be answered with an
//! error (`MOVED`, `CLUSTERDOWN`, ...), never `OK`. Every third cycle (`--pause-every`) also pauses
//! (`SIGSTOP`) a primary past its lease until its regions are promoted, resumes it and
//! checks the same. Each cycle ends by reading every acknowledged key back through the
//! cluster; `tucana check` runs on each victim's volume before its restart, and at the
//! end on every volume after the servers were shut down.
//!
//! The victim may be the coordinator (it is one of the servers): a new one must be
//! elected for the failover to finish. Between cycles the run waits until every region
//! has a backup that caught up (`INFO replication`: online, no lag), because promoting a
//! backup still catching up is a window DESIGN.md leaves open, not what this measures.
//!
//! Owns the run's processes, plan and verdict; the servers and etcd are the real
//! binaries. Writers run on threads of their own, each with its own connections; the
//! rest runs on the calling thread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tucana_clusterprobe::etcd::Etcd;
use tucana_clusterprobe::{
    backups_in_sync, connect, served, slot_ranges, tag_in, Range, Router, Writers,
};

use crate::serve::{check_outcome, free_port, Checked, Server};
use crate::Rng;

pub struct Config {
    pub cycles: u64,
    pub seed: u64,
    pub dir: PathBuf,
    pub tucana: PathBuf,
    pub servers: usize,
    pub lease_ms: u64,
    /// A pause cycle after every `pause_every`-th kill cycle (0: none).
    pub pause_every: u64,
    /// Leaked blocks (a check's only finding) are counted but fail no run: for CI while
    /// the leak M8 found is open (docs/reliability.md), so the run still fails on any
    /// lost or stale write or any other check finding.
    pub leaks_not_fatal: bool,
}

/// What a run found.
#[derive(Default)]
pub struct Summary {
    pub cycles: u64,
    pub primary_kills: u64,
    pub pauses: u64,
    pub acked_writes: u64,
    /// Acknowledged keys missing or holding another value at the end of their cycle.
    pub lost: Vec<String>,
    /// Keys a server acknowledged, sent to it directly, for a region it no longer led.
    pub stale_acks: Vec<String>,
    pub check_failures: u64,
    /// Checks whose only finding was leaked blocks (counted apart from `check_failures`).
    pub leaks: u64,
    /// Whether `leaks` fail the run (`Config::leaks_not_fatal`).
    pub leaks_fatal: bool,
    /// Kill → first write acknowledged by the new primary, per region of the victim, ms.
    pub failover_ms: Vec<f64>,
    /// Kills that landed before the victim answered a forced GC pass it was running.
    pub gc_kills: u64,
    /// Kills that landed while a split of one of the victim's regions was under way
    /// (the split must still finish, through the promoted backup).
    pub migration_kills: u64,
    pub failure: Option<String>,
}

impl Summary {
    pub fn failed(&self) -> bool {
        self.failure.is_some()
            || !self.lost.is_empty()
            || !self.stale_acks.is_empty()
            || self.check_failures > 0
            || (self.leaks_fatal && self.leaks > 0)
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
            "M8 cluster cycles: {}, primary kills: {}, pauses: {}, acknowledged writes: {}, lost: {}, \
             acknowledged by a stale primary: {}, check failures: {}, checks finding only leaked blocks: {}, failover p50: {:.0} ms, p99: {:.0} ms, \
             kills during a GC pass: {}, during a split: {}, seed: {seed}",
            self.cycles,
            self.primary_kills,
            self.pauses,
            self.acked_writes,
            self.lost.len(),
            self.stale_acks.len(),
            self.check_failures,
            self.leaks,
            pct(0.5),
            pct(0.99),
            self.gc_kills,
            self.migration_kills,
        )
    }
}

/// A bound on waits for something that should happen; reaching it fails the run.
const PATIENCE: Duration = Duration::from_secs(90);

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> Result<T, String> {
    tucana_clusterprobe::wait_for(what, PATIENCE, f)
}

/// The run's servers, their addresses and whether each is running (not killed, not
/// stopped).
struct Fleet {
    servers: Vec<Server>,
    addrs: Vec<String>,
    up: Vec<bool>,
    /// Running for the run; dropped after the servers (fields drop in order).
    etcd: Etcd,
    log: PathBuf,
    tucana: PathBuf,
}

impl Fleet {
    fn start(config: &Config) -> Result<Fleet, String> {
        std::fs::create_dir_all(&config.dir).map_err(|e| e.to_string())?;
        let etcd = Etcd::start(&config.dir, "m8", PATIENCE)?;
        let log = config.dir.join("servers.log");
        let mut servers = Vec::new();
        for i in 0..config.servers {
            let port = free_port().map_err(|e| e.to_string())?;
            let repl = free_port().map_err(|e| e.to_string())?;
            let args: Vec<String> = [
                "--durability",
                "sync",
                "--cluster-etcd",
                &etcd.endpoint,
                "--cluster-name",
                "m8",
                "--cluster-lease-ms",
                &config.lease_ms.to_string(),
                "--repl-port",
                &repl.to_string(),
                // Migrations in small paced batches, so a kill can land inside a split.
                "--cluster-migrate-batch",
                "256",
                "--cluster-migrate-pause-ms",
                "20",
                // Planned failovers between the kills (the coordinator's balancing).
                "--cluster-balance-leaders",
                "true",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let db = config.dir.join(format!("server{i}.tucana"));
            servers.push(Server::start(&config.tucana, &db, port, &args, None, &log)?);
        }
        let addrs: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let mut create = vec!["create", "--replicas", "1"];
        create.extend(addrs.iter().map(String::as_str));
        cluster_command(&config.tucana, &etcd.endpoint, &create)?;
        Ok(Fleet {
            up: vec![true; servers.len()],
            servers,
            addrs,
            etcd,
            log,
            tucana: config.tucana.clone(),
        })
    }

    /// What each live server says of the map and of its replication, for a failure's
    /// message.
    fn report(&self) -> String {
        let mut out = String::new();
        for addr in self.live() {
            let info = connect(addr).and_then(|mut c| {
                redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut c)
            });
            out.push_str(&format!(
                "\n{addr}: slots {:?}\n{}",
                slot_ranges(addr),
                info.unwrap_or_else(|e| e.to_string()).trim()
            ));
        }
        out
    }

    /// `tucana cluster ARGS --etcd .. --name m8`'s stdout, or its stderr as the error.
    fn tucana_cluster(&self, args: &[&str]) -> Result<String, String> {
        cluster_command(&self.tucana, &self.etcd.endpoint, args)
    }

    /// Whether `tucana cluster status` shows a migration.
    fn migrating(&self) -> bool {
        self.tucana_cluster(&["status"])
            .is_ok_and(|out| out.lines().any(|l| l.starts_with("migrating:")))
    }

    /// Starts `tucana cluster split` of the region whose slots are `range`'s, on a thread
    /// that returns once the split finished (or failed).
    fn split(&self, range: &Range) -> Result<std::thread::JoinHandle<Result<(), String>>, String> {
        let status = self.tucana_cluster(&["status"])?;
        let slots = format!(": slots {}-{} (", range.start, range.end);
        let id = status
            .lines()
            .find(|l| l.starts_with("region ") && l.contains(&slots))
            .and_then(|l| l.strip_prefix("region "))
            .and_then(|l| l.split(':').next())
            .ok_or_else(|| {
                format!(
                    "no region with slots {}-{}:\n{status}",
                    range.start, range.end
                )
            })?
            .to_owned();
        let (tucana, etcd) = (self.tucana.clone(), self.etcd.endpoint.clone());
        Ok(std::thread::spawn(move || {
            cluster_command(&tucana, &etcd, &["split", &id, "--wait-secs", "120"]).map(drop)
        }))
    }

    fn live(&self) -> Vec<&str> {
        self.addrs
            .iter()
            .zip(&self.up)
            .filter(|(_, up)| **up)
            .map(|(a, _)| a.as_str())
            .collect()
    }

    fn index_of(&self, addr: &str) -> Result<usize, String> {
        self.addrs
            .iter()
            .position(|a| a == addr)
            .ok_or_else(|| format!("{addr} is not one of the run's servers"))
    }

    /// The map as a running server other than `besides` reports it, once it covers
    /// every slot with a live primary.
    fn served_map(&self, besides: Option<usize>) -> Result<Vec<Range>, String> {
        let live = self.live();
        let asked: Vec<&str> = live
            .iter()
            .copied()
            .filter(|a| besides.is_none_or(|i| *a != self.addrs[i]))
            .collect();
        wait_for("every slot served by a live primary", || {
            asked
                .iter()
                .filter_map(|a| slot_ranges(a))
                .find(|r| served(r, &live))
        })
    }

    /// Waits until every region is served, has a backup, and every primary's backups are
    /// online with nothing left to ship (after a `SAVE`, so the index reached them too).
    fn settle(&self) -> Result<Vec<Range>, String> {
        let live = self.live();
        let mut polls = 0u64;
        wait_for("every region with a caught-up backup", || {
            polls += 1;
            let ranges = live
                .iter()
                .filter_map(|a| slot_ranges(a))
                .find(|r| served(r, &live))?;
            if ranges.iter().any(|r| r.backups.is_empty()) {
                return None;
            }
            for r in &ranges {
                let mut c = connect(&r.primary).ok()?;
                if polls % 20 == 1 {
                    let _ = redis::cmd("SAVE").query::<redis::Value>(&mut c);
                }
                let info: String = redis::cmd("INFO").arg("replication").query(&mut c).ok()?;
                let slaves: Vec<&str> = info
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains(":ip="))
                    .collect();
                if slaves.is_empty()
                    || slaves
                        .iter()
                        .any(|l| !l.contains("state=online") || !l.contains("lag_bytes=0,"))
                {
                    return None;
                }
            }
            // And the map lists every backup in sync (else the coordinator would not
            // promote it): `CLUSTER SHARDS` says `loading` for one that is not.
            if !backups_in_sync(live[0])? {
                return None;
            }
            Some(ranges)
        })
    }
}

/// Where the kill lands in a cycle.
#[derive(Clone, Copy, Debug)]
enum Moment {
    MidBurst,
    AfterBurst,
    AfterSave,
    /// Keys of a victim's region overwritten, then a forced GC pass (`BGREWRITEAOF`).
    DuringGc,
    /// `tucana cluster split` of a victim's region begun (paced batches).
    DuringSplit,
}

/// What a moment left running past the kill.
enum Underway {
    Nothing,
    /// The forced GC pass: whether the victim answered it.
    Gc(std::thread::JoinHandle<bool>),
    /// The split command, which waits for the migration to finish.
    Split(std::thread::JoinHandle<Result<(), String>>),
}

pub fn run(config: &Config) -> Summary {
    let mut summary = Summary {
        leaks_fatal: !config.leaks_not_fatal,
        ..Summary::default()
    };
    let mut fleet = match Fleet::start(config) {
        Ok(f) => f,
        Err(e) => {
            summary.failure = Some(format!("starting the cluster: {e}"));
            return summary;
        }
    };
    for cycle in 0..config.cycles {
        let mut rng = Rng::new(config.seed ^ cycle.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let result = kill_cycle(config, &mut fleet, cycle, &mut rng, &mut summary).and_then(|()| {
            if config.pause_every > 0 && cycle % config.pause_every == config.pause_every - 1 {
                pause_cycle(config, &mut fleet, cycle, &mut rng, &mut summary)
            } else {
                Ok(())
            }
        });
        summary.cycles += 1;
        if let Err(e) = result {
            summary.failure = Some(format!(
                "cycle {cycle}: {e} (servers' log: {})",
                fleet.log.display()
            ));
            return summary;
        }
    }
    for server in &mut fleet.servers {
        server.shutdown();
    }
    for server in &fleet.servers {
        let what = server.db.display().to_string();
        count_check(&mut summary, &config.tucana, &server.db, &what);
    }
    summary
}

/// Checks a volume and counts what the check found (`what` names it in the message).
fn count_check(summary: &mut Summary, tucana: &Path, db: &Path, what: &str) {
    match check_outcome(tucana, db) {
        Checked::Passed => {}
        Checked::Leaked => {
            eprintln!("cluster: tucana check found leaked blocks on {what}");
            summary.leaks += 1;
        }
        Checked::Failed => {
            eprintln!("cluster: tucana check failed on {what}");
            summary.check_failures += 1;
        }
    }
}

fn kill_cycle(
    config: &Config,
    fleet: &mut Fleet,
    cycle: u64,
    rng: &mut Rng,
    summary: &mut Summary,
) -> Result<(), String> {
    let ranges = fleet.settle()?;
    let victim_addr = ranges[rng.below(ranges.len() as u64) as usize]
        .primary
        .clone();
    let victim = fleet.index_of(&victim_addr)?;
    let led: Vec<Range> = ranges
        .iter()
        .filter(|r| r.primary == victim_addr)
        .cloned()
        .collect();
    let moment = [
        Moment::MidBurst,
        Moment::AfterBurst,
        Moment::AfterSave,
        Moment::DuringGc,
        Moment::DuringSplit,
    ][rng.below(5) as usize];
    let seeds = fleet.addrs.clone();
    let writers = Writers::start(&seeds, &format!("c{cycle}"), 4);
    std::thread::sleep(Duration::from_millis(200 + rng.below(1000)));
    let mut acked = BTreeMap::new();
    let mut underway = Underway::Nothing;
    let writers = match moment {
        Moment::MidBurst => writers,
        Moment::DuringGc => {
            let seeds = fleet.live().iter().map(|s| s.to_string()).collect();
            overwrite(seeds, &led[0], &format!("c{cycle}-g"), &mut acked)?;
            let addr = victim_addr.clone();
            underway = Underway::Gc(std::thread::spawn(move || {
                connect(&addr)
                    .and_then(|mut c| redis::cmd("BGREWRITEAOF").query::<redis::Value>(&mut c))
                    .is_ok()
            }));
            std::thread::sleep(Duration::from_millis(rng.below(40)));
            writers
        }
        Moment::DuringSplit => {
            let split = fleet.split(&led[0])?;
            // Under way, or already done (a small region moves in one batch).
            wait_for("the split under way", || {
                (fleet.migrating() || split.is_finished()).then_some(())
            })?;
            underway = Underway::Split(split);
            std::thread::sleep(Duration::from_millis(rng.below(300)));
            writers
        }
        Moment::AfterBurst => {
            acked.append(&mut writers.stop());
            Writers::start(&seeds, &format!("c{cycle}b"), 4)
        }
        Moment::AfterSave => {
            if let Ok(mut c) = connect(&victim_addr) {
                let _ = redis::cmd("SAVE").query::<redis::Value>(&mut c);
            }
            writers
        }
    };
    let killed = Instant::now();
    fleet.servers[victim].kill9();
    fleet.up[victim] = false;
    summary.primary_kills += 1;
    if matches!(underway, Underway::Split(_)) && fleet.migrating() {
        summary.migration_kills += 1;
    }
    eprintln!("cluster: cycle {cycle}: killed {victim_addr} ({moment:?})");
    // Each of the victim's regions takes a write again: the failover time.
    let mut router = Router::new(fleet.live().iter().map(|s| s.to_string()).collect());
    for r in &led {
        let key = format!("{{{}}}:c{cycle}-probe", tag_in(r.start, r.end));
        let mut last = String::new();
        wait_for("a write acknowledged by a new primary", || {
            router.set(&key, "p").map_err(|e| last = e).ok()
        })
        .map_err(|e| format!("{e}; {key} last answered: {last}; {}", fleet.report()))?;
        summary
            .failover_ms
            .push(killed.elapsed().as_secs_f64() * 1000.0);
        acked.insert(key, "p".into());
    }
    fleet.served_map(None)?;
    std::thread::sleep(Duration::from_millis(rng.below(500)));
    // The victim's volume as kill -9 left it must pass `check` too (the restart would
    // recover the same state).
    let what = format!(
        "cycle {cycle}: the killed {}",
        fleet.servers[victim].db.display()
    );
    count_check(summary, &config.tucana, &fleet.servers[victim].db, &what);
    fleet.servers[victim].restart(&config.tucana, &fleet.log)?;
    fleet.up[victim] = true;
    no_stale_acks(fleet, victim, &led, &format!("c{cycle}-stale"), summary)?;
    std::thread::sleep(Duration::from_millis(200 + rng.below(500)));
    acked.append(&mut writers.stop());
    match underway {
        Underway::Nothing => {}
        Underway::Gc(pass) => {
            if pass.join().unwrap_or(true) {
                eprintln!("cluster: cycle {cycle}: the GC pass ended before the kill");
            } else {
                summary.gc_kills += 1;
            }
        }
        Underway::Split(split) => split
            .join()
            .map_err(|_| "the split's thread panicked".to_string())?
            .map_err(|e| format!("the split of a killed primary's region: {e}"))?,
    }
    verify(fleet, &acked, moment, summary)
}

/// Writes 800 keys of ~1 KiB in `region` through the cluster (`seeds`), twice (so the
/// first versions are garbage for the collector), recording those acknowledged. A batch
/// refused (the region handed over meanwhile by the coordinator's balancing: `TRYAGAIN`,
/// then `MOVED`) is tried again a few times, then left out: it was not acknowledged.
fn overwrite(
    seeds: Vec<String>,
    region: &Range,
    prefix: &str,
    acked: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    let mut router = Router::new(seeds);
    let tag = tag_in(region.start, region.end);
    let filler = "x".repeat(1000);
    for version in 0..2 {
        for batch in 0..8 {
            let mut mset = redis::cmd("MSET");
            let mut written = Vec::new();
            for i in batch * 100..(batch + 1) * 100 {
                let key = format!("{{{tag}}}:{prefix}{i}");
                let value = format!("{version}{filler}");
                mset.arg(&key).arg(&value);
                written.push((key, value));
            }
            for _ in 0..5 {
                match router.query(&mset, &written[0].0) {
                    Ok(redis::Value::Okay) => {
                        acked.extend(written);
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
    }
    Ok(())
}

/// Writes sent straight to server `index` (no redirect followed) for each region of
/// `regions` it does not lead now: none may be answered `OK`. Asks several times over a
/// second, starting at once (a server just restarted or resumed is when it matters).
fn no_stale_acks(
    fleet: &Fleet,
    index: usize,
    regions: &[Range],
    prefix: &str,
    summary: &mut Summary,
) -> Result<(), String> {
    let addr = &fleet.addrs[index];
    let mut conn = wait_for("the server answering", || connect(addr).ok())?;
    for round in 0..5 {
        // The map as the others see it: this server's own view may be the stale one.
        let leads = fleet.served_map(Some(index))?;
        for r in regions {
            let now_led = leads
                .iter()
                .any(|l| l.start <= r.start && r.start <= l.end && l.primary == *addr);
            if now_led {
                continue;
            }
            let key = format!("{{{}}}:{prefix}-{round}", tag_in(r.start, r.end));
            let answer = redis::cmd("SET")
                .arg(&key)
                .arg("stale")
                .query::<redis::Value>(&mut conn);
            if let Ok(redis::Value::Okay) = answer {
                eprintln!("cluster: {addr} acknowledged {key} for a region it does not lead");
                summary.stale_acks.push(key);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// `tucana cluster ARGS` against the run's etcd: its stdout, or its stderr as the error.
fn cluster_command(tucana: &Path, etcd: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(tucana)
        .arg("cluster")
        .arg(args[0])
        .args(["--etcd", etcd, "--name", "m8"])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("tucana cluster {}: {e}", args[0]))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "tucana cluster {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Every acknowledged key reads back with its value through the cluster.
fn verify(
    fleet: &Fleet,
    acked: &BTreeMap<String, String>,
    moment: Moment,
    summary: &mut Summary,
) -> Result<(), String> {
    let mut router = Router::new(fleet.live().iter().map(|s| s.to_string()).collect());
    for (key, value) in acked {
        let got = wait_for("a read of an acknowledged key", || router.get(key).ok())?;
        if got.as_deref() != Some(value.as_str()) {
            eprintln!("cluster: acknowledged {key} reads {got:?} (kill {moment:?})");
            summary.lost.push(key.clone());
        }
    }
    summary.acked_writes += acked.len() as u64;
    Ok(())
}

/// Pauses the primary of a random region past its lease until its regions are promoted,
/// resumes it: it must acknowledge nothing for them afterwards, and nothing written
/// through the cluster meanwhile may be lost.
fn pause_cycle(
    _config: &Config,
    fleet: &mut Fleet,
    cycle: u64,
    rng: &mut Rng,
    summary: &mut Summary,
) -> Result<(), String> {
    let ranges = fleet.settle()?;
    let addr = ranges[rng.below(ranges.len() as u64) as usize]
        .primary
        .clone();
    let index = fleet.index_of(&addr)?;
    let led: Vec<Range> = ranges
        .iter()
        .filter(|r| r.primary == addr)
        .cloned()
        .collect();
    let writers = Writers::start(&fleet.addrs, &format!("c{cycle}p"), 4);
    std::thread::sleep(Duration::from_millis(200 + rng.below(500)));
    fleet.servers[index].signal(libc::SIGSTOP);
    fleet.up[index] = false;
    summary.pauses += 1;
    let promoted = fleet.served_map(Some(index));
    fleet.servers[index].signal(libc::SIGCONT);
    fleet.up[index] = true;
    promoted?;
    no_stale_acks(fleet, index, &led, &format!("c{cycle}-paused"), summary)?;
    let acked = writers.stop();
    verify(fleet, &acked, Moment::MidBurst, summary)
}
