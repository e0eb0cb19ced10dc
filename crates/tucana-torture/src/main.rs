//! `tucana-torture <suite> --seed S --count N`: runs one torture suite of RELIABILITY.md
//! and prints its figures line; exits non-zero (after printing each failure with the seed
//! and case that replay it) if anything failed.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use tucana_torture::{suites, Report, RunArgs};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Suite {
    /// Simulated power loss; count = crash states.
    M1,
    /// I/O error sweep (fail I/O N once, then from N on, for every N); count = workload
    /// variants swept.
    M2,
    /// Corruption: every bit of both superblock slots, then count random corruptions.
    M4,
    /// Model test against a BTreeMap with reopens, crashes, snapshots; count = cases.
    M6,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_count = match cli.suite {
        Suite::M1 => 10_000,
        Suite::M2 => 2,
        Suite::M4 => 2_000,
        Suite::M6 => 200,
    };
    let args = RunArgs {
        seed: cli.seed,
        count: cli.count.unwrap_or(default_count),
        case: cli.case,
        verbose: cli.verbose,
    };
    let report: Report = match cli.suite {
        Suite::M1 => suites::m1::run(&args),
        Suite::M2 => suites::m2::run(&args),
        Suite::M4 => suites::m4::run(&args),
        Suite::M6 => suites::m6::run(&args),
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
