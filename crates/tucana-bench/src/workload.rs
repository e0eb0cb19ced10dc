//! Workload generation: which keys exist, what value each one holds, and in which order
//! a phase visits them, all reproducible from one seed.
//!
//! Keys are never stored: key number `i` is a pure function of (seed, i), so a data set
//! can be far larger than the benchmark's memory and every thread can compute any key.
//! The first `min(8, key_bytes)` bytes of a key are a seeded bijection of `i`, which makes
//! keys unique by construction (no set of seen keys, no retries); the remaining bytes are
//! a seeded pseudo-random stream. Values are a function of (key, generation), so a read
//! knows exactly which bytes to expect, and an overwrite is told apart from the fill.
//!
//! Decimal keys (`KeySet::decimal`) have the shape redis-benchmark and many applications
//! use: a fixed prefix and then a number, zero-padded (`key:000000123456`). Every key then
//! shares its first bytes, which a store's 8-byte key prefixes cannot tell apart; key
//! number `i` holds a seeded permutation of `i`, so index order is not key order.
//!
//! Owns no engine and no timing. Everything here is immutable after construction and
//! therefore `Send + Sync`.

use std::ops::Range;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Which version of a value a key holds: the fill writes generation 0, an overwrite pass
/// generation 1, and so on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation(pub u32);

/// The keys `0..count` of a data set and how to build their bytes.
#[derive(Clone, Debug)]
pub struct KeySet {
    count: u64,
    key_bytes: usize,
    value_bytes: usize,
    /// Bytes at the front of a key filled from the bijection (at most 8).
    unique_prefix_bytes: usize,
    prefix_mix: Bijection,
    tail_seed: u64,
    value_seed: u64,
    /// Decimal keys: the prefix, and the permutation giving key `i` its number.
    decimal: Option<(Vec<u8>, Permutation)>,
}

impl KeySet {
    /// Fails when `count` keys of `key_bytes` bytes cannot all be distinct.
    pub fn new(
        seed: u64,
        count: u64,
        key_bytes: usize,
        value_bytes: usize,
    ) -> Result<KeySet, String> {
        if key_bytes == 0 {
            return Err("keys must be at least 1 byte long".into());
        }
        let unique_prefix_bytes = key_bytes.min(8);
        let prefix_bits = (unique_prefix_bytes * 8) as u32;
        if prefix_bits < 64 && count > 1u64 << prefix_bits {
            return Err(format!(
                "{count} distinct keys do not fit in {key_bytes}-byte keys (at most {})",
                1u64 << prefix_bits
            ));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        Ok(KeySet {
            count,
            key_bytes,
            value_bytes,
            unique_prefix_bytes,
            prefix_mix: Bijection::new(prefix_bits, &mut rng),
            tail_seed: rng.random(),
            value_seed: rng.random(),
            decimal: None,
        })
    }

    /// Keys of `key_bytes` bytes made of `prefix` and then a number below `count` in
    /// decimal, zero-padded to fill the key (`prefix` `key:` and 16-byte keys give
    /// redis-benchmark's `key:%012d`). Fails when the digits left cannot count to `count`.
    pub fn decimal(
        seed: u64,
        count: u64,
        key_bytes: usize,
        value_bytes: usize,
        prefix: &[u8],
    ) -> Result<KeySet, String> {
        let digits = key_bytes.saturating_sub(prefix.len());
        // 10^19 is the largest power of ten in a u64; 19 digits count past any u64 count.
        if digits == 0 || (digits < 19 && count > 10u64.pow(digits as u32)) {
            return Err(format!(
                "{count} distinct keys do not fit in {digits} decimal digits after a {}-byte prefix in {key_bytes}-byte keys",
                prefix.len()
            ));
        }
        let mut set = KeySet::new(seed, count, key_bytes, value_bytes)?;
        let permutation = Permutation::new(count, phase_seed(seed, "decimal keys"));
        set.decimal = Some((prefix.to_vec(), permutation));
        Ok(set)
    }

    pub fn key_bytes(&self) -> usize {
        self.key_bytes
    }

    /// Writes key number `index` into `out` (exactly `key_bytes` long).
    pub fn key_into(&self, index: u64, out: &mut [u8]) {
        assert!(index < self.count, "key {index} of {}", self.count);
        assert_eq!(out.len(), self.key_bytes);
        if let Some((prefix, permutation)) = &self.decimal {
            let (head, digits) = out.split_at_mut(prefix.len());
            head.copy_from_slice(prefix);
            let mut number = permutation.at(index);
            for digit in digits.iter_mut().rev() {
                *digit = b'0' + (number % 10) as u8;
                number /= 10;
            }
            return;
        }
        let prefix = self.prefix_mix.apply(index).to_be_bytes();
        let (head, tail) = out.split_at_mut(self.unique_prefix_bytes);
        // Big-endian low bytes: for short keys the bijection's whole output, in an order
        // that sorts like the number.
        head.copy_from_slice(&prefix[8 - self.unique_prefix_bytes..]);
        fill_stream(self.tail_seed ^ index.wrapping_mul(GOLDEN), tail);
    }

    /// Writes the value that `key` holds at `generation` into `out` (`value_bytes` long).
    pub fn value_into(&self, key: &[u8], generation: Generation, out: &mut [u8]) {
        assert_eq!(out.len(), self.value_bytes);
        let seed = hash_bytes(self.value_seed, key) ^ u64::from(generation.0).wrapping_mul(GOLDEN);
        fill_stream(seed, out);
    }

    /// A new buffer for keys.
    pub fn key_buf(&self) -> Vec<u8> {
        vec![0; self.key_bytes]
    }

    /// A new buffer for values.
    pub fn value_buf(&self) -> Vec<u8> {
        vec![0; self.value_bytes]
    }
}

/// A seeded random permutation of `0..count`: each phase that must touch every key exactly
/// once (overwrite, delete) visits `at(0), at(1), ...`, which are in random order.
#[derive(Clone, Debug)]
pub struct Permutation {
    count: u64,
    mix: Bijection,
}

impl Permutation {
    pub fn new(count: u64, seed: u64) -> Permutation {
        // The smallest power of two holding `count`; cycle-walking maps it onto `0..count`.
        let bits = (64 - count.saturating_sub(1).leading_zeros()).max(1);
        Permutation {
            count,
            mix: Bijection::new(bits, &mut StdRng::seed_from_u64(seed)),
        }
    }

