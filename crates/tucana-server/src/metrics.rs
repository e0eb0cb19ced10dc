//! The server's counters ([`Metrics`]) and a batch's local counts of them ([`Tally`]).
//!
//! Owns counting only. The two ways the counters are read live with their readers: the
//! `INFO` text with the INFO command (`commands/info.rs`), the Prometheus text with its
//! HTTP endpoint (`prometheus`). Commands are counted by their index in the command
//! table, which this module does not know: [`Metrics::new`] is told how many there are.
//!
//! Thread-safety: counters are relaxed atomics: each is exact, a reading of several is
//! not a consistent snapshot (as in Redis). The per-command ones are counted per batch in
//! a [`Tally`] (one batch, one thread) and added at the batch's end.

use std::sync::atomic::{AtomicU64, Ordering};

/// Everything the server counts.
pub struct Metrics {
    pub connections_received: AtomicU64,
    pub connections_rejected: AtomicU64,
    pub connected_clients: AtomicU64,
    /// Connections waiting in a blocking pop (INFO's `blocked_clients`).
    pub blocked_clients: AtomicU64,
    commands_by_index: Vec<AtomicU64>,
    pub error_replies: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub idle_timeouts: AtomicU64,
    pub auth_failures: AtomicU64,
    pub keyspace_hits: AtomicU64,
    pub keyspace_misses: AtomicU64,
    /// Keys deleted by the expiry sweeper (INFO's `expired_keys`; keys hidden by lazy
    /// expiry and then overwritten are not counted).
    pub expired_keys: AtomicU64,
    pub net_input_bytes: AtomicU64,
    pub net_output_bytes: AtomicU64,
}

impl Metrics {
    /// Counters for a server whose command table has `commands` entries.
    pub fn new(commands: usize) -> Metrics {
        Metrics {
            connections_received: AtomicU64::new(0),
            connections_rejected: AtomicU64::new(0),
            connected_clients: AtomicU64::new(0),
            blocked_clients: AtomicU64::new(0),
            commands_by_index: (0..commands).map(|_| AtomicU64::new(0)).collect(),
            error_replies: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            idle_timeouts: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            keyspace_hits: AtomicU64::new(0),
            keyspace_misses: AtomicU64::new(0),
            expired_keys: AtomicU64::new(0),
            net_input_bytes: AtomicU64::new(0),
            net_output_bytes: AtomicU64::new(0),
        }
    }
}

/// Reads one counter.
pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Metrics {
    pub fn count_command(&self, index: usize) {
        add(&self.commands_by_index[index], 1);
    }

    /// Adds what a batch counted locally (see [`Tally`]).
    pub fn add_tally(&self, tally: &Tally) {
        for &(index, n) in &tally.commands {
            add(&self.commands_by_index[index], n);
        }
        for (counter, n) in [
            (&self.error_replies, tally.errors),
            (&self.keyspace_hits, tally.hits),
            (&self.keyspace_misses, tally.misses),
        ] {
            if n > 0 {
                add(counter, n);
            }
        }
    }

    pub fn count_expired(&self, n: u64) {
        add(&self.expired_keys, n);
    }

    pub fn count_lookup(&self, hit: bool) {
        add(
            if hit {
                &self.keyspace_hits
            } else {
                &self.keyspace_misses
            },
            1,
        );
    }

    pub fn count_auth_failure(&self) {
        add(&self.auth_failures, 1);
    }

    pub fn connected_clients(&self) -> u64 {
        get(&self.connected_clients)
    }

    pub fn commands_processed(&self) -> u64 {
        self.commands_by_index.iter().map(get).sum()
    }

    /// Commands processed, by their index in the command table.
    pub fn commands_by_index(&self) -> impl Iterator<Item = u64> + '_ {
        self.commands_by_index.iter().map(get)
    }
}

/// Counts of one pipelined batch, added to [`Metrics`] once at its end: the counters are
/// shared by every connection, and an atomic add per command on a cache line that the
/// other cores also write costs more than the command's own bookkeeping.
#[derive(Debug, Default)]
pub struct Tally {
    /// (command index, count); a batch rarely has more than a couple of kinds.
    commands: Vec<(usize, u64)>,
    errors: u64,
    hits: u64,
    misses: u64,
}

impl Tally {
    pub fn command(&mut self, index: usize, n: u64) {
        match self.commands.iter_mut().find(|(i, _)| *i == index) {
            Some((_, count)) => *count += n,
            None => self.commands.push((index, n)),
        }
    }

    pub fn error(&mut self) {
        self.errors += 1;
    }

    /// Adds `other`'s counts of errors and lookups (not its commands).
    pub fn merge(&mut self, other: &Tally) {
        self.errors += other.errors;
        self.hits += other.hits;
        self.misses += other.misses;
    }

    pub fn lookup(&mut self, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }
}
