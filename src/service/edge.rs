//! The client connection: each request's head awaited and parsed, then
//! served by our routes or handed to pingora's proxy path.
//!
//! - the wait between requests is bounded by `limits.keepalive_timeout_ms`,
//!   and cut short for the connection idle the longest when
//!   `limits.max_connections` are open and another arrives (pingora would
//!   keep an idle keep-alive connection open for ever);
//! - a head, once begun, must be whole within `limits.header_timeout_ms`;
//! - a head that cannot be parsed gets an OpenAI error body (pingora's is an
//!   empty 400 that names it, `Server: Pingora`).
//!
//! A request for one of our own routes is served here, on our own HTTP/1
//! ([`h1`]), by what pingora's hooks would run (`request_filter`'s `route`,
//! `fail_to_proxy`'s `fail`, `logging`'s `log`; called directly, without the
//! box `async_trait` makes per call), and without pingora's proxy path
//! around them: its per-request future is sized for connecting, caching and
//! retrying upstream (14 KiB, held as long as a stream lasts). A request for
//! the proxy path is handed to pingora with its head (and what of its body
//! was read) as the connection's first bytes.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::BytesMut;
use memchr::memmem;
use pingora::apps::{HttpServerApp, ReusedHttpStream, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use pingora_timeout::fast_timeout::fast_timeout;
use tokio::io::AsyncReadExt;
use tokio::time::{timeout, Instant, Sleep};
use tracing::{error, warn};

use super::{h1, AgentProxy, ProxyPath};
use crate::boxed;
use crate::config::{Config, Held};
use crate::error::ApiError;
use crate::limits::{Connection, Connections};
use crate::shutdown::InFlight;

/// Reading a head stops just past the longest accepted.
const MAX_HEAD_BYTES: usize = h1::MAX_HEAD + 1;

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

/// A request's head, read and parsed.
#[expect(
    clippy::large_enum_variant,
    reason = "moved once, on the stack; a boxed session would be an allocation more a request"
)]
enum Arrived {
    /// Not HTTP/1 we take: refused.
    Malformed(Stream, h1::Malformed),
    /// For pingora's proxy path: the request as it arrived.
    ForPingora(Stream, BytesMut),
    /// For our handlers.
    Ours(h1::Session, ProxyPath),
}

/// How [`Edge::serve`] left a request.
enum Served {
    /// Answered: how the connection is left.
    Answered(h1::Finished),
    /// For pingora's proxy path: the connection, and the request as it
    /// arrived.
    PassedOn(Stream, BytesMut),
}

impl Edge {
    /// `limits.send_timeout_ms`, for a connection opened now.
    pub fn send_timeout(&self) -> Duration {
        self.config.load().limits.send_timeout
    }

    pub fn new(proxy: HttpProxy<AgentProxy>, config: Arc<ArcSwap<Config>>) -> Self {
        Edge {
            proxy: Arc::new(proxy),
            app: AgentProxy::new(config.clone()),
            config,
            connections: Connections::default(),
        }
    }

    /// The server is shutting down: connections waiting for a request close
    /// now, the others once their request is answered.
    pub fn close_idle(&self) {
        crate::shutdown::begin_draining();
        self.connections.close_idle();
    }

