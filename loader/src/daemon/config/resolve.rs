//! Resolving the file's values: flags over the file over the defaults,
//! each value checked and each name resolved, into [`Settings`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use policy::approval::{Approver, DEFAULT_MAX_TTL_SECONDS};

use super::error::value;
use super::{
    ApproverEntry, AuditSettings, CallerEntry, CallerRule, ConfigError, FileConfig, Overrides,
    Principal, Settings, DEFAULT_AUDIT_DB, DEFAULT_AUDIT_MAX_AGE_DAYS, DEFAULT_AUDIT_MAX_BYTES,
    DEFAULT_AUDIT_MAX_ROWS, DEFAULT_AUDIT_SYNC_INTERVAL_MS, DEFAULT_EXECUTOR_SOCKET,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_METRICS_LISTEN, DEFAULT_SKILLS_DIR, DEFAULT_SOCKET,
    MAX_APPROVAL_TTL_SECONDS, MAX_AUDIT_SYNC_INTERVAL_MS, MAX_DRAIN, MIN_AUDIT_MAX_BYTES,
};

/// The path of `key`: the command line's (`flag`), else the file's, else
/// `default`; it must be absolute.
fn absolute(
    key: &'static str,
    flag: &'static str,
    from_flag: Option<PathBuf>,
    from_file: Option<PathBuf>,
    default: PathBuf,
) -> Result<PathBuf, ConfigError> {
    let (path, flagged) = match (from_flag, from_file) {
        (Some(p), _) => (p, true),
        (None, Some(p)) => (p, false),
        (None, None) => (default, false),
    };
    if path.is_absolute() {
        return Ok(path);
    }
    let message = format!(
        "{path:?} is not an absolute path (a relative one would depend on the daemon's \
         working directory, / under systemd)"
    );
    Err(if flagged { ConfigError::Flag { flag, message } } else { value(key, message) })
}

impl FileConfig {
    /// Applies `overrides` and the defaults; `env_dirs` (the roots of
    /// `ONGRID_SKILLS_EXTERNAL_DIRS`) are appended to the roots.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Value`] (naming the file) for a bad mode, address or
    /// zero limit, [`ConfigError::Flag`] for a bad command-line value.
    pub fn resolve(
        self,
        overrides: Overrides,
        env_dirs: Vec<PathBuf>,
    ) -> Result<Settings, ConfigError> {
        let origin = self.origin.clone();
        self.resolve_values(overrides, env_dirs).map_err(|e| match e {
            ConfigError::Value { file: None, key, message } => {
                ConfigError::Value { file: origin, key, message }
            }
            e => e,
        })
    }

