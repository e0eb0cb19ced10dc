//! The `report` command: BENCHMARKS.md and its PNG plots, generated from a suite's JSON
//! file and nothing else, so the document never says what the run did not measure.
//!
//! Contents: how to reproduce, the machine, the data sets and memory limits, the ratios
//! Tucana/peer per workload (throughput and CPU per operation), every absolute figure,
//! each engine's configuration, and plots of throughput, CPU/op and write amplification per
//! workload (with the `plots` feature; without it the document says the plots were not
//! drawn); then, when the `coldscan` command's JSON file exists, the cold-scan section
//! (`render_coldscan`), and when the `server` command's does, its redis-benchmark section
//! (laid out by `server::render_section`, this module's child). Owns the document's
//! layout; reads only the JSON files. Single-threaded.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

use crate::format::{fmt_bytes, fmt_mib, fmt_number, number, ratio_cell, shell_quote};
use crate::Result;

mod server;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The suite's JSON file.
    #[arg(default_value = "bench/results.json")]
    json: PathBuf,
    /// The document to write.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// Directory of the plots, relative paths in the document are from `--out`'s directory.
    #[arg(long, default_value = "bench/plots")]
    plots_dir: PathBuf,
    /// A remark added when the report is generated (repeatable), shown apart from the
    /// run's own notes: what the JSON cannot say (e.g. why a run was stopped).
    #[arg(long)]
    note: Vec<String>,
    /// The `server` command's JSON file, whose section is added when the file exists
    /// (default: `server-results.json` next to the suite's JSON file).
    #[arg(long)]
    server_json: Option<PathBuf>,
    /// The JSON file of a separate `tucana-bench gc` run: its records fill the "Garbage
    /// collection" section in place of the suite's own GC records, if any.
    #[arg(long)]
    gc_json: Option<PathBuf>,
    /// The JSON file of another `tucana-bench gc` run (repeatable), e.g. on a data set
    /// that its writers rewrite faster: its overwrite records get a table of their own at
    /// the end of the "Garbage collection" section.
    #[arg(long)]
    also_gc_json: Vec<PathBuf>,
    /// The JSON file of a second suite run made with `--sync` (every write durable before
    /// it returns): its data sets join the document as "<data set>, sync per write".
    #[arg(long)]
    sync_json: Option<PathBuf>,
    /// The JSON file of a `tucana-bench coldscan` run, whose "Cold scans" section is added
    /// (default: `coldscan.json` next to the suite's JSON file, when it exists).
    #[arg(long)]
    coldscan_json: Option<PathBuf>,
}

/// The `coldscan` command's JSON file when `--coldscan-json` is not given, next to the
/// suite's.
const COLDSCAN_JSON_FILE_NAME: &str = "coldscan.json";

/// What a data set of a `--sync-json` run is called in the document.
const SYNC_SUFFIX: &str = ", sync per write";

/// The figure a table column or plot shows.
#[derive(Clone, Copy)]
struct Metric {
    field: &'static str,
    title: &'static str,
    /// Higher is better (throughput) or lower is better (costs).
    higher_is_better: bool,
}

const THROUGHPUT: Metric = Metric {
    field: "ops_per_sec",
    title: "throughput (ops/s)",
    higher_is_better: true,
};
const CPU: Metric = Metric {
    field: "cpu_us_per_op",
    title: "CPU time per operation (µs, user + system, all threads)",
    higher_is_better: false,
};
#[cfg_attr(not(feature = "plots"), allow(dead_code))]
const WRITE_AMP: Metric = Metric {
    field: "io_amp_write",
    title: "write amplification (process bytes written ÷ user bytes written)",
    higher_is_better: false,
};

