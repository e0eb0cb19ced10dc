//! The "Redis Cluster side by side" section of BENCHMARKS.md, from the JSON file of a
//! `tucana-bench cluster-compare` run (module `cluster_compare`): what ran and on what
//! machine, `redis-benchmark --cluster` throughput of each system and Tucana ÷ Redis,
//! the kill -9 cycles (failover time p50/p99, acknowledged writes, writes lost; each
//! cycle), each system's command lines and the command that reproduces the run.
//!
//! A run of several throughput rounds is shown as the median of the rounds (`server`'s
//! `median_records`). Owns this section's layout; reads only the JSON document.
//! Single-threaded.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::records::distinct;
use super::server::{median_records, setups};
use crate::cluster_compare::{quantile, CYCLE_WORKLOAD, READ_BACK_WORKLOAD};
use crate::format::{
    debug_build_warning, fmt_bytes, fmt_number, number, quoted_notes, ratio_cell, shell_args,
};

/// The Redis Cluster's name in the records.
const REDIS: &str = "redis-cluster";

pub(super) fn render(doc: &Value, json_path: &Path) -> String {
    let options = &doc["options"];
    let records: Vec<&Value> = doc["records"]
        .as_array()
        .map(|all| all.iter().collect())
        .unwrap_or_default();
    let mut md = String::new();
    what_ran(&mut md, options, &doc["machine"], json_path);
    if doc["debug_build"].as_bool() == Some(true)
        || options["tucana_binary"]
            .as_str()
            .is_some_and(|p| p.contains("/debug/"))
    {
        md += &debug_build_warning("these numbers");
    }
    if options["quick"].as_bool() == Some(true) {
        md += "**A `--quick` smoke run: the counts are too small to mean anything.**\n\n";
    }
    quoted_notes(&mut md, &options["notes"]);
    let _ = writeln!(
        md,
        "Load average (1, 5, 15 min) before the run: {}; after: {}.\n",
        options["load_average_before"].as_str().unwrap_or("?"),
        options["load_average_after"].as_str().unwrap_or("?")
    );
    throughput(&mut md, &records, options);
    failover(&mut md, &records, options);
    setups(&mut md, options);
    reproduce(&mut md, options);
    md
}

/// The heading and the paragraph on what ran, where, and why the timeouts are equal.
fn what_ran(md: &mut String, options: &Value, machine: &Value, json_path: &Path) {
    *md += "## Redis Cluster side by side: throughput and kill -9 of a master\n\n";
    let timeout = &options["timeout_ms"];
    let _ = writeln!(
        md,
        "From `{}`, written by one `tucana-bench cluster-compare` run (issue 19). Every \
         process on this one machine, loopback networking: **redis-cluster** is six \
         redis-server processes ({}) with `--cluster-enabled yes --appendonly yes \
         --appendfsync everysec`, made 3 masters with 1 replica each by `redis-cli --cluster \
         create --cluster-replicas 1`; Redis replicates asynchronously (a write is answered \
         before any replica has it) and its AOF is fsynced once a second. **tucana-sync** is \
         an etcd and three `tucana serve` servers ({}), 3 regions with 1 backup each (`tucana \
         cluster create --replicas 1`), `--durability sync`: a write is answered once durable \
         on the primary and received by its backup. **tucana-buffered** is the same with \
         `--durability buffered --flush-interval-ms 1000`, Redis's `everysec` mode on the \
         primary. Failure detection is the same for both: Redis's `cluster-node-timeout` and \
         Tucana's lease (`--cluster-lease-ms`) are both {timeout} ms ({}), so the failover \
         times compare the systems' promotions, not two different detection settings.\n",
        json_path.display(),
        options["redis_server_version"]
            .as_str()
            .unwrap_or("?")
            .split(" sha=")
            .next()
            .unwrap_or("?"),
        options["tucana_version"].as_str().unwrap_or("?"),
        if timeout.as_u64() == Some(4000) {
            "Tucana's default lease"
        } else {
            "Tucana's default lease is 4000 ms"
        },
    );
    let _ = writeln!(
        md,
        "Machine: {} cores ({}), {} memory, {}; data on {} ({}). The cores are shared by every \
         process of the cluster, the clients and whatever else the machine runs.\n",
        machine["cores"],
        machine["cpu_model"].as_str().unwrap_or("unknown CPU"),
        machine["mem_total_bytes"]
            .as_u64()
            .map_or_else(|| "unknown".to_string(), fmt_bytes),
        machine["kernel"].as_str().unwrap_or("unknown kernel"),
        machine["disk"].as_str().unwrap_or("an unknown device"),
        options["fs"].as_str().unwrap_or("unknown file system"),
    );
}

