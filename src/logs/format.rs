//! The line of each event, as text (tracing-subscriber's layout) or as JSON
//! (tracing-subscriber's `json()` shape).
//!
//! Formatted here rather than by tracing-subscriber's own formatters:
//! theirs cost 19,000 instructions for a request's line as text and 28,000
//! as JSON (its text fields go through its colour wrappers even when colours
//! are off; its JSON collects them in a map first), where a passthrough
//! request is 40,000 in all. This one writes each field once, straight into
//! the line, and each thread formats the date once a second.

use std::cell::Cell;
use std::fmt::{self, Write};
use std::marker::PhantomData;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The line of each event, as text or as JSON.
pub struct Lines {
    pub json: bool,
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // Events of the `log` crate (pingora's) under their own target.
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let line = EventLine {
            ctx,
            w: &mut w,
            meta,
            event,
        };
        match self.json {
            true => line.json(),
            false => line.text(),
        }
    }
}

/// One event's line, being written.
struct EventLine<'a, 'w, S, N> {
    ctx: &'a FmtContext<'a, S, N>,
    w: &'a mut Writer<'w>,
    meta: &'a Metadata<'a>,
    event: &'a Event<'a>,
}

impl<S, N> EventLine<'_, '_, S, N>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    /// `{"timestamp":…,"level":…,"fields":{…},"target":…}`, and `"spans"`
    /// (their names) inside one.
    fn json(self) -> fmt::Result {
        let w = self.w;
        json_head(w, *self.meta.level())?;
        let mut fields = Fields::<_, Json>::new(&mut *w);
        self.event.record(&mut fields);
        fields.result?;
        json_target(w, self.meta.target())?;
        if let Some(scope) = self.ctx.event_scope() {
            w.write_str(",\"spans\":[")?;
            for (i, span) in scope.from_root().enumerate() {
                w.write_str(if i == 0 { "{\"name\":" } else { ",{\"name\":" })?;
                json_string(w, span.name())?;
                w.write_char('}')?;
            }
            w.write_char(']')?;
        }
        w.write_str("}\n")
    }

    /// `2026-12-01T20:56:05.123456Z  INFO span{…}: target: message k=v …`, as
    /// tracing-subscriber's default; at a terminal, coloured as there.
    fn text(self) -> fmt::Result {
        let w = self.w;
        let ansi = w.has_ansi_escapes();
        text_head(w, ansi, *self.meta.level())?;
        if let Some(scope) = self.ctx.event_scope() {
            for span in scope.from_root() {
                w.write_str(span.name())?;
                if let Some(fields) = span.extensions().get::<FormattedFields<N>>() {
                    if !fields.is_empty() {
                        write!(w, "{{{fields}}}")?;
                    }
                }
                w.write_char(':')?;
            }
            w.write_char(' ')?;
        }
        text_target(w, ansi, self.meta.target())?;
        let mut fields = Fields::<_, Text>::new(&mut *w);
        self.event.record(&mut fields);
        fields.result?;
        w.write_char('\n')
    }
}

/// A JSON line up to its fields: `{"timestamp":…,"level":…,"fields":{`.
pub(super) fn json_head(w: &mut impl Write, level: Level) -> fmt::Result {
    w.write_str("{\"timestamp\":\"")?;
    timestamp(w)?;
    w.write_str("\",\"level\":\"")?;
    w.write_str(level.as_str())?;
    w.write_str("\",\"fields\":{")
}

/// What follows a JSON line's fields: `},"target":…` (its spans and `}`
/// after it).
pub(super) fn json_target(w: &mut impl Write, target: &str) -> fmt::Result {
    w.write_str("},\"target\":")?;
    json_string(w, target)
}

/// `(dim, reset)`: the escapes around a text line's quieter parts, at a
/// terminal.
fn dim(ansi: bool) -> (&'static str, &'static str) {
    match ansi {
        true => ("\x1b[2m", "\x1b[0m"),
        false => ("", ""),
    }
}

/// A text line up to its spans: `2026-12-01T20:56:05.123456Z  INFO `.
pub(super) fn text_head(w: &mut impl Write, ansi: bool, level: Level) -> fmt::Result {
    let (dim, reset) = dim(ansi);
    w.write_str(dim)?;
    timestamp(w)?;
    w.write_str(reset)?;
    let (level, colour) = match level {
        Level::TRACE => ("TRACE", "\x1b[35m"),
        Level::DEBUG => ("DEBUG", "\x1b[34m"),
        Level::INFO => (" INFO", "\x1b[32m"),
        Level::WARN => (" WARN", "\x1b[33m"),
        Level::ERROR => ("ERROR", "\x1b[31m"),
    };
    w.write_char(' ')?;
    if ansi {
        w.write_str(colour)?;
    }
    w.write_str(level)?;
    w.write_str(reset)?;
    w.write_char(' ')
}

