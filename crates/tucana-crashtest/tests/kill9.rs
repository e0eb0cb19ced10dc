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

#[test]
fn a_few_kill_cycles_pass_and_print_the_figure_line() {
    let tucana = tucana_binary();
    let dir = tempfile::tempdir().expect("temporary directory");
    let work = dir.path().join("run");
    let output = Command::new(env!("CARGO_BIN_EXE_tucana-crashtest"))
        .args(["kill9", "--cycles", "12", "--seed", "7", "--progress", "0"])
        .arg("--dir")
        .arg(&work)
        .arg("--tucana")
        .arg(&tucana)
        .output()
        .expect("run tucana-crashtest");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(
        stdout.trim(),
        "M3 kill cycles: 12, lost durable writes: 0, non-prefix states: 0, check failures: 0, seed: 7"
    );
    // The volume really was written to and survived every cycle.
    assert!(work.join("kill9.tucana").is_file());
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
