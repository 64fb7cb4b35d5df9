//! Filesystem confinement: Landlock read+exec on system dirs and
//! the skill folder, read-write only in the private run dir. Targets the
//! skill must not reach are world-accessible (or the skill runs as a granted
//! root without capabilities) so that Unix permissions alone would allow
//! the attempt and only the sandbox stops it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ongrid_tests::run::unsandboxed;
use ongrid_tests::skill::set_mode;
use ongrid_tests::{Config, SkillDir};
use serde_json::{json, Value};

use crate::{allowed, args, attack, blocked, blocked_with, outside, shared, Guard};

/// Files and dirs the test planted outside the sandbox, removed on drop.
struct Planted(Vec<PathBuf>);

impl Planted {
    fn file(&mut self, path: PathBuf, contents: &str, mode: u32) -> PathBuf {
        std::fs::write(&path, contents).expect("plant file");
        set_mode(&path, mode);
        self.0.push(path.clone());
        path
    }
    fn dir(&mut self, path: PathBuf, mode: u32) -> PathBuf {
        std::fs::create_dir(&path).expect("plant dir");
        set_mode(&path, mode);
        self.0.push(path.clone());
        path
    }
    fn watch(&mut self, path: PathBuf) -> PathBuf {
        self.0.push(path.clone());
        path
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir_all(p));
        }
    }
}

/// An attack skill granted (and asking) to run as root: uid 0 without
/// capabilities, so file modes owned by root no longer protect anything.
fn as_root(case: &str) -> (SkillDir, Config) {
    let skill = attack(case).with("sandbox", json!({"run_as": "root"}));
    let config = Config::new().grant(skill.name(), "run_as = [\"root\"]");
    (skill, config)
}

fn done(skill: &SkillDir, g: &Guard) {
    crate::no_leftovers(skill, g);
}

fn ran_as_root(run: &ongrid_tests::Run) {
    let sb = run.report.sandbox.as_ref().expect("sandbox report");
    assert_eq!(sb.uid, 0, "granted run_as root not applied:\n{}", run.dump());
}

/// /etc/shadow is unreadable by the skill user.
#[test]
fn shadow_is_unreadable() {
    let Some(g) = shared("shadow_is_unreadable") else { return };
    let skill = attack("read_shadow");
    let run = skill.run(&Config::new(), &args("read", json!({"path": "/etc/shadow"})));
    blocked_with(&run, &[libc::EACCES]);
    done(&skill, &g);
}

/// /etc/shadow is unreadable even with `run_as: root` granted:
/// Landlock, not file modes, stops it.
#[test]
fn shadow_is_unreadable_even_as_granted_root() {
    let Some(g) = shared("shadow_is_unreadable_even_as_granted_root") else { return };
    let (skill, config) = as_root("read_shadow_root");
    let run = skill.run(&config, &args("read", json!({"path": "/etc/shadow"})));
    ran_as_root(&run);
    blocked_with(&run, &[libc::EACCES]);
    done(&skill, &g);
}

/// A world-readable file outside the allowed dirs is unreadable,
/// and so are the executor's environment and the host's /proc/1 views.
#[test]
fn world_readable_files_outside_the_box_are_unreadable() {
    let Some(g) = shared("world_readable_files_outside_the_box_are_unreadable") else { return };
    let mut planted = Planted(vec![]);
    let skill = attack("read_outside");
    let secret = planted.file(outside(&skill, "/var/tmp", "secret"), "secret", 0o644);
    let tmp_secret = planted.file(outside(&skill, "/tmp", "secret"), "secret", 0o644);
    for path in [
        secret.to_str().expect("utf-8"),
        tmp_secret.to_str().expect("utf-8"),
        "/proc/{ppid}/environ",
        "/proc/1/environ",
        "/proc/1/root/etc/hostname",
    ] {
        let run = skill.run(&Config::new(), &args("read", json!({"path": path})));
        assert_eq!(run.result()["succeeded"], json!(false), "{path} was readable:\n{}", run.dump());
    }
    done(&skill, &g);
}

