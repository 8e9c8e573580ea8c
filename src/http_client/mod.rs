//! The outbound HTTP client. pingora connects (its connector for TLS and
//! ALPN; for plain HTTP its TCP connect, the socket then read and written as
//! our [`Socket`]); an HTTP/1 exchange is written and read here (`h1`) and its idle
//! connection waits in our own `pool`; HTTP/2 is pingora's session and pool.
//! Model upstreams and HTTP tools both call out through an [`Endpoint`]; the
//! upstream layer (`upstream/`) decides which endpoint and how often, and
//! pingora's proxy path connects to the same endpoints' [`Peers`].
//!
//! A host name's every address is tried ([`Peers`]): `localhost` is often
//! `::1` first while the model server listens on `127.0.0.1` only.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use futures::future::{BoxFuture, Either, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use pingora::connectors::http::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::client::HttpSession;
use pingora::protocols::l4;
use pingora::upstreams::peer::{HttpPeer, Peer};
use pingora::utils::tls::{parse_x509, WrappedX509};
use pingora::{Error, ErrorType, OrErr, Result};
use tokio::io::AsyncWriteExt;

use crate::http1::Fields;
use crate::per_thread::PerThread;
use crate::socket::Socket;

mod h1;
mod pool;
mod request;

pub use request::{EditHeaders, Request, CONTENT_TYPE, JSON};

/// How long a DNS answer is reused before the name is looked up again.
const DNS_TTL: Duration = Duration::from_secs(30);
/// How long a connection attempt runs alone before the next address is
/// tried beside it (RFC 8305's connection attempt delay).
const ATTEMPT_DELAY: Duration = Duration::from_millis(250);
/// How long a request whose write failed waits for an answer the server
/// sent before it closed (it came with the failure, or not at all).
const EARLY_ANSWER: Duration = Duration::from_secs(1);

/// A parsed base URL (`http[s]://host[:port][/base/path]`) with its own
/// connection settings.
pub struct Endpoint {
    tls: bool,
    host: String,
    port: u16,
    base_path: String,
    /// `host[:port]` as written, without userinfo: the `Host` header.
    authority: String,
    /// `scheme://host[:port]`: where connections go, for messages and logs.
    origin: String,
    timeouts: Timeouts,
    /// Roots that replace the system's for this endpoint (`ca_file`).
    ca: Option<Arc<[WrappedX509]>>,
    /// The peers of each thread's last name lookup: the counts of an `Arc`
    /// shared by both cores' requests moved between them at each request.
    peers: PerThread<Mutex<Option<Arc<Peers>>>>,
}

/// Every address of an endpoint's host, each as a peer (pingora pools
/// connections per peer), in the order connections try them: IPv6 and IPv4
/// alternating (RFC 8305), from the address that last connected.
pub struct Peers {
    resolved: Instant,
    /// Each with its pool key (`reuse_hash`, which hashes every field of
    /// the peer), computed once.
    list: Vec<(Arc<HttpPeer>, u64)>,
    /// Where in `list` attempts start: the address that last connected, or
    /// the one after an address that failed.
    preferred: AtomicUsize,
}

impl Peers {
    /// How many addresses (never none: a lookup without any fails).
    pub fn count(&self) -> usize {
        self.list.len()
    }

    /// Where attempts start now; the `k`-th attempt goes to
    /// `(preferred() + k) % len()`.
    pub fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.list.len()
    }

    pub fn peer(&self, index: usize) -> &Arc<HttpPeer> {
        &self.list[index % self.list.len()].0
    }

    fn reuse_hash(&self, index: usize) -> u64 {
        self.list[index % self.list.len()].1
    }

    fn connected(&self, index: usize) {
        self.preferred.store(index, Ordering::Relaxed);
    }

    /// The address at `index` refused or timed out: if attempts started
    /// there, they start at the next one from now on.
    pub fn failed(&self, index: usize) {
        let next = (index + 1) % self.list.len();
        let _ = self
            .preferred
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Connects to the first address that accepts, the way RFC 8305 does:
    /// the next address is tried as soon as one fails, or beside a slow one
    /// after [`ATTEMPT_DELAY`]; the first to connect wins. Returns the
    /// connection, whether it was pooled, and the peer it is with. On
    /// failure, the first address's error: the one most likely to be the
    /// right one.
    async fn connect(&self) -> Result<(Connection, bool, usize)> {
        let start = self.preferred();
        if let Some(link) = pool::shared().take(self.reuse_hash(start)) {
            return Ok((Connection::H1(link), true, start));
        }
        let mut order = (0..self.count()).map(|k| (start + k) % self.count());
        let attempt = |index: usize| async move { (index, connect(self.peer(index)).await) };
        let mut racing = FuturesUnordered::new();
        racing.extend(order.next().map(attempt));
        let mut failure = None;
        // `racing` is never empty here: a failure with nothing left to try returns.
        loop {
            let more = order.len() > 0;
            tokio::select! {
                Some((index, result)) = racing.next() => match result {
                    Ok((connection, reused)) => {
                        self.connected(index);
                        return Ok((connection, reused, index));
                    }
                    Err(e) => {
                        self.failed(index);
                        let first = failure.take().unwrap_or(e);
                        match order.next() {
                            Some(next) => racing.push(attempt(next)),
                            None if racing.is_empty() => return Err(first),
                            None => {}
                        }
                        failure = Some(first);
                    }
                },
                _ = tokio::time::sleep(ATTEMPT_DELAY), if more => {
                    racing.extend(order.next().map(attempt));
                }
            }
        }
    }
}

