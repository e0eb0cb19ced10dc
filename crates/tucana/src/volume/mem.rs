//! PLACEHOLDER: replaced by the file backend.
use crate::error::Result;
use crate::volume::Storage;

pub struct MemStorage;
impl MemStorage {
    pub fn new() -> MemStorage {
        todo!()
    }
}
impl Storage for MemStorage {
    fn len_bytes(&self) -> Result<u64> { todo!() }
    fn grow(&self, _len_bytes: u64) -> Result<()> { todo!() }
    fn read_at(&self, _offset: u64, _buf: &mut [u8]) -> Result<()> { todo!() }
    fn write_at(&self, _offset: u64, _data: &[u8]) -> Result<()> { todo!() }
    fn sync(&self) -> Result<()> { todo!() }
}
