//! The `server` command: `redis-benchmark` against `tucana serve` and against Debian's
//! `redis-server`, side by side in one run, into a JSON file that `report` turns into a
//! section of BENCHMARKS.md (issue 6, "Proof").
//!
//! For each server (a fresh data directory, a free port): start it, wait until it answers
//! PING, load the whole keyspace with a pipelined SET pass of our own (so every GET finds
//! its key), then run `redis-benchmark -t set` and `-t get` at each pipeline depth, one test
//! per invocation so that the server's CPU time (utime + stime from /proc/PID/stat, every
//! thread) and peak RSS (VmHWM, reset before each test) belong to that test alone. Then the
//! larger-than-memory variant: `tucana serve` alone inside a memory cgroup (see `cgroup`)
//! whose limit is a fraction of the data set. redis-server cannot serve a data set larger
//! than memory (it keeps every key and value in RAM), so that variant has no Redis row.
//!
//! Owns the run: its arguments, the plan of each server (`run_plan`) and the records it
//! writes, in the record format of `results`. The children: `kind` the servers compared and
//! the programs that run them, `process` a running server (start, settle, sample, stop:
//! every server started is stopped, also on error), `resp` the harness's own RESP client
//! (PING, INFO, the loader), `redis_benchmark` one redis-benchmark test and its CSV. The
//! Markdown section is `document::server`'s. Records go to their own file (default
//! `bench/server-results.json`, same layout as the suite's) so a server run and a suite
//! run never overwrite each other; `report` reads it from next to the suite's JSON file
//! (or `--server-json`).
//!
//! Single-threaded except for the loader's connections, which share nothing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Map, Value};

use crate::format::fmt_bytes;
use crate::results::{self, Machine, Record, RunOptions};
use crate::{cgroup, measure, sys, Result};

pub(crate) mod kind;
pub(crate) mod process;
pub(crate) mod redis_benchmark;
pub(crate) mod resp;
pub(crate) mod types;

use kind::{default_tucana, require, version_of, Programs, ServerKind};
use process::{load_average, Sample, Server};
use redis_benchmark::{redis_benchmark, redis_benchmark_command, Shape};
use resp::{info_field, load, KEY_BYTES, LOAD_CONNECTIONS, LOAD_PIPELINE};

#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Servers to run, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = ServerKind::DEFAULT)]
    servers: Vec<ServerKind>,
    /// Directory in which each server's temporary data directory is created.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// JSON file of the results (rewritten after every server).
    #[arg(long, default_value = "bench/server-results.json")]
    json: PathBuf,
    /// Requests per redis-benchmark test (its -n).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    requests: u64,
    /// Concurrent connections of redis-benchmark (its -c).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    clients: u64,
    /// Bytes per value (redis-benchmark's -d).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    value_bytes: u64,
    /// Keys: loaded first, then requested at random (redis-benchmark's -r).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=MAX_KEYSPACE))]
    keyspace: u64,
    /// Pipeline depths (redis-benchmark's -P), one test of each kind per depth.
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 16], value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pipelines: Vec<u64>,
    /// Records of the data-type tests (HSET/HGETALL of 10-field records, ZADD/
    /// ZRANGEBYSCORE of one index, LPUSH/LPOP; `types`), loaded before them and requested
    /// at random (0: skip those tests).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(0..=MAX_KEYSPACE))]
    type_keys: u64,
    /// Bytes per field of a record of the data-type tests (YCSB's default: 100).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1 << 16))]
    field_bytes: u64,
    /// Records of the data-type tests on the larger-than-memory data set (0: none).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=MAX_KEYSPACE))]
    large_type_keys: u64,
    /// Keys of the larger-than-memory data set, served by tucana-buffered inside a memory
    /// cgroup (0: skip it).
    #[arg(long, default_value_t = 4_000_000, value_parser = clap::value_parser!(u64).range(0..=MAX_KEYSPACE))]
    large_keys: u64,
    /// Bytes per value of the larger-than-memory data set.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    large_value_bytes: u64,
    /// Requests per test on the larger-than-memory data set.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    large_requests: u64,
    /// Memory limit (page cache included) of the cgroup the larger-than-memory server runs in.
    #[arg(long, default_value_t = 1 << 30)]
    memory_limit_bytes: u64,
    /// The `tucana` binary (default: next to this program, else on PATH).
    #[arg(long)]
    tucana: Option<PathBuf>,
    /// Connection threads of `tucana serve` (its --threads; default: the server's own
    /// default for this machine). The run records the count each server reported.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    tucana_threads: Option<u64>,
    #[arg(long, default_value = "redis-server")]
    redis_server: PathBuf,
    #[arg(long, default_value = "redis-benchmark")]
    redis_benchmark: PathBuf,
    /// Rounds of the in-memory tests: each round runs every server once, in order, so the
    /// servers alternate and a slow spell of a shared machine hits them alike; the
    /// document shows the median of the rounds and each round's ratios.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Seconds: tiny counts for a smoke test of the harness (overrides the sizes).
    #[arg(long)]
    quick: bool,
    /// A remark for the results document (repeatable), e.g. that the machine was shared.
    #[arg(long)]
    note: Vec<String>,
}

