//! The "Devices" section of BENCHMARKS.md: the `devices` command's records (one JSON object
//! per line, appended by each run of `scripts/bench-devices.sh`): issue 21's targets (3
//! equal members against 1, least weighted queue length against round-robin on unequal
//! members and with a hot read range on one member), every load run, and the hot-range
//! runs (records with `"case": "hot-range"`) and the YCSB A runs (`"case": "ycsb-a"`) in
//! tables of their own.
//!
//! Owns the section's layout only; the figures are the records'. Pure; single-threaded.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::format::{fmt_number, number, ratio_cell};

/// The section's heading (its first line starts so), for `report --devices-only`.
pub(super) const HEADING: &str = "## Devices: ";

/// The median `mib_per_s` of the records with this label, policy and writes in flight.
fn median_mib(records: &[Value], label: &str, policy: &str, in_flight: u64) -> Option<f64> {
    median_of(records, label, policy, in_flight, "mib_per_s")
}

/// The median `field` of the records with this label, policy and writes in flight.
fn median_of(
    records: &[Value],
    label: &str,
    policy: &str,
    in_flight: u64,
    field: &str,
) -> Option<f64> {
    let mut values: Vec<f64> = records
        .iter()
        .filter(|r| {
            r["label"] == label && r["policy"] == policy && r["writes_in_flight"] == in_flight
        })
        .filter_map(|r| number(&r[field]))
        .collect();
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

pub(super) fn render(text: &str, path: &Path) -> String {
    let all: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let (ycsb_a, all): (Vec<Value>, Vec<Value>) =
        all.into_iter().partition(|r| r["case"] == "ycsb-a");
    let (hot, records): (Vec<Value>, Vec<Value>) =
        all.into_iter().partition(|r| r["case"] == "hot-range");
    let mut md = String::new();
    md += HEADING;
    md += "one volume over several throttled members\n\n";
    let _ = writeln!(
        md,
        "From `{}` ({} runs of `tucana-bench devices`). `scripts/bench-devices.sh` (as root) makes three \
         loop devices (`losetup --direct-io=on`) over sparse files, an ext4 file system on each \
         with a member file on it (with `RAW_DEVICES=1`, the loop devices themselves are the \
         members, raw block devices written with `O_DIRECT`, and the runs' labels start with \
         `raw `, so the targets below are the member files' runs), throttles each loop device's reads \
         and writes with the cgroup v1 blkio controller (`blkio.throttle.write_bps_device` and \
         `read_bps_device`, its MAJ:MIN) in a cgroup the benchmark process joins, and runs each \
         load inside a memory cgroup (`--memory-limit-bytes`). A load: two threads put 16-byte \
         keys with 1000-byte values into one keyspace, then one sync; MiB/s is record bytes \
         (key + value) over the time until that sync returned. `wait=true` is \
         `Options::segment_writes_wait_for_device` (each background segment write lasts until \
         its writeback is done); `wait=false` is the default buffered path.\n",
        path.display(),
        records.len() + hot.len() + ycsb_a.len()
    );
    md += &targets_table(&records, &hot);
    md += &ycsb_a_targets(&ycsb_a);
    let with_load = records.iter().any(|r| r["loadavg"].is_string());
    md += "\n### Every run\n\n";
    md += "| case | members | policy | in flight | ops/s | MiB/s | MiB per member | idle while others busy (ms, per member) |";
    md += if with_load { " load average |\n" } else { "\n" };
    md += "|---|---|---|---|---|---|---|---|";
    md += if with_load { "---|\n" } else { "\n" };
    for r in &records {
        let per_member = r["per_member"].as_array().cloned().unwrap_or_default();
        let shares: Vec<String> = per_member
            .iter()
            .map(|m| {
                format!(
                    "{:.0}",
                    m["bytes_written"].as_f64().unwrap_or(0.0) / (1u64 << 20) as f64
                )
            })
            .collect();
        let idle: Vec<String> = per_member
            .iter()
            .map(|m| m["idle_while_others_busy_ms"].to_string())
            .collect();
        let _ = write!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r["label"].as_str().unwrap_or("?"),
            r["members"],
            r["policy"].as_str().unwrap_or("?"),
            r["writes_in_flight"],
            fmt_number(number(&r["ops_per_s"])),
            fmt_number(number(&r["mib_per_s"])),
            if shares.is_empty() {
                "–".to_string()
            } else {
                shares.join(" / ")
            },
            if idle.is_empty() {
                "–".to_string()
            } else {
                idle.join(" / ")
            },
        );
        if with_load {
            let _ = write!(md, " {} |", r["loadavg"].as_str().unwrap_or("?"));
        }
        md.push('\n');
    }
    if !hot.is_empty() {
        md += &hot_table(&hot);
    }
    if !ycsb_a.is_empty() {
        md += &ycsb_a_table(&ycsb_a);
    }
    let _ = writeln!(
        md,
        "\nReproduce (as root; `CASES`, `RECORDS`, `MEMORY_LIMIT_BYTES` and more in the \
         script's header):\n\n```sh\nROUNDS=2 JSON={} scripts/bench-devices.sh\nscripts/bench.sh report bench/results.json ...   # as under Reproduce at the top\n```",
        path.display()
    );
    md
}

