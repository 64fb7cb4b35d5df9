//! The runs tmpfs: how big it is and who mounts it.
//!
//! - Under the hardened unit: `ongrid-executor.service` keeps no
//!   `CAP_SYS_ADMIN`, so the executor cannot mount its tmpfs and the unit
//!   provides one (`TemporaryFileSystem=/run/ongrid/runs:...`). The real
//!   binary runs without `CAP_SYS_ADMIN` (setpriv drops it from the
//!   bounding set): with the unit's tmpfs mounted on `<runtime_dir>/runs`
//!   the report has no `disk:` shortfall and the mount is left in place;
//!   without one the shortfall is reported (the control), and so is a
//!   provided tmpfs too small for every run slot's run at its memory bound.
//! - As root: the executor's own tmpfs (made fresh, or an earlier
//!   instance's grown) holds every slot's run at its memory bound and
//!   counts no inodes, as the run itself sees it (`stat -f .`).
//!
//! Root only (mounts, the sandbox); as another user it prints SKIP.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn can_run() -> bool {
    if !testkit::can_run("runs tmpfs tests") {
        return false;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("SKIP: setpriv (util-linux) missing");
        return false;
    }
    true
}

fn mounted(path: &Path) -> bool {
    let path = std::fs::canonicalize(path).unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == path.to_str())
}

