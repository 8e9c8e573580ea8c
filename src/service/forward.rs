//! Forwarding what is not for an agent to `default_upstream`: a chat
//! request for another model, and with `passthrough` on, a request for any
//! other route whose body is small enough to read whole (an embedding, a
//! completion: most of what an app sends). The body goes as the client sent
//! it, the response streams back as it comes. pingora's proxy path keeps
//! what needs it: an upgrade, a body of unknown length, a large upload.

use std::pin::pin;

use bytes::Bytes;
use http::header::{self, HeaderName};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::Result;

use super::front_door::read_body;
use super::h1::Session;
use super::{handled, reject, RequestCtx};
use crate::config::Config;
use crate::conversation::Dialect;
use crate::downstream::{Client, Gone};
use crate::error::{from_upstream, ApiError};
use crate::http1::{is_name, Body, ConnectionListed, X_ACCEL};
use crate::metrics::StreamGuard;
use crate::upstream::Outbound;

/// Hop-by-hop headers: they describe one connection, not the message.
/// Names, not strings: a lookup by a string parses it first.
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Request headers the proxy sets itself for the upstream.
static SET_BY_PROXY: [HeaderName; 3] = [header::HOST, header::CONTENT_LENGTH, header::EXPECT];

fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|hop| is_name(name, hop.as_str().as_bytes()))
}

/// An answer pingora's proxy path passes on, without the fields of the
/// upstream's hop (RFC 9110 §7.6.1): those named hop-by-hop and those its
/// `Connection` lists. pingora writes the head as it is left here, so the
/// fields that frame its body (`Transfer-Encoding`, `Content-Length`) stay,
/// and the client's connection gets a `Connection` of ours. A 101 keeps
/// `Upgrade`, the protocol switched to, with `Connection: Upgrade` alone.
pub fn drop_hop_fields(answer: &mut ResponseHeader) -> Result<()> {
    let switching = answer.status == http::StatusCode::SWITCHING_PROTOCOLS;
    let listed = ConnectionListed::of(&answer.headers);
    let framing = [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::CONTENT_LENGTH,
    ];
    let doomed: Vec<HeaderName> = answer
        .headers
        .keys()
        .filter(|name| {
            let hop = HOP_BY_HOP.contains(name) || listed.names(name.as_str().as_bytes());
            hop && !framing.contains(name) && !(switching && *name == header::UPGRADE)
        })
        .cloned()
        .collect();
    for name in doomed {
        answer.remove_header(&name);
    }
    if switching {
        answer.insert_header(header::CONNECTION, "Upgrade")?;
    }
    Ok(())
}

/// The largest body of a request for another route read whole to forward
/// it here; a larger one streams through pingora's proxy path.
const WHOLE_BODY: usize = 1024 * 1024;

/// Whether a request for another route is forwarded here rather than by
/// pingora's proxy path: a path for its target (not `*`), no upgrade, and
/// a body, as the head's parser framed it, of a length up to
/// [`WHOLE_BODY`] (none is a length of 0).
pub fn takes(req: &RequestHeader, body: &Body) -> bool {
    req.method != http::Method::CONNECT
        && req.uri.path().starts_with('/')
        && !req.headers.contains_key(http::header::UPGRADE)
        && matches!(body, Body::Length(n) if *n <= WHOLE_BODY as u64)
}

/// A request for another route (see [`takes`]), with `passthrough` on.
pub async fn other_route(session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
    let config = ctx.config.clone();
    // No body and an empty one are framed alike; the upstream gets a
    // length only where the client gave one.
    let declared = session
        .req_header()
        .headers
        .contains_key(http::header::CONTENT_LENGTH);
    let body = match declared {
        true => match read_body(session, WHOLE_BODY).await {
            Ok(body) => Some(body),
            Err(error) => return reject(session, Dialect::Chat, &error).await,
        },
        false => None,
    };
    let affinity = ctx
        .session
        .as_deref()
        .filter(|_| config.default_upstream.pool.ranks_by_conversation())
        .map(crate::upstream::session_key);
    let mut client = Client::new(session, config.limits.heartbeat);
    forward(&mut client, &config, Dialect::Chat, body, affinity)
        .await
        .handled(ctx)
}

