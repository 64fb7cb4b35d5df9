use super::bpf::interpret::{run, run_counted};
use super::*;

fn call(p: &[Insn], n: libc::c_long, args: [u64; 6]) -> u32 {
    run(p, AUDIT_ARCH, nr(n), args)
}

const VARIANTS: [Variant; 4] = [
    Variant { network: false, lock_metadata: false },
    Variant { network: true, lock_metadata: false },
    Variant { network: false, lock_metadata: true },
    Variant { network: true, lock_metadata: true },
];

/// The straightforward linear program the search tree must agree with.
fn linear_reference(v: Variant) -> Vec<Insn> {
    let eperm = errno(libc::EPERM);
    let mut p = vec![
        stmt(LD_W_ABS, OFF_ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(RET_K, RET_KILL_PROCESS),
        stmt(LD_W_ABS, OFF_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        p.push(jump(JGE_K, X32_SYSCALL_BIT, 0, 1));
        p.push(stmt(RET_K, eperm));
    }
    let sockets = NO_NETWORK.iter().filter(|_| !v.network);
    let metadata = METADATA.iter().filter(|_| v.lock_metadata);
    for &n in DENIED.iter().chain(sockets).chain(metadata) {
        p.push(jump(JEQ_K, nr(n), 0, 1));
        p.push(stmt(RET_K, eperm));
    }
    p.push(jump(JEQ_K, nr(libc::SYS_clone3), 0, 1));
    p.push(stmt(RET_K, errno(libc::ENOSYS)));
    let selves = SELF_ONLY.iter().map(|&n| (n, Special::SelfPid));
    let pairs = (!v.network).then_some((libc::SYS_socketpair, Special::Socketpair));
    let families = v.network.then_some((libc::SYS_socket, Special::SocketFamily));
    let fcntl = v.lock_metadata.then_some((libc::SYS_fcntl, Special::Fcntl));
    for (n, s) in [
        (libc::SYS_clone, Special::Clone),
        (libc::SYS_ioctl, Special::Ioctl { lock_metadata: v.lock_metadata }),
        (libc::SYS_personality, Special::Personality),
        (libc::SYS_kill, Special::KillAll),
        (libc::SYS_setpriority, Special::SelfWho(PRIO_PROCESS)),
        (libc::SYS_ioprio_set, Special::SelfWho(IOPRIO_WHO_PROCESS)),
        (libc::SYS_setsockopt, Special::Setsockopt),
    ]
    .into_iter()
    .chain(selves)
    .chain(pairs)
    .chain(families)
    .chain(fcntl)
    {
        let block = special_block(s);
        p.push(jump(JEQ_K, nr(n), 0, u8::try_from(block.len()).unwrap()));
        p.extend(block);
    }
    p.push(stmt(RET_K, RET_ALLOW));
    p
}

#[test]
fn search_tree_agrees_with_the_linear_program_for_every_number() {
    let argsets: [[u64; 6]; 27] = [
        [0; 6],
        [0, 7, 0, 0, 0, 0],
        [1, 0, 0, 0, 0, 0],
        [0x1000_0000 | 17, 0x5412, 0, 0, 0, 0],
        [0x01_1200 | 17, 0x541C, 0, 0, 0, 0],
        [0xffff_ffff, 0x5401, 0, 0, 0, 0],
        [0x0040_0000, 0xffff_ffff_0000_5412, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [2, 1, 0, 0, 0, 0],
        [10, 2, 0, 0, 0, 0],
        // socketpair: AF_UNIX datagram, seqpacket | SOCK_CLOEXEC, raw;
        // fcntl: F_SETLEASE, F_SETLEASE in the high bits only.
        [1, 2, 0, 0, 0, 0],
        [1, 0x8_0005, 0, 0, 0, 0],
        [1, 3, 0, 0, 0, 0],
        [3, 1024, 1, 0, 0, 0],
        [3, 1024 << 32, 1, 0, 0, 0],
        // ioctl: FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR.
        [3, 0x4008_6602, 0, 0, 0, 0],
        [3, 0x401c_5820, 0, 0, 0, 0],
        // socket: AF_NETLINK, AF_PACKET, AF_VSOCK; setsockopt:
        // IPV6_RTHDR, IPV6_2292RTHDR, IP_OPTIONS.
        [16, 3, 0, 0, 0, 0],
        [17, 3, 0, 0, 0, 0],
        [40, 1, 0, 0, 0, 0],
        [3, 41, 57, 0, 0, 0],
        [3, 41, 5, 0, 0, 0],
        [3, 0, 4, 0, 0, 0],
        [3, 41, 6, 0, 0, 0],
        [3, 41, 59, 0, 0, 0],
        [3, 41, 26, 0, 0, 0],
        [3, 41, 60, 0, 0, 0],
    ];
    for v in VARIANTS {
        let tree = program(v);
        let linear = linear_reference(v);
        // Every jump lands inside the program.
        for (i, insn) in tree.iter().enumerate() {
            let far = match insn.code {
                JA => i + 1 + insn.k as usize,
                RET_K | LD_W_ABS => i,
                _ => i + 1 + usize::from(insn.jt.max(insn.jf)),
            };
            assert!(far < tree.len(), "insn {i} jumps out of the program");
        }
        let numbers = (0..1100u32).chain((0..1100).map(|n| X32_SYSCALL_BIT | n)).chain([
            u32::MAX,
            X32_SYSCALL_BIT - 1,
            0x7fff_ffff,
        ]);
        for n in numbers {
            for args in &argsets {
                for arch in [AUDIT_ARCH, 0x4000_0003] {
                    assert_eq!(
                        run(tree, arch, n, *args),
                        run(&linear, arch, n, *args),
                        "{v:?}, nr {n}, args {args:x?}, arch {arch:#x}"
                    );
                }
            }
        }
        // An allowed call runs a handful of instructions, not the whole
        // list (the kernel runs the filter for every number on attach).
        // The locked programs, for rare runs, decide ~25 numbers more.
        let bound = if v.lock_metadata { 20 } else { 18 };
        let longest = (0..500).map(|n| run_counted(tree, AUDIT_ARCH, n, [0; 6]).1).max();
        assert!(longest.unwrap_or(0) <= bound, "{v:?}: {longest:?} instructions");
        let linear_steps = run_counted(&linear, AUDIT_ARCH, 0, [0; 6]).1;
        assert!(linear_steps > 2 * longest.unwrap_or(0), "{linear_steps} vs {longest:?}");
    }
}

#[test]
fn decisions() {
    let p = program(VARIANTS[0]);
    let p = p.to_vec();
    let eperm = errno(libc::EPERM);
    let z = [0; 6];
    assert_eq!(run(&p, 0x4000_0003, 1, z), RET_KILL_PROCESS, "i386 ABI");
    assert_eq!(call(&p, libc::SYS_read, z), RET_ALLOW);
    assert_eq!(run(&p, AUDIT_ARCH, X32_SYSCALL_BIT | 1, z), eperm, "x32");
    for &n in DENIED {
        assert_eq!(call(&p, n, z), eperm, "{n}");
    }
    assert_eq!(call(&p, libc::SYS_clone3, z), errno(libc::ENOSYS));
    assert_eq!(call(&p, libc::SYS_clone, [0x01_1200 | 17, 0, 0, 0, 0, 0]), RET_ALLOW);
    assert_eq!(call(&p, libc::SYS_clone, [0x1000_0000 | 17, 0, 0, 0, 0, 0]), eperm);
    assert_eq!(call(&p, libc::SYS_ioctl, [0, 0x5401, 0, 0, 0, 0]), RET_ALLOW);
    assert_eq!(call(&p, libc::SYS_ioctl, [0, 0x5412, 0, 0, 0, 0]), eperm);
    assert_eq!(call(&p, libc::SYS_ioctl, [0, 0xffff_ffff_0000_5412, 0, 0, 0, 0]), eperm);
    assert_eq!(call(&p, libc::SYS_ioctl, [0, 0x541C, 0, 0, 0, 0]), eperm);
    assert_eq!(call(&p, libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0]), RET_ALLOW);
    assert_eq!(call(&p, libc::SYS_personality, [0x0040_0000, 0, 0, 0, 0, 0]), eperm);
    assert_eq!(call(&p, libc::SYS_socket, [1, 1, 0, 0, 0, 0]), eperm, "AF_UNIX");
    assert_eq!(call(&p, libc::SYS_socket, [2, 1, 0, 0, 0, 0]), eperm, "AF_INET");
    assert_eq!(call(&p, libc::SYS_socket, [10, 2, 0, 0, 0, 0]), eperm, "AF_INET6");
    assert_eq!(call(&p, libc::SYS_socket, [16, 3, 0, 0, 0, 0]), eperm, "AF_NETLINK");
    let pair = |family: u64, ty: u64| call(&p, libc::SYS_socketpair, [family, ty, 0, 0, 0, 0]);
    assert_eq!(pair(1, 1), RET_ALLOW, "AF_UNIX stream pair");
    assert_eq!(pair(1, 0x8_0805), RET_ALLOW, "seqpacket, CLOEXEC | NONBLOCK");
    assert_eq!(pair(1, 2), eperm, "a datagram pair can sendto any pathname socket");
    assert_eq!(pair(1, 0x8_0002), eperm, "datagram with flags");
    assert_eq!(pair(1, 3), eperm, "SOCK_RAW is a datagram socket for AF_UNIX");
    assert_eq!(pair(30, 1), eperm, "AF_TIPC");
    assert_eq!(call(&p, libc::SYS_bind, [3, 0, 0, 0, 0, 0]), eperm, "a pair's end named");
    assert_eq!(call(&p, libc::SYS_listen, [3, 0, 0, 0, 0, 0]), eperm);
    assert_eq!(call(&p, libc::SYS_io_setup, z), eperm, "host-wide AIO contexts");
    assert_eq!(call(&p, libc::SYS_mq_unlink, z), eperm, "POSIX message queues");
    for n in [libc::SYS_inotify_init1, libc::SYS_inotify_add_watch] {
        assert_eq!(call(&p, n, z), eperm, "inotify {n}");
    }
    // The dedicated run-as user keeps its own files' metadata.
    for &n in METADATA {
        assert_eq!(call(&p, n, z), RET_ALLOW, "{n} unlocked");
    }
    assert_eq!(call(&p, libc::SYS_fcntl, [3, 1024, 1, 0, 0, 0]), RET_ALLOW);
    let open = program(VARIANTS[1]);
    assert_eq!(call(open, libc::SYS_socket, [2, 1, 0, 0, 0, 0]), RET_ALLOW);
    assert_eq!(call(open, libc::SYS_socket, [1, 1, 0, 0, 0, 0]), RET_ALLOW, "AF_UNIX");
    assert_eq!(call(open, libc::SYS_socketpair, [1, 1, 0, 0, 0, 0]), RET_ALLOW);
    assert_eq!(call(open, libc::SYS_socketpair, [1, 2, 0, 0, 0, 0]), RET_ALLOW);
    assert_eq!(call(open, libc::SYS_bind, [3, 0, 0, 0, 0, 0]), RET_ALLOW);
    assert_eq!(call(open, libc::SYS_listen, [3, 0, 0, 0, 0, 0]), RET_ALLOW);
    assert_eq!(call(open, libc::SYS_ptrace, z), eperm);
}

#[test]
fn a_locked_run_changes_no_files_metadata() {
    let eperm = errno(libc::EPERM);
    for v in &VARIANTS[2..] {
        let p = program(*v);
        for &n in METADATA {
            assert_eq!(call(p, n, [0; 6]), eperm, "{v:?}: {n}");
        }
        let fcntl = |cmd: u64| call(p, libc::SYS_fcntl, [3, cmd, 1, 0, 0, 0]);
        assert_eq!(fcntl(1024), eperm, "F_SETLEASE");
        assert_eq!(fcntl(1025), RET_ALLOW, "F_GETLEASE");
        assert_eq!(fcntl(u64::from(libc::F_SETFD as u32)), RET_ALLOW, "F_SETFD");
        assert_eq!(fcntl(u64::from(libc::F_SETLK as u32)), RET_ALLOW, "record locks");
        assert_eq!(call(p, libc::SYS_openat, [0; 6]), RET_ALLOW);
        assert_eq!(call(p, libc::SYS_newfstatat, [0; 6]), RET_ALLOW);
        let ioctl = |cmd: u64| call(p, libc::SYS_ioctl, [3, cmd, 0, 0, 0, 0]);
        for &cmd in METADATA_IOCTLS {
            assert_eq!(ioctl(u64::from(cmd)), eperm, "{v:?}: ioctl {cmd:#x}");
        }
        assert_eq!(ioctl(0x8008_6601), RET_ALLOW, "FS_IOC_GETFLAGS");
        assert_eq!(ioctl(0x5412), eperm, "TIOCSTI");
        assert_eq!(ioctl(0x5401), RET_ALLOW, "TCGETS");
    }
    // Unlocked: chattr's ioctls work on the run's own files.
    let own = program(VARIANTS[0]);
    assert_eq!(call(own, libc::SYS_ioctl, [3, 0x4008_6602, 0, 0, 0, 0]), RET_ALLOW);
}

#[test]
fn a_capability_over_others_files_locks_metadata_even_for_the_dedicated_user() {
    assert!(!Variant::for_run(false, true, &[]).lock_metadata);
    assert!(!Variant::for_run(true, true, &[13]).lock_metadata, "CAP_NET_RAW");
    for &cap in METADATA_CAPABILITIES {
        assert!(Variant::for_run(false, true, &[13, cap]).lock_metadata, "cap {cap}");
    }
    assert!(Variant::for_run(false, false, &[]).lock_metadata, "not the dedicated user");
}

#[test]
fn another_process_cannot_be_named_only_the_caller() {
    let eperm = errno(libc::EPERM);
    for v in VARIANTS {
        let p = program(v);
        for &n in SELF_ONLY {
            assert_eq!(call(p, n, [0, 7, 0, 0, 0, 0]), RET_ALLOW, "{n} on itself");
            assert_eq!(call(p, n, [4242, 7, 0, 0, 0, 0]), eperm, "{n} on pid 4242");
            assert_eq!(call(p, n, [1 << 32, 7, 0, 0, 0, 0]), RET_ALLOW, "{n}: int pid");
        }
        let prio = libc::SYS_setpriority;
        assert_eq!(call(p, prio, [0, 0, 19, 0, 0, 0]), RET_ALLOW, "nice(19)");
        assert_eq!(call(p, prio, [0, 4242, 19, 0, 0, 0]), eperm, "another process");
        assert_eq!(call(p, prio, [1, 0, 19, 0, 0, 0]), eperm, "its process group");
        assert_eq!(call(p, prio, [2, 0, 19, 0, 0, 0]), eperm, "its user, every process");
        let io = libc::SYS_ioprio_set;
        assert_eq!(call(p, io, [1, 0, 3 << 13, 0, 0, 0]), RET_ALLOW, "itself idle");
        assert_eq!(call(p, io, [1, 4242, 3 << 13, 0, 0, 0]), eperm, "another process");
        assert_eq!(call(p, io, [3, 0, 3 << 13, 0, 0, 0]), eperm, "its user");
        // Reading stays open.
        assert_eq!(call(p, libc::SYS_getpriority, [2, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(p, libc::SYS_sched_getaffinity, [4242, 0, 0, 0, 0, 0]), RET_ALLOW);
        for n in [libc::SYS_shmget, libc::SYS_msgget, libc::SYS_semget, libc::SYS_shmat] {
            assert_eq!(call(p, n, [0; 6]), eperm, "SysV IPC {n}");
        }
        let kill = |pid: u64| call(p, libc::SYS_kill, [pid, 9, 0, 0, 0, 0]);
        assert_eq!(kill(u64::MAX), eperm, "kill(-1), sign-extended");
        assert_eq!(kill(u64::from(u32::MAX)), eperm, "kill(-1), the int alone");
        assert_eq!(kill(0), RET_ALLOW, "its own process group");
        assert_eq!(kill(4242), RET_ALLOW, "one process: Landlock's signal scope decides");
        assert_eq!(kill(u64::MAX - 1), RET_ALLOW, "process group 2");
    }
}

/// With the network grant: sockets of the IP families, Unix and netlink
/// only (no vsock, packet or XDP socket, whose destinations no egress
/// program judges); in every variant no source route (`IP_OPTIONS`, the
/// IPv6 routing header), other options of those levels allowed.
#[test]
fn network_families_and_source_routes() {
    let eperm = errno(libc::EPERM);
    let net = program(VARIANTS[1]).to_vec();
    for family in [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK] {
        let args = [family as u64, 1, 0, 0, 0, 0];
        assert_eq!(call(&net, libc::SYS_socket, args), RET_ALLOW, "{family}");
    }
    for family in [libc::AF_VSOCK, libc::AF_PACKET, libc::AF_XDP, libc::AF_BLUETOOTH] {
        let args = [family as u64, 1, 0, 0, 0, 0];
        assert_eq!(call(&net, libc::SYS_socket, args), eperm, "{family}");
    }
    for v in VARIANTS {
        let p = program(v).to_vec();
        let opt = |level: i32, name: i32| {
            call(&p, libc::SYS_setsockopt, [3, level as u64, name as u64, 0, 0, 0])
        };
        for name in [3, 4, 5, 6, 54, 55, 57, 59] {
            assert_eq!(opt(libc::SOL_IPV6, name), eperm, "IPv6 option {name}, {v:?}");
        }
        assert_eq!(opt(libc::SOL_IPV6, libc::IPV6_RTHDR), eperm, "{v:?}");
        assert_eq!(opt(libc::SOL_IP, libc::IP_OPTIONS), eperm, "{v:?}");
        assert_eq!(opt(libc::SOL_IPV6, libc::IPV6_V6ONLY), RET_ALLOW, "{v:?}");
        assert_eq!(opt(libc::SOL_IP, libc::IP_TOS), RET_ALLOW, "{v:?}");
        assert_eq!(opt(libc::SOL_SOCKET, libc::SO_REUSEADDR), RET_ALLOW, "{v:?}");
        assert_eq!(opt(libc::SOL_TCP, libc::IP_OPTIONS), RET_ALLOW, "TCP_KEEPIDLE, {v:?}");
    }
}
