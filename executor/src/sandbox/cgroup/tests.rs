use std::io::Write as _;

use super::*;
use crate::{Config, Engine};

/// A leaf counts as empty only on a read that says so: `populated 0`
/// (then remembered until the recycle), or, when `cgroup.events`
/// cannot be read, a `cgroup.procs` read with no pid. A file that
/// cannot be read is never "no process left" (the kill at the main
/// process's exit is skipped only on `seen_empty`).
#[test]
fn only_a_read_that_says_so_makes_a_leaf_empty() {
    let dir = tempfile::tempdir().unwrap();
    let leaf = || {
        let mut cg = RunCgroup::unmade();
        cg.v2 = Some(dir.path().to_owned());
        cg
    };
    let forget = |mut cg: RunCgroup| cg.v2 = None;

    // Neither file readable: not empty, whatever is asked.
    let cg = leaf();
    assert!(!cg.seen_empty() && !cg.is_empty() && !cg.wait_empty(Duration::ZERO));
    forget(cg);
    // No events file, an empty listing: empty by the listing, but not
    // `seen_empty` (that needs the v2 leaf's own word).
    std::fs::write(dir.path().join("cgroup.procs"), "").unwrap();
    let cg = leaf();
    assert!(cg.is_empty() && !cg.seen_empty());
    forget(cg);
    std::fs::write(dir.path().join("cgroup.procs"), "42\n").unwrap();
    let cg = leaf();
    assert!(!cg.is_empty());
    forget(cg);
    // `populated 1`, then `populated 0`: remembered once seen.
    let events = dir.path().join("cgroup.events");
    std::fs::write(&events, "populated 1\nfrozen 0\n").unwrap();
    let cg = leaf();
    assert!(!cg.seen_empty() && !cg.is_empty());
    std::fs::write(&events, "populated 0\nfrozen 0\n").unwrap();
    assert!(cg.seen_empty());
    std::fs::write(&events, "populated 1\nfrozen 0\n").unwrap();
    assert!(cg.seen_empty() && cg.is_empty(), "remembered until the recycle");
    forget(cg);
}

/// Small files come back in one read, larger ones whole.
#[test]
fn whole_files_are_read_short_or_long() {
    let dir = tempfile::tempdir().unwrap();
    for len in [0usize, 21, 4095, 4096, 4097, 10_000] {
        let text: String = (0..len).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let path = dir.path().join(format!("f{len}"));
        std::fs::write(&path, &text).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        assert_eq!(read_whole(&file).as_deref(), Some(text.as_str()), "{len} bytes");
    }
    // A file shown in one piece, as cgroup files are.
    let file = std::fs::File::open("/proc/self/cgroup").unwrap();
    let want = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    assert_eq!(read_whole(&file), Some(want));
}

