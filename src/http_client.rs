//! The outbound HTTP client, on pingora's connector (pooled, h1 and h2, rustls).
//! Model upstreams and HTTP tools both call out through an [`Endpoint`].

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, Either, FutureExt};
use pingora::connectors::http::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::client::HttpSession;
use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::{parse_x509, WrappedX509};
use pingora::{Error, ErrorType, Result};

/// How long a DNS answer is reused before the name is looked up again.
const DNS_TTL: Duration = Duration::from_secs(30);
/// How long a pooled connection may sit idle.
const POOL_IDLE: Duration = Duration::from_secs(60);

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
    /// The last built peer and when its address was resolved.
    peer: Mutex<Option<(Instant, Arc<HttpPeer>)>>,
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

pub struct EndpointOptions {
    pub timeouts: Timeouts,
    /// PEM CA bundle replacing the system roots (for private CAs and tests).
    pub ca_file: Option<String>,
}

impl Endpoint {
    pub fn parse(url: &str, options: EndpointOptions) -> std::result::Result<Self, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("invalid URL `{url}`: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("URL `{url}` must start with http:// or https://")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("URL `{url}` has no host"))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        if uri.query().is_some() {
            return Err(format!("URL `{url}` must not have a query"));
        }
        let base_path = uri.path().trim_end_matches('/').to_owned();
        let ca = options.ca_file.as_deref().map(load_ca_file).transpose()?;
        // Userinfo (`user:pass@`) is a credential: never in `Host` or a message.
        let authority = authority
            .as_str()
            .rsplit_once('@')
            .map_or(authority.as_str(), |(_, host_port)| host_port)
            .to_owned();
        Ok(Endpoint {
            tls,
            origin: format!("{}://{authority}", if tls { "https" } else { "http" }),
            authority,
            host,
            port,
            base_path,
            timeouts: options.timeouts,
            ca,
            peer: Mutex::new(None),
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

    /// The peer to connect to, built once per DNS answer and shared by every
    /// exchange until [`DNS_TTL`] passes. Names are resolved asynchronously
    /// (pingora's `HttpPeer::new` would block the runtime).
    pub async fn peer(&self) -> Result<Arc<HttpPeer>> {
        if let Some((at, peer)) = &*self.lock_peer() {
            if at.elapsed() < DNS_TTL {
                return Ok(peer.clone());
            }
        }
        let addr = self.resolve().await?;
        let mut peer = HttpPeer::new(addr, self.tls, self.host.clone());
        peer.options.connection_timeout = Some(self.timeouts.connect);
        peer.options.read_timeout = Some(self.timeouts.first_byte);
        peer.options.idle_timeout = Some(POOL_IDLE);
        if self.tls {
            peer.options.set_http_version(2, 1);
            peer.options.ca = self.ca.clone();
        }
        let peer = Arc::new(peer);
        *self.lock_peer() = Some((Instant::now(), peer.clone()));
        Ok(peer)
    }

    /// Opens a connection (TCP, and TLS for https) and closes it again:
    /// whether anything accepts connections here, without spending a request.
    pub async fn try_connect(&self) -> Result<()> {
        let peer = self.peer().await?;
        let (mut session, _) = connector()
            .get_http_session(&*peer)
            .await
            .map_err(|e| e.into_up())?;
        session.shutdown().await;
        Ok(())
    }

    async fn resolve(&self) -> Result<SocketAddr> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, self.port));
        }
        tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| {
                Error::explain(
                    ErrorType::ConnectNoRoute,
                    format!("cannot resolve `{}`", self.host),
                )
            })
            .map_err(|e| e.into_up())
    }

    fn lock_peer(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Arc<HttpPeer>)>> {
        // The cache holds plain data: a poisoned lock still holds a usable value.
        self.peer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request header for `path` with `Host` set. Without pingora's
    /// case-preserving name map: names go out lower-case (as HTTP/2 sends
    /// them anyway), for fewer allocations per request.
    pub fn request_header(&self, method: &str, path: &str) -> Result<RequestHeader> {
        let mut req = RequestHeader::build_no_case(method, path.as_bytes(), Some(8))?;
        req.insert_header(http::header::HOST, self.authority.as_str())?;
        Ok(req)
    }

    /// Sends `req` with an optional body and waits for the response header.
    /// Boxed: connecting and sending is a large future (pingora's connector,
    /// TLS) that lives only until the response header. On the heap it is
    /// freed then, instead of weighing on the task of every open stream.
    pub fn send(&self, req: RequestHeader, body: Option<Bytes>) -> BoxFuture<'_, Result<Exchange>> {
        let deadline = self.timeouts.total.map(|t| tokio::time::Instant::now() + t);
        Box::pin(within(deadline, self.exchange(req, body, deadline)))
    }

    async fn exchange(
        &self,
        mut req: RequestHeader,
        body: Option<Bytes>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Exchange> {
        let peer = self.peer().await?;
        if let Some(body) = &body {
            req.insert_header(http::header::CONTENT_LENGTH, body.len())?;
        }
        // Safe methods may be sent again whatever happened to them; others
        // only when they provably never reached the server whole.
        let replayable = matches!(req.method, http::Method::GET | http::Method::HEAD);
        let mut attempt = 0;
        let mut session = loop {
            let (mut session, reused) = connector()
                .get_http_session(&*peer)
                .await
                .map_err(|e| e.into_up())?;
            // The connector leaves per-read timeouts to the caller.
            session.set_read_timeout(Some(self.timeouts.first_byte));
            session.set_write_timeout(Some(self.timeouts.first_byte));
            let written = async {
                let _cork = body.as_ref().and_then(|_| Cork::new(&session));
                session.write_request_header(Box::new(req.clone())).await?;
                if let Some(body) = body.clone() {
                    session.write_request_body(body, true).await?;
                }
                session.finish_request_body().await
            }
            .await;
            let (result, may_resend) = match written {
                Ok(_) => (session.read_response_header().await, replayable),
                // A write that failed: the request never reached the server whole.
                Err(e) => (Err(e), true),
            };
            match result {
                Ok(()) => break session,
                Err(e) => {
                    session.shutdown().await;
                    // A pooled connection the server had closed while idle
                    // (the connector already drops those it sees closed, but
                    // the close can cross the request). Once written whole, a
                    // request may have been read and acted on before the
                    // server hung up, and a model call or a tool call must
                    // not run twice.
                    let stale = reused
                        && may_resend
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
        let Some(header) = session.response_header() else {
            return Err(
                Error::explain(ErrorType::InvalidHTTPHeader, "no response header").into_up(),
            );
        };
        let status = header.status.as_u16();
        let event_stream = header
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        session.set_read_timeout(Some(self.timeouts.idle));
        Ok(Exchange {
            session: Some(session),
            status,
            event_stream,
            peer,
            deadline,
            _busy: None,
        })
    }
}

/// Holds an HTTP/1 connection's writes back (`TCP_CORK`) until dropped, so a
/// request's header and body leave as one segment. pingora flushes the header
/// on its own; sent apart, they cost a second transmit here and a second
/// wake-up on the model server, per request.
struct Cork(RawFd);

impl Cork {
    fn new(session: &HttpSession) -> Option<Cork> {
        // pingora's connection id is its socket's fd (TLS included).
        let fd = session.as_http1()?.stream().id();
        set_cork(fd, true).then_some(Cork(fd))
    }
}

impl Drop for Cork {
    fn drop(&mut self) {
        // Uncorking sends what was held. Should it fail, the kernel still
        // sends held data within 200 ms: slower, never lost.
        set_cork(self.0, false);
    }
}

fn set_cork(fd: RawFd, on: bool) -> bool {
    let value = libc::c_int::from(on);
    // SAFETY: `fd` is a socket owned by the live session; the option value
    // is a valid c_int of the size passed.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
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

/// One connection pool for every endpoint: pingora keys pooled connections
/// by peer (address, TLS settings), so endpoints never share one by mistake.
fn connector() -> &'static Connector {
    static SHARED: OnceLock<Connector> = OnceLock::new();
    SHARED.get_or_init(|| Connector::new(Some(ConnectorOptions::new(1024))))
}

/// Reads a PEM bundle of CA certificates, checking each one so a bad file
/// is a config error rather than a failure at connect time.
fn load_ca_file(path: &str) -> std::result::Result<Arc<[WrappedX509]>, String> {
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
    Ok(certs
        .into_iter()
        .map(|cert| WrappedX509::new(cert.to_vec(), parse_x509))
        .collect())
}

/// One request/response on a pooled connection. The connection goes back to
/// the pool only when the body was read to its end; dropped half-way, it is
/// closed.
pub struct Exchange {
    session: Option<HttpSession>,
    status: u16,
    event_stream: bool,
    peer: Arc<HttpPeer>,
    deadline: Option<tokio::time::Instant>,
    /// Held while the exchange lives (counts the pool member's load).
    _busy: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Exchange {
    /// The response header, until the body has been read to its end (the
    /// connection, which holds it, is back in the pool then).
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.session.as_ref()?.response_header()
    }

    /// Keeps `guard` alive as long as this exchange.
    pub fn hold(&mut self, guard: impl std::any::Any + Send + Sync) {
        self._busy = Some(Box::new(guard));
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn is_event_stream(&self) -> bool {
        self.event_stream
    }

    /// The next piece of the body; `None` at its end.
    pub async fn read(&mut self) -> Result<Option<Bytes>> {
        let Some(session) = self.session.as_mut() else {
            return Ok(None);
        };
        match within(self.deadline, session.read_response_body()).await {
            Ok(Some(bytes)) => Ok(Some(bytes)),
            Ok(None) => {
                // Boxed: returning a connection to the pool is a large
                // future, and every read of every stream would carry it.
                Box::pin(self.release()).await;
                Ok(None)
            }
            Err(e) => Err(e.into_up()),
        }
    }

    /// Reads the whole body, failing past `limit` bytes.
    pub async fn read_to_end(&mut self, limit: usize) -> Result<Bytes> {
        let mut body = BytesMut::new();
        while let Some(piece) = self.read().await? {
            if body.len() + piece.len() > limit {
                return Err(
                    Error::explain(ErrorType::ReadError, "response body too large").into_up(),
                );
            }
            body.extend_from_slice(&piece);
        }
        Ok(body.freeze())
    }

    async fn release(&mut self) {
        if let Some(session) = self.session.take() {
            connector()
                .release_http_session(session, &*self.peer, Some(POOL_IDLE))
                .await;
        }
    }
}
