//! The "Cold scans" section of BENCHMARKS.md, from the JSON file of a `tucana-bench
//! coldscan` run (module `coldscan`): what ran and how cold it was, Tucana ÷ peer and
//! prefetch on ÷ off, every absolute figure and the stores each engine scanned.
//!
//! Owns this section's layout; reads only the JSON document. Single-threaded.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::records::distinct;
use crate::format::{
    debug_build_warning, fmt_bytes, fmt_mib, fmt_number, number, quoted_notes, ratio_cell,
    shell_args, shell_quote,
};

/// The cold-scan section: what was run and how cold it was, Tucana ÷ peer, prefetch on ÷
/// off, every absolute figure and the stores each engine scanned.
pub(super) fn render(doc: &Value, json_path: &Path) -> String {
    let options = &doc["options"];
    let records: Vec<Value> = doc["records"].as_array().cloned().unwrap_or_default();
    let engines = distinct(&records, |r| {
        r["engine"].as_str().unwrap_or("?").to_string()
    });
    let mut md = String::new();
    md += "## Cold scans: a data set larger than the page cache\n\n";
    if doc["debug_build"].as_bool() == Some(true) {
        md += &debug_build_warning("these numbers");
    }
    // The run's own remarks first: they qualify everything after them.
    quoted_notes(&mut md, &options["notes"]);
    what_ran(&mut md, options, json_path);
    reproduce(&mut md, options, json_path);
    ratios(&mut md, &records, &engines);
    absolute_table(&mut md, &records);
    stores_table(&mut md, &records, &engines);
    md
}

/// A byte count from the run's options or records; "?" when absent.
fn bytes(value: &Value) -> String {
    value.as_u64().map_or("?".to_string(), fmt_bytes)
}

/// The paragraph on the data set, the load, how each measurement was made cold, and the
/// phases.
fn what_ran(md: &mut String, options: &Value, json_path: &Path) {
    let _ = writeln!(
        md,
        "From `{}`, written by one `tucana-bench coldscan` run. {} keys of {} B with values of \
         {} B ({} of keys and values), written once each in a random (hashed) order into a \
         fresh store per engine, so Tucana's log is not in key order and a scan of it reads a \
         random page per record. After the load each store was settled ({}) and closed. \
         Before every measurement the store was closed, every file of its directory synced \
         and dropped from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`) and the store \
         reopened, which also empties engine caches of their own (cache budget {}); the \
         measurements ran {}. One thread. A full scan reads every key and value (checksummed \
         against the load, and the count checked); *seek + next* seeks to a random key and \
         reads the next {} items, {} times (all engines must return the same pairs). Tucana \
         ran twice on the same store: scan prefetch off, and on with a window of {} entries. \
         Load average when the run started: {}.\n",
        json_path.display(),
        options["keys"],
        options["key_bytes"],
        options["value_bytes"],
        bytes(&options["user_bytes"]),
        if options["settle"].as_bool() == Some(false) {
            "not asked to"
        } else {
            "each engine's own compaction or GC call, so nothing left over from the load runs \
             during a measurement"
        },
        bytes(&options["cache_bytes"]),
        memory_limit(options),
        options["short_scan_len"],
        options["short_scans"],
        options["prefetch_entries"],
        options["loadavg_at_start"].as_str().unwrap_or("?"),
    );
}

/// Where the measurements ran: inside a memory cgroup (and whether its limit was below the
/// data set), or without a limit and why.
fn memory_limit(options: &Value) -> String {
    let cgroups = options["cgroups"].as_object();
    let limited = cgroups.is_some_and(|all| {
        !all.is_empty() && all.values().all(|c| c["limited"].as_bool() == Some(true))
    });
    if !limited {
        let reasons: Vec<String> = cgroups
            .into_iter()
            .flatten()
            .filter(|(_, c)| c["limited"].as_bool() != Some(true))
            .map(|(engine, c)| format!("{engine}: {}", c["error"].as_str().unwrap_or("?")))
            .collect();
        return format!(
            "**without a memory limit** ({}): only the drop from the page cache before each \
             measurement makes it cold",
            reasons.join("; ")
        );
    }
    let any = cgroups
        .and_then(|all| all.values().next())
        .cloned()
        .unwrap_or_default();
    let smaller = match (
        options["memory_limit_bytes"].as_u64(),
        options["user_bytes"].as_u64(),
    ) {
        (Some(limit), Some(data)) if limit < data => {
            "smaller than the data set, so the scans read the device"
        }
        _ => {
            "**not smaller than the data set**: only the drop from the page cache before \
              each measurement makes it cold"
        }
    };
    format!(
        "inside a memory cgroup limited to {} (cgroup {} `{}`; page cache, engine caches \
         and the harness share it), {smaller}",
        bytes(&options["memory_limit_bytes"]),
        any["version"].as_str().unwrap_or("?"),
        any["limit_file"].as_str().unwrap_or("?"),
    )
}

