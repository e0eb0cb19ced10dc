//! The suites at small counts, as `cargo test` runs them: each passes, and its figures
//! show that garbage collection was really exercised (and, for the backup power-loss
//! suite, that crashes landed in each step of the apply path and promotions replayed
//! log), so a change that stops the workloads from collecting (or the crashes from
//! landing where they are aimed) fails here instead of leaving CI a quietly weaker run. CI runs the full counts
//! (`scripts/torture-ci.sh`).

use tucana_torture::{suites, Report, RunArgs};

fn args(seed: u64, count: u64) -> RunArgs {
    RunArgs {
        seed,
        count,
        case: None,
        verbose: false,
        members: 1,
    }
}

/// The number right after `name` in the figures line ("name: 12" or "name 12").
fn figure(report: &Report, name: &str) -> u64 {
    let line = &report.figures;
    let at = line
        .find(name)
        .unwrap_or_else(|| panic!("no {name:?} in {line}"))
        + name.len();
    let digits: String = line[at..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {name:?} in {line}"))
}

fn assert_passed(report: &Report) {
    assert!(
        report.passed(),
        "{}\n{}",
        report.figures,
        report.failures.join("\n")
    );
}

#[test]
fn power_loss_lands_inside_gc_passes() {
    let report = suites::power_loss::run(&args(7, 400));
    assert_passed(&report);
    assert!(figure(&report, "M1 crash states") >= 400);
    // Forced passes replay exactly, so these do not depend on timing.
    assert!(figure(&report, "forced pass") > 20, "{}", report.figures);
    assert!(figure(&report, "gc relocated") > 0, "{}", report.figures);
    assert!(figure(&report, "gc reclaimed") > 0, "{}", report.figures);
    assert!(figure(&report, "hole punches") > 0, "{}", report.figures);
}

#[test]
fn io_failure_fails_every_io_of_a_workload_with_gc_passes() {
    // Workload 1 is a GC workload.
    let report = suites::io_failure::run(&args(7, 2));
    assert_passed(&report);
    assert!(
        figure(&report, "inside gc passes") > 50,
        "{}",
        report.figures
    );
    assert!(figure(&report, "hole punches") > 0, "{}", report.figures);
}

#[test]
fn model_test_checks_reads_across_forced_and_background_gc() {
    let report = suites::model_test::run(&args(7, 40));
    assert_passed(&report);
    assert!(figure(&report, "forced") > 0, "{}", report.figures);
    // Cases with the background collector ("cases: 40 (background N)"); how much it did
    // depends on timing, so it is not asserted.
    assert!(figure(&report, "background") > 0, "{}", report.figures);
    assert!(figure(&report, "gc relocated") > 0, "{}", report.figures);
}

#[test]
fn replica_power_loss_lands_in_every_step_of_a_backups_apply_path() {
    let report = suites::replica_power_loss::run(&args(7, 400));
    assert_passed(&report);
    assert!(figure(&report, "crash states") >= 400);
    for step in [
        "writing shipped log",
        "a shipped commit's nodes and descriptor",
        "its superblock",
    ] {
        assert!(figure(&report, step) > 0, "{step}: {}", report.figures);
    }
    // Promotions replayed log past their commit, bounded below by durably received log;
    // backups carried on after crashes with commits in full; the primary collected.
    for figure_name in [
        "replaying log",
        "bounded by durable log",
        "in full",
        "resumed lives",
        "primary gc passes",
    ] {
        assert!(
            figure(&report, figure_name) > 0,
            "{figure_name}: {}",
            report.figures
        );
    }
}

#[test]
fn power_loss_and_the_model_test_pass_on_a_volume_over_three_members() {
    // The same suites on a `MemberSet` over three windows of the simulated disk (one
    // power domain): member headers and the group map must survive every crash state.
    let mut three = args(11, 200);
    three.members = 3;
    let report = suites::power_loss::run(&three);
    assert_passed(&report);
    assert!(figure(&report, "M1 crash states") >= 200);
    three.count = 20;
    let report = suites::model_test::run(&three);
    assert_passed(&report);
    assert!(figure(&report, "crashes") > 0, "{}", report.figures);
}
