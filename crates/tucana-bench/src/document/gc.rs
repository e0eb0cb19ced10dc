//! The "Garbage collection" section of BENCHMARKS.md: what the GC runs did, the overwrite
//! table with a verdict per GC-on run on issue 5's targets (also for each `--also-gc-json`
//! run), and the delete-all-then-reclaim table.
//!
//! Owns this section's layout; reads only the JSON document. Single-threaded.

use std::fmt::Write as _;

use serde_json::Value;

use super::records::gc_records;
use crate::format::{debug_build_warning, fmt_bytes, fmt_mib, fmt_number, number};

/// The sentence that says what an overwrite run did, from its data set's plan.
fn overwrite_plan_text(plan: &Value) -> String {
    format!(
        "YCSB A (50% reads, 50% updates, scrambled zipfian) for {} operations on {} records \
         of {}, so the updates write the data set {} times over",
        plan["operations"],
        plan["records"],
        plan["value_layout"].as_str().unwrap_or("?"),
        plan["overwrites"],
    )
}

/// The "Garbage collection" section, when the run has GC records.
pub(super) fn render(md: &mut String, doc: &Value) {
    let records = gc_records(doc);
    if records.is_empty() {
        return;
    }
    *md += "## Garbage collection\n\n";
    separate_run(md, &doc["options"]["gc_run"]);
    what_and_how(md, &doc["options"]["datasets"][crate::gc::DATASET]);
    let overwrites: Vec<&Value> = records
        .iter()
        .filter(|r| r["workload"] == "gc_ycsb_a")
        .collect();
    overwrite_table(md, &overwrites);
    verdicts(md, &overwrites);
    other_runs(md, doc);
    let deletes: Vec<&Value> = records
        .iter()
        .filter(|r| r["workload"] == "delete_all")
        .collect();
    delete_all_table(md, &deletes);
}

/// Where the figures come from when a separate `gc` run (`merge::merge_gc`) supplied
/// them, with the GC settings of each engine of that run; nothing otherwise.
fn separate_run(md: &mut String, gc_run: &Value) {
    if gc_run.is_null() {
        return;
    }
    let _ = writeln!(
        md,
        "These figures come from a separate `tucana-bench gc` run (`{}`, the second \
         command under \"Reproduce\"), with {} threads, on {} ({} cores).\n",
        gc_run["json"].as_str().unwrap_or("?"),
        gc_run["threads"],
        gc_run["machine"]["cpu_model"].as_str().unwrap_or("?"),
        gc_run["machine"]["cores"],
    );
    if gc_run["debug_build"].as_bool() == Some(true) {
        *md += &debug_build_warning("the GC figures");
    }
    let Some(configurations) = gc_run["configurations"].as_object() else {
        return;
    };
    for (engine, configuration) in configurations {
        let Some(fields) = configuration.as_object() else {
            continue;
        };
        let gc_fields: Vec<String> = fields
            .iter()
            .filter(|(name, _)| name.starts_with("gc"))
            .map(|(name, value)| format!("`{name}` {value}"))
            .collect();
        if !gc_fields.is_empty() {
            let _ = writeln!(md, "{engine}'s GC settings: {}.\n", gc_fields.join(", "));
        }
    }
}

/// The paragraph on what the runs did, what each column means, and the targets.
fn what_and_how(md: &mut String, plan: &Value) {
    let _ = writeln!(
        md,
        "What giving back the space of overwritten and deleted data costs, and how much comes \
         back. **Overwrite:** {}; \
         engines that can switch their reclamation off (Tucana) run it with background GC on \
         (space-amplification target {}) and off. **Space amplification** here is the files' \
         allocated bytes (st_blocks × 512) ÷ the live keys and values: *max* is the largest of \
         the readings taken every 250 ms during the run, *final* right after its last \
         operation, *settled* after {} s more with the engine open and idle. *Log space amp* is \
         Tucana's own ratio (log segment bytes ÷ live record bytes, headers included), the one \
         its GC steers. *GC-off CPU ÷ this* is the CPU per operation with GC off over this \
         run's: the throughput ratio a machine with CPU to spare would see, steadier than \
         the clock on a shared one. Issue 5's targets: throughput with GC on at least {:.0}% \
         of GC off, and space amplification at most the target.\n",
        overwrite_plan_text(plan),
        plan["gc_space_amp_target"],
        plan["settle_secs"],
        crate::gc::THROUGHPUT_RATIO_TARGET * 100.0,
    );
}

