//! The SQL of the audit trail: the schema, opening (WAL) and retention,
//! and each statement a job runs.

use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::rows::{
    now_ms, Entry, Finish, Query, Record, ERROR_MAX_BYTES, FIELD_MAX_BYTES, MAX_QUERY_ROWS,
    REFUSED_ARGS_MAX_BYTES,
};
use super::words::INTERRUPTED;
use crate::daemon::config::AuditSettings;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT,
    skill TEXT NOT NULL,
    class TEXT NOT NULL,
    caller_uid INTEGER NOT NULL,
    caller_pid INTEGER,
    role TEXT NOT NULL,
    mode TEXT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT NOT NULL,
    approvers TEXT NOT NULL,
    args TEXT,
    args_truncated INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    result_truncated INTEGER NOT NULL DEFAULT 0,
    outcome TEXT,
    error TEXT,
    exit_code INTEGER,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    duration_ms INTEGER,
    network_denied INTEGER
);
CREATE INDEX IF NOT EXISTS audit_started ON audit (started_at);
CREATE INDEX IF NOT EXISTS audit_skill ON audit (skill, id);
CREATE INDEX IF NOT EXISTS audit_refused ON audit (id) WHERE decision != 'allow';
CREATE INDEX IF NOT EXISTS audit_safe ON audit (id) WHERE decision = 'allow' AND class = 'safe';
CREATE TABLE IF NOT EXISTS used_approvals (
    approval TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    audit_id INTEGER NOT NULL
);
";

/// The schema version this build writes; [`migrate`] brings an older
/// database (kept across upgrades) to it.
const USER_VERSION: i64 = 2;

/// Adds what later versions added to the `audit` table of a database an
/// earlier version made: `network_denied` (version 2).
fn migrate(db: &Connection) -> rusqlite::Result<()> {
    let version: i64 = db.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version >= USER_VERSION {
        return Ok(());
    }
    let has = db
        .prepare("SELECT 1 FROM pragma_table_info('audit') WHERE name = 'network_denied'")?
        .exists([])?;
    if !has {
        db.execute_batch("ALTER TABLE audit ADD COLUMN network_denied INTEGER")?;
        tracing::info!(version = USER_VERSION, "audit: database schema upgraded");
    }
    db.pragma_update(None, "user_version", USER_VERSION)
}

/// Runs a statement without parameters, prepared once per connection.
pub(super) fn run_cached(db: &Connection, sql: &str) -> rusqlite::Result<()> {
    db.prepare_cached(sql)?.execute([]).map(drop)
}

#[derive(Debug)]
pub(super) enum WriteError {
    Replayed(String),
    /// The row to complete is not there.
    Lost(i64),
    Sql(rusqlite::Error),
    /// The journal could not be read, or the database synced.
    Io(std::io::Error),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Replayed(key_id) => write!(f, "approval {key_id} was already used"),
            WriteError::Lost(id) => write!(f, "row {id} is missing"),
            WriteError::Sql(e) => e.fmt(f),
            WriteError::Io(e) => e.fmt(f),
        }
    }
}

impl From<rusqlite::Error> for WriteError {
    fn from(e: rusqlite::Error) -> Self {
        WriteError::Sql(e)
    }
}

/// The audit database's mode: the rows hold every caller's args and
/// results, so only skilld's user (and root) read them; `GET /v1/audit`
/// serves the rest, to root and `audit = true` callers. Not the group:
/// skilld's group, `ongrid`, is its clients'. SQLite gives its `-wal` and
/// `-shm` files the database's mode.
const DB_MODE: u32 = 0o600;

pub(super) fn open(settings: &AuditSettings) -> rusqlite::Result<Connection> {
    use std::os::unix::fs::OpenOptionsExt;
    // Made here rather than by SQLite, which would use 0644 and the
    // umask. A failure is left to `Connection::open` to report.
    let made =
        std::fs::OpenOptions::new().append(true).create(true).mode(DB_MODE).open(&settings.db);
    if made.is_ok() {
        restrict_modes(&settings.db);
    }
    let mut db = Connection::open(&settings.db)?;
    db.busy_timeout(std::time::Duration::from_secs(5))?;
    // WAL: readers (ongrid-skill audit --db, sqlite3) never block the
    // daemon; `synchronous` NORMAL in every mode: SQLite syncs at
    // checkpoints, the commits are synced by the audit thread as the mode
    // asks (module docs).
    let mode: String = db.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(mode, "audit: the database is not in WAL mode");
    }
    db.pragma_update(None, "synchronous", settings.synchronous.pragma())?;
    db.execute_batch(SCHEMA)?;
    migrate(&db)?;
    prune(&mut db, settings)?;
    tracing::info!(path = %settings.db.display(), "audit: database open");
    Ok(db)
}

