//! The expected-state model: per keyspace, the history of writes the engine was asked to
//! make, with what each call answered, and the check that a recovered state is allowed.
//!
//! Owns: histories and their durability marks. Does not own: running operations (that is
//! `workload`) nor reading the engine (callers hand in the recovered contents).
//!
//! The rule (promises 1 and 2 of `docs/reliability.md`): after a crash, each keyspace
//! must equal the model after some prefix of *its* history, and that prefix must include
//! every entry acknowledged durable (a sync write, or any write followed by a completed
//! `sync` or `commit`). A batch is one entry, so it is all-or-nothing. A write whose call
//! failed is *uncertain*: it may or may not have reached the log, so prefixes are tried
//! both with and without the uncertain entries.
//!
//! Thread-safety: plain data; one workload thread owns it.

use std::collections::BTreeMap;

/// Contents of a keyspace.
pub type State = BTreeMap<Vec<u8>, Vec<u8>>;

/// One key's new value (`None`: deleted).
pub type Write = (Vec<u8>, Option<Vec<u8>>);

/// How a write call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `Ok`; `durable` for a sync write.
    Acked { durable: bool },
    /// `Err`: may or may not have happened.
    Failed,
}

#[derive(Clone, Debug)]
struct Entry {
    writes: Vec<Write>,
    certain: bool,
}

/// What `KeyspaceModel::verify` concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The recovered state is the model after `prefix` entries, at least `durable`.
    Prefix { prefix: usize, durable: usize },
    /// Equal to a prefix, but a shorter one than the durable entries require.
    LostDurable { prefix: usize, durable: usize },
    /// Equal to no prefix at all.
    NonPrefix {
        durable: usize,
        entries: usize,
        /// A key where the recovered state differs from the full history's state.
        example: String,
    },
}

impl Verdict {
    pub fn is_ok(&self) -> bool {
        matches!(self, Verdict::Prefix { .. })
    }
}

/// History of one keyspace since the last verified state. See the module doc.
#[derive(Clone, Debug, Default)]
pub struct KeyspaceModel {
    base: State,
    entries: Vec<Entry>,
    durable_upto: usize,
}

/// Applies `writes` to `state` in order (a later write of a key wins).
pub fn apply(state: &mut State, writes: &[Write]) {
    for (k, v) in writes {
        match v {
            Some(v) => state.insert(k.clone(), v.clone()),
            None => state.remove(k),
        };
    }
}

impl KeyspaceModel {
    /// A history starting from `base` (a state known to be on the volume durably).
    pub fn new(base: State) -> KeyspaceModel {
        KeyspaceModel {
            base,
            entries: Vec::new(),
            durable_upto: 0,
        }
    }

    pub fn record(&mut self, writes: Vec<Write>, outcome: Outcome) {
        self.entries.push(Entry {
            writes,
            certain: outcome != Outcome::Failed,
        });
        if outcome == (Outcome::Acked { durable: true }) {
            self.durable_upto = self.entries.len();
        }
    }

    /// A `sync` or `commit` call returned `Ok`: everything recorded so far is durable.
    pub fn mark_durable(&mut self) {
        self.durable_upto = self.entries.len();
    }

    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    pub fn durable_entries(&self) -> usize {
        self.durable_upto
    }

    /// What reads should return now, with failed writes left out (callers compare live
    /// reads only when nothing failed).
    pub fn latest(&self) -> State {
        let mut s = self.base.clone();
        for e in self.entries.iter().filter(|e| e.certain) {
            apply(&mut s, &e.writes);
        }
        s
    }

    /// Checks `recovered` against every prefix of the history (see the module doc).
    pub fn verify(&self, recovered: &State) -> Verdict {
        let durable = self.durable_upto;
        let mut best_lost: Option<usize> = None;
        let any_uncertain = self.entries.iter().any(|e| !e.certain);
        for skip_uncertain in [false, true] {
            if skip_uncertain && !any_uncertain {
                break;
            }
            let mut walk = DiffWalk::new(&self.base, recovered);
            let mut matched: Option<usize> = (walk.diff == 0).then_some(0);
            for (i, e) in self.entries.iter().enumerate() {
                if e.certain || !skip_uncertain {
                    walk.apply(&e.writes, recovered);
                }
                if walk.diff == 0 {
                    matched = Some(i + 1);
                    if i + 1 >= durable {
                        // The first match at or past `durable` proves the state allowed.
                        return Verdict::Prefix {
                            prefix: i + 1,
                            durable,
                        };
                    }
                }
            }
            if let Some(p) = matched {
                if p >= durable {
                    return Verdict::Prefix { prefix: p, durable };
                }
                best_lost = Some(best_lost.map_or(p, |b: usize| b.max(p)));
            }
        }
        if let Some(prefix) = best_lost {
            return Verdict::LostDurable { prefix, durable };
        }
        let full = self.latest();
        let example = full
            .iter()
            .find(|(k, v)| recovered.get(*k) != Some(*v))
            .map(|(k, v)| {
                format!(
                    "key {:?}: want {} bytes, recovered {:?}",
                    String::from_utf8_lossy(k),
                    v.len(),
                    recovered.get(k).map(|r| r.len())
                )
            })
            .or_else(|| {
                recovered.keys().find(|k| !full.contains_key(*k)).map(|k| {
                    format!(
                        "key {:?} recovered but not in the model",
                        String::from_utf8_lossy(k)
                    )
                })
            })
            .unwrap_or_default();
        Verdict::NonPrefix {
            durable,
            entries: self.entries.len(),
            example,
        }
    }
}

