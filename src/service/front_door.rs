//! The front doors: `POST /v1/chat/completions`, `POST /v1/responses` and
//! `POST /v1/messages`. Every such request, agent or not, is read and routed
//! here. An agent's
//! model is decoded by its front's codec into a conversation and runs the
//! tool loop, answering through that front's encoder; any other model is
//! forwarded to `default_upstream` untouched.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use pingora::Result;
use tracing::info;

use super::h1::Session;
use super::stored::{self, Saving};
use super::{forward, handled, reject, RequestCtx};
use crate::agent::rewrite::rewrite;
use crate::agent::router::AUTO;
use crate::agent::toolset::ToolSet;
use crate::agent::{tool_loop, Agent};
use crate::boxed;
use crate::config::file::UpstreamApi;
use crate::config::Config;
use crate::conversation::{Conversation, Dialect};
use crate::downstream::Client;
use crate::error::ApiError;
use crate::front::budget::{Entries, Found, Routed, Shape};
use crate::front::{self, chat::ChatEncoder, Encoder};
use crate::limits::{client_key, StreamSlot};
use crate::openai::RoutingPeek;
use crate::tools::CallContext;
use crate::upstream::{affinity_key, NO_SYSTEM};

pub async fn handle(session: &mut Session, ctx: &mut RequestCtx, dialect: Dialect) -> Result<bool> {
    let config = ctx.config.clone();
    let mut request = match read_agent_request(session, ctx, dialect, &config).await {
        Ok(request) => request,
        Err(done) => return done,
    };
    // The conversation stays in its box: moved out, its 520 bytes would be
    // copied into this future.
    let (asked, encoder) = (request.asked, request.encoder);
    let conversation = &mut request.conversation;
    // The shape's model is the parse's (`Shape::of`'s tests hold it to
    // that): no agent runs a request the parse reads otherwise.
    if conversation.model.as_deref() != Some(asked.as_str()) {
        let error = ApiError::bad_request("`model` is ambiguous").with_param("model");
        return reject(session, dialect, &error).await;
    }
    // Streams hold connections for long: each client gets a bounded share.
    let _slot = match conversation.options.stream {
        true => match stream_slot(session, &config) {
            Ok(slot) => Some(slot),
            Err(error) => return reject(session, dialect, &error).await,
        },
        false => None,
    };
    // The client's own conversation key, where it gives one, keeps its
    // turns on one replica (`prefix_affinity`).
    conversation.session = ctx.session.clone().or(conversation.session.take());
    let user = conversation.options.user.clone();
    let identity = crate::session::identity(&ctx.tenant, user.as_deref(), config.trust_user_field);
    let headers = Arc::new(context_headers(&config, &session.req_header().headers));
    let mut client = Client::new(session, config.limits.heartbeat);
    let agent = match config.agent(&asked).cloned() {
        Some(agent) => agent,
        // `auto`: the router picks (it exists, or `auto` was forwarded above).
        None => {
            let routed = match &config.router {
                // Boxed: routing is done before the answer streams, so its
                // future need not stay in this request's task.
                Some(router) => {
                    client
                        .wait(boxed::pinned(|| {
                            router.choose(&config, conversation, &ctx.request_id)
                        }))
                        .await
                }
                None => Ok(None),
            };
            match routed {
                Ok(Some(agent)) => agent,
                Ok(None) => {
                    let error = ApiError::internal("no agent to route to");
                    return handled(client.respond_error_in(dialect, &error).await.is_err());
                }
                Err(_) => return handled(true),
            }
        }
    };
    ctx.agent = Some(agent.id.clone());
    ctx.route = "agent";
    // The session: the client's id for it, else one derived from how the
    // conversation begins (so every turn of it has the same).
    let sources = crate::metrics::metrics().sessions.local();
    let (session_id, source) = match conversation.session.as_deref() {
        // The body's (`prompt_cache_key`, Messages' `metadata`) bounded as
        // a header's is.
        Some(id) => (crate::session::bounded(id), &sources.client),
        None => {
            let first_user = conversation.first_user_text().unwrap_or_default();
            let id = crate::session::derive(&agent.id, &identity, &first_user);
            (id, &sources.derived)
        }
    };
    source.inc();
    ctx.session = Some(session_id.clone());
    // The context of the agent's loop: the outermost of the stack.
    let call = CallContext {
        config,
        request_id: ctx.request_id.clone(),
        identity,
        session: session_id,
        user,
        key_name: ctx.key_name.clone(),
        headers,
        stack: vec![agent.id.clone()],
        progress: None,
        show_reasoning: false,
    };
    // An alias answers under the name the client asked for.
    let named = match asked {
        m if m != agent.id && m != AUTO => m,
        _ => agent.id.clone(),
    };
    let encoder = encoder.build(&agent, &named);
    client.set_heartbeat(encoder.heartbeat());
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

/// An agent's request, decoded.
struct AgentRequest {
    /// The model the client asked for: the agent, an alias, or `auto`.
    asked: String,
    conversation: Conversation,
    encoder: EncoderFor,
}

/// Reads the request and decodes it if it is for an agent; else (another
/// model, or a refusal) answers it, and the answer's outcome is the error.
/// A function of its own: its locals (the body's shape, the routing peek,
/// the decoded result) live across several awaits, and in `handle` they
/// would keep their room through every later state, the whole stream
/// long; here they share it with the tool loop's. The request comes boxed:
/// a request passed on then returns 16 bytes, not the 650 of one decoded,
/// copied twice on the way out, and an agent's conversation stays where it
/// is for the whole request.
async fn read_agent_request(
    session: &mut Session,
    ctx: &mut RequestCtx,
    dialect: Dialect,
    config: &Config,
) -> std::result::Result<Box<AgentRequest>, Result<bool>> {
    let body = match read_body(session, config.limits.max_body_bytes).await {
        Ok(body) => body,
        Err(error) => return Err(reject(session, dialect, &error).await),
    };
    // Read as JSON, routed by its model: a compressed body is neither. Its
    // header is looked at only for a body that is no JSON object.
    if !body.trim_ascii_start().starts_with(b"{") {
        let headers = &session.req_header().headers;
        let encoding = headers.get(http::header::CONTENT_ENCODING);
        if let Some(encoding) = encoding.filter(|e| !e.as_bytes().eq_ignore_ascii_case(b"identity"))
        {
            let error = ApiError::unsupported_media_type(format!(
                "a request body with Content-Encoding `{}` is not taken: send it as it is",
                String::from_utf8_lossy(encoding.as_bytes())
            ));
            return Err(reject(session, dialect, &error).await);
        }
    }
    let serves =
        |model: &str| config.agent(model).is_some() || (model == AUTO && config.router.is_some());
    // Before any parse: even the routing peek holds one entry per message.
    // A request for another model is checked to be JSON before it is
    // forwarded as it came; named first, the model lets one pass both read
    // the shape and check (`Shape::routed`).
    let (routed, found) = Shape::routed(&body, &serves);
    let (shape, ours, checked) = match routed {
        Routed::Ours(shape) => (shape, true, false),
        Routed::Read(shape) => (shape, false, false),
        Routed::Other(Some(shape)) => (shape, false, true),
        // Read again as before: the check below names the fault (or, where
        // only serde_json takes it, lets it pass).
        Routed::Other(None) => (Shape::of(&body), false, false),
    };
    if shape.values > config.limits.max_json_values {
        let error = ApiError::too_many_json_values(config.limits.max_json_values);
        return Err(reject(session, dialect, &error).await);
    }
    let entries = match dialect {
        Dialect::Responses => shape.input,
        _ => shape.messages,
    };
    // An agent's request is parsed once, by its front's decoder: the body's
    // shape tells where it goes. Any other, where the shape names its model,
    // is passed on without building what the routing peek holds (one entry
    // per message).
    let asked = match shape.model {
        Some(model) if ours || serves(model) => model.to_owned(),
        Some(model) => {
            let valid = match checked {
                true => Ok(()),
                false => crate::json::check(&body),
            };
            if let Err(e) = valid {
                return Err(reject(session, dialect, &front::not_json(e)).await);
            }
            let other = Other {
                model,
                stream: shape.stream,
                entries,
                peek: None,
            };
            // What the pass found is for a decoder: a stream passed on
            // does not hold it.
            drop(found);
            return Err(pass_on(session, ctx, dialect, other, &body).await);
        }
        None => {
            let peek: RoutingPeek = match crate::json::from_bytes(&body) {
                Ok(peek) => peek,
                Err(e) => return Err(reject(session, dialect, &front::not_json(e)).await),
            };
            match peek.model.as_deref() {
                Some(model) if serves(model) => model.to_owned(),
                model => {
                    let other = Other {
                        model: model.unwrap_or_default(),
                        stream: peek.stream == Some(true),
                        entries,
                        peek: Some(&peek),
                    };
                    drop(found);
                    return Err(pass_on(session, ctx, dialect, other, &body).await);
                }
            }
        }
    };
    // A refused request for an agent names it on its log line: by its id,
    // never by the name the client sent (an alias's pattern matches any).
    let refused = |ctx: &mut RequestCtx, asked: &str| {
        ctx.agent = config.agent(asked).map(|agent| agent.id.clone());
    };
    if let Err(error) = listed(dialect, entries, config.limits.max_messages) {
        refused(ctx, &asked);
        return Err(reject(session, dialect, &error).await);
    }
    // The body is let go once decoded: a coding agent's request is tens of
    // KiB, and the conversation holds all of it that a stream needs.
    let decoded = decode(config, &ctx.tenant, dialect, &body, &found).await;
    drop(body);
    let request = match decoded {
        Ok((conversation, encoder)) => Box::new(AgentRequest {
            asked,
            conversation,
            encoder,
        }),
        Err(error) => {
            refused(ctx, &asked);
            return Err(reject(session, dialect, &error).await);
        }
    };
    match unanswered_result(&request.conversation, dialect) {
        None => Ok(request),
        Some(error) => {
            refused(ctx, &request.asked);
            Err(reject(session, dialect, &error).await)
        }
    }
}

/// Why `conversation` is refused, if a tool result in it answers no call
/// before it ([`Conversation::unanswered_result`]), as OpenAI and Anthropic
/// refuse it. Read in its box: a result moved out of it would be copied.
fn unanswered_result(conversation: &Conversation, dialect: Dialect) -> Option<ApiError> {
    let id = conversation.unanswered_result()?;
    let (what, param) = match dialect {
        Dialect::Responses => ("function call output", "input"),
        _ => ("tool result", "messages"),
    };
    Some(
        ApiError::bad_request(format!(
            "No tool call found for the {what} with call id `{id}`: each result must follow the call it answers."
        ))
        .with_param(param),
    )
}

/// A request for a model that is no agent, as its body was read.
struct Other<'a> {
    model: &'a str,
    stream: bool,
    entries: Entries,
    /// The routing peek, where the body was parsed for it.
    peek: Option<&'a RoutingPeek<'a>>,
}

