//! The seccomp filter of a run: a deny-list compiled to classic BPF.
//!
//! Without the network grant `socket(2)` fails with `EPERM` for every
//! family, `AF_UNIX` included: a pathname Unix socket outside the sandbox
//! (D-Bus, a lax `docker.sock`, the loader's socket) would otherwise be
//! reachable, since Landlock cannot restrict `connect` to one before ABI 9
//! (and ABI 6 scopes only abstract sockets). `socketpair(2)` stays allowed
//! for `AF_UNIX` stream and seqpacket pairs only (in-process IPC): an
//! unbound datagram socket could `sendto` any pathname socket (`/dev/log`,
//! journald's) by name. `bind(2)` and `listen(2)` fail too: a pair never
//! needs them, and a pair's end bound to an abstract name held that name
//! in the host's network namespace (Landlock's scope covers `connect` and
//! `sendto`, not `bind`), so no host service could bind it while the run
//! lived.
//!
//! A run whose uid may own files outside the box (root, a user the
//! operator granted, the executor's own uid when it is not root), or that
//! keeps a capability over other users' files ([`METADATA_CAPABILITIES`]),
//! gets the `lock_metadata` variant: Landlock does not cover a file's mode,
//! owner, extended attributes (ACLs among them), attributes or times, and
//! uid 0 owns the host's files, so a granted-root run could `chmod 4755`
//! or `chmod 0666` any of them. Every call that changes them
//! ([`METADATA`], and the `chattr` `ioctl`s), by path or by descriptor,
//! fails, and so does taking a lease (`F_SETLEASE`, which would stall
//! whoever opens the file next). The dedicated run-as user owns
//! nothing outside its run directory and keeps them (`touch`, `tar`).
//!
//! Calls that can name another process by pid (`prlimit64`, `setpriority`,
//! the `sched_set*` family, `ioprio_set`, `migrate_pages`, `move_pages`)
//! are allowed only on the caller itself ([`SELF_ONLY`]); SysV IPC is
//! denied (its objects outlive the run and escape its cgroup).
//!
//! Denied calls fail with `EPERM` (`clone3` with `ENOSYS`, so libc falls back
//! to `clone`, whose flags the filter can inspect); a non-native
//! architecture kills the process, and x32 syscall numbers (bit 30) fail.
//! The program is built once per process (four variants: with or without
//! the network grant, metadata locked or not); the child only attaches it. Arguments are compared on their low 32 bits, which is what the kernel
//! uses for `int`/`unsigned int` parameters (the `TIOCSTI` check is immune to
//! high bits, CVE-2019-10063).

mod bpf;
mod names;

pub use bpf::Insn;
use bpf::{
    jump, off_arg_lo, stmt, ALU_AND_K, JA, JEQ_K, JGE_K, JSET_K, LD_W_ABS, OFF_ARCH, OFF_NR,
    RET_ALLOW, RET_ERRNO, RET_K, RET_KILL_PROCESS,
};
pub use names::name;

/// The native architecture as seccomp and audit records name it.
#[cfg(target_arch = "x86_64")]
pub const AUDIT_ARCH: u32 = 0xC000_003E;
/// The native architecture as seccomp and audit records name it.
#[cfg(target_arch = "aarch64")]
pub const AUDIT_ARCH: u32 = 0xC000_00B7;

const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
/// `ioctl`s that change a file's attributes, given ownership only
/// (`chattr` flags, project id and flags, inode generation); denied with
/// the rest of [`METADATA`]. The same numbers on x86_64 and aarch64.
const METADATA_IOCTLS: &[u32] = &[
    0x4008_6602, // FS_IOC_SETFLAGS
    0x4004_6602, // FS_IOC32_SETFLAGS
    0x401c_5820, // FS_IOC_FSSETXATTR
    0x4008_7602, // FS_IOC_SETVERSION
    0x4004_7602, // FS_IOC32_SETVERSION
];
const PERSONALITY_QUERY: u32 = 0xffff_ffff;
const F_SETLEASE: u32 = 1024;
const AF_UNIX: u32 = 1;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const AF_NETLINK: u32 = 16;
const SOL_IP: u32 = 0;
const IP_OPTIONS: u32 = 4;
const SOL_IPV6: u32 = 41;
/// The IPv6 options that set a routing header or the extension headers
/// sent before one: `IPV6_2292HOPOPTS`, `IPV6_2292DSTOPTS`,
/// `IPV6_2292RTHDR`, `IPV6_2292PKTOPTIONS` (control data kept as sticky
/// options), `IPV6_HOPOPTS`, `IPV6_RTHDRDSTOPTS`, `IPV6_RTHDR`,
/// `IPV6_DSTOPTS`.
const IPV6_ROUTE_OPTIONS: [u32; 8] = [3, 4, 5, 6, 54, 55, 57, 59];
/// The socket type in `socketpair`'s second argument (below the flags).
const SOCK_TYPE_MASK: u32 = 0xf;
const SOCK_STREAM: u32 = 1;
const SOCK_SEQPACKET: u32 = 5;
/// Every `CLONE_NEW*` flag `clone(2)` accepts (`CLONE_NEWTIME` shares its
/// bit with the exit signal there and only exists for `clone3`/`unshare`).
pub const CLONE_NEW_MASK: u32 = 0x0002_0000 // NEWNS
    | 0x0200_0000 // NEWCGROUP
    | 0x0400_0000 // NEWUTS
    | 0x0800_0000 // NEWIPC
    | 0x1000_0000 // NEWUSER
    | 0x2000_0000 // NEWPID
    | 0x4000_0000; // NEWNET

