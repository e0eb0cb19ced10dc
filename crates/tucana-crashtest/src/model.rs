//! The expected-state model of the kill -9 test: parses what the writer acknowledged and
//! decides whether a recovered volume is one it may legally find.
//!
//! Owns: the parser of the `crash-writer` line protocol (documented in
//! `crates/tucana-cli/src/crash_writer.rs`; `value_bytes` here must stay equal to the one
//! there) and the verdict. Does not own: processes or the volume (`kill9.rs`).
//!
//! The rules (promises 1 and 2 of `docs/reliability.md`), per keyspace, over the writes
//! that keyspace saw in acknowledgement order:
//! * the recovered contents must equal the base contents with some prefix of those writes
//!   applied (buffered writes are lost only as a suffix; a batch counts as one write, so
//!   it is all or nothing);
//! * the prefix must include every write acknowledged `sync`, and every write acknowledged
//!   before an acknowledged `sync`, `commit` or `gc` call (a forced pass commits first);
//! * the one write that may have been in flight at the kill (announced by `begin`, never
//!   acknowledged) may be there or not;
//! * a keyspace whose creation was acknowledged (or that existed before) must exist.
//!
//! Pure data, single-threaded.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Contents of one keyspace.
pub type Contents = BTreeMap<Vec<u8>, Vec<u8>>;
/// Contents of every keyspace, by name.
pub type State = BTreeMap<String, Contents>;

/// The bytes of a value named by `tag` and `len` (same as the writer's).
pub fn value_bytes(tag: &str, len: usize) -> Vec<u8> {
    let unit: Vec<u8> = tag.bytes().chain(std::iter::once(b'/')).collect();
    unit.iter().copied().cycle().take(len).collect()
}

/// One key's change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Put { key: Vec<u8>, value: Vec<u8> },
    Delete { key: Vec<u8> },
}

/// One engine call of the writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A put, delete or batch: applied to `keyspace` all at once or not at all.
    Write {
        keyspace: String,
        changes: Vec<Change>,
    },
    /// `sync` or `commit`: everything acknowledged before is durable.
    Sync,
    /// `gc`, a forced garbage-collection pass: it commits first, so everything
    /// acknowledged before is durable, as after `Sync`.
    Gc,
}

/// One line of the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    Open,
    Keyspace(String),
    Begin(u64, Op),
    /// The op was acknowledged; `sync` says it was durable when acknowledged.
    Ack {
        id: u64,
        sync: bool,
        op: Op,
    },
    Error(u64, String),
    GcStats(GcStats),
    /// Puts the writer's engine deferred in its life so far (`deferstats` lines).
    DeferStats(u64),
}

/// Garbage collection a writer's engine reported for its life so far (`gcstats` lines).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcStats {
    pub passes: u64,
    pub relocated_bytes: u64,
    pub reclaimed_bytes: u64,
}

fn parse_op(words: &[&str]) -> Result<Op, String> {
    let bad = || format!("malformed op {:?}", words.join(" "));
    let num = |w: &str| w.parse::<usize>().map_err(|_| bad());
    match words {
        ["sync"] | ["commit"] => Ok(Op::Sync),
        ["gc"] => Ok(Op::Gc),
        ["put", ks, key, tag, len] => Ok(Op::Write {
            keyspace: ks.to_string(),
            changes: vec![Change::Put {
                key: key.as_bytes().to_vec(),
                value: value_bytes(tag, num(len)?),
            }],
        }),
        ["del", ks, key] => Ok(Op::Write {
            keyspace: ks.to_string(),
            changes: vec![Change::Delete {
                key: key.as_bytes().to_vec(),
            }],
        }),
        ["batch", ks, n, items @ ..] => {
            let n = num(n)?;
            let mut changes = Vec::with_capacity(n);
            let mut rest = items;
            while !rest.is_empty() {
                match rest {
                    ["P", key, tag, len, tail @ ..] => {
                        changes.push(Change::Put {
                            key: key.as_bytes().to_vec(),
                            value: value_bytes(tag, num(len)?),
                        });
                        rest = tail;
                    }
                    ["D", key, tail @ ..] => {
                        changes.push(Change::Delete {
                            key: key.as_bytes().to_vec(),
                        });
                        rest = tail;
                    }
                    _ => return Err(bad()),
                }
            }
            if changes.len() != n {
                return Err(bad());
            }
            Ok(Op::Write {
                keyspace: ks.to_string(),
                changes,
            })
        }
        _ => Err(bad()),
    }
}

