//! Search inside one node, generic over heap node and disk image (monomorphised).
//!
//! Owns: pivot comparison (prefix first, then inline bytes or the log through `Ctx`), child
//! choice, leaf lookup by prefix + hash, leaf insert position, and materialising a pivot.
//! Does not own: descending the tree, restarts, changes (see `tree`).
//!
//! Thread safety: functions only read through the view traits. On a reader's heap view any
//! value may be torn until validated, so every index stays below the (clamped) count, and a
//! log pointer is validated before it is handed to `Ctx` (a torn pointer could name a
//! random log offset). The caller validates once more before trusting the result.

use std::cmp::Ordering;

use super::node::view::{inline_pivot, InternalRead, LeafRead, SResult, INT_STEM_TAIL_BYTES};
use super::node::{INT_HEADER_STEM_BYTES, MAX_INLINE_PIVOT};
use super::{key_prefix, Ctx};

/// Where a key stands against a node's stem (the bytes every key of a leaf, or every pivot
/// of an internal node, starts with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StemPos {
    /// The key sorts before every key the stem allows (it is smaller, or a proper prefix).
    Below,
    /// The key starts with the stem; the entry prefix it would have in this leaf.
    Inside(u64),
    /// The key sorts after every key the stem allows.
    Above,
}

/// Where `key` stands against `stem`; `Inside` carries `key_prefix(&key[stem.len()..])`.
pub(crate) fn stem_position(stem: &[u8], key: &[u8]) -> StemPos {
    // Word by word rather than a slice comparison: stems are at most 56 bytes, and the
    // `memcmp` call a slice comparison makes cost more than the comparison itself at
    // every node of every descent.
    let n = stem.len().min(key.len());
    let mut i = 0;
    while i + 8 <= n {
        let k = key_prefix(&key[i..i + 8]);
        let s = key_prefix(&stem[i..i + 8]);
        if k != s {
            return if k < s {
                StemPos::Below
            } else {
                StemPos::Above
            };
        }
        i += 8;
    }
    while i < n {
        if key[i] != stem[i] {
            return if key[i] < stem[i] {
                StemPos::Below
            } else {
                StemPos::Above
            };
        }
        i += 1;
    }
    if key.len() < stem.len() {
        StemPos::Below
    } else {
        StemPos::Inside(key_prefix(&key[stem.len()..]))
    }
}

/// `stem_position` against the stem of internal node `v` (unvalidated on a reader's heap
/// view): the header's bytes first, and only for a key that starts with them the bytes
/// of a longer stem, from pivot 0.
#[inline]
fn internal_stem_position<V: InternalRead>(v: &V, key: &[u8]) -> SResult<StemPos> {
    let stem_len = v.stem_len();
    let head = v.stem_head();
    if stem_len <= INT_HEADER_STEM_BYTES {
        return Ok(stem_position(&head[..stem_len], key));
    }
    match stem_position(&head, key) {
        StemPos::Inside(_) => {}
        settled => return Ok(settled),
    }
    // `key` starts with the header's bytes, so it is at least that long.
    let mut tail = [0u8; INT_STEM_TAIL_BYTES];
    let n = v.stem_tail(&mut tail)?;
    Ok(stem_position(&tail[..n], &key[INT_HEADER_STEM_BYTES..]))
}

/// `stem_position` against the stem of leaf `l` (unvalidated on a reader's heap view).
fn leaf_stem_position<L: LeafRead>(l: &L, key: &[u8]) -> StemPos {
    let stem = l.stem();
    stem_position(&stem[..l.stem_len()], key)
}

