//! The tool loop: call the model, stream what it says to the client, run the
//! calls it makes to the agent's own tools, and call it again with their
//! results, until it answers.
//!
//! The loop works on the protocol-neutral [`Conversation`]: the client's
//! dialect is its front encoder's business, the upstream's its round codec's.
//!
//! One turn may mix the agent's tools and the client's. The proxy is
//! stateless, so it cannot hold the local results until the client comes back
//! with its own: in a mixed turn the local calls run, and each client call
//! gets a tool result telling the model it was deferred and must be asked for
//! on its own. The model's next turn then either answers or asks for only
//! client tools, which go back to the client in standard form. No call is
//! dropped without the model being told.

use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{self, StreamExt};
use tokio::sync::mpsc::unbounded_channel;
use tracing::{debug, info, warn};

use super::reasoning::{Kind, ThinkSplitter};
use super::reply::{Failure, Reply};
use super::rewrite::rewrite;
use super::toolset::ToolSet;
use super::Agent;
use crate::boxed;
use crate::config::file::{ReasoningMode, ToolEvents, UpstreamApi};
use crate::conversation::{
    Conversation, Finish, FunctionTool, Item, Message, Prompt, Reasoning, Role, RoundEnd, ToolCall,
    ToolChoice, ToolResult, Usage,
};
use crate::downstream::{Downstream, Gone, Headless};
use crate::error::{from_upstream, ApiError};
use crate::front::Encoder;
use crate::metrics::metrics;
use crate::round::{self, DecodeError, RoundDecoder};
use crate::sse;
use crate::tools::{CallContext, Outcome, Progress};
use crate::upstream::affinity_key;

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
    /// What failed, if anything (`Failure::cause`).
    pub error: Option<&'static str>,
}

/// Runs `agent` on `conversation`, answering through `encoder`. The
/// conversation is rewritten for the agent in place, and let go once no
/// round can follow: taken by reference, the request's future holds it once.
pub async fn run(
    agent: &Agent,
    conversation: &mut Conversation,
    encoder: Box<dyn Encoder>,
    client: &mut impl Downstream,
    ctx: &CallContext,
    started: Instant,
) -> Summary {
    let toolset = ToolSet::of(agent, &ctx.config);
    prepare(agent, &toolset, conversation, ctx).await;
    let show_reasoning =
        agent.reasoning == ReasoningMode::Pass && conversation.options.thinking != Some(false);
    let mut reply = Reply::new(encoder, show_reasoning);
    let mut summary = Summary::default();
    let turn = Turn {
        agent,
        toolset: &toolset,
        ctx,
    };
    let limit = ctx.config.limits.request_timeout;
    let drive = turn.drive(conversation, client, &mut reply, &mut summary);
    let outcome = match tokio::time::timeout(limit, drive).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Failure::Api(
            ApiError::gateway_timeout(format!(
                "the request took longer than limits.request_timeout_ms ({} ms)",
                limit.as_millis()
            ))
            .with_cause("RequestTimedout"),
        )),
    };
    summary.usage = reply.usage();
    summary.first_token = reply.first_token_at().map(|at| at.duration_since(started));
    summary.cut = match outcome {
        Ok(finish) => {
            let cut = reply.finish(client, finish).await.is_err();
            summary.error = cut.then_some(Failure::Gone.cause());
            cut
        }
        Err(failure) => {
            if !matches!(failure, Failure::Gone) {
                warn!(agent = %agent.id, ?failure, "agent request failed");
            }
            summary.error = Some(failure.cause());
            reply.fail(client, failure).await
        }
    };
    summary
}

/// The agent's rewrite of `conversation`, its memory and its automatic
/// knowledge: what round 1 sends, for a client's request or another agent's.
async fn prepare(
    agent: &Agent,
    toolset: &ToolSet,
    conversation: &mut Conversation,
    ctx: &CallContext,
) {
    rewrite(agent, toolset, conversation);
    if let Some(memory) = &agent.memory {
        super::memory::inject(&agent.id, memory, ctx, conversation).await;
    }
    if agent.knowledge_auto {
        crate::knowledge::retrieve_into(&agent.knowledge, conversation).await;
    }
}