fn errno(e: i32) -> u32 {
    RET_ERRNO | (u32::try_from(e).unwrap_or(1) & 0xffff)
}

fn nr(n: libc::c_long) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Syscalls denied outright with `EPERM`: debugging other processes,
/// io_uring and Linux AIO, the kernel keyring, namespaces, mounts, BPF and
/// perf, kernel modules and kexec, userfaultfd, SysV and POSIX IPC, and
/// host administration.
pub const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_userfaultfd,
    libc::SYS_chroot,
    libc::SYS_acct,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_open_by_handle_at,
    libc::SYS_kcmp,
    libc::SYS_syslog,
    // Watching every access to a mount or filesystem (unprivileged since
    // Linux 5.13 with FAN_REPORT_FID): a side channel on the host's files.
    libc::SYS_fanotify_init,
    // The same for any directory the user may read (`/tmp`, `/etc`): the
    // names and timing of other users' files, where Landlock lets the run
    // neither list nor open the directory.
    #[cfg(target_arch = "x86_64")]
    libc::SYS_inotify_init,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_add_watch,
    // Advice on another process's memory (by pidfd): forcing it out.
    libc::SYS_process_madvise,
    libc::SYS_process_mrelease,
    // SysV IPC: its objects outlive the run, live outside every cgroup
    // limit and are shared by every run as the same user (a run left
    // 400 MiB of shared memory behind, another read it back).
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_semctl,
    // POSIX message queues, for the same reasons; `mq_open` is refused by
    // Landlock already, but `mq_unlink` removed another process's queue.
    libc::SYS_mq_open,
    libc::SYS_mq_unlink,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_notify,
    libc::SYS_mq_getsetattr,
    // Linux AIO contexts are counted host-wide (`fs.aio-nr` against
    // `fs.aio-max-nr`) and charged to no cgroup: one run took all 65,536
    // and every other process's `io_setup` failed until it ended. Without
    // a context the other `io_*` calls can do nothing.
    libc::SYS_io_setup,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_modify_ldt,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
];

/// Denied without the network grant (see the module docs); `socketpair`
/// is filtered by its arguments instead.
const NO_NETWORK: &[libc::c_long] = &[libc::SYS_socket, libc::SYS_bind, libc::SYS_listen];

/// `setxattrat(2)` and `removexattrat(2)` (Linux 6.13; one number on
/// every architecture).
const SYS_SETXATTRAT: libc::c_long = 463;
const SYS_REMOVEXATTRAT: libc::c_long = 466;
/// `file_setattr(2)` (Linux 6.17): the `FS_IOC_FSSETXATTR` fields by path.
const SYS_FILE_SETATTR: libc::c_long = 469;

/// Calls that change a file's mode, owner, extended attributes or times,
/// by path or by descriptor: denied to runs whose uid may own files
/// outside the box (see the module docs).
pub const METADATA: &[libc::c_long] = &[
    #[cfg(target_arch = "x86_64")]
    libc::SYS_chmod,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchmodat2,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_chown,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lchown,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    SYS_SETXATTRAT,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    SYS_REMOVEXATTRAT,
    SYS_FILE_SETATTR,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_utime,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_utimes,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_futimesat,
    libc::SYS_utimensat,
];

/// Capabilities that let a run change the metadata of files it does not
/// own (`CAP_CHOWN`, `CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_FSETID`,
/// `CAP_LINUX_IMMUTABLE`, `CAP_SYS_ADMIN`, `CAP_SETFCAP`): a run granted
/// one gets the locked program even as the dedicated user.
pub const METADATA_CAPABILITIES: &[u8] = &[0, 1, 3, 4, 9, 21, 31];