/// Takes group and world access away from the database and its `-wal`
/// and `-shm` files where an earlier version (or SQLite) left it: the
/// packaged database was 0640 with group `ongrid`, the API clients'.
fn restrict_modes(db: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let path = std::path::PathBuf::from(name);
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 == 0 {
            continue;
        }
        let tight = std::fs::Permissions::from_mode(mode & 0o700);
        match std::fs::set_permissions(&path, tight) {
            Ok(()) => tracing::warn!(
                path = %path.display(),
                was = format_args!("{mode:o}"),
                now = format_args!("{:o}", mode & 0o700),
                "audit: group and other users could read the audit rows; access taken away"
            ),
            Err(e) => tracing::warn!(
                path = %path.display(),
                mode = format_args!("{mode:o}"),
                error = %e,
                "audit: group or other users may read the audit rows, and the mode cannot be \
                 changed"
            ),
        }
    }
}

pub(super) fn prune(db: &mut Connection, settings: &AuditSettings) -> rusqlite::Result<()> {
    // Immediate: the write lock is taken (waiting out the busy timeout)
    // before the first read. A deferred transaction that reads, then
    // writes, fails at once with "database is locked" when another
    // connection wrote in between (a closing daemon's checkpoint).
    let tx = db.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    if settings.max_rows > 0 {
        let keep = i64::try_from(settings.max_rows).unwrap_or(i64::MAX);
        let rows: i64 = tx.query_row("SELECT count(*) FROM audit", [], |r| r.get(0))?;
        let mut excess = rows.saturating_sub(keep);
        for sql in OLDEST_BY_TIER {
            if excess <= 0 {
                break;
            }
            let stale = open_before();
            excess -= i64::try_from(tx.execute(sql, params![excess, stale])?).unwrap_or(i64::MAX);
        }
    }
    if settings.max_age_days > 0 {
        let age_ms =
            i64::try_from(settings.max_age_days.saturating_mul(86_400_000)).unwrap_or(i64::MAX);
        tx.execute(
            "DELETE FROM audit WHERE started_at < ?1",
            params![now_ms().saturating_sub(age_ms)],
        )?;
    }
    if settings.max_bytes > 0 {
        shrink_to(&tx, settings.max_bytes)?;
    }
    let forget = forget_before();
    tx.execute("DELETE FROM used_approvals WHERE expires_at < ?1", params![forget])?;
    tx.commit()
}

/// Bytes of the database's pages in use (free pages, which new rows reuse,
/// not counted).
pub(super) fn used_bytes(db: &Connection) -> rusqlite::Result<u64> {
    let pragma = |name: &str| db.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0));
    let pages = pragma("page_count")?.saturating_sub(pragma("freelist_count")?);
    Ok(u64::try_from(pages.saturating_mul(pragma("page_size")?)).unwrap_or(0))
}

/// Retention's order: the oldest `?1` rows of a tier, the first tier with
/// any row first. Refusals, then allowed `safe` runs (any caller may make
/// those, unmapped ones included), then the rest: a flood of requests by a
/// caller who may run nothing more pushes out its own kind of row before
/// any `mutating` or `dangerous` run's (it erased a dual-signed run's row
/// in 250 requests at `audit_max_rows = 100`). A run in flight (allowed,
/// no outcome yet, started after `?2`) keeps its row: its completion
/// updates it; one started before `?2` ([`STALE_OPEN_MS`] ago) is no
/// longer in flight (its completion was lost). The first two tiers read
/// their partial indexes (`audit_refused`, `audit_safe`), so a prune at
/// the cap does not scan the table.
const OLDEST_BY_TIER: [&str; 3] = [
    "DELETE FROM audit WHERE id IN
         (SELECT id FROM audit WHERE decision != 'allow'
             AND (outcome IS NOT NULL OR started_at < ?2) ORDER BY id LIMIT ?1)",
    "DELETE FROM audit WHERE id IN
         (SELECT id FROM audit WHERE decision = 'allow' AND class = 'safe'
             AND (outcome IS NOT NULL OR started_at < ?2) ORDER BY id LIMIT ?1)",
    "DELETE FROM audit WHERE id IN
         (SELECT id FROM audit WHERE decision != 'allow' OR outcome IS NOT NULL
             OR started_at < ?2 ORDER BY id LIMIT ?1)",
];

