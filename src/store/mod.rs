//! The response store: the Responses API answers a client asked to keep
//! (`store: true`, OpenAI's default), for `previous_response_id`,
//! `GET /v1/responses/{id}` and its `input_items`.
//!
//! One [`Store`] in front of one backend: SQLite in a file (embedded, the
//! default), Redis (shared by replicas) or memory (tests). The store is
//! never on a request's critical path unless the request needs it:
//! - a write is handed over when the answer ends, before its last bytes go
//!   out, and runs in the background; until it lands, the record is served
//!   from this process's pending set, so a client's next turn never races it;
//! - a graceful shutdown waits for the writes handed over (a crash loses
//!   them: at most the responses that were ending);
//! - a failed write is logged and counted (`agent_proxy_store_errors_total`),
//!   the answer is not affected;
//! - a read that fails is the caller's 503, for the one request needing it.
//!
//! Records are isolated by tenant (the client key's name, or a digest of
//! the key): another tenant's id reads as unknown.
//!
//! The same backends keep agents' memory: [`Note`]s, each owned by one
//! identity (or by no one, for an agent's own notes), never expiring.

mod memory;
mod redis;
mod sqlite;

pub use sqlite::open_with as open_sqlite;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::config::file::{StoreFile, StoreKind};
use crate::metrics::metrics;

/// One stored response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The Response object's id (`resp_…`).
    pub id: String,
    /// Whose it is: only requests of the same tenant see it.
    pub tenant: String,
    /// The agent that answered.
    pub agent: String,
    /// The response this one continued, if any.
    pub previous: Option<String>,
    /// `completed`, `incomplete` or `failed`.
    pub status: String,
    pub created_at: u64,
    /// Unix seconds after which the record is gone.
    pub expires_at: u64,
    /// JSON array: the request's own input items, each with an id.
    pub input: String,
    /// JSON: the Response object as it was answered.
    pub response: String,
}

impl Record {
    fn size(&self) -> usize {
        self.input.len() + self.response.len()
    }
}

/// One note an agent's memory keeps (`remember`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Note {
    /// `mem_…`, random.
    pub id: String,
    /// Whose it is: an identity (see `session::identity`); empty for the
    /// agent's own notes, shared by every user.
    pub owner: String,
    pub agent: String,
    /// `user`, `session` or `agent`.
    pub scope: String,
    /// The session it belongs to, for `session` notes; empty otherwise.
    pub session: String,
    pub text: String,
    /// Unix milliseconds.
    pub created_at: u64,
}

/// The store could not be asked (down, unreachable, broken file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where records live. Ids are unique across tenants (random), so a
/// backend keys by id alone; [`Store`] checks the tenant.
#[async_trait]
trait Backend: Send + Sync {
    async fn put(&self, record: Arc<Record>) -> Result<(), StoreError>;
    async fn get(&self, id: &str) -> Result<Option<Record>, StoreError>;
    async fn delete(&self, id: &str) -> Result<(), StoreError>;
    async fn put_note(&self, note: Note) -> Result<(), StoreError>;
    /// Every note of `owner`.
    async fn notes(&self, owner: &str) -> Result<Vec<Note>, StoreError>;
    /// Deletes `ids`, notes of `owner`.
    async fn delete_notes(&self, owner: &str, ids: &[String]) -> Result<(), StoreError>;
    /// Whether other processes write to it too.
    fn shared(&self) -> bool {
        false
    }
    /// Writes `record` without a task of the caller's, calling `done` with
    /// the outcome; `Err(done)` when it cannot (the caller then awaits
    /// `put`). A backend with a thread of its own saves a task and a
    /// wake-up per answer this way.
    fn put_detached(&self, _record: Arc<Record>, done: Done) -> Result<(), Done> {
        Err(done)
    }
}

/// What to do once a detached write is done.
type Done = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// The response store of a config (`store:`); `None` in the config for
/// `kind: none`.
pub struct Store {
    spec: StoreFile,
    backend: Box<dyn Backend>,
    /// Handed over, not yet written: served from here meanwhile.
    pending: Mutex<HashMap<String, Arc<Record>>>,
    ttl: Duration,
    /// An owner's note writes, one at a time (by a stripe of the owner's
    /// hash): a write reads the owner's notes to keep within the caps, and
    /// parallel `remember`s each read the same list and all wrote.
    note_writes: Box<[tokio::sync::Mutex<()>; NOTE_STRIPES]>,
}

/// Stripes of [`Store::note_writes`]: owners writing at once rarely share one.
const NOTE_STRIPES: usize = 64;

