//! The load generator: closed-loop keep-alive HTTP/1.1 connections, each
//! sending one request after another, timed as the client sees them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, ensure};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_TYPE, HOST, TRANSFER_ENCODING};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use memchr::memmem;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One load: `connections` clients POSTing `body` to `path` for
/// `warmup + measure`; only requests started after the warm-up count.
#[derive(Clone)]
pub struct Load {
    pub addr: SocketAddr,
    pub path: &'static str,
    pub body: Bytes,
    /// Fields sent besides `host` and `content-type`: a real client's.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body goes chunked, its length unsaid (pingora's proxy path is
    /// what forwards such a request for another route).
    pub chunked: bool,
    /// The request asks for a stream: the answer must be SSE.
    pub stream: bool,
    /// What every answer must be: proves it is the real, whole one.
    pub answer: Answer,
    pub connections: usize,
    pub warmup: Duration,
    /// Clients start spread over this time, so they don't move in lockstep.
    pub stagger: Duration,
    pub measure: Duration,
}

/// A good answer, in the dialect the request spoke.
#[derive(Clone, Copy)]
pub enum Answer {
    /// Chat completions: `"finish_reason":"stop"`; a stream's last event is
    /// `data: [DONE]`, and its first token the first chunk with content.
    Chat,
    /// OpenAI Responses: a Response object whose own status is `completed`;
    /// a stream's last event is its one `response.completed` (carrying such
    /// a Response), no `response.failed` or `response.incomplete` before it,
    /// and its first token the first `response.output_text.delta`.
    Responses,
    /// Anthropic Messages: a Message whose `stop_reason` is `end_turn`; a
    /// stream opens with `message_start`, names each event's `type` on its
    /// `event:` line, says `end_turn` in one `message_delta` and ends with
    /// `message_stop`; its first token is the first `text_delta`.
    Messages,
    /// Any other JSON answer: it contains these bytes.
    Containing(&'static [u8]),
}

/// What the clients saw. Times are in nanoseconds.
pub struct Stats {
    /// Request sent until the last byte of the answer.
    pub latency: Histogram<u64>,
    /// Request sent until the first generated token arrives (the first
    /// byte of a non-streaming answer).
    pub first_token: Histogram<u64>,
    /// Between two SSE events (0 for events that arrived together).
    pub gaps: Histogram<u64>,
    /// Answers counted in the figures (started after the warm-up).
    pub requests: u64,
    /// Every answer, warm-up included: what CPU time is divided by.
    pub completed: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub measured: Duration,
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 10 min at three significant digits.
    Histogram::new_with_bounds(1_000, 600_000_000_000, 3).expect("static histogram bounds")
}

impl Stats {
    pub fn new() -> Self {
        Stats {
            latency: histogram(),
            first_token: histogram(),
            gaps: histogram(),
            requests: 0,
            completed: 0,
            errors: 0,
            first_error: None,
            measured: Duration::ZERO,
        }
    }

    pub fn merge(&mut self, other: &Stats) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.latency.add(&other.latency);
        let _ = self.first_token.add(&other.first_token);
        let _ = self.gaps.add(&other.gaps);
        self.requests += other.requests;
        self.completed += other.completed;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        self.measured += other.measured;
    }

    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.measured.as_secs_f64().max(1e-9)
    }

    fn error(&mut self, e: anyhow::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{e:#}"));
        }
    }
}

pub async fn run(load: &Load) -> Stats {
    let measure_from = Instant::now() + load.warmup;
    let stop = measure_from + load.measure;
    let clients: Vec<_> = (0..load.connections)
        .map(|i| {
            let delay = load.stagger.mul_f64(i as f64 / load.connections as f64);
            tokio::spawn(client(
                load.clone(),
                Instant::now() + delay,
                measure_from,
                stop,
            ))
        })
        .collect();
    let mut total = Stats::new();
    for client in clients {
        match client.await {
            Ok(stats) => total.merge(&stats),
            Err(e) => total.error(e.into()),
        }
    }
    total.measured = load.measure;
    total
}

