//! What the host offers, and the `SKIP:` convention.

use std::sync::OnceLock;

/// Returns true if and only if the test process runs as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Name of the user the executor runs skills as by default.
pub const SKILL_USER: &str = "ongrid-skill";

/// uid and gid of [`SKILL_USER`], creating the user (as `scripts/test` does)
/// when the test runs as root and it is missing.
///
/// # Panics
///
/// When the user is missing and cannot be created.
pub fn skill_user() -> (u32, u32) {
    static USER: OnceLock<(u32, u32)> = OnceLock::new();
    *USER.get_or_init(|| {
        if let Some(ids) = lookup(SKILL_USER) {
            return ids;
        }
        let status = std::process::Command::new("useradd")
            .args(["--system", "--user-group", "--no-create-home", "--home-dir"])
            .args(["/nonexistent", "--shell", "/usr/sbin/nologin", SKILL_USER])
            .status()
            .expect("run useradd");
        assert!(status.success() || lookup(SKILL_USER).is_some(), "useradd {SKILL_USER} failed");
        lookup(SKILL_USER).expect("user exists after useradd")
    })
}

/// uid and gid of a user, from the passwd database.
pub fn lookup(name: &str) -> Option<(u32, u32)> {
    let user = nix::unistd::User::from_name(name).ok()??;
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

/// Prepares the host for a sandbox case, or prints `SKIP: <reason>` and
/// returns false when this host cannot run it (not root).
///
/// Also lowers `RLIMIT_NPROC` of the test process (root itself is exempt,
/// every run-as user inherits it) so that a fork bomb escaping a broken
/// sandbox cannot exhaust this machine's pid space and take other work
/// down with it. The executor's own limits are what the cases check.
pub fn prepare(case: &str) -> bool {
    if !is_root() {
        println!("SKIP: {case}: the sandbox suite needs root (the executor drops to {SKILL_USER})");
        return false;
    }
    static SAFETY_NET: OnceLock<()> = OnceLock::new();
    SAFETY_NET.get_or_init(|| {
        use nix::sys::resource::{setrlimit, Resource};
        setrlimit(Resource::RLIMIT_NPROC, 4096, 4096).expect("set RLIMIT_NPROC safety net");
    });
    skill_user();
    true
}

/// Whether this process runs as root; else prints `SKIP: <suite> need
/// root (<why>)` and returns false.
pub fn root_or_skip(suite: &str, why: &str) -> bool {
    let root = is_root();
    if !root {
        println!("SKIP: {suite} need root ({why})");
    }
    root
}

/// Whether runs can be sandboxed here: root, and [`SKILL_USER`] exists
/// (`scripts/test` creates it); else prints the `SKIP:` line saying which
/// is missing and returns false.
pub fn can_run(suite: &str) -> bool {
    if !root_or_skip(suite, "the sandbox switches users") {
        return false;
    }
    if lookup(SKILL_USER).is_none() {
        println!("SKIP: run-as user {SKILL_USER} missing (scripts/test creates it)");
        return false;
    }
    true
}

/// Prints the standard skip line for a case this host cannot check.
pub fn skip(case: &str, reason: &str) {
    println!("SKIP: {case}: {reason}");
}

/// Reads a small `/proc/sys` value, trimmed.
pub fn sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}