impl Store {
    /// The store `spec` describes; a relative SQLite path is taken from
    /// `base` (the config file's directory). Nothing is opened or connected
    /// here: the first use does it, so a store that is down never stops the
    /// proxy from starting.
    pub fn from_file(spec: &StoreFile, base: &Path) -> Option<Arc<Store>> {
        let backend: Box<dyn Backend> = match spec.kind {
            StoreKind::None => return None,
            StoreKind::Memory => Box::new(memory::Memory::default()),
            StoreKind::Sqlite => {
                let path = spec.path.as_deref().unwrap_or(DEFAULT_SQLITE_PATH);
                Box::new(sqlite::Sqlite::new(base.join(path)))
            }
            StoreKind::Redis => Box::new(redis::Redis::new(spec.url.as_deref().unwrap_or(""))),
        };
        Some(Arc::new(Store {
            spec: spec.clone(),
            backend,
            pending: Mutex::new(HashMap::new()),
            ttl: Duration::from_secs(spec.ttl_seconds),
            note_writes: Box::new(std::array::from_fn(|_| tokio::sync::Mutex::new(()))),
        }))
    }

    /// Whether a reload may keep this store (same spec).
    pub fn is_built_from(&self, spec: &StoreFile) -> bool {
        self.spec == *spec
    }

    /// Whether a request that says nothing about `store` is stored.
    pub fn by_default(&self) -> bool {
        self.spec.store_by_default
    }

    /// Seconds a record is kept.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Keeps `record`, in the background. Too large a record is not kept
    /// (logged and counted); neither is one whose write fails.
    pub fn save(self: &Arc<Self>, record: Record) {
        if record.size() > self.spec.max_response_bytes {
            warn!(
                id = %record.id,
                bytes = record.size(),
                limit = self.spec.max_response_bytes,
                "response not stored: larger than store.max_response_bytes"
            );
            metrics()
                .store_errors
                .with_label_values(&["too_large"])
                .inc();
            return;
        }
        let record = Arc::new(record);
        self.pending_set().insert(record.id.clone(), record.clone());
        let store = self.clone();
        let id = record.id.clone();
        // A graceful shutdown waits for the write as for a request.
        let in_flight = crate::shutdown::InFlight::enter();
        let started = Instant::now();
        let done: Done = Box::new(move |written| {
            let _in_flight = in_flight;
            observe("write", started);
            if let Err(e) = written {
                warn!(%id, error = %e, "response not stored");
                metrics().store_errors.with_label_values(&["write"]).inc();
            }
            store.pending_set().remove(&id);
        });
        if let Err(done) = self.backend.put_detached(record.clone(), done) {
            let store = self.clone();
            tokio::spawn(async move { done(store.backend.put(record).await) });
        }
    }

    /// The record `id` of `tenant`; `None` when unknown, expired or another
    /// tenant's.
    pub async fn load(&self, tenant: &str, id: &str) -> Result<Option<Arc<Record>>, StoreError> {
        let pending = self.pending_set().get(id).cloned();
        let record = match pending {
            Some(record) => record,
            None => match self.read(id).await {
                Ok(Some(record)) => Arc::new(record),
                Ok(None) => return Ok(None),
                Err(e) => {
                    warn!(error = %e, "response store read failed");
                    metrics().store_errors.with_label_values(&["read"]).inc();
                    return Err(e);
                }
            },
        };
        Ok((record.tenant == tenant && record.expires_at > unix_now()).then_some(record))
    }

    /// The backend's record `id`. A store shared by replicas is asked again
    /// a few times before an id is called unknown: another replica hands its
    /// write over as its answer ends, and the client's next turn may reach
    /// this one first.
    async fn read(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let mut backoff = Duration::from_millis(25);
        loop {
            let started = Instant::now();
            let found = self.backend.get(id).await;
            observe("read", started);
            let found = found?;
            if found.is_some() || !self.backend.shared() || backoff > Duration::from_millis(100) {
                return Ok(found);
            }
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }

    /// Deletes the record `id` of `tenant`: whether there was one.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<bool, StoreError> {
        if self.load(tenant, id).await?.is_none() {
            return Ok(false);
        }
        self.pending_set().remove(id);
        self.backend.delete(id).await.inspect_err(|_| {
            metrics().store_errors.with_label_values(&["write"]).inc();
        })?;
        Ok(true)
    }