/// No write outside the run dir, even where modes allow it (/tmp,
/// /var/tmp, /dev/shm, a 0777 dir, a 0777 dir in the skill's own folder).
#[test]
fn writes_outside_the_run_dir_fail() {
    let Some(g) = shared("writes_outside_the_run_dir_fail") else { return };
    let mut planted = Planted(vec![]);
    let skill = attack("write_outside");
    let open_dir = planted.dir(outside(&skill, "/var/tmp", "open"), 0o777);
    let scratch = skill.path().join("scratch");
    std::fs::create_dir(&scratch).expect("scratch dir");
    set_mode(&scratch, 0o777);
    let targets = [
        planted.watch(outside(&skill, "/tmp", "w")),
        planted.watch(outside(&skill, "/var/tmp", "w")),
        planted.watch(outside(&skill, "/dev/shm", "w")),
        planted.watch(open_dir.join("w")),
        planted.watch(scratch.join("w")),
    ];
    let paths: Vec<&str> = targets.iter().map(|p| p.to_str().expect("utf-8")).collect();
    let run = skill.run(&Config::new(), &args("persist", json!({"paths": paths})));
    let r = blocked(&run);
    assert_eq!(r["cwd_writable"], json!(true), "the run dir must be writable:\n{}", run.dump());
    for t in &targets {
        assert!(!t.exists(), "{} was created", t.display());
    }
    done(&skill, &g);
}

/// As granted root (no capabilities): no write to /etc, /root,
/// /tmp, /var/tmp, no listing of /root.
#[test]
fn granted_root_cannot_write_system_dirs_or_list_root() {
    let Some(g) = shared("granted_root_cannot_write_system_dirs_or_list_root") else { return };
    let mut planted = Planted(vec![]);
    let (skill, config) = as_root("write_as_root");
    let targets = [
        planted.watch(outside(&skill, "/etc", "w")),
        planted.watch(outside(&skill, "/root", "w")),
        planted.watch(outside(&skill, "/tmp", "w")),
        planted.watch(outside(&skill, "/var/tmp", "w")),
    ];
    let paths: Vec<&str> = targets.iter().map(|p| p.to_str().expect("utf-8")).collect();
    let run = skill.run(&config, &args("persist", json!({"paths": paths})));
    ran_as_root(&run);
    blocked(&run);
    for t in &targets {
        assert!(!t.exists(), "{} was created", t.display());
    }
    let run = skill.run(&config, &args("list", json!({"path": "/root"})));
    blocked_with(&run, &[libc::EACCES]);
    let dir = planted.watch(outside(&skill, "/etc", "d"));
    let run = skill.run(&config, &args("mkdir", json!({"path": dir})));
    blocked_with(&run, &[libc::EACCES]);
    done(&skill, &g);
}

/// A symlink planted in the run dir does not carry writes outside.
#[test]
fn symlink_in_the_run_dir_cannot_carry_a_write_outside() {
    let Some(g) = shared("symlink_in_the_run_dir_cannot_carry_a_write_outside") else { return };
    let mut planted = Planted(vec![]);
    let skill = attack("symlink_escape");
    let target = planted.file(outside(&skill, "/var/tmp", "target"), "original", 0o666);
    let run = skill.run(&Config::new(), &args("symlink_write", json!({"target": target})));
    blocked_with(&run, &[libc::EACCES]);
    assert_eq!(std::fs::read_to_string(&target).expect("target"), "original", "target changed");
    done(&skill, &g);
}

