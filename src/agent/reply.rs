//! The answer as the client sees it, whatever number of rounds the loop
//! took: the loop's output handed to the client's front encoder, and its
//! bytes to the client as they come.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

use tokio::sync::mpsc::UnboundedSender;

use crate::conversation::{Finish, Reasoning, ToolCall, Usage};
use crate::downstream::{Downstream, Gone};
use crate::error::ApiError;
use crate::front::{self, Encoder};
use crate::tools::Progress;

pub struct Reply {
    encoder: Box<dyn Encoder>,
    show_reasoning: bool,
    /// The proxy's notes go out on the reasoning channel: the answer has one.
    notes: bool,
    usage: Usage,
    first_token_at: Option<std::time::Instant>,
    /// Bytes the encoder wrote, reused for every event.
    buf: Vec<u8>,
    /// Events are gathered instead of written, until [`Reply::release`]:
    /// the events of one upstream read leave in one write.
    hold: bool,
    /// The encoder's opening events were written (to `buf`); the head goes
    /// out with the first bytes after them.
    opened: bool,
    /// The last character of the text sent so far.
    last_char: Option<char>,
    /// The last character of the reasoning sent so far.
    last_reasoning_char: Option<char>,
    /// A new round began: its first text starts a new paragraph.
    round_break: bool,
    /// The same for its first reasoning.
    reasoning_break: bool,
    /// The agent's tools ran: a failure now is not one for the client to
    /// send again (their side effects would repeat).
    acted: bool,
    /// For an agent called by another: its text is collected (the caller's
    /// tool result) and also sent to `progress`, to show up in the caller's
    /// stream as it comes.
    nested: Option<Nested>,
}

struct Nested {
    content: String,
    progress: Option<UnboundedSender<Progress>>,
}

/// How a request that failed reaches the client.
#[derive(Debug)]
pub enum Failure {
    Gone,
    Api(ApiError),
    /// The upstream answered with an error status; passed on as it is.
    Upstream {
        status: u16,
        body: Bytes,
        retry_after: Option<http::HeaderValue>,
    },
}

impl Failure {
    /// What failed, for the request's log line: pingora's name for a
    /// failure on the way to the upstream (`ConnectRefused`,
    /// `ReadTimedout`, `ConnectionClosed`), `ClientClosed` for a client
    /// that left, `UpstreamStatus` for an upstream's error answer, or the
    /// error's type.
    pub fn cause(&self) -> &'static str {
        match self {
            Failure::Gone => "ClientClosed",
            Failure::Api(e) => e.cause.unwrap_or(e.kind),
            Failure::Upstream { .. } => crate::error::UPSTREAM_STATUS,
        }
    }
}

impl From<Gone> for Failure {
    fn from(_: Gone) -> Self {
        Failure::Gone
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure::Api(e)
    }
}

impl Reply {
    pub fn new(encoder: Box<dyn Encoder>, show_reasoning: bool) -> Self {
        // A whole answer is written once, by the encoder's `finish`, which
        // sizes it: room taken now would be reallocated, and copied, then.
        let buf = match encoder.streams() {
            true => Vec::with_capacity(512),
            false => Vec::new(),
        };
        let notes = encoder.takes_reasoning();
        Reply {
            encoder,
            show_reasoning: show_reasoning && notes,
            notes,
            usage: Usage::default(),
            first_token_at: None,
            buf,
            hold: false,
            opened: false,
            last_char: None,
            last_reasoning_char: None,
            round_break: false,
            reasoning_break: false,
            acted: false,
            nested: None,
        }
    }

    /// The answer of an agent called by another: collected, with its text
    /// (and its reasoning if shown) also sent to `progress`.
    pub fn nested(progress: Option<UnboundedSender<Progress>>, show_reasoning: bool) -> Self {
        Reply {
            nested: Some(Nested {
                content: String::new(),
                progress,
            }),
            ..Reply::new(Box::new(Collect), show_reasoning)
        }
    }