/// The table of overwrite records: a row per engine and GC setting.
fn overwrite_table(md: &mut String, overwrites: &[&Value]) {
    let mib = |v: &Value| fmt_mib(number(v));
    *md += "| engine | GC | ops/s | ÷ GC off | CPU µs/op | GC-off CPU ÷ this | p50 µs | p99 µs | p99.9 µs | space amp max | final | settled | log space amp | settled | GC relocated MiB | GC reclaimed MiB |\n";
    *md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in overwrites {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r["engine"].as_str().unwrap_or("?"),
            r["gc"].as_str().unwrap_or("?"),
            fmt_number(number(&r["ops_per_sec"])),
            fmt_number(number(&r["throughput_vs_gc_off"])),
            fmt_number(number(&r["cpu_us_per_op"])),
            fmt_number(number(&r["cpu_per_op_vs_gc_off"])),
            fmt_number(number(&r["p50_us"])),
            fmt_number(number(&r["p99_us"])),
            fmt_number(number(&r["p999_us"])),
            fmt_number(number(&r["space_amp_max"])),
            fmt_number(number(&r["space_amp_final"])),
            fmt_number(number(&r["space_amp_settled"])),
            fmt_number(number(&r["log_space_amp"])),
            fmt_number(number(&r["log_space_amp_settled"])),
            mib(&r["gc_relocated_bytes"]),
            mib(&r["gc_reclaimed_bytes"]),
        );
    }
    *md += "\n";
}

/// A line per GC-on record (with a ratio to GC off) on issue 5's targets.
fn verdicts(md: &mut String, overwrites: &[&Value]) {
    for r in overwrites.iter().filter(|r| r["gc"] == "on") {
        let Some(ratio) = number(&r["throughput_vs_gc_off"]) else {
            continue;
        };
        let verdict = |met: bool| if met { "met" } else { "**missed**" };
        let target = number(&r["gc_space_amp_target"]);
        let space = number(&r["space_amp_max"]);
        let _ = writeln!(
            md,
            "- {}: with GC on, {:.0}% of the throughput with GC off (target ≥ {:.0}%: {}); space \
             amplification at most {} during the run (target ≤ {}: {}), {} after it settled.",
            r["engine"].as_str().unwrap_or("?"),
            ratio * 100.0,
            crate::gc::THROUGHPUT_RATIO_TARGET * 100.0,
            verdict(ratio >= crate::gc::THROUGHPUT_RATIO_TARGET),
            fmt_number(space),
            fmt_number(target),
            match (space, target) {
                (Some(s), Some(t)) => verdict(s <= t),
                _ => "–",
            },
            fmt_number(number(&r["space_amp_settled"])),
        );
        if let (Some(log), Some(user)) =
            (number(&r["live_log_bytes"]), number(&r["live_user_bytes"]))
        {
            if user > 0.0 {
                let _ = writeln!(
                    md,
                    "  Its live log records take {:.2}× the user bytes (record headers), and its \
                     files hold the index too, so its disk ÷ user bytes stays above the log \
                     space amplification its GC steers.",
                    log / user
                );
            }
        }
    }
    *md += "\n";
}

