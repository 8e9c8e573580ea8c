//! `POST /v1/embeddings` on an upstream (llama-server with `--embeddings`,
//! vLLM, OpenAI), through the one upstream layer.

use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tracing::warn;

use crate::upstream::Upstream;

/// Inputs per embeddings request.
pub const BATCH: usize = 32;
/// One embeddings request's longest wait.
const WAIT: Duration = Duration::from_secs(120);

#[derive(Deserialize)]
struct Answer {
    data: Vec<Datum>,
}

#[derive(Deserialize)]
struct Datum {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<f32>,
}

/// The vectors of `inputs`, in their order, or why not (never a secret:
/// the upstream's name, a status, the shape that was wrong).
pub async fn embed(
    upstream: &Upstream,
    model: Option<&str>,
    inputs: &[String],
) -> Result<Vec<Vec<f32>>, String> {
    let mut body = json!({"input": inputs, "encoding_format": "float"});
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    let (status, answer) = upstream
        .call(
            "POST",
            "/v1/embeddings",
            Some(Bytes::from(body.to_string())),
            WAIT,
        )
        .await
        .map_err(|e| format!("embeddings on `{}`: {e}", upstream.name))?;
    if status != 200 {
        // The answer's text goes to the log only: the reason is shown on
        // the unauthenticated `/readyz` and to the model.
        let start = String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned();
        warn!(upstream = %upstream.name, status, answer = %start, "embeddings refused");
        return Err(format!("embeddings on `{}`: HTTP {status}", upstream.name));
    }
    let answer: Answer = serde_json::from_slice(&answer).map_err(|e| {
        format!(
            "embeddings on `{}`: not an embeddings answer: {e}",
            upstream.name
        )
    })?;
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; inputs.len()];
    for (position, datum) in answer.data.into_iter().enumerate() {
        let index = datum.index.unwrap_or(position);
        if let Some(slot) = vectors.get_mut(index) {
            *slot = Some(datum.embedding);
        }
    }
    let vectors: Vec<Vec<f32>> = vectors.into_iter().flatten().collect();
    let dims = vectors.first().map_or(0, Vec::len);
    if vectors.len() != inputs.len() || dims == 0 || vectors.iter().any(|v| v.len() != dims) {
        return Err(format!(
            "embeddings on `{}`: {} vectors for {} inputs, or of different sizes",
            upstream.name,
            vectors.len(),
            inputs.len()
        ));
    }
    Ok(vectors)
}
