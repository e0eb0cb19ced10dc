//! Pub/Sub's shared part: which connection listens to which channel or pattern
//! ([`PubSub`], one per server), each listening connection's outbound queue
//! ([`Subscriber`]), and a connection's own handle on both ([`Subscription`]).
//!
//! Owns delivery: `PUBLISH` encodes a message once per protocol and appends it to the
//! queue of every subscriber of the channel and of every matching pattern (`glob`, the
//! matcher `KEYS` uses), then wakes that subscriber's connection, which writes its queue
//! to its socket on its own thread. No lock is held across a socket write: the registry's
//! lock (read-locked by publishers, write-locked to subscribe or unsubscribe) only covers
//! appending to in-memory queues, each behind a short mutex of its own. A queue is
//! bounded (Redis's `client-output-buffer-limit pubsub`, 32 MiB hard, 8 MiB for 60 s
//! soft by default): past the limit the subscriber is dropped, its queue freed, and its
//! connection closes, so a slow subscriber never stalls `PUBLISH` nor grows without end.
//! It does not own the commands' arguments and replies (`commands::pubsub`) nor the
//! socket (`connection`).
//!
//! Non-durable and per server, as in Redis: nothing is logged, a message reaches the
//! connections subscribed at the moment it is published, to this server only (in
//! cluster mode too).
//!
//! Thread-safety: `PubSub` is shared by every connection (a `parking_lot::RwLock`);
//! a `Subscriber` is shared by its connection and the publishers (a mutex around its
//! queue, atomics, `tokio::sync::Notify`); a `Subscription` belongs to one connection's
//! session and removes its entries from the registry when dropped.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::config::OutputLimit;
use crate::glob::glob_match;

type Listeners = HashMap<u64, Arc<Subscriber>>;

#[derive(Default)]
struct Registry {
    channels: HashMap<Vec<u8>, Listeners>,
    patterns: HashMap<Vec<u8>, Listeners>,
}

/// One server's subscriptions.
#[derive(Default)]
pub struct PubSub {
    registry: RwLock<Registry>,
    /// Subscribers dropped for passing their output limit (INFO).
    pub limit_disconnections: AtomicU64,
}

/// A message's frame, encoded for each protocol at most once per `PUBLISH`.
struct Frame<'a> {
    parts: [&'a [u8]; 4],
    len: usize,
    resp2: Option<Vec<u8>>,
    resp3: Option<Vec<u8>>,
}

impl<'a> Frame<'a> {
    fn new(parts: &[&'a [u8]]) -> Frame<'a> {
        let mut all: [&[u8]; 4] = [b""; 4];
        all[..parts.len()].copy_from_slice(parts);
        Frame {
            parts: all,
            len: parts.len(),
            resp2: None,
            resp3: None,
        }
    }

    fn bytes(&mut self, resp3: bool) -> &[u8] {
        let parts = &self.parts[..self.len];
        let slot = if resp3 {
            &mut self.resp3
        } else {
            &mut self.resp2
        };
        slot.get_or_insert_with(|| encode_push(resp3, parts))
    }
}

/// A push frame of bulk strings: RESP3's `>` type, a plain array in RESP2.
pub fn encode_push(resp3: bool, parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + parts.iter().map(|p| p.len() + 16).sum::<usize>());
    out.push(if resp3 { b'>' } else { b'*' });
    out.extend_from_slice(format!("{}\r\n", parts.len()).as_bytes());
    for p in parts {
        crate::resp::encode_bulk(p, &mut out);
    }
    out
}

impl PubSub {
    /// `PUBLISH`: queues the message for every subscriber of `channel` and of every
    /// pattern matching it; returns how many deliveries were queued (a connection
    /// subscribed to the channel and to a matching pattern counts twice, as in Redis).
    pub fn publish(&self, channel: &[u8], message: &[u8], limit: OutputLimit) -> usize {
        let registry = self.registry.read();
        let mut receivers = 0;
        if let Some(listeners) = registry.channels.get(channel) {
            let mut frame = Frame::new(&[b"message", channel, message]);
            for sub in listeners.values() {
                receivers += usize::from(self.deliver(sub, &mut frame, limit));
            }
        }
        for (pattern, listeners) in &registry.patterns {
            if !glob_match(pattern, channel) {
                continue;
            }
            let mut frame = Frame::new(&[b"pmessage", pattern, channel, message]);
            for sub in listeners.values() {
                receivers += usize::from(self.deliver(sub, &mut frame, limit));
            }
        }
        receivers
    }