/// How long after its start a row with no outcome counts as a run still
/// in flight for retention: two days, past any run's queue and timeout
/// (the executor's `max_timeout_seconds` is at most a day).
const STALE_OPEN_MS: i64 = 2 * 86_400_000;

/// Rows with no outcome started before this (unix ms) are no run in flight.
fn open_before() -> i64 {
    now_ms().saturating_sub(STALE_OPEN_MS)
}

/// Used approvals that expired before this (unix s) are forgotten
/// ([`crate::daemon::replay::FORGET_AFTER`]).
fn forget_before() -> i64 {
    (now_ms() / 1000).saturating_sub(crate::daemon::replay::FORGET_AFTER as i64)
}

/// Deletes the oldest rows while the pages in use exceed `max_bytes`, each
/// time the share of the rows that the excess is of the pages in use, in
/// [`OLDEST_BY_TIER`]'s order: the file stops growing there, whatever each
/// row holds. Stops when no row is left to delete.
fn shrink_to(db: &Connection, max_bytes: u64) -> rusqlite::Result<()> {
    loop {
        let used = used_bytes(db)?;
        if used <= max_bytes {
            break;
        }
        let rows: i64 = db.query_row("SELECT count(*) FROM audit", [], |r| r.get(0))?;
        let share = (used - max_bytes) as f64 / used as f64;
        #[allow(clippy::cast_possible_truncation)] // at most `rows`
        let batch = ((rows as f64 * share).ceil() as i64).max(1);
        let mut gone = 0;
        for sql in OLDEST_BY_TIER {
            gone = db.execute(sql, params![batch, open_before()])?;
            if gone > 0 {
                break;
            }
        }
        if gone == 0 {
            break;
        }
        tracing::warn!(
            rows = gone,
            max_bytes,
            "audit: oldest rows deleted to stay under audit_max_bytes"
        );
    }
    Ok(())
}

/// A decision's row as inserted: what a journal line holds and what the
/// statement binds, its id and times fixed when the decision was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Row {
    pub(super) id: i64,
    pub(super) session_id: Option<String>,
    pub(super) skill: String,
    pub(super) class: String,
    pub(super) caller_uid: u32,
    pub(super) caller_pid: Option<i32>,
    pub(super) role: String,
    pub(super) mode: String,
    pub(super) decision: String,
    pub(super) reason: String,
    /// JSON text of the approvers' key ids.
    pub(super) approvers: String,
    pub(super) args: Option<String>,
    pub(super) args_truncated: bool,
    pub(super) outcome: Option<String>,
    pub(super) error: Option<String>,
    pub(super) started_at: i64,
    pub(super) finished_at: Option<i64>,
}

impl Row {
    /// Row `id` of `r`, decided now: args and texts bounded.
    pub(super) fn new(id: i64, r: &Record) -> Self {
        let max = if r.decision == "allow" { FIELD_MAX_BYTES } else { REFUSED_ARGS_MAX_BYTES };
        let (args, args_truncated) = json_field(r.args.as_ref(), max);
        let now = now_ms();
        Self {
            id,
            session_id: r.session_id.clone(),
            skill: r.skill.clone(),
            class: r.class.clone(),
            caller_uid: r.caller_uid,
            caller_pid: r.caller_pid,
            role: r.role.clone(),
            mode: r.mode.clone(),
            decision: r.decision.to_owned(),
            reason: bounded(r.reason.clone(), ERROR_MAX_BYTES).0,
            approvers: Value::from(r.approvers.clone()).to_string(),
            args,
            args_truncated,
            outcome: r.outcome.clone(),
            error: short_text(r.error.as_deref()),
            started_at: now,
            // A refusal is finished when decided.
            finished_at: r.outcome.as_ref().map(|_| now),
        }
    }
}

/// A run's completion as applied to its row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Done {
    pub(super) id: i64,
    pub(super) outcome: String,
    pub(super) error: Option<String>,
    pub(super) exit_code: Option<i32>,
    pub(super) result: Option<String>,
    pub(super) result_truncated: bool,
    pub(super) finished_at: i64,
    pub(super) duration_ms: Option<i64>,
    /// Absent in journal lines of an earlier version.
    #[serde(default)]
    pub(super) network_denied: Option<i64>,
}

