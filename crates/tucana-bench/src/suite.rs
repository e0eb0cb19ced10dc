//! The `suite` command: every workload on every engine, in one run, into one JSON file.
//!
//! Order: for each data set (in memory, then larger than memory inside a memory cgroup),
//! for each engine, the YCSB sequence; then, on the in-memory set only, the micro phases
//! at each thread count and the garbage-collection runs (`gc`, data set "gc"). The JSON
//! file is rewritten after every engine, so a run that dies keeps what it measured.
//! `--quick` shrinks everything to seconds for CI's smoke test.
//!
//! Owns the run plan and the run-level options saved in the JSON (engine configurations,
//! cgroup, reproduce command); phases, engines and formats are other modules'.
//! Single-threaded (the phases spawn their own workers).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Map, Value};

use crate::engine::{EngineConfig, EngineKind};
use crate::format::fmt_bytes;
use crate::results::{self, Machine, Record, RunOptions};
use crate::ycsb::{SizeMix, ValueLayout, YcsbConfig};
use crate::{cgroup, gc, measure, micro, ycsb, EngineChoice, Result};

#[derive(Args, Debug, Clone)]
pub struct SuiteArgs {
    /// Engines to run, in order (default: every engine this build has).
    #[arg(long, value_enum, value_delimiter = ',')]
    engines: Vec<EngineChoice>,
    /// Directory in which each run's temporary engine directory is created.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// JSON file of all results (rewritten after every engine).
    #[arg(long, default_value = "bench/results.json")]
    json: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// YCSB client threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=256))]
    threads: u64,
    /// Records of the in-memory YCSB data set (YCSB's recordcount).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    records: u64,
    /// Operations per YCSB workload on the in-memory data set (YCSB's operationcount).
    #[arg(long, default_value_t = 1_000_000)]
    operations: u64,
    /// Fields per record (YCSB's fieldcount; 1 is the paper's Figure 8b mode).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    fields: u32,
    /// Bytes per field (YCSB's fieldlength).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(8..=1 << 20))]
    field_bytes: u64,
    /// Use one of Talos's key-value size mixes instead of fields.
    #[arg(long, value_enum)]
    size_mix: Option<SizeMix>,
    /// Records of the larger-than-memory data set (0: skip it).
    #[arg(long, default_value_t = 0)]
    large_records: u64,
    /// Operations per YCSB workload on the larger-than-memory data set.
    #[arg(long, default_value_t = 200_000)]
    large_operations: u64,
    /// Records per write batch when loading the in-memory data set (1: a put per record,
    /// as YCSB's load does).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    load_batch: u64,
    /// Records per write batch when loading the larger-than-memory data set.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    large_load_batch: u64,
    /// Fields per record of the larger-than-memory data set.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    large_fields: u32,
    /// Memory limit (page cache included) of the cgroup the larger-than-memory runs use.
    #[arg(long, default_value_t = 1 << 30)]
    memory_limit_bytes: u64,
    /// Keys of the micro phases (0: skip them).
    #[arg(long, default_value_t = 1_000_000)]
    micro_keys: u64,
    /// Thread counts of the micro phases.
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 2])]
    micro_threads: Vec<u64>,
    /// The garbage-collection runs (`tucana-bench gc`), after each engine's micro phases;
    /// they use --threads, --fields, --field-bytes and --load-batch.
    #[command(flatten)]
    gc: gc::GcPlanArgs,
    /// Cache budget of every engine that has a cache of its own.
    #[arg(long, default_value_t = 256 << 20)]
    cache_bytes: u64,
    /// Durable before each write returns (default: buffered, synced once a second).
    #[arg(long)]
    sync: bool,
    /// Seconds: tiny data sets for a smoke test of the harness (overrides the sizes).
    #[arg(long)]
    quick: bool,
    /// A remark for the results document (repeatable), e.g. that the machine was shared.
    #[arg(long)]
    note: Vec<String>,
    /// Stop an engine's larger-than-memory run after this many seconds (0: no limit); the
    /// phases it finished are kept and the stop is recorded as a failure.
    #[arg(long, default_value_t = 0)]
    large_time_limit_secs: u64,
    /// Where each phase's time went: its client and engine threads' running, runnable and
    /// blocked shares, their sampled wait channels, and the device's throughput and queue
    /// depth (a sampler thread reads /proc every 10 ms; off by default).
    #[arg(long)]
    offcpu: bool,
    /// The JSON file of `scripts/device-ceiling.sh --json` (fio on the data directory's
    /// device), shown in the machine section.
    #[arg(long)]
    device_ceiling_json: Option<PathBuf>,
    /// Internal: run only the larger-than-memory data set on this engine (a child process
    /// of the suite, so that the cgroup's OOM killer can only end that engine's run).
    #[arg(long, hide = true, requires = "child_json")]
    child_engine: Option<EngineChoice>,
    /// Internal: where the child writes its records.
    #[arg(long, hide = true)]
    child_json: Option<PathBuf>,
}

