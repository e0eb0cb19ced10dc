//! The kernel's text files the off-CPU sampler reads, parsed: a thread's
//! `/proc/<pid>/task/<tid>/schedstat` (time on a CPU, time waiting for one), its `stat`
//! (name, scheduler state, start time) and `wchan` (where it sleeps), and a block device's
//! line of `/proc/diskstats`.
//!
//! Owns the formats only (Documentation/scheduler/sched-stats.rst, proc(5),
//! Documentation/admin-guide/iostats.rst); reads no file. A line that does not have the
//! documented shape is an error naming what is wrong, never a panic. Pure functions;
//! thread-safe.

/// A thread's scheduler totals since it started, from its `schedstat` file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Time spent on a CPU.
    pub run_ns: u64,
    /// Time spent runnable, waiting on a run queue for a CPU.
    pub wait_ns: u64,
}

/// "12345 678 9": run ns, run-queue wait ns, time slices.
pub fn schedstat(text: &str) -> Result<SchedStat, String> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() != 3 {
        return Err(format!(
            "schedstat: expected 3 fields (run ns, wait ns, slices), got {}: {text:?}",
            fields.len()
        ));
    }
    let number = |i: usize, what: &str| -> Result<u64, String> {
        fields[i]
            .parse()
            .map_err(|_| format!("schedstat: {what} is not a number: {text:?}"))
    };
    Ok(SchedStat {
        run_ns: number(0, "run ns")?,
        wait_ns: number(1, "wait ns")?,
    })
}

/// What the sampler needs of a thread's `stat` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskStat {
    /// The thread's name (`comm`, at most 15 bytes; may contain spaces and parentheses).
    pub comm: String,
    /// 'R' running or runnable, 'S' sleeping (interruptible), 'D' waiting uninterruptibly
    /// (mostly I/O: a page read, writeback throttling), and the rarer others.
    pub state: char,
}

/// "pid (comm) S ppid ...": the name runs to the last ')', since it may hold ") ".
pub fn task_stat(text: &str) -> Result<TaskStat, String> {
    let open = text
        .find('(')
        .ok_or_else(|| format!("stat: no '(' before the name: {text:?}"))?;
    let close = text
        .rfind(')')
        .filter(|&close| close > open)
        .ok_or_else(|| format!("stat: no ')' after the name: {text:?}"))?;
    let state = text[close + 1..]
        .split_whitespace()
        .next()
        .ok_or_else(|| format!("stat: nothing after the name: {text:?}"))?;
    let mut chars = state.chars();
    match (chars.next(), chars.next()) {
        (Some(state), None) if state.is_ascii_alphabetic() => Ok(TaskStat {
            comm: text[open + 1..close].to_string(),
            state,
        }),
        _ => Err(format!("stat: the state is not one letter: {state:?}")),
    }
}

/// A thread's wait channel: the kernel function it sleeps in, or `None` when it is not
/// sleeping ("0", or an empty file).
pub fn wchan(text: &str) -> Result<Option<String>, String> {
    let symbol = text.trim();
    if symbol.is_empty() || symbol == "0" {
        return Ok(None);
    }
    if symbol
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        Ok(Some(symbol.to_string()))
    } else {
        Err(format!("wchan: not a kernel symbol: {text:?}"))
    }
}

/// A block device's totals since boot, from its line of `/proc/diskstats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub name: String,
    /// 512-byte units, whatever the device's sector size.
    pub sectors_read: u64,
    pub sectors_written: u64,
    /// Time the device had at least one request in flight.
    pub io_ticks_ms: u64,
    /// Time requests spent in flight, summed over requests ("time spent doing I/Os,
    /// weighted"): its growth over a span ÷ the span is the average queue depth.
    pub weighted_io_ms: u64,
}

/// "major minor name reads merged sectors ms writes merged sectors ms in-flight io-ms
/// weighted-ms [discard and flush fields]": at least the first 14 fields.
pub fn diskstats_line(line: &str) -> Result<DiskStats, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 14 {
        return Err(format!(
            "diskstats: expected at least 14 fields, got {}: {line:?}",
            fields.len()
        ));
    }
    let number = |i: usize| -> Result<u64, String> {
        fields[i]
            .parse()
            .map_err(|_| format!("diskstats: field {} is not a number: {line:?}", i + 1))
    };
    // The device numbers are checked too: a line whose first fields are not numbers is not
    // a diskstats line at all.
    number(0)?;
    number(1)?;
    Ok(DiskStats {
        name: fields[2].to_string(),
        sectors_read: number(5)?,
        sectors_written: number(9)?,
        io_ticks_ms: number(12)?,
        weighted_io_ms: number(13)?,
    })
}

