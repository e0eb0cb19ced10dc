//! The replication protocol's frames and their codec (DESIGN.md, "Replication",
//! "Protocol").
//!
//! A frame on the wire: `payload_len u32 | kind u8 | crc32c u32 | payload`, little-endian,
//! the crc covering the kind byte and the payload. Decoding checks the length limit, the
//! crc and every field's bounds: bytes from the network are never trusted, and a bad
//! frame is an `Err`, never a panic.
//!
//! Owns: the byte layout of every message. Does not own: what a peer does with one
//! (`primary`, `backup`). Plain functions; no state.

use std::io;

use tucana::replication::{RegionDesc, NODE_BYTES};
use tucana::types::DiskOffset;

/// Version of the protocol in `Open`; a peer refuses another.
pub const PROTOCOL_VERSION: u32 = 2;

/// Largest payload accepted: a `Nodes` frame of 1024 node images is 4 MiB.
pub const MAX_PAYLOAD_BYTES: usize = 16 << 20;

/// Bytes before a frame's payload.
pub const HEADER_BYTES: usize = 9;

/// What a backup holds of one region when the primary opens a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionState {
    pub name: String,
    pub term: u64,
    /// The primary's commit it last applied (0: none).
    pub upstream_epoch: u64,
    /// Whether its node map matches that commit (else the next commit comes in full).
    pub node_map_current: bool,
    /// Per segment: the primary's order and offset, and the bytes it holds.
    pub segments: Vec<(u64, u64, u64)>,
}

/// A region the primary replicates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    pub name: String,
    /// crc seed of its records.
    pub seed: u32,
    pub term: u64,
    /// The generation of its log now: raised every time the primary opens the region
    /// (a restart, a promotion). A backup whose last applied commit was of another
    /// generation may hold bytes the primary lost in between (`Replica::keep_committed`).
    pub generation: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Primary → backup, first on a connection: who it is and what it replicates.
    Open {
        version: u32,
        primary: String,
        password: String,
        /// Backups acknowledge only what they synced (`--repl-ack durable`).
        ack_durable: bool,
        regions: Vec<RegionInfo>,
    },
    /// Backup → primary, the answer to `Open` (and to `Regions`): what it holds.
    Hello {
        backup: String,
        /// Whether it wants index nodes (a send-index backup) or builds its own index from
        /// the log (the baseline, `--repl-build-index`).
        wants_index: bool,
        regions: Vec<RegionState>,
    },
    /// Primary → backup: more regions replicated from now on.
    Regions(Vec<RegionInfo>),
    /// Primary → backup: log bytes of the segment at `origin` from `offset`.
    Log {
        region: String,
        term: u64,
        order: u64,
        origin: u64,
        size_bytes: u64,
        offset: u64,
        relocation: bool,
        bytes: Vec<u8>,
    },
    /// Primary → backup: node images of a commit (their offsets in the primary's volume).
    Nodes {
        region: String,
        term: u64,
        upstream_epoch: u64,
        nodes: Vec<(u64, Box<[u8; NODE_BYTES]>)>,
    },
    /// Primary → backup: a commit, after its `Nodes`.
    Commit {
        region: String,
        term: u64,
        upstream_epoch: u64,
        full: bool,
        next_order: u64,
        node_count: u64,
        released: Vec<u64>,
        desc: Box<RegionDesc>,
    },
    /// Primary → backup: the region was dropped.
    Dropped { region: String, term: u64 },
    /// Backup → primary: the foreground log it holds up to (order, offset).
    Ack {
        region: String,
        term: u64,
        order: u64,
        offset: u64,
        durable: bool,
    },
    /// Backup → primary: a commit is applied and durable in the backup's volume.
    Applied {
        region: String,
        term: u64,
        upstream_epoch: u64,
    },
    /// Backup → primary: the backup holds the region at a higher term; the primary must
    /// stop acknowledging writes to it.
    Superseded { region: String, term: u64 },
    /// Either way: refused; the connection closes after it.
    Refused { reason: String },
}

/// What decoding a frame found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError(pub String);

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad replication frame: {}", self.0)
    }
}

impl std::error::Error for FrameError {}