/// The run's command and the report command that adds this section.
fn reproduce(md: &mut String, options: &Value, json_path: &Path) {
    *md += "```sh\n";
    if let Some(args) = shell_args(&options["argv"], 1) {
        let _ = writeln!(md, "scripts/bench.sh {args}");
    }
    let _ = writeln!(
        md,
        "scripts/bench.sh report bench/results.json --coldscan-json {}\n```\n",
        shell_quote(&json_path.display().to_string())
    );
}

/// "Tucana ÷ peer, and prefetch on ÷ off": a throughput table and a CPU table.
fn ratios(md: &mut String, records: &[Value], engines: &[String]) {
    let peers: Vec<&String> = engines.iter().filter(|e| *e != "tucana").collect();
    *md += "### Tucana ÷ peer, and prefetch on ÷ off\n\n";
    *md += "Throughput ratios (items/s for the full scans, scans/s for seek + next); above 1 \
            means Tucana (with prefetch on) is faster, or prefetch helps. CPU ratios (CPU time \
            per operation): below 1 means Tucana spends less.\n\n";
    for (metric, higher_is_better) in [("ops_per_sec", true), ("cpu_us_per_op", false)] {
        ratio_table(md, records, &peers, metric, higher_is_better);
    }
}

/// The `prefetch` field of the records of a store reorganised after its load
/// (`coldscan --reorganise`).
const REORGANISED: &str = "on, reorganised";

/// One metric's ratios: prefetch on ÷ off, then Tucana (prefetch on) ÷ each peer, a row per
/// phase every engine ran; with a reorganised store, its ratios to the store as loaded and
/// to each peer.
fn ratio_table(
    md: &mut String,
    records: &[Value],
    peers: &[&String],
    metric: &str,
    higher_is_better: bool,
) {
    use crate::coldscan::{FORWARD, REVERSE, SEEK_NEXT};
    let workloads = [
        (FORWARD, "full forward scan"),
        (REVERSE, "full reverse scan"),
        (SEEK_NEXT, "seek + next"),
    ];
    let find = |workload: &str, engine: &str, prefetch: Option<&str>| -> Option<&Value> {
        records.iter().find(|r| {
            r["workload"] == workload && r["engine"] == engine && r["prefetch"].as_str() == prefetch
        })
    };
    *md += "| workload | ";
    *md += if higher_is_better {
        "throughput: prefetch on ÷ off |"
    } else {
        "CPU/op: prefetch on ÷ off |"
    };
    for peer in peers {
        let _ = write!(md, " vs {peer} |");
    }
    // A run with `--reorganise`: its store's figures against the store as loaded, and
    // against each peer.
    let reorganised = records.iter().any(|r| r["prefetch"] == REORGANISED);
    if reorganised {
        *md += " reorganised ÷ as loaded |";
        for peer in peers {
            let _ = write!(md, " reorganised vs {peer} |");
        }
    }
    let columns = if reorganised {
        2 * peers.len() + 1
    } else {
        peers.len()
    };
    *md += "\n|---|---|";
    *md += &"---|".repeat(columns);
    *md += "\n";
    for (workload, title) in workloads {
        let ours = find(workload, "tucana", Some("on")).and_then(|r| number(&r[metric]));
        let off = find(workload, "tucana", Some("off")).and_then(|r| number(&r[metric]));
        let _ = write!(
            md,
            "| {title} | {} |",
            ratio_cell(ours, off, higher_is_better)
        );
        let theirs: Vec<Option<f64>> = peers
            .iter()
            .map(|peer| find(workload, peer, None).and_then(|r| number(&r[metric])))
            .collect();
        for &their in &theirs {
            let _ = write!(md, " {} |", ratio_cell(ours, their, higher_is_better));
        }
        if reorganised {
            let sorted =
                find(workload, "tucana", Some(REORGANISED)).and_then(|r| number(&r[metric]));
            let _ = write!(md, " {} |", ratio_cell(sorted, ours, higher_is_better));
            for &their in &theirs {
                let _ = write!(md, " {} |", ratio_cell(sorted, their, higher_is_better));
            }
        }
        *md += "\n";
    }
    *md += "\n";
}

