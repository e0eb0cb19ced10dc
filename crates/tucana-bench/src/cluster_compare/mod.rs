//! The `cluster-compare` command: Redis Cluster (3 masters + 1 replica each, AOF
//! `everysec`) side by side with a Tucana cluster (3 servers, 1 backup per region, sync
//! durability; also buffered, Redis's mode), all on this machine, into a JSON file that
//! `report` turns into a section of BENCHMARKS.md (issue 19, "Proof", last bullet).
//!
//! The run: first `--rounds` rounds of throughput, each starting a fresh cluster of each
//! system in turn (so the systems alternate through whatever else the machine does) and
//! running `redis-benchmark --cluster` SET then GET at each pipeline depth with the same
//! `-c -n -d -r` for all; then, for each system on a fresh cluster, `--cycles` kill -9
//! cycles (`failover`) and a last read back of every key acknowledged in any cycle.
//! Failure detection is made comparable: the Redis `cluster-node-timeout` and the Tucana
//! `--cluster-lease-ms` are both `--timeout-ms` (default 4000, Tucana's default lease).
//!
//! Owns the command: its arguments, the order of the runs, the records (in `results`'
//! format) and their file (default `bench/cluster-results.json`, rewritten after each
//! cluster). The children: `fleet` the processes, `failover` the kill cycles. The
//! Markdown section is `document::cluster`'s. Single-threaded, except for the writers
//! and probes of the kill cycles.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use tucana_clusterprobe::{lost_keys, ClientKind};

use crate::results::{self, Machine, Record, RunOptions};
use crate::server::kind::{default_tucana, require, version_of};
use crate::server::process::load_average;
use crate::server::redis_benchmark::{redis_benchmark_cluster, Shape};
use crate::{measure, Result};

mod failover;
mod fleet;

use fleet::{Fleet, Programs, System, PATIENCE};

/// The results file's name; `report` looks for it next to the suite's JSON file.
pub const DEFAULT_JSON_FILE_NAME: &str = "cluster-results.json";

/// The record's workload of a kill cycle, and of the last read back.
pub const CYCLE_WORKLOAD: &str = "kill -9 cycle";
pub const READ_BACK_WORKLOAD: &str = "read back at the end";

/// The value at quantile `q` of `sorted` (nearest rank, as the crash tests print it).
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    Some(sorted[((sorted.len() - 1) as f64 * q).round() as usize])
}

/// The client of the kill cycles' writers and probes (the read back always uses
/// tucana-clusterprobe's `Router`). Default: the `redis` crate's, the one a Rust user of
/// either system would pick; `router` (M8's) retries nothing, but learns the slot map
/// one `MOVED` at a time, so with unique keys most of its writes take two round trips
/// and it acknowledges fewer per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientChoice {
    /// tucana-clusterprobe's (M8's): follows `MOVED`, retries nothing.
    Router,
    /// The `redis` crate's `ClusterClient`: its own slot map and retries (2).
    RedisCrate,
}

