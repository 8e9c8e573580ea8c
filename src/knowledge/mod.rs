//! Knowledge bases (`knowledge_bases:`): documents an agent searches with
//! its `search_knowledge` tool, or that are searched for it before each
//! request (`knowledge_auto`).
//!
//! A base is built in the background once its config is loaded: its
//! sources are read and cut into chunks (`chunk`), and each chunk is
//! embedded on an upstream (`embed`) unless it already was. Embedded (the
//! default), the embeddings cache beside the config remembers vectors (by
//! model and a hash of the text: `index::Cache`), and the chunks and unit
//! vectors become an in-memory `Index` searched exactly. Shared (`index:
//! { kind: postgres }`), a pgvector table every replica reads is brought to
//! the sources (`postgres`). A reload builds every base again from its
//! sources: only new or changed chunks cost an embedding call, and the
//! previous index keeps answering until the new one is ready. Progress is
//! logged and shown on `/readyz`; a base that is not ready yet is left out
//! of a search, and the model is told so.

mod chunk;
mod embed;
pub mod index;
mod postgres;
mod source;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde_json::{json, Value};
use tracing::{info, warn};

use crate::config::file::{IndexKind, KnowledgeBaseFile};
use crate::config::Config;
use crate::conversation::{Conversation, FunctionTool, Item, Part, Role};
use crate::tools::{capped_text, parse_arguments, CallContext, Outcome, Run};
use crate::upstream::Upstream;
use index::{Cache, Chunk, Index};
pub use source::is_url;

/// Chunks one search returns at most.
const MAX_TOP_K: usize = 20;
/// The largest search result handed to the model.
const MAX_RESULT_BYTES: usize = 32 * 1024;
/// How often a build logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(2);
/// A failed build is tried again after this, then twice as long each time.
const RETRY_FIRST: Duration = Duration::from_secs(10);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// One base's search, the query's embedding included.
const SEARCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a base's build is.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    Pending,
    Building { embedded: usize, total: usize },
    Ready,
    Failed(String),
}

pub struct KnowledgeBase {
    pub name: String,
    spec: KnowledgeBaseFile,
    /// The config file's directory: sources and the cache are relative to it.
    base_dir: PathBuf,
    upstream: Arc<Upstream>,
    store: Store,
    progress: Mutex<Progress>,
    started: AtomicBool,
}

/// Where a base's vectors are searched.
enum Store {
    /// In this process: the last index built (a previous config's while
    /// this one's first build runs).
    Embedded(ArcSwapOption<Index>),
    /// A Postgres table every replica shares, and how many chunks it held
    /// when last seen (searched once it holds any).
    Shared(postgres::Shared, AtomicUsize),
}

impl KnowledgeBase {
    /// The base `spec` describes; `previous` (the same name in the config a
    /// reload replaces) lends its index (or its connections) until this
    /// one's is built, if its vectors are of the same embedding model.
    pub fn from_file(
        name: &str,
        spec: KnowledgeBaseFile,
        upstream: Arc<Upstream>,
        base_dir: &Path,
        previous: Option<&KnowledgeBase>,
    ) -> Result<KnowledgeBase, String> {
        let key = model_key(&spec, &upstream);
        let same_model = previous
            .filter(|p| p.spec.embedding == spec.embedding && p.upstream.name == upstream.name);
        let store = match (spec.index.kind, spec.index.url.as_deref()) {
            (IndexKind::Postgres, Some(url)) => {
                let ca_file = spec.index.ca_file.as_ref().map(|f| base_dir.join(f));
                let ca_file = ca_file.as_deref();
                let kept = same_model.and_then(|p| match &p.store {
                    Store::Shared(shared, rows) if shared.same_as(url, ca_file, name, &key) => {
                        Some((shared.clone(), rows.load(Ordering::Relaxed)))
                    }
                    _ => None,
                });
                let (shared, rows) = match kept {
                    Some(kept) => kept,
                    None => (postgres::Shared::new(url, ca_file, name, &key)?, 0),
                };
                Store::Shared(shared, AtomicUsize::new(rows))
            }
            _ => Store::Embedded(ArcSwapOption::new(same_model.and_then(
                |p| match &p.store {
                    Store::Embedded(serving) => serving.load_full(),
                    Store::Shared(..) => None,
                },
            ))),
        };
        Ok(KnowledgeBase {
            name: name.to_owned(),
            spec,
            base_dir: base_dir.to_owned(),
            upstream,
            store,
            progress: Mutex::new(Progress::Pending),
            started: AtomicBool::new(false),
        })
    }