/// A new connection to `peer`, and whether pingora's pool had it (an
/// HTTP/2 one). Plain HTTP is a TCP connection of ours ([`Socket`]): its
/// reads then skip pingora's stream (see [`crate::socket`]); the connect
/// itself and its errors are pingora's, as for TLS, which is pingora's
/// connector's throughout.
async fn connect(peer: &HttpPeer) -> Result<(Connection, bool)> {
    if let (false, Some(&addr)) = (peer.is_tls(), peer.address().as_inet()) {
        let connecting = l4::ext::connect(&addr, None);
        let stream = match peer.options.connection_timeout {
            Some(limit) => pingora_timeout::timeout(limit, connecting)
                .await
                .map_err(|_| {
                    Error::explain(
                        ErrorType::ConnectTimedout,
                        format!("timeout {limit:?} connecting to server {peer}"),
                    )
                })??,
            None => connecting.await?,
        };
        stream
            .set_nodelay(true)
            .or_err(ErrorType::ConnectError, "setting TCP_NODELAY")?;
        let link = h1::Link::new(Box::new(Socket::new(stream, addr)));
        return Ok((Connection::H1(link), false));
    }
    let (session, reused) = connector().get_http_session(peer).await?;
    let connection = match session {
        HttpSession::H1(h1) => Connection::H1(h1::Link::new(h1.into_inner())),
        other => Connection::Other(Box::new(other)),
    };
    Ok((connection, reused))
}

/// A connection to a peer: HTTP/1 ones are ours to read and write
/// ([`h1`]), HTTP/2 ones pingora's.
enum Connection {
    H1(h1::Link),
    Other(Box<HttpSession>),
}

/// How long each phase of an exchange may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// TCP and TLS connect.
    pub connect: Duration,
    /// From the request sent to the response header.
    pub first_byte: Duration,
    /// Between two reads of the body.
    pub idle: Duration,
    /// The whole exchange, body included; `None`: unbounded.
    pub total: Option<Duration>,
}

impl Timeouts {
    /// One limit for every phase (tools).
    pub fn all(limit: Duration) -> Self {
        Timeouts {
            connect: limit,
            first_byte: limit,
            idle: limit,
            total: Some(limit),
        }
    }
}

/// `url` with the password of its userinfo (`user:password@`), or the
/// whole userinfo when it has no `:`, replaced by `***`: for messages. The
/// userinfo ends at the last `@` before any query: a password pasted as it
/// is may hold a `/` (base64), and an `@` in a path is rarer.
pub fn redacted(url: &str) -> std::borrow::Cow<'_, str> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['?', '#'])
        .map_or(url.len(), |i| start + i);
    let Some(at) = url[start..end].rfind('@').map(|i| start + i) else {
        return url.into();
    };
    let hidden = url[start..at].find(':').map_or(start, |i| start + i + 1);
    format!("{}***{}", &url[..hidden], &url[at..]).into()
}

/// Refuses a URL whose `authority` carries credentials (`user:password@`):
/// taken, they were sent nowhere or, by an MCP client, as Basic auth the
/// operator never asked for. `url` is shown redacted.
pub fn without_credentials(url: &str, authority: &http::uri::Authority) -> Result<(), String> {
    match authority.as_str().contains('@') {
        true => Err(format!(
            "URL `{}` carries credentials (`user:password@`): give an upstream's key as \
             `api_key`, a tool's or an MCP server's as one of its `headers`",
            redacted(url)
        )),
        false => Ok(()),
    }
}

/// The message of a URL that does not parse, without its credentials.
pub fn invalid_url(url: &str, error: impl std::fmt::Display) -> String {
    format!("invalid URL `{}`: {error}", redacted(url))
}

pub struct EndpointOptions {
    pub timeouts: Timeouts,
    /// PEM CA bundle replacing the system roots (for private CAs and tests).
    pub ca_file: Option<String>,
}

