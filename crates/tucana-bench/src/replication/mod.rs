//! The `replication` command: one primary with one and with two backups, send-index
//! (Talos: the backup stores the shipped log and the shipped index) and build-index (the
//! backup builds its own index from the shipped records, as Redis replicas do), and the
//! primary alone, as separate `tucana serve` processes on this machine, measured side by
//! side in one run, into a JSON file that `report` turns into a section of BENCHMARKS.md
//! (issue 18, "Proof"). Two more setups vary one flag of the primary of `send-index-1`
//! each, so the same run compares the server's defaults with the alternatives: the backup
//! acknowledging what it synced instead of what it received (`send-index-1-durable`),
//! and every commit's index shipped as it is made instead of folded (`--repl-index-lag-ms
//! 0`, `send-index-1-every-commit`).
//!
//! The run: for each round, for each of Talos's size mixes, each setup in turn (so the
//! setups alternate through whatever else the machine does) on fresh volumes and ports
//! runs YCSB Load and A through the primary with sync durability (`phases`); then, for
//! each setup, `redis-benchmark -t set` at each pipeline depth; then a failover of a
//! region of `--failover-bytes` (`failover`). Around every phase the backups catch up
//! with a commit and every process is sampled, so each record has the primary's
//! throughput and latencies, and per backup its CPU and the split of it, its device
//! bytes and its link's network bytes (`figures`).
//!
//! Owns the command: its arguments, the plan and order of the runs, the records (in the
//! record format of `results`) and their file (default `bench/replication-results.json`,
//! rewritten after every cluster; `report` reads it from next to the suite's JSON file or
//! from `--replication-json`). The children: `cluster` the processes, `sample` what is
//! read of them, `figures` the arithmetic, `client` the YCSB driver's engine over RESP,
//! `phases` the measured phases, `failover` the failover. The Markdown section is
//! `document::replication`'s.
//!
//! Single-threaded except for the driver's and the loader's connections.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{json, Map, Value};

use crate::format::fmt_bytes;
use crate::results::{self, Machine, Record, RunOptions};
use crate::server::kind::{default_tucana, require, version_of};
use crate::server::process::load_average;
use crate::server::redis_benchmark::Shape;
use crate::ycsb::SizeMix;
use crate::{measure, Result};

mod client;
mod cluster;
mod failover;
mod figures;
mod phases;
mod sample;

pub use cluster::Setup;
use phases::{mix_name, RedisPlan, YcsbPlan};

/// The results file's name; `report` looks for it next to the suite's JSON file.
pub const DEFAULT_JSON_FILE_NAME: &str = "replication-results.json";

