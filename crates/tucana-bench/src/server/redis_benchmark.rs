//! One `redis-benchmark` test (a kind of request at a pipeline depth) against a server,
//! and its figures from the `--csv` output.
//!
//! Owns the invocation and the parsing; the record is the caller's (`super::run_plan`,
//! and the `replication` command's). Single-threaded.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// One test's figures as redis-benchmark reports them (latencies in ms).
#[derive(Debug, PartialEq)]
pub(crate) struct BenchResult {
    pub(crate) requests_per_sec: f64,
    pub(crate) avg_ms: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
    pub(crate) elapsed: Duration,
}

/// What a test asks for: connections (`-c`), requests (`-n`), bytes per value (`-d`) and
/// random keys (`-r`).
pub(crate) struct Shape {
    pub(crate) clients: u64,
    pub(crate) requests: u64,
    pub(crate) value_bytes: u64,
    pub(crate) keys: u64,
}

/// Runs `program` (redis-benchmark) for `test` ("SET", "GET") at `pipeline` against the
/// server on `port`.
pub(crate) fn redis_benchmark(
    program: &Path,
    port: u16,
    shape: &Shape,
    pipeline: u64,
    test: &str,
) -> Result<BenchResult> {
    run(program, port, false, shape, pipeline, test, &[])
}

/// As [`redis_benchmark`] for a command line of our own (`command`, whose
/// `__rand_int__` redis-benchmark replaces with a random 12-digit number below the
/// shape's `keys`), recorded as `test` (its first word: redis-benchmark names the row
/// after the whole line).
pub(crate) fn redis_benchmark_command(
    program: &Path,
    port: u16,
    shape: &Shape,
    pipeline: u64,
    test: &str,
    command: &[String],
) -> Result<BenchResult> {
    run(program, port, false, shape, pipeline, test, command)
}

/// As [`redis_benchmark`], with `--cluster`: the cluster that the server on `port` is
/// part of, each request sent to the master of its key's slot.
pub(crate) fn redis_benchmark_cluster(
    program: &Path,
    port: u16,
    shape: &Shape,
    pipeline: u64,
    test: &str,
) -> Result<BenchResult> {
    run(program, port, true, shape, pipeline, test, &[])
}

/// One invocation: the built-in `test` (`-t`), or `command` when not empty.
fn run(
    program: &Path,
    port: u16,
    cluster: bool,
    shape: &Shape,
    pipeline: u64,
    test: &str,
    command_line: &[String],
) -> Result<BenchResult> {
    let started = Instant::now();
    let mut command = Command::new(program);
    if cluster {
        command.arg("--cluster");
    }
    command
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &shape.clients.to_string()])
        .args(["-n", &shape.requests.to_string()])
        .args(["-d", &shape.value_bytes.to_string()])
        .args(["-r", &shape.keys.to_string()])
        .args(["-P", &pipeline.to_string()])
        .arg("--csv");
    if command_line.is_empty() {
        command.args(["-t", &test.to_ascii_lowercase()]);
    } else {
        command.args(command_line);
    }
    let output = command.stdin(Stdio::null()).output()?;
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "redis-benchmark {test} -P {pipeline} failed ({}): {} {}",
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    let mut result = parse_csv(&stdout, test).ok_or_else(|| {
        format!("redis-benchmark {test} -P {pipeline}: no {test} row in its CSV: {stdout}")
    })?;
    result.elapsed = elapsed;
    Ok(result)
}

/// The row of `test` in redis-benchmark 7's `--csv` output:
/// `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",
/// "p99_latency_ms","max_latency_ms"`, located by the header's names. Lines before the
/// header (`--cluster` prints the masters it found first) are skipped.
fn parse_csv(text: &str, test: &str) -> Option<BenchResult> {
    let split = |line: &str| -> Vec<String> {
        line.split(',')
            .map(|cell| cell.trim().trim_matches('"').to_string())
            .collect()
    };
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("\"test\""));
    let header = split(lines.next()?);
    let row = lines
        .map(split)
        // A command line of our own is named after the whole line.
        .find(|cells| {
            cells
                .first()
                .is_some_and(|c| c == test || c.starts_with(&format!("{test} ")))
        })?;
    let column = |name: &str| -> Option<f64> {
        let at = header.iter().position(|h| h == name)?;
        row.get(at)?.parse().ok()
    };
    Some(BenchResult {
        requests_per_sec: column("rps")?,
        avg_ms: column("avg_latency_ms")?,
        p50_ms: column("p50_latency_ms")?,
        p99_ms: column("p99_latency_ms")?,
        max_ms: column("max_latency_ms")?,
        elapsed: Duration::ZERO,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_of_redis_benchmark_7_parses() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"18691.59\",\"1.445\",\"0.152\",\"0.743\",\"4.863\",\"7.703\",\"21.519\"\n\
                    \"GET\",\"29850.75\",\"1.082\",\"0.176\",\"0.703\",\"3.367\",\"4.359\",\"4.583\"\n";
        let get = parse_csv(text, "GET").unwrap();
        assert_eq!(get.requests_per_sec, 29850.75);
        assert_eq!(get.p50_ms, 0.703);
        assert_eq!(get.p99_ms, 4.359);
        assert_eq!(get.max_ms, 4.583);
        assert_eq!(parse_csv(text, "SET").unwrap().avg_ms, 1.445);
        assert!(parse_csv(text, "INCR").is_none());
        assert!(parse_csv("", "GET").is_none());
        let custom = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                      \"HGETALL rec:__rand_int__\",\"111111.12\",\"0.240\",\"0.064\",\"0.239\",\"0.327\",\"0.439\",\"0.519\"\n";
        assert_eq!(parse_csv(custom, "HGETALL").unwrap().p99_ms, 0.439);
        assert!(parse_csv(custom, "HGET").is_none());
    }

    #[test]
    fn csv_of_redis_benchmark_cluster_parses_after_its_masters() {
        let text = "Cluster has 3 master nodes:\n\n\
                    Master 0: 44484b25e491c5dd6d080cdcaf682321b48767be 127.0.0.1:7303\n\
                    Master 1: 7079a332cddee402f2f0ccffeeb0055a31fcf74e 127.0.0.1:7302\n\n\
                    \"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"39292.73\",\"0.674\",\"0.040\",\"0.335\",\"2.999\",\"6.407\",\"19.839\"\n";
        let set = parse_csv(text, "SET").unwrap();
        assert_eq!(set.requests_per_sec, 39292.73);
        assert_eq!(set.p99_ms, 6.407);
        assert!(parse_csv("Cluster has 3 master nodes:\n", "SET").is_none());
    }
}
