//! The per-connection [`Session`] and the commands of Redis's `connection` group, which
//! read or change it: AUTH, HELLO, SELECT, CLIENT, QUIT, RESET, PING, ECHO (and the
//! session's Pub/Sub subscriptions, which `pubsub` changes).
//!
//! Owns the session's fields and the password check. It does not own the connection's
//! socket or its lifetime: `close_after_reply` and `shutdown_requested` only ask the
//! connection (`connection`) to end it, or the server to stop.
//!
//! Thread-safety: a `Session` belongs to one connection and moves with its batch when
//! that runs on a blocking thread; it is never shared.

use crate::resp::{Protocol, Reply};

use super::pubsub::drop_subscription;
use super::transaction::{Multi, Watched};
use super::{
    not_an_integer, opt_bulk, parse_i64, printable, syntax_error, wrong_args, Call,
    REDIS_COMPAT_VERSION,
};

/// Per-connection state.
#[derive(Debug)]
pub struct Session {
    /// `CLIENT ID`.
    pub(super) id: u64,
    pub protocol: Protocol,
    /// The database `SELECT` chose.
    pub(super) db_index: u32,
    pub authenticated: bool,
    /// `CLIENT SETNAME`, `HELLO ... SETNAME`.
    pub(super) name: Option<Vec<u8>>,
    /// `CLIENT SETINFO LIB-NAME`, `LIB-VER`.
    pub(super) lib_name: Option<Vec<u8>>,
    pub(super) lib_version: Option<Vec<u8>>,
    /// Between `MULTI` and `EXEC` or `DISCARD`: the queued commands.
    pub(super) multi: Option<Multi>,
    /// `WATCH`ed keys, until `EXEC`, `DISCARD` or `UNWATCH` (released when dropped).
    pub(super) watching: Vec<Watched>,
    /// `READONLY` (cluster mode): the client accepts reads from backups: a read of a
    /// slot this server backs is served from the replica's last applied commit.
    pub(super) readonly: bool,
    /// `ASKING` (cluster mode): the next command may run on a slot this server is
    /// importing; cleared after it.
    pub(super) asking: bool,
    /// Close the connection once the replies so far are written (`QUIT`, `SHUTDOWN`).
    pub close_after_reply: bool,
    /// The client asked the server to shut down.
    pub shutdown_requested: bool,
    /// The keyspace and log position of this connection's last write, for `WAIT` (kept
    /// only with replication).
    pub last_write: Option<(String, tucana::replication::LogPosition)>,
    /// Cluster mode: the regions' keyspaces the current batch wrote to (their backups
    /// must acknowledge the writes); taken after each batch.
    pub wrote_keyspaces: Vec<String>,
    /// Cluster mode with sync durability: the regions' keyspaces the current batch read
    /// as their primary (a reply may go only once the backups acknowledged what the read
    /// saw); taken after each batch.
    pub read_keyspaces: Vec<String>,
    /// Reads noted (`read_from`) since the session began: the batch marks the replies
    /// of the requests that noted one.
    pub(super) reads_noted: u64,
    /// A blocking pop found nothing: what the connection waits for (taken by it).
    pub blocked: Option<super::Blocked>,
    /// The request running is a blocked one run again (`retry_blocked`).
    pub(super) retrying: bool,
    /// Pub/Sub: the channels and patterns subscribed to, while there is one.
    pub(super) pubsub: Option<crate::pubsub::Subscription>,
    /// `CLIENT REPLY`.
    pub(super) reply_mode: ReplyMode,
    /// `EXEC` is running its queued commands.
    pub(super) in_exec: bool,
}

/// `CLIENT REPLY ON | OFF | SKIP`: which replies the client gets (Pub/Sub's push frames
/// and messages always go out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReplyMode {
    On,
    Off,
    /// `CLIENT REPLY SKIP` ran: its own reply is not sent, nor the next command's.
    SkipThisAndNext,
    /// The command running now gets no reply; the ones after it do.
    SkipThis,
}

