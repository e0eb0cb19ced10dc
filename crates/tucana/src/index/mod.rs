//! TEMPORARY API stub (replaced by the index branch).
#![allow(unused_variables, dead_code)]
use crate::error::Result;
use crate::types::{DiskOffset, RegionId, TreeEpoch};
use crossbeam_epoch::Guard;
pub const NODE_BYTES: usize = 4096;
pub trait Ctx {
    fn key_cmp(&self, ptr: u64, key: &[u8]) -> Result<std::cmp::Ordering>;
    fn key_into(&self, ptr: u64, out: &mut Vec<u8>) -> Result<()>;
    fn with_node<R>(&self, off: DiskOffset, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R>;
}
pub fn key_hash(key: &[u8]) -> u32 {
    todo!()
}
pub fn key_prefix(key: &[u8]) -> u64 {
    todo!()
}
pub struct Sealed {
    pub root: u64,
    pub epoch: TreeEpoch,
}
pub enum Seek<'a> {
    First,
    Last,
    AtOrAfter(&'a [u8]),
    Before(&'a [u8]),
}
#[derive(Default)]
pub struct LeafCopy {
    pub ptrs: Vec<u64>,
    pub low: Option<Vec<u8>>,
    pub high: Option<Vec<u8>>,
}
pub struct Tree;
impl Tree {
    pub fn new(region: RegionId, running: TreeEpoch) -> Tree {
        todo!()
    }
    pub fn from_disk(region: RegionId, root: DiskOffset, running: TreeEpoch) -> Tree {
        todo!()
    }
    pub fn root_word(&self) -> u64 {
        todo!()
    }
    pub fn heap_nodes(&self) -> u64 {
        todo!()
    }
    pub fn insert<C: Ctx>(&self, ctx: &C, key: &[u8], ptr: u64) -> Result<Option<u64>> {
        todo!()
    }
    pub fn remove<C: Ctx>(&self, ctx: &C, key: &[u8]) -> Result<Option<u64>> {
        todo!()
    }
    pub fn seal(&self) -> Sealed {
        todo!()
    }
    pub fn get<C: Ctx>(
        &self,
        ctx: &C,
        root: u64,
        key: &[u8],
        guard: &Guard,
    ) -> Result<Option<u64>> {
        todo!()
    }
    pub fn copy_leaf<C: Ctx>(
        &self,
        ctx: &C,
        root: u64,
        seek: Seek<'_>,
        guard: &Guard,
        out: &mut LeafCopy,
    ) -> Result<()> {
        todo!()
    }
    pub fn persist<C: Ctx>(
        &self,
        ctx: &C,
        sealed_root: u64,
        region: RegionId,
        alloc: &mut dyn FnMut() -> Result<DiskOffset>,
        out: &mut Vec<(DiskOffset, Box<[u8; 4096]>)>,
    ) -> Result<DiskOffset> {
        todo!()
    }
    pub fn reclaim(
        &self,
        durable: TreeEpoch,
        oldest_snapshot: Option<TreeEpoch>,
    ) -> Vec<DiskOffset> {
        todo!()
    }
    pub fn retired_disk_blocks(&self, upto: TreeEpoch) -> Vec<DiskOffset> {
        todo!()
    }
}
pub struct DiskNode<'a>(&'a [u8]);
impl<'a> DiskNode<'a> {
    pub fn verify(img: &'a [u8], off: DiskOffset, region: RegionId) -> Result<DiskNode<'a>> {
        todo!()
    }
    pub fn children(&self) -> Result<Option<Vec<DiskOffset>>> {
        todo!()
    }
    pub fn leaf_entries(&self) -> impl Iterator<Item = (u64, u32, u64)> + '_ {
        std::iter::empty()
    }
}
