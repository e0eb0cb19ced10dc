//! The results of a run: the machine description, the run's options, the result
//! records; the human table on stdout and the JSON results file that the `report` command
//! (module `document`) turns into BENCHMARKS.md.
//!
//! Owns the record format and the results file; measures and runs nothing (figures are
//! written by `format`). A [`Record`] is one row: the fields every
//! record has (`engine`, `workload`, `ops_per_sec`, `cpu_us_per_op`, `io_amp_write`,
//! `io_amp_read`, `space_amp`, `p50_us`, `p99_us`, `p999_us`, `peak_rss_bytes`; `null`
//! where a workload has no such number) plus workload-specific extras.
//! Single-threaded use only (the main thread prints).

use std::io::Write;
use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Map, Value};

use crate::format::fmt_bytes;
use crate::measure::Measurement;
use crate::sys;
use crate::Result;

/// The machine a run happened on, printed in every header and saved with the records.
pub struct Machine {
    pub cpu_model: Option<String>,
    pub cores: usize,
    pub mem_total_bytes: Option<u64>,
    pub kernel: Option<String>,
    /// The block device under the data directory, set once the directory is known.
    pub disk: Option<String>,
    /// fio's figures for that device (`scripts/device-ceiling.sh --json`), when given.
    pub device_ceiling: Option<Value>,
}

impl Machine {
    pub fn detect() -> Machine {
        Machine {
            cpu_model: sys::cpu_model(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_total_bytes: sys::mem_total_bytes(),
            kernel: sys::kernel(),
            disk: None,
            device_ceiling: None,
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "cpu_model": self.cpu_model,
            "cores": self.cores,
            "mem_total_bytes": self.mem_total_bytes,
            "kernel": self.kernel,
            "disk": self.disk,
            "device_ceiling": self.device_ceiling,
        })
    }
}

/// Options of a run, in the order given: printed in the header and saved as an object.
#[derive(Default)]
pub struct RunOptions {
    entries: Vec<(&'static str, Value)>,
}

impl RunOptions {
    /// The options every run records first: its command line (a list, so that arguments
    /// with spaces survive into the reproduce command) and the engines it ran.
    pub fn with_argv_and_engines<'a>(engines: impl IntoIterator<Item = &'a str>) -> RunOptions {
        let mut options = RunOptions::default();
        options.set("argv", std::env::args().collect::<Vec<_>>());
        options.set("engines", engines.into_iter().collect::<Vec<_>>());
        options
    }

    /// Sets `name` (replacing an earlier value in place).
    pub fn set(&mut self, name: &'static str, value: impl Into<Value>) {
        let value = value.into();
        match self.entries.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((name, value)),
        }
    }

    fn to_json(&self) -> Value {
        Value::Object(
            self.entries
                .iter()
                .map(|(name, value)| (name.to_string(), value.clone()))
                .collect(),
        )
    }
}

/// Prints what was run where: the first lines of every report.
pub fn print_header(command: &str, machine: &Machine, options: &RunOptions) {
    println!("tucana-bench {} {command}", env!("CARGO_PKG_VERSION"));
    println!(
        "machine: {} cores ({}), {} memory, {}",
        machine.cores,
        machine.cpu_model.as_deref().unwrap_or("unknown CPU"),
        machine
            .mem_total_bytes
            .map_or_else(|| "unknown".to_string(), fmt_bytes),
        machine.kernel.as_deref().unwrap_or("unknown kernel"),
    );
    let options_text: Vec<String> = options
        .entries
        .iter()
        .map(|(name, value)| match value {
            Value::String(s) => format!("{name}={s}"),
            other => format!("{name}={other}"),
        })
        .collect();
    println!("options: {}", options_text.join(" "));
    if cfg!(debug_assertions) {
        println!("WARNING: debug build; numbers are meaningless (use --release)");
    }
}

/// One result row.
pub struct Record {
    pub engine: &'static str,
    pub workload: String,
    pub ops_per_sec: Option<f64>,
    pub cpu_us_per_op: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    /// Bytes written by the process to storage ÷ bytes of keys and values written.
    pub io_amp_write: Option<f64>,
    /// Bytes read by the process from storage ÷ bytes of keys and values read.
    pub io_amp_read: Option<f64>,
    /// Space the engine's files take after the phase ÷ bytes of live keys and values.
    pub space_amp: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    extras: Map<String, Value>,
}