impl Endpoint {
    pub fn parse(url: &str, options: EndpointOptions) -> std::result::Result<Self, String> {
        let uri: http::Uri = url.parse().map_err(|e| invalid_url(url, e))?;
        // Messages show it without its credentials, if any.
        let url = &*redacted(url);
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("URL `{url}` must start with http:// or https://")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("URL `{url}` has no host"))?;
        without_credentials(url, authority)?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = match explicit_port(authority) {
            None => {
                if tls {
                    443
                } else {
                    80
                }
            }
            // `http` reads a port it cannot parse as none at all: a typo
            // (`:8O80`) would send the requests, and the key, to port 80.
            Some(text) => text
                .parse::<u16>()
                .ok()
                .filter(|&port| port != 0)
                .ok_or_else(|| format!("URL `{url}` has an invalid port `{text}`"))?,
        };
        if uri.query().is_some() {
            return Err(format!("URL `{url}` must not have a query"));
        }
        let base_path = uri.path().trim_end_matches('/').to_owned();
        let ca = options.ca_file.as_deref().map(load_ca_file).transpose()?;
        let authority = authority.as_str().to_owned();
        Ok(Endpoint {
            tls,
            origin: format!("{}://{authority}", if tls { "https" } else { "http" }),
            authority,
            host,
            port,
            base_path,
            timeouts: options.timeouts,
            ca,
            peers: PerThread::new(Default::default),
        })
    }

    /// The path on the server for `suffix` (which starts with `/`).
    pub fn path(&self, suffix: &str) -> String {
        let mut path = String::with_capacity(self.base_path.len() + suffix.len());
        path.push_str(&self.base_path);
        path.push_str(suffix);
        path
    }

    /// The `Host` header value.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// `scheme://host[:port]`, without credentials.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The base URL without credentials (`http://127.0.0.1:8080/v1`).
    pub fn url(&self) -> String {
        format!("{}{}", self.origin, self.base_path)
    }

    /// The peers to connect to, built once per DNS answer and shared by
    /// a thread's exchanges until `DNS_TTL` passes. Names are resolved
    /// asynchronously (pingora's `HttpPeer::new` would block the runtime).
    pub async fn peers(&self) -> Result<Arc<Peers>> {
        if let Some(peers) = self.lock_peers().as_ref() {
            if peers.resolved.elapsed() < DNS_TTL {
                return Ok(peers.clone());
            }
        }
        let cached = self.lock_peers().clone();
        let addrs = happy_eyeballs_order(self.resolve().await?);
        // The address that connected last stays first while it is listed.
        let preferred = cached
            .and_then(|old| {
                let addr = *old.peer(old.preferred()).address().as_inet()?;
                addrs.iter().position(|a| *a == addr)
            })
            .unwrap_or(0);
        let list = addrs
            .into_iter()
            .map(|addr| {
                let peer = self.build_peer(addr);
                let reuse = peer.reuse_hash();
                (Arc::new(peer), reuse)
            })
            .collect();
        let peers = Arc::new(Peers {
            resolved: Instant::now(),
            list,
            preferred: AtomicUsize::new(preferred),
        });
        *self.lock_peers() = Some(peers.clone());
        Ok(peers)
    }

    fn build_peer(&self, addr: SocketAddr) -> HttpPeer {
        let mut peer = HttpPeer::new(addr, self.tls, self.host.clone());
        peer.options.connection_timeout = Some(self.timeouts.connect);
        peer.options.read_timeout = Some(self.timeouts.first_byte);
        peer.options.idle_timeout = Some(pool::IDLE);
        if self.tls {
            peer.options.set_http_version(2, 1);
            peer.options.ca = self.ca.clone();
        }
        peer
    }

    /// Opens a connection (TCP, and TLS for https) and closes it again:
    /// whether anything accepts connections here, without spending a request.
    pub async fn try_connect(&self) -> Result<()> {
        let (connection, _, _) = self
            .peers()
            .await?
            .connect()
            .await
            .map_err(|e| e.into_up())?;
        match connection {
            Connection::H1(mut link) => {
                let _ = link.stream.shutdown().await;
            }
            Connection::Other(mut session) => session.shutdown().await,
        }
        Ok(())
    }

    /// Every address of the host. `localhost` is the loopback addresses,
    /// both of them, whatever the hosts file says (RFC 6761): a model
    /// server may listen on either.
    async fn resolve(&self) -> Result<Vec<SocketAddr>> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.port)]);
        }
        if is_localhost(&self.host) {
            return Ok(vec![
                SocketAddr::new(Ipv6Addr::LOCALHOST.into(), self.port),
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.port),
            ]);
        }
        tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .ok()
            .map(|addrs| addrs.collect::<Vec<_>>())
            .filter(|addrs| !addrs.is_empty())
            .ok_or_else(|| {
                Error::explain(
                    ErrorType::ConnectNoRoute,
                    format!("cannot resolve `{}`", self.host),
                )
            })
            .map_err(|e| e.into_up())
    }

    fn lock_peers(&self) -> std::sync::MutexGuard<'_, Option<Arc<Peers>>> {
        // The cache holds plain data: a poisoned lock still holds a usable value.
        self.peers.local().lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `req` with an optional body and waits for the response header;
    /// `Host` is this endpoint's unless `req` sets one.
    /// Boxed: connecting and sending is a large future (pingora's connector,
    /// TLS) that lives only until the response header. On the heap it is
    /// freed then, instead of weighing on the task of every open stream.
    pub fn send<'a>(
        &'a self,
        req: Request<'a>,
        body: Option<Bytes>,
    ) -> BoxFuture<'a, Result<Exchange>> {
        let deadline = self.timeouts.total.map(|t| tokio::time::Instant::now() + t);
        crate::boxed::pinned(|| within(deadline, self.exchange(req, body, deadline)))
    }

    async fn exchange(
        &self,
        req: Request<'_>,
        body: Option<Bytes>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Exchange> {
        let peers = self.peers().await?;
        let length = body.as_ref().map(Bytes::len);
        // Safe methods may be sent again whatever happened to them; others
        // only when they provably never reached the server whole.
        let replayable = matches!(*req.method(), http::Method::GET | http::Method::HEAD);
        let head_request = req.method() == http::Method::HEAD;
        // The HTTP/1 request head, once a connection needs it.
        let mut wire: Option<Bytes> = None;
        let mut attempt = 0;
        let (mut response, index) = loop {
            let (connection, reused, index) = peers.connect().await.map_err(|e| e.into_up())?;
            let sent = match connection {
                Connection::H1(link) => {
                    let head = match &wire {
                        Some(head) => head.clone(),
                        None => wire.insert(req.h1_head(&self.authority, length)).clone(),
                    };
                    self.send_h1(link, head, body.clone(), head_request).await
                }
                Connection::Other(session) => {
                    let header = req.header(&self.authority, length)?;
                    self.send_other(session, header, body.clone()).await
                }
            };
            match sent {
                Ok(response) => break (response, index),
                Err((e, written)) => {
                    // A pooled connection the server had closed while idle
                    // (the pool drops those it sees closed, but the close
                    // can cross the request). Once written whole, a request
                    // may have been read and acted on before the server hung
                    // up, and a model call or a tool call must not run twice.
                    let stale = reused
                        && (replayable || !written)
                        && matches!(
                            e.etype(),
                            ErrorType::ConnectionClosed
                                | ErrorType::WriteError
                                | ErrorType::ReadError
                        );
                    attempt += 1;
                    if !stale || attempt > 2 {
                        return Err(e.into_up());
                    }
                }
            }
        };
        let Some((status, event_stream)) = response.head() else {
            return Err(
                Error::explain(ErrorType::InvalidHTTPHeader, "no response header").into_up(),
            );
        };
        response.set_read_timeout(Some(self.timeouts.idle));
        Ok(Exchange {
            response: Some(response),
            status,
            event_stream,
            peer: peers.peer(index).clone(),
            reuse: peers.reuse_hash(index),
            deadline,
            watch: None,
        })
    }

    /// Sends an HTTP/1 request and reads its response head. The request's
    /// head and body leave in one vectored write, so as one segment: sent
    /// apart, they cost a second transmit here and a second wake-up on the
    /// model server. On failure, whether the request was written whole.
    async fn send_h1(
        &self,
        mut link: h1::Link,
        head: Bytes,
        body: Option<Bytes>,
        head_request: bool,
    ) -> std::result::Result<Response, (Box<Error>, bool)> {
        let limit = self.timeouts.first_byte;
        let mut wire = head.chain(body.unwrap_or_default());
        // A server may answer before it read the whole request (a 413 for
        // a body too large) and close: a write that failed so is followed
        // by a short read of that answer, for the client.
        let (read_limit, failed) = match link.write(limit, &mut wire).await {
            Ok(()) => (limit, None),
            Err(e) if e.etype() == &ErrorType::WriteError => (EARLY_ANSWER, Some(e)),
            Err(e) => return Err((e, false)),
        };
        match (
            h1::Response::read(link, Some(read_limit), head_request).await,
            failed,
        ) {
            (Ok(response), None) => Ok(Response::H1(response)),
            (Ok(mut early), Some(_)) => {
                early.close_after();
                Ok(Response::H1(early))
            }
            (Err(e), None) => Err((e, true)),
            (Err(_), Some(write)) => Err((write, false)),
        }
    }

    /// Sends a request over pingora's HTTP/2 session and reads its response
    /// head. On failure, whether the request was written whole.
    async fn send_other(
        &self,
        mut session: Box<HttpSession>,
        req: RequestHeader,
        body: Option<Bytes>,
    ) -> std::result::Result<Response, (Box<Error>, bool)> {
        // The connector leaves per-read timeouts to the caller.
        session.set_read_timeout(Some(self.timeouts.first_byte));
        session.set_write_timeout(Some(self.timeouts.first_byte));
        let written = async {
            session.write_request_header(Box::new(req)).await?;
            if let Some(body) = body {
                session.write_request_body(body, true).await?;
            }
            session.finish_request_body().await.map(drop)
        }
        .await;
        let result = match written {
            Ok(()) => session.read_response_header().await.map_err(|e| (e, true)),
            Err(e) => Err((e, false)),
        };
        match result {
            Ok(()) => Ok(Response::Other(session)),
            Err(failed) => {
                session.shutdown().await;
                Err(failed)
            }
        }
    }
}