/// Runs `agent` on `task` for another agent: its whole loop on its own
/// upstream, with the task as the user message. Its text streams to the
/// caller as progress; its final answer is the caller's tool result.
pub fn run_nested(
    agent: Arc<Agent>,
    task: String,
    ctx: CallContext,
) -> BoxFuture<'static, Outcome> {
    boxed::pinned(|| async move {
        let show_reasoning = ctx.show_reasoning && agent.reasoning == ReasoningMode::Pass;
        let ctx = CallContext {
            show_reasoning,
            ..ctx.nested(&agent.id)
        };
        let toolset = ToolSet::of(&agent, &ctx.config);
        let mut conversation = Conversation::default();
        conversation
            .items
            .push(Item::Message(Message::text(Role::User, task)));
        // Streamed: the callee's text is the caller's progress as it comes.
        conversation.options.stream = true;
        prepare(&agent, &toolset, &mut conversation, &ctx).await;
        let mut client = Headless;
        let mut reply = Reply::nested(ctx.progress.clone(), show_reasoning);
        let mut summary = Summary::default();
        let turn = Turn {
            agent: &agent,
            toolset: &toolset,
            ctx: &ctx,
        };
        let result = turn
            .drive(&mut conversation, &mut client, &mut reply, &mut summary)
            .await;
        if let Some(progress) = &ctx.progress {
            let _ = progress.send(Progress::Usage(reply.usage()));
        }
        match result {
            // Calls for a client, where there is none: the caller is told,
            // not given what came before them as the whole answer.
            Ok(Finish::ToolCalls) => Outcome::error(format!(
                "agent `{}` stopped to call a tool it does not have; what it said before: {}",
                agent.id,
                reply.into_content()
            )),
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
        conversation: &mut Conversation,
        client: &mut D,
        reply: &mut Reply,
        summary: &mut Summary,
    ) -> Result<Finish, Failure> {
        let agent = self.agent;
        let mut tool_rounds = 0;
        // Rounds and turns of one conversation share a prefix: keep them on
        // one replica, by the client's key for it or else by how it begins.
        let affinity =
            agent
                .upstream
                .pool
                .conversation_key(conversation.session.as_deref(), || {
                    let first_user = conversation.first_user_text();
                    affinity_key(
                        conversation.system.as_ref().map(Prompt::pieces),
                        first_user.as_deref(),
                    )
                });
        loop {
            if summary.rounds > 0 {
                reply.next_round();
            }
            let rounds_left = tool_rounds < agent.max_tool_rounds;
            // No round follows when the agent has no tools of its own, or
            // no rounds left to run them.
            let last = self.toolset.is_empty() || !rounds_left;
            let request = RoundRequest::of(agent.upstream.api, conversation, last);
            if last {
                // What the conversation holds (a coding agent's prompt,
                // tools and history, most of its stream's memory) is not
                // needed while the answer streams.
                conversation.release();
            }
            let round = read_round(agent, request, affinity, client, reply, self.ctx).await?;
            summary.rounds += 1;
            reply.add_usage(round.end.usage);
            let round_end = round.end;
            if round_end.calls.is_empty() {
                // A server that says it called tools and named none (a tool
                // parser that failed, in vLLM) answered: a client told
                // `tool_use` waits for calls that are not there.
                return Ok(match round_end.finish {
                    Some(Finish::ToolCalls) | None => Finish::Stop,
                    Some(finish) => finish,
                });
            }
            if round_end.finish == Some(Finish::Length) {
                // Cut by the token limit: the last call's arguments may be
                // cut too. Nothing runs; the client learns the turn was cut.
                warn!(agent = %agent.id, calls = round_end.calls.len(), "tool calls in a turn cut by the token limit: not run");
                return Ok(Finish::Length);
            }
            // Each call is one more item of the conversation, and a result:
            // past what a client may send, the model has gone wrong.
            let most = self.ctx.config.limits.max_messages;
            if round_end.calls.len() > most {
                let calls = round_end.calls.len();
                warn!(agent = %agent.id, calls, "a round with more tool calls than limits.max_messages");
                return Err(Failure::Api(ApiError::bad_gateway(format!(
                    "upstream `{}`: the model made {calls} tool calls in one round; at most {most} are taken",
                    agent.upstream.name
                ))));
            }
            // A call to a tool no one offered (a model's invention, which a
            // server that does not hold it to the list lets through) is
            // answered with an error, and the model gets another round,
            // rather than going to a client that never declared it.
            let tools = &conversation.tools;
            let ours = |call: &ToolCall| {
                self.toolset.is_local(&call.name) || (!last && !declares(tools, &call.name))
            };
            let local = round_end.calls.iter().filter(|c| ours(c)).count();
            if local == 0 {
                reply.tool_calls(client, &round_end.calls).await?;
                return Ok(Finish::ToolCalls);
            }
            if !rounds_left {
                warn!(agent = %agent.id, rounds = tool_rounds, "max_tool_rounds reached");
                let note = format!(
                    "\n\n[agent-proxy: stopped after {tool_rounds} tool rounds without a final answer]"
                );
                reply.content(client, &note).await?;
                // Cut by a limit, as with `max_tokens`.
                return Ok(Finish::Length);
            }
            tool_rounds += 1;
            let run = (round_end.calls.iter())
                .filter(|c| self.toolset.is_local(&c.name))
                .count();
            summary.tool_calls += run.min(self.ctx.config.limits.max_tool_calls_per_turn) as u32;
            if run > 0 {
                reply.tools_ran();
            }
            // Open the stream before the tools run so heartbeats can flow.
            reply.start(client).await?;
            let results = self
                .run_tools(&round_end.calls, &conversation.tools, client, reply)
                .await?;
            let items = &mut conversation.items;
            // The upstream's reasoning items (a Responses upstream's, which
            // go back whole), else the reasoning the round streamed: the
            // next round's prompt holds what the model wrote, as the
            // client's next request will when it sends the turn back.
            if round_end.reasoning.is_empty() && !round.reasoning.is_empty() {
                let text = round.reasoning;
                items.push(Item::Reasoning(Reasoning {
                    text,
                    ..Reasoning::default()
                }));
            }
            items.extend(round_end.reasoning.into_iter().map(Item::Reasoning));
            if !round.content.is_empty() {
                items.push(Item::Message(Message::text(Role::Assistant, round.content)));
            }
            items.extend(round_end.calls.into_iter().map(Item::ToolCall));
            items.extend(results.into_iter().map(Item::ToolResult));
            release_forced_choice(conversation);
        }
    }

    /// Runs the local calls of one turn concurrently, up to
    /// `limits.max_concurrent_tool_calls` at once and `max_tool_calls_per_turn`
    /// in all (each call past it gets an error result); client calls in the
    /// same turn are deferred (see the module docs). Results keep the calls'
    /// order. Agents called as tools report progress, shown as it arrives.
    async fn run_tools<D: Downstream>(
        &self,
        calls: &[ToolCall],
        tools: &[Arc<FunctionTool>],
        client: &mut D,
        reply: &mut Reply,
    ) -> Result<Vec<ToolResult>, Failure> {
        let agent = self.agent;
        let limits = &self.ctx.config.limits;
        let cap = limits.max_tool_calls_per_turn;
        let mut local_seen = 0;
        let plans: Vec<Plan> = calls
            .iter()
            .map(|call| match self.toolset.is_local(&call.name) {
                false if declares(tools, &call.name) => Plan::Defer,
                false => Plan::Unknown,
                true if local_seen >= cap => Plan::OverCap,
                true => {
                    local_seen += 1;
                    Plan::Run
                }
            })
            .collect();
        // One line a turn, however many calls: a model's output must not
        // flood the log.
        let not_run = |kind| plans.iter().filter(|p| **p == kind).count();
        let (deferred, over_cap) = (not_run(Plan::Defer), not_run(Plan::OverCap));
        let unknown = not_run(Plan::Unknown);
        if unknown > 0 {
            warn!(agent = %agent.id, calls = unknown, "tool calls to tools not offered: not run");
        }
        if deferred > 0 {
            warn!(agent = %agent.id, calls = deferred, "client tool calls deferred: mixed with local calls");
        }
        if over_cap > 0 {
            warn!(agent = %agent.id, calls = over_cap, cap, "tool calls over limits.max_tool_calls_per_turn: not run");
        }
        for (call, _) in calls.iter().zip(&plans).filter(|(_, p)| **p == Plan::Run) {
            self.show(client, reply, &progress_note(call), true).await?;
        }
        let (progress, mut notes) = unbounded_channel::<Progress>();
        let ctx = CallContext {
            progress: Some(progress),
            show_reasoning: reply.shows_reasoning(),
            ..self.ctx.clone()
        };
        let runs = calls.iter().zip(plans).map(|(call, plan)| {
            let ctx = &ctx;
            async move {
                let started = Instant::now();
                let outcome = match plan {
                    Plan::Run => self.toolset.call(&call.name, &call.arguments, ctx).await,
                    Plan::Defer => {
                        return Outcome::error(format!(
                            "`{}` was not run: it is a client tool and was requested together with agent tools. \
                             Request it again on its own, in a turn without agent tool calls.",
                            call.name
                        ));
                    }
                    Plan::OverCap => {
                        return Outcome::error(format!(
                            "`{}` was not run: at most {cap} tool calls run per turn. \
                             Request it again in a later turn.",
                            call.name
                        ));
                    }
                    Plan::Unknown => {
                        return Outcome::error(format!(
                            "There is no tool `{}`. Call one of the tools offered, or answer.",
                            call.name
                        ));
                    }
                };
                let took = started.elapsed();
                let offered = self.toolset.offers(&call.name);
                metrics().observe_tool(&call.name, offered, outcome.ok, took);
                info!(agent = %agent.id, tool = %call.name, ok = outcome.ok, ms = took.as_millis() as u64, "tool call");
                outcome
            }
        });
        // Collected first: a closure inside the stream's type trips the
        // compiler's `Send` proof for this future.
        let runs: Vec<_> = runs.collect();
        // `buffered` keeps the calls' order and runs at most that many at once.
        let runs = stream::iter(runs)
            .buffered(limits.max_concurrent_tool_calls)
            .collect::<Vec<Outcome>>();
        let mut runs = pin!(runs);
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
                Err(note) => self.progress(client, reply, note).await?,
            }
        };
        while let Ok(note) = notes.try_recv() {
            self.progress(client, reply, note).await?;
        }
        Ok(calls
            .iter()
            .zip(outcomes)
            .map(|(call, outcome)| ToolResult {
                call_id: call.id.clone(),
                is_error: !outcome.ok,
                output: outcome.text,
                attachments: Vec::new(),
            })
            .collect())
    }

    /// What an agent called as a tool reported.
    async fn progress<D: Downstream>(
        &self,
        client: &mut D,
        reply: &mut Reply,
        progress: Progress,
    ) -> Result<(), Failure> {
        match progress {
            Progress::Note(note) => self.show(client, reply, &note, false).await,
            Progress::Usage(usage) => {
                reply.add_usage(usage);
                Ok(())
            }
        }
    }

    /// Tool progress, where the agent's `tool_events` puts it: a `line` of
    /// its own (a call's), or a piece of a called agent's stream.
    async fn show<D: Downstream>(
        &self,
        client: &mut D,
        reply: &mut Reply,
        note: &str,
        line: bool,
    ) -> Result<(), Failure> {
        let in_content = match self.agent.tool_events {
            ToolEvents::Reasoning => false,
            ToolEvents::Content => true,
            ToolEvents::Hidden => return Ok(()),
        };
        match (line, in_content) {
            (true, _) => reply.line(client, note, in_content).await?,
            (false, true) => reply.content(client, note).await?,
            (false, false) => reply.proxy_note(client, note).await?,
        }
        Ok(())
    }
}

