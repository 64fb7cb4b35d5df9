//! `skilld.toml` parsed and resolved, its errors and the shipped file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use policy::PermissionMode;

use super::*;

fn parse(text: &str) -> Result<FileConfig, ConfigError> {
    FileConfig::parse(text, Path::new("/etc/ongrid/skilld.toml"))
}

/// The commented `/etc/ongrid/skilld.toml` the package ships: with every
/// `#key = value` and `#[[table]]` line uncommented it still parses
/// (no stale key, each key in the right place), and its top-level
/// values are the defaults.
#[test]
fn the_shipped_config_uncommented_parses_and_shows_the_defaults() {
    let shipped = include_str!("../../../../packaging/skilld.toml");
    let uncommented = testkit::shipped::uncomment(shipped, "[[");
    assert!(uncommented.contains("\n[[callers]]\n"), "{uncommented}");
    let all = parse(&uncommented).unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
    assert_eq!(all.callers.as_ref().map(Vec::len), Some(2));
    let top = uncommented.split("\n[[").next().unwrap();
    let mut shown = parse(top).unwrap().resolve(Overrides::default(), vec![]).unwrap();
    // `socket_group = "ongrid"` is shown for the default "the daemon's
    // own group", which is `ongrid` under the unit.
    shown.socket_group = None;
    let defaults = parse("").unwrap().resolve(Overrides::default(), vec![]).unwrap();
    assert_eq!(format!("{shown:?}"), format!("{defaults:?}"));
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
    assert_eq!(s.header_timeout, Duration::from_secs(10));
    assert_eq!(s.idle_timeout, Duration::from_secs(60));
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
           request_timeout_seconds = 5
           header_timeout_seconds = 6
           idle_timeout_seconds = 7
           drain_timeout_seconds = 8"#,
    )
    .unwrap();
    let s = f.clone().resolve(Overrides::default(), vec![PathBuf::from("/env")]).unwrap();
    assert_eq!(s.socket, PathBuf::from("/a.sock"));
    assert_eq!(s.socket_mode, 0o600);
    assert_eq!(s.skills_dirs, [PathBuf::from("/s1"), "/s2".into(), "/env".into()]);
    assert_eq!(s.max_concurrent_runs, 3);
    assert_eq!(s.queue_timeout, Duration::from_secs(4));
    assert_eq!(s.request_timeout, Duration::from_secs(5));
    assert_eq!(s.header_timeout, Duration::from_secs(6));
    assert_eq!(s.drain_timeout, Duration::from_secs(8));
    assert_eq!(s.idle_timeout, Duration::from_secs(7));
    let o = Overrides {
        socket: Some("/b.sock".into()),
        executor_socket: Some("/f.sock".into()),
        metrics_listen: Some(String::new()),
        skills_dirs: vec!["/cli".into()],
        audit_db: Some("/up/audit.db".into()),
    };
    let s = f.resolve(o, vec![]).unwrap();
    assert_eq!(s.socket, PathBuf::from("/b.sock"));
    assert_eq!(s.executor_socket, PathBuf::from("/f.sock"));
    assert_eq!(s.metrics_listen, None);
    assert_eq!(s.skills_dirs, [PathBuf::from("/cli")]);
    assert_eq!(s.audit.db, PathBuf::from("/up/audit.db"));
}

#[test]
fn permissions_and_audit_keys() {
    let key = policy::approval::SecretKey::from_seed([7; 32]).public_key();
    let other = policy::approval::SecretKey::from_seed([8; 32]).public_key();
    let text = format!(
        r#"socket_group = "0"
           approval_max_ttl_seconds = 60
           audit_db = "/a.db"
           audit_required = false
           audit_max_rows = 10
           audit_max_age_days = 0
           audit_max_bytes = 2097152
           audit_synchronous = "normal"
           audit_sync_interval_ms = 250
           [[callers]]
           uid = 1000
           role = "operator"
           mode = "dual-sign-required"
           audit = true
           [[callers]]
           group = "root"
           role = "admins"
           mode = "mutating-with-confirm"
           [[callers]]
           user = "root"
           role = "root"
           mode = "read-only"
           [[approvers]]
           name = "alice"
           public_key = "{key}"
           [[approvers]]
           name = "bob"
           public_key = "{other}""#
    );
    let s = parse(&text).unwrap().resolve(Overrides::default(), vec![]).unwrap();
    assert_eq!(s.socket_group, Some(0));
    assert_eq!(s.approval_max_ttl, 60);
    assert_eq!(
        s.audit,
        AuditSettings {
            db: "/a.db".into(),
            required: false,
            max_rows: 10,
            max_age_days: 0,
            max_bytes: 2 << 20,
            synchronous: AuditSync::Normal,
            sync_interval: Duration::from_millis(250),
        }
    );
    assert_eq!(s.callers.len(), 3);
    assert_eq!(s.callers[0].who, Principal::Uid(1000));
    assert!(s.callers[0].audit);
    assert_eq!(s.callers[1].who, Principal::Gid(0));
    assert_eq!(s.callers[1].mode, PermissionMode::MutatingWithConfirm);
    assert_eq!(s.callers[2].who, Principal::Uid(0));
    assert!(!s.callers[2].audit);
    assert_eq!(s.approvers[1].name(), "bob");

    let d = parse("").unwrap().resolve(Overrides::default(), vec![]).unwrap();
    assert_eq!(d.approval_max_ttl, 900);
    assert_eq!(d.audit.db, PathBuf::from(DEFAULT_AUDIT_DB));
    assert!(d.audit.required);
    assert_eq!(d.audit.synchronous, AuditSync::Interval);
    assert_eq!(d.audit.sync_interval, Duration::from_millis(DEFAULT_AUDIT_SYNC_INTERVAL_MS));
    for (text, mode) in [("full", AuditSync::Full), ("interval", AuditSync::Interval)] {
        let text = format!("audit_synchronous = \"{text}\"");
        let s = parse(&text).unwrap().resolve(Overrides::default(), vec![]).unwrap();
        assert_eq!(s.audit.synchronous, mode);
    }
    assert!(matches!(parse("audit_synchronous = \"off\""), Err(ConfigError::Parse { .. })));
    assert!(d.callers.is_empty() && d.approvers.is_empty() && d.socket_group.is_none());

    let dup = format!(
        "[[approvers]]\nname = \"a\"\npublic_key = \"{key}\"\n\
         [[approvers]]\nname = \"b\"\npublic_key = \"{key}\""
    );
    for text in [
        "approval_max_ttl_seconds = 0",
        "approval_max_ttl_seconds = 86401",
        "audit_sync_interval_ms = 0",
        "audit_sync_interval_ms = 60001",
        "audit_max_bytes = 4096",
        "socket_group = \"no-such-group-here\"",
        "[[callers]]\nrole = \"x\"\nmode = \"read-only\"",
        "[[callers]]\nuid = 1\ngid = 1\nrole = \"x\"\nmode = \"read-only\"",
        "[[callers]]\nuser = \"no-such-user-here\"\nrole = \"x\"\nmode = \"read-only\"",
        "[[approvers]]\nname = \"a\"\npublic_key = \"AAAA\"",
        dup.as_str(),
    ] {
        let r = parse(text).unwrap().resolve(Overrides::default(), vec![]);
        assert!(matches!(r, Err(ConfigError::Value { .. })), "{text}");
    }
    for text in [
        "[[callers]]\nuid = 1\nrole = \"x\"\nmode = \"admin\"",
        "[[callers]]\nuid = 1\nrole = \"x\"\nmode = \"read-only\"\nextra = 1",
    ] {
        assert!(matches!(parse(text), Err(ConfigError::Parse { .. })), "{text}");
    }
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
        "header_timeout_seconds = 0",
        "idle_timeout_seconds = 0",
        "drain_timeout_seconds = 0",
    ] {
        let r = parse(text).unwrap().resolve(Overrides::default(), vec![]);
        assert!(matches!(r, Err(ConfigError::Value { .. })), "{text}");
    }
}

