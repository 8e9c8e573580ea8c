//! The front doors: `POST /v1/chat/completions` and `POST /v1/responses`.
//! Every such request, agent or not, is read and routed here. An agent's
//! model is decoded by its front's codec into a conversation and runs the
//! tool loop, answering through that front's encoder; any other model is
//! forwarded to `default_upstream` untouched.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use pingora::proxy::Session;
use pingora::Result;
use tracing::info;

use super::{forward, handled, reject, RequestCtx};
use crate::agent::router::AUTO;
use crate::agent::{tool_loop, Agent};
use crate::conversation::{Conversation, Dialect};
use crate::downstream::Client;
use crate::error::ApiError;
use crate::front::{self, chat::ChatEncoder, Encoder};
use crate::limits::{client_key, StreamSlot};
use crate::openai::{ChatRequest, RoutingPeek};
use crate::tools::CallContext;
use crate::upstream::affinity_key;

pub async fn handle(session: &mut Session, ctx: &mut RequestCtx, dialect: Dialect) -> Result<bool> {
    let config = ctx.config.clone();
    let body = match read_body(session, config.limits.max_body_bytes).await {
        Ok(body) => body,
        Err(error) => return reject(session, &error).await,
    };
    let peek: RoutingPeek = match serde_json::from_slice(&body) {
        Ok(peek) => peek,
        Err(e) => {
            return reject(
                session,
                &ApiError::bad_request(format!("invalid JSON body: {e}")),
            )
            .await
        }
    };
    let listed = match dialect {
        Dialect::Chat => peek.messages.as_ref().map(Vec::len),
        _ => peek.input_len(),
    };
    let field = match dialect {
        Dialect::Chat => "messages",
        _ => "input",
    };
    match listed {
        None if dialect != Dialect::Chat => {}
        None => {
            return reject(
                session,
                &ApiError::bad_request("`messages` is required").with_param("messages"),
            )
            .await
        }
        Some(0) => {
            return reject(
                session,
                &ApiError::bad_request(format!("`{field}` must not be empty")).with_param(field),
            )
            .await
        }
        Some(n) if n > config.limits.max_messages => {
            let error = ApiError::bad_request(format!(
                "`{field}` has {n} entries; the limit is {}",
                config.limits.max_messages
            ));
            return reject(session, &error.with_param(field)).await;
        }
        Some(_) => {}
    }
    // Streams hold connections for long: each client gets a bounded share.
    let _slot = if peek.stream == Some(true) {
        let authorization = session
            .req_header()
            .headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let address = session.client_addr().map(|a| {
            a.as_inet()
                .map_or_else(|| a.to_string(), |a| a.ip().to_string())
        });
        let client = client_key(authorization, address);
        match StreamSlot::acquire(client, config.limits.max_streams_per_client) {
            Some(slot) => Some(slot),
            None => {
                let error = ApiError::too_many_streams(config.limits.max_streams_per_client);
                return reject(session, &error).await;
            }
        }
    } else {
        None
    };
    let model = peek.model.as_deref();
    let auto = model == Some(AUTO) && config.router.is_some();
    let agent = model.and_then(|m| config.agent(m)).cloned();
    if agent.is_none() && !auto {
        if !config.passthrough {
            let model = model.unwrap_or_default();
            return reject(
                session,
                &ApiError::not_found(format!("The model `{model}` does not exist"))
                    .with_param("model")
                    .with_code("model_not_found"),
            )
            .await;
        }
        let (system, first_user) = peek.prefix();
        let affinity = affinity_key(system, first_user);
        let mut client = Client::new(session, config.limits.heartbeat);
        let cut = forward::forward(&mut client, &config, body, affinity).await;
        return handled(cut);
    }
    let (conversation, encoder) = match decode(dialect, &body) {
        Ok(decoded) => decoded,
        Err(error) => return reject(session, &error).await,
    };
    let ctx_call = CallContext {
        config: config.clone(),
        request_id: ctx.request_id.clone(),
        user: conversation.options.user.clone(),
        headers: Arc::new(session.req_header().headers.clone()),
        stack: Vec::new(),
        progress: None,
    };
    let mut client = Client::new(session, config.limits.heartbeat);
    let agent = match agent {
        Some(agent) => agent,
        // `auto`: the router picks (it exists, or `auto` was forwarded above).
        None => {
            let routed = match &config.router {
                // Boxed: routing is done before the answer streams, so its
                // future need not stay in this request's task.
                Some(router) => {
                    client
                        .wait(Box::pin(router.choose(
                            &config,
                            &conversation,
                            &ctx.request_id,
                        )))
                        .await
                }
                None => Ok(None),
            };
            match routed {
                Ok(Some(agent)) => agent,
                Ok(None) => {
                    let error = ApiError::internal("no agent to route to");
                    return handled(client.respond_error(&error).await.is_err());
                }
                Err(_) => return handled(true),
            }
        }
    };
    ctx.agent = Some(agent.id.clone());
    ctx.route = "agent";
    let call = ctx_call.nested(&agent.id, None);
    let encoder = encoder.build(&agent);
    let summary = tool_loop::run(
        &agent,
        conversation,
        encoder,
        &mut client,
        &call,
        ctx.started,
    )
    .await;
    let cut = summary.cut;
    ctx.summary = Some(summary);
    handled(cut)
}

