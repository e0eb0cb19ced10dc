//! Redis's Pub/Sub commands: SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH
//! and PUBSUB CHANNELS / NUMSUB / NUMPAT, with Redis 7.0's replies (push frames in
//! RESP3, arrays in RESP2), and which commands a subscribed RESP2 connection may run.
//!
//! Owns the commands' arguments and replies and the session's side of a subscription
//! (created on the first SUBSCRIBE, dropped when the last channel or pattern goes).
//! It does not own delivery, the registry or the queues (`crate::pubsub`), nor writing
//! messages to the socket (`connection`). SSUBSCRIBE, SPUBLISH and the rest of sharded
//! Pub/Sub are not supported.
//!
//! Ordering: a reply that changes the subscriptions is preceded by every message queued
//! for the connection before it (they are taken out of the queue after the change, and
//! no message for a channel left can be queued after that), so a client never reads a
//! message of a channel after the reply that unsubscribed it. PUBLISH does the same, so
//! a message a connection publishes to itself comes before the reply, as in Redis 7.0.
//! Inside EXEC nothing is taken (EXEC's reply is one array): the messages follow it.
//!
//! Thread-safety: handlers run on the connection's thread with its session; the
//! registry synchronises itself.

use crate::pubsub::{Kind, Subscription};
use crate::resp::Reply;

use super::{printable, wrong_args, Call};

/// Commands a RESP2 connection with a subscription may run (Redis's list).
const ALLOWED_WHILE_SUBSCRIBED: [&str; 9] = [
    "subscribe",
    "unsubscribe",
    "psubscribe",
    "punsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "ping",
    "quit",
    "reset",
];

/// Commands whose first argument is a subcommand: Redis names them `name|sub` in the
/// error below.
const CONTAINERS: [&str; 7] = [
    "client", "config", "pubsub", "cluster", "command", "object", "memory",
];

/// The refusal of `spec_name` on a RESP2 connection with a subscription (Redis's text),
/// or `None` when the command may run.
pub(super) fn refused_while_subscribed(spec_name: &str, args: &[Vec<u8>]) -> Option<Reply> {
    if ALLOWED_WHILE_SUBSCRIBED.contains(&spec_name) {
        return None;
    }
    let name = match args.get(1) {
        Some(sub) if CONTAINERS.contains(&spec_name) => {
            format!("{spec_name}|{}", printable(sub, 32).to_ascii_lowercase())
        }
        _ => spec_name.to_string(),
    };
    Some(Reply::error(format!(
        "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
    )))
}

/// Leaves every channel and pattern of `subscription`, then appends the messages it
/// still had queued to `earlier`.
pub(super) fn drop_subscription(mut subscription: Subscription, earlier: &mut Vec<u8>) {
    subscription.leave_all();
    subscription.drain_into(earlier);
}

/// Drops the session's subscription if it holds nothing any more (one emptied inside
/// EXEC), appending its last queued messages to `after`.
pub(super) fn drop_if_empty(session: &mut super::Session, after: &mut Vec<u8>) {
    if session.pubsub.as_ref().is_some_and(|s| s.count() == 0) {
        if let Some(subscription) = session.pubsub.take() {
            drop_subscription(subscription, after);
        }
    }
}

/// A subscription change's push frame: `[kind, name or nil, subscriptions left]`.
fn notice(word: &str, name: Option<&[u8]>, count: usize) -> Reply {
    Reply::Push(vec![
        Reply::bulk(word),
        name.map_or(Reply::Nil, |n| Reply::Bulk(n.to_vec())),
        Reply::Int(count as i64),
    ])
}

/// The messages queued for this connection so far, which go out before the reply being
/// made; none inside EXEC (its reply is one array; they follow it).
fn take_earlier(session: &super::Session, earlier: &mut Vec<u8>) {
    if let (Some(subscription), false) = (&session.pubsub, session.in_exec) {
        subscription.drain_into(earlier);
    }
}

/// The frames of a subscription change, after the messages queued before it.
fn frames(earlier: Vec<u8>, notices: Vec<Reply>) -> Reply {
    let mut all = Vec::with_capacity(notices.len() + 1);
    if !earlier.is_empty() {
        all.push(Reply::Encoded(earlier));
    }
    all.extend(notices);
    Reply::Frames(all)
}

fn subscribe(call: &mut Call<'_>, args: &[Vec<u8>], kind: Kind, word: &str) -> Reply {
    let resp3 = call.session.protocol == crate::resp::Protocol::Resp3;
    let (pubsub, id) = (&call.state.pubsub, call.session.id);
    let subscription = call
        .session
        .pubsub
        .get_or_insert_with(|| Subscription::new(pubsub.clone(), id, resp3));
    let mut notices = Vec::with_capacity(args.len() - 1);
    for name in &args[1..] {
        subscription.subscribe(kind, name);
        notices.push(notice(word, Some(name), subscription.count()));
    }
    let mut earlier = Vec::new();
    take_earlier(call.session, &mut earlier);
    frames(earlier, notices)
}