impl Done {
    /// The completion of row `id`, now: the result and texts bounded.
    pub(super) fn new(id: i64, f: &Finish) -> Self {
        let (result, result_truncated) = match &f.result {
            None => (None, false),
            Some(r) => {
                let (text, cut) = bounded(r.get().to_owned(), FIELD_MAX_BYTES);
                (Some(text), cut)
            }
        };
        Self {
            id,
            outcome: f.outcome.clone(),
            error: short_text(f.error.as_deref()),
            exit_code: f.exit_code,
            result,
            result_truncated,
            finished_at: now_ms(),
            duration_ms: f.duration_ms.map(|d| i64::try_from(d).unwrap_or(i64::MAX)),
            network_denied: f.network_denied.map(|d| i64::try_from(d).unwrap_or(i64::MAX)),
        }
    }
}

/// The id after the largest the database has used (`AUTOINCREMENT`'s
/// sequence included, so an id is never given twice even after its row
/// was deleted).
pub(super) fn next_id(db: &Connection) -> rusqlite::Result<i64> {
    let max: i64 = db.query_row(
        "SELECT max(coalesce((SELECT max(id) FROM audit), 0),
                    coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'audit'), 0))",
        [],
        |r| r.get(0),
    )?;
    Ok(max.saturating_add(1))
}

/// Inserts a decision's row. With approvals, inside a savepoint, so that a
/// replayed approval rolls back this row only, not the rest of the batch.
pub(super) fn insert(db: &Connection, row: &Row, r: &Record) -> Result<(), WriteError> {
    if r.approvals_used.is_empty() {
        return insert_row(db, row, false);
    }
    run_cached(db, "SAVEPOINT job")?;
    let used = insert_row(db, row, false).and_then(|()| use_approvals(db, row.id, r));
    match used {
        Ok(()) => {
            run_cached(db, "RELEASE job")?;
            Ok(())
        }
        Err(e) => {
            run_cached(db, "ROLLBACK TO job")?;
            run_cached(db, "RELEASE job")?;
            Err(e)
        }
    }
}

/// Inserts `row`; `replayed`: from the journal, where it may already be in
/// the database (then it is left as it is).
pub(super) fn insert_row(db: &Connection, row: &Row, replayed: bool) -> Result<(), WriteError> {
    let sql = if replayed {
        "INSERT OR IGNORE INTO audit (id, session_id, skill, class, caller_uid, caller_pid, role,
             mode, decision, reason, approvers, args, args_truncated, outcome, error, started_at,
             finished_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
    } else {
        "INSERT INTO audit (id, session_id, skill, class, caller_uid, caller_pid, role,
             mode, decision, reason, approvers, args, args_truncated, outcome, error, started_at,
             finished_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
    };
    db.prepare_cached(sql)?.execute(params![
        row.id,
        row.session_id,
        row.skill,
        row.class,
        row.caller_uid,
        row.caller_pid,
        row.role,
        row.mode,
        row.decision,
        row.reason,
        row.approvers,
        row.args,
        row.args_truncated,
        row.outcome,
        row.error,
        row.started_at,
        row.finished_at,
    ])?;
    Ok(())
}

fn use_approvals(db: &Connection, id: i64, r: &Record) -> Result<(), WriteError> {
    for (key, expires_at) in &r.approvals_used {
        let key_id = key.split(':').next().unwrap_or_default();
        let expires = i64::try_from(*expires_at).unwrap_or(i64::MAX);
        let n = db
            .prepare_cached(
                "INSERT OR IGNORE INTO used_approvals (approval, key_id, expires_at, audit_id)
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![key, key_id, expires, id])?;
        if n == 0 {
            // The caller's savepoint rolls the row back.
            return Err(WriteError::Replayed(key_id.to_owned()));
        }
    }
    Ok(())
}

/// Completes every allowed run's row that an earlier skilld left open (it
/// stopped or crashed before the run's report): its run ended with that
/// skilld's executor connection, unreported. Returns how many.
pub(super) fn close_interrupted(db: &Connection) -> rusqlite::Result<usize> {
    db.execute(
        "UPDATE audit SET outcome = ?1, error = ?2, finished_at = ?3
         WHERE outcome IS NULL AND decision = 'allow'",
        params![
            INTERRUPTED,
            "skilld stopped before the run's report: the run ended with its executor \
             connection, unreported",
            now_ms(),
        ],
    )
}

