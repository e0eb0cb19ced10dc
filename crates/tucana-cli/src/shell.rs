//! `tucana shell`: many commands against one open volume, read from stdin one per line.
//!
//! Owns the shell's little language (`help` prints it) and what each command prints.
//! Words are separated by spaces or tabs and use the escapes of `escape` (a space inside
//! a key or value is `\x20`); empty lines and lines starting with `#` are skipped, so a
//! file of commands can be piped in. A failing command prints `error: <message>` on
//! stderr and the shell goes on; the session then ends with exit code 2.
//!
//! Writes are buffered (`Durability::Buffered`): durable at the next background flush,
//! `commit`, or when the shell ends (`main` closes the volume, which commits).
//!
//! Single-threaded.

use std::io::BufRead;

use crate::output::Output;
use crate::target::{delete, get, scan, ScanBounds, Target};
use crate::{escape, CliError, Outcome};

const PROMPT: &str = "tucana> ";

const HELP: &str = "\
commands (keys and values use the escapes \\\\ \\t \\n \\xNN; a space is \\x20):
  put KEY VALUE     set KEY to VALUE; prints ok
  get KEY           print the value of KEY, or (not found)
  del KEY           remove KEY; prints deleted, or (not found)
  scan [--from KEY] [--to KEY] [--prefix PREFIX] [--rev] [--limit N]
                    print key<TAB>value lines in key order, as `tucana scan` (from
                    inclusive, to exclusive); `scan FROM [TO]` is short for --from, --to
  stats             print statistics as JSON
  commit            persist the index now; prints ok
  help              print this
  quit              end the session (so does end of input)";

/// One parsed shell line.
#[derive(Debug, PartialEq, Eq)]
enum ShellCommand {
    Put(Vec<u8>, Vec<u8>),
    Get(Vec<u8>),
    Del(Vec<u8>),
    Scan(ScanArgs),
    Stats,
    Commit,
    Help,
    Quit,
}

/// The options of `scan`, the same as `tucana scan`'s.
#[derive(Debug, Default, PartialEq, Eq)]
struct ScanArgs {
    from: Option<Vec<u8>>,
    to: Option<Vec<u8>>,
    prefix: Option<Vec<u8>>,
    rev: bool,
    limit: Option<u64>,
}

const SCAN_USAGE: &str = "scan [--from KEY] [--to KEY] [--prefix PREFIX] [--rev] [--limit N]";

/// `scan`'s words: the CLI's options, or up to two bare keys (FROM, TO) as before.
fn parse_scan(args: Vec<Vec<u8>>) -> Result<ScanArgs, String> {
    let mut scan = ScanArgs::default();
    let mut bare = Vec::new();
    let mut words = args.into_iter();
    while let Some(word) = words.next() {
        let mut value = |name: &str| {
            words
                .next()
                .ok_or_else(|| format!("usage: {SCAN_USAGE} ({name} needs a value)"))
        };
        match word.as_slice() {
            b"--from" => scan.from = Some(value("--from")?),
            b"--to" => scan.to = Some(value("--to")?),
            b"--prefix" => scan.prefix = Some(value("--prefix")?),
            b"--rev" => scan.rev = true,
            b"--limit" => {
                let n = value("--limit")?;
                let n = std::str::from_utf8(&n).ok().and_then(|t| t.parse().ok());
                scan.limit =
                    Some(n.ok_or_else(|| format!("usage: {SCAN_USAGE} (--limit needs a number)"))?);
            }
            w if w.starts_with(b"--") => {
                return Err(format!(
                    "usage: {SCAN_USAGE} (unknown option {})",
                    String::from_utf8_lossy(w)
                ))
            }
            _ => bare.push(word),
        }
    }
    if bare.len() > 2 || (!bare.is_empty() && (scan.from.is_some() || scan.to.is_some())) {
        return Err(format!("usage: {SCAN_USAGE}"));
    }
    let mut bare = bare.into_iter();
    if let Some(from) = bare.next() {
        scan.from = Some(from);
        scan.to = bare.next();
    }
    Ok(scan)
}

/// Runs commands from `input` until `quit` or end of input.
pub fn run(
    target: &mut Target<'_>,
    mut input: impl BufRead,
    interactive: bool,
    out: &mut Output,
) -> Result<Outcome, CliError> {
    let mut line = Vec::new();
    let mut failed_commands: u64 = 0;
    loop {
        if interactive {
            out.prompt(PROMPT)?;
        }
        line.clear();
        let read_bytes = input
            .read_until(b'\n', &mut line)
            .map_err(|e| CliError::msg(format!("reading stdin: {e}")))?;
        if read_bytes == 0 {
            break;
        }
        let result = match parse_line(&line) {
            Ok(None) => Ok(()),
            Ok(Some(ShellCommand::Quit)) => break,
            Ok(Some(command)) => execute(target, command, out),
            Err(message) => Err(CliError::msg(message)),
        };
        // Flush results before an error message so the two streams read in order.
        out.flush()?;
        match result {
            Ok(()) => {}
            Err(CliError::StdoutClosed) => return Err(CliError::StdoutClosed),
            Err(CliError::Message(message)) => {
                failed_commands += 1;
                eprintln!("error: {message}");
            }
        }
    }
    if interactive {
        // End the prompt line when the session ended with end of input (^D).
        out.line("")?;
    }
    Ok(if failed_commands == 0 {
        Outcome::Done
    } else {
        Outcome::ShellErrors
    })
}