    /// Whether the model's reasoning reaches the client.
    pub fn shows_reasoning(&self) -> bool {
        self.show_reasoning
    }

    /// The collected answer text of a nested agent.
    pub fn into_content(self) -> String {
        self.nested.map(|n| n.content).unwrap_or_default()
    }

    /// Sends `text` as a nested agent's progress; false when not nested.
    fn report(&mut self, text: &str, content: bool) -> bool {
        let Some(nested) = &mut self.nested else {
            return false;
        };
        if content {
            nested.content.push_str(text);
        }
        if let Some(progress) = &nested.progress {
            // The caller may have finished already; its progress is moot then.
            let _ = progress.send(Progress::Note(text.to_owned()));
        }
        true
    }

    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// When the model's first content or reasoning was handed on.
    pub fn first_token_at(&self) -> Option<std::time::Instant> {
        self.first_token_at
    }

    /// Another model call begins: its text must not run into the last one's
    /// (`Let me check.It is 21 °C`).
    pub fn next_round(&mut self) {
        self.round_break = true;
        self.reasoning_break = true;
    }

    pub fn add_usage(&mut self, usage: Usage) {
        self.usage += usage;
    }

    /// Waits on `work` for the client (see [`Downstream::wait`]). A stream
    /// not yet open is opened after `heartbeat` of silence, so the client,
    /// and any load balancer in between, sees bytes while a long prompt is
    /// processed. Errors that come sooner still get their own status.
    ///
    /// `work` comes pinned where it was made (`pin!`, or a box): a future
    /// taken by value would be held twice here (the argument and its pinned
    /// move), and again in [`Downstream::wait`], all in the stream's future
    /// for as long as it is open.
    pub async fn wait<F>(
        &mut self,
        client: &mut impl Downstream,
        heartbeat: Duration,
        mut work: Pin<&mut F>,
    ) -> Result<F::Output, Gone>
    where
        F: Future + Send + ?Sized,
        F::Output: Send,
    {
        if !self.encoder.streams() || client.header_sent() {
            return client.wait(work).await;
        }
        if let Ok(out) = client
            .wait(tokio::time::timeout(heartbeat, work.as_mut()))
            .await?
        {
            return Ok(out);
        }
        // Boxed: once a request at most, and as large as a write.
        Box::pin(self.start(client)).await?;
        client.wait(work).await
    }

    /// The agent's tools are about to run.
    pub fn tools_ran(&mut self) {
        self.acted = true;
    }

    /// Opens the event stream now (head and opening events), if not yet
    /// open: a silence is beginning (a long prompt, a tool), and the client
    /// and any load balancer in between must see bytes.
    pub async fn start(&mut self, client: &mut impl Downstream) -> Result<(), Gone> {
        if !self.encoder.streams() || client.header_sent() {
            return Ok(());
        }
        self.open();
        if self.hold || self.buf.is_empty() {
            client.start_event_stream().await?;
        }
        self.flush(client).await
    }

    /// The stream's opening events, before its first: written with them.
    fn open(&mut self) {
        if self.encoder.streams() && !self.opened {
            self.opened = true;
            self.encoder.open(&mut self.buf);
        }
    }

    /// How many bytes wait to be written.
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Gathers the events that follow until [`Reply::release`].
    pub fn hold(&mut self) {
        self.hold = true;
    }

    /// Writes what was gathered since [`Reply::hold`], in one write.
    pub async fn release(&mut self, client: &mut impl Downstream) -> Result<(), Gone> {
        self.hold = false;
        self.flush(client).await
    }

    async fn flush(&mut self, client: &mut impl Downstream) -> Result<(), Gone> {
        self.write(client, false).await
    }

    /// Writes what `buf` holds, unless held; the stream's head goes with
    /// the first bytes, and the `last` ones with the response's end.
    async fn write(&mut self, client: &mut impl Downstream, last: bool) -> Result<(), Gone> {
        if self.hold || self.buf.is_empty() {
            return Ok(());
        }
        let bytes = Bytes::copy_from_slice(&self.buf);
        self.buf.clear();
        if self.encoder.streams() && !client.header_sent() {
            client.open_stream_with(bytes).await
        } else if last {
            client.write_last(bytes).await
        } else {
            client.write(bytes).await
        }
    }

