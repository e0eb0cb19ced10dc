//! Torture suites for Tucana, run by the `tucana-torture` command: simulated power loss
//! (`suites::power_loss`), I/O failure sweeps (`suites::io_failure`), corruption
//! (`suites::corruption`), the model test (`suites::model_test`) and power loss on a
//! replication backup while it receives and applies its primary's log and commits
//! (`suites::replica_power_loss`); rows M1, M2, M4, M6 and M9 of the table in
//! `docs/reliability.md`.
//!
//! Owns: the simulated volume (`sim`), the expected-state model (`model`), the shared
//! workload (`workload`) and the suites (`suites`). Does not own: the kill -9 driver (M3,
//! `crates/tucana-crashtest`) and the fuzz targets (M5, `fuzz/`).
//!
//! Every suite is driven by one seed: case `c` of seed `s` draws from its own generator
//! (`case_rng`), so `--case c` replays one case exactly (except cases that run the
//! engine's background committer, which say so when they fail).
//!
//! Thread-safety: each suite runs its cases one after another on the calling thread.

pub mod member_add;
pub mod members;
pub mod model;
pub mod sim;
pub mod suites;
pub mod workload;

use rand::rngs::StdRng;
use rand::SeedableRng;

/// The generator of case `case` of a run seeded with `seed`.
pub fn case_rng(seed: u64, case: u64) -> StdRng {
    // SplitMix-style mixing so neighbouring cases get unrelated streams.
    let mut z = seed ^ case.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    StdRng::seed_from_u64(z ^ (z >> 31))
}

/// What the command line asks of a suite.
#[derive(Clone, Debug)]
pub struct RunArgs {
    pub seed: u64,
    /// Suite-specific amount (crash states, cases, corruptions); see each suite.
    pub count: u64,
    /// Run only this case (to replay a failure).
    pub case: Option<u64>,
    /// Print one line per case.
    pub verbose: bool,
    /// Members of the volume the suite runs on (1: a single file; more: a volume over
    /// several members, `members::volume`). Power loss and the model test honour it.
    pub members: usize,
}

/// A suite's result: its figures line and the failures it found.
#[derive(Debug, Default)]
pub struct Report {
    pub figures: String,
    pub failures: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs `f`, turning a panic into `Err(message)`.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "non-string panic".into())
    })
}