/// The server of the larger-than-memory variant: buffered, as redis-everysec is.
const LARGE_SERVER: ServerKind = ServerKind::TucanaBuffered;

/// The results file's name; `report` looks for it next to the suite's JSON file.
pub const DEFAULT_JSON_FILE_NAME: &str = "server-results.json";

/// The file of a run kept for its data-type tests, shown as a section of its own.
pub const TYPES_JSON_FILE_NAME: &str = "server-types-results.json";

/// redis-benchmark writes `-r` keys as 12 decimal digits.
const MAX_KEYSPACE: u64 = 1_000_000_000_000;

impl ServerArgs {
    fn apply_quick(&mut self) {
        if self.quick {
            self.requests = 2_000;
            self.keyspace = self.keyspace.min(2_000);
            self.large_keys = self.large_keys.min(5_000);
            self.large_requests = 1_000;
            self.type_keys = self.type_keys.min(1_000);
            self.large_type_keys = self.large_type_keys.min(1_000);
        }
    }
}

pub fn run(args: &ServerArgs) -> Result<()> {
    let mut args = args.clone();
    args.apply_quick();
    if args.servers.is_empty() {
        return Err("--servers is empty".into());
    }
    let programs = Programs {
        tucana: args.tucana.clone().unwrap_or_else(default_tucana),
        tucana_threads: args.tucana_threads,
        redis_server: args.redis_server.clone(),
        redis_benchmark: args.redis_benchmark.clone(),
    };
    let versions = Versions::of(&args, &programs)?;

    let mut machine = Machine::detect();
    machine.disk = measure::watch_device_of(&args.dir);
    let mut options = run_options(&args, &programs, versions);
    crate::describe_dir(&args.dir, &mut options);
    results::print_header("server", &machine, &options);
    if programs.tucana.to_string_lossy().contains("/debug/") {
        println!("WARNING: {} is a debug build", programs.tucana.display());
    }
    if let Some(parent) = args.json.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }

    let work = tempfile::Builder::new()
        .prefix("tucana-server-bench-")
        .tempdir_in(&args.dir)?;
    let mut records: Vec<Record> = Vec::new();
    print_table_header();
    run_in_memory(
        &args,
        &programs,
        work.path(),
        &machine,
        &options,
        &mut records,
    )?;
    if args.large_keys > 0 {
        run_large(&args, &programs, work.path(), &mut options, &mut records)?;
    }
    options.set("load_average_after", load_average());
    results::write_json(&args.json, "server", &machine, &options, &records)?;
    println!("\nresults written to {}", args.json.display());
    Ok(())
}

/// The versions of the programs the run needs, or why one of them cannot run.
struct Versions {
    redis_benchmark: String,
    /// When redis-everysec is one of the servers.
    redis_server: Option<String>,
    /// When a Tucana server is one of them, or the larger-than-memory variant runs.
    tucana: Option<String>,
}

impl Versions {
    fn of(args: &ServerArgs, programs: &Programs) -> Result<Versions> {
        let redis_benchmark = require(&programs.redis_benchmark, "redis-benchmark is needed")?;
        let redis_server = if args.servers.contains(&ServerKind::RedisEverysec) {
            Some(require(
                &programs.redis_server,
                "redis-server is needed for redis-everysec",
            )?)
        } else {
            None
        };
        let tucana_needed = args.servers.iter().any(|s| s.is_tucana()) || args.large_keys > 0;
        let tucana = if tucana_needed {
            Some(version_of(&programs.tucana).map_err(|reason| {
                format!(
                    "{reason} (build it: cargo build --release -p tucana-cli, or pass --tucana)"
                )
            })?)
        } else {
            None
        };
        Ok(Versions {
            redis_benchmark,
            redis_server,
            tucana,
        })
    }
}

