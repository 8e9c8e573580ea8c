//! The pingora service: a request's life, in hook order.
//!
//! 0. [`Listener`] accepts the client's connection and runs it in a task of
//!    its own. [`Edge`] waits for each request's head on it (keep-alive
//!    timeout, connection cap), and parses it ([`h1`], our own HTTP/1 for
//!    the client side), refusing one that cannot be served. A request for
//!    one of our routes it serves itself, through the hooks below; the rest
//!    (no route of ours, with `passthrough`) it hands to pingora's proxy
//!    path. It takes the config snapshot the request keeps to its end.
//! 1. `route` (pingora's `request_filter`, for our routes) admits the
//!    request (its id, its route, `Host`), checks the client's key, and
//!    answers: the proxy's own endpoints and every chat completion (agent or
//!    not).
//! 2. Everything else goes through pingora's proxy path to `default_upstream`:
//!    `request_filter` admits it the same way, `upstream_peer` and
//!    `fail_to_connect` follow the upstream layer's one retry policy
//!    ([`Attempts`]: the same replica order, failover and `retries` as the
//!    agent loop), `upstream_request_filter` maps the path and sets
//!    credentials; bodies stream through untouched.
//! 3. `fail_to_proxy` (`fail` on our routes) turns failures into
//!    OpenAI-format errors; `logging` (`log`) writes one line per request.

mod admin;
mod auth;
mod edge;
mod forward;
mod front_door;
pub mod h1;
mod health;
mod listen;
mod memories;
mod models;
mod stored;
pub(crate) mod write_buffer;

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::modules::http::HttpModules;
use pingora::proxy::{FailToProxy, ProxyHttp, Session as ProxySession};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType, Result};

use crate::agent::tool_loop::Summary;
use crate::config::{Config, Held};
use crate::conversation::Dialect;
use crate::downstream::{Client, Gone};
use crate::error::ApiError;
use crate::http_client::is_event_stream;
use crate::metrics::{metrics, StreamGuard};
use crate::request_id;
use crate::shutdown::InFlight;
use crate::upstream::{Attempts, Upstream};

pub use admin::Admin;
pub use edge::Edge;
pub use listen::Listener;

pub struct AgentProxy {
    config: Arc<ArcSwap<Config>>,
}

impl AgentProxy {
    pub fn new(config: Arc<ArcSwap<Config>>) -> Self {
        AgentProxy { config }
    }
}

pub struct RequestCtx {
    config: Held,
    started: Instant,
    request_id: String,
    /// What kind of request this is, for metrics: `agent`, `chat`, `proxy`,
    /// `models`, `health`, `metrics`.
    route: &'static str,
    agent: Option<String>,
    summary: Option<Summary>,
    /// What failed on a passed-on request's way to its upstream, for the log
    /// line (an agent's is in its summary).
    pub failure: Option<&'static str>,
    /// Counts a passed-through event stream while it lasts.
    stream: Option<StreamGuard>,
    _in_flight: InFlight,
    /// The session id for the log line: the client's own (`session::HEADERS`)
    /// or, for an agent request, its conversation's by the cascade.
    session: Option<String>,
    /// The proxy path's attempts, by the one retry policy of the upstream
    /// layer; from the first `upstream_peer` on.
    attempts: Option<Attempts>,
    /// The name of the client key the request matched (`auth.api_keys`).
    key_name: Option<String>,
    /// Whose stored responses the client sees (see `store::tenant_of`).
    tenant: String,
    /// Pingora's proxy path passes on an error: its body's pieces go with
    /// the upstream's key masked (`Upstream::masking_key`).
    masking: bool,
}

/// The handler answered; `Err` aborts the connection when a response was
/// cut mid-stream, so the client cannot mistake it for complete.
fn handled(cut: bool) -> Result<bool> {
    if cut {
        Error::e_explain(ErrorType::ConnectionClosed, "response cut mid-stream")
    } else {
        Ok(true)
    }
}

/// Answers with an error in `dialect`'s shape; the request body may be
/// unread, so the connection is not reused.
async fn reject(session: &mut h1::Session, dialect: Dialect, error: &ApiError) -> Result<bool> {
    reject_with(session, dialect, error, &[]).await
}

/// [`reject`], with `extra` header fields.
async fn reject_with(
    session: &mut h1::Session,
    dialect: Dialect,
    error: &ApiError,
    extra: &[(http::HeaderName, http::HeaderValue)],
) -> Result<bool> {
    session.close_after();
    let (status, body) = crate::front::error_response(dialect, error);
    let mut client = Client::new(session, std::time::Duration::MAX);
    handled(client.respond_json(status, body, extra).await == Err(Gone))
}