/// Completes a row.
pub(super) fn update(db: &Connection, done: &Done) -> Result<(), WriteError> {
    let n = db
        .prepare_cached(
            "UPDATE audit SET outcome = ?2, error = ?3, exit_code = ?4, result = ?5,
                 result_truncated = ?6, finished_at = ?7,
                 duration_ms = COALESCE(?8, ?7 - started_at), network_denied = ?9
             WHERE id = ?1",
        )?
        .execute(params![
            done.id,
            done.outcome,
            done.error,
            done.exit_code,
            done.result,
            done.result_truncated,
            done.finished_at,
            done.duration_ms,
            done.network_denied,
        ])?;
    if n == 0 {
        return Err(WriteError::Lost(done.id));
    }
    Ok(())
}

pub(super) fn used_approvals(db: &Connection) -> rusqlite::Result<Vec<(String, u64)>> {
    let mut stmt =
        db.prepare("SELECT approval, expires_at FROM used_approvals WHERE expires_at >= ?1")?;
    let forget = forget_before();
    let rows = stmt.query_map(params![forget], |r| {
        Ok((r.get::<_, String>(0)?, u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0)))
    })?;
    rows.collect()
}

pub(super) fn select(db: &Connection, q: &Query) -> rusqlite::Result<Vec<Entry>> {
    let mut stmt = db.prepare(
        "SELECT id, session_id, skill, class, caller_uid, caller_pid, role, mode, decision,
                reason, approvers, args, args_truncated, result, result_truncated, outcome,
                error, exit_code, started_at, finished_at, duration_ms, network_denied
         FROM audit
         WHERE (?1 IS NULL OR skill = ?1) AND (?2 IS NULL OR outcome = ?2)
           AND (?3 IS NULL OR decision = ?3) AND (?4 IS NULL OR started_at >= ?4)
         ORDER BY id DESC LIMIT ?5",
    )?;
    let limit = q.limit.clamp(1, MAX_QUERY_ROWS);
    let rows = stmt.query_map(params![q.skill, q.outcome, q.decision, q.since_ms, limit], |r| {
        let approvers: String = r.get(10)?;
        Ok(Entry {
            id: r.get(0)?,
            session_id: r.get(1)?,
            skill: r.get(2)?,
            class: r.get(3)?,
            caller_uid: r.get(4)?,
            caller_pid: r.get(5)?,
            role: r.get(6)?,
            mode: r.get(7)?,
            decision: r.get(8)?,
            reason: r.get(9)?,
            approvers: serde_json::from_str(&approvers).unwrap_or_default(),
            args: stored_json(r.get(11)?, r.get(12)?),
            args_truncated: r.get(12)?,
            result: stored_json(r.get(13)?, r.get(14)?),
            result_truncated: r.get(14)?,
            outcome: r.get(15)?,
            error: r.get(16)?,
            exit_code: r.get(17)?,
            started_at: r.get(18)?,
            finished_at: r.get(19)?,
            duration_ms: r.get(20)?,
            network_denied: r.get(21)?,
        })
    })?;
    rows.collect()
}

/// Stored JSON text back as JSON, as it was written. A cut text, or one a
/// serde_json `Value` would not read (a skill's result may use the key
/// serde_json reserves), becomes a string, so every client can read the
/// listing.
pub(super) fn stored_json(text: Option<String>, truncated: bool) -> policy::RawJson {
    let Some(t) = text else { return policy::RawJson::from_value(&Value::Null) };
    let raw = (!truncated && serde_json::from_str::<Value>(&t).is_ok())
        .then(|| policy::RawJson::from_slice(t.as_bytes()).ok())
        .flatten();
    raw.unwrap_or_else(|| policy::RawJson::from_value(&Value::String(t)))
}

/// `text` cut to at most `max` bytes on a character boundary, and whether
/// it was cut.
pub(super) fn bounded(text: String, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

pub(super) fn json_field(v: Option<&policy::RawJson>, max: usize) -> (Option<String>, bool) {
    match v {
        None => (None, false),
        Some(v) => {
            let (text, cut) = bounded(v.get().to_owned(), max);
            (Some(text), cut)
        }
    }
}

pub(super) fn short_text(v: Option<&str>) -> Option<String> {
    v.map(|s| bounded(s.to_owned(), ERROR_MAX_BYTES).0)
}
