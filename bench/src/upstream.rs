//! The fake model server every target of the benchmark talks to.
//!
//! `POST /v1/chat/completions` answers like llama-server: JSON, or SSE when
//! the request says `"stream": true`. The request itself sets the shape of
//! the answer, so one upstream serves every scenario through every proxy:
//! `max_tokens` is the number of tokens generated and `bench_delay_us` the
//! pause before each one (both pass through agent-proxy as ordinary fields).
//! When the request offers tools (and `tool_choice` is not `none`) and the
//! last message is not a tool result, the answer is one call of the first
//! tool instead, so an agent with a tool runs exactly one tool round. `POST /tool` is the fake HTTP tool.
//!
//! `POST /v1/messages` and `POST /v1/responses` answer a whole Message or
//! Response object of `max_tokens` (`max_output_tokens`) tokens: a coding
//! agent's own request, sent straight or through nginx, gets the answer an
//! agent would send back, so the proxies are compared carrying the same
//! bytes.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};

/// Serves until the process is killed.
pub async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            // A client hanging up mid-stream is part of the benchmark.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .await;
        });
    }
}

/// The few request fields the fake model looks at.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(default)]
    stream: bool,
    max_tokens: Option<u32>,
    max_output_tokens: Option<u32>,
    #[serde(default)]
    bench_delay_us: u64,
    #[serde(default, borrow)]
    messages: Vec<ProbeMessage<'a>>,
    #[serde(default)]
    tools: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    tool_choice: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ProbeMessage<'a> {
    #[serde(borrow)]
    role: &'a str,
}

const DEFAULT_TOKENS: u32 = 16;

