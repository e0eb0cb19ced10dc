//! The keyspace a command works on, and what `commands` and `shell` both do with it:
//! look it up (reads never create it, writes do), get, delete, and print a scan over
//! [`ScanBounds`] as `key<TAB>value` lines.
//!
//! Owns the keyspace lookup and the reduction of `--from`/`--to`/`--prefix` to one pair of
//! bounds. Does not open or close the volume (`main` does) and parses no arguments.
//! Single-threaded.

use std::ops::Bound;

use tucana::{Database, Keyspace};

use crate::output::Output;
use crate::CliError;

/// The keyspace a command works on, looked up once: reads never create it (a missing
/// keyspace reads as empty), writes do.
pub struct Target<'a> {
    db: &'a Database,
    name: &'a str,
    keyspace: Option<Keyspace>,
}

impl<'a> Target<'a> {
    pub fn new(db: &'a Database, name: &'a str) -> Target<'a> {
        Target {
            db,
            name,
            keyspace: None,
        }
    }

    pub fn db(&self) -> &'a Database {
        self.db
    }

    /// The keyspace, or `None` if it does not exist.
    pub fn for_read(&mut self) -> Result<Option<&Keyspace>, CliError> {
        if self.keyspace.is_none() {
            match self.db.open_keyspace(self.name) {
                Ok(keyspace) => self.keyspace = Some(keyspace),
                Err(tucana::Error::KeyspaceNotFound(_)) => return Ok(None),
                Err(error) => return Err(error.into()),
            }
        }
        Ok(self.keyspace.as_ref())
    }

    /// The keyspace, created if it does not exist.
    pub fn for_write(&mut self) -> Result<&Keyspace, CliError> {
        if self.keyspace.is_none() {
            self.keyspace = Some(self.db.keyspace(self.name)?);
        }
        Ok(self
            .keyspace
            .as_ref()
            .expect("the keyspace was just stored"))
    }
}

pub fn get(target: &mut Target<'_>, key: &[u8]) -> Result<Option<Vec<u8>>, CliError> {
    match target.for_read()? {
        Some(keyspace) => Ok(keyspace.get(key)?),
        None => Ok(None),
    }
}

/// Removes `key`; whether it was present.
pub fn delete(target: &mut Target<'_>, key: &[u8]) -> Result<bool, CliError> {
    match target.for_read()? {
        Some(keyspace) => Ok(keyspace.delete(key)?),
        None => Ok(false),
    }
}

/// A key range as `scan` takes it, reduced to one pair of bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanBounds {
    /// Nothing can match (e.g. `--from` past `--to`). Kept apart because the engine's
    /// range, like `BTreeMap::range`, need not accept a start after the end.
    Empty,
    Range(Bound<Vec<u8>>, Bound<Vec<u8>>),
}

impl ScanBounds {
    /// Keys `k` with `from <= k < to` that start with `prefix` (each optional).
    pub fn new(from: Option<Vec<u8>>, to: Option<Vec<u8>>, prefix: Option<&[u8]>) -> ScanBounds {
        // A prefix is itself the range [prefix, successor(prefix)); intersect the two.
        let mut lower = from;
        let mut upper = to;
        if let Some(prefix) = prefix {
            if lower.as_deref().is_none_or(|from| from < prefix) {
                lower = Some(prefix.to_vec());
            }
            if let Some(end) = prefix_successor(prefix) {
                if upper.as_deref().is_none_or(|to| to > end.as_slice()) {
                    upper = Some(end);
                }
            }
        }
        if let (Some(lower), Some(upper)) = (&lower, &upper) {
            if lower >= upper {
                return ScanBounds::Empty;
            }
        }
        ScanBounds::Range(
            lower.map_or(Bound::Unbounded, Bound::Included),
            upper.map_or(Bound::Unbounded, Bound::Excluded),
        )
    }
}

/// The smallest key greater than every key that starts with `prefix`; `None` when there
/// is none (the prefix is empty or all 0xff bytes).
fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let last_incrementable = prefix.iter().rposition(|&byte| byte != 0xff)?;
    let mut end = prefix[..=last_incrementable].to_vec();
    end[last_incrementable] += 1;
    Some(end)
}

/// Prints the pairs of `bounds` as `key<TAB>value` lines.
pub fn scan(
    target: &mut Target<'_>,
    bounds: &ScanBounds,
    rev: bool,
    limit: Option<u64>,
    out: &mut Output,
) -> Result<(), CliError> {
    let Some(keyspace) = target.for_read()? else {
        return Ok(());
    };
    let ScanBounds::Range(lower, upper) = bounds else {
        return Ok(());
    };
    let range = keyspace.range::<Vec<u8>, _>((lower.clone(), upper.clone()));
    type Pairs = Box<dyn Iterator<Item = tucana::Result<(Vec<u8>, Vec<u8>)>>>;
    let pairs: Pairs = if rev {
        Box::new(range.rev())
    } else {
        Box::new(range)
    };
    let limit = limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    for pair in pairs.take(limit) {
        let (key, value) = pair?;
        out.pair_line(&key, &value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(lower: Option<&[u8]>, upper: Option<&[u8]>) -> ScanBounds {
        ScanBounds::Range(
            lower.map_or(Bound::Unbounded, |k| Bound::Included(k.to_vec())),
            upper.map_or(Bound::Unbounded, |k| Bound::Excluded(k.to_vec())),
        )
    }

    #[test]
    fn prefix_successor_skips_trailing_ff_bytes() {
        assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_successor(b"a\xff\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_successor(b"\xff"), None);
        assert_eq!(prefix_successor(b""), None);
    }

    #[test]
    fn bounds_without_prefix_are_from_inclusive_to_exclusive() {
        assert_eq!(ScanBounds::new(None, None, None), range(None, None));
        assert_eq!(
            ScanBounds::new(Some(b"b".to_vec()), Some(b"d".to_vec()), None),
            range(Some(b"b"), Some(b"d"))
        );
        assert_eq!(
            ScanBounds::new(Some(b"d".to_vec()), Some(b"d".to_vec()), None),
            ScanBounds::Empty
        );
        assert_eq!(
            ScanBounds::new(Some(b"e".to_vec()), Some(b"d".to_vec()), None),
            ScanBounds::Empty
        );
    }

    #[test]
    fn prefix_intersects_with_from_and_to() {
        assert_eq!(
            ScanBounds::new(None, None, Some(b"user:")),
            range(Some(b"user:"), Some(b"user;"))
        );
        // --from inside the prefix range narrows it, --from before it does not.
        assert_eq!(
            ScanBounds::new(Some(b"user:m".to_vec()), None, Some(b"user:")),
            range(Some(b"user:m"), Some(b"user;"))
        );
        assert_eq!(
            ScanBounds::new(
                Some(b"a".to_vec()),
                Some(b"user:c".to_vec()),
                Some(b"user:")
            ),
            range(Some(b"user:"), Some(b"user:c"))
        );
        assert_eq!(
            ScanBounds::new(Some(b"v".to_vec()), None, Some(b"user:")),
            ScanBounds::Empty
        );
        assert_eq!(
            ScanBounds::new(None, None, Some(b"\xff")),
            range(Some(b"\xff"), None)
        );
        assert_eq!(
            ScanBounds::new(None, None, Some(b"")),
            range(Some(b""), None)
        );
    }
}
