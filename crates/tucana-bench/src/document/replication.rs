//! The "Replication" section of BENCHMARKS.md, from the JSON file of a `tucana-bench
//! replication` run (module `replication`): what ran, issue 18's targets met or missed
//! with the figures behind each, backup CPU per replicated byte and its split, device and
//! network bytes, the primary's throughput and p99 against the unreplicated primary's,
//! the variants of `send-index-1` beside it (acknowledging what the backup synced rather
//! than received; every commit's index shipped rather than folded), the failover, each
//! setup's command lines and the command that reproduces the run.
//!
//! Setups are paired by name: `send-index-N` with `build-index-N`, a variant
//! `send-index-N-VARIANT` with `send-index-N`; issue 18's targets are judged on the
//! `send-index-N` setups alone (the server's defaults).
//!
//! A run of several rounds is shown as the median of the rounds (`server`'s
//! `median_records`; each round's records are in the JSON file).
//!
//! Owns this section's layout and the verdicts; reads only the JSON document.
//! Single-threaded.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::records::distinct;
use super::server::{median_records, setups};
use crate::format::{debug_build_warning, fmt_bytes, fmt_number, number, quoted_notes, shell_args};

/// Issue 18's bounds.
const CPU_RATIO_MAX: f64 = 0.2;
const NETWORK_PER_LOG_BYTE_MAX: f64 = 1.3;
const SET_P16_RATIO_MIN: f64 = 0.7;
const FAILOVER_MS_MAX: f64 = 1000.0;
/// "Backup device reads ≈ 0": at most this many bytes read per user byte written.
const DEVICE_READS_PER_USER_BYTE_MAX: f64 = 0.01;

/// The YCSB phases in the order shown.
const PHASES: [&str; 2] = ["ycsb_load", "ycsb_a"];

/// The median records (one per data set, setup and phase) as the tables read them.
struct Run {
    records: Vec<Value>,
}

impl Run {
    fn new(doc: &Value) -> Run {
        let all: Vec<&Value> = doc["records"]
            .as_array()
            .map(|all| all.iter().collect())
            .unwrap_or_default();
        Run {
            records: median_records(&all),
        }
    }

    fn find(&self, dataset: &str, setup: &str, workload: &str) -> Option<&Value> {
        self.records
            .iter()
            .find(|r| r["dataset"] == dataset && r["engine"] == setup && r["workload"] == workload)
    }

    fn field(&self, dataset: &str, setup: &str, workload: &str, field: &str) -> Option<f64> {
        self.find(dataset, setup, workload)
            .and_then(|r| number(&r[field]))
    }

    /// The YCSB data sets (size mixes), in the order run.
    fn mixes(&self) -> Vec<String> {
        let ycsb: Vec<Value> = self
            .records
            .iter()
            .filter(|r| {
                r["workload"]
                    .as_str()
                    .is_some_and(|w| w.starts_with("ycsb_"))
            })
            .cloned()
            .collect();
        distinct(&ycsb, |r| r["dataset"].as_str().unwrap_or("?").to_string())
    }

    /// The setups, in the order run.
    fn setups(&self) -> Vec<String> {
        distinct(&self.records, |r| {
            r["engine"].as_str().unwrap_or("?").to_string()
        })
    }

    /// The redis-benchmark tests, in the order run.
    fn redis_tests(&self) -> Vec<String> {
        let redis: Vec<Value> = self
            .records
            .iter()
            .filter(|r| r["dataset"] == "redis-benchmark")
            .cloned()
            .collect();
        distinct(&redis, |r| {
            r["workload"].as_str().unwrap_or("?").to_string()
        })
    }

    /// (data set, phase) of every measured phase: the YCSB ones, then redis-benchmark's.
    fn phases(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for mix in self.mixes() {
            for phase in PHASES {
                out.push((mix.clone(), phase.to_string()));
            }
        }
        for test in self.redis_tests() {
            out.push(("redis-benchmark".to_string(), test));
        }
        out.retain(|(d, w)| {
            self.records
                .iter()
                .any(|r| r["dataset"] == *d && r["workload"] == *w)
        });
        out
    }
}

/// The variant that acknowledges what a backup synced (`--repl-ack durable`).
const DURABLE: &str = "durable";
/// The variant that ships every commit's index as it is made (`--repl-index-lag-ms 0`).
const EVERY_COMMIT: &str = "every-commit";

/// A setup's name taken apart: `send-index-1-durable` is a `send-index` setup with 1
/// backup and variant `durable`; `send-index-2` the default with 2 backups. `None` for
/// `unreplicated` and anything else.
fn parse_setup(setup: &str) -> Option<(&str, u32, Option<&str>)> {
    ["send-index", "build-index"].into_iter().find_map(|mode| {
        let rest = setup.strip_prefix(mode)?.strip_prefix('-')?;
        let (count, variant) = match rest.split_once('-') {
            Some((count, variant)) => (count, Some(variant)),
            None => (rest, None),
        };
        Some((mode, count.parse().ok()?, variant))
    })
}