impl ClientChoice {
    fn kind(self) -> ClientKind {
        match self {
            ClientChoice::Router => ClientKind::Router,
            ClientChoice::RedisCrate => ClientKind::RedisCrate,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ClientChoice::Router => "router",
            ClientChoice::RedisCrate => "redis-crate",
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct ClusterCompareArgs {
    /// Systems to run, in this order in every round.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = System::ALL)]
    systems: Vec<System>,
    /// Directory in which the run's temporary directory (every node's files) is created.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// JSON file of the results (rewritten after every cluster).
    #[arg(long, default_value = "bench/cluster-results.json")]
    json: PathBuf,
    /// Connections of redis-benchmark (its -c).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    clients: u64,
    /// Requests per redis-benchmark test (its -n).
    #[arg(long, default_value_t = 500_000, value_parser = clap::value_parser!(u64).range(1..))]
    requests: u64,
    /// Bytes per value (its -d).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    value_bytes: u64,
    /// Random keys (its -r).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000_000))]
    keyspace: u64,
    /// Pipeline depths (its -P); SET then GET at each.
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 16], value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pipelines: Vec<u64>,
    /// Throughput rounds: each starts every system's cluster afresh, in turn.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=20))]
    rounds: u64,
    /// Kill -9 cycles per system (0: no failover experiment).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=1000))]
    cycles: u64,
    /// Client of the kill cycles' writers and probes.
    #[arg(long, value_enum, default_value_t = ClientChoice::RedisCrate)]
    client: ClientChoice,
    /// Writer threads of the kill cycles, each writing unique keys.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
    writers: u64,
    /// Writing before each kill, ms.
    #[arg(long, default_value_t = 2000)]
    warmup_ms: u64,
    /// Writing after the victim's ranges took a write again, ms.
    #[arg(long, default_value_t = 3000)]
    after_ms: u64,
    /// Failure detection of both systems: Redis's cluster-node-timeout and Tucana's
    /// --cluster-lease-ms (4000 is Tucana's default lease).
    #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u64).range(500..=600_000))]
    timeout_ms: u64,
    /// Seed of the victims.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The `tucana` binary (default: next to this program, else on PATH).
    #[arg(long)]
    tucana: Option<PathBuf>,
    #[arg(long, default_value = "redis-server")]
    redis_server: PathBuf,
    #[arg(long, default_value = "redis-cli")]
    redis_cli: PathBuf,
    #[arg(long, default_value = "redis-benchmark")]
    redis_benchmark: PathBuf,
    /// Tiny counts for a smoke test of the harness: 2000 requests, one cycle of short
    /// writing, a 2 s timeout (overrides those flags).
    #[arg(long)]
    quick: bool,
    /// A remark for the results document (repeatable), e.g. that the machine was shared.
    #[arg(long)]
    note: Vec<String>,
}

impl ClusterCompareArgs {
    fn apply_quick(&mut self) {
        if self.quick {
            self.requests = self.requests.min(2_000);
            self.keyspace = self.keyspace.min(2_000);
            self.pipelines.truncate(1);
            self.rounds = self.rounds.min(1);
            self.cycles = self.cycles.min(1);
            self.warmup_ms = self.warmup_ms.min(500);
            self.after_ms = self.after_ms.min(500);
            self.timeout_ms = self.timeout_ms.min(2000);
        }
    }

    fn shape(&self) -> Shape {
        Shape {
            clients: self.clients,
            requests: self.requests,
            value_bytes: self.value_bytes,
            keys: self.keyspace,
        }
    }
}

pub fn run(args: &ClusterCompareArgs) -> Result<()> {
    let mut args = args.clone();
    args.apply_quick();
    if args.systems.is_empty() {
        return Err("--systems is empty".into());
    }
    let tucana = args.tucana.clone().unwrap_or_else(default_tucana);
    let versions = [
        (
            "tucana_version",
            version_of(&tucana).map_err(|reason| {
                format!(
                    "{reason} (build it: cargo build --release -p tucana-cli, or pass --tucana)"
                )
            })?,
        ),
        (
            "redis_server_version",
            require(&args.redis_server, "redis-server runs the Redis Cluster")?,
        ),
        (
            "redis_benchmark_version",
            require(&args.redis_benchmark, "redis-benchmark measures throughput")?,
        ),
    ];
    require(&args.redis_cli, "redis-cli creates the Redis Cluster")?;
    let programs = Programs {
        tucana,
        redis_server: args.redis_server.clone(),
        redis_cli: args.redis_cli.clone(),
    };
    let mut machine = Machine::detect();
    machine.disk = measure::watch_device_of(&args.dir);
    let mut options = run_options(&args, &programs);
    for (name, version) in versions {
        options.set(name, version);
    }
    crate::describe_dir(&args.dir, &mut options);
    results::print_header("cluster-compare", &machine, &options);
    if let Some(parent) = args.json.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let work = tempfile::Builder::new()
        .prefix("tucana-cluster-compare-")
        .tempdir_in(&args.dir)?;
    let mut run = Run {
        args: &args,
        programs: &programs,
        work: work.path().to_path_buf(),
        machine: &machine,
        options: &mut options,
        records: Vec::new(),
        clusters: 0,
    };
    run.throughput()?;
    run.failover()?;
    run.options.set("load_average_after", load_average());
    run.save()?;
    println!("\nresults written to {}", args.json.display());
    Ok(())
}

/// What the results file records of the run before it starts.
fn run_options(args: &ClusterCompareArgs, programs: &Programs) -> RunOptions {
    let mut options = RunOptions::default();
    options.set("argv", std::env::args().collect::<Vec<_>>());
    options.set(
        "systems",
        args.systems.iter().map(|s| s.name()).collect::<Vec<_>>(),
    );
    options.set("clients", args.clients);
    options.set("requests", args.requests);
    options.set("value_bytes", args.value_bytes);
    options.set("keyspace", args.keyspace);
    options.set("pipelines", args.pipelines.clone());
    options.set("rounds", args.rounds);
    options.set("cycles", args.cycles);
    options.set("client", args.client.name());
    options.set("writers", args.writers);
    options.set("warmup_ms", args.warmup_ms);
    options.set("after_ms", args.after_ms);
    options.set("timeout_ms", args.timeout_ms);
    options.set("seed", args.seed);
    options.set("quick", args.quick);
    options.set("notes", args.note.clone());
    options.set("tucana_binary", programs.tucana.display().to_string());
    options.set("load_average_before", load_average());
    let configurations: Map<String, Value> = args
        .systems
        .iter()
        .map(|s| {
            (
                s.name().to_string(),
                json!(s.command_lines(args.timeout_ms)),
            )
        })
        .collect();
    options.set("configurations", Value::Object(configurations));
    options
}

/// The run in progress.
struct Run<'a> {
    args: &'a ClusterCompareArgs,
    programs: &'a Programs,
    work: PathBuf,
    machine: &'a Machine,
    options: &'a mut RunOptions,
    records: Vec<Record>,
    /// Clusters started so far (each gets a directory of its own).
    clusters: u64,
}

impl Run<'_> {
    fn save(&self) -> Result<()> {
        results::write_json(
            &self.args.json,
            "cluster-compare",
            self.machine,
            self.options,
            &self.records,
        )
    }

