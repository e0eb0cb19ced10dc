//! The commands that list or count keys, in cluster mode: over the regions this server is
//! primary of, with the slot prefix stripped so clients see their own keys (SCAN, KEYS,
//! DBSIZE, FLUSHDB/FLUSHALL, CLUSTER COUNTKEYSINSLOT and GETKEYSINSLOT).
//!
//! Owns walking the regions' keyspaces in stored-key order: regions are disjoint slot
//! ranges and stored keys start with their slot (big-endian), so the regions by first
//! slot, each in key order, are one ordered sequence, and a SCAN cursor is the last stored
//! key it returned. It does not own routing (`routing`) nor the standalone versions of
//! these commands (`keys`).
//!
//! Thread-safety: as `keys`: reads take no lock and start over if a keyspace is dropped
//! under them; flushing takes each region's write lock.

use std::ops::Bound;
use std::sync::Arc;

use tucana_cluster::slot::slot_prefix;
use tucana_cluster::{split_storage_key, SlotRange, SLOTS};

use crate::glob::glob_match;
use crate::migration::SlotState;
use crate::resp::Reply;
use crate::store::Slot;

use crate::expiry::{now_ms, MARKER};

use super::expire::{hidden_records, visible};
use super::strings::type_name;
use super::Call;

/// The regions this server leads now, by first slot.
fn regions(call: &Call<'_>) -> Vec<(SlotRange, Arc<Slot>)> {
    match &call.state.cluster {
        Some(cluster) => cluster.led_regions(&call.state.store.db),
        None => Vec::new(),
    }
}

/// Stored keys of slots `first..=last`: `[prefix(first), prefix(last + 1))`.
fn slots_bounds(first: u16, last: u16) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let lo = Bound::Included(slot_prefix(first).to_vec());
    let hi = if last + 1 >= SLOTS {
        Bound::Unbounded
    } else {
        Bound::Excluded(slot_prefix(last + 1).to_vec())
    };
    (lo, hi)
}

/// The client's key of a stored one (`None` for a stored key too short to hold a slot,
/// which this server never writes).
fn user_key(stored: &[u8]) -> Option<Vec<u8>> {
    split_storage_key(stored).ok().map(|(_, key)| key.to_vec())
}

/// Whether the stored key `stored`, whose client's key is `key`, is live (not a deadline
/// record nor expired; see `expire::visible`).
fn visible_stored(
    ks: &tucana::Keyspace,
    may_expire: bool,
    stored: &[u8],
    key: &[u8],
    now: u64,
) -> tucana::Result<bool> {
    let prefix = &stored[..stored.len() - key.len()];
    visible(ks, may_expire, prefix, key, now)
}

/// `SCAN` in cluster mode (options parsed by `keys::cmd_scan`). The cursor contract is
/// the standalone one, over the keys of every region this server leads.
pub(super) fn scan(
    call: &Call<'_>,
    after: Option<Vec<u8>>,
    pattern: Option<&[u8]>,
    count: usize,
    type_filter: Option<&[u8]>,
) -> tucana::Result<(Vec<Reply>, Option<Vec<u8>>)> {
    let mut keys = Vec::new();
    let mut last: Option<Vec<u8>> = None;
    let mut examined = 0;
    let mut more = false;
    for (range, slot) in regions(call) {
        let (mut lo, hi) = slots_bounds(range.start, range.end);
        if let Some(after) = &after {
            let past_region = match &hi {
                Bound::Excluded(end) => after >= end,
                _ => false,
            };
            if past_region {
                continue;
            }
            if after.as_slice() >= slot_prefix(range.start).as_slice() {
                lo = Bound::Excluded(after.clone());
            }
        }
        let (may_expire, now) = (slot.may_expire(), now_ms());
        let (found, region_last, region_more, seen) = slot.read(|ks| {
            let mut found = Vec::new();
            let mut region_last = None;
            let Some(ks) = ks else {
                return Ok((found, region_last, false, examined));
            };
            let mut range = ks.range::<Vec<u8>, _>((lo.clone(), hi.clone())).peekable();
            let mut seen = examined;
            while seen < count {
                let Some(item) = range.next() else { break };
                let (stored, value) = item?;
                seen += 1;
                if let Some(key) = user_key(&stored) {
                    if type_filter
                        .is_none_or(|t| t.eq_ignore_ascii_case(type_name(&value).as_bytes()))
                        && pattern.is_none_or(|p| glob_match(p, &key))
                        && visible_stored(ks, may_expire, &stored, &key, now)?
                    {
                        found.push(Reply::Bulk(key));
                    }
                }
                region_last = Some(stored);
            }
            let more = range.peek().is_some();
            Ok((found, region_last, more, seen))
        })?;
        examined = seen;
        if region_last.is_some() {
            last = region_last;
        }
        keys.extend(found);
        if region_more || examined >= count {
            // Something may follow (in this region or a later one).
            more = true;
            break;
        }
    }
    Ok((keys, if more { last } else { None }))
}