/// "Absolute figures": a row per phase and engine (Tucana once per prefetch setting).
fn absolute_table(md: &mut String, records: &[Value]) {
    *md += "### Absolute figures\n\n";
    *md += "Operations are items for the full scans, scans for seek + next, batches for the \
            Tucana-only batch phases. Read amplification: bytes this process read from the \
            storage layer (/proc/self/io) ÷ bytes of keys and values returned; device: the data \
            directory's block device (every process on it). *hot-scan-forward* is Tucana's \
            forward scan with its volume already in the page cache and no memory limit: what \
            the scan costs when nothing has to come from the device.\n\n";
    *md += "| workload | engine | ops/s | items/s | MB/s | CPU µs/op | r-amp | device r-amp | p50 µs | p99 µs | read MiB | peak RSS MiB |\n";
    *md += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for workload in distinct(records, |r| {
        r["workload"].as_str().unwrap_or("?").to_string()
    }) {
        for r in records
            .iter()
            .filter(|r| r["workload"] == workload.as_str())
        {
            let _ = writeln!(
                md,
                "| {workload} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                engine_column(r),
                fmt_number(number(&r["ops_per_sec"])),
                fmt_number(number(&r["items_per_sec"])),
                fmt_number(number(&r["mb_per_sec"])),
                fmt_number(number(&r["cpu_us_per_op"])),
                fmt_number(number(&r["io_amp_read"])),
                fmt_number(number(&r["device_io_amp_read"])),
                fmt_number(number(&r["p50_us"])),
                fmt_number(number(&r["p99_us"])),
                fmt_mib(number(&r["process_read_bytes"])),
                fmt_mib(number(&r["peak_rss_bytes"])),
            );
        }
    }
    *md += "\n";
}

/// "tucana, prefetch on" / "tucana, prefetch off" / "rocksdb": the column a cold-scan
/// record belongs to.
fn engine_column(record: &Value) -> String {
    let engine = record["engine"].as_str().unwrap_or("?");
    match record["prefetch"].as_str() {
        Some(setting) => format!("{engine}, prefetch {setting}"),
        None => engine.to_string(),
    }
}

/// "The stores": each engine's files after the load, the load's time and how it settled.
fn stores_table(md: &mut String, records: &[Value], engines: &[String]) {
    *md += "### The stores\n\n| engine | files after load | load s | settled by |\n|---|---|---|---|\n";
    for engine in engines {
        let Some(r) = records.iter().find(|r| r["engine"] == engine.as_str()) else {
            continue;
        };
        let _ = writeln!(
            md,
            "| {engine} | {} | {} | {} |",
            bytes(&r["space_used_bytes"]),
            fmt_number(number(&r["load_s"])),
            r["settle"].as_str().unwrap_or("?"),
        );
    }
    *md += "\n";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coldscan_section_has_ratios_and_figures() {
        let doc = serde_json::json!({
            "command": "coldscan",
            "debug_build": false,
            "options": {
                "argv": ["/x/tucana-bench", "coldscan", "--keys", "100"],
                "keys": 100, "key_bytes": 16, "value_bytes": 1000, "user_bytes": 1u64 << 30,
                "short_scans": 5, "short_scan_len": 100, "prefetch_entries": 64,
                "cache_bytes": 1u64 << 20, "memory_limit_bytes": 512u64 << 20, "settle": true,
                "loadavg_at_start": "1.00 0.50 0.25 1/100 5",
                "cgroups": {
                    "tucana": {"limited": true, "version": "v1", "limit_file": "memory.limit_in_bytes"},
                    "rocksdb": {"limited": true, "version": "v1", "limit_file": "memory.limit_in_bytes"},
                },
            },
            "records": [
                {"engine": "tucana", "workload": "cold-scan-forward", "prefetch": "off",
                 "ops_per_sec": 100.0, "items_per_sec": 100.0, "cpu_us_per_op": 4.0,
                 "space_used_bytes": 2u64 << 20, "load_s": 1.5, "settle": "nothing to do"},
                {"engine": "tucana", "workload": "cold-scan-forward", "prefetch": "on",
                 "ops_per_sec": 300.0, "items_per_sec": 300.0, "cpu_us_per_op": 2.0},
                {"engine": "rocksdb", "workload": "cold-scan-forward",
                 "ops_per_sec": 600.0, "items_per_sec": 600.0, "cpu_us_per_op": 1.0,
                 "space_used_bytes": 3u64 << 20, "load_s": 2.0, "settle": "compact_range"},
            ],
        });
        let md = render(&doc, Path::new("bench/coldscan.json"));
        assert!(md.contains("## Cold scans"), "{md}");
        assert!(
            md.contains("smaller than the data set, so the scans read"),
            "{md}"
        );
        assert!(
            md.contains("limited to 512.0 MiB (cgroup v1 `memory.limit_in_bytes`"),
            "{md}"
        );
        assert!(
            md.contains("| full forward scan | **3.00** | 0.50 |"),
            "{md}"
        );
        assert!(
            md.contains("| full forward scan | **0.50** | 2.00 |"),
            "{md}"
        );
        assert!(md.contains("| full reverse scan | – | – |"), "{md}");
        assert!(
            md.contains("| cold-scan-forward | tucana, prefetch on | 300.0 |"),
            "{md}"
        );
        assert!(
            md.contains("scripts/bench.sh coldscan --keys 100\n"),
            "{md}"
        );
        assert!(
            md.contains("| rocksdb | 3.0 MiB | 2.00 | compact_range |"),
            "{md}"
        );
    }
}