/// A text line's target, before its fields: `agent_proxy::service: `.
pub(super) fn text_target(w: &mut impl Write, ansi: bool, target: &str) -> fmt::Result {
    let (dim, reset) = dim(ansi);
    w.write_str(dim)?;
    w.write_str(target)?;
    w.write_char(':')?;
    w.write_str(reset)?;
    w.write_char(' ')
}

thread_local! {
    /// The second last formatted on this thread, and its text up to the
    /// seconds (`2026-12-01T20:56:05`).
    static SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

/// Now, as tracing-subscriber writes it: RFC 3339, UTC, microseconds.
fn timestamp(w: &mut impl Write) -> fmt::Result {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = now.as_secs();
    let (cached, mut text) = SECOND.get();
    if cached != seconds {
        text = date_time(seconds);
        SECOND.set((seconds, text));
    }
    w.write_str(std::str::from_utf8(&text).unwrap_or("0000-00-00T00:00:00"))?;
    let mut micros = [b'0'; 6];
    let mut n = now.subsec_micros();
    for digit in micros.iter_mut().rev() {
        *digit = b'0' + (n % 10) as u8;
        n /= 10;
    }
    w.write_char('.')?;
    w.write_str(std::str::from_utf8(&micros).unwrap_or("000000"))?;
    w.write_char('Z')
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix second.
fn date_time(seconds: u64) -> [u8; 19] {
    let at = i64::try_from(seconds)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let mut text = [0u8; 19];
    let mut out = &mut text[..];
    let _ = std::io::Write::write_fmt(
        &mut out,
        format_args!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            at.year(),
            u8::from(at.month()),
            at.day(),
            at.hour(),
            at.minute(),
            at.second()
        ),
    );
    text
}

/// How a line writes its fields.
pub(super) trait Form {
    /// Whether this is the JSON form.
    const JSON: bool;
    /// What comes before a field's value: a separator unless it is the
    /// first, and its name.
    fn name(w: &mut impl Write, first: bool, name: &str) -> fmt::Result;
    fn str(w: &mut impl Write, message: bool, value: &str) -> fmt::Result;
    fn f64(w: &mut impl Write, value: f64) -> fmt::Result;
    /// A `%`- or `?`-value (and the message).
    fn debug(w: &mut impl Write, value: &dyn fmt::Debug) -> fmt::Result;
    /// A `%`-value that is a string: as [`Form::debug`] writes it.
    fn shown(w: &mut impl Write, value: &str) -> fmt::Result;
}

/// `message` first and bare, then `name=value`: strings quoted and escaped
/// (a value cannot break the line), numbers and `%`-values as they are.
pub(super) struct Text;

impl Form for Text {
    const JSON: bool = false;

    fn name(w: &mut impl Write, first: bool, name: &str) -> fmt::Result {
        // `write_str`s, not `write!`: formatting machinery for three strings
        // was half of a line's cost.
        if !first {
            w.write_char(' ')?;
        }
        if name != "message" {
            w.write_str(name)?;
            w.write_char('=')?;
        }
        Ok(())
    }

    fn str(w: &mut impl Write, message: bool, value: &str) -> fmt::Result {
        if message {
            Sanitized(w).write_str(value)
        } else if needs_escape(value) {
            write!(w, "{value:?}")
        } else {
            w.write_char('"')?;
            w.write_str(value)?;
            w.write_char('"')
        }
    }

    fn f64(w: &mut impl Write, value: f64) -> fmt::Result {
        write!(w, "{value:?}")
    }

    fn debug(w: &mut impl Write, value: &dyn fmt::Debug) -> fmt::Result {
        write!(Sanitized(w), "{value:?}")
    }

    fn shown(w: &mut impl Write, value: &str) -> fmt::Result {
        Sanitized(w).write_str(value)
    }
}

/// The members of a JSON object: strings and `%`/`?` values as JSON
/// strings, numbers and booleans as themselves.
pub(super) struct Json;

impl Form for Json {
    const JSON: bool = true;

    fn name(w: &mut impl Write, first: bool, name: &str) -> fmt::Result {
        if !first {
            w.write_char(',')?;
        }
        json_string(w, name)?;
        w.write_char(':')
    }

    fn str(w: &mut impl Write, _message: bool, value: &str) -> fmt::Result {
        json_string(w, value)
    }

    fn f64(w: &mut impl Write, value: f64) -> fmt::Result {
        // JSON has no NaN or infinity.
        match value.is_finite() {
            true => write!(w, "{value}"),
            false => w.write_str("null"),
        }
    }

    fn debug(w: &mut impl Write, value: &dyn fmt::Debug) -> fmt::Result {
        w.write_char('"')?;
        write!(Escaped(&mut *w), "{value:?}")?;
        w.write_char('"')
    }

    fn shown(w: &mut impl Write, value: &str) -> fmt::Result {
        json_string(w, value)
    }
}

/// An event's fields, written into its line in the form `F`.
struct Fields<'a, W, F> {
    w: &'a mut W,
    first: bool,
    result: fmt::Result,
    form: PhantomData<F>,
}

