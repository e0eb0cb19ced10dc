//! The nemesis: a schedule of faults drawn from the seed ([`schedule`]), and each fault
//! applied to the running cluster, held, healed ([`apply`]).
//!
//! A step's kind, its choice among the servers (an index into a sorted list made when it
//! runs: the primaries, the backups, the regions), how long it holds and the gap after
//! it are all drawn from the seed, so a seed names a schedule; which server an index
//! names depends on the map at that moment (failovers move primaries), so a failure is
//! reproduced by running its seed, not guaranteed to recur at the same step. One fault
//! at a time: each is healed before the next is applied.
//!
//! Faults: `kill` (kill -9 of a primary, a backup or any server, which may be the
//! coordinator, then a restart on its volume); `pause` (SIGSTOP of a primary or backup
//! for longer than the lease, then SIGCONT); `partition` (with namespaces only: a server
//! isolated (its link down), a server cut from etcd, a primary cut from its backups, a
//! minority of servers cut from the majority and from etcd while clients still reach
//! them); `slow` (with namespaces only: a primary's, a backup's or any server's link
//! shaped by `tc tbf` to 256 kbit/s – 4 Mbit/s each way, dropping what queues longer
//! than 100–400 ms, for longer than the lease); `etcd` (kill -9 of etcd, a restart on
//! its data); `migrate` (`tucana cluster move-slots` of part of a region to another
//! server, alone or, every other time, with a kill -9 of the source's primary or of the
//! target in the middle of it); `failover` (`CLUSTER FAILOVER` on an in-sync backup).
//!
//! Against Redis Cluster (`--target redis`) the same schedule applies with these
//! differences: no `etcd` kind ([`kinds_for`] drops it); the partition that cuts a server
//! from etcd cuts it from every other server instead, and a minority is cut from the
//! majority only; `migrate` is `redis-cli --cluster reshard` between two masters.
//!
//! After a fault that takes a primary away, the time until a write to each region it
//! led is acknowledged by another server is a failover time.
//!
//! Runs on the calling thread; owns no process (the [`Fleet`] does).

use std::time::{Duration, Instant};

use tucana_clusterprobe::{connect_with, tag_in, Range};

use super::fleet::{Fleet, Target};
use crate::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    Kill,
    Pause,
    Partition,
    Slow,
    Etcd,
    Migrate,
    Failover,
}

/// One step of the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub fault: Fault,
    /// Which variant of the fault (e.g. which role a kill's victim has).
    pub variant: u64,
    /// Index into the candidates (taken modulo their number).
    pub pick: u64,
    /// A second index (a migration's target, a minority's size).
    pub pick2: u64,
    /// How long the fault holds beyond what it needs (past the lease for pauses and
    /// partitions).
    pub hold_ms: u64,
    /// Quiet time after the fault healed and the cluster settled.
    pub gap_ms: u64,
}

/// The kinds of `asked` that can be injected into `target`'s cluster (with network
/// namespaces or not), and a sentence for each kind dropped.
pub fn kinds_for(asked: &[Fault], target: Target, netns: bool) -> (Vec<Fault>, Vec<String>) {
    let mut notes = Vec::new();
    let mut kinds = asked.to_vec();
    for (kind, name) in [(Fault::Partition, "partition"), (Fault::Slow, "slow link")] {
        if !netns && kinds.contains(&kind) {
            kinds.retain(|f| *f != kind);
            notes.push(format!("{name} faults dropped: no network namespaces"));
        }
    }
    if target == Target::Redis && kinds.contains(&Fault::Etcd) {
        kinds.retain(|f| *f != Fault::Etcd);
        notes.push("etcd faults dropped: Redis Cluster has no etcd".to_string());
    }
    (kinds, notes)
}

/// `count` steps drawn from `seed` among `faults`.
pub fn schedule(seed: u64, faults: &[Fault], count: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| Step {
            fault: faults[rng.below(faults.len() as u64) as usize],
            variant: rng.next_u64(),
            pick: rng.next_u64(),
            pick2: rng.next_u64(),
            hold_ms: 500 + rng.below(3000),
            gap_ms: 500 + rng.below(2000),
        })
        .collect()
}