impl SuiteArgs {
    fn apply_quick(&mut self) {
        if self.quick {
            self.records = 2_000;
            self.operations = 2_000;
            self.large_records = self.large_records.min(2_000);
            self.large_operations = 1_000;
            self.micro_keys = self.micro_keys.min(2_000);
        }
    }
}

/// One data set of the plan.
struct Dataset {
    name: &'static str,
    records: u64,
    operations: u64,
    layout: ValueLayout,
    load_batch: u64,
    memory_limit_bytes: Option<u64>,
}

pub fn run(args: &SuiteArgs) -> Result<()> {
    let mut args = args.clone();
    args.apply_quick();
    let is_child = args.child_engine.is_some();
    if let (Some(engine), Some(json)) = (args.child_engine, args.child_json.clone()) {
        args.engines = vec![engine];
        args.json = json;
    }
    let engines = EngineChoice::chosen_or_built(&args.engines);
    if args.large_records > 0 && args.cache_bytes > args.memory_limit_bytes / 4 {
        return Err(format!(
            "--cache-bytes {} leaves too little of --memory-limit-bytes {} for the engines' \
             other memory and the page cache (at most a quarter, or the cgroup kills the run)",
            args.cache_bytes, args.memory_limit_bytes
        )
        .into());
    }
    let kinds = engines
        .iter()
        .map(|e| e.kind())
        .collect::<std::result::Result<Vec<_>, String>>()?;

    let mut machine = Machine::detect();
    machine.disk = measure::watch_device_of(&args.dir);
    let mut options = RunOptions::with_argv_and_engines(kinds.iter().map(|k| k.name()));
    options.set("threads", args.threads);
    where_the_time_goes(&args, &mut machine, &mut options)?;
    options.set("sync", args.sync);
    options.set("cache_bytes", args.cache_bytes);
    options.set("seed", args.seed);
    options.set("quick", args.quick);
    options.set("notes", args.note.clone());
    crate::describe_dir(&args.dir, &mut options);
    results::print_header("suite", &machine, &options);

    let engine_config = EngineConfig {
        sync_writes: args.sync,
        background_commit: true,
        cache_bytes: args.cache_bytes,
        flush_interval: Duration::from_secs(1),
        ..EngineConfig::default()
    };
    let configurations: Map<String, Value> = kinds
        .iter()
        .map(|k| (k.name().to_string(), k.configuration(&engine_config)))
        .collect();
    options.set("configurations", Value::Object(configurations));

    let layout = match args.size_mix {
        Some(mix) => ValueLayout::Mix(mix),
        None => ValueLayout::Fields {
            fields: args.fields,
            field_bytes: args.field_bytes as usize,
        },
    };
    let datasets = datasets(&args, layout, is_child);
    let gc_config = args.gc.config(
        args.quick,
        gc::RunShape {
            threads: args.threads as usize,
            layout,
            load_batch: args.load_batch as usize,
            seed: args.seed,
            engine: engine_config,
            dir: args.dir.clone(),
        },
    )?;
    options.set(
        "datasets",
        Value::Object(dataset_info(&datasets, &gc_config, is_child)),
    );
    if let Some(parent) = args.json.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }

    let plan = Plan {
        args,
        is_child,
        kinds,
        engine_config,
        gc_config,
    };
    let mut collected = Collected {
        machine,
        options,
        records: Vec::new(),
        imported: Vec::new(),
        cgroup_notes: Map::new(),
    };
    for dataset in &datasets {
        if dataset.memory_limit_bytes.is_some() && !plan.is_child {
            run_children(&plan, dataset, &mut collected)?;
        } else {
            run_in_process(&plan, dataset, &mut collected)?;
        }
    }
    if plan.is_child {
        return Ok(());
    }
    println!("\nresults written to {}", plan.args.json.display());
    print_summary(&collected.records);
    gc::print_summary(&collected.records);
    for failure in collected.imported.iter().filter(|r| !r["failed"].is_null()) {
        println!(
            "FAILED: {} on {}: {}",
            failure["engine"], failure["dataset"], failure["failed"]
        );
    }
    Ok(())
}

