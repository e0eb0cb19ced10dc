//! The fault campaign (issue 20): a Tucana cluster (etcd and 3 to 5 servers, each in a
//! network namespace of its own when root and `ip netns` allow, else on loopback with
//! process faults only) under a real Redis Cluster client workload while a nemesis
//! injects faults from a seed; the history of every operation is checked for
//! linearizability by Porcupine (tools/lincheck, a Go program), every acknowledged write
//! of a unique key is read back, and `tucana check` runs on every volume afterwards.
//!
//! The run: the checker's self-test (a history with a stale read must be reported
//! illegal, so a checker that cannot fail fails the campaign), the cluster started and
//! settled, the clients started, then nemesis steps ([`nemesis`]) until `duration_s`,
//! each followed by waiting for the cluster to settle (a step after which it does not
//! within 60 s is a finding) and a gap; then the clients stop, every key of the history
//! is read once more (part of the history), the unique keys are read back, the history
//! goes to the checker, the servers shut down and their volumes are checked.
//!
//! With `--target redis` the same campaign runs against Redis Cluster (the contrast the
//! issue asks for): six `redis-server` nodes, three masters with one replica each,
//! `appendonly yes` with `appendfsync everysec` (Redis's recommended default; `always`
//! as a variant), `cluster-node-timeout` equal to the lease; no etcd, so `etcd` faults
//! are dropped from the schedule (said); no `tucana check` (the figure says n/a).
//!
//! Owns the run and its verdict. Clients run on threads of their own
//! ([`workload`]); the nemesis on the calling thread.

pub mod fleet;
pub mod nemesis;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tucana_clusterprobe::netns::Net;

use crate::serve::{check_outcome, Checked};
use fleet::{Fleet, Member, Programs, Target, REDIS_NODES};
use nemesis::Fault;
use workload::{Ack, Op, Workload};

pub struct Config {
    pub target: Target,
    /// Redis's `appendfsync` (`everysec` or `always`) with `--target redis`.
    pub redis_fsync: String,
    pub seed: u64,
    pub duration_s: u64,
    pub faults: Vec<Fault>,
    pub servers: usize,
    /// Use network namespaces if this machine allows (else loopback, said so).
    pub netns: bool,
    pub clients: usize,
    pub lease_ms: u64,
    pub dir: PathBuf,
    pub programs: Programs,
    /// The checker's binary (tools/lincheck built with `go build`).
    pub lincheck: PathBuf,
    /// Whether a history not shown linearizable fails the run.
    pub violations_fatal: bool,
    /// Whether lost acknowledged writes fail the run.
    pub lost_fatal: bool,
}

#[derive(Default)]
pub struct Summary {
    /// The target's name and how it was made durable.
    pub target: String,
    /// Servers started.
    pub servers: usize,
    pub network: String,
    /// The fault kinds drawn from (partitions dropped without namespaces).
    pub faults: Vec<Fault>,
    pub steps: Vec<String>,
    pub ops: usize,
    pub acked: usize,
    pub refused: usize,
    pub indeterminate: usize,
    /// The checker's verdict: `ok`, `illegal`, `unknown` (timed out), or what failed.
    pub linearizable: String,
    pub unique_acked: usize,
    pub lost: Vec<String>,
    /// Acknowledged unique keys that could not be read at the end (not shown lost, not
    /// shown present: the run fails).
    pub unreadable: Vec<String>,
    pub check_failures: u64,
    /// Whether `tucana check` ran on the volumes (not for Redis Cluster).
    pub checked: bool,
    pub failover_ms: Vec<f64>,
    pub planned_ms: Vec<f64>,
    /// Planned failovers that gave up (`nemesis::Outcome::planned_aborted`).
    pub planned_aborted: usize,
    /// Per region of the first map: the fraction of the run's whole seconds with an
    /// acknowledged write to one of its slots.
    pub availability: Vec<f64>,
    /// Findings that are not a verdict of the checker (a region that did not fail
    /// over, a cluster that did not settle, a fault that could not be applied).
    pub troubles: Vec<String>,
    /// Writes sent to servers of a cut minority past the lease, and those acknowledged.
    pub minority_probes: usize,
    pub minority_acks: Vec<String>,
    /// Whether an acknowledgement by a cut minority fails the run (Tucana's fencing
    /// promise; Redis Cluster's is reported).
    pub fencing_fatal: bool,
    pub failure: Option<String>,
    pub elapsed_s: f64,
    /// `Config::violations_fatal`.
    pub violations_fatal: bool,
    /// `Config::lost_fatal`.
    pub lost_fatal: bool,
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
}

