//! A scripted upstream: each request is recorded and answered by a handler.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Which connection it came on (0-based, in accept order).
    pub connection: usize,
}

impl Recorded {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }

    /// The contents of a chat request's `tool` messages, in order.
    pub fn tool_results(&self) -> Vec<String> {
        self.tool_messages()
            .into_iter()
            .map(|(_, content)| content)
            .collect()
    }

    /// A chat request's `tool` messages as (`tool_call_id`, content), in order.
    pub fn tool_messages(&self) -> Vec<(String, String)> {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        self.json()["messages"]
            .as_array()
            .map(|messages| {
                messages
                    .iter()
                    .filter(|m| m["role"] == "tool")
                    .map(|m| (text(&m["tool_call_id"]), text(&m["content"])))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub enum Step {
    Bytes(Vec<u8>),
    /// Several chunks in one write, as a server that fell behind its
    /// socket sends them.
    Chunks(Vec<Vec<u8>>),
    Sleep(Duration),
}

impl Step {
    /// One SSE `data:` event.
    pub fn event(value: &Value) -> Step {
        Step::Bytes(format!("data: {value}\n\n").into_bytes())
    }
}

/// Holds a handler back until the test opens it: a request stays in flight
/// exactly as long as the test needs, with no guessed durations.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    /// Blocks (handlers run on blocking threads) until opened; a minute at
    /// most, so a test that fails before opening it does not hang.
    pub fn wait(&self) {
        let (open, opened) = &*self.0;
        let guard = open.lock().unwrap();
        let _ = opened
            .wait_timeout_while(guard, Duration::from_secs(60), |open| !*open)
            .unwrap();
    }

    pub fn open(&self) {
        let (open, opened) = &*self.0;
        *open.lock().unwrap() = true;
        opened.notify_all();
    }
}

pub enum Reply {
    Json {
        status: u16,
        body: Vec<u8>,
        headers: Vec<(String, String)>,
    },
    /// A chunked `text/event-stream` body written step by step.
    Sse { steps: Vec<Step>, complete: bool },
    /// Accept the request and never answer.
    Stall,
    /// Never answer, and count a hangup when the proxy closes the connection
    /// (it gave up on the request).
    Hold,
    /// Close the connection without answering, the request read whole.
    CloseUnanswered,
    /// A `text/event-stream` body short of the length its head declares,
    /// then the close: an upstream that died mid-answer.
    ShortEvents { declared: usize, body: Vec<u8> },
    /// Answer, then close the connection (its response did not say so):
    /// a keep-alive connection the server closes while it is idle.
    ThenClose(Box<Reply>),
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        Reply::Json {
            status,
            body: body.to_string().into_bytes(),
            headers: vec![],
        }
    }

    pub fn raw_json(status: u16, body: &[u8]) -> Reply {
        Reply::Json {
            status,
            body: body.to_vec(),
            headers: vec![],
        }
    }

    /// `body` with header `fields` of its own, in order and as written.
    pub fn with_fields(status: u16, body: &[u8], fields: &[(&str, &str)]) -> Reply {
        let fields = fields
            .iter()
            .map(|(name, value)| ((*name).into(), (*value).into()));
        Reply::Json {
            status,
            body: body.to_vec(),
            headers: fields.collect(),
        }
    }

    /// Each JSON value as one `data:` event, then `[DONE]`.
    pub fn events(events: Vec<Value>) -> Reply {
        let mut steps: Vec<Step> = events
            .into_iter()
            .map(|e| Step::Bytes(format!("data: {e}\n\n").into_bytes()))
            .collect();
        steps.push(Step::Bytes(b"data: [DONE]\n\n".to_vec()));
        Reply::Sse {
            steps,
            complete: true,
        }
    }

    /// `events` content chunks (`.`) `gap` apart, then `finish_reason: stop`
    /// and `[DONE]`: an answer that takes its time.
    pub fn slow_stream(events: usize, gap: Duration) -> Reply {
        let mut steps = Vec::new();
        for _ in 0..events {
            steps.push(Step::event(&content(".")));
            steps.push(Step::Sleep(gap));
        }
        steps.push(Step::event(&finish("stop")));
        steps.push(Step::Bytes(b"data: [DONE]\n\n".to_vec()));
        Reply::Sse {
            steps,
            complete: true,
        }
    }

    /// The stream begins with `text`, then goes silent for an hour.
    pub fn silent_after(text: &str) -> Reply {
        Reply::Sse {
            steps: vec![
                Step::event(&content(text)),
                Step::Sleep(Duration::from_secs(3600)),
            ],
            complete: true,
        }
    }

    /// A captured SSE body replayed event by event, `gap` apart.
    pub fn replay(bytes: &[u8], gap: Duration) -> Reply {
        let text = String::from_utf8(bytes.to_vec()).expect("fixture is UTF-8");
        let mut steps = Vec::new();
        for event in text.split_inclusive("\n\n") {
            steps.push(Step::Bytes(event.as_bytes().to_vec()));
            if !gap.is_zero() {
                steps.push(Step::Sleep(gap));
            }
        }
        Reply::Sse {
            steps,
            complete: true,
        }
    }
}

pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/llama.cpp/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// An upstream whose first round calls `calls` (name, arguments) and whose
/// next round answers with the tool results as a JSON array of strings. It
/// answers `/readyz`'s model-list probe with an empty list.
pub async fn calls_then_echo_results(calls: Vec<(&'static str, &'static str)>) -> FakeServer {
    FakeServer::start(move |req, _| {
        if req.method == "GET" {
            return Reply::json(200, json!({"object": "list", "data": []}));
        }
        let results = req.tool_results();
        if results.is_empty() {
            let mut events: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| tool_call(i as u32, &format!("c{i}"), name, args))
                .collect();
            events.push(finish("tool_calls"));
            Reply::events(events)
        } else {
            Reply::events(vec![
                content(&serde_json::to_string(&results).unwrap()),
                finish("stop"),
            ])
        }
    })
    .await
}

