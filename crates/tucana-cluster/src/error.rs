//! The crate's one error enum. Bytes that do not decode, or decode into a map that breaks
//! an invariant, are an `Err` naming the source and what is wrong, never a panic. A map
//! transformation that does not apply (an unknown region, a server that is not a backup)
//! is an `Err` too, and leaves the map as it was.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid cluster map: {0}")]
    InvalidMap(String),

    #[error("map change refused: {0}")]
    Refused(String),

    #[error("cannot decode {what}: {detail}")]
    Decode { what: String, detail: String },

    #[error("storage key of {len} bytes is too short to hold a slot (2 bytes)")]
    StorageKeyTooShort { len: usize },

    #[error("storage key names slot {slot}, past the last slot (16383)")]
    SlotOutOfRange { slot: u16 },
}