    pub fn at(&self, position: u64) -> u64 {
        assert!(
            position < self.count,
            "position {position} of {}",
            self.count
        );
        // Cycle walking: follow the bijection until it lands inside 0..count. The walk
        // ends because `position`'s cycle passes through `position` itself, and since the
        // domain is less than twice `count` it takes under two steps on average.
        let mut x = self.mix.apply(position);
        while x >= self.count {
            x = self.mix.apply(x);
        }
        x
    }
}

/// The part of `0..count` that thread `thread` of `threads` works on.
pub fn thread_share(count: u64, threads: usize, thread: usize) -> Range<u64> {
    assert!(thread < threads);
    let share = |t: usize| -> u64 {
        // u128: count * threads overflows u64 for large inputs.
        (u128::from(count) * t as u128 / threads as u128) as u64
    };
    share(thread)..share(thread + 1)
}

/// Key-space boundaries splitting a full scan into `threads` disjoint, contiguous pieces:
/// piece `t` is `[bounds[t], bounds[t + 1])` with `None` meaning unbounded. Keys are
/// uniform in their first bytes, so the pieces hold about equal numbers of keys.
pub fn scan_bounds(threads: usize) -> Vec<Option<Vec<u8>>> {
    assert!((1..=65536).contains(&threads));
    let mut bounds = vec![None];
    for t in 1..threads {
        let split = (t * 65536 / threads) as u16;
        bounds.push(Some(split.to_be_bytes().to_vec()));
    }
    bounds.push(None);
    bounds
}

/// A per-thread random number generator for phases that pick keys with replacement.
pub fn thread_rng(seed: u64, phase: &str, thread: usize) -> StdRng {
    let seed = hash_bytes(seed, phase.as_bytes()) ^ (thread as u64).wrapping_mul(GOLDEN);
    StdRng::seed_from_u64(seed)
}

/// A per-phase seed derived from the run's seed.
pub fn phase_seed(seed: u64, phase: &str) -> u64 {
    hash_bytes(seed, phase.as_bytes())
}

pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A keyed bijection on `0..2^bits`: rounds of xor with a key, multiplication by an odd
/// key, and xorshift, each invertible modulo `2^bits`.
#[derive(Clone, Debug)]
struct Bijection {
    bits: u32,
    mask: u64,
    shift: u32,
    rounds: [(u64, u64); 4],
}

impl Bijection {
    fn new(bits: u32, rng: &mut StdRng) -> Bijection {
        assert!((1..=64).contains(&bits));
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let mut rounds = [(0, 0); 4];
        for round in &mut rounds {
            // An odd multiplier is invertible modulo any power of two.
            *round = (rng.random::<u64>() & mask, rng.random::<u64>() | 1);
        }
        Bijection {
            bits,
            mask,
            shift: (bits / 2).max(1),
            rounds,
        }
    }

