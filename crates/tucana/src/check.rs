//! `check`: walks a whole volume and verifies every invariant and checksum.

/// What `Database::check` found on a sound volume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub keyspaces: u64,
    pub index_nodes: u64,
    pub keys: u64,
    pub log_segments: u64,
    pub log_records: u64,
    pub allocated_blocks: u64,
}
