//! The one error type of the proxy: it knows its HTTP status and how to render
//! itself as an OpenAI error body (`{"error":{"message","type","param","code"}}`).

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::Serialize;

/// An error answered to the client in OpenAI shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<Cow<'static, str>>,
    pub code: Option<Cow<'static, str>>,
    /// What failed, for the request's log line (not sent): pingora's name
    /// for a failure on the way to an upstream (`ConnectRefused`,
    /// `ReadTimedout`), as its proxy path logs it.
    pub cause: Option<&'static str>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            cause: None,
        }
    }

    pub fn with_cause(mut self, cause: &'static str) -> Self {
        self.cause = Some(cause);
        self
    }

    pub fn with_param(mut self, param: impl Into<Cow<'static, str>>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: impl Into<Cow<'static, str>>) -> Self {
        self.code = Some(code.into());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request_error", message)
    }

    pub fn invalid_api_key() -> Self {
        Self::new(
            401,
            "invalid_request_error",
            "Incorrect or missing API key.",
        )
        .with_code("invalid_api_key")
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "invalid_request_error", message).with_code("not_found")
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "invalid_request_error", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "invalid_request_error", message)
    }

    /// The client stopped sending its request (nginx: 408 too).
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(408, "invalid_request_error", message).with_code("request_timeout")
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            413,
            "invalid_request_error",
            format!("Request body exceeds the limit of {limit} bytes."),
        )
        .with_code("request_too_large")
    }

    pub fn too_many_json_values(limit: usize) -> Self {
        Self::new(
            413,
            "invalid_request_error",
            format!("Request body holds more than {limit} JSON values (limits.max_json_values)."),
        )
        .with_code("request_too_large")
    }

    pub fn too_many_streams(limit: usize) -> Self {
        Self::new(
            429,
            "rate_limit_error",
            format!("Too many open streams for this client (the limit is {limit})."),
        )
        .with_code("too_many_streams")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "server_error", message)
    }

    /// The upstream could not be reached or broke off its answer.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(502, "upstream_error", message).with_code("bad_gateway")
    }

    pub fn gateway_timeout(message: impl Into<String>) -> Self {
        Self::new(504, "upstream_error", message).with_code("timeout")
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "server_error", message)
    }

    /// The JSON body `{"error":{...}}`.
    pub fn to_json(&self) -> Bytes {
        let envelope = Envelope {
            error: Body {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code.as_deref(),
            },
        };
        // Serializing plain strings into a Vec cannot fail.
        Bytes::from(serde_json::to_vec(&envelope).unwrap_or_default())
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.kind, self.message)
    }
}

impl std::error::Error for ApiError {}

/// Maps an error from pingora's HTTP client to what the client should see:
/// a timeout is a 504, anything else on the way to the upstream is a 502.
/// The message names the endpoint when the error carries it ([`AtEndpoint`]),
/// and says what to do about a refused connection: on a first run that is
/// almost always a model server that is not started yet.
pub fn from_upstream(upstream: &str, err: &pingora::Error) -> ApiError {
    use pingora::ErrorType::*;
    let kind = err.etype();
    let origin = AtEndpoint::origin_of(err);
    let at = origin.map(|o| format!(" at {o}")).unwrap_or_default();
    let reason = failure_reason(kind);
    let error = match kind {
        ConnectRefused => ApiError::bad_gateway(format!(
            "upstream `{upstream}` refused the connection{at}: is llama-server (or your model server) running {}?",
            if origin.is_some() { "there" } else { "and reachable" }
        )),
        ConnectTimedout | ReadTimedout | WriteTimedout => {
            ApiError::gateway_timeout(format!("upstream `{upstream}` timed out{at} ({reason})"))
        }
        ConnectNoRoute => ApiError::bad_gateway(format!(
            "upstream `{upstream}` cannot be reached{at}: {reason}"
        )),
        TLSHandshakeFailure | TLSHandshakeTimedout | InvalidCert | HandshakeError => {
            ApiError::bad_gateway(format!(
                "upstream `{upstream}` failed the TLS handshake{at} ({reason}): check the URL's scheme and the upstream's `ca_file`"
            ))
        }
        _ => ApiError::bad_gateway(format!("upstream `{upstream}` failed{at}: {reason}")),
    };
    error.with_cause(kind.as_str())
}

