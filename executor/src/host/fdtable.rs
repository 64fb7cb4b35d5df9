//! The executor's descriptor table, split at a floor so that a child copies
//! only the part below it.
//!
//! Every `clone` without `CLONE_FILES` copies the creating thread's table
//! and every `execve` closes the copies again (they are close-on-exec):
//! during runs the executor holds ~230 descriptors, 176 of them the kernfs
//! files of its 16 pooled cgroup slots and ~40 the `O_PATH` system paths of
//! the Landlock rulesets. Copying and closing them cost ~3 % of the host's
//! CPU per run with 8 clients: each copy takes a
//! reference and each close flushes, with a cache miss on each file.
//!
//! So the long-lived descriptors that a child never needs after joining its
//! cgroups are [`lift`]ed to numbers at or above a [`floor`], and a child is
//! created with `CLONE_FILES` (sharing the table, nothing copied) and, once
//! it has written to its `cgroup.procs` files (themselves above the floor),
//! calls `close_range(floor, ~0, CLOSE_RANGE_UNSHARE)` (Linux 5.9): the
//! kernel then gives it a table of its own holding only the descriptors
//! below the floor. Whatever lands where is never a question of safety: a
//! descriptor that could not be lifted is copied and closed at `exec` as
//! before, and the caller shares the table only when the child's stdio and
//! Landlock descriptors are below the floor (the child's spec).
//!
//! Below the floor stays what comes and goes with the runs (~100
//! descriptors with 8 clients). A spawn therefore places the descriptors
//! its child keeps on a [`Bands`] band of low numbers reserved at start,
//! and the child's floor is the band's top: it copies only what lies
//! under it.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::sys::fd;

/// The highest floor: the part below it holds the connections, pipes and
/// per-run descriptors of up to ~100 runs at once.
const MAX_FLOOR: u32 = 1024;
/// The lowest useful floor (a soft `RLIMIT_NOFILE` under 2x this disables
/// the split).
const MIN_FLOOR: u32 = 256;

/// The floor of this process's table, or `None` when the kernel lacks
/// `CLOSE_RANGE_UNSHARE` or the soft `RLIMIT_NOFILE` leaves no room above
/// a useful floor. Decided once per process.
pub fn floor() -> Option<u32> {
    static FLOOR: OnceLock<Option<u32>> = OnceLock::new();
    *FLOOR.get_or_init(|| {
        let soft = nofile_soft()?;
        let floor = u32::try_from(soft / 2).unwrap_or(u32::MAX).min(MAX_FLOOR);
        (floor >= MIN_FLOOR && close_range_unshares()).then_some(floor)
    })
}

/// The soft `RLIMIT_NOFILE` a daemon raises itself to: enough for every
/// connection, run and pooled slot at the configured maximums many times
/// over, and what makes the [`floor`] its highest.
pub const NOFILE_WANTED: u64 = 65_536;

/// Raises this process's soft `RLIMIT_NOFILE` towards its hard limit, up to
/// [`NOFILE_WANTED`], before anything reads it (the [`floor`] is decided
/// once, from it). systemd starts a service at a soft 1024 (its
/// `DefaultLimitNOFILE=1024:524288`) and leaves raising it to programs
/// that need more, as the executor does: up to `max_connections` (256)
/// connections, ~10 descriptors per run in flight, ~230 for the pooled
/// slots and rulesets; and at 1024 the floor would be 512 instead of
/// [`MAX_FLOOR`]. Skills are not affected: each run's own `NOFILE` is
/// set in step 4e. Returns the soft limit before and after.
///
/// # Errors
///
/// The error of `getrlimit` or `setrlimit` (the limit is then unchanged).
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let wanted = hard.min(NOFILE_WANTED);
    if soft >= wanted {
        return Ok((soft, soft));
    }
    setrlimit(Resource::RLIMIT_NOFILE, wanted, hard)?;
    Ok((soft, wanted))
}

fn nofile_soft() -> Option<u64> {
    use nix::sys::resource::{getrlimit, Resource};
    getrlimit(Resource::RLIMIT_NOFILE).ok().map(|(soft, _)| soft)
}

