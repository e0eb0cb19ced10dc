//! Word-level operations on one allocation group's bitmap.
//!
//! Owns: setting, clearing, counting and searching bit ranges of a `[u64; BITMAP_WORDS]`
//! (bit `i` = block `i` of the group, LSB-first within little-endian words, 1 = allocated).
//! Does not own: what the bits mean for the volume (reserved blocks, the volume's end,
//! dirty tracking) — that is `alloc::Allocator`.
//!
//! Thread-safety: plain functions over borrowed words; the caller serialises access.
//!
//! Every search walks whole words and skips full (or empty) words in one comparison, so a
//! scan of a group costs at most `BITMAP_WORDS` word reads plus one step per run of set
//! bits it has to jump over — never quadratic in the group size.

use super::GROUP_BLOCKS;

/// Words in one group's bitmap.
pub const BITMAP_WORDS: usize = (GROUP_BLOCKS / 64) as usize;

/// One group's bitmap.
pub type BitmapWords = [u64; BITMAP_WORDS];

/// A zeroed bitmap on the heap (4 KiB; kept off the stack).
pub(crate) fn zeroed() -> Box<BitmapWords> {
    let words: Box<[u64]> = vec![0u64; BITMAP_WORDS].into_boxed_slice();
    match words.try_into() {
        Ok(words) => words,
        Err(_) => unreachable!("the vector has exactly BITMAP_WORDS words"),
    }
}

/// Mask of bits `lo..hi` of one word (`lo < hi <= 64`).
fn mask(lo: u64, hi: u64) -> u64 {
    debug_assert!(lo < hi && hi <= 64);
    let upper = if hi == 64 { !0 } else { (1u64 << hi) - 1 };
    upper & !((1u64 << lo) - 1)
}

/// Calls `f(word_index, mask)` for each word that bits `start..end` touch.
fn for_each_word(start: u64, end: u64, mut f: impl FnMut(usize, u64)) {
    assert!(
        start <= end && end <= GROUP_BLOCKS,
        "bit range {start}..{end} outside a group"
    );
    let mut bit = start;
    while bit < end {
        let word = bit / 64;
        let hi = (end - word * 64).min(64);
        f(word as usize, mask(bit % 64, hi));
        bit = word * 64 + hi;
    }
}

/// Sets bits `start..end`; returns how many were clear before.
pub(crate) fn set_range(words: &mut BitmapWords, start: u64, end: u64) -> u64 {
    let mut newly = 0;
    for_each_word(start, end, |i, m| {
        newly += u64::from((!words[i] & m).count_ones());
        words[i] |= m;
    });
    newly
}

/// Clears bits `start..end`; returns how many were set before.
pub(crate) fn clear_range(words: &mut BitmapWords, start: u64, end: u64) -> u64 {
    let mut cleared = 0;
    for_each_word(start, end, |i, m| {
        cleared += u64::from((words[i] & m).count_ones());
        words[i] &= !m;
    });
    cleared
}

/// Number of set bits in `start..end`.
pub(crate) fn count_set(words: &BitmapWords, start: u64, end: u64) -> u64 {
    let mut set = 0;
    for_each_word(start, end, |i, m| {
        set += u64::from((words[i] & m).count_ones())
    });
    set
}