async fn answer(request: Request<Incoming>) -> Result<Response<Reply>, Infallible> {
    let path = request.uri().path().to_owned();
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return Ok(plain(StatusCode::BAD_REQUEST, "unreadable body")),
    };
    Ok(match path.as_str() {
        // The legacy path too: agent-proxy sends it down pingora's own proxy
        // path, a reference for what pingora alone costs.
        "/v1/chat/completions" | "/v1/completions" => probed(&body, chat),
        "/v1/messages" => probed(&body, |probe| whole(probe, message)),
        "/v1/responses" => probed(&body, |probe| whole(probe, response)),
        "/tool" => json(Bytes::from_static(br#"{"temperature_c":21,"sky":"clear"}"#)),
        _ => plain(StatusCode::NOT_FOUND, "no such path"),
    })
}

fn probed(body: &[u8], answer: impl FnOnce(&Probe) -> Response<Reply>) -> Response<Reply> {
    match serde_json::from_slice::<Probe>(body) {
        Ok(probe) => answer(&probe),
        Err(e) => plain(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

/// A whole answer of the probe's length, its generated text written by `answer`.
fn whole(probe: &Probe, answer: fn(&str, u32) -> String) -> Response<Reply> {
    if probe.stream {
        return plain(
            StatusCode::BAD_REQUEST,
            "the fake model streams chat completions only",
        );
    }
    let tokens = probe
        .max_tokens
        .or(probe.max_output_tokens)
        .unwrap_or(DEFAULT_TOKENS);
    json(Bytes::from(answer(&TOKEN.repeat(tokens as usize), tokens)))
}

/// An Anthropic Message, as an agent answers through `/v1/messages`.
fn message(text: &str, tokens: u32) -> String {
    format!(
        r#"{{"id":"msg_bench","type":"message","role":"assistant","model":"bench","content":[{{"type":"text","text":"{text}"}}],"stop_reason":"end_turn","stop_sequence":null,"usage":{{"input_tokens":12,"output_tokens":{tokens}}}}}"#
    )
}

/// An OpenAI Response object, as an agent answers through `/v1/responses`.
fn response(text: &str, tokens: u32) -> String {
    format!(
        r#"{{"id":"resp_bench","object":"response","created_at":0,"status":"completed","model":"bench","output":[{{"type":"message","id":"msg_bench","status":"completed","role":"assistant","content":[{{"type":"output_text","text":"{text}","annotations":[]}}]}}],"usage":{{"input_tokens":12,"output_tokens":{tokens},"total_tokens":{}}}}}"#,
        tokens + 12
    )
}

fn chat(probe: &Probe) -> Response<Reply> {
    let calls_tool = !probe.tools.is_empty()
        && probe
            .tool_choice
            .as_ref()
            .is_none_or(|choice| choice != "none")
        && probe.messages.last().is_some_and(|m| m.role != "tool");
    let tokens = probe.max_tokens.unwrap_or(DEFAULT_TOKENS);
    if probe.stream {
        let mut response = Response::new(Reply::Stream(TokenStream::new(
            if calls_tool { 0 } else { tokens },
            Duration::from_micros(probe.bench_delay_us),
            calls_tool,
        )));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        return response;
    }
    let message = if calls_tool {
        format!(
            r#"{{"role":"assistant","content":null,"tool_calls":[{TOOL_CALL}]}},"finish_reason":"tool_calls""#
        )
    } else {
        format!(
            r#"{{"role":"assistant","content":"{}"}},"finish_reason":"stop""#,
            TOKEN.repeat(tokens as usize)
        )
    };
    json(Bytes::from(format!(
        r#"{{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench","choices":[{{"index":0,"message":{message}}}],"usage":{{"prompt_tokens":12,"completion_tokens":{tokens},"total_tokens":{}}}}}"#,
        tokens + 12
    )))
}

const TOKEN: &str = " tok";
const TOOL_CALL: &str = r#"{"index":0,"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"city\":\"Paris\"}"}}"#;

fn json(body: Bytes) -> Response<Reply> {
    let mut response = Response::new(Reply::Full(Some(body)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn plain(status: StatusCode, message: &str) -> Response<Reply> {
    let mut response = Response::new(Reply::Full(Some(Bytes::from(message.to_owned()))));
    *response.status_mut() = status;
    response
}

/// A whole body, or a stream of SSE chunks.
pub enum Reply {
    Full(Option<Bytes>),
    Stream(TokenStream),
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Reply::Full(body) => Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
            Reply::Stream(stream) => stream.poll_chunk(cx).map(|c| c.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Reply::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Reply::Full(body) => SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64)),
            Reply::Stream(_) => SizeHint::default(),
        }
    }
}

const ROLE_CHUNK: &[u8] = b"data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null},\"finish_reason\":null}]}\n\n";
const TOKEN_CHUNK: &[u8] = b"data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"},\"finish_reason\":null}]}\n\n";
const DONE_CHUNK: &[u8] = b"data: [DONE]\n\n";

enum Step {
    Role,
    Tokens,
    Finish,
    Done,
    End,
}

/// Role chunk, `tokens` content chunks (each after `delay`), or one tool
/// call, then the finish chunk with usage and `[DONE]`.
pub struct TokenStream {
    step: Step,
    left: u32,
    tokens: u32,
    delay: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    calls_tool: bool,
}

impl TokenStream {
    fn new(tokens: u32, delay: Duration, calls_tool: bool) -> Self {
        TokenStream {
            step: Step::Role,
            left: tokens,
            tokens,
            delay,
            sleep: None,
            calls_tool,
        }
    }

    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            match self.step {
                Step::Role => {
                    self.step = Step::Tokens;
                    return Poll::Ready(Some(Bytes::from_static(ROLE_CHUNK)));
                }
                Step::Tokens if self.calls_tool => {
                    self.step = Step::Finish;
                    return Poll::Ready(Some(Bytes::from(format!(
                        "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{TOOL_CALL}]}},\"finish_reason\":null}}]}}\n\n"
                    ))));
                }
                Step::Tokens if self.left == 0 => self.step = Step::Finish,
                Step::Tokens => {
                    if !self.delay.is_zero() {
                        let delay = self.delay;
                        let sleep = self
                            .sleep
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
                        ready!(sleep.as_mut().poll(cx));
                        sleep.as_mut().reset(Instant::now() + delay);
                    }
                    self.left -= 1;
                    return Poll::Ready(Some(Bytes::from_static(TOKEN_CHUNK)));
                }
                Step::Finish => {
                    self.step = Step::Done;
                    let reason = if self.calls_tool {
                        "tool_calls"
                    } else {
                        "stop"
                    };
                    return Poll::Ready(Some(Bytes::from(format!(
                        "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"{reason}\"}}],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{},\"total_tokens\":{}}}}}\n\n",
                        self.tokens,
                        self.tokens + 12
                    ))));
                }
                Step::Done => {
                    self.step = Step::End;
                    return Poll::Ready(Some(Bytes::from_static(DONE_CHUNK)));
                }
                Step::End => return Poll::Ready(None),
            }
        }
    }
}
