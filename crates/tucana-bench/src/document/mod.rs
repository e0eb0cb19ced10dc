//! The `report` command: BENCHMARKS.md and its PNG plots, generated from the harness's
//! JSON files and nothing else, so the document never says what a run did not measure.
//!
//! The document, in order: the suite's sections (`suite`: title, reproduce, machine, data
//! sets, Tucana ÷ peer, plots, absolute figures, then `gc`'s Garbage collection section,
//! engine configurations, method), the notes given with `--note` inserted after the
//! title's paragraph, the cold-scan section (`coldscan`) when the `coldscan` command's JSON
//! file exists, the redis-benchmark section (`server`) when the `server` command's
//! does, the replication section (`replication`) when the `replication` command's
//! does, and the Redis Cluster section (`cluster`) when the `cluster-compare` command's
//! does. The runs given with `--gc-json`, `--also-gc-json` and `--sync-json` join the
//! suite's document first (`merge`); `records` picks the records each table shows;
//! `plots` draws the PNG files (with the `plots` feature). Every figure is written by
//! `crate::format`.
//!
//! Owns the command, the reading of the files and the order of the sections; each child
//! owns the layout of its sections. Single-threaded.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

use crate::Result;

mod cluster;
mod coldscan;
mod devices;
mod gc;
mod merge;
mod offcpu;
mod plots;
mod records;
mod replication;
mod server;
mod suite;

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
    /// A second `server` run's JSON file, for issue 23's data-type tests, whose section
    /// follows the first when the file exists (default: `server-types-results.json`
    /// next to the suite's JSON file).
    #[arg(long)]
    server_types_json: Option<PathBuf>,
    /// The `replication` command's JSON file, whose section is added when the file
    /// exists (default: `replication-results.json` next to the suite's JSON file).
    #[arg(long)]
    replication_json: Option<PathBuf>,
    /// The `cluster-compare` command's JSON file, whose section is added when the file
    /// exists (default: `cluster-results.json` next to the suite's JSON file).
    #[arg(long)]
    cluster_json: Option<PathBuf>,
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
    /// it returns): its data sets join the document as "DATA SET, sync per write".
    #[arg(long)]
    sync_json: Option<PathBuf>,
    /// The JSON file of a `tucana-bench coldscan` run, whose "Cold scans" section is added
    /// (default: `coldscan.json` next to the suite's JSON file, when it exists).
    #[arg(long)]
    coldscan_json: Option<PathBuf>,
    /// The records of `tucana-bench devices` runs (one JSON object per line, as
    /// `scripts/bench-devices.sh` appends them), whose "Devices" section is added
    /// (default: `devices.jsonl` next to the suite's JSON file, when it exists).
    #[arg(long)]
    devices_json: Option<PathBuf>,
    /// Only replace the "Devices" section of the existing `--out` document (from its
    /// heading to the next `## ` heading or the end) with one made from the devices
    /// records; nothing else is read, drawn or rewritten.
    #[arg(long)]
    devices_only: bool,
    /// The JSON file of `scripts/device-ceiling.sh --json` (fio on the data directory's
    /// device), shown in the machine section in place of the suite run's own, if any.
    #[arg(long)]
    device_ceiling_json: Option<PathBuf>,
    /// The JSON file of a suite run made with `--offcpu` (repeatable), whose "where the
    /// time went" tables get a section of their own after the suite's.
    #[arg(long)]
    offcpu_json: Vec<PathBuf>,
}

/// `--devices-only`: the document at `--out` with its Devices section made again.
fn replace_devices_section(args: &ReportArgs) -> Result<()> {
    let devices_json = args
        .devices_json
        .clone()
        .unwrap_or_else(|| args.json.with_file_name("devices.jsonl"));
    let section = devices::render(&read_text(&devices_json)?, &devices_json);
    let old = read_text(&args.out)?;
    let new = splice_section(&old, devices::HEADING, &section).ok_or_else(|| {
        format!(
            "{} has no \"{}\" section to replace",
            args.out.display(),
            devices::HEADING
        )
    })?;
    std::fs::write(&args.out, new)?;
    println!(
        "replaced the Devices section of {} from {}",
        args.out.display(),
        devices_json.display()
    );
    Ok(())
}

/// `doc` with the section whose heading line starts with `heading` (up to the next
/// `## ` heading or the end) replaced by `section`; `None` without such a heading.
fn splice_section(doc: &str, heading: &str, section: &str) -> Option<String> {
    let start = if doc.starts_with(heading) {
        0
    } else {
        doc.find(&format!("\n{heading}"))? + 1
    };
    let end = doc[start + heading.len()..]
        .find("\n## ")
        .map_or(doc.len(), |i| start + heading.len() + i + 1);
    let mut out = String::with_capacity(doc.len() + section.len());
    out += &doc[..start];
    out += section;
    if end < doc.len() && !section.ends_with("\n\n") {
        out.push('\n');
    }
    out += &doc[end..];
    Some(out)
}

