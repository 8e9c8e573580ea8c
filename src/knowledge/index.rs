//! The searchable index of a knowledge base (chunks and their unit
//! vectors, searched exactly by cosine similarity), and the embeddings
//! cache that makes a rebuild embed only what changed: SQLite, keyed by the
//! embedding model and a hash of the chunk's text.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

/// One piece of a document.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// The file it came from, as the config names it (relative path).
    pub source: String,
    pub text: String,
}

/// Chunks and their vectors, row by row in one contiguous matrix.
#[derive(Debug, Default)]
pub struct Index {
    chunks: Vec<Chunk>,
    dims: usize,
    vectors: Vec<f32>,
}

impl Index {
    /// An index of `chunks` with their `vectors` (same order, same length,
    /// normalized here).
    pub fn new(chunks: Vec<Chunk>, vectors: Vec<Vec<f32>>) -> Index {
        let dims = vectors.first().map_or(0, Vec::len);
        let mut matrix = Vec::with_capacity(dims * vectors.len());
        for mut vector in vectors {
            normalize(&mut vector);
            matrix.extend_from_slice(&vector);
        }
        Index {
            chunks,
            dims,
            vectors: matrix,
        }
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The `k` chunks most similar to `query` (cosine), best first. A query
    /// of another dimension than the index's finds nothing.
    pub fn search(&self, query: &[f32], k: usize) -> Vec<(&Chunk, f32)> {
        if query.len() != self.dims || self.dims == 0 {
            return Vec::new();
        }
        let mut query = query.to_vec();
        normalize(&mut query);
        let mut scored: Vec<(usize, f32)> = self
            .vectors
            .chunks_exact(self.dims)
            .map(|row| dot(row, &query))
            .enumerate()
            .collect();
        let k = k.min(scored.len());
        if k == 0 {
            return Vec::new();
        }
        scored.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        scored.truncate(k);
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored
            .into_iter()
            .map(|(i, score)| (&self.chunks[i], score))
            .collect()
    }

    /// Bytes held: texts and vectors.
    pub fn bytes(&self) -> usize {
        self.chunks
            .iter()
            .map(|c| c.text.len() + c.source.len())
            .sum::<usize>()
            + self.vectors.len() * 4
    }
}

/// `a · b`, in eight lanes: a float sum in one chain cannot be reordered
/// by the compiler, eight independent ones become SIMD.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

/// The cache key of a chunk's text.
pub fn text_hash(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Embeddings already computed, by model and text hash. Blocking: used from
/// `spawn_blocking`.
pub struct Cache(Connection);

impl Cache {
    pub fn open(path: &Path) -> rusqlite::Result<Cache> {
        let db = crate::store::open_sqlite(
            path,
            "CREATE TABLE IF NOT EXISTS embeddings (
                model TEXT NOT NULL,
                hash TEXT NOT NULL,
                vector BLOB NOT NULL,
                PRIMARY KEY (model, hash)
            );",
        )?;
        Ok(Cache(db))
    }

    pub fn get(&self, model: &str, hash: &str) -> rusqlite::Result<Option<Vec<f32>>> {
        self.0
            .prepare_cached("SELECT vector FROM embeddings WHERE model = ?1 AND hash = ?2")?
            .query_row(params![model, hash], |row| row.get::<_, Vec<u8>>(0))
            .optional()
            .map(|blob| blob.map(|b| from_blob(&b)))
    }

    /// Keeps `vectors` (by text hash) in one transaction.
    pub fn put(&mut self, model: &str, vectors: &[(String, Vec<f32>)]) -> rusqlite::Result<()> {
        let transaction = self.0.transaction()?;
        {
            let mut insert = transaction.prepare_cached(
                "INSERT OR REPLACE INTO embeddings (model, hash, vector) VALUES (?1, ?2, ?3)",
            )?;
            for (hash, vector) in vectors {
                insert.execute(params![model, hash, to_blob(vector)])?;
            }
        }
        transaction.commit()
    }
}

/// Little-endian f32s.
pub fn to_blob(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn from_blob(blob: &[u8]) -> Vec<f32> {
    blob.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chunk(text: &str) -> Chunk {
        Chunk {
            source: "a.md".into(),
            text: text.into(),
        }
    }

    #[test]
    fn search_ranks_by_cosine_and_ignores_other_dimensions() {
        let index = Index::new(
            vec![chunk("x"), chunk("y"), chunk("xy")],
            vec![vec![1.0, 0.0], vec![0.0, 2.0], vec![1.0, 1.0]],
        );
        let found: Vec<(&str, f32)> = index
            .search(&[0.9, 0.1], 2)
            .into_iter()
            .map(|(c, s)| (c.text.as_str(), s))
            .collect();
        assert_eq!(found[0].0, "x");
        assert_eq!(found[1].0, "xy");
        assert!(found[0].1 > found[1].1 && found[0].1 <= 1.0);
        assert!(index.search(&[1.0, 0.0, 0.0], 2).is_empty());
        assert_eq!(index.search(&[0.0, 1.0], 10).len(), 3);
    }

    #[test]
    fn the_cache_keeps_vectors_by_model_and_hash() {
        let path =
            std::env::temp_dir().join(format!("agent-proxy-kb-{}.sqlite3", std::process::id()));
        let mut cache = Cache::open(&path).unwrap();
        cache
            .put("m", &[(text_hash("hi"), vec![0.5, -1.0])])
            .unwrap();
        assert_eq!(
            cache.get("m", &text_hash("hi")).unwrap(),
            Some(vec![0.5, -1.0])
        );
        assert_eq!(cache.get("other", &text_hash("hi")).unwrap(), None);
        drop(cache);
        let _ = std::fs::remove_file(&path);
    }

    proptest! {
        #[test]
        fn dot_is_the_plain_sum(pairs in proptest::collection::vec((-1.0f32..1.0, -1.0f32..1.0), 0..100)) {
            let (a, b): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
            let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            prop_assert!((dot(&a, &b) - plain).abs() < 1e-4);
        }

        #[test]
        fn blobs_round_trip(vector in proptest::collection::vec(any::<f32>().prop_filter("not NaN", |x| !x.is_nan()), 0..64)) {
            prop_assert_eq!(from_blob(&to_blob(&vector)), vector);
        }
    }
}
