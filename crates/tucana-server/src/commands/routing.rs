//! Cluster mode's one seam between a request and the keyspace its keys live in.
//!
//! Owns: finding a request's keys (the table's key positions), their one hash slot
//! (`CROSSSLOT` when they have several), whether this server serves that slot (`MOVED`
//! to the primary that does, `CLUSTERDOWN` when nobody does; on a `READONLY` connection
//! a read of a slot this server backs is served from the replica), and [`SlotKv`], which
//! stores a handler's keys slot-prefixed in the region's keyspace. Handlers written
//! against [`Kv`] so learn nothing of slots. It does not own the cluster map or the
//! regions' keyspaces (`cluster`), nor the commands that list keys (`cluster_keys`).
//!
//! Replies follow Redis Cluster's documented shapes: `-MOVED <slot> <host>:<port>`,
//! `-CROSSSLOT Keys in request don't hash to the same slot`, `-CLUSTERDOWN Hash slot not
//! served`.
//!
//! Thread-safety: plain functions over the connection's session and the shared cluster
//! view (read without waiting on etcd).

use tucana_cluster::{key_slot, storage_key, RegionId};

use crate::cluster::Route;
use crate::resp::Reply;

use super::kv::{Bounds, Kv, Ops, Pairs};
use super::table::{Run, Spec, NOMULTI, NUMKEYS, TXCTL};
use super::Call;

/// A request that may run here: its keys' hash slot, in this server's region `region`,
/// or, for a read on a `READONLY` connection, in the replica of a region it backs.
#[derive(Clone, Copy)]
pub(super) struct Routed {
    pub(super) hash_slot: u16,
    pub(super) region: RegionId,
    pub(super) replica: bool,
}

pub(super) fn crossslot() -> Reply {
    Reply::error("CROSSSLOT Keys in request don't hash to the same slot")
}

/// The keys of `args` by the table's key positions `(first, last, step)` (a negative
/// `last` counts from the end, as in Redis's command table). With `last` =
/// [`NUMKEYS`], `first` is the position of a key count followed by that many keys, and
/// `step` 1 says argument 1 is a key too (the destination of ZUNIONSTORE); a count that
/// is not a number names no keys (the handler answers the error).
pub(super) fn keys<'a>(spec: &Spec, args: &'a [Vec<u8>]) -> impl Iterator<Item = &'a [u8]> {
    let (first, last, step) = spec.keys;
    let n = args.len() as i32;
    let (head, positions, step) = if last == NUMKEYS {
        let count = args
            .get(first as usize)
            .and_then(|c| super::parse_i64(c))
            .unwrap_or(0)
            .clamp(0, i64::from(n)) as i32;
        let dest = if step == 1 { 1..2 } else { 0..0 };
        (dest, first + 1..(first + 1 + count).min(n), 1)
    } else {
        let last = if last < 0 { n + last } else { last.min(n - 1) };
        let positions = if first <= 0 || step <= 0 {
            0..0
        } else {
            first..last + 1
        };
        (0..0, positions, step.max(1))
    };
    head.chain(positions.step_by(step as usize))
        .map(move |i| args[i as usize].as_slice())
}

/// The one hash slot of the request's keys (`None`: it has none), or `CROSSSLOT`.
fn hash_slot(spec: &Spec, args: &[Vec<u8>]) -> Result<Option<u16>, Reply> {
    let mut found = None;
    for key in keys(spec, args) {
        let slot = key_slot(key);
        match found {
            None => found = Some(slot),
            Some(s) if s != slot => return Err(crossslot()),
            Some(_) => {}
        }
    }
    Ok(found)
}

/// The region of `hash_slot` if this server serves it, else the redirection or error a
/// client is answered.
pub(super) fn route_slot(call: &Call<'_>, hash_slot: u16) -> Result<Routed, Reply> {
    let Some(cluster) = &call.state.cluster else {
        return Err(Reply::error(
            "ERR This instance has cluster support disabled",
        ));
    };
    // After ASKING, a slot this server imports runs in the migration's target region.
    if call.session.asking {
        if let Some(region) = crate::migration::importing_here(cluster, hash_slot) {
            return Ok(Routed {
                hash_slot,
                region,
                replica: false,
            });
        }
    }
    match cluster.route(hash_slot) {
        Route::Here(region) => Ok(Routed {
            hash_slot,
            region,
            replica: false,
        }),
        Route::Moved(addr) => Err(Reply::error(format!("MOVED {hash_slot} {addr}"))),
        Route::Down => Err(Reply::error("CLUSTERDOWN Hash slot not served")),
    }
}

