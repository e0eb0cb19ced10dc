//! `tucana-torture <suite> --seed S --count N`: runs one torture suite of
//! `docs/reliability.md` and prints its figures line; exits non-zero (after printing each
//! failure with the seed and case that replay it) if anything failed.
//!
//! Suites are named for what they do (`power-loss`, `io-failure`, `corruption`,
//! `model-test`, `replica-power-loss`). The ids of their rows in the reliability table
//! (`m1`, `m2`, `m4`, `m6`, `m9`) are accepted as aliases: the figures lines start with
//! those ids, so `tucana-torture m1` reruns the row whose figure it printed, and commands
//! written before the suites had names keep working.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use tucana_torture::{suites, Report, RunArgs};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Suite {
    /// Simulated power loss (M1); count = crash states.
    #[value(alias = "m1")]
    PowerLoss,
    /// I/O failure sweep (fail I/O N once, then from N on, for every N) (M2); count =
    /// workload variants swept.
    #[value(alias = "m2")]
    IoFailure,
    /// Corruption: every bit of both superblock slots, then count random corruptions
    /// (M4).
    #[value(alias = "m4")]
    Corruption,
    /// Model test against a BTreeMap with reopens, crashes, snapshots (M6); count = cases.
    #[value(alias = "m6")]
    ModelTest,
    /// Power loss on a backup while it receives and applies a primary's log and commits
    /// (M9); count = crash states.
    #[value(alias = "m9")]
    ReplicaPowerLoss,
}

#[derive(Parser, Debug)]
#[command(
    name = "tucana-torture",
    about = "Crash, fault and corruption torture suites"
)]
struct Cli {
    suite: Suite,
    /// Seed of the whole run; a failure prints the seed and case that replay it.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// How much to run (see the suite's help).
    #[arg(long)]
    count: Option<u64>,
    /// Replay one case only.
    #[arg(long)]
    case: Option<u64>,
    /// One line per case on stderr.
    #[arg(long)]
    verbose: bool,
    /// Run on a volume over this many members (windows of the simulated disk); power-loss
    /// and model-test only.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    members: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_count = match cli.suite {
        Suite::PowerLoss => 10_000,
        Suite::IoFailure => 2,
        Suite::Corruption => 2_000,
        Suite::ModelTest => 200,
        Suite::ReplicaPowerLoss => 3_000,
    };
    let args = RunArgs {
        seed: cli.seed,
        count: cli.count.unwrap_or(default_count),
        case: cli.case,
        verbose: cli.verbose,
        members: cli.members as usize,
    };
    let report: Report = match cli.suite {
        Suite::PowerLoss => suites::power_loss::run(&args),
        Suite::IoFailure => suites::io_failure::run(&args),
        Suite::Corruption => suites::corruption::run(&args),
        Suite::ModelTest => suites::model_test::run(&args),
        Suite::ReplicaPowerLoss => suites::replica_power_loss::run(&args),
    };
    const SHOWN: usize = 20;
    for f in report.failures.iter().take(SHOWN) {
        println!("FAIL {f}");
    }
    if report.failures.len() > SHOWN {
        println!("... and {} more failures", report.failures.len() - SHOWN);
    }
    println!("{}", report.figures);
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
