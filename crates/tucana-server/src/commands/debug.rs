//! DEBUG: the subcommands of Redis's `DEBUG` that mean something for tucana, which
//! Redis's own test suite and some operators use.
//!
//! - `SET-ACTIVE-EXPIRE 0|1`: stops or restarts the sweeper's deletion of expired keys
//!   (`settings`, `sweeper`); lazy expiry still hides them.
//! - `DIGEST-VALUE key...` and `DIGEST`: a digest of values (of the whole selected
//!   database: every live key, its value and its deadline). Equal content gives equal
//!   digests, whatever the history (a list built by LPUSH or by RPUSH, a copy); a
//!   missing key, or an empty database, is forty zeros, as in Redis. The digest is not
//!   Redis's (it is computed another way) and is only comparable within one server
//!   process (`DefaultHasher`).
//! - `RELOAD`: what Redis's "save and load again" proves, done the tucana way: a commit,
//!   then a walk of the whole committed volume verifying every invariant and checksum
//!   (`Database::check`, an error reply if any fails), then each database's keyspace
//!   handle is opened again from the engine and its flags (`may expire`) derived again
//!   from what the volume holds. O(volume); refused in cluster mode. `LOADAOF` (reload
//!   from the append-only file) is the same here: every write is in the log.
//! - `PROTOCOL type`: one reply of each RESP3 type, for client tests.
//! - `OBJECT key`: the reference count (1) and the encoding `OBJECT ENCODING` answers.
//! - `SLEEP seconds`: holds this connection (not the server: it runs on the blocking
//!   pool).
//! - `QUICKLIST-PACKED-THRESHOLD size`: accepted with no effect, as Redis's encoding
//!   thresholds are by `CONFIG SET` (`settings`): every list element is its own record
//!   here, whatever its size, so there is no packed or plain node to choose.
//!
//! Served only when the server was started with `--enable-debug-command`
//! (`ServerConfig::enable_debug_command`), as Redis 7 serves it only when configured.
//! It owns no state: the active-expiry switch lives in `settings`.
//!
//! Thread-safety: plain functions; `RELOAD` and `SLEEP` wait, so the command is marked as
//! one that may block (`table`).

use std::hash::{DefaultHasher, Hasher};
use std::time::Duration;

use crate::expiry::{is_reserved, now_ms};
use crate::resp::Reply;
use crate::types::{Family, Kind, Meta};

use super::collection::all_members;
use super::expire::read_stored;
use super::kv::{Kv, ReadKv};
use super::{printable, Call};

/// A digest being computed: three differently seeded 64-bit hashes of a stream of
/// length-prefixed fields (160 bits are printed, as Redis's SHA1 digests are).
struct Digest([DefaultHasher; 3]);

impl Digest {
    fn new() -> Digest {
        let mut hashers = [
            DefaultHasher::new(),
            DefaultHasher::new(),
            DefaultHasher::new(),
        ];
        for (seed, h) in hashers.iter_mut().enumerate() {
            h.write_u8(seed as u8);
        }
        Digest(hashers)
    }

    fn feed(&mut self, bytes: &[u8]) {
        for h in &mut self.0 {
            h.write_usize(bytes.len());
            h.write(bytes);
        }
    }

    fn hex(&self) -> String {
        let mut text: String = self
            .0
            .iter()
            .map(|h| format!("{:016x}", h.finish()))
            .collect();
        text.truncate(40);
        text
    }
}

/// What a missing key or an empty database digests to (as in Redis).
const NOTHING: &str = "0000000000000000000000000000000000000000";

/// The digest of a live key's value: its type and its content in a canonical order
/// (fields, members in byte order; list elements in list order; no versions or indexes).
fn value_digest(kv: &mut dyn Kv, key: &[u8], value: &[u8]) -> tucana::Result<String> {
    let mut d = Digest::new();
    if !crate::types::is_typed(value) {
        d.feed(b"string");
        d.feed(value);
        return Ok(d.hex());
    }
    let meta = Meta::decode(value)?;
    d.feed(meta.kind.name().as_bytes());
    let (family, with_values) = match meta.kind {
        Kind::Hash => (Family::Hash, true),
        Kind::Set => (Family::Set, false),
        Kind::ZSet => (Family::ZMember, true),
        Kind::List => (Family::List, false),
    };
    let members = if meta.packed {
        crate::types::packed::decode(value)?
    } else {
        all_members(kv, family, key, meta.version)?
    };
    for (suffix, member) in members {
        if meta.kind == Kind::List {
            d.feed(&member);
            continue;
        }
        d.feed(&suffix);
        if with_values {
            d.feed(&member);
        }
    }
    Ok(d.hex())
}

