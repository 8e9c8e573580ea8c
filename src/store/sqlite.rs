//! `store: { kind: sqlite, path }` (the default): one SQLite file, in WAL
//! mode, no server to run. SQLite calls block, so one thread of its own owns
//! the connection and serves the store's calls in order; the writes waiting
//! when it wakes go in one transaction (a group commit), so a busy proxy
//! pays one commit per batch rather than per answer. An answer's write is
//! detached (the client has its answer; the pending set serves it
//! meanwhile), so it waits a moment for company; a call someone awaits does
//! not wait.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::{mpsc, oneshot};

use super::{unix_now, Backend, Done, Note, Record, StoreError};
use std::sync::Arc;

/// Expired rows go oldest first, with the batches of writes: rows are kept
/// in the order they are written (`rowid`), and a store's answers share
/// one TTL, so the oldest expire first. A purge deletes the expired among
/// the oldest rows, twice as many as the batch wrote (at least
/// [`PURGE_LEAST`]): deleting keeps pace with writing, and no purge holds
/// up the thread's reads for long. Without an index on `expires_at`, an
/// answer's write costs the thread 13% fewer instructions (one B-tree less
/// to insert into, fewer pages to write at the commit).
const PURGE_PER_WRITE: i64 = 2;
/// Rows a purge looks at however few the batch wrote: once a burst's
/// answers expire, a lighter load's batches delete this many each.
const PURGE_LEAST: i64 = 512;
/// Rows a sweep looks at, past the last one it looked at (see [`Purge`]).
const SWEEP: i64 = 10_000;
/// Once the oldest rows are not expired, the next purge waits this long.
const PURGE_IDLE_SECONDS: u64 = 60;
/// Calls waiting for the thread; a caller beyond it waits its turn.
const QUEUE: usize = 1024;
/// Calls served in one transaction at most.
const BATCH: usize = 256;
/// How long a detached write waits for others to share its commit. At one
/// connection, 10 ms rather than 2 put five times the answers in a commit:
/// the thread's CPU per answer went from 13–19 µs to 8–9. A crash of the
/// process loses at most the answers of those 10 ms.
const LINGER: std::time::Duration = std::time::Duration::from_millis(10);
/// Calls served between two yields of the store's thread (about 50 µs of
/// work). A batch is a millisecond of CPU; threads woken on the same core
/// meanwhile (a worker, the model server) waited it out while the other
/// core went idle: 10% of both cores at 32 connections.
const YIELD_EVERY: usize = 16;

pub struct Sqlite {
    calls: mpsc::Sender<Call>,
    /// Set with a call someone awaits: it ends a write's linger (see [`linger`]).
    awaited: Arc<AtomicBool>,
    /// The store's thread, unparked by an awaited call or a full batch.
    thread: Option<std::thread::Thread>,
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A write's outcome goes to its `Done`, called on the store's thread once
/// the batch is committed; a read answers on its channel.
enum Call {
    Put(Arc<Record>, Done),
    Get(String, Reply<Option<Record>>),
    Delete(String, Done),
    PutNote(Note, Done),
    Notes(String, Reply<Vec<Note>>),
    DeleteNotes(String, Vec<String>, Done),
}

impl Sqlite {
    /// Starts the thread; the file is opened on first use (and again after a
    /// failure to open). The thread ends when the store is dropped.
    pub fn new(path: PathBuf) -> Self {
        let (calls, queue) = mpsc::channel(QUEUE);
        let awaited = Arc::new(AtomicBool::new(false));
        let waiting = awaited.clone();
        let spawned = std::thread::Builder::new()
            .name("sqlite-store".into())
            .spawn(move || serve(path, queue, &waiting));
        let thread = match spawned {
            Ok(handle) => Some(handle.thread().clone()),
            Err(e) => {
                // Every call then fails as a store outage (the channel is closed).
                tracing::error!("cannot start the SQLite store's thread: {e}");
                None
            }
        };
        Sqlite {
            calls,
            awaited,
            thread,
        }
    }

    fn wake(&self) {
        if let Some(thread) = &self.thread {
            thread.unpark();
        }
    }