impl From<FrameError> for io::Error {
    fn from(e: FrameError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

const K_OPEN: u8 = 1;
const K_HELLO: u8 = 2;
const K_REGIONS: u8 = 3;
const K_LOG: u8 = 4;
const K_NODES: u8 = 5;
const K_COMMIT: u8 = 6;
const K_DROPPED: u8 = 7;
const K_ACK: u8 = 8;
const K_APPLIED: u8 = 9;
const K_SUPERSEDED: u8 = 10;
const K_REFUSED: u8 = 11;

/// Appends the frame's bytes (header and payload) to `out`.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_BYTES]);
    let kind = encode_payload(frame, out);
    let payload_len = out.len() - start - HEADER_BYTES;
    assert!(
        payload_len <= MAX_PAYLOAD_BYTES,
        "a frame of {payload_len} bytes is over the protocol's limit"
    );
    out[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    out[start + 4] = kind;
    let crc = crc32c::crc32c_append(crc32c::crc32c(&[kind]), &out[start + HEADER_BYTES..]);
    out[start + 5..start + 9].copy_from_slice(&crc.to_le_bytes());
}

fn encode_payload(frame: &Frame, out: &mut Vec<u8>) -> u8 {
    let mut w = Writer(out);
    match frame {
        Frame::Open {
            version,
            primary,
            password,
            ack_durable,
            regions,
        } => {
            w.u32(*version);
            w.str(primary);
            w.str(password);
            w.bool(*ack_durable);
            w.regions(regions);
            K_OPEN
        }
        Frame::Hello {
            backup,
            wants_index,
            regions,
        } => {
            encode_hello(&mut w, backup, *wants_index, regions);
            K_HELLO
        }
        Frame::Regions(regions) => {
            w.regions(regions);
            K_REGIONS
        }
        Frame::Log {
            region,
            term,
            order,
            origin,
            size_bytes,
            offset,
            relocation,
            bytes,
        } => {
            w.str(region);
            w.u64(*term);
            w.u64(*order);
            w.u64(*origin);
            w.u64(*size_bytes);
            w.u64(*offset);
            w.bool(*relocation);
            w.bytes(bytes);
            K_LOG
        }
        Frame::Nodes {
            region,
            term,
            upstream_epoch,
            nodes,
        } => {
            w.str(region);
            w.u64(*term);
            w.u64(*upstream_epoch);
            w.u32(nodes.len() as u32);
            for (off, image) in nodes {
                w.u64(*off);
                w.0.extend_from_slice(&image[..]);
            }
            K_NODES
        }
        Frame::Commit { .. } => {
            encode_commit(&mut w, frame);
            K_COMMIT
        }
        Frame::Dropped { region, term } => {
            w.str(region);
            w.u64(*term);
            K_DROPPED
        }
        Frame::Ack {
            region,
            term,
            order,
            offset,
            durable,
        } => {
            w.str(region);
            w.u64(*term);
            w.u64(*order);
            w.u64(*offset);
            w.bool(*durable);
            K_ACK
        }
        Frame::Applied {
            region,
            term,
            upstream_epoch,
        } => {
            w.str(region);
            w.u64(*term);
            w.u64(*upstream_epoch);
            K_APPLIED
        }
        Frame::Superseded { region, term } => {
            w.str(region);
            w.u64(*term);
            K_SUPERSEDED
        }
        Frame::Refused { reason } => {
            w.str(reason);
            K_REFUSED
        }
    }
}

/// Decodes a frame from its header's kind and crc and its payload.
pub fn decode(kind: u8, crc: u32, payload: &[u8]) -> Result<Frame, FrameError> {
    if crc32c::crc32c_append(crc32c::crc32c(&[kind]), payload) != crc {
        return Err(FrameError(format!(
            "checksum mismatch on a frame of kind {kind}"
        )));
    }
    let mut r = Reader {
        bytes: payload,
        pos: 0,
    };
    let frame = match kind {
        K_OPEN => Frame::Open {
            version: r.u32()?,
            primary: r.str()?,
            password: r.str()?,
            ack_durable: r.bool()?,
            regions: r.regions()?,
        },
        K_HELLO => decode_hello(&mut r)?,
        K_REGIONS => Frame::Regions(r.regions()?),
        K_LOG => Frame::Log {
            region: r.str()?,
            term: r.u64()?,
            order: r.u64()?,
            origin: r.u64()?,
            size_bytes: r.u64()?,
            offset: r.u64()?,
            relocation: r.bool()?,
            bytes: r.bytes()?.to_vec(),
        },
        K_NODES => decode_nodes(&mut r)?,
        K_COMMIT => decode_commit(&mut r)?,
        K_DROPPED => Frame::Dropped {
            region: r.str()?,
            term: r.u64()?,
        },
        K_ACK => Frame::Ack {
            region: r.str()?,
            term: r.u64()?,
            order: r.u64()?,
            offset: r.u64()?,
            durable: r.bool()?,
        },
        K_APPLIED => Frame::Applied {
            region: r.str()?,
            term: r.u64()?,
            upstream_epoch: r.u64()?,
        },
        K_SUPERSEDED => Frame::Superseded {
            region: r.str()?,
            term: r.u64()?,
        },
        K_REFUSED => Frame::Refused { reason: r.str()? },
        other => return Err(FrameError(format!("unknown frame kind {other}"))),
    };
    if r.pos != payload.len() {
        return Err(FrameError(format!(
            "{} bytes left over after a frame of kind {kind}",
            payload.len() - r.pos
        )));
    }
    Ok(frame)
}

fn encode_hello(w: &mut Writer<'_>, backup: &str, wants_index: bool, regions: &[RegionState]) {
    w.str(backup);
    w.bool(wants_index);
    w.u32(regions.len() as u32);
    for r in regions {
        w.str(&r.name);
        w.u64(r.term);
        w.u64(r.upstream_epoch);
        w.bool(r.node_map_current);
        w.u32(r.segments.len() as u32);
        for (order, origin, held) in &r.segments {
            w.u64(*order);
            w.u64(*origin);
            w.u64(*held);
        }
    }
}

fn encode_commit(w: &mut Writer<'_>, frame: &Frame) {
    let Frame::Commit {
        region,
        term,
        upstream_epoch,
        full,
        next_order,
        node_count,
        released,
        desc,
    } = frame
    else {
        unreachable!("encode_commit of another frame");
    };
    w.str(region);
    w.u64(*term);
    w.u64(*upstream_epoch);
    w.bool(*full);
    w.u64(*next_order);
    w.u64(*node_count);
    w.u32(released.len() as u32);
    for off in released {
        w.u64(*off);
    }
    let mut entry = Vec::new();
    desc.encode_into(&mut entry);
    w.bytes(&entry);
}

fn decode_hello(r: &mut Reader<'_>) -> Result<Frame, FrameError> {
    let backup = r.str()?;
    let wants_index = r.bool()?;
    let n = r.count(2 + 8 + 8 + 1 + 4)?;
    let mut regions = Vec::with_capacity(n);
    for _ in 0..n {
        let name = r.str()?;
        let term = r.u64()?;
        let upstream_epoch = r.u64()?;
        let node_map_current = r.bool()?;
        let segs = r.count(24)?;
        let mut segments = Vec::with_capacity(segs);
        for _ in 0..segs {
            segments.push((r.u64()?, r.u64()?, r.u64()?));
        }
        regions.push(RegionState {
            name,
            term,
            upstream_epoch,
            node_map_current,
            segments,
        });
    }
    Ok(Frame::Hello {
        backup,
        wants_index,
        regions,
    })
}

fn decode_nodes(r: &mut Reader<'_>) -> Result<Frame, FrameError> {
    let region = r.str()?;
    let term = r.u64()?;
    let upstream_epoch = r.u64()?;
    let n = r.count(8 + NODE_BYTES)?;
    let mut nodes = Vec::with_capacity(n);
    for _ in 0..n {
        let off = r.u64()?;
        let mut image = Box::new([0u8; NODE_BYTES]);
        image.copy_from_slice(r.take(NODE_BYTES)?);
        nodes.push((off, image));
    }
    Ok(Frame::Nodes {
        region,
        term,
        upstream_epoch,
        nodes,
    })
}

fn decode_commit(r: &mut Reader<'_>) -> Result<Frame, FrameError> {
    let region = r.str()?;
    let term = r.u64()?;
    let upstream_epoch = r.u64()?;
    let full = r.bool()?;
    let next_order = r.u64()?;
    let node_count = r.u64()?;
    let n = r.count(8)?;
    let mut released = Vec::with_capacity(n);
    for _ in 0..n {
        released.push(r.u64()?);
    }
    let entry = r.bytes()?;
    let desc = RegionDesc::decode(entry, DiskOffset::NONE)
        .map_err(|e| FrameError(format!("commit's region entry: {e}")))?;
    Ok(Frame::Commit {
        region,
        term,
        upstream_epoch,
        full,
        next_order,
        node_count,
        released,
        desc: Box::new(desc),
    })
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn bool(&mut self, v: bool) {
        self.0.push(v as u8);
    }

    fn str(&mut self, s: &str) {
        assert!(s.len() <= u16::MAX as usize, "a name over 64 KiB");
        self.0.extend_from_slice(&(s.len() as u16).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }

    fn regions(&mut self, regions: &[RegionInfo]) {
        self.u32(regions.len() as u32);
        for r in regions {
            self.str(&r.name);
            self.u32(r.seed);
            self.u64(r.term);
            self.u32(r.generation);
        }
    }
}

/// A bounds-checked cursor over a payload.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.bytes.len() - self.pos < n {
            return Err(FrameError(format!("truncated at byte {}", self.pos)));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn bool(&mut self) -> Result<bool, FrameError> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(FrameError(format!(
                "a flag of {b} at byte {}",
                self.pos - 1
            ))),
        }
    }

