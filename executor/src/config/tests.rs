use super::*;

/// The default run-as user and the users skills are granted are looked
/// up; the ones missing are named once each.
#[test]
fn missing_run_as_users_are_named() {
    let text = r#"
        run_as = "root"
        [skills.a]
        run_as = ["ongrid-no-such-user-x", "root"]
        [skills.b]
        run_as = ["ongrid-no-such-user-x"]
    "#;
    let config = Config::parse(text, Path::new("t.toml")).unwrap();
    assert_eq!(config.missing_users(), ["ongrid-no-such-user-x"]);
    let text = "run_as = \"ongrid-no-such-user-y\"\n";
    let config = Config::parse(text, Path::new("t.toml")).unwrap();
    assert_eq!(config.missing_users(), ["ongrid-no-such-user-y"]);
    assert!(Config::parse("run_as = \"root\"\n", Path::new("t.toml"))
        .unwrap()
        .missing_users()
        .is_empty());
}

/// The commented `/etc/ongrid/executor.toml` the package ships: with
/// every `#key = value` and `#[table]` line uncommented it still parses
/// (no stale key, each key under the right table).
#[test]
fn the_shipped_config_uncommented_parses() {
    let shipped = include_str!("../../../packaging/executor.toml");
    let uncommented = testkit::shipped::uncomment(shipped, "[");
    assert!(uncommented.contains("\n[skills.netprobe]\n"), "{uncommented}");
    let c = Config::parse(&uncommented, Path::new("executor.toml"))
        .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
    assert!(c.skills.contains_key("netprobe"), "{c:?}");
    assert_eq!(
        c.skills["netprobe"].manifest.as_deref(),
        Some(Path::new("/etc/ongrid/skills/netprobe/skill.json"))
    );
}

/// `[skills.NAME] warm` and the pool-wide settings parse, and the
/// total is clamped to `max_warm_total`.
#[test]
fn warm_grants_parse_and_are_bounded_in_total() {
    let c = Config::parse("", Path::new("x.toml")).unwrap();
    assert_eq!((c.max_warm_total, c.warm_idle_seconds, c.warm_total()), (8, 60, 0));
    let text = "max_warm_total = 3\nwarm_idle_seconds = 5\n\
                [skills.a]\nwarm = 2\n[skills.b]\nwarm = 3\n[skills.c]\n";
    let c = Config::parse(text, Path::new("x.toml")).unwrap();
    assert_eq!((c.skills["a"].warm, c.skills["b"].warm, c.skills["c"].warm), (2, 3, 0));
    assert_eq!((c.warm_idle_seconds, c.warm_total()), (5, 3));
}

#[test]
fn empty_is_default() {
    let c = Config::parse("", Path::new("x.toml")).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.landlock, LandlockMode::Required);
}

#[test]
fn full_example_parses() {
    let text = r#"
        run_as = "nobody"
        roots = ["/etc/ongrid/skills"]
        runtime_dir = "/run/ongrid"
        landlock = "best-effort"
        egress = "best-effort"
        report_denials = "on"
        max_timeout_seconds = 60
        entry_owners = ["root", "bin"]
        [limits]
        max_pids = 32
        [skills.netprobe]
        network = true
        connect = ["0.0.0.0/0:443", "[::]/0:443", "example.com:*"]
        dns = true
        capabilities = ["CAP_NET_RAW"]
        [skills.ps]
        proc = "host"
    "#;
    let c = Config::parse(text, Path::new("x.toml")).unwrap();
    assert_eq!(c.landlock, LandlockMode::BestEffort);
    assert_eq!(c.egress, EgressMode::BestEffort);
    assert_eq!(c.report_denials, ReportDenials::On);
    assert_eq!(c.skills["netprobe"].connect.len(), 3);
    assert!(c.skills["netprobe"].dns);
    assert_eq!(c.skills["ps"].proc, policy::sandbox::ProcView::Host);
    assert_eq!(c.skills["netprobe"].proc, policy::sandbox::ProcView::Own, "the default");
    let bad = "[skills.x]\nnetwork = true\nconnect = [\"10.0.0.1\"]\n";
    assert!(Config::parse(bad, Path::new("x.toml")).is_err(), "an entry without a port");
    let bad = "[skills.x]\nconnect = [\"10.0.0.1:443\"]\n";
    let e = Config::parse(bad, Path::new("x.toml")).unwrap_err().to_string();
    assert!(e.contains("[skills.x] connect needs network = true"), "{e}");
    assert_eq!(c.limits.max_pids, 32);
    assert_eq!(c.limits.nofile, Limits::default().nofile);
    assert!(c.skills["netprobe"].network);
}

#[test]
fn serve_settings_parse() {
    let text = r#"
        socket = "/run/x/executor.sock"
        socket_owner = "root"
        socket_group = "ongrid"
        socket_mode = "0600"
        allowed_uids = [0, 998]
        allowed_gids = [997]
        max_concurrent_runs = 2
        max_queued_runs = 0
        max_connections = 8
        max_line_bytes = 65536
        idle_timeout_seconds = 5
        [[peers]]
        uid = 998
        classes = ["safe", "mutating"]
        [[peers]]
        user = "ops"
        classes = ["dangerous"]
    "#;
    let c = Config::parse(text, Path::new("x.toml")).unwrap();
    assert_eq!(c.socket_path(), PathBuf::from("/run/x/executor.sock"));
    assert_eq!(c.socket_mode_bits(), 0o600);
    assert_eq!(c.idle_timeout_seconds, 5);
    assert_eq!(c.allowed_uids, Some(vec![0, 998]));
    assert_eq!(c.peers[0].classes, [SkillClass::Safe, SkillClass::Mutating]);
    assert_eq!(c.peers[1].user.as_deref(), Some("ops"));
    assert_eq!(c.max_queued_runs, 0);

    let d = Config::default();
    assert_eq!(d.socket_mode_bits(), 0o660);
    assert_eq!(d.max_line_bytes, policy::wire::MAX_LINE_BYTES);
    assert_eq!(d.socket_path(), d.runtime_dir().join("executor.sock"));
    assert!(d.clone().for_serve().roots == [PathBuf::from(DEFAULT_SERVE_ROOT)]);
    let custom = Config { roots: vec!["/srv/s".into()], ..d };
    assert_eq!(custom.for_serve().roots, [PathBuf::from("/srv/s")]);
}

