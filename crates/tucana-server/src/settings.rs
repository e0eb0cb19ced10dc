//! The settings `CONFIG SET` may change while the server runs, and what it answers for
//! the others.
//!
//! Owns the run-time values of `maxclients` and `timeout` (the idle timeout), which start
//! from the command line (`ServerConfig`) and are read by the listener and the
//! connections, and Redis's tuning knobs that have no effect here but are accepted so
//! clients and Redis's own tests that set them keep working: the thresholds of Redis's
//! compact encodings (tucana has one encoding per type, `types`), kept so `CONFIG GET`
//! answers what was set (and `OBJECT ENCODING` answers by them, `commands::collection`).
//! Every other setting is fixed for the life of the server and
//! `CONFIG SET` names the ones that are not. Also whether the sweeper deletes expired
//! keys (`DEBUG SET-ACTIVE-EXPIRE`, `commands::debug`), and the output limit of Pub/Sub
//! subscribers (`client-output-buffer-limit`'s `pubsub` class, see `pubsub`), and the
//! classes of keyspace notifications published (`notify-keyspace-events`, see `notify`;
//! one atomic that every write command loads once). It does not own the parsing of
//! `CONFIG` requests (`commands::admin`).
//!
//! Thread-safety: atomics and one mutex; a change is seen by the next accept (maxclients)
//! or the next read of a connection (timeout).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::{OutputLimit, ServerConfig};

/// Settings accepted with no effect, with Redis 7.0's defaults: the thresholds below
/// which Redis uses its compact encodings.
const ENCODING_THRESHOLDS: [(&str, &str); 14] = [
    ("hash-max-listpack-entries", "512"),
    ("hash-max-listpack-value", "64"),
    ("hash-max-ziplist-entries", "512"),
    ("hash-max-ziplist-value", "64"),
    ("set-max-intset-entries", "512"),
    ("set-max-listpack-entries", "128"),
    ("set-max-listpack-value", "64"),
    ("zset-max-listpack-entries", "128"),
    ("zset-max-listpack-value", "64"),
    ("zset-max-ziplist-entries", "128"),
    ("zset-max-ziplist-value", "64"),
    ("list-max-listpack-size", "-2"),
    ("list-max-ziplist-size", "-2"),
    ("list-compress-depth", "0"),
];

/// Redis 7 keeps the ziplist names as aliases of the listpack ones: setting either sets
/// both.
const ALIASES: [(&str, &str); 5] = [
    ("hash-max-ziplist-entries", "hash-max-listpack-entries"),
    ("hash-max-ziplist-value", "hash-max-listpack-value"),
    ("zset-max-ziplist-entries", "zset-max-listpack-entries"),
    ("zset-max-ziplist-value", "zset-max-listpack-value"),
    ("list-max-ziplist-size", "list-max-listpack-size"),
];

/// Settings whose one value is what tucana does; setting that value is accepted.
const FIXED_VALUES: [(&str, &str, &str); 4] = [
    ("appendonly", "yes", "every write is in the log"),
    (
        "save",
        "",
        "there are no snapshots: every write is in the log",
    ),
    (
        "maxmemory",
        "0",
        "tucana keeps data on disk and evicts nothing",
    ),
    (
        "aof-use-rdb-preamble",
        "no",
        "the log holds write records only, never a snapshot",
    ),
];

/// The settings `CONFIG SET` changes for real, for its error messages.
pub const SETTABLE: &str =
    "maxclients, timeout, client-output-buffer-limit (pubsub class), notify-keyspace-events";

/// The run-time settings of one server.
pub struct Settings {
    max_clients: AtomicU64,
    /// 0: never. Milliseconds, as the command line may give it (tests do); CONFIG
    /// speaks seconds.
    idle_timeout_ms: AtomicU64,
    inert: Mutex<BTreeMap<&'static str, String>>,
    /// The sweeper deletes expired keys (`DEBUG SET-ACTIVE-EXPIRE`, as in Redis: a test
    /// turns it off to see lazy expiry alone). Lazy expiry is unaffected.
    active_expire: AtomicBool,
    /// `client-output-buffer-limit pubsub <hard> <soft> <seconds>`.
    pubsub_hard_bytes: AtomicU64,
    pubsub_soft_bytes: AtomicU64,
    pubsub_soft_s: AtomicU64,
    /// `notify-keyspace-events`: the classes published (`notify`'s flags; 0: none).
    notify_flags: AtomicU32,
}