/// True if `close_range` takes `CLOSE_RANGE_UNSHARE` here: both came in
/// Linux 5.9. Read off the kernel's release rather than tried: trying it on
/// a thread of this process would give that thread a table of its own, and
/// a throwaway thread made for the test would wait out the cgroup attach
/// lock's warm-up of a one-shot `run` (`crate::host::attach_lock`).
fn close_range_unshares() -> bool {
    fd::kernel_release().is_some_and(|release| release_at_least(&release, (5, 9)))
}

/// `release` ("6.18.44-fc-v1045") is `want` (major, minor) or later.
fn release_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
    match (next(), next()) {
        (Some(major), Some(minor)) => (major, minor) >= want,
        _ => false,
    }
}

pub use crate::sys::spec::all_below;

/// `fd` renumbered to the lowest free number at or above the [`floor`]
/// (close-on-exec), or `fd` itself when there is no floor or no free number
/// above it.
#[must_use]
pub fn lift(fd: OwnedFd) -> OwnedFd {
    let Some(floor) = floor() else { return fd };
    let Ok(floor) = libc::c_int::try_from(floor) else { return fd };
    if fd.as_raw_fd() >= floor {
        return fd;
    }
    // The old descriptor is closed when `fd` drops.
    fd::dup_at_least(fd.as_fd(), floor).unwrap_or(fd)
}

/// Spawns placed at once at most (spawner threads and runtime workers that
/// create children themselves); more fall back to the floor.
const BANDS: usize = 16;
/// Descriptors a child needs after its own table is made: stdin, stdout,
/// stderr and the Landlock ruleset.
pub const BAND: usize = 4;

/// Descriptor numbers held at the bottom of the table for the spawns.
///
/// Under load the part of the table below the [`floor`] holds ~100
/// descriptors (the connections, the pipes made ahead for the pooled slots,
/// the running skills' pipes and pidfds) and every child copied them all at
/// `close_range(floor, ~0, CLOSE_RANGE_UNSHARE)` and closed them again at
/// `exec`: ~15 % of the child's work before `exec`, growing with the
/// number of runs at once. So [`BANDS`] x [`BAND`] numbers are reserved
/// when the engine starts, each holding a `/dev/null` placeholder, and a
/// spawn moves the descriptors its child keeps onto the lowest free band
/// ([`Bands::place`]): the child then keeps only what is below the band's
/// top, the few descriptors the process had at start and the bands under
/// its own. Placing is `dup3` over a placeholder, atomic, so no other
/// thread can ever be handed those numbers; the placeholders come back
/// when the [`Placed`] drops (the child has exec'd or failed by then).
#[derive(Debug)]
pub struct Bands {
    /// `numbers[k]`: band k, ascending; band k < band k + 1.
    numbers: [[RawFd; BAND]; BANDS],
    /// What the placeholders are duplicates of.
    null: OwnedFd,
    /// Bit k set: band k is placed.
    taken: AtomicU32,
}

/// The process's bands, reserved on the first call (the engine makes it at
/// start, while the table is still short), or `None` without a [`floor`] or
/// when `/dev/null` cannot be opened or duplicated.
pub fn bands() -> Option<&'static Bands> {
    static BANDS_OF_PROCESS: OnceLock<Option<Bands>> = OnceLock::new();
    BANDS_OF_PROCESS.get_or_init(|| floor().and_then(Bands::reserve)).as_ref()
}

