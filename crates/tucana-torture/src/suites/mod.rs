//! The suites, one module each, named for what they do; every `run` returns a `Report`
//! whose figures line starts with the suite's row id in `docs/reliability.md` and ends
//! with the seed.

pub mod corruption;
pub mod io_failure;
pub mod model_test;
pub mod power_loss;
pub mod replica_power_loss;