impl Session {
    /// Notes that the batch wrote to keyspace `name` (cluster mode).
    pub(super) fn wrote_to(&mut self, name: &str) {
        if !self.wrote_keyspaces.iter().any(|n| n == name) {
            self.wrote_keyspaces.push(name.to_string());
        }
    }

    /// Notes that the request read keyspace `name` as its region's primary (cluster
    /// mode with sync durability: see `read_keyspaces`).
    pub(super) fn read_from(&mut self, name: &str) {
        self.reads_noted += 1;
        if !self.read_keyspaces.iter().any(|n| n == name) {
            self.read_keyspaces.push(name.to_string());
        }
    }

    /// `CLIENT ID`.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The selected database's index (`SELECT`).
    pub fn db_index(&self) -> u32 {
        self.db_index
    }

    pub fn new(id: u64, authenticated: bool) -> Session {
        Session {
            id,
            protocol: Protocol::Resp2,
            db_index: 0,
            authenticated,
            name: None,
            lib_name: None,
            lib_version: None,
            multi: None,
            watching: Vec::new(),
            readonly: false,
            asking: false,
            close_after_reply: false,
            shutdown_requested: false,
            last_write: None,
            wrote_keyspaces: Vec::new(),
            read_keyspaces: Vec::new(),
            reads_noted: 0,
            blocked: None,
            retrying: false,
            pubsub: None,
            reply_mode: ReplyMode::On,
            in_exec: false,
        }
    }

    /// Whether every reply is sent (`CLIENT REPLY ON`, the default).
    pub(super) fn replies_on(&self) -> bool {
        self.reply_mode == ReplyMode::On
    }

    /// After a command ran: whether its reply is withheld (`CLIENT REPLY`), moving a
    /// `SKIP` on to the next command.
    pub(super) fn take_reply_suppressed(&mut self) -> bool {
        match self.reply_mode {
            ReplyMode::On => false,
            ReplyMode::Off => true,
            ReplyMode::SkipThisAndNext => {
                self.reply_mode = ReplyMode::SkipThis;
                true
            }
            ReplyMode::SkipThis => {
                self.reply_mode = ReplyMode::On;
                true
            }
        }
    }

    /// Pub/Sub: this connection's queue of messages, while it is subscribed to a
    /// channel or pattern (the connection writes what is queued there).
    pub fn subscriber(&self) -> Option<&std::sync::Arc<crate::pubsub::Subscriber>> {
        self.pubsub.as_ref().map(|s| s.subscriber())
    }

    /// RESP2 with a subscription: only the commands Redis allows in that context run.
    pub(super) fn in_resp2_pubsub(&self) -> bool {
        self.pubsub.as_ref().is_some_and(|s| s.count() > 0) && self.protocol == Protocol::Resp2
    }
}

pub(super) fn cmd_ping(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    // Subscribed in RESP2, Redis answers PING as a message: ["pong", message or ""].
    if call.session.in_resp2_pubsub() && args.len() <= 2 {
        let message = args.get(1).cloned().unwrap_or_default();
        return Ok(Reply::Array(vec![
            Reply::bulk("pong"),
            Reply::Bulk(message),
        ]));
    }
    Ok(match args {
        [_] => Reply::Status("PONG".into()),
        [_, msg] => Reply::Bulk(msg.clone()),
        _ => wrong_args("ping"),
    })
}

pub(super) fn cmd_echo(_call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    Ok(Reply::Bulk(args[1].clone()))
}

pub(super) fn cmd_quit(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    call.session.close_after_reply = true;
    Ok(Reply::Ok)
}

