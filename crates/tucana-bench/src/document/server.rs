//! The "Redis protocol" section of BENCHMARKS.md, from the JSON file of a `tucana-bench
//! server` run (module `server`): what ran, Tucana ÷ redis-server in memory (the median of
//! the rounds' own ratios when the run had several), every absolute figure, the
//! larger-than-memory variant, each server's configuration and the command that reproduces
//! the run.
//!
//! Owns this section's layout; reads only the JSON document, never runs anything.
//! Single-threaded.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::format::{
    debug_build_warning, fmt_bytes, fmt_mib, fmt_number, number, quoted_notes, ratio_cell,
    shell_args,
};

/// "### Setups": each system's (or setup's) command lines, from the run's
/// `configurations` (the cluster and replication sections).
pub(super) fn setups(md: &mut String, options: &Value) {
    *md += "### Setups\n\n";
    if let Some(configurations) = options["configurations"].as_object() {
        for (name, lines) in configurations {
            let commands: Vec<String> = lines
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|l| format!("`{l}`"))
                .collect();
            let _ = writeln!(md, "- `{name}`: {}", commands.join("; "));
        }
    }
    *md += "\n";
}

/// One record per (data set, server, test), in the order first seen, each numeric field
/// the median over the rounds that have it (a run of one round: its records as they are).
/// The replication section's rounds are summarised the same way.
pub(super) fn median_records(all: &[&Value]) -> Vec<Value> {
    let mut keys: Vec<(&Value, &Value, &Value)> = Vec::new();
    for r in all {
        let key = (&r["dataset"], &r["engine"], &r["workload"]);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(dataset, engine, workload)| {
            let group: Vec<&Value> = all
                .iter()
                .copied()
                .filter(|r| {
                    &r["dataset"] == dataset && &r["engine"] == engine && &r["workload"] == workload
                })
                .collect();
            let mut merged = group[0].clone();
            if let Some(fields) = merged.as_object_mut() {
                fields.remove("round");
                for (name, value) in fields.iter_mut() {
                    if !value.is_number() {
                        continue;
                    }
                    let mut values: Vec<f64> = group
                        .iter()
                        .filter_map(|r| number(&r[name.as_str()]))
                        .collect();
                    if values.len() != group.len() {
                        continue;
                    }
                    values.sort_by(f64::total_cmp);
                    let n = values.len();
                    *value = if value.is_u64() {
                        // Counts stay whole: the lower median.
                        json!(values[(n - 1) / 2] as u64)
                    } else if n % 2 == 1 {
                        json!(values[n / 2])
                    } else {
                        json!((values[n / 2 - 1] + values[n / 2]) / 2.0)
                    };
                }
            }
            merged
        })
        .collect()
}

/// A `server` run's records as the section's tables read them.
struct Run<'a> {
    /// Every record, each round's own.
    all: Vec<&'a Value>,
    /// One record per (data set, server, test): the median of the rounds.
    medians: Vec<Value>,
    rounds: u64,
}

/// The server Tucana's servers are compared with.
const REDIS: &str = "redis-everysec";