    /// Keeps `note`; then, past `keep` notes of the same agent, scope and
    /// session, the oldest go.
    pub async fn add_note(&self, note: Note, keep: usize) -> Result<(), StoreError> {
        let owner = note.owner.clone();
        let stripe = {
            use std::hash::{BuildHasher, BuildHasherDefault};
            let hasher = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
            hasher.hash_one(&owner) as usize % NOTE_STRIPES
        };
        let _one_at_a_time = self.note_writes[stripe].lock().await;
        let started = Instant::now();
        let result = async {
            let same = |n: &Note| {
                n.agent == note.agent && n.scope == note.scope && n.session == note.session
            };
            let mut all: Vec<Note> = self.backend.notes(&owner).await?;
            sort_notes(&mut all);
            // The oldest of the same place beyond `keep`, then the oldest
            // of the owner's beyond the cap (sessions come and go; their
            // notes would pile up).
            let mut doomed: BTreeSet<&str> = BTreeSet::new();
            let alike: Vec<&Note> = all.iter().filter(|n| same(n)).collect();
            let over = (alike.len() + 1).saturating_sub(keep.max(1));
            doomed.extend(alike.iter().take(over).map(|n| n.id.as_str()));
            let over = (all.len() + 1 - doomed.len()).saturating_sub(MAX_NOTES_PER_OWNER);
            let oldest: Vec<&str> = all
                .iter()
                .map(|n| n.id.as_str())
                .filter(|id| !doomed.contains(id))
                .take(over)
                .collect();
            doomed.extend(oldest);
            self.backend.put_note(note).await?;
            if !doomed.is_empty() {
                let ids: Vec<String> = doomed.into_iter().map(str::to_owned).collect();
                self.backend.delete_notes(&owner, &ids).await?;
            }
            Ok(())
        }
        .await;
        observe("note_write", started);
        count_failure(&result, "write");
        result
    }

    /// The notes of `owner`, oldest first.
    pub async fn notes(&self, owner: &str) -> Result<Vec<Note>, StoreError> {
        let started = Instant::now();
        let result = self.backend.notes(owner).await.map(|mut notes| {
            sort_notes(&mut notes);
            notes
        });
        observe("note_read", started);
        count_failure(&result, "read");
        result
    }

    /// Deletes the notes `ids` of `owner`.
    pub async fn delete_notes(&self, owner: &str, ids: &[String]) -> Result<(), StoreError> {
        let result = self.backend.delete_notes(owner, ids).await;
        count_failure(&result, "write");
        result
    }