impl Record {
    /// A record of a timed phase; `ops` and `elapsed_s` become extras.
    pub fn measured(engine: &'static str, workload: &str, m: &Measurement) -> Record {
        let mut record = Record::unmeasured(engine, workload);
        record.ops_per_sec = Some(m.ops_per_sec());
        record.cpu_us_per_op = Some(m.cpu_us_per_op());
        record.p50_us = Some(m.p50_us());
        record.p99_us = Some(m.p99_us());
        record.p999_us = Some(m.p999_us());
        record.peak_rss_bytes = m.peak_rss_bytes;
        record.set("ops", m.ops);
        record.set("elapsed_s", m.elapsed.as_secs_f64());
        if let Some(io) = m.io.process {
            record.set("process_read_bytes", io.read_bytes);
            record.set("process_write_bytes", io.write_bytes);
        }
        if let Some(io) = m.io.device {
            record.set("device_read_bytes", io.read_bytes);
            record.set("device_write_bytes", io.write_bytes);
        }
        if let Some(figures) = &m.offcpu {
            record.set("offcpu", figures.clone());
        }
        record
    }

    /// Sets the I/O amplifications from the phase's process I/O and the user bytes it moved
    /// (keys and values, as the application sees them); `None` where nothing was moved.
    pub fn set_io_amp(&mut self, m: &Measurement, user_read_bytes: u64, user_write_bytes: u64) {
        self.set("user_read_bytes", user_read_bytes);
        self.set("user_write_bytes", user_write_bytes);
        let ratio = |io: u64, user: u64| (user > 0).then(|| io as f64 / user as f64);
        if let Some(io) = m.io.process {
            self.io_amp_read = ratio(io.read_bytes, user_read_bytes);
            self.io_amp_write = ratio(io.write_bytes, user_write_bytes);
        }
        if let Some(io) = m.io.device {
            if let Some(amp) = ratio(io.read_bytes, user_read_bytes) {
                self.set("device_io_amp_read", amp);
            }
            if let Some(amp) = ratio(io.write_bytes, user_write_bytes) {
                self.set("device_io_amp_write", amp);
            }
        }
    }

    /// Sets the space amplification: `space_used_bytes` on disk for `live_user_bytes`.
    pub fn set_space_amp(&mut self, space_used_bytes: u64, live_user_bytes: u64) {
        self.set("space_used_bytes", space_used_bytes);
        self.set("live_user_bytes", live_user_bytes);
        self.space_amp =
            (live_user_bytes > 0).then(|| space_used_bytes as f64 / live_user_bytes as f64);
    }

    /// A record without throughput or latency (e.g. one reopen of the recovery run).
    pub fn unmeasured(engine: &'static str, workload: &str) -> Record {
        Record {
            engine,
            workload: workload.to_string(),
            ops_per_sec: None,
            cpu_us_per_op: None,
            p50_us: None,
            p99_us: None,
            p999_us: None,
            io_amp_write: None,
            io_amp_read: None,
            space_amp: None,
            peak_rss_bytes: None,
            extras: Map::new(),
        }
    }

    /// Adds (or replaces) a workload-specific field.
    pub fn set(&mut self, name: &str, value: impl Into<Value>) {
        assert!(
            !matches!(
                name,
                "engine"
                    | "workload"
                    | "ops_per_sec"
                    | "cpu_us_per_op"
                    | "p50_us"
                    | "p99_us"
                    | "p999_us"
                    | "io_amp_write"
                    | "io_amp_read"
                    | "space_amp"
                    | "peak_rss_bytes"
            ),
            "extra {name:?} would shadow a common field"
        );
        self.extras.insert(name.to_string(), value.into());
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.extras.get(name)
    }

    /// Takes a workload-specific field out (one that does not describe what the caller
    /// measured, e.g. the harness's own I/O when a server did the work).
    pub fn remove(&mut self, name: &str) -> Option<Value> {
        self.extras.remove(name)
    }

    fn to_json(&self) -> Value {
        let mut object = Map::new();
        object.insert("engine".into(), self.engine.into());
        object.insert("workload".into(), self.workload.clone().into());
        object.insert("ops_per_sec".into(), json!(self.ops_per_sec));
        object.insert("cpu_us_per_op".into(), json!(self.cpu_us_per_op));
        object.insert("p50_us".into(), json!(self.p50_us));
        object.insert("p99_us".into(), json!(self.p99_us));
        object.insert("p999_us".into(), json!(self.p999_us));
        object.insert("io_amp_write".into(), json!(self.io_amp_write));
        object.insert("io_amp_read".into(), json!(self.io_amp_read));
        object.insert("space_amp".into(), json!(self.space_amp));
        object.insert("peak_rss_bytes".into(), json!(self.peak_rss_bytes));
        for (name, value) in &self.extras {
            object.insert(name.clone(), value.clone());
        }
        Value::Object(object)
    }
}

/// Column headings of the phase table.
pub fn print_phase_table_header() {
    println!();
    println!(
        "{:<8} {:<13} {:>10} {:>12} {:>10} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9}",
        "engine",
        "phase",
        "ops",
        "ops/s",
        "cpu us/op",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "w-amp",
        "r-amp",
        "peak RSS"
    );
}

