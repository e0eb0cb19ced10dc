//! "Where the time went": for each phase a suite run made with `--offcpu` measured, the
//! client threads' wall time split into running, runnable and blocked, the wait channels
//! they slept in most, the engine's own threads' CPU, and the device's throughput and
//! queue depth (the figures module `crate::offcpu` records). Written under the suite's
//! absolute figures when its run had `--offcpu`, and as a section of its own for a
//! separate run given with `report --offcpu-json`.
//!
//! Owns the layout of those tables; reads only the JSON. Single-threaded.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::records::{dataset, distinct, find, records, row_name};
use crate::format::{fmt_number, number, quoted_notes, shell_args};

/// The table's opening paragraph: what each column is.
const COLUMNS: &str = "Client threads are the harness's threads that issue the phase's \
    operations; their wall time is split into running on a CPU, runnable (waiting for a \
    CPU) and blocked, from each thread's `/proc/<pid>/task/<tid>/schedstat` over the span \
    it was alive in the phase. Their top waits are the most frequent (state, kernel wait \
    channel) of their samples every 10 ms (`stat`'s state, `wchan`), as a share of all their \
    samples: D is an uninterruptible wait (a page read, writeback throttling, a direct \
    write), S an interruptible sleep (a lock, a condition variable, fsync's wait on a \
    journal). Engine threads are every other thread of the process (the engine's own): \
    their CPU seconds, seconds spent runnable, and their most frequent D waits (as a share \
    of all their samples, idle threads included). The device is the data directory's, from \
    `/proc/diskstats`: MB/s written and read (10^6 bytes, every process on the device) and \
    the average number of requests in flight (weighted I/O time ÷ wall time). Phases whose \
    clients the sampler saw for less than a second in all are left out.";

/// The tables of `records` that carry `offcpu` figures, one per data set; nothing when
/// none does.
pub(super) fn tables(md: &mut String, records: &[Value], heading_level: &str) {
    let measured: Vec<Value> = records
        .iter()
        .filter(|r| r["offcpu"].is_object() && clients_were_seen(&r["offcpu"]))
        .cloned()
        .collect();
    if measured.is_empty() {
        return;
    }
    let _ = writeln!(md, "{heading_level} Where the time went\n\n{COLUMNS}\n");
    let engines = distinct(&measured, |r| {
        r["engine"].as_str().unwrap_or("?").to_string()
    });
    for dataset_name in distinct(&measured, dataset) {
        let _ = writeln!(md, "{heading_level}# {dataset_name}: where the time went\n");
        *md += "| phase | engine | ops/s | clients run | runnable | blocked | clients' top waits | engine threads CPU s | runnable s | engine threads' top D waits | device write MB/s | read MB/s | queue depth |\n";
        *md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
        let in_set: Vec<Value> = measured
            .iter()
            .filter(|r| dataset(r) == dataset_name)
            .cloned()
            .collect();
        for row in distinct(&in_set, row_name) {
            for engine in &engines {
                if let Some(record) = find(&in_set, &dataset_name, &row, engine) {
                    table_row(md, &row, engine, record);
                }
            }
        }
        *md += "\n";
    }
}

/// The least time the clients must have been seen for, in all, for a phase to get a row:
/// over a few sampling intervals the clock and `schedstat` readings, taken microseconds
/// apart, weigh too much (a tiny data set's phases).
const MIN_CLIENT_SECONDS: f64 = 1.0;

/// Whether the sampler saw the phase's clients for at least [`MIN_CLIENT_SECONDS`].
fn clients_were_seen(figures: &Value) -> bool {
    let clients = &figures["clients"];
    ["run_s", "runnable_s", "blocked_s"]
        .iter()
        .filter_map(|field| number(&clients[*field]))
        .sum::<f64>()
        >= MIN_CLIENT_SECONDS
}