/// How a forwarded request ended.
pub struct Forwarded {
    /// The response was cut mid-stream.
    pub cut: bool,
    /// What failed on the way to the upstream (pingora's name for it), for
    /// the log line.
    pub failure: Option<&'static str>,
}

impl Forwarded {
    /// The route's outcome, with what failed noted for the request's line.
    pub fn handled(self, ctx: &mut RequestCtx) -> Result<bool> {
        ctx.failure = self.failure;
        handled(self.cut)
    }
}

/// Forwards the request to the default upstream. What the proxy itself
/// answers (the upstream could not be reached, its stream broke) is in
/// `dialect`'s shape: the client's SDK reads it.
pub async fn forward(
    client: &mut Client<'_>,
    config: &Config,
    dialect: Dialect,
    body: Option<Bytes>,
    affinity: Option<u64>,
) -> Forwarded {
    let mut failure = None;
    let relayed = relay(client, config, dialect, body, affinity, &mut failure).await;
    Forwarded {
        cut: relayed.is_err(),
        // Cut with no failure of the upstream's: the client left.
        failure: failure.or(relayed.err().map(|Gone| "ClientClosed")),
    }
}

async fn relay(
    client: &mut Client<'_>,
    config: &Config,
    dialect: Dialect,
    body: Option<Bytes>,
    affinity: Option<u64>,
    failure: &mut Option<&'static str>,
) -> Result<(), Gone> {
    let upstream = &config.default_upstream;
    // The client's head goes out borrowed, not copied (a coding agent's
    // twenty fields, each name and value counted up and down twice).
    let sent = client
        .wait_on_head(async move |incoming| {
            let path = incoming.uri.path_and_query().map_or("/", |p| p.as_str());
            let fields = &incoming.headers;
            let listed = ConnectionListed::of(fields);
            // At the request's size: collected through a filter, the list
            // began at four and grew (a reallocation, a tenth of a
            // microsecond).
            let mut headers = Vec::with_capacity(fields.len());
            headers.extend(fields.iter().filter(|(name, _)| {
                !HOP_BY_HOP.contains(name)
                    && !SET_BY_PROXY.contains(name)
                    && !listed.names(name.as_str().as_bytes())
            }));
            let outbound = Outbound {
                method: incoming.method.as_str(),
                path,
                headers: &headers,
                body,
                affinity,
                client_key_is_ours: !config.api_keys.is_empty(),
            };
            upstream.send(&outbound).await
        })
        .await;
    let mut exchange = match sent? {
        Ok(exchange) => exchange,
        Err(e) => {
            let error = from_upstream(&upstream.name, &e);
            *failure = error.cause;
            return client.respond_error_in(dialect, &error).await;
        }
    };
    let Some(fields) = exchange.take_fields() else {
        let missing = ApiError::bad_gateway("the upstream's response has no header");
        return client.respond_error_in(dialect, &missing).await;
    };
    let Ok(status) = http::StatusCode::from_u16(exchange.status()) else {
        let invalid = ApiError::bad_gateway("the upstream's response has an invalid status");
        return client.respond_error_in(dialect, &invalid).await;
    };
    // An error's body is read whole first, to mask the upstream's key in
    // it (a server may echo the credential it was sent), at its length.
    let error_body = match status.as_u16() >= 400 {
        true => {
            *failure = Some(crate::error::UPSTREAM_STATUS);
            let limit = config.limits.max_upstream_body_bytes;
            match client.wait(pin!(exchange.read_to_end(limit))).await? {
                Ok(body) => Some(upstream.masking_key(body)),
                Err(e) => {
                    let error = from_upstream(&upstream.name, &e);
                    *failure = error.cause;
                    return client.respond_error_in(dialect, &error).await;
                }
            }
        }
        false => None,
    };
    // Written as the upstream sent them, but for its hop-by-hop fields and
    // those its `Connection` lists. Ours is an HTTP/1.1 answer, whatever the
    // upstream spoke (h2).
    let event_stream = exchange.is_event_stream();
    let (mut length, mut unbuffered) = (false, false);
    let mut listed = ConnectionListed::default();
    for (name, value) in fields.iter() {
        length |= is_name(name, b"content-length");
        unbuffered |= is_name(name, X_ACCEL.as_bytes());
        if is_name(name, b"connection") {
            listed.add(value);
        }
    }
    let chunked = (!length).then_some((&b"transfer-encoding"[..], &b"chunked"[..]));
    let unbuffered = (event_stream && !unbuffered).then_some((X_ACCEL.as_bytes(), &b"no"[..]));
    let passed = fields
        .iter()
        .filter(|(name, _)| !is_hop_by_hop(name) && !listed.names(name));
    client
        .send_head(status, passed.chain(chunked).chain(unbuffered), false)
        .await?;
    if let Some(body) = error_body {
        return match body.is_empty() {
            true => Ok(()),
            false => client.write(body).await,
        };
    }
    // Counted, but no heartbeats: a passed-through stream stays byte for byte.
    let _stream = event_stream.then(StreamGuard::open);
    // What ends the event the upstream was sending, should it stop inside
    // it: an error event of ours must not run into its last line.
    let mut unended: &'static [u8] = b"";
    loop {
        // A statement of its own: pinned in the match's scrutinee, the read
        // would live on through the arms' writes, and the relay's future
        // would make room for both at once.
        let read = client.wait(pin!(exchange.read())).await?;
        match read {
            Ok(Some(piece)) => {
                if event_stream && !piece.is_empty() {
                    unended = unended_event(&piece);
                }
                client.write(piece).await?
            }
            Ok(None) => return Ok(()),
            Err(e) => {
                *failure = Some(e.etype().as_str());
                // A body with a length is cut by the close alone: an event
                // after it would be read as the next response, or land
                // inside the length declared.
                if event_stream && !length {
                    let error = from_upstream(&upstream.name, &e);
                    let event = crate::front::error_event(dialect, &error);
                    let _ = client.write([unended, &event].concat().into()).await;
                }
                return Err(Gone);
            }
        }
    }
}