/// Parses one complete line.
pub fn parse_line(line: &str) -> Result<Line, String> {
    let words: Vec<&str> = line.split(' ').collect();
    let id = |w: &str| {
        w.parse::<u64>()
            .map_err(|_| format!("bad op id in {line:?}"))
    };
    match words.as_slice() {
        ["open", ..] => Ok(Line::Open),
        ["ks", name] => Ok(Line::Keyspace(name.to_string())),
        ["begin", n, op @ ..] => Ok(Line::Begin(id(n)?, parse_op(op)?)),
        ["ack", n, durability, op @ ..] => {
            let sync = match *durability {
                "sync" => true,
                "buffered" => false,
                other => return Err(format!("unknown durability {other:?} in {line:?}")),
            };
            Ok(Line::Ack {
                id: id(n)?,
                sync,
                op: parse_op(op)?,
            })
        }
        ["error", n, message @ ..] => Ok(Line::Error(id(n)?, message.join(" "))),
        ["gcstats", passes, relocated, reclaimed] => {
            let num = |w: &str| {
                w.parse::<u64>()
                    .map_err(|_| format!("bad number in {line:?}"))
            };
            Ok(Line::GcStats(GcStats {
                passes: num(passes)?,
                relocated_bytes: num(relocated)?,
                reclaimed_bytes: num(reclaimed)?,
            }))
        }
        ["deferstats", puts] => puts
            .parse::<u64>()
            .map(Line::DeferStats)
            .map_err(|_| format!("bad number in {line:?}")),
        _ => Err(format!("unknown line {line:?}")),
    }
}

/// What one writer process acknowledged before it was killed.
#[derive(Clone, Debug, Default)]
pub struct Session {
    pub opened: bool,
    /// Keyspaces whose creation was acknowledged.
    pub keyspaces: BTreeSet<String>,
    /// Acknowledged ops in order, with their durability.
    pub acked: Vec<(Op, bool)>,
    /// The op announced but not acknowledged when the writer died.
    pub in_flight: Option<Op>,
    pub last_id: Option<u64>,
    /// The writer's last report of its garbage collection (none before its first).
    pub gc_stats: Option<GcStats>,
    /// The writer's last report of its deferred puts (none before its first).
    pub deferred_puts: Option<u64>,
}

impl Session {
    /// Feeds the complete lines of one writer in order.
    pub fn from_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<Session, String> {
        let mut s = Session::default();
        for line in lines {
            match parse_line(line)? {
                Line::Open => s.opened = true,
                Line::Keyspace(name) => {
                    s.keyspaces.insert(name);
                }
                Line::Begin(id, op) => {
                    if s.in_flight.is_some() {
                        return Err(format!("op {id} begun while another was in flight"));
                    }
                    if s.last_id.is_some_and(|last| id != last + 1)
                        || (s.last_id.is_none() && id != 0)
                    {
                        return Err(format!("op {id} out of order"));
                    }
                    s.last_id = Some(id);
                    s.in_flight = Some(op);
                }
                Line::Ack { id, sync, op } => {
                    if s.last_id != Some(id) || s.in_flight.as_ref() != Some(&op) {
                        return Err(format!("ack of op {id} does not match its begin"));
                    }
                    s.in_flight = None;
                    s.acked.push((op, sync));
                }
                Line::Error(id, message) => {
                    return Err(format!("the writer's op {id} failed: {message}"))
                }
                Line::GcStats(stats) => {
                    if s.in_flight.is_some() {
                        return Err("gcstats while an op was in flight".into());
                    }
                    s.gc_stats = Some(stats);
                }
                Line::DeferStats(puts) => {
                    if s.in_flight.is_some() {
                        return Err("deferstats while an op was in flight".into());
                    }
                    s.deferred_puts = Some(puts);
                }
            }
        }
        Ok(s)
    }
}

/// Why a recovered state is not allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Recovered to an earlier prefix than the durable one: `lost` durable writes missing.
    LostDurable {
        keyspace: String,
        lost: usize,
        detail: String,
    },
    /// Recovered to no prefix of history at all.
    NonPrefix { keyspace: String, detail: String },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::LostDurable {
                keyspace,
                lost,
                detail,
            } => write!(
                f,
                "keyspace {keyspace}: {lost} durable writes lost: {detail}"
            ),
            Violation::NonPrefix { keyspace, detail } => {
                write!(f, "keyspace {keyspace}: not a prefix state: {detail}")
            }
        }
    }
}

fn apply(contents: &mut Contents, changes: &[Change]) {
    for change in changes {
        match change {
            Change::Put { key, value } => {
                contents.insert(key.clone(), value.clone());
            }
            Change::Delete { key } => {
                contents.remove(key);
            }
        }
    }
}

