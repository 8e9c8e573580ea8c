//! `store: { kind: memory }`: records in this process, gone when it exits
//! (tests, a single replica that needs no history across restarts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use super::{unix_now, Backend, Note, Record, StoreError};

#[derive(Default)]
pub struct Memory {
    records: Mutex<HashMap<String, Arc<Record>>>,
    /// By owner.
    notes: Mutex<HashMap<String, Vec<Note>>>,
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

    async fn put_note(&self, note: Note) -> Result<(), StoreError> {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        notes.entry(note.owner.clone()).or_default().push(note);
        Ok(())
    }

    async fn notes(&self, owner: &str) -> Result<Vec<Note>, StoreError> {
        let notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(notes.get(owner).cloned().unwrap_or_default())
    }

    async fn delete_notes(&self, owner: &str, ids: &[String]) -> Result<(), StoreError> {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(own) = notes.get_mut(owner) {
            own.retain(|n| !ids.contains(&n.id));
        }
        Ok(())
    }
}