/// The line breaks that end an SSE event whose bytes so far end `piece`:
/// none after a blank line, one after a whole line, two inside a line.
fn unended_event(piece: &[u8]) -> &'static [u8] {
    match piece {
        [.., b'\n', b'\n'] | [.., b'\n', b'\r', b'\n'] => b"",
        [.., b'\n'] => b"\n",
        _ => b"\n\n",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_cut_short_is_ended_before_the_next() {
        for (piece, unended) in [
            (&b"data: {}\n\n"[..], &b""[..]),
            (b"data: {}\r\n\r\n", b""),
            (b"event: x\n", b"\n"),
            (b"data: {\"choices\": [nu", b"\n\n"),
        ] {
            assert_eq!(unended_event(piece), unended);
        }
    }

    use crate::service::h1;

    /// A client's request as the edge has it: its head parsed, its body framed.
    fn request(method: &str, target: &str, headers: &[(&str, &str)]) -> (RequestHeader, Body) {
        let fields: String = headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}\r\n"))
            .collect();
        let host = if method == "CONNECT" { target } else { "x" };
        let wire = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n{fields}\r\n");
        let head = h1::parse(&mut bytes::BytesMut::from(wire.as_bytes())).unwrap();
        let body = head.body().clone();
        (head.header, body)
    }

    #[test]
    fn what_needs_pingoras_proxy_path_goes_there() {
        let small = WHOLE_BODY.to_string();
        let large = (WHOLE_BODY + 1).to_string();
        let ours = [
            request("GET", "/health", &[]),
            request("DELETE", "/v1/files/f?x=1", &[]),
            request("POST", "/v1/embeddings", &[("content-length", "17")]),
            request("PUT", "/v1/x", &[("content-length", &small)]),
        ];
        let pingoras = [
            request("POST", "/v1/audio", &[("content-length", &large)]),
            request("POST", "/v1/x", &[("transfer-encoding", "chunked")]),
            // The coding frames the body, not the length beside it.
            request(
                "POST",
                "/v1/x",
                &[("content-length", "3"), ("transfer-encoding", "chunked")],
            ),
            request("GET", "/v1/realtime", &[("upgrade", "websocket")]),
            request("OPTIONS", "*", &[]),
            request("CONNECT", "example.com:443", &[]),
        ];
        for (req, body) in &ours {
            assert!(takes(req, body), "{} {}", req.method, req.uri);
        }
        for (req, body) in &pingoras {
            assert!(!takes(req, body), "{} {}", req.method, req.uri);
        }
    }
}