async fn client(load: Load, start: Instant, measure_from: Instant, stop: Instant) -> Stats {
    tokio::time::sleep_until(start).await;
    let mut stats = Stats::new();
    let mut scratch = Scratch {
        gaps: Vec::with_capacity(512),
        body: Vec::with_capacity(4096),
    };
    let mut sender = None;
    loop {
        let started = Instant::now();
        if started >= stop {
            return stats;
        }
        let measured = started >= measure_from;
        let conn = match sender.as_mut() {
            Some(conn) => conn,
            None => match connect(load.addr).await {
                Ok(conn) => sender.insert(conn),
                Err(e) => {
                    if measured {
                        stats.error(e);
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let answer = exchange(conn, &load, &mut scratch).await;
        if let Ok(timing) = &answer {
            stats.completed += 1;
            if timing.closing {
                sender = None;
            }
        }
        match answer {
            Ok(timing) if measured => {
                stats.requests += 1;
                let _ = stats.latency.record(nanos(timing.total));
                let _ = stats.first_token.record(nanos(timing.first_token));
                for gap in &scratch.gaps {
                    let _ = stats.gaps.record(*gap);
                }
            }
            Ok(_) => {}
            Err(e) => {
                sender = None;
                if measured {
                    stats.error(e);
                }
            }
        }
    }
}

fn nanos(d: Duration) -> u64 {
    (d.as_nanos() as u64).max(1_000)
}

async fn connect(addr: SocketAddr) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

fn post(
    path: &str,
    body: Bytes,
    chunked: bool,
    headers: &[(HeaderName, HeaderValue)],
) -> anyhow::Result<Request<Full<Bytes>>> {
    let mut request = Request::post(path)
        .header(HOST, "bench")
        .header(CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(name, value);
    }
    if chunked {
        request = request.header(TRANSFER_ENCODING, "chunked");
    }
    Ok(request.body(Full::new(body))?)
}

struct Timing {
    total: Duration,
    first_token: Duration,
    /// The server said `Connection: close`: the next request needs a new one.
    closing: bool,
}

/// Buffers a client reuses from one answer to the next.
struct Scratch {
    /// Between the SSE events of the answer, in nanoseconds.
    gaps: Vec<u64>,
    /// A non-streaming answer so far, or the SSE event a frame cut in two.
    body: Vec<u8>,
}

async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    load: &Load,
    scratch: &mut Scratch,
) -> anyhow::Result<Timing> {
    sender.ready().await?;
    let request = post(load.path, load.body.clone(), load.chunked, &load.headers)?;
    let started = Instant::now();
    let response = sender.send_request(request).await?;
    let status = response.status();
    let closing = response
        .headers()
        .get(CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let sse = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut body = response.into_body();
    if status != StatusCode::OK {
        let text = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        bail!("status {status}: {}", String::from_utf8_lossy(&text));
    }
    let wire = |sse| if sse { "an SSE stream" } else { "JSON" };
    ensure!(
        sse == load.stream,
        "asked for {}, answered with {}",
        wire(load.stream),
        wire(sse)
    );
    let Scratch { gaps, body: kept } = scratch;
    gaps.clear();
    kept.clear();
    let mut check = Check::new(load.answer);
    let mut first_token = None;
    let mut last = started;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let now = Instant::now();
        if !sse {
            kept.extend_from_slice(&data);
            first_token.get_or_insert(now - started);
        } else {
            let (mut events, mut token) = (0usize, false);
            each_event(kept, &data, |event| {
                events += 1;
                token |= check.event(event)?;
                Ok(())
            })?;
            if first_token.is_none() {
                first_token = token.then(|| now - started);
            } else {
                gaps.push(nanos(now - last));
                gaps.extend(std::iter::repeat_n(0, events.saturating_sub(1)));
            }
        }
        last = now;
    }
    if sse {
        ensure!(kept.is_empty(), "the stream ended mid-event");
        check.ended()?;
    } else {
        check.body(kept)?;
    }
    Ok(Timing {
        total: last - started,
        first_token: first_token.unwrap_or_default(),
        closing,
    })
}

/// Calls `each` on every SSE event `data` completes, without the blank
/// line; `cut` carries an event split between frames over to the next.
fn each_event(
    cut: &mut Vec<u8>,
    data: &[u8],
    mut each: impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let joined = !cut.is_empty();
    if joined {
        cut.extend_from_slice(data);
    }
    let all = if joined { cut.as_slice() } else { data };
    let mut start = 0;
    for end in memmem::find_iter(all, b"\n\n") {
        if end > start {
            each(&all[start..end])?;
        }
        start = end + 2;
    }
    if joined {
        cut.drain(..start);
    } else {
        cut.extend_from_slice(&data[start..]);
    }
    Ok(())
}

/// What every token of the fake model reads.
const TOKEN: &[u8] = b" tok";
const STOP: &[u8] = br#""finish_reason":"stop""#;
const END_TURN: &[u8] = br#""stop_reason":"end_turn""#;

/// Checks one answer in its dialect, event by event for a stream.
struct Check {
    answer: Answer,
    /// Chat: a chunk said `"finish_reason":"stop"`; Messages: a
    /// `message_delta` said `end_turn`.
    stopped: bool,
    /// Messages: `message_start` came.
    started: bool,
    /// The stream's terminal event arrived: nothing may follow it.
    ended: bool,
}

impl Check {
    fn new(answer: Answer) -> Self {
        Check {
            answer,
            stopped: false,
            started: false,
            ended: false,
        }
    }

    /// Checks one SSE event; says whether it carries a generated token.
    fn event(&mut self, event: &[u8]) -> anyhow::Result<bool> {
        ensure!(!self.ended, "an event after the end: {}", excerpt(event));
        match self.answer {
            Answer::Chat => {
                if event == b"data: [DONE]" {
                    ensure!(self.stopped, "the stream lacks {}", excerpt(STOP));
                    self.ended = true;
                    return Ok(false);
                }
                self.stopped |= memmem::find(event, STOP).is_some();
                Ok(memmem::find(event, TOKEN).is_some())
            }
            Answer::Responses => match event_name(event) {
                b"response.output_text.delta" => Ok(true),
                b"response.completed" => {
                    ensure!(
                        response_completed(event),
                        "response.completed without a completed response: {}",
                        excerpt(event)
                    );
                    self.ended = true;
                    Ok(false)
                }
                b"response.failed" | b"response.incomplete" | b"error" => {
                    bail!("{}", excerpt(event))
                }
                _ => Ok(false),
            },
            Answer::Messages => {
                let kind = event_name(event);
                let typed = [br#""type":""#, kind, b"\""].concat();
                ensure!(
                    memmem::find(event, &typed).is_some(),
                    "the event line doesn't name the data's type: {}",
                    excerpt(event)
                );
                ensure!(
                    self.started || kind == b"message_start",
                    "message_start is not first: {}",
                    excerpt(event)
                );
                match kind {
                    b"message_start" => {
                        ensure!(!self.started, "a second message_start");
                        self.started = true;
                        Ok(false)
                    }
                    b"content_block_delta" => {
                        Ok(memmem::find(event, br#""type":"text_delta""#).is_some())
                    }
                    b"message_delta" => {
                        ensure!(
                            !self.stopped && memmem::find(event, END_TURN).is_some(),
                            "not one message_delta with end_turn: {}",
                            excerpt(event)
                        );
                        self.stopped = true;
                        Ok(false)
                    }
                    b"message_stop" => {
                        ensure!(self.stopped, "message_stop before end_turn");
                        self.ended = true;
                        Ok(false)
                    }
                    b"error" => bail!("{}", excerpt(event)),
                    _ => Ok(false),
                }
            }
            Answer::Containing(_) => bail!("a stream where JSON was expected"),
        }
    }

    /// The stream ended: it must have ended well.
    fn ended(&self) -> anyhow::Result<()> {
        let end = match self.answer {
            Answer::Chat => "data: [DONE]",
            Answer::Responses => "response.completed",
            Answer::Messages => "message_stop",
            Answer::Containing(_) => "its end",
        };
        ensure!(self.ended, "the stream ended without {end}");
        Ok(())
    }

    /// Checks a whole non-streaming answer.
    fn body(&self, body: &[u8]) -> anyhow::Result<()> {
        let good = match self.answer {
            Answer::Chat => memmem::find(body, STOP).is_some(),
            Answer::Responses => response_completed(body),
            Answer::Messages => {
                memmem::find(body, br#""type":"message""#).is_some()
                    && memmem::find(body, END_TURN).is_some()
            }
            Answer::Containing(expect) => memmem::find(body, expect).is_some(),
        };
        ensure!(good, "not the expected answer: {}", excerpt(body));
        Ok(())
    }
}

/// An SSE event's `event:` name (empty without one).
fn event_name(event: &[u8]) -> &[u8] {
    event.strip_prefix(b"event: ").map_or(&b""[..], |rest| {
        &rest[..memchr::memchr(b'\n', rest).unwrap_or(rest.len())]
    })
}

/// A Response object, or an event carrying one, whose own status (the
/// first `status` in it: items come after) is `completed`.
fn response_completed(json: &[u8]) -> bool {
    const STATUS: &[u8] = br#""status":"#;
    memmem::find(json, br#""object":"response""#).is_some()
        && memmem::find(json, STATUS)
            .is_some_and(|at| json[at + STATUS.len()..].starts_with(br#""completed""#))
}

/// The start of an answer, for an error message.
fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.into_owned(),
    }
}

/// Streams held open (until dropped) to weigh what each one costs.
pub struct OpenStreams {
    clients: Vec<JoinHandle<()>>,
}

impl Drop for OpenStreams {
    fn drop(&mut self) {
        for client in &self.clients {
            client.abort();
        }
    }
}

/// Opens `count` streams and returns once every one has had its first byte.
pub async fn open_streams(load: &Load, count: usize) -> anyhow::Result<OpenStreams> {
    let (started, mut first_tokens) = mpsc::channel(count);
    let mut streams = OpenStreams {
        clients: Vec::with_capacity(count),
    };
    for i in 0..count {
        let (addr, path, body, chunked, headers, started) = (
            load.addr,
            load.path,
            load.body.clone(),
            load.chunked,
            load.headers.clone(),
            started.clone(),
        );
        streams.clients.push(tokio::spawn(async move {
            let held = async {
                let mut sender = connect(addr).await?;
                let mut body = sender
                    .send_request(post(path, body, chunked, &headers)?)
                    .await?
                    .into_body();
                let mut announced = false;
                while let Some(frame) = body.frame().await {
                    frame?;
                    if !announced {
                        announced = true;
                        let _ = started.send(()).await;
                    }
                }
                anyhow::Ok(())
            };
            // An early end is noticed by the count of first bytes.
            let _ = held.await;
        }));
        // Don't overrun the listeners' accept queues.
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    drop(started);
    let deadline = Instant::now() + Duration::from_secs(60);
    for seen in 0..count {
        match tokio::time::timeout_at(deadline, first_tokens.recv()).await {
            Ok(Some(())) => {}
            _ => bail!("only {seen} of {count} streams started"),
        }
    }
    Ok(streams)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT_STREAM: &[u8] = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\" tok\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: [DONE]\n\n";

    /// A Responses stream as agent-proxy writes it (trimmed).
    const RESPONSES_STREAM: &[u8] = b"event: response.created\n\
data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n\
event: response.output_item.added\n\
data: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"item\":{\"type\":\"message\",\"status\":\"in_progress\"}}\n\n\
event: response.output_text.delta\n\
data: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"delta\":\" tok\"}\n\n\
event: response.output_item.done\n\
data: {\"type\":\"response.output_item.done\",\"sequence_number\":3,\"item\":{\"type\":\"message\",\"status\":\"completed\"}}\n\n\
event: response.completed\n\
data: {\"type\":\"response.completed\",\"sequence_number\":4,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"status\":\"completed\"}]}}\n\n";

    /// A Messages stream as agent-proxy writes it (trimmed).
    const MESSAGES_STREAM: &[u8] = b"event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"stop_reason\":null}}\n\n\
event: content_block_start\n\
data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" tok\"}}\n\n\
event: content_block_stop\n\
data: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1}}\n\n\
event: message_stop\n\
data: {\"type\":\"message_stop\"}\n\n";

    /// Feeds `stream` in frames of `size` bytes; the tokens seen, or the
    /// first error.
    fn stream(answer: Answer, stream: &[u8], size: usize) -> anyhow::Result<usize> {
        let (mut check, mut cut, mut tokens) = (Check::new(answer), Vec::new(), 0);
        for frame in stream.chunks(size) {
            each_event(&mut cut, frame, |event| {
                tokens += usize::from(check.event(event)?);
                Ok(())
            })?;
        }
        ensure!(cut.is_empty(), "the stream ended mid-event");
        check.ended()?;
        Ok(tokens)
    }

    fn replace(stream: &[u8], from: &str, to: &str) -> Vec<u8> {
        String::from_utf8_lossy(stream)
            .replace(from, to)
            .into_bytes()
    }

    #[test]
    fn good_streams_pass_whatever_the_frames() {
        for size in [1, 7, 64, usize::MAX] {
            assert_eq!(stream(Answer::Chat, CHAT_STREAM, size).unwrap(), 1);
            assert_eq!(
                stream(Answer::Responses, RESPONSES_STREAM, size).unwrap(),
                1
            );
            assert_eq!(stream(Answer::Messages, MESSAGES_STREAM, size).unwrap(), 1);
        }
    }

    #[test]
    fn bad_chat_streams_fail() {
        let no_done = &CHAT_STREAM[..CHAT_STREAM.len() - b"data: [DONE]\n\n".len()];
        let no_stop = replace(CHAT_STREAM, "\"finish_reason\":\"stop\"", "\"x\":1");
        let after = [CHAT_STREAM, b"data: {}\n\n"].concat();
        for bad in [no_done, &no_stop, &after] {
            assert!(stream(Answer::Chat, bad, usize::MAX).is_err());
        }
    }

    #[test]
    fn bad_responses_streams_fail() {
        let completed = "event: response.completed";
        let end = memmem::find(RESPONSES_STREAM, completed.as_bytes()).unwrap();
        let failed = replace(RESPONSES_STREAM, completed, "event: response.failed");
        let incomplete = replace(RESPONSES_STREAM, completed, "event: response.incomplete");
        let twice = [RESPONSES_STREAM, &RESPONSES_STREAM[end..]].concat();
        let status = replace(
            RESPONSES_STREAM,
            "\"object\":\"response\",\"status\":\"completed\"",
            "\"object\":\"response\",\"status\":\"failed\"",
        );
        let cut = &RESPONSES_STREAM[..RESPONSES_STREAM.len() - 5];
        let early_fail = [
            &RESPONSES_STREAM[..end],
            b"event: response.failed\ndata: {}\n\n",
            &RESPONSES_STREAM[end..],
        ]
        .concat();
        for bad in [
            &RESPONSES_STREAM[..end],
            &failed,
            &incomplete,
            &twice,
            &status,
            cut,
            &early_fail,
        ] {
            assert!(stream(Answer::Responses, bad, 64).is_err());
        }
    }

    #[test]
    fn bad_messages_streams_fail() {
        let stop = "event: message_stop";
        let end = memmem::find(MESSAGES_STREAM, stop.as_bytes()).unwrap();
        let start = memmem::find(MESSAGES_STREAM, b"event: content_block_start").unwrap();
        let max_tokens = replace(MESSAGES_STREAM, "end_turn", "max_tokens");
        let misnamed = replace(MESSAGES_STREAM, "event: content_block_stop", "event: ping");
        let error = [
            &MESSAGES_STREAM[..end],
            b"event: error\ndata: {\"type\":\"error\"}\n\n",
            &MESSAGES_STREAM[end..],
        ]
        .concat();
        let twice = [MESSAGES_STREAM, &MESSAGES_STREAM[end..]].concat();
        for bad in [
            &MESSAGES_STREAM[..end],
            &MESSAGES_STREAM[start..],
            &max_tokens,
            &misnamed,
            &error,
            &twice,
        ] {
            assert!(stream(Answer::Messages, bad, 64).is_err());
        }
    }

    #[test]
    fn whole_answers() {
        let check = |answer, body: &str| Check::new(answer).body(body.as_bytes()).is_ok();
        let response = r#"{"id":"resp_1","object":"response","created_at":1,"status":"completed","output":[{"type":"message","status":"completed"}]}"#;
        assert!(check(Answer::Responses, response));
        let failed = response.replacen("\"completed\"", "\"failed\"", 1);
        assert!(!check(Answer::Responses, &failed), "{failed}");
        assert!(!check(Answer::Responses, r#"{"error":{"message":"no"}}"#));
        let message = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":" tok"}],"stop_reason":"end_turn"}"#;
        assert!(check(Answer::Messages, message));
        let cut = message.replace("end_turn", "max_tokens");
        assert!(!check(Answer::Messages, &cut));
        assert!(!check(Answer::Messages, response));
        let chat = r#"{"choices":[{"message":{"content":" tok"},"finish_reason":"stop"}]}"#;
        assert!(check(Answer::Chat, chat));
        assert!(!check(Answer::Chat, response));
        assert!(check(
            Answer::Containing(b"temperature_c"),
            r#"{"temperature_c":21}"#
        ));
    }
}