    /// The steps of [`FileConfig::resolve`], in the order their errors are
    /// reported: the sockets and listeners, the paths, the permission keys,
    /// the audit trail, then the limits.
    fn resolve_values(
        self,
        overrides: Overrides,
        env_dirs: Vec<PathBuf>,
    ) -> Result<Settings, ConfigError> {
        let socket_mode = socket_mode(self.socket_mode.as_deref())?;
        let metrics_listen = metrics_listen(overrides.metrics_listen, self.metrics_listen)?;
        // Every configured path is absolute: a relative one would depend on
        // the daemon's working directory (`/` under systemd). The roots of
        // ONGRID_SKILLS_EXTERNAL_DIRS are not checked here: the scan skips
        // a relative one with its log line.
        let socket =
            absolute("socket", "--socket", overrides.socket, self.socket, DEFAULT_SOCKET.into())?;
        let executor_socket = absolute(
            "executor_socket",
            "--executor-socket",
            overrides.executor_socket,
            self.executor_socket,
            DEFAULT_EXECUTOR_SOCKET.into(),
        )?;
        let mut skills_dirs = skills_dirs(overrides.skills_dirs, self.skills_dirs)?;
        skills_dirs.extend(env_dirs);
        let audit_db = absolute(
            "audit_db",
            "the audit database",
            overrides.audit_db,
            self.audit_db,
            DEFAULT_AUDIT_DB.into(),
        )?;
        let approval_max_ttl = approval_max_ttl(self.approval_max_ttl_seconds)?;
        let socket_group = self
            .socket_group
            .as_deref()
            .map(|g| resolve_group(g).map_err(|m| value("socket_group", m)))
            .transpose()?;
        let callers = self
            .callers
            .unwrap_or_default()
            .into_iter()
            .map(CallerEntry::resolve)
            .collect::<Result<Vec<_>, _>>()?;
        let approvers = approvers(self.approvers.unwrap_or_default())?;
        let audit = AuditSettings {
            db: audit_db,
            required: self.audit_required.unwrap_or(true),
            max_rows: self.audit_max_rows.unwrap_or(DEFAULT_AUDIT_MAX_ROWS),
            max_age_days: self.audit_max_age_days.unwrap_or(DEFAULT_AUDIT_MAX_AGE_DAYS),
            max_bytes: audit_max_bytes(self.audit_max_bytes)?,
            synchronous: self.audit_synchronous.unwrap_or_default(),
            sync_interval: audit_sync_interval(self.audit_sync_interval_ms)?,
        };
        Ok(Settings {
            socket_group,
            callers,
            approvers,
            approval_max_ttl,
            audit,
            socket,
            socket_mode,
            executor_socket,
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
            header_timeout: seconds("header_timeout_seconds", self.header_timeout_seconds, 10)?,
            idle_timeout: seconds("idle_timeout_seconds", self.idle_timeout_seconds, 60)?,
            drain_timeout: seconds(
                "drain_timeout_seconds",
                self.drain_timeout_seconds,
                MAX_DRAIN.as_secs(),
            )?,
        })
    }
}

/// `socket_mode`: an octal mode (`"0660"`, `"0o660"`), 0660 by default.
fn socket_mode(mode: Option<&str>) -> Result<u32, ConfigError> {
    match mode {
        None => Ok(0o660),
        Some(s) => u32::from_str_radix(s.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| {
                value("socket_mode", format!("{s:?} is not an octal mode like \"0660\""))
            }),
    }
}

/// `--metrics-listen`, else `metrics_listen`, else the default; empty
/// turns the listener off.
fn metrics_listen(
    flag: Option<String>,
    file: Option<String>,
) -> Result<Option<SocketAddr>, ConfigError> {
    let flagged = flag.is_some();
    let metrics = flag.or(file).unwrap_or_else(|| DEFAULT_METRICS_LISTEN.to_owned());
    if metrics.trim().is_empty() {
        return Ok(None);
    }
    let addr = metrics.trim().parse::<SocketAddr>().map_err(|e| {
        let message = format!("{metrics:?}: {e}");
        if flagged {
            ConfigError::Flag { flag: "--metrics-listen", message }
        } else {
            value("metrics_listen", message)
        }
    })?;
    Ok(Some(addr))
}

/// The `--skills-dir` flags, else `skills_dirs`, else the default; each
/// one absolute.
fn skills_dirs(
    flags: Vec<PathBuf>,
    file: Option<Vec<PathBuf>>,
) -> Result<Vec<PathBuf>, ConfigError> {
    if flags.is_empty() {
        let dirs = file.unwrap_or_else(|| vec![PathBuf::from(DEFAULT_SKILLS_DIR)]);
        for dir in &dirs {
            absolute("skills_dirs", "", None, Some(dir.clone()), PathBuf::new())?;
        }
        return Ok(dirs);
    }
    for dir in &flags {
        absolute("skills_dirs", "--skills-dir", Some(dir.clone()), None, PathBuf::new())?;
    }
    Ok(flags)
}

/// `approval_max_ttl_seconds`, within 1..=[`MAX_APPROVAL_TTL_SECONDS`].
fn approval_max_ttl(seconds: Option<u64>) -> Result<u64, ConfigError> {
    match seconds {
        None => Ok(DEFAULT_MAX_TTL_SECONDS),
        Some(n) if (1..=MAX_APPROVAL_TTL_SECONDS).contains(&n) => Ok(n),
        Some(n) => Err(value(
            "approval_max_ttl_seconds",
            format!("{n} is not within 1..={MAX_APPROVAL_TTL_SECONDS}"),
        )),
    }
}

