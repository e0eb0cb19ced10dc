//! The data-type tests of the `server` command (issue 23's performance target): what a
//! YCSB-style application and redis-benchmark's list tests send, side by side with the
//! SET and GET tests, at each pipeline depth:
//!
//! - `HSET` of a record of 10 fields (`rec:` and redis-benchmark's 12 random digits,
//!   `field0`..`field9`, each `--field-bytes` long, YCSB's record shape) and `HGETALL`
//!   of one;
//! - `ZADD` of a random member at a random score to one sorted set (YCSB's Redis binding
//!   keeps its scan index so) and `ZRANGEBYSCORE` of the 10 members from a random score;
//! - `LPUSH` and `LPOP`, redis-benchmark's own tests (one list, `-d` bytes per element):
//!   the pops take what the pushes left.
//!
//! Before them every record and every index member exists (`preload`), so each HGETALL
//! answers 10 fields and each ZRANGEBYSCORE up to 10 members.
//!
//! Owns the command lines and the preload; the measurement is `super::run_plan`'s.
//! Single-threaded except for the loader's connections.

use super::resp::{command, load_requests};
use crate::Result;

/// Fields of a record.
pub(super) const FIELDS: usize = 10;

/// The sorted set the ZADD and ZRANGEBYSCORE tests share.
const INDEX_KEY: &str = "rec-index";

/// A test: its name in the records, and its redis-benchmark command line (empty: the
/// built-in test of that name).
pub(super) struct TypeTest {
    pub(super) name: &'static str,
    pub(super) command: Vec<String>,
}

/// The tests in the order they run: each read follows the write of its type.
pub(super) fn tests(field_bytes: u64) -> Vec<TypeTest> {
    let value = "x".repeat(field_bytes as usize);
    let mut hset = vec!["HSET".to_string(), "rec:__rand_int__".to_string()];
    for f in 0..FIELDS {
        hset.push(format!("field{f}"));
        hset.push(value.clone());
    }
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        TypeTest {
            name: "HSET",
            command: hset,
        },
        TypeTest {
            name: "HGETALL",
            command: words(&["HGETALL", "rec:__rand_int__"]),
        },
        TypeTest {
            name: "ZADD",
            command: words(&["ZADD", INDEX_KEY, "__rand_int__", "rec:__rand_int__"]),
        },
        TypeTest {
            name: "ZRANGEBYSCORE",
            command: words(&[
                "ZRANGEBYSCORE",
                INDEX_KEY,
                "__rand_int__",
                "+inf",
                "LIMIT",
                "0",
                "10",
            ]),
        },
        TypeTest {
            name: "LPUSH",
            command: Vec::new(),
        },
        TypeTest {
            name: "LPOP",
            command: Vec::new(),
        },
    ]
}

/// redis-benchmark's replacement of `__rand_int__` for index `i`.
fn record_key(i: u64) -> String {
    format!("rec:{i:012}")
}

/// Writes every record `rec:000000000000`.. of `records` (10 fields) and puts each in
/// the index at its number as score, checking every reply.
pub(super) fn preload(port: u16, records: u64, field_bytes: u64) -> Result<()> {
    let value = vec![b'x'; field_bytes as usize];
    let fields: Vec<Vec<u8>> = (0..FIELDS)
        .map(|f| format!("field{f}").into_bytes())
        .collect();
    let hset = |i: u64| {
        let key = record_key(i).into_bytes();
        let mut args: Vec<&[u8]> = vec![b"HSET", &key];
        for field in &fields {
            args.push(field);
            args.push(&value);
        }
        command(&args)
    };
    let integer = |line: &str| line.starts_with(':');
    load_requests(port, 0..records, &hset, &integer)?;
    let zadd = |i: u64| {
        let (score, member) = (i.to_string(), record_key(i));
        command(&[
            b"ZADD",
            INDEX_KEY.as_bytes(),
            score.as_bytes(),
            member.as_bytes(),
        ])
    };
    load_requests(port, 0..records, &zadd, &integer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_has_ten_fields_in_redis_benchmarks_key_names() {
        let all = tests(100);
        let hset = &all[0].command;
        assert_eq!(hset.len(), 2 + 2 * FIELDS);
        assert_eq!(hset[1], "rec:__rand_int__");
        assert_eq!(hset[3].len(), 100);
        assert_eq!(record_key(42), "rec:000000000042");
        let names: Vec<&str> = all.iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            ["HSET", "HGETALL", "ZADD", "ZRANGEBYSCORE", "LPUSH", "LPOP"]
        );
        assert!(
            all[4].command.is_empty(),
            "LPUSH is redis-benchmark's own test"
        );
    }
}
