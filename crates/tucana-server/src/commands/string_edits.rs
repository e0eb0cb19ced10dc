//! The string commands that read or edit part of a value, or its number: GETRANGE,
//! SETRANGE, GETBIT, SETBIT, BITCOUNT, LCS and INCRBYFLOAT.
//!
//! Owns their semantics as Redis 7.0 documents them (index clamping, bit order, the
//! 512 MB limit on a value, LCS's match ranges). Edits keep the key's deadline, as in
//! Redis, through `strings::modify` (one `Kv::apply`); the stored layout and deadlines are
//! `strings`' and `expire`'s. It owns no locks: the store a handler is given does.
//!
//! Thread-safety: plain functions; they run on whichever thread runs the batch.

use crate::expiry::now_ms;
use crate::resp::Reply;

use super::collection::parse_double;
use super::expire::read_stored;
use super::kv::Kv;
use super::strings::{modify, reserved_value, string_only};
use super::{not_an_integer, parse_i64, syntax_error};

/// The largest value a string command may make (Redis's `proto-max-bulk-len` default).
pub(super) const STRING_BYTES_MAX: u64 = 512 * 1024 * 1024;

fn too_big() -> Reply {
    Reply::error("ERR string exceeds maximum allowed size (proto-max-bulk-len)")
}

/// The live string at `key` (`Ok(None)`: missing), or `WRONGTYPE`.
fn read_string(kv: &mut dyn Kv, key: &[u8]) -> tucana::Result<Result<Option<Vec<u8>>, Reply>> {
    Ok(string_only(read_stored(kv, key, now_ms())?.value))
}

/// Redis's clamping of an inclusive `start..=end` range (negative: from the end) over
/// `len` items; `None` when it selects nothing.
fn clamp_range(start: i64, end: i64, len: i64) -> Option<(usize, usize)> {
    if start < 0 && end < 0 && start > end {
        return None;
    }
    let start = if start < 0 { len + start } else { start }.max(0);
    let end = if end < 0 { len + end } else { end }.max(0);
    let end = end.min(len - 1);
    (len > 0 && start <= end).then_some((start as usize, end as usize))
}

/// `GETRANGE key start end`: the bytes from `start` to `end` inclusive.
pub(super) fn cmd_getrange(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let (Some(start), Some(end)) = (parse_i64(&args[2]), parse_i64(&args[3])) else {
        return Ok(not_an_integer());
    };
    let value = match read_string(kv, &args[1])? {
        Err(reply) => return Ok(reply),
        Ok(v) => v.unwrap_or_default(),
    };
    Ok(Reply::Bulk(
        match clamp_range(start, end, value.len() as i64) {
            Some((s, e)) => value[s..=e].to_vec(),
            None => Vec::new(),
        },
    ))
}

/// `SETRANGE key offset value`: overwrites from `offset`, padding with zero bytes; the
/// new length. An empty `value` changes nothing (and creates no key).
pub(super) fn cmd_setrange(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let Some(offset) = parse_i64(&args[2]) else {
        return Ok(not_an_integer());
    };
    if offset < 0 {
        return Ok(Reply::error("ERR offset is out of range"));
    }
    let piece = &args[3];
    if piece.is_empty() {
        return Ok(match read_string(kv, &args[1])? {
            Err(reply) => reply,
            Ok(v) => Reply::Int(v.map_or(0, |v| v.len() as i64)),
        });
    }
    if offset as u64 + piece.len() as u64 > STRING_BYTES_MAX {
        // Redis checks the type first.
        if let Err(reply) = read_string(kv, &args[1])? {
            return Ok(reply);
        }
        return Ok(too_big());
    }
    let offset = offset as usize;
    let result = modify(kv, &args[1], "setrange", |old| {
        let mut value = old.unwrap_or_default();
        if value.len() < offset + piece.len() {
            value.resize(offset + piece.len(), 0);
        }
        value[offset..offset + piece.len()].copy_from_slice(piece);
        match reserved_value([&value].into_iter()) {
            Some(reply) => Err(reply),
            None => Ok(value),
        }
    })?;
    Ok(result.map_or_else(|reply| reply, |v| Reply::Int(v.len() as i64)))
}

/// A bit offset argument: `0 ..= 2^32 - 1` (512 MB of bits).
fn bit_offset(arg: &[u8]) -> Result<u64, Reply> {
    parse_i64(arg)
        .filter(|&n| n >= 0 && (n as u64) < STRING_BYTES_MAX * 8)
        .map(|n| n as u64)
        .ok_or_else(|| Reply::error("ERR bit offset is not an integer or out of range"))
}

