//! A knowledge base's index in Postgres with pgvector, shared by every
//! replica (`index: { kind: postgres, url }`).
//!
//! One table per base and embedding model, one row per chunk (its source,
//! a hash of its text, the text, the vector), an HNSW index for cosine
//! distance made once the rows are in. A build brings the table to the
//! chunks of the current sources: rows already there are kept (the table
//! is its own embeddings cache, so a second replica building the same
//! sources embeds nothing), missing ones are embedded and inserted, stale
//! ones deleted. Every statement is idempotent, so replicas that build at
//! once agree.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use pgvector::Vector;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::index::{text_hash, Chunk};

/// pgvector's HNSW index takes vectors up to this size; larger ones are
/// searched by a scan.
const HNSW_MAX_DIMS: usize = 2000;
/// Candidates an HNSW search keeps (pgvector's default is 40). On
/// `bench/knowledge.py`'s 10k chunks, recall@5 and the cost per request:
/// 40: 0.80, 1.5 ms; 100: 0.92, 2.2 ms; 200: 0.98-1.00, 3.5-4.2 ms. Next to a model's
/// seconds, recall is worth the milliseconds.
const EF_SEARCH: usize = 200;
/// Taken around every schema change, by every replica and base.
const DDL_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('agent-proxy knowledge schema'))";
/// Connections to Postgres per base and process.
const POOL_SIZE: usize = 4;
/// Connecting, and waiting for a pooled connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A base's table, through a small pool.
#[derive(Clone)]
pub struct Shared {
    pool: Pool,
    /// The latest build's number: shared with the same table's `Shared` in
    /// the config a reload makes, so an older build can tell it is stale.
    generation: Arc<AtomicU64>,
    url: String,
    ca_file: Option<PathBuf>,
    /// Quoted: `"agent_proxy_kb_<base>_<hash>"`, and its HNSW index's.
    table: String,
    index: String,
}

