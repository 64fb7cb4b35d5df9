//! `skilld.toml`: the daemon's configuration, parsed once at start-up.
//!
//! Every key is optional; unknown keys are an error (typos must not pass
//! silently). Precedence: command-line flag > file > built-in default. The
//! allow-list roots are the file's `skills_dirs` (or the default
//! `/etc/ongrid/skills`) followed by `ONGRID_SKILLS_EXTERNAL_DIRS`.
//!
//! ```toml
//! socket = "/run/ongrid/skilld.sock"
//! socket_mode = "0660"
//! executor_socket = "/run/ongrid/executor.sock"
//! skills_dirs = ["/etc/ongrid/skills"]
//! metrics_listen = "127.0.0.1:9464"   # "" disables the listener
//! max_body_bytes = 1048576
//! max_connections = 256
//! max_concurrent_runs = 64
//! queue_timeout_seconds = 10
//! request_timeout_seconds = 30
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Where the daemon looks for its file when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ongrid/skilld.toml";
/// The client API socket.
pub const DEFAULT_SOCKET: &str = "/run/ongrid/skilld.sock";
/// The executor's socket.
pub const DEFAULT_EXECUTOR_SOCKET: &str = "/run/ongrid/executor.sock";
/// The packaged skills directory.
pub const DEFAULT_SKILLS_DIR: &str = "/etc/ongrid/skills";
/// The Prometheus listener.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
/// Largest request body accepted (DESIGN.md §5: over 1 MiB is 413).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// The file as written, every key optional.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Client API socket path.
    pub socket: Option<PathBuf>,
    /// Octal mode of the client socket, e.g. `"0660"`.
    pub socket_mode: Option<String>,
    /// The executor's socket path.
    pub executor_socket: Option<PathBuf>,
    /// Allow-list roots, in priority order.
    pub skills_dirs: Option<Vec<PathBuf>>,
    /// `ADDR:PORT` of the metrics listener; empty disables it.
    pub metrics_listen: Option<String>,
    /// Largest request body in bytes.
    pub max_body_bytes: Option<usize>,
    /// Client connections served at once; more wait in the kernel backlog.
    pub max_connections: Option<usize>,
    /// Runs forwarded to the executor at once; more queue.
    pub max_concurrent_runs: Option<usize>,
    /// How long a run may queue for a slot before it is answered `busy`.
    pub queue_timeout_seconds: Option<u64>,
    /// How long a client may take to send its request head and body.
    pub request_timeout_seconds: Option<u64>,
}

/// Command-line overrides, `None` when the flag was not given.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--socket`.
    pub socket: Option<PathBuf>,
    /// `--executor-socket`.
    pub executor_socket: Option<PathBuf>,
    /// `--metrics-listen` (empty disables).
    pub metrics_listen: Option<String>,
    /// `--skills-dir`, repeatable: replaces the file's `skills_dirs`.
    pub skills_dirs: Vec<PathBuf>,
}

/// The resolved configuration the daemon runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Client API socket path.
    pub socket: PathBuf,
    /// Mode of the client socket file.
    pub socket_mode: u32,
    /// The executor's socket path.
    pub executor_socket: PathBuf,
    /// Allow-list roots, in priority order (configured, then the env var).
    pub skills_dirs: Vec<PathBuf>,
    /// Metrics listener, `None` when disabled.
    pub metrics_listen: Option<SocketAddr>,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// Client connections served at once.
    pub max_connections: usize,
    /// Runs forwarded to the executor at once.
    pub max_concurrent_runs: usize,
    /// How long a run may wait for a slot.
    pub queue_timeout: Duration,
    /// How long a client may take to send its request.
    pub request_timeout: Duration,
}