fn unsubscribe(call: &mut Call<'_>, args: &[Vec<u8>], kind: Kind, word: &str) -> Reply {
    let names: Vec<Vec<u8>> = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        call.session
            .pubsub
            .as_ref()
            .map_or_else(Vec::new, |s| s.names(kind))
    };
    let mut notices = Vec::with_capacity(names.len().max(1));
    let mut earlier = Vec::new();
    match call.session.pubsub.as_mut() {
        Some(subscription) => {
            for name in &names {
                subscription.unsubscribe(kind, name);
                notices.push(notice(word, Some(name), subscription.count()));
            }
            if names.is_empty() {
                notices.push(notice(word, None, subscription.count()));
            }
            let left = subscription.count();
            take_earlier(call.session, &mut earlier);
            if left == 0 {
                if let Some(mut subscription) = call.session.pubsub.take() {
                    // Inside EXEC it stays, empty, until EXEC ends (`drop_if_empty`):
                    // its queued messages go out after EXEC's reply.
                    if call.session.in_exec {
                        subscription.leave_all();
                        call.session.pubsub = Some(subscription);
                    } else {
                        drop_subscription(subscription, &mut earlier);
                    }
                }
            }
        }
        None => {
            for name in &names {
                notices.push(notice(word, Some(name), 0));
            }
            if names.is_empty() {
                notices.push(notice(word, None, 0));
            }
        }
    }
    frames(earlier, notices)
}

pub(super) fn cmd_subscribe(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(subscribe(call, args, Kind::Channel, "subscribe"))
}

pub(super) fn cmd_psubscribe(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(subscribe(call, args, Kind::Pattern, "psubscribe"))
}

pub(super) fn cmd_unsubscribe(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(unsubscribe(call, args, Kind::Channel, "unsubscribe"))
}

pub(super) fn cmd_punsubscribe(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(unsubscribe(call, args, Kind::Pattern, "punsubscribe"))
}

/// `PUBLISH channel message`: how many subscriptions it was queued for.
pub(super) fn cmd_publish(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let limit = call.state.settings.pubsub_limit();
    let receivers = Reply::Int(call.state.pubsub.publish(&args[1], &args[2], limit) as i64);
    // A message to itself goes out before the reply, as in Redis 7.0 (not inside EXEC).
    let mut earlier = Vec::new();
    take_earlier(call.session, &mut earlier);
    Ok(match earlier.is_empty() {
        true => receivers,
        false => Reply::Frames(vec![Reply::Encoded(earlier), receivers]),
    })
}

/// `PUBSUB CHANNELS [pattern] | NUMSUB [channel ...] | NUMPAT | HELP`.
pub(super) fn cmd_pubsub(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let pubsub = &call.state.pubsub;
    let sub = args[1].to_ascii_uppercase();
    Ok(match (sub.as_slice(), &args[2..]) {
        (b"CHANNELS", rest) if rest.len() <= 1 => Reply::Array(
            pubsub
                .channels(rest.first().map(|p| p.as_slice()))
                .into_iter()
                .map(Reply::Bulk)
                .collect(),
        ),
        (b"NUMSUB", channels) => {
            // A flat array in RESP3 too, as Redis 7.0 answers.
            let mut out = Vec::with_capacity(channels.len() * 2);
            for channel in channels {
                out.push(Reply::Bulk(channel.clone()));
                out.push(Reply::Int(pubsub.numsub(channel) as i64));
            }
            Reply::Array(out)
        }
        (b"NUMPAT", []) => Reply::Int(pubsub.numpat() as i64),
        (b"NUMPAT", _) => wrong_args("pubsub|numpat"),
        (b"HELP", []) => Reply::Array(
            [
                "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CHANNELS [<pattern>]",
                "    Return the currently active channels matching a <pattern> (default: '*').",
                "NUMPAT",
                "    Return number of subscriptions to patterns.",
                "NUMSUB [<channel> ...]",
                "    Return the number of subscribers for the specified channels, excluding",
                "    pattern subscriptions(default: no channels).",
                "HELP",
                "    Prints this help.",
            ]
            .into_iter()
            .map(|line| Reply::Status(line.into()))
            .collect(),
        ),
        (b"CHANNELS", _) => Reply::error(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try PUBSUB HELP.",
            printable(&args[1], 32)
        )),
        _ => Reply::error(format!(
            "ERR unknown subcommand '{}'. Try PUBSUB HELP.",
            printable(&args[1], 32)
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribed_resp2_connections_run_only_redis_s_list() {
        let args =
            |a: &[&str]| -> Vec<Vec<u8>> { a.iter().map(|s| s.as_bytes().to_vec()).collect() };
        assert!(refused_while_subscribed("ping", &args(&["PING"])).is_none());
        assert!(refused_while_subscribed("punsubscribe", &args(&["PUNSUBSCRIBE"])).is_none());
        let Some(Reply::Error(text)) = refused_while_subscribed("get", &args(&["GET", "k"])) else {
            panic!("GET must be refused");
        };
        assert_eq!(
            text,
            "ERR Can't execute 'get': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
        );
        let Some(Reply::Error(text)) = refused_while_subscribed("client", &args(&["CLIENT", "ID"]))
        else {
            panic!("CLIENT ID must be refused");
        };
        assert!(text.starts_with("ERR Can't execute 'client|id'"), "{text}");
    }
}