/// A request for a model that is no agent: forwarded untouched to
/// `default_upstream` with `passthrough` on, else a 404.
async fn pass_on(
    session: &mut Session,
    ctx: &mut RequestCtx,
    dialect: Dialect,
    other: Other<'_>,
    body: &Bytes,
) -> Result<bool> {
    let config = &ctx.config;
    if let Err(error) = listed(dialect, other.entries, config.limits.max_messages) {
        return reject(session, dialect, &error).await;
    }
    if !config.passthrough {
        let error = match other.model {
            // As OpenAI answers a request that names none.
            "" => ApiError::bad_request("You must provide a model parameter.").with_param("model"),
            model => ApiError::not_found(format!("The model `{model}` does not exist"))
                .with_param("model")
                .with_code("model_not_found"),
        };
        return reject(session, dialect, &error).await;
    }
    // Streams hold connections for long: each client gets a bounded share.
    let _slot = match other.stream {
        true => match stream_slot(session, config) {
            Ok(slot) => Some(slot),
            Err(error) => return reject(session, dialect, &error).await,
        },
        false => None,
    };
    // How the conversation begins, read only for a pool that ranks by it.
    let affinity = config
        .default_upstream
        .pool
        .conversation_key(ctx.session.as_deref(), || {
            let key = |peek: &RoutingPeek| {
                let (system, first_user) = peek.prefix();
                affinity_key(system.map(std::iter::once), first_user)
            };
            // A body the peek cannot type (JSON, but a list that is none)
            // ranks as a conversation without a beginning.
            match other.peek {
                Some(peek) => key(peek),
                None => crate::json::from_bytes(body)
                    .map_or_else(|_| affinity_key(NO_SYSTEM, None), |peek| key(&peek)),
            }
        });
    let mut client = Client::new(session, config.limits.heartbeat);
    let body = Some(body.clone());
    forward::forward(&mut client, config, dialect, body, affinity)
        .await
        .handled(ctx)
}