    fn pending_set(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Record>>> {
        // A panic while holding it left a map, still valid.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn sort_notes(notes: &mut [Note]) {
    notes.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
}

fn count_failure<T>(result: &Result<T, StoreError>, kind: &str) {
    if let Err(e) = result {
        warn!(error = %e, "memory store {kind} failed");
        metrics().store_errors.with_label_values(&[kind]).inc();
    }
}

/// `store.path` when not set: beside the config file.
pub const DEFAULT_SQLITE_PATH: &str = "agent-proxy.sqlite3";

/// Notes one identity keeps across its agents, scopes and sessions: what a
/// request reads stays bounded.
pub const MAX_NOTES_PER_OWNER: usize = 1000;

/// `agent_proxy_store_duration_seconds{op}`: a call from `started` on.
fn observe(op: &str, started: Instant) {
    metrics()
        .store_seconds
        .local()
        .with_label_values(&[op])
        .observe(started.elapsed().as_secs_f64());
}

pub fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whose records a client sees: the name of the key it matched (keys may
/// share a name, and so a tenant), else a digest of the key itself (never
/// the key); with auth off, everyone is the one tenant `""`.
pub fn tenant_of(key: Option<&crate::config::ApiKey>) -> String {
    use sha2::{Digest, Sha256};
    match key {
        None => String::new(),
        Some(key) => match &key.name {
            Some(name) => format!("name:{name}"),
            None => {
                let digest = Sha256::digest(key.key.as_bytes());
                format!("key:{}", hex::encode(&digest[..16]))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the stores' tests keep: `{"id":…}` its response.
    pub(super) fn record(id: &str, tenant: &str, expires_at: u64) -> Record {
        Record {
            id: id.into(),
            tenant: tenant.into(),
            agent: "weather".into(),
            previous: None,
            status: "completed".into(),
            created_at: 1,
            expires_at,
            input: "[]".into(),
            response: format!(r#"{{"id":"{id}"}}"#),
        }
    }

    fn spec(kind: StoreKind) -> StoreFile {
        StoreFile {
            kind,
            ..StoreFile::default()
        }
    }

    /// Each embedded backend keeps, isolates, expires and deletes.
    #[tokio::test]
    async fn backends_keep_isolate_expire_and_delete() {
        let dir = std::env::temp_dir().join(format!("agent-proxy-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for kind in [StoreKind::Memory, StoreKind::Sqlite] {
            let store = Store::from_file(&spec(kind), &dir).unwrap();
            let later = unix_now() + 60;
            store.save(record("resp_a", "name:alice", later));
            store.save(record("resp_old", "name:alice", unix_now() - 1));
            // Served while pending and after the write.
            assert!(store.load("name:alice", "resp_a").await.unwrap().is_some());
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(store.pending_set().is_empty(), "{kind:?}");
            let got = store.load("name:alice", "resp_a").await.unwrap().unwrap();
            assert_eq!(*got, record("resp_a", "name:alice", later), "{kind:?}");
            assert_eq!(store.load("name:bob", "resp_a").await.unwrap(), None);
            assert_eq!(store.load("name:alice", "resp_old").await.unwrap(), None);
            assert!(!store.delete("name:bob", "resp_a").await.unwrap());
            assert!(store.delete("name:alice", "resp_a").await.unwrap());
            assert_eq!(store.load("name:alice", "resp_a").await.unwrap(), None);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn note(id: &str, owner: &str, scope: &str, created_at: u64) -> Note {
        Note {
            id: id.into(),
            owner: owner.into(),
            agent: "helper".into(),
            scope: scope.into(),
            session: String::new(),
            text: format!("note {id}"),
            created_at,
        }
    }

    /// Each embedded backend keeps notes per owner, drops the oldest past
    /// the cap of their own scope only, and deletes by id.
    #[tokio::test]
    async fn backends_keep_notes_per_owner_and_cap_them() {
        let dir = std::env::temp_dir().join(format!("agent-proxy-notes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for kind in [StoreKind::Memory, StoreKind::Sqlite] {
            let store = Store::from_file(&spec(kind), &dir).unwrap();
            for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
                let n = note(id, "name:alice", "user", i as u64);
                store.add_note(n, 2).await.unwrap();
            }
            store
                .add_note(note("s", "name:alice", "session", 9), 2)
                .await
                .unwrap();
            store
                .add_note(note("x", "name:bob", "user", 1), 2)
                .await
                .unwrap();
            let ids = |notes: Vec<Note>| notes.into_iter().map(|n| n.id).collect::<Vec<_>>();
            let alice = store.notes("name:alice").await.unwrap();
            assert_eq!(ids(alice), ["b", "c", "s"], "{kind:?}");
            assert_eq!(ids(store.notes("name:bob").await.unwrap()), ["x"]);
            store.delete_notes("name:bob", &["b".into()]).await.unwrap();
            assert_eq!(
                store.notes("name:alice").await.unwrap().len(),
                3,
                "not bob's to delete"
            );
            store
                .delete_notes("name:alice", &["b".into(), "s".into()])
                .await
                .unwrap();
            assert_eq!(ids(store.notes("name:alice").await.unwrap()), ["c"]);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Notes of many sessions do not pile up: an owner keeps the newest
    /// `MAX_NOTES_PER_OWNER`.
    /// Notes written at once (a model's parallel `remember`s) keep the cap:
    /// each write reads the list after the one before it wrote.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn notes_written_at_once_keep_the_cap() {
        let dir = std::env::temp_dir().join(format!("agent-proxy-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::from_file(&spec(StoreKind::Sqlite), &dir).unwrap();
        let writes = (0..6).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let n = note(&format!("n{i}"), "name:alice", "user", i);
                store.add_note(n, 3).await
            })
        });
        for written in futures::future::join_all(writes).await {
            written.unwrap().unwrap();
        }
        assert_eq!(store.notes("name:alice").await.unwrap().len(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn an_owner_keeps_a_bounded_number_of_notes() {
        let store = Store::from_file(&spec(StoreKind::Memory), Path::new(".")).unwrap();
        for i in 0..MAX_NOTES_PER_OWNER + 5 {
            let mut n = note(&format!("n{i:04}"), "name:alice", "session", i as u64);
            n.session = format!("sess_{i}");
            store.add_note(n, 20).await.unwrap();
        }
        let notes = store.notes("name:alice").await.unwrap();
        assert_eq!(notes.len(), MAX_NOTES_PER_OWNER);
        assert_eq!(notes[0].id, "n0005");
    }

    #[test]
    fn tenants_are_the_key_name_or_a_digest_never_the_key() {
        let named = crate::config::ApiKey {
            key: "sk-secret".into(),
            name: Some("alice".into()),
        };
        let bare = crate::config::ApiKey {
            key: "sk-secret".into(),
            name: None,
        };
        assert_eq!(tenant_of(Some(&named)), "name:alice");
        let digest = tenant_of(Some(&bare));
        assert!(digest.starts_with("key:") && !digest.contains("secret"));
        assert_eq!(tenant_of(None), "");
    }
}