/// Why `CONFIG SET` refused a change (the text of its error reply, after `ERR `).
pub type Refusal = String;

impl Settings {
    pub fn new(config: &ServerConfig) -> Settings {
        Settings {
            max_clients: AtomicU64::new(config.max_clients as u64),
            idle_timeout_ms: AtomicU64::new(
                config.idle_timeout.map_or(0, |d| d.as_millis() as u64),
            ),
            inert: Mutex::new(
                ENCODING_THRESHOLDS
                    .iter()
                    .map(|&(k, v)| (k, v.to_string()))
                    .collect(),
            ),
            active_expire: AtomicBool::new(true),
            pubsub_hard_bytes: AtomicU64::new(config.pubsub_limit.hard_bytes),
            pubsub_soft_bytes: AtomicU64::new(config.pubsub_limit.soft_bytes),
            pubsub_soft_s: AtomicU64::new(config.pubsub_limit.soft_s),
            // `ServerConfig::validate` refused a flag string that does not parse.
            notify_flags: AtomicU32::new(
                crate::notify::parse(config.notify_keyspace_events.as_bytes()).unwrap_or(0),
            ),
        }
    }

    /// The bound on a Pub/Sub subscriber's outbound bytes.
    pub fn pubsub_limit(&self) -> OutputLimit {
        OutputLimit {
            hard_bytes: self.pubsub_hard_bytes.load(Ordering::Relaxed),
            soft_bytes: self.pubsub_soft_bytes.load(Ordering::Relaxed),
            soft_s: self.pubsub_soft_s.load(Ordering::Relaxed),
        }
    }

    /// `client-output-buffer-limit` as `CONFIG GET` answers it: Redis's three classes;
    /// only `pubsub` is enforced (normal clients' replies are bounded by the batch
    /// size, and tucana has no Redis replicas).
    fn output_limit_text(&self) -> String {
        let limit = self.pubsub_limit();
        format!(
            "normal 0 0 0 slave 268435456 67108864 60 pubsub {} {} {}",
            limit.hard_bytes, limit.soft_bytes, limit.soft_s
        )
    }

    /// The keyspace notification classes published now (`notify`; 0: none).
    pub fn notify_flags(&self) -> u32 {
        self.notify_flags.load(Ordering::Relaxed)
    }

    /// Whether the sweeper deletes expired keys now (`DEBUG SET-ACTIVE-EXPIRE`).
    pub fn active_expire(&self) -> bool {
        self.active_expire.load(Ordering::Relaxed)
    }

    pub fn set_active_expire(&self, on: bool) {
        self.active_expire.store(on, Ordering::Relaxed);
    }

    pub fn max_clients(&self) -> u64 {
        self.max_clients.load(Ordering::Relaxed)
    }