impl Bands {
    fn reserve(floor: u32) -> Option<Self> {
        let null = std::fs::File::open("/dev/null").ok().map(OwnedFd::from)?;
        let mut held = Vec::with_capacity(BANDS * BAND);
        // Owned by `held` (closed on every early return), then by the bands.
        for _ in 0..BANDS * BAND {
            let Some(fd) = fd::dup_at_least(null.as_fd(), 3) else { break };
            held.push(fd);
        }
        if held.len() < BANDS * BAND
            || held.iter().any(|fd| u32::try_from(fd.as_raw_fd()).map_or(true, |n| n >= floor))
        {
            return None;
        }
        let mut raw: Vec<RawFd> =
            held.into_iter().map(std::os::fd::IntoRawFd::into_raw_fd).collect();
        raw.sort_unstable();
        let mut numbers = [[0; BAND]; BANDS];
        for (band, chunk) in numbers.iter_mut().zip(raw.chunks_exact(BAND)) {
            band.copy_from_slice(chunk);
        }
        Some(Bands { numbers, null, taken: AtomicU32::new(0) })
    }

    /// Moves `fds` (`None`: nothing at that place) onto the lowest free
    /// band: the child is then given the returned numbers, and keeps only
    /// what is below [`Placed::top`]. `None` when every band is placed or a
    /// `dup3` failed (the caller keeps its own numbers and the floor).
    pub fn place(&'static self, fds: [Option<RawFd>; BAND]) -> Option<Placed> {
        let mut taken = self.taken.load(Ordering::Relaxed);
        let band = loop {
            let free = (!taken).trailing_zeros() as usize;
            if free >= BANDS {
                return None;
            }
            match self.taken.compare_exchange_weak(
                taken,
                taken | (1 << free),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break free,
                Err(now) => taken = now,
            }
        };
        let mut placed = Placed { bands: self, band, fds: [None; BAND] };
        for ((slot, number), fd) in placed.fds.iter_mut().zip(self.numbers[band]).zip(fds) {
            let Some(fd) = fd else { continue };
            // Onto a number the bands own (holding a placeholder), from a
            // descriptor the caller keeps open.
            if !fd::dup_onto(fd, number) {
                return None;
            }
            *slot = Some(number);
        }
        Some(placed)
    }
}

/// One band, holding a spawn's descriptors until dropped.
#[derive(Debug)]
pub struct Placed {
    bands: &'static Bands,
    band: usize,
    fds: [Option<RawFd>; BAND],
}

impl Placed {
    /// The numbers the descriptors were placed at, in the order given.
    #[must_use]
    pub fn fds(&self) -> [Option<RawFd>; BAND] {
        self.fds
    }

    /// One above the band's highest number: the child's floor.
    #[must_use]
    pub fn top(&self) -> u32 {
        let high = self.bands.numbers[self.band][BAND - 1];
        u32::try_from(high).map_or(u32::MAX, |h| h + 1)
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        let mut restored = true;
        for number in self.fds.iter().flatten() {
            // The bands' own `null` onto a number of this band, which this
            // `Placed` holds: the copy placed there is closed and the
            // placeholder is back.
            if !fd::dup_onto(self.bands.null.as_raw_fd(), *number) {
                // The copy this band placed there goes anyway (a pipe end
                // kept open would hold the run's EOF back).
                fd::close_held(*number);
                restored = false;
            }
        }
        // A number without its placeholder may be handed to any later
        // open: the band is never placed again.
        if restored {
            self.bands.taken.fetch_and(!(1 << self.band), Ordering::Release);
        }
    }
}

/// [`lift`] for an inotify instance.
#[must_use]
pub fn lift_inotify(inotify: nix::sys::inotify::Inotify) -> nix::sys::inotify::Inotify {
    // The instance's descriptor, or a duplicate of it.
    fd::inotify_from(lift(OwnedFd::from(inotify)))
}