    fn deliver(&self, sub: &Subscriber, frame: &mut Frame<'_>, limit: OutputLimit) -> bool {
        let bytes = frame.bytes(sub.resp3.load(Ordering::Relaxed));
        match sub.push(bytes, limit) {
            Pushed::Queued => true,
            Pushed::AlreadyDropped => false,
            Pushed::DroppedNow => {
                self.limit_disconnections.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// `PUBSUB CHANNELS [pattern]`: the channels with at least one subscriber.
    pub fn channels(&self, pattern: Option<&[u8]>) -> Vec<Vec<u8>> {
        let registry = self.registry.read();
        let mut out: Vec<Vec<u8>> = registry
            .channels
            .keys()
            .filter(|c| pattern.is_none_or(|p| glob_match(p, c)))
            .cloned()
            .collect();
        out.sort();
        out
    }

    /// `PUBSUB NUMSUB`: the subscribers of `channel`.
    pub fn numsub(&self, channel: &[u8]) -> usize {
        self.registry
            .read()
            .channels
            .get(channel)
            .map_or(0, |l| l.len())
    }

    /// `PUBSUB NUMPAT`: the distinct patterns subscribed to.
    pub fn numpat(&self) -> usize {
        self.registry.read().patterns.len()
    }

    /// The channels and the patterns with a subscriber (INFO's `pubsub_channels` and
    /// `pubsub_patterns`).
    pub fn counts(&self) -> (usize, usize) {
        let registry = self.registry.read();
        (registry.channels.len(), registry.patterns.len())
    }
}

/// What appending to a subscriber's queue did.
enum Pushed {
    Queued,
    /// The subscriber was dropped before (its connection is closing).
    AlreadyDropped,
    /// This message took it past its limit: dropped now.
    DroppedNow,
}

struct Outbound {
    /// Encoded frames not yet taken by the connection.
    queued: Vec<u8>,
    /// Bytes the connection took and has not finished writing.
    taken: usize,
    /// Since when the outbound bytes are above the soft limit.
    over_soft_since: Option<Instant>,
}

/// One subscribed connection as publishers see it.
pub struct Subscriber {
    id: u64,
    outbound: Mutex<Outbound>,
    /// Messages are encoded for RESP3 (push frames) when set.
    resp3: AtomicBool,
    dropped: AtomicBool,
    /// Wakes the connection: something was queued, or the subscriber was dropped.
    ready: Notify,
}

impl Subscriber {
    fn push(&self, bytes: &[u8], limit: OutputLimit) -> Pushed {
        let mut out = self.outbound.lock();
        if self.dropped.load(Ordering::Relaxed) {
            return Pushed::AlreadyDropped;
        }
        let total = (out.queued.len() + out.taken + bytes.len()) as u64;
        let over_hard = limit.hard_bytes > 0 && total > limit.hard_bytes;
        let over_soft = limit.soft_bytes > 0 && total > limit.soft_bytes;
        let mut soft_expired = false;
        if over_soft {
            let since = *out.over_soft_since.get_or_insert_with(Instant::now);
            soft_expired = since.elapsed() >= Duration::from_secs(limit.soft_s);
        } else {
            out.over_soft_since = None;
        }
        if over_hard || soft_expired {
            self.dropped.store(true, Ordering::Relaxed);
            out.queued = Vec::new();
            drop(out);
            self.ready.notify_one();
            return Pushed::DroppedNow;
        }
        out.queued.extend_from_slice(bytes);
        drop(out);
        self.ready.notify_one();
        Pushed::Queued
    }

    /// Whether the subscriber passed its output limit: its connection must close.
    pub fn dropped(&self) -> bool {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Waits until something was queued or the subscriber was dropped (a wake-up may
    /// find the queue already taken: check `take`).
    pub async fn ready(&self) {
        self.ready.notified().await;
    }

    /// Moves the queued frames to the end of `into` (normally empty: then its buffer
    /// is swapped in, not copied) and counts them as being written until
    /// [`Subscriber::written`].
    pub fn take(&self, into: &mut Vec<u8>) {
        let mut out = self.outbound.lock();
        if into.is_empty() {
            std::mem::swap(&mut out.queued, into);
        } else {
            into.extend_from_slice(&out.queued);
            out.queued.clear();
        }
        out.taken = into.len();
    }

    /// The bytes last taken are written.
    pub fn written(&self) {
        self.outbound.lock().taken = 0;
    }

    /// Appends the queued frames to `into` (they go out before what follows there).
    fn drain_into(&self, into: &mut Vec<u8>) {
        let mut out = self.outbound.lock();
        into.extend_from_slice(&out.queued);
        out.queued.clear();
    }
}

/// One connection's subscriptions, held by its session while there is at least one.
pub struct Subscription {
    pubsub: Arc<PubSub>,
    subscriber: Arc<Subscriber>,
    channels: BTreeSet<Vec<u8>>,
    patterns: BTreeSet<Vec<u8>>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.subscriber.id)
            .field("channels", &self.channels.len())
            .field("patterns", &self.patterns.len())
            .finish()
    }
}

/// Which kind of subscription a command is about.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Channel,
    Pattern,
}

impl Subscription {
    pub fn new(pubsub: Arc<PubSub>, id: u64, resp3: bool) -> Subscription {
        Subscription {
            pubsub,
            subscriber: Arc::new(Subscriber {
                id,
                outbound: Mutex::new(Outbound {
                    queued: Vec::new(),
                    taken: 0,
                    over_soft_since: None,
                }),
                resp3: AtomicBool::new(resp3),
                dropped: AtomicBool::new(false),
                ready: Notify::new(),
            }),
            channels: BTreeSet::new(),
            patterns: BTreeSet::new(),
        }
    }

    /// The channels and patterns subscribed to (what Redis's replies count).
    pub fn count(&self) -> usize {
        self.channels.len() + self.patterns.len()
    }

    pub fn subscriber(&self) -> &Arc<Subscriber> {
        &self.subscriber
    }

    /// Messages are encoded for this protocol from now on (`HELLO`).
    pub fn set_resp3(&self, resp3: bool) {
        self.subscriber.resp3.store(resp3, Ordering::Relaxed);
    }

    fn set(&mut self, kind: Kind) -> &mut BTreeSet<Vec<u8>> {
        match kind {
            Kind::Channel => &mut self.channels,
            Kind::Pattern => &mut self.patterns,
        }
    }

    /// Subscribes; false if it already was.
    pub fn subscribe(&mut self, kind: Kind, name: &[u8]) -> bool {
        if !self.set(kind).insert(name.to_vec()) {
            return false;
        }
        let mut registry = self.pubsub.registry.write();
        let map = match kind {
            Kind::Channel => &mut registry.channels,
            Kind::Pattern => &mut registry.patterns,
        };
        map.entry(name.to_vec())
            .or_default()
            .insert(self.subscriber.id, self.subscriber.clone());
        true
    }

    /// Unsubscribes; false if it was not subscribed.
    pub fn unsubscribe(&mut self, kind: Kind, name: &[u8]) -> bool {
        if !self.set(kind).remove(name) {
            return false;
        }
        let mut registry = self.pubsub.registry.write();
        remove(&mut registry, kind, name, self.subscriber.id);
        true
    }

    /// The channels (or patterns) subscribed to, in byte order.
    pub fn names(&self, kind: Kind) -> Vec<Vec<u8>> {
        match kind {
            Kind::Channel => self.channels.iter().cloned().collect(),
            Kind::Pattern => self.patterns.iter().cloned().collect(),
        }
    }

    /// Appends the messages queued so far to `into`: a reply that changes the
    /// subscriptions goes out after every message delivered before it.
    pub fn drain_into(&self, into: &mut Vec<u8>) {
        self.subscriber.drain_into(into);
    }
}

fn remove(registry: &mut Registry, kind: Kind, name: &[u8], id: u64) {
    let map = match kind {
        Kind::Channel => &mut registry.channels,
        Kind::Pattern => &mut registry.patterns,
    };
    if let Some(listeners) = map.get_mut(name) {
        listeners.remove(&id);
        if listeners.is_empty() {
            map.remove(name);
        }
    }
}

impl Subscription {
    /// Leaves every channel and pattern (no message is queued here after it returns).
    pub fn leave_all(&mut self) {
        if self.channels.is_empty() && self.patterns.is_empty() {
            return;
        }
        let mut registry = self.pubsub.registry.write();
        for name in std::mem::take(&mut self.channels) {
            remove(&mut registry, Kind::Channel, &name, self.subscriber.id);
        }
        for name in std::mem::take(&mut self.patterns) {
            remove(&mut registry, Kind::Pattern, &name, self.subscriber.id);
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.leave_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(hard_bytes: u64) -> OutputLimit {
        OutputLimit {
            hard_bytes,
            soft_bytes: 0,
            soft_s: 0,
        }
    }

    #[test]
    fn publish_counts_channel_and_pattern_deliveries() {
        let pubsub = Arc::new(PubSub::default());
        let mut a = Subscription::new(pubsub.clone(), 1, false);
        let mut b = Subscription::new(pubsub.clone(), 2, true);
        assert!(a.subscribe(Kind::Channel, b"news.1"));
        assert!(!a.subscribe(Kind::Channel, b"news.1"));
        assert!(a.subscribe(Kind::Pattern, b"news.*"));
        assert!(b.subscribe(Kind::Pattern, b"news.[0-9]"));
        assert_eq!(pubsub.publish(b"news.1", b"hi", limit(0)), 3);
        assert_eq!(pubsub.publish(b"news.x", b"hi", limit(0)), 1);
        assert_eq!(pubsub.publish(b"other", b"hi", limit(0)), 0);
        let mut got = Vec::new();
        a.drain_into(&mut got);
        let text = String::from_utf8(got).unwrap();
        assert!(text.starts_with("*3\r\n$7\r\nmessage\r\n$6\r\nnews.1\r\n$2\r\nhi\r\n"));
        assert!(text.contains("*4\r\n$8\r\npmessage\r\n$6\r\nnews.*\r\n$6\r\nnews.x\r\n"));
        let mut got = Vec::new();
        b.drain_into(&mut got);
        assert!(
            got.starts_with(b">4\r\n$8\r\npmessage\r\n"),
            "RESP3 push frame"
        );
        assert_eq!(pubsub.numsub(b"news.1"), 1);
        assert_eq!(pubsub.numpat(), 2);
        drop(a);
        assert_eq!(
            pubsub.numsub(b"news.1"),
            0,
            "dropping a subscription leaves"
        );
        assert_eq!(pubsub.numpat(), 1);
        assert!(b.unsubscribe(Kind::Pattern, b"news.[0-9]"));
        assert!(!b.unsubscribe(Kind::Pattern, b"news.[0-9]"));
        assert_eq!(pubsub.counts(), (0, 0));
    }

    #[test]
    fn a_subscriber_past_its_hard_limit_is_dropped_and_its_queue_freed() {
        let pubsub = Arc::new(PubSub::default());
        let mut a = Subscription::new(pubsub.clone(), 1, false);
        a.subscribe(Kind::Channel, b"c");
        let message = vec![b'x'; 1000];
        let mut delivered = 0;
        for _ in 0..10 {
            delivered += pubsub.publish(b"c", &message, limit(4096));
        }
        assert_eq!(
            delivered, 3,
            "each frame is 1033 bytes: the fourth would pass 4096"
        );
        assert!(a.subscriber().dropped());
        assert_eq!(pubsub.limit_disconnections.load(Ordering::Relaxed), 1);
        let mut got = Vec::new();
        a.drain_into(&mut got);
        assert!(got.is_empty(), "the queue is freed when dropped");
    }

    #[test]
    fn bytes_taken_but_not_written_count_against_the_limit() {
        let pubsub = Arc::new(PubSub::default());
        let mut a = Subscription::new(pubsub.clone(), 1, false);
        a.subscribe(Kind::Channel, b"c");
        let message = vec![b'x'; 1000];
        assert_eq!(pubsub.publish(b"c", &message, limit(2500)), 1);
        let mut taken = Vec::new();
        a.subscriber().take(&mut taken);
        assert!(!taken.is_empty());
        assert_eq!(pubsub.publish(b"c", &message, limit(2500)), 1);
        assert_eq!(pubsub.publish(b"c", &message, limit(2500)), 0, "over 2500");
        assert!(a.subscriber().dropped());

        let mut b = Subscription::new(pubsub.clone(), 2, false);
        b.subscribe(Kind::Channel, b"d");
        for _ in 0..10 {
            assert_eq!(pubsub.publish(b"d", &message, limit(2500)), 1);
            taken.clear();
            b.subscriber().take(&mut taken);
            assert_eq!(taken.len(), 1033, "one frame");
            b.subscriber().written();
        }
        assert!(
            !b.subscriber().dropped(),
            "a subscriber that keeps up stays"
        );
    }

    #[test]
    fn the_soft_limit_drops_only_after_its_time() {
        let pubsub = Arc::new(PubSub::default());
        let mut a = Subscription::new(pubsub.clone(), 1, false);
        a.subscribe(Kind::Channel, b"c");
        let soft = |s| OutputLimit {
            hard_bytes: 0,
            soft_bytes: 100,
            soft_s: s,
        };
        assert_eq!(pubsub.publish(b"c", &[b'x'; 200], soft(3600)), 1);
        assert_eq!(pubsub.publish(b"c", &[b'x'; 200], soft(3600)), 1);
        assert!(
            !a.subscriber().dropped(),
            "over the soft limit, not for long"
        );
        assert_eq!(pubsub.publish(b"c", &[b'x'; 200], soft(0)), 0);
        assert!(a.subscriber().dropped(), "over it for its whole time (0 s)");
    }
}