/// "### Throughput": redis-benchmark --cluster per system and Tucana ÷ Redis.
fn throughput(md: &mut String, all: &[&Value], options: &Value) {
    let bench: Vec<&Value> = all
        .iter()
        .copied()
        .filter(|r| r["test"].is_string())
        .collect();
    if bench.is_empty() {
        return;
    }
    let records = median_records(&bench);
    let systems = distinct(&records, |r| {
        r["engine"].as_str().unwrap_or("?").to_string()
    });
    let tests = distinct(&records, |r| {
        r["workload"].as_str().unwrap_or("?").to_string()
    });
    let find = |system: &str, test: &str| {
        records
            .iter()
            .find(|r| r["engine"] == system && r["workload"] == test)
    };
    *md += "### Throughput: `redis-benchmark --cluster`\n\n";
    let rounds = options["rounds"].as_u64().unwrap_or(1);
    let _ = writeln!(
        md,
        "`redis-benchmark --cluster -c {} -n {} -d {} -r {} -P P -t set` then `-t get` \
         against each system's fresh cluster (the same flags for all; random keys, each \
         request sent to the master of its key's slot){}. Requests per second, and p50 / \
         p99 latency in ms as redis-benchmark reports them; Tucana ÷ Redis is the throughput \
         ratio (above 1: Tucana serves more).\n",
        options["clients"],
        options["requests"],
        options["value_bytes"],
        options["keyspace"],
        if rounds > 1 {
            format!(
                "; {rounds} rounds, each starting every system in turn, the median of the rounds"
            )
        } else {
            String::new()
        },
    );
    *md += "| test |";
    for s in &systems {
        let _ = write!(md, " {s} requests/s | {s} p50 / p99 ms |");
    }
    let ours: Vec<&String> = systems.iter().filter(|s| *s != REDIS).collect();
    let has_redis = systems.iter().any(|s| s == REDIS);
    if has_redis {
        for s in &ours {
            let _ = write!(md, " {s} ÷ redis |");
        }
    }
    *md += "\n|---|";
    *md += &"---|---|".repeat(systems.len());
    if has_redis {
        *md += &"---|".repeat(ours.len());
    }
    *md += "\n";
    for test in &tests {
        let _ = write!(md, "| {test} |");
        for s in &systems {
            let r = find(s, test);
            let rps = r.and_then(|r| number(&r["ops_per_sec"]));
            let ms = |field: &str| r.and_then(|r| number(&r[field])).map(|us| us / 1000.0);
            let _ = write!(
                md,
                " {} | {} / {} |",
                fmt_number(rps),
                fmt_number(ms("p50_us")),
                fmt_number(ms("p99_us"))
            );
        }
        if has_redis {
            let theirs = find(REDIS, test).and_then(|r| number(&r["ops_per_sec"]));
            for s in &ours {
                let mine = find(s, test).and_then(|r| number(&r["ops_per_sec"]));
                let _ = write!(md, " {} |", ratio_cell(mine, theirs, true));
            }
        }
        *md += "\n";
    }
    *md += "\n";
}

/// Which client the writers and probes used (files without `client` used the router).
fn client_phrase(options: &Value) -> &'static str {
    if options["client"] == "redis-crate" {
        "one client for both systems: the `redis` crate's `ClusterClient`, which refreshes its \
         slot map and retries twice by itself, a new connection after a failed request; a \
         write counts as acknowledged when `OK` came back, retries included"
    } else {
        "one client for both systems, tucana-clusterprobe's (the crash test M8's), which \
         follows `MOVED` and retries nothing itself: a write counts as acknowledged exactly \
         when `OK` came back"
    }
}

/// A cycle's failover time: until the last of the victim's ranges took a write.
fn cycle_failover_ms(record: &Value) -> Option<f64> {
    record["failover_ms"]
        .as_array()?
        .iter()
        .filter_map(number)
        .reduce(f64::max)
}