/// What the results file records of the run before it starts: the arguments, the
/// programs' versions, the load average, and each server's command line and promise.
fn run_options(args: &ServerArgs, programs: &Programs, versions: Versions) -> RunOptions {
    let mut options = RunOptions::default();
    options.set("argv", std::env::args().collect::<Vec<_>>());
    options.set(
        "servers",
        args.servers.iter().map(|s| s.name()).collect::<Vec<_>>(),
    );
    options.set("requests", args.requests);
    options.set("clients", args.clients);
    options.set("value_bytes", args.value_bytes);
    options.set("keyspace", args.keyspace);
    options.set("pipelines", args.pipelines.clone());
    options.set("rounds", args.rounds);
    // Every test is followed by `process::wait_until_quiet` (records: `quiet_wait_s`).
    options.set("quiet_between_tests", true);
    options.set("type_keys", args.type_keys);
    options.set("field_bytes", args.field_bytes);
    options.set("large_type_keys", args.large_type_keys);
    options.set("large_keys", args.large_keys);
    options.set("large_value_bytes", args.large_value_bytes);
    options.set("large_requests", args.large_requests);
    options.set("memory_limit_bytes", args.memory_limit_bytes);
    options.set("quick", args.quick);
    options.set("notes", args.note.clone());
    options.set("redis_benchmark_version", versions.redis_benchmark);
    options.set("redis_server_version", versions.redis_server);
    options.set("tucana_version", versions.tucana);
    options.set("tucana_binary", programs.tucana.display().to_string());
    options.set("tucana_threads", args.tucana_threads);
    options.set("load_average_before", load_average());
    options.set("configurations", Value::Object(configurations(args)));
    options
}

/// Each server the run starts: its command line (data directory `DIR`, port `PORT`) and
/// what it promises.
fn configurations(args: &ServerArgs) -> Map<String, Value> {
    ServerKind::ALL
        .iter()
        .filter(|k| args.servers.contains(k) || (**k == LARGE_SERVER && args.large_keys > 0))
        .map(|k| {
            let flags: Vec<String> = k
                .flags(Path::new("DIR"), 0)
                .into_iter()
                .map(|f| if f.is_empty() { "\"\"".into() } else { f })
                .collect();
            let program = if k.is_tucana() {
                "tucana"
            } else {
                "redis-server"
            };
            (
                k.name().to_string(),
                json!({
                    "command": format!("{program} {}", flags.join(" ")).replace(" 0 ", " PORT "),
                    "promise": k.promise(),
                }),
            )
        })
        .collect()
}

/// The in-memory tests: each round runs every server once, in order, each on a fresh data
/// directory under `work`; the results file is rewritten after every server.
fn run_in_memory(
    args: &ServerArgs,
    programs: &Programs,
    work: &Path,
    machine: &Machine,
    options: &RunOptions,
    records: &mut Vec<Record>,
) -> Result<()> {
    for (round, &kind) in
        (0..args.rounds).flat_map(|round| args.servers.iter().map(move |kind| (round, kind)))
    {
        let plan = Plan {
            dataset: "in-memory",
            requests: args.requests,
            clients: args.clients,
            value_bytes: args.value_bytes,
            keys: args.keyspace,
            pipelines: args.pipelines.clone(),
            type_keys: args.type_keys,
            field_bytes: args.field_bytes,
        };
        let data_dir = work.join(kind.name());
        std::fs::create_dir_all(&data_dir)?;
        let mut server = Server::start(kind, programs, &data_dir, None)?;
        let first = records.len();
        let result = run_plan(&mut server, &plan, programs, None, records);
        for record in &mut records[first..] {
            record.set("round", round);
        }
        let stopped = server.stop();
        result?;
        stopped?;
        // The data directory is large; the next server gets the space.
        std::fs::remove_dir_all(&data_dir)?;
        results::write_json(&args.json, "server", machine, options, records)?;
    }
    Ok(())
}

