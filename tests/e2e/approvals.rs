//! The "Permissions and approvals" walk-through of docs/operating.md (keygen,
//! a dangerous skill, `up --config`, refused without approvals, approve,
//! run, replay refused, audit), run as written with the workspace's
//! binaries on `PATH`.

use std::path::Path;
use std::process::Command;

use crate::harness::{bin, temp_dir};

/// The first fenced `sh` block of docs/operating.md's "Permissions and
/// approvals".
fn doc_walkthrough() -> String {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operating.md");
    let text = std::fs::read_to_string(doc).unwrap();
    let section = text
        .split("\n## Permissions and approvals")
        .nth(1)
        .expect("docs/operating.md has ## Permissions and approvals");
    let block = section.split("```sh\n").nth(1).expect("a ```sh block");
    block.split("\n```").next().unwrap().to_owned()
}

#[test]
fn the_approval_walkthrough_runs_as_written() {
    if nix::unistd::geteuid().is_root() {
        ongrid_tests::host::skill_user();
    }
    let script = doc_walkthrough();
    let (_tmp, dir) = temp_dir("ongrid-e2e-approvals-");
    let bin_dir = bin("ongrid-skill").parent().unwrap().to_path_buf();
    bin("ongrid-executor");
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("timeout")
        .args(["120", "bash", "-c"])
        .arg(format!("set -e\n{script}"))
        .current_dir(&dir)
        .env("PATH", path)
        .env_remove("ONGRID_SOCKET")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(dir.join("up.log")).unwrap_or_default();
    let ctx = format!("stdout:\n{stdout}\nstderr:\n{stderr}\nup.log:\n{log}");
    assert!(out.status.success(), "{ctx}");

    // Refused first, with the reason and exit 5.
    assert!(stderr.contains("approvals_required"), "{ctx}");
    assert_eq!(stdout.matches("refused: exit 5").count(), 2, "{ctx}");
    // The signed run printed its result: `cat` of the args as sent.
    assert!(stdout.lines().any(|l| l == r#"{"days": 30}"#), "{ctx}");
    // The replay was refused.
    assert!(stderr.contains("approval_replayed"), "{ctx}");
    // audit: a header and three rows, newest first.
    let table: Vec<&str> = stdout.lines().skip_while(|l| !l.starts_with("ID ")).collect();
    assert_eq!(table.len(), 4, "{ctx}");
    assert!(table[1].contains("deny") && table[1].contains("approval_replayed"), "{ctx}");
    assert!(table[2].contains("allow") && table[2].contains("dual_signed"), "{ctx}");
    assert!(table[3].contains("deny") && table[3].contains("approvals_required"), "{ctx}");
    // keygen's key files are private; up stopped and removed its sockets.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.join("alice.key")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    assert!(!dir.join("run/skilld.sock").exists(), "{ctx}");
    assert!(dir.join("run/audit.db").exists());
}