/// The `coldscan` command's JSON file when `--coldscan-json` is not given, next to the
/// suite's.
const COLDSCAN_JSON_FILE_NAME: &str = "coldscan.json";

pub fn run(args: &ReportArgs) -> Result<()> {
    if args.devices_only {
        return replace_devices_section(args);
    }
    let mut doc = read_suite_and_merged_runs(args)?;
    let plots = draw_plots(args, &doc)?;
    if let Some(path) = &args.coldscan_json {
        // Named in the report command under "Reproduce" (the default file needs no flag).
        doc["options"]["coldscan_run"] = serde_json::json!({ "json": path.display().to_string() });
    }
    doc["options"]["offcpu_runs"] = args
        .offcpu_json
        .iter()
        .map(|path| serde_json::json!({ "json": path.display().to_string() }))
        .collect();
    let mut markdown = suite::render(&doc, &args.json, &plots);
    for path in &args.offcpu_json {
        let run: Value = serde_json::from_str(&read_text(path)?)
            .map_err(|e| format!("{} is not a suite run's JSON: {e}", path.display()))?;
        if run["options"]["offcpu"].as_bool() != Some(true) {
            return Err(format!("{} is not a suite run made with --offcpu", path.display()).into());
        }
        markdown += &offcpu::render_run(&run, path);
    }
    insert_notes(&mut markdown, &args.note);
    let coldscan_json = match &args.coldscan_json {
        Some(path) => Some(path.clone()),
        None => Some(args.json.with_file_name(COLDSCAN_JSON_FILE_NAME)).filter(|p| p.exists()),
    };
    if let Some(path) = coldscan_json {
        append_coldscan_section(&mut markdown, &path)?;
    }
    let server_json = args.server_json.clone().unwrap_or_else(|| {
        args.json
            .with_file_name(crate::server::DEFAULT_JSON_FILE_NAME)
    });
    append_server_section(&mut markdown, &server_json)?;
    let server_types_json = args.server_types_json.clone().unwrap_or_else(|| {
        args.json
            .with_file_name(crate::server::TYPES_JSON_FILE_NAME)
    });
    append_server_types_section(&mut markdown, &server_types_json)?;
    let replication_json = args.replication_json.clone().unwrap_or_else(|| {
        args.json
            .with_file_name(crate::replication::DEFAULT_JSON_FILE_NAME)
    });
    append_replication_section(&mut markdown, &replication_json)?;
    let cluster_json = args.cluster_json.clone().unwrap_or_else(|| {
        args.json
            .with_file_name(crate::cluster_compare::DEFAULT_JSON_FILE_NAME)
    });
    append_cluster_section(&mut markdown, &cluster_json)?;
    let devices_json = args
        .devices_json
        .clone()
        .unwrap_or_else(|| args.json.with_file_name("devices.jsonl"));
    if devices_json.exists() {
        markdown += "\n";
        markdown += &devices::render(&read_text(&devices_json)?, &devices_json);
    }
    std::fs::write(&args.out, markdown)?;
    println!(
        "wrote {} and {} plot(s) in {}",
        args.out.display(),
        plots.len(),
        args.plots_dir.display()
    );
    Ok(())
}

/// The text of the file at `path`, or an error that names it.
fn read_text(path: &Path) -> Result<String> {
    Ok(
        std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
    )
}

/// The suite's JSON document with the runs of `--gc-json`, `--also-gc-json` and
/// `--sync-json` merged into it (module `merge`).
fn read_suite_and_merged_runs(args: &ReportArgs) -> Result<Value> {
    let mut doc: Value = serde_json::from_str(&read_text(&args.json)?)?;
    if let Some(gc_path) = &args.gc_json {
        let gc = serde_json::from_str(&read_text(gc_path)?)?;
        merge::merge_gc(&mut doc, &gc, gc_path);
    }
    for path in &args.also_gc_json {
        let gc = serde_json::from_str(&read_text(path)?)?;
        merge::add_also_gc(&mut doc, &gc, path);
    }
    if let Some(sync_path) = &args.sync_json {
        let sync = serde_json::from_str(&read_text(sync_path)?)?;
        merge::merge_sync(&mut doc, &sync, sync_path)?;
    }
    if let Some(path) = &args.device_ceiling_json {
        let figures = crate::suite::read_device_ceiling(path)?;
        doc["options"]["device_ceiling_run"] = serde_json::json!({
            "dir": figures["dir"],
            "json": path.display().to_string(),
            "report_json": path.display().to_string(),
        });
        doc["machine"]["device_ceiling"] = figures;
    }
    Ok(doc)
}

