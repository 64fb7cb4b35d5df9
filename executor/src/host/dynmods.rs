//! `favordynmods`: cgroup joins without an RCU grace period.
//!
//! Joining a cgroup (the child's write to `cgroup.procs`, spawn step 4c)
//! takes the kernel's global `cgroup_threadgroup_rwsem` for writing. That
//! per-CPU rwsem goes back to its fast reader mode one RCU grace period
//! after its last writer, and the next writer then waits a whole grace
//! period to leave it again. Runs back to back never see it; the first run
//! after an idle gap does: on the dev machine the child's `write` of "0"
//! took 4-24 ms after a 200 ms gap (strace), and a served run's `setup_us`
//! p50 went from 0.3 ms back to back to 12.6 ms after 50 ms idle
//! (measured on the dev machine). An agent calls skills now and then, so
//! that is most runs.
//!
//! With `favordynmods` on any cgroup hierarchy (the rwsem is global) the
//! kernel keeps it in writer mode: migrations never wait, and forks and
//! exits everywhere take the rwsem's slower reader path (a shared atomic
//! instead of a per-CPU count), the trade the kernel documents for this
//! option. `serve` turns it on at start when no hierarchy has it
//! (`cgroup_favordynmods`, default true) by remounting the cgroup v2
//! hierarchy with its own flags and options plus `favordynmods` (a v1
//! one when there is no v2), and never turns it off: another instance or
//! program may rely on it. The kernel's `cgroup_favordynmods=true` boot
//! option, or the option in the mount unit, does the same for the host.

use std::io;
use std::path::PathBuf;

use nix::mount::MsFlags;

/// The option's name, in `mount(2)` data and in `/proc/self/mountinfo`.
pub const OPTION: &str = "favordynmods";

/// One cgroup hierarchy as `/proc/self/mountinfo` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// Where it is mounted.
    pub target: PathBuf,
    /// `cgroup2` or `cgroup`.
    pub fstype: String,
    /// Per-mount options (`rw,nosuid,nodev,noexec,relatime`).
    pub mount_opts: String,
    /// Superblock options (`rw,nsdelegate,memory_recursiveprot`; v1: the
    /// controllers).
    pub super_opts: String,
}

impl CgroupMount {
    /// Whether the hierarchy has `favordynmods`.
    pub fn favors_dynmods(&self) -> bool {
        self.super_opts.split(',').any(|o| o == OPTION)
    }

    /// The `mount(2)` flags of a remount that keeps the per-mount options.
    pub fn remount_flags(&self) -> MsFlags {
        let mut flags = MsFlags::MS_REMOUNT;
        for opt in self.mount_opts.split(',') {
            flags |= match opt {
                "ro" => MsFlags::MS_RDONLY,
                "nosuid" => MsFlags::MS_NOSUID,
                "nodev" => MsFlags::MS_NODEV,
                "noexec" => MsFlags::MS_NOEXEC,
                "noatime" => MsFlags::MS_NOATIME,
                "nodiratime" => MsFlags::MS_NODIRATIME,
                "relatime" => MsFlags::MS_RELATIME,
                "strictatime" => MsFlags::MS_STRICTATIME,
                _ => MsFlags::empty(),
            };
        }
        flags
    }

    /// The `mount(2)` data of that remount: the superblock options as they
    /// are (a cgroup remount resets every option it is not given), without
    /// `rw`/`ro` (flags), plus `favordynmods`.
    pub fn remount_data(&self) -> String {
        self.super_opts
            .split(',')
            .filter(|o| !o.is_empty() && *o != "rw" && *o != "ro" && *o != OPTION)
            .chain([OPTION])
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The cgroup hierarchies in a `/proc/self/mountinfo` text (`ID PARENT
/// MAJ:MIN ROOT TARGET OPTS [TAGS...] - FSTYPE SOURCE SUPER_OPTS`).
pub fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let _source = right.next()?;
            let super_opts = right.next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(CgroupMount {
                target: PathBuf::from(unescape(left.get(4)?)),
                fstype: fstype.to_owned(),
                mount_opts: (*left.get(5)?).to_owned(),
                super_opts: super_opts.to_owned(),
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What [`ensure`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Favor {
    /// A hierarchy already had the option (this one).
    Already(PathBuf),
    /// This hierarchy was remounted with it.
    Enabled(PathBuf),
    /// No cgroup hierarchy is mounted.
    NoCgroup,
}

/// Turns `favordynmods` on (see the module docs) unless a hierarchy has it.
///
/// # Errors
///
/// Reading `/proc/self/mountinfo`, or the remount (`EPERM` without
/// `CAP_SYS_ADMIN`, `EINVAL` on a kernel without the option, before 6.1).
pub fn ensure() -> io::Result<Favor> {
    let mounts = cgroup_mounts(&std::fs::read_to_string("/proc/self/mountinfo")?);
    if let Some(m) = mounts.iter().find(|m| m.favors_dynmods()) {
        return Ok(Favor::Already(m.target.clone()));
    }
    let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup2").or_else(|| mounts.first()) else {
        return Ok(Favor::NoCgroup);
    };
    let data = m.remount_data();
    nix::mount::mount(
        None::<&str>,
        &m.target,
        Some(m.fstype.as_str()),
        m.remount_flags(),
        Some(data.as_str()),
    )
    .map_err(io::Error::from)?;
    // A kernel that ignores an option it does not know says nothing: check.
    let now = cgroup_mounts(&std::fs::read_to_string("/proc/self/mountinfo")?);
    if now.iter().any(|n| n.target == m.target && n.favors_dynmods()) {
        Ok(Favor::Enabled(m.target.clone()))
    } else {
        Err(io::Error::new(io::ErrorKind::Unsupported, "the remount did not keep favordynmods"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
25 24 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:4 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
29 25 0:27 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,pids
30 25 0:28 / /sys/fs/cgroup/odd\\040name rw,relatime - cgroup cgroup rw,name=odd,favordynmods
";

    #[test]
    fn cgroup_hierarchies_are_read_from_mountinfo() {
        let m = cgroup_mounts(MOUNTINFO);
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m[0].target, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(m[0].fstype, "cgroup2");
        assert!(!m[0].favors_dynmods());
        assert_eq!(m[1].super_opts, "rw,pids");
        assert_eq!(m[2].target, PathBuf::from("/sys/fs/cgroup/odd name"));
        assert!(m[2].favors_dynmods());
        assert!(cgroup_mounts("garbage\n\n1 2 3\n").is_empty());
    }

    #[test]
    fn a_remount_keeps_every_flag_and_option() {
        let m = &cgroup_mounts(MOUNTINFO)[0];
        assert_eq!(
            m.remount_flags(),
            MsFlags::MS_REMOUNT
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_RELATIME
        );
        assert_eq!(m.remount_data(), "nsdelegate,memory_recursiveprot,favordynmods");
        let v1 = &cgroup_mounts(MOUNTINFO)[1];
        assert_eq!(v1.remount_data(), "pids,favordynmods");
    }
}
