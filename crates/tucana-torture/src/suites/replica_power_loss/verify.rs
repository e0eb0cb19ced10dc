//! Judging a backup reopened from a post-crash image (`super`): it opens, passes `check`,
//! each replica holds a commit the primary shipped and no older than the last one applied
//! durably, with exactly the primary's contents at that commit; promoted, each holds that
//! commit's contents plus a prefix of the log received after it, at least what the backup
//! had made durable and at most what was shipped; the backup's own keyspace obeys
//! promises 1 and 2; `check` passes again after the promotions.
//!
//! Owns: those judgements. Does not own: the bookkeeping they read (`super::link`), the
//! crash images and the tally (`super`).
//!
//! Thread-safety: single-threaded.

use std::sync::Arc;

use tucana::replication::ReplicaHandle;
use tucana::volume::Storage;
use tucana::{Database, Options};

use super::link::{Dropped, Link, PrefixMatch, Replicated, TERM};
use crate::model::{KeyspaceModel, State};
use crate::workload::{self, Recovery};

/// What was wrong with a crash state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// A replica at a commit older than the last one applied durably, a replica gone that
    /// was never dropped, or one back that was dropped durably.
    LostCommit,
    /// A replica at a commit never shipped, or whose contents are not the primary's at
    /// that commit.
    WrongCommit,
    /// Promoted, a replica lacks log the backup had made durable (or the backup's own
    /// keyspace lost a durable write).
    LostLog,
    /// Promoted, a replica equals no prefix of what was shipped (or the backup's own
    /// keyspace equals no prefix of its history).
    NonPrefix,
    /// Open, a read, `check` or a promotion failed.
    Failed,
}

/// What a good crash state showed.
#[derive(Debug, Default)]
pub struct Good {
    /// Replicas promoted.
    pub promotions: u64,
    /// Of those, promotions that replayed log past their commit.
    pub replayed: u64,
    /// Promotions whose lower bound was durable log past their commit (not the commit).
    pub log_bound: u64,
}

type Judgement<T> = Result<T, (Broken, String)>;

fn failed(what: &str) -> impl Fn(tucana::Error) -> (Broken, String) + '_ {
    move |e| (Broken::Failed, format!("{what}: {e}"))
}

/// Opens `storage` and judges it against `link` and the backup's own keyspace `own`
/// (its name and model), as the module doc says.
pub fn judge(
    options: &Options,
    storage: &Arc<dyn Storage>,
    link: &Link,
    own: Option<(&str, &KeyspaceModel)>,
) -> Judgement<Good> {
    let db = workload::open(options.clone(), storage).map_err(failed("open"))?;
    let judged = judge_open(&db, link, own);
    db.abandon();
    judged
}

fn judge_open(db: &Database, link: &Link, own: Option<(&str, &KeyspaceModel)>) -> Judgement<Good> {
    match own {
        Some((name, model)) => {
            match workload::verify_recovered(db, &[name.to_string()], std::slice::from_ref(model)) {
                Recovery::Good(_) => {}
                Recovery::LostDurable(m) => return Err((Broken::LostLog, format!("own {m}"))),
                Recovery::NonPrefix(m) => return Err((Broken::NonPrefix, format!("own {m}"))),
                Recovery::Failed(e) => return Err((Broken::Failed, format!("own keyspace: {e}"))),
            }
        }
        None => {
            db.check().map_err(failed("check"))?;
        }
    }
    let mut good = Good::default();
    for k in &link.keyspaces {
        match (db.open_replica(&k.name), k.dropped) {
            (None, Dropped::No) => {
                return Err((Broken::LostCommit, format!("replica {} is gone", k.name)))
            }
            (None, _) => {}
            (Some(_), Dropped::Durably) => {
                return Err((
                    Broken::LostCommit,
                    format!("replica {} is back after a durable drop", k.name),
                ))
            }
            (Some(replica), _) => judge_replica(replica, k, &mut good)?,
        }
    }
    db.check().map_err(failed("check after promotion"))?;
    Ok(good)
}