/// Where a request runs in cluster mode (`Ok(None)` outside it, or for a request with no
/// keys). Inside `MULTI` a command is checked alone, as Redis does, and the transaction
/// remembers its slot: `EXEC` refuses a transaction whose commands' slots differ.
pub(super) fn route(
    call: &mut Call<'_>,
    spec: &Spec,
    args: &[Vec<u8>],
) -> Result<Option<Routed>, Reply> {
    if call.state.cluster.is_none() {
        return Ok(None);
    }
    let Some(slot) = hash_slot(spec, args)? else {
        return Ok(None);
    };
    // READONLY: a read outside a transaction of a slot this server backs is served from
    // the replica (its last applied commit), as a Redis Cluster replica serves it.
    let replica_read =
        call.session.readonly && call.session.multi.is_none() && matches!(spec.run, Run::Read(_));
    if replica_read {
        if let Some(region) = call.state.cluster.as_ref().and_then(|c| c.backs(slot)) {
            return Ok(Some(Routed {
                hash_slot: slot,
                region,
                replica: true,
            }));
        }
    }
    let routed = route_slot(call, slot)?;
    let queued = spec.flags & (TXCTL | NOMULTI) == 0;
    if let Some(multi) = call.session.multi.as_mut().filter(|_| queued) {
        match multi.hash_slot {
            None => multi.hash_slot = Some(slot),
            Some(s) if s != slot => multi.cross_slot = true,
            Some(_) => {}
        }
    }
    Ok(Some(routed))
}

/// A [`Kv`] whose keys are those of one hash slot, stored slot-prefixed in the region's
/// keyspace (`tucana_cluster::storage_key`).
pub(super) struct SlotKv<'a> {
    pub(super) inner: &'a mut dyn Kv,
    pub(super) hash_slot: u16,
}

impl SlotKv<'_> {
    fn stored(&self, key: &[u8]) -> Vec<u8> {
        storage_key(self.hash_slot, key)
    }
}

