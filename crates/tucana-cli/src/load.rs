//! `tucana load`: bulk-puts `key<TAB>value` lines read from stdin.
//!
//! Owns the line format (one pair per line, both escaped as in `escape`, exactly one
//! tab) and the progress display. Lines are put one at a time as they are read, so a
//! bad line stops the load with everything before it already written; `main` closes the
//! volume afterwards, which makes those writes durable. Does not batch: a batch would
//! make a failed load all-or-nothing, which is not what the command promises.
//!
//! Single-threaded (the progress bar may tick from its own thread).

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Read};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tucana::{Durability, Keyspace};

use crate::escape;
use crate::CliError;

/// Reads pairs from stdin into `keyspace`; the number of pairs put.
pub fn load_stdin(keyspace: &Keyspace, durability: Durability) -> Result<u64, CliError> {
    let progress = progress_bar();
    let result = load(keyspace, io::stdin().lock(), durability, &progress);
    progress.finish_and_clear();
    result
}

/// Puts every line of `input` into `keyspace`; the number of pairs put.
pub fn load(
    keyspace: &Keyspace,
    input: impl Read,
    durability: Durability,
    progress: &ProgressBar,
) -> Result<u64, CliError> {
    // The progress bar counts bytes as the buffer pulls them in, so a bar sized by the
    // input's length fills up as the load goes.
    let mut reader = BufReader::with_capacity(1 << 20, progress.wrap_read(input));
    let mut line = Vec::new();
    let mut line_number: u64 = 0;
    let mut loaded: u64 = 0;
    loop {
        line.clear();
        let read_bytes = reader.read_until(b'\n', &mut line).map_err(|e| {
            CliError::msg(format!(
                "reading stdin after line {line_number}: {e}; {}",
                kept(loaded)
            ))
        })?;
        if read_bytes == 0 {
            break;
        }
        line_number += 1;
        let at_line = |detail: &dyn std::fmt::Display| {
            CliError::msg(format!("line {line_number}: {detail}; {}", kept(loaded)))
        };
        let (key, value) = parse_pair(&line).map_err(|e| at_line(&e))?;
        keyspace
            .put_with(&key, &value, durability)
            .map_err(|e| at_line(&e))?;
        loaded += 1;
        if loaded.is_multiple_of(1024) {
            progress.set_message(format!("{loaded} pairs"));
        }
    }
    Ok(loaded)
}

fn kept(loaded: u64) -> String {
    format!("the {loaded} pairs before it were loaded and kept, nothing after it")
}

/// Parses one line of `load` input (with or without its final newline).
pub fn parse_pair(line: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let mut fields = line.split(|&byte| byte == b'\t');
    let (Some(key), Some(value), None) = (fields.next(), fields.next(), fields.next()) else {
        let tabs = line.iter().filter(|&&byte| byte == b'\t').count();
        return Err(format!(
            "expected KEY<TAB>VALUE, found {tabs} tabs (write a tab inside a key or value as \\t)"
        ));
    };
    let key = escape::unescape(key).map_err(|e| format!("key: {e}"))?;
    let value = escape::unescape(value).map_err(|e| format!("value: {e}"))?;
    Ok((key, value))
}

/// A progress bar on stderr when a person is watching it, else a hidden one (logs and
/// pipes get no control sequences).
fn progress_bar() -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match stdin_len_bytes() {
        Some(len_bytes) => ProgressBar::new(len_bytes).with_style(
            ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {msg} ({bytes_per_sec}, {eta} left)",
            )
            .expect("the template is valid"),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {bytes} read, {msg} ({bytes_per_sec})")
                .expect("the template is valid"),
        ),
    };
    bar.set_message("0 pairs");
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// The length of stdin when it is a regular file (`tucana load < pairs.tsv`).
#[cfg(unix)]
fn stdin_len_bytes() -> Option<u64> {
    use std::os::fd::AsFd;
    let fd = io::stdin().as_fd().try_clone_to_owned().ok()?;
    let metadata = File::from(fd).metadata().ok()?;
    metadata.is_file().then_some(metadata.len())
}

#[cfg(not(unix))]
fn stdin_len_bytes() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_line_is_key_tab_value_with_escapes() {
        assert_eq!(
            parse_pair(b"k\tv\n").unwrap(),
            (b"k".to_vec(), b"v".to_vec())
        );
        assert_eq!(parse_pair(b"k\tv").unwrap(), (b"k".to_vec(), b"v".to_vec()));
        assert_eq!(
            parse_pair(b"a\\tb\\x00\tc\\nd\\\\").unwrap(),
            (b"a\tb\x00".to_vec(), b"c\nd\\".to_vec())
        );
        // Empty keys and values are the engine's business, not the format's.
        assert_eq!(parse_pair(b"\t").unwrap(), (Vec::new(), Vec::new()));
        // A carriage return is a byte like any other; scan output never contains one.
        assert_eq!(
            parse_pair(b"k\tv\r\n").unwrap(),
            (b"k".to_vec(), b"v\r".to_vec())
        );
    }

    #[test]
    fn a_line_without_exactly_one_tab_is_malformed() {
        assert!(parse_pair(b"no tab here\n")
            .unwrap_err()
            .contains("found 0 tabs"));
        assert!(parse_pair(b"a\tb\tc").unwrap_err().contains("found 2 tabs"));
        assert!(parse_pair(b"\n").is_err());
    }

    #[test]
    fn a_bad_escape_says_whether_it_is_in_the_key_or_the_value() {
        assert!(parse_pair(b"k\\q\tv")
            .unwrap_err()
            .starts_with("key: bad escape"));
        assert!(parse_pair(b"k\tv\\x1")
            .unwrap_err()
            .starts_with("value: bad escape"));
    }
}
