//! Redis glob patterns (`KEYS`, `SCAN MATCH`, `CONFIG GET`): `*`, `?`, `[abc]`, `[^a-z]`
//! and `\` escapes, matched on bytes.
//!
//! Matching uses one backtracking point (the last `*`), so it runs in O(pattern × key)
//! time whatever the pattern: a client cannot make the server spin with `*a*a*a*b`.
//! Pure functions; thread-safe.

/// Whether `key` matches `pattern`.
pub fn glob_match(pattern: &[u8], key: &[u8]) -> bool {
    let (mut p, mut k) = (0, 0);
    // Where to resume after the last `*`: (pattern position after it, key position).
    let mut star: Option<(usize, usize)> = None;
    while k < key.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p + 1, k));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    k += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class_match(pattern, p, key[k]) {
                        if matched {
                            p = next;
                            k += 1;
                            continue;
                        }
                    } else if key[k] == b'[' {
                        // An unterminated class is a literal '['.
                        p += 1;
                        k += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == key[k] {
                        p += 2;
                        k += 1;
                        continue;
                    }
                }
                c => {
                    if c == key[k] {
                        p += 1;
                        k += 1;
                        continue;
                    }
                }
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

/// Matches `c` against the class starting at `pattern[start] == '['`; `None` when the
/// class has no closing `]`, else whether it matched and where the pattern continues.
fn class_match(pattern: &[u8], start: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    loop {
        let b = *pattern.get(i)?;
        match b {
            b']' => return Some((matched != negate, i + 1)),
            b'\\' if i + 1 < pattern.len() => {
                matched |= pattern[i + 1] == c;
                i += 2;
            }
            _ if pattern.get(i + 1) == Some(&b'-')
                && pattern.get(i + 2).is_some_and(|&e| e != b']') =>
            {
                let (mut lo, mut hi) = (b, pattern[i + 2]);
                if lo > hi {
                    std::mem::swap(&mut lo, &mut hi);
                }
                matched |= (lo..=hi).contains(&c);
                i += 3;
            }
            _ => {
                matched |= b == c;
                i += 1;
            }
        }
    }
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
            ("[", "["),
        ];
        let no = [
            ("h?llo", "hllo"),
            ("h[ae]llo", "hillo"),
            ("h[^e]llo", "hello"),
            ("user:*", "use"),
            ("a\\*b", "axb"),
            ("*a*b", "xxaxxbx"),
            ("abc", "ab"),
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