impl<'a, W: Write, F: Form> Fields<'a, W, F> {
    fn new(w: &'a mut W) -> Self {
        Fields {
            w,
            first: true,
            result: Ok(()),
            form: PhantomData,
        }
    }

    /// Writes `field` (unless it is `log` metadata, shown as the target).
    fn field(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let first = std::mem::take(&mut self.first);
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.result = F::name(self.w, first, name).and_then(|()| value(self.w));
    }
}

impl<W: Write, F: Form> Visit for Fields<'_, W, F> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let message = field.name() == "message";
        self.field(field, |w| F::str(w, message, value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |w| w.write_str(itoa::Buffer::new().format(value)));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |w| w.write_str(itoa::Buffer::new().format(value)));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.field(field, |w| F::f64(w, value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, |w| w.write_str(if value { "true" } else { "false" }));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, |w| F::debug(w, value));
    }
}

/// Writes what passes through it with control characters escaped (`\n`,
/// `\x1b`, `\u{9b}`): a message or a `%`-value that carries a client's or
/// a model's text can neither break the line nor drive a terminal.
struct Sanitized<'a, W>(&'a mut W);

impl<W: Write> Write for Sanitized<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // C1 controls are U+0080–U+009F: 0xC2 0x80–0x9F in UTF-8. Folded
        // without a branch a byte, the look is vectorised.
        let suspect = s.bytes().fold(false, |seen, b| {
            seen | (b < 0x20) | (b == 0x7f) | (b == 0xc2)
        });
        if !suspect {
            return self.0.write_str(s);
        }
        for c in s.chars() {
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                '\0'..='\x1f' | '\x7f' => write!(self.0, "\\x{:02x}", u32::from(c))?,
                '\u{80}'..='\u{9f}' => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
                c => self.0.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Whether a string's `Debug` form differs from it between quotes.
fn needs_escape(s: &str) -> bool {
    s.bytes().fold(false, |seen, b| {
        seen | (b < 0x20) | (b == b'"') | (b == b'\\') | (b >= 0x7f)
    })
}

fn json_string(w: &mut impl Write, s: &str) -> fmt::Result {
    w.write_char('"')?;
    // Most strings (names, ids, routes) have nothing to escape.
    match needs_escape(s) {
        true => Escaped(&mut *w).write_str(s)?,
        false => w.write_str(s)?,
    }
    w.write_char('"')
}

/// Writes what passes through it as the inside of a JSON string.
struct Escaped<'a, W>(&'a mut W);

