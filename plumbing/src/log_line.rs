//! One log record, one line: the daemons' `tracing` subscriber, shared by
//! `ongrid-skilld` and `ongrid-executor` ([`crate::journald::try_init`]
//! looks at stderr and installs it).
//!
//! Messages and fields carry text from packs: a folder's name, a
//! manifest's `entry`, a name in an error. Written raw, a `\n` in a folder
//! named `bad\nskill loader: registered subprocess skill "fake" from /x`
//! would end the record and start a forged one, and on the journal's
//! stream a forged line starting `<0>` would be logged at emergency
//! priority. So every field, the message included, is written through
//! [`printable::line`], as the CLI prints pack text: control characters
//! but tab escaped (`\n`, `\r`, `\x1b`, `\u{9b}`), so that each record is
//! exactly one line. Text without control characters is written as it is,
//! so ordinary lines read exactly as the default format writes them.

use std::fmt::{self, Write as _};

use policy::printable;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The daemons' subscriber: `filter`, to `writer`, fields through
/// [`OneLineFields`]; in the journal's format ([`StreamFormat`]) when
/// `journal`, else the usual text, with colours when `ansi`.
#[must_use]
pub fn subscriber<W>(
    filter: EnvFilter,
    writer: W,
    journal: bool,
    ansi: bool,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .fmt_fields(OneLineFields);
    if journal {
        Box::new(builder.with_ansi(false).event_format(StreamFormat::default()).finish())
    } else {
        Box::new(builder.with_ansi(ansi).finish())
    }
}

/// The fields of an event or a span as the default format writes them
/// (`message name=value name=value`), every control character in them
/// escaped ([`printable::line`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct OneLineFields;

impl<'a> MakeVisitor<Writer<'a>> for OneLineFields {
    type Visitor = OneLineVisitor<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> Self::Visitor {
        OneLineVisitor { writer: target, is_empty: true, result: Ok(()) }
    }
}

/// Writes the fields of one record for [`OneLineFields`].
#[derive(Debug)]
pub struct OneLineVisitor<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

/// A `fmt::Write` that escapes what goes through it.
struct Escaping<'w, 'a>(&'w mut Writer<'a>);

impl fmt::Write for Escaping<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write_str(&printable::line(s))
    }
}

/// An error's sources as the default format lists them: `[a, b]`.
struct Sources<'e>(&'e (dyn std::error::Error + 'static));

impl fmt::Display for Sources<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('[')?;
        let mut next = Some(self.0);
        let mut first = true;
        while let Some(e) = next {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{e}")?;
            next = e.source();
        }
        f.write_char(']')
    }
}

impl OneLineVisitor<'_> {
    fn field(&mut self, name: &str, value: &dyn fmt::Debug) -> fmt::Result {
        if !std::mem::take(&mut self.is_empty) {
            self.writer.write_char(' ')?;
        }
        if name != "message" {
            // Field names are the code's; italic and a dimmed `=` on a
            // terminal, as the default format has them.
            let name = name.strip_prefix("r#").unwrap_or(name);
            if self.writer.has_ansi_escapes() {
                write!(self.writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m")?;
            } else {
                write!(self.writer, "{name}=")?;
            }
        }
        write!(Escaping(&mut self.writer), "{value:?}")
    }
}

impl Visit for OneLineVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        match value.source() {
            Some(source) => self.record_debug(
                field,
                &format_args!("{value} {}.sources={}", field.name(), Sources(source)),
            ),
            None => self.record_debug(field, &format_args!("{value}")),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `log` records' metadata, already in the line's head.
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        self.result = self.field(field.name(), value);
    }
}

impl VisitOutput<fmt::Result> for OneLineVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for OneLineVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

/// The syslog priority of a level, as journald reads it from a `<N>`
/// prefix: error 3, warn 4, info 6, debug and trace 7.
#[must_use]
pub fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// The event format for the journal's stream: the priority prefix, then
/// the usual text without timestamp, level word or colours. Its fields
/// are formatted by the subscriber's field formatter: with
/// [`OneLineFields`] a record is one line.
#[derive(Debug)]
pub struct StreamFormat {
    text: Format<Full, ()>,
}

impl Default for StreamFormat {
    fn default() -> Self {
        Self { text: tracing_subscriber::fmt::format().without_time().with_level(false) }
    }
}

impl<S, N> FormatEvent<S, N> for StreamFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", priority(*event.metadata().level()))?;
        self.text.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What `subscriber` writes while `f` logs, as text.
    fn logged(journal: bool, ansi: bool, f: impl FnOnce()) -> String {
        let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = Arc::clone(&buf);
        let writer = move || Sink(Arc::clone(&sink));
        let subscriber = subscriber(EnvFilter::new("trace"), writer, journal, ansi);
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        text
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer\nline")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner\r\x1b[2J")]
    struct Inner;

    fn forge() {
        let dir = "bad\n<0>skill loader: registered subprocess skill \"fake\" from /x";
        tracing::warn!("skill loader: parse {dir}/skill.json: missing required field \"name\"");
        tracing::info!(entry = %"run\n<0>forged", path = ?"a\nb", "build \"x\"");
        tracing::error!(error = &Outer(Inner) as &(dyn std::error::Error + 'static), "failed");
        let span = tracing::info_span!("run", skill = %"s\n<0>span");
        span.in_scope(|| tracing::warn!("in\u{85}span\u{202e}"));
    }

    #[test]
    fn a_record_with_line_breaks_is_one_line_on_the_journal() {
        let text = logged(true, false, forge);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "<4>plumbing::log_line::tests: skill loader: parse bad\\n<0>skill loader: registered \
                 subprocess skill \"fake\" from /x/skill.json: missing required field \"name\"",
                "<6>plumbing::log_line::tests: build \"x\" entry=run\\n<0>forged path=\"a\\nb\"",
                "<3>plumbing::log_line::tests: failed error=outer\\nline \
                 error.sources=[inner\\r\\x1b[2J]",
                "<4>run{skill=s\\n<0>span}: plumbing::log_line::tests: in\\u{85}span\\u{202e}",
            ],
            "{text}"
        );
    }

    #[test]
    fn a_record_with_line_breaks_is_one_line_on_a_terminal() {
        for ansi in [false, true] {
            let text = logged(false, ansi, forge);
            assert_eq!(text.lines().count(), 4, "{text}");
            assert!(text.ends_with('\n'), "{text}");
            for line in text.lines() {
                // The format's own colours are the only escapes left.
                let plain = without_colours(line);
                assert!(!plain.chars().any(char::is_control), "{line:?}");
            }
        }
    }

    /// `line` without its SGR sequences (`ESC [ digits ; m`); any other
    /// escape stays.
    fn without_colours(line: &str) -> String {
        let mut out = String::new();
        let mut rest = line;
        while let Some(at) = rest.find('\x1b') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let params = after.strip_prefix('[').map(|p| {
                let n = p.find(|c: char| !c.is_ascii_digit() && c != ';').unwrap_or(p.len());
                (n, p[n..].starts_with('m'))
            });
            match params {
                Some((n, true)) => rest = &after[1 + n + 1..],
                _ => {
                    out.push('\x1b');
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn plain_text_is_written_as_the_default_format_writes_it() {
        let text = logged(true, false, || {
            tracing::info!(
                registered = 3,
                skill = "echo",
                "skill loader: registered subprocess skill \"echo\" from /skills/echo/skill.json"
            );
        });
        assert_eq!(
            text,
            "<6>plumbing::log_line::tests: skill loader: registered subprocess skill \"echo\" from \
             /skills/echo/skill.json registered=3 skill=\"echo\"\n"
        );
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
