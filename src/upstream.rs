//! Model servers the proxy forwards to (llama.cpp, vLLM, OpenAI, …).

use std::time::Duration;

use bytes::Bytes;
use pingora::http::RequestHeader;

use crate::config::file::UpstreamFile;
use crate::http_client::{Endpoint, EndpointOptions};

/// One configured upstream: its base URL as the OpenAI SDKs take it
/// (`http://host:8080/v1`) and the key the proxy sends there.
pub struct Upstream {
    pub name: String,
    pub endpoint: Endpoint,
    api_key: Option<String>,
}

impl Upstream {
    pub fn from_file(name: &str, file: UpstreamFile) -> Result<Self, String> {
        let endpoint = Endpoint::parse(
            &file.url,
            EndpointOptions {
                connect_timeout: Duration::from_millis(file.connect_timeout_ms),
                read_timeout: Duration::from_millis(file.read_timeout_ms),
                ca_file: file.ca_file,
            },
        )?;
        Ok(Upstream {
            name: name.to_owned(),
            endpoint,
            api_key: file.api_key.filter(|k| !k.is_empty()),
        })
    }

    /// Where a client path goes: `/v1/X` maps to the base URL + `/X`;
    /// other paths (llama.cpp's `/health`, `/props`, …) keep their path on
    /// the upstream's origin.
    pub fn map_path(&self, client_path_and_query: &str) -> String {
        match client_path_and_query.strip_prefix("/v1") {
            Some(rest) if rest.is_empty() || rest.starts_with(['/', '?']) => {
                self.endpoint.path(rest)
            }
            _ => client_path_and_query.to_owned(),
        }
    }

    /// Sets `Host` and the upstream's credentials on a request that came from
    /// a client. The client's own `Authorization` is dropped when the upstream
    /// has a key of its own, or when it was the proxy's key.
    pub fn authorize(
        &self,
        req: &mut RequestHeader,
        client_key_is_ours: bool,
    ) -> pingora::Result<()> {
        req.insert_header(http::header::HOST, self.endpoint.authority())?;
        match &self.api_key {
            Some(key) => req.insert_header(http::header::AUTHORIZATION, format!("Bearer {key}"))?,
            None if client_key_is_ours => {
                req.remove_header(&http::header::AUTHORIZATION);
            }
            None => {}
        }
        Ok(())
    }

    /// A POST of a JSON body to `suffix` under the base URL.
    pub fn json_post(&self, suffix: &str, request_id: &str) -> pingora::Result<RequestHeader> {
        let mut req = self
            .endpoint
            .request_header("POST", &self.endpoint.path(suffix))?;
        req.insert_header(http::header::CONTENT_TYPE, "application/json")?;
        req.insert_header(crate::request_id::HEADER, request_id)?;
        self.authorize(&mut req, true)?;
        Ok(req)
    }

    /// A GET of `suffix` under the base URL.
    pub fn get(&self, suffix: &str) -> pingora::Result<RequestHeader> {
        let mut req = self
            .endpoint
            .request_header("GET", &self.endpoint.path(suffix))?;
        self.authorize(&mut req, true)?;
        Ok(req)
    }
}

impl Upstream {
    /// `GET <url>/models` within `wait`: the status and body, or why not.
    /// Used by the model list and the readiness probe.
    pub async fn fetch_models(&self, wait: Duration) -> Result<(u16, Bytes), String> {
        let fetch = async {
            let req = self.get("/models").map_err(|e| e.to_string())?;
            let mut exchange = self
                .endpoint
                .send(req, None)
                .await
                .map_err(|e| e.etype().as_str().to_owned())?;
            let body = exchange
                .read_to_end(4 << 20)
                .await
                .map_err(|e| e.etype().as_str().to_owned())?;
            Ok((exchange.status(), body))
        };
        tokio::time::timeout(wait, fetch)
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(url: &str) -> Upstream {
        Upstream::from_file(
            "t",
            UpstreamFile {
                url: url.into(),
                api_key: None,
                ca_file: None,
                connect_timeout_ms: 1,
                read_timeout_ms: 1,
            },
        )
        .unwrap()
    }

    #[test]
    fn maps_v1_paths_onto_the_base_url() {
        let u = upstream("http://127.0.0.1:8080/v1");
        assert_eq!(u.map_path("/v1/embeddings"), "/v1/embeddings");
        assert_eq!(u.map_path("/health"), "/health");
        let u = upstream("https://example.test/openai/v1/");
        assert_eq!(u.map_path("/v1/models?x=1"), "/openai/v1/models?x=1");
        assert_eq!(u.map_path("/v1"), "/openai/v1");
        assert_eq!(u.map_path("/v1x"), "/v1x");
        let u = upstream("http://host:1234");
        assert_eq!(u.map_path("/v1/chat/completions"), "/chat/completions");
    }
}