/// Which of the four programs a run gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The network grant: `socket(2)` (of the families
    /// [`Special::SocketFamily`] names) and every `socketpair(2)` allowed.
    pub network: bool,
    /// The run's uid may own files outside the box: [`METADATA`] and
    /// `F_SETLEASE` denied.
    pub lock_metadata: bool,
}

impl Variant {
    /// The program of a run with the network grant or not, as the
    /// dedicated run-as user or not, keeping `capabilities`.
    pub fn for_run(network: bool, dedicated: bool, capabilities: &[u8]) -> Self {
        let privileged = capabilities.iter().any(|c| METADATA_CAPABILITIES.contains(c));
        Variant { network, lock_metadata: !dedicated || privileged }
    }

    /// 0 to 3, one per program.
    pub fn index(self) -> usize {
        usize::from(self.network) | usize::from(self.lock_metadata) << 1
    }
}

/// Calls that take another process's pid (first argument): allowed only on
/// the caller itself (pid 0), as libc's own wrappers pass it (`setrlimit`,
/// `sched_setaffinity(0, ..)`). Otherwise a run could set the limits,
/// priority, CPUs or memory placement of any process of its user outside
/// the sandbox (another run, a granted root's executor: an `RLIMIT_CPU` of
/// 1 s has the kernel kill it), which neither Landlock's signal scope nor
/// the lack of capabilities stops.
pub const SELF_ONLY: &[libc::c_long] = &[
    libc::SYS_prlimit64,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_setparam,
    libc::SYS_sched_setattr,
    libc::SYS_migrate_pages,
    libc::SYS_move_pages,
];

/// `which` of `setpriority` and `ioprio_set` naming one process.
const PRIO_PROCESS: u32 = 0;
const IOPRIO_WHO_PROCESS: u32 = 1;

/// What the filter does with one syscall number that is not simply allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Special {
    /// `EPERM` outright.
    Deny,
    /// `clone3`: `ENOSYS`, so libc falls back to `clone`.
    Clone3,
    /// `clone`: `EPERM` with any `CLONE_NEW*` flag.
    Clone,
    /// `ioctl`: `EPERM` for `TIOCSTI` and `TIOCLINUX`, and with
    /// `lock_metadata` for [`METADATA_IOCTLS`] too.
    Ioctl { lock_metadata: bool },
    /// `personality`: only the query and `PER_LINUX`.
    Personality,
    /// [`SELF_ONLY`]: `EPERM` unless the pid (first argument) is 0.
    SelfPid,
    /// `setpriority`, `ioprio_set`: `EPERM` unless `which` is this value
    /// (one process) and `who` is 0 (the caller): no other process, no
    /// process group, no user (`PRIO_USER` with 0 would renice every
    /// process of the skill user on the host).
    SelfWho(u32),
    /// `socketpair`: only `AF_UNIX` stream and seqpacket pairs.
    Socketpair,
    /// `socket` with the network grant: only `AF_UNIX`, `AF_INET`,
    /// `AF_INET6` and `AF_NETLINK`. The egress programs judge the
    /// destinations of the two IP families only: a vsock (the hypervisor's
    /// services), packet or XDP socket would pass every rule.
    SocketFamily,
    /// `setsockopt`: `EPERM` for `IP_OPTIONS` and the IPv6 routing header
    /// and the headers before one ([`IPV6_ROUTE_OPTIONS`]): a source route
    /// sends a packet allowed to one address on to another, after the
    /// egress programs judged the first (the IPv6 one needs no capability).
    Setsockopt,
    /// `fcntl`: `EPERM` for `F_SETLEASE`.
    Fcntl,
    /// `kill`: `EPERM` for pid -1, every process the caller may signal:
    /// on a kernel without Landlock's signal scoping (ABI 6), every
    /// process of the run-as user, other runs among them.
    KillAll,
}

