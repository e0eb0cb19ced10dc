//! How the harness writes a figure: byte counts, numbers in tables, ratio cells, shell
//! words; and the pieces of Markdown every section of BENCHMARKS.md repeats (a run's notes
//! as block quotes, its command line, the debug-build warning). The terminal lines of the
//! runs and every section of the document (module `document`) write through these
//! functions, so the same figure reads the same everywhere.
//!
//! Owns the written form only: what a figure means belongs to the module that measures it,
//! where it goes to the module that lays out the output. Pure functions; thread-safe.

use std::fmt::Write as _;

use serde_json::Value;

/// "1.5 KiB", "114.4 MiB": binary units, one decimal.
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A JSON number that is finite; `None` for anything else (absent, `null`, text).
pub fn number(value: &Value) -> Option<f64> {
    value.as_f64().filter(|v| v.is_finite())
}

/// A table cell: whole above 1000, one decimal above 10, two below; "–" without a figure.
pub fn fmt_number(value: Option<f64>) -> String {
    match value {
        None => "–".to_string(),
        Some(v) if v >= 1000.0 => format!("{v:.0}"),
        Some(v) if v >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// Bytes as a table cell of whole MiB; "–" without a figure.
pub fn fmt_mib(value: Option<f64>) -> String {
    value.map_or("–".to_string(), |b| {
        format!("{:.0}", b / (1 << 20) as f64)
    })
}

/// A table cell of `ours / theirs` to two decimals, bold where Tucana is better (a ratio
/// at or above 1 when higher is better, at or below 1 otherwise); "–" without both.
pub fn ratio_cell(ours: Option<f64>, theirs: Option<f64>, higher_is_better: bool) -> String {
    match (ours, theirs) {
        (Some(a), Some(b)) if b > 0.0 => {
            let ratio = a / b;
            let better = if higher_is_better {
                ratio >= 1.0
            } else {
                ratio <= 1.0
            };
            if better {
                format!("**{ratio:.2}**")
            } else {
                format!("{ratio:.2}")
            }
        }
        _ => "–".to_string(),
    }
}

/// `arg` as one shell word.
pub fn shell_quote(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=,:@%+".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

/// A recorded command line (`argv`, a JSON list) without its first `skip` words, each
/// word quoted for the shell; `None` when `argv` is not a list.
pub fn shell_args(argv: &Value, skip: usize) -> Option<String> {
    let args: Vec<String> = argv
        .as_array()?
        .iter()
        .skip(skip)
        .filter_map(Value::as_str)
        .map(shell_quote)
        .collect();
    Some(args.join(" "))
}

/// A run's own remarks (`notes`, a JSON list of text) as Markdown block quotes, one
/// paragraph each.
pub fn quoted_notes(md: &mut String, notes: &Value) {
    for note in notes
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let _ = writeln!(md, "> {note}\n");
    }
}

/// The paragraph that marks figures a debug build produced: `what` "are meaningless".
pub fn debug_build_warning(what: &str) -> String {
    format!("**WARNING: a debug build produced {what}; they are meaningless.**\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_human() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(120 << 20), "120.0 MiB");
    }

    #[test]
    fn numbers_keep_three_significant_digits_or_more() {
        assert_eq!(fmt_number(None), "–");
        assert_eq!(fmt_number(Some(123456.7)), "123457");
        assert_eq!(fmt_number(Some(12.34)), "12.3");
        assert_eq!(fmt_number(Some(1.234)), "1.23");
        assert_eq!(fmt_mib(Some(3.0 * (1 << 20) as f64)), "3");
        assert_eq!(number(&serde_json::json!(f64::NAN)), None);
    }

    #[test]
    fn ratio_cells_are_bold_where_tucana_is_better() {
        assert_eq!(ratio_cell(Some(2.0), Some(1.0), true), "**2.00**");
        assert_eq!(ratio_cell(Some(2.0), Some(1.0), false), "2.00");
        assert_eq!(ratio_cell(Some(1.0), Some(0.0), true), "–");
        assert_eq!(ratio_cell(None, Some(1.0), true), "–");
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_quote("--json=bench/x.json"), "--json=bench/x.json");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        let argv = serde_json::json!(["/x/tucana-bench", "suite", "--note", "a b"]);
        assert_eq!(shell_args(&argv, 1).unwrap(), "suite --note 'a b'");
        assert_eq!(shell_args(&argv, 9).unwrap(), "");
        assert_eq!(shell_args(&serde_json::Value::Null, 1), None);
    }

    #[test]
    fn notes_are_block_quotes() {
        let mut md = String::new();
        quoted_notes(&mut md, &serde_json::json!(["shared machine", 3, "rerun"]));
        assert_eq!(md, "> shared machine\n\n> rerun\n\n");
        quoted_notes(&mut md, &serde_json::Value::Null);
        assert_eq!(
            md, "> shared machine\n\n> rerun\n\n",
            "no notes, nothing added"
        );
    }
}