    pub async fn content(&mut self, client: &mut impl Downstream, text: &str) -> Result<(), Gone> {
        if text.is_empty() {
            return Ok(());
        }
        self.first_token_at
            .get_or_insert_with(std::time::Instant::now);
        let continues = self.encoder.continues(front::Channel::Text);
        if paragraph_break(&mut self.round_break, continues, self.last_char, text) {
            self.send_content(client, "\n\n").await?;
        }
        self.last_char = text.chars().next_back();
        self.send_content(client, text).await
    }

    async fn send_content(&mut self, client: &mut impl Downstream, text: &str) -> Result<(), Gone> {
        if self.report(text, true) {
            return Ok(());
        }
        self.open();
        self.encoder.content(text, &mut self.buf);
        self.flush(client).await
    }

    pub async fn reasoning(
        &mut self,
        client: &mut impl Downstream,
        text: &str,
    ) -> Result<(), Gone> {
        self.thought(client, text, Channel::Model).await
    }

    /// A piece of a summary of the model's reasoning (a Responses
    /// upstream's), shown as the model's reasoning is.
    pub async fn summary(&mut self, client: &mut impl Downstream, text: &str) -> Result<(), Gone> {
        self.thought(client, text, Channel::Summary).await
    }

    async fn thought(
        &mut self,
        client: &mut impl Downstream,
        text: &str,
        channel: Channel,
    ) -> Result<(), Gone> {
        if text.is_empty() {
            return Ok(());
        }
        self.first_token_at
            .get_or_insert_with(std::time::Instant::now);
        if !self.show_reasoning {
            return Ok(());
        }
        // A new round's reasoning does not run into the last one's, in a
        // block or item it continues (`…first.Let me…`).
        let continues = self.encoder.continues(front::Channel::Reasoning);
        let last = self.last_reasoning_char;
        if paragraph_break(&mut self.reasoning_break, continues, last, text) {
            self.send_reasoning(client, "\n\n", channel).await?;
        }
        self.send_reasoning(client, text, channel).await
    }

    /// A reasoning item the upstream completed, for fronts that hand them on.
    pub async fn reasoning_item(
        &mut self,
        client: &mut impl Downstream,
        item: &Reasoning,
    ) -> Result<(), Gone> {
        if !self.show_reasoning || self.nested.is_some() {
            return Ok(());
        }
        self.open();
        self.encoder.reasoning_item(item, &mut self.buf);
        self.flush(client).await
    }

    /// Reasoning-channel text from the proxy itself (tool progress); shown
    /// even when the model's own reasoning is stripped.
    pub async fn proxy_note(
        &mut self,
        client: &mut impl Downstream,
        text: &str,
    ) -> Result<(), Gone> {
        if !self.notes {
            return Ok(());
        }
        self.send_reasoning(client, text, Channel::Note).await
    }

    async fn send_reasoning(
        &mut self,
        client: &mut impl Downstream,
        text: &str,
        channel: Channel,
    ) -> Result<(), Gone> {
        self.last_reasoning_char = text.chars().next_back().or(self.last_reasoning_char);
        if self.report(text, false) {
            return Ok(());
        }
        self.open();
        match channel {
            Channel::Model => self.encoder.reasoning(text, &mut self.buf),
            Channel::Summary => self.encoder.summary(text, &mut self.buf),
            Channel::Note => self.encoder.note(text, &mut self.buf),
        }
        self.flush(client).await
    }