/// Runs `f` with a read-only store on the selected database.
fn with_reader<R>(
    call: &Call<'_>,
    mut f: impl FnMut(&mut ReadKv<'_>, Option<&tucana::Keyspace>) -> tucana::Result<R>,
) -> tucana::Result<R> {
    let state = call.state;
    let slot = call.slot();
    slot.read(|ks| {
        let mut kv = ReadKv {
            ks,
            state,
            may_expire: slot.may_expire(),
            misses_of: None,
        };
        f(&mut kv, ks)
    })
}

/// `DEBUG DIGEST-VALUE key...`
fn digest_values(call: &Call<'_>, keys: &[Vec<u8>]) -> tucana::Result<Reply> {
    with_reader(call, |kv, _| {
        let now = now_ms();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let digest = match read_stored(kv, key, now)?.value {
                Some(value) => value_digest(kv, key, &value)?,
                None => NOTHING.to_string(),
            };
            out.push(Reply::Status(digest));
        }
        Ok(Reply::Array(out))
    })
}

/// `DEBUG DIGEST`: every live key of the selected database in key order, with its
/// value's digest and its deadline.
fn digest_database(call: &Call<'_>) -> tucana::Result<Reply> {
    with_reader(call, |kv, ks| {
        let Some(ks) = ks else {
            return Ok(Reply::Status(NOTHING.to_string()));
        };
        let now = now_ms();
        let mut d = Digest::new();
        let mut any = false;
        for item in ks.range::<Vec<u8>, _>(..) {
            let (key, _) = item?;
            if is_reserved(&key) {
                continue;
            }
            let stored = read_stored(kv, &key, now)?;
            let Some(value) = stored.value.as_deref() else {
                continue;
            };
            any = true;
            d.feed(&key);
            d.feed(value_digest(kv, &key, value)?.as_bytes());
            d.feed(&stored.deadline_ms().unwrap_or(0).to_be_bytes());
        }
        Ok(Reply::Status(if any {
            d.hex()
        } else {
            NOTHING.to_string()
        }))
    })
}

/// `DEBUG RELOAD`: see the module doc.
fn reload(call: &Call<'_>) -> tucana::Result<Reply> {
    if call.state.cluster.is_some() {
        return Ok(Reply::error(
            "ERR DEBUG RELOAD is not supported in cluster mode",
        ));
    }
    let db = &call.state.store.db;
    db.check()?;
    for slot in call.state.store.slots() {
        slot.reload(db);
    }
    Ok(Reply::Ok)
}

/// `DEBUG OBJECT key`: what is known of a value's representation, in Redis's
/// `name:value` form: its reference count (1: nothing is shared) and the encoding
/// `OBJECT ENCODING` answers. Redis's memory address, LRU clock and serialized length
/// have no meaning here and are left out.
fn object(call: &Call<'_>, key: &[u8]) -> tucana::Result<Reply> {
    with_reader(call, |kv, _| {
        let args = [b"OBJECT".to_vec(), b"ENCODING".to_vec(), key.to_vec()];
        Ok(match super::strings::cmd_object(kv, &args)? {
            Reply::Bulk(encoding) => Reply::Status(format!(
                "refcount:1 encoding:{}",
                String::from_utf8_lossy(&encoding)
            )),
            Reply::Nil => Reply::error("ERR no such key"),
            other => other,
        })
    })
}