/// A forced tool choice (`required`, a named function; the client's or the
/// agent's `params`) asks the model's answer for a call, and it made one: the
/// rounds after it may answer. Forced still, a model whose server enforces
/// the choice (llama.cpp's grammar) must call a tool every round, until
/// `max_tool_rounds` cuts the turn. OpenAI's Agents SDK resets it the same way.
fn release_forced_choice(conversation: &mut Conversation) {
    let forced = match &conversation.options.tool_choice {
        Some(choice) => !matches!(choice, ToolChoice::Auto | ToolChoice::None),
        None => conversation
            .params
            .get("tool_choice")
            .is_some_and(|choice| !matches!(choice.as_str(), Some("auto" | "none"))),
    };
    if forced {
        conversation.options.tool_choice = Some(ToolChoice::Auto);
    }
}

/// What becomes of one call of a turn that runs local tools.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plan {
    Run,
    /// A client tool in a mixed turn (see the module docs).
    Defer,
    /// Past `limits.max_tool_calls_per_turn`.
    OverCap,
    /// To a tool no one offered.
    Unknown,
}

/// Whether the request offers the model `function` (its own tools and the
/// client's).
fn declares(tools: &[Arc<FunctionTool>], function: &str) -> bool {
    tools.iter().any(|tool| tool.name == function)
}