    /// A line of the proxy's own (tool progress), in the text or in the
    /// reasoning: it starts a line, whatever the model's text before it
    /// ended with.
    pub async fn line(
        &mut self,
        client: &mut impl Downstream,
        line: &str,
        in_content: bool,
    ) -> Result<(), Gone> {
        let last = match in_content {
            true => self
                .last_char
                .filter(|_| self.encoder.continues(front::Channel::Text)),
            false => self
                .last_reasoning_char
                .filter(|_| self.encoder.continues(front::Channel::Note)),
        };
        let line = match last {
            Some(c) if c != '\n' => std::borrow::Cow::Owned(format!("\n{line}")),
            _ => std::borrow::Cow::Borrowed(line),
        };
        match in_content {
            true => self.content(client, &line).await,
            false => self.proxy_note(client, &line).await,
        }
    }

    /// Tool calls the client runs itself, in the client's dialect.
    pub async fn tool_calls(
        &mut self,
        client: &mut impl Downstream,
        calls: &[ToolCall],
    ) -> Result<(), Gone> {
        self.open();
        self.encoder.client_calls(calls, &mut self.buf);
        self.flush(client).await
    }

    /// Ends the answer with `finish` (and the usage summed over rounds).
    pub async fn finish(
        mut self,
        client: &mut impl Downstream,
        finish: Finish,
    ) -> Result<(), Gone> {
        // What was gathered goes out with the end.
        self.hold = false;
        self.open();
        if !self.encoder.streams() {
            self.buf.clear();
        }
        self.encoder.finish(finish, self.usage, &mut self.buf);
        if self.encoder.streams() {
            return self.write(client, true).await;
        }
        if self.nested.is_some() {
            return Ok(());
        }
        client
            .respond_json(200, Bytes::from(std::mem::take(&mut self.buf)), &[])
            .await
    }

    /// Reports a failure: before any byte, as an error response with its
    /// status; once streaming, as the dialect's error event, which ends the
    /// stream where the dialect's does ([`Encoder::error_ends_stream`]).
    /// Returns whether the stream was cut (the caller must then abort the
    /// connection, so the answer cannot look complete).
    pub async fn fail(mut self, client: &mut impl Downstream, failure: Failure) -> bool {
        let (status, body, retry_after) = match failure {
            Failure::Gone => return true,
            Failure::Api(e) => (e.status, e.to_json(), None),
            Failure::Upstream {
                status,
                body,
                retry_after,
            } => (status, openai_error_body(status, &body), retry_after),
        };
        // Opened: a stream's head went out, or goes out with the event.
        if self.opened {
            // What was gathered before the failure goes out before its event.
            self.hold = false;
            self.encoder.stream_error(status, &body, &mut self.buf);
            if self.encoder.error_ends_stream() {
                return self.write(client, true).await.is_err();
            }
            let _ = self.flush(client).await;
            return true;
        }
        let mut extra: Vec<_> = retry_after
            .into_iter()
            .map(|v| (http::header::RETRY_AFTER, v))
            .collect();
        // The OpenAI SDKs send a 5xx again (twice, by default) unless told
        // not to: the tools that ran would run again.
        if self.acted {
            let never = http::HeaderValue::from_static("false");
            extra.push((http::HeaderName::from_static("x-should-retry"), never));
        }
        let body = self.encoder.error_body(status, body);
        let status = self.encoder.error_status(status);
        client.respond_json(status, body, &extra).await.is_err()
    }
}

/// Whether a new round's first piece (`text`) begins a paragraph: the round
/// just began (`pending`, cleared), its piece `continues` the last round's in
/// one block or item, and words meet at the seam (the last round ended with
/// `last`).
fn paragraph_break(pending: &mut bool, continues: bool, last: Option<char>, text: &str) -> bool {
    std::mem::take(pending)
        && continues
        && last.is_some_and(|c| !c.is_whitespace())
        && !text.starts_with(char::is_whitespace)
}

/// Whose text the reasoning channel carries.
#[derive(Clone, Copy)]
enum Channel {
    /// The model's own reasoning.
    Model,
    /// A summary of it, as a Responses upstream gives it.
    Summary,
    /// The proxy's progress notes.
    Note,
}

/// The encoder of a nested agent's answer: nothing goes to a client (the
/// text is collected by [`Reply`]).
struct Collect;