/// The first few keys where `a` and `b` differ, for failure messages.
fn diff(a: &Contents, b: &Contents) -> String {
    let keys: BTreeSet<&Vec<u8>> = a.keys().chain(b.keys()).collect();
    let show = |v: Option<&Vec<u8>>| match v {
        None => "absent".to_string(),
        Some(v) => format!(
            "{} bytes {:?}",
            v.len(),
            String::from_utf8_lossy(&v[..v.len().min(24)])
        ),
    };
    let differing: Vec<String> = keys
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .take(4)
        .map(|k| {
            format!(
                "{}: expected {}, found {}",
                String::from_utf8_lossy(k),
                show(a.get(k)),
                show(b.get(k))
            )
        })
        .collect();
    differing.join("; ")
}

/// Checks `recovered` against `base` plus what `session` acknowledged; on success returns
/// how many writes were found per keyspace (`(found, durable, possible)` summed).
pub fn verify(base: &State, session: &Session, recovered: &State) -> Result<Found, Violation> {
    // Writes per keyspace in order, and how many of them must be durable.
    let mut writes: BTreeMap<&str, Vec<&[Change]>> = BTreeMap::new();
    let mut durable: BTreeMap<&str, usize> = BTreeMap::new();
    for (op, sync) in &session.acked {
        match op {
            Op::Write { keyspace, changes } => {
                let list = writes.entry(keyspace).or_default();
                list.push(changes);
                if *sync {
                    durable.insert(keyspace, list.len());
                }
            }
            Op::Sync | Op::Gc => {
                for (ks, list) in &writes {
                    durable.insert(ks, list.len());
                }
            }
        }
    }
    if let Some(Op::Write { keyspace, changes }) = &session.in_flight {
        writes.entry(keyspace).or_default().push(changes);
    }
    let mut names: BTreeSet<&str> = base.keys().map(String::as_str).collect();
    names.extend(session.keyspaces.iter().map(String::as_str));
    names.extend(recovered.keys().map(String::as_str));
    names.extend(writes.keys());
    let empty = Contents::new();
    let mut found = Found::default();
    for name in names {
        let must_exist = base.contains_key(name) || session.keyspaces.contains(name);
        let got = match recovered.get(name) {
            Some(contents) => contents,
            None if must_exist => {
                return Err(Violation::LostDurable {
                    keyspace: name.to_string(),
                    lost: 1,
                    detail: "the keyspace is gone".into(),
                })
            }
            None => &empty,
        };
        let list = writes.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let must = durable.get(name).copied().unwrap_or(0);
        let mut state = base.get(name).cloned().unwrap_or_default();
        let mut matches = Vec::new();
        let mut at_durable = None;
        for p in 0..=list.len() {
            if p > 0 {
                apply(&mut state, list[p - 1]);
            }
            if p == must {
                at_durable = Some(state.clone());
            }
            if &state == got {
                matches.push(p);
            }
        }
        match matches.iter().rev().find(|p| **p >= must) {
            Some(p) => {
                found.writes += *p;
                found.durable += must;
                found.possible += list.len();
            }
            None => {
                let expected = at_durable.unwrap_or_default();
                return Err(match matches.last() {
                    Some(p) => Violation::LostDurable {
                        keyspace: name.to_string(),
                        lost: must - p,
                        detail: format!(
                            "found the state after {p} of {} writes, {must} were durable; {}",
                            list.len(),
                            diff(&expected, got)
                        ),
                    },
                    None => Violation::NonPrefix {
                        keyspace: name.to_string(),
                        detail: format!(
                            "{} writes, {must} durable; against the durable prefix: {}",
                            list.len(),
                            diff(&expected, got)
                        ),
                    },
                });
            }
        }
    }
    Ok(found)
}