/// What a finished run left charged to its reused memory leaf (here
/// 2 MiB of a file's page cache) stays there for a run whose bound it
/// takes less than 1/64 of, and is given back before a run with a
/// smaller bound starts.
#[test]
fn leftover_charges_are_bounded_by_the_next_runs_share() {
    // On disk: tmpfs pages are shmem, which no reclaim gives back
    // without swap.
    let runtime = tempfile::tempdir_in("/var/tmp").unwrap();
    let on_tmpfs = nix::sys::statfs::statfs(runtime.path())
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    if on_tmpfs {
        println!("SKIP: leftover_charges_are_bounded_by_the_next_runs_share: /var/tmp is a tmpfs here (its pages cannot be reclaimed)");
        return;
    }
    let config = Config { runtime_dir: Some(runtime.path().to_owned()), ..Config::default() };
    let engine = Engine::new(config).unwrap();
    let h = &engine.host().cgroups;
    if h.v1_memory.is_none() {
        println!("SKIP: leftover_charges_are_bounded_by_the_next_runs_share: no v1 memory hierarchy here (needs root and a v1 memory controller)");
        return;
    }
    let id = format!("leftover-test-{}", std::process::id());
    let mut cg = RunCgroup::create(h, &id, 512 << 20, 64).unwrap();
    let dir = cg.memory.clone().unwrap();
    let usage = || -> u64 {
        fs::read_to_string(dir.join("memory.usage_in_bytes")).unwrap().trim().parse().unwrap()
    };
    // A clean 2 MiB file out of the page cache, then read by a process
    // in the leaf: its pages are charged to the leaf and stay there.
    let file = runtime.path().join("cache");
    let mut f = fs::File::create(&file).unwrap();
    f.write_all(&vec![7u8; 2 << 20]).unwrap();
    f.sync_all().unwrap();
    nix::fcntl::posix_fadvise(&f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED)
        .unwrap();
    let script =
        format!("echo $$ > {}/cgroup.procs && cat {} > /dev/null", dir.display(), file.display());
    let status = std::process::Command::new("/bin/sh").arg("-c").arg(&script).status().unwrap();
    assert!(status.success());
    let left = usage();
    assert!(left >= 3 << 19, "the read was charged to the leaf: {left}");

    // Under FORCE_EMPTY_ABOVE: recycling keeps them, and so does a run
    // with the default bound (512 MiB, an 8 MiB share).
    assert!(cg.recycle(), "an empty leaf is recycled");
    assert!(usage() >= 3 << 19, "kept by recycle: {}", usage());
    cg.set_limits(512 << 20, 64).unwrap();
    assert!(usage() >= 3 << 19, "kept for a 512 MiB run: {}", usage());

    // A 32 MiB run's share is 512 KiB: the leaf is emptied first.
    cg.set_limits(32 << 20, 64).unwrap();
    let after = usage();
    assert!(after <= (32 << 20) / LEFTOVER_SHARE, "left for a 32 MiB run: {after}");
    cg.remove();
}

/// A finished run's charges that no reclaim gives back (tmpfs pages, with
/// no swap) never go with its leaf into another run: a leaf still holding
/// more than [`FORCE_EMPTY_ABOVE`] once emptied (v1 `force_empty`, which
/// succeeds whatever it freed) or as found (v2, which has no such file) is
/// not recycled.
#[test]
fn unreclaimable_charges_over_the_bound_do_not_go_into_the_next_run() {
    let runtime = tempfile::tempdir_in("/var/tmp").unwrap();
    let config = Config { runtime_dir: Some(runtime.path().to_owned()), ..Config::default() };
    let engine = Engine::new(config).unwrap();
    let h = &engine.host().cgroups;
    let id = format!("shm-test-{}", std::process::id());
    let mut cg = RunCgroup::create(h, &id, 512 << 20, 64).unwrap();
    let charged = RunCgroup::charge;
    if charged(&cg).is_none() {
        println!("SKIP: unreclaimable_charges_over_the_bound_do_not_go_into_the_next_run: no memory controller for run leaves here (needs root)");
        cg.remove();
        return;
    }
    // 16 MiB written to a tmpfs file by a process in every leaf.
    let shm = tempfile::NamedTempFile::new_in("/dev/shm").unwrap();
    let joins: String = (cg.leaves().iter())
        .map(|l| format!("echo $$ > {}/cgroup.procs && ", l.display()))
        .collect();
    let script = format!("{joins}head -c 16777216 /dev/zero > {}", shm.path().display());
    let status = std::process::Command::new("/bin/sh").arg("-c").arg(&script).status().unwrap();
    assert!(status.success());
    assert!(charged(&cg).is_some_and(|c| c >= 16 << 20), "charged: {:?}", charged(&cg));
    let kept = cg.recycle();
    let left = charged(&cg);
    assert!(
        !kept || left.is_some_and(|c| c <= FORCE_EMPTY_ABOVE),
        "recycled holding {left:?} bytes"
    );
    cg.remove();
}