/// A coding agent's model in two rounds: it thinks and makes `call` (a
/// `tool_call` event for the client's own tool); once the request carries
/// the result, it answers quoting the result's last line.
pub fn call_then_quote(req: &Recorded, call: Value) -> Reply {
    match req.tool_results().last() {
        None => Reply::events(vec![
            role(),
            reasoning("Let me run it."),
            call,
            finish("tool_calls"),
            usage(100, 7),
        ]),
        Some(result) => {
            let last_line = result.lines().rev().find(|l| !l.trim().is_empty());
            Reply::events(vec![
                role(),
                content("All done: "),
                content(last_line.unwrap_or("(no output)").trim()),
                finish("stop"),
                usage(150, 5),
            ])
        }
    }
}

/// The tool results an answer of [`calls_then_echo_results`] carries.
pub fn echoed_results(answer: &Value) -> Vec<String> {
    serde_json::from_str(
        answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("[]"),
    )
    .unwrap_or_default()
}

// Chunk builders in llama.cpp's shape.
fn chunk(delta: Value, finish: Value) -> Value {
    json!({"choices":[{"finish_reason":finish,"index":0,"delta":delta}],"created":1,"id":"chatcmpl-up","model":"tiny","object":"chat.completion.chunk"})
}
pub fn role() -> Value {
    chunk(json!({"role":"assistant","content":null}), Value::Null)
}
pub fn content(text: &str) -> Value {
    chunk(json!({"content": text}), Value::Null)
}
pub fn reasoning(text: &str) -> Value {
    chunk(json!({"reasoning_content": text}), Value::Null)
}
pub fn tool_call(index: u32, id: &str, name: &str, args: &str) -> Value {
    chunk(
        json!({"tool_calls":[{"index":index,"id":id,"type":"function","function":{"name":name,"arguments":args}}]}),
        Value::Null,
    )
}
pub fn tool_args(index: u32, args: &str) -> Value {
    chunk(
        json!({"tool_calls":[{"index":index,"function":{"arguments":args}}]}),
        Value::Null,
    )
}
pub fn finish(reason: &str) -> Value {
    chunk(json!({}), json!(reason))
}
pub fn usage(prompt: u64, completion: u64) -> Value {
    json!({"choices":[],"created":1,"id":"chatcmpl-up","model":"tiny","object":"chat.completion.chunk",
           "usage":{"prompt_tokens":prompt,"completion_tokens":completion,"total_tokens":prompt+completion}})
}

type Handler = dyn Fn(&Recorded, usize) -> Reply + Send + Sync;