/// A path asked below a write grant that is a symlink out of it (an
/// earlier run may plant one: it may make links there) carries no right
/// beyond the grant: writing through it fails, and the report says the
/// path was not granted.
#[test]
fn a_link_below_a_grant_carries_no_right_outside_it() {
    let Some(g) = shared("a_link_below_a_grant_carries_no_right_outside_it") else { return };
    let mut planted = Planted(vec![]);
    let skill = attack("grant_link");
    let granted = planted.dir(outside(&skill, "/var/tmp", "granted"), 0o777);
    let beyond = planted.dir(outside(&skill, "/var/tmp", "beyond"), 0o777);
    let link = planted.watch(granted.join("esc"));
    std::os::unix::fs::symlink(&beyond, &link).expect("plant link");
    let skill = skill.with("sandbox", json!({"fs_write": [granted, link]}));
    let grant = format!("fs_write = [{:?}]", granted.to_str().expect("utf-8"));
    let config = Config::new().grant(skill.name(), &grant);
    let run = skill.run(&config, &args("write", json!({"path": granted.join("inside")})));
    allowed(&run);
    let run = skill.run(&config, &args("write", json!({"path": link.join("f")})));
    blocked_with(&run, &[libc::EACCES]);
    assert!(!beyond.join("f").exists(), "written through the link\n{}", run.dump());
    let degraded = &run.report.sandbox.as_ref().expect("sandbox report").degraded;
    let said = |l: &String| l.contains(link.to_str().expect("utf-8")) && l.contains("not granted");
    assert!(degraded.iter().any(said), "{degraded:?}");
    done(&skill, &g);
}

/// As granted root: no hard link of /etc/passwd into the run dir,
/// no rename of a skill-folder file into it (REFER / REMOVE_FILE).
#[test]
fn links_and_renames_across_directories_fail() {
    let Some(g) = shared("links_and_renames_across_directories_fail") else { return };
    let (skill, config) = as_root("link_rename");
    let victim = skill.write_file("victim.txt", "keep", 0o666);
    let run = skill.run(&config, &args("link", json!({"src": "/etc/passwd", "dst": "passwd"})));
    ran_as_root(&run);
    blocked_with(&run, &[libc::EXDEV, libc::EACCES, libc::EPERM]);
    let run = skill.run(&config, &args("link", json!({"src": victim, "dst": "victim-link"})));
    blocked_with(&run, &[libc::EXDEV, libc::EACCES, libc::EPERM]);
    let run = skill.run(&config, &args("rename", json!({"src": victim, "dst": "victim-moved"})));
    blocked_with(&run, &[libc::EXDEV, libc::EACCES, libc::EPERM]);
    assert_eq!(std::fs::read_to_string(&victim).expect("victim stays"), "keep");
    done(&skill, &g);
}

/// No device node in the run dir.
#[test]
fn mknod_fails() {
    let Some(g) = shared("mknod_fails") else { return };
    let (skill, config) = as_root("mknod");
    let run = skill.run(&config, &args("mknod", json!({"path": "null-dev"})));
    blocked_with(&run, &[libc::EPERM, libc::EACCES]);
    done(&skill, &g);
}

/// A setuid-root copy in the skill folder gains nothing (no_new_privs).
#[test]
fn setuid_binary_gains_nothing() {
    let Some(g) = shared("setuid_binary_gains_nothing") else { return };
    let skill = attack("setuid");
    let suid = skill.copy_file(Path::new(crate::ATTACK), "attack-suid", 0o755);
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).expect("chmod u+s");
    let run = skill.run(&Config::new(), &args("exec_setuid", json!({"path": suid})));
    blocked(&run);
    done(&skill, &g);
}

/// A granted read-only path stays read-only: reading works,
/// truncating a world-writable file in it does not.
#[test]
fn read_only_grant_cannot_truncate() {
    let Some(g) = shared("read_only_grant_cannot_truncate") else { return };
    let mut planted = Planted(vec![]);
    let skill = attack("truncate");
    let dir = planted.dir(outside(&skill, "/var/tmp", "ro"), 0o755);
    let file = planted.file(dir.join("data"), "precious", 0o666);
    let skill = skill.with("sandbox", json!({"fs_read": [dir]}));
    let config = Config::new()
        .grant(skill.name(), &format!("fs_read = [{:?}]", dir.to_str().expect("utf-8")));
    let run = skill.run(&config, &args("read", json!({"path": file})));
    crate::allowed(&run);
    let run = skill.run(&config, &args("truncate", json!({"path": file})));
    blocked_with(&run, &[libc::EACCES]);
    let run = skill.run(&config, &args("write", json!({"path": file})));
    blocked_with(&run, &[libc::EACCES]);
    assert_eq!(std::fs::read_to_string(&file).expect("file"), "precious");
    done(&skill, &g);
}