    async fn call<T>(&self, call: impl FnOnce(Reply<T>) -> Call) -> Result<T, StoreError> {
        let gone = || StoreError("sqlite: the store's thread is gone".into());
        let (reply, answer) = oneshot::channel();
        self.calls.send(call(reply)).await.map_err(|_| gone())?;
        self.awaited.store(true, Ordering::Release);
        self.wake();
        answer.await.map_err(|_| gone())?
    }

    /// A write, its outcome awaited.
    async fn write(&self, call: impl FnOnce(Done) -> Call) -> Result<(), StoreError> {
        self.call(|reply| {
            call(Box::new(move |written| {
                let _ = reply.send(written);
            }))
        })
        .await
    }
}

/// The store's thread: each wake-up serves every call waiting (up to
/// [`BATCH`]) in one transaction.
fn serve(path: PathBuf, mut queue: mpsc::Receiver<Call>, awaited: &AtomicBool) {
    let mut connection: Option<Connection> = None;
    let mut purge = Purge::default();
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = queue.blocking_recv() {
        // Writes wait a moment for company: one commit then serves many
        // answers even one connection at a time. A read does not wait.
        if first.is_write() {
            linger(awaited, &queue);
        }
        batch.push(first);
        while batch.len() < BATCH {
            match queue.try_recv() {
                Ok(call) => batch.push(call),
                Err(_) => break,
            }
        }
        let db = match connection.as_mut() {
            Some(db) => db,
            None => match open(&path) {
                Ok(db) => connection.insert(db),
                Err(e) => {
                    let error = StoreError(format!("cannot open {}: {e}", path.display()));
                    batch.drain(..).for_each(|call| call.fail(error.clone()));
                    continue;
                }
            },
        };
        serve_batch(db, &mut batch, &mut purge);
    }
}

/// A write's wait for company: [`LINGER`], unless a call someone awaits is
/// handed over meanwhile, or a batch is full. A read is not kept waiting for
/// the writes' commit: a turn that continues a stored conversation reads its
/// earlier answers, and a client sending tool results by
/// `previous_response_id` does so at once. Nor is a deleted response or a
/// tool's note, which a client or a model awaits.
fn linger(awaited: &AtomicBool, queue: &mpsc::Receiver<Call>) {
    let until = Instant::now() + LINGER;
    while !awaited.swap(false, Ordering::Acquire) && queue.len() + 1 < BATCH {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::park_timeout(left);
    }
}

/// One transaction: each call's own statement result, unless the commit
/// fails, which fails every write of the batch.
fn serve_batch(db: &mut Connection, batch: &mut Vec<Call>, purge: &mut Purge) {
    let transaction = match db.transaction() {
        Ok(transaction) => transaction,
        Err(e) => {
            let error = StoreError(format!("sqlite: {e}"));
            batch.drain(..).for_each(|call| call.fail(error.clone()));
            return;
        }
    };
    let mut writes: Vec<(rusqlite::Result<()>, Done)> = Vec::new();
    for (served, call) in batch.drain(..).enumerate() {
        if served % YIELD_EVERY == YIELD_EVERY - 1 {
            std::thread::yield_now();
        }
        match call {
            Call::Put(record, done) => writes.push((put(&transaction, &record), done)),
            Call::Delete(id, done) => writes.push((delete(&transaction, &id), done)),
            Call::Get(id, reply) => {
                let _ = reply.send(get(&transaction, &id).map_err(sql_error));
            }
            Call::PutNote(note, done) => writes.push((put_note(&transaction, &note), done)),
            Call::DeleteNotes(owner, ids, done) => {
                writes.push((delete_notes(&transaction, &owner, &ids), done))
            }
            Call::Notes(owner, reply) => {
                let _ = reply.send(notes(&transaction, &owner).map_err(sql_error));
            }
        }
    }
    // A batch whose writes all failed (the file locked by another process,
    // a full disk) leaves the purge for later.
    let written = writes.iter().filter(|(result, _)| result.is_ok()).count();
    if written > 0 {
        purge.run(&transaction, unix_now(), written);
    }
    let committed = transaction.commit().map_err(sql_error);
    for (result, done) in writes {
        done(committed.clone().and(result.map_err(sql_error)));
    }
}

impl Call {
    fn is_write(&self) -> bool {
        !matches!(self, Call::Get(..) | Call::Notes(..))
    }

