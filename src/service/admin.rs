//! The optional admin listener (`admin_listen`): metrics and probes on a port
//! of their own, without client auth, for scrapers and kubelets.

use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use super::health;
use crate::config::Config;
use crate::metrics::{metrics, CONTENT_TYPE};

pub struct Admin {
    config: Arc<ArcSwap<Config>>,
}

impl Admin {
    pub fn new(config: Arc<ArcSwap<Config>>) -> Self {
        Admin { config }
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let (status, content_type, body) = match session.req_header().uri.path() {
            "/metrics" => (200, CONTENT_TYPE, metrics().render()),
            "/healthz" => (
                200,
                "application/json",
                health::live_body().to_string().into_bytes(),
            ),
            "/readyz" => {
                let (status, body) = health::readiness(&self.config.load_full()).await;
                (status, "application/json", body.to_string().into_bytes())
            }
            _ => (404, "text/plain", b"not found\n".to_vec()),
        };
        Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::CONTENT_LENGTH, body.len())
            .body(body)
            .unwrap_or_default()
    }
}