/// Issue 21's targets: ratios of the medians of the rounds (wait=true), one row per
/// comparison, and one per label of the hot-range runs.
fn targets_table(records: &[Value], hot: &[Value]) -> String {
    let mut md = String::new();
    md += "### Issue 21's targets (medians of the rounds, wait=true)\n\n";
    md += "| comparison | ratio | target | devices' ceiling |\n|---|---|---|---|\n";
    let targets = [
        (
            "3 equal members at 20 MiB/s ÷ 1 member (round-robin)",
            median_mib(records, "equal-3x20 wait=true", "RoundRobin", 4),
            median_mib(records, "equal-1x20 wait=true", "RoundRobin", 4),
            "≥ 2.7",
            "3",
        ),
        (
            "3 equal members at 20 MiB/s ÷ 1 member (LWQL)",
            median_mib(records, "equal-3x20 wait=true", "Lwql", 4),
            median_mib(records, "equal-1x20 wait=true", "RoundRobin", 4),
            "≥ 2.7",
            "3",
        ),
        (
            "members at 10/20/40 MiB/s: LWQL ÷ round-robin",
            median_mib(records, "unequal-10/20/40 wait=true", "Lwql", 4),
            median_mib(records, "unequal-10/20/40 wait=true", "RoundRobin", 4),
            "≥ 1.5",
            "2.33 (70 ÷ 3 × 10)",
        ),
        (
            "members at 10/20/40 MiB/s, wait=false: LWQL ÷ round-robin",
            median_mib(records, "unequal-10/20/40 wait=false", "Lwql", 4),
            median_mib(records, "unequal-10/20/40 wait=false", "RoundRobin", 4),
            "(none)",
            "2.33",
        ),
    ];
    for (what, ours, theirs, target, ceiling) in targets {
        let _ = writeln!(
            md,
            "| {what} | {} | {target} | {ceiling} |",
            ratio_cell(ours, theirs, true)
        );
    }
    let mut hot_labels: Vec<&str> = hot.iter().filter_map(|r| r["label"].as_str()).collect();
    hot_labels.sort_unstable();
    hot_labels.dedup();
    for hot_label in hot_labels {
        let _ = writeln!(
            md,
            "| {hot_label}: hot read range on member 0, LWQL ÷ round-robin (writers' MiB/s) | {} | ≥ 1.15 | (see below) |",
            ratio_cell(
                median_mib(hot, hot_label, "Lwql", 4),
                median_mib(hot, hot_label, "RoundRobin", 4),
                true
            )
        );
    }
    md
}

