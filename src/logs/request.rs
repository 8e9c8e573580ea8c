//! A request's line, the one event every request logs: written straight
//! into the queue from its typed fields, not through tracing's dispatch.
//!
//! Through tracing, the line cost a passed-on request 7,500 instructions
//! (its sixteen fields each visited through `dyn Value`, its `%`-values
//! through `fmt`'s machinery), a sixth of the request. Written here, it is
//! the same line, text or JSON, filtered by `RUST_LOG` as before (its target
//! is [`TARGET`]), but seen by no other subscriber.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::OnceLock;

use tracing::Level;

use super::format::{json_head, json_target, text_head, text_target, Form, Json, Text};
use super::queue;

/// The request line's target: the module that logged it through tracing,
/// so that `RUST_LOG=agent_proxy::service=warn` still turns it off.
pub const TARGET: &str = "agent_proxy::service";

/// How the process writes its lines: set by [`super::init`]. Unset (a
/// library's tests), request lines are not written.
pub(super) static STYLE: OnceLock<Style> = OnceLock::new();

#[derive(Clone, Copy)]
pub(super) struct Style {
    pub json: bool,
    /// Colours: stderr is a terminal.
    pub ansi: bool,
}

/// The fields of a request's line, in the order they are written.
pub struct RequestLine<'a> {
    pub request_id: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    /// 0: no response was written.
    pub status: u16,
    pub route: &'a str,
    pub agent: &'a str,
    pub session: &'a str,
    pub upstream: &'a str,
    pub rounds: u32,
    pub tools: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Left out of the line when there was none.
    pub first_token_ms: Option<u64>,
    pub ms: u64,
    pub error: &'a str,
}

/// Whether `RUST_LOG` lets the line through: asked as of an event with its
/// fields, as the line's own callsite was (a directive may name fields).
fn enabled() -> bool {
    tracing::enabled!(
        kind: tracing::metadata::Kind::EVENT,
        target: TARGET,
        Level::INFO,
        {
            message, request_id, method, path, status, route, agent, session, upstream,
            rounds, tools, prompt_tokens, completion_tokens, first_token_ms, ms, error
        }
    )
}