impl Summary {
    pub fn failed(&self) -> bool {
        let checker_found = matches!(self.linearizable.as_str(), "illegal" | "unknown");
        self.failure.is_some()
            || (self.linearizable != "ok" && (self.violations_fatal || !checker_found))
            || (!self.lost.is_empty() && self.lost_fatal)
            || !self.unreadable.is_empty()
            || self.check_failures > 0
            || (!self.minority_acks.is_empty() && self.fencing_fatal)
    }

    pub fn figure_line(&self, config: &Config) -> String {
        let avail_min = self.availability.iter().copied().fold(f64::NAN, f64::min);
        let avail_mean = if self.availability.is_empty() {
            f64::NAN
        } else {
            self.availability.iter().sum::<f64>() / self.availability.len() as f64
        };
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|f| format!("{f:?}").to_lowercase())
            .collect();
        format!(
            "campaign: target {}, seed {}, {:.0} s, {} servers, {}, faults {} ({} steps), ops {}, acknowledged {}, \
             refused {}, indeterminate {}, linearizable: {}, lost acknowledged writes: {} of {} unique ({} unreadable), \
             check failures: {}, failovers: {} (p50 {:.0} ms, p99 {:.0} ms), planned failovers: {} (p50 {:.0} ms, {} aborted), \
             availability per region: min {:.2}, mean {:.2}, troubles: {}, \
             minority acknowledged: {} of {} probes",
            self.target,
            config.seed,
            self.elapsed_s,
            self.servers,
            self.network,
            faults.join(","),
            self.steps.len(),
            self.ops,
            self.acked,
            self.refused,
            self.indeterminate,
            self.linearizable,
            self.lost.len(),
            self.unique_acked,
            self.unreadable.len(),
            if self.checked {
                self.check_failures.to_string()
            } else {
                "n/a".to_string()
            },
            self.failover_ms.len(),
            pct(&self.failover_ms, 0.5),
            pct(&self.failover_ms, 0.99),
            self.planned_ms.len(),
            pct(&self.planned_ms, 0.5),
            self.planned_aborted,
            avail_min,
            avail_mean,
            self.troubles.len(),
            self.minority_acks.len(),
            self.minority_probes,
        )
    }
}

/// Histories the checker must call illegal: a stale read, and a transaction's reads that
/// saw half of another transaction.
const ILLEGAL_HISTORIES: [(&str, &str); 2] = [
    (
        "a stale read",
        include_str!("../../../../tools/lincheck/testdata/stale-read.json"),
    ),
    (
        "a torn transaction",
        include_str!("../../../../tools/lincheck/testdata/torn-txn.json"),
    ),
];

/// Runs the checker on `history`; its verdict (`ok`, `illegal`, `unknown`) or why it
/// could not run. Writes the visualisation to `html` on a violation.
pub fn lincheck(lincheck: &Path, history: &Path, html: &Path) -> Result<String, String> {
    let output = Command::new(lincheck)
        .args(["-timeout-s", "120", "-html"])
        .arg(html)
        .arg(history)
        .output()
        .map_err(|e| format!("running {}: {e}", lincheck.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprint!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    match output.status.code() {
        Some(0) => Ok("ok".into()),
        Some(1) => Ok("illegal".into()),
        Some(3) => Ok("unknown".into()),
        other => Err(format!("lincheck exited {other:?}")),
    }
}

pub fn run(config: &Config) -> Summary {
    let started = Instant::now();
    let mut summary = Summary {
        violations_fatal: config.violations_fatal,
        lost_fatal: config.lost_fatal,
        fencing_fatal: config.target == Target::Tucana,
        ..Summary::default()
    };
    if let Err(e) = std::fs::create_dir_all(&config.dir) {
        summary.failure = Some(format!("{}: {e}", config.dir.display()));
        return summary;
    }
    // The checker can fail: a stale read and a torn transaction are violations.
    for (n, (what, history)) in ILLEGAL_HISTORIES.into_iter().enumerate() {
        let selftest = config.dir.join(format!("selftest-history-{n}.json"));
        let verdict = std::fs::write(&selftest, history)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                lincheck(
                    &config.lincheck,
                    &selftest,
                    &config.dir.join(format!("selftest-{n}.html")),
                )
            });
        if verdict.as_deref() != Ok("illegal") {
            summary.failure = Some(format!(
                "checker self-test: a history with {what} was judged {verdict:?}, not illegal"
            ));
            return summary;
        }
        eprintln!("campaign: checker self-test: {what} is reported illegal");
    }
    let result = campaign(config, &mut summary);
    summary.elapsed_s = started.elapsed().as_secs_f64();
    if let Err(e) = result {
        summary.failure = Some(e);
    }
    summary
}