/// Draws the plots into `--plots-dir`; their titles and paths as the document links them
/// (relative to `--out`'s directory).
fn draw_plots(args: &ReportArgs, doc: &Value) -> Result<Vec<(String, PathBuf)>> {
    let out_dir = args
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(&args.plots_dir)?;
    let plots = plots::draw(doc, &args.plots_dir)?;
    Ok(plots
        .into_iter()
        .map(|(title, path)| {
            let relative = path.strip_prefix(out_dir).unwrap_or(&path).to_path_buf();
            (title, relative)
        })
        .collect())
}

/// The `--note` remarks as a list after the title and the paragraph under it.
fn insert_notes(markdown: &mut String, notes: &[String]) {
    if notes.is_empty() {
        return;
    }
    let at = markdown.find("\n## ").map_or(markdown.len(), |i| i + 1);
    let mut list = String::from("Notes added when this report was generated:\n\n");
    for note in notes {
        let _ = writeln!(list, "- {note}");
    }
    list.push('\n');
    markdown.insert_str(at, &list);
}

/// Adds the redis-benchmark section (module `server`) when its JSON file exists.
fn append_server_section(markdown: &mut String, path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let doc: Value = serde_json::from_str(&read_text(path)?)
        .map_err(|e| format!("{} is not a server run's JSON: {e}", path.display()))?;
    *markdown += &server::render(&doc, path);
    Ok(())
}

/// Adds a second redis-benchmark section, of a run made for the data-type tests, when its
/// JSON file exists; its headings say so (the first section's are the same words).
fn append_server_types_section(markdown: &mut String, path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let doc: Value = serde_json::from_str(&read_text(path)?)
        .map_err(|e| format!("{} is not a server run's JSON: {e}", path.display()))?;
    let section = server::render(&doc, path)
        .replacen(
            "## Redis protocol: ",
            "## Redis data types (issue 23), a run of its own: ",
            1,
        )
        .replace("\n### ", "\n### Data types: ");
    *markdown += &section;
    Ok(())
}

/// Adds the replication section (module `replication`) when its JSON file exists.
fn append_replication_section(markdown: &mut String, path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let doc: Value = serde_json::from_str(&read_text(path)?)
        .map_err(|e| format!("{} is not a replication run's JSON: {e}", path.display()))?;
    if doc["command"] != "replication" {
        return Err(format!("{} is not a replication run's JSON", path.display()).into());
    }
    *markdown += &replication::render(&doc, path);
    Ok(())
}

/// Adds the Redis Cluster section (module `cluster`) when its JSON file exists.
fn append_cluster_section(markdown: &mut String, path: &Path) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let doc: Value = serde_json::from_str(&read_text(path)?).map_err(|e| {
        format!(
            "{} is not a cluster-compare run's JSON: {e}",
            path.display()
        )
    })?;
    if doc["command"] != "cluster-compare" {
        return Err(format!("{} is not a cluster-compare run's JSON", path.display()).into());
    }
    *markdown += &cluster::render(&doc, path);
    Ok(())
}

/// Adds the "Cold scans" section from the `coldscan` command's JSON file at `path`.
fn append_coldscan_section(markdown: &mut String, path: &Path) -> Result<()> {
    let doc: Value = serde_json::from_str(&read_text(path)?)
        .map_err(|e| format!("{} is not a coldscan run's JSON: {e}", path.display()))?;
    if doc["command"] != "coldscan" {
        return Err(format!("{} is not a coldscan run's JSON", path.display()).into());
    }
    *markdown += &coldscan::render(&doc, path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_section_is_replaced_wherever_it_is() {
        let doc = "# Title\n\n## A\n\na\n\n## Devices: old\n\nold rows\n\n## B\n\nb\n";
        let new = splice_section(doc, "## Devices: ", "## Devices: new\n\nnew rows\n").unwrap();
        assert_eq!(
            new,
            "# Title\n\n## A\n\na\n\n## Devices: new\n\nnew rows\n\n## B\n\nb\n"
        );
        // Last section: up to the end.
        let doc = "# T\n\n## Devices: old\n\nold\n";
        assert_eq!(
            splice_section(doc, "## Devices: ", "## Devices: new\n").unwrap(),
            "# T\n\n## Devices: new\n"
        );
        assert_eq!(splice_section("# T\n\n## A\n", "## Devices: ", "x"), None);
    }
}