/// What a step did.
#[derive(Default)]
pub struct Outcome {
    pub what: String,
    /// Per region of a primary taken away: fault → a write acknowledged by another
    /// server, ms.
    pub failover_ms: Vec<f64>,
    /// A planned failover: request → the backup named primary, ms.
    pub planned_ms: Option<f64>,
    /// A planned failover that did not happen, its region still led, and written to, by
    /// its old primary: the handover gave up (its backup did not acknowledge the
    /// handover's write in time), as Redis's manual failover gives up after its timeout.
    pub planned_aborted: bool,
    /// Something that should have happened did not (a region never failed over, a
    /// command failed): a finding, reported, not a crash of the campaign.
    pub trouble: Option<String>,
    /// Writes sent straight to a server cut from etcd (alone or in a minority), past the
    /// lease, for a region it led: how many.
    pub minority_probes: usize,
    /// Those it acknowledged (each described): a fencing violation.
    pub minority_acks: Vec<String>,
}

/// How long past the lease a server cut from etcd (or a minority) is probed: by then
/// it may acknowledge no write (its lease ran out, or it lost its majority).
const MINORITY_PROBE_AFTER_MS: u64 = 1000;

/// A bound on waiting for a failover or a planned failover.
const FAILOVER_PATIENCE: Duration = Duration::from_secs(30);