/// How the answer will be encoded, once the agent (and so its
/// `reasoning_field`) is known.
enum EncoderFor {
    Chat { stream: bool, include_usage: bool },
    // Boxed: the context is large beside the chat variant.
    Responses(Box<front::responses::Context>, bool),
}

impl EncoderFor {
    fn build(self, agent: &Agent) -> Box<dyn Encoder> {
        match self {
            EncoderFor::Chat {
                stream,
                include_usage,
            } => Box::new(ChatEncoder::new(
                &agent.id,
                stream,
                include_usage,
                agent.reasoning_field,
            )),
            EncoderFor::Responses(context, stream) => Box::new(
                front::responses::ResponsesEncoder::new(&agent.id, stream, *context),
            ),
        }
    }
}

/// The request as a conversation, by its front's decoder.
fn decode(dialect: Dialect, body: &[u8]) -> Result<(Conversation, EncoderFor), ApiError> {
    match dialect {
        Dialect::Responses => {
            let (conversation, context) = front::responses::decode(body)?;
            if !context.dropped_tools.is_empty() {
                info!(tools = ?context.dropped_tools, "hosted tools dropped: the upstream cannot run them");
            }
            let stream = conversation.options.stream;
            Ok((
                conversation,
                EncoderFor::Responses(Box::new(context), stream),
            ))
        }
        Dialect::Chat | Dialect::Messages => {
            let request: ChatRequest = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid chat request: {e}")))?;
            let conversation = front::chat::decode(request)?;
            let encoder = EncoderFor::Chat {
                stream: conversation.options.stream,
                include_usage: conversation.options.include_usage,
            };
            Ok((conversation, encoder))
        }
    }
}

/// Reads the whole request body, refusing more than `limit` bytes.
async fn read_body(session: &mut Session, limit: usize) -> Result<Bytes, ApiError> {
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::body_too_large(limit));
    }
    let expects_continue = session
        .req_header()
        .headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        session
            .write_continue_response()
            .await
            .map_err(|_| ApiError::bad_request("client went away"))?;
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0));
    loop {
        match session.read_request_body().await {
            Ok(Some(piece)) => {
                if body.len() + piece.len() > limit {
                    return Err(ApiError::body_too_large(limit));
                }
                body.extend_from_slice(&piece);
            }
            Ok(None) => return Ok(body.freeze()),
            Err(e) => {
                return Err(ApiError::bad_request(format!(
                    "cannot read the request body: {}",
                    e.etype().as_str()
                )))
            }
        }
    }
}