/// Number of set bits in the whole group.
pub(crate) fn count_all(words: &BitmapWords) -> u64 {
    words.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// First bit in `start..end` whose value is `want`.
fn first_with(words: &BitmapWords, start: u64, end: u64, want: bool) -> Option<u64> {
    assert!(
        start <= end && end <= GROUP_BLOCKS,
        "bit range {start}..{end} outside a group"
    );
    let mut bit = start;
    while bit < end {
        let word = bit / 64;
        let hi = (end - word * 64).min(64);
        let value = if want {
            words[word as usize]
        } else {
            !words[word as usize]
        };
        let hits = value & mask(bit % 64, hi);
        if hits != 0 {
            return Some(word * 64 + u64::from(hits.trailing_zeros()));
        }
        bit = word * 64 + hi;
    }
    None
}

/// First set bit in `start..end`.
pub(crate) fn first_set(words: &BitmapWords, start: u64, end: u64) -> Option<u64> {
    first_with(words, start, end, true)
}

/// First clear bit in `start..end`.
pub(crate) fn first_clear(words: &BitmapWords, start: u64, end: u64) -> Option<u64> {
    first_with(words, start, end, false)
}

/// Last set bit in `0..end`.
pub(crate) fn last_set_below(words: &BitmapWords, end: u64) -> Option<u64> {
    assert!(end <= GROUP_BLOCKS);
    let mut word_end = end;
    while word_end > 0 {
        let word = (word_end - 1) / 64;
        let lo = word * 64;
        let hits = words[word as usize] & mask(0, word_end - lo);
        if hits != 0 {
            return Some(lo + 63 - u64::from(hits.leading_zeros()));
        }
        word_end = lo;
    }
    None
}

/// Rounds `value` up to a multiple of the power of two `align`.
pub(crate) fn align_up(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (value + align - 1) & !(align - 1)
}

/// First run of `blocks` clear bits at or after bit `from` whose start is a multiple of
/// `align` (a power of two), wholly inside the group.
pub(crate) fn find_run(words: &BitmapWords, from: u64, blocks: u64, align: u64) -> Option<u64> {
    assert!(blocks >= 1 && align.is_power_of_two());
    let mut search_from = from;
    loop {
        let free = first_clear(words, search_from, GROUP_BLOCKS)?;
        let start = align_up(free, align);
        let end = start.checked_add(blocks)?;
        if end > GROUP_BLOCKS {
            return None;
        }
        match first_set(words, start, end) {
            None => return Some(start),
            // Every candidate starting at or before `blocker` overlaps it: jump past it.
            Some(blocker) => search_from = blocker + 1,
        }
    }
}

/// First run of clear bits at or after bit `from`, cut to at most `max_blocks`:
/// (start, blocks).
pub(crate) fn first_run_up_to(
    words: &BitmapWords,
    from: u64,
    max_blocks: u64,
) -> Option<(u64, u64)> {
    assert!(max_blocks >= 1);
    let start = first_clear(words, from, GROUP_BLOCKS)?;
    let limit = start.saturating_add(max_blocks).min(GROUP_BLOCKS);
    let end = first_set(words, start, limit).unwrap_or(limit);
    Some((start, end - start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_across_words() {
        let mut words = zeroed();
        assert_eq!(set_range(&mut words, 3, 130), 127);
        assert_eq!(count_set(&words, 0, GROUP_BLOCKS), 127);
        assert_eq!(set_range(&mut words, 0, 10), 3);
        assert_eq!(first_clear(&words, 0, GROUP_BLOCKS), Some(130));
        assert_eq!(first_set(&words, 130, GROUP_BLOCKS), None);
        assert_eq!(last_set_below(&words, GROUP_BLOCKS), Some(129));
        assert_eq!(last_set_below(&words, 64), Some(63));
        assert_eq!(clear_range(&mut words, 64, 128), 64);
        assert_eq!(first_clear(&words, 0, GROUP_BLOCKS), Some(64));
        assert_eq!(first_set(&words, 64, GROUP_BLOCKS), Some(128));
        assert_eq!(count_all(&words), 130 - 64);
    }

    #[test]
    fn runs_respect_alignment_and_blockers() {
        let mut words = zeroed();
        set_range(&mut words, 0, 8);
        set_range(&mut words, 20, 21);
        assert_eq!(find_run(&words, 0, 4, 1), Some(8));
        assert_eq!(find_run(&words, 0, 16, 1), Some(21));
        assert_eq!(find_run(&words, 0, 8, 8), Some(8));
        assert_eq!(find_run(&words, 0, 8, 16), Some(32));
        assert_eq!(find_run(&words, 9, 4, 4), Some(12));
        assert_eq!(find_run(&words, 0, GROUP_BLOCKS, 1), None);
        assert_eq!(first_run_up_to(&words, 0, 100), Some((8, 12)));
        assert_eq!(first_run_up_to(&words, 0, 5), Some((8, 5)));
        set_range(&mut words, 0, GROUP_BLOCKS);
        assert_eq!(find_run(&words, 0, 1, 1), None);
        assert_eq!(first_run_up_to(&words, 0, 1), None);
    }
}
