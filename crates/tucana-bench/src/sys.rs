//! What the operating system tells the benchmark: process CPU time, the kernel, the file
//! system under the data directory, memory size, and dropping a file from the page cache.
//!
//! Owns every `unsafe` call of the crate (each a plain libc call on a local, zeroed struct).
//! Does not interpret anything: callers decide what a number means. All functions are
//! thread-safe; none keeps state.

use std::ffi::CString;
use std::io;
use std::path::Path;
use std::time::Duration;

/// User + system CPU time consumed so far by the whole process (every thread, including
/// the engine's background threads, which is the point: the paper's cycles/op count them).
pub fn process_cpu_time() -> Duration {
    // SAFETY: `rusage` is a plain C struct for which all-zero bytes are a valid value, and
    // getrusage only writes into the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF is a valid `who`, and `usage` is a valid, exclusive pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    // getrusage(RUSAGE_SELF) can only fail for a bad pointer or `who`; neither can happen.
    assert_eq!(rc, 0, "getrusage failed: {}", io::Error::last_os_error());
    timeval_duration(usage.ru_utime) + timeval_duration(usage.ru_stime)
}

/// User + system CPU time of this process's children that have ended and been waited
/// for (a `Command::output()` child counts once it returns): the difference around one
/// child's run is that child's CPU time.
pub fn children_cpu_time() -> Duration {
    // SAFETY: as in `process_cpu_time`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_CHILDREN is a valid `who`, and `usage` is a valid, exclusive pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    assert_eq!(rc, 0, "getrusage failed: {}", io::Error::last_os_error());
    timeval_duration(usage.ru_utime) + timeval_duration(usage.ru_stime)
}

fn timeval_duration(tv: libc::timeval) -> Duration {
    let secs = u64::try_from(tv.tv_sec).unwrap_or(0);
    let micros = u64::try_from(tv.tv_usec).unwrap_or(0);
    Duration::from_secs(secs) + Duration::from_micros(micros)
}

/// "Linux 6.8.0-45-generic x86_64", from uname(2).
pub fn kernel() -> Option<String> {
    // SAFETY: `utsname` is arrays of C chars; all-zero bytes are a valid value.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is a valid, exclusive pointer to a utsname.
    if unsafe { libc::uname(&mut name) } != 0 {
        return None;
    }
    let field = |chars: &[libc::c_char]| -> String {
        // Stop at the NUL, or at the end of the array should one ever be missing.
        let bytes: Vec<u8> = chars
            .iter()
            .map(|&c| c as u8)
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Some(format!(
        "{} {} {}",
        field(&name.sysname),
        field(&name.release),
        field(&name.machine)
    ))
}

/// Total memory in bytes, from /proc/meminfo.
pub fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let amount: u64 = words.next()?.parse().ok()?;
    // The kernel writes "kB" but means KiB.
    match words.next() {
        Some("kB") => Some(amount * 1024),
        _ => None,
    }
}