impl Encoder for Collect {
    fn streams(&self) -> bool {
        false
    }
    fn open(&mut self, _: &mut Vec<u8>) {}
    fn reasoning(&mut self, _: &str, _: &mut Vec<u8>) {}
    fn content(&mut self, _: &str, _: &mut Vec<u8>) {}
    fn client_calls(&mut self, _: &[ToolCall], _: &mut Vec<u8>) {}
    fn finish(&mut self, _: Finish, _: Usage, _: &mut Vec<u8>) {}
    fn stream_error(&mut self, _: u16, _: &[u8], _: &mut Vec<u8>) {}
}

/// An upstream error body in OpenAI shape: an `{"error":{...}}` body is kept
/// with `type`, `param` and `code` filled in (a numeric code, as llama.cpp
/// sends, becomes a string); anything else is wrapped.
pub fn openai_error_body(status: u16, body: &[u8]) -> Bytes {
    use serde_json::{json, Value};
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = match parsed {
        Some(Value::Object(mut top)) if top.get("error").is_some_and(Value::is_object) => {
            let mut error = top.remove("error").unwrap_or(Value::Null);
            if let Some(fields) = error.as_object_mut() {
                fields
                    .entry("message")
                    .or_insert_with(|| json!(format!("upstream error {status}")));
                fields
                    .entry("type")
                    .or_insert_with(|| json!("upstream_error"));
                fields.entry("param").or_insert(Value::Null);
                let code = fields.entry("code").or_insert(Value::Null);
                if let Value::Number(n) = code {
                    *code = Value::String(n.to_string());
                }
                // llama.cpp's context overflow as OpenAI names it: clients
                // (Codex, LangChain's trimming) act on that code.
                if fields.get("type").and_then(Value::as_str) == Some("exceed_context_size_error") {
                    fields.insert("type".into(), json!("invalid_request_error"));
                    fields.insert("code".into(), json!("context_length_exceeded"));
                }
            }
            error
        }
        _ => {
            let text = String::from_utf8_lossy(&body[..body.len().min(2048)]);
            json!({
                "message": if text.trim().is_empty() { format!("upstream returned HTTP {status}") } else { text.into_owned() },
                "type": "upstream_error",
                "param": null,
                "code": null,
            })
        }
    };
    Bytes::from(serde_json::to_vec(&json!({ "error": error })).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::chat::ChatEncoder;

    /// A client that records each write, and how it was made.
    #[derive(Default)]
    struct Recording {
        header_sent: bool,
        writes: Vec<Bytes>,
        calls: Vec<&'static str>,
    }

    impl Downstream for Recording {
        fn header_sent(&self) -> bool {
            self.header_sent
        }
        async fn start_event_stream(&mut self) -> Result<(), Gone> {
            self.header_sent = true;
            self.calls.push("head");
            Ok(())
        }
        async fn write(&mut self, bytes: Bytes) -> Result<(), Gone> {
            self.writes.push(bytes);
            self.calls.push("write");
            Ok(())
        }
        async fn open_stream_with(&mut self, first: Bytes) -> Result<(), Gone> {
            self.header_sent = true;
            self.writes.push(first);
            self.calls.push("head and first");
            Ok(())
        }
        async fn write_last(&mut self, bytes: Bytes) -> Result<(), Gone> {
            self.writes.push(bytes);
            self.calls.push("last");
            Ok(())
        }
        async fn respond_json(
            &mut self,
            _: u16,
            body: Bytes,
            _: &[(http::HeaderName, http::HeaderValue)],
        ) -> Result<(), Gone> {
            self.writes.push(body);
            Ok(())
        }
    }

    /// A streamed chat answer.
    fn chat_stream() -> Reply {
        let encoder = ChatEncoder::new("m", true, false, Default::default());
        Reply::new(Box::new(encoder), true)
    }

    fn text(writes: &[Bytes]) -> String {
        writes.iter().map(|w| String::from_utf8_lossy(w)).collect()
    }

    #[tokio::test]
    async fn held_events_leave_in_one_write_and_before_an_end_or_a_failure() {
        let (mut client, mut reply) = (Recording::default(), chat_stream());
        reply.content(&mut client, "a").await.unwrap();
        let before = client.writes.len();
        reply.hold();
        for piece in ["b", "c", "d"] {
            reply.content(&mut client, piece).await.unwrap();
        }
        assert_eq!(client.writes.len(), before, "nothing written while held");
        reply.release(&mut client).await.unwrap();
        assert_eq!(client.writes.len(), before + 1, "three events, one write");
        assert_eq!(text(&client.writes[before..]).matches("data: ").count(), 3);

        // Held events are not lost to the end or to a failure.
        reply.hold();
        reply.content(&mut client, "e").await.unwrap();
        reply.finish(&mut client, Finish::Stop).await.unwrap();
        let all = text(&client.writes);
        assert!(
            all.contains("\"e\"") && all.ends_with("data: [DONE]\n\n"),
            "{all}"
        );

        // Whether or not the stream's head went out before them.
        for written_before in [true, false] {
            let (mut client, mut reply) = (Recording::default(), chat_stream());
            if written_before {
                reply.content(&mut client, "x").await.unwrap();
            }
            reply.hold();
            reply.content(&mut client, "held").await.unwrap();
            let cut = reply
                .fail(&mut client, Failure::Api(ApiError::bad_gateway("broke")))
                .await;
            assert!(cut);
            assert!(client.header_sent, "the failure is an event of the stream");
            let all = text(&client.writes);
            let (held, error) = (all.find("held").unwrap(), all.find("broke").unwrap());
            assert!(held < error, "{all}");
        }
    }

    /// The head leaves with the first events, and the last events with
    /// the response's end (each a write of the connection, not two).
    #[tokio::test]
    async fn a_stream_opens_with_its_first_events_and_ends_with_its_last() {
        let (mut client, mut reply) = (Recording::default(), chat_stream());
        reply.hold();
        reply.content(&mut client, "a").await.unwrap();
        reply.content(&mut client, "b").await.unwrap();
        assert!(
            client.calls.is_empty(),
            "nothing before the held events leave"
        );
        reply.release(&mut client).await.unwrap();
        reply.content(&mut client, "c").await.unwrap();
        reply.finish(&mut client, Finish::Stop).await.unwrap();
        assert_eq!(client.calls, ["head and first", "write", "last"]);
        assert!(text(&client.writes[..1]).contains("\"b\""));
        assert!(text(&client.writes[2..]).ends_with("data: [DONE]\n\n"));

        // A silence (a tool, a long prompt) opens the stream at once, with
        // the opening events; while events are held, the head goes alone.
        let (mut client, mut reply) = (Recording::default(), chat_stream());
        reply.start(&mut client).await.unwrap();
        assert_eq!(client.calls, ["head and first"]);
        let (mut client, mut reply) = (Recording::default(), chat_stream());
        reply.hold();
        reply.start(&mut client).await.unwrap();
        assert_eq!(client.calls, ["head"]);
    }

    #[test]
    fn llama_cpp_error_body_becomes_openai_shape() {
        let body = include_bytes!("../../tests/fixtures/llama.cpp/error-context-exceeded.json");
        let v: serde_json::Value = serde_json::from_slice(&openai_error_body(400, body)).unwrap();
        // As OpenAI answers a prompt too long for the model.
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert!(v["error"]["param"].is_null());
        assert!(v["error"]["n_ctx"].is_number(), "extra fields are kept");
        let other = br#"{"error":{"code":500,"message":"x","type":"server_error"}}"#;
        let v: serde_json::Value = serde_json::from_slice(&openai_error_body(500, other)).unwrap();
        assert_eq!(v["error"]["code"], "500");
        let v: serde_json::Value =
            serde_json::from_slice(&openai_error_body(503, b"<html>busy</html>")).unwrap();
        assert_eq!(v["error"]["message"], "<html>busy</html>");
    }
}
