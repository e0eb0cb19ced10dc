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
//! Owns the server plan and the processes it starts (it stops every one of them, also on
//! error); the record format is `report`'s, the Markdown section `document::server`'s. Records go to their
//! own file (default `bench/server-results.json`, same layout as the suite's) so a server
//! run and a suite run never overwrite each other; `report` reads it from next to the
//! suite's JSON file (or `--server-json`).
//! Single-threaded except for the loader's connections, which share nothing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Map, Value};

use crate::format::fmt_bytes;
use crate::report::{self, Machine, Record, RunOptions};
use crate::{cgroup, measure, sys, Result};

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

/// redis-benchmark writes `-r` keys as 12 decimal digits.
const MAX_KEYSPACE: u64 = 1_000_000_000_000;

/// How long a server may take to answer its first PING (a large volume's recovery included).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a server may take to stop after SIGTERM (it commits first) before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(120);

/// SETs per round trip of the loader: deep enough that the network is not the limit.
const LOAD_PIPELINE: u64 = 256;

/// Connections of the loader, each loading a contiguous share of the keys.
const LOAD_CONNECTIONS: u64 = 4;

impl ServerArgs {
    fn apply_quick(&mut self) {
        if self.quick {
            self.requests = 2_000;
            self.keyspace = self.keyspace.min(2_000);
            self.large_keys = self.large_keys.min(5_000);
            self.large_requests = 1_000;
        }
    }
}

/// The servers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ServerKind {
    /// redis-server, appendonly yes, appendfsync everysec, no RDB snapshots.
    RedisEverysec,
    /// tucana serve --durability buffered --flush-interval-ms 1000.
    TucanaBuffered,
    /// tucana serve --durability sync (answered once durable; group commit).
    TucanaSync,
    /// tucana-buffered without busy polling (--busy-poll-us 0): what the spin is worth.
    TucanaBufferedNopoll,
}

impl ServerKind {
    /// The servers a run compares unless told otherwise.
    const DEFAULT: [ServerKind; 3] = [
        ServerKind::RedisEverysec,
        ServerKind::TucanaBuffered,
        ServerKind::TucanaSync,
    ];
    const ALL: [ServerKind; 4] = [
        ServerKind::RedisEverysec,
        ServerKind::TucanaBuffered,
        ServerKind::TucanaSync,
        ServerKind::TucanaBufferedNopoll,
    ];

    fn name(self) -> &'static str {
        match self {
            ServerKind::RedisEverysec => "redis-everysec",
            ServerKind::TucanaBuffered => "tucana-buffered",
            ServerKind::TucanaSync => "tucana-sync",
            ServerKind::TucanaBufferedNopoll => "tucana-buffered-nopoll",
        }
    }

    fn is_tucana(self) -> bool {
        self != ServerKind::RedisEverysec
    }

    /// The flags after the program name; `{dir}` and `{port}` as given.
    fn flags(self, data_dir: &Path, port: u16) -> Vec<String> {
        let dir = data_dir.display().to_string();
        let port_arg = port.to_string();
        let strings = |flags: &[&str]| flags.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        match self {
            ServerKind::RedisEverysec => strings(&[
                "--port",
                &port_arg,
                "--bind",
                "127.0.0.1",
                "--dir",
                &dir,
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                &format!("{dir}/redis.log"),
            ]),
            ServerKind::TucanaBuffered => strings(&[
                "--db",
                &format!("{dir}/volume.tucana"),
                "serve",
                "--port",
                &port_arg,
                "--durability",
                "buffered",
                "--flush-interval-ms",
                "1000",
            ]),
            ServerKind::TucanaBufferedNopoll => {
                let mut flags = ServerKind::TucanaBuffered.flags(data_dir, port);
                flags.extend(strings(&["--busy-poll-us", "0"]));
                flags
            }
            ServerKind::TucanaSync => strings(&[
                "--db",
                &format!("{dir}/volume.tucana"),
                "serve",
                "--port",
                &port_arg,
                "--durability",
                "sync",
            ]),
        }
    }

    /// What the server promises, for the document.
    fn promise(self) -> &'static str {
        match self {
            ServerKind::RedisEverysec => {
                "every write appended to the AOF, fsync once a second (no RDB snapshots)"
            }
            ServerKind::TucanaBuffered => {
                "every write appended to the log, flushed and synced at least once a second: \
                 the same promise as everysec"
            }
            ServerKind::TucanaBufferedNopoll => {
                "as tucana-buffered; a connection thread sleeps as soon as it has nothing to \
                 run (no busy polling)"
            }
            ServerKind::TucanaSync => {
                "a write is answered only once durable (concurrent writers share an fsync); \
                 Redis would need appendfsync always for this"
            }
        }
    }
}

