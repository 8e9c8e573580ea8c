//! The load generator: closed-loop keep-alive HTTP/1.1 connections, each
//! sending one request after another, timed as the client sees them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, ensure};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST};
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
    /// Must appear in every answer (in one frame): proves it is the real one.
    pub expect: &'static [u8],
    pub connections: usize,
    pub warmup: Duration,
    /// Clients start spread over this time, so they don't move in lockstep.
    pub stagger: Duration,
    pub measure: Duration,
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
    let mut gaps = Vec::with_capacity(512);
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
        gaps.clear();
        let answer = exchange(conn, &load, &mut gaps).await;
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
                for gap in &gaps {
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

fn post(path: &str, body: Bytes) -> anyhow::Result<Request<Full<Bytes>>> {
    Ok(Request::post(path)
        .header(HOST, "bench")
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))?)
}

struct Timing {
    total: Duration,
    first_token: Duration,
    /// The server said `Connection: close`: the next request needs a new one.
    closing: bool,
}

const DONE: &[u8] = b"data: [DONE]\n\n";
/// What every token of the fake model reads.
const TOKEN: &[u8] = b" tok";

async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    load: &Load,
    gaps: &mut Vec<u64>,
) -> anyhow::Result<Timing> {
    sender.ready().await?;
    let request = post(load.path, load.body.clone())?;
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
    let mut first_token = None;
    let mut last = started;
    let mut found = false;
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let now = Instant::now();
        if first_token.is_none() && (!sse || memmem::find(&data, TOKEN).is_some()) {
            first_token = Some(now - started);
        } else if sse && first_token.is_some() {
            gaps.push(nanos(now - last));
            let events = memmem::find_iter(&data, b"\n\n").count();
            gaps.extend(std::iter::repeat_n(0, events.saturating_sub(1)));
        }
        last = now;
        found |= memmem::find(&data, load.expect).is_some();
        done = data.ends_with(DONE);
    }
    ensure!(
        found,
        "the answer lacks {}",
        String::from_utf8_lossy(load.expect)
    );
    ensure!(!sse || done, "the stream ended without [DONE]");
    Ok(Timing {
        total: last - started,
        first_token: first_token.unwrap_or_default(),
        closing,
    })
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
        let (addr, path, body, started) =
            (load.addr, load.path, load.body.clone(), started.clone());
        streams.clients.push(tokio::spawn(async move {
            let held = async {
                let mut sender = connect(addr).await?;
                let mut body = sender.send_request(post(path, body)?).await?.into_body();
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