impl Kv for SlotKv<'_> {
    fn hash_slot(&self) -> Option<u16> {
        Some(self.hash_slot)
    }

    fn settings(&self) -> &crate::settings::Settings {
        self.inner.settings()
    }

    fn get(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        let stored = self.stored(key);
        self.inner.get(&stored)
    }

    fn value_len(&mut self, key: &[u8]) -> tucana::Result<Option<usize>> {
        let stored = self.stored(key);
        self.inner.value_len(&stored)
    }

    fn apply(&mut self, ops: Ops) -> tucana::Result<()> {
        let ops = ops
            .into_iter()
            .map(|(key, value)| (self.stored(&key), value))
            .collect();
        self.inner.apply(ops)
    }

    fn multi_get(&mut self, keys: &[Vec<u8>]) -> tucana::Result<Vec<Option<Vec<u8>>>> {
        let stored: Vec<Vec<u8>> = keys.iter().map(|k| self.stored(k)).collect();
        self.inner.multi_get(&stored)
    }

    fn lookup(&mut self, key: &[u8]) -> tucana::Result<Option<Vec<u8>>> {
        let stored = self.stored(key);
        self.inner.lookup(&stored)
    }

    fn count_lookup(&mut self, key: &[u8], hit: bool) {
        let stored = self.stored(key);
        self.inner.count_lookup(&stored, hit);
    }

    /// The bounds slot-prefixed (an unbounded end becomes the end of the slot's keys),
    /// the keys read back without the prefix.
    fn range(&mut self, bounds: Bounds, rev: bool, limit: usize) -> tucana::Result<Pairs> {
        use std::ops::Bound;
        let prefix = storage_key(self.hash_slot, b"");
        let lo = match bounds.0 {
            Bound::Included(k) => Bound::Included(self.stored(&k)),
            Bound::Excluded(k) => Bound::Excluded(self.stored(&k)),
            Bound::Unbounded => Bound::Included(prefix.clone()),
        };
        let hi = match bounds.1 {
            Bound::Included(k) => Bound::Included(self.stored(&k)),
            Bound::Excluded(k) => Bound::Excluded(self.stored(&k)),
            // The slot's keys end where the next slot's prefix starts.
            Bound::Unbounded => {
                Bound::Excluded((u32::from(self.hash_slot) + 1).to_be_bytes()[2..].to_vec())
            }
        };
        let pairs = self.inner.range((lo, hi), rev, limit)?;
        Ok(pairs
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_vec(), v))
            .collect())
    }

    fn may_expire(&self) -> bool {
        self.inner.may_expire()
    }

    fn note_deadline(&mut self) {
        self.inner.note_deadline();
    }

    fn note_abandoned(&mut self) {
        self.inner.note_abandoned();
    }

    fn touch(&mut self, key: &[u8]) {
        let stored = self.stored(key);
        self.inner.touch(&stored);
    }

    fn notify_flags(&self) -> u32 {
        self.inner.notify_flags()
    }

    /// The client's key, not the stored one: a notification names what the client wrote.
    fn notify(&mut self, class: u32, event: &'static str, key: &[u8]) {
        self.inner.notify(class, event, key);
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::{lookup, table};
    use super::*;

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    fn slot_of(words: &[&str]) -> Result<Option<u16>, Reply> {
        let spec = &table()[lookup(words[0].as_bytes()).unwrap()];
        hash_slot(spec, &args(words))
    }

    #[test]
    fn keys_come_from_the_table_positions() {
        assert_eq!(slot_of(&["get", "foo"]).ok(), Some(Some(12182)));
        assert_eq!(slot_of(&["ping"]).ok(), Some(None));
        // A key count that is not a number (or too big) names no keys past the arguments.
        assert_eq!(slot_of(&["zunion", "x", "a"]).ok(), Some(None));
        assert_eq!(
            slot_of(&["zunion", "9", "{u}a"]).ok(),
            Some(Some(key_slot(b"u")))
        );
        // MSET's keys are every other argument: values do not count.
        assert_eq!(
            slot_of(&["mset", "{u}a", "x", "{u}b", "y"]).ok(),
            Some(Some(key_slot(b"u")))
        );
        assert!(matches!(
            slot_of(&["mset", "a", "1", "b", "2"]),
            Err(Reply::Error(e)) if e.starts_with("CROSSSLOT")
        ));
        assert!(matches!(
            slot_of(&["del", "{t}1", "{t}2", "other"]),
            Err(Reply::Error(e)) if e.starts_with("CROSSSLOT")
        ));
    }

    #[test]
    fn collection_commands_route_by_their_keys_only() {
        let u = Some(Some(key_slot(b"u")));
        // Fields, members, scores and elements are not keys.
        for words in [
            &["hset", "{u}h", "f", "v", "g", "w"][..],
            &["zadd", "{u}z", "1", "m"],
            &["zrangebyscore", "{u}z", "-inf", "+inf", "LIMIT", "0", "1"],
            &["sadd", "{u}s", "a", "b"],
            &["lpush", "{u}l", "a", "b"],
            &["object", "encoding", "{u}h"],
            // Multi-key commands: every key counts.
            &["smove", "{u}a", "{u}b", "member"],
            &["lmove", "{u}a", "{u}b", "LEFT", "RIGHT"],
            &["sinterstore", "{u}d", "{u}a", "{u}b"],
            &["sunion", "{u}a", "{u}b"],
            &["rename", "{u}a", "{u}b"],
            &["renamenx", "{u}a", "{u}b"],
            &["copy", "{u}a", "{u}b", "REPLACE"],
            &["lcs", "{u}a", "{u}b", "IDX"],
            // Keys after a count: what follows them (weights, options) is not a key.
            &["zunion", "2", "{u}a", "{u}b", "WEIGHTS", "1", "2"],
            &[
                "zunionstore",
                "{u}d",
                "2",
                "{u}a",
                "{u}b",
                "AGGREGATE",
                "MAX",
            ],
            &["sintercard", "1", "{u}a", "LIMIT", "5"],
            &["lmpop", "2", "{u}a", "{u}b", "LEFT", "COUNT", "3"],
            &["zmpop", "1", "{u}a", "MIN"],
            &["zrangestore", "{u}d", "{u}a", "0", "-1"],
        ] {
            assert_eq!(slot_of(words).ok(), u, "{words:?}");
        }
        for words in [
            &["smove", "a", "b", "m"][..],
            &["rpoplpush", "a", "b"],
            // A key moves within its slot only: across slots it would change servers.
            &["rename", "a", "b"],
            &["renamenx", "a", "b"],
            &["copy", "a", "b"],
            &["zunionstore", "d", "2", "{u}a", "{u}b"],
            &["zinter", "2", "{u}a", "b"],
            &["zrangestore", "d", "{u}a", "0", "-1"],
            &["sdiffstore", "{u}d", "{u}a", "b"],
        ] {
            assert!(
                matches!(slot_of(words), Err(Reply::Error(e)) if e.starts_with("CROSSSLOT")),
                "{words:?}"
            );
        }
    }
}