pub fn run(args: &ReportArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.json)
        .map_err(|e| format!("cannot read {}: {e}", args.json.display()))?;
    let mut doc: Value = serde_json::from_str(&text)?;
    if let Some(gc_path) = &args.gc_json {
        let text = std::fs::read_to_string(gc_path)
            .map_err(|e| format!("cannot read {}: {e}", gc_path.display()))?;
        merge_gc(&mut doc, &serde_json::from_str(&text)?, gc_path);
    }
    for path in &args.also_gc_json {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        add_also_gc(&mut doc, &serde_json::from_str(&text)?, path);
    }
    if let Some(sync_path) = &args.sync_json {
        let text = std::fs::read_to_string(sync_path)
            .map_err(|e| format!("cannot read {}: {e}", sync_path.display()))?;
        merge_sync(&mut doc, &serde_json::from_str(&text)?, sync_path)?;
    }
    let out_dir = args
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(&args.plots_dir)?;
    let plots = draw_plots(&doc, &args.plots_dir)?;
    let relative_plots: Vec<(String, PathBuf)> = plots
        .into_iter()
        .map(|(title, path)| {
            let relative = path.strip_prefix(out_dir).unwrap_or(&path).to_path_buf();
            (title, relative)
        })
        .collect();
    if let Some(path) = &args.coldscan_json {
        // Named in the report command under "Reproduce" (the default file needs no flag).
        doc["options"]["coldscan_run"] = serde_json::json!({ "json": path.display().to_string() });
    }
    let mut markdown = render(&doc, &args.json, &relative_plots)?;
    if !args.note.is_empty() {
        // After the title and the paragraph under it.
        let at = markdown.find("\n## ").map_or(markdown.len(), |i| i + 1);
        let mut notes = String::from("Notes added when this report was generated:\n\n");
        for note in &args.note {
            let _ = writeln!(notes, "- {note}");
        }
        notes.push('\n');
        markdown.insert_str(at, &notes);
    }
    let server_json = args.server_json.clone().unwrap_or_else(|| {
        args.json
            .with_file_name(crate::server::DEFAULT_JSON_FILE_NAME)
    });
    let coldscan_json = match &args.coldscan_json {
        Some(path) => Some(path.clone()),
        None => Some(args.json.with_file_name(COLDSCAN_JSON_FILE_NAME)).filter(|p| p.exists()),
    };
    if let Some(path) = coldscan_json {
        append_coldscan_section(&mut markdown, &path)?;
    }
    append_server_section(&mut markdown, &server_json)?;
    std::fs::write(&args.out, markdown)?;
    println!(
        "wrote {} and {} plot(s) in {}",
        args.out.display(),
        relative_plots.len(),
        args.plots_dir.display()
    );
    Ok(())
}

/// Adds the redis-benchmark section (module `server`) when its JSON file exists.
fn append_server_section(markdown: &mut String, path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a server run's JSON: {e}", path.display()))?;
    *markdown += &server::render_section(&doc, path);
    Ok(())
}

