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

#[async_trait]
impl Backend for Redis {
    async fn put(&self, record: Arc<Record>) -> Result<(), StoreError> {
        let json = serde_json::to_string(&*record).map_err(|e| StoreError(e.to_string()))?;
        let ttl = record.expires_at.saturating_sub(unix_now()).max(1);
        let mut connection = self.connection().await?;
        connection
            .set_ex::<_, _, ()>(key(&record.id), json, ttl)
            .await
            .map_err(error)
    }

    async fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let mut connection = self.connection().await?;
        let json: Option<String> = connection.get(key(id)).await.map_err(error)?;
        json.map(|json| serde_json::from_str(&json).map_err(json_error))
            .transpose()
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let mut connection = self.connection().await?;
        connection.del::<_, ()>(key(id)).await.map_err(error)
    }

    async fn put_note(&self, note: Note) -> Result<(), StoreError> {
        let json = serde_json::to_string(&note).map_err(json_error)?;
        let mut connection = self.connection().await?;
        connection
            .hset::<_, _, _, ()>(notes_key(&note.owner), &note.id, json)
            .await
            .map_err(error)
    }

    async fn notes(&self, owner: &str) -> Result<Vec<Note>, StoreError> {
        let mut connection = self.connection().await?;
        let all: Vec<String> = connection.hvals(notes_key(owner)).await.map_err(error)?;
        all.iter()
            .map(|json| serde_json::from_str(json).map_err(json_error))
            .collect()
    }

    async fn delete_notes(&self, owner: &str, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut connection = self.connection().await?;
        connection
            .hdel::<_, _, ()>(notes_key(owner), ids)
            .await
            .map_err(error)
    }

    fn shared(&self) -> bool {
        true
    }
}
