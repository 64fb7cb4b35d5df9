//! An error with its causes, as one line: `outer: middle: inner`. Both
//! daemons and the CLI say a failure this way where a person reads it (an
//! answer's message, a start-up failure), since `Display` alone shows the
//! outermost layer only and `{:#}` is `anyhow`'s, which the libraries do not
//! use.

use std::error::Error;
use std::fmt;

/// The error and its sources, `: `-separated.
#[must_use]
pub fn chain(e: &dyn Error) -> String {
    Chain(e).to_string()
}

/// Displays an error and its sources, `: `-separated, without building a
/// `String` first (for `format!` and `tracing` fields).
#[derive(Debug, Clone, Copy)]
pub struct Chain<'e>(pub &'e dyn Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot reach the executor")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("connect /run/ongrid/executor.sock")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn every_source_follows_its_error() {
        let e = Outer(Middle(std::io::Error::from(std::io::ErrorKind::NotFound)));
        assert_eq!(
            chain(&e),
            "cannot reach the executor: connect /run/ongrid/executor.sock: entity not found"
        );
        assert_eq!(format!("[{}]", Chain(&e)), format!("[{}]", chain(&e)));
    }

    #[test]
    fn an_error_without_a_source_is_its_own_text() {
        let e = std::io::Error::other("plain");
        assert_eq!(chain(&e), "plain");
    }
}