/// Nothing persists between runs: each run gets a fresh private
/// dir, removed afterwards, invisible to the next run.
#[test]
fn nothing_persists_between_runs() {
    let Some(g) = shared("nothing_persists_between_runs") else { return };
    let skill = attack("persist");
    let first = skill.run(&Config::new(), &args("persist", json!({"paths": []})));
    let cwd1 = first.result()["cwd"].as_str().expect("cwd").to_owned();
    assert_eq!(first.result()["cwd_writable"], json!(true), "{}", first.dump());
    assert!(crate::removed_soon(Path::new(&cwd1)), "run dir {cwd1} left behind");
    let marker = format!("{cwd1}/persist-marker");
    let second = skill.run(&Config::new(), &args("exists", json!({"path": marker})));
    blocked(&second);
    let second = skill.run(&Config::new(), &args("persist", json!({"paths": []})));
    let cwd2: Value = second.result()["cwd"].clone();
    assert_ne!(cwd2, json!(cwd1), "two runs shared a run dir");
    assert!(
        !cwd1.starts_with(skill.path().to_str().expect("utf-8")),
        "run dir inside the skill folder"
    );
    done(&skill, &g);
}

/// Cleaning a hostile run dir (2000-deep dirs, a FIFO, a mode-000
/// subtree, symlinks to `/` and to a planted dir) removes exactly the run
/// dir: nothing is followed out of it.
#[test]
fn hostile_run_dir_is_cleaned_without_following_links() {
    let Some(g) = shared("hostile_run_dir_is_cleaned_without_following_links") else { return };
    let mut planted = Planted(vec![]);
    let skill = attack("messy_run_dir").with("timeout_seconds", json!(10));
    let dir = planted.dir(outside(&skill, "/var/tmp", "keep"), 0o777);
    let kept = planted.file(dir.join("kept"), "kept", 0o666);
    let run =
        skill.run(&Config::new(), &args("messy_run_dir", json!({"target": dir, "depth": 2000})));
    let r = crate::allowed(&run);
    let cwd = r["cwd"].as_str().expect("cwd");
    assert!(crate::removed_soon(Path::new(cwd)), "run dir {cwd} left behind");
    assert!(kept.exists(), "cleanup followed a symlink out of the run dir");
    assert!(Path::new("/etc/passwd").exists());
    done(&skill, &g);
}

/// A run dir nested deeper than any thread's stack could recurse through
/// (a recursive removal aborted the executor) is removed, and the executor
/// runs the next request.
#[test]
fn a_run_dir_nested_past_any_stack_is_removed_and_the_executor_goes_on() {
    let Some(g) = shared("a_run_dir_nested_past_any_stack_is_removed") else { return };
    let mut planted = Planted(vec![]);
    let skill = attack("deep_run_dir").with("timeout_seconds", json!(60));
    let dir = planted.dir(outside(&skill, "/var/tmp", "keep"), 0o777);
    let depth = json!({"target": dir, "depth": 20_000});
    let run = skill.run(&Config::new(), &args("messy_run_dir", depth));
    let r = crate::allowed(&run);
    let cwd = Path::new(r["cwd"].as_str().expect("cwd"));
    let gone = crate::poll(std::time::Duration::from_secs(60), || (!cwd.exists()).then_some(()));
    assert!(gone.is_some(), "run dir {} left behind", cwd.display());
    let next = skill.run(&Config::new(), &args("probe", json!({})));
    next.expect(policy::Outcome::Ok);
    done(&skill, &g);
}