/// The programs the run uses.
struct Programs {
    tucana: PathBuf,
    /// `--threads` for `tucana serve`, if given.
    tucana_threads: Option<u64>,
    redis_server: PathBuf,
    redis_benchmark: PathBuf,
}

impl Programs {
    fn program(&self, kind: ServerKind) -> &Path {
        if kind.is_tucana() {
            &self.tucana
        } else {
            &self.redis_server
        }
    }
}

/// The first line `program --version` prints, or why it cannot run.
fn version_of(program: &Path) -> std::result::Result<String, String> {
    let output = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} --version failed ({})",
            program.display(),
            output.status
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

/// `tucana` next to this program (cargo puts both in the same target directory), else PATH.
fn default_tucana() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("tucana")))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("tucana"))
}

/// Whether redis-benchmark can run here: the smoke test skips the server run when not.
fn require(program: &Path, what: &str) -> Result<String> {
    version_of(program).map_err(|reason| {
        format!("{reason}: {what} (scripts/server-deps.sh --bench installs redis-server and redis-benchmark)").into()
    })
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
    let benchmark_version = require(&programs.redis_benchmark, "redis-benchmark is needed")?;
    let redis_version = if args.servers.contains(&ServerKind::RedisEverysec) {
        Some(require(
            &programs.redis_server,
            "redis-server is needed for redis-everysec",
        )?)
    } else {
        None
    };
    let tucana_needed = args.servers.iter().any(|s| s.is_tucana()) || args.large_keys > 0;
    let tucana_version = if tucana_needed {
        Some(version_of(&programs.tucana).map_err(|reason| {
            format!("{reason} (build it: cargo build --release -p tucana-cli, or pass --tucana)")
        })?)
    } else {
        None
    };

    let mut machine = Machine::detect();
    machine.disk = measure::watch_device_of(&args.dir);
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
    options.set("large_keys", args.large_keys);
    options.set("large_value_bytes", args.large_value_bytes);
    options.set("large_requests", args.large_requests);
    options.set("memory_limit_bytes", args.memory_limit_bytes);
    options.set("quick", args.quick);
    options.set("notes", args.note.clone());
    options.set("redis_benchmark_version", benchmark_version);
    options.set("redis_server_version", redis_version);
    options.set("tucana_version", tucana_version);
    options.set("tucana_binary", programs.tucana.display().to_string());
    options.set("tucana_threads", args.tucana_threads);
    options.set("load_average_before", load_average());
    let configurations: Map<String, Value> = ServerKind::ALL
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
        .collect();
    options.set("configurations", Value::Object(configurations));
    crate::describe_dir(&args.dir, &mut options);
    report::print_header("server", &machine, &options);
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
        };
        let data_dir = work.path().join(kind.name());
        std::fs::create_dir_all(&data_dir)?;
        let mut server = Server::start(kind, &programs, &data_dir, None)?;
        let first = records.len();
        let result = run_plan(&mut server, &plan, &programs, None, &mut records);
        for record in &mut records[first..] {
            record.set("round", round);
        }
        let stopped = server.stop();
        result?;
        stopped?;
        // The data directory is large; the next server gets the space.
        std::fs::remove_dir_all(&data_dir)?;
        report::write_json(&args.json, "server", &machine, &options, &records)?;
    }

    if args.large_keys > 0 {
        run_large(&args, &programs, work.path(), &mut options, &mut records)?;
    }
    options.set("load_average_after", load_average());
    report::write_json(&args.json, "server", &machine, &options, &records)?;
    println!("\nresults written to {}", args.json.display());
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
struct Plan {
    dataset: &'static str,
    requests: u64,
    clients: u64,
    value_bytes: u64,
    keys: u64,
    pipelines: Vec<u64>,
}

/// `key:` and 12 digits, as redis-benchmark's `-r` writes its keys.
const KEY_BYTES: u64 = 16;

