//! The tool loop: call the model, stream what it says to the client, run the
//! calls it makes to the agent's own tools, and call it again with their
//! results, until it answers.
//!
//! One turn may mix the agent's tools and the client's. The proxy is
//! stateless, so it cannot hold the local results until the client comes back
//! with its own: in a mixed turn the local calls run, and each client call
//! gets a tool result telling the model it was deferred and must be asked for
//! on its own. The model's next turn then either answers or asks for only
//! client tools, which go back to the client in standard form. No call is
//! dropped without the model being told.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{join_all, BoxFuture};
use tokio::sync::mpsc::unbounded_channel;
use tracing::{debug, info, warn};

use super::assemble::Assembler;
use super::reasoning::{Kind, ThinkSplitter};
use super::reply::{Failure, Reply};
use super::rewrite::rewrite;
use super::toolset::ToolSet;
use super::Agent;
use crate::config::file::{ReasoningMode, ToolEvents};
use crate::config::Limits;
use crate::downstream::{Downstream, Headless};
use crate::error::{from_upstream, ApiError};
use crate::metrics::metrics;
use crate::openai::{ChatRequest, ChunkIn, CompletionIn, Message, ToolCall, Usage};
use crate::sse;
use crate::tools::{CallContext, Outcome};
use crate::upstream::affinity_key;

/// `finish_reason` when `max_tool_rounds` stops the loop: the answer was cut
/// by a limit, as with `max_tokens`.
pub const ROUNDS_EXHAUSTED: &str = "length";

/// What the request did, for the request log line.
#[derive(Debug, Default)]
pub struct Summary {
    pub rounds: u32,
    pub tool_calls: u32,
    pub usage: Usage,
    /// From the request's start to the first content or reasoning delta.
    pub first_token: Option<Duration>,
    /// The response was cut mid-stream: the connection must be aborted so
    /// the client cannot take it for complete.
    pub cut: bool,
}

pub async fn run(
    agent: &Agent,
    request: ChatRequest,
    client: &mut impl Downstream,
    ctx: &CallContext,
    started: Instant,
) -> Summary {
    let stream = request.stream.unwrap_or(false);
    let include_usage = request
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let toolset = ToolSet::of(agent, &ctx.config);
    let mut upstream_request = rewrite(agent, &toolset, request, stream);
    let show_reasoning =
        agent.reasoning == ReasoningMode::Pass && upstream_request.enable_thinking != Some(false);
    let mut reply = Reply::new(&agent.id, stream, include_usage, show_reasoning);
    let mut summary = Summary::default();
    let turn = Turn {
        agent,
        toolset: &toolset,
        ctx,
    };
    let limit = ctx.config.limits.request_timeout;
    let drive = turn.drive(&mut upstream_request, client, &mut reply, &mut summary);
    let outcome = match tokio::time::timeout(limit, drive).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Failure::Api(ApiError::gateway_timeout(format!(
            "the request took longer than limits.request_timeout_ms ({} ms)",
            limit.as_millis()
        )))),
    };
    summary.usage = reply.usage();
    summary.first_token = reply.first_token_at().map(|at| at.duration_since(started));
    summary.cut = match outcome {
        Ok(finish_reason) => reply.finish(client, finish_reason).await.is_err(),
        Err(failure) => {
            if !matches!(failure, Failure::Gone) {
                warn!(agent = %agent.id, ?failure, "agent request failed");
            }
            reply.fail(client, failure).await
        }
    };
    summary
}

/// Runs `agent` on `task` for another agent: its whole loop on its own
/// upstream, with the task as the user message. Its text streams to the
/// caller as progress; its final answer is the caller's tool result.
pub fn run_nested(
    agent: Arc<Agent>,
    task: String,
    ctx: CallContext,
) -> BoxFuture<'static, Outcome> {
    Box::pin(async move {
        let ctx = ctx.nested(&agent.id, ctx.progress.clone());
        let toolset = ToolSet::of(&agent, &ctx.config);
        let request = ChatRequest {
            model: Some(agent.id.clone()),
            messages: vec![Message::text("user", task)],
            tools: None,
            stream: None,
            stream_options: None,
            enable_thinking: None,
            rest: Default::default(),
        };
        // Streamed: the callee's text is the caller's progress as it comes.
        let mut upstream_request = rewrite(&agent, &toolset, request, true);
        let mut client = Headless::new(ctx.request_id.clone());
        let mut reply = Reply::nested(&agent.id, ctx.progress.clone());
        let mut summary = Summary::default();
        let turn = Turn {
            agent: &agent,
            toolset: &toolset,
            ctx: &ctx,
        };
        match turn
            .drive(&mut upstream_request, &mut client, &mut reply, &mut summary)
            .await
        {
            Ok(_) => Outcome::success(reply.into_content()),
            Err(Failure::Api(e)) => {
                Outcome::error(format!("agent `{}` failed: {}", agent.id, e.message))
            }
            Err(Failure::Upstream { status, .. }) => Outcome::error(format!(
                "agent `{}` failed: its upstream answered HTTP {status}",
                agent.id
            )),
            Err(Failure::Gone) => Outcome::error("cancelled"),
        }
    })
}