/// Writes counted by a successful `verify`, over all keyspaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// Writes present after recovery.
    pub writes: usize,
    /// Writes that had to be present.
    pub durable: usize,
    /// Writes that could have been present (acknowledged plus the one in flight).
    pub possible: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pairs: &[(&str, &[(&str, &str)])]) -> State {
        pairs
            .iter()
            .map(|(ks, kv)| {
                (
                    ks.to_string(),
                    kv.iter()
                        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                        .collect(),
                )
            })
            .collect()
    }

    fn session(lines: &[&str]) -> Session {
        Session::from_lines(lines.iter().copied()).unwrap()
    }

    const LINES: &[&str] = &[
        "open x",
        "ks a",
        "begin 0 put a k1 t 2",
        "ack 0 buffered put a k1 t 2",
        "begin 1 put a k2 u 1",
        "ack 1 sync put a k2 u 1",
        "begin 2 batch a 2 P k3 v 1 D k1",
        "ack 2 buffered batch a 2 P k3 v 1 D k1",
        "begin 3 del a k2",
    ];

    #[test]
    fn parses_every_line_kind() {
        let s = session(LINES);
        assert!(s.opened);
        assert_eq!(s.acked.len(), 3);
        assert_eq!(
            s.in_flight,
            Some(Op::Write {
                keyspace: "a".into(),
                changes: vec![Change::Delete {
                    key: b"k2".to_vec()
                }]
            })
        );
        assert!(parse_line("ack 4 sync commit").is_ok());
        assert!(parse_line("batch a 2 P k").is_err());
        assert!(Session::from_lines(["ack 0 sync sync"]).is_err());
    }

    #[test]
    fn accepts_every_prefix_from_the_durable_one_on() {
        let s = session(LINES);
        let base = State::new();
        // After the sync put, without the buffered batch, with it, and with the delete.
        for ok in [
            state(&[("a", &[("k1", "t/"), ("k2", "u")])]),
            state(&[("a", &[("k2", "u"), ("k3", "v")])]),
            state(&[("a", &[("k3", "v")])]),
        ] {
            verify(&base, &s, &ok).unwrap();
        }
    }

    #[test]
    fn rejects_lost_durable_writes_and_mixtures() {
        let s = session(LINES);
        let base = State::new();
        let lost = state(&[("a", &[("k1", "t/")])]);
        assert!(matches!(
            verify(&base, &s, &lost),
            Err(Violation::LostDurable { lost: 1, .. })
        ));
        // Half of the batch: its put without its delete.
        let torn = state(&[("a", &[("k1", "t/"), ("k2", "u"), ("k3", "v")])]);
        assert!(matches!(
            verify(&base, &s, &torn),
            Err(Violation::NonPrefix { .. })
        ));
        assert!(matches!(
            verify(&base, &s, &State::new()),
            Err(Violation::LostDurable { .. })
        ));
    }

    #[test]
    fn a_sync_call_makes_earlier_writes_of_every_keyspace_durable() {
        let s = session(&[
            "ks a",
            "ks b",
            "begin 0 put a x t 1",
            "ack 0 buffered put a x t 1",
            "begin 1 put b y t 1",
            "ack 1 buffered put b y t 1",
            "begin 2 sync",
            "ack 2 sync sync",
            "begin 3 put b z t 1",
            "ack 3 buffered put b z t 1",
        ]);
        let base = State::new();
        verify(
            &base,
            &s,
            &state(&[("a", &[("x", "t")]), ("b", &[("y", "t")])]),
        )
        .unwrap();
        assert!(verify(&base, &s, &state(&[("a", &[]), ("b", &[("y", "t")])])).is_err());
    }

    #[test]
    fn a_forced_pass_makes_earlier_writes_durable_and_gc_stats_are_kept() {
        let s = session(&[
            "ks a",
            "begin 0 put a x t 1",
            "ack 0 buffered put a x t 1",
            "begin 1 gc",
            "ack 1 sync gc",
            "gcstats 2 4096 65536",
            "begin 2 gc",
        ]);
        assert_eq!(s.in_flight, Some(Op::Gc));
        assert_eq!(
            s.gc_stats,
            Some(GcStats {
                passes: 2,
                relocated_bytes: 4096,
                reclaimed_bytes: 65536
            })
        );
        let base = State::new();
        verify(&base, &s, &state(&[("a", &[("x", "t")])])).unwrap();
        assert!(matches!(
            verify(&base, &s, &state(&[("a", &[])])),
            Err(Violation::LostDurable { lost: 1, .. })
        ));
        // Stats belong between an ack and the next begin.
        assert!(Session::from_lines(["begin 0 gc", "gcstats 1 2 3"]).is_err());
        assert!(parse_line("gcstats 1 x 3").is_err());
    }

    #[test]
    fn deferred_put_reports_are_kept_between_ops_only() {
        let s = session(&[
            "ks a",
            "begin 0 put a x t 1",
            "ack 0 buffered put a x t 1",
            "deferstats 7",
            "deferstats 9",
        ]);
        assert_eq!(s.deferred_puts, Some(9));
        assert!(Session::from_lines(["ks a", "begin 0 put a x t 1", "deferstats 1"]).is_err());
        assert!(parse_line("deferstats -1").is_err());
        assert!(parse_line("deferstats").is_err());
    }
}
