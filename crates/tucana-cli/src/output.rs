//! Buffered standard output for command results.
//!
//! Owns the one policy about stdout: results are buffered (a `scan` of millions of
//! pairs must not cost a write call per line) and a reader that went away is reported
//! as `CliError::StdoutClosed`, not as an error message. Errors and progress go to
//! stderr, never here, so stdout carries only results a script can parse.
//!
//! Not shared between threads; one per process.

use std::io::{self, BufWriter, Stdout, Write};

use crate::escape;
use crate::CliError;

pub struct Output {
    stdout: BufWriter<Stdout>,
    /// Reused for the escaped form of each line.
    line: Vec<u8>,
}

impl Output {
    pub fn stdout() -> Output {
        Output {
            stdout: BufWriter::with_capacity(64 * 1024, io::stdout()),
            line: Vec::new(),
        }
    }

    /// Writes `text` and a newline.
    pub fn line(&mut self, text: &str) -> Result<(), CliError> {
        self.write(text.as_bytes())?;
        self.write(b"\n")
    }

    /// Writes the escaped form of `bytes` and a newline.
    pub fn escaped_line(&mut self, bytes: &[u8]) -> Result<(), CliError> {
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        escape::escape_into(bytes, &mut line);
        line.push(b'\n');
        let written = self.write(&line);
        self.line = line;
        written
    }

    /// Writes `key<TAB>value` and a newline, both escaped: the `scan` and `load` format.
    pub fn pair_line(&mut self, key: &[u8], value: &[u8]) -> Result<(), CliError> {
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        escape::escape_into(key, &mut line);
        line.push(b'\t');
        escape::escape_into(value, &mut line);
        line.push(b'\n');
        let written = self.write(&line);
        self.line = line;
        written
    }

    /// Writes `text` without a newline and flushes (a prompt).
    pub fn prompt(&mut self, text: &str) -> Result<(), CliError> {
        self.write(text.as_bytes())?;
        self.flush()
    }

    pub fn flush(&mut self) -> Result<(), CliError> {
        self.stdout.flush().map_err(stdout_error)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), CliError> {
        self.stdout.write_all(bytes).map_err(stdout_error)
    }
}

fn stdout_error(error: io::Error) -> CliError {
    if error.kind() == io::ErrorKind::BrokenPipe {
        CliError::StdoutClosed
    } else {
        CliError::msg(format!("writing to stdout: {error}"))
    }
}
