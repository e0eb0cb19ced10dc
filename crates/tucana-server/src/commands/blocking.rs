//! The blocking pops: BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BZPOPMIN, BZPOPMAX, BLMPOP,
//! BZMPOP (DESIGN.md, "Blocking pops").
//!
//! Owns their non-blocking step (a handler like LPOP's, which answers the timeout reply,
//! null or null array, when there is nothing to pop: all `EXEC` ever runs), their timeout
//! argument, and [`Blocked`], what a connection whose command found nothing must wait
//! for ([`blocked_on`]). The wait itself is the connection's (`connection`), the queues
//! of waiters `waiters`'; the pops are `mpop`'s and `lists`'.
//!
//! Thread-safety: plain functions on the store a handler is given.

use std::time::{Duration, Instant};

use crate::resp::{Args, Reply};

use super::kv::Kv;
use super::lists::{cmd_lmove, cmd_rpoplpush};
use super::mpop::{pop_first, End, Popped};

/// What a blocked connection waits for: its request (run again when woken), the keys
/// whose writes wake it, and its deadline (`None`: forever).
#[derive(Debug)]
pub struct Blocked {
    pub args: Args,
    /// The keys to wait on, as stored (the selected database's).
    pub keys: Vec<Vec<u8>>,
    pub deadline: Option<Instant>,
    /// Where the command's placeholder reply (what it answers inside `EXEC`) starts in
    /// the batch's output; set by `execute_batch`, replaced by the connection.
    pub reply_at: usize,
}

/// A timeout argument: seconds as a float, 0 for forever; `Err` is Redis's reply.
fn timeout(arg: &[u8]) -> Result<Option<Duration>, Reply> {
    let seconds = super::collection::parse_double(arg)
        .filter(|s| s.is_finite())
        .ok_or_else(|| Reply::error("ERR timeout is not a float or out of range"))?;
    // Redis truncates to whole milliseconds before it checks the sign.
    let ms = (seconds * 1000.0) as i64;
    if ms < 0 {
        return Err(Reply::error("ERR timeout is negative"));
    }
    Ok((ms > 0).then(|| Duration::from_millis(ms as u64)))
}

/// BLPOP, BRPOP, BZPOPMIN, BZPOPMAX: `key... timeout`.
fn pop_any(kv: &mut dyn Kv, args: &[Vec<u8>], end: End) -> tucana::Result<Reply> {
    if let Err(reply) = timeout(&args[args.len() - 1]) {
        return Ok(reply);
    }
    let keys = &args[1..args.len() - 1];
    Ok(match pop_first(kv, keys, end, 1)? {
        Err(reply) => reply,
        Ok(None) => Reply::NilArray,
        Ok(Some(Popped::List(key, mut elements))) => {
            Reply::Array(vec![Reply::Bulk(key), Reply::Bulk(elements.remove(0))])
        }
        Ok(Some(Popped::ZSet(key, mut items))) => {
            let (member, score) = items.remove(0);
            Reply::Array(vec![
                Reply::Bulk(key),
                Reply::Bulk(member),
                super::collection::double_reply(score),
            ])
        }
    })
}

pub(super) fn cmd_blpop(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    pop_any(kv, args, End::Left)
}

pub(super) fn cmd_brpop(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    pop_any(kv, args, End::Right)
}

pub(super) fn cmd_bzpopmin(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    pop_any(kv, args, End::Min)
}

pub(super) fn cmd_bzpopmax(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    pop_any(kv, args, End::Max)
}

/// BLMPOP and BZMPOP: `timeout numkeys key... end [COUNT n]`.
fn mpop_blocking(kv: &mut dyn Kv, args: &[Vec<u8>], lists: bool) -> tucana::Result<Reply> {
    if let Err(reply) = timeout(&args[1]) {
        return Ok(reply);
    }
    // The rest is LMPOP's or ZMPOP's, with the timeout in the command's place.
    super::mpop::mpop(kv, &args[1..], lists)
}

pub(super) fn cmd_blmpop(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    mpop_blocking(kv, args, true)
}

pub(super) fn cmd_bzmpop(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    mpop_blocking(kv, args, false)
}