/// The larger-than-memory variant: tucana-buffered inside a memory cgroup.
fn run_large(
    args: &ServerArgs,
    programs: &Programs,
    work: &Path,
    options: &mut RunOptions,
    records: &mut Vec<Record>,
) -> Result<()> {
    let kind = LARGE_SERVER;
    let data_bytes = args.large_keys * (KEY_BYTES + args.large_value_bytes);
    let mut info = json!({
        "server": kind.name(),
        "keys": args.large_keys,
        "value_bytes": args.large_value_bytes,
        "data_bytes": data_bytes,
        "requests": args.large_requests,
        "memory_limit_bytes": args.memory_limit_bytes,
    });
    println!(
        "\nlarger-than-memory: {} keys x {} B values = {} of keys and values; {} in a memory cgroup limited to {}",
        args.large_keys,
        args.large_value_bytes,
        fmt_bytes(data_bytes),
        kind.name(),
        fmt_bytes(args.memory_limit_bytes)
    );
    let group = match cgroup::create(args.memory_limit_bytes) {
        Ok(group) => {
            info["cgroup"] = group.describe();
            Some(group)
        }
        Err(reason) => {
            println!("WARNING: no memory cgroup ({reason}); memory is NOT limited");
            info["cgroup"] = json!({ "error": reason, "limited": false });
            None
        }
    };
    options.set("larger_than_memory", info.clone());
    let data_dir = work.join("large");
    std::fs::create_dir_all(&data_dir)?;
    let plan = Plan {
        dataset: "larger-than-memory",
        requests: args.large_requests,
        clients: args.clients,
        value_bytes: args.large_value_bytes,
        keys: args.large_keys,
        pipelines: args.pipelines.clone(),
        type_keys: args.large_type_keys,
        field_bytes: args.field_bytes,
    };
    let mut server = Server::start(kind, programs, &data_dir, group.as_ref())?;
    let first = records.len();
    let result = run_plan(&mut server, &plan, programs, group.as_ref(), records);
    if result.is_err() {
        // A server killed by the OOM killer drops its connections a moment before it is
        // reaped; give it that moment so the failure names the real cause.
        std::thread::sleep(Duration::from_millis(500));
    }
    let exit = server.child.try_wait()?;
    let stopped = server.stop();
    if let Err(error) = result {
        // The OOM killer ends the server without a word; say so rather than fail obscurely.
        let how = match exit {
            Some(status) => format!(
                "the server exited ({status}; SIGKILL here is the memory cgroup's OOM killer) \
                 during the run, after {} of its tests: {error}",
                records.len() - first
            ),
            None => error.to_string(),
        };
        println!("WARNING: larger-than-memory: {how}");
        info["failed"] = how.into();
    }
    if let Some(group) = &group {
        info["cgroup_peak_bytes"] = json!(group.peak_bytes());
        info["cgroup_limit_hits"] = json!(group.limit_hits());
    }
    options.set("larger_than_memory", info);
    stopped?;
    // The guard removes the cgroup, which needs the server gone: `stop` waited for it.
    drop(group);
    std::fs::remove_dir_all(&data_dir)?;
    Ok(())
}

/// One server's share of the run.
#[derive(Clone)]
struct Plan {
    dataset: &'static str,
    requests: u64,
    clients: u64,
    value_bytes: u64,
    keys: u64,
    pipelines: Vec<u64>,
    /// Records of the data-type tests (0: none), and bytes per field.
    type_keys: u64,
    field_bytes: u64,
}