fn key(index: u64) -> String {
    format!("key:{index:012}")
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
    let settle = settle(server)?;
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

    for &pipeline in &plan.pipelines {
        // SET first, as redis-benchmark's own order; both find every key present.
        for test in ["SET", "GET"] {
            let before = server.sample();
            let client_before = sys::children_cpu_time();
            let result = redis_benchmark(programs, server.port, plan, pipeline, test)?;
            // redis-benchmark has been waited for: its CPU time is in the children's.
            let client_cpu = sys::children_cpu_time().saturating_sub(client_before);
            let after = server.sample();
            let mut record = Record::unmeasured(name, &format!("redis-{test}-P{pipeline}"));
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
            record.set(
                "client_cpu_us_per_op",
                client_cpu.as_secs_f64() * 1e6 / plan.requests.max(1) as f64,
            );
            record.set("connection_threads", threads);
            record.set("busy_poll_us", busy_poll_us);
            print_row(&record);
            records.push(record);
        }
    }
    Ok(())
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
    if let (Some(a), Some(b)) = (before.cpu_ticks, after.cpu_ticks) {
        let cpu_s = b.saturating_sub(a) as f64 / sys::clock_ticks_per_sec() as f64;
        record.cpu_us_per_op = Some(cpu_s * 1e6 / requests.max(1) as f64);
        record.set("server_cpu_s", cpu_s);
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

/// A running server: ours to stop.
struct Server {
    kind: ServerKind,
    port: u16,
    child: Child,
    stopped: bool,
}

/// What a server has used so far, read around each test.
struct Sample {
    cpu_ticks: Option<u64>,
    /// Voluntary context switches of the server's threads (see `process_sleeps`).
    sleeps: Option<u64>,
    peak_rss_bytes: Option<u64>,
    syncs: Option<u64>,
    device: Option<sys::ProcessIo>,
}

impl Server {
    /// Starts `kind` on a free port with its data in `data_dir` (inside `group` if given) and
    /// waits until it answers PING.
    fn start(
        kind: ServerKind,
        programs: &Programs,
        data_dir: &Path,
        group: Option<&cgroup::MemoryCgroup>,
    ) -> Result<Server> {
        let port = free_port()?;
        let log = std::fs::File::create(data_dir.join("server.stderr"))?;
        let mut flags = kind.flags(data_dir, port);
        if let (true, Some(threads)) = (kind.is_tucana(), programs.tucana_threads) {
            flags.extend(["--threads".to_string(), threads.to_string()]);
        }
        let child = Command::new(programs.program(kind))
            .args(flags)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", programs.program(kind).display()))?;
        let mut server = Server {
            kind,
            port,
            child,
            stopped: false,
        };
        if let Some(group) = group {
            // Right after the spawn: the server has done nothing yet worth charging elsewhere.
            group.add_process(server.child.id())?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = server.child.try_wait()? {
                server.stopped = true;
                let log =
                    std::fs::read_to_string(data_dir.join("server.stderr")).unwrap_or_default();
                return Err(format!("{} exited at start ({status}): {log}", kind.name()).into());
            }
            if ping(port).is_ok() {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not answer PING on port {port}", kind.name()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn sample(&self) -> Sample {
        let pid = self.child.id();
        Sample {
            cpu_ticks: process_cpu_ticks(pid),
            sleeps: process_sleeps(pid),
            peak_rss_bytes: process_peak_rss_bytes(pid),
            syncs: if self.kind.is_tucana() {
                info_field(self.port, "persistence", "syncs")
            } else {
                None
            },
            device: measure::device_io_now(),
        }
    }

    /// SIGTERM, then SIGKILL if the server does not exit in time. Also run on drop.
    fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        sys::send_sigterm(self.child.id())?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                self.child.kill()?;
                self.child.wait()?;
                return Err(format!("{} did not stop on SIGTERM", self.kind.name()).into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            eprintln!("stopping {}: {error}", self.kind.name());
        }
    }
}

/// A port nobody listens on now. Another program could take it before the server does;
/// the server then fails to start and says so.
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// utime + stime of every thread of `pid` so far, in clock ticks, from /proc/PID/stat.
fn process_cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu_ticks(&text)
}

fn parse_stat_cpu_ticks(text: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces or ')': the fields
    // after the last ')' start at field 3 (state); utime and stime are fields 14 and 15.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Voluntary context switches of all the threads of `pid`: each is a thread going to
/// sleep (on `epoll_wait`, a lock, a condition, I/O), and each is woken again by someone,
/// on loopback often the client's `send`. Threads that ended are not counted.
fn process_sleeps(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        // A thread may end between the listing and the read.
        if let Ok(text) = std::fs::read_to_string(task.path().join("status")) {
            total += parse_voluntary_switches(&text).unwrap_or(0);
        }
    }
    Some(total)
}

fn parse_voluntary_switches(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// Peak RSS of `pid` since the last reset, then resets it so that the next reading is
/// the next test's own peak (best effort: without the reset it is the peak so far).
fn process_peak_rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut words = line.split_whitespace().skip(1);
    let amount: u64 = words.next()?.parse().ok()?;
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), b"5");
    match words.next() {
        Some("kB") => Some(amount * 1024),
        _ => None,
    }
}

