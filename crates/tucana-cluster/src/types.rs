//! Identifiers shared by the map, the etcd store and the error enum (and so kept apart
//! from all three): server ids and etcd revisions.
//!
//! Threads: plain values.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A server's identity: 40 lowercase hex characters, as Redis Cluster's node ids are
/// (clients show and compare them). Drawn at random when a server first joins.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ServerId(String);

impl ServerId {
    pub const LEN: usize = 40;

    /// A fresh random id (160 random bits).
    pub fn random() -> ServerId {
        let bytes: [u8; Self::LEN / 2] = rand::random();
        ServerId(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// `text` as an id, if it is 40 lowercase hex characters.
    pub fn parse(text: &str) -> Option<ServerId> {
        let ok = text.len() == Self::LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| ServerId(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ServerId {
    /// What serde reports for a bad id in JSON.
    type Error = String;
    fn try_from(text: String) -> Result<ServerId, String> {
        ServerId::parse(&text).ok_or_else(|| {
            format!("invalid server id {text:?}: expected 40 lowercase hex characters")
        })
    }
}

impl From<ServerId> for String {
    fn from(id: ServerId) -> String {
        id.0
    }
}

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerId({})", self.0)
    }
}

/// An etcd revision: the store's logical clock, raised by every change. A key's
/// `mod_revision` is the revision of its last change, which is what `update_map` compares.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Revision(pub i64);

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
