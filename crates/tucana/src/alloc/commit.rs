//! The commit-time images of the bitmap, and which buddy of each group is current.
//!
//! Owns: `BitmapCommit`, the commit phases (`CommitPhase`: idle; sealed, with the post-seal
//! runs; imaged), and `Allocator`'s `slots`, `begin_commit`, `commit_images`,
//! `end_commit_keep_seal` and `end_commit` (steps 1, 3 and 5 of the protocol in the module
//! documentation). Does not own: recording post-seal runs as they are allocated and
//! forgetting released ones (`State::take` and `State::try_release` in `state`), the buddy
//! format (`buddy`), nor writing the images and the descriptor (the caller).
//!
//! Thread-safety: each method takes `Allocator`'s mutex for its call; the phases allow one
//! commit in progress at a time (asserted).

use std::fmt;

use super::bitmap;
use super::buddy::{buddy_offset, encode_buddy, BUDDY_BYTES};
use super::state::Run;
use super::{Allocator, GROUP_BLOCKS};
use crate::types::{CommitEpoch, DiskOffset, BLOCK_BYTES};

/// The bitmap images a commit writes, and the buddy choice its descriptor records.
pub struct BitmapCommit {
    /// (buddy offset, encoded buddy) for every changed group.
    pub writes: Vec<(DiskOffset, Box<[u8; BUDDY_BYTES]>)>,
    /// Current buddy per group once this commit is durable (one per group of `volume_bytes`).
    pub slots: Vec<u8>,
    /// The volume length these images describe; the descriptor must record it, since
    /// `Allocator::load` needs it (the file itself may be longer after a failed commit).
    pub volume_bytes: u64,
}

impl fmt::Debug for BitmapCommit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BitmapCommit")
            .field(
                "writes",
                &self.writes.iter().map(|w| w.0).collect::<Vec<_>>(),
            )
            .field("slots", &self.slots)
            .field("volume_bytes", &self.volume_bytes)
            .finish()
    }
}

pub(super) enum CommitPhase {
    Idle,
    /// `begin_commit` ran; post-seal runs are recorded.
    Sealed {
        post_seal: Vec<Run>,
    },
    /// `commit_images` ran: (group, slot its image went to).
    Imaged {
        post_seal: Vec<Run>,
        imaged: Vec<(usize, u8)>,
    },
}

impl Allocator {
    /// Current committed buddy per group. For a group not yet committed (fresh volume,
    /// growth): the buddy its first image will not use.
    pub fn slots(&self) -> Vec<u8> {
        self.state.lock().groups.iter().map(|g| g.slot).collect()
    }

    /// Seals the state for a commit: from now until `end_commit`, runs from
    /// `allocate(…, post_seal = true)` are left out of this commit's images.
    /// Panics if a commit is already in progress.
    pub fn begin_commit(&self) {
        let mut st = self.state.lock();
        assert!(
            matches!(st.phase, CommitPhase::Idle),
            "begin_commit while a commit is in progress"
        );
        st.phase = CommitPhase::Sealed {
            post_seal: Vec::new(),
        };
    }

    /// Images of the changed groups as commit `epoch` must write them: live bits minus the
    /// recorded post-seal runs, each addressed to the buddy the last durable commit does
    /// not use. Groups whose image left out post-seal runs stay changed. Panics unless
    /// called once, after `begin_commit`.
    pub fn commit_images(&self, epoch: CommitEpoch) -> BitmapCommit {
        let mut st = self.state.lock();
        let st = &mut *st;
        let post_seal = match std::mem::replace(&mut st.phase, CommitPhase::Idle) {
            CommitPhase::Sealed { post_seal } => post_seal,
            _ => panic!("commit_images without begin_commit, or twice in one commit"),
        };
        let mut writes = Vec::new();
        let mut imaged = Vec::new();
        for (g, group) in st.groups.iter_mut().enumerate() {
            if !group.dirty {
                continue;
            }
            let mut bits = group.bits.clone();
            let mut excluded = false;
            let base = g as u64 * GROUP_BLOCKS;
            for run in &post_seal {
                let lo = run.start_block.max(base);
                let hi = run.end_block().min(base + GROUP_BLOCKS);
                if lo < hi {
                    excluded |= bitmap::clear_range(&mut bits, lo - base, hi - base) > 0;
                }
            }
            let slot = 1 - group.slot;
            writes.push((
                buddy_offset(g as u64, slot),
                encode_buddy(g as u64, epoch, &bits),
            ));
            imaged.push((g, slot));
            // Changes from here on (and the runs left out) go to the next commit.
            group.dirty = excluded;
        }
        let mut slots: Vec<u8> = st.groups.iter().map(|g| g.slot).collect();
        for &(g, slot) in &imaged {
            slots[g] = slot;
        }
        st.phase = CommitPhase::Imaged { post_seal, imaged };
        BitmapCommit {
            writes,
            slots,
            volume_bytes: st.volume_blocks * BLOCK_BYTES,
        }
    }

    /// Ends a commit whose superblock is durable, like `end_commit(true)`, and seals again
    /// at once, still recording the post-seal runs of the commit just ended: the next
    /// commit is a repeat of it (the same durable state under a new epoch), whose images
    /// must leave out everything allocated after that seal too. Panics without
    /// `commit_images`.
    pub fn end_commit_keep_seal(&self) {
        let mut st = self.state.lock();
        match std::mem::replace(&mut st.phase, CommitPhase::Idle) {
            CommitPhase::Imaged { imaged, post_seal } => {
                for (g, slot) in imaged {
                    st.groups[g].slot = slot;
                }
                st.phase = CommitPhase::Sealed { post_seal };
            }
            _ => panic!("end_commit_keep_seal without commit_images"),
        }
    }

    /// Ends the commit. `committed`: its superblock is durable, so the images' buddies
    /// become current. Otherwise nothing changes and every imaged group stays changed.
    /// Panics without `begin_commit`, or with `committed` but no `commit_images`.
    pub fn end_commit(&self, committed: bool) {
        let mut st = self.state.lock();
        match std::mem::replace(&mut st.phase, CommitPhase::Idle) {
            CommitPhase::Idle => panic!("end_commit without begin_commit"),
            CommitPhase::Sealed { .. } => {
                assert!(!committed, "end_commit(true) without commit_images");
            }
            CommitPhase::Imaged { imaged, .. } => {
                for (g, slot) in imaged {
                    let group = &mut st.groups[g];
                    if committed {
                        group.slot = slot;
                    } else {
                        group.dirty = true;
                    }
                }
            }
        }
    }
}