/// `RESET`: the connection as it was when it opened: no transaction and no watches, no
/// Pub/Sub subscription (without an unsubscribe reply, as Redis), RESP2, database 0, no
/// name, and not authenticated when a password is required. It runs at once inside
/// `MULTI`, which it discards.
pub(super) fn cmd_reset(call: &mut Call<'_>, _args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let session = &mut *call.session;
    // Messages delivered before the RESET still go out, before its reply.
    let mut earlier = Vec::new();
    if let Some(subscription) = session.pubsub.take() {
        drop_subscription(subscription, &mut earlier);
    }
    session.multi = None;
    session.watching.clear();
    session.protocol = Protocol::Resp2;
    session.db_index = 0;
    session.name = None;
    session.readonly = false;
    session.asking = false;
    session.reply_mode = ReplyMode::On;
    session.authenticated = call.state.config.requirepass.is_none();
    let reply = Reply::Status("RESET".into());
    if earlier.is_empty() {
        Ok(reply)
    } else {
        Ok(Reply::Frames(vec![Reply::Encoded(earlier), reply]))
    }
}

pub(super) fn cmd_select(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    match parse_i64(&args[1]) {
        // Redis Cluster has only database 0.
        Some(n) if n != 0 && call.state.cluster.is_some() => {
            Ok(Reply::error("ERR SELECT is not allowed in cluster mode"))
        }
        Some(n) if n >= 0 && n < i64::from(call.state.store.databases()) => {
            call.session.db_index = n as u32;
            Ok(Reply::Ok)
        }
        Some(_) => Ok(Reply::error("ERR DB index is out of range")),
        None => Ok(not_an_integer()),
    }
}

/// Compares in time independent of where the first difference is.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

/// Checks a user name and password; `Err` is the reply when they are wrong.
fn authenticate(call: &mut Call<'_>, user: Option<&[u8]>, password: &[u8]) -> Result<(), Reply> {
    let Some(expected) = call.state.config.requirepass.as_deref() else {
        // No password: Redis's `default` user is `nopass`, so naming it signs in with
        // any password; the one-argument form and any other user are refused.
        match user {
            Some(name) if name == b"default" => {
                call.session.authenticated = true;
                return Ok(());
            }
            Some(_) => {
                call.state.metrics.count_auth_failure();
                return Err(Reply::error(
                    "WRONGPASS invalid username-password pair or user is disabled.",
                ));
            }
            None => {}
        }
        return Err(Reply::error(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        ));
    };
    let user_ok = user.is_none_or(|u| u == b"default");
    if user_ok && same_secret(password, expected.as_bytes()) {
        call.session.authenticated = true;
        Ok(())
    } else {
        call.state.metrics.count_auth_failure();
        Err(Reply::error(
            "WRONGPASS invalid username-password pair or user is disabled.",
        ))
    }
}