/// Turns on the `--offcpu` sampler and reads `--device-ceiling-json` into the machine's
/// description, noting both in the run's options.
fn where_the_time_goes(
    args: &SuiteArgs,
    machine: &mut Machine,
    options: &mut RunOptions,
) -> Result<()> {
    if args.offcpu {
        crate::offcpu::enable(crate::sys::device_stat_path(&args.dir).map(|(_, name)| name));
    }
    options.set("offcpu", args.offcpu);
    if let Some(path) = &args.device_ceiling_json {
        let figures = read_device_ceiling(path)?;
        options.set(
            "device_ceiling_run",
            json!({ "dir": figures["dir"], "json": path.display().to_string() }),
        );
        machine.device_ceiling = Some(figures);
    }
    Ok(())
}

/// The figures `scripts/device-ceiling.sh --json` wrote.
pub fn read_device_ceiling(path: &std::path::Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--device-ceiling-json {}: {e}", path.display()))?;
    let figures: Value = serde_json::from_str(&text)
        .map_err(|e| format!("--device-ceiling-json {}: {e}", path.display()))?;
    if figures["seq_write_mb_s"].as_f64().is_none() || figures["rand_read_iops"].as_f64().is_none()
    {
        return Err(format!(
            "--device-ceiling-json {}: no seq_write_mb_s and rand_read_iops (not written by \
             scripts/device-ceiling.sh?)",
            path.display()
        )
        .into());
    }
    Ok(figures)
}

/// What every data set and engine of the run shares.
struct Plan {
    args: SuiteArgs,
    /// This process is a child that runs one engine on the larger-than-memory data set.
    is_child: bool,
    kinds: Vec<&'static dyn EngineKind>,
    engine_config: EngineConfig,
    gc_config: gc::GcConfig,
}

/// What the run has collected so far: its description and its records, as the results
/// file gets them.
struct Collected {
    machine: Machine,
    options: RunOptions,
    records: Vec<Record>,
    /// Records of the child processes, already JSON.
    imported: Vec<Value>,
    /// What each data set's memory cgroup was (`options.cgroups`).
    cgroup_notes: Map<String, Value>,
}

/// The data sets of the run, in order: in memory (unless this is a child), then larger
/// than memory when asked for.
fn datasets(args: &SuiteArgs, layout: ValueLayout, is_child: bool) -> Vec<Dataset> {
    let mut datasets = Vec::new();
    if !is_child {
        datasets.push(Dataset {
            name: if args.quick { "quick" } else { "in-memory" },
            records: args.records,
            operations: args.operations,
            layout,
            load_batch: args.load_batch,
            memory_limit_bytes: None,
        });
    }
    if args.large_records > 0 {
        datasets.push(Dataset {
            name: "larger-than-memory",
            records: args.large_records,
            operations: args.large_operations,
            layout: ValueLayout::Fields {
                fields: args.large_fields,
                field_bytes: args.field_bytes as usize,
            },
            load_batch: args.large_load_batch,
            memory_limit_bytes: Some(args.memory_limit_bytes),
        });
    }
    datasets
}

/// What the results file says of each data set (`options.datasets`), the GC runs' included.
fn dataset_info(
    datasets: &[Dataset],
    gc_config: &gc::GcConfig,
    is_child: bool,
) -> Map<String, Value> {
    let mut info = Map::new();
    for dataset in datasets {
        info.insert(
            dataset.name.to_string(),
            json!({
                "records": dataset.records,
                "operations": dataset.operations,
                "value_layout": dataset.layout.describe(),
                "load_batch": dataset.load_batch,
                "memory_limit_bytes": dataset.memory_limit_bytes,
            }),
        );
    }
    if gc_config.records > 0 && !is_child {
        info.insert(gc::DATASET.to_string(), gc_config.describe());
    }
    info
}

/// The larger-than-memory data set, one child process per engine (see [`run_child`]); the
/// results file is rewritten after each.
fn run_children(plan: &Plan, dataset: &Dataset, collected: &mut Collected) -> Result<()> {
    for kind in &plan.kinds {
        let child = run_child(kind.name(), &plan.args)?;
        if let Some(note) = child.cgroup {
            collected
                .cgroup_notes
                .insert(dataset.name.to_string(), note);
        }
        collected.imported.extend(child.records);
        collected
            .options
            .set("cgroups", Value::Object(collected.cgroup_notes.clone()));
        results::write_json_with(
            &plan.args.json,
            "suite",
            &collected.machine,
            &collected.options,
            &collected.records,
            &collected.imported,
        )?;
    }
    Ok(())
}