impl AgentProxy {
    /// A request's context, on the config it runs with.
    fn ctx_with(&self, config: Held) -> RequestCtx {
        RequestCtx {
            config,
            started: Instant::now(),
            request_id: String::new(),
            route: PROXY,
            agent: None,
            summary: None,
            failure: None,
            stream: None,
            _in_flight: InFlight::enter(),
            session: None,
            attempts: None,
            key_name: None,
            tenant: String::new(),
            masking: false,
        }
    }

    /// What every request goes through first, on our routes and on
    /// pingora's proxy path alike: its id, its session, its route and the
    /// dialect its errors are in, and RFC 9112's `Host` rule.
    fn admit(
        &self,
        req: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<Dialect, (Dialect, ApiError)> {
        ctx.request_id = request_id::ensure(req);
        ctx.session = crate::session::from_headers(&req.headers);
        ctx.route = route_of(req.method.as_str(), req.uri.path(), &ctx.config);
        let dialect = match ctx.route {
            "messages" | "count_tokens" => Dialect::Messages,
            "models" | "model" if req.headers.contains_key(ANTHROPIC_VERSION) => Dialect::Messages,
            _ => Dialect::Chat,
        };
        // RFC 9112 §3.2: an HTTP/1.1 request without `Host` is malformed
        // (HTTP/1.0 had no such header).
        if req.version == http::Version::HTTP_11 && !req.headers.contains_key(http::header::HOST) {
            let error = ApiError::bad_request("an HTTP/1.1 request needs a `Host` header");
            return Err((dialect, error));
        }
        Ok(dialect)
    }

    /// Checks the client's key (`auth.api_keys`).
    fn authenticate(&self, req: &RequestHeader, ctx: &mut RequestCtx) -> Result<(), ApiError> {
        match auth::authenticate(&ctx.config, req) {
            Ok(key) => {
                ctx.key_name = key.and_then(|k| k.name.clone());
                ctx.tenant = crate::store::tenant_of(key);
                Ok(())
            }
            Err(auth::Refused) => Err(ApiError::invalid_api_key()),
        }
    }

    /// Our routes (pingora's `request_filter`, called by `Edge`): admits the
    /// request, checks the client's key, and answers it; `Ok(false)` passes
    /// it on to pingora's proxy path.
    async fn route(&self, session: &mut h1::Session, ctx: &mut RequestCtx) -> Result<bool> {
        let dialect = match self.admit(session.req_header_mut(), ctx) {
            Ok(dialect) => dialect,
            Err((dialect, error)) => return reject(session, dialect, &error).await,
        };
        match session.req_header().uri.path() {
            "/healthz" if ctx.route == "health" => return health::live(session).await,
            "/readyz" if ctx.route == "health" => return health::ready(session, &ctx.config).await,
            _ => {}
        }
        if ctx.route == "root" {
            return health::live(session).await;
        }
        if ctx.route == NOT_ALLOWED {
            let method = &session.req_header().method;
            let error = ApiError::method_not_allowed(format!("{method} is not allowed"));
            // RFC 9110 §15.5.6: a 405 names the methods that are.
            let allow = (
                http::header::ALLOW,
                http::HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            );
            return reject_with(session, dialect, &error, &[allow]).await;
        }
        // Behind an admin key, not a client's.
        if ctx.route == "admin" {
            return memories::handle(session, &ctx.config).await;
        }
        if let Err(error) = self.authenticate(session.req_header(), ctx) {
            return reject(session, dialect, &error).await;
        }
        match ctx.route {
            "metrics" => health::metrics(session).await,
            "models" => models::list(session, &ctx.config, dialect).await,
            "model" => {
                let id = session.req_header().uri.path()["/v1/models/".len()..].to_owned();
                models::one(session, &ctx.config, &id, dialect).await
            }
            "chat" => front_door::handle(session, ctx, Dialect::Chat).await,
            "responses" => front_door::handle(session, ctx, Dialect::Responses).await,
            "messages" => front_door::handle(session, ctx, Dialect::Messages).await,
            "count_tokens" => front_door::count_tokens(session, ctx).await,
            "stored_response" => match stored::handle(session, ctx).await? {
                true => Ok(true),
                // An id that is not ours: the upstream's, perhaps.
                false => other_route(session, ctx, dialect).await,
            },
            _ => other_route(session, ctx, dialect).await,
        }
    }

    /// `logging`: one line and the metrics of a finished request, `req`,
    /// answered with `response`. Not async: `Edge` calls it without the box
    /// pingora's trait would make.
    fn log(
        &self,
        req: &RequestHeader,
        response: Option<h1::Answered>,
        error: Option<&Error>,
        ctx: &mut RequestCtx,
    ) {
        ctx.stream = None;
        let status = response.map_or(0, |h| h.status.as_u16());
        let stream = response.is_some_and(|h| h.event_stream);
        let summary = ctx.summary.take().unwrap_or_default();
        let agent = ctx.agent.as_deref().unwrap_or_default();
        let elapsed = ctx.started.elapsed();
        let m = metrics();
        m.requests
            .local()
            .with_label_values(&[
                ctx.route,
                agent,
                response.as_ref().map_or("0", |h| h.status.as_str()),
                if stream { "true" } else { "false" },
            ])
            .inc();
        m.request_seconds
            .local()
            .with_label_values(&[ctx.route])
            .observe(elapsed.as_secs_f64());
        let served_by = ctx.agent.as_deref().and_then(|id| ctx.config.agent(id));
        if let Some(series) = served_by.map(|a| a.series.local()) {
            series.rounds.observe(f64::from(summary.rounds));
            series.prompt_tokens.inc_by(summary.usage.prompt_tokens);
            series
                .completion_tokens
                .inc_by(summary.usage.completion_tokens);
            if let Some(first) = summary.first_token {
                series.first_token_seconds.observe(first.as_secs_f64());
            }
        }
        let upstream = match served_by {
            Some(agent) => agent.upstream.name.as_str(),
            None if ctx.agent.is_none()
                && matches!(ctx.route, "chat" | "responses" | "messages" | PROXY) =>
            {
                ctx.config.default_upstream.name.as_str()
            }
            None => "-",
        };
        crate::logs::RequestLine {
            request_id: &ctx.request_id,
            method: req.method.as_str(),
            path: req.uri.path(),
            status,
            route: ctx.route,
            agent: if agent.is_empty() { "-" } else { agent },
            session: ctx.session.as_deref().unwrap_or("-"),
            upstream,
            rounds: summary.rounds,
            tools: summary.tool_calls,
            prompt_tokens: summary.usage.prompt_tokens,
            completion_tokens: summary.usage.completion_tokens,
            first_token_ms: summary.first_token.map(|d| d.as_millis() as u64),
            ms: elapsed.as_millis() as u64,
            // What our own paths knew failed, else what ended the request.
            error: summary
                .error
                .or(ctx.failure)
                .or(error.map(|e| e.etype().as_str()))
                .unwrap_or("-"),
        }
        .log();
    }
}

#[async_trait]
impl ProxyHttp for AgentProxy {
    type CTX = RequestCtx;

