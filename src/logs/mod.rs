//! The process's log lines on stderr: text, or JSON lines with
//! `--log-json`, filtered by `RUST_LOG` (default `info`, a line per
//! request).
//!
//! - `format`: each event's line, written by a formatter of our own (a
//!   fifth of the cost of tracing-subscriber's); colours only at a
//!   terminal, where they help, not in a file or a collector's pipe.
//! - `request`: a request's line, written from its typed fields without
//!   tracing's dispatch (a sixth of a passed-on request's cost before).
//! - `queue`: the lines go to stderr from a thread of their own, so a
//!   request's line costs its thread no `write(2)`, and a slow collector
//!   never holds up a request.

mod format;
mod queue;
mod request;

use std::io::IsTerminal;

use tracing_subscriber::util::SubscriberInitExt;

pub use format::Lines;
pub use request::RequestLine;

/// Starts logging for the process (once, first thing in `main`). What is
/// queued when the process exits (by `std::process::exit` too) is written
/// first.
pub fn init(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    queue::start();
    let ansi = !json && std::io::stderr().is_terminal();
    let _ = request::STYLE.set(request::Style { json, ansi });
    let _ = subscriber(filter, json, ansi, || queue::Line).try_init();
}

/// Lines as `filter` lets them through, written by [`Lines`] to `writer`,
/// but for pingora's `trace` events: they print whole request heads, a
/// client's key and the upstream's with them (`Authorization`,
/// `x-api-key`), and no level of ours logs a key.
fn subscriber<W>(
    filter: tracing_subscriber::EnvFilter,
    json: bool,
    ansi: bool,
    writer: W,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;
    let no_pingora_trace = tracing_subscriber::filter::filter_fn(|meta| {
        *meta.level() != tracing::Level::TRACE || !meta.target().starts_with("pingora")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .event_format(Lines { json })
        .with_writer(writer)
        .finish()
        .with(no_pingora_trace)
}