impl Plan {
    /// What each redis-benchmark test of the plan asks for.
    fn shape(&self) -> Shape {
        Shape {
            clients: self.clients,
            requests: self.requests,
            value_bytes: self.value_bytes,
            keys: self.keys,
        }
    }
}
fn run_plan(
    server: &mut Server,
    plan: &Plan,
    programs: &Programs,
    group: Option<&cgroup::MemoryCgroup>,
    records: &mut Vec<Record>,
) -> Result<()> {
    let name = server.kind.name();
    // What `tucana serve` reports it runs (its --threads, or its default for the cores).
    let (threads, busy_poll_us) = if server.kind.is_tucana() {
        (
            info_field(server.port, "server", "connection_threads"),
            info_field(server.port, "server", "busy_poll_us"),
        )
    } else {
        (None, None)
    };
    // Load: every key once, so the GETs below all hit and SETs overwrite.
    let before = server.sample();
    let started = Instant::now();
    load(server.port, plan.keys, plan.value_bytes)?;
    let elapsed = started.elapsed();
    // What the load left the server to do is the load's (its CPU is in the load's row),
    // not the first test's; requests/s counts the SETs' time alone.
    let settle = server.settle()?;
    let after = server.sample();
    let mut record = Record::unmeasured(name, "load");
    record.ops_per_sec = Some(plan.keys as f64 / elapsed.as_secs_f64().max(1e-9));
    fill(&mut record, plan, &before, &after, plan.keys, group);
    record.set("settle_s", settle.as_secs_f64());
    record.set("elapsed_s", elapsed.as_secs_f64());
    record.set("pipeline", LOAD_PIPELINE);
    record.set("clients", LOAD_CONNECTIONS);
    record.set("connection_threads", threads);
    record.set("busy_poll_us", busy_poll_us);
    print_row(&record);
    records.push(record);

    let common = |record: &mut Record| {
        record.set("connection_threads", threads);
        record.set("busy_poll_us", busy_poll_us);
        print_row(record);
    };
    for &pipeline in &plan.pipelines {
        // SET first, as redis-benchmark's own order; both find every key present.
        for test in ["SET", "GET"] {
            let mut record = bench_one(server, plan, programs, group, pipeline, test, &[])?;
            common(&mut record);
            records.push(record);
        }
    }
    if plan.type_keys == 0 {
        return Ok(());
    }
    // The data-type tests: every record and index member first, then each test at each
    // depth (`types`).
    let started = Instant::now();
    types::preload(server.port, plan.type_keys, plan.field_bytes)?;
    server.settle()?;
    println!(
        "{:<20} {:<16} loaded {} records of {} fields and their index in {:.1} s",
        plan.dataset,
        name,
        plan.type_keys,
        types::FIELDS,
        started.elapsed().as_secs_f64()
    );
    let type_plan = Plan {
        keys: plan.type_keys,
        ..plan.clone()
    };
    for &pipeline in &plan.pipelines {
        for test in types::tests(plan.field_bytes) {
            let mut record = bench_one(
                server,
                &type_plan,
                programs,
                group,
                pipeline,
                test.name,
                &test.command,
            )?;
            record.set("field_bytes", plan.field_bytes);
            common(&mut record);
            records.push(record);
        }
    }
    Ok(())
}

/// One redis-benchmark test (`test` built in, or the command line `command`) and its
/// record, named `redis-TEST-PN`.
fn bench_one(
    server: &mut Server,
    plan: &Plan,
    programs: &Programs,
    group: Option<&cgroup::MemoryCgroup>,
    pipeline: u64,
    test: &str,
    command: &[String],
) -> Result<Record> {
    let before = server.sample();
    let client_before = sys::children_cpu_time();
    let shape = plan.shape();
    let result = if command.is_empty() {
        redis_benchmark(
            &programs.redis_benchmark,
            server.port,
            &shape,
            pipeline,
            test,
        )?
    } else {
        redis_benchmark_command(
            &programs.redis_benchmark,
            server.port,
            &shape,
            pipeline,
            test,
            command,
        )?
    };
    // redis-benchmark has been waited for: its CPU time is in the children's.
    let client_cpu = sys::children_cpu_time().saturating_sub(client_before);
    // What the test left the server to do in the background is this test's CPU, not the
    // next test's (throughput is redis-benchmark's own, over the requests alone).
    let (quiet_wait, quiet_timed_out) = process::wait_until_quiet(server.child.id());
    let after = server.sample();
    let mut record = Record::unmeasured(server.kind.name(), &format!("redis-{test}-P{pipeline}"));
    record.ops_per_sec = Some(result.requests_per_sec);
    record.p50_us = Some(result.p50_ms * 1000.0);
    record.p99_us = Some(result.p99_ms * 1000.0);
    fill(&mut record, plan, &before, &after, plan.requests, group);
    record.set("pipeline", pipeline);
    record.set("clients", plan.clients);
    record.set("test", test);
    record.set("avg_latency_us", result.avg_ms * 1000.0);
    record.set("max_latency_us", result.max_ms * 1000.0);
    record.set("elapsed_s", result.elapsed.as_secs_f64());
    record.set("quiet_wait_s", quiet_wait.as_secs_f64());
    record.set("quiet_timed_out", quiet_timed_out);
    record.set(
        "client_cpu_us_per_op",
        client_cpu.as_secs_f64() * 1e6 / plan.requests.max(1) as f64,
    );
    Ok(record)
}