    /// No downstream modules: pingora's default is a response compression
    /// module at level 0 (off), which still costs every request its setup
    /// and a look at each response header and body piece.
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    fn new_ctx(&self) -> RequestCtx {
        self.ctx_with(Held::current(&self.config))
    }

    /// The requests `Edge` hands over: admitted as our routes' are, then
    /// proxied while `passthrough` is on, each the last of its connection.
    /// Pingora keeps what a client pipelined after it where our HTTP/1 cannot
    /// take it back, so the close tells the client to send those again
    /// (RFC 9112 §9.3.2). These are rare: bodies over 1 MiB, chunked ones to
    /// other routes, upgrades.
    async fn request_filter(
        &self,
        session: &mut ProxySession,
        ctx: &mut RequestCtx,
    ) -> Result<bool> {
        let admitted = self
            .admit(session.req_header_mut(), ctx)
            .and_then(|dialect| {
                self.authenticate(session.req_header(), ctx)
                    .map(|()| dialect)
                    .map_err(|error| (dialect, error))
            });
        session.set_keepalive(None);
        let (dialect, error) = match admitted {
            Ok(_) if ctx.config.passthrough => return Ok(false),
            Ok(dialect) => {
                let req = session.req_header();
                let error =
                    ApiError::not_found(format!("no route for {} {}", req.method, req.uri.path()));
                (dialect, error)
            }
            Err(refused) => refused,
        };
        respond_proxied(session, dialect, &error, &ctx.request_id).await?;
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        session: &mut ProxySession,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let method = session.req_header().method.as_str();
        let attempts = ctx
            .attempts
            .get_or_insert_with(|| Attempts::new(None, method));
        attempts.next_peer(&ctx.config.default_upstream).await
    }

