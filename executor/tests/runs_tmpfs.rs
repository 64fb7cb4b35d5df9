//! The runs tmpfs under the hardened unit: `ongrid-executor.service` keeps
//! no `CAP_SYS_ADMIN`, so the executor cannot mount its tmpfs and the unit
//! provides one (`TemporaryFileSystem=/run/ongrid/runs:...`). The real
//! binary runs without `CAP_SYS_ADMIN` (setpriv drops it from the bounding
//! set): with a tmpfs already mounted on `<runtime_dir>/runs` the report
//! has no `disk:` shortfall and the mount is left in place; without one the
//! shortfall is reported (the control).
//!
//! Root only (mounts, the sandbox); as another user it prints SKIP.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn can_run() -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: runs tmpfs tests need root");
        return false;
    }
    if nix::unistd::User::from_name("ongrid-skill").ok().flatten().is_none() {
        eprintln!("SKIP: run-as user ongrid-skill missing (scripts/test creates it)");
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

/// Runs a trivial skill with `ongrid-executor run --json` without
/// CAP_SYS_ADMIN; returns the report's `sandbox.degraded`.
fn degraded_without_sys_admin(premount: bool) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let skills = dir.path().join("skills/ok");
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(
        skills.join("skill.json"),
        r#"{"name":"ok","description":"t","entry":"run.sh"}"#,
    )
    .unwrap();
    std::fs::write(skills.join("run.sh"), "#!/bin/sh\necho '{\"ok\":true}'\n").unwrap();
    std::fs::set_permissions(skills.join("run.sh"), std::fs::Permissions::from_mode(0o755))
        .unwrap();
    let runtime = dir.path().join("rt");
    let runs = runtime.join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    if premount {
        // What systemd's TemporaryFileSystem= mounts: source "tmpfs".
        nix::mount::mount(
            Some("tmpfs"),
            &runs,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID
                | nix::mount::MsFlags::MS_NODEV
                | nix::mount::MsFlags::MS_NOEXEC,
            Some("mode=0711,size=16m"),
        )
        .unwrap();
    }
    let config = dir.path().join("executor.toml");
    std::fs::write(
        &config,
        format!("roots = [{:?}]\nruntime_dir = {:?}\n", dir.path().join("skills"), runtime),
    )
    .unwrap();
    let out = Command::new("setpriv")
        .args(["--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--"])
        .arg(env!("CARGO_BIN_EXE_ongrid-executor"))
        .args(["run", "--json", "--manifest"])
        .arg(skills.join("skill.json"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let still = mounted(&runs);
    if premount {
        let _ = nix::mount::umount2(&runs, nix::mount::MntFlags::MNT_DETACH);
    }
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["outcome"], "ok", "{report}");
    assert_eq!(still, premount, "the provided tmpfs must stay mounted (and none be made)");
    report["sandbox"]["degraded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_provided_tmpfs_is_used_without_cap_sys_admin() {
    if !can_run() {
        return;
    }
    let with = degraded_without_sys_admin(true);
    assert!(!with.iter().any(|d| d.starts_with("disk:")), "{with:?}");
    let without = degraded_without_sys_admin(false);
    assert!(
        without.iter().any(|d| d.starts_with("disk: cannot mount a tmpfs")),
        "control: without a provided tmpfs the shortfall must show: {without:?}"
    );
}
