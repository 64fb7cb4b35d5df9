//! Log lines for the journal, for both daemons: when systemd runs a
//! daemon, its stderr is a stream to journald, which stamps each line
//! itself and reads its priority from a `<N>` prefix (`sd-daemon(3)`;
//! `SyslogLevelPrefix=yes`, the default). Without the prefix every line is
//! `info` and `journalctl -p warning` finds nothing; with the daemon's own
//! timestamp every line carries two.
//!
//! So when `$JOURNAL_STREAM` names stderr, lines are written as
//! `<4>target: message fields`, without timestamp ([`StreamFormat`]);
//! anywhere else they keep the usual text, with colours on a terminal.
//! Either way a record is one line, its control characters escaped
//! ([`crate::log_line`]), so that no pack text can start a line with a
//! `<N>` of its own.

use std::ffi::OsStr;

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use policy::printable;
use tracing::Level;
use tracing_subscriber::EnvFilter;

/// Whether `$JOURNAL_STREAM` (`journal_stream`, `DEVICE:INODE`,
/// `systemd.exec(5)`) names the file whose device and inode are given:
/// stderr's, for a daemon whose stderr is the journal. A child of a
/// service whose stderr goes elsewhere keeps the variable, not the stream.
#[must_use]
pub fn names_stream(journal_stream: Option<&OsStr>, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = journal_stream.and_then(OsStr::to_str).and_then(|v| v.split_once(':'))
    else {
        return false;
    };
    d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino)
}

pub use crate::log_line::{priority, StreamFormat};

/// Whether stderr is the journal's stream.
#[must_use]
pub fn stderr_is_journal() -> bool {
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else { return false };
    let Ok(meta) = std::fs::File::from(fd).metadata() else { return false };
    names_stream(std::env::var_os("JOURNAL_STREAM").as_deref(), meta.dev(), meta.ino())
}

/// Prints one record to stderr, with `level`'s priority prefix when stderr
/// is the journal: for what is said outside the subscriber (a bad
/// configuration, the error a daemon exits with). Its control characters
/// are escaped, as in every log line, so it is one line; but on a
/// terminal, where a person reads it and no log is written, its line
/// breaks are kept (a TOML error's pointer under the bad line).
pub fn eprint(level: Level, record: &str) {
    if stderr_is_journal() {
        eprintln!("<{}>{}", priority(level), printable::line(record));
    } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        for line in printable::lines(record) {
            eprintln!("{line}");
        }
    } else {
        eprintln!("{}", printable::line(record));
    }
}

/// Installs the global subscriber ([`crate::log_line::subscriber`]):
/// `filter`, to stderr, in the journal's format when stderr is the
/// journal.
///
/// # Errors
///
/// A global subscriber was set before.
pub fn try_init(filter: EnvFilter) -> Result<(), tracing_subscriber::util::TryInitError> {
    use tracing_subscriber::util::SubscriberInitExt;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    crate::log_line::subscriber(filter, std::io::stderr, stderr_is_journal(), ansi).try_init()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn the_stream_is_named_by_device_and_inode() {
        fn v(s: &str) -> Option<&OsStr> {
            Some(OsStr::new(s))
        }
        assert!(names_stream(v("64:12345"), 64, 12345));
        assert!(!names_stream(v("64:12346"), 64, 12345));
        assert!(!names_stream(v("65:12345"), 64, 12345));
        assert!(!names_stream(v("64"), 64, 12345));
        assert!(!names_stream(v("x:12345"), 64, 12345));
        assert!(!names_stream(None, 64, 12345));
    }

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
        let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = Arc::clone(&buf);
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Sink(Arc::clone(&sink)))
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
                "<4>plumbing::journald::tests: run refused skill=\"echo\"",
                "<6>plumbing::journald::tests: skill loader: 3 skills registered",
            ],
            "{text}"
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