fn progress_note(call: &ToolCall) -> String {
    const SHOWN: usize = 200;
    let args = call.arguments.trim();
    let mut cut = args.len().min(SHOWN);
    while !args.is_char_boundary(cut) {
        cut -= 1;
    }
    let ellipsis = if cut < args.len() { "…" } else { "" };
    format!("Calling {} {}{ellipsis}…\n", call.name, &args[..cut])
}

/// One model call as it streamed.
struct Round {
    /// The visible text, for the conversation history (empty in the last
    /// round).
    content: String,
    /// The reasoning it streamed, likewise.
    reasoning: String,
    end: RoundEnd,
}

/// Per-round state: where decoded deltas go as they arrive.
struct RoundReader<'r> {
    reply: &'r mut Reply,
    /// The visible text, gathered for the next round's history; none in
    /// the last round, whose answer would otherwise be held whole while
    /// it streams.
    history: Option<String>,
    /// The reasoning, gathered as the text is (shown to the client or not).
    thought: Option<String>,
    splitter: ThinkSplitter,
}

/// One model call, made from the conversation as it stands.
struct RoundRequest {
    body: Vec<u8>,
    decoder: Box<dyn RoundDecoder + Send>,
    /// No round follows this one.
    last: bool,
}

impl RoundRequest {
    fn of(api: UpstreamApi, conversation: &Conversation, last: bool) -> RoundRequest {
        RoundRequest {
            body: round::encode(api, conversation, conversation.options.stream),
            decoder: round::decoder(api, conversation),
            last,
        }
    }
}

