//! `store: { kind: redis, url }`: records in Redis, so every replica behind
//! a load balancer continues any conversation. Each record is one key
//! (`agent-proxy:response:<id>`, its JSON) that Redis expires itself.
//! An owner's memory notes are one hash (`agent-proxy:notes:<owner>`, a
//! field per note id), kept until deleted.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncCommands;
use tokio::sync::OnceCell;

use super::{unix_now, Backend, Note, Record, StoreError};

/// A request waits no longer than this on Redis: a store that is down must
/// cost the one request needing it a quick 503, not its whole timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Redis {
    url: String,
    /// Connected on first use; the manager reconnects by itself after that.
    connection: OnceCell<ConnectionManager>,
}

impl Redis {
    pub fn new(url: &str) -> Self {
        Redis {
            url: url.to_owned(),
            connection: OnceCell::new(),
        }
    }

    async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        self.connection
            .get_or_try_init(|| async {
                let client = redis::Client::open(self.url.as_str()).map_err(error)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(1);
                client
                    .get_connection_manager_with_config(config)
                    .await
                    .map_err(error)
            })
            .await
            .cloned()
    }
}

/// Redis errors name the server, never a password in the URL.
fn error(e: redis::RedisError) -> StoreError {
    StoreError(format!("redis: {}", e.category()))
}

fn key(id: &str) -> String {
    format!("agent-proxy:response:{id}")
}

fn notes_key(owner: &str) -> String {
    format!("agent-proxy:notes:{owner}")
}

fn json_error(e: serde_json::Error) -> StoreError {
    StoreError(format!("redis: {e}"))
}

impl Redis {
    /// Runs `command` on the connection, and once more when the connection
    /// turns out to have dropped: after Redis restarts, the manager learns
    /// of it only from the next command's failure (and reconnects then), so
    /// the first command after an outage failed, a 503 or a lost write
    /// seconds after Redis was back. Every command here can run twice to
    /// the same effect (`SET`, `GET`, `DEL`, `HSET` of one field, `HVALS`,
    /// `HDEL`); a timeout is not retried, so a stalled Redis still costs a
    /// request one wait.
    async fn run<T, F>(&self, command: impl Fn(ConnectionManager) -> F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let connection = self.connection().await?;
        match command(connection.clone()).await {
            Err(e) if e.is_connection_dropped() => command(connection).await.map_err(error),
            done => done.map_err(error),
        }
    }
}

#[async_trait]
impl Backend for Redis {
    async fn put(&self, record: Arc<Record>) -> Result<(), StoreError> {
        let json = serde_json::to_string(&*record).map_err(|e| StoreError(e.to_string()))?;
        let ttl = record.expires_at.saturating_sub(unix_now()).max(1);
        let (key, json) = (&key(&record.id), &json);
        self.run(|mut c| async move { c.set_ex::<_, _, ()>(key, json, ttl).await })
            .await
    }

    async fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let key = &key(id);
        let json: Option<String> = self.run(|mut c| async move { c.get(key).await }).await?;
        json.map(|json| serde_json::from_str(&json).map_err(json_error))
            .transpose()
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let key = &key(id);
        self.run(|mut c| async move { c.del::<_, ()>(key).await })
            .await
    }

    async fn put_note(&self, note: Note) -> Result<(), StoreError> {
        let json = serde_json::to_string(&note).map_err(json_error)?;
        let (key, id, json) = (&notes_key(&note.owner), &note.id, &json);
        self.run(|mut c| async move { c.hset::<_, _, _, ()>(key, id, json).await })
            .await
    }

    async fn notes(&self, owner: &str) -> Result<Vec<Note>, StoreError> {
        let key = &notes_key(owner);
        let all: Vec<String> = self.run(|mut c| async move { c.hvals(key).await }).await?;
        all.iter()
            .map(|json| serde_json::from_str(json).map_err(json_error))
            .collect()
    }

    async fn delete_notes(&self, owner: &str, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let key = &notes_key(owner);
        self.run(|mut c| async move { c.hdel::<_, _, ()>(key, ids).await })
            .await
    }

    fn shared(&self) -> bool {
        true
    }
}
