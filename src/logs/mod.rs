//! The process's log lines on stderr: text, or JSON lines with
//! `--log-json`, filtered by `RUST_LOG` (default `info`, a line per
//! request).
//!
//! - `format`: each event's line, written by a formatter of our own (a
//!   fifth of the cost of tracing-subscriber's); colours only at a
//!   terminal, where they help, not in a file or a collector's pipe.
//! - `queue`: the lines go to stderr from a thread of their own, so a
//!   request's line costs its thread no `write(2)`, and a slow collector
//!   never holds up a request.

mod format;
mod queue;

use std::io::IsTerminal;

pub use format::Lines;

/// Starts logging for the process (once, first thing in `main`). What is
/// queued when the process exits (by `std::process::exit` too) is written
/// first.
pub fn init(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    queue::start();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(!json && std::io::stderr().is_terminal())
        .event_format(Lines { json })
        .with_writer(|| queue::Line)
        .init();
}