/// The instructions that decide a `Special` syscall; each path ends in a
/// return, so the block can be placed anywhere.
fn special_block(s: Special) -> Vec<Insn> {
    let eperm = errno(libc::EPERM);
    match s {
        Special::Deny => vec![stmt(RET_K, eperm)],
        Special::Clone3 => vec![stmt(RET_K, errno(libc::ENOSYS))],
        Special::Clone => vec![
            stmt(LD_W_ABS, off_arg_lo(0)),
            jump(JSET_K, CLONE_NEW_MASK, 0, 1),
            stmt(RET_K, eperm),
            stmt(RET_K, RET_ALLOW),
        ],
        Special::Ioctl { lock_metadata } => {
            let denied: Vec<u32> = [TIOCSTI, TIOCLINUX]
                .into_iter()
                .chain(METADATA_IOCTLS.iter().copied().filter(|_| lock_metadata))
                .collect();
            let n = denied.len();
            let mut block = vec![stmt(LD_W_ABS, off_arg_lo(1))];
            // Each match jumps over the rest and the allow, to the EPERM.
            for (i, cmd) in denied.into_iter().enumerate() {
                block.push(jump(JEQ_K, cmd, u8::try_from(n - i).unwrap_or(u8::MAX), 0));
            }
            block.push(stmt(RET_K, RET_ALLOW));
            block.push(stmt(RET_K, eperm));
            block
        }
        Special::Personality => vec![
            stmt(LD_W_ABS, off_arg_lo(0)),
            jump(JEQ_K, PERSONALITY_QUERY, 2, 0),
            jump(JEQ_K, 0, 1, 0),
            stmt(RET_K, eperm),
            stmt(RET_K, RET_ALLOW),
        ],
        Special::SelfPid => vec![
            stmt(LD_W_ABS, off_arg_lo(0)),
            jump(JEQ_K, 0, 0, 1),
            stmt(RET_K, RET_ALLOW),
            stmt(RET_K, eperm),
        ],
        Special::SelfWho(which) => vec![
            stmt(LD_W_ABS, off_arg_lo(0)),
            jump(JEQ_K, which, 0, 3),
            stmt(LD_W_ABS, off_arg_lo(1)),
            jump(JEQ_K, 0, 0, 1),
            stmt(RET_K, RET_ALLOW),
            stmt(RET_K, eperm),
        ],
        Special::Socketpair => vec![
            stmt(LD_W_ABS, off_arg_lo(0)),
            jump(JEQ_K, AF_UNIX, 0, 5),
            stmt(LD_W_ABS, off_arg_lo(1)),
            stmt(ALU_AND_K, SOCK_TYPE_MASK),
            jump(JEQ_K, SOCK_STREAM, 1, 0),
            jump(JEQ_K, SOCK_SEQPACKET, 0, 1),
            stmt(RET_K, RET_ALLOW),
            stmt(RET_K, eperm),
        ],
        Special::SocketFamily => vec![
            stmt(LD_W_ABS, off_arg_lo(0)),
            jump(JEQ_K, AF_UNIX, 4, 0),
            jump(JEQ_K, AF_INET, 3, 0),
            jump(JEQ_K, AF_INET6, 2, 0),
            jump(JEQ_K, AF_NETLINK, 1, 0),
            stmt(RET_K, eperm),
            stmt(RET_K, RET_ALLOW),
        ],
        Special::Setsockopt => {
            let n = IPV6_ROUTE_OPTIONS.len();
            let mut block = vec![
                stmt(LD_W_ABS, off_arg_lo(1)),
                jump(JEQ_K, SOL_IP, 0, 4),
                stmt(LD_W_ABS, off_arg_lo(2)),
                jump(JEQ_K, IP_OPTIONS, 0, 1),
                stmt(RET_K, eperm),
                stmt(RET_K, RET_ALLOW),
                // Past the list and its EPERM: to the last ALLOW.
                jump(JEQ_K, SOL_IPV6, 0, u8::try_from(n + 2).unwrap_or(u8::MAX)),
                stmt(LD_W_ABS, off_arg_lo(2)),
            ];
            for (i, &opt) in IPV6_ROUTE_OPTIONS.iter().enumerate() {
                // A match jumps to the EPERM after the list; the last
                // miss jumps over it.
                let to_eperm = u8::try_from(n - 1 - i).unwrap_or(u8::MAX);
                block.push(jump(JEQ_K, opt, to_eperm, u8::from(i == n - 1)));
            }
            block.extend([stmt(RET_K, eperm), stmt(RET_K, RET_ALLOW)]);
            block
        }
        Special::Fcntl => vec![
            stmt(LD_W_ABS, off_arg_lo(1)),
            jump(JEQ_K, F_SETLEASE, 0, 1),
            stmt(RET_K, eperm),
            stmt(RET_K, RET_ALLOW),
        ],
        // The kernel reads the pid as an `int`: the low word.
        Special::KillAll => vec![
            stmt(LD_W_ABS, off_arg_lo(0)),
            jump(JEQ_K, u32::MAX, 0, 1),
            stmt(RET_K, eperm),
            stmt(RET_K, RET_ALLOW),
        ],
    }
}

/// At most this many syscall numbers are compared one by one in a leaf of
/// the search tree.
const LEAF: usize = 3;