    pub fn progress(&self) -> Progress {
        self.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_progress(&self, progress: Progress) {
        *self.progress.lock().unwrap_or_else(PoisonError::into_inner) = progress;
    }

    /// Chunks searches see now.
    fn serving_chunks(&self) -> usize {
        match &self.store {
            Store::Embedded(serving) => serving.load().as_ref().map_or(0, |index| index.len()),
            Store::Shared(_, rows) => rows.load(Ordering::Relaxed),
        }
    }

    /// What `/readyz` shows of it.
    pub fn status(&self) -> Value {
        let chunks = self.serving_chunks();
        match self.progress() {
            Progress::Pending => json!({"status": "pending", "chunks": chunks}),
            Progress::Building { embedded, total } => {
                json!({"status": "building", "embedded": embedded, "total": total, "serving_chunks": chunks})
            }
            Progress::Ready => json!({"status": "ready", "chunks": chunks}),
            Progress::Failed(reason) => {
                json!({"status": "failed", "reason": reason, "serving_chunks": chunks})
            }
        }
    }

    /// Builds the index (once per base object; a reload makes new ones),
    /// trying again with backoff while it fails and the base is in use.
    pub async fn build(self: Arc<Self>) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut backoff = RETRY_FIRST;
        loop {
            let started = Instant::now();
            match self.build_once().await {
                Ok(chunks) => {
                    info!(base = %self.name, chunks, seconds = started.elapsed().as_secs_f64(), "knowledge base ready");
                    self.set_progress(Progress::Ready);
                    return;
                }
                Err(BuildError::Superseded) => {
                    info!(base = %self.name, "knowledge base build left to the newer config's");
                    return;
                }
                Err(BuildError::Failed(reason)) => {
                    warn!(base = %self.name, %reason, retry_in_seconds = backoff.as_secs(), "knowledge base not built");
                    self.set_progress(Progress::Failed(reason));
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_MAX);
            // Only this task holds it: a reload replaced it, the new one builds.
            if Arc::strong_count(&self) == 1 {
                return;
            }
        }
    }

    async fn build_once(&self) -> Result<usize, BuildError> {
        let (chunks, hashes, unread) = self.read_chunks().await?;
        match &self.store {
            Store::Embedded(serving) => Ok(self.build_embedded(chunks, hashes, serving).await?),
            Store::Shared(shared, rows) => {
                self.build_shared(chunks, hashes, unread, shared, rows)
                    .await
            }
        }
    }

    /// The chunks of the current sources, their texts' hashes (the keys of
    /// their vectors), and how many sources could not be read. Reading,
    /// chunking and hashing block: off the runtime.
    async fn read_chunks(&self) -> Result<(Vec<Chunk>, Vec<String>, usize), String> {
        let (sources, base_dir, size, overlap) = (
            self.spec.sources.clone(),
            self.base_dir.clone(),
            self.spec.chunk.size,
            self.spec.chunk.overlap,
        );
        let name = self.name.clone();
        let (fetched, not_fetched) = source::fetch_urls(&self.name, &self.spec.sources).await;
        tokio::task::spawn_blocking(move || {
            let (mut documents, unread) = source::read_files(&name, &base_dir, &sources);
            documents.extend(fetched);
            let chunks: Vec<Chunk> = documents
                .into_iter()
                .flat_map(|document| {
                    let label = document.label;
                    chunk::chunks(&document.text, size, overlap)
                        .into_iter()
                        .map(move |text| Chunk {
                            source: label.clone(),
                            text,
                        })
                })
                .collect();
            let hashes = chunks.iter().map(|c| index::text_hash(&c.text)).collect();
            (chunks, hashes, unread + not_fetched)
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// Embeds the chunks at `batch` (indexes into `chunks`).
    async fn embed(&self, chunks: &[Chunk], batch: &[usize]) -> Result<Vec<Vec<f32>>, String> {
        let inputs: Vec<String> = batch.iter().map(|&i| chunks[i].text.clone()).collect();
        embed::embed(
            &self.upstream,
            self.spec.embedding.model.as_deref(),
            &inputs,
        )
        .await
    }

    /// In memory, with the embeddings cache: returns the chunks indexed.
    async fn build_embedded(
        &self,
        chunks: Vec<Chunk>,
        hashes: Vec<String>,
        serving: &ArcSwapOption<Index>,
    ) -> Result<usize, String> {
        let cache_path = self.base_dir.join(&self.spec.path);
        let key = model_key(&self.spec, &self.upstream);
        let lookup = key.clone();
        let (hashes, mut vectors, mut cache) = tokio::task::spawn_blocking(move || {
            let cache = Cache::open(&cache_path)
                .map_err(|e| format!("embeddings cache {}: {e}", cache_path.display()))?;
            let vectors = hashes
                .iter()
                .map(|hash| cache.get(&lookup, hash))
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(|e| format!("embeddings cache: {e}"))?;
            Ok::<_, String>((hashes, vectors, cache))
        })
        .await
        .map_err(|e| e.to_string())??;
        let missing: Vec<usize> = (0..chunks.len())
            .filter(|&i| vectors[i].is_none())
            .collect();
        let mut tally = Tally::start(self, chunks.len(), missing.len());
        for batch in missing.chunks(embed::BATCH) {
            let got = self.embed(&chunks, batch).await?;
            let rows: Vec<(String, Vec<f32>)> = batch
                .iter()
                .zip(&got)
                .map(|(&i, vector)| (hashes[i].clone(), vector.clone()))
                .collect();
            let key = key.clone();
            let kept;
            (cache, kept) = tokio::task::spawn_blocking(move || {
                let kept = cache.put(&key, &rows);
                (cache, kept)
            })
            .await
            .map_err(|e| e.to_string())?;
            if let Err(e) = kept {
                // A cache that cannot be written costs the next build time, not this one.
                warn!(base = %self.name, error = %e, "embeddings not cached");
            }
            for (&i, vector) in batch.iter().zip(got) {
                vectors[i] = Some(vector);
            }
            tally.add(self, batch.len());
        }
        let vectors: Vec<Vec<f32>> = vectors.into_iter().flatten().collect();
        let dims = vectors.first().map_or(0, Vec::len);
        if vectors.iter().any(|v| v.len() != dims) {
            return Err(
                "the embeddings have different sizes: was the model changed? Set `embedding.model`"
                    .into(),
            );
        }
        let index = Index::new(chunks, vectors);
        info!(base = %self.name, mib = index.bytes() >> 20, "knowledge index in memory");
        let len = index.len();
        serving.store(Some(Arc::new(index)));
        Ok(len)
    }

    /// In the shared table: what it lacks is embedded and inserted, what
    /// the sources no longer have is deleted (unless a source could not be
    /// read: its rows may be another replica's). Returns the rows left.
    async fn build_shared(
        &self,
        chunks: Vec<Chunk>,
        hashes: Vec<String>,
        unread: usize,
        shared: &postgres::Shared,
        rows: &AtomicUsize,
    ) -> Result<usize, BuildError> {
        // A reload of this process starts another build on the same table:
        // from then on, this one stops writing.
        let generation = shared.begin();
        let (present, held) = shared.present(&chunks, &hashes).await?;
        // What another replica (or an earlier run) built is searched meanwhile.
        rows.store(held, Ordering::Relaxed);
        let missing: Vec<usize> = (0..chunks.len()).filter(|&i| !present[i]).collect();
        let mut tally = Tally::start(self, chunks.len(), missing.len());
        let mut created = false;
        for batch in missing.chunks(embed::BATCH) {
            let got = self.embed(&chunks, batch).await?;
            if !shared.is_current(generation) {
                return Err(BuildError::Superseded);
            }
            if !created {
                shared.create(got.first().map_or(0, Vec::len)).await?;
                created = true;
            }
            let batch_chunks: Vec<&Chunk> = batch.iter().map(|&i| &chunks[i]).collect();
            let batch_hashes: Vec<&str> = batch.iter().map(|&i| hashes[i].as_str()).collect();
            shared.insert(&batch_chunks, &batch_hashes, got).await?;
            rows.fetch_add(batch.len(), Ordering::Relaxed);
            tally.add(self, batch.len());
        }
        if !shared.is_current(generation) {
            return Err(BuildError::Superseded);
        }
        if unread > 0 {
            warn!(base = %self.name, unread, "knowledge base: rows of sources no longer listed kept, as a source could not be read");
        }
        let left = shared.finish(&chunks, &hashes, unread == 0).await?;
        rows.store(left, Ordering::Relaxed);
        Ok(left)
    }

    /// The `k` best chunks for `query`, or why there are none.
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Hit>, String> {
        let embedded = match &self.store {
            Store::Embedded(serving) => serving.load_full(),
            Store::Shared(..) => None,
        };
        if embedded.is_none() && self.serving_chunks() == 0 {
            return Err(match self.progress() {
                Progress::Building { embedded, total } => format!(
                    "knowledge base `{}` is still being built ({embedded}/{total} chunks embedded)",
                    self.name
                ),
                Progress::Failed(reason) => {
                    format!("knowledge base `{}` is unavailable: {reason}", self.name)
                }
                Progress::Ready => format!("knowledge base `{}` is empty", self.name),
                Progress::Pending => format!("knowledge base `{}` is still being built", self.name),
            });
        }
        let seconds = |phase: &str, started: Instant| {
            crate::metrics::metrics()
                .knowledge_seconds
                .with_label_values(&[self.name.as_str(), phase])
                .observe(started.elapsed().as_secs_f64());
        };
        let started = Instant::now();
        let model = self.spec.embedding.model.as_deref();
        let query = embed::embed(&self.upstream, model, &[query.to_owned()])
            .await?
            .pop()
            .unwrap_or_default();
        seconds("embed", started);
        let started = Instant::now();
        let found = match (&self.store, embedded) {
            (Store::Shared(shared, _), _) => shared.search(&query, k).await?,
            (Store::Embedded(_), Some(index)) => tokio::task::spawn_blocking(move || {
                index
                    .search(&query, k)
                    .into_iter()
                    .map(|(chunk, score)| (chunk.clone(), score))
                    .collect()
            })
            .await
            .map_err(|e| e.to_string())?,
            (Store::Embedded(_), None) => Vec::new(),
        };
        seconds("search", started);
        Ok(found
            .into_iter()
            .map(|(chunk, score)| Hit {
                base: self.name.clone(),
                chunk,
                score,
            })
            .collect())
    }
}

/// The embeddings' key: another model (or another server's) makes other
/// vectors.
fn model_key(spec: &KnowledgeBaseFile, upstream: &Upstream) -> String {
    format!(
        "{}@{}",
        spec.embedding.model.as_deref().unwrap_or(""),
        upstream.name
    )
}

/// Why a build stopped.
enum BuildError {
    /// A newer build of the same base (a reload) took over.
    Superseded,
    Failed(String),
}

impl From<String> for BuildError {
    fn from(reason: String) -> Self {
        BuildError::Failed(reason)
    }
}

/// A build's embedding progress, on `/readyz` and in the log.
struct Tally {
    total: usize,
    embedded: usize,
    started: Instant,
    logged: Instant,
}

impl Tally {
    fn start(base: &KnowledgeBase, chunks: usize, total: usize) -> Tally {
        info!(base = %base.name, chunks, cached = chunks - total, to_embed = total, "building knowledge base");
        base.set_progress(Progress::Building { embedded: 0, total });
        Tally {
            total,
            embedded: 0,
            started: Instant::now(),
            logged: Instant::now(),
        }
    }

    fn add(&mut self, base: &KnowledgeBase, embedded: usize) {
        self.embedded += embedded;
        let (embedded, total) = (self.embedded, self.total);
        base.set_progress(Progress::Building { embedded, total });
        if self.logged.elapsed() >= LOG_EVERY {
            self.logged = Instant::now();
            let rate = embedded as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
            info!(base = %base.name, embedded, total, per_second = rate.round(), "embedding knowledge base");
        }
    }
}

/// A chunk found for a query.
struct Hit {
    base: String,
    chunk: Chunk,
    score: f32,
}

/// The best `k` chunks across `bases`, and a note for each base that could
/// not be searched.
async fn search_all(
    bases: &[Arc<KnowledgeBase>],
    query: &str,
    k: usize,
) -> (Vec<Hit>, Vec<String>) {
    let searches = bases.iter().map(|base| async move {
        tokio::time::timeout(SEARCH_TIMEOUT, base.search(query, k))
            .await
            .unwrap_or_else(|_| Err(format!("knowledge base `{}` timed out", base.name)))
    });
    let mut hits = Vec::new();
    let mut notes = Vec::new();
    for result in futures::future::join_all(searches).await {
        match result {
            Ok(found) => hits.extend(found),
            Err(note) => notes.push(note),
        }
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    hits.truncate(k);
    (hits, notes)
}

fn render(hits: &[Hit]) -> String {
    hits.iter()
        .enumerate()
        .map(|(i, hit)| {
            format!(
                "[{}] {} / {} (score {:.3})\n{}",
                i + 1,
                hit.base,
                hit.chunk.source,
                hit.score,
                hit.chunk.text
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// `search_knowledge` over an agent's bases.
pub struct SearchTool {
    bases: Vec<Arc<KnowledgeBase>>,
}

impl SearchTool {
    pub fn definition(bases: &[Arc<KnowledgeBase>]) -> (FunctionTool, Arc<dyn Run>) {
        let names: Vec<&str> = bases.iter().map(|b| b.name.as_str()).collect();
        let definition = FunctionTool::function(
            "search_knowledge",
            &format!(
                "Search the knowledge base ({}) for passages relevant to a question; returns the best passages with their source and score.",
                names.join(", ")
            ),
            &json!({"type": "object", "properties": {
                "query": {"type": "string", "description": "What to look for, as a question or keywords"},
                "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K, "description": "How many passages"}
            }, "required": ["query"]}),
        );
        let tool = SearchTool {
            bases: bases.to_vec(),
        };
        (definition, Arc::new(tool))
    }
}

#[async_trait]
impl Run for SearchTool {
    async fn run(&self, arguments: &str, _ctx: &CallContext) -> Outcome {
        let arguments = match parse_arguments(arguments) {
            Ok(arguments) => arguments,
            Err(outcome) => return outcome,
        };
        let Some(query) = arguments
            .get("query")
            .and_then(Value::as_str)
            .filter(|q| !q.trim().is_empty())
        else {
            return Outcome::error("`query` (a non-empty string) is required");
        };
        let k = arguments
            .get("top_k")
            .and_then(Value::as_u64)
            .map_or_else(|| default_k(&self.bases), |k| k as usize)
            .clamp(1, MAX_TOP_K);
        let (hits, notes) = search_all(&self.bases, query, k).await;
        if hits.is_empty() && !notes.is_empty() {
            return Outcome::error(notes.join("; "));
        }
        let mut text = if hits.is_empty() {
            "nothing found".to_owned()
        } else {
            render(&hits)
        };
        if !notes.is_empty() {
            text.push_str(&format!("\n\n(incomplete: {})", notes.join("; ")));
        }
        Outcome::success(capped_text(text.as_bytes(), MAX_RESULT_BYTES, false))
    }
}

fn default_k(bases: &[Arc<KnowledgeBase>]) -> usize {
    bases.iter().map(|b| b.spec.top_k).max().unwrap_or(5)
}

/// `knowledge_auto`: the best chunks for the last user message go in front
/// of it, delimited. In the user message rather than the system prompt, so
/// the prompt before it (the cache's) stays the same from turn to turn.
pub async fn retrieve_into(bases: &[Arc<KnowledgeBase>], conversation: &mut Conversation) {
    let Some(message) = conversation
        .items
        .iter_mut()
        .rev()
        .find_map(|item| match item {
            Item::Message(m) if m.role == Role::User => Some(m),
            _ => None,
        })
    else {
        return;
    };
    let question = message.text_content();
    if question.trim().is_empty() {
        return;
    }
    let (hits, notes) = search_all(bases, &question, default_k(bases)).await;
    for note in &notes {
        warn!(note = %note, "knowledge not retrieved");
    }
    if hits.is_empty() {
        return;
    }
    let block = format!(
        "<knowledge>\nPassages from the knowledge base that may help answer the message after this block:\n\n{}\n</knowledge>\n\n",
        render(&hits)
    );
    message.content.insert(0, Part::Text(block));
}

/// Starts the build of every base of the current config that has not
/// started (at start, and after each reload; nothing wakes it in between).
pub struct KnowledgeBuilder {
    config: Arc<ArcSwap<Config>>,
}

impl KnowledgeBuilder {
    pub fn new(config: Arc<ArcSwap<Config>>) -> Self {
        KnowledgeBuilder { config }
    }
}

#[async_trait]
impl BackgroundService for KnowledgeBuilder {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let config = self.config.load_full();
            for base in config.knowledge_bases.values() {
                if !base.started.load(Ordering::SeqCst) {
                    tokio::spawn(base.clone().build());
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = config.superseded.wait() => {}
            }
        }
    }
}