    /// Runs `body` on a fresh cluster of `system`, whose directory is removed after it
    /// stops (kept if `body` failed); its records join the run's and the file is
    /// rewritten.
    fn on_cluster(
        &mut self,
        system: System,
        body: impl FnOnce(&mut Fleet) -> Result<Vec<Record>>,
    ) -> Result<()> {
        self.clusters += 1;
        let dir = self
            .work
            .join(format!("{}-{}", self.clusters, system.name()));
        let started = Instant::now();
        let mut fleet = Fleet::start(system, self.programs, &dir, self.args.timeout_ms)?;
        println!(
            "{}: cluster up in {:.1} s ({})",
            system.name(),
            started.elapsed().as_secs_f64(),
            dir.display()
        );
        let new = match body(&mut fleet) {
            Ok(new) => new,
            Err(e) => {
                fleet.stop();
                // Kept for a look: the work directory is removed with the run otherwise.
                let kept = self.args.dir.join(format!(
                    "tucana-cluster-compare-failed-{}",
                    std::process::id()
                ));
                let _ = std::fs::rename(&dir, &kept);
                return Err(format!("{e} (the cluster's files: {})", kept.display()).into());
            }
        };
        fleet.stop();
        std::fs::remove_dir_all(&dir)?;
        self.records.extend(new);
        self.save()
    }

    /// `redis-benchmark --cluster` SET then GET at each pipeline depth, each round
    /// every system in turn.
    fn throughput(&mut self) -> Result<()> {
        let args = self.args;
        let shape = args.shape();
        for round in 0..args.rounds {
            for &system in &args.systems {
                let program = args.redis_benchmark.clone();
                self.on_cluster(system, |fleet| {
                    let mut records = Vec::new();
                    for &pipeline in &args.pipelines {
                        for test in ["SET", "GET"] {
                            let port = fleet.any_port()?;
                            let r =
                                redis_benchmark_cluster(&program, port, &shape, pipeline, test)?;
                            let mut record =
                                Record::unmeasured(system.name(), &format!("{test} -P {pipeline}"));
                            record.ops_per_sec = Some(r.requests_per_sec);
                            record.p50_us = Some(r.p50_ms * 1000.0);
                            record.p99_us = Some(r.p99_ms * 1000.0);
                            record.set("test", test);
                            record.set("pipeline", pipeline);
                            record.set("avg_ms", r.avg_ms);
                            record.set("max_ms", r.max_ms);
                            record.set("elapsed_s", r.elapsed.as_secs_f64());
                            record.set("round", round);
                            println!(
                                "{:<16} {:<10} round {round}: {:>10.0} requests/s, p50 {:.3} ms, p99 {:.3} ms",
                                system.name(),
                                record.workload,
                                r.requests_per_sec,
                                r.p50_ms,
                                r.p99_ms
                            );
                            records.push(record);
                        }
                    }
                    Ok(records)
                })?;
            }
        }
        Ok(())
    }

