//! Privilege and kernel surface: who the skill is, what it
//! holds, and the syscalls and cross-process operations it is refused.

use std::path::Path;

use ongrid_tests::run::unsandboxed;
use ongrid_tests::{host, Config, Victim};
use serde_json::{json, Value};

use crate::{
    args, attack, blocked, blocked_with, exclusive, no_leftovers, shared, signals_scoped,
    syscall_denied,
};

const CAPS: [&str; 5] = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];

fn assert_unprivileged(run: &ongrid_tests::Run, r: &Value) {
    assert_eq!(r["status"]["NoNewPrivs"], json!("1"), "{}", run.dump());
    for cap in CAPS {
        assert_eq!(r["status"][cap], json!("0000000000000000"), "{cap} not empty:\n{}", run.dump());
    }
    let sb = run.report.sandbox.as_ref().expect("sandbox report");
    assert!(sb.no_new_privs, "report: no_new_privs false:\n{}", run.dump());
    assert!(sb.capabilities.is_empty(), "report: capabilities kept:\n{}", run.dump());
}

/// The skill runs as `ongrid-skill` with no supplementary groups,
/// and the report says so.
#[test]
fn runs_as_the_skill_user() {
    let Some(g) = shared("runs_as_the_skill_user") else { return };
    let (uid, gid) = host::skill_user();
    let skill = attack("identity");
    let run = skill.run(&Config::new(), &args("probe", json!({})));
    let r = run.result();
    for k in ["uid", "euid"] {
        assert_eq!(r[k], json!(uid), "{k}:\n{}", run.dump());
    }
    for k in ["gid", "egid"] {
        assert_eq!(r[k], json!(gid), "{k}:\n{}", run.dump());
    }
    assert_eq!(r["status"]["Groups"], json!(""), "supplementary groups kept:\n{}", run.dump());
    let sb = run.report.sandbox.as_ref().expect("sandbox report");
    assert_eq!((sb.uid, sb.gid), (uid, gid), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// NoNewPrivs 1 and every capability set empty.
#[test]
fn no_capabilities_and_no_new_privs() {
    let Some(g) = shared("no_capabilities_and_no_new_privs") else { return };
    let skill = attack("caps");
    let run = skill.run(&Config::new(), &args("probe", json!({})));
    assert_unprivileged(&run, &run.result());
    no_leftovers(&skill, &g);
}

/// Run as a granted root, every capability set is still empty.
#[test]
fn granted_root_has_no_capabilities() {
    let Some(g) = shared("granted_root_has_no_capabilities") else { return };
    let skill = attack("caps_root").with("sandbox", json!({"run_as": "root"}));
    let config = Config::new().grant(skill.name(), "run_as = [\"root\"]");
    let run = skill.run(&config, &args("probe", json!({})));
    let r = run.result();
    assert_eq!(r["uid"], json!(0), "{}", run.dump());
    assert_unprivileged(&run, &r);
    no_leftovers(&skill, &g);
}

/// Only fds 0, 1 and 2 are open.
#[test]
fn only_standard_fds_are_open() {
    let Some(g) = shared("only_standard_fds_are_open") else { return };
    let skill = attack("fds");
    let run = skill.run(&Config::new(), &args("probe", json!({})));
    let result = run.result();
    let fds: Vec<&String> = result["fds"].as_object().expect("fds").keys().collect();
    assert_eq!(fds, ["0", "1", "2"], "inherited fds:\n{}", run.dump());
    no_leftovers(&skill, &g);
}

/// No controlling terminal, own session.
#[test]
fn no_controlling_terminal_and_own_session() {
    let Some(g) = shared("no_controlling_terminal_and_own_session") else { return };
    let skill = attack("tty");
    let run = skill.run(&Config::new(), &args("probe", json!({})));
    let r = run.result();
    assert_eq!(r["tty_nr"], json!(0), "controlling tty:\n{}", run.dump());
    assert_eq!(r["session"], r["pid"], "not a session leader (no setsid):\n{}", run.dump());
    no_leftovers(&skill, &g);
}

/// A seccomp filter is attached and reported.
#[test]
fn seccomp_filter_is_attached() {
    let Some(g) = shared("seccomp_filter_is_attached") else { return };
    let skill = attack("seccomp");
    let run = skill.run(&Config::new(), &args("probe", json!({})));
    assert_eq!(run.result()["status"]["Seccomp"], json!("2"), "{}", run.dump());
    assert!(run.report.sandbox.as_ref().is_some_and(|s| s.seccomp), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// One syscall the filter must deny. Where the attack works on this host
/// outside the sandbox (as the same user), that is checked first, so the
/// denial is the sandbox's doing.
fn denied(name: &str, baseline: bool) {
    let case = format!("syscall_{name}");
    let Some(g) = shared(&case) else { return };
    let a = args("syscall", json!({"name": name}));
    if baseline {
        let (uid, gid) = host::skill_user();
        let base = unsandboxed(Path::new(crate::ATTACK), uid, gid, &a);
        if base["succeeded"] != json!(true) && host_policy_refuses(name) {
            host::skip(&case, &format!("baseline: the host's own policy refuses {name}: {base}"));
        } else {
            assert_eq!(
                base["succeeded"],
                json!(true),
                "baseline: {name} fails even unsandboxed: {base}"
            );
        }
    }
    let skill = attack(&case);
    let run = skill.run(&Config::new(), &a);
    syscall_denied(&run);
    no_leftovers(&skill, &g);
}

/// The host itself refuses `name` to an unprivileged user, so no
/// baseline can show it working: `perf_event_open` under
/// `kernel.perf_event_paranoid` 3 (Debian's default), which only Debian's
/// kernels have.
fn host_policy_refuses(name: &str) -> bool {
    name == "perf_event_open"
        && host::sysctl("/proc/sys/kernel/perf_event_paranoid")
            .and_then(|v| v.parse::<i32>().ok())
            .is_some_and(|v| v > 2)
}

macro_rules! denied_syscalls {
    ($($test:ident: $name:literal, $baseline:literal;)*) => {$(
        #[doc = concat!("Seccomp denies `", $name, "`.")]
        #[test]
        fn $test() {
            denied($name, $baseline);
        }
    )*};
}

denied_syscalls! {
    seccomp_denies_io_uring_setup: "io_uring_setup", true;
    seccomp_denies_keyctl: "keyctl", true;
    seccomp_denies_add_key: "add_key", true;
    seccomp_denies_unshare_newuser: "unshare_user", true;
    seccomp_denies_clone_newns: "clone_newns", true;
    seccomp_denies_clone3_newuser: "clone3_newuser", true;
    seccomp_denies_int80_32bit_abi: "int80", true;
    seccomp_denies_perf_event_open: "perf_event_open", true;
    seccomp_denies_bpf: "bpf", false;
    seccomp_denies_mount: "mount", false;
    seccomp_denies_kexec_load: "kexec_load", false;
    seccomp_denies_tiocsti: "tiocsti", false;
    seccomp_denies_tiocsti_high_bits: "tiocsti_high", false;
    seccomp_denies_fanotify_init: "fanotify_init", true;
    seccomp_denies_inotify_init1: "inotify_init1", true;
    seccomp_denies_linux_aio_contexts: "io_setup", true;
}

/// The 16-bit segment table (x86-64 only).
#[cfg(target_arch = "x86_64")]
#[test]
fn seccomp_denies_modify_ldt() {
    denied("modify_ldt", true);
}

fn victim() -> Victim {
    let (uid, gid) = host::skill_user();
    Victim::spawn(Path::new(crate::ATTACK), uid, gid)
}

/// `ptrace` of a same-user process outside the sandbox fails (it
/// works unsandboxed).
#[test]
fn ptrace_of_a_same_user_process_fails() {
    let Some(g) = shared("ptrace_of_a_same_user_process_fails") else { return };
    let mut v = victim();
    let (uid, gid) = host::skill_user();
    let a = args("ptrace", json!({"pid": v.pid}));
    let base = unsandboxed(Path::new(crate::ATTACK), uid, gid, &a);
    assert_eq!(base["succeeded"], json!(true), "baseline: ptrace fails unsandboxed: {base}");
    let skill = attack("ptrace");
    let run = skill.run(&Config::new(), &a);
    blocked_with(&run, &[libc::EPERM, libc::EACCES, libc::ENOSYS]);
    assert!(v.alive());
    no_leftovers(&skill, &g);
}

/// `process_vm_readv` of a same-user process outside the sandbox
/// fails (it reads the secret unsandboxed).
#[test]
fn process_vm_readv_of_a_same_user_process_fails() {
    let Some(g) = shared("process_vm_readv_of_a_same_user_process_fails") else { return };
    let v = victim();
    let (uid, gid) = host::skill_user();
    let a = args("process_vm_readv", json!({"pid": v.pid, "addr": v.addr}));
    let base = unsandboxed(Path::new(crate::ATTACK), uid, gid, &a);
    assert_eq!(base["read"], json!("ONGRID-SECRET-01"), "baseline: read fails unsandboxed: {base}");
    let skill = attack("vm_readv");
    let run = skill.run(&Config::new(), &a);
    blocked_with(&run, &[libc::EPERM, libc::EACCES, libc::ENOSYS]);
    no_leftovers(&skill, &g);
}

/// The nice value (field 19 of `/proc/PID/stat`) and core limit of `pid`.
fn sched_state(pid: i32) -> (String, String) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_comm = &stat[stat.rfind(')').expect("comm") + 2..];
    let nice = after_comm.split(' ').nth(16).unwrap_or("").to_owned();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let core =
        limits.lines().find(|l| l.starts_with("Max core file size")).unwrap_or("").to_owned();
    (nice, core)
}

/// Every call of the `interfere` case failed with EPERM.
fn all_refused(run: &ongrid_tests::Run) {
    let r = blocked(run);
    let errnos = r["errnos"].as_object().cloned().unwrap_or_default();
    assert_eq!(errnos.len(), 5, "{}", run.dump());
    for (call, e) in &errnos {
        assert_eq!(e, &json!(libc::EPERM), "{call}:\n{}", run.dump());
    }
}

/// A run cannot set the limits, niceness, CPUs, scheduling policy
/// or I/O class of a same-user process outside the sandbox (each works
/// unsandboxed), which Landlock's signal scope does not cover.
#[test]
fn another_process_cannot_be_reniced_or_limited() {
    let Some(g) = shared("another_process_cannot_be_reniced_or_limited") else { return };
    let (uid, gid) = host::skill_user();
    let mut first = victim();
    let base = unsandboxed(
        Path::new(crate::ATTACK),
        uid,
        gid,
        &args("interfere", json!({"pid": first.pid})),
    );
    assert_eq!(base["done"].as_array().map(Vec::len), Some(5), "baseline: {base}");
    assert_ne!(sched_state(first.pid).0, "0", "baseline: the victim was not reniced");
    let mut v = victim();
    let before = sched_state(v.pid);
    let skill = attack("interfere");
    let run = skill.run(&Config::new(), &args("interfere", json!({"pid": v.pid})));
    all_refused(&run);
    assert_eq!(sched_state(v.pid), before, "the victim changed:\n{}", run.dump());
    assert!(v.alive() && first.alive());
    no_leftovers(&skill, &g);
}

/// As granted root, the run cannot set the limits of the executor side of
/// the run either (an `RLIMIT_CPU` of 1 s would have the kernel kill it).
#[test]
fn granted_root_cannot_limit_the_executor() {
    let Some(g) = shared("granted_root_cannot_limit_the_executor") else { return };
    let skill = attack("interfere_root").with("sandbox", json!({"run_as": "root"}));
    let config = Config::new().grant(skill.name(), "run_as = [\"root\"]");
    let run = skill.run(&config, &args("interfere", json!({"pid": 0})));
    assert_eq!(run.report.sandbox.as_ref().map(|s| s.uid), Some(0), "{}", run.dump());
    all_refused(&run);
    no_leftovers(&skill, &g);
}

/// The same calls on the run itself (pid 0, as libc's wrappers pass) still
/// work: `nice`, `setrlimit`, `sched_setaffinity(0, ..)`.
#[test]
fn a_run_may_still_renice_and_limit_itself() {
    let Some(g) = shared("a_run_may_still_renice_and_limit_itself") else { return };
    let skill = attack("interfere_self");
    let run = skill.run(&Config::new(), &args("interfere_self", json!({})));
    let r = run.result();
    assert_eq!(r["done"].as_array().map(Vec::len), Some(5), "{}", run.dump());
    no_leftovers(&skill, &g);
}

/// SysV shared memory, message queues and semaphores are refused:
/// their objects would outlive the run, escape its memory limit and be
/// shared with every other run (each works unsandboxed).
#[test]
fn sysv_ipc_is_refused() {
    let Some(g) = shared("sysv_ipc_is_refused") else { return };
    let (uid, gid) = host::skill_user();
    let base = unsandboxed(Path::new(crate::ATTACK), uid, gid, &args("sysv_ipc", json!({})));
    assert_eq!(base["made"].as_array().map(Vec::len), Some(3), "baseline: {base}");
    let skill = attack("sysv_ipc");
    let run = skill.run(&Config::new(), &args("sysv_ipc", json!({})));
    let r = blocked(&run);
    for call in ["shmget", "msgget", "semget"] {
        assert_eq!(r["errnos"][call], json!(libc::EPERM), "{call}:\n{}", run.dump());
    }
    no_leftovers(&skill, &g);
}

/// A POSIX message queue of the run-as user, made outside the sandbox,
/// survives a run's `mq_unlink` (Landlock does not cover it; seccomp
/// does), and the run cannot make one of its own either.
#[test]
fn posix_message_queues_are_refused() {
    let Some(g) = shared("posix_message_queues_are_refused") else { return };
    let (uid, gid) = host::skill_user();
    let name = format!("ongrid-sbx-mq-{}", std::process::id());
    let mq = |case: &str| {
        let a = args(case, json!({"name": name}));
        unsandboxed(Path::new(crate::ATTACK), uid, gid, &a)
    };
    assert_eq!(mq("mq_create")["succeeded"], json!(true), "baseline: mq_open");
    let skill = attack("posix_mq");
    let unlink = skill.run(&Config::new(), &args("mq_unlink", json!({"name": name})));
    let create =
        skill.run(&Config::new(), &args("mq_create", json!({"name": format!("{name}-b")})));
    // Removing it outside proves it was still there, whatever the asserts say.
    let gone = mq("mq_unlink");
    assert_eq!(gone["succeeded"], json!(true), "the queue is gone: {gone}\n{}", unlink.dump());
    syscall_denied(&unlink);
    syscall_denied(&create);
    no_leftovers(&skill, &g);
}

/// Signalling a same-user process outside the sandbox fails (where the
/// kernel scopes signals; elsewhere the report says it does not).
#[test]
fn cannot_signal_a_same_user_process() {
    let Some(g) = shared("cannot_signal_a_same_user_process") else { return };
    let mut v = victim();
    let skill = attack("signal");
    let probe = skill.run(&Config::new(), &args("proc_view", json!({})));
    if signals_scoped("cannot_signal_a_same_user_process", &probe) {
        let run = skill.run(&Config::new(), &args("kill", json!({"pid": v.pid})));
        blocked_with(&run, &[libc::EPERM]);
    }
    assert!(v.alive(), "the victim was killed from inside the sandbox");
    no_leftovers(&skill, &g);
}

/// As granted root, signalling the executor side of the run fails (where
/// the kernel scopes signals; elsewhere the report says it does not).
#[test]
fn granted_root_cannot_signal_the_executor() {
    let Some(g) = shared("granted_root_cannot_signal_the_executor") else { return };
    let skill = attack("signal_executor").with("sandbox", json!({"run_as": "root"}));
    let config = Config::new().grant(skill.name(), "run_as = [\"root\"]");
    let probe = skill.run(&config, &args("proc_view", json!({})));
    if signals_scoped("granted_root_cannot_signal_the_executor", &probe) {
        let run = skill.run(&config, &args("kill", json!({"pid": 0})));
        blocked_with(&run, &[libc::EPERM]);
    }
    no_leftovers(&skill, &g);
}

/// `kill(-1, SIGKILL)` is refused (`EPERM`: on a kernel without Landlock's
/// signal scoping it would reach every process of the run-as user) and
/// reaches nothing outside the sandbox (and does kill a same-user process
/// when run unsandboxed).
#[test]
fn kill_minus_one_spares_the_outside() {
    let Some(g) = exclusive("kill_minus_one_spares_the_outside") else { return };
    let mut v = victim();
    let skill = attack("kill_all");
    let run = skill.run(&Config::new(), &args("kill_all", json!({})));
    run.expect(policy::Outcome::Ok);
    let r = run.result();
    assert_eq!((&r["ret"], &r["errno"]), (&json!(-1), &json!(libc::EPERM)), "{}", run.dump());
    assert!(v.alive(), "kill(-1) from the sandbox killed a process outside it:\n{}", run.dump());
    let mut scope = g.scope();
    scope.exclude.push(v.pid);
    ongrid_tests::procs::assert_no_leftovers(&skill, &scope);
    let (uid, gid) = host::skill_user();
    unsandboxed(Path::new(crate::ATTACK), uid, gid, &args("kill_all", json!({})));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while v.alive() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!v.alive(), "baseline: unsandboxed kill(-1) did not reach the victim");
}

/// A skill cannot loosen its cgroup limits or leave its cgroup, even as a
/// granted root whose uid owns the cgroup files.
#[test]
fn cgroup_limits_and_membership_are_fixed() {
    let Some(g) = shared("cgroup_limits_and_membership_are_fixed") else { return };
    // Some write reached a real cgroup file and was refused (a path that
    // does not exist on this host's layout proves nothing).
    let refused = |run: &ongrid_tests::Run| {
        let r = blocked(run);
        let errnos = r["errnos"].as_object().cloned().unwrap_or_default();
        let real = errnos
            .values()
            .filter_map(serde_json::Value::as_i64)
            .any(|e| [libc::EACCES, libc::EPERM, libc::EROFS].iter().any(|x| i64::from(*x) == e));
        assert!(real, "no cgroup file was reached and refused:\n{}", run.dump());
    };
    let skill = attack("cgroup_escape");
    let run = skill.run(&Config::new(), &args("cgroup_escape", json!({})));
    refused(&run);
    let skill = attack("cgroup_escape_root").with("sandbox", json!({"run_as": "root"}));
    let config = Config::new().grant(skill.name(), "run_as = [\"root\"]");
    let run = skill.run(&config, &args("cgroup_escape", json!({})));
    assert_eq!(run.report.sandbox.as_ref().map(|s| s.uid), Some(0), "{}", run.dump());
    refused(&run);
    no_leftovers(&skill, &g);
}

/// Granted root cannot write kernel tunables through /proc/sys (it writes
/// the current hostname back, harmless should it get through).
#[test]
fn granted_root_cannot_write_proc_sys() {
    let Some(g) = shared("granted_root_cannot_write_proc_sys") else { return };
    let skill = attack("proc_sys").with("sandbox", json!({"run_as": "root"}));
    let config = Config::new().grant(skill.name(), "run_as = [\"root\"]");
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let a = json!({"path": "/proc/sys/kernel/hostname", "data": hostname.trim()});
    let run = skill.run(&config, &args("write", a));
    blocked_with(&run, &[libc::EACCES, libc::EPERM, libc::EROFS]);
    no_leftovers(&skill, &g);
}