/// The 1, 5 and 15-minute load averages, from /proc/loadavg.
fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

// ---------------------------------------------------------------------------------------
// A minimal RESP client: PING, INFO and the loader's pipelined SETs.

fn connect(port: u16) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    // A server that stops answering ends the run instead of hanging it.
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    Ok(stream)
}

fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn ping(port: u16) -> Result<()> {
    let mut stream = connect(port)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(&command(&[b"PING"]))?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // A server still loading answers -LOADING; only +PONG means ready.
    if line != "+PONG\r\n" {
        return Err(format!("PING answered {line:?}").into());
    }
    Ok(())
}

/// How long a server may take to finish what the load left it to do.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Waits until the server has finished the work the load left behind, so that the first
/// test does not pay for it: Tucana's commit of the loaded keys (`SAVE`: commit now; the
/// committer would otherwise do it during the first test), redis-server's automatic AOF
/// rewrite if one is running or scheduled. How long it took.
fn settle(server: &Server) -> Result<Duration> {
    let started = Instant::now();
    if server.kind.is_tucana() {
        let mut stream = connect(server.port)?;
        stream.set_read_timeout(Some(SETTLE_TIMEOUT))?;
        stream.write_all(&command(&[b"SAVE"]))?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line)?;
        if line != "+OK\r\n" {
            return Err(format!("SAVE answered {line:?}").into());
        }
        return Ok(started.elapsed());
    }
    loop {
        let busy = ["aof_rewrite_in_progress", "aof_rewrite_scheduled"]
            .iter()
            .any(|field| info_field(server.port, "persistence", field) != Some(0));
        if !busy {
            return Ok(started.elapsed());
        }
        if started.elapsed() > SETTLE_TIMEOUT {
            return Err("redis-server's AOF rewrite did not finish".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `field` of INFO `section` as a number, or `None` (no such field, no answer).
fn info_field(port: u16, section: &str, field: &str) -> Option<u64> {
    let mut stream = connect(port).ok()?;
    stream
        .write_all(&command(&[b"INFO", section.as_bytes()]))
        .ok()?;
    let mut reader = BufReader::new(stream);
    let mut header = String::new();
    reader.read_line(&mut header).ok()?;
    // RESP2 bulk string "$LEN\r\n" (RESP3 would be a verbatim string; we never say HELLO 3).
    let len: usize = header.strip_prefix('$')?.trim_end().parse().ok()?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).ok()?;
    let text = String::from_utf8_lossy(&body);
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
}

/// SETs every key `key:000000000000` .. of the keyspace once with a value of `value_bytes`
/// bytes ('x', like redis-benchmark's), over a few pipelined connections, checking every
/// reply.
fn load(port: u16, keys: u64, value_bytes: u64) -> Result<()> {
    let value = vec![b'x'; value_bytes as usize];
    let share = keys.div_ceil(LOAD_CONNECTIONS);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..LOAD_CONNECTIONS)
            .map(|c| {
                let value = &value;
                let range = (c * share).min(keys)..((c + 1) * share).min(keys);
                scope.spawn(move || load_range(port, range, value))
            })
            .collect();
        for worker in workers {
            worker.join().map_err(|_| "a loader thread panicked")??;
        }
        Ok(())
    })
}

fn load_range(port: u16, range: std::ops::Range<u64>, value: &[u8]) -> Result<()> {
    let stream = connect(port)?;
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, stream.try_clone()?);
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut next = range.start;
    while next < range.end {
        let batch_end = (next + LOAD_PIPELINE).min(range.end);
        for index in next..batch_end {
            writer.write_all(&command(&[b"SET", key(index).as_bytes(), value]))?;
        }
        writer.flush()?;
        for index in next..batch_end {
            line.clear();
            reader.read_line(&mut line)?;
            if line != "+OK\r\n" {
                return Err(format!("SET {} answered {line:?}", key(index)).into());
            }
        }
        next = batch_end;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// redis-benchmark.

/// One test's figures as redis-benchmark reports them (latencies in ms).
#[derive(Debug, PartialEq)]
struct BenchResult {
    requests_per_sec: f64,
    avg_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    elapsed: Duration,
}

fn redis_benchmark(
    programs: &Programs,
    port: u16,
    plan: &Plan,
    pipeline: u64,
    test: &str,
) -> Result<BenchResult> {
    let started = Instant::now();
    let output = Command::new(&programs.redis_benchmark)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &plan.clients.to_string()])
        .args(["-n", &plan.requests.to_string()])
        .args(["-d", &plan.value_bytes.to_string()])
        .args(["-r", &plan.keys.to_string()])
        .args(["-P", &pipeline.to_string()])
        .args(["-t", &test.to_ascii_lowercase(), "--csv"])
        .stdin(Stdio::null())
        .output()?;
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "redis-benchmark {test} -P {pipeline} failed ({}): {} {}",
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    let mut result = parse_csv(&stdout, test).ok_or_else(|| {
        format!("redis-benchmark {test} -P {pipeline}: no {test} row in its CSV: {stdout}")
    })?;
    result.elapsed = elapsed;
    Ok(result)
}