/// "### Kill -9 of a master": the summary per system, then every cycle.
fn failover(md: &mut String, all: &[&Value], options: &Value) {
    let cycles: Vec<Value> = all
        .iter()
        .filter(|r| r["workload"] == CYCLE_WORKLOAD)
        .map(|r| (*r).clone())
        .collect();
    if cycles.is_empty() {
        return;
    }
    let systems = distinct(&cycles, |r| r["engine"].as_str().unwrap_or("?").to_string());
    *md += "### Kill -9 of a master under acknowledged writes\n\n";
    let _ = writeln!(
        md,
        "On a fresh cluster of each system, {} cycles: {} writer threads write unique keys \
         through the cluster ({}) and record every `OK`; after {} ms the master (primary) of a \
         random slot range is killed with `kill -9`. **Failover** is the time from the kill \
         to the first write acknowledged on a slot of the victim's range (a probe writes \
         there every 20 ms); a victim that led several ranges has a probe on each, and its \
         cycle's failover time is the last of them (p50 and p99 are over cycles, nearest \
         rank). The writers go on {} ms \
         longer, then every key acknowledged in the cycle is read back from the surviving \
         nodes: **lost** are those missing or holding another value. The victim is then \
         restarted on its files (it rejoins as a replica or backup) and the next cycle waits \
         until every range has a caught-up replica again (Redis: the restarted master has \
         rejoined as the replica of its range and resynced; Tucana: the coordinator already \
         gave every region a new backup on the survivors, so the cluster is whole before the \
         victim is back, which then backs nothing until a region lacks a backup; nothing \
         moves primaries back, so after a few cycles one Tucana server leads every region \
         and a kill fails over all of them at once). At the end every key acknowledged \
         in any cycle is read back once more. A `kill -9` loses nothing the kernel holds: \
         what Redis can lose is what its master acknowledged before its replica received it \
         (asynchronous replication), not its AOF's unsynced second.\n",
        options["cycles"],
        options["writers"],
        client_phrase(options),
        options["warmup_ms"],
        options["after_ms"],
    );
    *md += "| system | cycles | failover p50 ms | failover p99 ms | acknowledged writes | lost | lost, read back at the end | acknowledged writes/s while writing |\n|---|---|---|---|---|---|---|---|\n";
    for s in &systems {
        let mine: Vec<&Value> = cycles.iter().filter(|r| r["engine"] == *s).collect();
        let mut ms: Vec<f64> = mine.iter().filter_map(|r| cycle_failover_ms(r)).collect();
        ms.sort_by(f64::total_cmp);
        let sum = |field: &str| -> u64 { mine.iter().filter_map(|r| r[field].as_u64()).sum() };
        let writing_s: f64 = mine
            .iter()
            .filter_map(|r| number(&r["writing_ms"]))
            .sum::<f64>()
            / 1000.0;
        let end = all
            .iter()
            .find(|r| r["engine"] == s.as_str() && r["workload"] == READ_BACK_WORKLOAD);
        let _ = writeln!(
            md,
            "| {s} | {} | {} | {} | {} | **{}** | {} | {} |",
            mine.len(),
            fmt_number(quantile(&ms, 0.5)),
            fmt_number(quantile(&ms, 0.99)),
            sum("acknowledged"),
            sum("lost"),
            end.and_then(|r| r["lost"].as_u64())
                .map_or("–".to_string(), |l| l.to_string()),
            fmt_number((writing_s > 0.0).then(|| sum("acknowledged") as f64 / writing_s)),
        );
    }
    *md += "\nEach cycle:\n\n| system | cycle | victim | failover ms | acknowledged | lost | victim restarted → cluster whole again, s |\n|---|---|---|---|---|---|---|\n";
    for r in &cycles {
        let ms: Vec<String> = r["failover_ms"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| fmt_number(number(v)))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r["engine"].as_str().unwrap_or("?"),
            r["cycle"],
            r["victim"].as_str().unwrap_or("?"),
            ms.join(", "),
            r["acknowledged"],
            r["lost"],
            fmt_number(number(&r["rejoin_ms"]).map(|ms| ms / 1000.0)),
        );
    }
    *md += "\n";
}