async fn read_round<D: Downstream>(
    agent: &Agent,
    request: RoundRequest,
    affinity: Option<u64>,
    client: &mut D,
    reply: &mut Reply,
    ctx: &CallContext,
) -> Result<Round, Failure> {
    let limits = &ctx.config.limits;
    // The client's own credential goes on only when it is not our key.
    let client_auth = ctx
        .config
        .api_keys
        .is_empty()
        .then(|| ctx.headers.get(http::header::AUTHORIZATION))
        .flatten();
    let upstream = &agent.upstream;
    let RoundRequest {
        body,
        mut decoder,
        last,
    } = request;
    debug!(agent = %agent.id, upstream = %upstream.name, bytes = body.len(), "calling upstream");
    // The request's, as the client's session carries it: read once, with
    // the context (a lookup in the header map was 200 instructions).
    let request_id = ctx.request_id.as_str();
    let heartbeat = limits.heartbeat;
    // Boxed, like the whole-body reads below: a stream's future keeps room
    // for its largest state as long as it relays, and connecting (3.9 KiB)
    // is over once the answer's head is in.
    let mut exchange = reply
        .wait(
            client,
            heartbeat,
            boxed::pinned(|| {
                upstream.post_model(
                    upstream.api,
                    Bytes::from(body),
                    request_id,
                    affinity,
                    client_auth,
                )
            })
            .as_mut(),
        )
        .await?
        .map_err(|e| from_upstream(&upstream.name, &e))?;
    let status = exchange.status();
    if !(200..300).contains(&status) {
        let retry_after = exchange.field(&http::header::RETRY_AFTER);
        let body = reply
            .wait(
                client,
                heartbeat,
                boxed::pinned(|| exchange.read_to_end(limits.max_upstream_body_bytes)).as_mut(),
            )
            .await?
            .unwrap_or_default();
        return Err(Failure::Upstream {
            status,
            body: upstream.masking_key(body),
            retry_after,
        });
    }
    let mut reader = RoundReader {
        reply,
        history: (!last).then(String::new),
        // A Responses upstream's reasoning items carry their own.
        thought: (!last && agent.upstream.api == UpstreamApi::Chat).then(String::new),
        splitter: ThinkSplitter::default(),
    };
    let failed = |e: DecodeError| -> Failure {
        match e {
            DecodeError::Malformed(m) => {
                ApiError::bad_gateway(format!("upstream `{}`: {m}", upstream.name)).into()
            }
            DecodeError::Upstream(e) => Failure::Upstream {
                status: e.status,
                body: upstream.masking_key(e.body),
                retry_after: None,
            },
        }
    };
    if !exchange.is_event_stream() {
        // Some servers answer a stream request with one JSON document.
        let body = reader
            .reply
            .wait(
                client,
                heartbeat,
                boxed::pinned(|| exchange.read_to_end(limits.max_upstream_body_bytes)).as_mut(),
            )
            .await?
            .map_err(|e| match e.etype() == &crate::error::ANSWER_TOO_LARGE {
                true => too_large(&upstream.name, limits.max_upstream_body_bytes),
                false => from_upstream(&upstream.name, &e),
            })?;
        let whole = decoder.body(&body).map_err(failed)?;
        // In a stream's order: the text, then the items that finish it
        // (handed on first, an item was shown again by the text after it).
        reader.reasoning(client, &whole.reasoning).await?;
        for item in &whole.reasoning_items {
            reader.reply.reasoning_item(client, item).await?;
        }
        reader.content(client, &whole.content).await?;
        let end = decoder.end().map_err(failed)?;
        return reader.finish(client, end).await;
    }
    let mut parser = sse::Parser::new(limits.max_event_bytes);
    // The next piece, when it was read with the last.
    let mut read = None;
    // What the round holds grows with what the model sends (the text for
    // the history, a call's arguments, a Responses item's text): a stream
    // is bounded as a whole answer is.
    let mut streamed = 0usize;
    loop {
        let piece = match read.take() {
            Some(piece) => piece,
            None => reader
                .reply
                .wait(client, heartbeat, pin!(exchange.read()))
                .await?
                .map_err(|e| from_upstream(&upstream.name, &e))?,
        };
        let Some(piece) = piece else {
            if let Some(event) = parser.finish() {
                reader
                    .event(client, decoder.as_mut(), &event)
                    .await
                    .map_err(|e| e.failure(failed))?;
            }
            break;
        };
        streamed += piece.len();
        if streamed > limits.max_upstream_body_bytes {
            return Err(too_large(&upstream.name, limits.max_upstream_body_bytes).into());
        }
        parser.feed(&piece);
        // The events of one read leave in one write: under load a read
        // holds many (in as many chunks, from llama-server), and a write per
        // event would cost a syscall each.
        reader.reply.hold();
        while let Some(event) = parser
            .next_event()
            .map_err(|e| ApiError::bad_gateway(format!("upstream `{}`: {e}", upstream.name)))?
        {
            reader
                .event(client, decoder.as_mut(), &event)
                .await
                .map_err(|e| e.failure(failed))?;
        }
        read = exchange
            .read_buffered()
            .map_err(|e| from_upstream(&upstream.name, &e))?;
        if read.is_none() || reader.reply.held() >= MAX_HELD {
            reader.reply.release(client).await?;
        }
    }
    reader.reply.release(client).await?;
    let end = decoder.end().map_err(failed)?;
    reader.finish(client, end).await
}