/// The network (namespaces if asked and possible), the fault kinds left for it and the
/// target, and the cluster started; each said in `summary` and on stderr.
fn start_fleet(config: &Config, summary: &mut Summary) -> Result<(Fleet, Vec<Fault>), String> {
    let count = match config.target {
        Target::Tucana => config.servers,
        Target::Redis => REDIS_NODES,
    };
    summary.servers = count;
    summary.target = match config.target {
        Target::Tucana => format!("{} (--durability sync)", config.target.name()),
        Target::Redis => format!(
            "{} (appendonly yes, appendfsync {})",
            config.target.name(),
            config.redis_fsync
        ),
    };
    let net = if config.netns {
        match Net::create(count) {
            Ok(net) => Some(net),
            Err(why) => {
                eprintln!(
                    "campaign: no network namespaces ({why}): servers on loopback, process faults only (no partitions)"
                );
                None
            }
        }
    } else {
        eprintln!(
            "campaign: --netns off: servers on loopback, process faults only (no partitions)"
        );
        None
    };
    summary.network = if net.is_some() { "netns" } else { "loopback" }.into();
    let (faults, dropped) = nemesis::kinds_for(&config.faults, config.target, net.is_some());
    for note in dropped {
        eprintln!("campaign: {note}");
    }
    summary.faults = faults.clone();
    if faults.is_empty() {
        return Err("no fault kind left to inject".into());
    }
    let programs = Programs {
        tucana: config.programs.tucana.clone(),
        redis_server: config.programs.redis_server.clone(),
        redis_cli: config.programs.redis_cli.clone(),
    };
    let fleet = match config.target {
        Target::Tucana => {
            Fleet::start(programs, &config.dir, config.servers, config.lease_ms, net)?
        }
        Target::Redis => Fleet::start_redis(
            programs,
            &config.dir,
            config.lease_ms,
            &config.redis_fsync,
            net,
        )?,
    };
    Ok((fleet, faults))
}

fn campaign(config: &Config, summary: &mut Summary) -> Result<(), String> {
    let (mut fleet, faults) = start_fleet(config, summary)?;
    let settle = Duration::from_secs(60);
    let first_map = fleet.settle(Duration::from_secs(120))?;
    let seeds = fleet.addrs();
    let epoch = Instant::now();
    // The steps' times count from here; the servers' log lines from the run's start.
    eprintln!(
        "campaign: clients start at {:.3} s of the servers' log clock",
        crate::serve::run_clock_s()
    );
    let workload = Workload::start(&seeds, fleet.password(), config.clients, config.seed, epoch);
    if let Err(e) = nemesis_loop(config, &mut fleet, &faults, epoch, summary) {
        workload.stop();
        return Err(e);
    }
    let run_ns = epoch.elapsed().as_nanos() as u64;
    let mut recorded = workload.stop();
    // Every slot served again (backups are not needed to read back; a cluster left
    // without them was reported as trouble after its step).
    // A cluster that does not serve every slot is a finding; the history is still
    // checked (keys that cannot be read get no final read) and written.
    if let Err(e) = tucana_clusterprobe::wait_for("every slot served at the end", settle, || {
        fleet.served_map(None)
    }) {
        summary.troubles.push(format!("at the end: {e}"));
    }
    let unread = workload::final_reads(
        &seeds,
        fleet.password(),
        &mut recorded.history,
        config.clients,
        epoch,
        settle,
    );
    if !unread.is_empty() {
        summary.troubles.push(format!(
            "at the end, keys of the history not readable: {}",
            unread.join(" ")
        ));
    }
    let history = &recorded.history;
    summary.ops = history.len();
    summary.acked = history.iter().filter(|o| o.status == "ok").count();
    summary.refused = history.iter().filter(|o| o.status == "fail").count();
    summary.indeterminate = history.iter().filter(|o| o.status == "info").count();
    summary.availability = availability(&first_map, &recorded.acks, run_ns);
    let (lost, unreadable) =
        workload::lost_unique(&seeds, fleet.password(), &recorded.unique, settle);
    summary.unique_acked = recorded.unique.len();
    summary.lost = lost;
    summary.unreadable = unreadable;
    let path = config.dir.join("history.json");
    write_history(&path, history)?;
    summary.linearizable = lincheck(&config.lincheck, &path, &config.dir.join("history.html"))?;
    for server in &mut fleet.servers {
        match server {
            Member::Tucana(s) => s.shutdown(),
            Member::Redis(p) => p.stop(),
        }
    }
    summary.checked = config.target == Target::Tucana;
    for server in &fleet.servers {
        let Member::Tucana(server) = server else {
            continue;
        };
        if check_outcome(&config.programs.tucana, &server.db) != Checked::Passed {
            eprintln!("campaign: tucana check failed on {}", server.db.display());
            summary.check_failures += 1;
        }
    }
    Ok(())
}

