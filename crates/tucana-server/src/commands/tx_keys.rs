//! KEYS and DBSIZE inside `MULTI`: queued like any read (Redis allows them there) and
//! run at `EXEC` through the transaction's store, so they see the writes queued before
//! them, as Redis, which runs a transaction's commands in order, does.
//!
//! Owns only these two readings of the transaction's view (records under the write
//! lock with the transaction's overlay laid over them, `TxKv::range`); outside a
//! transaction `keys::cmd_keys` and `keys::cmd_dbsize` read the keyspace directly.
//!
//! Thread-safety: runs inside EXEC, which holds the database's write lock.

use std::ops::Bound;

use crate::expiry::{is_reserved, RESERVED};
use crate::glob::{glob_match, literal_prefix};
use crate::resp::Reply;

use super::expire::live_len;
use super::kv::Kv;
use super::prefix_end;

/// The reply of `args` when it is KEYS or DBSIZE (`None`: another command). In
/// cluster mode a transaction runs in the region of its keys' slot, and these name no
/// key: refused in place.
pub(super) fn run_in_transaction(
    name: &str,
    kv: &mut dyn Kv,
    args: &[Vec<u8>],
    cluster: bool,
) -> Option<tucana::Result<Reply>> {
    if name != "keys" && name != "dbsize" {
        return None;
    }
    if cluster {
        return Some(Ok(Reply::error(format!(
            "ERR {} inside MULTI is not supported in cluster mode",
            name.to_ascii_uppercase()
        ))));
    }
    Some(if name == "keys" {
        live_keys(kv, &literal_prefix(&args[1])).map(|keys| {
            let matching = keys.into_iter().filter(|k| glob_match(&args[1], k));
            Reply::Array(matching.map(Reply::Bulk).collect())
        })
    } else {
        live_keys(kv, b"").map(|keys| Reply::Int(keys.len() as i64))
    })
}

/// The live keys starting with `prefix`, in key order, skipping the reserved family
/// (deadline records, collections' members) with one range on each side of it.
fn live_keys(kv: &mut dyn Kv, prefix: &[u8]) -> tucana::Result<Vec<Vec<u8>>> {
    let hi = prefix_end(prefix);
    let below_hi = |k: &[u8]| match &hi {
        Bound::Excluded(h) => k < h.as_slice(),
        _ => true,
    };
    let mut pieces = Vec::new();
    // Below the reserved family.
    let first_hi = if below_hi(RESERVED) {
        Bound::Excluded(RESERVED.to_vec())
    } else {
        hi.clone()
    };
    if prefix < RESERVED {
        pieces.push((Bound::Included(prefix.to_vec()), first_hi));
    }
    // Above it.
    if let Bound::Excluded(end) = prefix_end(RESERVED) {
        let lo = if end.as_slice() > prefix {
            end
        } else {
            prefix.to_vec()
        };
        if below_hi(&lo) {
            pieces.push((Bound::Included(lo), hi.clone()));
        }
    }
    let mut keys = Vec::new();
    for bounds in pieces {
        for (key, _) in kv.range(bounds, false, usize::MAX)? {
            if is_reserved(&key) {
                continue;
            }
            if !kv.may_expire() || live_len(kv, &key)?.is_some() {
                keys.push(key);
            }
        }
    }
    Ok(keys)
}