#[derive(Args, Debug, Clone)]
pub struct ReplicationArgs {
    /// Setups to run, in order: the primary alone, with one or two backups of each kind,
    /// and one send-index backup with `--repl-ack durable` or `--repl-index-lag-ms 0`.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Setup::ALL)]
    setups: Vec<Setup>,
    /// Talos's key-value pair sizes for YCSB: small 33 B, medium 123 B, large 1023 B
    /// (sd: 60/20/20 of them).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [SizeMix::Small, SizeMix::Medium, SizeMix::Large])]
    mixes: Vec<SizeMix>,
    /// Directory in which each cluster's temporary data directory is created.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// JSON file of the results (rewritten after every cluster).
    #[arg(long, default_value = "bench/replication-results.json")]
    json: PathBuf,
    /// Records YCSB Load inserts, per size mix (YCSB's recordcount).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    records: u64,
    /// Operations of YCSB A per size mix (YCSB's operationcount).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    operations: u64,
    /// Client threads of the YCSB driver, each with its own connection to the primary.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: u64,
    /// Records per pipelined batch (one round trip) of YCSB Load.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    load_batch: u64,
    /// Requests per redis-benchmark SET test (its -n).
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    redis_requests: u64,
    /// Connections of redis-benchmark (its -c).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    redis_clients: u64,
    /// Bytes per value of redis-benchmark (its -d).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    redis_value_bytes: u64,
    /// Random keys of redis-benchmark (its -r).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000_000))]
    redis_keyspace: u64,
    /// Pipeline depths of the redis-benchmark SET tests (its -P).
    #[arg(long, value_delimiter = ',', default_values_t = [16u64], value_parser = clap::value_parser!(u64).range(1..=10_000))]
    redis_pipelines: Vec<u64>,
    /// Skip the redis-benchmark SET tests (redis-benchmark is then not needed).
    #[arg(long)]
    no_redis_benchmark: bool,
    /// Bytes of keys and values in the region the failover promotes (0: no failover).
    #[arg(long, default_value_t = 1 << 30)]
    failover_bytes: u64,
    /// Bytes per value of the failover's data set.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    failover_value_bytes: u64,
    /// Bytes of keys and values written after the failover's last commit (replayed by
    /// the promotion). Below 256 MiB, the size at which the primary commits on its own.
    #[arg(long, default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(1..(256 << 20)))]
    failover_tail_bytes: u64,
    /// Rounds: each runs every setup of every size mix once more, in the same order.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Seed of the YCSB driver's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The `tucana` binary (default: next to this program, else on PATH).
    #[arg(long)]
    tucana: Option<PathBuf>,
    #[arg(long, default_value = "redis-benchmark")]
    redis_benchmark: PathBuf,
    /// Tiny counts for a smoke test of the harness (overrides the sizes).
    #[arg(long)]
    quick: bool,
    /// A remark for the results document (repeatable), e.g. that the machine was shared.
    #[arg(long)]
    note: Vec<String>,
}

impl ReplicationArgs {
    fn apply_quick(&mut self) {
        if self.quick {
            self.records = self.records.min(2_000);
            self.operations = self.operations.min(2_000);
            self.redis_requests = self.redis_requests.min(2_000);
            self.redis_keyspace = self.redis_keyspace.min(2_000);
            self.failover_bytes = self.failover_bytes.min(4 << 20);
            self.failover_tail_bytes = self.failover_tail_bytes.min(1 << 20);
        }
    }
}

/// The programs the run uses and their versions.
struct Programs {
    tucana: PathBuf,
    tucana_version: String,
    redis_benchmark_version: Option<String>,
}

pub fn run(args: &ReplicationArgs) -> Result<()> {
    let mut args = args.clone();
    args.apply_quick();
    if args.setups.is_empty() {
        return Err("--setups is empty".into());
    }
    let tucana = args.tucana.clone().unwrap_or_else(default_tucana);
    let programs = Programs {
        tucana_version: version_of(&tucana).map_err(|reason| {
            format!("{reason} (build it: cargo build --release -p tucana-cli, or pass --tucana)")
        })?,
        tucana,
        redis_benchmark_version: if args.no_redis_benchmark {
            None
        } else {
            Some(require(
                &args.redis_benchmark,
                "redis-benchmark is needed for the SET tests (or --no-redis-benchmark)",
            )?)
        },
    };
    let mut machine = Machine::detect();
    machine.disk = measure::watch_device_of(&args.dir);
    let mut options = run_options(&args, &programs);
    crate::describe_dir(&args.dir, &mut options);
    results::print_header("replication", &machine, &options);
    if programs.tucana.to_string_lossy().contains("/debug/") {
        println!("WARNING: {} is a debug build", programs.tucana.display());
    }
    if let Some(parent) = args.json.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let work = tempfile::Builder::new()
        .prefix("tucana-replication-bench-")
        .tempdir_in(&args.dir)?;
    let mut run = Run {
        args: &args,
        programs: &programs,
        work: work.path(),
        machine: &machine,
        options: &mut options,
        records: Vec::new(),
    };
    run.ycsb_rounds()?;
    run.redis_rounds()?;
    if args.failover_bytes > 0 {
        run.failover()?;
    }
    run.options.set("load_average_after", load_average());
    run.save()?;
    println!("\nresults written to {}", args.json.display());
    Ok(())
}

