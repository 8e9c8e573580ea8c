//! A raw HTTP/1.1 client that keeps every byte and when each chunk arrived.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Body chunks as they arrived (chunked responses).
    pub chunks: Vec<(Instant, Vec<u8>)>,
    /// The body ended properly (terminal chunk or full length), not by a cut connection.
    pub complete: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The JSON of every `data:` event, without `[DONE]`.
    pub fn events(&self) -> Vec<Value> {
        sse_data(&self.body)
            .into_iter()
            .filter(|d| d != "[DONE]")
            .map(|d| serde_json::from_str(&d).unwrap_or_else(|e| panic!("event {d}: {e}")))
            .collect()
    }

    pub fn ends_with_done(&self) -> bool {
        self.body.ends_with(b"data: [DONE]\n\n")
    }

    /// All `delta.<field>` strings of the stream, concatenated.
    pub fn delta_text(&self, field: &str) -> String {
        self.events()
            .iter()
            .filter_map(|e| e["choices"][0]["delta"][field].as_str().map(str::to_owned))
            .collect()
    }

    /// The JSON of the last `data:` event.
    pub fn last_event(&self) -> Value {
        let data = sse_data(&self.body);
        let last = data.last().expect("an event");
        serde_json::from_str(last).unwrap_or_else(|e| panic!("event {last}: {e}"))
    }

    pub fn error_type(&self) -> String {
        self.json()["error"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// A chat completions request: one user message to `model`.
pub fn chat_body(model: &str, user: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": user}]})
}

/// [`chat_body`], streamed.
pub fn stream_body(model: &str, user: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": user}]})
}

/// The answer's text of a non-streamed chat completion that must succeed.
pub async fn answer_text(port: u16, body: &Value) -> String {
    let res = post_json(port, "/v1/chat/completions", body).await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Each event's data (an event's `event:` line, as the Responses and
/// Messages streams have one, is passed over).
pub fn sse_data(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|event| event.lines().find_map(|line| line.strip_prefix("data: ")))
        .map(str::to_owned)
        .collect()
}

pub async fn post_json(port: u16, path: &str, body: &Value) -> Response {
    request(
        port,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .await
}

pub async fn get(port: u16, path: &str) -> Response {
    request(port, "GET", path, &[], b"").await
}

pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut conn = Connection::open(port, method, path, headers, body).await;
    let mut response = conn.head().await;
    while let Some(chunk) = conn.next_chunk(&mut response).await {
        response.body.extend_from_slice(&chunk);
        response.chunks.push((Instant::now(), chunk));
    }
    response
}

/// Sends `bytes` as they are (a request the normal helpers could not write:
/// no `Host`, a malformed head) and reads the answer. A write the proxy cut
/// short by answering early is not an error.
pub async fn raw_request(port: u16, bytes: &[u8]) -> Response {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to proxy");
    let _ = stream.write_all(bytes).await;
    let mut conn = Connection::on(stream);
    let mut response = conn.head().await;
    while let Some(chunk) = conn.next_chunk(&mut response).await {
        response.body.extend_from_slice(&chunk);
        response.chunks.push((Instant::now(), chunk));
    }
    response
}

/// A request whose response is read piece by piece (or abandoned).
pub struct Connection {
    reader: BufReader<TcpStream>,
    chunked: bool,
    remaining: Option<usize>,
    finished: bool,
}

impl Connection {
    pub async fn open(
        port: u16,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Connection {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to proxy");
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        Connection::on(stream)
    }

    /// Reads answers from a stream the test wrote its request to itself.
    pub fn on(stream: TcpStream) -> Connection {
        Connection {
            reader: BufReader::new(stream),
            chunked: false,
            remaining: None,
            finished: false,
        }
    }

    /// After a complete answer: the next one on the same connection
    /// (keep-alive), for a request written with [`Connection::send`].
    pub async fn next_response(&mut self) -> Response {
        self.finished = false;
        let mut response = self.head().await;
        while let Some(chunk) = self.next_chunk(&mut response).await {
            response.body.extend_from_slice(&chunk);
            response.chunks.push((Instant::now(), chunk));
        }
        response
    }

    /// Writes more bytes on the connection (the next request).
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.reader.get_mut().write_all(bytes).await
    }

    /// Whether the proxy closes the connection within `limit`: a read that
    /// returns 0 bytes (or fails: a reset is a close too).
    pub async fn closed_within(&mut self, limit: Duration) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(limit, self.reader.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// A chat completion whose response is read piece by piece.
    pub async fn chat(port: u16, body: &Value) -> Connection {
        let body = body.to_string();
        Connection::open(port, "POST", "/v1/chat/completions", &[], body.as_bytes()).await
    }

    pub async fn head(&mut self) -> Response {
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(30), self.reader.read_line(&mut line))
            .await
            .expect("response head within 30 s")
            .unwrap();
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                break;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.push((k.trim().to_owned(), v.trim().to_owned()));
            }
        }
        let response = Response {
            status,
            headers,
            body: Vec::new(),
            chunks: Vec::new(),
            complete: false,
        };
        self.chunked = response
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"));
        self.remaining = response
            .header("content-length")
            .and_then(|v| v.parse().ok());
        response
    }

    /// The next piece of the body; `None` at the end (setting `complete`) or on a cut.
    pub async fn next_chunk(&mut self, response: &mut Response) -> Option<Vec<u8>> {
        if self.finished {
            return None;
        }
        let read = tokio::time::timeout(Duration::from_secs(30), self.read_piece())
            .await
            .expect("body read within 30 s");
        match read {
            Some(piece) if !piece.is_empty() => Some(piece),
            Some(_) => {
                self.finished = true;
                response.complete = true;
                None
            }
            None => {
                self.finished = true;
                None
            }
        }
    }

    /// Some(empty) at a proper end, None on a cut connection.
    async fn read_piece(&mut self) -> Option<Vec<u8>> {
        if self.chunked {
            let mut size = String::new();
            if self.reader.read_line(&mut size).await.ok()? == 0 {
                return None;
            }
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut data = vec![0; size + 2];
            self.reader.read_exact(&mut data).await.ok()?;
            data.truncate(size);
            Some(data)
        } else if let Some(remaining) = self.remaining {
            if remaining == 0 {
                return Some(Vec::new());
            }
            let mut data = vec![0; remaining.min(65536)];
            let n = self.reader.read(&mut data).await.ok()?;
            if n == 0 {
                return None;
            }
            data.truncate(n);
            self.remaining = Some(remaining - n);
            Some(data)
        } else {
            let mut data = vec![0; 65536];
            let n = self.reader.read(&mut data).await.ok()?;
            data.truncate(n);
            Some(data)
        }
    }
}