/// One replica: the commit it holds, its contents, then promoted.
fn judge_replica(replica: ReplicaHandle, k: &Replicated, good: &mut Good) -> Judgement<()> {
    let name = &k.name;
    let upstream = replica.state().upstream_epoch;
    if upstream == 0 {
        if k.durable_epoch > 0 {
            return Err((
                Broken::LostCommit,
                format!(
                    "replica {name} holds no commit; commit {} was applied durably",
                    k.durable_epoch
                ),
            ));
        }
        // Nothing to promote from: promotion must refuse, and change nothing.
        return match replica.promote(TERM + 1) {
            Err(_) => Ok(()),
            Ok(_) => Err((
                Broken::Failed,
                format!("replica {name} holds no commit, yet promotion succeeded"),
            )),
        };
    }
    if upstream < k.durable_epoch {
        return Err((
            Broken::LostCommit,
            format!(
                "replica {name} holds commit {upstream}; commit {} was applied durably",
                k.durable_epoch
            ),
        ));
    }
    let at = match k.units_at(upstream) {
        Some(at) if k.shipped_epochs.contains(&upstream) => at,
        _ => {
            return Err((
                Broken::WrongCommit,
                format!("replica {name} holds commit {upstream}, never shipped"),
            ))
        }
    };
    let mut contents = State::new();
    replica
        .for_each(&mut |key, value| {
            contents.insert(key.to_vec(), value.to_vec());
        })
        .map_err(failed("scan of the replica"))?;
    let expected = k.state_after(at);
    if contents != expected {
        return Err((
            Broken::WrongCommit,
            format!(
                "replica {name} at commit {upstream} ({at} units) differs from the primary: {}",
                first_difference(&expected, &contents)
            ),
        ));
    }
    let promoted = replica.promote(TERM + 1).map_err(failed("promotion"))?;
    let state = workload::read_state(&promoted).map_err(failed("read of the promoted keyspace"))?;
    let lo = at.max(k.durable_units);
    let bounds = format!(
        "commit {upstream} holds {at} units, {} durably received, {} shipped",
        k.durable_units, k.shipped_units
    );
    match k.prefix_of(&state, lo, k.shipped_units) {
        PrefixMatch::Within(n) => {
            good.promotions += 1;
            good.replayed += u64::from(n > at);
            good.log_bound += u64::from(k.durable_units > at);
            Ok(())
        }
        PrefixMatch::Below(n) => Err((
            Broken::LostLog,
            format!("promoted {name} holds the first {n} units; {bounds}"),
        )),
        PrefixMatch::Nothing => Err((
            Broken::NonPrefix,
            format!(
                "promoted {name} equals no prefix of its history ({}); {bounds}",
                first_difference(&k.state_after(k.shipped_units), &state)
            ),
        )),
    }
}

/// A backup carried on after a crash, once it took the primary's newest commit: each
/// live replica holds the commit it was last given, with the primary's contents at it.
pub fn caught_up(db: &Database, link: &Link) -> Judgement<()> {
    for k in link.keyspaces.iter().filter(|k| k.dropped == Dropped::No) {
        let Some(replica) = db.open_replica(&k.name) else {
            return Err((Broken::LostCommit, format!("replica {} is gone", k.name)));
        };
        let upstream = replica.state().upstream_epoch;
        let at = k.units_at(upstream).filter(|_| upstream == k.durable_epoch);
        let Some(at) = at else {
            return Err((
                Broken::WrongCommit,
                format!(
                    "caught up, replica {} holds commit {upstream}, not {}",
                    k.name, k.durable_epoch
                ),
            ));
        };
        let mut contents = State::new();
        replica
            .for_each(&mut |key, value| {
                contents.insert(key.to_vec(), value.to_vec());
            })
            .map_err(failed("scan of the replica"))?;
        let expected = k.state_after(at);
        if contents != expected {
            return Err((
                Broken::WrongCommit,
                format!(
                    "caught up, replica {} at commit {upstream} differs from the primary: {}",
                    k.name,
                    first_difference(&expected, &contents)
                ),
            ));
        }
    }
    Ok(())
}

/// The first key where `got` differs from `want`, described.
fn first_difference(want: &State, got: &State) -> String {
    let show = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
    if let Some((k, v)) = want.iter().find(|(k, v)| got.get(*k) != Some(*v)) {
        return format!(
            "key {:?}: want {} bytes, got {:?}",
            show(k),
            v.len(),
            got.get(k).map(Vec::len)
        );
    }
    match got.keys().find(|k| !want.contains_key(*k)) {
        Some(k) => format!("key {:?} is there but should not be", show(k)),
        None => "equal".into(),
    }
}