    /// One request, through our hooks in pingora's order for a request that
    /// `request_filter` answers.
    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` copies `session` (456 bytes) from its argument \
                  into a local of its future on the first poll; a block uses it in place"
    )]
    fn serve<'a>(
        &'a self,
        mut session: h1::Session,
        config: Held,
        shutdown: &'a ShutdownWatch,
    ) -> impl Future<Output = Served> + 'a {
        async move {
            // The signal's version first: an atomic load, where reading its
            // value takes a lock that every request on both cores shares.
            if shutdown.has_changed().unwrap_or(true) && *shutdown.borrow() {
                session.close_after();
            }
            let app = &self.app;
            let mut ctx = app.ctx_with(config);
            // Our routes' future is part of this one, which is boxed.
            match app.route(&mut session, &mut ctx).await {
                Ok(true) => {
                    app.log(
                        session.req_header(),
                        session.response_written(),
                        None,
                        &mut ctx,
                    );
                    session.end().await;
                    Served::Answered(session.finished())
                }
                Ok(false) => {
                    let (stream, request) = session.into_passed_on();
                    Served::PassedOn(stream, request)
                }
                Err(e) => {
                    let code = app.fail(&mut session, &e, &ctx).await;
                    if !super::is_routine(&e) {
                        error!("Fail to filter request: {e}, status: {code}");
                    }
                    app.log(
                        session.req_header(),
                        session.response_written(),
                        Some(&e),
                        &mut ctx,
                    );
                    Served::Answered(h1::Finished::Closed)
                }
            }
        }
    }

    /// What the head in `buf` asks for. Not async: the parsed head (408
    /// bytes) then never lives in the connection's future, which a request
    /// finds cold when many connections are open; it goes straight into the
    /// session, or into the bytes pingora's proxy path reads.
    fn arrived(&self, stream: Stream, mut buf: BytesMut, config: &Config) -> Arrived {
        let head = match h1::parse(&mut buf) {
            Ok(head) => head,
            Err(malformed) => return Arrived::Malformed(stream, malformed),
        };
        match super::proxy_path(&head, config) {
            // `buf`'s room (4 KiB) goes now, not as late as pingora's request.
            ProxyPath::Now => Arrived::ForPingora(stream, head.as_sent(&buf)),
            proxy_path => Arrived::Ours(h1::Session::new(stream, head, buf), proxy_path),
        }
    }

    /// Hands a request to pingora's proxy path, which parses `request` (its
    /// head, and what of its body was read) as the connection's first bytes,
    /// and serves it as the connection's last (`AgentProxy`'s `request_filter`
    /// says why): what it returns is never reused. Not an `async fn`:
    /// pingora's future is boxed already, and ours would only be a frame
    /// around it.
    fn pass_on<'a>(
        &'a self,
        stream: Stream,
        request: BytesMut,
        shutdown: &'a ShutdownWatch,
    ) -> impl Future<Output = Option<ReusedHttpStream>> + 'a {
        // The connection's last request (see `request_filter`): its buffer
        // holds nothing more.
        super::write_buffer::writing_through();
        let mut session = ServerSession::new_http1(stream);
        if let ServerSession::H1(h1) = &mut session {
            // Interim answers (103 Early Hints) mean nothing to an API
            // client, and an HTTP/1.0 one must get none (RFC 9110 §15.2);
            // a switch, and a 100 the client waits for, still go.
            h1.set_ignore_info_resp(true);
        }
        // Bytes a client pipelined after the request wait for a next
        // request that never comes, rather than being an error that cuts
        // this one off (no answer, a reset).
        session.set_pipelining_enabled(true);
        session.set_pipelined_prefix(request);
        self.proxy.process_new_http(session, shutdown)
    }
}

#[async_trait]
impl ServerApp for Edge {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let (max, mut timeouts) = {
            let config = self.config.load();
            (config.limits.max_connections, HeadTimeouts::of(&config))
        };
        let Some(connection) = self.connections.admit(max) else {
            warn!(
                max,
                "limits.max_connections open and none idle: connection refused"
            );
            return None;
        };
        // Bytes of the next request, read with the last one.
        let mut next = BytesMut::new();
        // A new connection's first request counts as in flight from the
        // accept, so a graceful shutdown (or an upgrade's hand-over) waits
        // for it: its client sent it to a listening socket.
        let mut arriving = Some(InFlight::arriving());
        let mut between = Between {
            connection: &connection,
            timer: pin!(tokio::time::sleep(Duration::ZERO)),
        };
        loop {
            let first = arriving.is_some();
            let buf = read_head(&mut stream, next, &mut between, timeouts, first).await?;
            // The request's config, loaded once: its route and its context
            // are read from it, and the next wait's timeouts.
            let config = Held::current(&self.config);
            timeouts = HeadTimeouts::of(&config);
            let arrived = self.arrived(stream, buf, &config);
            match arrived {
                Arrived::Malformed(stream, malformed) => {
                    drop(config);
                    boxed::pinned(move || refuse(stream, malformed)).await;
                    return None;
                }
                Arrived::ForPingora(stream, request) => {
                    // Pingora's proxy path takes its own.
                    drop(config);
                    self.pass_on(stream, request, shutdown).await;
                    return None;
                }
                // Boxed: a request's state is held only while it lasts,
                // not by every idle connection.
                Arrived::Ours(session, proxy_path) => {
                    match boxed::pinned(|| self.serve(session, config, shutdown)).await {
                        Served::Answered(h1::Finished::Reusable(reusable, read)) => {
                            arriving = None;
                            (stream, next) = (reusable, read);
                            continue;
                        }
                        Served::Answered(h1::Finished::Unread(stream)) => {
                            boxed::pinned(move || close_draining(stream)).await;
                            return None;
                        }
                        Served::Answered(h1::Finished::Closed) => return None,
                        Served::PassedOn(stream, request) if proxy_path == ProxyPath::Perhaps => {
                            self.pass_on(stream, request, shutdown).await;
                            return None;
                        }
                        Served::PassedOn(..) => {
                            error!(
                                "a request passed on from a route that never is: connection closed"
                            );
                            return None;
                        }
                    }
                }
            }
        }
    }

    async fn cleanup(&self) {
        self.proxy.http_cleanup().await;
    }
}

/// How long to wait for a request, and then for the rest of its head.
#[derive(Clone, Copy)]
struct HeadTimeouts {
    /// For the first byte of the next request (keep-alive).
    idle: Duration,
    /// For the rest of the head once it began.
    whole: Duration,
}

impl HeadTimeouts {
    fn of(config: &Config) -> Self {
        HeadTimeouts {
            idle: config.limits.keepalive_timeout,
            whole: config.limits.header_timeout,
        }
    }
}

/// What a connection waits on between requests, made once for its life
/// and re-armed for each wait without a lock: a timer made per request
/// takes the runtime's timer lock to register, and again to drop. The
/// server's shutdown reaches a waiting connection through its own slot
/// ([`Connection`]): pingora's shutdown signal, waited on, took a lock that
/// every connection on both cores shared, at every wait.
struct Between<'a> {
    connection: &'a Connection<'a>,
    /// Pushed later for each wait (a compare-and-swap).
    timer: Pin<&'a mut Sleep>,
}

/// The next request's head (and any body bytes that came with it), or
/// `None` when the connection should close: the client left, it stayed
/// idle past `timeouts.idle`, its head took longer than `timeouts.whole`
/// (a client dripping bytes), it was shed to make room, or the server is
/// shutting down. A connection's `first` request still gets
/// [`FIRST_REQUEST_AFTER_SHUTDOWN`] to begin then: accepted just before
/// the listener closed, its client is sending it. `read`: what of it was
/// read with the last request (pipelined), if anything.
async fn read_head(
    stream: &mut Stream,
    read: BytesMut,
    between: &mut Between<'_>,
    timeouts: HeadTimeouts,
    first: bool,
) -> Option<BytesMut> {
    let mut head = read;
    if head.is_empty() && !between.connection.closing() {
        head.reserve(READ_CHUNK);
        let idle = between.connection.idle();
        between.timer.as_mut().reset(Instant::now() + timeouts.idle);
        tokio::select! {
            read = stream.read_buf(&mut head) => {
                if !matches!(read, Ok(1..)) {
                    return None;
                }
            }
            () = between.timer.as_mut() => return None,
            // Room made for another connection, or the server is shutting
            // down: the head stays empty.
            () = idle.shed() => {}
        }
    }
    if head.is_empty() {
        // Shed, or shutting down: only a connection's first request still
        // gets its moment to arrive.
        if !(first && between.connection.closing()) {
            return None;
        }
        head.reserve(READ_CHUNK);
        let read = stream.read_buf(&mut head);
        if !matches!(
            timeout(FIRST_REQUEST_AFTER_SHUTDOWN, read).await,
            Ok(Ok(1..))
        ) {
            return None;
        }
    }
    // Most heads come whole in their first read: no timer for the rest.
    let mut scanned = 0;
    if head_complete(&head, &mut scanned) {
        return Some(head);
    }
    let rest = async {
        while !head_complete(&head, &mut scanned) && head.len() < MAX_HEAD_BYTES {
            head.reserve(READ_CHUNK);
            if !matches!(stream.read_buf(&mut head).await, Ok(1..)) {
                return false;
            }
        }
        true
    };
    match fast_timeout(timeouts.whole, rest).await {
        Ok(true) => Some(head),
        _ => None,
    }
}

/// A line end, then an empty line: how every client's head ends.
static CRLF_BLANK: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\n\r\n"));
/// The same with bare `\n` line ends, which pingora's parser takes too.
static LF_BLANK: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(b"\n\n"));

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
    // The blank line itself searched for, by memchr's SIMD search: line by
    // line, a coding agent's twenty fields took 1.1k instructions.
    let rest = &head[from..];
    let found = CRLF_BLANK.find(rest).is_some() || LF_BLANK.find(rest).is_some();
    // The last two bytes may begin a blank line the next read completes.
    *scanned = head.len().saturating_sub(2).max(start);
    found
}

/// Answers a head that cannot be served with an OpenAI error, and closes.
async fn refuse(mut stream: Stream, malformed: h1::Malformed) {
    let body = ApiError::bad_request(malformed.why).to_json();
    if h1::refuse(&mut stream, malformed.status, &body)
        .await
        .is_ok()
    {
        close_draining(stream).await;
    }
}

/// Closes a connection whose answer went out before all the client sent
/// was read: our side first, then what still comes is read and dropped.
async fn close_draining(mut stream: Stream) {
    stream.shutdown().await;
    linger(stream).await;
}

/// How long a connection closing with its client's bytes unread reads them
/// first (nginx: `lingering_time`, 30 s, of 5 s silences at most).
pub const LINGER: Duration = Duration::from_secs(2);

/// Reads what the client still sends, for a bounded time, before the
/// connection closes: closing with unread bytes resets it, and the client
/// could lose the answer.
async fn linger(mut stream: Stream) {
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

    proptest::proptest! {
        /// Read by read, the search says what a byte-by-byte look at the
        /// whole says: a line end, then `\n` or `\r\n`, past any blank
        /// lines before the request line.
        #[test]
        fn the_search_agrees_with_a_look_at_every_byte(
            head in proptest::collection::vec(
                proptest::sample::select(vec![b'\r', b'\n', b'a', b' ']), 0..40),
            cuts in proptest::collection::vec(0usize..40, 0..4),
        ) {
            let start = head.iter().position(|b| !matches!(b, b'\r' | b'\n')).unwrap_or(head.len());
            let whole = (start..head.len()).any(|i| {
                head[i] == b'\n' && (head[i + 1..].starts_with(b"\n") || head[i + 1..].starts_with(b"\r\n"))
            });
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < head.len()).collect();
            cuts.sort_unstable();
            let mut scanned = 0;
            let mut found = false;
            for cut in cuts.into_iter().chain([head.len()]) {
                found = head_complete(&head[..cut], &mut scanned);
                if found {
                    break;
                }
            }
            proptest::prop_assert_eq!(found, whole);
        }
    }

    #[test]
    fn a_blank_line_split_across_reads_is_found() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut scanned = 0;
        assert!(!head_complete(&head[..head.len() - 1], &mut scanned));
        assert!(head_complete(head, &mut scanned));
    }
}
