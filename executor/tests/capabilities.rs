//! `ongrid-executor serve`, the real binary started as root, keeps exactly
//! the capabilities it needs plus those `executor.toml` grants to skills:
//! read from `/proc/<pid>/status` (CapInh, CapPrm, CapEff, CapBnd, CapAmb).
//!
//! Root only; as another user each test prints SKIP.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use executor::host::capabilities::NEEDED;

/// The five capability masks of `/proc/<pid>/status`, in file order.
fn masks(status: &str) -> [(String, u64); 5] {
    ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"].map(|key| {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .unwrap_or_else(|| panic!("{key} missing from\n{status}"));
        (key.to_owned(), u64::from_str_radix(line.trim(), 16).unwrap())
    })
}

/// Starts `serve` with `extra` appended to a minimal configuration and
/// returns it once its socket exists.
fn serve(dir: &Path, extra: &str) -> Child {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = dir.join("skills");
    std::fs::create_dir(&root).unwrap();
    let socket = dir.join("x.sock");
    let config = dir.join("executor.toml");
    let text = format!(
        "roots = [{root:?}]\nruntime_dir = {:?}\nsocket = {socket:?}\n{extra}",
        dir.join("rt")
    );
    std::fs::write(&config, text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ongrid-executor"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--stop-on-stdin-eof")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("serve exited before binding: {status}");
        }
        assert!(Instant::now() < deadline, "serve did not bind {}", socket.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Stops `child` (end of its stdin) and waits for it.
fn stop(mut child: Child) {
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts the served executor's sets: bounding, permitted and effective
/// are `keep` within what this test process itself had; inheritable and
/// ambient are empty.
fn assert_sets(extra: &str, keep: u64) {
    let dir = tempfile::tempdir().unwrap();
    let child = serve(dir.path(), extra);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    stop(child);
    let own = masks(&std::fs::read_to_string("/proc/self/status").unwrap());
    let seen = masks(&status);
    let want = |key: &str| match key {
        "CapInh" | "CapAmb" => 0,
        "CapBnd" => own[3].1 & keep,
        _ => own[1].1 & keep,
    };
    for (key, value) in &seen {
        assert_eq!(*value, want(key), "{key}: {value:#x}, want {:#x}\n{status}", want(key));
    }
    assert!(seen[2].1 & (1 << 7) != 0, "CAP_SETUID kept: {status}");
}

/// The capabilities serve keeps, written out here by kernel number, apart
/// from the executor's own list: a capability added to that list fails
/// this test until it is added here too, on purpose.
const KEPT: [(&str, u32); 16] = [
    ("CAP_CHOWN", 0),
    ("CAP_DAC_OVERRIDE", 1),
    ("CAP_FOWNER", 3),
    ("CAP_KILL", 5),
    ("CAP_SETGID", 6),
    ("CAP_SETUID", 7),
    ("CAP_SETPCAP", 8),
    ("CAP_NET_ADMIN", 12),
    ("CAP_SYS_CHROOT", 18),
    ("CAP_SYS_PTRACE", 19),
    ("CAP_SYS_ADMIN", 21),
    ("CAP_SYS_NICE", 23),
    ("CAP_SYS_RESOURCE", 24),
    ("CAP_AUDIT_CONTROL", 30),
    ("CAP_AUDIT_READ", 37),
    ("CAP_BPF", 39),
];

fn needed() -> u64 {
    let kept = KEPT.iter().fold(0u64, |m, (_, n)| m | (1 << n));
    let listed = NEEDED.iter().fold(0, |m, c| m | c.bitmask());
    let names: Vec<&str> = KEPT.iter().map(|(name, _)| *name).collect();
    assert_eq!(listed, kept, "NEEDED is not {names:?}: {listed:#x}, want {kept:#x}");
    kept
}

#[test]
fn serve_keeps_only_the_capabilities_it_needs() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: the capability drop happens only as root");
        return;
    }
    assert_sets("", needed());
}

#[test]
fn a_capability_granted_to_a_skill_is_kept() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: the capability drop happens only as root");
        return;
    }
    let grant = "\n[skills.ping]\ncapabilities = [\"CAP_NET_RAW\"]\n";
    let net_raw = 1u64 << 13;
    assert_sets(grant, needed() | net_raw);
}