    fn fail_to_connect(
        &self,
        _session: &mut ProxySession,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        e: Box<Error>,
    ) -> Box<Error> {
        match ctx.attempts.as_mut() {
            Some(attempts) => attempts.connect_failed(&ctx.config.default_upstream, e),
            None => e,
        }
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut ProxySession,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let upstream = &ctx.config.default_upstream;
        let replica = ctx.attempts.as_ref().map_or(0, Attempts::replica);
        let member = upstream.pool.member(replica);
        let path = upstream_request
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str());
        let mapped = Upstream::map_path(member, path);
        let uri = mapped
            .parse::<http::Uri>()
            .map_err(|_| Error::explain(ErrorType::InvalidHTTPHeader, "unmappable path"))?;
        upstream_request.set_uri(uri);
        upstream_request.insert_header(http::header::HOST, member.endpoint.authority())?;
        upstream.authorize(upstream_request, !ctx.config.api_keys.is_empty())
    }

    async fn response_filter(
        &self,
        session: &mut ProxySession,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // A switch the client did not ask for would make its connection a
        // tunnel to the upstream (nginx: 502).
        if upstream_response.status == http::StatusCode::SWITCHING_PROTOCOLS
            && !session
                .req_header()
                .headers
                .contains_key(http::header::UPGRADE)
        {
            let unasked = ErrorType::Custom("it switched protocols unasked");
            return Err(Error::new(unasked).into_up());
        }
        if let Some(attempts) = ctx.attempts.as_mut() {
            attempts.passed_on(
                &ctx.config.default_upstream,
                upstream_response.status.as_u16(),
            );
        }
        forward::drop_hop_fields(upstream_response)?;
        upstream_response.insert_header(request_id::HEADER.clone(), ctx.request_id.as_str())?;
        ctx.masking = upstream_response.status.as_u16() >= 400;
        if ctx.masking {
            ctx.failure = Some(crate::error::UPSTREAM_STATUS);
        }
        if is_event_stream(upstream_response) {
            ctx.stream = Some(StreamGuard::open());
        }
        Ok(())
    }

    /// An error's pieces, each with the upstream's key masked (a key split
    /// across two pieces is not found: an error's body comes in one).
    fn response_body_filter(
        &self,
        _session: &mut ProxySession,
        body: &mut Option<bytes::Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        if ctx.masking {
            *body = body
                .take()
                .map(|piece| ctx.config.default_upstream.masking_key(piece));
        }
        Ok(None)
    }

    fn suppress_error_log(
        &self,
        _session: &ProxySession,
        _ctx: &RequestCtx,
        error: &Error,
    ) -> bool {
        is_routine(error)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut ProxySession,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let upstream = &ctx.config.default_upstream;
        if let (ErrorSource::Upstream, Some(attempts)) = (e.esource(), ctx.attempts.as_mut()) {
            attempts.broke_off(upstream, e);
        }
        let mut code = 0;
        let error = failure(e, &upstream.name).filter(|_| session.response_written().is_none());
        if let Some(error) = error {
            code = error.status;
            let _ = respond_proxied(session, Dialect::Chat, &error, &ctx.request_id).await;
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(
        &self,
        session: &mut ProxySession,
        error: Option<&Error>,
        ctx: &mut RequestCtx,
    ) {
        let response = session.response_written().map(|h| h1::Answered {
            status: h.status,
            event_stream: is_event_stream(h),
        });
        self.log(session.req_header(), response, error, ctx);
        // Answered before the client's body was read whole (a refused key,
        // an upstream that failed): the connection closes next, and closed
        // with bytes unread it is reset, the answer lost with it, or the
        // client's send fails before it reads. What it still sends is read
        // first, for a bounded time, as our own routes do (`edge::linger`).
        if !session.is_body_done() {
            let _ = tokio::time::timeout(edge::LINGER, session.drain_request_body()).await;
        }
    }
}

impl AgentProxy {
    /// `fail_to_proxy` for our routes: answers a request whose handler
    /// failed, if its response has not begun; returns the status sent.
    async fn fail(&self, session: &mut h1::Session, e: &Error, ctx: &RequestCtx) -> u16 {
        let error = failure(e, &ctx.config.default_upstream.name)
            .filter(|_| session.response_written().is_none());
        let Some(error) = error else {
            return 0;
        };
        let mut client = Client::new(session, std::time::Duration::MAX);
        let _ = client.respond_error(&error).await;
        error.status
    }
}

/// A client that hangs up is routine, not an error worth a log line.
fn is_routine(error: &Error) -> bool {
    error.esource() == &ErrorSource::Downstream || error.etype() == &ErrorType::ConnectionClosed
}

/// What the client of a failed request is told, if it is still there.
fn failure(e: &Error, upstream: &str) -> Option<ApiError> {
    match (e.etype(), e.esource()) {
        (ErrorType::HTTPStatus(code), _) => Some(ApiError::bad_request(format!("HTTP {code}"))),
        (_, ErrorSource::Downstream) => None,
        (_, ErrorSource::Upstream) => Some(crate::error::from_upstream(upstream, e)),
        _ => Some(ApiError::internal("internal error")),
    }
}

/// An error in `dialect`'s shape, on pingora's proxy path.
async fn respond_proxied(
    session: &mut ProxySession,
    dialect: Dialect,
    error: &ApiError,
    request_id: &str,
) -> Result<()> {
    let (status, body) = crate::front::error_response(dialect, error);
    let mut header = ResponseHeader::build_no_case(status, Some(3))?;
    header.insert_header(http::header::CONTENT_TYPE, "application/json")?;
    header.insert_header(http::header::CONTENT_LENGTH, body.len())?;
    header.insert_header(request_id::HEADER.clone(), request_id)?;
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(body), true).await
}

/// The route of `method path`, for metrics and for dispatch: the proxy's
/// own endpoints, the three API fronts, or [`PROXY`] for everything else.
fn route_of(method: &str, path: &str, config: &Config) -> &'static str {
    match (method, path) {
        ("GET", "/healthz" | "/readyz") => "health",
        ("GET", "/metrics") => "metrics",
        ("GET", "/v1/models") => "models",
        ("GET", p)
            if p.strip_prefix("/v1/models/")
                .is_some_and(|id| config.agent(id).is_some()) =>
        {
            "model"
        }
        ("POST", "/v1/chat/completions") => "chat",
        ("POST", "/v1/responses") => "responses",
        ("POST", "/v1/messages") => "messages",
        ("POST", "/v1/messages/count_tokens") => "count_tokens",
        (m, p) if stored::is_route(m, p) => "stored_response",
        (_, p) if memories::is_route(p) => "admin",
        // Claude Code probes the base URL before it starts.
        ("GET" | "HEAD", "/") => "root",
        // A TRACE would echo the request as sent upstream, its key with it
        // (nginx refuses it too); a CONNECT asks for a tunnel.
        ("TRACE" | "TRACK" | "CONNECT", _) => NOT_ALLOWED,
        _ => PROXY,
    }
}