fn execute(
    target: &mut Target<'_>,
    command: ShellCommand,
    out: &mut Output,
) -> Result<(), CliError> {
    match command {
        ShellCommand::Put(key, value) => {
            target.for_write()?.put(&key, &value)?;
            out.line("ok")
        }
        ShellCommand::Get(key) => match get(target, &key)? {
            Some(value) => out.escaped_line(&value),
            None => out.line("(not found)"),
        },
        ShellCommand::Del(key) => {
            if delete(target, &key)? {
                out.line("deleted")
            } else {
                out.line("(not found)")
            }
        }
        ShellCommand::Scan(args) => {
            let bounds = ScanBounds::new(args.from, args.to, args.prefix.as_deref());
            scan(target, &bounds, args.rev, args.limit, out)
        }
        ShellCommand::Stats => out.line(&target.db().stats().to_json()),
        ShellCommand::Commit => {
            target.db().commit()?;
            out.line("ok")
        }
        ShellCommand::Help => out.line(HELP),
        ShellCommand::Quit => unreachable!("quit ends the loop before execute"),
    }
}

/// Parses one line; `None` for a blank line or a comment.
fn parse_line(line: &[u8]) -> Result<Option<ShellCommand>, String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut words = line
        .split(|&byte| byte == b' ' || byte == b'\t')
        .filter(|word| !word.is_empty());
    let Some(name) = words.next() else {
        return Ok(None);
    };
    if name.starts_with(b"#") {
        return Ok(None);
    }
    let args: Vec<Vec<u8>> = words
        .enumerate()
        .map(|(i, word)| escape::unescape(word).map_err(|e| format!("word {}: {e}", i + 2)))
        .collect::<Result<_, _>>()?;
    let name = String::from_utf8_lossy(name);
    let arg_count = args.len();
    let usage = |usage: &str| format!("usage: {usage} (got {arg_count} arguments)");
    let mut args = args.into_iter();
    let command = match (name.as_ref(), arg_count) {
        ("put", 2) => ShellCommand::Put(next(&mut args), next(&mut args)),
        ("put", _) => return Err(usage("put KEY VALUE")),
        ("get", 1) => ShellCommand::Get(next(&mut args)),
        ("get", _) => return Err(usage("get KEY")),
        ("del", 1) => ShellCommand::Del(next(&mut args)),
        ("del", _) => return Err(usage("del KEY")),
        ("scan", _) => ShellCommand::Scan(parse_scan(args.collect())?),
        ("stats", 0) => ShellCommand::Stats,
        ("commit", 0) => ShellCommand::Commit,
        ("help", 0) => ShellCommand::Help,
        ("quit" | "exit", 0) => ShellCommand::Quit,
        ("stats" | "commit" | "help" | "quit" | "exit", _) => {
            return Err(format!("{name} takes no arguments"))
        }
        _ => return Err(format!("unknown command {name:?} (try help)")),
    };
    Ok(Some(command))
}

fn next(args: &mut impl Iterator<Item = Vec<u8>>) -> Vec<u8> {
    args.next().expect("the argument count was matched")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Option<ShellCommand>, String> {
        parse_line(line.as_bytes())
    }

    #[test]
    fn commands_parse_with_escaped_words() {
        assert_eq!(
            parse("put k\\x201 v\\t2\n"),
            Ok(Some(ShellCommand::Put(b"k 1".to_vec(), b"v\t2".to_vec())))
        );
        assert_eq!(
            parse("  get\tk  "),
            Ok(Some(ShellCommand::Get(b"k".to_vec())))
        );
        assert_eq!(
            parse("del k\r\n"),
            Ok(Some(ShellCommand::Del(b"k".to_vec())))
        );
        let scan = |from: Option<&str>, to: Option<&str>| {
            Ok(Some(ShellCommand::Scan(ScanArgs {
                from: from.map(|k| k.as_bytes().to_vec()),
                to: to.map(|k| k.as_bytes().to_vec()),
                ..ScanArgs::default()
            })))
        };
        assert_eq!(parse("scan"), scan(None, None));
        assert_eq!(parse("scan a"), scan(Some("a"), None));
        assert_eq!(parse("scan a c"), scan(Some("a"), Some("c")));
        assert_eq!(parse("scan --from a --to c"), scan(Some("a"), Some("c")));
        assert_eq!(
            parse("scan --prefix user: --rev --limit 10"),
            Ok(Some(ShellCommand::Scan(ScanArgs {
                prefix: Some(b"user:".to_vec()),
                rev: true,
                limit: Some(10),
                ..ScanArgs::default()
            })))
        );
        assert_eq!(parse("stats"), Ok(Some(ShellCommand::Stats)));
        assert_eq!(parse("commit"), Ok(Some(ShellCommand::Commit)));
        assert_eq!(parse("help"), Ok(Some(ShellCommand::Help)));
        assert_eq!(parse("quit"), Ok(Some(ShellCommand::Quit)));
    }

    #[test]
    fn blank_lines_and_comments_are_skipped() {
        assert_eq!(parse("\n"), Ok(None));
        assert_eq!(parse("   \t "), Ok(None));
        assert_eq!(parse("# put a b"), Ok(None));
    }

    #[test]
    fn wrong_arity_unknown_commands_and_bad_escapes_are_errors() {
        assert!(parse("put k").unwrap_err().contains("usage: put KEY VALUE"));
        assert!(parse("put k v w").unwrap_err().contains("got 3 arguments"));
        assert!(parse("get").is_err());
        assert!(parse("scan a b c").is_err());
        assert!(parse("scan --limit x")
            .unwrap_err()
            .contains("needs a number"));
        assert!(parse("scan --from").unwrap_err().contains("needs a value"));
        assert!(parse("scan --bogus")
            .unwrap_err()
            .contains("unknown option"));
        assert!(parse("scan a --from b").is_err());
        assert!(parse("stats now").is_err());
        assert!(parse("frobnicate").unwrap_err().contains("unknown command"));
        assert!(parse("get k\\q")
            .unwrap_err()
            .contains("word 2: bad escape"));
    }
}