/// What the results file records of the run before it starts.
fn run_options(args: &ReplicationArgs, programs: &Programs) -> RunOptions {
    let mut options = RunOptions::default();
    options.set("argv", std::env::args().collect::<Vec<_>>());
    options.set(
        "setups",
        args.setups.iter().map(|s| s.name()).collect::<Vec<_>>(),
    );
    options.set(
        "mixes",
        args.mixes.iter().map(|m| mix_name(*m)).collect::<Vec<_>>(),
    );
    options.set("records", args.records);
    options.set("operations", args.operations);
    options.set("threads", args.threads);
    options.set("load_batch", args.load_batch);
    options.set("redis_requests", args.redis_requests);
    options.set("redis_clients", args.redis_clients);
    options.set("redis_value_bytes", args.redis_value_bytes);
    options.set("redis_keyspace", args.redis_keyspace);
    options.set(
        "redis_pipelines",
        if args.no_redis_benchmark {
            Vec::new()
        } else {
            args.redis_pipelines.clone()
        },
    );
    options.set("failover_bytes", args.failover_bytes);
    options.set("failover_value_bytes", args.failover_value_bytes);
    options.set("failover_tail_bytes", args.failover_tail_bytes);
    options.set("rounds", args.rounds);
    options.set("seed", args.seed);
    options.set("quick", args.quick);
    options.set("notes", args.note.clone());
    options.set("tucana_version", programs.tucana_version.clone());
    options.set("tucana_binary", programs.tucana.display().to_string());
    options.set(
        "redis_benchmark_version",
        programs.redis_benchmark_version.clone(),
    );
    options.set("load_average_before", load_average());
    let configurations: Map<String, Value> = Setup::ALL
        .iter()
        .filter(|s| args.setups.contains(s))
        .map(|s| (s.name().to_string(), json!(s.command_lines())))
        .collect();
    options.set("configurations", Value::Object(configurations));
    options
}

/// The run in progress: its plan and the records so far.
struct Run<'a> {
    args: &'a ReplicationArgs,
    programs: &'a Programs,
    work: &'a Path,
    machine: &'a Machine,
    options: &'a mut RunOptions,
    records: Vec<Record>,
}