fn table_row(md: &mut String, row: &str, engine: &str, record: &Value) {
    let figures = &record["offcpu"];
    let clients = &figures["clients"];
    let engine_threads = &figures["engine"];
    let device = &figures["device"];
    let pct = |v: &Value| number(v).map_or("–".to_string(), |f| format!("{:.0}%", f * 100.0));
    let _ = writeln!(
        md,
        "| {row} | {engine} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        fmt_number(number(&record["ops_per_sec"])),
        pct(&clients["run_frac"]),
        pct(&clients["runnable_frac"]),
        pct(&clients["blocked_frac"]),
        crate::offcpu::top_waits(clients, 3).unwrap_or_else(|| "–".to_string()),
        fmt_number(number(&engine_threads["run_s"])),
        fmt_number(number(&engine_threads["runnable_s"])),
        crate::offcpu::top_d_waits(engine_threads, 2).unwrap_or_else(|| "–".to_string()),
        fmt_number(number(&device["write_mb_s"])),
        fmt_number(number(&device["read_mb_s"])),
        fmt_number(number(&device["queue_depth"])),
    );
}

/// The section of a separate `--offcpu` suite run (`report --offcpu-json`): where it
/// comes from, its command, its notes, then its tables.
pub(super) fn render_run(doc: &Value, path: &Path) -> String {
    let mut md = format!("## Where the time went: `{}`\n\n", path.display());
    let _ = writeln!(
        md,
        "From `{}`, one `tucana-bench suite --offcpu` run (a sampler thread read every \
         thread's /proc files every 10 ms; its own CPU time is in the JSON file as \
         `sampler_cpu_s`). Its throughput figures are that run's, not the tables' above.\n",
        path.display()
    );
    quoted_notes(&mut md, &doc["options"]["notes"]);
    if let Some(args) = shell_args(&doc["options"]["argv"], 1) {
        let _ = writeln!(md, "```sh\nscripts/bench.sh {args}\n```\n");
    }
    tables(&mut md, &records(doc), "###");
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_with_figures_get_a_row_and_others_none() {
        let offcpu = serde_json::json!({
            "clients": {"run_frac": 0.3, "runnable_frac": 0.05, "blocked_frac": 0.65,
                        "run_s": 3.0, "runnable_s": 0.5, "blocked_s": 6.5,
                        "top_waits": [{"state": "D", "wchan": "balance_dirty_pages", "frac": 0.4}]},
            "engine": {"run_s": 12.5, "runnable_s": 0.5,
                       "top_d_waits": [{"state": "D", "wchan": "jbd2_log_wait_commit", "frac": 0.1}]},
            "device": {"write_mb_s": 120.0, "read_mb_s": 3.0, "queue_depth": 1.5},
        });
        let doc = serde_json::json!({
            "options": {"argv": ["/x/tucana-bench", "suite", "--offcpu"], "notes": ["shared"]},
            "records": [
                {"engine": "tucana", "workload": "ycsb_load", "dataset": "larger-than-memory",
                 "threads": 2, "ops_per_sec": 100000.0, "offcpu": offcpu},
                {"engine": "tucana", "workload": "ycsb_a", "dataset": "larger-than-memory",
                 "threads": 2, "ops_per_sec": 5.0},
                {"engine": "tucana", "workload": "ycsb_b", "dataset": "larger-than-memory",
                 "threads": 2, "ops_per_sec": 5.0, "offcpu": {"clients": {"run_s": 0.2,
                 "runnable_s": 0.3, "blocked_s": 0.0}}},
            ],
        });
        let md = render_run(&doc, Path::new("bench/x.json"));
        assert!(
            md.contains("| ycsb_load | tucana | 100000 | 30% | 5% | 65% | D balance_dirty_pages 40% | 12.5 | 0.50 | D jbd2_log_wait_commit 10% | 120.0 | 3.00 | 1.50 |"),
            "{md}"
        );
        assert!(!md.contains("| ycsb_a |"), "{md}");
        assert!(
            !md.contains("| ycsb_b |"),
            "a phase whose clients were not seen: {md}"
        );
        assert!(md.contains("scripts/bench.sh suite --offcpu"), "{md}");
        assert!(md.contains("> shared"), "{md}");
        assert!(
            md.starts_with("## Where the time went: `bench/x.json`\n"),
            "{md}"
        );

        let mut plain = String::new();
        tables(
            &mut plain,
            &records(&serde_json::json!({"records": [
                {"engine": "tucana", "workload": "ycsb_a", "dataset": "x", "ops_per_sec": 1.0}
            ]})),
            "##",
        );
        assert_eq!(plain, "", "no figures, no section");
    }
}
