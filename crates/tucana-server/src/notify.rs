//! Keyspace notifications (Redis's `notify-keyspace-events`): the event classes, their
//! flag string (parsed for `CONFIG SET` and the command line, written back for `CONFIG
//! GET`), and the messages one event is published as ([`publish`], handed to Pub/Sub's
//! registry by the caller: this module imports nothing, so `config` can check a flag
//! string with it).
//!
//! Owns the channel names (`__keyspace@<db>__:<key>` carrying the event name,
//! `__keyevent@<db>__:<event>` carrying the key) and which of the two an event goes to.
//! It does not own which command raises which event (the handlers, through
//! `Kv::notify` in `commands`; the sweeper for `expired`), nor the enabled classes at run
//! time (`settings`, one atomic), nor delivery (`pubsub`).
//!
//! Thread-safety: constants and pure functions.

/// `K`: publish to `__keyspace@<db>__:<key>`.
pub const KEYSPACE: u32 = 1 << 0;
/// `E`: publish to `__keyevent@<db>__:<event>`.
pub const KEYEVENT: u32 = 1 << 1;
/// `g`: generic commands (DEL, EXPIRE, RENAME, COPY, PERSIST, ...).
pub const GENERIC: u32 = 1 << 2;
/// `$`: string commands.
pub const STRING: u32 = 1 << 3;
/// `l`: list commands.
pub const LIST: u32 = 1 << 4;
/// `s`: set commands.
pub const SET: u32 = 1 << 5;
/// `h`: hash commands.
pub const HASH: u32 = 1 << 6;
/// `z`: sorted set commands.
pub const ZSET: u32 = 1 << 7;
/// `x`: a key expired (its records deleted, lazily by a write or by the sweeper).
pub const EXPIRED: u32 = 1 << 8;
/// `e`: a key evicted (never here: tucana evicts nothing; accepted for Redis's sake).
pub const EVICTED: u32 = 1 << 9;
/// `t`: stream commands (no streams here; accepted).
pub const STREAM: u32 = 1 << 10;
/// `m`: a read missed (accepted, not published: see DESIGN.md, "Keyspace
/// notifications"; not part of `A`, as in Redis).
pub const KEY_MISS: u32 = 1 << 11;
/// `d`: module key types (no modules here; accepted).
pub const MODULE: u32 = 1 << 12;
/// `n`: a key was created (not part of `A`, as in Redis).
pub const NEW: u32 = 1 << 13;
/// `A`: every class but `m` and `n`.
pub const ALL: u32 =
    GENERIC | STRING | LIST | SET | HASH | ZSET | EXPIRED | EVICTED | STREAM | MODULE;

/// The classes in the order `CONFIG GET` writes them (after `A`, or instead of it).
const CLASS_CHARS: [(u32, char); 11] = [
    (GENERIC, 'g'),
    (STRING, '$'),
    (LIST, 'l'),
    (SET, 's'),
    (HASH, 'h'),
    (ZSET, 'z'),
    (EXPIRED, 'x'),
    (EVICTED, 'e'),
    (STREAM, 't'),
    (MODULE, 'd'),
    (NEW, 'n'),
];

/// Redis's text for a flag string with a character it does not know.
pub const INVALID: &str = "Invalid event class character. Use 'Ag$lshzxeKEtmdn'.";

/// The flags of a `notify-keyspace-events` value (`None`: a character that is no class).
/// The empty string disables notifications.
pub fn parse(text: &[u8]) -> Option<u32> {
    let mut flags = 0;
    for &c in text {
        flags |= match c {
            b'A' => ALL,
            b'g' => GENERIC,
            b'$' => STRING,
            b'l' => LIST,
            b's' => SET,
            b'h' => HASH,
            b'z' => ZSET,
            b'x' => EXPIRED,
            b'e' => EVICTED,
            b'K' => KEYSPACE,
            b'E' => KEYEVENT,
            b't' => STREAM,
            b'm' => KEY_MISS,
            b'd' => MODULE,
            b'n' => NEW,
            _ => return None,
        };
    }
    Some(flags)
}

