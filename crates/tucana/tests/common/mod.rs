//! Helpers shared by the member tests (`members.rs`, `add_member_online.rs`,
//! `remove_member.rs`, `rebalance.rs`): each is its own test crate and takes this module
//! with `mod common;`.

use std::hash::{DefaultHasher, Hasher};
use std::io::Read;
use std::path::Path;

/// Each file in `dir` by name, with its length and a digest of every byte: equal before
/// and after a step that must write nothing (a refused open, add, removal or
/// rebalance), without holding member files of hundreds of MiB in memory.
pub fn snapshot(dir: &Path) -> Vec<(String, u64, u64)> {
    let mut files: Vec<(String, u64, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let mut file = std::fs::File::open(&p).unwrap();
            let mut hasher = DefaultHasher::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut len = 0;
            loop {
                let n = file.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                hasher.write(&buf[..n]);
                len += n as u64;
            }
            (p.display().to_string(), len, hasher.finish())
        })
        .collect();
    files.sort();
    files
}