/// One data set on every engine in this process (inside the data set's memory cgroup, if
/// it has a limit); the results file is rewritten after each engine.
fn run_in_process(plan: &Plan, dataset: &Dataset, collected: &mut Collected) -> Result<()> {
    // The guard keeps the process in the cgroup until the data set is done.
    let cgroup = dataset.memory_limit_bytes.and_then(|limit_bytes| {
        enter_cgroup(dataset.name, limit_bytes, &mut collected.cgroup_notes)
    });
    collected
        .options
        .set("cgroups", Value::Object(collected.cgroup_notes.clone()));
    for &kind in &plan.kinds {
        let first = collected.records.len();
        println!(
            "\n== {} on {} ({} records, {})",
            kind.name(),
            dataset.name,
            dataset.records,
            dataset.layout.describe()
        );
        run_engine(plan, kind, dataset, collected)?;
        if let Some(cgroup) = &cgroup {
            for record in &mut collected.records[first..] {
                if let Some(peak) = cgroup.peak_bytes() {
                    record.set("cgroup_peak_bytes_so_far", peak);
                }
            }
            println!(
                "cgroup: peak {} of {}, limit hit {} times",
                cgroup.peak_bytes().map_or("?".into(), fmt_bytes),
                fmt_bytes(dataset.memory_limit_bytes.unwrap_or(0)),
                cgroup.limit_hits().map_or("?".into(), |n| n.to_string())
            );
        }
        results::write_json(
            &plan.args.json,
            "suite",
            &collected.machine,
            &collected.options,
            &collected.records,
        )?;
    }
    Ok(())
}

/// Moves this process into a memory cgroup limited to `limit_bytes` for data set `name`,
/// noting in `cgroup_notes` what it is, or why there is none.
fn enter_cgroup(
    name: &str,
    limit_bytes: u64,
    cgroup_notes: &mut Map<String, Value>,
) -> Option<cgroup::MemoryCgroup> {
    match cgroup::enter(limit_bytes) {
        Ok(cgroup) => {
            println!(
                "\n{name}: inside a memory cgroup limited to {}",
                fmt_bytes(limit_bytes)
            );
            cgroup_notes.insert(name.to_string(), cgroup.describe());
            Some(cgroup)
        }
        Err(reason) => {
            println!(
                "\nWARNING: {name}: no memory cgroup ({reason}); the page cache is NOT limited"
            );
            cgroup_notes.insert(
                name.to_string(),
                json!({ "error": reason, "limited": false }),
            );
            None
        }
    }
}

/// One engine on one data set: the YCSB sequence, then on a data set without a memory
/// limit the micro phases at each thread count and the GC runs.
fn run_engine(
    plan: &Plan,
    kind: &'static dyn EngineKind,
    dataset: &Dataset,
    collected: &mut Collected,
) -> Result<()> {
    let args = &plan.args;
    let config = YcsbConfig {
        records: dataset.records,
        operations: dataset.operations,
        threads: args.threads as usize,
        layout: dataset.layout,
        load_batch: dataset.load_batch as usize,
        seed: args.seed,
        dataset: dataset.name.to_string(),
        engine: plan.engine_config,
        dir: args.dir.clone(),
    };
    let Collected {
        machine,
        options,
        records,
        ..
    } = collected;
    ycsb::run(kind, &config, records, &mut |so_far| {
        // A child saves every phase: the OOM killer gives no warning.
        if plan.is_child {
            results::write_json(&args.json, "suite", machine, options, so_far)?;
        }
        Ok(())
    })?;
    if dataset.memory_limit_bytes.is_none() && args.micro_keys > 0 {
        for &threads in &args.micro_threads {
            let micro_first = records.len();
            let config = micro::MicroConfig {
                keys: args.micro_keys,
                key_bytes: 16,
                key_prefix: None,
                value_bytes: 100,
                threads: threads as usize,
                seed: args.seed,
                sync_writes: args.sync,
                dir: args.dir.clone(),
                stop_after: None,
                engine: plan.engine_config,
            };
            micro::run(kind, &config, records)?;
            for record in &mut records[micro_first..] {
                record.set("dataset", dataset.name);
            }
        }
    }
    if dataset.memory_limit_bytes.is_none() && plan.gc_config.records > 0 {
        gc::run(kind, &plan.gc_config, records)?;
    }
    Ok(())
}

