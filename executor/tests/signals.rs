//! A skill starts with every signal at its default disposition and none
//! blocked, whatever the executor's own process ignores, catches or blocks.
//! Its own test binary: the process's signal dispositions are set here
//! before the first spawn (an engine reads which signals its process
//! ignores once, at its first spawn).

#![allow(unsafe_code)] // the test sets its own process's signal dispositions

use std::os::unix::fs::PermissionsExt;

use executor::{Config, Engine, RunRequest};
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use policy::Outcome;

extern "C" fn on_signal(_: i32) {}

/// One `Sig*:` line of the skill's `/proc/self/status`, as a bit mask.
fn mask(lines: &[String], name: &str) -> u64 {
    let sig: Vec<&String> = lines.iter().filter(|l| l.starts_with("Sig")).collect();
    let line = sig
        .iter()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} line in {sig:?}"));
    u64::from_str_radix(line[name.len()..].trim(), 16).unwrap()
}

#[test]
fn a_skill_starts_with_default_dispositions_and_an_empty_mask() {
    let root = nix::unistd::geteuid().is_root();
    if root && nix::unistd::User::from_name("ongrid-skill").ok().flatten().is_none() {
        eprintln!("SKIP: run-as user ongrid-skill missing (scripts/test creates it)");
        return;
    }
    // What a parent (nohup, a shell, a service manager) or a library may
    // leave on the executor's process: ignored, caught and blocked signals,
    // standard and real-time.
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    let catch = SigAction::new(SigHandler::Handler(on_signal), SaFlags::empty(), SigSet::empty());
    let rt = libc::SIGRTMIN() + 5;
    // SAFETY: installs a no-op handler or SIG_IGN in this test process.
    unsafe {
        signal::sigaction(Signal::SIGHUP, &ignore).unwrap();
        signal::sigaction(Signal::SIGUSR1, &ignore).unwrap();
        signal::sigaction(Signal::SIGUSR2, &catch).unwrap();
        signal::sigaction(Signal::SIGWINCH, &catch).unwrap();
        assert_eq!(libc::signal(rt, libc::SIG_IGN), libc::SIG_DFL);
        assert_eq!(
            libc::signal(rt + 1, on_signal as *const () as libc::sighandler_t),
            libc::SIG_DFL
        );
    }
    let mut blocked = SigSet::empty();
    blocked.add(Signal::SIGTERM);
    blocked.add(Signal::SIGALRM);
    blocked.thread_block().unwrap();

    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = dir.path().join("skill.json");
    std::fs::write(&manifest, r#"{"name":"signals","description":"t","entry":"run.sh"}"#).unwrap();
    let entry = dir.path().join("run.sh");
    // cat's own status: what sh was given, sh passes on (a non-interactive
    // sh keeps what it was started with ignored); cat catches nothing
    // itself (GNU grep would: its SIGSEGV handler).
    std::fs::write(&entry, "#!/bin/sh\ncat /proc/self/status >&2\necho '{}'\n").unwrap();
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755)).unwrap();

    let engine = Engine::new(Config::default()).unwrap();
    let rt_runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Twice: the first spawn and one after it.
    for _ in 0..2 {
        let mut lines = Vec::new();
        let mut sink = |l: &str| lines.push(l.to_owned());
        let req = RunRequest { manifest_path: manifest.clone(), args: b"{}".to_vec() };
        let report = rt_runtime.block_on(engine.run(req, &mut sink, std::future::pending()));
        assert_eq!(report.outcome, Outcome::Ok, "{report:?}");
        for name in ["SigBlk:", "SigIgn:", "SigCgt:"] {
            let sig: Vec<&String> = lines.iter().filter(|l| l.starts_with("Sig")).collect();
            assert_eq!(mask(&lines, name), 0, "{name} in {sig:?}");
        }
    }
}