/// The `[[approvers]]`, each key valid, no two sharing a name or a key.
fn approvers(entries: Vec<ApproverEntry>) -> Result<Vec<Approver>, ConfigError> {
    let mut approvers: Vec<Approver> = Vec::new();
    for a in entries {
        let approver = Approver::new(&a.name, &a.public_key)
            .map_err(|e| value("approvers", format!("approver {:?}: public_key: {e}", a.name)))?;
        if let Some(dup) = approvers
            .iter()
            .find(|p| p.key_id() == approver.key_id() || p.name() == approver.name())
        {
            return Err(value(
                "approvers",
                format!(
                    "approvers {:?} and {:?} share a name or a key: each approver needs its own",
                    dup.name(),
                    a.name
                ),
            ));
        }
        approvers.push(approver);
    }
    Ok(approvers)
}

/// `audit_max_bytes`: 0 (no size cap) or at least [`MIN_AUDIT_MAX_BYTES`].
fn audit_max_bytes(bytes: Option<u64>) -> Result<u64, ConfigError> {
    match bytes {
        None => Ok(DEFAULT_AUDIT_MAX_BYTES),
        Some(n) if n == 0 || n >= MIN_AUDIT_MAX_BYTES => Ok(n),
        Some(n) => Err(value(
            "audit_max_bytes",
            format!("{n} is below {MIN_AUDIT_MAX_BYTES} (0: no size cap)"),
        )),
    }
}

/// `audit_sync_interval_ms`, within 1..=[`MAX_AUDIT_SYNC_INTERVAL_MS`].
fn audit_sync_interval(ms: Option<u64>) -> Result<Duration, ConfigError> {
    match ms {
        None => Ok(Duration::from_millis(DEFAULT_AUDIT_SYNC_INTERVAL_MS)),
        Some(n) if (1..=MAX_AUDIT_SYNC_INTERVAL_MS).contains(&n) => Ok(Duration::from_millis(n)),
        Some(n) => Err(value(
            "audit_sync_interval_ms",
            format!("{n} is not within 1..={MAX_AUDIT_SYNC_INTERVAL_MS}"),
        )),
    }
}

/// A count `key`: at least 1, `default` when not given.
fn positive(key: &'static str, v: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match v {
        Some(0) => Err(value(key, "must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(default),
    }
}

/// A duration `key` in seconds: at least 1, `default` when not given.
fn seconds(key: &'static str, v: Option<u64>, default: u64) -> Result<Duration, ConfigError> {
    match v {
        Some(0) => Err(value(key, "must be at least 1")),
        Some(n) => Ok(Duration::from_secs(n)),
        None => Ok(Duration::from_secs(default)),
    }
}

impl CallerEntry {
    /// Resolves the user or group name.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Value`] unless exactly one of `uid`, `user`, `gid`,
    /// `group` is given, or when a name does not exist.
    pub fn resolve(self) -> Result<CallerRule, ConfigError> {
        let role = &self.role;
        let bad = |m: String| value("callers", format!("caller with role {role:?}: {m}"));
        let who = match (self.uid, self.user.as_deref(), self.gid, self.group.as_deref()) {
            (Some(uid), None, None, None) => Principal::Uid(uid),
            (None, Some(user), None, None) => Principal::Uid(resolve_user(user).map_err(bad)?),
            (None, None, Some(gid), None) => Principal::Gid(gid),
            (None, None, None, Some(group)) => Principal::Gid(resolve_group(group).map_err(bad)?),
            _ => return Err(bad("give exactly one of uid, user, gid, group".into())),
        };
        Ok(CallerRule { who, role: self.role, mode: self.mode, audit: self.audit })
    }
}

/// A user name's uid, or what is wrong.
fn resolve_user(name: &str) -> Result<u32, String> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => Err(format!("no user named {name:?}")),
        Err(e) => Err(format!("looking up user {name:?}: {e}")),
    }
}

/// A group name or number's gid, or what is wrong.
fn resolve_group(name: &str) -> Result<u32, String> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(name) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!("no group named {name:?}")),
        Err(e) => Err(format!("looking up group {name:?}: {e}")),
    }
}
