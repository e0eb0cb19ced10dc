//! A `BTreeMap` engine for the benchmark's own tests: it lets the phase and recovery logic
//! run end to end without a real engine. Test-only.
//!
//! Durability model: `sync`, `commit` and `close` make the current contents durable;
//! `abandon` loses everything since. Durable contents live in a process-wide table keyed
//! by directory, so a reopen in the same directory finds them.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, RwLock};

use super::{Direction, Engine, EngineConfig, EngineKind, Footprint, Visit};
use crate::Result;

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

fn durable() -> &'static Mutex<HashMap<PathBuf, Map>> {
    static DURABLE: OnceLock<Mutex<HashMap<PathBuf, Map>>> = OnceLock::new();
    DURABLE.get_or_init(Default::default)
}

pub struct Memory;

impl EngineKind for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn configuration(&self, _config: &EngineConfig) -> serde_json::Value {
        serde_json::json!({ "kind": "BTreeMap for tests" })
    }

    fn open(&self, dir: &Path, _config: &EngineConfig) -> Result<Box<dyn Engine>> {
        let map = durable()
            .lock()
            .unwrap()
            .get(dir)
            .cloned()
            .unwrap_or_default();
        // A file so that the directory is not empty, as with a real engine.
        std::fs::write(dir.join("memory.engine"), b"x")?;
        Ok(Box::new(MemoryEngine {
            dir: dir.to_path_buf(),
            map: RwLock::new(map),
        }))
    }
}

struct MemoryEngine {
    dir: PathBuf,
    map: RwLock<Map>,
}

impl MemoryEngine {
    fn persist(&self) {
        let map = self.map.read().unwrap().clone();
        durable().lock().unwrap().insert(self.dir.clone(), map);
    }
}

impl Engine for MemoryEngine {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.map
            .write()
            .unwrap()
            .insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn get(&self, key: &[u8], check: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>> {
        Ok(self.map.read().unwrap().get(key).map(|v| check(v)))
    }

    fn delete(&self, key: &[u8]) -> Result<bool> {
        Ok(self.map.write().unwrap().remove(key).is_some())
    }

    fn scan(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        direction: Direction,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        let map = self.map.read().unwrap();
        let range = map.range::<[u8], _>((lower, upper));
        let mut visit_all = |mut items: Box<dyn Iterator<Item = (&Vec<u8>, &Vec<u8>)>>| {
            let _ = items.try_for_each(|(k, v)| visit(k, v));
        };
        match direction {
            Direction::Forward => visit_all(Box::new(range)),
            Direction::Reverse => visit_all(Box::new(range.rev())),
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.persist();
        Ok(())
    }

    fn commit(&self) -> Result<()> {
        self.persist();
        Ok(())
    }

    fn footprint(&self) -> Footprint {
        let map = self.map.read().unwrap();
        Footprint {
            keys: Some(map.len() as u64),
            index_bytes: Some(map.len() as u64 * 48),
            live_log_bytes: Some(map.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()),
            dead_log_bytes: Some(0),
            ..Footprint::default()
        }
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.persist();
        Ok(())
    }

    fn abandon(self: Box<Self>) {}
}