    /// The kill -9 cycles of each system on a fresh cluster, then the read back of every
    /// key acknowledged in any of them.
    fn failover(&mut self) -> Result<()> {
        let args = self.args;
        if args.cycles == 0 {
            return Ok(());
        }
        let plan = failover::CyclePlan {
            client: args.client.kind(),
            writers: args.writers as usize,
            warmup: Duration::from_millis(args.warmup_ms),
            after: Duration::from_millis(args.after_ms),
        };
        for &system in &args.systems {
            let mut rng = StdRng::seed_from_u64(args.seed);
            self.on_cluster(system, |fleet| {
                let mut records = Vec::new();
                let mut all = std::collections::BTreeMap::new();
                for c in 0..args.cycles {
                    let figures =
                        failover::cycle(fleet, c, &plan, |ranges| rng.random_range(0..ranges))?;
                    let mut record = Record::unmeasured(system.name(), CYCLE_WORKLOAD);
                    record.set("cycle", c);
                    record.set("victim", figures.victim.clone());
                    record.set("failover_ms", figures.failover_ms.clone());
                    record.set("acknowledged", figures.acknowledged.len() as u64);
                    record.set("lost", figures.lost.len() as u64);
                    record.set(
                        "lost_keys_first",
                        figures.lost.iter().take(10).cloned().collect::<Vec<_>>(),
                    );
                    record.set("writing_ms", figures.writing_ms);
                    record.set("rejoin_ms", figures.rejoin_ms);
                    println!(
                        "{:<16} cycle {c}: killed {}, failover {} ms, acknowledged {}, lost {}, rejoined in {:.1} s",
                        system.name(),
                        figures.victim,
                        figures
                            .failover_ms
                            .iter()
                            .map(|ms| format!("{ms:.0}"))
                            .collect::<Vec<_>>()
                            .join("/"),
                        figures.acknowledged.len(),
                        figures.lost.len(),
                        figures.rejoin_ms / 1000.0
                    );
                    records.push(record);
                    all.extend(figures.acknowledged);
                }
                // A cycle's failover: until the last of the victim's ranges took a write.
                let mut ms: Vec<f64> = records
                    .iter()
                    .filter_map(|r: &Record| {
                        r.get("failover_ms")?
                            .as_array()?
                            .iter()
                            .filter_map(Value::as_f64)
                            .reduce(f64::max)
                    })
                    .collect();
                ms.sort_by(f64::total_cmp);
                let lost_in_cycles: u64 = records
                    .iter()
                    .filter_map(|r| r.get("lost").and_then(Value::as_u64))
                    .sum();
                println!(
                    "{:<16} {} cycles: failover p50 {:.0} ms, p99 {:.0} ms; acknowledged {}, lost {}",
                    system.name(),
                    args.cycles,
                    quantile(&ms, 0.5).unwrap_or(f64::NAN),
                    quantile(&ms, 0.99).unwrap_or(f64::NAN),
                    all.len(),
                    lost_in_cycles
                );
                let lost = lost_keys(&fleet.live(), &all, PATIENCE)?;
                let mut record = Record::unmeasured(system.name(), READ_BACK_WORKLOAD);
                record.set("acknowledged", all.len() as u64);
                record.set("lost", lost.len() as u64);
                println!(
                    "{:<16} every cycle's acknowledged writes read back at the end: {} of {} lost",
                    system.name(),
                    lost.len(),
                    all.len()
                );
                records.push(record);
                Ok(records)
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: ClusterCompareArgs,
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[1.0, 2.0, 3.0], 0.5), Some(2.0));
        assert_eq!(quantile(&[1.0, 2.0, 3.0], 0.99), Some(3.0));
        assert_eq!(quantile(&[6.0, 7.0], 0.5), Some(7.0), "rounds half up");
    }

    #[test]
    fn quick_shrinks_every_count_and_keeps_the_systems() {
        use clap::Parser;
        let mut args = Cli::parse_from(["x", "--quick"]).args;
        assert_eq!(args.systems, System::ALL);
        args.apply_quick();
        assert_eq!(
            (args.requests, args.cycles, args.pipelines.len()),
            (2000, 1, 1)
        );
        assert_eq!(args.timeout_ms, 2000);
        let args = Cli::parse_from(["x", "--systems", "redis,tucana", "--cycles", "0"]).args;
        assert_eq!(args.systems, [System::Redis, System::Tucana]);
        assert_eq!(args.cycles, 0);
        assert_eq!(args.timeout_ms, 4000);
        assert_eq!(args.client, ClientChoice::RedisCrate);
        let args = Cli::parse_from(["x", "--client", "router"]).args;
        assert_eq!(args.client.kind(), ClientKind::Router);
    }
}