/// "### Reproduce": the run's command, through `scripts/bench-cluster.sh`.
fn reproduce(md: &mut String, options: &Value) {
    *md += "### Reproduce\n\n```sh\nscripts/server-deps.sh --bench   # redis-server, redis-cli, redis-benchmark (Debian/Ubuntu, as root)\nscripts/cluster-deps.sh          # etcd, protoc\n";
    let args = shell_args(&options["argv"], 2).unwrap_or_default();
    let _ = writeln!(md, "scripts/bench-cluster.sh {args}");
    *md +=
        "scripts/bench.sh report bench/results.json ...   # as under Reproduce at the top\n```\n\n";
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> Value {
        json!({
            "machine": {"cores": 2, "cpu_model": "AMD EPYC", "mem_total_bytes": 1u64 << 30,
                        "kernel": "Linux 6", "disk": "vda"},
            "options": {
                "argv": ["/x/tucana-bench", "cluster-compare", "--cycles", "2"],
                "clients": 50, "requests": 1000, "value_bytes": 100, "keyspace": 1000,
                "rounds": 1, "cycles": 2, "writers": 4, "warmup_ms": 2000, "after_ms": 3000,
                "timeout_ms": 5000, "notes": ["shared machine"],
                "redis_server_version": "Redis server v=7.0.15 sha=0", "tucana_version": "tucana 0.1.0",
                "configurations": {"redis-cluster": ["redis-server --port PORT"]},
            },
            "records": [
                {"engine": "redis-cluster", "workload": "SET -P 1", "test": "SET", "ops_per_sec": 1000.0, "p50_us": 500.0, "p99_us": 2000.0, "round": 0},
                {"engine": "tucana-sync", "workload": "SET -P 1", "test": "SET", "ops_per_sec": 500.0, "p50_us": 1500.0, "p99_us": 9000.0, "round": 0},
                {"engine": "redis-cluster", "workload": CYCLE_WORKLOAD, "cycle": 0, "victim": "127.0.0.1:1", "failover_ms": [6000.0], "acknowledged": 100, "lost": 3, "writing_ms": 10000.0, "rejoin_ms": 7000.0},
                {"engine": "redis-cluster", "workload": CYCLE_WORKLOAD, "cycle": 1, "victim": "127.0.0.1:2", "failover_ms": [7000.0], "acknowledged": 100, "lost": 0, "writing_ms": 10000.0, "rejoin_ms": 7000.0},
                {"engine": "redis-cluster", "workload": READ_BACK_WORKLOAD, "acknowledged": 200, "lost": 3},
                {"engine": "tucana-sync", "workload": CYCLE_WORKLOAD, "cycle": 0, "victim": "127.0.0.1:3", "failover_ms": [5000.0, 5100.0], "acknowledged": 50, "lost": 0, "writing_ms": 10000.0, "rejoin_ms": 100.0},
            ],
        })
    }

    #[test]
    fn section_has_the_ratio_and_the_losses_of_each_system() {
        let md = render(&doc(), Path::new("bench/cluster-results.json"));
        assert!(md.contains("## Redis Cluster side by side"));
        assert!(md.contains("Machine: 2 cores (AMD EPYC)"));
        assert!(md.contains("> shared machine"));
        // Throughput: 500 ÷ 1000.
        assert!(
            md.contains("| SET -P 1 | 1000 | 0.50 / 2.00 | 500.0 | 1.50 / 9.00 | 0.50 |"),
            "{md}"
        );
        // Redis: two cycles, 3 lost, p50 of 6000 and 7000 by nearest rank, 200 acks in 20 s.
        assert!(
            md.contains("| redis-cluster | 2 | 7000 | 7000 | 200 | **3** | 3 | 10.0 |"),
            "{md}"
        );
        // Tucana: both probes of its one cycle count; no read back at the end recorded.
        assert!(
            md.contains("| tucana-sync | 1 | 5100 | 5100 | 50 | **0** | – | 5.00 |"),
            "{md}"
        );
        assert!(
            md.contains("| tucana-sync | 0 | 127.0.0.1:3 | 5000, 5100 | 50 | 0 | 0.10 |"),
            "{md}"
        );
        assert!(md.contains("scripts/bench-cluster.sh --cycles 2"));
    }
}