impl Shared {
    /// Connections are made when first used. `url` was checked with the
    /// config; `ca_file`, read here, replaces the system's roots.
    pub fn new(
        url: &str,
        ca_file: Option<&Path>,
        base: &str,
        model_key: &str,
    ) -> Result<Shared, String> {
        let name = table_name(base, model_key);
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| format!("not a valid Postgres URL ({e})"))?;
        config.connect_timeout(CONNECT_TIMEOUT);
        config.application_name("agent-proxy");
        let manager = Manager::from_config(
            config,
            tls(ca_file)?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .post_create(Hook::async_fn(|client, _| {
                Box::pin(async move {
                    client
                        .batch_execute(&format!("SET hnsw.ef_search = {EF_SEARCH}"))
                        .await
                        .map_err(HookError::Backend)
                })
            }))
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Shared {
            pool,
            generation: Arc::default(),
            url: url.to_owned(),
            ca_file: ca_file.map(Path::to_owned),
            table: quote(&name),
            index: quote(&format!("{name}_hnsw")),
        })
    }

    /// Whether this is the same table on the same server, reached the same
    /// way (a reload keeps the pool).
    pub fn same_as(&self, url: &str, ca_file: Option<&Path>, base: &str, model_key: &str) -> bool {
        self.url == url
            && self.ca_file.as_deref() == ca_file
            && self.table == quote(&table_name(base, model_key))
    }

    /// A new build's number.
    pub fn begin(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Whether no build began after `generation`.
    pub fn is_current(&self, generation: u64) -> bool {
        self.generation.load(Ordering::SeqCst) == generation
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, String> {
        self.pool.get().await.map_err(|e| format!("postgres: {e}"))
    }

    async fn exists(&self, client: &deadpool_postgres::Object) -> Result<bool, String> {
        let found: Option<String> = client
            .query_one("SELECT to_regclass($1)::text", &[&self.table])
            .await
            .map_err(error)?
            .get(0);
        Ok(found.is_some())
    }

    /// For each chunk (with its text's hash), whether the table holds it
    /// (none before the table is made), and how many rows it holds.
    pub async fn present(
        &self,
        chunks: &[Chunk],
        hashes: &[String],
    ) -> Result<(Vec<bool>, usize), String> {
        let client = self.client().await?;
        if !self.exists(&client).await? {
            return Ok((vec![false; chunks.len()], 0));
        }
        let rows = client
            .query(&format!("SELECT source, hash FROM {}", self.table), &[])
            .await
            .map_err(error)?;
        let held: HashSet<(String, String)> =
            rows.iter().map(|row| (row.get(0), row.get(1))).collect();
        let present = chunks
            .iter()
            .zip(hashes)
            .map(|(c, hash)| held.contains(&(c.source.clone(), hash.clone())))
            .collect();
        Ok((present, held.len()))
    }

    /// Makes the extension and the table, sized for vectors of `dims`, if
    /// they are not there: once per build, before its first insert.
    pub async fn create(&self, dims: usize) -> Result<(), String> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(error)?;
        // Replicas (and bases) may make the extension and tables at once:
        // `IF NOT EXISTS` is not safe then, so one at a time.
        transaction.batch_execute(DDL_LOCK).await.map_err(error)?;
        transaction
            .batch_execute(&self.schema(dims))
            .await
            .map_err(|e| match e.as_db_error() {
                Some(db) if db.message().contains("vector") => format!(
                    "postgres: {} (is the pgvector extension installed on the server?)",
                    db.message()
                ),
                _ => error(e),
            })?;
        transaction.commit().await.map_err(error)
    }

    /// Inserts `chunks` (with their texts' hashes) and their `vectors`, in
    /// one statement: the rows as arrays.
    pub async fn insert(
        &self,
        chunks: &[&Chunk],
        hashes: &[&str],
        vectors: Vec<Vec<f32>>,
    ) -> Result<(), String> {
        let sources: Vec<&str> = chunks.iter().map(|c| c.source.as_str()).collect();
        let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
        let vectors: Vec<Vector> = vectors.into_iter().map(Vector::from).collect();
        self.client()
            .await?
            .execute(
                &format!(
                    "INSERT INTO {} (source, hash, text, embedding)
                     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::vector[])
                     ON CONFLICT (source, hash) DO NOTHING",
                    self.table
                ),
                &[&sources, &hashes, &texts, &vectors],
            )
            .await
            .map_err(error)?;
        Ok(())
    }

    fn schema(&self, dims: usize) -> String {
        let table = &self.table;
        format!(
            "CREATE EXTENSION IF NOT EXISTS vector;
             CREATE TABLE IF NOT EXISTS {table} (
                 source TEXT NOT NULL,
                 hash TEXT NOT NULL,
                 text TEXT NOT NULL,
                 embedding vector({dims}) NOT NULL,
                 PRIMARY KEY (source, hash)
             );"
        )
    }

    /// Ends a build: with `prune`, deletes the rows that are not among
    /// `chunks` (with their texts' hashes); indexes the table; returns how
    /// many rows it holds.
    pub async fn finish(
        &self,
        chunks: &[Chunk],
        hashes: &[String],
        prune: bool,
    ) -> Result<usize, String> {
        let mut client = self.client().await?;
        if !self.exists(&client).await? {
            return Ok(0);
        }
        if prune {
            let sources: Vec<&str> = chunks.iter().map(|c| c.source.as_str()).collect();
            client
                .execute(
                    &format!(
                        "DELETE FROM {} t WHERE NOT EXISTS (
                             SELECT 1 FROM unnest($1::text[], $2::text[]) AS k(source, hash)
                             WHERE k.source = t.source AND k.hash = t.hash)",
                        self.table
                    ),
                    &[&sources, &hashes],
                )
                .await
                .map_err(error)?;
        }
        // The HNSW index is made once the rows are in: built in one pass,
        // much faster than kept up to date row by row.
        let dims: i32 = client
            .query_one(
                "SELECT atttypmod FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'embedding'",
                &[&self.table],
            )
            .await
            .map_err(error)?
            .get(0);
        if usize::try_from(dims).is_ok_and(|dims| dims <= HNSW_MAX_DIMS) {
            let transaction = client.transaction().await.map_err(error)?;
            transaction.batch_execute(DDL_LOCK).await.map_err(error)?;
            transaction
                .batch_execute(&format!(
                    "CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding vector_cosine_ops)",
                    self.index, self.table
                ))
                .await
                .map_err(error)?;
            transaction.commit().await.map_err(error)?;
        }
        let left: i64 = client
            .query_one(&format!("SELECT count(*) FROM {}", self.table), &[])
            .await
            .map_err(error)?
            .get(0);
        Ok(usize::try_from(left).unwrap_or(0))
    }

    /// The `k` chunks nearest to `query` by cosine, with their similarity,
    /// best first.
    pub async fn search(&self, query: &[f32], k: usize) -> Result<Vec<(Chunk, f32)>, String> {
        let client = self.client().await?;
        let query = Vector::from(query.to_vec());
        let limit = i64::try_from(k).unwrap_or(i64::MAX);
        let rows = client
            .query(
                &format!(
                    "SELECT source, text, (1 - (embedding <=> $1))::real FROM {}
                     ORDER BY embedding <=> $1 LIMIT $2",
                    self.table
                ),
                &[&query, &limit],
            )
            .await
            .map_err(error)?;
        Ok(rows
            .iter()
            .map(|row| {
                let chunk = Chunk {
                    source: row.get(0),
                    text: row.get(1),
                };
                (chunk, row.get::<_, f32>(2))
            })
            .collect())
    }
}