    fn fail(self, error: StoreError) {
        match self {
            Call::Put(_, done)
            | Call::Delete(_, done)
            | Call::PutNote(_, done)
            | Call::DeleteNotes(_, _, done) => done(Err(error)),
            Call::Get(_, reply) => drop(reply.send(Err(error))),
            Call::Notes(_, reply) => drop(reply.send(Err(error))),
        }
    }
}

fn sql_error(e: rusqlite::Error) -> StoreError {
    StoreError(format!("sqlite: {e}"))
}

fn open(path: &std::path::Path) -> rusqlite::Result<Connection> {
    open_with(
        path,
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
        -- Made by earlier versions; purges go by rowid (see Purge).
        DROP INDEX IF EXISTS responses_expires_at;
        CREATE TABLE IF NOT EXISTS notes (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            agent TEXT NOT NULL,
            scope TEXT NOT NULL,
            session TEXT NOT NULL,
            text TEXT NOT NULL,
            created_at INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS notes_owner ON notes (owner);",
    )
}

/// An SQLite file in WAL mode with `schema` applied: the response store's,
/// and the knowledge bases' embeddings cache.
pub fn open_with(path: &std::path::Path, schema: &str) -> rusqlite::Result<Connection> {
    let connection = Connection::open(path)?;
    connection.busy_timeout(std::time::Duration::from_secs(5))?;
    // For a new file (an existing one keeps its own): a commit writes each
    // changed page to the WAL in a `pwrite` of its own, and a batch of
    // answers fills fewer, larger pages: the store's thread spent about a
    // sixth less CPU per answer than with the default 4 KiB.
    connection.pragma_update(None, "page_size", 16384)?;
    connection.pragma_update(None, "journal_mode", "WAL")?;
    // WAL with NORMAL survives a crash of the process (not of the machine)
    // without an fsync per write.
    connection.pragma_update(None, "synchronous", "NORMAL")?;
    connection.execute_batch(schema)?;
    Ok(connection)
}

/// Unix seconds fit an i64 for the next 292 billion years.
fn to_sql(seconds: u64) -> i64 {
    i64::try_from(seconds).unwrap_or(i64::MAX)
}

fn put(db: &Connection, record: &Record) -> rusqlite::Result<()> {
    db.prepare_cached(
        "INSERT OR REPLACE INTO responses
         (id, tenant, agent, previous, status, created_at, expires_at, input, response)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        record.id,
        record.tenant,
        record.agent,
        record.previous,
        record.status,
        to_sql(record.created_at),
        to_sql(record.expires_at),
        record.input,
        record.response,
    ])?;
    Ok(())
}

/// When and where expired rows are deleted. The oldest go first, with each
/// batch while the oldest are expired. Once they are not, the purge waits
/// [`PURGE_IDLE_SECONDS`], then sweeps on from where it last stopped, a
/// stretch of [`SWEEP`] rows at a time, starting again from the oldest past
/// the newest: after a reload lowers the TTL, newer rows expire before the
/// older ones ahead of them, and are found there.
#[derive(Default)]
struct Purge {
    /// Unix seconds before which no purge runs.
    next: u64,
    /// The last row the sweep looked at.
    swept: i64,
}

impl Purge {
    fn run(&mut self, db: &Connection, now: u64, written: usize) {
        if now < self.next {
            return;
        }
        let most = PURGE_PER_WRITE
            .saturating_mul(written as i64)
            .max(PURGE_LEAST);
        let done = oldest(db, now, most).and_then(|deleted| {
            if deleted as i64 >= most {
                // More may be due: the next batch purges too.
                return Ok(());
            }
            self.next = now + PURGE_IDLE_SECONDS;
            self.swept = sweep(db, now, self.swept)?;
            Ok(())
        });
        if let Err(e) = done {
            tracing::warn!("sqlite store: purging expired responses: {e}");
            self.next = now + PURGE_IDLE_SECONDS;
        }
    }
}

/// Deletes the expired among the `most` oldest rows: how many it deleted.
/// Only those are looked at, so a purge costs the same however large the
/// table.
fn oldest(db: &Connection, now: u64, most: i64) -> rusqlite::Result<usize> {
    db.prepare_cached(OLDEST)?
        .execute(params![to_sql(now), most])
}

/// SQLite looks the listed rows up by `rowid`, and lists them by reading
/// the table in `rowid` order until it has `most`.
const OLDEST: &str = "DELETE FROM responses WHERE expires_at <= ?1
    AND rowid IN (SELECT rowid FROM responses ORDER BY rowid LIMIT ?2)";

/// Deletes the expired among the [`SWEEP`] rows past `after`: the last row
/// looked at, or 0 past the newest (the next sweep starts again from the
/// oldest).
fn sweep(db: &Connection, now: u64, after: i64) -> rusqlite::Result<i64> {
    let last: Option<i64> = db
        .prepare_cached(SWEEP_END)?
        .query_row(params![after, SWEEP], |row| row.get(0))?;
    let Some(last) = last else {
        return Ok(0);
    };
    db.prepare_cached(SWEEP_DELETE)?
        .execute(params![to_sql(now), after, last])?;
    Ok(last)
}

const SWEEP_END: &str = "SELECT max(rowid) FROM
    (SELECT rowid FROM responses WHERE rowid > ?1 ORDER BY rowid LIMIT ?2)";
const SWEEP_DELETE: &str =
    "DELETE FROM responses WHERE expires_at <= ?1 AND rowid > ?2 AND rowid <= ?3";

fn get(db: &Connection, id: &str) -> rusqlite::Result<Option<Record>> {
    db.prepare_cached(
        "SELECT id, tenant, agent, previous, status, created_at, expires_at, input, response
         FROM responses WHERE id = ?1",
    )?
    .query_row(params![id], |row| {
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
    })
    .optional()
}

fn delete(db: &Connection, id: &str) -> rusqlite::Result<()> {
    db.prepare_cached("DELETE FROM responses WHERE id = ?1")?
        .execute(params![id])?;
    Ok(())
}

fn put_note(db: &Connection, note: &Note) -> rusqlite::Result<()> {
    db.prepare_cached(
        "INSERT OR REPLACE INTO notes (id, owner, agent, scope, session, text, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        note.id,
        note.owner,
        note.agent,
        note.scope,
        note.session,
        note.text,
        to_sql(note.created_at),
    ])?;
    Ok(())
}