#[cfg(test)]
thread_local! {
    /// Pivot comparisons the prefixes did not settle, on this thread (tests count them).
    pub(crate) static FULL_PIVOT_COMPARES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Compares pivot `i` of `v` with `key` (`pivot.cmp(key)`), for a key that starts with the
/// node's stem of `stem_len` bytes; `kp` is `key_prefix(&key[stem_len..])`.
pub(crate) fn cmp_pivot<V: InternalRead, C: Ctx>(
    v: &V,
    ctx: &C,
    i: usize,
    key: &[u8],
    stem_len: usize,
    kp: u64,
) -> SResult<Ordering> {
    let pp = v.pivot_prefix(i);
    if pp != kp {
        // Prefixes are monotone in key order among keys with the stem, so different
        // prefixes settle it.
        return Ok(pp.cmp(&kp));
    }
    #[cfg(test)]
    FULL_PIVOT_COMPARES.with(|c| c.set(c.get() + 1));
    let d = v.pivot_desc(i);
    if d.is_external() {
        let mut b = [0u8; 8];
        v.area_read(d.area_at as usize, &mut b)?;
        let ptr = u64::from_le_bytes(b);
        v.validate()?;
        if ptr == 0 {
            return Err(v.corrupt("external pivot with a zero log pointer"));
        }
        return Ok(ctx.key_cmp(ptr, key)?);
    }
    let len = d.len_bytes as usize;
    if len > MAX_INLINE_PIVOT || len < stem_len {
        v.validate()?;
        return Err(v.corrupt("inline pivot longer than the inline limit or shorter than the stem"));
    }
    // Pivot and key share the stem, so their bytes after it decide: the prefix's 8, then
    // the pivot's bytes past `stem_len + 8`, which the key area holds `stem_len` bytes
    // into the pivot's run (the area keeps every byte from the 8th on).
    let rest = &key[stem_len..];
    let after_stem = len - stem_len;
    let head = pp.to_be_bytes();
    if after_stem <= 8 {
        return Ok(cmp_short(&head[..after_stem], rest));
    }
    match cmp_short(&head, &rest[..rest.len().min(8)]) {
        Ordering::Equal => {}
        settled => return Ok(settled),
    }
    // The pivot's bytes past its first 8, read a chunk at a time: pivots that tie on the
    // prefix (keys sharing more than an internal node's stem, such as a collection's
    // sub-records) usually differ in the next few bytes, so most compares read one chunk
    // instead of copying the whole pivot. The area's end is checked first, so a damaged
    // disk image fails here whichever chunk would settle the compare.
    let area_at = d.area_at as usize + stem_len;
    v.area_read(area_at + after_stem - 8, &mut [])?;
    let mut chunk = [0u8; 16];
    let mut off = 8;
    while off < after_stem {
        let n = (after_stem - off).min(chunk.len());
        v.area_read(area_at + off - 8, &mut chunk[..n])?;
        let k = &rest[off.min(rest.len())..(off + n).min(rest.len())];
        match cmp_short(&chunk[..n], k) {
            Ordering::Equal => {}
            settled => return Ok(settled),
        }
        off += n;
    }
    Ok(after_stem.cmp(&rest.len()))
}

/// `a.cmp(b)`, eight bytes at a time: for the few bytes a pivot compare looks at, a call
/// to the C library's `memcmp` (what a slice comparison of bytes becomes) costs more than
/// the comparison, and internal nodes whose pivots tie on their prefix make one per step
/// of their binary search.
fn cmp_short(a: &[u8], b: &[u8]) -> Ordering {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_be_bytes(a[i..i + 8].try_into().expect("8 bytes"));
        let y = u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if x != y {
            return x.cmp(&y);
        }
        i += 8;
    }
    while i < n {
        if a[i] != b[i] {
            return a[i].cmp(&b[i]);
        }
        i += 1;
    }
    a.len().cmp(&b.len())
}

