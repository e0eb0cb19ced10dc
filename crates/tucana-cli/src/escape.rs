//! The text form of keys and values: how arbitrary bytes travel through command-line
//! arguments, `load` input, `scan` output and the shell.
//!
//! Owns the escape syntax and nothing else. The syntax is deliberately small so that
//! `scan` output fed to `load` gives back exactly the same bytes:
//!
//! | bytes                         | text      |
//! |-------------------------------|-----------|
//! | `\` (0x5c)                    | `\\`      |
//! | tab (0x09)                    | `\t`      |
//! | newline (0x0a)                | `\n`      |
//! | any byte outside 0x20..=0x7e  | `\xNN`    |
//! | any other byte                | itself    |
//!
//! Output is therefore pure printable ASCII: never a raw tab or newline (the separators
//! of `load`/`scan` lines) and never a control sequence that a terminal would act on.
//! Non-ASCII text (UTF-8) is printed as `\xNN` escapes too: the store holds bytes, and we
//! prefer an exact, boring rendering to guessing an encoding.
//!
//! Input is more lenient: any byte other than `\` stands for itself (so UTF-8 typed on a
//! command line is stored as its UTF-8 bytes), and hex digits may be either case. A `\`
//! followed by anything but `\`, `t`, `n` or `xNN` is an error, which keeps room for
//! more escapes later without changing what existing input means.
//!
//! Pure functions; no shared state.

use std::fmt;

/// Why a piece of text is not a valid escaped byte string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EscapeError {
    /// Byte offset of the offending `\` in the text.
    pub offset: usize,
    pub detail: &'static str,
}

impl fmt::Display for EscapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad escape at byte {}: {}", self.offset, self.detail)
    }
}

/// Appends the text form of `bytes` to `out`.
pub fn escape_into(bytes: &[u8], out: &mut Vec<u8>) {
    const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len());
    for &byte in bytes {
        match byte {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            0x20..=0x7e => out.push(byte),
            _ => out.extend_from_slice(&[
                b'\\',
                b'x',
                HEX_DIGITS[usize::from(byte >> 4)],
                HEX_DIGITS[usize::from(byte & 0xf)],
            ]),
        }
    }
}

/// The bytes that the text form `text` stands for.
pub fn unescape(text: &[u8]) -> Result<Vec<u8>, EscapeError> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let byte = text[i];
        if byte != b'\\' {
            out.push(byte);
            i += 1;
            continue;
        }
        let error = |detail| EscapeError { offset: i, detail };
        match text.get(i + 1) {
            Some(b'\\') => out.push(b'\\'),
            Some(b't') => out.push(b'\t'),
            Some(b'n') => out.push(b'\n'),
            Some(b'x') => {
                let high = text.get(i + 2).copied().and_then(hex_value);
                let low = text.get(i + 3).copied().and_then(hex_value);
                match (high, low) {
                    (Some(high), Some(low)) => out.push(high << 4 | low),
                    _ => return Err(error("\\x must be followed by two hex digits")),
                }
                i += 2;
            }
            Some(_) => return Err(error("use \\\\, \\t, \\n or \\xNN")),
            None => return Err(error("a lone \\ at the end (write \\\\ for a backslash)")),
        }
        i += 2;
    }
    Ok(out)
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escape(bytes: &[u8]) -> String {
        let mut out = Vec::new();
        escape_into(bytes, &mut out);
        String::from_utf8(out).expect("escaped text is ASCII")
    }

    #[test]
    fn every_byte_round_trips_and_escaped_text_is_printable_ascii() {
        let all: Vec<u8> = (0..=255u8).collect();
        let text = escape(&all);
        assert!(text.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{text}");
        assert_eq!(unescape(text.as_bytes()).unwrap(), all);
    }

    #[test]
    fn escapes_are_the_documented_ones() {
        assert_eq!(escape(b"a\\b\tc\nd"), "a\\\\b\\tc\\nd");
        assert_eq!(escape(b"\x00\x1f\x7f\xff"), "\\x00\\x1f\\x7f\\xff");
        assert_eq!(escape(b"plain text ~!"), "plain text ~!");
        assert_eq!(escape("é".as_bytes()), "\\xc3\\xa9");
        assert_eq!(escape(b""), "");
    }

    #[test]
    fn unescape_accepts_raw_bytes_and_either_hex_case() {
        assert_eq!(
            unescape("é\\xFF\\xab".as_bytes()).unwrap(),
            b"\xc3\xa9\xff\xab"
        );
        assert_eq!(unescape(b"\\\\x41").unwrap(), b"\\x41");
        assert_eq!(unescape(b"").unwrap(), b"");
    }

    #[test]
    fn unescape_rejects_unknown_and_truncated_escapes_with_their_offset() {
        assert_eq!(unescape(b"ab\\q").unwrap_err().offset, 2);
        assert_eq!(unescape(b"\\x4").unwrap_err().offset, 0);
        assert_eq!(unescape(b"x\\xg1").unwrap_err().offset, 1);
        assert_eq!(unescape(b"abc\\").unwrap_err().offset, 3);
        let message = unescape(b"\\r").unwrap_err().to_string();
        assert!(message.contains("byte 0"), "{message}");
    }
}