/// `DEBUG PROTOCOL type`: a sample reply of each RESP3 type (what Redis answers).
fn protocol(kind: &[u8]) -> Reply {
    let n = |i: i64| Reply::Int(i);
    match kind.to_ascii_lowercase().as_slice() {
        b"string" => Reply::bulk("Hello World"),
        b"integer" => n(12345),
        b"double" => Reply::Double("3.141".into()),
        b"bignum" => Reply::BigNumber("1234567999999999999999999999999999999".into()),
        b"null" => Reply::Nil,
        b"array" => Reply::Array((0..3).map(n).collect()),
        b"set" => Reply::Set((0..3).map(n).collect()),
        b"map" => Reply::Map((0..3).map(|i| (n(i), Reply::Bool(i == 1))).collect()),
        b"attrib" => Reply::WithAttributes(
            vec![(
                Reply::bulk("key-popularity"),
                Reply::Array(vec![Reply::bulk("key:123"), n(90)]),
            )],
            Box::new(Reply::bulk("Some real reply following the attribute")),
        ),
        b"verbatim" => Reply::Verbatim(*b"txt", b"This is a verbatim\nstring".to_vec()),
        b"true" => Reply::Bool(true),
        b"false" => Reply::Bool(false),
        _ => Reply::error(
            "ERR Wrong protocol type name. Please use one of the following: string|integer|double|bignum|null|array|set|map|attrib|verbatim|true|false",
        ),
    }
}

/// A memory size as Redis's configuration reads them (`100`, `1b`, `10kb`, `2m`, `1gb`).
fn valid_memory_size(arg: &[u8]) -> bool {
    let text = String::from_utf8_lossy(arg).to_ascii_lowercase();
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &text[digits.len()..];
    digits.parse::<u64>().is_ok() && ["", "b", "k", "kb", "m", "mb", "g", "gb"].contains(&unit)
}

/// `DEBUG subcommand [argument...]`
pub(super) fn cmd_debug(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if !call.state.config.enable_debug_command {
        return Ok(Reply::error(
            "ERR DEBUG command not allowed: start the server with --enable-debug-command",
        ));
    }
    let sub = args[1].to_ascii_uppercase();
    Ok(match (sub.as_slice(), &args[2..]) {
        (b"SET-ACTIVE-EXPIRE", [flag]) => match flag.as_slice() {
            b"0" | b"1" => {
                call.state.settings.set_active_expire(flag == b"1");
                Reply::Ok
            }
            _ => super::not_an_integer(),
        },
        (b"DIGEST-VALUE", keys) => digest_values(call, keys)?,
        (b"DIGEST", []) => digest_database(call)?,
        // The log is tucana's append-only file: loading it again is a reload.
        (b"RELOAD", _) | (b"LOADAOF", []) => reload(call)?,
        (b"PROTOCOL", [kind]) => protocol(kind),
        (b"OBJECT", [key]) => object(call, key)?,
        (b"SLEEP", [seconds]) => {
            match std::str::from_utf8(seconds)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
            {
                Some(s) => {
                    std::thread::sleep(Duration::from_secs_f64(s));
                    Reply::Ok
                }
                None => Reply::error("ERR value is not a valid float"),
            }
        }
        (b"QUICKLIST-PACKED-THRESHOLD", [size]) => {
            if valid_memory_size(size) {
                Reply::Ok
            } else {
                Reply::error("ERR argument must be a memory value")
            }
        }
        (b"HELP", []) => Reply::Array(
            [
                "DEBUG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "DIGEST",
                "    A digest of the selected database's keys, values and deadlines.",
                "DIGEST-VALUE <key> [<key> ...]",
                "    A digest of each key's value.",
                "OBJECT <key>",
                "    The reference count and encoding of a key's value.",
                "PROTOCOL <type>",
                "    A sample reply of a RESP3 type.",
                "QUICKLIST-PACKED-THRESHOLD <size>",
                "    Accepted with no effect (every list element is its own record).",
                "RELOAD",
                "    Commit, verify the whole volume, and open the databases again.",
                "LOADAOF",
                "    The same as RELOAD (every write is in the log).",
                "SET-ACTIVE-EXPIRE <0|1>",
                "    Stop or restart the deletion of expired keys in the background.",
                "SLEEP <seconds>",
                "    Hold this connection for a while.",
            ]
            .into_iter()
            .map(|l| Reply::Status(l.into()))
            .collect(),
        ),
        _ => Reply::error(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try DEBUG HELP.",
            printable(&args[1], 32)
        )),
    })
}