    /// The idle timeout (`None`: never).
    pub fn idle_timeout(&self) -> Option<Duration> {
        match self.idle_timeout_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// One of Redis's encoding thresholds (`hash-max-listpack-entries`, ...), as last
    /// set; `OBJECT ENCODING` answers by them.
    pub fn threshold(&self, name: &str) -> i64 {
        let value = self.inert.lock().get(name).and_then(|v| v.parse().ok());
        debug_assert!(value.is_some(), "{name} is not a threshold");
        value.unwrap_or(0)
    }

    /// The settings kept here, as `CONFIG GET` lists them: `maxclients`, `timeout`
    /// (seconds), the fixed values, then the accepted encoding thresholds.
    pub fn values(&self) -> Vec<(String, String)> {
        let mut out = vec![
            ("maxclients".to_string(), self.max_clients().to_string()),
            (
                "timeout".to_string(),
                (self.idle_timeout_ms.load(Ordering::Relaxed) / 1000).to_string(),
            ),
        ];
        for (k, v, _) in FIXED_VALUES {
            out.push((k.to_string(), v.to_string()));
        }
        out.push((
            "client-output-buffer-limit".to_string(),
            self.output_limit_text(),
        ));
        out.push((
            "notify-keyspace-events".to_string(),
            crate::notify::to_text(self.notify_flags()),
        ));
        for (k, v) in self.inert.lock().iter() {
            out.push((k.to_string(), v.clone()));
        }
        out
    }

    /// Applies `pairs` (name, value) all or nothing: every one is checked before any
    /// changes, as Redis 7 does.
    pub fn set(&self, pairs: &[(&[u8], &[u8])]) -> Result<(), Refusal> {
        enum Change {
            MaxClients(u64),
            Timeout(u64),
            Inert(&'static str, String),
            PubSubLimit(OutputLimit),
            Notify(u32),
            Nothing,
        }
        let mut changes = Vec::with_capacity(pairs.len());
        for &(name, value) in pairs {
            let name_text = String::from_utf8_lossy(name).to_ascii_lowercase();
            let value_text = String::from_utf8_lossy(value).into_owned();
            let number = || {
                value_text.parse::<u64>().map_err(|_| {
                    format!(
                        "CONFIG SET failed (possibly related to argument '{name_text}') - argument couldn't be parsed into an integer"
                    )
                })
            };
            let change = match name_text.as_str() {
                "maxclients" => match number()? {
                    0 => return Err(format!("CONFIG SET failed (possibly related to argument '{name_text}') - argument must be between 1 and 4294967295 inclusive")),
                    n => Change::MaxClients(n),
                },
                "timeout" => Change::Timeout(number()?),
                "notify-keyspace-events" => match crate::notify::parse(value) {
                    Some(flags) => Change::Notify(flags),
                    None => return Err(format!(
                        "CONFIG SET failed (possibly related to argument '{name_text}') - {}",
                        crate::notify::INVALID
                    )),
                },
                "client-output-buffer-limit" => match parse_output_limit(&value_text) {
                    Ok(Some(limit)) => Change::PubSubLimit(limit),
                    Ok(None) => Change::Nothing,
                    Err(why) => return Err(format!(
                        "CONFIG SET failed (possibly related to argument '{name_text}') - {why}"
                    )),
                },
                _ => {
                    if let Some(&(key, _)) =
                        ENCODING_THRESHOLDS.iter().find(|(k, _)| *k == name_text)
                    {
                        value_text.parse::<i64>().map_err(|_| {
                            format!("CONFIG SET failed (possibly related to argument '{name_text}') - argument couldn't be parsed into an integer")
                        })?;
                        Change::Inert(key, value_text)
                    } else if let Some((_, fixed, why)) =
                        FIXED_VALUES.iter().find(|(k, _, _)| *k == name_text)
                    {
                        if value_text.eq_ignore_ascii_case(fixed) {
                            Change::Nothing
                        } else {
                            return Err(format!(
                                "CONFIG SET failed (possibly related to argument '{name_text}') - only '{fixed}' is accepted here: {why}"
                            ));
                        }
                    } else {
                        return Err(format!(
                            "CONFIG SET failed (possibly related to argument '{name_text}') - not supported: tucana serve is configured by its command line; at run time only {SETTABLE} change (and Redis's encoding thresholds are accepted, with no effect)"
                        ));
                    }
                }
            };
            changes.push(change);
        }
        for change in changes {
            match change {
                Change::MaxClients(n) => self.max_clients.store(n, Ordering::Relaxed),
                Change::Timeout(s) => self
                    .idle_timeout_ms
                    .store(s.saturating_mul(1000), Ordering::Relaxed),
                Change::Inert(k, v) => {
                    let mut inert = self.inert.lock();
                    for &(a, b) in &ALIASES {
                        if k == a {
                            inert.insert(b, v.clone());
                        } else if k == b {
                            inert.insert(a, v.clone());
                        }
                    }
                    inert.insert(k, v);
                }
                Change::PubSubLimit(limit) => {
                    self.pubsub_hard_bytes
                        .store(limit.hard_bytes, Ordering::Relaxed);
                    self.pubsub_soft_bytes
                        .store(limit.soft_bytes, Ordering::Relaxed);
                    self.pubsub_soft_s.store(limit.soft_s, Ordering::Relaxed);
                }
                Change::Notify(flags) => self.notify_flags.store(flags, Ordering::Relaxed),
                Change::Nothing => {}
            }
        }
        Ok(())
    }
}

/// A byte count as Redis writes one: digits with an optional unit (`k` 1000, `kb`
/// 1024, `m`, `mb`, `g`, `gb`; any case).
fn parse_bytes(text: &str) -> Option<u64> {
    let lower = text.to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (digits, unit) = lower.split_at(digits_end);
    let n: u64 = digits.parse().ok()?;
    let scale: u64 = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1 << 10,
        "m" => 1000 * 1000,
        "mb" => 1 << 20,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// `client-output-buffer-limit`'s value: groups of `<class> <hard> <soft> <seconds>`.
/// The `pubsub` class's limit is returned (`None`: not given); the `normal` and
/// `replica` classes are accepted only at their Redis defaults, which is what tucana
/// does for them (no limit on normal clients' replies beyond the batch's; no Redis
/// replicas).
fn parse_output_limit(text: &str) -> Result<Option<OutputLimit>, String> {
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    if words.is_empty() || !words.len().is_multiple_of(4) {
        return Err("Wrong number of arguments in buffer limit configuration.".into());
    }
    let mut pubsub = None;
    for group in words.chunks(4) {
        let numbers: Option<Vec<u64>> = group[1..].iter().map(|w| parse_bytes(w)).collect();
        let Some(numbers) = numbers else {
            return Err(
                "Error in hard, soft or soft_seconds setting in buffer limit configuration.".into(),
            );
        };
        let limit = OutputLimit {
            hard_bytes: numbers[0],
            soft_bytes: numbers[1],
            soft_s: numbers[2],
        };
        match group[0].to_ascii_lowercase().as_str() {
            "pubsub" => pubsub = Some(limit),
            "normal" if numbers == [0, 0, 0] => {}
            "replica" | "slave" if numbers == [256 << 20, 64 << 20, 60] => {}
            "normal" | "replica" | "slave" => {
                return Err(format!(
                    "only the pubsub class's limit can change here (the {} class keeps Redis's default)",
                    group[0]
                ))
            }
            _ => return Err("Invalid client class specified in buffer limit configuration.".into()),
        }
    }
    Ok(pubsub)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_apply_all_or_nothing() {
        let s = Settings::new(&ServerConfig::default());
        s.set(&[(b"timeout", b"30"), (b"MAXCLIENTS", b"7")])
            .unwrap();
        assert_eq!(s.idle_timeout(), Some(Duration::from_secs(30)));
        assert_eq!(s.max_clients(), 7);
        let err = s.set(&[(b"timeout", b"0"), (b"port", b"1")]).unwrap_err();
        assert!(err.contains("'port') - not supported") && err.contains(SETTABLE));
        assert_eq!(s.idle_timeout(), Some(Duration::from_secs(30)));
        assert!(s.set(&[(b"timeout", b"x")]).is_err());
        s.set(&[(b"hash-max-ziplist-value", b"16")]).unwrap();
        assert!(s
            .values()
            .contains(&("hash-max-ziplist-value".into(), "16".into())));
        assert_eq!(s.threshold("hash-max-listpack-value"), 16, "an alias");
        s.set(&[(b"save", b"")]).unwrap();
        assert!(s.set(&[(b"maxmemory", b"100mb")]).is_err());
    }

    #[test]
    fn the_pubsub_output_limit_is_set_as_redis_writes_it() {
        let s = Settings::new(&ServerConfig::default());
        assert_eq!(s.pubsub_limit(), OutputLimit::default());
        s.set(&[(b"client-output-buffer-limit", b"pubsub 1mb 512k 5")])
            .unwrap();
        let limit = OutputLimit {
            hard_bytes: 1 << 20,
            soft_bytes: 512_000,
            soft_s: 5,
        };
        assert_eq!(s.pubsub_limit(), limit);
        assert!(s
            .values()
            .iter()
            .any(|(k, v)| k == "client-output-buffer-limit"
                && v.ends_with("pubsub 1048576 512000 5")));
        for bad in [
            &b"pubsub 1mb 0"[..],
            b"pubsub 1xb 0 0",
            b"normal 1 0 0",
            b"friends 0 0 0",
        ] {
            assert!(s.set(&[(b"client-output-buffer-limit", bad)]).is_err());
        }
        assert_eq!(s.pubsub_limit(), limit, "a refused change changes nothing");
        s.set(&[(b"client-output-buffer-limit", b"normal 0 0 0 pubsub 0 0 0")])
            .unwrap();
        assert_eq!(s.pubsub_limit().hard_bytes, 0);
    }
}
