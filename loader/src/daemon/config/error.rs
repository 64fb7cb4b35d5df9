//! Why `skilld.toml` (or a flag) is not usable.

use std::path::{Path, PathBuf};

/// Why the configuration is not usable. The daemon exits 78 (EX_CONFIG).
/// Each names the file (when there is one) and the key or flag; print it
/// with its sources (the OS error of [`ConfigError::Read`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys or wrong types.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A value of the file (or a default) is out of range.
    #[error("{}{key}: {message}", in_file(.file.as_deref()))]
    Value {
        /// The file the value is from; `None` without a file.
        file: Option<PathBuf>,
        /// The key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A command-line value is out of range.
    #[error("{flag}: {message}")]
    Flag {
        /// The flag, e.g. `--metrics-listen`.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
}

fn in_file(file: Option<&Path>) -> String {
    file.map(|f| format!("{}: ", f.display())).unwrap_or_default()
}
/// A [`ConfigError::Value`] of `key`, its file filled in by
/// [`FileConfig::resolve`](super::FileConfig::resolve).
pub(super) fn value(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Value { file: None, key, message: message.into() }
}