/// Whether a response is an event stream (by its `Content-Type`).
pub fn is_event_stream(header: &ResponseHeader) -> bool {
    header
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| crate::http1::is_event_stream(v.as_bytes()))
}

/// A response being read: HTTP/1 by us, HTTP/2 by pingora (boxed: rare,
/// and three times the size).
enum Response {
    H1(h1::Response),
    Other(Box<HttpSession>),
}

impl Response {
    /// The status, and whether the answer is an event stream.
    fn head(&self) -> Option<(u16, bool)> {
        match self {
            Response::H1(h1) => Some((h1.status().as_u16(), h1.is_event_stream())),
            Response::Other(session) => {
                let header = session.response_header()?;
                Some((header.status.as_u16(), is_event_stream(header)))
            }
        }
    }

    fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        match self {
            Response::H1(h1) => h1.set_read_timeout(timeout),
            Response::Other(session) => session.set_read_timeout(timeout),
        }
    }
}

/// Runs `work` unless `deadline` passes first (then a read timeout).
/// Combinators, not an `async fn`: that would hold `work` twice (argument
/// and awaited future), doubling the size of every read.
fn within<T>(
    deadline: Option<tokio::time::Instant>,
    work: impl Future<Output = Result<T>>,
) -> impl Future<Output = Result<T>> {
    match deadline {
        None => Either::Left(work),
        Some(deadline) => Either::Right(tokio::time::timeout_at(deadline, work).map(|done| {
            done.unwrap_or_else(|_| {
                Err(Error::explain(ErrorType::ReadTimedout, "total timeout").into_up())
            })
        })),
    }
}

