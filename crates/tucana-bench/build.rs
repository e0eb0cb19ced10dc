//! Records which versions of the peers this binary is built with, so the results say it
//! from the build rather than from a hand-typed string:
//! - each peer crate's version, from the workspace's Cargo.lock (the versions cargo
//!   resolved and compiled), as `TUCANA_BENCH_<CRATE>_VERSION`;
//! - with the `rocksdb` feature, the version of the RocksDB sources librocksdb-sys compiled
//!   (its `rocksdb/include/rocksdb/version.h`, found through the `cargo_manifest_dir`
//!   metadata librocksdb-sys's build script publishes to direct dependents), as
//!   `TUCANA_BENCH_ROCKSDB_LIBRARY`.
//!
//! LMDB's version needs no help: heed asks the linked library at run time.

use std::collections::BTreeMap;
use std::path::Path;

/// Crates whose versions the results name (missing ones are recorded as "unknown").
const CRATES: [&str; 6] = [
    "rocksdb",
    "librocksdb-sys",
    "fjall",
    "lsm-tree",
    "redb",
    "heed",
];

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let lock = Path::new(&manifest_dir).join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let versions = std::fs::read_to_string(&lock)
        .map(|text| locked_versions(&text))
        .unwrap_or_default();
    for name in CRATES {
        let version = versions.get(name).map_or("unknown", String::as_str);
        let var = name.to_uppercase().replace('-', "_");
        println!("cargo:rustc-env=TUCANA_BENCH_{var}_VERSION={version}");
    }

    println!("cargo:rerun-if-env-changed=DEP_ROCKSDB_CARGO_MANIFEST_DIR");
    if let Ok(dir) = std::env::var("DEP_ROCKSDB_CARGO_MANIFEST_DIR") {
        let header = Path::new(&dir).join("rocksdb/include/rocksdb/version.h");
        let library = std::fs::read_to_string(&header)
            .ok()
            .and_then(|text| rocksdb_version(&text))
            .map_or_else(
                || format!("RocksDB (version unknown: {} unreadable)", header.display()),
                |version| {
                    format!(
                        "RocksDB {version}, compiled from the sources bundled in librocksdb-sys"
                    )
                },
            );
        println!("cargo:rustc-env=TUCANA_BENCH_ROCKSDB_LIBRARY={library}");
    }
}

/// Every `[[package]]`'s name and version in a Cargo.lock; a crate locked at two versions
/// gets both, comma-separated.
fn locked_versions(lock: &str) -> BTreeMap<String, String> {
    let mut versions: BTreeMap<String, String> = BTreeMap::new();
    let mut name: Option<&str> = None;
    for line in lock.lines() {
        if line.starts_with("[[package]]") {
            name = None;
        } else if let Some(value) = quoted_value(line, "name") {
            name = Some(value);
        } else if let (Some(value), Some(package)) = (quoted_value(line, "version"), name) {
            versions
                .entry(package.to_string())
                .and_modify(|known| {
                    known.push_str(", ");
                    known.push_str(value);
                })
                .or_insert_with(|| value.to_string());
        }
    }
    versions
}

/// `value` of a line `key = "value"`.
fn quoted_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(key)?.trim_start().strip_prefix('=')?;
    rest.trim().strip_prefix('"')?.strip_suffix('"')
}

/// "MAJOR.MINOR.PATCH" from RocksDB's version.h.
fn rocksdb_version(header: &str) -> Option<String> {
    let define = |what: &str| {
        header.lines().find_map(|line| {
            let number = line.strip_prefix("#define ")?.strip_prefix(what)?.trim();
            number.parse::<u32>().ok()
        })
    };
    Some(format!(
        "{}.{}.{}",
        define("ROCKSDB_MAJOR")?,
        define("ROCKSDB_MINOR")?,
        define("ROCKSDB_PATCH")?
    ))
}