pub(super) fn cmd_auth(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let result = match args {
        [_, password] => authenticate(call, None, password),
        [_, user, password] => authenticate(call, Some(user), password),
        _ => return Ok(syntax_error()),
    };
    Ok(result.map_or_else(|e| e, |()| Reply::Ok))
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`
pub(super) fn cmd_hello(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let mut protocol = call.session.protocol;
    if let Some(version) = args.get(1) {
        protocol = match parse_i64(version) {
            Some(2) => Protocol::Resp2,
            Some(3) => Protocol::Resp3,
            Some(_) => return Ok(Reply::error("NOPROTO unsupported protocol version")),
            None => {
                return Ok(Reply::error(
                    "ERR Protocol version is not an integer or out of range",
                ))
            }
        };
    }
    let mut name = None;
    let mut i = 2;
    while i < args.len() {
        match args[i].to_ascii_uppercase().as_slice() {
            b"AUTH" if i + 2 < args.len() => {
                if let Err(reply) = authenticate(call, Some(&args[i + 1]), &args[i + 2]) {
                    return Ok(reply);
                }
                i += 3;
            }
            b"SETNAME" if i + 1 < args.len() => {
                name = Some(args[i + 1].clone());
                i += 2;
            }
            _ => return Ok(syntax_error()),
        }
    }
    if !call.session.authenticated {
        return Ok(Reply::error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        ));
    }
    if let Some(name) = name {
        call.session.name = Some(name);
    }
    call.session.protocol = protocol;
    if let Some(subscription) = &call.session.pubsub {
        subscription.set_resp3(protocol == Protocol::Resp3);
    }
    let proto = if protocol == Protocol::Resp3 { 3 } else { 2 };
    let s = |t: &str| Reply::bulk(t);
    Ok(Reply::Map(vec![
        (s("server"), s("tucana")),
        (s("version"), s(REDIS_COMPAT_VERSION)),
        (s("proto"), Reply::Int(proto)),
        (s("id"), Reply::Int(call.session.id as i64)),
        (s("mode"), s("standalone")),
        (s("role"), s("master")),
        (s("modules"), Reply::Array(vec![])),
    ]))
}

fn client_info_line(call: &Call<'_>) -> String {
    let text = |v: &Option<Vec<u8>>| v.as_deref().map(|b| printable(b, 64)).unwrap_or_default();
    format!(
        "id={} name={} db={} resp={} lib-name={} lib-ver={}",
        call.session.id,
        text(&call.session.name),
        call.session.db_index,
        if call.session.protocol == Protocol::Resp3 {
            3
        } else {
            2
        },
        text(&call.session.lib_name),
        text(&call.session.lib_version),
    )
}

pub(super) fn cmd_client(call: &mut Call<'_>, args: &[Vec<u8>]) -> tucana::Result<Reply> {
    let sub = args[1].to_ascii_uppercase();
    Ok(match (sub.as_slice(), &args[2..]) {
        (b"SETNAME", [name]) => {
            if name.iter().any(|&b| b <= b' ' || b > b'~') {
                Reply::error("ERR Client names cannot contain spaces, newlines or special characters.")
            } else {
                call.session.name = (!name.is_empty()).then(|| name.clone());
                Reply::Ok
            }
        }
        (b"GETNAME", []) => opt_bulk(call.session.name.clone()),
        (b"ID", []) => Reply::Int(call.session.id as i64),
        (b"SETINFO", [attr, value]) => match attr.to_ascii_uppercase().as_slice() {
            b"LIB-NAME" => {
                call.session.lib_name = Some(value.clone());
                Reply::Ok
            }
            b"LIB-VER" => {
                call.session.lib_version = Some(value.clone());
                Reply::Ok
            }
            _ => Reply::error(format!(
                "ERR Unrecognized option '{}'",
                printable(attr, 32)
            )),
        },
        (b"UNBLOCK", [id, how @ ..]) if how.len() <= 1 => {
            let how = match how.first().map(|h| h.to_ascii_uppercase()) {
                None => crate::waiters::UnblockAs::Timeout,
                Some(h) if h == b"TIMEOUT" => crate::waiters::UnblockAs::Timeout,
                Some(h) if h == b"ERROR" => crate::waiters::UnblockAs::Error,
                Some(_) => {
                    return Ok(Reply::error(
                        "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR",
                    ))
                }
            };
            match parse_i64(id) {
                Some(id) => Reply::Int(i64::from(
                    u64::try_from(id).is_ok_and(|id| call.state.unblock.unblock(id, how)),
                )),
                None => not_an_integer(),
            }
        }
        (b"INFO", []) => Reply::Bulk(format!("{}\n", client_info_line(call)).into_bytes()),
        // Eviction and LRU do not exist here, so opting out of them changes nothing.
        (b"NO-EVICT" | b"NO-TOUCH", [_]) => Reply::Ok,
        (b"REPLY", [mode]) => match mode.to_ascii_uppercase().as_slice() {
            b"ON" => {
                call.session.reply_mode = ReplyMode::On;
                Reply::Ok
            }
            // Withheld (`take_reply_suppressed`).
            b"OFF" => {
                call.session.reply_mode = ReplyMode::Off;
                Reply::Ok
            }
            // Under OFF, everything stays withheld (as in Redis, SKIP does not end OFF).
            b"SKIP" => {
                if call.session.reply_mode != ReplyMode::Off {
                    call.session.reply_mode = ReplyMode::SkipThisAndNext;
                }
                Reply::Ok
            }
            _ => syntax_error(),
        },
        _ => Reply::error(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Supported: SETNAME GETNAME ID SETINFO INFO UNBLOCK REPLY",
            printable(&args[1], 32)
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }
}