/// What a child process measured.
struct ChildResult {
    records: Vec<Value>,
    cgroup: Option<Value>,
}

/// Runs the larger-than-memory data set for one engine in a child process (this program,
/// same arguments) and reads back its records. A child that dies (the cgroup's OOM
/// killer, a failed check) becomes one record saying so, and the suite goes on.
fn run_child(engine: &str, args: &SuiteArgs) -> Result<ChildResult> {
    let json = args.json.with_extension(format!("{engine}.child.json"));
    let _ = std::fs::remove_file(&json);
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    argv.push("--child-engine".into());
    argv.push(engine.into());
    argv.push("--child-json".into());
    argv.push(json.clone().into());
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(&argv)
        .spawn()?;
    let started = std::time::Instant::now();
    let limit =
        (args.large_time_limit_secs > 0).then(|| Duration::from_secs(args.large_time_limit_secs));
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if limit.is_some_and(|limit| started.elapsed() > limit) && !timed_out {
            timed_out = true;
            // SIGKILL: the child is ours, and a stuck engine may not answer anything softer.
            child.kill()?;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let parsed = std::fs::read_to_string(&json)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok());
    let _ = std::fs::remove_file(&json);
    let mut records: Vec<Value> = parsed
        .as_ref()
        .and_then(|doc| doc["records"].as_array().cloned())
        .unwrap_or_default();
    let cgroup = parsed
        .as_ref()
        .map(|doc| doc["options"]["cgroups"]["larger-than-memory"].clone())
        .filter(|v| !v.is_null());
    if !status.success() {
        let how = match status.code() {
            _ if timed_out => format!(
                "stopped by the harness after the time limit of {} s",
                args.large_time_limit_secs
            ),
            Some(code) => format!("exit status {code}"),
            None => {
                use std::os::unix::process::ExitStatusExt;
                format!(
                    "killed by signal {} (SIGKILL here is the memory cgroup's OOM killer)",
                    status.signal().unwrap_or(0)
                )
            }
        };
        let done: Vec<String> = records
            .iter()
            .filter_map(|r| r["workload"].as_str().map(str::to_string))
            .collect();
        println!("\nWARNING: {engine} on larger-than-memory: {how}");
        records.push(json!({
            "engine": engine,
            "workload": "failed",
            "dataset": "larger-than-memory",
            "failed": format!("{how}; phases completed before: {done:?}"),
            "ops_per_sec": null, "cpu_us_per_op": null, "io_amp_write": null,
            "io_amp_read": null, "space_amp": null, "p50_us": null, "p99_us": null,
            "p999_us": null, "peak_rss_bytes": null,
        }));
    }
    Ok(ChildResult { records, cgroup })
}

/// Throughput per workload and engine, side by side.
fn print_summary(records: &[Record]) {
    let mut engines: Vec<&str> = Vec::new();
    let mut rows: Vec<(String, String)> = Vec::new();
    // The GC runs have their own summary (`gc::print_summary`).
    let records: Vec<&Record> = records
        .iter()
        .filter(|r| r.get("dataset").and_then(Value::as_str) != Some(gc::DATASET))
        .collect();
    for record in &records {
        if !engines.contains(&record.engine) {
            engines.push(record.engine);
        }
        let dataset = record
            .get("dataset")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let threads = record.get("threads").and_then(Value::as_u64).unwrap_or(0);
        let row = (dataset, format!("{} t{threads}", record.workload));
        if !rows.contains(&row) {
            rows.push(row);
        }
    }
    println!("\nsummary: ops/s");
    print!("{:<20} {:<20}", "dataset", "workload");
    for engine in &engines {
        print!(" {engine:>12}");
    }
    println!();
    for (dataset, workload) in &rows {
        print!("{dataset:<20} {workload:<20}");
        for engine in &engines {
            let value = records.iter().find(|r| {
                r.engine == *engine
                    && r.get("dataset").and_then(Value::as_str) == Some(dataset.as_str())
                    && format!(
                        "{} t{}",
                        r.workload,
                        r.get("threads").and_then(Value::as_u64).unwrap_or(0)
                    ) == *workload
            });
            match value.and_then(|r| r.ops_per_sec) {
                Some(ops) => print!(" {ops:>12.0}"),
                None => print!(" {:>12}", "-"),
            }
        }
        println!();
    }
}
