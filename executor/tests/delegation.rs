//! The delegated-cgroup start-up step ([`executor::host::delegation::take`]) on a
//! real cgroup v2 hierarchy: a cgroup2 mount in a temporary directory, a
//! `sleep` standing in for the executor. This host may be cgroup v1/hybrid,
//! where `pids` and `memory` belong to v1; the test then uses a domain
//! controller v2 does offer (`hugetlb`, `pids`, `memory` or `io`), which
//! obeys the same no-internal-process rule.
//!
//! Root only; prints SKIP when cgroup2 cannot be mounted or offers no
//! domain controller.

use std::fs;
use std::path::Path;
use std::process::Command;

use executor::host::delegation::{take, Delegation};

fn words(p: &Path) -> Vec<String> {
    fs::read_to_string(p).unwrap_or_default().split_whitespace().map(str::to_owned).collect()
}

struct Mount(tempfile::TempDir);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn executor_moves_into_supervisor_and_runs_get_the_controllers() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: delegation test needs root (mounts cgroup2)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    if let Err(e) = nix::mount::mount(
        Some("cgroup2"),
        dir.path(),
        Some("cgroup2"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    ) {
        eprintln!("SKIP: cannot mount cgroup2 here: {e}");
        return;
    }
    let mnt = Mount(dir);
    let top = mnt.0.path();
    let offered = words(&top.join("cgroup.controllers"));
    let Some(controller) =
        ["pids", "memory", "hugetlb", "io"].into_iter().find(|c| offered.iter().any(|o| o == c))
    else {
        eprintln!("SKIP: the cgroup2 hierarchy offers no domain controller ({offered:?})");
        return;
    };
    let root_enabled = words(&top.join("cgroup.subtree_control")).iter().any(|c| c == controller);
    if !root_enabled {
        fs::write(top.join("cgroup.subtree_control"), format!("+{controller}")).unwrap();
    }
    let own_rel = format!("ongrid-delegation-test-{}", std::process::id());
    let own = top.join(&own_rel);
    fs::create_dir(&own).unwrap();
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id();
    fs::write(own.join("cgroup.procs"), pid.to_string()).unwrap();

    let result = std::panic::catch_unwind(|| {
        // The rule this step exists for: no controller for the children
        // while a process lives in the cgroup.
        let busy = fs::write(own.join("cgroup.subtree_control"), format!("+{controller}"));
        assert!(busy.is_err(), "the kernel allowed an internal process");

        let got = take(top, &format!("/{own_rel}"), pid, &[controller]).unwrap();
        assert_eq!(got, Delegation::Taken { root: own.clone(), enabled: vec![controller.into()] });
        assert_eq!(words(&own.join("supervisor/cgroup.procs")), [pid.to_string()]);
        assert!(words(&own.join("cgroup.procs")).is_empty());
        assert!(words(&own.join("cgroup.subtree_control")).iter().any(|c| c == controller));
        // The run layout below <own>/ongrid gets the controller.
        fs::create_dir(own.join("ongrid")).unwrap();
        assert!(words(&own.join("ongrid/cgroup.controllers")).iter().any(|c| c == controller));
        // Again: already enabled, nothing moves.
        assert_eq!(
            take(top, &format!("/{own_rel}"), pid, &[controller]).unwrap(),
            Delegation::AlreadyEnabled
        );
    });

    let _ = sleeper.kill();
    let _ = sleeper.wait();
    for leaf in ["ongrid", "supervisor"] {
        for _ in 0..100 {
            if fs::remove_dir(own.join(leaf)).is_ok() || !own.join(leaf).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    let _ = fs::write(own.join("cgroup.subtree_control"), format!("-{controller}"));
    let _ = fs::remove_dir(&own);
    if !root_enabled {
        let _ = fs::write(top.join("cgroup.subtree_control"), format!("-{controller}"));
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
