//! Records which RocksDB the `rocksdb` feature links, so the results can say it:
//! librocksdb-sys links the library in `ROCKSDB_LIB_DIR` when that is set at build time,
//! else it compiles its bundled sources. The `rocksdb-bundled` feature asks for the latter
//! and refuses a build that would silently do the former.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=ROCKSDB_LIB_DIR");
    let bundled_requested = std::env::var_os("CARGO_FEATURE_ROCKSDB_BUNDLED").is_some();
    let link = match std::env::var("ROCKSDB_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => {
            assert!(
                !bundled_requested,
                "feature rocksdb-bundled needs ROCKSDB_LIB_DIR unset (it is {dir})"
            );
            // librocksdb.so is a symlink to the versioned file: its name says the version.
            let so = Path::new(&dir).join("librocksdb.so");
            let version = std::fs::canonicalize(&so)
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "librocksdb (version unknown)".to_string());
            format!("system library {version} from {dir}")
        }
        _ => "bundled sources of librocksdb-sys 0.10.0+7.9.2 (RocksDB 7.9.2)".to_string(),
    };
    println!("cargo:rustc-env=TUCANA_BENCH_ROCKSDB_LINK={link}");
}