/// The request's list (`messages`, or Responses `input`) within bounds. A
/// list of the wrong type is the parse's to name.
fn listed(dialect: Dialect, entries: Entries, max: usize) -> Result<(), ApiError> {
    let field = match dialect {
        Dialect::Responses => "input",
        _ => "messages",
    };
    let n = match entries {
        Entries::Absent if dialect == Dialect::Responses => return Ok(()),
        Entries::Absent => {
            return Err(ApiError::bad_request("`messages` is required").with_param("messages"))
        }
        Entries::Other => return Ok(()),
        Entries::Text => 1,
        Entries::List(n) => n,
    };
    if n == 0 {
        let error = ApiError::bad_request(format!("`{field}` must not be empty"));
        return Err(error.with_param(field));
    }
    if n > max {
        let error = ApiError::bad_request(format!("`{field}` has {n} entries; the limit is {max}"));
        return Err(error.with_param(field));
    }
    Ok(())
}

/// A slot among the client's open streams.
fn stream_slot(session: &Session, config: &Config) -> Result<StreamSlot, ApiError> {
    let authorization = super::auth::limited_key(config, session.req_header());
    let address = session.client_addr().map(|a| {
        a.as_inet()
            .map_or_else(|| a.to_string(), |a| a.ip().to_string())
    });
    let client = client_key(authorization, address);
    StreamSlot::acquire(client, config.limits.max_streams_per_client)
        .ok_or_else(|| ApiError::too_many_streams(config.limits.max_streams_per_client))
}