/// `localhost`, `localhost.` and names under it (RFC 6761).
fn is_localhost(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    host == "localhost" || host.ends_with(".localhost")
}

/// `addrs` without repeats, IPv6 and IPv4 alternating from the family of
/// the first (the resolver's preference), as RFC 8305 orders attempts.
fn happy_eyeballs_order(addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let mut unique: Vec<SocketAddr> = Vec::with_capacity(addrs.len());
    for addr in addrs {
        if !unique.contains(&addr) {
            unique.push(addr);
        }
    }
    let first_is_v6 = unique.first().is_some_and(SocketAddr::is_ipv6);
    let (mut first, mut second): (Vec<_>, Vec<_>) =
        unique.into_iter().partition(|a| a.is_ipv6() == first_is_v6);
    let mut ordered = Vec::with_capacity(first.len() + second.len());
    first.reverse();
    second.reverse();
    while let Some(addr) = first.pop() {
        ordered.push(addr);
        ordered.extend(second.pop());
    }
    ordered.extend(second.into_iter().rev());
    ordered
}

/// One connector for every endpoint that is not plain HTTP over TCP (TLS,
/// and with it HTTP/2; a Unix socket): it connects, and pools HTTP/2
/// connections (HTTP/1 ones wait in [`pool`]). Plain HTTP is connected by
/// [`connect`] itself, with pingora's TCP connect and no options of the
/// connector's (it is built with none).
fn connector() -> &'static Connector {
    static SHARED: OnceLock<Connector> = OnceLock::new();
    SHARED.get_or_init(|| Connector::new(Some(ConnectorOptions::new(1024))))
}

/// Reads a PEM bundle of CA certificates, checking each one so a bad file
/// is a config error rather than a failure at connect time: the roots, and
/// the certificates as read.
pub fn ca_roots(
    path: &str,
) -> std::result::Result<
    (
        pingora::tls::RootCertStore,
        Vec<rustls_pki_types::CertificateDer<'static>>,
    ),
    String,
> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| format!("ca_file `{path}`: {e}"))?;
    if certs.is_empty() {
        return Err(format!("ca_file `{path}` holds no certificate"));
    }
    let mut store = pingora::tls::RootCertStore::empty();
    for cert in &certs {
        store
            .add(cert.clone())
            .map_err(|e| format!("ca_file `{path}`: {e}"))?;
    }
    Ok((store, certs))
}

/// The port as written in `authority`, if one is (after the userinfo, and
/// after an IPv6 literal's brackets); an empty one is the scheme's
/// (RFC 3986 §3.2.3).
fn explicit_port(authority: &http::uri::Authority) -> Option<&str> {
    let host_port = authority.as_str().rsplit('@').next().unwrap_or_default();
    let after_host = match host_port.rfind(']') {
        Some(end) => &host_port[end + 1..],
        None => host_port,
    };
    after_host
        .rsplit_once(':')
        .map(|(_, port)| port)
        .filter(|port| !port.is_empty())
}

fn load_ca_file(path: &str) -> std::result::Result<Arc<[WrappedX509]>, String> {
    let (_, certs) = ca_roots(path)?;
    Ok(certs
        .into_iter()
        .map(|cert| WrappedX509::new(cert.to_vec(), parse_x509))
        .collect())
}

