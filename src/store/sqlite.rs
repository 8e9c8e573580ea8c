//! `store: { kind: sqlite, path }` (the default): one SQLite file, in WAL
//! mode, no server to run. SQLite calls block, so each runs on tokio's
//! blocking pool, on the one connection in turn (writes are serialized by
//! SQLite anyway; each is one small statement).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

use super::{unix_now, Backend, Record, StoreError};

/// Expired rows are deleted at most this often (on a write).
const PURGE_EVERY_SECONDS: u64 = 600;

pub struct Sqlite {
    path: PathBuf,
    /// Opened on first use, and again after a failure to open.
    state: Arc<Mutex<State>>,
}

struct State {
    connection: Option<Connection>,
    last_purge: u64,
}

impl Sqlite {
    pub fn new(path: PathBuf) -> Self {
        Sqlite {
            path,
            state: Arc::new(Mutex::new(State {
                connection: None,
                last_purge: 0,
            })),
        }
    }

    /// Runs `work` on the connection, on the blocking pool.
    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection, &mut u64) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let state = self.state.clone();
        let path = self.path.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
            let State {
                connection,
                last_purge,
            } = &mut *state;
            let connection = match connection {
                Some(connection) => connection,
                None => connection.insert(
                    open(&path)
                        .map_err(|e| StoreError(format!("cannot open {}: {e}", path.display())))?,
                ),
            };
            work(connection, last_purge).map_err(|e| StoreError(format!("sqlite: {e}")))
        })
        .await;
        done.map_err(|e| StoreError(format!("sqlite task: {e}")))?
    }
}

fn open(path: &std::path::Path) -> rusqlite::Result<Connection> {
    let connection = Connection::open(path)?;
    connection.busy_timeout(std::time::Duration::from_secs(5))?;
    connection.pragma_update(None, "journal_mode", "WAL")?;
    // WAL with NORMAL survives a crash of the process (not of the machine)
    // without an fsync per write.
    connection.pragma_update(None, "synchronous", "NORMAL")?;
    connection.execute_batch(
        "CREATE TABLE IF NOT EXISTS responses (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            agent TEXT NOT NULL,
            previous TEXT,
            status TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            input TEXT NOT NULL,
            response TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS responses_expires_at ON responses (expires_at);",
    )?;
    Ok(connection)
}

/// Unix seconds fit an i64 for the next 292 billion years.
fn to_sql(seconds: u64) -> i64 {
    i64::try_from(seconds).unwrap_or(i64::MAX)
}

#[async_trait]
impl Backend for Sqlite {
    async fn put(&self, record: Arc<Record>) -> Result<(), StoreError> {
        self.with(move |db, last_purge| {
            db.execute(
                "INSERT OR REPLACE INTO responses
                 (id, tenant, agent, previous, status, created_at, expires_at, input, response)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    record.id,
                    record.tenant,
                    record.agent,
                    record.previous,
                    record.status,
                    to_sql(record.created_at),
                    to_sql(record.expires_at),
                    record.input,
                    record.response,
                ],
            )?;
            let now = unix_now();
            if now >= *last_purge + PURGE_EVERY_SECONDS {
                *last_purge = now;
                db.execute(
                    "DELETE FROM responses WHERE expires_at <= ?1",
                    params![to_sql(now)],
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let id = id.to_owned();
        self.with(move |db, _| {
            db.query_row(
                "SELECT id, tenant, agent, previous, status, created_at, expires_at, input, response
                 FROM responses WHERE id = ?1",
                params![id],
                |row| {
                    Ok(Record {
                        id: row.get(0)?,
                        tenant: row.get(1)?,
                        agent: row.get(2)?,
                        previous: row.get(3)?,
                        status: row.get(4)?,
                        created_at: row.get::<_, i64>(5)?.max(0) as u64,
                        expires_at: row.get::<_, i64>(6)?.max(0) as u64,
                        input: row.get(7)?,
                        response: row.get(8)?,
                    })
                },
            )
            .optional()
        })
        .await
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.with(move |db, _| {
            db.execute("DELETE FROM responses WHERE id = ?1", params![id])?;
            Ok(())
        })
        .await
    }
}
