//! The answer as the client sees it: one OpenAI stream (one id, the role
//! once, deltas as they come, one finish chunk, `[DONE]`) or one
//! `chat.completion`, whatever number of rounds the loop took.

use bytes::Bytes;

use tokio::sync::mpsc::UnboundedSender;

use crate::downstream::{Downstream, Gone};
use crate::error::ApiError;
use crate::openai::{
    AssistantMessageOut, ChoiceOut, ChunkOut, CompletionChoiceOut, CompletionOut, DeltaOut,
    IndexedToolCall, ToolCall, Usage,
};
use crate::sse;

pub struct Reply {
    id: String,
    created: u64,
    model: String,
    stream: bool,
    include_usage: bool,
    show_reasoning: bool,
    usage: Usage,
    first_token_at: Option<std::time::Instant>,
    /// Serialization buffer reused for every chunk.
    buf: Vec<u8>,
    // What a non-streaming answer accumulates.
    content: String,
    reasoning: String,
    tool_calls: Vec<ToolCall>,
    /// For an agent called by another: every piece of text also goes here,
    /// to show up in the caller's stream as progress.
    progress: Option<UnboundedSender<String>>,
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
    pub fn new(model: &str, stream: bool, include_usage: bool, show_reasoning: bool) -> Self {
        let mut id = String::from("chatcmpl-");
        id.extend((0..24).map(|_| fastrand::alphanumeric()));
        Reply {
            id,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: model.to_owned(),
            stream,
            include_usage,
            show_reasoning,
            usage: Usage::default(),
            first_token_at: None,
            buf: Vec::with_capacity(512),
            content: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            progress: None,
        }
    }

    /// The answer of an agent called by another: collected, with its text
    /// also sent to `progress`.
    pub fn nested(model: &str, progress: Option<UnboundedSender<String>>) -> Self {
        Reply {
            progress,
            ..Reply::new(model, false, false, true)
        }
    }

    /// The collected answer text (non-streaming replies).
    pub fn into_content(self) -> String {
        self.content
    }

    fn report(&self, text: &str) {
        if let Some(progress) = &self.progress {
            // The caller may have finished already; its progress is moot then.
            let _ = progress.send(text.to_owned());
        }
    }

    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// When the model's first content or reasoning was handed on.
    pub fn first_token_at(&self) -> Option<std::time::Instant> {
        self.first_token_at
    }

    pub fn add_usage(&mut self, usage: Usage) {
        self.usage += usage;
    }

    /// Opens the event stream (header and the role chunk) if not yet open.
    pub async fn start(&mut self, client: &mut impl Downstream) -> Result<(), Gone> {
        if !self.stream || client.header_sent() {
            return Ok(());
        }
        client.start_event_stream().await?;
        let delta = DeltaOut {
            role: Some("assistant"),
            content: Some(""),
            ..DeltaOut::default()
        };
        self.write_chunk(client, delta, None).await
    }

    pub async fn content(&mut self, client: &mut impl Downstream, text: &str) -> Result<(), Gone> {
        if text.is_empty() {
            return Ok(());
        }
        self.first_token_at
            .get_or_insert_with(std::time::Instant::now);
        if !self.stream {
            self.report(text);
            self.content.push_str(text);
            return Ok(());
        }
        let delta = DeltaOut {
            content: Some(text),
            ..DeltaOut::default()
        };
        self.send_chunk(client, delta, None).await
    }

    pub async fn reasoning(
        &mut self,
        client: &mut impl Downstream,
        text: &str,
    ) -> Result<(), Gone> {
        if text.is_empty() {
            return Ok(());
        }
        self.first_token_at
            .get_or_insert_with(std::time::Instant::now);
        if !self.show_reasoning {
            return Ok(());
        }
        self.proxy_note(client, text).await
    }

    /// Reasoning-channel text from the proxy itself (tool progress); shown
    /// even when the model's own reasoning is stripped.
    pub async fn proxy_note(
        &mut self,
        client: &mut impl Downstream,
        text: &str,
    ) -> Result<(), Gone> {
        if !self.stream {
            self.report(text);
            self.reasoning.push_str(text);
            return Ok(());
        }
        let delta = DeltaOut {
            reasoning_content: Some(text),
            ..DeltaOut::default()
        };
        self.send_chunk(client, delta, None).await
    }

    /// Tool calls the client runs itself, in standard OpenAI form.
    pub async fn tool_calls(
        &mut self,
        client: &mut impl Downstream,
        calls: Vec<ToolCall>,
    ) -> Result<(), Gone> {
        if self.stream {
            let indexed = calls
                .iter()
                .enumerate()
                .map(|(index, call)| IndexedToolCall { index, call })
                .collect();
            let delta = DeltaOut {
                tool_calls: Some(indexed),
                ..DeltaOut::default()
            };
            self.send_chunk(client, delta, None).await?;
        }
        self.tool_calls = calls;
        Ok(())
    }

