//! Which records of a suite's JSON document go where: the measured ones (one row per
//! engine in the tables), the GC runs' (a section of their own) and the failed runs'
//! (named under the title); a record's data set and row name, and the lookup of one
//! figure. Also the figures the tables and plots show ([`Metric`]).
//!
//! Owns the selection only; the layout is the sections'. Pure functions; single-threaded.

use serde_json::Value;

/// The figure a table column or plot shows.
#[derive(Clone, Copy)]
pub(super) struct Metric {
    pub field: &'static str,
    pub title: &'static str,
    /// Higher is better (throughput) or lower is better (costs).
    pub higher_is_better: bool,
}

pub(super) const THROUGHPUT: Metric = Metric {
    field: "ops_per_sec",
    title: "throughput (ops/s)",
    higher_is_better: true,
};
pub(super) const CPU: Metric = Metric {
    field: "cpu_us_per_op",
    title: "CPU time per operation (µs, user + system, all threads)",
    higher_is_better: false,
};
#[cfg_attr(not(feature = "plots"), allow(dead_code))]
pub(super) const WRITE_AMP: Metric = Metric {
    field: "io_amp_write",
    title: "write amplification (process bytes written ÷ user bytes written)",
    higher_is_better: false,
};

/// The measured records (runs that failed are listed apart, see [`failures`]; the GC
/// runs too, see [`gc_records`]).
pub(super) fn records(doc: &Value) -> Vec<Value> {
    doc["records"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|r| r["failed"].is_null() && !is_gc(r))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `record` is one of the GC runs', which have a section of their own: Tucana runs
/// them twice (GC on and off), so they do not fit the one-row-per-engine tables.
pub(super) fn is_gc(record: &Value) -> bool {
    record["dataset"] == crate::gc::DATASET
}

pub(super) fn gc_records(doc: &Value) -> Vec<Value> {
    doc["records"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|r| r["failed"].is_null() && is_gc(r))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn failures(doc: &Value) -> Vec<Value> {
    doc["records"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|r| !r["failed"].is_null())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Distinct values of `f(record)` in first-seen order.
pub(super) fn distinct(records: &[Value], f: impl Fn(&Value) -> String) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for record in records {
        let value = f(record);
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen
}

pub(super) fn dataset(record: &Value) -> String {
    record["dataset"].as_str().unwrap_or("-").to_string()
}

/// "ycsb_a" for YCSB phases (their thread count is the data set's), "fillrandom t2" for
/// micro phases, which run at several thread counts.
pub(super) fn row_name(record: &Value) -> String {
    let workload = record["workload"].as_str().unwrap_or("?");
    if workload.starts_with("ycsb_") {
        workload.to_string()
    } else {
        format!("{workload} t{}", record["threads"].as_u64().unwrap_or(0))
    }
}

pub(super) fn find<'a>(
    records: &'a [Value],
    dataset_name: &str,
    row: &str,
    engine: &str,
) -> Option<&'a Value> {
    records
        .iter()
        .find(|r| dataset(r) == dataset_name && row_name(r) == row && r["engine"] == engine)
}