/// One row of the phase table.
pub fn print_phase_row(record: &Record) {
    let ops = record.get("ops").and_then(Value::as_u64).unwrap_or(0);
    println!(
        "{:<8} {:<13} {:>10} {:>12.0} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>7} {:>7} {:>9}",
        record.engine,
        record.workload,
        ops,
        record.ops_per_sec.unwrap_or(f64::NAN),
        record.cpu_us_per_op.unwrap_or(f64::NAN),
        record.p50_us.unwrap_or(f64::NAN),
        record.p99_us.unwrap_or(f64::NAN),
        record.p999_us.unwrap_or(f64::NAN),
        record
            .io_amp_write
            .map_or_else(|| "-".to_string(), |a| format!("{a:.2}")),
        record
            .io_amp_read
            .map_or_else(|| "-".to_string(), |a| format!("{a:.2}")),
        record
            .peak_rss_bytes
            .map_or_else(|| "-".to_string(), |b| format!("{}M", b >> 20)),
    );
    if let Some(figures) = record.get("offcpu") {
        print_note(&crate::offcpu::describe(figures));
    }
}

/// A line under a row, for what does not fit the columns.
pub fn print_note(text: &str) {
    println!("{:<8} {:<13} {text}", "", "");
}

/// Writes the run as one JSON object: tool, command, machine, options and records.
pub fn write_json(
    path: &Path,
    command: &str,
    machine: &Machine,
    options: &RunOptions,
    records: &[Record],
) -> Result<()> {
    write_json_with(path, command, machine, options, records, &[])
}

/// As [`write_json`], with `imported` records (already JSON, e.g. from a child process)
/// after `records`.
pub fn write_json_with(
    path: &Path,
    command: &str,
    machine: &Machine,
    options: &RunOptions,
    records: &[Record],
    imported: &[Value],
) -> Result<()> {
    let mut all: Vec<Value> = records.iter().map(Record::to_json).collect();
    all.extend(imported.iter().cloned());
    let document = json!({
        "tool": "tucana-bench",
        "version": env!("CARGO_PKG_VERSION"),
        "command": command,
        "debug_build": cfg!(debug_assertions),
        "machine": machine.to_json(),
        "options": options.to_json(),
        "records": all,
    });
    let mut file = std::fs::File::create(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    serde_json::to_writer_pretty(&mut file, &document)?;
    file.write_all(b"\n")?;
    Ok(())
}

/// A progress bar on stderr; hidden when stderr is not a terminal (CI, redirected runs).
pub fn progress_bar(engine: &str, dataset: &str, phase: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let style =
        ProgressStyle::with_template("{prefix:>40} [{bar:30}] {pos}/{len} ({per_sec}, {eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{engine} {dataset} {phase}"));
    bar
}

/// Records the engine's syncs during a phase (`(before, after)` of its counter, `None` for
/// engines that do not count them) beside the phase's `writes`, and with sync writes
/// (`sync_writes`) prints how many writes each sync served (group commit).
pub fn set_syncs(record: &mut Record, syncs: Option<(u64, u64)>, writes: u64, sync_writes: bool) {
    let Some((before, after)) = syncs else {
        return;
    };
    let syncs = after - before;
    record.set("syncs", syncs);
    record.set("writes", writes);
    if sync_writes && writes > 0 {
        println!(
            "  {} fsyncs for {writes} writes ({:.3} fsyncs per write)",
            syncs,
            syncs as f64 / writes as f64
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::{Latencies, PhaseTimer};
    use std::time::Duration;

    #[test]
    fn json_has_common_fields_and_extras() {
        let mut lat = Latencies::new();
        lat.record(Duration::from_micros(3));
        let m = PhaseTimer::start().finish(1, &[lat]);
        let mut measured = Record::measured("tucana", "fillrandom", &m);
        measured.set("index_bytes_per_key", 12.5);
        let mut recovery = Record::unmeasured("tucana", "recovery");
        recovery.set("open_ms", 4.0);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        let mut options = RunOptions::default();
        options.set("keys", 1u64);
        write_json(
            &path,
            "micro",
            &Machine::detect(),
            &options,
            &[measured, recovery],
        )
        .unwrap();
        let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let records = doc["records"].as_array().unwrap();
        assert_eq!(records[0]["engine"], "tucana");
        assert_eq!(records[0]["workload"], "fillrandom");
        assert_eq!(records[0]["ops"], 1);
        assert_eq!(records[0]["index_bytes_per_key"], 12.5);
        assert!(records[0]["p50_us"].as_f64().unwrap() > 2.9);
        assert!(records[1]["ops_per_sec"].is_null());
        assert_eq!(records[1]["open_ms"], 4.0);
        assert_eq!(doc["options"]["keys"], 1);
    }

    #[test]
    #[should_panic(expected = "shadow")]
    fn extras_cannot_shadow_common_fields() {
        Record::unmeasured("tucana", "x").set("p99_us", 1.0);
    }
}