    /// Ends the answer with `finish_reason` (and the summed usage).
    pub async fn finish(
        mut self,
        client: &mut impl Downstream,
        finish_reason: &str,
    ) -> Result<(), Gone> {
        if !self.stream {
            let body = CompletionOut {
                id: &self.id,
                object: "chat.completion",
                created: self.created,
                model: &self.model,
                choices: [CompletionChoiceOut {
                    index: 0,
                    message: AssistantMessageOut {
                        role: "assistant",
                        content: (!self.content.is_empty() || self.tool_calls.is_empty())
                            .then_some(self.content.as_str()),
                        reasoning_content: (!self.reasoning.is_empty())
                            .then_some(self.reasoning.as_str()),
                        tool_calls: (!self.tool_calls.is_empty())
                            .then_some(self.tool_calls.as_slice()),
                    },
                    logprobs: None,
                    finish_reason,
                }],
                usage: self.usage,
            };
            // Sized for the text and the envelope: one allocation, no regrowth.
            let mut json = Vec::with_capacity(512 + self.content.len() + self.reasoning.len());
            if serde_json::to_writer(&mut json, &body).is_err() {
                json.clear();
            }
            return client.respond_json(200, Bytes::from(json), &[]).await;
        }
        self.start(client).await?;
        self.send_chunk(client, DeltaOut::default(), Some(finish_reason))
            .await?;
        if self.include_usage {
            self.buf.clear();
            let chunk = ChunkOut {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: &[],
                usage: Some(self.usage),
            };
            self.buf.extend_from_slice(b"data: ");
            serde_json::to_writer(&mut self.buf, &chunk).unwrap_or_default();
            self.buf.extend_from_slice(b"\n\n");
            client.write(Bytes::copy_from_slice(&self.buf)).await?;
        }
        client.write(Bytes::from_static(sse::DONE)).await
    }

    /// Reports a failure: before any byte, as an error response with its
    /// status; once streaming, as an OpenAI error event. Returns whether the
    /// stream was cut (the caller must then abort the connection, so the
    /// answer cannot look complete).
    pub async fn fail(self, client: &mut impl Downstream, failure: Failure) -> bool {
        let (status, body, retry_after) = match failure {
            Failure::Gone => return true,
            Failure::Api(e) => (e.status, e.to_json(), None),
            Failure::Upstream {
                status,
                body,
                retry_after,
            } => (status, openai_error_body(status, &body), retry_after),
        };
        if client.header_sent() {
            let mut event = Vec::with_capacity(body.len() + 8);
            sse::write_data(&mut event, &body);
            let _ = client.write(Bytes::from(event)).await;
            return true;
        }
        let extra: Vec<_> = retry_after
            .into_iter()
            .map(|v| (http::header::RETRY_AFTER, v))
            .collect();
        client.respond_json(status, body, &extra).await.is_err()
    }

    async fn send_chunk(
        &mut self,
        client: &mut impl Downstream,
        delta: DeltaOut<'_>,
        finish_reason: Option<&str>,
    ) -> Result<(), Gone> {
        self.start(client).await?;
        self.write_chunk(client, delta, finish_reason).await
    }

    async fn write_chunk(
        &mut self,
        client: &mut impl Downstream,
        delta: DeltaOut<'_>,
        finish_reason: Option<&str>,
    ) -> Result<(), Gone> {
        self.buf.clear();
        let choices = [ChoiceOut {
            index: 0,
            delta,
            logprobs: None,
            finish_reason,
        }];
        let chunk = ChunkOut {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: &choices,
            usage: None,
        };
        self.buf.extend_from_slice(b"data: ");
        // Serializing our own string-only types cannot fail.
        serde_json::to_writer(&mut self.buf, &chunk).unwrap_or_default();
        self.buf.extend_from_slice(b"\n\n");
        client.write(Bytes::copy_from_slice(&self.buf)).await
    }
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

    #[test]
    fn llama_cpp_error_body_becomes_openai_shape() {
        let body = include_bytes!("../../tests/fixtures/llama.cpp/error-context-exceeded.json");
        let v: serde_json::Value = serde_json::from_slice(&openai_error_body(400, body)).unwrap();
        assert_eq!(v["error"]["type"], "exceed_context_size_error");
        assert_eq!(v["error"]["code"], "400");
        assert!(v["error"]["param"].is_null());
        assert!(v["error"]["n_ctx"].is_number(), "extra fields are kept");
        let v: serde_json::Value =
            serde_json::from_slice(&openai_error_body(503, b"<html>busy</html>")).unwrap();
        assert_eq!(v["error"]["message"], "<html>busy</html>");
    }
}
