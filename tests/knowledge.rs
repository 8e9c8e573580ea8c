//! Knowledge bases: documents chunked and embedded on an upstream, found by
//! the `search_knowledge` tool or retrieved before the question
//! (`knowledge_auto`); a reload embeds only the chunks that changed; a base
//! still building is reported, never a failed request.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const DIMS: usize = 64;

/// A deterministic embedding: words hashed into `DIMS` counts, so texts
/// sharing words are close.
fn embedding(text: &str) -> Vec<f32> {
    let mut vector = vec![0.0; DIMS];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
    {
        let hash = word
            .to_lowercase()
            .bytes()
            .fold(0xcbf29ce484222325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
            });
        vector[(hash % DIMS as u64) as usize] += 1.0;
    }
    vector
}

/// The inputs of an embeddings request.
fn inputs(req: &Recorded) -> Vec<String> {
    match &req.json()["input"] {
        Value::Array(items) => items
            .iter()
            .filter_map(|i| i.as_str().map(str::to_owned))
            .collect(),
        Value::String(one) => vec![one.clone()],
        _ => Vec::new(),
    }
}

/// The model and the embedding server in one: embeddings as above (each
/// embeddings request waits for `gate` when given); a chat request either
/// answers with knowledge retrieved into the question, or calls
/// `search_knowledge` with the question and answers with the result.
async fn model(gate: Option<Gate>) -> FakeServer {
    FakeServer::start(move |req, _| {
        if req.method == "GET" {
            return Reply::json(200, json!({"object": "list", "data": []}));
        }
        if req.path.ends_with("/embeddings") {
            if let Some(gate) = &gate {
                gate.wait();
            }
            let data: Vec<Value> = inputs(req)
                .iter()
                .enumerate()
                .map(|(i, text)| json!({"object": "embedding", "index": i, "embedding": embedding(text)}))
                .collect();
            return Reply::json(200, json!({"object": "list", "data": data, "model": "fake-embed"}));
        }
        if let Some(result) = req.tool_results().last() {
            return Reply::events(vec![content(result), finish("stop")]);
        }
        let body = req.json();
        let last_user = body["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
            .map(|m| match &m["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
                _ => String::new(),
            })
            .unwrap_or_default();
        if last_user.starts_with("<knowledge>") {
            return Reply::events(vec![content(&last_user), finish("stop")]);
        }
        let args = json!({"query": last_user}).to_string();
        Reply::events(vec![
            tool_call(0, "c0", "search_knowledge", &args),
            finish("tool_calls"),
        ])
    })
    .await
}

fn docs() -> PathBuf {
    let dir = scratch_dir();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    write(
        "install.md",
        "# Installing\n\nRun make install to install the frobnicator on your machine.",
    );
    write(
        "cats.md",
        "Cats sleep most of the day. A cat purrs when it is happy.",
    );
    write(
        "weather.md",
        "Rain is expected in Bergen tomorrow, with strong wind.",
    );
    dir
}

fn config(upstream: &str, docs: &Path) -> String {
    one_upstream(
        upstream,
        &format!(
            "knowledge_bases:
  docs:
    sources: [\"{}/*.md\"]
    chunk: {{ size: 200, overlap: 20 }}
    top_k: 2
agents:
  librarian: {{ knowledge: [docs] }}
  reader: {{ knowledge: [docs], knowledge_auto: true }}
",
            docs.display()
        ),
    )
}

async fn ask(port: u16, agent: &str, question: &str) -> String {
    let body = json!({"model": agent, "messages": [{"role": "user", "content": question}]});
    let response = post_json(port, "/v1/chat/completions", &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn knowledge_status(port: u16) -> Value {
    get(port, "/readyz").await.json()["knowledge"]["docs"].clone()
}

async fn wait_ready(proxy: &Proxy, builds: usize) {
    let ready = wait_until(Duration::from_secs(20), || {
        std::future::ready(proxy.logs().matches("knowledge base ready").count() >= builds)
    })
    .await;
    assert!(ready, "the base was not built:\n{}", proxy.logs());
}

/// Document texts the fake embedded (queries left out).
fn embedded_documents(model: &FakeServer, questions: &[&str]) -> Vec<String> {
    model
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/embeddings"))
        .flat_map(inputs)
        .filter(|text| !questions.contains(&text.as_str()))
        .collect()
}

#[tokio::test]
async fn search_finds_the_right_chunk_and_a_reload_embeds_only_what_changed() {
    let model = model(None).await;
    let docs = docs();
    let yaml = config(&model.url(), &docs);
    let proxy = Reloadable::start(&yaml).await;
    wait_ready(&proxy.proxy, 1).await;
    let port = proxy.port();
    assert_eq!(
        knowledge_status(port).await,
        json!({"status": "ready", "chunks": 3})
    );

    let question = "How do I install the frobnicator?";
    let found = ask(port, "librarian", question).await;
    assert!(
        found.starts_with("[1] docs / install.md (score "),
        "{found}"
    );
    assert!(
        found.contains("Run make install to install the frobnicator"),
        "{found}"
    );
    assert!(!found.contains("[3]"), "top_k: 2");
    assert_eq!(embedded_documents(&model, &[question]).len(), 3);

    // One document changes; a reload embeds its chunk alone.
    std::fs::write(
        docs.join("cats.md"),
        "Cats hunt mice at night and nap by the fire.",
    )
    .unwrap();
    proxy.reload(&format!("{yaml}# reloaded\n")).await;
    wait_ready(&proxy.proxy, 2).await;
    let question2 = "Where do cats nap?";
    let found = ask(port, "librarian", question2).await;
    assert!(found.starts_with("[1] docs / cats.md"), "{found}");
    assert!(found.contains("nap by the fire"), "{found}");
    let embedded = embedded_documents(&model, &[question, question2]);
    assert_eq!(embedded.len(), 4, "{embedded:?}");
    assert_eq!(embedded[3], "Cats hunt mice at night and nap by the fire.");

    // `knowledge_auto`: the passages come before the question, unasked.
    let answered = ask(port, "reader", "Will there be rain in Bergen?").await;
    assert!(answered.starts_with("<knowledge>\n"), "{answered}");
    assert!(
        answered.contains("weather.md")
            && answered.contains("</knowledge>\n\nWill there be rain in Bergen?"),
        "{answered}"
    );
}

#[tokio::test]
async fn a_base_still_building_is_reported_and_the_agent_still_answers() {
    let gate = Gate::default();
    let model = model(Some(gate.clone())).await;
    let docs = docs();
    let proxy = Proxy::start(&config(&model.url(), &docs)).await;
    let building = wait_until(Duration::from_secs(10), || async {
        knowledge_status(proxy.port).await["status"] == "building"
    })
    .await;
    assert!(building, "{}", knowledge_status(proxy.port).await);
    assert_eq!(
        knowledge_status(proxy.port).await,
        json!({"status": "building", "embedded": 0, "total": 3, "serving_chunks": 0})
    );
    let answer = ask(proxy.port, "librarian", "How do I install it?").await;
    assert_eq!(
        answer,
        "error: knowledge base `docs` is still being built (0/3 chunks embedded)"
    );
    gate.open();
    wait_ready(&proxy, 1).await;
    assert!(ask(proxy.port, "librarian", "install frobnicator")
        .await
        .contains("install.md"));
}