/// [`lift`] for a `File`.
#[must_use]
pub fn lift_file(file: std::fs::File) -> std::fs::File {
    std::fs::File::from(lift(OwnedFd::from(file)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(release_at_least("6.18.44-fc-v1045", (5, 9)));
        assert!(release_at_least("5.9.0", (5, 9)));
        assert!(release_at_least("5.10.0-28-amd64", (5, 9)));
        assert!(!release_at_least("5.4.0-150-generic", (5, 9)));
        assert!(!release_at_least("4.18.0-553.el8_10.x86_64", (5, 9)));
        assert!(!release_at_least("garbage", (5, 9)));
    }

    /// The `flags:` of `fd` in `/proc/self/fdinfo` (octal; `O_CLOEXEC`
    /// among them when the descriptor is close-on-exec).
    fn fd_flags(fd: RawFd) -> libc::c_int {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        let octal = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap().trim();
        libc::c_int::from_str_radix(octal, 8).unwrap()
    }

    fn same_file(a: RawFd, b: RawFd) -> bool {
        // The magic link is followed to the open file (a pipe's inode too).
        let stat = |fd: RawFd| {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?;
            Some((m.dev(), m.ino()))
        };
        stat(a).is_some() && stat(a) == stat(b)
    }

    /// A placed band holds the caller's files at low numbers below its
    /// top; bands placed at once are distinct; dropped, the copies placed
    /// are closed (the numbers hold a placeholder again, or, by the time
    /// this looks, another test's spawn).
    #[test]
    fn placed_descriptors_sit_low_and_go_back_to_placeholders() {
        let Some(bands) = bands() else {
            println!("SKIP: no descriptor bands here (no floor: {:?})", floor());
            return;
        };
        // Close-on-exec: children that other tests start at the same time
        // must not hold the write end.
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let status = std::fs::File::open("/proc/self/status").unwrap();
        let first = bands
            .place([Some(r.as_raw_fd()), Some(w.as_raw_fd()), None, Some(status.as_raw_fd())])
            .unwrap();
        let [Some(pr), Some(pw), None, Some(ps)] = first.fds() else {
            panic!("placed {:?}", first.fds());
        };
        assert!(same_file(pr, r.as_raw_fd()) && same_file(pw, w.as_raw_fd()));
        assert!(same_file(ps, status.as_raw_fd()));
        assert!(all_below(first.top(), [pr, pw, ps]), "top {} {:?}", first.top(), first.fds());
        assert!(first.top() < floor().unwrap());
        let second = bands.place([Some(r.as_raw_fd()), None, None, None]).unwrap();
        let [Some(sr), ..] = second.fds() else { panic!("placed {:?}", second.fds()) };
        assert!(![pr, pw, ps].contains(&sr), "two bands share {sr}");
        assert!(second.top() != first.top());
        drop(first);
        for (fd, ours) in [(pr, r.as_raw_fd()), (pw, w.as_raw_fd()), (ps, status.as_raw_fd())] {
            let open = std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists();
            assert!(open && !same_file(fd, ours), "{fd}: not given back to a placeholder");
        }
        // The pipe's only write end left is `w`: the placed copy is closed.
        drop(w);
        let mut buf = [0u8; 1];
        assert_eq!(nix::unistd::read(&r, &mut buf).unwrap(), 0, "EOF once `w` is dropped");
        drop(second);
    }

    /// This kernel (Linux 5.9 or later) and a soft limit of 512 or more
    /// give a floor; a lifted descriptor is above it and still the same
    /// open file.
    #[test]
    fn lifted_descriptors_sit_above_the_floor() {
        let Some(floor) = floor() else {
            println!(
                "SKIP: no descriptor floor here (soft RLIMIT_NOFILE {:?}, or no \
                 CLOSE_RANGE_UNSHARE)",
                nofile_soft()
            );
            return;
        };
        assert!((MIN_FLOOR..=MAX_FLOOR).contains(&floor), "floor {floor}");
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let ino = file.metadata().unwrap();
        let low = file.as_raw_fd();
        let lifted = lift_file(file);
        let fd = u32::try_from(lifted.as_raw_fd()).unwrap();
        assert!(fd >= floor, "lifted to {fd}, floor {floor} (was {low})");
        let again = lifted.metadata().unwrap();
        assert_eq!(
            (std::os::unix::fs::MetadataExt::ino(&again), again.len()),
            (std::os::unix::fs::MetadataExt::ino(&ino), ino.len())
        );
        let flags = fd_flags(lifted.as_raw_fd());
        assert_eq!(flags & libc::O_CLOEXEC, libc::O_CLOEXEC, "close-on-exec");
    }
}