/// `BLMOVE source destination LEFT|RIGHT LEFT|RIGHT timeout`: LMOVE, whose sides Redis
/// checks before the timeout.
pub(super) fn cmd_blmove(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    for side in &args[3..5] {
        if !side.eq_ignore_ascii_case(b"LEFT") && !side.eq_ignore_ascii_case(b"RIGHT") {
            return Ok(super::syntax_error());
        }
    }
    if let Err(reply) = timeout(&args[5]) {
        return Ok(reply);
    }
    cmd_lmove(kv, &args[..5])
}

/// `BRPOPLPUSH source destination timeout`: RPOPLPUSH.
pub(super) fn cmd_brpoplpush(kv: &mut dyn Kv, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    if let Err(reply) = timeout(&args[3]) {
        return Ok(reply);
    }
    cmd_rpoplpush(kv, &args[..3])
}

/// A retried blocking command answered WRONGTYPE: whether that came from a key it
/// waits on (then it keeps waiting) rather than from BLMOVE's or BRPOPLPUSH's
/// destination (then the error is its answer, as in Redis).
pub(super) fn source_not_ready(call: &super::Call<'_>, args: &[Vec<u8>]) -> bool {
    let name = args[0].to_ascii_lowercase();
    if name != b"blmove" && name != b"brpoplpush" {
        return true;
    }
    let slot = call.slot();
    let source = slot.read(|ks| {
        let mut kv = super::ReadKv {
            ks,
            state: call.state,
            may_expire: slot.may_expire(),
            misses_of: None,
        };
        super::expire::live_value(&mut kv, &args[1])
    });
    // The source is a list exactly when the destination made the error.
    !matches!(source, Ok(Some(v)) if crate::types::kind_of(&v) == Some(crate::types::Kind::List))
}

/// After a blocking command answered its timeout reply outside `EXEC`: what its
/// connection waits for. Its arguments were checked by the handler.
pub(super) fn blocked_on(args: &[Vec<u8>]) -> Option<Blocked> {
    let name = args[0].to_ascii_lowercase();
    let (timeout_arg, keys): (&[u8], Vec<Vec<u8>>) = match name.as_slice() {
        b"blpop" | b"brpop" | b"bzpopmin" | b"bzpopmax" => {
            (&args[args.len() - 1], args[1..args.len() - 1].to_vec())
        }
        // Only the source's writes can serve these.
        b"blmove" => (&args[5], vec![args[1].clone()]),
        b"brpoplpush" => (&args[3], vec![args[1].clone()]),
        b"blmpop" | b"bzmpop" => {
            let n = super::parse_i64(&args[2])? as usize;
            (&args[1], args.get(3..3 + n)?.to_vec())
        }
        _ => return None,
    };
    let wait = timeout(timeout_arg).ok()?;
    Some(Blocked {
        args: args.to_vec(),
        keys,
        deadline: wait.map(|d| Instant::now() + d),
        reply_at: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_float_seconds_and_zero_is_forever() {
        assert_eq!(timeout(b"0").unwrap(), None);
        assert_eq!(timeout(b"1.5").unwrap(), Some(Duration::from_millis(1500)));
        assert_eq!(timeout(b"0.0001").unwrap(), None);
        assert!(timeout(b"-1").is_err());
        assert!(timeout(b"abc").is_err());
        assert!(timeout(b"inf").is_err());
    }

    #[test]
    fn a_blocked_request_waits_on_its_source_keys_only() {
        let args = |w: &[&str]| -> Args { w.iter().map(|s| s.as_bytes().to_vec()).collect() };
        let b = blocked_on(&args(&["BLPOP", "a", "b", "0"])).unwrap();
        assert_eq!(b.keys, [b"a".to_vec(), b"b".to_vec()]);
        assert!(b.deadline.is_none());
        let b = blocked_on(&args(&["blmove", "src", "dst", "LEFT", "RIGHT", "2"])).unwrap();
        assert_eq!(b.keys, [b"src".to_vec()]);
        assert!(b.deadline.is_some());
        let b = blocked_on(&args(&["BZMPOP", "1", "2", "x", "y", "MIN", "COUNT", "3"])).unwrap();
        assert_eq!(b.keys, [b"x".to_vec(), b"y".to_vec()]);
    }
}
