//! HTTP tools: the model's arguments are POSTed as JSON to a URL fixed by the
//! config; the response body is the result.

use std::time::Duration;

use ::http::HeaderValue;
use bytes::Bytes;
use pingora::{ErrorType, OrErr};

use super::{capped_text, CallContext, Outcome, Run};
use crate::config::file::HttpToolFile;
use crate::http_client::{
    EditHeaders, Endpoint, EndpointOptions, Request, Timeouts, CONTENT_TYPE, JSON,
};

pub struct HttpTool {
    endpoint: Endpoint,
    path: String,
    headers: Vec<(::http::HeaderName, ::http::HeaderValue)>,
    /// The credentials among `headers`, masked in what the tool answers: a
    /// target that reflects its request's headers would put the operator's
    /// key in the model's context, and on to the client.
    secrets: Vec<Box<[u8]>>,
    timeout: Duration,
    /// Longer results are cut (`max_output_bytes`).
    cap: usize,
}

impl HttpTool {
    pub fn from_file(file: HttpToolFile, cap: usize) -> Result<Self, String> {
        let timeout = Duration::from_millis(file.timeout_ms);
        let uri: ::http::Uri = file
            .url
            .parse()
            .map_err(|e| crate::http_client::invalid_url(&file.url, e))?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        let origin = format!(
            "{}://{}",
            uri.scheme_str().unwrap_or_default(),
            uri.authority().map_or("", |a| a.as_str())
        );
        let endpoint = Endpoint::parse(
            &origin,
            EndpointOptions {
                timeouts: Timeouts::all(timeout),
                ca_file: None,
            },
        )?;
        let headers = file
            .headers
            .into_iter()
            .map(|(name, value)| {
                let name = ::http::HeaderName::try_from(name.as_str())
                    .map_err(|_| format!("invalid header name `{name}`"))?;
                let value = ::http::HeaderValue::try_from(value)
                    .map_err(|_| format!("invalid value for header `{name}`"))?;
                Ok((name, value))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let secrets = crate::mask::credentials(headers.iter().map(|(n, v)| (n, v)));
        Ok(HttpTool {
            endpoint,
            path,
            headers,
            secrets,
            timeout,
            cap,
        })
    }

    /// The endpoint enforces `timeout_ms` on the whole exchange.
    async fn post(&self, arguments: &str, request_id: &str) -> Outcome {
        let cap = self.cap;
        let id = match HeaderValue::from_str(request_id)
            .or_err(ErrorType::InvalidHTTPHeader, "invalid request id")
        {
            Ok(id) => id,
            Err(e) => return self.failed("request failed", &e),
        };
        let request = Request::new("POST", &self.path).and_then(|mut req| {
            req.append(&CONTENT_TYPE, &JSON);
            req.append(&crate::request_id::HEADER, &id);
            // The tool's own headers win over ours.
            for (name, value) in &self.headers {
                req.insert(name, value)?;
            }
            Ok(req)
        });
        let mut exchange = match request {
            Ok(req) => match self
                .endpoint
                .send(req, Some(Bytes::copy_from_slice(arguments.as_bytes())))
                .await
            {
                Ok(exchange) => exchange,
                Err(e) => return self.failed("request failed", &e),
            },
            Err(e) => return self.failed("request failed", &e),
        };
        let mut body = Vec::new();
        let mut truncated = false;
        loop {
            match exchange.read().await {
                Ok(Some(piece)) => {
                    body.extend_from_slice(&piece);
                    if body.len() > cap {
                        // Stop reading: the rest is not going to the model anyway.
                        truncated = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => return self.failed("reading the response failed", &e),
            }
        }
        let body = crate::mask::masked_all(body, &self.secrets);
        let text = capped_text(&body, cap, truncated);
        let status = exchange.status();
        if (200..300).contains(&status) {
            Outcome::success(text)
        } else {
            Outcome::error(format!("HTTP status {status}: {text}"))
        }
    }

    fn failed(&self, what: &str, e: &pingora::Error) -> Outcome {
        use pingora::ErrorType::*;
        match e.etype() {
            ConnectTimedout | ReadTimedout | WriteTimedout => {
                Outcome::error(format!("timed out after {} ms", self.timeout.as_millis()))
            }
            kind => Outcome::error(format!("{what}: {}", kind.as_str())),
        }
    }
}

#[async_trait::async_trait]
impl Run for HttpTool {
    async fn run(&self, arguments: &str, ctx: &CallContext) -> Outcome {
        self.post(arguments, &ctx.request_id).await
    }
}
