//! Counts the full keys an index reads while loading YCSB's keys, with no log, volume or
//! page cache: a bare `index::Tree` over a vector of keys. Each key read here is a log
//! record a region reads under its writer lock (a page fault when the load is larger than
//! memory), so the counts say what a split policy costs before any benchmark runs.
//!
//! `cargo run --release -p tucana --example split_key_reads -- [records]` (default 1M):
//! YCSB's key names (`user` + FNV-1a 64 of the record number, hashed insert order), each
//! inserted once, in record-number order, as YCSB's load does. Prints the tree's
//! `WriteCounts` per million inserts and the time the load took (one thread, in memory).

use std::time::Instant;

use tucana::error::Result;
use tucana::index::{Ctx, Tree};
use tucana::types::{DiskOffset, RegionId, TreeEpoch};

/// Keys by log pointer (pointer = index + 1); never any disk node.
struct Keys(Vec<Vec<u8>>);

impl Ctx for Keys {
    fn key_cmp(&self, ptr: u64, key: &[u8]) -> Result<std::cmp::Ordering> {
        Ok(self.0[(ptr - 1) as usize].as_slice().cmp(key))
    }

    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        out.extend_from_slice(&self.0[(ptr - 1) as usize]);
        Ok(())
    }

    fn with_node<R>(&self, off: DiskOffset, _f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        panic!("no disk nodes in this tree (asked for {off:?})");
    }
}

/// YCSB's `Utils.fnvhash64` (as `tucana-bench`'s `ycsb::fnv_hash64`).
fn fnv_hash64(value: u64) -> u64 {
    let mut hash: u64 = 0xCBF2_9CE4_8422_2325;
    let mut rest = value;
    for _ in 0..8 {
        hash ^= rest & 0xff;
        rest >>= 8;
        hash = hash.wrapping_mul(1_099_511_628_211);
    }
    (hash as i64).wrapping_abs() as u64
}

fn main() {
    let records: u64 = match std::env::args().nth(1) {
        None => 1_000_000,
        Some(a) => a.parse().unwrap_or_else(|_| {
            eprintln!("usage: split_key_reads [records]  (records: a positive integer, got {a:?})");
            std::process::exit(2);
        }),
    };
    let keys = Keys(
        (0..records)
            .map(|i| format!("user{}", fnv_hash64(i)).into_bytes())
            .collect(),
    );
    let tree = Tree::new(RegionId(1), TreeEpoch(1));
    let start = Instant::now();
    for (i, key) in keys.0.iter().enumerate() {
        if let Err(e) = tree.insert(&keys, key, i as u64 + 1) {
            eprintln!("insert of record {i} failed: {e}");
            std::process::exit(1);
        }
    }
    let elapsed = start.elapsed();
    let c = tree.write_counts();
    let per_million = |n: u64| n as f64 * 1e6 / records as f64;
    println!(
        "records {records}, load {:.3} s (one thread, in memory)",
        elapsed.as_secs_f64()
    );
    println!("per million inserts:");
    println!(
        "  leaf splits          {:>10.0}",
        per_million(c.leaf_splits)
    );
    println!(
        "  restemmed halves     {:>10.0}",
        per_million(c.restemmed_halves)
    );
    println!(
        "  split key reads      {:>10.0}",
        per_million(c.split_key_reads)
    );
    println!(
        "  insert key reads     {:>10.0}",
        per_million(c.insert_key_reads)
    );
    println!(
        "  leaf stem shrinks    {:>10.0}",
        per_million(c.stem_shrinks)
    );
    println!(
        "  key reads per insert {:>10.3}",
        (c.split_key_reads + c.insert_key_reads) as f64 / records as f64
    );
}