/// TLS as the URL's `sslmode` asks (`prefer` by default, `require`), the
/// server's certificate checked against `ca_file`'s roots or the system's.
fn tls(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, String> {
    static SYSTEM: OnceLock<Arc<rustls::RootCertStore>> = OnceLock::new();
    let roots = match ca_file {
        Some(path) => Arc::new(crate::http_client::ca_roots(&path.to_string_lossy())?.0),
        None => SYSTEM
            .get_or_init(|| {
                let mut roots = rustls::RootCertStore::empty();
                // Unreadable system certificates leave TLS to fail, not the config.
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
                Arc::new(roots)
            })
            .clone(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The server's message, without the connection's details.
fn error(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("postgres: {}", db.message()),
        None => format!("postgres: {e}"),
    }
}

/// `agent_proxy_kb_<base>_<8 hex of the base's exact name and the model
/// key>`, within Postgres's 63 bytes with `_hnsw` added: bases whose names
/// differ only in case or punctuation get tables of their own.
fn table_name(base: &str, model_key: &str) -> String {
    let readable: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    let hash = text_hash(&format!("{base}\0{model_key}"));
    format!("agent_proxy_kb_{readable}_{}", &hash[..8])
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_safe_identifiers_per_base_and_model() {
        let quoted = |base: &str, key: &str| quote(&table_name(base, key));
        let name = quoted("Hand-Book \"x\"; DROP", "m@local");
        assert!(name.starts_with("\"agent_proxy_kb_hand_book__x___drop_"));
        assert!(name.len() <= 63 + 2);
        assert_ne!(name, quoted("Hand-Book \"x\"; DROP", "other@local"));
        assert_ne!(quoted("Docs", "m"), quoted("docs", "m"));
        assert_ne!(quoted("docs-v2", "m"), quoted("docs_v2", "m"));
        assert!(quoted(&"b".repeat(200), "m").len() <= 63 + 2);
        // Its index's name fits too.
        assert!(table_name(&"b".repeat(200), "m").len() + "_hnsw".len() <= 63);
    }
}