/// The flag string `CONFIG GET` answers: `A` for all of its classes (else each class),
/// then `K`, `E`, `m`, as Redis writes it. One difference: Redis 7.0 drops `n` after `A`
/// (`CONFIG SET ... An` reads back `A` though `n` is on); here it is written, so what
/// `CONFIG GET` answers sets the same flags again.
pub fn to_text(flags: u32) -> String {
    let mut out = String::new();
    let all = flags & ALL == ALL;
    if all {
        out.push('A');
    }
    for (class, c) in CLASS_CHARS {
        let in_all = ALL & class != 0;
        if flags & class != 0 && !(all && in_all) {
            out.push(c);
        }
    }
    for (class, c) in [(KEYSPACE, 'K'), (KEYEVENT, 'E'), (KEY_MISS, 'm')] {
        if flags & class != 0 {
            out.push(c);
        }
    }
    out
}

/// Whether `flags` publish events of `class` at all: the class is on, and so is at
/// least one of the two channel kinds.
pub fn wants(flags: u32, class: u32) -> bool {
    flags & class != 0 && flags & (KEYSPACE | KEYEVENT) != 0
}

/// Publishes `event` about `key` of database `db` to the channels `flags` ask for,
/// through `publish(channel, message)`: the keyspace channel first, then the keyevent
/// one (Redis's order). The caller has checked [`wants`] and publishes to this server's
/// subscribers only (in cluster mode too, as Redis).
pub fn publish(
    flags: u32,
    db: u32,
    event: &str,
    key: &[u8],
    mut publish: impl FnMut(&[u8], &[u8]),
) {
    if flags & KEYSPACE != 0 {
        let mut channel = format!("__keyspace@{db}__:").into_bytes();
        channel.extend_from_slice(key);
        publish(&channel, event.as_bytes());
    }
    if flags & KEYEVENT != 0 {
        let channel = format!("__keyevent@{db}__:{event}");
        publish(channel.as_bytes(), key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_strings_read_back_as_redis_writes_them() {
        let back = |text: &str| to_text(parse(text.as_bytes()).unwrap());
        assert_eq!(back("gKE"), "gKE");
        assert_eq!(back("$lshzxeKE"), "$lshzxeKE");
        assert_eq!(back("KA"), "AK");
        assert_eq!(back("EA"), "AE");
        assert_eq!(back("Egn$"), "g$nE");
        assert_eq!(back("KEAm"), "AKEm");
        assert_eq!(back("Ag$lshzxeKEtmdn"), "AnKEm", "n written after A");
        assert_eq!(back(""), "");
        assert_eq!(back("KEg$lshzxetd"), "AKE", "every class of A is A");
        assert_eq!(parse(b"x?"), None);
        assert_eq!(parse(b"a"), None, "case matters");
    }

    #[test]
    fn classes_need_a_channel_kind() {
        let flags = parse(b"g").unwrap();
        assert!(!wants(flags, GENERIC), "no K nor E: nothing is published");
        let flags = parse(b"Kg").unwrap();
        assert!(wants(flags, GENERIC) && !wants(flags, STRING));
        assert!(!wants(parse(b"KA").unwrap(), NEW), "n is not in A");
    }

    #[test]
    fn events_go_to_the_channels_the_flags_name() {
        let mut got = Vec::new();
        let mut collect = |c: &[u8], m: &[u8]| {
            got.push(format!(
                "{} {}",
                String::from_utf8_lossy(c),
                String::from_utf8_lossy(m)
            ))
        };
        publish(KEYSPACE | KEYEVENT, 3, "set", b"k", &mut collect);
        publish(KEYEVENT, 0, "del", b"k", &mut collect);
        publish(KEYSPACE, 1, "lpush", b"l", &mut collect);
        assert_eq!(
            got,
            [
                "__keyspace@3__:k set",
                "__keyevent@3__:set k",
                "__keyevent@0__:del k",
                "__keyspace@1__:l lpush"
            ]
        );
    }
}
