//! The client connection, around pingora's handling of each request on it.
//!
//! Pingora keeps an idle keep-alive connection open for ever, and answers a
//! request head it cannot parse with an empty 400 that names it
//! (`Server: Pingora`) before any hook of ours runs. So the wait for each
//! request's head, and a first parse of it, happen here:
//!
//! - the wait between requests is bounded by `limits.keepalive_timeout_ms`,
//!   and cut short for the connection idle the longest when
//!   `limits.max_connections` are open and another arrives;
//! - a head, once begun, must be whole within `limits.header_timeout_ms`;
//! - a head pingora's own parser refuses gets an OpenAI error body.
//!
//! Pingora parses the head once it is whole. A request for one of our own
//! routes is then served here, by what pingora's hooks would run
//! (`request_filter`'s `route`, `fail_to_proxy`, `logging`'s `log`; called
//! directly, without the box `async_trait` makes per call), and without
//! pingora's proxy path around them: its per-request future is sized for
//! connecting, caching and retrying upstream (14 KiB, held as long as a
//! stream lasts), and it would parse the head a second time. A request for
//! the proxy path is handed to pingora with the head as the connection's
//! first bytes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::BytesMut;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream, ServerApp};
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::proxy::{HttpProxy, ProxyHttp, Session};
use pingora::server::ShutdownWatch;
use pingora::ErrorType;
use pingora_timeout::fast_timeout::fast_timeout;
use tokio::io::AsyncReadExt;
use tracing::{error, warn};

use super::{AgentProxy, ProxyPath};
use crate::boxed;
use crate::config::Config;
use crate::error::ApiError;
use crate::limits::{Connection, Connections};
use crate::shutdown::InFlight;

/// Pingora refuses a head over 1 MiB − 1 byte; reading stops just past it.
const MAX_HEAD_BYTES: usize = 1 << 20;

/// How much a read of the head asks for at once.
const READ_CHUNK: usize = 4096;

/// How long a new connection's first request may take to begin once the
/// server is shutting down.
const FIRST_REQUEST_AFTER_SHUTDOWN: Duration = Duration::from_secs(1);

pub struct Edge {
    /// Pingora's proxy path, for the requests our handlers pass on.
    proxy: Arc<HttpProxy<AgentProxy>>,
    /// Our hooks, called directly for the requests they answer.
    app: AgentProxy,
    config: Arc<ArcSwap<Config>>,
    connections: Connections,
}

/// How [`Edge::serve`] left a request.
enum Served {
    /// Answered; the connection, if it can take another request.
    Answered(Option<ReusedHttpStream>),
    /// For pingora's proxy path, untouched but for its parsed head.
    PassedOn(Box<ServerSession>),
}

impl Edge {
    pub fn new(proxy: HttpProxy<AgentProxy>, config: Arc<ArcSwap<Config>>) -> Self {
        Edge {
            proxy: Arc::new(proxy),
            app: AgentProxy::new(config.clone()),
            config,
            connections: Connections::default(),
        }
    }

    /// One request, through our hooks in pingora's order for a request that
    /// `request_filter` answers.
    async fn serve(&self, mut session: Session, shutdown: &ShutdownWatch) -> Served {
        if *shutdown.borrow() {
            session.set_keepalive(None);
        }
        let app = &self.app;
        let mut ctx = app.new_ctx();
        // Our routes' future, built in its box (`boxed`); pingora's trait
        // would box it by a copy.
        match boxed::pinned(|| app.route(&mut session, &mut ctx)).await {
            Ok(true) => {
                app.log(&session, None, &mut ctx);
                let settings = HttpPersistentSettings::for_session(&session);
                // Boxed: finishing is brief, and its future (3.7 KiB) would
                // be held for the whole request.
                let downstream = session.downstream_session;
                let reusable = boxed::pinned(move || downstream.finish()).await;
                let reusable = reusable.ok().flatten();
                Served::Answered(
                    reusable.map(|s| ReusedHttpStream::from_reusable_stream(s, settings)),
                )
            }
            Ok(false) => Served::PassedOn(session.downstream_session),
            Err(e) => {
                let failed = app.fail_to_proxy(&mut session, &e, &mut ctx).await;
                if !app.suppress_error_log(&session, &ctx, &e) {
                    error!("Fail to filter request: {e}, status: {}", failed.error_code);
                }
                app.log(&session, Some(&e), &mut ctx);
                Served::Answered(None)
            }
        }
    }