/// The measured records (runs that failed are listed apart, see [`failures`]; the GC
/// runs too, see [`gc_records`]).
fn records(doc: &Value) -> Vec<Value> {
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
fn is_gc(record: &Value) -> bool {
    record["dataset"] == crate::gc::DATASET
}

fn gc_records(doc: &Value) -> Vec<Value> {
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

fn failures(doc: &Value) -> Vec<Value> {
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
fn distinct(records: &[Value], f: impl Fn(&Value) -> String) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for record in records {
        let value = f(record);
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen
}

fn dataset(record: &Value) -> String {
    record["dataset"].as_str().unwrap_or("-").to_string()
}

/// "ycsb_a" for YCSB phases (their thread count is the data set's), "fillrandom t2" for
/// micro phases, which run at several thread counts.
fn row_name(record: &Value) -> String {
    let workload = record["workload"].as_str().unwrap_or("?");
    if workload.starts_with("ycsb_") {
        workload.to_string()
    } else {
        format!("{workload} t{}", record["threads"].as_u64().unwrap_or(0))
    }
}

fn find<'a>(
    records: &'a [Value],
    dataset_name: &str,
    row: &str,
    engine: &str,
) -> Option<&'a Value> {
    records
        .iter()
        .find(|r| dataset(r) == dataset_name && row_name(r) == row && r["engine"] == engine)
}

fn render(doc: &Value, json_path: &Path, plots: &[(String, PathBuf)]) -> Result<String> {
    let records = &records(doc)[..];
    let options = &doc["options"];
    let machine = &doc["machine"];
    let engines = distinct(records, |r| r["engine"].as_str().unwrap_or("?").to_string());
    let peers: Vec<&String> = engines.iter().filter(|e| *e != "tucana").collect();
    let datasets = distinct(records, dataset);
    let mut md = String::new();

    md += "# Benchmarks: Tucana and its peers\n\n";
    let _ = writeln!(
        md,
        "Generated by `tucana-bench report {}` from the JSON file of one `tucana-bench suite` \
         run; never edited by hand. Every read the harness made was checked against the value \
         it must hold (a wrong or missing answer ends the run), so every engine below answered \
         correctly.\n",
        json_path.display()
    );
    for failure in failures(doc) {
        let _ = writeln!(
            md,
            "**{} did not finish the {} data set: {}.** Its figures for that data set are missing.\n",
            failure["engine"].as_str().unwrap_or("?"),
            failure["dataset"].as_str().unwrap_or("?"),
            failure["failed"].as_str().unwrap_or("?")
        );
    }
    if doc["debug_build"].as_bool() == Some(true) {
        md += "**WARNING: a debug build produced these numbers; they are meaningless.**\n\n";
    }
    if let Some(notes) = options["notes"].as_array() {
        for note in notes.iter().filter_map(Value::as_str) {
            let _ = writeln!(md, "> {note}\n");
        }
    }

    md += "## Reproduce\n\n```sh\nscripts/bench-deps.sh   # librocksdb-dev, clang, fonts (Debian/Ubuntu, as root)\n";
    // The binary's own path (argv[0]) is machine-specific; the script builds and runs the
    // same program. The suite's command, then those of the runs merged into it.
    let gc_run = &options["gc_run"];
    let sync_run = &options["sync_run"];
    let also_gc = options["also_gc_runs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let also_gc_argvs = also_gc.iter().map(|run| &run["argv"]);
    for argv in [&options["argv"], &gc_run["argv"]]
        .into_iter()
        .chain(also_gc_argvs)
        .chain([&sync_run["argv"]])
    {
        if let Some(argv) = argv.as_array() {
            let args: Vec<String> = argv
                .iter()
                .skip(1)
                .filter_map(Value::as_str)
                .map(shell_quote)
                .collect();
            let _ = writeln!(md, "scripts/bench.sh {}", args.join(" "));
        }
    }
    let _ = write!(md, "scripts/bench.sh report {}", json_path.display());
    if let Some(path) = gc_run["json"].as_str() {
        let _ = write!(md, " --gc-json {}", shell_quote(path));
    }
    for path in also_gc.iter().filter_map(|run| run["json"].as_str()) {
        let _ = write!(md, " --also-gc-json {}", shell_quote(path));
    }
    if let Some(path) = sync_run["json"].as_str() {
        let _ = write!(md, " --sync-json {}", shell_quote(path));
    }
    if let Some(path) = options["coldscan_run"]["json"].as_str() {
        let _ = write!(md, " --coldscan-json {}", shell_quote(path));
    }
    md += "\n```\n\n";

    md += "## Machine\n\n";
    let _ = writeln!(
        md,
        "- CPU: {} ({} cores)\n- memory: {}\n- kernel: {}\n- disk: {}\n- data directory: {} ({})\n",
        machine["cpu_model"].as_str().unwrap_or("unknown"),
        machine["cores"],
        machine["mem_total_bytes"]
            .as_u64()
            .map_or("unknown".into(), fmt_bytes),
        machine["kernel"].as_str().unwrap_or("unknown"),
        machine["disk"].as_str().unwrap_or("unknown"),
        options["dir"].as_str().unwrap_or("?"),
        options["fs"].as_str().unwrap_or("?"),
    );

    md += "## Data sets\n\n| data set | records | operations per workload | values | load batch | memory limit |\n|---|---|---|---|---|---|\n";
    if let Some(sets) = options["datasets"].as_object() {
        for (name, info) in sets {
            let cgroup = &options["cgroups"][name];
            let limit = match info["memory_limit_bytes"].as_u64() {
                None => "none".to_string(),
                Some(bytes) if cgroup["error"].is_null() => format!(
                    "{} (cgroup {} `{}`)",
                    fmt_bytes(bytes),
                    cgroup["version"].as_str().unwrap_or("?"),
                    cgroup["limit_file"].as_str().unwrap_or("?")
                ),
                Some(bytes) => format!(
                    "**not applied**: {} requested, but {}",
                    fmt_bytes(bytes),
                    cgroup["error"].as_str().unwrap_or("?")
                ),
            };
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} | {} | {limit} |",
                info["records"],
                info["operations"],
                info["value_layout"].as_str().unwrap_or("?"),
                info["load_batch"]
            );
        }
    }
    let _ = writeln!(
        md,
        "\nYCSB threads: {}. Durability: {}. Cache budget: {} per engine. Micro phases \
         (16-byte keys, 100-byte values) ran on the in-memory data set's engines at each \
         thread count listed.\n",
        options["threads"],
        if options["sync"].as_bool() == Some(true) {
            "every write durable before it returns".to_string()
        } else if options["sync_run"].is_null() {
            "buffered, made durable about once a second, nothing synced per operation".to_string()
        } else {
            format!(
                "buffered, made durable about once a second, nothing synced per operation; \
                 the data sets named \"…{SYNC_SUFFIX}\" come from a second run (YCSB threads: \
                 {}) in which every write is durable before it returns, where group commit \
                 matters",
                options["sync_run"]["threads"]
            )
        },
        options["cache_bytes"]
            .as_u64()
            .map_or("?".into(), fmt_bytes),
    );

    if !peers.is_empty() {
        md += "## Tucana ÷ peer\n\n";
        md += "Throughput ratio: above 1 means Tucana is faster. CPU ratio: below 1 means Tucana \
                spends less CPU per operation.\n\n";
        for dataset_name in &datasets {
            for metric in [THROUGHPUT, CPU] {
                let _ = writeln!(md, "### {dataset_name}: {}\n", metric.title);
                md += "| workload |";
                for peer in &peers {
                    let _ = write!(md, " vs {peer} |");
                }
                md += "\n|---|";
                md += &"---|".repeat(peers.len());
                md += "\n";
                let rows = distinct(
                    &records
                        .iter()
                        .filter(|r| dataset(r) == *dataset_name)
                        .cloned()
                        .collect::<Vec<_>>(),
                    row_name,
                );
                for row in &rows {
                    let _ = write!(md, "| {row} |");
                    let ours = find(records, dataset_name, row, "tucana")
                        .and_then(|r| number(&r[metric.field]));
                    for peer in &peers {
                        let theirs = find(records, dataset_name, row, peer)
                            .and_then(|r| number(&r[metric.field]));
                        let cell = ratio_cell(ours, theirs, metric.higher_is_better);
                        let _ = write!(md, " {cell} |");
                    }
                    md += "\n";
                }
                md += "\n";
            }
        }
    }

    if !plots.is_empty() {
        md += "## Plots\n\n";
        for (title, path) in plots {
            let _ = writeln!(md, "![{title}]({})\n", path.display());
        }
    } else {
        md += "## Plots\n\nNot drawn: this report was generated without the `plots` feature.\n\n";
    }

    md += "## Absolute figures\n\n";
    md += "ops/s; CPU µs per operation; write and read amplification (bytes this process made \
            the storage layer write or read, from /proc/self/io, ÷ bytes of keys and values the \
            workload wrote or read); device write amplification (the data directory's block \
            device, every process on it); space amplification (files' allocated bytes after the \
            phase ÷ live keys and values); latency percentiles in µs; peak resident memory in MiB \
            during the phase.\n\n";
    for dataset_name in &datasets {
        let _ = writeln!(md, "### {dataset_name}\n");
        md += "| workload | engine | ops/s | CPU µs/op | w-amp | r-amp | device w-amp | space amp | p50 µs | p99 µs | p99.9 µs | peak RSS MiB |\n";
        md += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
        let in_set: Vec<Value> = records
            .iter()
            .filter(|r| dataset(r) == *dataset_name)
            .cloned()
            .collect();
        for row in distinct(&in_set, row_name) {
            for engine in &engines {
                let Some(r) = find(records, dataset_name, &row, engine) else {
                    continue;
                };
                let _ = writeln!(
                    md,
                    "| {row} | {engine} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    fmt_number(number(&r["ops_per_sec"])),
                    fmt_number(number(&r["cpu_us_per_op"])),
                    fmt_number(number(&r["io_amp_write"])),
                    fmt_number(number(&r["io_amp_read"])),
                    fmt_number(number(&r["device_io_amp_write"])),
                    fmt_number(number(&r["space_amp"])),
                    fmt_number(number(&r["p50_us"])),
                    fmt_number(number(&r["p99_us"])),
                    fmt_number(number(&r["p999_us"])),
                    fmt_mib(number(&r["peak_rss_bytes"])),
                );
            }
        }
        md += "\n";
    }

    render_gc(&mut md, doc);

    md += "## Engine configurations\n\n";
    if let Some(configurations) = options["configurations"].as_object() {
        for (engine, configuration) in configurations {
            let _ = writeln!(md, "### {engine}\n");
            if let Some(fields) = configuration.as_object() {
                for (name, value) in fields {
                    let value = match value {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let _ = writeln!(md, "- `{name}`: {value}");
                }
            }
            md += "\n";
        }
    }

    md += "## Method\n\n";
    md += "- YCSB: Load, A (50% read, 50% update), B (95/5), C (read only), F (read-modify-write), \
            D (95% reads of the latest inserts, 5% inserts), then a fresh database, Load again and \
            E (95% scans of uniform length 1–100, 5% inserts). Zipfian requests with constant 0.99, \
            scrambled as YCSB does; hashed insert order; YCSB's key names (`user` + FNV-1a hash). \
            An update writes the whole record (a blind put).\n";
    md += "- Micro: db_bench-style fillseq (ascending key order, into a store of its own; \
            runs from this version of the harness on), fillrandom, readrandom, readseq, \
            readreverse, overwrite, seekrandom (seek + 10 next), deleterandom.\n";
    md += "- Larger than memory: the harness moves itself into a child of its own memory cgroup \
            with the limit above for those runs, so page cache, engine caches and the harness \
            itself share that limit.\n";
    md += "- Garbage collection (`tucana-bench gc`, and the suite's `gc` data set): YCSB A on a \
            fresh database long enough for the updates to overwrite the data set several times, \
            Tucana with its background GC on and off; then load, delete every key and ask each \
            engine to give the space back the way its documentation says.\n";
    md += "- CPU time is the whole process's (engine background threads included, and the \
            harness's own key generation and checks, the same for every engine).\n";
    Ok(md)
}

/// Adds the records of `sync` (a suite run with `--sync`, read from `path`) to `doc`,
/// each data set renamed with [`SYNC_SUFFIX`], its GC runs left out (the GC section is
/// the buffered run's).
fn merge_sync(doc: &mut Value, sync: &Value, path: &Path) -> Result<()> {
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
fn merge_gc(doc: &mut Value, gc: &Value, path: &Path) {
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
fn add_also_gc(doc: &mut Value, gc: &Value, path: &Path) {
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

/// The table of overwrite records and a line per GC-on record on the issue's targets.
fn render_overwrites(md: &mut String, overwrites: &[&Value]) {
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

/// The overwrite tables of the runs `add_also_gc` kept.
fn render_also_gc(md: &mut String, doc: &Value) {
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
            *md += "**WARNING: a debug build produced these figures; they are meaningless.**\n\n";
        }
        let records: Vec<&Value> = run["records"].as_array().into_iter().flatten().collect();
        render_overwrites(md, &records);
    }
}

/// The "Garbage collection" section, when the run has GC records.
fn render_gc(md: &mut String, doc: &Value) {
    let records = gc_records(doc);
    if records.is_empty() {
        return;
    }
    let plan = &doc["options"]["datasets"][crate::gc::DATASET];
    let bytes = |v: &Value| v.as_u64().map_or("–".to_string(), fmt_bytes);
    *md += "## Garbage collection\n\n";
    let gc_run = &doc["options"]["gc_run"];
    if !gc_run.is_null() {
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
            *md += "**WARNING: a debug build produced the GC figures; they are meaningless.**\n\n";
        }
        if let Some(configurations) = gc_run["configurations"].as_object() {
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
    }
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
    let overwrites: Vec<&Value> = records
        .iter()
        .filter(|r| r["workload"] == "gc_ycsb_a")
        .collect();
    render_overwrites(md, &overwrites);
    render_also_gc(md, doc);

    let deletes: Vec<&Value> = records
        .iter()
        .filter(|r| r["workload"] == "delete_all")
        .collect();
    if deletes.is_empty() {
        return;
    }
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

// ---------------------------------------------------------------------------------------
// Cold scans (`tucana-bench coldscan`).

/// Adds the "Cold scans" section from the `coldscan` command's JSON file at `path`.
fn append_coldscan_section(markdown: &mut String, path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a coldscan run's JSON: {e}", path.display()))?;
    if doc["command"] != "coldscan" {
        return Err(format!("{} is not a coldscan run's JSON", path.display()).into());
    }
    *markdown += &render_coldscan(&doc, path);
    Ok(())
}

/// "tucana, prefetch on" / "tucana, prefetch off" / "rocksdb": the column a cold-scan
/// record belongs to.
fn coldscan_engine(record: &Value) -> String {
    let engine = record["engine"].as_str().unwrap_or("?");
    match record["prefetch"].as_str() {
        Some(setting) => format!("{engine}, prefetch {setting}"),
        None => engine.to_string(),
    }
}

/// The cold-scan section: what was run and how cold it was, Tucana ÷ peer, prefetch on ÷
/// off, every absolute figure and the stores each engine scanned.
fn render_coldscan(doc: &Value, json_path: &Path) -> String {
    use crate::coldscan::{FORWARD, REVERSE, SEEK_NEXT};
    let options = &doc["options"];
    let records: Vec<Value> = doc["records"].as_array().cloned().unwrap_or_default();
    let engines = distinct(&records, |r| {
        r["engine"].as_str().unwrap_or("?").to_string()
    });
    let peers: Vec<&String> = engines.iter().filter(|e| *e != "tucana").collect();
    let find = |workload: &str, engine: &str, prefetch: Option<&str>| -> Option<&Value> {
        records.iter().find(|r| {
            r["workload"] == workload && r["engine"] == engine && r["prefetch"].as_str() == prefetch
        })
    };
    let bytes = |v: &Value| v.as_u64().map_or("?".to_string(), fmt_bytes);
    let mut md = String::new();

    md += "## Cold scans: a data set larger than the page cache\n\n";
    if doc["debug_build"].as_bool() == Some(true) {
        md += "**WARNING: a debug build produced these numbers; they are meaningless.**\n\n";
    }
    // The run's own remarks first: they qualify everything after them.
    if let Some(notes) = options["notes"].as_array() {
        for note in notes.iter().filter_map(Value::as_str) {
            let _ = writeln!(md, "> {note}\n");
        }
    }
    let cgroups = options["cgroups"].as_object();
    let limited = cgroups.is_some_and(|all| {
        !all.is_empty() && all.values().all(|c| c["limited"].as_bool() == Some(true))
    });
    let cgroup_text = if limited {
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
    } else {
        let reasons: Vec<String> = cgroups
            .into_iter()
            .flatten()
            .filter(|(_, c)| c["limited"].as_bool() != Some(true))
            .map(|(engine, c)| format!("{engine}: {}", c["error"].as_str().unwrap_or("?")))
            .collect();
        format!(
            "**without a memory limit** ({}): only the drop from the page cache before each \
             measurement makes it cold",
            reasons.join("; ")
        )
    };
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
        cgroup_text,
        options["short_scan_len"],
        options["short_scans"],
        options["prefetch_entries"],
        options["loadavg_at_start"].as_str().unwrap_or("?"),
    );
    md += "```sh\n";
    if let Some(argv) = options["argv"].as_array() {
        let args: Vec<String> = argv
            .iter()
            .skip(1)
            .filter_map(Value::as_str)
            .map(shell_quote)
            .collect();
        let _ = writeln!(md, "scripts/bench.sh {}", args.join(" "));
    }
    let _ = writeln!(
        md,
        "scripts/bench.sh report bench/results.json --coldscan-json {}\n```\n",
        shell_quote(&json_path.display().to_string())
    );

    let workloads = [
        (FORWARD, "full forward scan"),
        (REVERSE, "full reverse scan"),
        (SEEK_NEXT, "seek + next"),
    ];
    md += "### Tucana ÷ peer, and prefetch on ÷ off\n\n";
    md += "Throughput ratios (items/s for the full scans, scans/s for seek + next); above 1 \
            means Tucana (with prefetch on) is faster, or prefetch helps. CPU ratios (CPU time \
            per operation): below 1 means Tucana spends less.\n\n";
    for (metric, higher_is_better) in [("ops_per_sec", true), ("cpu_us_per_op", false)] {
        md += "| workload | ";
        md += if higher_is_better {
            "throughput: prefetch on ÷ off |"
        } else {
            "CPU/op: prefetch on ÷ off |"
        };
        for peer in &peers {
            let _ = write!(md, " vs {peer} |");
        }
        md += "\n|---|---|";
        md += &"---|".repeat(peers.len());
        md += "\n";
        for (workload, title) in workloads {
            let ours = find(workload, "tucana", Some("on")).and_then(|r| number(&r[metric]));
            let off = find(workload, "tucana", Some("off")).and_then(|r| number(&r[metric]));
            let _ = write!(
                md,
                "| {title} | {} |",
                ratio_cell(ours, off, higher_is_better)
            );
            for peer in &peers {
                let theirs = find(workload, peer, None).and_then(|r| number(&r[metric]));
                let _ = write!(md, " {} |", ratio_cell(ours, theirs, higher_is_better));
            }
            md += "\n";
        }
        md += "\n";
    }

    md += "### Absolute figures\n\n";
    md += "Operations are items for the full scans, scans for seek + next, batches for the \
            Tucana-only batch phases. Read amplification: bytes this process read from the \
            storage layer (/proc/self/io) ÷ bytes of keys and values returned; device: the data \
            directory's block device (every process on it). *hot-scan-forward* is Tucana's \
            forward scan with its volume already in the page cache and no memory limit: what \
            the scan costs when nothing has to come from the device.\n\n";
    md += "| workload | engine | ops/s | items/s | MB/s | CPU µs/op | r-amp | device r-amp | p50 µs | p99 µs | read MiB | peak RSS MiB |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for workload in distinct(&records, |r| {
        r["workload"].as_str().unwrap_or("?").to_string()
    }) {
        for r in records
            .iter()
            .filter(|r| r["workload"] == workload.as_str())
        {
            let _ = writeln!(
                md,
                "| {workload} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                coldscan_engine(r),
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
    md += "\n";

    md += "### The stores\n\n| engine | files after load | load s | settled by |\n|---|---|---|---|\n";
    for engine in &engines {
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
    md += "\n";
    md
}

// ---------------------------------------------------------------------------------------
// Plots.

#[cfg(not(feature = "plots"))]
fn draw_plots(_doc: &Value, _dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    Ok(Vec::new())
}

#[cfg(feature = "plots")]
fn draw_plots(doc: &Value, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    register_font()?;
    let records = &records(doc)[..];
    let engines = distinct(records, |r| r["engine"].as_str().unwrap_or("?").to_string());
    let mut plots = Vec::new();
    for dataset_name in distinct(records, dataset) {
        let in_set: Vec<Value> = records
            .iter()
            .filter(|r| dataset(r) == dataset_name)
            .cloned()
            .collect();
        let all_rows = distinct(&in_set, row_name);
        let (ycsb_rows, micro_rows): (Vec<String>, Vec<String>) =
            all_rows.into_iter().partition(|r| r.starts_with("ycsb_"));
        for (group, rows) in [("ycsb", ycsb_rows), ("micro", micro_rows)] {
            if rows.is_empty() {
                continue;
            }
            for (metric, file) in [
                (THROUGHPUT, "throughput"),
                (CPU, "cpu"),
                (WRITE_AMP, "write-amp"),
            ] {
                let values: Vec<Vec<Option<f64>>> = rows
                    .iter()
                    .map(|row| {
                        engines
                            .iter()
                            .map(|e| {
                                find(&in_set, &dataset_name, row, e)
                                    .and_then(|r| number(&r[metric.field]))
                                    .filter(|v| *v > 0.0)
                            })
                            .collect()
                    })
                    .collect();
                if values.iter().flatten().all(Option::is_none) {
                    continue;
                }
                // File names without spaces or commas ("in-memory, sync per write").
                let slug: String = dataset_name
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect::<String>()
                    .split('-')
                    .filter(|part| !part.is_empty())
                    .collect::<Vec<_>>()
                    .join("-");
                let path = dir.join(format!("{slug}-{group}-{file}.png"));
                let title = format!("{dataset_name}, {group}: {}", metric.title);
                bar_chart(&path, &title, &rows, &engines, &values)?;
                plots.push((title, path));
            }
        }
    }
    Ok(plots)
}

#[cfg(feature = "plots")]
fn register_font() -> Result<()> {
    use plotters::style::{register_font, FontStyle};
    const CANDIDATES: [&str; 3] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    ];
    let bytes = CANDIDATES
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no DejaVuSans.ttf found: run scripts/bench-deps.sh (fonts-dejavu-core)")?;
    // plotters keeps fonts for the life of the process; one small leak per run.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| "the DejaVu font is not a valid TrueType font")?;
    Ok(())
}

/// 1.5M, 20k, 3.2, 0.05: short labels for a log axis.
#[cfg(feature = "plots")]
fn human(value: f64) -> String {
    if value >= 1e6 {
        format!("{}M", trim(value / 1e6))
    } else if value >= 1e3 {
        format!("{}k", trim(value / 1e3))
    } else {
        trim(value)
    }
}

#[cfg(feature = "plots")]
fn trim(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Grouped bars on a log scale: one group per row, one bar per engine.
#[cfg(feature = "plots")]
fn bar_chart(
    path: &Path,
    title: &str,
    rows: &[String],
    engines: &[String],
    values: &[Vec<Option<f64>>],
) -> Result<()> {
    use plotters::prelude::*;
    const COLORS: [RGBColor; 6] = [
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    let positive: Vec<f64> = values.iter().flatten().flatten().copied().collect();
    let max = positive.iter().copied().fold(f64::MIN, f64::max);
    let min = positive.iter().copied().fold(f64::MAX, f64::min);
    // Headroom above the tallest bar for the legend.
    let (low, high) = (min / 2.0, max * 30.0);
    let width = (160 + rows.len() * 28 * (engines.len() + 1)).clamp(900, 2400) as u32;
    let root = BitMapBackend::new(path, (width, 560)).into_drawing_area();
    let fail = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..rows.len() as f64, (low..high).log_scale())
        .map_err(|e| fail(&e))?;
    let labels = rows.to_vec();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() * 2 + 1)
        .x_label_formatter(&|x| {
            // Labels at group centres only.
            let centre = x - x.floor();
            if (centre - 0.5).abs() < 0.01 {
                labels.get(x.floor() as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 12))
        .y_label_style(("sans-serif", 13))
        .y_label_formatter(&|y| human(*y))
        .draw()
        .map_err(|e| fail(&e))?;
    let bar_width = 0.8 / engines.len() as f64;
    for (e, engine) in engines.iter().enumerate() {
        let color = COLORS[e % COLORS.len()];
        let bars = values.iter().enumerate().filter_map(|(row, per_engine)| {
            let value = per_engine[e]?;
            let x0 = row as f64 + 0.1 + e as f64 * bar_width;
            Some(Rectangle::new(
                [(x0, low), (x0 + bar_width * 0.9, value)],
                color.filled(),
            ))
        });
        chart
            .draw_series(bars)
            .map_err(|e| fail(&e))?
            .label(engine.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let md = render(&suite, Path::new("bench/results.json"), &[]).unwrap();
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
        let md = render(&suite, Path::new("bench/results.json"), &[]).unwrap();
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
        let md = render_coldscan(&doc, Path::new("bench/coldscan.json"));
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

    #[test]
    fn report_has_ratios_figures_and_configurations() {
        let doc = serde_json::json!({
            "debug_build": false,
            "machine": {"cores": 2, "cpu_model": "Test CPU", "mem_total_bytes": 1u64 << 30,
                        "kernel": "Linux test", "disk": "vda"},
            "options": {
                "argv": ["/x/tucana-bench", "suite", "--records", "10", "--note", "it's shared"],
                "notes": ["The machine was shared."],
                "threads": 2, "sync": false, "cache_bytes": 1u64 << 20, "dir": "/tmp", "fs": "ext4",
                "datasets": {"in-memory": {"records": 10, "operations": 5, "value_layout": "1 field(s) x 100 B", "memory_limit_bytes": null}},
                "configurations": {"tucana": {"flush_interval_ms": 1000}, "rocksdb": {"bloom_filter_bits_per_key": 10}},
            },
            "records": [
                {"engine": "tucana", "workload": "ycsb_c", "dataset": "in-memory", "threads": 2,
                 "ops_per_sec": 200.0, "cpu_us_per_op": 1.0, "io_amp_write": null},
                {"engine": "rocksdb", "workload": "ycsb_c", "dataset": "in-memory", "threads": 2,
                 "ops_per_sec": 100.0, "cpu_us_per_op": 4.0},
                {"engine": "tucana", "workload": "readrandom", "dataset": "in-memory", "threads": 1,
                 "ops_per_sec": 50.0},
                {"engine": "tucana", "workload": "gc_ycsb_a", "dataset": "gc", "gc": "on",
                 "threads": 2, "ops_per_sec": 70.0, "throughput_vs_gc_off": 0.7,
                 "space_amp_max": 1.4, "space_amp_final": 1.3, "space_amp_settled": 1.2,
                 "gc_space_amp_target": 1.5, "gc_relocated_bytes": 10u64 << 20,
                 "live_log_bytes": 120u64, "live_user_bytes": 100u64},
                {"engine": "tucana", "workload": "gc_ycsb_a", "dataset": "gc", "gc": "off",
                 "threads": 2, "ops_per_sec": 100.0, "space_amp_max": 4.0},
                {"engine": "rocksdb", "workload": "gc_ycsb_a", "dataset": "gc", "gc": "on",
                 "threads": 2, "ops_per_sec": 90.0, "space_amp_max": 1.9},
                {"engine": "tucana", "workload": "delete_all", "dataset": "gc", "gc": "on",
                 "records": 1000, "ops_per_sec": 500.0, "empty_space_bytes": 57344u64,
                 "loaded_space_bytes": 1u64 << 20, "reclaimed_space_bytes": 65536u64,
                 "above_empty_bytes": 8192u64, "reclaim": "Database::gc()"},
            ],
        });
        let md = render(&doc, Path::new("bench/results.json"), &[]).unwrap();
        assert!(md.contains("| ycsb_c | **2.00** |"), "{md}");
        assert!(md.contains("| ycsb_c | **0.25** |"), "{md}");
        assert!(md.contains("| readrandom t1 | tucana | 50.0 |"), "{md}");
        assert!(
            md.contains(r"scripts/bench.sh suite --records 10 --note 'it'\''s shared'"),
            "{md}"
        );
        assert!(md.contains("`bloom_filter_bits_per_key`: 10"));
        assert!(md.contains("> The machine was shared."));
        // The GC runs have their own section and stay out of the per-engine tables.
        assert!(!md.contains("| gc_ycsb_a t2 |"), "{md}");
        assert!(md.contains("## Garbage collection"), "{md}");
        assert!(
            md.contains("| tucana | on | 70.0 | 0.70 | – | – | – | – | – | 1.40 | 1.30 | 1.20 |"),
            "{md}"
        );
        assert!(md.contains("| rocksdb | on | 90.0 | – |"), "{md}");
        assert!(
            md.contains("- tucana: with GC on, 70% of the throughput with GC off (target ≥ 65%: met); space amplification at most 1.40 during the run (target ≤ 1.50: met)"),
            "{md}"
        );
        assert!(md.contains("take 1.20× the user bytes"), "{md}");
        assert!(
            md.contains("| tucana | 1000 | 500.0 | 56.0 KiB | 1.0 MiB | – | 64.0 KiB | 8.0 KiB |"),
            "{md}"
        );
    }
}