/// Bit `offset` of `value`; bit 0 is the most significant bit of the first byte.
fn bit_at(value: &[u8], offset: u64) -> u8 {
    let byte = (offset / 8) as usize;
    value.get(byte).map_or(0, |b| (b >> (7 - offset % 8)) & 1)
}

/// `GETBIT key offset`
pub(super) fn cmd_getbit(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let offset = match bit_offset(&args[2]) {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    Ok(match read_string(kv, &args[1])? {
        Err(reply) => reply,
        Ok(v) => Reply::Int(i64::from(bit_at(&v.unwrap_or_default(), offset))),
    })
}

/// `SETBIT key offset 0|1`: the bit's old value; the value grows with zero bytes.
pub(super) fn cmd_setbit(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let offset = match bit_offset(&args[2]) {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let on = match args[3].as_slice() {
        b"0" => false,
        b"1" => true,
        _ => return Ok(Reply::error("ERR bit is not an integer or out of range")),
    };
    let mut old_bit = 0;
    let result = modify(kv, &args[1], "setbit", |old| {
        let mut value = old.unwrap_or_default();
        let byte = (offset / 8) as usize;
        if value.len() <= byte {
            value.resize(byte + 1, 0);
        }
        old_bit = bit_at(&value, offset);
        let mask = 1u8 << (7 - offset % 8);
        if on {
            value[byte] |= mask;
        } else {
            value[byte] &= !mask;
        }
        match reserved_value([&value].into_iter()) {
            Some(reply) => Err(reply),
            None => Ok(value),
        }
    })?;
    Ok(result.map_or_else(|reply| reply, |_| Reply::Int(i64::from(old_bit))))
}

/// `BITCOUNT key [start end [BYTE|BIT]]`: set bits in the range (bytes by default).
pub(super) fn cmd_bitcount(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    // Redis 7.0 looks the key up before it reads the range.
    let value = match read_string(kv, &args[1])? {
        Err(reply) => return Ok(reply),
        Ok(None) => return Ok(Reply::Int(0)),
        Ok(Some(v)) => v,
    };
    let (start, end, bits) = match args.len() {
        2 => return Ok(Reply::Int(count_ones(&value))),
        4 | 5 => {
            let (Some(start), Some(end)) = (parse_i64(&args[2]), parse_i64(&args[3])) else {
                return Ok(not_an_integer());
            };
            let bits = match args.get(4).map(|a| a.to_ascii_uppercase()) {
                None => false,
                Some(a) if a == b"BYTE" => false,
                Some(a) if a == b"BIT" => true,
                Some(_) => return Ok(syntax_error()),
            };
            (start, end, bits)
        }
        _ => return Ok(syntax_error()),
    };
    let len = value.len() as i64 * if bits { 8 } else { 1 };
    let Some((s, e)) = clamp_range(start, end, len) else {
        return Ok(Reply::Int(0));
    };
    if !bits {
        return Ok(Reply::Int(count_ones(&value[s..=e])));
    }
    let n = (s as u64..=e as u64)
        .filter(|&bit| bit_at(&value, bit) == 1)
        .count();
    Ok(Reply::Int(n as i64))
}

fn count_ones(bytes: &[u8]) -> i64 {
    bytes.iter().map(|b| i64::from(b.count_ones())).sum()
}

/// `INCRBYFLOAT key increment`: the new value, kept with the key's deadline.
pub(super) fn cmd_incrbyfloat(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let not_a_float = || Reply::error("ERR value is not a valid float");
    let Some(delta) = parse_double(&args[2]) else {
        return Ok(not_a_float());
    };
    let result = modify(kv, &args[1], "incrbyfloat", |old| {
        let current = match old {
            None => 0.0,
            Some(v) => parse_double(&v).ok_or_else(not_a_float)?,
        };
        let next = current + delta;
        if !next.is_finite() {
            return Err(Reply::error("ERR increment would produce NaN or Infinity"));
        }
        Ok(format!("{next}").into_bytes())
    })?;
    Ok(result.map_or_else(|reply| reply, Reply::Bulk))
}

/// LCS's options.
#[derive(Default)]
struct LcsOptions {
    len: bool,
    idx: bool,
    min_match_len: u64,
    with_match_len: bool,
}

fn lcs_options(args: &[Vec<u8>]) -> Result<LcsOptions, Reply> {
    let mut o = LcsOptions::default();
    let mut i = 0;
    while i < args.len() {
        match args[i].to_ascii_uppercase().as_slice() {
            b"LEN" => o.len = true,
            b"IDX" => o.idx = true,
            b"WITHMATCHLEN" => o.with_match_len = true,
            b"MINMATCHLEN" if i + 1 < args.len() => {
                let n = parse_i64(&args[i + 1]).ok_or_else(not_an_integer)?;
                o.min_match_len = n.max(0) as u64;
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    if o.len && o.idx {
        return Err(Reply::error(
            "ERR If you want both the length and indexes, please just use IDX.",
        ));
    }
    Ok(o)
}

/// `LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN]`: the longest common
/// subsequence of two strings (missing keys are empty), its length, or its matching
/// ranges from the ends of the strings backwards, as Redis lists them.
pub(super) fn cmd_lcs(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let must_be_strings = || Reply::error("ERR The specified keys must contain string values");
    let (a, b) = match (read_string(kv, &args[1])?, read_string(kv, &args[2])?) {
        (Ok(a), Ok(b)) => (a.unwrap_or_default(), b.unwrap_or_default()),
        _ => return Ok(must_be_strings()),
    };
    let o = match lcs_options(&args[3..]) {
        Ok(o) => o,
        Err(reply) => return Ok(reply),
    };
    let cells = (a.len() as u64 + 1).saturating_mul(b.len() as u64 + 1);
    if cells.saturating_mul(4) > STRING_BYTES_MAX {
        return Ok(Reply::error(
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len",
        ));
    }
    // table[i][j]: the LCS length of a[..i] and b[..j].
    let width = b.len() + 1;
    let mut table = vec![0u32; (a.len() + 1) * width];
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            table[i * width + j] = if a[i - 1] == b[j - 1] {
                table[(i - 1) * width + j - 1] + 1
            } else {
                table[(i - 1) * width + j].max(table[i * width + j - 1])
            };
        }
    }
    let total = table[a.len() * width + b.len()] as usize;
    if o.len {
        return Ok(Reply::Int(total as i64));
    }
    // Walk back from the ends, collecting the subsequence and its contiguous ranges.
    let mut common = vec![0u8; total];
    let mut matches = Vec::new();
    let (mut i, mut j, mut left) = (a.len(), b.len(), total);
    // The open range: a's and b's first and last index (None: no range open).
    let mut open: Option<(usize, usize, usize, usize)> = None;
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            common[left - 1] = a[i - 1];
            open = Some(match open {
                None => (i - 1, i - 1, j - 1, j - 1),
                Some((_, a_end, _, b_end)) => (i - 1, a_end, j - 1, b_end),
            });
            if i - 1 == 0 || j - 1 == 0 {
                emit = true;
            }
            left -= 1;
            i -= 1;
            j -= 1;
        } else {
            if table[(i - 1) * width + j] > table[i * width + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            emit = open.is_some();
        }
        if let (true, Some((a_start, a_end, b_start, b_end))) = (emit, open) {
            let match_len = (a_end - a_start + 1) as u64;
            if match_len >= o.min_match_len {
                let mut item = vec![
                    Reply::Array(vec![Reply::Int(a_start as i64), Reply::Int(a_end as i64)]),
                    Reply::Array(vec![Reply::Int(b_start as i64), Reply::Int(b_end as i64)]),
                ];
                if o.with_match_len {
                    item.push(Reply::Int(match_len as i64));
                }
                matches.push(Reply::Array(item));
            }
            open = None;
        }
    }
    if !o.idx {
        return Ok(Reply::Bulk(common));
    }
    Ok(Reply::Map(vec![
        (Reply::Bulk(b"matches".to_vec()), Reply::Array(matches)),
        (Reply::Bulk(b"len".to_vec()), Reply::Int(total as i64)),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_clamp_as_redis_does() {
        assert_eq!(clamp_range(0, -1, 5), Some((0, 4)));
        assert_eq!(clamp_range(-3, -1, 5), Some((2, 4)));
        assert_eq!(clamp_range(-1, -3, 5), None);
        assert_eq!(clamp_range(3, 100, 5), Some((3, 4)));
        assert_eq!(clamp_range(-100, 1, 5), Some((0, 1)));
        assert_eq!(clamp_range(4, 2, 5), None);
        assert_eq!(clamp_range(0, 0, 0), None);
    }

    #[test]
    fn bit_zero_is_the_first_bytes_top_bit() {
        assert_eq!(bit_at(b"\x80", 0), 1);
        assert_eq!(bit_at(b"\x80", 1), 0);
        assert_eq!(bit_at(b"\x00\x01", 15), 1);
        assert_eq!(bit_at(b"\x01", 100), 0);
    }
}
