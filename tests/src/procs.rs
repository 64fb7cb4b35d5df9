//! `/proc` and cgroup scans proving nothing of a run survives it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::skill::SkillDir;

/// One live process.
#[derive(Debug, Clone)]
pub struct Proc {
    /// pid.
    pub pid: i32,
    /// Real uid.
    pub uid: u32,
    /// One-letter state (`R`, `S`, `T`, `Z`...).
    pub state: char,
    /// Target of `/proc/PID/exe`, when readable.
    pub exe: Option<PathBuf>,
    /// `/proc/PID/cmdline`, NULs as spaces.
    pub cmdline: String,
}

/// Every process except this one, read from `/proc` (vanishing ones skipped).
pub fn scan() -> Vec<Proc> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if u32::try_from(pid) == Ok(me) {
            continue;
        }
        let base = e.path();
        let Ok(status) = std::fs::read_to_string(base.join("status")) else { continue };
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or("")
        };
        let uid = field("Uid:").split_whitespace().next().and_then(|u| u.parse().ok());
        let state = field("State:").chars().next().unwrap_or('?');
        let cmdline = std::fs::read(base.join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let exe = std::fs::read_link(base.join("exe")).ok();
        out.push(Proc { pid, uid: uid.unwrap_or(u32::MAX), state, exe, cmdline });
    }
    out
}

/// Every process but this one whose command line contains `needle`: not
/// a pattern but a marker unique to the test, so no other process on the
/// host matches.
pub fn with_cmdline(needle: &str) -> Vec<Proc> {
    scan().into_iter().filter(|p| p.cmdline.contains(needle)).collect()
}

/// Which processes count as the run's.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Also every process of this uid (only sound when no other run is live).
    pub uid: Option<u32>,
    /// pids to ignore (helpers the test itself started).
    pub exclude: Vec<i32>,
}

/// Live (non-zombie) processes belonging to the run of `skill`: executable
/// under its folder, or its marker in the command line, or the scope's uid.
pub fn leftovers(skill: &SkillDir, scope: &Scope) -> Vec<Proc> {
    let marker = skill.marker();
    scan()
        .into_iter()
        .filter(|p| !matches!(p.state, 'Z' | 'X') && !scope.exclude.contains(&p.pid))
        .filter(|p| {
            p.exe.as_deref().is_some_and(|e| e.starts_with(skill.path()))
                || p.cmdline.contains(marker)
                || scope.uid == Some(p.uid)
        })
        .collect()
}

/// Asserts no process of the run is alive. Dying processes get 250 ms to
/// finish exiting (the report may race the kernel's reaping by a hair);
/// anything alive after that leaked, and is killed so it cannot disturb the
/// next case.
///
/// # Panics
///
/// When a process of the run survives.
pub fn assert_no_leftovers(skill: &SkillDir, scope: &Scope) {
    let deadline = Instant::now() + Duration::from_millis(250);
    loop {
        let left = leftovers(skill, scope);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for p in &left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            panic!("processes of the run survived it (now killed): {left:#?}");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Count of live processes of `uid`.
pub fn count_uid(uid: u32) -> usize {
    scan().iter().filter(|p| p.uid == uid && !matches!(p.state, 'Z' | 'X')).count()
}

/// Every cgroup directory (up to 4 levels) of the hierarchies a run may
/// use, but those of served executors ([`crate::served`]), which keep their
/// runs' leaves for later runs by design (see [`busy_served_cgroups`]).
pub fn cgroup_dirs() -> BTreeSet<PathBuf> {
    split_served_cgroups().0
}

/// The cgroups of served executors that hold a process: none between runs.
pub fn busy_served_cgroups() -> Vec<PathBuf> {
    split_served_cgroups()
        .1
        .into_iter()
        .filter(|d| {
            std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty())
        })
        .collect()
}

/// Every cgroup directory, split into (not a served executor's, a served
/// executor's): those with a served instance's name among their components.
fn split_served_cgroups() -> (BTreeSet<PathBuf>, BTreeSet<PathBuf>) {
    let served = crate::served::instance_names();
    all_cgroup_dirs()
        .into_iter()
        .partition(|d| !d.components().any(|c| served.iter().any(|n| c.as_os_str() == n.as_str())))
}

fn all_cgroup_dirs() -> BTreeSet<PathBuf> {
    fn walk(dir: &Path, depth: u32, out: &mut BTreeSet<PathBuf>) {
        if depth == 0 {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.insert(e.path());
                walk(&e.path(), depth - 1, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    let base = Path::new("/sys/fs/cgroup");
    if pure_v2(base) {
        // The executors' parents sit under a service's or a session's cgroup.
        walk(base, 8, &mut out);
    } else {
        for root in ["unified", "pids", "memory", "freezer"] {
            walk(&base.join(root), 4, &mut out);
        }
    }
    if nix::unistd::geteuid().is_root() && base.is_dir() {
        assert!(!out.is_empty(), "no cgroup directory found: the leak checks would see nothing");
    }
    out
}

/// Whether `base` is itself a cgroup v2 mount (a host without v1).
fn pure_v2(base: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines().any(|l| {
            let mut f = l.split_whitespace().skip(1);
            (f.next(), f.next()) == (base.to_str(), Some("cgroup2"))
        })
    })
}