/// An upstream's answer past the size a whole one is read to.
pub const ANSWER_TOO_LARGE: pingora::ErrorType = pingora::ErrorType::Custom("AnswerTooLarge");

/// What a request's log line says failed when the upstream answered with an
/// error status (4xx, 5xx), on every path alike.
pub const UPSTREAM_STATUS: &str = "UpstreamStatus";

/// What went wrong on the way to an upstream, in words, for error messages,
/// logs and `/readyz`.
pub fn failure_reason(kind: &pingora::ErrorType) -> &'static str {
    use pingora::ErrorType::*;
    match kind {
        ConnectRefused => "connection refused",
        ConnectTimedout => "connect timed out",
        ConnectNoRoute => "no route to the host, or its name does not resolve",
        ConnectError => "connect failed",
        TLSHandshakeFailure | HandshakeError => "TLS handshake failed",
        TLSHandshakeTimedout => "TLS handshake timed out",
        InvalidCert => "certificate not trusted",
        ReadTimedout => "no answer in time",
        WriteTimedout => "sending the request timed out",
        ConnectionClosed => "connection closed",
        ReadError => "read failed",
        WriteError => "write failed",
        kind if *kind == ANSWER_TOO_LARGE => "its answer is too large",
        other => other.as_str(),
    }
}

/// A failed exchange with an upstream and the endpoint it was with
/// (`scheme://host:port`, never credentials). The upstream layer wraps its
/// errors in this so the client's message can say where the failure was.
#[derive(Debug)]
pub struct AtEndpoint {
    origin: String,
    error: Box<pingora::Error>,
}

impl AtEndpoint {
    /// `error` with `origin` attached; its type, source and retry decision
    /// stay the same, so callers that look at those see no difference.
    pub fn wrap(origin: &str, error: Box<pingora::Error>) -> Box<pingora::Error> {
        Box::new(pingora::Error {
            etype: error.etype.clone(),
            esource: error.esource.clone(),
            retry: error.retry,
            cause: Some(Box::new(AtEndpoint {
                origin: origin.to_owned(),
                error,
            })),
            context: None,
        })
    }

    /// The endpoint `err` happened at, when it was wrapped.
    pub fn origin_of(err: &pingora::Error) -> Option<&str> {
        let cause = err.cause.as_deref()?.downcast_ref::<AtEndpoint>()?;
        Some(&cause.origin)
    }
}

impl fmt::Display for AtEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at {}: {}", self.origin, self.error)
    }
}

impl std::error::Error for AtEndpoint {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openai_shape_with_nulls() {
        let body = ApiError::bad_request("messages is required").with_param("messages");
        let v: serde_json::Value = serde_json::from_slice(&body.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error":{"message":"messages is required","type":"invalid_request_error","param":"messages","code":null}})
        );
    }

    #[test]
    fn invalid_key_has_code() {
        let e = ApiError::invalid_api_key();
        assert_eq!(e.status, 401);
        assert!(std::str::from_utf8(&e.to_json())
            .unwrap()
            .contains("\"code\":\"invalid_api_key\""));
    }

    #[test]
    fn a_refused_connection_names_the_endpoint_and_what_to_start() {
        let refused = pingora::Error::new(pingora::ErrorType::ConnectRefused).into_up();
        let e = from_upstream("local", &AtEndpoint::wrap("http://127.0.0.1:8080", refused));
        assert_eq!(e.status, 502);
        assert_eq!(
            e.message,
            "upstream `local` refused the connection at http://127.0.0.1:8080: \
             is llama-server (or your model server) running there?"
        );
        let timeout = pingora::Error::new(pingora::ErrorType::ReadTimedout).into_up();
        let wrapped = AtEndpoint::wrap("http://h:1", timeout);
        assert_eq!(wrapped.etype(), &pingora::ErrorType::ReadTimedout);
        assert_eq!(wrapped.esource(), &pingora::ErrorSource::Upstream);
        assert_eq!(from_upstream("local", &wrapped).status, 504);
    }
}