/// Why the configuration is not usable. The daemon exits 78 (EX_CONFIG).
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
    /// A value is out of range.
    #[error("{key}: {message}")]
    Value {
        /// The key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl FileConfig {
    /// Parses the TOML text of `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Parse`] for bad TOML, unknown keys or wrong types.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })
    }

    /// Reads `path`; when `path` is `None`, reads [`DEFAULT_CONFIG_PATH`]
    /// if it exists and uses the defaults otherwise.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when the file cannot be read or parsed.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let (path, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text, &path),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    /// Applies `overrides` and the defaults; `env_dirs` (the roots of
    /// `ONGRID_SKILLS_EXTERNAL_DIRS`) are appended to the roots.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Value`] for a bad mode, address or zero limit.
    pub fn resolve(
        self,
        overrides: Overrides,
        env_dirs: Vec<PathBuf>,
    ) -> Result<Settings, ConfigError> {
        let socket_mode = match &self.socket_mode {
            None => 0o660,
            Some(s) => u32::from_str_radix(s.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o777)
                .ok_or_else(|| ConfigError::Value {
                    key: "socket_mode",
                    message: format!("{s:?} is not an octal mode like \"0660\""),
                })?,
        };
        let metrics = overrides
            .metrics_listen
            .or(self.metrics_listen)
            .unwrap_or_else(|| DEFAULT_METRICS_LISTEN.to_owned());
        let metrics_listen = if metrics.trim().is_empty() {
            None
        } else {
            Some(metrics.trim().parse::<SocketAddr>().map_err(|e| ConfigError::Value {
                key: "metrics_listen",
                message: format!("{metrics:?}: {e}"),
            })?)
        };
        let mut skills_dirs = if overrides.skills_dirs.is_empty() {
            self.skills_dirs.unwrap_or_else(|| vec![PathBuf::from(DEFAULT_SKILLS_DIR)])
        } else {
            overrides.skills_dirs
        };
        skills_dirs.extend(env_dirs);
        let positive = |key: &'static str, v: Option<usize>, default: usize| match v {
            Some(0) => Err(ConfigError::Value { key, message: "must be at least 1".into() }),
            Some(n) => Ok(n),
            None => Ok(default),
        };
        let seconds = |key: &'static str, v: Option<u64>, default: u64| match v {
            Some(0) => Err(ConfigError::Value { key, message: "must be at least 1".into() }),
            Some(n) => Ok(Duration::from_secs(n)),
            None => Ok(Duration::from_secs(default)),
        };
        Ok(Settings {
            socket: overrides.socket.or(self.socket).unwrap_or_else(|| DEFAULT_SOCKET.into()),
            socket_mode,
            executor_socket: overrides
                .executor_socket
                .or(self.executor_socket)
                .unwrap_or_else(|| DEFAULT_EXECUTOR_SOCKET.into()),
            skills_dirs,
            metrics_listen,
            max_body_bytes: positive(
                "max_body_bytes",
                self.max_body_bytes,
                DEFAULT_MAX_BODY_BYTES,
            )?,
            max_connections: positive("max_connections", self.max_connections, 256)?,
            max_concurrent_runs: positive("max_concurrent_runs", self.max_concurrent_runs, 64)?,
            queue_timeout: seconds("queue_timeout_seconds", self.queue_timeout_seconds, 10)?,
            request_timeout: seconds("request_timeout_seconds", self.request_timeout_seconds, 30)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        FileConfig::parse(text, Path::new("/etc/ongrid/skilld.toml"))
    }

    #[test]
    fn empty_file_gives_the_defaults() {
        let s = parse("").unwrap().resolve(Overrides::default(), vec![]).unwrap();
        assert_eq!(s.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(s.socket_mode, 0o660);
        assert_eq!(s.executor_socket, PathBuf::from(DEFAULT_EXECUTOR_SOCKET));
        assert_eq!(s.skills_dirs, [PathBuf::from(DEFAULT_SKILLS_DIR)]);
        assert_eq!(s.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(s.max_body_bytes, 1 << 20);
        assert_eq!(s.max_connections, 256);
    }

    #[test]
    fn every_key_parses_and_flags_win() {
        let f = parse(
            r#"socket = "/a.sock"
               socket_mode = "0600"
               executor_socket = "/e.sock"
               skills_dirs = ["/s1", "/s2"]
               metrics_listen = "127.0.0.1:1"
               max_body_bytes = 10
               max_connections = 2
               max_concurrent_runs = 3
               queue_timeout_seconds = 4
               request_timeout_seconds = 5"#,
        )
        .unwrap();
        let s = f.clone().resolve(Overrides::default(), vec![PathBuf::from("/env")]).unwrap();
        assert_eq!(s.socket, PathBuf::from("/a.sock"));
        assert_eq!(s.socket_mode, 0o600);
        assert_eq!(s.skills_dirs, [PathBuf::from("/s1"), "/s2".into(), "/env".into()]);
        assert_eq!(s.max_concurrent_runs, 3);
        assert_eq!(s.queue_timeout, Duration::from_secs(4));
        assert_eq!(s.request_timeout, Duration::from_secs(5));
        let o = Overrides {
            socket: Some("/b.sock".into()),
            executor_socket: Some("/f.sock".into()),
            metrics_listen: Some(String::new()),
            skills_dirs: vec!["/cli".into()],
        };
        let s = f.resolve(o, vec![]).unwrap();
        assert_eq!(s.socket, PathBuf::from("/b.sock"));
        assert_eq!(s.executor_socket, PathBuf::from("/f.sock"));
        assert_eq!(s.metrics_listen, None);
        assert_eq!(s.skills_dirs, [PathBuf::from("/cli")]);
    }

    #[test]
    fn bad_files_and_values_are_errors() {
        for text in ["sockett = \"/x\"", "max_connections = \"many\"", "socket = ", "[x]\na=1"] {
            assert!(matches!(parse(text), Err(ConfigError::Parse { .. })), "{text}");
        }
        for text in [
            "socket_mode = \"rw\"",
            "socket_mode = \"7777\"",
            "metrics_listen = \"localhost\"",
            "max_body_bytes = 0",
            "queue_timeout_seconds = 0",
        ] {
            let r = parse(text).unwrap().resolve(Overrides::default(), vec![]);
            assert!(matches!(r, Err(ConfigError::Value { .. })), "{text}");
        }
    }

    #[test]
    fn missing_default_file_is_fine_but_missing_given_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let r = FileConfig::load(Some(&dir.path().join("nope.toml")));
        assert!(matches!(r, Err(ConfigError::Read { .. })));
    }
}