/// `KEYS pattern` over the regions this server leads.
pub(super) fn keys(call: &Call<'_>, pattern: &[u8]) -> tucana::Result<Reply> {
    let mut keys = Vec::new();
    for (range, slot) in regions(call) {
        let (lo, hi) = slots_bounds(range.start, range.end);
        let (may_expire, now) = (slot.may_expire(), now_ms());
        let found = slot.read(|ks| {
            let mut found = Vec::new();
            if let Some(ks) = ks {
                for item in ks.range::<Vec<u8>, _>((lo.clone(), hi.clone())) {
                    let (stored, _) = item?;
                    match user_key(&stored) {
                        Some(key)
                            if glob_match(pattern, &key)
                                && visible_stored(ks, may_expire, &stored, &key, now)? =>
                        {
                            found.push(Reply::Bulk(key))
                        }
                        _ => {}
                    }
                }
            }
            Ok(found)
        })?;
        keys.extend(found);
    }
    Ok(Reply::Array(keys))
}

/// `DBSIZE`: the keys of every region this server leads.
pub(super) fn dbsize(call: &Call<'_>) -> tucana::Result<Reply> {
    let mut total = 0u64;
    for (range, slot) in regions(call) {
        let may_expire = slot.may_expire();
        total += slot.read(|ks| match ks {
            None => Ok(0),
            Some(ks) if !may_expire => Ok(ks.len()),
            // The marker, and each slot's deadline records and expired keys.
            Some(ks) => {
                let now = now_ms();
                let mut hidden = u64::from(ks.contains(MARKER)?);
                for hash_slot in range.start..=range.end {
                    hidden += hidden_records(ks, &slot_prefix(hash_slot), now)?;
                }
                Ok(ks.len().saturating_sub(hidden))
            }
        })?;
    }
    Ok(Reply::Int(total as i64))
}

/// `FLUSHDB` / `FLUSHALL`: drops the keyspace of every region this server leads.
pub(super) fn flush(call: &Call<'_>) -> tucana::Result<Reply> {
    // Dropping a migration's source would forget its tombstones (DESIGN.md, "Slot
    // migration"), dropping its target the batches it acknowledged.
    if let Some(cluster) = &call.state.cluster {
        let view = cluster.view();
        let involved = view.map.as_ref().is_some_and(|map| {
            map.migrations.iter().any(|m| {
                m.target.primary == cluster.id
                    || map
                        .region(m.source)
                        .is_some_and(|r| r.primary == cluster.id)
            })
        });
        if involved {
            return Ok(Reply::error(
                "ERR a slot migration involves this server: flush once it finished (tucana cluster status)",
            ));
        }
    }
    for (_, slot) in regions(call) {
        slot.lock_writes().flush(&call.state.store.db)?;
    }
    Ok(Reply::Ok)
}

/// The keyspace of the region serving `hash_slot` here, for a read of several of its keys
/// (TRANGE, TPREFIX), or the reply to give instead: `MOVED`/`CLUSTERDOWN` as for any key
/// (`routing`), `TRYAGAIN` while the slot is migrating (its keys are on both sides, as
/// Redis answers a multi-key command then).
pub(super) fn slot_region(call: &Call<'_>, hash_slot: u16) -> Result<Arc<Slot>, Reply> {
    let routed = super::routing::route_slot(call, hash_slot)?;
    let Some(cluster) = &call.state.cluster else {
        return Err(Reply::error(
            "ERR This instance has cluster support disabled",
        ));
    };
    match crate::migration::slot_state(cluster, hash_slot, routed.region) {
        SlotState::Owned => Ok(cluster.region(&call.state.store.db, routed.region)),
        SlotState::Migrating { .. } | SlotState::Importing => Err(Reply::error(
            "TRYAGAIN the slot is migrating: its keys are on two servers; retry",
        )),
        SlotState::Gone(reply) => Err(Reply::error(reply)),
    }
}

/// Up to `limit` keys stored in `hash_slot` here (none if this server does not lead it).
pub(super) fn keys_in_slot(
    call: &Call<'_>,
    hash_slot: u16,
    limit: usize,
) -> tucana::Result<Vec<Vec<u8>>> {
    let Some((_, slot)) = regions(call)
        .into_iter()
        .find(|(range, _)| range.contains(hash_slot))
    else {
        return Ok(Vec::new());
    };
    let (lo, hi) = slots_bounds(hash_slot, hash_slot);
    let (may_expire, now) = (slot.may_expire(), now_ms());
    slot.read(|ks| {
        let mut keys = Vec::new();
        if let Some(ks) = ks {
            for item in ks.range::<Vec<u8>, _>((lo.clone(), hi.clone())) {
                if keys.len() == limit {
                    break;
                }
                let (stored, _) = item?;
                if let Some(key) = user_key(&stored) {
                    if visible_stored(ks, may_expire, &stored, &key, now)? {
                        keys.push(key);
                    }
                }
            }
        }
        Ok(keys)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_bounds_cover_exactly_their_slots() {
        let (lo, hi) = slots_bounds(5, 7);
        assert_eq!(lo, Bound::Included(vec![0, 5]));
        assert_eq!(hi, Bound::Excluded(vec![0, 8]));
        assert_eq!(slots_bounds(0, SLOTS - 1).1, Bound::Unbounded);
        assert_eq!(slots_bounds(255, 255).1, Bound::Excluded(vec![1, 0]));
    }
}