impl<W: Write> Write for Escaped<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, b) in s.bytes().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&s[start..i])?;
            match escape {
                "" => write!(self.0, "\\u{b:04x}")?,
                escape => self.0.write_str(escape)?,
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What `f` logs through [`Lines`], in `json` or text.
    pub(in crate::logs) fn logged(json: bool, f: impl FnOnce()) -> String {
        captured(json, "trace", f).1
    }

    /// What `f` returns and logs (as text) under `RUST_LOG=filter`.
    pub(in crate::logs) fn filtered<T>(filter: &str, f: impl FnOnce() -> T) -> (T, String) {
        captured(false, filter, f)
    }

    /// What `f` returns and logs through [`Lines`] under `RUST_LOG=filter`.
    fn captured<T>(json: bool, filter: &str, f: impl FnOnce() -> T) -> (T, String) {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        let subscriber = crate::logs::subscriber(
            tracing_subscriber::EnvFilter::new(filter),
            json,
            false,
            move || Sink(sink.clone()),
        );
        let returned = tracing::subscriber::with_default(subscriber, f);
        let bytes = out.lock().map(|b| b.clone()).unwrap_or_default();
        (returned, String::from_utf8(bytes).expect("UTF-8"))
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn request_line() {
        tracing::info!(
            request_id = %"req-1",
            status = 200u16,
            route = "agent",
            agent = "say \"hi\"\nnow",
            first_token_ms = Option::<u64>::None,
            ms = 12u64,
            delta = -3i64,
            ok = true,
            "request"
        );
    }

    #[test]
    fn pingoras_trace_events_are_never_written() {
        for filter in ["trace", "pingora_proxy=trace,pingora_core=trace"] {
            let ((), written) = filtered(filter, || {
                tracing::trace!(target: "pingora_proxy", "Request header: Bearer sk-client");
                tracing::trace!(target: "pingora_core::protocols", "header: Bearer sk-upstream");
                tracing::debug!(target: "pingora_core::protocols", "connected");
            });
            assert!(!written.contains("sk-"), "{filter}: {written}");
            assert!(written.contains("connected"), "{filter}: {written}");
        }
        let ((), written) = filtered("trace", || tracing::trace!("ours"));
        assert!(written.contains("ours"), "{written}");
    }

    #[test]
    fn text_lines_read_as_tracing_subscriber_writes_them() {
        let line = logged(false, request_line);
        let (stamp, rest) = line.split_at(27);
        // 2026-12-01T20:56:05.123456Z
        assert_eq!(stamp.len(), 27);
        assert_eq!(&stamp[4..5], "-");
        assert_eq!(&stamp[10..11], "T");
        assert_eq!(&stamp[19..20], ".");
        assert!(stamp.ends_with('Z'));
        assert_eq!(
            rest,
            "  INFO agent_proxy::logs::format::tests: request request_id=req-1 status=200 \
             route=\"agent\" agent=\"say \\\"hi\\\"\\nnow\" ms=12 delta=-3 ok=true\n"
        );
    }

    #[test]
    fn json_lines_are_json_with_typed_fields() {
        let line = logged(true, request_line);
        assert!(
            line.ends_with("}\n") && line.matches('\n').count() == 1,
            "{line}"
        );
        let value: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(value["level"], "INFO");
        assert_eq!(value["target"], "agent_proxy::logs::format::tests");
        assert!(value["timestamp"].as_str().is_some_and(|t| t.len() == 27));
        let fields = &value["fields"];
        assert_eq!(fields["message"], "request");
        assert_eq!(fields["request_id"], "req-1");
        assert_eq!(fields["status"], 200);
        assert_eq!(fields["agent"], "say \"hi\"\nnow");
        assert_eq!(fields["delta"], -3);
        assert_eq!(fields["ok"], true);
        assert!(fields.get("first_token_ms").is_none());
    }

    #[test]
    fn text_from_outside_cannot_break_the_line_or_drive_a_terminal() {
        let hostile = "a\nfake line\x1b[31m\u{9b}é";
        let line = logged(
            false,
            || tracing::warn!(path = %hostile, "model said {hostile}"),
        );
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(!line.contains('\x1b') && !line.contains('\u{9b}'), "{line}");
        assert!(
            line.ends_with(
                "model said a\\nfake line\\x1b[31m\\u{9b}é path=a\\nfake line\\x1b[31m\\u{9b}é\n"
            ),
            "{line}"
        );
    }

    #[test]
    fn any_string_survives_json_escaping() {
        for s in [
            "",
            "plain",
            "\u{0}\u{1f}\"\\\n\r\t",
            "é ✓ \u{7f}",
            "a\u{2028}b",
        ] {
            let mut out = String::new();
            json_string(&mut out, s).expect("write");
            assert_eq!(serde_json::from_str::<String>(&out).expect("JSON"), s);
        }
    }

    #[test]
    fn spans_show_in_both_forms() {
        let work = || {
            let span = tracing::info_span!("round", n = 2);
            let _in = span.enter();
            tracing::warn!("slow");
        };
        let text = logged(false, work);
        assert!(
            text.ends_with(" WARN round{n=2}: agent_proxy::logs::format::tests: slow\n"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&logged(true, work)).expect("JSON");
        assert_eq!(json["spans"][0]["name"], "round");
        assert_eq!(json["fields"]["message"], "slow");
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(&date_time(0), b"1970-01-01T00:00:00");
        assert_eq!(&date_time(1_795_301_752), b"2026-11-21T22:55:52");
    }
}