/// The CPU model, from /proc/cpuinfo.
pub fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// The kind of file system holding `path` ("ext4", "tmpfs", ...), by statfs(2) magic.
#[cfg(target_os = "linux")]
pub fn fs_type(path: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statfs` is a plain C struct; all-zero bytes are a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call; `st` is a valid,
    // exclusive pointer.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // Magic numbers are 32-bit; the field's width and signedness differ between targets.
    #[allow(clippy::unnecessary_cast)]
    let magic = (st.f_type as u64) & 0xFFFF_FFFF;
    let name = match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0xF2F5_2010 => "f2fs",
        0x2FC1_2FC1 => "zfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        other => return Some(format!("unknown (magic {other:#x})")),
    };
    Some(name.to_string())
}

#[cfg(not(target_os = "linux"))]
pub fn fs_type(_path: &Path) -> Option<String> {
    None
}

/// True for file systems whose numbers say nothing about an SSD.
pub fn fs_is_memory_backed(fs: &str) -> bool {
    matches!(fs, "tmpfs" | "overlayfs")
}

/// Writes back and evicts `path` from the page cache, so that the next open reads the
/// device rather than memory. Best effort: the kernel may keep pages that are mapped.
#[cfg(target_os = "linux")]
pub fn drop_from_page_cache(path: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    // Dirty pages are not evicted; write them back first.
    file.sync_all()?;
    // SAFETY: the descriptor is open for the whole call; offset 0 and length 0 mean
    // "the whole file"; the call does not touch our memory.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        // posix_fadvise returns the error number instead of setting errno.
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub fn drop_from_page_cache(_path: &Path) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "dropping a file from the page cache needs Linux",
    ))
}

/// Bytes allocated on the device by the files under `dir` (st_blocks, so holes do not
/// count and preallocation does). Measured the same way for every engine.
pub fn dir_space_used_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total_bytes = 0u64;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            total_bytes += dir_space_used_bytes(&entry.path())?;
        } else {
            // st_blocks is in 512-byte units whatever the file system's block size.
            total_bytes += meta.blocks() * 512;
        }
    }
    Ok(total_bytes)
}

/// Every regular file under `dir`, recursively.
pub fn files_under(dir: &Path) -> io::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            files.extend(files_under(&entry.path())?);
        } else if kind.is_file() {
            files.push(entry.path());
        }
    }
    Ok(files)
}

/// Bytes this process made the storage layer read and write, from /proc/self/io
/// (`read_bytes`, `write_bytes`: counted when a page is read from or dirtied for the device,
/// so page-cache hits do not count and deferred writeback does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessIo {
    pub read_bytes: u64,
    pub write_bytes: u64,
}

pub fn process_io() -> Option<ProcessIo> {
    parse_process_io(&std::fs::read_to_string("/proc/self/io").ok()?)
}

/// The same figures of another process of ours (a server this program started), from
/// /proc/PID/io.
pub fn process_io_of(pid: u32) -> Option<ProcessIo> {
    parse_process_io(&std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?)
}

fn parse_process_io(text: &str) -> Option<ProcessIo> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line.split_once(':')?.1.trim().parse().ok()
    };
    Some(ProcessIo {
        read_bytes: field("read_bytes:")?,
        write_bytes: field("write_bytes:")?,
    })
}

/// Sectors read and written by a whole block device, from its `stat` file in sysfs, in
/// bytes. Counts every process using the device, not only this one.
pub fn device_io(stat_path: &Path) -> Option<ProcessIo> {
    let text = std::fs::read_to_string(stat_path).ok()?;
    let fields: Vec<u64> = text
        .split_whitespace()
        .map(|w| w.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    // Documented layout (Documentation/block/stat.rst): field 2 is sectors read, field 6
    // sectors written, both in 512-byte units whatever the device's sector size.
    Some(ProcessIo {
        read_bytes: fields.get(2)? * 512,
        write_bytes: fields.get(6)? * 512,
    })
}

/// The sysfs `stat` file of the block device holding `dir` (a partition's own file when
/// the file system is on a partition), and the device's name.
#[cfg(target_os = "linux")]
pub fn device_stat_path(dir: &Path) -> Option<(std::path::PathBuf, String)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys_dir = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let stat = sys_dir.join("stat");
    if !stat.exists() {
        return None;
    }
    let name = std::fs::canonicalize(&sys_dir)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| format!("{major}:{minor}"));
    Some((stat, name))
}

#[cfg(not(target_os = "linux"))]
pub fn device_stat_path(_dir: &Path) -> Option<(std::path::PathBuf, String)> {
    None
}

/// Model and rotational flag of a block device by name ("vda": "virtio disk, non-rotational").
pub fn device_description(name: &str) -> String {
    // A partition's queue/ lives in its parent disk's directory.
    let base = std::path::Path::new("/sys/class/block").join(name);
    let queue = if base.join("queue").exists() {
        base.join("queue")
    } else {
        base.join("../queue")
    };
    let rotational = std::fs::read_to_string(queue.join("rotational"))
        .ok()
        .map(|s| s.trim() == "1");
    let model = std::fs::read_to_string(base.join("device/model"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let mut text = name.to_string();
    if let Some(model) = model {
        text += &format!(" ({model})");
    }
    match rotational {
        Some(true) => text += ", rotational",
        Some(false) => text += ", non-rotational",
        None => {}
    }
    text
}

/// Resets this process's peak resident set size (VmHWM) to its current size, so that the
/// next [`peak_rss_bytes`] is the peak of what ran in between. Best effort: returns false
/// where the kernel does not support it (before Linux 4.0).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// Peak resident set size (VmHWM) since the process started or the last [`reset_peak_rss`].
pub fn peak_rss_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut words = line.split_whitespace().skip(1);
    let amount: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(amount * 1024),
        _ => None,
    }
}

/// The calling thread's kernel id: the name of its `/proc/self/task` entry.
pub fn thread_id() -> Option<u32> {
    // SAFETY: gettid(2) takes no arguments, cannot fail and touches no memory of ours.
    let tid = unsafe { libc::gettid() };
    u32::try_from(tid).ok()
}

/// Clock ticks per second, the unit of utime and stime in /proc/PID/stat.
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // POSIX requires a positive value; 100 is what Linux has used everywhere for decades.
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// Sends SIGTERM to process `pid` (a server this program started), asking it to stop.
pub fn send_sigterm(pid: u32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) only sends a signal; it touches no memory of ours.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_monotonic_and_counts_work() {
        let before = process_cpu_time();
        // Burn a little CPU so the clock (10 ms granularity on some kernels) may move.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_time() >= before);
    }

    #[test]
    fn space_used_counts_written_blocks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![1u8; 64 * 1024]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![2u8; 64 * 1024]).unwrap();
        let used = dir_space_used_bytes(dir.path()).unwrap();
        // Compressing file systems could store less; none of ours do for a test dir.
        assert!(used >= 128 * 1024, "used {used}");
        assert_eq!(files_under(dir.path()).unwrap().len(), 2);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn machine_facts_are_readable() {
        assert!(kernel().unwrap().starts_with("Linux "));
        assert!(mem_total_bytes().unwrap() > 0);
        assert!(fs_type(Path::new("/")).is_some());
        let io = process_io().unwrap();
        // Reading a file from the page cache need not count, but the numbers must parse.
        assert!(io.read_bytes < u64::MAX);
        assert!(reset_peak_rss());
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        assert!(peak_rss_bytes().unwrap() >= 64 << 20);
    }
}