/// How the test sets `<runtime_dir>/runs` up before the run.
enum Before {
    /// Nothing mounted.
    Nothing,
    /// A tmpfs with this source and these options, as systemd's
    /// `TemporaryFileSystem=` (source `tmpfs`) or an earlier executor
    /// (source `ongrid-runs`) mounts it.
    Mounted(&'static str, String),
}

/// What a run saw: the report's `sandbox.degraded`, its result (`stat -f`
/// of its run directory), and whether its runs tmpfs has a memory cgroup
/// under it.
struct Seen {
    degraded: Vec<String>,
    result: Value,
    memcg: bool,
}

/// The options of the unit's `TemporaryFileSystem=/run/ongrid/runs:...`.
fn unit_options() -> String {
    let unit = include_str!("../../packaging/systemd/ongrid-executor.service");
    unit.lines()
        .find_map(|l| l.strip_prefix("TemporaryFileSystem=/run/ongrid/runs:"))
        .expect("the unit mounts a runs tmpfs")
        .to_owned()
}

/// Runs a skill that reports its run directory's filesystem (`stat -f`)
/// with `ongrid-executor run --json`, without CAP_SYS_ADMIN unless
/// `sys_admin`, after `before`.
fn run(before: &Before, sys_admin: bool) -> Seen {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let skills = dir.path().join("skills/ok");
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(
        skills.join("skill.json"),
        r#"{"name":"ok","description":"t","entry":"run.sh"}"#,
    )
    .unwrap();
    std::fs::write(
        skills.join("run.sh"),
        "#!/bin/sh\nexec /usr/bin/stat -f -c '{\"blocks\":%b,\"block_size\":%S,\"inodes\":%c}' .\n",
    )
    .unwrap();
    std::fs::set_permissions(skills.join("run.sh"), std::fs::Permissions::from_mode(0o755))
        .unwrap();
    let runtime = dir.path().join("rt");
    let runs = runtime.join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    if let Before::Mounted(source, options) = before {
        let mut flags = nix::mount::MsFlags::empty();
        let mut data = Vec::new();
        for o in options.split(',') {
            match o {
                "nosuid" => flags |= nix::mount::MsFlags::MS_NOSUID,
                "nodev" => flags |= nix::mount::MsFlags::MS_NODEV,
                "noexec" => flags |= nix::mount::MsFlags::MS_NOEXEC,
                o => data.push(o),
            }
        }
        nix::mount::mount(
            Some(*source),
            &runs,
            Some("tmpfs"),
            flags,
            Some(data.join(",").as_str()),
        )
        .unwrap();
    }
    let config = dir.path().join("executor.toml");
    std::fs::write(
        &config,
        format!("roots = [{:?}]\nruntime_dir = {:?}\n", dir.path().join("skills"), runtime),
    )
    .unwrap();
    let mut cmd = Command::new("setpriv");
    if !sys_admin {
        cmd.args(["--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]);
    }
    let out = cmd
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_ongrid-executor"))
        .args(["run", "--json", "--manifest"])
        .arg(skills.join("skill.json"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let still = mounted(&runs);
    if let Before::Mounted(..) = before {
        let _ = nix::mount::umount2(&runs, nix::mount::MntFlags::MNT_DETACH);
    }
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["outcome"], "ok", "{report}");
    match before {
        Before::Mounted("tmpfs", _) => assert!(still, "the provided tmpfs must stay mounted"),
        // The executor's own mount goes with its last user.
        _ => assert!(!still, "the runs tmpfs is left mounted"),
    }
    Seen {
        degraded: report["sandbox"]["degraded"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect(),
        result: report["result"].clone(),
        memcg: !report["sandbox"]["cgroup"]["memory"].is_null(),
    }
}

fn disk_notes(seen: &Seen) -> Vec<&String> {
    seen.degraded.iter().filter(|d| d.starts_with("disk:")).collect()
}

#[test]
fn the_units_tmpfs_is_used_without_cap_sys_admin() {
    if !can_run() {
        return;
    }
    let with = run(&Before::Mounted("tmpfs", unit_options()), false);
    assert!(disk_notes(&with).is_empty(), "{:?}", with.degraded);
    let without = run(&Before::Nothing, false);
    assert!(
        without.degraded.iter().any(|d| d.starts_with("disk: cannot mount a tmpfs")),
        "control: without a provided tmpfs the shortfall must show: {:?}",
        without.degraded
    );
}

/// 16 runs at 512 MiB (the defaults) need 8 GiB: a provided tmpfs of 16 MiB
/// that counts inodes lets runs fill it for one another, and every report
/// says so.
#[test]
fn a_provided_tmpfs_too_small_for_every_slot_is_reported() {
    if !can_run() {
        return;
    }
    let small = run(&Before::Mounted("tmpfs", "mode=0711,size=16m,nosuid,nodev".to_owned()), false);
    if !small.memcg {
        eprintln!("SKIP: no memory cgroup here: the tmpfs alone bounds the runs' files");
        return;
    }
    let notes = disk_notes(&small);
    assert_eq!(notes.len(), 1, "{:?}", small.degraded);
    for needle in
        ["holds 16 MiB where 16 runs at 512 MiB need 8192", "counts inodes", "for one another"]
    {
        assert!(notes[0].contains(needle), "{needle:?} not in {notes:?}");
    }
}

/// A provided tmpfs without a size limit (`size=0`) and without an inode
/// count holds every slot's run: no note.
#[test]
fn a_provided_tmpfs_without_limits_is_enough() {
    if !can_run() {
        return;
    }
    let open = run(
        &Before::Mounted("tmpfs", "mode=0711,size=0,nr_inodes=0,nosuid,nodev".to_owned()),
        false,
    );
    assert!(disk_notes(&open).is_empty(), "{:?}", open.degraded);
}

/// The executor's own tmpfs, as the run sees it: room for every slot's run
/// at its memory bound (8 GiB with the defaults) and no inode count, both
/// when it mounts it and when it finds an earlier instance's smaller one
/// (which it grows in place).
#[test]
fn the_executors_own_tmpfs_holds_every_slot_at_its_memory_bound() {
    if !can_run() {
        return;
    }
    let earlier = "mode=0711,size=1g,nr_inodes=1000,nosuid,nodev,noexec".to_owned();
    for before in [Before::Nothing, Before::Mounted("ongrid-runs", earlier)] {
        let seen = run(&before, true);
        if !seen.memcg {
            eprintln!("SKIP: no memory cgroup here: the tmpfs alone bounds the runs' files");
            return;
        }
        assert!(disk_notes(&seen).is_empty(), "{:?}", seen.degraded);
        let r = &seen.result;
        let bytes = r["blocks"].as_u64().unwrap() * r["block_size"].as_u64().unwrap();
        assert_eq!(bytes, 8 << 30, "{r}");
        assert_eq!(r["inodes"], 0, "{r}");
    }
}

/// An earlier instance's mount without a size limit but with an inode
/// count: its inodes are uncounted, and it stays without a size limit.
#[test]
fn an_earlier_unlimited_mount_stays_unlimited() {
    if !can_run() {
        return;
    }
    let earlier = "mode=0711,size=0,nr_inodes=1000,nosuid,nodev,noexec".to_owned();
    let seen = run(&Before::Mounted("ongrid-runs", earlier), true);
    if !seen.memcg {
        eprintln!("SKIP: no memory cgroup here: the tmpfs alone bounds the runs' files");
        return;
    }
    assert!(disk_notes(&seen).is_empty(), "{:?}", seen.degraded);
    assert_eq!(seen.result["blocks"], 0, "a size limit was set: {}", seen.result);
    assert_eq!(seen.result["inodes"], 0, "{}", seen.result);
}