/// What of the request's headers an agent's calls may read
/// ([`Config::context_headers`]): most often none, and a coding agent's
/// request has a score of them.
fn context_headers(config: &Config, headers: &http::HeaderMap) -> http::HeaderMap {
    let mut kept = http::HeaderMap::new();
    for name in &config.context_headers {
        for value in headers.get_all(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

/// How the answer will be encoded, once the agent (and so its
/// `reasoning_field`) is known.
enum EncoderFor {
    Chat { stream: bool, include_usage: bool },
    Messages(front::messages::Context, bool),
    // Boxed: the context is large beside the chat variant.
    Responses(Box<front::responses::Context>, bool, Option<Saving>),
}

impl EncoderFor {
    /// `model`: the name the answer carries (the agent's id, or the alias
    /// the client asked for).
    fn build(self, agent: &Agent, model: &str) -> Box<dyn Encoder> {
        match self {
            EncoderFor::Chat {
                stream,
                include_usage,
            } => Box::new(ChatEncoder::new(
                model,
                stream,
                include_usage,
                agent.reasoning_field,
            )),
            EncoderFor::Messages(context, stream) => Box::new(
                front::messages::MessagesEncoder::new(model, stream, context),
            ),
            EncoderFor::Responses(mut context, stream, saving) => {
                context.summarizes &= agent.upstream.api == UpstreamApi::Chat;
                let encoder = front::responses::ResponsesEncoder::new(model, stream, *context);
                match saving {
                    Some(saving) => Box::new(encoder.keeping(saving.keep(&agent.id))),
                    None => Box::new(encoder),
                }
            }
        }
    }
}

/// The request as a conversation, by its front's decoder; the Responses
/// front's goes through the store ([`stored::decode`]) for
/// `previous_response_id` and for keeping the answer, as `tenant`'s.
async fn decode(
    config: &Config,
    tenant: &str,
    dialect: Dialect,
    body: &[u8],
    found: &Found<'_>,
) -> Result<(Conversation, EncoderFor), ApiError> {
    match dialect {
        Dialect::Responses => {
            let (conversation, context, saving) =
                stored::decode(config, tenant, body, found).await?;
            if !context.dropped_tools.is_empty() {
                info!(tools = ?context.dropped_tools, "hosted tools dropped: the upstream cannot run them");
            }
            let stream = conversation.options.stream;
            let encoder = EncoderFor::Responses(context, stream, saving);
            Ok((conversation, encoder))
        }
        Dialect::Messages => {
            let (conversation, context) = front::messages::decode_with(body, found)?;
            if !context.dropped_tools.is_empty() {
                info!(tools = ?context.dropped_tools, "server tools dropped: the upstream cannot run them");
            }
            let stream = conversation.options.stream;
            Ok((conversation, EncoderFor::Messages(context, stream)))
        }
        Dialect::Chat => {
            let conversation = front::chat::decode_with(body, found)?;
            let encoder = EncoderFor::Chat {
                stream: conversation.options.stream,
                include_usage: conversation.options.include_usage,
            };
            Ok((conversation, encoder))
        }
    }
}

/// `POST /v1/messages/count_tokens`. For an agent: the tokens of the
/// request as its upstream would get it (the agent's prompt and tools
/// included), counted by llama-server's own template and tokenizer
/// (`/apply-template`, `/tokenize`) when it has them, else estimated at four
/// bytes of the request's text per token. Other models are forwarded.
pub async fn count_tokens(session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
    let config = ctx.config.clone();
    let dialect = Dialect::Messages;
    let body = match read_body(session, config.limits.max_body_bytes).await {
        Ok(body) => body,
        Err(error) => return reject(session, dialect, &error).await,
    };
    let model = crate::json::from_bytes::<RoutingPeek>(&body)
        .ok()
        .and_then(|peek| peek.model.map(|m| m.into_owned()));
    let Some(agent) = model.as_deref().and_then(|m| config.agent(m)).cloned() else {
        let mut client = Client::new(session, config.limits.heartbeat);
        let forwarded = forward::forward(&mut client, &config, dialect, Some(body), Some(0));
        return forwarded.await.handled(ctx);
    };
    let mut conversation = match front::messages::decode(&body) {
        Ok((conversation, _)) => conversation,
        Err(error) => return reject(session, dialect, &error).await,
    };
    ctx.agent = Some(agent.id.clone());
    let toolset = ToolSet::of(&agent, &config);
    rewrite(&agent, &toolset, &mut conversation);
    let request = crate::round::chat::encode(&conversation, false);
    let upstream = &agent.upstream;
    let mut client = Client::new(session, config.limits.heartbeat);
    let exact = client
        .wait(boxed::pinned(|| tokenize(upstream, request.clone())))
        .await;
    let Ok(counted) = exact else {
        return handled(true);
    };
    let tokens = counted.unwrap_or_else(|| request.len().div_ceil(4));
    let body = serde_json::json!({ "input_tokens": tokens });
    let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    handled(client.respond_json(200, body, &[]).await.is_err())
}

/// The prompt's token count by llama-server's template and tokenizer; `None`
/// when the upstream has no such endpoints (or is not llama-server).
async fn tokenize(upstream: &crate::upstream::Upstream, chat_request: Vec<u8>) -> Option<usize> {
    const WAIT: std::time::Duration = std::time::Duration::from_secs(10);
    #[derive(serde::Deserialize)]
    struct Applied {
        prompt: String,
    }
    #[derive(serde::Deserialize)]
    struct Tokens {
        tokens: Vec<serde_json::Value>,
    }
    let (status, applied) = upstream
        .call(
            "POST",
            "/apply-template",
            Some(Bytes::from(chat_request)),
            WAIT,
        )
        .await
        .ok()?;
    let applied: Applied = serde_json::from_slice(&applied)
        .ok()
        .filter(|_| status == 200)?;
    let request =
        serde_json::json!({"content": applied.prompt, "add_special": true, "parse_special": true});
    let request = Bytes::from(serde_json::to_vec(&request).ok()?);
    let (status, tokens) = upstream
        .call("POST", "/tokenize", Some(request), WAIT)
        .await
        .ok()?;
    let tokens: Tokens = serde_json::from_slice(&tokens)
        .ok()
        .filter(|_| status == 200)?;
    Some(tokens.tokens.len())
}

/// Reads the whole request body, refusing more than `limit` bytes.
pub(super) async fn read_body(session: &mut Session, limit: usize) -> Result<Bytes, ApiError> {
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
    let failed = |e: pingora::BError| body_unread(e.etype());
    // A body of declared length comes in one piece, kept as it is.
    let Some(first) = session
        .read_request_body_whole(limit)
        .await
        .map_err(failed)?
    else {
        return Ok(Bytes::new());
    };
    if first.len() > limit {
        return Err(ApiError::body_too_large(limit));
    }
    if session.body_done() {
        return Ok(first);
    }
    // A chunked one comes in pieces, gathered.
    let mut body = BytesMut::from(&first[..]);
    while let Some(piece) = session.read_request_body().await.map_err(failed)? {
        if body.len() + piece.len() > limit {
            return Err(ApiError::body_too_large(limit));
        }
        body.extend_from_slice(&piece);
    }
    Ok(body.freeze())
}

/// Why a request body could not be read, for its client.
fn body_unread(kind: &pingora::ErrorType) -> ApiError {
    match kind {
        pingora::ErrorType::ReadTimedout => ApiError::request_timeout(format!(
            "the request body stopped arriving: nothing came for {} s",
            super::h1::BODY_READ_TIMEOUT.as_secs()
        )),
        kind => ApiError::bad_request(format!("cannot read the request body: {}", kind.as_str())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that stops arriving is a 408, as nginx answers it; one that
    /// breaks is a 400.
    #[test]
    fn a_body_that_stops_arriving_is_a_408() {
        assert_eq!(body_unread(&pingora::ErrorType::ReadTimedout).status, 408);
        let broken = body_unread(&pingora::ErrorType::InvalidHTTPHeader);
        assert_eq!(broken.status, 400);
    }
}
