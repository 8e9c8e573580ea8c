//! The client side of a request handled by the proxy itself: writing the
//! response, and waiting on anything (an upstream read, a tool) while
//! watching for the client to go away and keeping a silent stream alive.

use std::future::Future;
use std::pin::{pin, Pin};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::StatusCode;
use pingora::http::RequestHeader;
use tokio::time::{Instant, Sleep};

use crate::conversation::Dialect;
use crate::error::ApiError;
use crate::http1::{field_bytes, X_ACCEL};
use crate::metrics::StreamGuard;
use crate::service::h1::Session;
use crate::service::write_buffer;
use crate::sse;

/// The client went away; whatever was in flight for it is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

/// What the client's idleness (`Session::idle`) says: gone, or the bytes of
/// a pipelined request, not a disconnect, and nothing more to learn from
/// the socket (`watching` goes off).
fn seen(closed: pingora::Result<()>, watching: &mut bool) -> Result<(), Gone> {
    closed.map_err(|_| Gone)?;
    *watching = false;
    Ok(())
}

pub struct Client<'s> {
    session: &'s mut Session,
    heartbeat: Duration,
    /// What keeps a silent stream alive: an SSE comment, or the dialect's
    /// own event (Anthropic's `ping`).
    heartbeat_bytes: &'static [u8],
    /// SSE headers were sent: heartbeats are allowed, and the stream is counted.
    streaming: Option<StreamGuard>,
    /// The heartbeat's timer, made once per stream: each wait pushes it
    /// later (a compare-and-swap), where a timer per wait would register and
    /// deregister under the timer wheel's lock for every upstream read.
    silence: Option<Pin<Box<Sleep>>>,
    watching: bool,
}

impl<'s> Client<'s> {
    pub fn new(session: &'s mut Session, heartbeat: Duration) -> Self {
        Client {
            session,
            heartbeat,
            heartbeat_bytes: sse::HEARTBEAT,
            streaming: None,
            silence: None,
            watching: true,
        }
    }

    /// Sets what a heartbeat writes (the client's dialect decides).
    pub fn set_heartbeat(&mut self, bytes: &'static [u8]) {
        self.heartbeat_bytes = bytes;
    }

    pub fn session(&self) -> &Session {
        self.session
    }

    pub fn header_sent(&self) -> bool {
        self.session.response_written().is_some()
    }

    /// Runs `work` to its end unless the client disconnects first. While an
    /// event stream is open, an SSE comment is sent every heartbeat interval.
    pub async fn wait<F: Future>(&mut self, work: F) -> Result<F::Output, Gone> {
        tokio::pin!(work);
        loop {
            let watching = self.watching;
            let silence = self.streaming.is_some().then(|| {
                let timer = self
                    .silence
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(self.heartbeat)));
                timer.as_mut().reset(Instant::now() + self.heartbeat);
                timer.as_mut()
            });
            let streaming = silence.is_some();
            let silent = async {
                match silence {
                    Some(timer) => timer.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                out = &mut work => return Ok(out),
                closed = self.session.idle(), if watching => {
                    seen(closed, &mut self.watching)?;
                    continue;
                }
                _ = silent, if streaming => {}
            }
            self.write(Bytes::from_static(self.heartbeat_bytes)).await?;
        }
    }

    /// Runs `work` on the client's request head to its end unless the
    /// client disconnects first, as [`Client::wait`] runs work: the head is
    /// lent where it is (a request passed on borrows its fields, where a
    /// copy counted each name and value up and down). Before any answer,
    /// so no heartbeat is due.
    pub async fn wait_on_head<T>(
        &mut self,
        work: impl AsyncFnOnce(&RequestHeader) -> T,
    ) -> Result<T, Gone> {
        let (head, mut watch) = self.session.head_and_watch();
        let work = work(head);
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return Ok(out),
                closed = watch.idle(), if self.watching => seen(closed, &mut self.watching)?,
            }
        }
    }

    /// Sends the response header of an event stream.
    pub async fn start_event_stream(&mut self) -> Result<(), Gone> {
        const EVENT_STREAM: [(&[u8], &[u8]); 4] = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (X_ACCEL.as_bytes(), b"no"),
            (b"transfer-encoding", b"chunked"),
        ];
        self.send_head(StatusCode::OK, EVENT_STREAM.into_iter(), false)
            .await?;
        self.mark_streaming();
        Ok(())
    }

    /// Opens an event stream with its first bytes: head and bytes in one
    /// write (pingora would flush the head alone).
    pub async fn open_stream_with(&mut self, first: Bytes) -> Result<(), Gone> {
        write_buffer::deferring_flush(pin!(self.start_event_stream())).await?;
        self.write(first).await
    }

    /// Writes the last bytes of an event stream: they leave with the
    /// response's closing chunk, in one write.
    pub async fn write_last(&mut self, bytes: Bytes) -> Result<(), Gone> {
        write_buffer::deferring_flush(pin!(self.write(bytes))).await
    }

    /// The response being sent is an event stream (heartbeats allowed).
    pub fn mark_streaming(&mut self) {
        self.streaming.get_or_insert_with(StreamGuard::open);
    }

    /// Sends a response head of `status` and `fields` (the session adds the
    /// request's id, `Date` and `Connection`).
    pub async fn send_head<'f>(
        &mut self,
        status: StatusCode,
        fields: impl Iterator<Item = (&'f [u8], &'f [u8])> + Clone,
        end: bool,
    ) -> Result<(), Gone> {
        let head = self
            .session
            .response_head(status, fields)
            .map_err(|_| Gone)?;
        self.session.send_head(head, end).await.map_err(|_| Gone)
    }

    pub async fn write(&mut self, bytes: Bytes) -> Result<(), Gone> {
        self.session
            .write_response_body(bytes, false)
            .await
            .map_err(|_| Gone)
    }

    /// A complete response, JSON unless `extra` sets another content type.
    pub async fn respond_json(
        &mut self,
        status: u16,
        body: Bytes,
        extra: &[(http::HeaderName, http::HeaderValue)],
    ) -> Result<(), Gone> {
        let status = StatusCode::from_u16(status).map_err(|_| Gone)?;
        let typed = extra.iter().any(|(name, _)| name == CONTENT_TYPE);
        let json = (!typed).then_some((&b"content-type"[..], &b"application/json"[..]));
        let mut length = itoa::Buffer::new();
        let length = (&b"content-length"[..], length.format(body.len()).as_bytes());
        let extra = extra
            .iter()
            .filter(|(name, _)| name != CONTENT_LENGTH)
            .map(|(name, value)| field_bytes((name, value)));
        let fields = json.into_iter().chain([length]).chain(extra);
        self.send_head(status, fields, body.is_empty()).await?;
        if !body.is_empty() {
            self.session
                .write_response_body(body, true)
                .await
                .map_err(|_| Gone)?;
        }
        Ok(())
    }

    pub async fn respond_error(&mut self, error: &ApiError) -> Result<(), Gone> {
        self.respond_error_in(Dialect::Chat, error).await
    }

    /// An error in the shape `dialect`'s clients read.
    pub async fn respond_error_in(
        &mut self,
        dialect: Dialect,
        error: &ApiError,
    ) -> Result<(), Gone> {
        let (status, body) = crate::front::error_response(dialect, error);
        self.respond_json(status, body, &[]).await
    }
}