/// One agent's loop on one request.
struct Turn<'a> {
    agent: &'a Agent,
    toolset: &'a ToolSet,
    ctx: &'a CallContext,
}

impl Turn<'_> {
    async fn drive<D: Downstream>(
        &self,
        request: &mut ChatRequest,
        client: &mut D,
        reply: &mut Reply,
        summary: &mut Summary,
    ) -> Result<&'static str, Failure> {
        let agent = self.agent;
        let mut tool_rounds = 0;
        // Rounds of one conversation share a prefix: keep them on one replica.
        let affinity = affinity_key(
            request
                .messages
                .iter()
                .find(|m| m.is_instruction())
                .map(Message::content_text)
                .as_deref(),
            request
                .messages
                .iter()
                .find(|m| m.role == "user")
                .map(Message::content_text)
                .as_deref(),
        );
        loop {
            let round = read_round(
                agent,
                request,
                affinity,
                client,
                reply,
                &self.ctx.config.limits,
            )
            .await?;
            summary.rounds += 1;
            reply.add_usage(round.usage);
            if round.calls.is_empty() {
                return Ok(finish_reason(round.finish_reason.as_deref()));
            }
            let local = round
                .calls
                .iter()
                .filter(|c| self.toolset.is_local(&c.function.name))
                .count();
            if local == 0 {
                reply.tool_calls(client, round.calls).await?;
                return Ok("tool_calls");
            }
            if tool_rounds >= agent.max_tool_rounds {
                warn!(agent = %agent.id, rounds = tool_rounds, "max_tool_rounds reached");
                let note = format!(
                    "\n\n[agent-proxy: stopped after {tool_rounds} tool rounds without a final answer]"
                );
                reply.content(client, &note).await?;
                return Ok(ROUNDS_EXHAUSTED);
            }
            tool_rounds += 1;
            summary.tool_calls += local as u32;
            // Open the stream before the tools run so heartbeats can flow.
            reply.start(client).await?;
            let results = self.run_tools(&round.calls, client, reply).await?;
            request.messages.push(Message {
                content: (!round.content.is_empty()).then(|| round.content.into()),
                tool_calls: Some(round.calls),
                ..Message::text("assistant", "")
            });
            request.messages.extend(results);
        }
    }

    /// Runs the local calls of one turn concurrently; client calls in the same
    /// turn are deferred (see the module docs). Results keep the calls' order.
    /// Agents called as tools report progress, shown as it arrives.
    async fn run_tools<D: Downstream>(
        &self,
        calls: &[ToolCall],
        client: &mut D,
        reply: &mut Reply,
    ) -> Result<Vec<Message>, Failure> {
        let agent = self.agent;
        for call in calls
            .iter()
            .filter(|c| self.toolset.is_local(&c.function.name))
        {
            self.show(client, reply, &progress_note(call)).await?;
        }
        let (progress, mut notes) = unbounded_channel::<String>();
        let ctx = CallContext {
            progress: Some(progress),
            ..self.ctx.clone()
        };
        let runs = calls.iter().map(|call| {
            let ctx = &ctx;
            async move {
                let started = Instant::now();
                let local = self.toolset.is_local(&call.function.name);
                let outcome = match local {
                    true => self.toolset.call(&call.function.name, &call.function.arguments, ctx).await,
                    false => {
                        warn!(agent = %agent.id, tool = %call.function.name, "client tool call deferred: mixed with local calls");
                        Outcome::error(format!(
                            "`{}` was not run: it is a client tool and was requested together with agent tools. \
                             Request it again on its own, in a turn without agent tool calls.",
                            call.function.name
                        ))
                    }
                };
                let took = started.elapsed();
                if local {
                    metrics().observe_tool(&call.function.name, outcome.ok, took);
                }
                info!(agent = %agent.id, tool = %call.function.name, ok = outcome.ok, ms = took.as_millis() as u64, "tool call");
                outcome
            }
        });
        let mut runs = std::pin::pin!(join_all(runs));
        let outcomes = loop {
            let next = client
                .wait(async {
                    tokio::select! {
                        outcomes = &mut runs => Ok(outcomes),
                        Some(note) = notes.recv() => Err(note),
                    }
                })
                .await?;
            match next {
                Ok(outcomes) => break outcomes,
                Err(note) => self.show(client, reply, &note).await?,
            }
        };
        while let Ok(note) = notes.try_recv() {
            self.show(client, reply, &note).await?;
        }
        Ok(calls
            .iter()
            .zip(outcomes)
            .map(|(call, outcome)| Message {
                tool_call_id: Some(call.id.clone()),
                ..Message::text("tool", outcome.text)
            })
            .collect())
    }

    /// Tool progress, where the agent's `tool_events` puts it.
    async fn show<D: Downstream>(
        &self,
        client: &mut D,
        reply: &mut Reply,
        note: &str,
    ) -> Result<(), Failure> {
        match self.agent.tool_events {
            ToolEvents::Reasoning => reply.proxy_note(client, note).await?,
            ToolEvents::Content => reply.content(client, note).await?,
            ToolEvents::Hidden => {}
        }
        Ok(())
    }
}

