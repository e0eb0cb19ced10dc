//! regions