/// A model state walked forward while counting the keys where it differs from a target,
/// so each prefix is compared in time proportional to its writes, not to the state.
pub struct DiffWalk {
    state: State,
    /// Keys where the walked state and the target differ (0: equal).
    pub diff: usize,
}

impl DiffWalk {
    /// `base`, compared with `target`.
    pub fn new(base: &State, target: &State) -> DiffWalk {
        let mut diff = base
            .iter()
            .filter(|(k, v)| target.get(*k) != Some(*v))
            .count();
        diff += target.keys().filter(|k| !base.contains_key(*k)).count();
        DiffWalk {
            state: base.clone(),
            diff,
        }
    }

    /// Applies `writes` to the walked state (`target` must be the one given to `new`).
    pub fn apply(&mut self, writes: &[Write], target: &State) {
        for (k, v) in writes {
            let before = self.state.get(k) == target.get(k);
            match v {
                Some(v) => self.state.insert(k.clone(), v.clone()),
                None => self.state.remove(k),
            };
            let after = self.state.get(k) == target.get(k);
            match (before, after) {
                (true, false) => self.diff += 1,
                (false, true) => self.diff -= 1,
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(k: &str, v: Option<&str>) -> Write {
        (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))
    }

    fn state(pairs: &[(&str, &str)]) -> State {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn buffered() -> Outcome {
        Outcome::Acked { durable: false }
    }

    #[test]
    fn every_prefix_from_the_durable_point_is_allowed() {
        let mut m = KeyspaceModel::new(State::new());
        m.record(vec![w("a", Some("1"))], Outcome::Acked { durable: true });
        m.record(vec![w("b", Some("2"))], buffered());
        m.record(vec![w("a", None)], buffered());
        assert_eq!(m.durable_entries(), 1);
        assert!(m.verify(&state(&[("a", "1")])).is_ok());
        assert!(m.verify(&state(&[("a", "1"), ("b", "2")])).is_ok());
        assert!(m.verify(&state(&[("b", "2")])).is_ok());
        assert_eq!(
            m.verify(&State::new()),
            Verdict::LostDurable {
                prefix: 0,
                durable: 1
            }
        );
        // The delete without the put before it is no prefix.
        assert!(matches!(
            m.verify(&state(&[("b", "3")])),
            Verdict::NonPrefix { .. }
        ));
    }

    #[test]
    fn a_batch_is_all_or_nothing() {
        let mut m = KeyspaceModel::new(state(&[("x", "0")]));
        m.record(vec![w("a", Some("1")), w("b", Some("1"))], buffered());
        assert!(m.verify(&state(&[("x", "0")])).is_ok());
        assert!(m
            .verify(&state(&[("x", "0"), ("a", "1"), ("b", "1")]))
            .is_ok());
        assert!(!m.verify(&state(&[("x", "0"), ("a", "1")])).is_ok());
    }

    #[test]
    fn mark_durable_covers_everything_before_it() {
        let mut m = KeyspaceModel::new(State::new());
        m.record(vec![w("a", Some("1"))], buffered());
        m.record(vec![w("b", Some("1"))], buffered());
        m.mark_durable();
        m.record(vec![w("c", Some("1"))], buffered());
        assert!(!m.verify(&state(&[("a", "1")])).is_ok());
        assert!(m.verify(&state(&[("a", "1"), ("b", "1")])).is_ok());
    }

    #[test]
    fn a_failed_write_may_or_may_not_be_there() {
        let mut m = KeyspaceModel::new(State::new());
        m.record(vec![w("a", Some("1"))], Outcome::Acked { durable: true });
        m.record(vec![w("b", Some("1"))], Outcome::Failed);
        m.record(vec![w("c", Some("1"))], buffered());
        assert!(m.verify(&state(&[("a", "1"), ("b", "1")])).is_ok());
        assert!(m.verify(&state(&[("a", "1"), ("c", "1")])).is_ok());
        assert!(m
            .verify(&state(&[("a", "1"), ("b", "1"), ("c", "1")]))
            .is_ok());
        assert_eq!(m.latest(), state(&[("a", "1"), ("c", "1")]));
    }
}
