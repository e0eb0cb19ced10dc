//! The runs that join the suite's JSON document before it is rendered: a separate `gc`
//! run in place of the suite's GC records (`--gc-json`), other `gc` runs whose overwrite
//! tables follow (`--also-gc-json`), and a second suite run with a sync per write
//! (`--sync-json`), whose data sets get [`SYNC_SUFFIX`].
//!
//! Owns how the runs are joined, and what each leaves in `options` for the sections to
//! describe it (`gc_run`, `also_gc_runs`, `sync_run`). Single-threaded.

use std::path::Path;

use serde_json::Value;

use super::records::{dataset, is_gc};
use crate::Result;

/// What a data set of a `--sync-json` run is called in the document.
pub(super) const SYNC_SUFFIX: &str = ", sync per write";

/// Adds the records of `sync` (a suite run with `--sync`, read from `path`) to `doc`,
/// each data set renamed with [`SYNC_SUFFIX`], its GC runs left out (the GC section is
/// the buffered run's).
pub(super) fn merge_sync(doc: &mut Value, sync: &Value, path: &Path) -> Result<()> {
    if sync["options"]["sync"].as_bool() != Some(true) {
        return Err(format!("{} is not a suite run made with --sync", path.display()).into());
    }
    let renamed = |name: &str| format!("{name}{SYNC_SUFFIX}");
    let mut records = doc["records"].as_array().cloned().unwrap_or_default();
    for record in sync["records"].as_array().into_iter().flatten() {
        if is_gc(record) {
            continue;
        }
        let mut record = record.clone();
        let name = dataset(&record);
        record["dataset"] = Value::String(renamed(&name));
        records.push(record);
    }
    doc["records"] = Value::Array(records);
    if let Some(sets) = sync["options"]["datasets"].as_object() {
        for (name, info) in sets {
            if name != crate::gc::DATASET {
                doc["options"]["datasets"][renamed(name)] = info.clone();
            }
        }
    }
    doc["options"]["sync_run"] = serde_json::json!({
        "json": path.display().to_string(),
        "argv": sync["options"]["argv"],
        "threads": sync["options"]["threads"],
    });
    Ok(())
}

/// Puts the GC records of `gc` (a `tucana-bench gc` run's JSON, read from `path`) in
/// `doc` in place of its own, with what the section must say about that run.
pub(super) fn merge_gc(doc: &mut Value, gc: &Value, path: &Path) {
    let mut records: Vec<Value> = doc["records"]
        .as_array()
        .map(|all| all.iter().filter(|r| !is_gc(r)).cloned().collect())
        .unwrap_or_default();
    records.extend(
        gc["records"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| is_gc(r))
            .cloned(),
    );
    doc["records"] = Value::Array(records);
    let dataset = gc["options"]["datasets"][crate::gc::DATASET].clone();
    if let Some(datasets) = doc["options"]["datasets"].as_object_mut() {
        datasets.insert(crate::gc::DATASET.to_string(), dataset);
    } else {
        doc["options"]["datasets"] = serde_json::json!({ crate::gc::DATASET: dataset });
    }
    doc["options"]["gc_run"] = serde_json::json!({
        "json": path.display().to_string(),
        "argv": gc["options"]["argv"],
        "debug_build": gc["debug_build"],
        "machine": gc["machine"],
        "threads": gc["options"]["threads"],
        "configurations": gc["options"]["configurations"],
    });
}

/// Keeps the overwrite records of another `gc` run, with what describes it, in
/// `options.also_gc_runs` (rendered after the main GC run's figures).
pub(super) fn add_also_gc(doc: &mut Value, gc: &Value, path: &Path) {
    let records: Vec<Value> = gc["records"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| is_gc(r) && r["failed"].is_null() && r["workload"] == "gc_ycsb_a")
        .cloned()
        .collect();
    let run = serde_json::json!({
        "json": path.display().to_string(),
        "argv": gc["options"]["argv"],
        "debug_build": gc["debug_build"],
        "machine": gc["machine"],
        "threads": gc["options"]["threads"],
        "plan": gc["options"]["datasets"][crate::gc::DATASET],
        "records": records,
    });
    match doc["options"]["also_gc_runs"].as_array_mut() {
        Some(runs) => runs.push(run),
        None => doc["options"]["also_gc_runs"] = Value::Array(vec![run]),
    }
}
