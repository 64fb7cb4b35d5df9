//! Log lines for the journal when systemd runs the daemon: when
//! `$JOURNAL_STREAM` names stderr, lines are written as
//! `<4>target: message fields` without timestamp
//! ([`policy::journald`]); anywhere else they keep the usual text, with
//! colours on a terminal. Either way a record is one line, its control
//! characters escaped ([`policy::log_line`]).

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use policy::journald::{names_stream, priority};
use policy::printable;
use tracing::Level;
use tracing_subscriber::EnvFilter;

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

/// Installs the global subscriber ([`policy::log_line::subscriber`]):
/// `filter`, to stderr, in the journal's format when stderr is the
/// journal.
///
/// # Errors
///
/// A global subscriber was set before.
pub fn try_init(filter: EnvFilter) -> Result<(), tracing_subscriber::util::TryInitError> {
    use tracing_subscriber::util::SubscriberInitExt;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    policy::log_line::subscriber(filter, std::io::stderr, stderr_is_journal(), ansi).try_init()
}