/// A binary search over `table` (sorted by number) with the syscall number
/// in the accumulator; anything not in the table is allowed. Every path
/// ends in a return.
fn search(table: &[(u32, Special)]) -> Vec<Insn> {
    if table.len() <= LEAF {
        let mut out = Vec::new();
        for &(n, s) in table {
            let block = special_block(s);
            let skip = u8::try_from(block.len()).expect("a special block is short");
            out.push(jump(JEQ_K, n, 0, skip));
            out.extend(block);
        }
        out.push(stmt(RET_K, RET_ALLOW));
        return out;
    }
    let (low, high) = table.split_at(table.len() / 2);
    let pivot = high[0].0;
    let low = search(low);
    let high = search(high);
    let mut out = Vec::with_capacity(low.len() + high.len() + 2);
    match u8::try_from(low.len()) {
        // nr >= pivot: jump over the lower half.
        Ok(skip) => out.push(jump(JGE_K, pivot, skip, 0)),
        Err(_) => {
            out.push(jump(JGE_K, pivot, 0, 1));
            out.push(stmt(JA, u32::try_from(low.len()).unwrap_or(u32::MAX)));
        }
    }
    out.extend(low);
    out.extend(high);
    out
}

/// Builds the filter. `network` allows `socket(2)` for `AF_UNIX`,
/// `AF_INET`, `AF_INET6` and `AF_NETLINK` and `socketpair(2)` for every
/// family; without it `socket` is denied for every family, `AF_UNIX`
/// included (TCP, UDP, ICMP, netlink, vsock, pathname and abstract Unix
/// sockets), and `socketpair` allowed for `AF_UNIX` stream and seqpacket
/// pairs only. `lock_metadata` denies [`METADATA`] and `F_SETLEASE`.
///
/// The syscall number is looked up by binary search (about 7 comparisons),
/// not a linear scan of the ~90 special numbers: the kernel runs the filter
/// once per syscall number when it is attached, to build its cache of
/// always-allowed calls, so a linear program made each spawn pay ~0.1 ms in
/// `seccomp(2)` on the dev machine. The decisions are those
/// of the linear reference program in the tests, number by number.
pub fn program(v: Variant) -> &'static [Insn] {
    static PROGRAMS: [std::sync::OnceLock<Vec<Insn>>; 4] =
        [const { std::sync::OnceLock::new() }; 4];
    PROGRAMS[v.index()].get_or_init(|| build(v))
}

fn build(v: Variant) -> Vec<Insn> {
    let mut p = vec![
        // Non-native ABI (32-bit x86 via int 0x80, ...): kill.
        stmt(LD_W_ABS, OFF_ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(RET_K, RET_KILL_PROCESS),
        stmt(LD_W_ABS, OFF_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        // x32 syscall numbers.
        p.push(jump(JGE_K, X32_SYSCALL_BIT, 0, 1));
        p.push(stmt(RET_K, errno(libc::EPERM)));
    }
    let mut table: Vec<(u32, Special)> = DENIED.iter().map(|&n| (nr(n), Special::Deny)).collect();
    table.push((nr(libc::SYS_clone3), Special::Clone3));
    table.push((nr(libc::SYS_clone), Special::Clone));
    table.push((nr(libc::SYS_ioctl), Special::Ioctl { lock_metadata: v.lock_metadata }));
    table.push((nr(libc::SYS_personality), Special::Personality));
    table.push((nr(libc::SYS_kill), Special::KillAll));
    table.extend(SELF_ONLY.iter().map(|&n| (nr(n), Special::SelfPid)));
    table.push((nr(libc::SYS_setpriority), Special::SelfWho(PRIO_PROCESS)));
    table.push((nr(libc::SYS_ioprio_set), Special::SelfWho(IOPRIO_WHO_PROCESS)));
    table.push((nr(libc::SYS_setsockopt), Special::Setsockopt));
    if v.network {
        table.push((nr(libc::SYS_socket), Special::SocketFamily));
    } else {
        table.extend(NO_NETWORK.iter().map(|&n| (nr(n), Special::Deny)));
        table.push((nr(libc::SYS_socketpair), Special::Socketpair));
    }
    if v.lock_metadata {
        table.extend(METADATA.iter().map(|&n| (nr(n), Special::Deny)));
        table.push((nr(libc::SYS_fcntl), Special::Fcntl));
    }
    table.sort_unstable_by_key(|(n, _)| *n);
    table.dedup_by_key(|(n, _)| *n);
    p.extend(search(&table));
    p
}

#[cfg(test)]
mod tests;
