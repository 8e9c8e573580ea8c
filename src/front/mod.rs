//! Front doors: the client's dialect. Each front has a request decoder (wire
//! request → [`Conversation`]) and an [`Encoder`] that turns the loop's
//! neutral output into that dialect's stream or single response. Both are
//! pure: bytes and types in, bytes out, no I/O.
//!
//! [`Conversation`]: crate::conversation::Conversation

pub mod chat;
pub mod responses;

use bytes::Bytes;

use crate::conversation::{Finish, Reasoning, ToolCall, Usage};

/// Writes one answer in a client's dialect. Streaming encoders append SSE
/// bytes to `out` as each call comes; non-streaming ones collect and write
/// the whole response body in [`Encoder::finish`].
pub trait Encoder: Send {
    /// Whether the answer is an event stream.
    fn streams(&self) -> bool;

    /// The events that open a stream (chat: the role chunk; Responses:
    /// `response.created`, `response.in_progress`). Called once, first.
    fn open(&mut self, out: &mut Vec<u8>);

    /// A piece of the model's reasoning, or of the proxy's own progress
    /// notes shown on the reasoning channel.
    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>);

    /// A reasoning item the upstream completed (with its opaque encrypted
    /// content), for fronts that hand reasoning items to the client.
    fn reasoning_item(&mut self, item: &Reasoning, out: &mut Vec<u8>) {
        let _ = (item, out);
    }

    /// A piece of the answer's text.
    fn content(&mut self, text: &str, out: &mut Vec<u8>);

    /// Tool calls the client runs itself.
    fn client_calls(&mut self, calls: &[ToolCall], out: &mut Vec<u8>);

    /// Ends the answer: the closing events of a stream, or the whole body.
    fn finish(&mut self, finish: Finish, usage: Usage, out: &mut Vec<u8>);

    /// An error body in this dialect, before anything was sent, from an
    /// OpenAI-shaped error body (`{"error":{message,type,param,code}}`).
    fn error_body(&self, status: u16, openai_error: Bytes) -> Bytes {
        let _ = status;
        openai_error
    }

    /// An error once the stream is open: the dialect's error event.
    fn stream_error(&mut self, status: u16, openai_error: &[u8], out: &mut Vec<u8>);
}