/// Where an agent's answer goes: the client's connection ([`Client`]), or
/// nowhere ([`Headless`]) when another agent called this one and takes its
/// answer as a tool result.
pub trait Downstream: Send {
    fn header_sent(&self) -> bool;
    /// Runs `work` unless the client goes away first (by default, a
    /// downstream that cannot go away: `work` alone).
    fn wait<F>(&mut self, work: F) -> impl Future<Output = Result<F::Output, Gone>> + Send
    where
        F: Future + Send,
        F::Output: Send,
    {
        async { Ok(work.await) }
    }
    fn start_event_stream(&mut self) -> impl Future<Output = Result<(), Gone>> + Send;
    fn write(&mut self, bytes: Bytes) -> impl Future<Output = Result<(), Gone>> + Send;
    /// Opens an event stream with its first bytes, in one write where it can.
    fn open_stream_with(&mut self, first: Bytes) -> impl Future<Output = Result<(), Gone>> + Send {
        async move {
            self.start_event_stream().await?;
            self.write(first).await
        }
    }
    /// An event stream's last bytes, to leave with its end where it can.
    fn write_last(&mut self, bytes: Bytes) -> impl Future<Output = Result<(), Gone>> + Send {
        self.write(bytes)
    }
    fn respond_json(
        &mut self,
        status: u16,
        body: Bytes,
        extra: &[(http::HeaderName, http::HeaderValue)],
    ) -> impl Future<Output = Result<(), Gone>> + Send;
}

impl Downstream for Client<'_> {
    fn header_sent(&self) -> bool {
        Client::header_sent(self)
    }

    fn wait<F>(&mut self, work: F) -> impl Future<Output = Result<F::Output, Gone>> + Send
    where
        F: Future + Send,
        F::Output: Send,
    {
        Client::wait(self, work)
    }

    fn start_event_stream(&mut self) -> impl Future<Output = Result<(), Gone>> + Send {
        Client::start_event_stream(self)
    }

    fn write(&mut self, bytes: Bytes) -> impl Future<Output = Result<(), Gone>> + Send {
        Client::write(self, bytes)
    }

    fn open_stream_with(&mut self, first: Bytes) -> impl Future<Output = Result<(), Gone>> + Send {
        Client::open_stream_with(self, first)
    }

    fn write_last(&mut self, bytes: Bytes) -> impl Future<Output = Result<(), Gone>> + Send {
        Client::write_last(self, bytes)
    }

    fn respond_json(
        &mut self,
        status: u16,
        body: Bytes,
        extra: &[(http::HeaderName, http::HeaderValue)],
    ) -> impl Future<Output = Result<(), Gone>> + Send {
        Client::respond_json(self, status, body, extra)
    }
}

/// The downstream of an agent called by another agent: its answer is
/// collected, not sent, and the caller's connection watches for disconnects
/// (dropping the caller's work drops this loop with it).
pub struct Headless;

impl Downstream for Headless {
    fn header_sent(&self) -> bool {
        false
    }

    async fn start_event_stream(&mut self) -> Result<(), Gone> {
        Ok(())
    }

    async fn write(&mut self, _bytes: Bytes) -> Result<(), Gone> {
        Ok(())
    }

    async fn respond_json(
        &mut self,
        _status: u16,
        _body: Bytes,
        _extra: &[(http::HeaderName, http::HeaderValue)],
    ) -> Result<(), Gone> {
        Ok(())
    }
}
