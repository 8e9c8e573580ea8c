//! The one upstream layer: model servers the proxy forwards to (llama.cpp,
//! vLLM, OpenAI, …), one base URL or a pool of replicas, and how a request
//! gets to one. Both ways out use it: [`Upstream::send`] (agent calls,
//! forwarded chat, Responses and Messages requests, the proxy's own calls),
//! whose I/O engine is `http_client`, and pingora's proxy path (other
//! endpoints), whose hooks ask [`Attempts`] for each peer. Replica choice
//! (`pool.rs`: health, affinity, least-busy), the retry policy and upstream
//! metrics (`attempts.rs`), timeouts and DNS (`http_client`'s endpoints, which
//! also build the proxy path's peers) are each written once.
//!
//! An [`Upstream`] is the runtime built from its spec ([`UpstreamFile`]); a
//! reload that leaves the spec unchanged keeps it, health state included.

mod attempts;
mod health;
mod pool;

use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use pingora::ErrorType;
use tracing::warn;

pub use attempts::Attempts;
pub use health::{HealthChecks, Readiness};
pub use pool::{affinity_key, session_key, Busy, HealthCheck, Member, Pool, NO_SYSTEM};

use crate::config::file::{UpstreamApi, UpstreamFile};
use crate::error::AtEndpoint;
use crate::http_client::{
    EditHeaders, Endpoint, EndpointOptions, Exchange, Request, Timeouts, CONTENT_TYPE, JSON,
};

/// The runtime of one configured upstream, built from its spec: the pool
/// with its health state, the replicas' connection pools and DNS answers.
/// A reload whose spec for it is unchanged keeps this very object.
pub struct Upstream {
    pub name: String,
    /// The spec it was built from.
    spec: UpstreamFile,
    pub pool: Pool,
    pub api: UpstreamApi,
    /// Its models take a tool result's images and files (`vision`).
    pub vision: bool,
    /// `Authorization: Bearer <api_key>`, marked sensitive (never logged).
    bearer: Option<http::HeaderValue>,
    retries: usize,
    ready: health::ReadyState,
}

/// Names the credentials go by, to borrow.
static AUTHORIZATION: http::HeaderName = http::header::AUTHORIZATION;
static X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// A request for an upstream, built for whichever replica serves it.
pub struct Outbound<'a> {
    pub method: &'a str,
    /// The client-facing path (`/v1/chat/completions`), mapped per replica.
    pub path: &'a str,
    pub headers: &'a [(&'a http::HeaderName, &'a http::HeaderValue)],
    pub body: Option<Bytes>,
    /// Conversation key for `prefix_affinity`.
    pub affinity: Option<u64>,
    /// The client's `Authorization` is the proxy's own key: never forwarded.
    pub client_key_is_ours: bool,
}