    fn apply(&self, x: u64) -> u64 {
        debug_assert!(self.bits == 64 || x <= self.mask);
        let mut x = x;
        for &(xor_key, multiplier) in &self.rounds {
            x ^= xor_key;
            // The low `bits` bits of a product depend only on the low bits of the factors,
            // so masking after the wrapping multiply is multiplication modulo 2^bits.
            x = x.wrapping_mul(multiplier) & self.mask;
            // Right xorshift by at least one bit: invertible, and mixes high bits into the
            // low ones, which multiplication alone never does.
            x ^= x >> self.shift;
        }
        x
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GOLDEN);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn fill_stream(seed: u64, out: &mut [u8]) {
    // Whole words first: a fixed-size copy compiles to one store, where a copy of a
    // chunk whose length the compiler cannot see is a `memcpy` call per 8 bytes (which
    // showed up in profiles of the engines' insert loops).
    let mut state = seed;
    let mut words = out.chunks_exact_mut(8);
    for chunk in &mut words {
        chunk.copy_from_slice(&splitmix64(&mut state).to_le_bytes());
    }
    let rest = words.into_remainder();
    if !rest.is_empty() {
        let word = splitmix64(&mut state).to_le_bytes();
        rest.copy_from_slice(&word[..rest.len()]);
    }
}

fn hash_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let mut state = seed ^ (bytes.len() as u64).wrapping_mul(GOLDEN);
    let mut words = bytes.chunks_exact(8);
    for chunk in &mut words {
        state ^= u64::from_le_bytes(chunk.try_into().expect("chunks_exact gives 8 bytes"));
        state = splitmix64(&mut state);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        state ^= u64::from_le_bytes(word);
        state = splitmix64(&mut state);
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn bijection_is_a_permutation_of_small_domains() {
        for bits in [1, 2, 7, 8, 12] {
            let mix = Bijection::new(bits, &mut StdRng::seed_from_u64(u64::from(bits)));
            let outputs: HashSet<u64> = (0..1u64 << bits).map(|x| mix.apply(x)).collect();
            assert_eq!(outputs.len(), 1 << bits, "bits {bits}");
            assert!(outputs.iter().all(|&y| y < 1 << bits));
        }
    }

    #[test]
    fn streams_are_splitmix_words_in_order_and_hashes_see_every_byte() {
        // The byte-for-byte definition the harness's stored results were made with.
        let mut state = 99;
        let words: Vec<u8> = (0..4)
            .flat_map(|_| splitmix64(&mut state).to_le_bytes())
            .collect();
        for len in [0, 1, 7, 8, 9, 16, 31, 32] {
            let mut out = vec![0u8; len];
            fill_stream(99, &mut out);
            assert_eq!(out, words[..len], "len {len}");
        }
        let key = *b"0123456789abcdefXYZ";
        for len in 1..key.len() {
            let mut other = key;
            other[len - 1] ^= 1;
            assert_ne!(hash_bytes(5, &key[..len]), hash_bytes(5, &other[..len]));
        }
    }

    #[test]
    fn permutation_visits_every_index_once() {
        for count in [1, 2, 3, 1000, 1025] {
            let perm = Permutation::new(count, 7);
            let seen: HashSet<u64> = (0..count).map(|i| perm.at(i)).collect();
            assert_eq!(seen.len() as u64, count);
            assert!(seen.iter().all(|&x| x < count));
        }
        // And it is not the identity.
        let perm = Permutation::new(1000, 7);
        assert!((0..1000).filter(|&i| perm.at(i) == i).count() < 50);
    }

    #[test]
    fn keys_are_unique_even_when_the_key_space_is_full() {
        let set = KeySet::new(1, 256, 1, 4).unwrap();
        let mut key = set.key_buf();
        let keys: HashSet<Vec<u8>> = (0..256)
            .map(|i| {
                set.key_into(i, &mut key);
                key.clone()
            })
            .collect();
        assert_eq!(keys.len(), 256);
        assert!(KeySet::new(1, 257, 1, 4).is_err());
        assert!(KeySet::new(1, 10, 0, 4).is_err());
    }

    #[test]
    fn keys_depend_on_seed_and_index_only() {
        let a = KeySet::new(3, 10_000, 16, 100).unwrap();
        let b = KeySet::new(3, 10_000, 16, 100).unwrap();
        let c = KeySet::new(4, 10_000, 16, 100).unwrap();
        let (mut ka, mut kb, mut kc) = (a.key_buf(), b.key_buf(), c.key_buf());
        let mut unique = HashSet::new();
        for i in 0..10_000 {
            a.key_into(i, &mut ka);
            b.key_into(i, &mut kb);
            c.key_into(i, &mut kc);
            assert_eq!(ka, kb);
            assert_ne!(ka, kc);
            assert!(unique.insert(ka.clone()));
        }
    }

    #[test]
    fn decimal_keys_are_the_prefix_and_a_padded_number_each_once() {
        let set = KeySet::decimal(1, 1000, 16, 8, b"key:").unwrap();
        let mut key = set.key_buf();
        let mut numbers = HashSet::new();
        for i in 0..1000 {
            set.key_into(i, &mut key);
            let text = std::str::from_utf8(&key).unwrap();
            assert!(text.starts_with("key:000000000"), "{text}");
            numbers.insert(text[4..].parse::<u64>().unwrap());
        }
        assert_eq!(numbers.len(), 1000);
        assert!(numbers.iter().all(|&n| n < 1000));
        // Index order is not key order (fills in index order must not be sequential).
        let in_index_order: Vec<Vec<u8>> = (0..100)
            .map(|i| {
                set.key_into(i, &mut key);
                key.clone()
            })
            .collect();
        assert!(!in_index_order.is_sorted());
        assert!(KeySet::decimal(1, 1001, 7, 8, b"key:").is_err());
        assert!(KeySet::decimal(1, 1000, 7, 8, b"key:").is_ok());
        assert!(KeySet::decimal(1, 10, 4, 8, b"key:").is_err());
    }

    #[test]
    fn values_depend_on_key_and_generation() {
        let set = KeySet::new(5, 10, 16, 37).unwrap();
        let mut key = set.key_buf();
        let (mut v0, mut v0_again, mut v1, mut other) = (
            set.value_buf(),
            set.value_buf(),
            set.value_buf(),
            set.value_buf(),
        );
        set.key_into(3, &mut key);
        set.value_into(&key, Generation(0), &mut v0);
        set.value_into(&key, Generation(0), &mut v0_again);
        set.value_into(&key, Generation(1), &mut v1);
        assert_eq!(v0, v0_again);
        assert_ne!(v0, v1);
        set.key_into(4, &mut key);
        set.value_into(&key, Generation(0), &mut other);
        assert_ne!(v0, other);
    }

    #[test]
    fn thread_shares_cover_everything_once() {
        for (count, threads) in [(10, 3), (0, 2), (1_000_001, 7), (5, 8)] {
            let mut next = 0;
            for t in 0..threads {
                let share = thread_share(count, threads, t);
                assert_eq!(share.start, next);
                next = share.end;
            }
            assert_eq!(next, count);
        }
    }

    #[test]
    fn scan_bounds_are_sorted_and_open_at_both_ends() {
        let bounds = scan_bounds(5);
        assert_eq!(bounds.len(), 6);
        assert!(bounds[0].is_none() && bounds[5].is_none());
        let inner: Vec<_> = bounds[1..5].iter().map(|b| b.clone().unwrap()).collect();
        assert!(inner.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(scan_bounds(1), vec![None, None]);
    }
}