    /// Hands a request whose head `session` parsed to pingora's proxy path,
    /// which parses `head` again. Not an `async fn`: pingora's future is
    /// boxed already, and ours would only be a frame around it.
    fn pass_on<'a>(
        &'a self,
        mut session: Box<ServerSession>,
        head: BytesMut,
        shutdown: &'a ShutdownWatch,
    ) -> impl Future<Output = Option<ReusedHttpStream>> + 'a {
        session.set_pipelined_prefix(head);
        self.proxy.process_new_http(*session, shutdown)
    }

    /// How long to wait for a request, and then for the rest of its head.
    fn head_timeouts(&self) -> HeadTimeouts {
        let limits = &self.config.load().limits;
        HeadTimeouts {
            idle: limits.keepalive_timeout,
            whole: limits.header_timeout,
        }
    }
}

#[async_trait]
impl ServerApp for Edge {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let max = self.config.load().limits.max_connections;
        let Some(connection) = self.connections.admit(max) else {
            warn!(
                max,
                "limits.max_connections open and none idle: connection refused"
            );
            return None;
        };
        let mut persisted = None;
        // A new connection's first request counts as in flight from the
        // accept, so a graceful shutdown (or an upgrade's hand-over) waits
        // for it: its client sent it to a listening socket.
        let mut arriving = Some(InFlight::enter());
        loop {
            let first = arriving.is_some();
            let timeouts = self.head_timeouts();
            let head = read_head(&mut stream, &connection, timeouts, first, shutdown).await?;
            let mut session = Session::new_h1(stream);
            if let Some(settings) = persisted.take() {
                HttpPersistentSettings::apply_to_session(settings, &mut session);
            }
            // Pingora parses (and keeps) the copy; `head` stays for a
            // request that goes on to its proxy path, which parses it again.
            session.set_pipelined_prefix(head.clone());
            // Boxed, like `refuse` below: this future lives as long as the
            // connection (idle or streaming), so it keeps only what every
            // state needs; parsing a head is brief and heap-allocated.
            match boxed::pinned(|| session.read_request()).await {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) if e.etype() == &ErrorType::InvalidHTTPHeader => {
                    let too_large = head.len() >= MAX_HEAD_BYTES;
                    let downstream = *session.downstream_session;
                    boxed::pinned(move || refuse(downstream, too_large)).await;
                    return None;
                }
                Err(_) => return None,
            }
            let proxy_path = super::proxy_path(session.req_header(), &self.config.load());
            let reused = if proxy_path == ProxyPath::Now {
                self.pass_on(session.downstream_session, head, shutdown)
                    .await
            } else {
                // The head is kept only for a request that may yet be passed
                // on: a front door's (with up to 4 KiB of its body) would
                // hold it for as long as its answer streams.
                let head = (proxy_path == ProxyPath::Perhaps).then_some(head);
                // Boxed: a request's state is held only while it lasts,
                // not by every idle connection.
                match (boxed::pinned(|| self.serve(session, shutdown)).await, head) {
                    (Served::Answered(reused), _) => reused,
                    (Served::PassedOn(session), Some(head)) => {
                        self.pass_on(session, head, shutdown).await
                    }
                    (Served::PassedOn(_), None) => {
                        error!("a request passed on from a route that never is: connection closed");
                        None
                    }
                }
            };
            arriving = None;
            (stream, persisted) = reused?.consume();
        }
    }

    async fn cleanup(&self) {
        self.proxy.http_cleanup().await;
    }
}

#[derive(Clone, Copy)]
struct HeadTimeouts {
    /// For the first byte of the next request (keep-alive).
    idle: Duration,
    /// For the rest of the head once it began.
    whole: Duration,
}

