//! Log lines for the journal when systemd runs the daemon.
//!
//! Under systemd, stderr is a stream to journald, which stamps each line
//! itself and reads its priority from a `<N>` prefix (`sd-daemon(3)`;
//! `SyslogLevelPrefix=yes`, the default). Without the prefix every line is
//! `info` and `journalctl -p warning` finds nothing; with our own
//! timestamp every line carries two. So when `$JOURNAL_STREAM` names
//! stderr's device and inode (`systemd.exec(5)`), lines are written as
//! `<4>target: message fields` (error 3, warn 4, info 6, debug and trace
//! 7); anywhere else they keep the usual text, with colours on a terminal.

use std::fmt;
use std::os::unix::fs::MetadataExt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Whether stderr is the journal's stream: `$JOURNAL_STREAM` is
/// `DEVICE:INODE` of it. Not inherited blindly: a child of a service
/// whose stderr goes elsewhere keeps the variable, not the stream.
#[must_use]
pub fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else { return false };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else { return false };
    use std::os::fd::AsFd;
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else { return false };
    std::fs::File::from(fd).metadata().is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// The syslog priority of a level, as journald reads it from a `<N>`
/// prefix.
#[must_use]
pub fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Prints one line to stderr, with `level`'s priority prefix when stderr
/// is the journal: for what is said outside the subscriber (a bad
/// configuration, the error a daemon exits with).
pub fn eprint(level: Level, line: &str) {
    if stderr_is_journal() {
        eprintln!("<{}>{line}", priority(level));
    } else {
        eprintln!("{line}");
    }
}

/// The event format for the journal's stream: the priority prefix, then
/// the usual text without timestamp, level word or colours.
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

/// Installs the global subscriber: `filter`, to stderr, in the journal's
/// format when stderr is the journal. Fails only when one is installed
/// already.
///
/// # Errors
///
/// A global subscriber was set before.
pub fn try_init(filter: EnvFilter) -> Result<(), tracing_subscriber::util::TryInitError> {
    use tracing_subscriber::util::SubscriberInitExt;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if stderr_is_journal() {
        builder.with_ansi(false).event_format(StreamFormat::default()).finish().try_init()
    } else {
        builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).finish().try_init()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_the_syslog_priorities_journald_reads() {
        assert_eq!(priority(Level::ERROR), 3);
        assert_eq!(priority(Level::WARN), 4);
        assert_eq!(priority(Level::INFO), 6);
        assert_eq!(priority(Level::DEBUG), 7);
        assert_eq!(priority(Level::TRACE), 7);
    }

    #[test]
    fn a_line_has_the_prefix_and_no_timestamp_or_level_word() {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = std::sync::Arc::clone(&buf);
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Sink(std::sync::Arc::clone(&sink)))
            .with_ansi(false)
            .event_format(StreamFormat::default())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(skill = "echo", "run refused");
            tracing::info!("skill loader: 3 skills registered");
        });
        let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "<4>loader::journald::tests: run refused skill=\"echo\"",
                "<6>loader::journald::tests: skill loader: 3 skills registered",
            ],
            "{text}"
        );
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

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
