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

/// An embeddings answer for `req`'s inputs.
fn embeddings(req: &Recorded) -> Reply {
    let data: Vec<Value> = inputs(req)
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"object": "embedding", "index": i, "embedding": embedding(text)}))
        .collect();
    Reply::json(
        200,
        json!({"object": "list", "data": data, "model": "fake-embed"}),
    )
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
            return embeddings(req);
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

/// The question the install document answers, asked of `librarian` on
/// `port`: that document first, two passages at most (`top_k: 2`).
async fn finds_the_install_chunk(port: u16) {
    let found = ask(port, "librarian", INSTALL_QUESTION).await;
    assert!(
        found.starts_with("[1] docs / install.md (score "),
        "{found}"
    );
    assert!(
        found.contains("Run make install to install the frobnicator"),
        "{found}"
    );
    assert!(!found.contains("[3]"), "top_k: 2");
}

const INSTALL_QUESTION: &str = "How do I install the frobnicator?";

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

    let question = INSTALL_QUESTION;
    finds_the_install_chunk(port).await;
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

/// A one-page PDF whose page shows `text` (Helvetica): offsets computed,
/// as a real writer's.
fn pdf(text: &str) -> Vec<u8> {
    let content = format!("BT /F1 12 Tf 72 720 Td ({text}) Tj ET");
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_owned(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_owned(),
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>".to_owned(),
        format!("<< /Length {} >>\nstream\n{content}\nendstream", content.len()),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>".to_owned(),
    ];
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{object}\nendobj\n", i + 1).as_bytes());
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for offset in offsets {
        out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    out
}

/// A PDF file, and a Markdown page and a PDF fetched by URL when the base
/// is built, are searched like any file; a URL that fails is left out.
#[tokio::test]
async fn pdf_files_and_urls_are_sources_too() {
    let model = model(None).await;
    let pages = FakeServer::start(|req, _| match req.path.as_str() {
        "/remote.md" => Reply::Json {
            status: 200,
            body: b"The lighthouse keeper lights the lamp at dusk.".to_vec(),
            headers: vec![("content-type".into(), "text/markdown".into())],
        },
        "/manual.pdf" => Reply::Json {
            status: 200,
            body: pdf("Descale the espresso machine every month."),
            headers: vec![("content-type".into(), "application/pdf".into())],
        },
        _ => Reply::json(404, json!({"error": "no such page"})),
    })
    .await;
    let docs = scratch_dir();
    std::fs::write(
        docs.join("guide.pdf"),
        pdf("Water the orchids twice a week."),
    )
    .unwrap();
    std::fs::write(docs.join("broken.pdf"), b"%PDF-1.4 not really").unwrap();
    let yaml = one_upstream(
        &model.url(),
        &format!(
            "knowledge_bases:
  docs:
    sources: [\"{}/*.pdf\", \"{url}/remote.md\", \"{url}/manual.pdf\", \"{url}/missing.md\"]
    top_k: 1
agents:
  librarian: {{ knowledge: [docs] }}
",
            docs.display(),
            url = pages.url()
        ),
    );
    let proxy = Proxy::start(&yaml).await;
    wait_ready(&proxy, 1).await;
    let lamp = ask(
        proxy.port,
        "librarian",
        "When does the lighthouse keeper light the lamp?",
    )
    .await;
    assert!(
        lamp.starts_with(&format!("[1] docs / {}/remote.md", pages.url())),
        "{lamp}"
    );
    assert!(
        proxy
            .logged(&[
                "knowledge source not fetched",
                "missing.md",
                "knowledge source skipped",
                "broken.pdf"
            ])
            .await,
        "{}",
        proxy.logs()
    );
    if cfg!(feature = "pdf") {
        assert_eq!(
            knowledge_status(proxy.port).await,
            json!({"status": "ready", "chunks": 3})
        );
        let orchids = ask(proxy.port, "librarian", "How often do I water the orchids?").await;
        assert!(orchids.starts_with("[1] docs / guide.pdf"), "{orchids}");
        assert!(
            orchids.contains("Water the orchids twice a week."),
            "{orchids}"
        );
        let espresso = ask(proxy.port, "librarian", "descale espresso machine").await;
        assert!(
            espresso.contains("manual.pdf")
                && espresso.contains("Descale the espresso machine every month."),
            "{espresso}"
        );
    } else {
        // Without the feature, PDFs are skipped and said so, never a failed build.
        assert_eq!(
            knowledge_status(proxy.port).await,
            json!({"status": "ready", "chunks": 1})
        );
        assert!(
            proxy
                .logged(&["build with the `pdf` feature", "guide.pdf"])
                .await,
            "{}",
            proxy.logs()
        );
    }
}

/// `config` with the base's index in Postgres.
fn shared_config(upstream: &str, docs: &Path, postgres: &str) -> String {
    config(upstream, docs).replace(
        "    top_k: 2\n",
        &format!("    top_k: 2\n    index: {{ kind: postgres, url: \"{postgres}\" }}\n"),
    )
}

/// Replicas with `index: { kind: postgres }` share one pgvector table: the
/// first builds it, the second embeds nothing, a reload of either re-embeds
/// only what changed and every replica finds the new text at once.
#[tokio::test]
async fn replicas_share_one_postgres_index_and_embed_each_chunk_once() {
    let postgres = PostgresServer::start().await;
    let model = model(None).await;
    let docs = docs();
    let yaml = shared_config(&model.url(), &docs, &postgres.url());
    let first = Reloadable::start(&yaml).await;
    wait_ready(&first.proxy, 1).await;
    assert_eq!(
        knowledge_status(first.port()).await,
        json!({"status": "ready", "chunks": 3})
    );
    assert_eq!(embedded_documents(&model, &[]).len(), 3);

    let second = Proxy::start(&yaml).await;
    wait_ready(&second, 1).await;
    assert_eq!(
        knowledge_status(second.port).await,
        json!({"status": "ready", "chunks": 3})
    );
    assert_eq!(
        embedded_documents(&model, &[]).len(),
        3,
        "the second replica embedded again"
    );
    let question = INSTALL_QUESTION;
    for port in [first.port(), second.port] {
        finds_the_install_chunk(port).await;
    }

    std::fs::write(
        docs.join("cats.md"),
        "Cats hunt mice at night and nap by the fire.",
    )
    .unwrap();
    first.reload(&format!("{yaml}# reloaded\n")).await;
    wait_ready(&first.proxy, 2).await;
    let embedded = embedded_documents(&model, &[question]);
    assert_eq!(embedded.len(), 4, "{embedded:?}");
    assert_eq!(embedded[3], "Cats hunt mice at night and nap by the fire.");
    let found = ask(second.port, "librarian", "Where do cats nap?").await;
    assert!(
        found.starts_with("[1] docs / cats.md") && found.contains("nap by the fire"),
        "{found}"
    );
    let texts = table_texts(&postgres);
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert!(!texts.iter().any(|t| t.contains("purrs")), "{texts:?}");

    // A replica whose documents are not there (a volume not mounted yet)
    // leaves the table alone: the rows may be the other replicas'.
    let blind = Proxy::start(&yaml.replace(&docs.display().to_string(), "/nonexistent/docs")).await;
    wait_ready(&blind, 1).await;
    assert_eq!(
        knowledge_status(blind.port).await,
        json!({"status": "ready", "chunks": 3})
    );
    assert_eq!(table_texts(&postgres).len(), 3);
    assert!(
        blind.logged(&["as a source could not be read"]).await,
        "{}",
        blind.logs()
    );

    // `sslmode=require` is kept: this server has no TLS, so no connection.
    let tls_only = format!("{}?sslmode=require", postgres.url());
    let strict = Proxy::start(&shared_config(&model.url(), &docs, &tls_only)).await;
    let failed = wait_until(Duration::from_secs(20), || async {
        knowledge_status(strict.port).await["status"] == "failed"
    })
    .await;
    let status = knowledge_status(strict.port).await;
    assert!(
        failed && status["reason"].as_str().is_some_and(|r| r.contains("TLS")),
        "{status}"
    );
}

/// The texts in the base's table (there is one), a line each.
fn table_texts(postgres: &PostgresServer) -> Vec<String> {
    let table = postgres
        .psql("SELECT tablename FROM pg_tables WHERE tablename LIKE 'agent_proxy_kb_docs_%'");
    assert_eq!(table.lines().count(), 1, "{table}");
    postgres
        .psql(&format!(
            "SELECT replace(text, E'\\n', ' ') FROM \"{table}\" ORDER BY source"
        ))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A Postgres that cannot be reached fails the base, said on `/readyz` and
/// to the model; the agent still answers. The URL's password is never shown.
#[tokio::test]
async fn an_unreachable_postgres_fails_the_base_not_the_request() {
    let model = model(None).await;
    let docs = docs();
    let url = format!("postgres://kb:s3cret-pw@127.0.0.1:{}/kb", free_port());
    let proxy = Proxy::start(&shared_config(&model.url(), &docs, &url)).await;
    let failed = wait_until(Duration::from_secs(20), || async {
        knowledge_status(proxy.port).await["status"] == "failed"
    })
    .await;
    let status = knowledge_status(proxy.port).await;
    assert!(failed, "{status}");
    let reason = status["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("postgres: "), "{status}");
    let answer = ask(proxy.port, "librarian", "How do I install it?").await;
    assert!(
        answer.starts_with("error: knowledge base `docs` is unavailable: postgres: "),
        "{answer}"
    );
    for text in [status.to_string(), answer, proxy.logs()] {
        assert!(!text.contains("s3cret-pw"), "{text}");
    }
}

/// An agent another agent calls (`agent:<id>`) gets its `knowledge_auto`
/// passages as it would from a client.
#[tokio::test]
async fn an_agent_called_by_another_retrieves_its_knowledge_too() {
    let model = FakeServer::start(|req, _| {
        if req.method == "GET" {
            return Reply::json(200, json!({"object": "list", "data": []}));
        }
        if req.path.ends_with("/embeddings") {
            return embeddings(req);
        }
        let body = req.json();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let is_boss = messages[0]["content"] == "BOSS";
        if let (true, Some(result)) = (is_boss, req.tool_results().last()) {
            return Reply::events(vec![content(result), finish("stop")]);
        }
        if is_boss {
            return Reply::events(vec![
                tool_call(
                    0,
                    "b1",
                    "agent__reader",
                    r#"{"task": "Will there be rain in Bergen?"}"#,
                ),
                finish("tool_calls"),
            ]);
        }
        // The reader answers with the message it got.
        let last = messages.last().map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
            _ => String::new(),
        });
        Reply::events(vec![content(&last.unwrap_or_default()), finish("stop")])
    })
    .await;
    let docs = docs();
    let yaml = config(&model.url(), &docs).replace(
        "agents:\n",
        "agents:\n  boss: { system_prompt: BOSS, tools: [\"agent:reader\"] }\n",
    );
    let proxy = Proxy::start(&yaml).await;
    wait_ready(&proxy, 1).await;
    let answer = ask(proxy.port, "boss", "Ask the reader about Bergen.").await;
    assert!(answer.starts_with("<knowledge>\n"), "{answer}");
    assert!(
        answer.contains("weather.md")
            && answer.contains("</knowledge>\n\nWill there be rain in Bergen?"),
        "{answer}"
    );
}