pub struct FakeServer {
    pub port: u16,
    requests: Arc<Mutex<Vec<Recorded>>>,
    /// Bumped when a write to the proxy fails: the proxy hung up on us.
    pub hangups: Arc<Mutex<u32>>,
    /// Connections this server closed itself ([`Reply::CloseUnanswered`],
    /// [`Reply::ThenClose`]).
    closed: Arc<Mutex<u32>>,
    task: tokio::task::JoinHandle<()>,
    /// Open connections, closed when the server is dropped.
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl FakeServer {
    /// Serves plain HTTP. The handler gets each request and its 0-based index.
    pub async fn start(
        handler: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
    ) -> FakeServer {
        Self::start_with(handler, None).await
    }

    pub async fn start_with(
        handler: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> FakeServer {
        Self::start_on(0, handler, tls).await
    }

    /// Serves on `port` (0: any free port), e.g. to bring a killed server back.
    pub async fn start_on(
        port: u16,
        handler: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> FakeServer {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let hangups = Arc::new(Mutex::new(0));
        let closed = Arc::new(Mutex::new(0));
        let handler: Arc<Handler> = Arc::new(handler);
        let log = Log {
            requests: requests.clone(),
            hangups: hangups.clone(),
            closed: closed.clone(),
        };
        let connections = Arc::new(Mutex::new(Vec::new()));
        let conns = connections.clone();
        let task = tokio::spawn(async move {
            for connection in 0.. {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let (handler, log, tls) = (handler.clone(), log.clone(), tls.clone());
                let conn = tokio::spawn(async move {
                    match tls {
                        None => serve(socket, connection, handler, log).await,
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(socket).await {
                                serve(stream, connection, handler, log).await
                            }
                        }
                    }
                });
                conns.lock().unwrap().push(conn.abort_handle());
            }
        });
        FakeServer {
            port,
            requests,
            hangups,
            closed,
            task,
            connections,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    pub fn hangups(&self) -> u32 {
        *self.hangups.lock().unwrap()
    }

    pub fn closed(&self) -> u32 {
        *self.closed.lock().unwrap()
    }

    /// Waits (10 s at most) until this server has seen `n` requests.
    pub async fn wait_requests(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.requests().len() < n {
            assert!(
                Instant::now() < deadline,
                "the upstream saw {} requests, not {n}",
                self.requests().len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
        for conn in self.connections.lock().unwrap().drain(..) {
            conn.abort();
        }
    }
}

/// What a server's connections record.
#[derive(Clone)]
struct Log {
    requests: Arc<Mutex<Vec<Recorded>>>,
    hangups: Arc<Mutex<u32>>,
    closed: Arc<Mutex<u32>>,
}

async fn serve<S: tokio::io::AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    connection: usize,
    handler: Arc<Handler>,
    log: Log,
) {
    let mut stream = BufReader::new(stream);
    loop {
        let Some(request) = read_request(&mut stream, connection).await else {
            return;
        };
        let index = {
            let mut all = log.requests.lock().unwrap();
            all.push(request.clone());
            all.len() - 1
        };
        // Handlers may block (a slow tool); keep them off the runtime's workers.
        let handler = handler.clone();
        let reply = tokio::task::spawn_blocking(move || handler(&request, index))
            .await
            .unwrap();
        let reply = match reply {
            Reply::Hold => {
                let mut byte = [0u8; 1];
                while matches!(stream.read(&mut byte).await, Ok(n) if n > 0) {}
                *log.hangups.lock().unwrap() += 1;
                return;
            }
            Reply::CloseUnanswered => None,
            Reply::ThenClose(reply) => Some(*reply),
            reply => {
                if !write_reply(stream.get_mut(), reply).await {
                    *log.hangups.lock().unwrap() += 1;
                    return;
                }
                continue;
            }
        };
        if let Some(reply) = reply {
            write_reply(stream.get_mut(), reply).await;
        }
        let _ = stream.get_mut().shutdown().await;
        drop(stream);
        *log.closed.lock().unwrap() += 1;
        return;
    }
}

async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(
    stream: &mut R,
    connection: usize,
) -> Option<Recorded> {
    let mut line = String::new();
    if stream.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).await.ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':')?;
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(len) = find("content-length") {
        body.resize(len.parse().ok()?, 0);
        stream.read_exact(&mut body).await.ok()?;
    } else if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            stream.read_line(&mut size).await.ok()?;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            stream.read_exact(&mut chunk).await.ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    Some(Recorded {
        method,
        path,
        headers,
        body,
        connection,
    })
}

/// Writes a reply; false when the peer went away while we wrote.
async fn write_reply<W: AsyncWrite + Unpin>(w: &mut W, reply: Reply) -> bool {
    match reply {
        Reply::Json {
            status,
            body,
            headers,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            );
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            w.write_all(head.as_bytes()).await.is_ok()
                && w.write_all(&body).await.is_ok()
                && w.flush().await.is_ok()
        }
        Reply::Sse { steps, complete } => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nX-Accel-Buffering: no\r\n\r\n";
            if w.write_all(head.as_bytes()).await.is_err() {
                return false;
            }
            for step in steps {
                match step {
                    Step::Sleep(d) => tokio::time::sleep(d).await,
                    Step::Bytes(bytes) => {
                        if !write_chunks(w, vec![bytes]).await {
                            return false;
                        }
                    }
                    Step::Chunks(chunks) => {
                        if !write_chunks(w, chunks).await {
                            return false;
                        }
                    }
                }
            }
            if complete {
                w.write_all(b"0\r\n\r\n").await.is_ok() && w.flush().await.is_ok()
            } else {
                let _ = w.shutdown().await;
                false
            }
        }
        Reply::ShortEvents { declared, body } => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {declared}\r\n\r\n"
            );
            let _ = w.write_all(head.as_bytes()).await;
            let _ = w.write_all(&body).await;
            let _ = w.shutdown().await;
            false
        }
        Reply::Stall | Reply::Hold => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            false
        }
        Reply::CloseUnanswered | Reply::ThenClose(_) => {
            unreachable!("`serve` closes the connection itself")
        }
    }
}

/// Writes `chunks` in chunked framing, in one write.
async fn write_chunks(w: &mut (impl AsyncWrite + Unpin), chunks: Vec<Vec<u8>>) -> bool {
    let framed: Vec<u8> = chunks
        .into_iter()
        .flat_map(|bytes| {
            [
                format!("{:x}\r\n", bytes.len()).into_bytes(),
                bytes,
                b"\r\n".to_vec(),
            ]
        })
        .flatten()
        .collect();
    w.write_all(&framed).await.is_ok() && w.flush().await.is_ok()
}
