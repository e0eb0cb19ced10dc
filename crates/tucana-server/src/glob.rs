//! Redis glob patterns (`KEYS`, `SCAN MATCH`, `CONFIG GET`): `*`, `?`, `[abc]`, `[^a-z]`
//! and `\` escapes, matched on bytes.
//!
//! Matching uses one backtracking point (the last `*`), so it runs in O(pattern × key)
//! time whatever the pattern: a client cannot make the server spin with `*a*a*a*b`.
//! Pure functions; thread-safe.

/// Whether `key` matches `pattern`, as Redis 7's `stringmatchlen` decides, quirks
/// included (each checked against redis-server in `tests/differential_commands.rs`):
///
/// - an empty key matches only the patterns `""` and `"*"` (Redis's matcher never runs
///   on an empty key; `KEYS *` and `SCAN` without a pattern take every key before it);
/// - a `[` with no closing `]` is a class of the rest of the pattern (`[abc` matches
///   `a`), and a lone `[` at the end matches nothing;
/// - `x-y` in a class is a range when two bytes follow the `x`, whatever they are
///   (`[a-]` is the range from `]` to `a`), and `[]` is an empty class;
/// - a `\` at the end of the pattern is a literal backslash.
pub fn glob_match(pattern: &[u8], key: &[u8]) -> bool {
    if key.is_empty() {
        return pattern.is_empty() || pattern == b"*";
    }
    let (mut p, mut k) = (0, 0);
    // Where to resume after the last `*`: (pattern position after it, key position).
    let mut star: Option<(usize, usize)> = None;
    while k < key.len() {
        if p < pattern.len() {
            if pattern[p] == b'*' {
                star = Some((p + 1, k));
                p += 1;
                continue;
            }
            if let Some(next) = element_match(pattern, p, key[k]) {
                p = next;
                k += 1;
                continue;
            }
        }
        // Mismatch: let the last `*` eat one more byte, or fail.
        match star {
            Some((sp, sk)) => {
                star = Some((sp, sk + 1));
                p = sp;
                k = sk + 1;
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches byte `c` against the pattern element at `pattern[p]` (not a `*`): where the
/// pattern continues when it matched, `None` when not.
fn element_match(pattern: &[u8], p: usize, c: u8) -> Option<usize> {
    match pattern[p] {
        b'?' => Some(p + 1),
        b'[' => {
            let (matched, next) = class_match(pattern, p, c);
            matched.then_some(next)
        }
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == c).then_some(p + 2),
        b => (b == c).then_some(p + 1),
    }
}

/// Matches `c` against the class starting at `pattern[start] == '['`: whether it
/// matched and where the pattern continues. A class with no closing `]` takes the rest
/// of the pattern, as in Redis.
fn class_match(pattern: &[u8], start: usize, c: u8) -> (bool, usize) {
    let mut i = start + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    loop {
        let left = pattern.len().saturating_sub(i);
        if left >= 2 && pattern[i] == b'\\' {
            i += 1;
            matched |= pattern[i] == c;
        } else if left >= 1 && pattern[i] == b']' {
            break;
        } else if left == 0 {
            // The pattern ended inside the class: it ends at the last byte.
            i -= 1;
            break;
        } else if left >= 3 && pattern[i + 1] == b'-' {
            let (mut lo, mut hi) = (pattern[i], pattern[i + 2]);
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            matched |= (lo..=hi).contains(&c);
            i += 2;
        } else {
            matched |= pattern[i] == c;
        }
        i += 1;
    }
    (matched != negate, i + 1)
}

/// The literal bytes every match must start with (up to the first special character),
/// so an ordered scan can start there instead of at the first key.
pub fn literal_prefix(pattern: &[u8]) -> Vec<u8> {
    let mut prefix = Vec::new();
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            b'*' | b'?' | b'[' => break,
            b'\\' if i + 1 < pattern.len() => {
                prefix.push(pattern[i + 1]);
                i += 2;
            }
            b'\\' => break,
            c => {
                prefix.push(c);
                i += 1;
            }
        }
    }
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_redis() {
        let yes = [
            ("*", ""),
            ("*", "abc"),
            ("h?llo", "hello"),
            ("h*llo", "heeeello"),
            ("h[ae]llo", "hallo"),
            ("h[^e]llo", "hallo"),
            ("h[a-b]llo", "hbllo"),
            ("user:*", "user:42"),
            ("a\\*b", "a*b"),
            ("*a*b", "xxaxxb"),
            ("[abc", "b"),
            ("[a-]", "_"),
            ("[a-", "-"),
            ("[^", "x"),
            ("[^]", "x"),
            ("[!-]", "["),
            ("[\\", "\\"),
            ("a\\", "a\\"),
            ("[\\]]", "]"),
            ("[z-a]", "h"),
            ("a*", "a"),
            ("", ""),
        ];
        let no = [
            ("h?llo", "hllo"),
            ("h[ae]llo", "hillo"),
            ("h[^e]llo", "hello"),
            ("user:*", "use"),
            ("a\\*b", "axb"),
            ("*a*b", "xxaxxbx"),
            ("abc", "ab"),
            ("[", "["),
            ("x[ab", "xa["),
            ("[]", "a"),
            ("[]a]", "a"),
            ("[a-]", "b"),
            ("**", ""),
            ("?", ""),
            ("a[", "a["),
        ];
        for (p, k) in yes {
            assert!(glob_match(p.as_bytes(), k.as_bytes()), "{p} ~ {k}");
        }
        for (p, k) in no {
            assert!(!glob_match(p.as_bytes(), k.as_bytes()), "{p} !~ {k}");
        }
    }

    #[test]
    fn a_pathological_pattern_is_quick() {
        let pattern = "*a".repeat(50) + "b";
        let key = "a".repeat(10_000);
        assert!(!glob_match(pattern.as_bytes(), key.as_bytes()));
    }

    #[test]
    fn literal_prefixes_stop_at_the_first_wildcard() {
        assert_eq!(literal_prefix(b"user:*"), b"user:");
        assert_eq!(literal_prefix(b"a\\*b*"), b"a*b");
        assert_eq!(literal_prefix(b"*x"), b"");
        assert_eq!(literal_prefix(b"abc"), b"abc");
    }
}