fn finish_reason(upstream: Option<&str>) -> &'static str {
    match upstream {
        Some("length") => "length",
        Some("content_filter") => "content_filter",
        Some("tool_calls") => "tool_calls",
        _ => "stop",
    }
}

fn progress_note(call: &ToolCall) -> String {
    const SHOWN: usize = 200;
    let args = call.function.arguments.trim();
    let mut cut = args.len().min(SHOWN);
    while !args.is_char_boundary(cut) {
        cut -= 1;
    }
    let ellipsis = if cut < args.len() { "…" } else { "" };
    format!(
        "Calling {} {}{ellipsis}…\n",
        call.function.name,
        &args[..cut]
    )
}

/// One model call as it streamed.
#[derive(Default)]
struct Round {
    /// The visible text, for the conversation history.
    content: String,
    calls: Vec<ToolCall>,
    finish_reason: Option<String>,
    usage: Usage,
}

/// Per-round parsing state: where deltas go as they arrive.
struct RoundReader<'r> {
    reply: &'r mut Reply,
    round: Round,
    splitter: ThinkSplitter,
    assembler: Assembler,
}

async fn read_round<D: Downstream>(
    agent: &Agent,
    request: &ChatRequest,
    affinity: u64,
    client: &mut D,
    reply: &mut Reply,
    limits: &Limits,
) -> Result<Round, Failure> {
    let upstream = &agent.upstream;
    // Most chat requests fit: one allocation instead of a series of regrowths.
    let mut body = Vec::with_capacity(4096);
    serde_json::to_writer(&mut body, request).map_err(|e| ApiError::internal(e.to_string()))?;
    debug!(agent = %agent.id, upstream = %upstream.name, bytes = body.len(), "calling upstream");
    let request_id = client.request_id().to_owned();
    let mut exchange = client
        .wait(upstream.post_chat(Bytes::from(body), &request_id, Some(affinity)))
        .await?
        .map_err(|e| from_upstream(&upstream.name, &e))?;
    let status = exchange.status();
    if !(200..300).contains(&status) {
        let kind = if status >= 500 {
            "http_5xx"
        } else {
            "http_4xx"
        };
        metrics().upstream_error(&upstream.name, kind);
        let retry_after = exchange
            .header()
            .and_then(|h| h.headers.get(http::header::RETRY_AFTER))
            .cloned();
        let body = client
            .wait(exchange.read_to_end(limits.max_upstream_body_bytes))
            .await?
            .unwrap_or_default();
        return Err(Failure::Upstream {
            status,
            body,
            retry_after,
        });
    }
    let mut reader = RoundReader {
        reply,
        round: Round::default(),
        splitter: ThinkSplitter::default(),
        assembler: Assembler::default(),
    };
    if !exchange.is_event_stream() {
        // Some servers answer a stream request with one JSON completion.
        let body = client
            .wait(exchange.read_to_end(limits.max_upstream_body_bytes))
            .await?
            .map_err(|e| from_upstream(&upstream.name, &e))?;
        reader.completion(client, &body).await?;
        return reader.finish(client).await;
    }
    let mut parser = sse::Parser::new(limits.max_event_bytes);
    let mut done = false;
    loop {
        let piece = client
            .wait(exchange.read())
            .await?
            .map_err(|e| from_upstream(&upstream.name, &e))?;
        let Some(piece) = piece else {
            if let Some(event) = parser.finish() {
                done |= reader.event(client, &event).await?;
            }
            break;
        };
        parser.feed(&piece);
        while let Some(event) = parser
            .next_event()
            .map_err(|e| ApiError::bad_gateway(format!("upstream `{}`: {e}", upstream.name)))?
        {
            done |= reader.event(client, &event).await?;
        }
    }
    if !done && reader.round.finish_reason.is_none() {
        return Err(ApiError::bad_gateway(format!(
            "upstream `{}` ended its stream before the answer was complete",
            upstream.name
        ))
        .into());
    }
    reader.finish(client).await
}