/// The figures of one test from the server's samples before and after it.
fn fill(
    record: &mut Record,
    plan: &Plan,
    before: &Sample,
    after: &Sample,
    requests: u64,
    group: Option<&cgroup::MemoryCgroup>,
) {
    record.set("dataset", plan.dataset);
    record.set("requests", requests);
    record.set("value_bytes", plan.value_bytes);
    record.set("keyspace", plan.keys);
    // `cpu_us_per_op` (what the report's ratios compare) is the process tree's: the
    // server's forked children (redis-server's AOF rewrite) are the server's work too.
    // The process's own figure stays beside it; records from before the tree was counted
    // have only `cpu_us_per_op`, the process's.
    let ticks_per_sec = sys::clock_ticks_per_sec() as f64;
    if let (Some(a), Some(b)) = (before.cpu_ticks, after.cpu_ticks) {
        let cpu_s = b.saturating_sub(a) as f64 / ticks_per_sec;
        record.cpu_us_per_op = Some(cpu_s * 1e6 / requests.max(1) as f64);
        record.set(
            "process_cpu_us_per_op",
            cpu_s * 1e6 / requests.max(1) as f64,
        );
        record.set("server_process_cpu_s", cpu_s);
    }
    if let (Some(a), Some(b)) = (before.tree_cpu_ticks, after.tree_cpu_ticks) {
        let cpu_s = b.saturating_sub(a) as f64 / ticks_per_sec;
        record.cpu_us_per_op = Some(cpu_s * 1e6 / requests.max(1) as f64);
        record.set("server_cpu_s", cpu_s);
        record.set("server_cpu_scope", "process tree");
    }
    if let (Some(a), Some(b)) = (before.sleeps, after.sleeps) {
        record.set(
            "server_sleeps_per_op",
            b.saturating_sub(a) as f64 / requests.max(1) as f64,
        );
    }
    record.peak_rss_bytes = after.peak_rss_bytes;
    if let (Some(a), Some(b)) = (before.syncs, after.syncs) {
        let syncs = b.saturating_sub(a);
        record.set("log_syncs", syncs);
    }
    if let (Some(a), Some(b)) = (before.device, after.device) {
        record.set(
            "device_read_bytes",
            b.read_bytes.saturating_sub(a.read_bytes),
        );
        record.set(
            "device_write_bytes",
            b.write_bytes.saturating_sub(a.write_bytes),
        );
    }
    if let Some(group) = group {
        if let Some(peak) = group.peak_bytes() {
            record.set("cgroup_peak_bytes_so_far", peak);
        }
        if let Some(hits) = group.limit_hits() {
            record.set("cgroup_limit_hits_so_far", hits);
        }
    }
}
// ---------------------------------------------------------------------------------------
// Terminal table.

fn print_table_header() {
    println!();
    println!(
        "{:<20} {:<16} {:<24} {:>10} {:>9} {:>9} {:>10} {:>10} {:>10} {:>9} {:>10}",
        "dataset",
        "server",
        "test",
        "req/s",
        "p50 us",
        "p99 us",
        "tree cpu",
        "proc cpu",
        "client cpu",
        "peak RSS",
        "log syncs"
    );
}

fn print_row(record: &Record) {
    let field = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    println!(
        "{:<20} {:<16} {:<24} {:>10.0} {:>9} {:>9} {:>10} {:>10} {:>10} {:>9} {:>10}",
        record.get("dataset").and_then(Value::as_str).unwrap_or("-"),
        record.engine,
        record.workload,
        record.ops_per_sec.unwrap_or(f64::NAN),
        field(record.p50_us),
        field(record.p99_us),
        record
            .cpu_us_per_op
            .map_or("-".to_string(), |v| format!("{v:.2}")),
        record
            .get("process_cpu_us_per_op")
            .and_then(Value::as_f64)
            .map_or("-".to_string(), |v| format!("{v:.2}")),
        record
            .get("client_cpu_us_per_op")
            .and_then(Value::as_f64)
            .map_or("-".to_string(), |v| format!("{v:.2}")),
        record
            .peak_rss_bytes
            .map_or_else(|| "-".to_string(), |b| format!("{}M", b >> 20)),
        record
            .get("log_syncs")
            .and_then(Value::as_u64)
            .map_or("-".to_string(), |n| n.to_string()),
    );
}