impl Run<'_> {
    fn save(&self) -> Result<()> {
        results::write_json(
            &self.args.json,
            "replication",
            self.machine,
            self.options,
            &self.records,
        )
    }

    /// Runs `body` on a fresh cluster of `setup` in its own directory, which is removed
    /// after the cluster stops; the records it returns get `round`, then the file is
    /// rewritten.
    fn on_cluster(
        &mut self,
        setup: Setup,
        label: &str,
        round: u64,
        body: impl FnOnce(&mut cluster::Cluster) -> Result<Vec<Record>>,
    ) -> Result<()> {
        let dir = self.work.join(format!("{}-{label}", setup.name()));
        let mut cluster = cluster::Cluster::start(setup, &self.programs.tucana, &dir)?;
        let result = body(&mut cluster);
        let stopped = cluster.stop();
        drop(cluster);
        let new = result?;
        stopped?;
        std::fs::remove_dir_all(&dir)?;
        for mut record in new {
            record.set("round", round);
            print_row(&record);
            self.records.push(record);
        }
        self.save()
    }

    /// YCSB Load and A: each round, each mix, each setup in turn.
    fn ycsb_rounds(&mut self) -> Result<()> {
        print_table_header();
        let args = self.args;
        for round in 0..args.rounds {
            for &mix in &args.mixes {
                for &setup in &args.setups {
                    let driver_dir = self.work.join("driver");
                    std::fs::create_dir_all(&driver_dir)?;
                    let plan = YcsbPlan {
                        mix,
                        records: args.records,
                        operations: args.operations,
                        threads: args.threads as usize,
                        load_batch: args.load_batch as usize,
                        seed: args.seed,
                        dir: &driver_dir,
                    };
                    self.on_cluster(setup, mix_name(mix), round, |cluster| {
                        phases::ycsb(cluster, &plan)
                    })?;
                }
            }
        }
        Ok(())
    }

    /// redis-benchmark's SET tests: each round, each setup in turn.
    fn redis_rounds(&mut self) -> Result<()> {
        let args = self.args;
        if args.no_redis_benchmark {
            return Ok(());
        }
        for round in 0..args.rounds {
            for &setup in &args.setups {
                let plan = RedisPlan {
                    program: &args.redis_benchmark,
                    shape: Shape {
                        clients: args.redis_clients,
                        requests: args.redis_requests,
                        value_bytes: args.redis_value_bytes,
                        keys: args.redis_keyspace,
                    },
                    pipelines: &args.redis_pipelines,
                };
                self.on_cluster(setup, "redis", round, |cluster| {
                    phases::redis_sets(cluster, &plan)
                })?;
            }
        }
        Ok(())
    }

    /// The failover of a region of `--failover-bytes`, once.
    fn failover(&mut self) -> Result<()> {
        let args = self.args;
        println!(
            "\nfailover: {} of keys and {}-byte values, then {} written after the last commit; \
             kill -9 of the primary, REPLICAOF NO ONE on its backup, then a SET",
            fmt_bytes(args.failover_bytes),
            args.failover_value_bytes,
            fmt_bytes(args.failover_tail_bytes),
        );
        let dir = self.work.join("failover");
        let plan = failover::FailoverPlan {
            data_bytes: args.failover_bytes,
            value_bytes: args.failover_value_bytes,
            tail_bytes: args.failover_tail_bytes,
        };
        let mut record = failover::run(&self.programs.tucana, &dir, &plan)?;
        std::fs::remove_dir_all(&dir)?;
        record.set("load_average", load_average());
        let get = |name: &str| record.get(name).and_then(Value::as_f64);
        println!(
            "failover: promotion {:.0} ms, first write acknowledged {:.0} ms after REPLICAOF NO ONE; \
             log replayed {}, {:.0} MiB/s over the whole failover",
            get("promote_ms").unwrap_or(f64::NAN),
            get("failover_ms").unwrap_or(f64::NAN),
            get("replay_log_bytes").map_or("unknown".into(), |b| fmt_bytes(b as u64)),
            get("replay_bytes_per_sec").unwrap_or(f64::NAN) / f64::from(1 << 20),
        );
        self.records.push(record);
        self.save()
    }
}

// ---------------------------------------------------------------------------------------
// Terminal table.

fn print_table_header() {
    println!();
    println!(
        "{:<14} {:<25} {:<14} {:>9} {:>9} {:>8} {:>22} {:>8} {:>8} {:>8}",
        "data",
        "setup",
        "phase",
        "ops/s",
        "p99 us",
        "prim us",
        "backup ns/B log/idx/oth",
        "net/log",
        "bk w/usr",
        "bk r/usr",
    );
}

fn print_row(record: &Record) {
    let f = |name: &str| record.get(name).and_then(Value::as_f64);
    let cell =
        |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    let split = match (
        f("backup_log_cpu_ns_per_log_byte"),
        f("backup_index_cpu_ns_per_log_byte"),
        f("backup_other_cpu_ns_per_log_byte"),
    ) {
        (Some(l), Some(i), Some(o)) => format!("{l:.2}/{i:.2}/{o:.2}"),
        _ => "-".into(),
    };
    println!(
        "{:<14} {:<25} {:<14} {:>9.0} {:>9} {:>8} {:>22} {:>8} {:>8} {:>8}",
        record.get("dataset").and_then(Value::as_str).unwrap_or("-"),
        record.engine,
        record.workload,
        record.ops_per_sec.unwrap_or(f64::NAN),
        cell(record.p99_us, 0),
        cell(record.cpu_us_per_op, 2),
        split,
        cell(f("network_bytes_per_log_byte"), 3),
        cell(f("backup_device_write_bytes_per_user_byte"), 2),
        cell(f("backup_device_read_bytes_per_user_byte"), 4),
    );
}