/// What the sender of an exchange keeps with it while its answer is read
/// (the upstream layer: the replica's load, its failure count).
pub trait Watch: Send + Sync {
    /// Reading the answer failed.
    fn read_failed(&mut self, error: &Error);
}

/// One request/response on a pooled connection. The connection goes back to
/// the pool only when the body was read to its end; dropped half-way, it is
/// closed.
pub struct Exchange {
    response: Option<Response>,
    status: u16,
    event_stream: bool,
    peer: Arc<HttpPeer>,
    /// The peer's pool key.
    reuse: u64,
    deadline: Option<tokio::time::Instant>,
    /// Held while the exchange lives.
    watch: Option<Box<dyn Watch>>,
}

impl Exchange {
    /// The first value of the response's field `name`, until the body has
    /// been read to its end (the connection, which holds it, is back in the
    /// pool then).
    pub fn field(&self, name: &http::HeaderName) -> Option<http::HeaderValue> {
        match self.response.as_ref()? {
            Response::H1(h1) => h1.fields()?.value(name),
            Response::Other(session) => session.response_header()?.headers.get(name).cloned(),
        }
    }

    /// The response's fields to keep (passed on as they came, say): without
    /// a copy from an HTTP/1 response, whose [`field`](Self::field)s are
    /// gone afterwards.
    pub fn take_fields(&mut self) -> Option<Fields> {
        match self.response.as_mut()? {
            Response::H1(h1) => h1.take_fields(),
            Response::Other(session) => Some(Fields::from_map(&session.response_header()?.headers)),
        }
    }