/// Applies `step` to `fleet`, holds it, heals it.
pub fn apply(fleet: &mut Fleet, step: &Step, lease_ms: u64) -> Result<Outcome, String> {
    let map = fleet
        .served_map(None)
        .ok_or("no live server gives a served map")?;
    let primaries = sorted(map.iter().map(|r| r.primary.clone()));
    let backups = sorted(map.iter().flat_map(|r| r.backups.clone()));
    let all = fleet.addrs();
    let pick = |list: &[String], n: u64| list[(n % list.len() as u64) as usize].clone();
    let mut out = Outcome::default();
    match step.fault {
        Fault::Kill => {
            let (role, victim) = victim_of(step, &primaries, &backups, &all);
            let i = fleet.index_of(&victim).ok_or("victim not a server")?;
            let led = led_by(&map, &victim);
            out.what = format!("kill -9 {role} {victim} (leads {} regions)", led.len());
            let at = Instant::now();
            fleet.servers[i].kill9();
            fleet.up[i] = false;
            measure_failover(fleet, &victim, &led, at, &mut out);
            sleep_until(at, step.hold_ms);
            fleet.restart(i)?;
        }
        Fault::Pause => {
            let (role, victim) = match step.variant % 2 {
                0 => ("primary", pick(&primaries, step.pick)),
                _ if !backups.is_empty() => ("backup", pick(&backups, step.pick)),
                _ => ("primary", pick(&primaries, step.pick)),
            };
            let i = fleet.index_of(&victim).ok_or("victim not a server")?;
            let led = led_by(&map, &victim);
            out.what = format!("SIGSTOP {role} {victim} past the lease");
            let at = Instant::now();
            fleet.servers[i].signal(libc::SIGSTOP);
            fleet.up[i] = false;
            measure_failover(fleet, &victim, &led, at, &mut out);
            sleep_until(at, lease_ms + step.hold_ms);
            fleet.servers[i].signal(libc::SIGCONT);
            fleet.up[i] = true;
        }
        Fault::Partition => partition(fleet, &map, step, lease_ms, &mut out)?,
        Fault::Slow => slow(fleet, &primaries, &backups, step, lease_ms, &mut out)?,
        Fault::Etcd => {
            // Dropped from a Redis Cluster's kinds ([`kinds_for`]); said if asked anyway.
            let Some(etcd) = fleet.etcd.as_mut() else {
                out.what = "etcd: skipped (no etcd)".into();
                return Ok(out);
            };
            out.what = format!("kill -9 etcd for {} ms", step.hold_ms);
            etcd.kill();
            std::thread::sleep(Duration::from_millis(step.hold_ms));
            etcd.restart(Duration::from_secs(60))?;
        }
        Fault::Migrate if fleet.target == Target::Redis => {
            migrate_redis(fleet, &map, step, &mut out)
        }
        Fault::Migrate if step.variant % 2 == 1 => migrate_under_kill(fleet, &map, step, &mut out)?,
        Fault::Migrate => migrate(fleet, step, &mut out),
        Fault::Failover => {
            let with_backup: Vec<&Range> = map.iter().filter(|r| !r.backups.is_empty()).collect();
            if with_backup.is_empty() {
                out.what = "planned failover: no region has a backup".into();
                return Ok(out);
            }
            let r = with_backup[(step.pick % with_backup.len() as u64) as usize];
            let backup = r.backups[0].clone();
            out.what = format!(
                "CLUSTER FAILOVER on {backup} (backs slots {}-{} of {})",
                r.start, r.end, r.primary
            );
            let at = Instant::now();
            let answer = connect_with(&backup, fleet.password()).and_then(|mut c| {
                redis::cmd("CLUSTER")
                    .arg("FAILOVER")
                    .query::<redis::Value>(&mut c)
            });
            match answer {
                Err(e) => out.trouble = Some(format!("CLUSTER FAILOVER on {backup}: {e}")),
                Ok(_) => {
                    let start = r.start;
                    let done = tucana_clusterprobe::wait_for(
                        "the planned failover",
                        FAILOVER_PATIENCE,
                        || {
                            let m = fleet.served_map(None)?;
                            m.iter()
                                .any(|x| x.start <= start && start <= x.end && x.primary == backup)
                                .then_some(())
                        },
                    );
                    match done {
                        Ok(()) => out.planned_ms = Some(at.elapsed().as_secs_f64() * 1000.0),
                        Err(_) if old_primary_serves_on(fleet, r) => {
                            out.planned_aborted = true;
                            out.what.push_str(
                                ", aborted: the backup did not catch up in time and the primary serves on",
                            );
                        }
                        Err(e) => out.trouble = Some(e),
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Whether `r`'s primary still leads it in the served map and acknowledges a write to
/// its first slot sent straight to it: a planned failover that gave up, not a stuck one.
fn old_primary_serves_on(fleet: &Fleet, r: &Range) -> bool {
    let leads = fleet.served_map(None).is_some_and(|m| {
        m.iter()
            .any(|x| x.start <= r.start && r.start <= x.end && x.primary == r.primary)
    });
    let key = format!("{{{}}}:aborted-failover-probe", tag_in(r.start, r.start));
    leads
        && connect_with(&r.primary, fleet.password())
            .and_then(|mut c| {
                redis::cmd("SET")
                    .arg(&key)
                    .arg("a")
                    .query::<redis::Value>(&mut c)
            })
            .is_ok_and(|v| matches!(v, redis::Value::Okay))
}

/// A step's victim by role: a primary, a backup (if any) or any server, as its
/// `variant` says; which one, as its `pick` says.
fn victim_of(
    step: &Step,
    primaries: &[String],
    backups: &[String],
    all: &[String],
) -> (&'static str, String) {
    let pick = |list: &[String]| list[(step.pick % list.len() as u64) as usize].clone();
    match step.variant % 3 {
        0 => ("primary", pick(primaries)),
        1 if !backups.is_empty() => ("backup", pick(backups)),
        _ => ("server", pick(all)),
    }
}

fn sorted(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = items.collect();
    v.sort();
    v.dedup();
    v
}

fn led_by(map: &[Range], addr: &str) -> Vec<Range> {
    map.iter().filter(|r| r.primary == addr).cloned().collect()
}

fn sleep_until(from: Instant, ms: u64) {
    let until = from + Duration::from_millis(ms);
    let now = Instant::now();
    if until > now {
        std::thread::sleep(until - now);
    }
}

/// Until a write to each region of `led` is acknowledged by a server other than
/// `victim` (asked directly, as the map of a server other than the victim names it),
/// for at most [`FAILOVER_PATIENCE`] in all: each time from `at` into `out`; regions
/// that never fail over are trouble.
fn measure_failover(fleet: &Fleet, victim: &str, led: &[Range], at: Instant, out: &mut Outcome) {
    // A key of each region's first slot, the slot whose owner is asked: the region may
    // shrink meanwhile (a migration of its upper slots under the fault), and a key of
    // a moved slot would be answered MOVED by the owner of the first for ever.
    let keys: Vec<String> = (0..led.len())
        .map(|n| {
            let r = &led[n];
            format!("{{{}}}:failover-probe-{n}", tag_in(r.start, r.start))
        })
        .collect();
    let mut done = vec![false; led.len()];
    let started = Instant::now();
    while done.iter().any(|d| !d) && started.elapsed() < FAILOVER_PATIENCE {
        if let Some(map) = fleet.served_map(Some(victim)) {
            for (n, r) in led.iter().enumerate() {
                if done[n] {
                    continue;
                }
                let Some(owner) = map.iter().find(|x| x.start <= r.start && r.start <= x.end)
                else {
                    continue;
                };
                if owner.primary == victim {
                    continue;
                }
                let acked = connect_with(&owner.primary, fleet.password())
                    .and_then(|mut c| {
                        redis::cmd("SET")
                            .arg(&keys[n])
                            .arg("p")
                            .query::<redis::Value>(&mut c)
                    })
                    .is_ok_and(|v| v == redis::Value::Okay);
                if acked {
                    done[n] = true;
                    out.failover_ms.push(at.elapsed().as_secs_f64() * 1000.0);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let stuck: Vec<String> = led
        .iter()
        .zip(&done)
        .filter(|(_, d)| !**d)
        .map(|(r, _)| format!("{}-{}", r.start, r.end))
        .collect();
    if !stuck.is_empty() {
        out.trouble = Some(format!(
            "slots {} of {victim} not failed over within {FAILOVER_PATIENCE:?}",
            stuck.join(",")
        ));
    }
}

fn partition(
    fleet: &mut Fleet,
    map: &[Range],
    step: &Step,
    lease_ms: u64,
    out: &mut Outcome,
) -> Result<(), String> {
    let Some(net) = fleet.net.as_ref() else {
        out.what = "partition: skipped (no network namespaces)".into();
        return Ok(());
    };
    let n = fleet.servers.len();
    let addrs = fleet.addrs();
    let i = (step.pick % n as u64) as usize;
    let victim = addrs[i].clone();
    let led = led_by(map, &victim);
    let at = Instant::now();
    match step.variant % 4 {
        0 => {
            out.what = format!("isolate {victim} (its link down)");
            net.link_down(i)?;
            measure_failover(fleet, &victim, &led, at, out);
            sleep_until(at, lease_ms + step.hold_ms);
            fleet.net.as_ref().expect("checked").link_up(i)?;
        }
        1 if fleet.target == Target::Redis => {
            // No etcd: the server cut from every other (clients still reach it), the
            // partition in which Redis documents that a master acknowledges writes it
            // then loses.
            out.what = format!("cut {victim} from every other server");
            for j in (0..n).filter(|&j| j != i) {
                net.cut_pair(i, j)?;
            }
            measure_failover(fleet, &victim, &led, at, out);
            probe_and_hold(
                fleet,
                &[(victim.as_str(), led.clone())],
                step,
                lease_ms,
                at,
                out,
            );
            let net = fleet.net.as_ref().expect("checked");
            for j in (0..n).filter(|&j| j != i) {
                net.heal_pair(i, j)?;
            }
        }
        1 => {
            out.what = format!("cut {victim} from etcd");
            net.cut_etcd(i)?;
            measure_failover(fleet, &victim, &led, at, out);
            // Fenced: past its lease it acknowledges nothing, though clients reach it.
            probe_and_hold(
                fleet,
                &[(victim.as_str(), led.clone())],
                step,
                lease_ms,
                at,
                out,
            );
            fleet.net.as_ref().expect("checked").heal_etcd(i)?;
        }
        2 => {
            // A primary from its backups (etcd and clients still reach it).
            let Some(r) = map.get((step.pick % map.len() as u64) as usize) else {
                return Ok(());
            };
            let p = fleet.index_of(&r.primary).ok_or("primary not a server")?;
            let bs: Vec<usize> = r.backups.iter().filter_map(|b| fleet.index_of(b)).collect();
            out.what = format!("cut primary {} from its backups {:?}", r.primary, r.backups);
            for &b in &bs {
                net.cut_pair(p, b)?;
            }
            sleep_until(at, lease_ms + step.hold_ms);
            for &b in &bs {
                net.heal_pair(p, b)?;
            }
        }
        _ => cut_minority(fleet, map, step, lease_ms, i, at, out)?,
    }
    Ok(())
}

/// A minority (fewer than half, from server `i` on) cut from the majority and from etcd
/// (clients on the host still reach every server): regions with a copy outside fail
/// over, and past the lease the minority is probed.
fn cut_minority(
    fleet: &Fleet,
    map: &[Range],
    step: &Step,
    lease_ms: u64,
    i: usize,
    at: Instant,
    out: &mut Outcome,
) -> Result<(), String> {
    let net = fleet.net.as_ref().ok_or("no network namespaces")?;
    let n = fleet.servers.len();
    let addrs = fleet.addrs();
    // A minority (fewer than half) cut from the majority and from etcd; clients
    // on the host still reach every server.
    let size = 1 + (step.pick2 % ((n as u64 - 1) / 2).max(1)) as usize;
    let minority: Vec<usize> = (0..size).map(|k| (i + k) % n).collect();
    let names: Vec<&str> = minority.iter().map(|&m| addrs[m].as_str()).collect();
    let etcd = fleet.etcd.is_some();
    out.what = if etcd {
        format!("cut minority {names:?} from the majority and etcd")
    } else {
        format!("cut minority {names:?} from the majority")
    };
    for &m in &minority {
        if etcd {
            net.cut_etcd(m)?;
        }
        for j in (0..n).filter(|j| !minority.contains(j)) {
            net.cut_pair(m, j)?;
        }
    }
    // Only a region with a copy on the majority's side can fail over: one whose
    // primary and backups are all cut off stays down until the cut heals, by
    // design (no server outside may hold its acknowledged writes).
    let cut: Vec<&str> = minority.iter().map(|&m| addrs[m].as_str()).collect();
    for &m in &minority {
        let movable: Vec<Range> = led_by(map, &addrs[m])
            .into_iter()
            .filter(|r| r.backups.iter().any(|b| !cut.contains(&b.as_str())))
            .collect();
        measure_failover(fleet, &addrs[m], &movable, at, out);
    }
    // A partitioned minority acknowledges nothing once its lease is gone.
    let probed: Vec<(&str, Vec<Range>)> = minority
        .iter()
        .map(|&m| (addrs[m].as_str(), led_by(map, &addrs[m])))
        .collect();
    probe_and_hold(fleet, &probed, step, lease_ms, at, out);
    let net = fleet.net.as_ref().expect("checked");
    for &m in &minority {
        if etcd {
            net.heal_etcd(m)?;
        }
        for j in (0..n).filter(|j| !minority.contains(j)) {
            net.heal_pair(m, j)?;
        }
    }
    Ok(())
}

/// Holds a cut made at `at` until [`MINORITY_PROBE_AFTER_MS`] past the lease, probes
/// each server of `probed` for the regions it led ([`probe_minority`]), then holds the
/// cut until the step's end (at least half a second more).
fn probe_and_hold(
    fleet: &Fleet,
    probed: &[(&str, Vec<Range>)],
    step: &Step,
    lease_ms: u64,
    at: Instant,
    out: &mut Outcome,
) {
    sleep_until(at, lease_ms + MINORITY_PROBE_AFTER_MS);
    for (server, led) in probed {
        probe_minority(fleet, server, led, at, out);
    }
    sleep_until(
        at,
        lease_ms + step.hold_ms.max(MINORITY_PROBE_AFTER_MS + 500),
    );
}

/// Sends a write straight to `server` (cut off from etcd, alone or with a minority,
/// since `at`) for each
/// region of `led` (those it led when cut), without following a redirect: an `OK` is
/// an acknowledgement by a server that may no longer lead the region, counted in `out`.
fn probe_minority(fleet: &Fleet, server: &str, led: &[Range], at: Instant, out: &mut Outcome) {
    for (n, r) in led.iter().enumerate() {
        let key = format!("{{{}}}:minority-probe-{n}", tag_in(r.start, r.start));
        out.minority_probes += 1;
        let answer = connect_with(server, fleet.password()).and_then(|mut c| {
            redis::cmd("SET")
                .arg(&key)
                .arg("m")
                .query::<redis::Value>(&mut c)
        });
        if matches!(answer, Ok(redis::Value::Okay)) {
            out.minority_acks.push(format!(
                "{server} acknowledged a write to slots {}-{} {:.0} ms after it was cut off",
                r.start,
                r.end,
                at.elapsed().as_secs_f64() * 1000.0
            ));
        }
    }
}

/// A server's link slowed (both ways, `tc tbf`) for longer than the lease, then
/// restored. Writes slow down or time out (indeterminate), acknowledgements from its
/// backups may come too late (`NOREPLICAS`), and its lease may lapse (a failover): what
/// must not happen is an acknowledged write lost or a read out of order.
fn slow(
    fleet: &mut Fleet,
    primaries: &[String],
    backups: &[String],
    step: &Step,
    lease_ms: u64,
    out: &mut Outcome,
) -> Result<(), String> {
    let Some(net) = fleet.net.as_ref() else {
        out.what = "slow link: skipped (no network namespaces)".into();
        return Ok(());
    };
    let (role, victim) = victim_of(step, primaries, backups, &fleet.addrs());
    let i = fleet.index_of(&victim).ok_or("victim not a server")?;
    let rate_kbit = [256, 1024, 4096][(step.pick2 % 3) as usize];
    let latency_ms = 100 + (step.pick2 / 3) % 301;
    out.what = format!(
        "slow link of {role} {victim}: {rate_kbit} kbit/s each way, {latency_ms} ms of queue"
    );
    let at = Instant::now();
    net.shape(i, rate_kbit, 32, latency_ms)?;
    sleep_until(at, lease_ms + step.hold_ms);
    net.unshape(i)
}

/// A move the nemesis chose: slots `slots` of region `id` (led by `primary`) to `to`.
struct Move {
    id: String,
    slots: String,
    primary: String,
    to: String,
}

impl Move {
    fn args(&self) -> [&str; 10] {
        [
            "cluster",
            "move-slots",
            "--from-region",
            &self.id,
            "--slots",
            &self.slots,
            "--to",
            &self.to,
            "--wait-secs",
            "60",
        ]
    }
}

/// Chooses a suffix (a quarter, at most 512 slots) of a region of two slots or more,
/// and another live server to move it to; or says in `out` why there is none.
fn plan_move(fleet: &Fleet, step: &Step, out: &mut Outcome) -> Option<Move> {
    let status = match fleet.tucana_cli(&["cluster", "status"]) {
        Ok(s) => s,
        Err(e) => {
            out.what = "migrate".into();
            out.trouble = Some(e);
            return None;
        }
    };
    // "region ID: slots A-B (N slots), epoch E, primary SERVERID ADDR live, ..."
    let regions: Vec<(String, u32, u32, String)> = status
        .lines()
        .filter(|l| l.starts_with("region "))
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let id = t.get(1)?.trim_end_matches(':').to_string();
            let (a, b) = t.get(3)?.split_once('-')?;
            let p = t.iter().position(|w| *w == "primary")?;
            let addr = t.get(p + 2)?.to_string();
            Some((id, a.parse().ok()?, b.parse().ok()?, addr))
        })
        .filter(|r| r.2 > r.1)
        .collect();
    if regions.is_empty() {
        out.what = "migrate: no region of two slots or more".into();
        return None;
    }
    let (id, a, b, primary) = regions[(step.pick % regions.len() as u64) as usize].clone();
    let targets: Vec<String> = fleet.live().into_iter().filter(|s| *s != primary).collect();
    if targets.is_empty() {
        out.what = "migrate: no other live server".into();
        return None;
    }
    let to = targets[(step.pick2 % targets.len() as u64) as usize].clone();
    let count = ((b - a + 1) / 4).clamp(1, 512);
    Some(Move {
        id,
        slots: format!("{}-{b}", b + 1 - count),
        primary,
        to,
    })
}

/// `tucana cluster move-slots` of a suffix of a region to another live server, alone.
fn migrate(fleet: &Fleet, step: &Step, out: &mut Outcome) {
    let Some(m) = plan_move(fleet, step, out) else {
        return;
    };
    out.what = format!(
        "move slots {} of region {} ({}) to {}",
        m.slots, m.id, m.primary, m.to
    );
    if let Err(e) = fleet.tucana_cli(&m.args()) {
        out.trouble = Some(e);
    }
}

/// How long a migration may still run once the fault that overlapped it healed.
const MIGRATION_PATIENCE: Duration = Duration::from_secs(90);

/// A move (as [`migrate`]) with a fault in the middle of it: a few hundred milliseconds
/// after `move-slots` began, kill -9 of the source region's primary or of the server
/// the slots go to, restarted after the hold. The migration must still finish (by the
/// promoted backup, or to the restarted target) and lose nothing; one still running
/// [`MIGRATION_PATIENCE`] later is trouble. `move-slots` itself may give up waiting
/// (said in the step, not trouble: the map's migration goes on without it).
fn migrate_under_kill(
    fleet: &mut Fleet,
    map: &[Range],
    step: &Step,
    out: &mut Outcome,
) -> Result<(), String> {
    let Some(m) = plan_move(fleet, step, out) else {
        return Ok(());
    };
    let (role, victim) = if (step.variant / 2).is_multiple_of(2) {
        ("its source primary", m.primary.clone())
    } else {
        ("its target", m.to.clone())
    };
    let i = fleet.index_of(&victim).ok_or("victim not a server")?;
    out.what = format!(
        "move slots {} of region {} ({}) to {}, kill -9 of {role} {victim} mid-move",
        m.slots, m.id, m.primary, m.to
    );
    let mover = fleet
        .tucana_cli_command(&m.args())?
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting move-slots: {e}"))?;
    std::thread::sleep(Duration::from_millis(100 + step.pick2 % 700));
    let led = led_by(map, &victim);
    let at = Instant::now();
    fleet.servers[i].kill9();
    fleet.up[i] = false;
    measure_failover(fleet, &victim, &led, at, out);
    sleep_until(at, step.hold_ms);
    fleet.restart(i)?;
    let moved = mover.wait_with_output().map_err(|e| e.to_string())?;
    if !moved.status.success() {
        let said = String::from_utf8_lossy(&moved.stderr);
        out.what += &format!(" (move-slots: {})", said.trim());
    }
    let finished = tucana_clusterprobe::wait_for("the migration", MIGRATION_PATIENCE, || {
        let status = fleet.tucana_cli(&["cluster", "status"]).ok()?;
        (!status.lines().any(|l| l.starts_with("migrating:"))).then_some(())
    });
    if let Err(e) = finished {
        out.trouble = Some(e);
    }
    Ok(())
}

/// Redis Cluster's migration: `redis-cli --cluster reshard` of a quarter (at most 512)
/// of a region's slots from its master to another live master (slots and keys moved
/// with `CLUSTER SETSLOT` and `MIGRATE` by redis-cli).
fn migrate_redis(fleet: &Fleet, map: &[Range], step: &Step, out: &mut Outcome) {
    let regions: Vec<&Range> = map.iter().filter(|r| r.end > r.start).collect();
    if regions.is_empty() {
        out.what = "migrate: no region of two slots or more".into();
        return;
    }
    let r = regions[(step.pick % regions.len() as u64) as usize];
    let live = fleet.live();
    let masters: Vec<String> = sorted(map.iter().map(|x| x.primary.clone()))
        .into_iter()
        .filter(|m| *m != r.primary && live.contains(m))
        .collect();
    if masters.is_empty() {
        out.what = "migrate: no other live master".into();
        return;
    }
    let to = &masters[(step.pick2 % masters.len() as u64) as usize];
    let count = (u32::from(r.end - r.start + 1) / 4).clamp(1, 512);
    out.what = format!("reshard {count} slots of {} to {to}", r.primary);
    let id = |addr: &str| -> Result<String, String> {
        let mut c = connect_with(addr, fleet.password()).map_err(|e| format!("{addr}: {e}"))?;
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut c)
            .map_err(|e| format!("CLUSTER MYID on {addr}: {e}"))
    };
    let ids = id(&r.primary).and_then(|from| Ok((from, id(to)?)));
    let (from, to_id) = match ids {
        Ok(ids) => ids,
        Err(e) => {
            out.trouble = Some(e);
            return;
        }
    };
    let mut command = std::process::Command::new(&fleet.programs.redis_cli);
    if let Some(p) = fleet.password() {
        command.args(["--no-auth-warning", "-a", p]);
    }
    let output = command
        .args(["--cluster", "reshard", &r.primary])
        .args(["--cluster-from", &from, "--cluster-to", &to_id])
        .args(["--cluster-slots", &count.to_string(), "--cluster-yes"])
        .stdin(std::process::Stdio::null())
        .output();
    match output {
        Err(e) => out.trouble = Some(format!("running redis-cli: {e}")),
        Ok(o) if !o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let last: Vec<&str> = text.lines().rev().take(3).collect();
            out.trouble = Some(format!(
                "redis-cli --cluster reshard: {}: {} {}",
                o.status,
                last.join(" / "),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_faults_are_dropped_for_redis_and_partitions_without_namespaces() {
        let all = [
            Fault::Kill,
            Fault::Pause,
            Fault::Partition,
            Fault::Slow,
            Fault::Etcd,
            Fault::Migrate,
            Fault::Failover,
        ];
        let (redis, notes) = kinds_for(&all, Target::Redis, true);
        assert_eq!(
            redis,
            [
                Fault::Kill,
                Fault::Pause,
                Fault::Partition,
                Fault::Slow,
                Fault::Migrate,
                Fault::Failover
            ]
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("etcd"), "{notes:?}");
        let steps = schedule(3, &redis, 500);
        assert!(steps.iter().all(|s| s.fault != Fault::Etcd));
        assert!(steps.iter().any(|s| s.fault == Fault::Partition));
        let (tucana, notes) = kinds_for(&all, Target::Tucana, true);
        assert_eq!(tucana, all, "Tucana keeps every kind");
        assert!(notes.is_empty());
        let (loopback, notes) = kinds_for(&all, Target::Redis, false);
        assert!(!loopback.contains(&Fault::Partition) && !loopback.contains(&Fault::Etcd));
        assert!(!loopback.contains(&Fault::Slow));
        assert_eq!(notes.len(), 3, "{notes:?}");
        let (left, _) = kinds_for(&[Fault::Etcd], Target::Redis, true);
        assert!(left.is_empty(), "nothing left to inject: the run says so");
    }

    #[test]
    fn a_seed_names_its_schedule_and_draws_only_the_kinds_asked() {
        let kinds = [Fault::Kill, Fault::Partition, Fault::Migrate];
        let a = schedule(7, &kinds, 200);
        assert_eq!(a, schedule(7, &kinds, 200), "same seed, same schedule");
        assert_ne!(
            a,
            schedule(8, &kinds, 200),
            "another seed, another schedule"
        );
        for kind in kinds {
            assert!(a.iter().any(|s| s.fault == kind), "{kind:?} never drawn");
        }
        assert!(a.iter().all(|s| kinds.contains(&s.fault)));
    }
}
