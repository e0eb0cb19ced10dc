//! A few kill -9 cycles end to end: the driver binary spawns the real `tucana` writer,
//! kills it, reopens and verifies; the run must pass and print its figure line.

use std::path::PathBuf;
use std::process::Command;

/// The `tucana` binary next to the driver, built first when this package is tested alone
/// (cargo builds only the tested package's binaries for its integration tests).
fn tucana_binary() -> PathBuf {
    let driver = PathBuf::from(env!("CARGO_BIN_EXE_tucana-crashtest"));
    let tucana = driver.with_file_name(format!("tucana{}", std::env::consts::EXE_SUFFIX));
    if !tucana.is_file() {
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "-p", "tucana-cli", "--bin", "tucana"]);
        // The driver sits in target/<profile>/; build the writer into the same place.
        if driver.parent().and_then(|p| p.file_name()) == Some("release".as_ref()) {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "building the tucana binary failed");
    }
    assert!(tucana.is_file(), "no tucana binary at {}", tucana.display());
    tucana
}

/// Runs `tucana-crashtest kill9` with `args` in `work` against the built `tucana`;
/// asserts it succeeded and returns its standard output.
fn run_kill9(work: &std::path::Path, args: &[&str]) -> String {
    let tucana = tucana_binary();
    let output = Command::new(env!("CARGO_BIN_EXE_tucana-crashtest"))
        .arg("kill9")
        .args(args)
        .args(["--progress", "0"])
        .arg("--dir")
        .arg(work)
        .arg("--tucana")
        .arg(&tucana)
        .output()
        .expect("run tucana-crashtest");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

#[test]
fn a_few_kill_cycles_pass_and_print_the_figure_line() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let work = dir.path().join("run");
    let stdout = run_kill9(&work, &["--cycles", "12", "--seed", "7"]);
    let line = stdout.trim();
    assert!(
        line.starts_with(
            "M3 kill cycles: 12, lost durable writes: 0, non-prefix states: 0, check failures: 0, gc cycles: "
        ) && line.ends_with(", seed: 7"),
        "{line}"
    );
    // Seed 7 draws both kinds of writer.
    let gc_cycles = figure(line, "gc cycles: ");
    assert!(0 < gc_cycles && gc_cycles < 12, "{line}");
    // The volume really was written to and survived every cycle.
    assert!(work.join("kill9.tucana").is_file());
}

/// The number after `label` in a figure line.
fn figure(line: &str, label: &str) -> u64 {
    let at = line
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {line}"))
        + label.len();
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {label:?} in {line}"))
}

#[test]
fn gc_heavy_cycles_kill_a_collector_at_work() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let stdout = run_kill9(
        &dir.path().join("run"),
        &["--cycles", "10", "--seed", "11", "--gc-percent", "100"],
    );
    let line = stdout.trim();
    assert_eq!(figure(line, "gc cycles: "), 10, "{line}");
    // Forced passes alone relocate (their writers report it) in the longer lives; the
    // background collector adds to it when it gets a core.
    assert!(figure(line, "writers that relocated: ") > 0, "{line}");
}

#[test]
fn deferred_update_cycles_kill_a_writer_with_updates_not_yet_in_the_index() {
    let dir = tempfile::tempdir().expect("temporary directory");
    // GC-heavy writers rewrite a dozen hot keys, so nearly every put is an update and is
    // deferred; their lives are long enough to report it.
    let stdout = run_kill9(
        &dir.path().join("run"),
        &[
            "--cycles",
            "10",
            "--seed",
            "5",
            "--gc-percent",
            "100",
            "--deferred-percent",
            "100",
        ],
    );
    let line = stdout.trim();
    assert_eq!(figure(line, "deferred-update cycles: "), 10, "{line}");
    assert!(figure(line, "puts deferred: ") > 0, "{line}");
}

#[test]
fn a_second_run_refuses_a_directory_that_holds_a_volume() {
    let tucana = tucana_binary();
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(dir.path().join("kill9.tucana"), b"").expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_tucana-crashtest"))
        .args(["kill9", "--cycles", "1", "--progress", "0"])
        .arg("--dir")
        .arg(dir.path())
        .arg("--tucana")
        .arg(&tucana)
        .output()
        .expect("run tucana-crashtest");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("exists"));
}