    /// Keeps `watch` as long as this exchange, and tells it of failures.
    pub fn watch(&mut self, watch: Box<dyn Watch>) {
        self.watch = Some(watch);
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn is_event_stream(&self) -> bool {
        self.event_stream
    }

    /// The next piece of the body; `None` at its end.
    pub async fn read(&mut self) -> Result<Option<Bytes>> {
        let read = match self.response.as_mut() {
            None => return Ok(None),
            Some(Response::H1(h1)) => within(self.deadline, h1.read_body()).await,
            Some(Response::Other(session)) => {
                within(self.deadline, session.read_response_body()).await
            }
        };
        self.got(read)
    }

    /// The next piece of the body if it was read already, without waiting:
    /// `Some` of what [`read`](Self::read) would return at once, `None` when
    /// it would wait. A chunked stream (llama-server sends an event a
    /// chunk) brings many chunks in one read under load.
    pub fn read_buffered(&mut self) -> Result<Option<Option<Bytes>>> {
        let read = match self.response.as_mut() {
            None => return Ok(Some(None)),
            Some(Response::H1(h1)) => match h1.read_buffered() {
                Ok(None) => return Ok(None),
                Ok(Some(piece)) => Ok(piece),
                Err(e) => Err(e),
            },
            Some(Response::Other(_)) => return Ok(None),
        };
        self.got(read).map(Some)
    }

    /// What a read of the body got: at its end the connection goes back.
    fn got(&mut self, read: Result<Option<Bytes>>) -> Result<Option<Bytes>> {
        match read {
            Ok(Some(bytes)) => Ok(Some(bytes)),
            Ok(None) => {
                self.release();
                Ok(None)
            }
            Err(e) => {
                if let Some(watch) = self.watch.as_mut() {
                    watch.read_failed(&e);
                }
                Err(e.into_up())
            }
        }
    }

    /// Reads the whole body, failing past `limit` bytes.
    pub async fn read_to_end(&mut self, limit: usize) -> Result<Bytes> {
        let mut body = BytesMut::new();
        while let Some(piece) = self.read().await? {
            if body.len() + piece.len() > limit {
                return Err(Error::explain(
                    crate::error::ANSWER_TOO_LARGE,
                    "response body too large",
                )
                .into_up());
            }
            body.extend_from_slice(&piece);
        }
        Ok(body.freeze())
    }

    /// The body was read to its end: the connection goes back to the pool
    /// if it may serve another request.
    fn release(&mut self) {
        match self.response.take() {
            Some(Response::H1(h1)) => {
                if let Some(link) = h1.into_reusable() {
                    pool::shared().put(self.reuse, link);
                }
            }
            Some(Response::Other(session)) => {
                let peer = self.peer.clone();
                // Releasing is a large future: off this stream's task.
                tokio::spawn(async move {
                    connector()
                        .release_http_session(*session, &*peer, Some(pool::IDLE))
                        .await;
                });
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn listed(peers: &Peers) -> Vec<String> {
        (0..peers.count())
            .map(|i| peers.peer(i).address().to_string())
            .collect()
    }

    #[test]
    fn a_port_is_a_number_or_the_schemes_own() {
        let options = || EndpointOptions {
            timeouts: Timeouts::all(Duration::from_secs(5)),
            ca_file: None,
        };
        let port = |url: &str| Endpoint::parse(url, options()).map(|e| e.port);
        assert_eq!(port("http://127.0.0.1:8080/v1"), Ok(8080));
        assert_eq!(port("http://127.0.0.1/v1"), Ok(80));
        assert_eq!(port("https://api.openai.com/v1"), Ok(443));
        assert_eq!(port("http://[::1]:9000"), Ok(9000));
        assert_eq!(port("http://[::1]"), Ok(80));
        assert_eq!(port("http://127.0.0.1:/v1"), Ok(80));
        for typo in ["8O80", "99999", "notaport", "0"] {
            let url = format!("http://127.0.0.1:{typo}/v1");
            let refused = port(&url).expect_err(&url);
            assert!(refused.contains("invalid port"), "{refused}");
        }
    }

    /// Credentials in a URL are refused, and no message shows the password.
    #[test]
    fn a_url_with_credentials_is_refused_without_showing_them() {
        let options = || EndpointOptions {
            timeouts: Timeouts::all(Duration::from_secs(5)),
            ca_file: None,
        };
        for url in [
            "http://alice:hunter2@host/v1",
            "http://alice:hunter2@host:8O80/v1",
            "http://alice:hunter2@host/v1?x=1",
            "ftp://alice:hunter2@host/v1",
        ] {
            let Err(refused) = Endpoint::parse(url, options()) else {
                panic!("{url} was taken");
            };
            assert!(!refused.contains("hunter2"), "{refused}");
            assert!(refused.contains("alice:***@host"), "{refused}");
        }
        assert!(!invalid_url("http://a:hunter2@ho st/", "bad").contains("hunter2"));
        assert_eq!(redacted("http://host/v1"), "http://host/v1");
        assert_eq!(
            redacted("http://alice:Ab/cD+e==@h:1/v1"),
            "http://alice:***@h:1/v1"
        );
        let Err(refused) = Endpoint::parse("http://alice:Ab/cD+e==@h:1/v1", options()) else {
            panic!("taken");
        };
        assert!(!refused.contains("cD+e"), "{refused}");
        assert_eq!(redacted("http://token@host/"), "http://***@host/");
        assert_eq!(redacted("http://u:p:q@h@host/"), "http://u:***@host/");
    }

    #[test]
    fn addresses_alternate_families_from_the_resolvers_first() {
        let order = |addrs: &[&str]| {
            happy_eyeballs_order(addrs.iter().map(|a| addr(a)).collect())
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            order(&[
                "[::1]:80",
                "[::2]:80",
                "[::3]:80",
                "10.0.0.1:80",
                "10.0.0.2:80"
            ]),
            [
                "[::1]:80",
                "10.0.0.1:80",
                "[::2]:80",
                "10.0.0.2:80",
                "[::3]:80"
            ]
        );
        assert_eq!(
            order(&[
                "10.0.0.1:80",
                "10.0.0.2:80",
                "10.0.0.3:80",
                "[::1]:80",
                "10.0.0.1:80"
            ]),
            ["10.0.0.1:80", "[::1]:80", "10.0.0.2:80", "10.0.0.3:80"]
        );
        assert!(is_localhost("LocalHost.") && is_localhost("a.localhost"));
        assert!(!is_localhost("localhost.example"));
    }

    /// A port where 127.0.0.1 accepts connections and `[::1]` refuses them,
    /// as for a llama-server started on 127.0.0.1.
    async fn ipv4_loopback_only() -> (tokio::net::TcpListener, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(
            tokio::net::TcpStream::connect(("::1", port)).await.is_err(),
            "nothing listens on [::1]:{port}"
        );
        (listener, port)
    }

    #[tokio::test]
    async fn localhost_is_both_loopbacks_and_the_one_that_accepts_is_kept() {
        let (_listener, port) = ipv4_loopback_only().await;
        let endpoint = test_endpoint(&format!("http://localhost:{port}/v1"));
        let peers = endpoint.peers().await.unwrap();
        assert_eq!(
            listed(&peers),
            [format!("[::1]:{port}"), format!("127.0.0.1:{port}")]
        );
        assert_eq!(peers.preferred(), 0);

        endpoint
            .try_connect()
            .await
            .expect("[::1] refuses, 127.0.0.1 accepts");
        assert_eq!(
            peers.preferred(),
            1,
            "the address that connected is tried first from now on"
        );
        endpoint.try_connect().await.unwrap();
        assert_eq!(peers.preferred(), 1);
    }

    /// Data segments a connected socket has received (Linux's `TCP_INFO`).
    fn data_segments_in(socket: &tokio::net::TcpStream) -> u32 {
        use std::os::fd::AsRawFd;
        // SAFETY: a zeroed `tcp_info` is valid; the kernel writes at most
        // `len` bytes into it.
        unsafe {
            let mut info: libc::tcp_info = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            let done = libc::getsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                std::ptr::addr_of_mut!(info).cast(),
                &mut len,
            );
            assert_eq!(done, 0, "TCP_INFO");
            info.tcpi_data_segs_in
        }
    }

    /// A request's header and body reach the model server as one TCP
    /// segment (sent apart, they cost a second transmit and a second
    /// wake-up of the server), and the connection they were written on goes
    /// back to the pool and serves the next request.
    #[tokio::test]
    async fn a_request_leaves_in_one_segment_and_its_connection_is_reused() {
        use tokio::io::AsyncReadExt;
        let body = Bytes::from(format!("{{\"input\":\"{}\"}}", "x".repeat(3000)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let expected = body.clone();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for _ in 0..2 {
                let mut request = Vec::new();
                while !request.ends_with(&expected) {
                    let mut buf = [0; 8192];
                    let n = socket.read(&mut buf).await.unwrap();
                    assert!(n > 0, "closed mid-request");
                    request.extend_from_slice(&buf[..n]);
                }
                seen.push((
                    String::from_utf8(request).unwrap(),
                    data_segments_in(&socket),
                ));
                socket
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await
                    .unwrap();
            }
            seen
        });
        let endpoint = test_endpoint(&format!("http://127.0.0.1:{port}/v1"));
        for _ in 0..2 {
            let path = endpoint.path("/chat/completions");
            let req = Request::new("POST", &path).unwrap();
            let mut exchange = endpoint.send(req, Some(body.clone())).await.unwrap();
            assert_eq!(exchange.status(), 200);
            assert_eq!(exchange.read_to_end(1024).await.unwrap(), "ok");
        }
        // The server accepted once: the second request came on the pooled connection.
        let seen = server.await.unwrap();
        let length = format!("content-length: {}\r\n", body.len());
        for (request, _) in &seen {
            assert!(request.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"));
            assert!(request.to_ascii_lowercase().contains(&length));
        }
        let segments: Vec<u32> = seen.iter().map(|(_, segments)| *segments).collect();
        assert_eq!(
            segments,
            [1, 2],
            "data segments received after each request"
        );
    }

    /// An event stream's pieces come out as the server sends them, not when
    /// the body ends; a chunked body read to its end leaves the connection
    /// for the next request.
    #[tokio::test]
    async fn a_streamed_body_comes_out_piece_by_piece() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (go_on, mut wait) = tokio::sync::mpsc::channel::<()>(1);
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            for _ in 0..2 {
                let mut buf = [0; 4096];
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0);
                socket
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
                    .await
                    .unwrap();
                wait.recv().await.unwrap();
                socket
                    .write_all(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")
                    .await
                    .unwrap();
            }
        });
        let endpoint = test_endpoint(&format!("http://127.0.0.1:{port}"));
        for _ in 0..2 {
            let req = Request::new("POST", "/v1/chat/completions").unwrap();
            let mut exchange = endpoint.send(req, Some(Bytes::from("{}"))).await.unwrap();
            assert!(exchange.is_event_stream());
            assert_eq!(exchange.read().await.unwrap().unwrap(), "data: 1\n\n");
            go_on.send(()).await.unwrap();
            assert_eq!(exchange.read().await.unwrap().unwrap(), "data: 2\n\n");
            assert_eq!(exchange.read().await.unwrap(), None);
            assert!(
                exchange.field(&http::header::CONTENT_TYPE).is_none(),
                "the connection is back in the pool"
            );
        }
        // Both requests went over the one connection the server accepted.
        server.await.unwrap();
    }

    /// An endpoint at `url` with a 5 s bound on every phase.
    fn test_endpoint(url: &str) -> Endpoint {
        let options = EndpointOptions {
            timeouts: Timeouts::all(Duration::from_secs(5)),
            ca_file: None,
        };
        Endpoint::parse(url, options).unwrap()
    }

    /// Serves one connection: reads a request, answers with `wire`, closes.
    async fn answering(wire: &'static [u8]) -> Endpoint {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0; 4096];
            let _ = socket.read(&mut buf).await.unwrap();
            socket.write_all(wire).await.unwrap();
        });
        test_endpoint(&format!("http://127.0.0.1:{port}"))
    }

    /// An interim 100 Continue is skipped for the answer after it; a body
    /// cut short by the server's close is an error, never a short answer.
    #[tokio::test]
    async fn interim_answers_are_skipped_and_a_cut_body_is_an_error() {
        let endpoint = answering(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        )
        .await;
        let req = Request::new("POST", "/v1/chat/completions").unwrap();
        let mut exchange = endpoint.send(req, Some(Bytes::from("{}"))).await.unwrap();
        assert_eq!(exchange.status(), 200);
        assert_eq!(exchange.read_to_end(1024).await.unwrap(), "ok");

        let endpoint =
            answering(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel").await;
        let req = Request::new("POST", "/v1/chat/completions").unwrap();
        let mut exchange = endpoint.send(req, Some(Bytes::from("{}"))).await.unwrap();
        assert!(exchange.read_to_end(1024).await.is_err());
    }
}