/// Child to follow for `key`: the number of pivots `<= key` (`inclusive`, the child whose
/// range holds `key`) or `< key` (the child holding the largest keys below `key`).
///
/// Every pivot starts with the node's stem, so a key below everything the stem allows
/// goes to the first child and one above it to the last, with no pivot read. Otherwise
/// pivots whose prefix (their 8 bytes after the stem) differs from the key's are settled
/// by the prefix alone (prefixes are monotone in key order), so the prefix array is
/// searched first (see `prefix_lower_bound_by`) and full comparisons run only among
/// equal prefixes. Keys that share long beginnings (`key:000000123456`) tie in their first
/// 8 bytes but not after the stem.
pub(crate) fn child_index<V: InternalRead, C: Ctx>(
    v: &V,
    ctx: &C,
    key: &[u8],
    inclusive: bool,
) -> SResult<usize> {
    let n = v.count();
    let stem_len = v.stem_len();
    let kp = if stem_len == 0 {
        key_prefix(key)
    } else {
        match internal_stem_position(v, key)? {
            StemPos::Below => return Ok(0),
            StemPos::Above => return Ok(n),
            StemPos::Inside(kp) => kp,
        }
    };
    let mut lo = prefix_lower_bound_by(|i| v.pivot_prefix(i), 0, n, kp);
    let mut hi = match kp.checked_add(1) {
        Some(next) => prefix_lower_bound_by(|i| v.pivot_prefix(i), lo, n, next),
        None => n,
    };
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let go_right = match cmp_pivot(v, ctx, mid, key, stem_len, kp)? {
            Ordering::Less => true,
            Ordering::Equal => inclusive,
            Ordering::Greater => false,
        };
        if go_right {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// Whether `key` goes to child `idx` of `v`, i.e. `child_index(v, ctx, key, true) ==
/// idx`, settled by the two pivots around that child (`pivot[idx - 1] <= key <
/// pivot[idx]`) instead of a search of the node: a batch's finger asks this of the leaf's
/// parent for every key, and a search of a node whose pivots tie on their prefixes (one
/// collection's sub-records) compares about 7 pivots past the prefix where this compares 2.
pub(crate) fn child_holds<V: InternalRead, C: Ctx>(
    v: &V,
    ctx: &C,
    key: &[u8],
    idx: usize,
) -> SResult<bool> {
    let n = v.count();
    debug_assert!(idx <= n, "child {idx} of a node with {n} pivots");
    let stem_len = v.stem_len();
    let kp = if stem_len == 0 {
        key_prefix(key)
    } else {
        match internal_stem_position(v, key)? {
            StemPos::Below => return Ok(idx == 0),
            StemPos::Above => return Ok(idx == n),
            StemPos::Inside(kp) => kp,
        }
    };
    if idx > 0 && cmp_pivot(v, ctx, idx - 1, key, stem_len, kp)? == Ordering::Greater {
        return Ok(false);
    }
    Ok(idx == n || cmp_pivot(v, ctx, idx, key, stem_len, kp)? == Ordering::Greater)
}

/// Copies pivot `i` of `v` into `out` (for EXTERNAL pivots, the full key from the log;
/// inline ones as `node::inline_pivot` assembles them).
pub(crate) fn pivot_into<V: InternalRead, C: Ctx>(
    v: &V,
    ctx: &C,
    i: usize,
    out: &mut Vec<u8>,
) -> SResult<()> {
    let d = v.pivot_desc(i);
    out.clear();
    if d.is_external() {
        let mut b = [0u8; 8];
        v.area_read(d.area_at as usize, &mut b)?;
        let ptr = u64::from_le_bytes(b);
        v.validate()?;
        if ptr == 0 {
            return Err(v.corrupt("external pivot with a zero log pointer"));
        }
        ctx.key_into(ptr, out)?;
        return Ok(());
    }
    let len = d.len_bytes as usize;
    if len > MAX_INLINE_PIVOT || len < v.stem_len() {
        v.validate()?;
        return Err(v.corrupt("inline pivot longer than the inline limit or shorter than the stem"));
    }
    let mut buf = [0u8; MAX_INLINE_PIVOT];
    let len = inline_pivot(v, i, d, &mut buf)?;
    out.extend_from_slice(&buf[..len]);
    Ok(())
}

/// First index in `[lo, hi)` whose prefix is `>= kp` (`hi` if none), for a non-decreasing
/// array read through `at`.
///
/// Why not a plain binary search: a node's prefix array spans 16–25 cache lines and the
/// index is mostly out of cache, so each probe of a binary search is a cache miss (8 for a
/// full leaf). Prefixes are the keys' first bytes, which are close to uniformly spread
/// within a node for most key sets, so one interpolation step lands within a few entries
/// of the answer; galloping from there brackets it in adjacent cache lines and a binary
/// search finishes. On skewed prefixes the galloping costs at most about two binary
/// searches. Torn reads (an unvalidated heap node) can only mislead the search, never
/// send it out of `[lo, hi]`: every index is clamped and each loop halves or doubles.
fn prefix_lower_bound_by(at: impl Fn(usize) -> u64, lo: usize, hi: usize, kp: u64) -> usize {
    if lo >= hi || at(lo) >= kp {
        return lo;
    }
    let last = hi - 1;
    let p_last = at(last);
    if p_last < kp {
        return hi;
    }
    // Invariant from here: at(lo) < kp <= at(last).
    // Read again: on a torn node it may differ from the first reading, so the
    // subtractions wrap rather than overflow (a guess may be wrong, never a panic).
    let p_lo = at(lo);
    let span = p_last.wrapping_sub(p_lo) as u128;
    let guess = match (kp.wrapping_sub(p_lo) as u128 * (last - lo) as u128).checked_div(span) {
        Some(off) => lo
            .saturating_add(usize::try_from(off).unwrap_or(usize::MAX))
            .clamp(lo, last),
        None => lo,
    };
    // Gallop to a bracket [a, b] with at(a) < kp <= at(b).
    let (mut a, mut b);
    if at(guess) < kp {
        a = guess;
        let mut step = 1;
        loop {
            let next = (a + step).min(last);
            if next == last || at(next) >= kp {
                // at(last) >= kp holds on a consistent array; on a torn one, stop here.
                b = next;
                break;
            }
            a = next;
            step *= 2;
        }
    } else {
        b = guess;
        let mut step = 1;
        loop {
            let next = b.saturating_sub(step).max(lo);
            if at(next) < kp {
                a = next;
                break;
            }
            b = next;
            if next == lo {
                // at(lo) < kp holds on a consistent array; on a torn one, give up here.
                a = lo;
                break;
            }
            step *= 2;
        }
    }
    // Binary search for the first index in (a, b] whose prefix is >= kp.
    while a + 1 < b {
        let mid = a + (b - a) / 2;
        if at(mid) < kp {
            a = mid;
        } else {
            b = mid;
        }
    }
    b
}

/// First entry whose prefix is `>= kp`, searching `[lo, hi)`.
fn prefix_lower_bound<L: LeafRead>(l: &L, lo: usize, hi: usize, kp: u64) -> usize {
    prefix_lower_bound_by(|i| l.prefix(i), lo, hi, kp)
}

/// First entry whose prefix is `> kp`, searching `[lo, hi)`: usually `lo` itself or the
/// next entry (unique prefixes), so a short scan before falling back to bisection.
fn prefix_upper_bound<L: LeafRead>(l: &L, lo: usize, hi: usize, kp: u64) -> usize {
    match kp.checked_add(1) {
        Some(next) => prefix_lower_bound_by(|i| l.prefix(i), lo, hi, next),
        None => hi,
    }
}

/// Point lookup in a leaf: binary search on prefixes, then among equal prefixes the hash
/// picks the candidate and one full-key compare confirms it (the paper's §3.1 lookup).
/// Prefixes are taken after the leaf's stem; a key without the stem is not in the leaf.
pub(crate) fn leaf_get<L: LeafRead, C: Ctx>(
    l: &L,
    ctx: &C,
    key: &[u8],
    kh: u32,
) -> SResult<Option<u64>> {
    let StemPos::Inside(kp) = leaf_stem_position(l, key) else {
        l.validate()?;
        return Ok(None);
    };
    let n = l.count();
    let mut i = prefix_lower_bound(l, 0, n, kp);
    while i < n && l.prefix(i) == kp {
        if l.hash(i) == kh {
            let ptr = l.ptr(i);
            l.validate()?;
            if ptr == 0 {
                return Err(l.corrupt("zero log pointer"));
            }
            if ctx.key_cmp(ptr, key)? == Ordering::Equal {
                return Ok(Some(ptr));
            }
        }
        i += 1;
    }
    l.validate()?;
    Ok(None)
}

/// Whether the leaf entry for `key` holds log pointer `ptr`, with no log read: among the
/// entries with the key's prefix and hash, one holding `ptr` is the key's own entry (a
/// record has one key), and if none does the key maps elsewhere or nowhere. What garbage
/// collection asks of every record of a victim; most are dead, and confirming a dead
/// one's key (as `leaf_get` does) read a newer record at a random place in the log.
pub(crate) fn leaf_points_at<L: LeafRead>(l: &L, key: &[u8], kh: u32, ptr: u64) -> SResult<bool> {
    Ok(leaf_entry_of(l, key, kh, ptr)?.is_some())
}

/// The index of the leaf entry for `key` holding log pointer `ptr`, by `leaf_points_at`'s
/// rule (no log read).
pub(crate) fn leaf_entry_of<L: LeafRead>(
    l: &L,
    key: &[u8],
    kh: u32,
    ptr: u64,
) -> SResult<Option<usize>> {
    let StemPos::Inside(kp) = leaf_stem_position(l, key) else {
        l.validate()?;
        return Ok(None);
    };
    let n = l.count();
    let mut i = prefix_lower_bound(l, 0, n, kp);
    let mut found = None;
    while i < n && l.prefix(i) == kp {
        if l.hash(i) == kh && l.ptr(i) == ptr {
            found = Some(i);
            break;
        }
        i += 1;
    }
    l.validate()?;
    Ok(found)
}

/// Where `key` is or belongs in a leaf: `(index, found)`. A key without the leaf's stem
/// belongs at one end.
pub(crate) fn leaf_position<L: LeafRead, C: Ctx>(
    l: &L,
    ctx: &C,
    key: &[u8],
    kh: u32,
) -> SResult<(usize, bool)> {
    let n = l.count();
    let kp = match leaf_stem_position(l, key) {
        StemPos::Inside(kp) => kp,
        StemPos::Below => return Ok((0, false)),
        StemPos::Above => return Ok((n, false)),
    };
    let lo = prefix_lower_bound(l, 0, n, kp);
    let hi = prefix_upper_bound(l, lo, n, kp);
    if lo == hi {
        return Ok((lo, false));
    }
    // A prefix tie. The hash finds an existing key with (usually) one log read; a key that
    // is absent needs a binary search by full key over the tie range.
    for i in lo..hi {
        if l.hash(i) == kh {
            let ptr = l.ptr(i);
            l.validate()?;
            if ctx.key_cmp(ptr, key)? == Ordering::Equal {
                return Ok((i, true));
            }
        }
    }
    let (mut a, mut b) = (lo, hi);
    while a < b {
        let mid = a + (b - a) / 2;
        let ptr = l.ptr(mid);
        l.validate()?;
        match ctx.key_cmp(ptr, key)? {
            Ordering::Less => a = mid + 1,
            Ordering::Greater => b = mid,
            // The hash scan above would have found it; a log that answers differently
            // now is inconsistent, but the position is still right.
            Ordering::Equal => return Ok((mid, true)),
        }
    }
    Ok((a, false))
}

/// Shortest prefix of `right_first` that is greater than `left_last`: the separator a leaf
/// split pushes up. `None` if `right_first <= left_last` (keys out of order).
pub(crate) fn separator(left_last: &[u8], right_first: &[u8]) -> Option<usize> {
    let lcp = left_last
        .iter()
        .zip(right_first)
        .take_while(|(a, b)| a == b)
        .count();
    if lcp >= right_first.len() || (lcp < left_last.len() && left_last[lcp] > right_first[lcp]) {
        return None;
    }
    Some(lcp + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::key_prefix;

    #[test]
    fn interpolating_lower_bound_equals_binary_search() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for case in 0..2000 {
            let n = rng.random_range(0..220);
            // Uniform, clustered and heavily duplicated prefix arrays.
            let mut v: Vec<u64> = (0..n)
                .map(|_| match case % 3 {
                    0 => rng.random(),
                    1 => rng.random_range(0..50u64) << 40,
                    _ => rng.random_range(0..4u64),
                })
                .collect();
            v.sort();
            for _ in 0..20 {
                let kp = match rng.random_range(0..3) {
                    0 if n > 0 => v[rng.random_range(0..n)],
                    1 => rng.random_range(0..5u64),
                    _ => rng.random(),
                };
                let lo = if n > 0 { rng.random_range(0..=n) } else { 0 };
                let expect = lo + v[lo..].partition_point(|x| *x < kp);
                assert_eq!(
                    prefix_lower_bound_by(|i| v[i], lo, n, kp),
                    expect,
                    "{v:?} {kp}"
                );
            }
        }
    }

    #[test]
    fn a_torn_or_changing_prefix_array_never_sends_the_search_out_of_its_range() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for _ in 0..2000 {
            let n = rng.random_range(1..220);
            // Not sorted: what an unvalidated node torn by a concurrent writer may hold.
            let v: Vec<u64> = (0..n)
                .map(|_| match rng.random_range(0..3) {
                    0 => rng.random(),
                    1 => u64::MAX - rng.random_range(0..3u64),
                    _ => rng.random_range(0..3u64),
                })
                .collect();
            let lo = rng.random_range(0..=n);
            let kp = rng.random();
            let found = prefix_lower_bound_by(|i| v[i], lo, n, kp);
            assert!((lo..=n).contains(&found), "{found} outside {lo}..={n}");
            // A node changing under the search: each reading of an entry may differ.
            let state = std::cell::Cell::new(rng.random::<u64>() | 1);
            let changing = |i: usize| {
                let mut x = state.get();
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                state.set(x);
                if x.is_multiple_of(3) {
                    v[i]
                } else {
                    x
                }
            };
            let found = prefix_lower_bound_by(changing, lo, n, kp);
            assert!((lo..=n).contains(&found), "{found} outside {lo}..={n}");
        }
    }

    #[test]
    fn separator_is_shortest_greater_prefix() {
        assert_eq!(separator(b"abc", b"abd"), Some(3));
        assert_eq!(separator(b"ab", b"abc"), Some(3));
        assert_eq!(separator(b"a", b"b"), Some(1));
        assert_eq!(separator(b"", b"\0"), Some(1));
        assert_eq!(separator(b"abz", b"b"), Some(1));
        assert_eq!(separator(b"abc", b"abc"), None);
        assert_eq!(separator(b"abd", b"abc"), None);
        assert_eq!(separator(b"abc", b"ab"), None);
    }

    #[test]
    fn stem_position_orders_keys_around_the_stem() {
        let stem = b"user12";
        assert_eq!(stem_position(stem, b"user1"), StemPos::Below);
        assert_eq!(stem_position(stem, b"user11zzz"), StemPos::Below);
        assert_eq!(stem_position(stem, b""), StemPos::Below);
        assert_eq!(stem_position(stem, b"user13"), StemPos::Above);
        assert_eq!(stem_position(stem, b"v"), StemPos::Above);
        assert_eq!(stem_position(stem, b"user12"), StemPos::Inside(0));
        assert_eq!(
            stem_position(stem, b"user12abcdefghij"),
            StemPos::Inside(key_prefix(b"abcdefgh"))
        );
        assert_eq!(
            stem_position(b"", b"xy"),
            StemPos::Inside(key_prefix(b"xy"))
        );
    }

    /// The word-by-word `stem_position` and `key_prefix` against their plain definitions.
    #[test]
    fn stem_position_and_key_prefix_match_their_definitions() {
        use rand::{Rng, SeedableRng};
        let plain_prefix = |key: &[u8]| {
            let mut b = [0u8; 8];
            let n = key.len().min(8);
            b[..n].copy_from_slice(&key[..n]);
            u64::from_be_bytes(b)
        };
        let plain = |stem: &[u8], key: &[u8]| {
            let n = stem.len().min(key.len());
            match key[..n].cmp(&stem[..n]) {
                Ordering::Less => StemPos::Below,
                Ordering::Greater => StemPos::Above,
                Ordering::Equal if key.len() < stem.len() => StemPos::Below,
                Ordering::Equal => StemPos::Inside(plain_prefix(&key[stem.len()..])),
            }
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        for _ in 0..100_000 {
            // A small alphabet and a key built from the stem make every branch common.
            let stem: Vec<u8> = (0..rng.random_range(0..=crate::index::node::MAX_STEM_BYTES))
                .map(|_| b"a\0z"[rng.random_range(0..3)])
                .collect();
            let mut key = stem[..rng.random_range(0..=stem.len())].to_vec();
            if rng.random_bool(0.7) && !key.is_empty() {
                let at = rng.random_range(0..key.len());
                key[at] = b"a\0z"[rng.random_range(0..3)];
            }
            key.extend((0..rng.random_range(0..12)).map(|_| b"a\0z"[rng.random_range(0..3)]));
            assert_eq!(
                stem_position(&stem, &key),
                plain(&stem, &key),
                "{stem:?} {key:?}"
            );
            assert_eq!(key_prefix(&key), plain_prefix(&key), "{key:?}");
        }
    }

    /// `cmp_short`, the word-at-a-time compare of pivot bytes, against the slice order
    /// it replaces, on lengths around its 8-byte steps and bytes that differ anywhere.
    #[test]
    fn cmp_short_orders_as_slices_do() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        for _ in 0..100_000 {
            let a: Vec<u8> = (0..rng.random_range(0..=25))
                .map(|_| b"\0a\xff"[rng.random_range(0..3)])
                .collect();
            let mut b = a[..rng.random_range(0..=a.len())].to_vec();
            if rng.random_bool(0.5) && !b.is_empty() {
                let at = rng.random_range(0..b.len());
                b[at] = b"\0a\xff"[rng.random_range(0..3)];
            }
            b.extend((0..rng.random_range(0..10)).map(|_| b"\0a\xff"[rng.random_range(0..3)]));
            assert_eq!(cmp_short(&a, &b), a.cmp(&b), "{a:?} {b:?}");
            assert_eq!(cmp_short(&b, &a), b.cmp(&a), "{b:?} {a:?}");
        }
    }

    #[test]
    fn prefix_is_monotone() {
        let mut keys: Vec<&[u8]> = vec![
            b"",
            b"\0",
            b"\0\0",
            b"a",
            b"a\0",
            b"ab",
            b"abcdefgh",
            b"abcdefgh\0",
            b"abcdefgi",
            b"b",
        ];
        keys.sort();
        for w in keys.windows(2) {
            assert!(
                key_prefix(w[0]) <= key_prefix(w[1]),
                "{:?} {:?}",
                w[0],
                w[1]
            );
        }
    }
}