/// The hot-range runs: writers load 3 members while readers get a key range placed on
/// member 0 (`devices/hot_range.rs`).
fn hot_table(hot: &[Value]) -> String {
    let mut md = String::new();
    md += "\n### A hot read range on member 0 (`CASES=hot-range`)\n\n";
    md += "Before each run, `hot_records` records are placed on member 0 and its cached pages \
           dropped; then two writers put `records` new records (and sync) while `readers` \
           threads get random hot records. Queue spread: the largest minus the smallest \
           member's weighted queue (what least-weighted dispatch compares) and write-queue \
           bytes, sampled every 20 ms and averaged.\n\n";
    md += "| case | policy | writers' MiB/s | hot reads/s | read p99 (µs) | weighted queue spread (ms) | write-queue spread (MiB) | MiB written per member | load average |\n";
    md += "|---|---|---|---|---|---|---|---|---|\n";
    for r in hot {
        let written: Vec<String> = r["written_mib_per_member"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|m| format!("{:.0}", m.as_f64().unwrap_or(0.0)))
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r["label"].as_str().unwrap_or("?"),
            r["policy"].as_str().unwrap_or("?"),
            fmt_number(number(&r["mib_per_s"])),
            fmt_number(number(&r["reads_per_s"])),
            r["read_p99_us"],
            fmt_number(number(&r["weighted_queue_spread_ms"])),
            fmt_number(number(&r["write_queue_spread_mib"])),
            written.join(" / "),
            r["loadavg"].as_str().unwrap_or("?"),
        );
    }
    md
}

/// The YCSB A runs' rows of the targets table (ratios of the medians of ops/s); nothing
/// without such runs. The issue's targets were written for the load; A is held to them too.
fn ycsb_a_targets(runs: &[Value]) -> String {
    if runs.is_empty() {
        return String::new();
    }
    let ops = |label: &str, policy: &str| median_of(runs, label, policy, 4, "ops_per_s");
    let rows = [
        (
            "YCSB A, 3 equal members at 20 MiB/s ÷ 1 member (round-robin, ops/s)",
            ops("ycsb-a equal-3x20", "RoundRobin"),
            ops("ycsb-a equal-1x20", "RoundRobin"),
            "≥ 2.7 (written for the load)",
            "3",
        ),
        (
            "YCSB A, 3 equal members at 20 MiB/s ÷ 1 member (LWQL, ops/s)",
            ops("ycsb-a equal-3x20", "Lwql"),
            ops("ycsb-a equal-1x20", "RoundRobin"),
            "≥ 2.7 (written for the load)",
            "3",
        ),
        (
            "YCSB A, members at 10/20/40 MiB/s: LWQL ÷ round-robin (ops/s)",
            ops("ycsb-a unequal-10/20/40", "Lwql"),
            ops("ycsb-a unequal-10/20/40", "RoundRobin"),
            "≥ 1.5 (written for the load)",
            "2.33",
        ),
    ];
    let mut md = String::new();
    for (what, ours, theirs, target, ceiling) in rows {
        let _ = writeln!(
            md,
            "| {what} | {} | {target} | {ceiling} |",
            ratio_cell(ours, theirs, true)
        );
    }
    md
}