impl RoundReader<'_> {
    /// Handles one SSE event; returns whether it was `[DONE]`.
    async fn event(
        &mut self,
        client: &mut impl Downstream,
        event: &sse::Event,
    ) -> Result<bool, Failure> {
        if event.is_done() {
            return Ok(true);
        }
        let chunk: ChunkIn = serde_json::from_slice(&event.data).map_err(|e| {
            ApiError::bad_gateway(format!(
                "upstream sent an event that is not a chat chunk: {e}"
            ))
        })?;
        if chunk.error.is_some() || event.name.as_deref() == Some("error") {
            return Err(Failure::Upstream {
                status: 502,
                body: event.data.clone(),
                retry_after: None,
            });
        }
        if let Some(usage) = chunk.usage {
            self.round.usage = usage;
        }
        // The proxy asks for one choice; only the first is read.
        let Some(choice) = chunk.choices.into_iter().next() else {
            return Ok(false);
        };
        if let Some(delta) = choice.delta {
            let reasoning = delta
                .reasoning_content
                .as_deref()
                .or(delta.reasoning.as_deref());
            if let Some(text) = reasoning {
                self.reply.reasoning(client, text).await?;
            }
            if let Some(text) = delta.content.as_deref() {
                self.content(client, text).await?;
            }
            for call in delta.tool_calls.iter().flatten() {
                self.assembler.push(call);
            }
        }
        if let Some(reason) = choice.finish_reason {
            self.round.finish_reason = Some(reason.into_owned());
        }
        Ok(false)
    }

    async fn content(&mut self, client: &mut impl Downstream, text: &str) -> Result<(), Failure> {
        let pieces = self.splitter.split(text);
        for (kind, piece) in pieces.iter() {
            self.piece(client, kind, piece).await?;
        }
        Ok(())
    }

    async fn piece(
        &mut self,
        client: &mut impl Downstream,
        kind: Kind,
        text: &str,
    ) -> Result<(), Failure> {
        match kind {
            Kind::Content => {
                self.round.content.push_str(text);
                self.reply.content(client, text).await?;
            }
            Kind::Reasoning => self.reply.reasoning(client, text).await?,
        }
        Ok(())
    }

    async fn completion(
        &mut self,
        client: &mut impl Downstream,
        body: &[u8],
    ) -> Result<(), Failure> {
        let completion: CompletionIn = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_gateway(format!("upstream sent invalid JSON: {e}")))?;
        if let Some(usage) = completion.usage {
            self.round.usage = usage;
        }
        let Some(choice) = completion.choices.into_iter().next() else {
            return Err(ApiError::bad_gateway("upstream answered without choices").into());
        };
        let message = choice.message;
        if let Some(text) = message
            .reasoning_content
            .as_deref()
            .or(message.reasoning.as_deref())
        {
            self.reply.reasoning(client, text).await?;
        }
        if let Some(text) = message.content.as_deref() {
            self.content(client, text).await?;
        }
        self.round.calls = message.tool_calls;
        self.round.finish_reason = choice.finish_reason;
        Ok(())
    }

    async fn finish(mut self, client: &mut impl Downstream) -> Result<Round, Failure> {
        if let Some((kind, text)) = self.splitter.flush() {
            self.piece(client, kind, &text).await?;
        }
        if !self.assembler.is_empty() {
            self.round.calls = std::mem::take(&mut self.assembler).finish();
        }
        Ok(self.round)
    }
}