/// Any send-index setup, variants included.
fn is_send_index(setup: &str) -> bool {
    parse_setup(setup).is_some_and(|(mode, _, _)| mode == "send-index")
}

/// A send-index setup with the server's defaults (`send-index-N`): the ones issue 18's
/// targets are judged on.
fn is_default_send_index(setup: &str) -> bool {
    matches!(parse_setup(setup), Some(("send-index", _, None)))
}

/// The default send-index setup a variant varies (`send-index-1-durable` →
/// `send-index-1`).
fn default_of(setup: &str) -> Option<String> {
    match parse_setup(setup)? {
        ("send-index", n, Some(_)) => Some(format!("send-index-{n}")),
        _ => None,
    }
}

/// The build-index setup a send-index setup's backup CPU is compared with: the one with
/// as many backups. Only for setups whose difference from it is the kind of backup: the
/// defaults, and every-commit (a build-index backup is shipped no index, so folding
/// changes nothing for it); not `durable` (its backups sync what build-index-N's do not).
fn build_counterpart(setup: &str) -> Option<String> {
    match parse_setup(setup)? {
        ("send-index", n, None | Some(EVERY_COMMIT)) => Some(format!("build-index-{n}")),
        _ => None,
    }
}

/// The Markdown section for BENCHMARKS.md from a `replication` run's JSON document.
pub(super) fn render(doc: &Value, json_path: &Path) -> String {
    let options = &doc["options"];
    let run = Run::new(doc);
    let mut md = String::new();
    what_ran(&mut md, options, json_path);
    if doc["debug_build"].as_bool() == Some(true)
        || options["tucana_binary"]
            .as_str()
            .is_some_and(|p| p.contains("/debug/"))
    {
        md += &debug_build_warning("these numbers");
    }
    if options["quick"].as_bool() == Some(true) {
        md += "**A `--quick` smoke run: the counts are too small to mean anything.**\n\n";
    }
    quoted_notes(&mut md, &options["notes"]);
    let _ = writeln!(
        md,
        "Load average (1, 5, 15 min) before the run: {}; after: {} (each record has its own in \
         the JSON file).\n",
        options["load_average_before"].as_str().unwrap_or("?"),
        options["load_average_after"].as_str().unwrap_or("?")
    );
    if options["rounds"].as_u64().is_some_and(|r| r > 1) {
        let _ = writeln!(
            md,
            "{} rounds, each running every setup in turn; the figures are the median of the \
             rounds.\n",
            options["rounds"]
        );
    }
    targets(&mut md, &run);
    cpu_table(&mut md, &run);
    bytes_table(&mut md, &run);
    throughput_table(&mut md, &run);
    ack_comparison(&mut md, &run);
    folding_comparison(&mut md, &run);
    failover_table(&mut md, &run);
    setups(&mut md, options);
    reproduce(&mut md, options);
    md
}

/// The heading and the paragraph on what ran and how it was measured.
fn what_ran(md: &mut String, options: &Value, json_path: &Path) {
    *md += "## Replication: send-index and build-index backups\n\n";
    let _ = writeln!(
        md,
        "From `{}`, written by one `tucana-bench replication` run. A primary alone, with one \
         and with two backups, each a separate `tucana serve` process on this machine with a \
         fresh volume: **send-index** backups store the shipped log and apply the index \
         nodes each commit of the primary ships (Talos), **build-index** backups \
         (`--repl-build-index`) parse the shipped records and insert them into an index of \
         their own, as Redis replicas do. Sync durability: a write is answered once durable \
         on the primary and received by every backup. For each of Talos's size mixes run \
         ({}; small = 33-byte, medium = 123-byte, large = 1023-byte key-value pairs), every \
         setup in turn ran YCSB Load ({} records, pipelined batches of {} SETs) and YCSB A \
         ({} operations, half GETs, half SETs, zipfian) through the primary with {} client \
         connections{}{}. Around every phase the harness waited \
         until no backup lagged and made the writes committed (`SAVE` on the primary, applied \
         by every send-index backup; `SAVE` on a build-index backup, its own commit), so a \
         phase's figures include the commit that covers its writes. Tucana: {}; redis-benchmark: {}.\n",
        json_path.display(),
        list(&options["mixes"]),
        options["records"],
        options["load_batch"],
        options["operations"],
        options["threads"],
        redis_phrase(options),
        if options["failover_bytes"].as_u64().is_some_and(|b| b > 0) {
            "; then a failover"
        } else {
            ""
        },
        options["tucana_version"].as_str().unwrap_or("?"),
        options["redis_benchmark_version"]
            .as_str()
            .unwrap_or("not run")
            .trim_start_matches("redis-benchmark "),
    );
    variants_sentence(md, options);
    *md += "What is measured, per phase: a backup's CPU is its process's user + system time, \
            all threads (/proc/PID/stat), split by the backup's own thread clocks into *log* \
            (storing shipped log bytes; a build-index backup: applying their records to its \
            index and log; the backup times one shipped log frame in 16 and counts it 16 \
            times, a thread clock read being a system call), *index* (applying shipped commits: rewriting and writing nodes) and \
            *rest* (receiving and decoding frames, acknowledging, syncing, its own commits and \
            collector); a replicated byte is a log byte the backup received. Device bytes are \
            what each process made the block device read and write (/proc/PID/io). Network \
            bytes are the TCP payload bytes of a replication connection, both directions \
            (`ss -ti`), divided by the log bytes the primary shipped on it or by the user bytes \
            (keys and values written). Throughput and latency are the clients' (the YCSB \
            driver's, checked reads included; a Load latency is one batch's).\n\n";
}