fn notes(db: &Connection, owner: &str) -> rusqlite::Result<Vec<Note>> {
    db.prepare_cached(
        "SELECT id, owner, agent, scope, session, text, created_at FROM notes WHERE owner = ?1",
    )?
    .query_map(params![owner], |row| {
        Ok(Note {
            id: row.get(0)?,
            owner: row.get(1)?,
            agent: row.get(2)?,
            scope: row.get(3)?,
            session: row.get(4)?,
            text: row.get(5)?,
            created_at: row.get::<_, i64>(6)?.max(0) as u64,
        })
    })?
    .collect()
}

fn delete_notes(db: &Connection, owner: &str, ids: &[String]) -> rusqlite::Result<()> {
    let mut statement = db.prepare_cached("DELETE FROM notes WHERE owner = ?1 AND id = ?2")?;
    for id in ids {
        statement.execute(params![owner, id])?;
    }
    Ok(())
}

#[async_trait]
impl Backend for Sqlite {
    async fn put(&self, record: Arc<Record>) -> Result<(), StoreError> {
        self.write(|done| Call::Put(record, done)).await
    }

    fn put_detached(&self, record: Arc<Record>, done: Done) -> Result<(), Done> {
        // A full queue (or a gone thread) hands it back: the caller waits.
        match self.calls.try_reserve() {
            Ok(slot) => {
                slot.send(Call::Put(record, done));
                // A full batch ends the linger (the thread holds one call).
                if self.calls.max_capacity() - self.calls.capacity() + 1 >= BATCH {
                    self.wake();
                }
                Ok(())
            }
            Err(_) => Err(done),
        }
    }