/// Landlock does not cover file metadata, and uid 0 owns the host's files:
/// a run granted root (no capabilities) cannot change the mode, owner,
/// extended attributes or times of a root-owned file outside the box, by
/// path (`/var/tmp`) or through a read-only descriptor (a file in the
/// skill's own folder, which Landlock lets it open), nor take a lease on
/// it. Unsandboxed as root every probe works; each writes back what the
/// file has, and the file is checked unchanged after the run.
#[test]
fn granted_root_cannot_change_file_metadata() {
    let Some(g) = shared("granted_root_cannot_change_file_metadata") else { return };
    let mut planted = Planted(vec![]);
    let (skill, config) = as_root("metadata_root");
    let outside = planted.file(outside(&skill, "/var/tmp", "meta"), "x", 0o600);
    let inside = skill.path().join("readable");
    std::fs::write(&inside, "x").expect("a file in the skill folder");
    set_mode(&inside, 0o644);
    let a = args("metadata", json!({"path": outside, "fd_path": inside}));
    let stamp = |p: &Path| {
        let m = std::fs::metadata(p).expect("stat");
        (m.mode(), m.uid(), m.gid(), m.modified().ok())
    };
    let before = (stamp(&outside), stamp(&inside));
    let base = unsandboxed(Path::new(crate::ATTACK), 0, 0, &a);
    assert_eq!(
        base["errnos"].as_object().map(|e| e.values().all(|v| v == 0)),
        Some(true),
        "baseline: {base}"
    );
    let run = skill.run(&config, &a);
    ran_as_root(&run);
    let r = blocked(&run);
    let errnos = r["errnos"].as_object().expect("errnos");
    assert_eq!(errnos.len(), 10, "every probe ran: {r}");
    for (call, e) in errnos {
        assert_eq!(e, &json!(libc::EPERM), "{call}: {r}");
    }
    assert_eq!((stamp(&outside), stamp(&inside)), before, "a file's metadata changed");
    done(&skill, &g);
}

/// The dedicated run-as user owns nothing outside its run directory and
/// keeps changing its own files' metadata there (`touch`, `tar`, `cp -p`).
#[test]
fn the_skill_user_changes_its_own_files_metadata() {
    let Some(g) = shared("the_skill_user_changes_its_own_files_metadata") else { return };
    let skill = attack("metadata_own");
    let a = args("metadata", json!({"path": "mine", "fd_path": "also-mine", "create": true}));
    let run = skill.run(&Config::new(), &a);
    let r = allowed(&run);
    let errnos = r["errnos"].as_object().expect("errnos");
    assert_eq!(errnos.len(), 10, "every probe ran: {r}");
    for (call, e) in errnos {
        // user.* extended attributes and chattr flags are not supported
        // on every tmpfs.
        let unsupported = [libc::EOPNOTSUPP, libc::ENOTTY, libc::EINVAL];
        let ok = e == &json!(0)
            || ((call.ends_with("setxattr") || call == "setflags")
                && unsupported.iter().any(|u| e == &json!(u)));
        assert!(ok, "{call}: {r}");
    }
    done(&skill, &g);
}

/// A capability over other users' files (`CAP_FOWNER` here) locks file
/// metadata even for the dedicated run-as user: granted it, a run still
/// cannot change a root-owned file's mode, owner, attributes or times.
#[test]
fn a_run_granted_cap_fowner_cannot_change_file_metadata() {
    let Some(g) = shared("a_run_granted_cap_fowner_cannot_change_file_metadata") else { return };
    let mut planted = Planted(vec![]);
    let skill = attack("metadata_fowner").with("sandbox", json!({"capabilities": ["CAP_FOWNER"]}));
    let config = Config::new().grant(skill.name(), "capabilities = [\"CAP_FOWNER\"]");
    let outside = planted.file(outside(&skill, "/var/tmp", "meta"), "x", 0o644);
    let inside = skill.path().join("readable");
    std::fs::write(&inside, "x").expect("a file in the skill folder");
    set_mode(&inside, 0o644);
    let before = std::fs::metadata(&outside).expect("stat").mode();
    let run = skill.run(&config, &args("metadata", json!({"path": outside, "fd_path": inside})));
    let sb = run.report.sandbox.as_ref().expect("sandbox report");
    assert_eq!(sb.capabilities, ["CAP_FOWNER"], "not granted:\n{}", run.dump());
    let r = blocked(&run);
    for (call, e) in r["errnos"].as_object().expect("errnos") {
        assert_eq!(e, &json!(libc::EPERM), "{call}: {r}");
    }
    assert_eq!(std::fs::metadata(&outside).expect("stat").mode(), before);
    done(&skill, &g);
}