/// The YCSB A runs: a larger-than-memory load, then workload A for a fixed time
/// (`devices/ycsb_a.rs`).
fn ycsb_a_table(runs: &[Value]) -> String {
    let mut md = String::new();
    md += "\n### YCSB A after a larger-than-memory load (`CASES=ycsb-a`)\n\n";
    md += "Inside the memory cgroup, `records` records are loaded and synced; then \
           `ycsb_threads` clients run YCSB A (scrambled zipfian keys, half reads, half \
           updates of whole records) for `seconds`, segment writes waiting for the device. \
           ops/s: the workload's operations over its time. Queue spread as in the hot-range \
           table; MiB written and read per member: during the workload only.\n\n";
    md += "| case | policy | ops/s | read p99 (µs) | update p99 (µs) | load MiB/s | weighted queue spread (ms) | MiB written per member | MiB read per member | load average |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|\n";
    let list = |v: &Value| -> String {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|m| format!("{:.0}", m.as_f64().unwrap_or(0.0)))
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
            .unwrap_or_default()
    };
    for r in runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r["label"].as_str().unwrap_or("?"),
            r["policy"].as_str().unwrap_or("?"),
            fmt_number(number(&r["ops_per_s"])),
            r["read_p99_us"],
            r["update_p99_us"],
            fmt_number(number(&r["load_mib_per_s"])),
            fmt_number(number(&r["weighted_queue_spread_ms"])),
            list(&r["written_mib_per_member"]),
            list(&r["read_mib_per_member"]),
            r["loadavg"].as_str().unwrap_or("?"),
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_medians_of_the_rounds_and_every_run_is_listed() {
        let line = |label: &str, policy: &str, mib: f64| {
            serde_json::json!({
                "label": label, "policy": policy, "writes_in_flight": 4, "members": 3,
                "mib_per_s": mib, "ops_per_s": mib * 1000.0, "loadavg": "1.00",
                "per_member": [{"bytes_written": 1u64 << 20, "idle_while_others_busy_ms": 5}],
            })
            .to_string()
        };
        let text = [
            line("unequal-10/20/40 wait=true", "Lwql", 60.0),
            line("unequal-10/20/40 wait=true", "Lwql", 66.0),
            line("unequal-10/20/40 wait=true", "Lwql", 70.0),
            line("unequal-10/20/40 wait=true", "RoundRobin", 30.0),
            "not json".to_string(),
        ]
        .join("\n");
        let md = render(&text, Path::new("bench/devices.jsonl"));
        assert!(md.contains("(4 runs of"), "{md}");
        // 66 ÷ 30.
        assert!(
            md.contains("| members at 10/20/40 MiB/s: LWQL ÷ round-robin | **2.20** |"),
            "{md}"
        );
        assert_eq!(md.matches("| unequal-10/20/40 wait=true |").count(), 4);
        assert!(md.contains("| 1 | 5 | 1.00 |"), "{md}");
        assert!(!md.contains("hot read range"), "{md}");
        assert!(!md.contains("hot-range"), "{md}");
    }

    #[test]
    fn hot_range_runs_get_their_own_table_and_target_row() {
        let hot = |policy: &str, mib: f64| {
            serde_json::json!({
                "case": "hot-range", "label": "hot-range 3x20 wait=true", "policy": policy,
                "writes_in_flight": 4, "mib_per_s": mib, "reads_per_s": 4000.0,
                "read_p99_us": 6000, "weighted_queue_spread_ms": 300.0,
                "write_queue_spread_mib": 1.5, "written_mib_per_member": [100.0, 101.0, 99.0],
                "loadavg": "2.00",
            })
            .to_string()
        };
        let text = [hot("RoundRobin", 50.0), hot("Lwql", 60.0)].join("\n");
        let md = render(&text, Path::new("bench/devices.jsonl"));
        assert!(md.contains("(2 runs of"), "{md}");
        assert!(
            md.contains(
                "| hot-range 3x20 wait=true: hot read range on member 0, LWQL ÷ round-robin (writers' MiB/s) | **1.20** | ≥ 1.15 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| hot-range 3x20 wait=true | Lwql | 60"),
            "{md}"
        );
        assert!(md.contains("| 100 / 101 / 99 | 2.00 |"), "{md}");
        // Not in the load runs' table.
        assert!(!md.contains("| hot-range 3x20 wait=true | 3 |"), "{md}");
    }

    #[test]
    fn ycsb_a_runs_get_their_own_table_and_ratios_of_their_ops() {
        let run = |label: &str, policy: &str, ops: f64| {
            serde_json::json!({
                "case": "ycsb-a", "label": label, "policy": policy, "writes_in_flight": 4,
                "ops_per_s": ops, "read_p99_us": 900, "update_p99_us": 40,
                "load_mib_per_s": 20.0, "weighted_queue_spread_ms": 12.0,
                "written_mib_per_member": [10.0, 20.0, 40.0],
                "read_mib_per_member": [1.0, 2.0, 3.0], "loadavg": "3.00",
            })
            .to_string()
        };
        let text = [
            run("ycsb-a equal-1x20", "RoundRobin", 1000.0),
            run("ycsb-a equal-3x20", "RoundRobin", 2500.0),
            run("ycsb-a unequal-10/20/40", "RoundRobin", 2000.0),
            run("ycsb-a unequal-10/20/40", "Lwql", 3000.0),
        ]
        .join("\n");
        let md = render(&text, Path::new("bench/devices.jsonl"));
        assert!(md.contains("(4 runs of"), "{md}");
        assert!(
            md.contains("| YCSB A, 3 equal members at 20 MiB/s ÷ 1 member (round-robin, ops/s) | **2.50** |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| YCSB A, members at 10/20/40 MiB/s: LWQL ÷ round-robin (ops/s) | **1.50** |"
            ),
            "{md}"
        );
        assert!(md.contains("| 10 / 20 / 40 | 1 / 2 / 3 | 3.00 |"), "{md}");
        // Not in the load runs' table.
        assert!(!md.contains("| ycsb-a equal-1x20 | 1 |"), "{md}");
    }
}