/// Every error names the file and the key (or the flag), a group too.
#[test]
fn errors_name_the_file_and_the_key() {
    let resolve = |text: &str| {
        parse(text).unwrap().resolve(Overrides::default(), vec![]).unwrap_err().to_string()
    };
    assert_eq!(
        resolve("max_connections = 0"),
        "/etc/ongrid/skilld.toml: max_connections: must be at least 1"
    );
    assert_eq!(
        resolve("socket_group = \"no-such-group-here\""),
        "/etc/ongrid/skilld.toml: socket_group: no group named \"no-such-group-here\""
    );
    assert_eq!(
        resolve("[[callers]]\nuser = \"no-such-user-here\"\nrole = \"x\"\nmode = \"read-only\""),
        "/etc/ongrid/skilld.toml: callers: caller with role \"x\": no user named \"no-such-user-here\""
    );
    assert!(
        resolve("metrics_listen = \"x\"").starts_with("/etc/ongrid/skilld.toml: metrics_listen: ")
    );
    let flag = Overrides { metrics_listen: Some("x".into()), ..Overrides::default() };
    let e = parse("").unwrap().resolve(flag, vec![]).unwrap_err().to_string();
    assert!(e.starts_with("--metrics-listen: \"x\": "), "{e}");
    // Without a file, the key alone.
    let e = FileConfig { max_connections: Some(0), ..FileConfig::default() }
        .resolve(Overrides::default(), vec![])
        .unwrap_err()
        .to_string();
    assert_eq!(e, "max_connections: must be at least 1");
}

/// A relative path in any path-valued key (or flag) is refused,
/// naming the file and the key; the env var's roots are the scan's to
/// skip.
#[test]
fn relative_paths_are_refused() {
    for (text, key) in [
        ("skills_dirs = [\"/ok\", \"packs\"]", "skills_dirs"),
        ("audit_db = \"rel.db\"", "audit_db"),
        ("socket = \"relative.sock\"", "socket"),
        ("executor_socket = \"./executor.sock\"", "executor_socket"),
        ("socket = \"\"", "socket"),
    ] {
        let e = parse(text).unwrap().resolve(Overrides::default(), vec![]).unwrap_err();
        assert!(matches!(e, ConfigError::Value { .. }), "{text}: {e:?}");
        let e = e.to_string();
        assert!(e.starts_with(&format!("/etc/ongrid/skilld.toml: {key}: ")), "{text}: {e}");
        assert!(e.contains("is not an absolute path"), "{text}: {e}");
    }
    let flags = [
        (Overrides { socket: Some("s.sock".into()), ..Overrides::default() }, "--socket"),
        (
            Overrides { executor_socket: Some("e.sock".into()), ..Overrides::default() },
            "--executor-socket",
        ),
        (Overrides { skills_dirs: vec!["packs".into()], ..Overrides::default() }, "--skills-dir"),
    ];
    for (o, flag) in flags {
        let e = parse("").unwrap().resolve(o, vec![]).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{flag}: ")), "{e}");
    }
    let s = parse("").unwrap().resolve(Overrides::default(), vec!["rel".into()]).unwrap();
    assert_eq!(s.skills_dirs, [PathBuf::from(DEFAULT_SKILLS_DIR), "rel".into()]);
}

#[test]
fn missing_default_file_is_fine_but_missing_given_file_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let r = FileConfig::load(Some(&dir.path().join("nope.toml")));
    assert!(matches!(r, Err(ConfigError::Read { .. })));
}
