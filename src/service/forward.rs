//! Forwarding a chat request for a non-agent model to `default_upstream`:
//! the body as the client sent it, the response streamed back as it comes.

use bytes::Bytes;

use crate::config::Config;
use crate::downstream::{Client, Gone};
use crate::error::{from_upstream, ApiError};
use crate::metrics::StreamGuard;
use crate::sse;
use crate::upstream::Outbound;

/// Hop-by-hop headers: they describe one connection, not the message.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
];

/// Request headers the proxy sets itself for the upstream.
const SET_BY_PROXY: &[&str] = &["host", "content-length", "expect"];

fn is_hop_by_hop(name: &http::HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// Returns whether the response was cut mid-stream.
pub async fn forward(client: &mut Client<'_>, config: &Config, body: Bytes, affinity: u64) -> bool {
    match relay(client, config, body, affinity).await {
        Ok(()) => false,
        Err(Gone) => true,
    }
}

async fn relay(
    client: &mut Client<'_>,
    config: &Config,
    body: Bytes,
    affinity: u64,
) -> Result<(), Gone> {
    let upstream = &config.default_upstream;
    let incoming = client.session().req_header();
    let path = incoming
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let headers: Vec<_> = incoming
        .headers
        .iter()
        .filter(|(name, _)| !is_hop_by_hop(name) && !SET_BY_PROXY.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let outbound = Outbound {
        method: "POST",
        path: &path,
        headers: &headers,
        body: Some(body),
        affinity: Some(affinity),
        client_key_is_ours: !config.api_keys.is_empty(),
    };
    let mut exchange = match client.wait(upstream.send(&outbound)).await? {
        Ok(exchange) => exchange,
        Err(e) => {
            return client
                .respond_error(&from_upstream(&upstream.name, &e))
                .await
        }
    };
    let Some(mut header) = exchange.take_header() else {
        let missing = ApiError::bad_gateway("the upstream's response has no header");
        return client.respond_error(&missing).await;
    };
    for name in HOP_BY_HOP {
        header.remove_header(*name);
    }
    // Ours is an HTTP/1.1 answer, whatever the upstream spoke (h2).
    header.set_version(http::Version::HTTP_11);
    let event_stream = exchange.is_event_stream();
    if header.headers.get(http::header::CONTENT_LENGTH).is_none() {
        header
            .insert_header("transfer-encoding", "chunked")
            .map_err(|_| Gone)?;
    }
    if event_stream && header.headers.get("x-accel-buffering").is_none() {
        header
            .insert_header("x-accel-buffering", "no")
            .map_err(|_| Gone)?;
    }
    client.send_header(*header, false).await?;
    // Counted, but no heartbeats: a passed-through stream stays byte for byte.
    let _stream = event_stream.then(StreamGuard::open);
    loop {
        match client.wait(exchange.read()).await? {
            Ok(Some(piece)) => client.write(piece).await?,
            Ok(None) => return Ok(()),
            Err(e) => {
                if event_stream {
                    let mut event = Vec::new();
                    sse::write_data(&mut event, &from_upstream(&upstream.name, &e).to_json());
                    let _ = client.write(Bytes::from(event)).await;
                }
                return Err(Gone);
            }
        }
    }
}
