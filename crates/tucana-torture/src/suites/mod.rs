//! The suites, one module each; every `run` returns a `Report` whose figures line ends
//! with the seed.

pub mod m1;
pub mod m2;
pub mod m4;
pub mod m6;