thread_local! {
    /// The line being written, its room kept for the thread's next.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl RequestLine<'_> {
    /// Queues the line, where `RUST_LOG` lets its target (`agent_proxy::service`)
    /// log at `INFO`.
    pub fn log(&self) {
        let Some(&style) = STYLE.get() else { return };
        if !enabled() {
            return;
        }
        LINE.with_borrow_mut(|line| {
            line.clear();
            if self.write(line, style).is_ok() {
                // `Line` queues it whole, or writes it itself without the
                // writer thread.
                let _ = queue::Line.write_all(line.as_bytes());
            }
        });
    }

    /// The line as tracing-subscriber's layout has it (`format::Lines`).
    fn write(&self, w: &mut String, style: Style) -> fmt::Result {
        match style.json {
            true => {
                json_head(w, Level::INFO)?;
                self.fields::<Json>(w)?;
                json_target(w, TARGET)?;
                w.write_str("}\n")
            }
            false => {
                text_head(w, style.ansi, Level::INFO)?;
                text_target(w, style.ansi, TARGET)?;
                self.fields::<Text>(w)?;
                w.write_char('\n')
            }
        }
    }

    /// Its fields in the form `F`: those tracing took as `%`-values (the
    /// id, method and path) as such, `message` first. Each name is written
    /// with its separators in one piece.
    fn fields<F: Form>(&self, w: &mut String) -> fmt::Result {
        /// A field's name, between the separators of the form `F`.
        macro_rules! named {
            ($name:literal) => {
                match F::JSON {
                    true => concat!(",\"", $name, "\":"),
                    false => concat!(" ", $name, "="),
                }
            };
        }
        let mut digits = itoa::Buffer::new();
        let mut number = |w: &mut String, named, value: u64| {
            w.write_str(named)?;
            w.write_str(digits.format(value))
        };
        w.write_str(match F::JSON {
            true => "\"message\":\"request\"",
            false => "request",
        })?;
        for (named, value) in [
            (named!("request_id"), self.request_id),
            (named!("method"), self.method),
            (named!("path"), self.path),
        ] {
            w.write_str(named)?;
            F::shown(w, value)?;
        }
        number(w, named!("status"), u64::from(self.status))?;
        for (named, value) in [
            (named!("route"), self.route),
            (named!("agent"), self.agent),
            (named!("session"), self.session),
            (named!("upstream"), self.upstream),
        ] {
            w.write_str(named)?;
            F::str(w, false, value)?;
        }
        number(w, named!("rounds"), u64::from(self.rounds))?;
        number(w, named!("tools"), u64::from(self.tools))?;
        number(w, named!("prompt_tokens"), self.prompt_tokens)?;
        number(w, named!("completion_tokens"), self.completion_tokens)?;
        if let Some(ms) = self.first_token_ms {
            number(w, named!("first_token_ms"), ms)?;
        }
        number(w, named!("ms"), self.ms)?;
        w.write_str(named!("error"))?;
        F::str(w, false, self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::tests::{filtered, logged};
    use super::*;

    /// The line through tracing, as the request line was logged before.
    fn through_tracing(line: &RequestLine) {
        tracing::info!(
            target: TARGET,
            request_id = %line.request_id,
            method = %line.method,
            path = %line.path,
            status = line.status,
            route = line.route,
            agent = line.agent,
            session = line.session,
            upstream = line.upstream,
            rounds = line.rounds,
            tools = line.tools,
            prompt_tokens = line.prompt_tokens,
            completion_tokens = line.completion_tokens,
            first_token_ms = line.first_token_ms,
            ms = line.ms,
            error = line.error,
            "request"
        );
    }

    /// A line without its timestamp (27 bytes, at the start or after
    /// `{"timestamp":"`).
    fn untimed(line: &str, json: bool) -> String {
        let at = if json { r#"{"timestamp":""#.len() } else { 0 };
        format!("{}{}", &line[..at], &line[at + 27..])
    }

    #[test]
    fn the_line_is_the_one_tracing_wrote() {
        let plain = RequestLine {
            request_id: "req-1",
            method: "POST",
            path: "/v1/chat/completions",
            status: 200,
            route: "agent",
            agent: "weather",
            session: "-",
            upstream: "local",
            rounds: 2,
            tools: 1,
            prompt_tokens: 30,
            completion_tokens: u64::MAX,
            first_token_ms: Some(12),
            ms: 0,
            error: "-",
        };
        // What a client or a model controls, hostile: it can break no line.
        let hostile = RequestLine {
            request_id: "id\n\"quoted\"\\",
            path: "/a\nfake line\x1b[31m\u{9b}é\t",
            status: 0,
            agent: "say \"hi\"\nnow",
            session: "é\u{7f}\u{0}",
            first_token_ms: None,
            ..plain
        };
        for line in [&plain, &hostile] {
            for json in [false, true] {
                let ours = {
                    let mut w = String::new();
                    let style = Style { json, ansi: false };
                    line.write(&mut w, style).expect("written");
                    w
                };
                let theirs = logged(json, || through_tracing(line));
                assert_eq!(untimed(&ours, json), untimed(&theirs, json));
                assert_eq!(ours.matches('\n').count(), 1, "{ours}");
            }
        }
    }

    #[test]
    fn rust_log_lets_the_line_through_as_it_let_the_event() {
        let line = RequestLine {
            request_id: "r",
            method: "GET",
            path: "/",
            status: 200,
            route: "health",
            agent: "-",
            session: "-",
            upstream: "-",
            rounds: 0,
            tools: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            first_token_ms: None,
            ms: 0,
            error: "-",
        };
        for filter in [
            "info",
            "warn",
            "off",
            "agent_proxy=warn",
            "warn,agent_proxy::service=info",
            "agent_proxy::service=debug",
            "info,agent_proxy::service=warn",
            // Directives that name fields apply to events with them alone.
            "info,agent_proxy[{dropped}]=off",
            "off,agent_proxy[{dropped}]=info",
            "off,agent_proxy[{request_id}]=info",
            "info,agent_proxy::service[{status}]=off",
        ] {
            let (ours, written) = filtered(filter, || {
                let ours = enabled();
                through_tracing(&line);
                ours
            });
            assert_eq!(ours, !written.is_empty(), "RUST_LOG={filter}");
        }
    }
}