/// The overwrite tables of the runs `merge::add_also_gc` kept, each under its own heading.
fn other_runs(md: &mut String, doc: &Value) {
    let Some(runs) = doc["options"]["also_gc_runs"].as_array() else {
        return;
    };
    for run in runs {
        let plan = &run["plan"];
        let _ = writeln!(
            md,
            "### Overwrite of {} records\n\nFrom another `tucana-bench gc` run (`{}`, under \
             \"Reproduce\"), with {} threads, on {} ({} cores): {}, space-amplification target {}.\n",
            plan["records"],
            run["json"].as_str().unwrap_or("?"),
            run["threads"],
            run["machine"]["cpu_model"].as_str().unwrap_or("?"),
            run["machine"]["cores"],
            overwrite_plan_text(plan),
            plan["gc_space_amp_target"],
        );
        if run["debug_build"].as_bool() == Some(true) {
            *md += &debug_build_warning("these figures");
        }
        let records: Vec<&Value> = run["records"].as_array().into_iter().flatten().collect();
        overwrite_table(md, &records);
        verdicts(md, &records);
    }
}

/// "Delete all, then reclaim": the disk bytes after each step, when the run has any.
fn delete_all_table(md: &mut String, deletes: &[&Value]) {
    if deletes.is_empty() {
        return;
    }
    let bytes = |v: &Value| v.as_u64().map_or("–".to_string(), fmt_bytes);
    *md += "### Delete all, then reclaim\n\n";
    *md += "A fresh store (its disk bytes: *empty*), loaded, every key deleted, then what the \
            engine's documentation says gives the space back (*reclaim*); disk bytes (allocated, \
            st_blocks × 512) after each step and after closing. The store is checked to be empty \
            afterwards.\n\n";
    *md += "| engine | records | deletes/s | empty | loaded | after deleting all | after reclaim | above empty | after close | reclaim | reclaim s |\n";
    *md += "|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in deletes {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r["engine"].as_str().unwrap_or("?"),
            r["records"],
            fmt_number(number(&r["ops_per_sec"])),
            bytes(&r["empty_space_bytes"]),
            bytes(&r["loaded_space_bytes"]),
            bytes(&r["deleted_space_bytes"]),
            bytes(&r["reclaimed_space_bytes"]),
            bytes(&r["above_empty_bytes"]),
            bytes(&r["closed_space_bytes"]),
            r["reclaim"].as_str().unwrap_or("?"),
            fmt_number(number(&r["reclaim_seconds"])),
        );
    }
    *md += "\n";
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::merge::{add_also_gc, merge_gc};
    use super::super::suite::render;

    #[test]
    fn a_separate_gc_run_replaces_the_suites_gc_records() {
        let mut suite = serde_json::json!({
            "options": {"argv": ["/x/tucana-bench", "suite"], "datasets": {"in-memory": {"records": 10}}},
            "records": [
                {"engine": "tucana", "workload": "ycsb_a", "dataset": "in-memory", "ops_per_sec": 1.0},
                {"engine": "tucana", "workload": "gc_ycsb_a", "dataset": "gc", "gc": "on", "ops_per_sec": 2.0},
            ],
        });
        let gc = serde_json::json!({
            "debug_build": false,
            "machine": {"cores": 2, "cpu_model": "Test CPU"},
            "options": {
                "argv": ["/x/tucana-bench", "gc", "--gc-records", "5"], "threads": 2,
                "datasets": {"gc": {"records": 5, "operations": 40, "overwrites": 4}},
                "configurations": {"tucana": {"gc": "background GC on", "gc_space_amp": 1.5, "version": "x"}},
            },
            "records": [
                {"engine": "tucana", "workload": "gc_ycsb_a", "dataset": "gc", "gc": "on", "ops_per_sec": 3.0},
                {"engine": "tucana", "workload": "gc_ycsb_a", "dataset": "gc", "gc": "off", "ops_per_sec": 4.0},
            ],
        });
        merge_gc(&mut suite, &gc, Path::new("bench/gc.json"));
        let ops: Vec<f64> = suite["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["ops_per_sec"].as_f64().unwrap())
            .collect();
        assert_eq!(ops, [1.0, 3.0, 4.0]);
        assert_eq!(suite["options"]["datasets"]["gc"]["records"], 5);
        let md = render(&suite, Path::new("bench/results.json"), &[]);
        assert!(md.contains("scripts/bench.sh gc --gc-records 5\n"), "{md}");
        assert!(
            md.contains("scripts/bench.sh report bench/results.json --gc-json bench/gc.json\n"),
            "{md}"
        );
        assert!(
            md.contains("separate `tucana-bench gc` run (`bench/gc.json`"),
            "{md}"
        );
        assert!(
            md.contains("tucana's GC settings: `gc` \"background GC on\", `gc_space_amp` 1.5."),
            "{md}"
        );
        assert!(md.contains("| tucana | off | 4.00 |"), "{md}");
    }

    #[test]
    fn another_gc_run_gets_a_table_of_its_own() {
        let gc_run = |records: u64, on: f64, amp: f64| {
            serde_json::json!({
                "debug_build": false,
                "machine": {"cores": 2, "cpu_model": "Test CPU"},
                "options": {
                    "argv": ["/x/tucana-bench", "gc", "--gc-records", records.to_string()],
                    "threads": 2,
                    "datasets": {"gc": {"records": records, "operations": records * 16,
                        "overwrites": 8, "value_layout": "10 field(s) x 100 B",
                        "gc_space_amp_target": 1.5}},
                },
                "records": [
                    {"engine": "tucana", "workload": "gc_ycsb_a", "dataset": "gc", "gc": "on",
                     "ops_per_sec": on, "throughput_vs_gc_off": on / 10.0,
                     "space_amp_max": amp, "gc_space_amp_target": 1.5},
                    {"engine": "tucana", "workload": "gc_ycsb_a", "dataset": "gc", "gc": "off",
                     "ops_per_sec": 10.0},
                    {"engine": "tucana", "workload": "delete_all", "dataset": "gc",
                     "records": records, "ops_per_sec": 1.0},
                ],
            })
        };
        let mut suite = serde_json::json!({
            "options": {"argv": ["/x/tucana-bench", "suite"], "datasets": {}},
            "records": [],
        });
        merge_gc(
            &mut suite,
            &gc_run(1000, 7.0, 1.4),
            Path::new("bench/gc.json"),
        );
        add_also_gc(
            &mut suite,
            &gc_run(300, 5.0, 1.7),
            Path::new("bench/gc-small.json"),
        );
        let md = render(&suite, Path::new("bench/results.json"), &[]);
        // Both runs' commands, and the report command that merges them.
        assert!(
            md.contains("scripts/bench.sh gc --gc-records 1000\n"),
            "{md}"
        );
        assert!(
            md.contains("scripts/bench.sh gc --gc-records 300\n"),
            "{md}"
        );
        assert!(
            md.contains("--gc-json bench/gc.json --also-gc-json bench/gc-small.json"),
            "{md}"
        );
        // The other run's table comes after the main one's, with its own verdicts; its
        // delete-all record is not shown.
        let main = md
            .find("70% of the throughput with GC off")
            .expect("main verdict");
        let also = md
            .find("### Overwrite of 300 records")
            .expect("own heading");
        assert!(main < also, "{md}");
        let tail = &md[also..];
        assert!(
            tail.contains("on 300 records of 10 field(s) x 100 B"),
            "{md}"
        );
        assert!(tail.contains("| tucana | on | 5.00 | 0.50 |"), "{md}");
        assert!(
            tail.contains(
                "space amplification at most 1.70 during the run (target ≤ 1.50: **missed**)"
            ),
            "{md}"
        );
        assert_eq!(md.matches("| tucana | 300 |").count(), 0, "{md}");
        assert_eq!(md.matches("| tucana | 1000 |").count(), 1, "{md}");
    }
}
