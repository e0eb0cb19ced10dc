//! Who holds a volume's lock, for the message of `Error::Locked` (which the engine
//! gives without the path or the holder: it does not know the holder).
//!
//! Reads `/proc/locks` (Linux): the process ids holding a `flock` on the file's inode,
//! and each one's command line from `/proc/PID/cmdline`. Best effort: `None` where
//! `/proc` is missing or the holder is in another pid namespace (its pid reads 0 or is
//! not ours to see).
//!
//! Pure reads of `/proc`; thread-safe.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// "pid N (command line)" of each process holding a lock on the file at `path`, joined
/// with ", "; `None` when none can be found.
pub fn describe(path: &Path) -> Option<String> {
    let metadata = std::fs::metadata(path).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pids = holders(
        &locks,
        dev_major(metadata.dev()),
        dev_minor(metadata.dev()),
        metadata.ino(),
    );
    let described: Vec<String> = pids
        .into_iter()
        .filter(|&pid| pid != std::process::id())
        .map(|pid| match command_line(pid) {
            Some(command) => format!("pid {pid} ({command})"),
            None => format!("pid {pid}"),
        })
        .collect();
    (!described.is_empty()).then(|| described.join(", "))
}

/// The pids of `/proc/locks` lines of `FLOCK` locks on device `major:minor`, inode `ino`.
/// A line: `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF` (device numbers in hex);
/// a blocked waiter's line has `->` after its number and is skipped.
fn holders(locks: &str, major: u64, minor: u64, ino: u64) -> Vec<u32> {
    let mut pids = Vec::new();
    for line in locks.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") {
            continue;
        }
        let (Some(pid), Some(file)) = (fields.get(4), fields.get(5)) else {
            continue;
        };
        let parts: Vec<&str> = file.split(':').collect();
        let [maj, min, inode] = parts.as_slice() else {
            continue;
        };
        let same = u64::from_str_radix(maj, 16).ok() == Some(major)
            && u64::from_str_radix(min, 16).ok() == Some(minor)
            && inode.parse::<u64>().ok() == Some(ino);
        if let (true, Ok(pid)) = (same, pid.parse::<u32>()) {
            if pid != 0 && !pids.contains(&pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// glibc's `major()` of a `dev_t`.
fn dev_major(dev: u64) -> u64 {
    ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff)
}

/// glibc's `minor()` of a `dev_t`.
fn dev_minor(dev: u64) -> u64 {
    (dev & 0xff) | ((dev >> 12) & !0xff)
}

fn command_line(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flock_lines_of_the_inode_are_found() {
        let locks = "1: POSIX  ADVISORY  WRITE 10 fd:01:77 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 fd:01:77 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 5151 fd:01:77 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 99 fd:01:78 0 EOF\n\
                     4: FLOCK  ADVISORY  WRITE 0 fd:01:77 0 EOF\n";
        assert_eq!(holders(locks, 0xfd, 1, 77), vec![4242]);
        assert!(holders(locks, 0xfd, 2, 77).is_empty());
    }

    #[test]
    fn this_process_finds_another_holder_by_its_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v");
        std::fs::write(&path, b"x").unwrap();
        // A child that holds the lock: flock(1) where installed, else nothing to test.
        let Ok(mut child) = std::process::Command::new("flock")
            .arg(&path)
            .args(["sleep", "30"])
            .spawn()
        else {
            eprintln!("skipped: flock(1) is not installed");
            return;
        };
        let mut found = None;
        for _ in 0..100 {
            found = describe(&path);
            if found.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let found = found.expect("the child's lock is listed");
        assert!(
            found.contains("sleep 30") || found.contains("flock"),
            "{found}"
        );
    }
}
