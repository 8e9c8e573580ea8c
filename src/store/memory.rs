//! `store: { kind: memory }`: records in this process, gone when it exits
//! (tests, a single replica that needs no history across restarts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use super::{unix_now, Backend, Record, StoreError};

#[derive(Default)]
pub struct Memory {
    records: Mutex<HashMap<String, Arc<Record>>>,
}

impl Memory {
    fn records(&self) -> MutexGuard<'_, HashMap<String, Arc<Record>>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Backend for Memory {
    async fn put(&self, record: Arc<Record>) -> Result<(), StoreError> {
        let mut records = self.records();
        // Expired records go as new ones come: the map holds only live ones
        // (and those of the last write's second).
        if records.len() % 1024 == 1023 {
            let now = unix_now();
            records.retain(|_, r| r.expires_at > now);
        }
        records.insert(record.id.clone(), record);
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.records().get(id).map(|r| (**r).clone()))
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        self.records().remove(id);
        Ok(())
    }
}
