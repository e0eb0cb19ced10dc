//! `MEMORY USAGE key [SAMPLES n]`: an estimate of the bytes a key's records take in the
//! keyspace (key and value of each record; the engine's per-record overhead and the
//! index are not counted). Redis answers its allocation for the key; clients and
//! Redis's tests only compare it or check it is positive.
//!
//! Owns the estimate: a string's key and value; a collection's metadata record plus,
//! per sub-record family, the average size of its first `SAMPLES` sub-records (default
//! 5; 0: all) times its member count, as Redis samples big collections.
//!
//! Thread-safety: a plain function on the store a handler is given.

use std::ops::Bound;

use crate::resp::Reply;
use crate::types::{is_typed, sub_prefix, Family, Meta};

use super::collection::members;
use super::expire::live_value;
use super::kv::Kv;
use super::{not_an_integer, parse_i64, syntax_error};

/// Sub-records sampled per family unless `SAMPLES` says otherwise (Redis's default).
const SAMPLES_DEFAULT: usize = 5;

pub(super) fn cmd_memory(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if !args[1].eq_ignore_ascii_case(b"USAGE") || args.len() < 3 {
        return Ok(Reply::error(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try MEMORY HELP.",
            super::printable(&args[1], 64)
        )));
    }
    let samples = match &args[3..] {
        [] => SAMPLES_DEFAULT,
        [word, n] if word.eq_ignore_ascii_case(b"SAMPLES") => match parse_i64(n) {
            Some(0) => usize::MAX,
            Some(n) if n > 0 => n as usize,
            _ => return Ok(not_an_integer()),
        },
        _ => return Ok(syntax_error()),
    };
    let key = &args[2];
    let Some(value) = live_value(kv, key)? else {
        return Ok(Reply::Nil);
    };
    let mut bytes = (key.len() + value.len()) as u64;
    // A packed hash is all in its value (`Meta::packed`: no sub-records to sample).
    if is_typed(&value) && !crate::types::packed::is_packed(&value) {
        let meta = Meta::decode(&value)?;
        for &family in Family::of(meta.kind) {
            let prefix_len = sub_prefix(family, key, meta.version).len();
            let all = (Bound::Unbounded, Bound::Unbounded);
            let sample = members(kv, family, key, meta.version, all, false, samples)?;
            if sample.is_empty() {
                continue;
            }
            let sampled: u64 = sample
                .iter()
                .map(|(suffix, v)| (prefix_len + suffix.len() + v.len()) as u64)
                .sum();
            bytes += sampled * meta.count / sample.len() as u64;
        }
    }
    Ok(Reply::Int(bytes as i64))
}
