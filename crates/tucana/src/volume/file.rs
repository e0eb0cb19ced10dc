//! PLACEHOLDER: replaced by the file backend.
use crate::error::Result;
use crate::volume::Storage;
use std::path::Path;

pub struct FileStorage;
impl FileStorage {
    pub fn open(_path: &Path, _create: bool) -> Result<FileStorage> {
        todo!()
    }
}
impl Storage for FileStorage {
    fn len_bytes(&self) -> Result<u64> { todo!() }
    fn grow(&self, _len_bytes: u64) -> Result<()> { todo!() }
    fn read_at(&self, _offset: u64, _buf: &mut [u8]) -> Result<()> { todo!() }
    fn write_at(&self, _offset: u64, _data: &[u8]) -> Result<()> { todo!() }
    fn sync(&self) -> Result<()> { todo!() }
}