    fn str(&mut self) -> Result<String, FrameError> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")) as usize;
        std::str::from_utf8(self.take(len)?)
            .map(str::to_string)
            .map_err(|_| FrameError(format!("a name that is not UTF-8 at byte {}", self.pos)))
    }

    fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    /// A count of items of at least `item_bytes` each that must fit in what is left.
    fn count(&mut self, item_bytes: usize) -> Result<usize, FrameError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item_bytes) > self.bytes.len() - self.pos {
            return Err(FrameError(format!("a count of {n} past the frame's end")));
        }
        Ok(n)
    }

    fn regions(&mut self) -> Result<Vec<RegionInfo>, FrameError> {
        let n = self.count(2 + 4 + 8 + 4)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(RegionInfo {
                name: self.str()?,
                seed: self.u32()?,
                term: self.u64()?,
                generation: self.u32()?,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9]{0,12}"
    }

    fn region_info() -> impl Strategy<Value = RegionInfo> {
        (name(), any::<u32>(), any::<u64>(), any::<u32>()).prop_map(
            |(name, seed, term, generation)| RegionInfo {
                name,
                seed,
                term,
                generation,
            },
        )
    }

    fn frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (
                any::<u32>(),
                name(),
                name(),
                any::<bool>(),
                proptest::collection::vec(region_info(), 0..4)
            )
                .prop_map(|(version, primary, password, ack_durable, regions)| {
                    Frame::Open {
                        version,
                        primary,
                        password,
                        ack_durable,
                        regions,
                    }
                }),
            (
                name(),
                any::<bool>(),
                proptest::collection::vec(
                    (
                        name(),
                        any::<u64>(),
                        any::<u64>(),
                        any::<bool>(),
                        proptest::collection::vec(any::<(u64, u64, u64)>(), 0..4)
                    ),
                    0..4
                )
            )
                .prop_map(|(backup, wants_index, regions)| Frame::Hello {
                    backup,
                    wants_index,
                    regions: regions
                        .into_iter()
                        .map(|(name, term, upstream_epoch, node_map_current, segments)| {
                            RegionState {
                                name,
                                term,
                                upstream_epoch,
                                node_map_current,
                                segments,
                            }
                        })
                        .collect()
                }),
            proptest::collection::vec(region_info(), 0..4).prop_map(Frame::Regions),
            (
                name(),
                any::<[u64; 5]>(),
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 0..300)
            )
                .prop_map(|(region, w, relocation, bytes)| Frame::Log {
                    region,
                    term: w[0],
                    order: w[1],
                    origin: w[2],
                    size_bytes: w[3],
                    offset: w[4],
                    relocation,
                    bytes
                }),
            (
                name(),
                any::<u64>(),
                any::<u64>(),
                proptest::collection::vec((any::<u64>(), any::<u8>()), 0..3)
            )
                .prop_map(|(region, term, upstream_epoch, nodes)| Frame::Nodes {
                    region,
                    term,
                    upstream_epoch,
                    nodes: nodes
                        .into_iter()
                        .map(|(off, b)| (off, Box::new([b; NODE_BYTES])))
                        .collect()
                }),
            (name(), any::<u64>()).prop_map(|(region, term)| Frame::Dropped { region, term }),
            (name(), any::<[u64; 3]>(), any::<bool>()).prop_map(|(region, w, durable)| {
                Frame::Ack {
                    region,
                    term: w[0],
                    order: w[1],
                    offset: w[2],
                    durable,
                }
            }),
            (name(), any::<u64>(), any::<u64>()).prop_map(|(region, term, upstream_epoch)| {
                Frame::Applied {
                    region,
                    term,
                    upstream_epoch,
                }
            }),
            (name(), any::<u64>()).prop_map(|(region, term)| Frame::Superseded { region, term }),
            name().prop_map(|reason| Frame::Refused { reason }),
        ]
    }

    fn parts(bytes: &[u8]) -> (u8, u32, &[u8]) {
        let crc = u32::from_le_bytes(bytes[5..9].try_into().unwrap());
        (bytes[4], crc, &bytes[HEADER_BYTES..])
    }

    proptest! {
        /// Every frame decodes to itself; any shorter payload, any flipped bit, is an
        /// error (the crc or the bounds), never a panic or another frame.
        #[test]
        fn frames_round_trip_and_damage_is_an_error(frame in frame(), cut in any::<prop::sample::Index>(), bit in any::<prop::sample::Index>()) {
            let mut bytes = Vec::new();
            encode(&frame, &mut bytes);
            let (kind, crc, payload) = parts(&bytes);
            prop_assert_eq!(&decode(kind, crc, payload).unwrap(), &frame);
            if !payload.is_empty() {
                let short = &payload[..cut.index(payload.len())];
                prop_assert!(decode(kind, crc, short).is_err());
                let mut flipped = payload.to_vec();
                let b = bit.index(flipped.len() * 8);
                flipped[b / 8] ^= 1 << (b % 8);
                prop_assert!(decode(kind, crc, &flipped).is_err());
            }
        }

        /// Arbitrary bytes with a matching crc (what a fuzzer would find past the crc):
        /// decoding answers, never panics.
        #[test]
        fn arbitrary_payloads_never_panic(kind in any::<u8>(), payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let crc = crc32c::crc32c_append(crc32c::crc32c(&[kind]), &payload);
            let _ = decode(kind, crc, &payload);
        }
    }

    /// A commit frame carries a region's descriptor entry through the engine's codec.
    #[test]
    fn a_commit_frame_carries_its_region_entry() {
        let desc = RegionDesc {
            id: tucana::types::RegionId(3),
            name: "db0".into(),
            tree_epoch: tucana::types::TreeEpoch(4),
            root: DiskOffset(1 << 20),
            generation: 2,
            next_seq: tucana::types::SeqNo(77),
            tail: DiskOffset(2 << 20),
            tail_size_bytes: 2 << 20,
            tail_used_bytes: 100,
            gc_tail: None,
            keys: 5,
            segments: vec![(
                DiskOffset(2 << 20),
                tucana::log::SegmentStats {
                    size_bytes: 2 << 20,
                    written_bytes: 100,
                    live_bytes: 80,
                    order: 9,
                },
            )],
            seed: 42,
            term: 1,
            replica: None,
            received: Vec::new(),
        };
        let frame = Frame::Commit {
            region: "db0".into(),
            term: 1,
            upstream_epoch: 12,
            full: true,
            next_order: 10,
            node_count: 1,
            released: vec![4096, 8192],
            desc: Box::new(desc),
        };
        let mut bytes = Vec::new();
        encode(&frame, &mut bytes);
        let (kind, crc, payload) = parts(&bytes);
        assert_eq!(decode(kind, crc, payload).unwrap(), frame);
    }
}