impl<'a> Run<'a> {
    fn new(doc: &'a Value) -> Run<'a> {
        let all: Vec<&Value> = doc["records"]
            .as_array()
            .map(|all| all.iter().collect())
            .unwrap_or_default();
        let rounds = all
            .iter()
            .filter_map(|r| r["round"].as_u64())
            .max()
            .map_or(1, |last| last + 1);
        let medians = median_records(&all);
        Run {
            all,
            medians,
            rounds,
        }
    }

    /// The median record of `workload` on `server` in `dataset`.
    fn find(&self, dataset: &str, server: &str, workload: &str) -> Option<&Value> {
        self.medians
            .iter()
            .find(|r| r["dataset"] == dataset && r["engine"] == server && r["workload"] == workload)
    }

    /// The tests (workloads) in the order first seen.
    fn tests(&self) -> Vec<String> {
        let mut seen: Vec<String> = Vec::new();
        for r in &self.medians {
            if let Some(w) = r["workload"].as_str() {
                if !seen.iter().any(|s| s == w) {
                    seen.push(w.to_string());
                }
            }
        }
        seen
    }

    /// `field` of `server`'s in-memory `workload` record of round `round`.
    fn in_round(&self, server: &str, workload: &str, round: u64, field: &str) -> Option<f64> {
        self.all
            .iter()
            .find(|r| {
                r["dataset"] == "in-memory"
                    && r["engine"] == server
                    && r["workload"] == workload
                    && r["round"].as_u64() == Some(round)
            })
            .and_then(|r| number(&r[field]))
    }

    /// Each round's ratio of `field`, `server` ÷ redis-server (the two servers of a round
    /// ran minutes apart, through the same spell).
    fn round_ratios(&self, server: &str, workload: &str, field: &str) -> Vec<Option<f64>> {
        (0..self.rounds)
            .map(|round| {
                match (
                    self.in_round(server, workload, round, field),
                    self.in_round(REDIS, workload, round, field),
                ) {
                    (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                    _ => None,
                }
            })
            .collect()
    }
}

/// The Markdown section for BENCHMARKS.md from a `server` run's JSON document.
pub(super) fn render(doc: &Value, json_path: &Path) -> String {
    let options = &doc["options"];
    let run = Run::new(doc);
    let mut md = String::new();
    what_ran(&mut md, options, json_path);
    warnings(&mut md, doc);
    quoted_notes(&mut md, &options["notes"]);
    let _ = writeln!(
        md,
        "Load average (1, 5, 15 min) before the run: {}; after: {}.\n",
        options["load_average_before"].as_str().unwrap_or("?"),
        options["load_average_after"].as_str().unwrap_or("?")
    );
    rounds(&mut md, run.rounds);
    connection_threads(&mut md, &run.medians, options);
    busy_polling(&mut md, &run.medians);
    ratio_table(&mut md, &run, options);
    absolute_table(&mut md, &run);
    larger_than_memory(&mut md, &run.medians, &options["larger_than_memory"]);
    configurations(&mut md, options);
    reproduce(&mut md, options);
    md
}

/// The heading, the paragraph on how each server was loaded and measured, and the target.
fn what_ran(md: &mut String, options: &Value, json_path: &Path) {
    *md += "## Redis protocol: `tucana serve` and redis-server under redis-benchmark\n\n";
    let _ = writeln!(
        md,
        "From `{}`, written by one `tucana-bench server` run. Each server ran alone on a fresh \
         data directory; the keyspace was first loaded with a pipelined SET of every key (so \
         every GET finds its key), the harness waited for the server to finish what the load \
         left it to do (Tucana: `SAVE`, the commit of the loaded keys; redis-server: its \
         automatic AOF rewrite, if one ran), then `redis-benchmark -t set` and `-t get` ran at each \
         pipeline depth, {} connections, {} requests per test, {}-byte values, {} random keys \
         (`-r`). redis-benchmark {}; {}.\n",
        json_path.display(),
        options["clients"],
        options["requests"],
        options["value_bytes"],
        options["keyspace"],
        options["redis_benchmark_version"]
            .as_str()
            .unwrap_or("?")
            .trim_start_matches("redis-benchmark "),
        options["redis_server_version"]
            .as_str()
            // "Redis server v=7.0.15 sha=00000000:0 malloc=...": the version is enough.
            .map_or("no redis-server", |v| v.split(" sha=").next().unwrap_or(v)),
    );
    if let Some(records) = options["type_keys"].as_u64().filter(|&n| n > 0) {
        let _ = writeln!(
            md,
            "The data-type tests (issue 23) followed at each pipeline depth, after a load of \
             {records} records of 10 fields of {} bytes (`HSET rec:N field0 v ... field9 v`) and of \
             an index holding each record at its number (`ZADD rec-index N rec:N`): `HSET` of a \
             random record, `HGETALL` of one, `ZADD` of a random member at a random score to the \
             index and `ZRANGEBYSCORE rec-index N +inf LIMIT 0 10` (YCSB's Redis binding: records \
             as hashes, its scan index a sorted set), then redis-benchmark's own `LPUSH` and `LPOP` \
             (one list; the pops take what the pushes left), {records} random keys (`-r`).\n",
            options["field_bytes"],
        );
    }
    if options["quiet_between_tests"].as_bool() == Some(true) {
        *md += "After each test the harness waited until the server's process tree was quiet \
               (at most 2 clock ticks of CPU in half a second, for up to a minute) before it \
               read the server's CPU, so what a test left its server to do in the background \
               (Tucana's log collection of the records the test made dead, redis-server's AOF \
               rewrite) is in that test's server CPU and does not slow the next test down; \
               requests/s is redis-benchmark's own, over the requests alone.\n\n";
    }
    *md += "Issue 6's target: Tucana at ≥ 1.0× redis-server's throughput while persisting \
           every write to its log, with the data set allowed to be larger than memory. \
           Issue 23's: the same for the data-type tests.\n\n";
}

/// A debug build's warning (of the harness or of the `tucana` it ran), and a quick run's.
fn warnings(md: &mut String, doc: &Value) {
    let options = &doc["options"];
    if doc["debug_build"].as_bool() == Some(true)
        || options["tucana_binary"]
            .as_str()
            .is_some_and(|p| p.contains("/debug/"))
    {
        *md += &debug_build_warning("these numbers");
    }
    if options["quick"].as_bool() == Some(true) {
        *md += "**A `--quick` smoke run: the counts are too small to mean anything.**\n\n";
    }
}

/// How the rounds of a run of several are summarised.
fn rounds(md: &mut String, rounds: u64) {
    if rounds > 1 {
        let _ = writeln!(
            md,
            "{rounds} rounds: each round ran every server once, in the order listed, so the servers \
             alternated. The ratios are the median of each round's own ratio (the two servers of a \
             round ran minutes apart), and the first table also lists each round's throughput \
             ratio; the absolute figures are the median of the rounds (each round's own are in \
             the JSON file).\n"
        );
    }
}

/// How many connection threads `tucana serve` ran, as it reported them.
fn connection_threads(md: &mut String, records: &[Value], options: &Value) {
    let mut threads: Vec<u64> = records
        .iter()
        .filter_map(|r| r["connection_threads"].as_u64())
        .collect();
    threads.sort_unstable();
    threads.dedup();
    if threads.is_empty() {
        return;
    }
    let list: Vec<String> = threads.iter().map(u64::to_string).collect();
    let how = match options["tucana_threads"].as_u64() {
        Some(_) => "as `--tucana-threads` asked",
        None => "its default for the machine's cores",
    };
    let _ = writeln!(
        md,
        "`tucana serve` ran {} connection thread(s) ({how}; INFO `connection_threads`).\n",
        list.join(", ")
    );
}

/// How long each Tucana server's connection threads polled before sleeping.
fn busy_polling(md: &mut String, records: &[Value]) {
    let mut polls: Vec<String> = Vec::new();
    for r in records {
        if let (Some(server), Some(us)) = (r["engine"].as_str(), r["busy_poll_us"].as_u64()) {
            let text = match us {
                0 => format!("{server} off"),
                us => format!("{server} {us} µs"),
            };
            if !polls.contains(&text) {
                polls.push(text);
            }
        }
    }
    if !polls.is_empty() {
        let _ = writeln!(
            md,
            "Busy polling before a connection thread sleeps (`--busy-poll-us`, INFO \
             `busy_poll_us`; docs/server-bench.md): {}.\n",
            polls.join(", ")
        );
    }
}

/// "Tucana ÷ redis-server (in memory)": throughput and server CPU of each Tucana server
/// over redis-server's, a row per test (and each round's throughput ratio, with several),
/// when the run had both.
fn ratio_table(md: &mut String, run: &Run, options: &Value) {
    let servers: Vec<String> = options["servers"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let ours: Vec<&String> = servers.iter().filter(|s| s.starts_with("tucana")).collect();
    if !servers.iter().any(|s| s == REDIS) || ours.is_empty() {
        return;
    }
    *md += "### Tucana ÷ redis-server (in memory)\n\n";
    *md += "Throughput: above 1 means Tucana serves more requests per second. Server CPU: \
            below 1 means the Tucana server spends less CPU time per request.\n\n";
    *md += "| test |";
    for s in &ours {
        let _ = write!(md, " {s} throughput | {s} server CPU |");
        if run.rounds > 1 {
            let _ = write!(md, " {s} throughput, each round |");
        }
    }
    *md += "\n|---|";
    *md += &(if run.rounds > 1 {
        "---|---|---|"
    } else {
        "---|---|"
    })
    .repeat(ours.len());
    *md += "\n";
    for test in &run.tests() {
        let _ = write!(md, "| {test} |");
        for s in &ours {
            ratio_cells(md, run, s, test);
        }
        *md += "\n";
    }
    *md += "\n";
}

/// The cells of one Tucana server in one test's row: throughput and server CPU ratios,
/// then each round's throughput ratio when there are several rounds.
fn ratio_cells(md: &mut String, run: &Run, server: &str, test: &str) {
    for (field, higher_is_better) in [("ops_per_sec", true), ("cpu_us_per_op", false)] {
        let (a, b) = if run.rounds > 1 {
            // The median of the rounds' own ratios, not a ratio of medians taken from
            // different rounds.
            let ratios: Vec<f64> = run
                .round_ratios(server, test, field)
                .into_iter()
                .flatten()
                .collect();
            (median(ratios), Some(1.0))
        } else {
            (
                run.find("in-memory", server, test)
                    .and_then(|r| number(&r[field])),
                run.find("in-memory", REDIS, test)
                    .and_then(|r| number(&r[field])),
            )
        };
        let cell = ratio_cell(a, b, higher_is_better);
        let _ = write!(md, " {cell} |");
    }
    if run.rounds > 1 {
        let each: Vec<String> = run
            .round_ratios(server, test, "ops_per_sec")
            .into_iter()
            .map(|r| r.map_or("–".to_string(), |r| format!("{r:.2}")))
            .collect();
        let _ = write!(md, " {} |", each.join(", "));
    }
}

/// The median of `values` (the mean of the middle two for an even count); `None` for none.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// "Absolute figures": what the columns are, then a row per data set, test and server.
fn absolute_table(md: &mut String, run: &Run) {
    *md += "### Absolute figures\n\n";
    *md += "requests/s and latency percentiles as redis-benchmark reports them (with pipelining \
            a request's latency includes waiting for the rest of its batch); server CPU is the \
            user + system time of the server's process tree during the test ÷ requests: its \
            threads, its live children and the children it has waited for (/proc/PID/stat \
            utime, stime, cutime, cstime, and each descendant's), so redis-server's forked AOF \
            rewrite counts as Tucana's log collector thread does; process CPU is the server \
            process's threads alone (records from before the tree was counted have only \
            server CPU, and it is the process's); peak RSS is the server's VmHWM during the test (Tucana's includes the pages of its \
            volume file it maps, which the kernel can reclaim; Redis's is its heap); log syncs are Tucana's \
            fsyncs of its log during the test (INFO persistence); server sleeps are the \
            voluntary context switches of all the server's threads (/proc/PID/task/*/status) \
            ÷ requests: each is a thread that found nothing to do and had to be woken again, \
            at pipeline 1 mostly by the client's next request; client CPU is redis-benchmark's \
            user + system time ÷ requests (the client shares the machine's cores with the server, \
            and how the server batches its replies changes what the client spends). `load` is the \
            harness's own SET of every key (4 connections, pipeline 256); its server CPU includes the \
            wait that followed it (Tucana's commit of the loaded keys).\n\n";
    *md += "| data set | test | server | requests/s | p50 µs | p99 µs | server CPU µs/request | process CPU µs/request | client CPU µs/request | server sleeps per request | peak RSS MiB | log syncs | writes per sync |\n";
    *md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let tests = run.tests();
    for dataset in ["in-memory", "larger-than-memory"] {
        for test in &tests {
            for r in run
                .medians
                .iter()
                .filter(|r| r["dataset"] == dataset && r["workload"] == test.as_str())
            {
                let syncs = r["log_syncs"].as_u64();
                let writes_per_sync = match (syncs, test.contains("GET")) {
                    (Some(s), false) if s > 0 => number(&r["requests"]).map(|n| n / s as f64),
                    _ => None,
                };
                let _ = writeln!(
                    md,
                    "| {dataset} | {test} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    r["engine"].as_str().unwrap_or("?"),
                    fmt_number(number(&r["ops_per_sec"])),
                    fmt_number(number(&r["p50_us"])),
                    fmt_number(number(&r["p99_us"])),
                    fmt_number(number(&r["cpu_us_per_op"])),
                    fmt_number(number(&r["process_cpu_us_per_op"])),
                    fmt_number(number(&r["client_cpu_us_per_op"])),
                    number(&r["server_sleeps_per_op"]).map_or("–".into(), |s| format!("{s:.3}")),
                    fmt_mib(number(&r["peak_rss_bytes"])),
                    syncs.map_or("–".into(), |s| s.to_string()),
                    fmt_number(writes_per_sync),
                );
            }
        }
    }
    *md += "\n";
}

/// "Larger than memory (Tucana only)": the cgroup and the data set, then the device
/// traffic of each test; nothing when the run skipped the variant.
fn larger_than_memory(md: &mut String, records: &[Value], large: &Value) {
    if !large.is_object() {
        return;
    }
    *md += "### Larger than memory (Tucana only)\n\n";
    let _ = writeln!(
        md,
        "redis-server keeps every key and value in memory, so it cannot serve a data set \
         larger than memory: this variant has no Redis row. `{}` ran inside a memory \
         cgroup the harness created ({}), {} keys × {}-byte values = {} of keys and values, \
         {} requests per test over all the keys.\n",
        large["server"].as_str().unwrap_or("?"),
        large_cgroup(large),
        large["keys"],
        large["value_bytes"],
        large["data_bytes"].as_u64().map_or("?".into(), fmt_bytes),
        large["requests"],
    );
    if let Some(failed) = large["failed"].as_str() {
        let _ = writeln!(md, "**The run did not finish: {failed}.**\n");
    }
    *md += "Device traffic during each test (the data directory's block device, every \
            process on it):\n\n| test | device read MiB | device written MiB | device bytes read per request |\n|---|---|---|---|\n";
    for r in records
        .iter()
        .filter(|r| r["dataset"] == "larger-than-memory")
    {
        let read = number(&r["device_read_bytes"]);
        let written = number(&r["device_write_bytes"]);
        let per_request = read
            .zip(number(&r["requests"]))
            .map(|(b, n)| b / n.max(1.0));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            r["workload"].as_str().unwrap_or("?"),
            fmt_number(read.map(|b| b / (1 << 20) as f64)),
            fmt_number(written.map(|b| b / (1 << 20) as f64)),
            fmt_number(per_request),
        );
    }
    *md += "\n";
}

/// The larger-than-memory variant's cgroup: its limit and what the server used of it, or
/// why there was none.
fn large_cgroup(large: &Value) -> String {
    match large["cgroup"]["error"].as_str() {
        None => format!(
            "cgroup {} `{}` = {}, page cache included; peak use {}, limit reached {} times",
            large["cgroup"]["version"].as_str().unwrap_or("?"),
            large["cgroup"]["limit_file"].as_str().unwrap_or("?"),
            large["memory_limit_bytes"]
                .as_u64()
                .map_or("?".into(), fmt_bytes),
            large["cgroup_peak_bytes"]
                .as_u64()
                .map_or("?".into(), fmt_bytes),
            large["cgroup_limit_hits"]
                .as_u64()
                .map_or("?".into(), |n| n.to_string()),
        ),
        Some(reason) => format!("**not applied**: {reason}; memory was NOT limited"),
    }
}

/// "Server configurations": each server's command line and promise, and Tucana's version.
fn configurations(md: &mut String, options: &Value) {
    *md += "### Server configurations\n\n";
    if let Some(configurations) = options["configurations"].as_object() {
        for (name, c) in configurations {
            let _ = writeln!(
                md,
                "- `{name}`: `{}`: {}",
                c["command"].as_str().unwrap_or("?"),
                c["promise"].as_str().unwrap_or("?")
            );
        }
    }
    let _ = writeln!(
        md,
        "\nTucana: {}.\n",
        options["tucana_version"].as_str().unwrap_or("?")
    );
}

/// "Reproduce": the run's command (through `scripts/bench-redis.sh`), and why the server
/// CPU column is the fairer one.
fn reproduce(md: &mut String, options: &Value) {
    *md += "### Reproduce\n\n```sh\nscripts/server-deps.sh --bench   # redis-server, redis-benchmark (Debian/Ubuntu, as root)\n";
    let args = shell_args(&options["argv"], 2).unwrap_or_default();
    let _ = writeln!(md, "scripts/bench-redis.sh {args}");
    *md += "```\n\n";
    *md += "redis-benchmark runs on the same cores as the server it measures, so on a small \
            machine the two compete for CPU; the server CPU column is the fairer comparison \
            of what each server costs per request.\n\n";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_has_ratios_absolutes_and_the_large_row() {
        let doc = json!({
            "debug_build": false,
            "options": {
                "argv": ["/x/tucana-bench", "server", "--dir", "/var/tmp/sb"],
                "servers": ["redis-everysec", "tucana-buffered", "tucana-buffered-nopoll"],
                "clients": 50, "requests": 100, "value_bytes": 100, "keyspace": 10,
                "redis_benchmark_version": "redis-benchmark 7.0.15",
                "redis_server_version": "Redis server v=7.0.15",
                "load_average_before": "1.00 2.00 3.00",
                "notes": ["shared machine"],
                "configurations": {"tucana-buffered": {"command": "tucana serve", "promise": "p"}},
                "larger_than_memory": {"server": "tucana-buffered", "keys": 10, "value_bytes": 1000,
                    "data_bytes": 10160, "requests": 100, "memory_limit_bytes": 4096,
                    "cgroup": {"version": "v1", "limit_file": "memory.limit_in_bytes"}},
            },
            "records": [
                {"engine": "redis-everysec", "workload": "redis-SET-P1", "dataset": "in-memory",
                 "ops_per_sec": 100.0, "cpu_us_per_op": 10.0, "requests": 100},
                {"engine": "tucana-buffered", "workload": "redis-SET-P1", "dataset": "in-memory",
                 "ops_per_sec": 150.0, "cpu_us_per_op": 20.0, "requests": 100, "log_syncs": 4,
                 "process_cpu_us_per_op": 18.0,
                 "client_cpu_us_per_op": 12.5, "connection_threads": 1, "busy_poll_us": 50,
                 "server_sleeps_per_op": 0.0125},
                {"engine": "tucana-buffered-nopoll", "workload": "redis-SET-P1", "dataset": "in-memory",
                 "ops_per_sec": 120.0, "cpu_us_per_op": 20.0, "requests": 100, "busy_poll_us": 0},
                {"engine": "tucana-buffered", "workload": "redis-GET-P1", "dataset": "larger-than-memory",
                 "ops_per_sec": 50.0, "requests": 100, "device_read_bytes": 409600},
            ],
        });
        let md = render(&doc, Path::new("bench/server-results.json"));
        assert!(md.contains("| redis-SET-P1 | **1.50** | 2.00 |"), "{md}");
        assert!(
            md.contains("| in-memory | redis-SET-P1 | tucana-buffered | 150.0 |"),
            "{md}"
        );
        assert!(md.contains("| 25.0 |"), "writes per sync: {md}");
        assert!(
            md.contains("| 20.0 | 18.0 | 12.5 | 0.013 |"),
            "server (process tree), process and client CPU: {md}"
        );
        // A record from before the tree was counted has no process column of its own.
        assert!(
            md.contains("| tucana-buffered-nopoll | 120.0 | – | – | 20.0 | – |"),
            "{md}"
        );
        assert!(
            md.contains("ran 1 connection thread(s) (its default"),
            "{md}"
        );
        assert!(
            md.contains("`busy_poll_us`; docs/server-bench.md): tucana-buffered 50 µs, tucana-buffered-nopoll off."),
            "{md}"
        );
        assert!(
            md.contains("| redis-SET-P1 | **1.50** | 2.00 | **1.20** |"),
            "{md}"
        );
        assert!(md.contains("cannot serve a data set"), "{md}");
        assert!(md.contains("| redis-GET-P1 | 0.39 | – | 4096 |"), "{md}");
        assert!(
            md.contains("scripts/bench-redis.sh --dir /var/tmp/sb"),
            "{md}"
        );
        assert!(md.contains("> shared machine"));
    }

    #[test]
    fn rounds_are_shown_as_medians_with_each_rounds_ratio() {
        let rec = |engine: &str, round: u64, ops: f64, cpu: f64| {
            json!({"engine": engine, "workload": "redis-GET-P16", "dataset": "in-memory",
                   "ops_per_sec": ops, "cpu_us_per_op": cpu, "requests": 100, "round": round,
                   "connection_threads": 1})
        };
        let doc = json!({
            "options": {
                "argv": ["/x/tucana-bench", "server", "--rounds", "3"],
                "servers": ["redis-everysec", "tucana-buffered"],
                "rounds": 3,
            },
            "records": [
                rec("redis-everysec", 0, 100.0, 2.0), rec("tucana-buffered", 0, 90.0, 2.0),
                rec("redis-everysec", 1, 200.0, 1.0), rec("tucana-buffered", 1, 300.0, 1.0),
                rec("redis-everysec", 2, 150.0, 3.0), rec("tucana-buffered", 2, 165.0, 4.0),
            ],
        });
        let md = render(&doc, Path::new("bench/server-results.json"));
        // Medians: redis 150 and 2.0 us, tucana 165 and 2.0 us.
        assert!(
            md.contains("| redis-GET-P16 | **1.10** | **1.00** | 0.90, 1.50, 1.10 |"),
            "{md}"
        );
        assert!(md.contains("3 rounds"), "{md}");
        assert!(
            md.contains("| in-memory | redis-GET-P16 | tucana-buffered | 165.0 |"),
            "{md}"
        );
        assert!(md.contains("ran 1 connection thread(s)"), "{md}");
    }
}