    async fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let id = id.to_owned();
        self.call(|reply| Call::Get(id, reply)).await
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.write(|done| Call::Delete(id, done)).await
    }

    async fn put_note(&self, note: Note) -> Result<(), StoreError> {
        self.write(|done| Call::PutNote(note, done)).await
    }

    async fn notes(&self, owner: &str) -> Result<Vec<Note>, StoreError> {
        let owner = owner.to_owned();
        self.call(|reply| Call::Notes(owner, reply)).await
    }

    async fn delete_notes(&self, owner: &str, ids: &[String]) -> Result<(), StoreError> {
        let (owner, ids) = (owner.to_owned(), ids.to_vec());
        self.write(|done| Call::DeleteNotes(owner, ids, done)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, expires_at: u64) -> Record {
        crate::store::tests::record(id, "name:alice", expires_at)
    }

    fn ids(db: &Connection) -> Vec<String> {
        let mut statement = db
            .prepare("SELECT id FROM responses ORDER BY rowid")
            .unwrap();
        let rows = statement.query_map([], |row| row.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    /// A store file in a directory of the test's own, gone with it.
    struct File(PathBuf);

    impl File {
        fn new(test: &str) -> File {
            let dir = std::env::temp_dir()
                .join(format!("agent-proxy-sqlite-{}-{test}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            File(dir)
        }

        fn path(&self) -> PathBuf {
            self.0.join("store.sqlite3")
        }
    }

    impl Drop for File {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A write into the batch, its outcome sent on `outcomes`.
    fn put_call(record: Record, outcomes: &std::sync::mpsc::Sender<bool>) -> Call {
        let outcomes = outcomes.clone();
        Call::Put(
            Arc::new(record),
            Box::new(move |written| {
                let _ = outcomes.send(written.is_ok());
            }),
        )
    }

    fn plan(db: &Connection, statement: &str, params: impl rusqlite::Params) -> Vec<String> {
        let mut explain = db
            .prepare(&format!("EXPLAIN QUERY PLAN {statement}"))
            .unwrap();
        let rows = explain.query_map(params, |row| row.get(3)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    /// The oldest rows go first, the expired among them only, a bounded
    /// number at a time.
    #[test]
    fn a_purge_deletes_the_expired_among_the_oldest_rows() {
        let file = File::new("oldest");
        let db = open(&file.path()).unwrap();
        let now = unix_now();
        for (id, expires_at) in [("a", now - 5), ("b", now), ("c", now + 60), ("d", now - 1)] {
            put(&db, &record(id, expires_at)).unwrap();
        }
        assert_eq!(oldest(&db, now, 1).unwrap(), 1);
        assert_eq!(ids(&db), ["b", "c", "d"]);
        // Two looked at (b, c): the live one stays, and so does d behind it.
        assert_eq!(oldest(&db, now, 2).unwrap(), 1);
        assert_eq!(ids(&db), ["c", "d"]);
        assert_eq!(oldest(&db, now, 10).unwrap(), 1);
        assert_eq!(ids(&db), ["c"]);
        // Written again, a row goes to the back, to expire as it now says.
        put(&db, &record("e", now - 1)).unwrap();
        put(&db, &record("c", now - 1)).unwrap();
        assert_eq!(ids(&db), ["e", "c"]);
        assert_eq!(oldest(&db, now, 10).unwrap(), 2);
        assert!(ids(&db).is_empty());
    }

    /// Every purge's statement goes by `rowid`: none reads the whole table
    /// or sorts it, however large it is.
    #[test]
    fn purges_look_rows_up_by_rowid() {
        let file = File::new("plans");
        let db = open(&file.path()).unwrap();
        assert_eq!(
            plan(&db, OLDEST, params![0, 1]),
            [
                "SEARCH responses USING INTEGER PRIMARY KEY (rowid=?)",
                "LIST SUBQUERY 1",
                "SCAN responses"
            ]
        );
        assert_eq!(
            plan(&db, SWEEP_END, params![0, 1]),
            [
                "CO-ROUTINE (subquery-1)",
                "SEARCH responses USING INTEGER PRIMARY KEY (rowid>?)",
                "SEARCH (subquery-1)"
            ]
        );
        assert_eq!(
            plan(&db, SWEEP_DELETE, params![0, 0, 1]),
            ["SEARCH responses USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)"]
        );
    }

    /// A backlog goes [`PURGE_LEAST`] rows a batch (at least), and the
    /// purge runs again at the next batch while it deleted as many as it
    /// might; once it finds fewer, it waits.
    #[test]
    fn batches_purge_as_they_write_until_nothing_is_due() {
        let file = File::new("batches");
        let mut db = open(&file.path()).unwrap();
        let now = unix_now();
        let backlog = PURGE_LEAST as usize + 8;
        let writing = db.transaction().unwrap();
        for n in 0..backlog {
            put(&writing, &record(&format!("old{n}"), now - 1)).unwrap();
        }
        writing.commit().unwrap();
        let (outcomes, written) = std::sync::mpsc::channel();
        let mut purge = Purge::default();
        let mut batch = vec![put_call(record("new1", now + 60), &outcomes)];
        serve_batch(&mut db, &mut batch, &mut purge);
        assert!(written.recv().unwrap());
        assert_eq!(ids(&db).len(), 8 + 1);
        assert_eq!(purge.next, 0, "as many deleted as allowed: more may be due");
        let mut batch = vec![put_call(record("new2", now + 60), &outcomes)];
        serve_batch(&mut db, &mut batch, &mut purge);
        assert!(written.recv().unwrap());
        assert_eq!(ids(&db), ["new1", "new2"]);
        assert!(purge.next >= now + PURGE_IDLE_SECONDS);
        // Not due: an expired row written meanwhile stays for now.
        put(&db, &record("old", now - 1)).unwrap();
        let mut batch = vec![put_call(record("new3", now + 60), &outcomes)];
        serve_batch(&mut db, &mut batch, &mut purge);
        assert!(written.recv().unwrap());
        assert_eq!(ids(&db), ["new1", "new2", "old", "new3"]);
    }

    /// After a reload lowers the TTL, newer rows expire before the older
    /// ones ahead of them: the sweep finds them, a stretch at a time, and
    /// starts again from the oldest past the newest.
    #[test]
    fn a_sweep_finds_what_expired_behind_longer_lived_rows() {
        let file = File::new("sweep");
        let mut db = open(&file.path()).unwrap();
        let now = unix_now();
        // More long-lived rows than the oldest rows a purge looks at.
        let long = PURGE_LEAST as usize;
        let writing = db.transaction().unwrap();
        for n in 0..long {
            put(&writing, &record(&format!("long{n}"), now + 60)).unwrap();
        }
        put(&writing, &record("short1", now - 1)).unwrap();
        put(&writing, &record("short2", now - 1)).unwrap();
        writing.commit().unwrap();
        let mut purge = Purge::default();
        purge.run(&db, now, 1);
        assert_eq!(ids(&db).len(), long);
        assert!(purge.next >= now + PURGE_IDLE_SECONDS);
        assert_eq!(
            purge.swept,
            long as i64 + 2,
            "looked at up to the newest row"
        );
        // A row written now takes the rowid after the newest left (a
        // deleted one's): the next sweep finds nothing past where the last
        // stopped, and the one after starts again from the oldest.
        put(&db, &record("short3", now - 1)).unwrap();
        assert_eq!(sweep(&db, now, purge.swept).unwrap(), 0);
        assert_eq!(ids(&db).len(), long + 1);
        assert_eq!(sweep(&db, now, 0).unwrap(), long as i64 + 1);
        assert_eq!(ids(&db).len(), long);
        assert!(ids(&db).iter().all(|id| id.starts_with("long")));
    }

    /// A file an earlier version made loses its `expires_at` index, which
    /// every write paid for; its rows stay.
    #[test]
    fn an_earlier_versions_expiry_index_is_dropped() {
        let file = File::new("earlier");
        {
            let db = open(&file.path()).unwrap();
            put(&db, &record("kept", unix_now() + 60)).unwrap();
            db.execute_batch("CREATE INDEX responses_expires_at ON responses (expires_at)")
                .unwrap();
        }
        let db = open(&file.path()).unwrap();
        let indexes: i64 = db
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'responses_expires_at'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(indexes, 0);
        assert_eq!(ids(&db), ["kept"]);
    }
}
