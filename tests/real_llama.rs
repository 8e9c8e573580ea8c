//! Knowledge bases on a real llama-server's `/v1/embeddings`
//! (`--embeddings --pooling mean`): a tiny random-weight model with Qwen2's
//! tokenizer, whose vectors mean nothing but are the server's own, so the
//! wire format, batching and chunk sizes are exercised for real; a passage
//! asked for by its own words comes first with a cosine of 1.
//!
//! llama-server is built once by `tools/llama-server` (~15 min on 2 cores),
//! too long for every run:
//! `cargo test --test real_llama -- --ignored`.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

struct LlamaServer {
    port: u16,
    child: Child,
}

impl LlamaServer {
    async fn start(args: &[&str]) -> LlamaServer {
        let tool = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/llama-server");
        // The build's progress shows as it goes.
        let model = stdout_of(
            Command::new(tool)
                .args(["--tiny-model", "Qwen-Qwen3-0.6B"])
                .stderr(Stdio::inherit()),
        );
        let port = free_port();
        let child = Command::new(tool)
            .args(["-m", &model, "--port", &port.to_string(), "-c", "8192"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("llama-server starts");
        // Listening first, then healthy once the model is loaded.
        let up = wait_until(Duration::from_secs(60), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
                && get(port, "/health").await.status == 200
        })
        .await;
        assert!(up, "llama-server did not become healthy on port {port}");
        LlamaServer { port, child }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A paragraph of documentation, ~330 characters.
fn paragraph(topic: &str, n: usize) -> String {
    format!(
        "{topic}, part {n}. The {topic} subsystem keeps its state in a journal that is \
         replayed at start; operators rotate the journal weekly and archive it for ninety days. \
         When the {topic} queue grows past its high-water mark, new work is refused with a \
         retry-after hint, and the dashboard shows the backlog per tenant and per region."
    )
}

#[tokio::test]
#[ignore = "builds llama-server once (~15 min): cargo test --test real_llama -- --ignored"]
async fn a_knowledge_base_is_built_and_searched_on_llama_server_embeddings() {
    let embedder = LlamaServer::start(&["--embeddings", "--pooling", "mean", "-np", "4"]).await;
    // The chat model asks `search_knowledge` for the user's words and
    // answers with what the tool found.
    let chat = FakeServer::start(|req, _| {
        if req.method == "GET" {
            return Reply::json(200, json!({"object": "list", "data": []}));
        }
        if let Some(result) = req.tool_results().last() {
            return Reply::events(vec![content(result), finish("stop")]);
        }
        let question = req.json()["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let args = json!({"query": question, "top_k": 3}).to_string();
        Reply::events(vec![
            tool_call(0, "c0", "search_knowledge", &args),
            finish("tool_calls"),
        ])
    })
    .await;
    let docs = scratch_dir();
    let topics = ["billing", "storage", "scheduler", "gateway"];
    for topic in topics {
        let text: Vec<String> = (0..12).map(|n| paragraph(topic, n)).collect();
        std::fs::write(docs.join(format!("{topic}.md")), text.join("\n\n")).unwrap();
    }
    let yaml = format!(
        "default_upstream: chat
upstreams:
  chat: {{ url: \"{}/v1\" }}
  embedder: {{ url: \"{}\" }}
knowledge_bases:
  docs:
    sources: [\"{}/*.md\"]
    embedding: {{ upstream: embedder }}
    chunk: {{ size: 400, overlap: 0 }}
agents:
  librarian: {{ knowledge: [docs] }}
",
        chat.url(),
        embedder.url(),
        docs.display()
    );
    let proxy = Proxy::start(&yaml).await;
    let ready = wait_until(Duration::from_secs(120), || async {
        let status = get(proxy.port, "/readyz").await.json()["knowledge"]["docs"].clone();
        assert_ne!(status["status"], "failed", "{status}\n{}", proxy.logs());
        status["status"] == "ready"
    })
    .await;
    let status = get(proxy.port, "/readyz").await.json()["knowledge"]["docs"].clone();
    assert!(ready, "{status}");
    // A paragraph a chunk: 48, so two embeddings requests of up to 32.
    assert_eq!(status["chunks"], 48, "{status}");

    let asked = paragraph("scheduler", 7);
    let body = json!({"model": "librarian", "messages": [{"role": "user", "content": asked}]});
    let response = post_json(proxy.port, "/v1/chat/completions", &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let found: Value = response.json()["choices"][0]["message"]["content"].clone();
    let found = found.as_str().unwrap_or_default();
    assert!(
        found.starts_with("[1] docs / scheduler.md (score 1.000)"),
        "{found}"
    );
    assert!(found.contains(&asked), "{found}");
}