/// The row of `test` in redis-benchmark 7's `--csv` output:
/// `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",
/// "p99_latency_ms","max_latency_ms"`, located by the header's names.
fn parse_csv(text: &str, test: &str) -> Option<BenchResult> {
    let split = |line: &str| -> Vec<String> {
        line.split(',')
            .map(|cell| cell.trim().trim_matches('"').to_string())
            .collect()
    };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = split(lines.next()?);
    let row = lines
        .map(split)
        .find(|cells| cells.first().is_some_and(|c| c == test))?;
    let column = |name: &str| -> Option<f64> {
        let at = header.iter().position(|h| h == name)?;
        row.get(at)?.parse().ok()
    };
    Some(BenchResult {
        requests_per_sec: column("rps")?,
        avg_ms: column("avg_latency_ms")?,
        p50_ms: column("p50_latency_ms")?,
        p99_ms: column("p99_latency_ms")?,
        max_ms: column("max_latency_ms")?,
        elapsed: Duration::ZERO,
    })
}

// ---------------------------------------------------------------------------------------
// Terminal table.

fn print_table_header() {
    println!();
    println!(
        "{:<20} {:<16} {:<16} {:>10} {:>9} {:>9} {:>10} {:>10} {:>9} {:>10}",
        "dataset",
        "server",
        "test",
        "req/s",
        "p50 us",
        "p99 us",
        "cpu us/req",
        "client cpu",
        "peak RSS",
        "log syncs"
    );
}

fn print_row(record: &Record) {
    let field = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    println!(
        "{:<20} {:<16} {:<16} {:>10.0} {:>9} {:>9} {:>10} {:>10} {:>9} {:>10}",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_of_redis_benchmark_7_parses() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"18691.59\",\"1.445\",\"0.152\",\"0.743\",\"4.863\",\"7.703\",\"21.519\"\n\
                    \"GET\",\"29850.75\",\"1.082\",\"0.176\",\"0.703\",\"3.367\",\"4.359\",\"4.583\"\n";
        let get = parse_csv(text, "GET").unwrap();
        assert_eq!(get.requests_per_sec, 29850.75);
        assert_eq!(get.p50_ms, 0.703);
        assert_eq!(get.p99_ms, 4.359);
        assert_eq!(get.max_ms, 4.583);
        assert_eq!(parse_csv(text, "SET").unwrap().avg_ms, 1.445);
        assert!(parse_csv(text, "INCR").is_none());
        assert!(parse_csv("", "GET").is_none());
    }

    #[test]
    fn stat_cpu_ticks_survive_odd_command_names() {
        // Fields 14 and 15 (utime 7, stime 5) after a name holding ") (".
        let stat = "42 (a) (b) S 1 42 42 0 -1 4194304 100 0 0 0 7 5 0 0 20 0 3 0 100 1000 50";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(12));
        assert_eq!(parse_stat_cpu_ticks("42 (a) S 1"), None);
    }

    #[test]
    fn voluntary_switches_are_not_confused_with_involuntary_ones() {
        let status = "Name:\tx\nnonvoluntary_ctxt_switches:\t9\nvoluntary_ctxt_switches:\t41\n";
        assert_eq!(parse_voluntary_switches(status), Some(41));
        assert_eq!(
            parse_voluntary_switches("nonvoluntary_ctxt_switches:\t9\n"),
            None
        );
    }

    #[test]
    fn own_process_is_measurable() {
        let pid = std::process::id();
        assert!(process_cpu_ticks(pid).is_some());
        // A sleep of this thread is counted.
        let sleeps = process_sleeps(pid).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(process_sleeps(pid).unwrap() > sleeps, "a sleep is counted");
        assert!(process_peak_rss_bytes(pid).unwrap() > 0);
        assert!(load_average().is_some());
    }

    #[test]
    fn keys_are_redis_benchmarks() {
        assert_eq!(key(123_456), "key:000000123456");
        assert_eq!(key(0).len() as u64, KEY_BYTES);
        assert_eq!(
            command(&[b"SET", b"k", b"v"]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n".to_vec()
        );
    }
}
