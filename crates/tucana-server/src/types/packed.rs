//! The packed layout of a small hash (DESIGN.md, "Packed small hashes"): every field and
//! value inside the metadata record's value, so that a write of a small hash is one read
//! and one write of one record, and HGETALL one read, where the per-field layout costs a
//! record per field.
//!
//! ```text
//! TYPED 'p' format(1) count(2 BE) { field-len(2 BE) field value-len(2 BE) value } * count
//! ```
//!
//! Fields are in strictly ascending byte order (a lookup is a binary search, HGETALL
//! answers in field order as the per-field layout does), `count` is 1 to
//! [`ENTRIES_MAX`] (an empty hash is deleted, not stored) and the fields and values
//! together hold at most [`BYTES_MAX`] bytes. `format` is 1; any other byte is refused, so
//! a later layout can take another number.
//!
//! Owns the encoding and the decoder, which checks every length, the order and the bounds
//! and answers an error (never a panic) on bytes that break any of them
//! (`fuzz/fuzz_targets/packed_hash.rs`). It does not own when a hash is packed or
//! converted to the per-field layout (`commands::hashes`), nor the per-field layout
//! (`types`).
//!
//! Thread-safety: pure functions.

use super::TYPED;

/// The kind byte of a packed hash (after [`TYPED`]; the per-field layout's is `h`).
pub const KIND_BYTE: u8 = b'p';

/// The only format this decoder reads.
pub const FORMAT: u8 = 1;

/// A packed hash holds at most this many fields (and fewer if
/// `hash-max-listpack-entries` says so).
pub const ENTRIES_MAX: usize = 128;

/// A packed hash's fields and values add up to at most this many bytes.
pub const BYTES_MAX: usize = 4096;

/// What precedes the entries: [`TYPED`], the kind byte, the format and the count.
const HEADER_LEN: usize = TYPED.len() + 4;

/// Whether a stored value is a packed hash (it may still be damaged: [`parse`] says).
pub fn is_packed(value: &[u8]) -> bool {
    value.strip_prefix(TYPED).and_then(|r| r.first()) == Some(&KIND_BYTE)
}

/// Whether fields and values adding up to `bytes` bytes, `count` of them, fit the layout.
pub fn fits(count: usize, bytes: usize) -> bool {
    (1..=ENTRIES_MAX).contains(&count) && bytes <= BYTES_MAX
}