#[test]
fn the_runs_tmpfs_holds_every_slot_at_its_memory_bound() {
    let text = "max_concurrent_runs = 4\n[limits]\nmemory_bytes = 1048576\n\
                [skills.big]\nmemory_bytes = 8388608\n[skills.small]\nmemory_bytes = 1048576\n";
    let c = Config::parse(text, Path::new("x.toml")).unwrap();
    assert_eq!(c.largest_run_memory(), 8 << 20);
    assert_eq!(c.runs_tmpfs_need(), 32 << 20);
    assert_eq!(c.runs_tmpfs_bytes(true), 32 << 20);
    // Without a memory cgroup only the tmpfs bounds the runs' files.
    assert!(c.runs_tmpfs_bytes(false) <= DEFAULT_RUNS_TMPFS_BYTES);
    let set = Config { runs_tmpfs_bytes: Some(2 << 20), ..c.clone() };
    assert_eq!((set.runs_tmpfs_bytes(true), set.runs_tmpfs_bytes(false)), (2 << 20, 2 << 20));
    // The defaults: 16 slots of 512 MiB.
    assert_eq!(Config::default().runs_tmpfs_need(), 8 << 30);
    let huge = Config { max_concurrent_runs: usize::MAX, ..c };
    assert_eq!(huge.runs_tmpfs_need(), MAX_RUNS_TMPFS_BYTES);
}

/// The TOML error is said once: in the message, not again as its
/// source (`serve` prints the chain: it said the error twice).
#[test]
fn a_parse_error_is_said_once() {
    let e = Config::parse("foo = 1", Path::new("x.toml")).unwrap_err();
    assert!(std::error::Error::source(&e).is_none());
    let chain = format!("{:#}", anyhow::Error::from(e));
    assert_eq!(chain.matches("unknown field").count(), 1, "{chain}");
}

#[test]
fn unknown_and_bad_fields_are_errors() {
    for (text, needle) in [
        ("runas = \"x\"", "unknown field"),
        ("[limits]\nmax_pid = 3", "unknown field"),
        ("roots = [\"rel/dir\"]", "roots"),
        ("max_timeout_seconds = 0", "max_timeout_seconds"),
        ("max_timeout_seconds = 86401", "from 1 to 86400"),
        ("[skills.Bad-Name]", "skills"),
        ("[skills.x]\ncapabilities = [\"CAP_NOPE\"]", "CAP_NOPE"),
        ("landlock = \"maybe\"", "landlock"),
        ("socket = \"rel.sock\"", "socket"),
        ("socket_mode = \"0999\"", "socket_mode"),
        ("socket_mode = \"4755\"", "socket_mode"),
        ("socket_group = \"\"", "socket_group"),
        ("max_concurrent_runs = 0", "max_concurrent_runs"),
        ("max_connections = 0", "max_connections"),
        ("hold_timeout_seconds = 0", "hold_timeout_seconds"),
        ("drain_timeout_seconds = 0", "drain_timeout_seconds"),
        ("max_line_bytes = 10", "max_line_bytes"),
        ("runs_tmpfs_bytes = 4096", "runs_tmpfs_bytes"),
        ("runs_tmpfs_bytes = 2251799813685249", "runs_tmpfs_bytes"),
        ("allowed_uids = [-1]", "allowed_uids"),
        ("[[peers]]\nclasses = [\"safe\"]", "peers"),
        ("[[peers]]\nuid = 1\nuser = \"x\"\nclasses = []", "peers"),
        ("[[peers]]\nuid = 1\nclasses = [\"root\"]", "classes"),
        ("[[peers]]\nuid = 1\nclasses = []\n[[peers]]\nuid = 1\nclasses = []", "twice"),
        ("[[peers]]\nuid = 1\nclass = []", "unknown field"),
        ("[limits]\nmemory_bytes = 65536", "memory_bytes: must be at least 1048576"),
        ("[limits]\nnofile = 0", "nofile"),
        ("[limits]\nstdout_bytes = 0", "stdout_bytes"),
        ("[limits]\naddress_space_bytes = 0", "address_space_bytes"),
        ("[limits]\nmax_pids = 0", "max_pids"),
        ("[skills.x]\nmemory_bytes = 1", "[skills.x] memory_bytes"),
        ("[skills.x]\nmax_pids = 0", "[skills.x] max_pids"),
        ("[skills.x]\nmanifest = \"x/skill.json\"", "[skills.x] manifest"),
        ("[skills.x]\nmanifest = \"/srv/x/../y/skill.json\"", "[skills.x] manifest"),
        ("[skills.x]\nmanifest = \"/srv/x/run.sh\"", "not a skill.json or SKILL.md"),
        ("warm_idle_seconds = 0", "warm_idle_seconds"),
        ("max_concurrent_runs = 4\n[skills.x]\nwarm = 4", "max_warm_total"),
        ("max_warm_total = 2\n[skills.x]\nwarm = 3", "[skills.x] warm: at most 2"),
        ("[skills.x]\nwarm = -1", "warm"),
    ] {
        let e = Config::parse(text, Path::new("x.toml")).unwrap_err().to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
}