/// An upstream's answer, streamed or whole, past what a round reads.
fn too_large(upstream: &str, limit: usize) -> ApiError {
    ApiError::bad_gateway(format!(
        "upstream `{upstream}`: its answer is larger than {limit} bytes"
    ))
}

/// The most a write gathers of the events already read: past it, they go
/// out, and the client's pace (its socket's backpressure) sets when the
/// next read happens.
const MAX_HELD: usize = 16 * 1024;

/// A round's failure: the client left, or the upstream's answer was bad.
enum ReadError {
    Gone,
    Decode(DecodeError),
}

impl ReadError {
    fn failure(self, failed: impl Fn(DecodeError) -> Failure) -> Failure {
        match self {
            ReadError::Gone => Failure::Gone,
            ReadError::Decode(e) => failed(e),
        }
    }
}

impl From<Gone> for ReadError {
    fn from(_: Gone) -> Self {
        ReadError::Gone
    }
}

impl RoundReader<'_> {
    /// Hands on what one upstream event carries.
    async fn event(
        &mut self,
        client: &mut impl Downstream,
        decoder: &mut (dyn RoundDecoder + Send),
        event: &sse::Event,
    ) -> Result<(), ReadError> {
        let step = decoder.event(event).map_err(ReadError::Decode)?;
        if let Some(text) = step.delta.reasoning.as_deref() {
            match step.delta.summary {
                // A Responses upstream's: the history has its items.
                true => self.reply.summary(client, text).await?,
                false => self.reasoning(client, text).await?,
            }
        }
        if let Some(item) = &step.reasoning_item {
            self.reply.reasoning_item(client, item).await?;
        }
        if let Some(text) = step.delta.content.as_deref() {
            self.content(client, text).await?;
        }
        Ok(())
    }

    async fn content(&mut self, client: &mut impl Downstream, text: &str) -> Result<(), Gone> {
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
    ) -> Result<(), Gone> {
        match kind {
            Kind::Content => {
                if let Some(history) = &mut self.history {
                    history.push_str(text);
                }
                self.reply.content(client, text).await
            }
            Kind::Reasoning => self.reasoning(client, text).await,
        }
    }

    async fn reasoning(&mut self, client: &mut impl Downstream, text: &str) -> Result<(), Gone> {
        if let Some(thought) = &mut self.thought {
            thought.push_str(text);
        }
        self.reply.reasoning(client, text).await
    }

    async fn finish(
        mut self,
        client: &mut impl Downstream,
        end: RoundEnd,
    ) -> Result<Round, Failure> {
        if let Some((kind, text)) = self.splitter.flush() {
            self.piece(client, kind, &text).await?;
        }
        Ok(Round {
            content: self.history.unwrap_or_default(),
            reasoning: self.thought.unwrap_or_default(),
            end,
        })
    }
}