/// The paragraph on the setups that vary one flag of a default's primary, when the run
/// had any.
fn variants_sentence(md: &mut String, options: &Value) {
    let names: Vec<&str> = options["setups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut parts = Vec::new();
    for name in &names {
        let flag = match parse_setup(name) {
            Some(("send-index", _, Some(DURABLE))) => {
                "`--repl-ack durable` on the primary (a backup acknowledges a write once it \
                 has synced it, not once it has received it)"
            }
            Some(("send-index", _, Some(EVERY_COMMIT))) => {
                "`--repl-index-lag-ms 0` on the primary (every commit's index is shipped as it \
                 is made, none folded into later commits)"
            }
            _ => continue,
        };
        let default = default_of(name).unwrap_or_default();
        parts.push(format!("`{name}` is `{default}` with {flag}"));
    }
    if !parts.is_empty() {
        let _ = writeln!(md, "{}.\n", parts.join("; "));
    }
}

/// "; then redis-benchmark SETs (...)" when the run had them.
fn redis_phrase(options: &Value) -> String {
    if options["redis_pipelines"]
        .as_array()
        .is_none_or(|p| p.is_empty())
    {
        return String::new();
    }
    format!(
        "; then redis-benchmark SETs ({} requests, {} connections, {}-byte values, {} random \
         keys, pipelines {})",
        options["redis_requests"],
        options["redis_clients"],
        options["redis_value_bytes"],
        options["redis_keyspace"],
        list(&options["redis_pipelines"]),
    )
}

/// A JSON list as "a, b, c".
fn list(value: &Value) -> String {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|| "?".to_string())
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "**met**",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

/// "### Issue 18's targets": one row per target with the figures it was judged on.
fn targets(md: &mut String, run: &Run) {
    *md += "### Issue 18's targets\n\n";
    if run.setups().iter().any(|s| default_of(s).is_some()) {
        *md += "Judged on the setups with the server's defaults (send-index-N: the backup \
                acknowledges what it received, commits are folded); the variants of \
                send-index-1 are in the tables after.\n\n";
    }
    *md += "| target | measured | verdict |\n|---|---|---|\n";
    let (text, met) = cpu_target(run);
    let _ = writeln!(
        md,
        "| backup CPU per replicated byte ≤ 1/5 of a build-index backup's (send-index-N ÷ build-index-N, same phase) | {text} | {} |",
        verdict(met)
    );
    let (text, met) = device_read_target(run);
    let _ = writeln!(
        md,
        "| backup device reads ≈ 0 (here: ≤ {DEVICE_READS_PER_USER_BYTE_MAX} bytes read per user byte written) | {text} | {} |",
        verdict(met)
    );
    let (text, met) = network_target(run);
    let _ = writeln!(
        md,
        "| network bytes ≤ {NETWORK_PER_LOG_BYTE_MAX}× the log bytes (send-index-N) | {text} | {} |",
        verdict(met)
    );
    let (text, met) = set_target(run);
    let _ = writeln!(
        md,
        "| replicated sync SETs (redis-benchmark -P 16) ≥ {SET_P16_RATIO_MIN}× unreplicated (send-index-N) | {text} | {} |",
        verdict(met)
    );
    let (text, met) = failover_target(run);
    let _ = writeln!(
        md,
        "| failover (promotion to first acknowledged write) under 1 s plus log replay | {text} | {} |",
        verdict(met)
    );
    *md += "\n";
}

/// Every (data set, phase, send-index setup) with its send ÷ build CPU ratio.
fn cpu_ratios(run: &Run) -> Vec<(String, String, String, f64)> {
    let mut out = Vec::new();
    for (dataset, phase) in run.phases() {
        for setup in run.setups().iter().filter(|s| is_send_index(s)) {
            let Some(build) = build_counterpart(setup) else {
                continue;
            };
            let field = "backup_cpu_ns_per_log_byte";
            if let (Some(a), Some(b)) = (
                run.field(&dataset, setup, &phase, field),
                run.field(&dataset, &build, &phase, field),
            ) {
                if b > 0.0 {
                    out.push((dataset.clone(), phase.clone(), setup.clone(), a / b));
                }
            }
        }
    }
    out
}

fn cpu_target(run: &Run) -> (String, Option<bool>) {
    let mut ratios = cpu_ratios(run);
    ratios.retain(|(_, _, setup, _)| is_default_send_index(setup));
    if ratios.is_empty() {
        return ("–".into(), None);
    }
    let cells: Vec<String> = ratios
        .iter()
        .map(|(d, p, s, r)| format!("{d} {p} {s}: {r:.2}"))
        .collect();
    let worst = ratios.iter().map(|r| r.3).fold(f64::MIN, f64::max);
    (
        format!("worst {worst:.2}; {}", cells.join(", ")),
        Some(worst <= CPU_RATIO_MAX),
    )
}

/// The largest value of `field` over the default send-index setups' records, with where
/// it was.
fn worst_send_index(run: &Run, field: &str) -> Option<(f64, String)> {
    run.records
        .iter()
        .filter(|r| r["engine"].as_str().is_some_and(is_default_send_index))
        .filter_map(|r| {
            let where_ = format!(
                "{} {} {}",
                r["dataset"].as_str().unwrap_or("?"),
                r["workload"].as_str().unwrap_or("?"),
                r["engine"].as_str().unwrap_or("?")
            );
            Some((number(&r[field])?, where_))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

fn device_read_target(run: &Run) -> (String, Option<bool>) {
    match worst_send_index(run, "backup_device_read_bytes_per_user_byte") {
        Some((worst, at)) => {
            let bytes = worst_send_index(run, "backup_device_read_bytes")
                .map_or("?".into(), |(b, _)| fmt_bytes(b as u64));
            (
                format!("at most {worst:.4} B per user byte ({at}); at most {bytes} read by a backup in a phase"),
                Some(worst <= DEVICE_READS_PER_USER_BYTE_MAX),
            )
        }
        None => ("–".into(), None),
    }
}

fn network_target(run: &Run) -> (String, Option<bool>) {
    match worst_send_index(run, "network_bytes_per_log_byte") {
        Some((worst, at)) => {
            let per_phase: Vec<String> = run
                .phases()
                .iter()
                .filter_map(|(d, p)| {
                    let v = run.field(d, "send-index-1", p, "network_bytes_per_log_byte")?;
                    Some(format!("{d} {p}: {v:.2}"))
                })
                .collect();
            (
                format!(
                    "worst {worst:.2} ({at}); send-index-1: {}",
                    per_phase.join(", ")
                ),
                Some(worst <= NETWORK_PER_LOG_BYTE_MAX),
            )
        }
        None => ("–".into(), None),
    }
}

fn set_target(run: &Run) -> (String, Option<bool>) {
    let test = "redis-SET-P16";
    let Some(base) = run.field("redis-benchmark", "unreplicated", test, "ops_per_sec") else {
        return ("–".into(), None);
    };
    let mut cells = Vec::new();
    let mut worst: Option<f64> = None;
    for setup in run.setups().iter().filter(|s| *s != "unreplicated") {
        if let Some(ops) = run.field("redis-benchmark", setup, test, "ops_per_sec") {
            let ratio = ops / base.max(1e-9);
            cells.push(format!("{setup} {ratio:.2}"));
            if is_default_send_index(setup) {
                worst = Some(worst.map_or(ratio, |w: f64| w.min(ratio)));
            }
        }
    }
    (
        format!(
            "÷ unreplicated ({} requests/s): {}",
            fmt_number(Some(base)),
            cells.join(", ")
        ),
        worst.map(|w| w >= SET_P16_RATIO_MIN),
    )
}

fn failover_target(run: &Run) -> (String, Option<bool>) {
    let Some(r) = run.records.iter().find(|r| r["workload"] == "failover") else {
        return ("–".into(), None);
    };
    let ms = number(&r["failover_ms"]);
    let text = format!(
        "{} ms with {} of data; it replayed {} of log written after the last commit ({} MiB/s \
         over the whole failover)",
        fmt_number(ms),
        r["data_bytes"].as_u64().map_or("?".into(), fmt_bytes),
        r["replay_log_bytes"]
            .as_u64()
            .map_or("an unknown amount".into(), fmt_bytes),
        fmt_number(number(&r["replay_bytes_per_sec"]).map(|b| b / f64::from(1 << 20))),
    );
    // Under 1 s with the replay included is under 1 s plus the replay.
    (text, ms.map(|ms| ms <= FAILOVER_MS_MAX))
}

/// "### Backup CPU per replicated byte": every phase and replicated setup.
fn cpu_table(md: &mut String, run: &Run) {
    *md += "### Backup CPU per replicated byte\n\n";
    *md += "ns of backup CPU per log byte the backup received (over all backups of the setup), \
            and its split; µs per operation is one backup's CPU per client operation; send ÷ \
            build is the send-index backups' total over the build-index backups' in the same \
            phase with as many backups (issue 18: ≤ 0.2; not for the durable variant, whose \
            backup syncs what a build-index backup here does not).\n\n";
    *md += "| data | phase | setup | total ns/B | log ns/B | index ns/B | rest ns/B | backup CPU µs/op | send ÷ build |\n";
    *md += "|---|---|---|---|---|---|---|---|---|\n";
    let ratios = cpu_ratios(run);
    for (dataset, phase) in run.phases() {
        for setup in run.setups().iter().filter(|s| *s != "unreplicated") {
            let Some(r) = run.find(&dataset, setup, &phase) else {
                continue;
            };
            let ratio = ratios
                .iter()
                .find(|x| x.0 == dataset && x.1 == phase && x.2 == *setup)
                .map(|x| x.3);
            let _ = writeln!(
                md,
                "| {dataset} | {phase} | {setup} | {} | {} | {} | {} | {} | {} |",
                fmt_number(number(&r["backup_cpu_ns_per_log_byte"])),
                fmt_number(number(&r["backup_log_cpu_ns_per_log_byte"])),
                fmt_number(number(&r["backup_index_cpu_ns_per_log_byte"])),
                fmt_number(number(&r["backup_other_cpu_ns_per_log_byte"])),
                fmt_number(number(&r["backup_cpu_us_per_op"])),
                fmt_number(ratio),
            );
        }
    }
    *md += "\n";
}

/// "### Device and network bytes": every phase and replicated setup.
fn bytes_table(md: &mut String, run: &Run) {
    *md += "### Device and network bytes\n\n";
    *md += "Per user byte: ÷ the keys and values the clients wrote in the phase, per backup. \
            Index ÷ log: the index bytes the primary shipped over the log bytes. The \
            primary's own device bytes written per user byte are in the last column.\n\n";
    *md += "| data | phase | setup | backup written B/user B | backup read B/user B | backup read (each) | index B ÷ log B | network B ÷ log B | network B/user B | primary written B/user B |\n";
    *md += "|---|---|---|---|---|---|---|---|---|---|\n";
    for (dataset, phase) in run.phases() {
        for setup in run.setups() {
            let Some(r) = run.find(&dataset, &setup, &phase) else {
                continue;
            };
            let _ = writeln!(
                md,
                "| {dataset} | {phase} | {setup} | {} | {} | {} | {} | {} | {} | {} |",
                fmt_number(number(&r["backup_device_write_bytes_per_user_byte"])),
                number(&r["backup_device_read_bytes_per_user_byte"])
                    .map_or("–".into(), |v| format!("{v:.4}")),
                number(&r["backup_device_read_bytes"])
                    .map_or("–".into(), |b| fmt_bytes(b as u64)),
                fmt_number(number(&r["index_bytes_per_log_byte"])),
                fmt_number(number(&r["network_bytes_per_log_byte"])),
                fmt_number(number(&r["network_bytes_per_user_byte"])),
                fmt_number(number(&r["io_amp_write"])),
            );
        }
    }
    *md += "\n";
}

/// "### Primary throughput and p99": every phase and setup, and the ratios to the
/// unreplicated primary's.
fn throughput_table(md: &mut String, run: &Run) {
    *md += "### Primary throughput and p99, replicated ÷ unreplicated\n\n";
    *md += "Throughput and p99 latency as the clients saw them (redis-benchmark's for its \
            tests); ÷ unreplicated: over the primary alone in the same phase. Primary CPU: \
            the primary process's user + system time per operation.\n\n";
    *md += "| data | phase | setup | ops/s | ÷ unreplicated | p99 µs | ÷ unreplicated | primary CPU µs/op |\n";
    *md += "|---|---|---|---|---|---|---|---|\n";
    for (dataset, phase) in run.phases() {
        let base = |field: &str| run.field(&dataset, "unreplicated", &phase, field);
        for setup in run.setups() {
            let Some(r) = run.find(&dataset, &setup, &phase) else {
                continue;
            };
            let over = |field: &str| {
                let ours = number(&r[field])?;
                base(field).filter(|b| *b > 0.0).map(|b| ours / b)
            };
            let _ = writeln!(
                md,
                "| {dataset} | {phase} | {setup} | {} | {} | {} | {} | {} |",
                fmt_number(number(&r["ops_per_sec"])),
                fmt_number(over("ops_per_sec")),
                fmt_number(number(&r["p99_us"])),
                fmt_number(over("p99_us")),
                fmt_number(number(&r["cpu_us_per_op"])),
            );
        }
    }
    *md += "\n";
}

/// Every (variant setup, its default) of the run whose variant is `variant`, in the order
/// run.
fn variant_pairs(run: &Run, variant: &str) -> Vec<(String, String)> {
    let setups = run.setups();
    setups
        .iter()
        .filter(|s| parse_setup(s).is_some_and(|(_, _, v)| v == Some(variant)))
        .filter_map(|s| {
            let default = default_of(s)?;
            setups.contains(&default).then(|| (s.clone(), default))
        })
        .collect()
}

/// `a ÷ b` of two figures, when both are there and `b` is not 0.
fn over(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b.filter(|b| *b > 0.0)?)
}

/// "### Acknowledgement: received or durable": the primary's throughput and p99 with a
/// backup that acknowledges what it synced beside the default's, phase by phase.
fn ack_comparison(md: &mut String, run: &Run) {
    let pairs = variant_pairs(run, DURABLE);
    if pairs.is_empty() {
        return;
    }
    *md += "### Acknowledgement: received or durable\n\n";
    for (durable, received) in pairs {
        let _ = writeln!(
            md,
            "`{received}` (the default, `--repl-ack received`: a backup acknowledges a write \
             once it has received it) beside `{durable}` (`--repl-ack durable`: once it has \
             synced it to its volume), in the same run: the primary's throughput and p99 as \
             the clients saw them, and durable ÷ received.\n"
        );
        *md += "| data | phase | received ops/s | durable ops/s | ÷ received | received p99 µs | durable p99 µs | ÷ received |\n";
        *md += "|---|---|---|---|---|---|---|---|\n";
        for (dataset, phase) in run.phases() {
            let get = |setup: &str, field: &str| run.field(&dataset, setup, &phase, field);
            let (ops, p99) = (
                [get(&received, "ops_per_sec"), get(&durable, "ops_per_sec")],
                [get(&received, "p99_us"), get(&durable, "p99_us")],
            );
            if ops.iter().all(Option::is_none) {
                continue;
            }
            let _ = writeln!(
                md,
                "| {dataset} | {phase} | {} | {} | {} | {} | {} | {} |",
                fmt_number(ops[0]),
                fmt_number(ops[1]),
                fmt_number(over(ops[1], ops[0])),
                fmt_number(p99[0]),
                fmt_number(p99[1]),
                fmt_number(over(p99[1], p99[0])),
            );
        }
        *md += "\n";
    }
}

/// "### Folding commits or shipping every commit's index": what folding saves the
/// network and the backup, phase by phase.
fn folding_comparison(md: &mut String, run: &Run) {
    let pairs = variant_pairs(run, EVERY_COMMIT);
    if pairs.is_empty() {
        return;
    }
    *md += "### Folding commits or shipping every commit's index\n\n";
    let ratios = cpu_ratios(run);
    for (every, folding) in pairs {
        let _ = writeln!(
            md,
            "`{folding}` (the default: the primary folds a commit whose index would cost more \
             than a fifth of the log it covers into later ones, for up to \
             `--repl-index-lag-ms` 60000 and `--repl-index-lag-bytes` 256 MiB; the `SAVE` that \
             ends each phase ships at once) beside `{every}` (`--repl-index-lag-ms 0`: every \
             commit's index shipped as it is made), in the same run; each cell is every \
             commit / folding, each figure as defined in the tables above; send ÷ build \
             over `{}` in the same phase.\n",
            build_counterpart(&folding).unwrap_or_default()
        );
        *md += "| data | phase | network B ÷ log B | backup CPU ns/B | of it index ns/B | backup CPU send ÷ build | backup written B/user B |\n";
        *md += "|---|---|---|---|---|---|---|\n";
        for (dataset, phase) in run.phases() {
            if run.find(&dataset, &every, &phase).is_none() {
                continue;
            }
            let pair = |field: &str| {
                let [a, b] = [&every, &folding].map(|s| run.field(&dataset, s, &phase, field));
                format!("{} / {}", fmt_number(a), fmt_number(b))
            };
            let ratio = |setup: &str| {
                ratios
                    .iter()
                    .find(|x| x.0 == dataset && x.1 == phase && x.2 == setup)
                    .map(|x| x.3)
            };
            let _ = writeln!(
                md,
                "| {dataset} | {phase} | {} | {} | {} | {} / {} | {} |",
                pair("network_bytes_per_log_byte"),
                pair("backup_cpu_ns_per_log_byte"),
                pair("backup_index_cpu_ns_per_log_byte"),
                fmt_number(ratio(&every)),
                fmt_number(ratio(&folding)),
                pair("backup_device_write_bytes_per_user_byte"),
            );
        }
        *md += "\n";
    }
}

/// "### Failover": the loaded region, the tail and the times.
fn failover_table(md: &mut String, run: &Run) {
    let Some(r) = run.records.iter().find(|r| r["workload"] == "failover") else {
        return;
    };
    *md += "### Failover\n\n";
    let _ = writeln!(
        md,
        "A primary with one send-index backup: {} keys of {}-byte values ({} of keys and values) \
         loaded, committed (`SAVE`, applied by the backup), then {} more written that no commit \
         covered ({} try/tries until no timed commit of the primary took part of it), then \
         `kill -9` of the primary. Failover time: from sending `REPLICAOF NO ONE` to the backup \
         until it acknowledged a `SET`; the promotion replayed the log bytes the backup had \
         received after the last commit it applied (from its page cache: a live backup has just \
         received them).\n",
        r["keys"],
        r["value_bytes"],
        r["data_bytes"].as_u64().map_or("?".into(), fmt_bytes),
        r["tail_user_bytes"].as_u64().map_or("?".into(), fmt_bytes),
        r["tail_tries"],
    );
    *md += "| data | log replayed | promotion ms | first write acknowledged ms | replay rate MiB/s (whole failover) | load MiB/s |\n|---|---|---|---|---|---|\n";
    let _ = writeln!(
        md,
        "| {} | {} | {} | {} | {} | {} |\n",
        r["data_bytes"].as_u64().map_or("?".into(), fmt_bytes),
        r["replay_log_bytes"]
            .as_u64()
            .map_or("unknown".into(), fmt_bytes),
        fmt_number(number(&r["promote_ms"])),
        fmt_number(number(&r["failover_ms"])),
        fmt_number(number(&r["replay_bytes_per_sec"]).map(|b| b / f64::from(1 << 20))),
        fmt_number(number(&r["load_bytes_per_sec"]).map(|b| b / f64::from(1 << 20))),
    );
}

/// "### Reproduce": the run's command, through `scripts/bench-replication.sh`.
fn reproduce(md: &mut String, options: &Value) {
    *md += "### Reproduce\n\n```sh\nscripts/server-deps.sh --bench   # redis-benchmark (Debian/Ubuntu, as root)\n";
    let args = shell_args(&options["argv"], 2).unwrap_or_default();
    let _ = writeln!(md, "scripts/bench-replication.sh {args}");
    *md += "```\n\n";
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(setup: &str, dataset: &str, workload: &str, extra: Value) -> Value {
        let mut r = json!({"engine": setup, "dataset": dataset, "workload": workload});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        r
    }

    #[test]
    fn section_judges_every_target() {
        let doc = json!({
            "options": {
                "argv": ["/x/tucana-bench", "replication", "--dir", "/var/tmp/r"],
                "mixes": ["small"], "records": 10, "operations": 10, "threads": 2,
                "load_batch": 5, "redis_pipelines": [16], "tucana_version": "tucana 0.1.0",
                "load_average_before": "1.00 1.00 1.00", "notes": ["shared"],
                "configurations": {"send-index-1": ["tucana --db DIR/b serve", "tucana --db DIR/p serve"]},
            },
            "records": [
                rec("unreplicated", "small", "ycsb_load", json!({"ops_per_sec": 100.0, "p99_us": 10.0})),
                rec("send-index-1", "small", "ycsb_load", json!({"ops_per_sec": 80.0, "p99_us": 20.0,
                    "backup_cpu_ns_per_log_byte": 1.0, "network_bytes_per_log_byte": 1.1,
                    "backup_device_read_bytes_per_user_byte": 0.0, "backup_device_read_bytes": 0.0})),
                rec("build-index-1", "small", "ycsb_load", json!({"ops_per_sec": 60.0,
                    "backup_cpu_ns_per_log_byte": 10.0, "network_bytes_per_log_byte": 1.0})),
                rec("unreplicated", "redis-benchmark", "redis-SET-P16", json!({"ops_per_sec": 1000.0})),
                rec("send-index-1", "redis-benchmark", "redis-SET-P16", json!({"ops_per_sec": 600.0,
                    "network_bytes_per_log_byte": 1.5})),
                rec("send-index-1", "failover", "failover", json!({"failover_ms": 120.0,
                    "data_bytes": 1u64 << 30, "replay_log_bytes": 1u64 << 20,
                    "replay_bytes_per_sec": 8.0 * f64::from(1 << 20), "keys": 5, "value_bytes": 1000,
                    "tail_user_bytes": 1u64 << 20, "tail_tries": 2})),
            ],
        });
        let md = render(&doc, Path::new("bench/replication-results.json"));
        assert!(
            md.contains("small ycsb_load send-index-1: 0.10 | **met** |"),
            "{md}"
        );
        assert!(
            md.contains("worst 1.50 (redis-benchmark redis-SET-P16 send-index-1)"),
            "{md}"
        );
        assert!(md.contains("send-index-1 0.60 | **missed** |"), "{md}");
        assert!(md.contains("120.0 ms with 1.0 GiB of data"), "{md}");
        assert!(
            md.contains("| small | ycsb_load | send-index-1 | 80.0 | 0.80 | 20.0 | 2.00 |"),
            "{md}"
        );
        assert!(
            md.contains("| small | ycsb_load | send-index-1 | 1.00 | – | – | – | – | 0.10 |"),
            "{md}"
        );
        assert!(
            md.contains("scripts/bench-replication.sh --dir /var/tmp/r"),
            "{md}"
        );
        assert!(md.contains("> shared"), "{md}");
        assert!(!md.contains("### Acknowledgement"), "{md}");
        assert!(!md.contains("### Folding commits"), "{md}");
    }

    #[test]
    fn variants_pair_with_their_default_and_never_with_a_build_index_setup_they_differ_from() {
        assert_eq!(
            parse_setup("send-index-1-every-commit"),
            Some(("send-index", 1, Some("every-commit")))
        );
        assert_eq!(parse_setup("build-index-2"), Some(("build-index", 2, None)));
        assert_eq!(parse_setup("unreplicated"), None);
        assert_eq!(parse_setup("send-index-x"), None);
        assert!(is_default_send_index("send-index-2"));
        assert!(!is_default_send_index("send-index-1-durable"));
        assert!(is_send_index("send-index-1-durable"));
        assert!(!is_send_index("build-index-1"));
        assert_eq!(
            build_counterpart("send-index-2").as_deref(),
            Some("build-index-2")
        );
        assert_eq!(
            build_counterpart("send-index-1-every-commit").as_deref(),
            Some("build-index-1")
        );
        assert_eq!(build_counterpart("send-index-1-durable"), None);
        assert_eq!(build_counterpart("build-index-1"), None);
        assert_eq!(
            default_of("send-index-1-durable").as_deref(),
            Some("send-index-1")
        );
        assert_eq!(default_of("send-index-1"), None);
    }

    #[test]
    fn targets_ignore_the_variants_and_the_comparisons_show_them() {
        let cpu = |ns: f64, index: f64, net: f64, written: f64| {
            json!({"backup_cpu_ns_per_log_byte": ns, "backup_index_cpu_ns_per_log_byte": index,
                   "network_bytes_per_log_byte": net, "backup_device_write_bytes_per_user_byte": written,
                   "backup_device_read_bytes_per_user_byte": 0.0, "backup_device_read_bytes": 0.0})
        };
        let with = |mut a: Value, b: Value| {
            for (k, v) in b.as_object().unwrap() {
                a[k] = v.clone();
            }
            a
        };
        let doc = json!({
            "options": {
                "setups": ["unreplicated", "send-index-1", "send-index-1-durable",
                           "send-index-1-every-commit", "build-index-1"],
                "mixes": ["small"], "redis_pipelines": [16],
            },
            "records": [
                rec("unreplicated", "small", "ycsb_a", json!({"ops_per_sec": 100.0, "p99_us": 10.0})),
                rec("send-index-1", "small", "ycsb_a", with(cpu(1.0, 0.25, 1.2, 2.0),
                    json!({"ops_per_sec": 80.0, "p99_us": 20.0}))),
                rec("send-index-1-durable", "small", "ycsb_a", with(cpu(3.0, 0.5, 1.25, 2.5),
                    json!({"ops_per_sec": 40.0, "p99_us": 50.0}))),
                rec("send-index-1-every-commit", "small", "ycsb_a", with(cpu(4.0, 2.0, 9.0, 4.0),
                    json!({"ops_per_sec": 70.0, "p99_us": 30.0}))),
                rec("build-index-1", "small", "ycsb_a", cpu(10.0, 0.0, 1.0, 2.0)),
                rec("unreplicated", "redis-benchmark", "redis-SET-P16", json!({"ops_per_sec": 1000.0})),
                rec("send-index-1", "redis-benchmark", "redis-SET-P16", json!({"ops_per_sec": 900.0})),
                rec("send-index-1-durable", "redis-benchmark", "redis-SET-P16",
                    json!({"ops_per_sec": 450.0, "p99_us": 7.0})),
            ],
        });
        let md = render(&doc, Path::new("r.json"));
        // Every target on send-index-1 alone: the variants' worse figures do not count.
        assert!(
            md.contains("worst 0.10; small ycsb_a send-index-1: 0.10 | **met** |"),
            "{md}"
        );
        assert!(
            md.contains("worst 1.20 (small ycsb_a send-index-1)"),
            "{md}"
        );
        assert!(
            md.contains("send-index-1 0.90, send-index-1-durable 0.45 | **met** |"),
            "{md}"
        );
        // The CPU table: every-commit over build-index-1, durable over nothing.
        assert!(
            md.contains(
                "| small | ycsb_a | send-index-1-every-commit | 4.00 | – | 2.00 | – | – | 0.40 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| small | ycsb_a | send-index-1-durable | 3.00 | – | 0.50 | – | – | – |"),
            "{md}"
        );
        assert!(
            md.contains("`send-index-1-durable` is `send-index-1` with `--repl-ack durable`"),
            "{md}"
        );
        assert!(
            md.contains("### Acknowledgement: received or durable"),
            "{md}"
        );
        assert!(
            md.contains("| small | ycsb_a | 80.0 | 40.0 | 0.50 | 20.0 | 50.0 | 2.50 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| redis-benchmark | redis-SET-P16 | 900.0 | 450.0 | 0.50 | – | 7.00 | – |"
            ),
            "{md}"
        );
        assert!(
            md.contains("### Folding commits or shipping every commit's index"),
            "{md}"
        );
        assert!(md.contains("| small | ycsb_a | 9.00 / 1.20 | 4.00 / 1.00 | 2.00 / 0.25 | 0.40 / 0.10 | 4.00 / 2.00 |"), "{md}");
        // No every-commit record for redis-benchmark: no row.
        assert!(
            !md.contains("| redis-benchmark | redis-SET-P16 | – / "),
            "{md}"
        );
    }
}