/// A request none of our handlers answers: with `passthrough`, passed on
/// by our forwarder where it takes it (no body, or one of up to 1 MiB), by
/// pingora's proxy path otherwise (`Ok(false)`); without, a 404.
async fn other_route(
    session: &mut h1::Session,
    ctx: &mut RequestCtx,
    dialect: Dialect,
) -> Result<bool> {
    if !ctx.config.passthrough {
        let req = session.req_header();
        let error = ApiError::not_found(format!("no route for {} {}", req.method, req.uri.path()));
        return reject(session, dialect, &error).await;
    }
    match forward::takes(session.req_header(), session.body()) {
        true => forward::other_route(session, ctx).await,
        false => Ok(false),
    }
}

/// The route of a request our handlers do not answer.
const PROXY: &str = "proxy";

/// A listing's `limit` query parameter: a whole number from 1 to `most`.
fn page_limit(value: &str, most: usize) -> std::result::Result<usize, ApiError> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=most).contains(n))
        .ok_or_else(|| {
            ApiError::bad_request(format!("limit must be an integer from 1 to {most}."))
                .with_param("limit")
        })
}

/// The route of a method no route takes.
const NOT_ALLOWED: &str = "not_allowed";

/// Sent by every Anthropic client: `/v1/models` answers it in its shape.
const ANTHROPIC_VERSION: http::HeaderName = http::HeaderName::from_static("anthropic-version");

/// Where pingora's proxy path comes in for a request.
#[derive(Clone, Copy, PartialEq)]
enum ProxyPath {
    /// It takes the request straight away: a route of none of ours, with
    /// `passthrough` on.
    Now,
    /// Our handlers answer, but may pass the request on: a stored
    /// response's id that is not ours, or a route of none of ours, which
    /// our forwarder takes unless its body is large or chunked (without
    /// `passthrough`, refused).
    Perhaps,
    /// Our handlers answer.
    Never,
}

fn proxy_path(head: &h1::Head, config: &Config) -> ProxyPath {
    let req = &head.header;
    match route_of(req.method.as_str(), req.uri.path(), config) {
        PROXY if config.passthrough && !forward::takes(req, head.body()) => ProxyPath::Now,
        PROXY | "stored_response" => ProxyPath::Perhaps,
        _ => ProxyPath::Never,
    }
}