/// The stored value of a packed hash of `entries`, which must be in strictly ascending
/// field order and [`fits`] (the caller checks; a violation is a programmer error).
pub fn encode<'a>(entries: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>) -> Vec<u8> {
    let count = entries.len();
    assert!((1..=ENTRIES_MAX).contains(&count), "packed hash of {count}");
    let mut out = Vec::with_capacity(HEADER_LEN + count * 16);
    out.extend_from_slice(TYPED);
    out.extend_from_slice(&[KIND_BYTE, FORMAT]);
    out.extend_from_slice(&(count as u16).to_be_bytes());
    let mut bytes = 0;
    for (field, value) in entries {
        bytes += field.len() + value.len();
        assert!(bytes <= BYTES_MAX, "packed hash over {BYTES_MAX} bytes");
        for part in [field, value] {
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    debug_assert!(parse(&out).is_ok(), "encode writes what parse reads");
    out
}

/// The entries of a packed hash's stored value, in field order, borrowed from it; an
/// error naming what is wrong when the bytes break the layout.
pub fn parse(value: &[u8]) -> tucana::Result<Vec<(&[u8], &[u8])>> {
    let bad = |what: &str| {
        tucana::Error::InvalidArgument(format!(
            "damaged packed hash ({} bytes): {what}",
            value.len()
        ))
    };
    let rest = value
        .strip_prefix(TYPED)
        .and_then(|r| r.strip_prefix(&[KIND_BYTE]))
        .ok_or_else(|| bad("not a packed hash"))?;
    let (&format, rest) = rest.split_first().ok_or_else(|| bad("no format byte"))?;
    if format != FORMAT {
        return Err(bad(&format!("unknown format {format}")));
    }
    let (count, mut rest) = rest
        .split_first_chunk::<2>()
        .ok_or_else(|| bad("no count"))?;
    let count = u16::from_be_bytes(*count) as usize;
    if !(1..=ENTRIES_MAX).contains(&count) {
        return Err(bad(&format!("count {count} outside 1..={ENTRIES_MAX}")));
    }
    let mut entries: Vec<(&[u8], &[u8])> = Vec::with_capacity(count);
    let mut bytes = 0;
    for i in 0..count {
        let mut part = || -> tucana::Result<&[u8]> {
            let (len, after) = rest
                .split_first_chunk::<2>()
                .ok_or_else(|| bad(&format!("entry {i} cut short")))?;
            let len = u16::from_be_bytes(*len) as usize;
            if after.len() < len {
                return Err(bad(&format!("entry {i} cut short")));
            }
            let (bytes, after) = after.split_at(len);
            rest = after;
            Ok(bytes)
        };
        let (field, val) = (part()?, part()?);
        bytes += field.len() + val.len();
        if bytes > BYTES_MAX {
            return Err(bad(&format!("over {BYTES_MAX} bytes of fields and values")));
        }
        if entries.last().is_some_and(|(last, _)| *last >= field) {
            return Err(bad(&format!("field {i} out of order")));
        }
        entries.push((field, val));
    }
    if !rest.is_empty() {
        return Err(bad(&format!("{} bytes after the last entry", rest.len())));
    }
    Ok(entries)
}

/// [`parse`], with the entries copied out.
pub fn decode(value: &[u8]) -> tucana::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    Ok(parse(value)?
        .into_iter()
        .map(|(f, v)| (f.to_vec(), v.to_vec()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b"".to_vec(), b"empty field".to_vec()),
            (b"a".to_vec(), b"".to_vec()),
            (b"b".to_vec(), vec![0xff; 300]),
        ]
    }

    fn encoded(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        encode(entries.iter().map(|(f, v)| (f.as_slice(), v.as_slice())))
    }

    #[test]
    fn round_trips_and_every_cut_is_an_error() {
        let bytes = encoded(&sample());
        assert!(is_packed(&bytes));
        assert_eq!(decode(&bytes).unwrap(), sample());
        for cut in 0..bytes.len() {
            assert!(parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(parse(&[bytes.as_slice(), b"x"].concat()).is_err());
    }

    #[test]
    fn refuses_unknown_format_bad_count_disorder_and_excess() {
        let good = encoded(&sample());
        let at = TYPED.len() + 1;
        let mut other_format = good.clone();
        other_format[at] = 2;
        let err = parse(&other_format).unwrap_err().to_string();
        assert!(err.contains("unknown format 2"), "{err}");
        let mut zero = good.clone();
        zero[at + 1..at + 3].copy_from_slice(&0u16.to_be_bytes());
        assert!(parse(&zero).is_err());
        let swapped = [sample()[1].clone(), sample()[0].clone()];
        let mut disordered = encoded(&swapped[..1]);
        disordered[at + 1..at + 3].copy_from_slice(&2u16.to_be_bytes());
        disordered.extend_from_slice(&encoded(&swapped[1..])[HEADER_LEN..]);
        let err = parse(&disordered).unwrap_err().to_string();
        assert!(err.contains("out of order"), "{err}");
        // Two entries of 2100 bytes each: well formed but over the byte bound.
        let big = [
            (b"a".to_vec(), vec![1; 2100]),
            (b"b".to_vec(), vec![2; 2100]),
        ];
        let mut over = encoded(&big[..1]);
        over[at + 1..at + 3].copy_from_slice(&2u16.to_be_bytes());
        over.extend_from_slice(&encoded(&big[1..])[HEADER_LEN..]);
        let err = parse(&over).unwrap_err().to_string();
        assert!(err.contains("over 4096 bytes"), "{err}");
    }

    #[test]
    fn bounds() {
        assert!(fits(ENTRIES_MAX, BYTES_MAX));
        assert!(!fits(ENTRIES_MAX + 1, 0));
        assert!(!fits(1, BYTES_MAX + 1));
        assert!(!fits(0, 0));
    }
}