/// Nemesis steps from the seed's schedule until `config.duration_s` after `epoch`, each
/// followed by waiting for the cluster to settle and the step's gap.
fn nemesis_loop(
    config: &Config,
    fleet: &mut Fleet,
    faults: &[Fault],
    epoch: Instant,
    summary: &mut Summary,
) -> Result<(), String> {
    let settle = Duration::from_secs(60);
    let steps = nemesis::schedule(config.seed, faults, 10_000);
    let deadline = Duration::from_secs(config.duration_s);
    // Let the clients warm up before the first fault.
    std::thread::sleep(Duration::from_millis(1000));
    for (n, step) in steps.iter().enumerate() {
        if epoch.elapsed() >= deadline {
            break;
        }
        let at = epoch.elapsed().as_secs_f64();
        let outcome = nemesis::apply(fleet, step, config.lease_ms);
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                // A fault that could not be applied or healed ends the run: what follows
                // would measure a broken harness.
                return Err(format!("step {n} ({:?}): {e}", step.fault));
            }
        };
        eprintln!(
            "campaign: [{at:6.1} s] step {n}: {}{}{}",
            outcome.what,
            if outcome.failover_ms.is_empty() {
                String::new()
            } else {
                format!(
                    ", failover {:?} ms",
                    outcome
                        .failover_ms
                        .iter()
                        .map(|m| m.round())
                        .collect::<Vec<_>>()
                )
            },
            outcome
                .trouble
                .as_ref()
                .map(|t| format!(", TROUBLE: {t}"))
                .unwrap_or_default()
        );
        summary.steps.push(outcome.what.clone());
        summary.failover_ms.extend(&outcome.failover_ms);
        summary.planned_ms.extend(outcome.planned_ms);
        summary.planned_aborted += usize::from(outcome.planned_aborted);
        summary.minority_probes += outcome.minority_probes;
        for ack in &outcome.minority_acks {
            eprintln!("campaign: FENCING: {ack}");
        }
        summary.minority_acks.extend(outcome.minority_acks);
        if let Some(t) = outcome.trouble {
            summary
                .troubles
                .push(format!("step {n}: {} : {t}", outcome.what));
        }
        if let Err(e) = fleet.settle(settle) {
            summary
                .troubles
                .push(format!("step {n}: {}: {e}", outcome.what));
            eprintln!("campaign: TROUBLE after step {n}: {e}");
        }
        std::thread::sleep(Duration::from_millis(step.gap_ms));
    }
    Ok(())
}

fn write_history(path: &Path, history: &[Op]) -> Result<(), String> {
    #[derive(serde::Serialize)]
    struct History<'a> {
        ops: &'a [Op],
    }
    let text = serde_json::to_string(&History { ops: history }).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Per region of `map`: the fraction of whole seconds of `run_ns` with an acknowledged
/// write to one of its slots.
fn availability(map: &[tucana_clusterprobe::Range], acks: &[Ack], run_ns: u64) -> Vec<f64> {
    let seconds = (run_ns / 1_000_000_000).max(1) as usize;
    map.iter()
        .map(|r| {
            let mut hit = vec![false; seconds];
            for a in acks {
                let s = (a.at_ns / 1_000_000_000) as usize;
                if (r.start..=r.end).contains(&a.slot) && s < seconds {
                    hit[s] = true;
                }
            }
            hit.iter().filter(|h| **h).count() as f64 / seconds as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tucana_clusterprobe::Range;

    #[test]
    fn availability_is_the_share_of_seconds_with_a_write_per_region() {
        let region = |start, end| Range {
            start,
            end,
            primary: String::new(),
            backups: Vec::new(),
        };
        let map = [region(0, 99), region(100, 16383)];
        let s = 1_000_000_000;
        let acks = [
            Ack { slot: 5, at_ns: 0 },
            Ack {
                slot: 7,
                at_ns: s / 2,
            },
            Ack {
                slot: 5,
                at_ns: 3 * s + 1,
            },
            Ack {
                slot: 200,
                at_ns: 2 * s,
            },
            // After the run's last whole second: not counted.
            Ack {
                slot: 200,
                at_ns: 4 * s + 5,
            },
        ];
        assert_eq!(availability(&map, &acks, 4 * s + 10), vec![0.5, 0.25]);
    }
}