/// The next request's head (and any body bytes that came with it), or
/// `None` when the connection should close: the client left, it stayed
/// idle past `timeouts.idle`, its head took longer than `timeouts.whole`
/// (a client dripping bytes), it was shed to make room, or the server is
/// shutting down. A connection's `first` request still gets
/// [`FIRST_REQUEST_AFTER_SHUTDOWN`] to begin then: accepted just before
/// the listener closed, its client is sending it.
async fn read_head(
    stream: &mut Stream,
    connection: &Connection<'_>,
    timeouts: HeadTimeouts,
    first: bool,
    shutdown: &ShutdownWatch,
) -> Option<BytesMut> {
    let keepalive = timeouts.idle;
    let mut head = BytesMut::with_capacity(READ_CHUNK);
    {
        let idle = connection.idle();
        let mut shutdown = shutdown.clone();
        let stop = async {
            let _ = shutdown.wait_for(|&down| down).await;
            if first {
                tokio::time::sleep(FIRST_REQUEST_AFTER_SHUTDOWN).await;
            }
        };
        // pingora's shared 10 ms timer wheel, not a runtime timer: tokio
        // wakes its driver (an eventfd write and often a thread) when a
        // timer is registered earlier than any it had, once per request.
        tokio::select! {
            read = fast_timeout(keepalive, stream.read_buf(&mut head)) => {
                if !matches!(read, Ok(Ok(1..))) {
                    return None;
                }
            }
            _ = idle.shed() => return None,
            _ = stop => return None,
        }
    }
    let rest = async {
        let mut scanned = 0;
        while !head_complete(&head, &mut scanned) && head.len() < MAX_HEAD_BYTES {
            head.reserve(READ_CHUNK);
            if !matches!(stream.read_buf(&mut head).await, Ok(1..)) {
                return false;
            }
        }
        true
    };
    match fast_timeout(timeouts.whole, rest).await {
        // A copy the size of the head, not of the buffer it was read into:
        // pingora keeps the buffer it parses for as long as the request lasts.
        Ok(true) => Some(BytesMut::from(&head[..])),
        _ => None,
    }
}

/// Whether `head` holds a blank line after the request line (a line end is
/// `\n` or `\r\n`, as pingora's parser takes them; blank lines before the
/// request line are skipped). `scanned` keeps the search from starting over
/// on each read.
fn head_complete(head: &[u8], scanned: &mut usize) -> bool {
    let start = head
        .iter()
        .position(|b| !matches!(b, b'\r' | b'\n'))
        .unwrap_or(head.len());
    let from = (*scanned).max(start);
    let found = head[from..]
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .any(|(i, _)| {
            let rest = &head[from + i + 1..];
            rest.starts_with(b"\n") || rest.starts_with(b"\r\n")
        });
    // The last two bytes may begin a blank line the next read completes.
    *scanned = head.len().saturating_sub(2).max(start);
    found
}

/// Answers a head pingora's parser refused with an OpenAI error, and closes.
async fn refuse(mut session: ServerSession, too_large: bool) {
    let error = ApiError::bad_request(if too_large {
        "the request head is larger than 1 MiB"
    } else {
        "malformed HTTP request: the request line or a header cannot be parsed"
    });
    let body = error.to_json();
    let Ok(mut header) = ResponseHeader::build(error.status, Some(2)) else {
        return;
    };
    let headers = [
        (http::header::CONTENT_TYPE, "application/json"),
        (http::header::CONTENT_LENGTH, &body.len().to_string()),
    ];
    for (name, value) in headers {
        if header.insert_header(name, value).is_err() {
            return;
        }
    }
    if session.write_error_response(header, body).await.is_ok() {
        session.shutdown().await;
        linger(session).await;
    }
}

/// Reads what the client still sends, for a bounded time, before the
/// connection closes: closing with unread bytes resets it, and the client
/// could lose the answer.
async fn linger(session: ServerSession) {
    const LINGER: Duration = Duration::from_secs(2);
    let ServerSession::H1(session) = session else {
        return;
    };
    let mut stream = session.into_inner();
    let mut sink = vec![0; READ_CHUNK];
    let drain = async { while matches!(stream.read(&mut sink).await, Ok(1..)) {} };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(head: &[u8]) -> bool {
        head_complete(head, &mut 0)
    }

    #[test]
    fn a_head_ends_at_its_first_blank_line() {
        assert!(complete(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(complete(b"GET / HTTP/1.1\nHost: x\n\n"));
        assert!(complete(b"GET / HTTP/1.1\r\n\r\nbody"));
        assert!(!complete(b"GET / HTTP/1.1\r\nHost: x\r\n"));
        assert!(
            !complete(b"\r\n\r\nGET / HTTP/1.1\r\n"),
            "leading blank lines"
        );
    }

    #[test]
    fn a_blank_line_split_across_reads_is_found() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut scanned = 0;
        assert!(!head_complete(&head[..head.len() - 1], &mut scanned));
        assert!(head_complete(head, &mut scanned));
    }
}