impl Upstream {
    pub fn from_file(name: &str, file: UpstreamFile) -> Result<Self, String> {
        let spec = file.clone();
        let urls = match (file.url, file.endpoints) {
            (Some(url), endpoints) if endpoints.is_empty() => vec![url],
            (None, endpoints) if !endpoints.is_empty() => endpoints,
            _ => return Err("give either `url` or a non-empty `endpoints` list".into()),
        };
        let timeouts = Timeouts {
            connect: Duration::from_millis(file.connect_timeout_ms),
            first_byte: Duration::from_millis(file.first_byte_timeout_ms),
            idle: Duration::from_millis(file.idle_timeout_ms),
            total: file.total_timeout_ms.map(Duration::from_millis),
        };
        let members = urls
            .into_iter()
            .map(|url| {
                let options = EndpointOptions {
                    timeouts,
                    ca_file: file.ca_file.clone(),
                };
                // Credentials in the URL stay out of the logs that name it.
                Endpoint::parse(&url, options).map(|endpoint| {
                    let url = endpoint.url();
                    (endpoint, url)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let is_pool = members.len() > 1;
        let health = match file.health_check {
            Some(check) if !check.enabled => None,
            Some(check) => Some(check),
            None if is_pool => Some(Default::default()),
            None => None,
        };
        let health = health
            .map(|check| {
                if !check.path.starts_with('/') {
                    return Err(format!(
                        "health_check.path `{}` must start with `/`",
                        check.path
                    ));
                }
                Ok(HealthCheck {
                    path: check.path,
                    interval: Duration::from_millis(check.interval_ms.max(10)),
                    timeout: Duration::from_millis(check.timeout_ms.max(1)),
                })
            })
            .transpose()?;
        let bearer = match file.api_key.filter(|k| !k.is_empty()) {
            Some(key) => {
                let mut value = http::HeaderValue::try_from(format!("Bearer {key}"))
                    .map_err(|_| "`api_key` holds a character a header cannot carry")?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let retries = file
            .retries
            .map_or(members.len().saturating_sub(1).min(2), |r| r as usize);
        Ok(Upstream {
            name: name.to_owned(),
            spec,
            pool: Pool::new(name, members, file.balance, health),
            api: file.api,
            vision: file.vision,
            bearer,
            retries,
            ready: Default::default(),
        })
    }

    /// Where a client path goes on `member`: `/v1/X` maps to its base URL +
    /// `/X`; other paths (llama.cpp's `/health`, `/props`, …) keep their path
    /// on its origin.
    pub fn map_path(member: &Member, client_path_and_query: &str) -> String {
        match client_path_and_query.strip_prefix("/v1") {
            Some(rest) if rest.is_empty() || rest.starts_with(['/', '?']) => {
                member.endpoint.path(rest)
            }
            _ => client_path_and_query.to_owned(),
        }
    }

    /// Sets the upstream's credentials. The client's own `Authorization` is
    /// dropped when the upstream has a key of its own, or when it was the
    /// proxy's key.
    pub fn authorize<'a>(
        &'a self,
        req: &mut impl EditHeaders<'a>,
        client_key_is_ours: bool,
    ) -> pingora::Result<()> {
        if self.bearer.is_some() || client_key_is_ours {
            // Anthropic clients send their key as `x-api-key`.
            req.remove(&X_API_KEY);
            req.remove(&AUTHORIZATION);
        }
        match &self.bearer {
            Some(bearer) => req.insert(&AUTHORIZATION, bearer),
            None => Ok(()),
        }
    }

    /// `body` with every copy of this upstream's key masked, byte for byte:
    /// a server may echo the credential it was sent ("Incorrect API key
    /// provided: sk-…"), and an upstream's error goes on to the client and
    /// into the log. The same length, so a body's framing holds.
    pub fn masking_key(&self, body: Bytes) -> Bytes {
        let key = self.spec.api_key.as_deref().unwrap_or_default();
        crate::mask::masked(&body, key.as_bytes()).map_or(body, Bytes::from)
    }

    /// Whether this runtime was built from `spec`.
    pub fn is_built_from(&self, spec: &UpstreamFile) -> bool {
        self.spec == *spec
    }

    /// How many more replicas a failed attempt may move on to.
    pub fn retries(&self) -> usize {
        self.retries
    }

    /// Sends `request` by the one retry policy ([`Attempts`]): to the next
    /// replica on a connect failure, on a 5xx answer, and on other failures
    /// of a `GET`, while retries remain. The last answer, 5xx or not, is
    /// returned for the caller to pass on.
    pub async fn send(&self, request: &Outbound<'_>) -> pingora::Result<Exchange> {
        let mut attempts = Attempts::new(request.affinity, request.method);
        let mut failure = None;
        while let Some(index) = attempts.next_replica(self) {
            let member = self.pool.member(index);
            let mut req = Request::new(request.method, Self::map_path(member, request.path))?;
            for &(name, value) in request.headers {
                req.append(name, value);
            }
            self.authorize(&mut req, request.client_key_is_ours)?;
            match member.endpoint.send(req, request.body.clone()).await {
                Ok(exchange) if attempts.answered(self, exchange.status()) => {
                    warn!(upstream = %self.name, endpoint = %member.url, status = exchange.status(), "retrying on another endpoint");
                }
                Ok(mut exchange) => {
                    exchange.watch(attempts.answer_watch(self));
                    return Ok(exchange);
                }
                Err(e) => {
                    let again = attempts.failed(self, &e);
                    let e = member.tag_error(e);
                    if !again {
                        return Err(e);
                    }
                    warn!(upstream = %self.name, endpoint = %member.url, error = e.etype().as_str(), "retrying on another endpoint");
                    failure = Some(e);
                }
            }
        }
        Err(failure.unwrap_or_else(|| pingora::Error::new(ErrorType::ConnectNoRoute).into_up()))
    }

    /// A model call: `body` POSTed to `/chat/completions` or `/responses`
    /// (per `api`) with the request's id, on the replica `affinity` prefers.
    /// `client_auth` is the client's `Authorization` when it is not the
    /// proxy's key: it goes along unless the upstream has a key of its own.
    pub async fn post_model(
        &self,
        api: UpstreamApi,
        body: Bytes,
        request_id: &str,
        affinity: Option<u64>,
        client_auth: Option<&http::HeaderValue>,
    ) -> pingora::Result<Exchange> {
        let id = http::HeaderValue::from_str(request_id).map_err(|_| {
            pingora::Error::explain(ErrorType::InvalidHTTPHeader, "invalid request id")
        })?;
        let ours = [(&CONTENT_TYPE, &JSON), (&crate::request_id::HEADER, &id)];
        let with_auth;
        let headers: &[_] = match client_auth {
            Some(auth) => {
                with_auth = [ours[0], ours[1], (&AUTHORIZATION, auth)];
                &with_auth
            }
            None => &ours,
        };
        self.send(&Outbound {
            method: "POST",
            path: match api {
                UpstreamApi::Chat => "/v1/chat/completions",
                UpstreamApi::Responses => "/v1/responses",
            },
            headers,
            body: Some(body),
            affinity,
            client_key_is_ours: client_auth.is_none(),
        })
        .await
    }

    /// `GET <url>/models` within `wait`: the status and body, or why not.
    /// Used by the model list and the health checker's readiness probe.
    pub async fn fetch_models(&self, wait: Duration) -> Result<(u16, Bytes), String> {
        self.call("GET", "/v1/models", None, wait).await
    }

    /// A small request of the proxy's own (a listing, a tokenization): the
    /// status and the whole body within `wait`, or why not.
    pub async fn call(
        &self,
        method: &'static str,
        path: &str,
        body: Option<Bytes>,
        wait: Duration,
    ) -> Result<(u16, Bytes), String> {
        let json = [(&CONTENT_TYPE, &JSON)];
        let request = Outbound {
            method,
            path,
            headers: if body.is_some() { &json } else { &[] },
            body,
            affinity: None,
            client_key_is_ours: true,
        };
        let fetch = async {
            let mut exchange = self.send(&request).await.map_err(describe_failure)?;
            let body = exchange
                .read_to_end(4 << 20)
                .await
                .map_err(describe_failure)?;
            Ok((exchange.status(), body))
        };
        tokio::time::timeout(wait, fetch)
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }

    /// Whether any replica accepts a connection, within `wait`. Nothing is
    /// sent: the model server sees no request. `Err` says why not (the last
    /// replica's failure).
    pub async fn accepts_connections(&self, wait: Duration) -> Result<(), &'static str> {
        let tries = (0..self.pool.size()).map(|i| self.pool.member(i).endpoint.try_connect());
        let outcomes = tokio::time::timeout(wait, join_all(tries))
            .await
            .map_err(|_| "timed out")?;
        outcomes
            .into_iter()
            .reduce(Result::or)
            .unwrap_or(Ok(()))
            .map_err(|e| crate::error::failure_reason(e.etype()))
    }

    /// Every replica's base URL, without credentials, for messages.
    pub fn urls(&self) -> String {
        (0..self.pool.size())
            .map(|i| self.pool.member(i).url.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Why an exchange failed, in words, and where (`connection refused at
/// http://127.0.0.1:8080`).
fn describe_failure(err: Box<pingora::Error>) -> String {
    let reason = crate::error::failure_reason(err.etype());
    match AtEndpoint::origin_of(&err) {
        Some(origin) => format!("{reason} at {origin}"),
        None => reason.to_owned(),
    }
}

/// Failures where the request never reached the server: safe to send elsewhere.
pub fn is_connect_failure(kind: &ErrorType) -> bool {
    matches!(
        kind,
        ErrorType::ConnectTimedout
            | ErrorType::ConnectRefused
            | ErrorType::ConnectNoRoute
            | ErrorType::ConnectError
            | ErrorType::TLSHandshakeFailure
            | ErrorType::TLSHandshakeTimedout
            | ErrorType::InvalidCert
            | ErrorType::HandshakeError
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(url: &str) -> Upstream {
        let file: UpstreamFile = serde_yaml_ng::from_str(&format!("url: '{url}'")).unwrap();
        Upstream::from_file("t", file).unwrap()
    }

    #[test]
    fn every_copy_of_the_key_is_masked_at_its_length() {
        let file: UpstreamFile =
            serde_yaml_ng::from_str("{ url: 'http://a', api_key: sk-1234 }").unwrap();
        let keyed = Upstream::from_file("t", file).unwrap();
        let body = Bytes::from_static(b"sk-1234 and sk-12345, not sk-123");
        assert_eq!(keyed.masking_key(body), "******* and *******5, not sk-123");
        let none = upstream("http://a");
        assert_eq!(none.masking_key(Bytes::from_static(b"sk-1234")), "sk-1234");
    }

    #[test]
    fn maps_v1_paths_onto_the_base_url() {
        let map = |url: &str, path: &str| {
            let u = upstream(url);
            Upstream::map_path(u.pool.member(0), path)
        };
        assert_eq!(
            map("http://127.0.0.1:8080/v1", "/v1/embeddings"),
            "/v1/embeddings"
        );
        assert_eq!(map("http://127.0.0.1:8080/v1", "/health"), "/health");
        assert_eq!(
            map("https://example.test/openai/v1/", "/v1/models?x=1"),
            "/openai/v1/models?x=1"
        );
        assert_eq!(map("https://example.test/openai/v1/", "/v1"), "/openai/v1");
        assert_eq!(map("https://example.test/openai/v1/", "/v1x"), "/v1x");
        assert_eq!(
            map("http://host:1234", "/v1/chat/completions"),
            "/chat/completions"
        );
    }

    #[test]
    fn url_or_endpoints_and_pool_defaults() {
        let file: UpstreamFile = serde_yaml_ng::from_str(
            "endpoints: ['http://a:1/v1', 'http://b:1/v1', 'http://c:1/v1', 'http://d:1/v1']",
        )
        .unwrap();
        let pool = Upstream::from_file("p", file).unwrap();
        assert_eq!(pool.pool.size(), 4);
        assert_eq!(pool.retries(), 2);
        let file: UpstreamFile =
            serde_yaml_ng::from_str("url: 'http://a:1/v1'\nendpoints: ['http://b:1/v1']").unwrap();
        assert!(Upstream::from_file("p", file).is_err());
        let file: UpstreamFile = serde_yaml_ng::from_str("endpoints: []").unwrap();
        assert!(Upstream::from_file("p", file).is_err());
    }
}