/// The line of device `name` in the whole `/proc/diskstats` text.
pub fn diskstats_of(text: &str, name: &str) -> Result<DiskStats, String> {
    let line = text
        .lines()
        .find(|line| line.split_whitespace().nth(2) == Some(name))
        .ok_or_else(|| format!("diskstats: no device {name:?}"))?;
    diskstats_line(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_run_and_wait() {
        assert_eq!(
            schedstat("1234567 89012 45\n").unwrap(),
            SchedStat {
                run_ns: 1_234_567,
                wait_ns: 89_012
            }
        );
        for bad in ["", "1 2", "1 2 3 4", "1 x 3", "-1 2 3", "1.5 2 3"] {
            let err = schedstat(bad).unwrap_err();
            assert!(err.starts_with("schedstat:"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn stat_name_may_hold_spaces_and_parentheses() {
        let line = "4242 (rocksdb:low) D 1 2 3 4 5 4194368 0 0 0 0 10 3 0 0 20 0 5 0 100 0";
        assert_eq!(
            task_stat(line).unwrap(),
            TaskStat {
                comm: "rocksdb:low".into(),
                state: 'D'
            }
        );
        let odd = "7 (a) b (c)) S 1 2";
        assert_eq!(task_stat(odd).unwrap().comm, "a) b (c)");
        assert_eq!(task_stat(odd).unwrap().state, 'S');
        for bad in [
            "",
            "7 a S",
            "7 (a S",
            "7 )a( S",
            "7 (a)",
            "7 (a) SS 1",
            "7 (a) 1 2",
        ] {
            let err = task_stat(bad).unwrap_err();
            assert!(err.starts_with("stat:"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn wchan_is_a_symbol_or_nothing() {
        assert_eq!(
            wchan("folio_wait_bit_common").unwrap().as_deref(),
            Some("folio_wait_bit_common")
        );
        assert_eq!(wchan("0").unwrap(), None);
        assert_eq!(wchan("").unwrap(), None);
        assert_eq!(
            wchan("do_epoll_wait.part.0\n").unwrap().as_deref(),
            Some("do_epoll_wait.part.0")
        );
        for bad in ["two words", "x/y", "\u{0}"] {
            assert!(wchan(bad).unwrap_err().starts_with("wchan:"), "{bad:?}");
        }
    }

    #[test]
    fn diskstats_lines_give_sectors_and_queue_time() {
        // A kernel 5.5+ line (20 fields: discards and flushes at the end).
        let line = " 254       0 vda 15833687 255236 423402538 17176370 273870434 6217471 \
                    3416971232 21272356 0 10177152 43890464 13577486 152 2161351392 1050799 \
                    96094942 4390937";
        assert_eq!(
            diskstats_line(line).unwrap(),
            DiskStats {
                name: "vda".into(),
                sectors_read: 423_402_538,
                sectors_written: 3_416_971_232,
                io_ticks_ms: 10_177_152,
                weighted_io_ms: 43_890_464,
            }
        );
        // An old kernel's 14 fields are enough.
        let old = "8 0 sda 1 2 3 4 5 6 7 8 9 10 11";
        assert_eq!(diskstats_line(old).unwrap().weighted_io_ms, 11);
        for bad in [
            "",
            "8 0 sda 1 2 3",
            "8 0 sda 1 2 x 4 5 6 7 8 9 10 11",
            "a b sda 1 2 3 4 5 6 7 8 9 10 11",
        ] {
            assert!(
                diskstats_line(bad).unwrap_err().starts_with("diskstats:"),
                "{bad:?}"
            );
        }
        let text = format!("8 0 sda 1 2 3 4 5 6 7 8 9 10 11\n{line}\n");
        assert_eq!(
            diskstats_of(&text, "vda").unwrap().sectors_read,
            423_402_538
        );
        assert_eq!(diskstats_of(&text, "sda").unwrap().sectors_written, 7);
        assert!(diskstats_of(&text, "nvme0n1").is_err());
    }
}
