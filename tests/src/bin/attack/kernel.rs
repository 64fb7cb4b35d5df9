//! Kernel attack surface: syscalls the sandbox must deny, signals, ptrace
//! and cross-process memory reads.

use serde_json::{json, Value};

use crate::{errno, num, outcome, param};

fn ret(r: libc::c_long) -> Result<Value, i32> {
    if r >= 0 {
        Ok(json!({"ret": r}))
    } else {
        Err(errno())
    }
}

/// Forks with raw `clone`/`clone3` flags; the child exits at once.
fn clone_child(r: libc::c_long) -> Result<Value, i32> {
    if r == 0 {
        // SAFETY: in the child of a raw clone: leave without touching Rust state.
        unsafe { libc::_exit(0) };
    }
    let res = ret(r);
    if let Ok(pid) = i32::try_from(r) {
        if pid > 0 {
            // SAFETY: waiting for our own child; a null status pointer is allowed.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        }
    }
    res
}

/// `int 0x80` getpid: the 32-bit syscall ABI from a 64-bit process.
fn int80_getpid() -> libc::c_long {
    let r: i32;
    // SAFETY: `int 0x80` with eax = 20 is the i386 getpid; it reads no
    // memory and the kernel may clobber r8-r11, which are declared.
    unsafe {
        std::arch::asm!(
            "int 0x80",
            inlateout("eax") 20i32 => r,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            options(nostack)
        );
    }
    libc::c_long::from(r)
}

fn syscall(name: &str) -> Result<Value, i32> {
    // The 128-byte argument block of the calls that take a struct.
    let mut buf = [0u64; 16];
    match name {
        // BPF_MAP_CREATE of a 1-entry array map.
        "bpf" => {
            buf[0] = 2 | (4 << 32);
            buf[1] = 4 | (1 << 32);
        }
        // PERF_TYPE_SOFTWARE, size 64 (VER0), PERF_COUNT_SW_CPU_CLOCK,
        // disabled | exclude_kernel | exclude_hv.
        "perf_event_open" => {
            buf[0] = 1 | (64 << 32);
            buf[5] = 1 | (1 << 5) | (1 << 6);
        }
        // struct clone_args { flags = CLONE_NEWUSER, exit_signal = SIGCHLD }.
        "clone3_newuser" => {
            buf[0] = libc::CLONE_NEWUSER as u64;
            buf[4] = libc::SIGCHLD as u64;
        }
        _ => {}
    }
    let p = buf.as_mut_ptr();
    // SAFETY: every call below passes constants, or pointers to `buf` and
    // C string literals that outlive the call and are large enough for what
    // the kernel reads or writes (128 bytes); fds returned close at exit.
    let r: libc::c_long = unsafe {
        match name {
            "keyctl" => libc::syscall(libc::SYS_keyctl, 0, -3, 1),
            "add_key" => libc::syscall(
                libc::SYS_add_key,
                c"user".as_ptr(),
                c"ongrid".as_ptr(),
                c"x".as_ptr(),
                1,
                -2,
            ),
            "io_uring_setup" => libc::syscall(libc::SYS_io_uring_setup, 4, p),
            // One Linux AIO context (its id written to buf[0], which is 0).
            "io_setup" => libc::syscall(libc::SYS_io_setup, 1, p),
            "bpf" => libc::syscall(libc::SYS_bpf, 0, p, 128),
            "perf_event_open" => libc::syscall(libc::SYS_perf_event_open, p, 0, -1, -1, 0),
            "kexec_load" => libc::syscall(libc::SYS_kexec_load, 0, 0, std::ptr::null::<u8>(), 0),
            // FAN_CLASS_NOTIF | FAN_REPORT_FID: allowed without privilege.
            "fanotify_init" => libc::syscall(libc::SYS_fanotify_init, 0x200, libc::O_RDONLY),
            "inotify_init1" => libc::syscall(libc::SYS_inotify_init1, libc::IN_CLOEXEC),
            // Reads the LDT (func 0) into `buf`.
            #[cfg(target_arch = "x86_64")]
            "modify_ldt" => libc::syscall(libc::SYS_modify_ldt, 0, p, 128),
            "unshare_user" => libc::c_long::from(libc::unshare(libc::CLONE_NEWUSER)),
            "clone_newns" => {
                let flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::SIGCHLD;
                return clone_child(libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0));
            }
            "clone3_newuser" => return clone_child(libc::syscall(libc::SYS_clone3, p, 88)),
            "mount" => {
                let _ = std::fs::create_dir("mnt");
                libc::c_long::from(libc::mount(
                    c"none".as_ptr(),
                    c"mnt".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                ))
            }
            "tiocsti" => {
                let c = b'x';
                libc::c_long::from(libc::ioctl(0, libc::TIOCSTI, &c))
            }
            "tiocsti_high" => {
                let c = b'x';
                let cmd = u64::from(u32::try_from(libc::TIOCSTI).unwrap_or(0)) | (1 << 32);
                libc::syscall(libc::SYS_ioctl, 0, cmd, &c)
            }
            "int80" => {
                let r = int80_getpid();
                let pid = libc::c_long::from(libc::getpid());
                return if r == pid {
                    Ok(json!({"ret": r}))
                } else if r < 0 {
                    Err(i32::try_from(-r).unwrap_or(-1))
                } else {
                    Err(-1)
                };
            }
            _ => return Err(-1),
        }
    };
    ret(r)
}

fn scan_proc(needle: &str) -> Value {
    let mut hits = Vec::new();
    let mut readable = 0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if !e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        for file in ["cmdline", "environ"] {
            if let Ok(b) = std::fs::read(e.path().join(file)) {
                readable += 1;
                if b.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    hits.push(format!("{}/{file}", e.path().display()));
                }
            }
        }
    }
    json!({"attempt": "cmdline_scan", "succeeded": !hits.is_empty(), "hits": hits,
           "files_read": readable})
}

/// Runs one kernel-surface case.
pub(crate) fn attempt(case: &str, args: &Value) -> Value {
    // pid 0 stands for the parent (the executor side of the run).
    let pid = match libc::pid_t::try_from(num(args, "pid", 0)).unwrap_or(0) {
        // SAFETY: getppid cannot fail and touches no memory.
        0 => unsafe { libc::getppid() },
        p => p,
    };
    let r = match case {
        "syscall" => {
            let name = param(args, "name");
            let mut v = outcome(case, syscall(name));
            v["syscall"] = json!(name);
            return v;
        }
        // SAFETY: kill(2) takes plain integers.
        "kill" => ret(libc::c_long::from(unsafe { libc::kill(pid, libc::SIGKILL) })),
        "kill_all" => {
            // SAFETY: kill(2) takes plain integers; -1 = every process we may signal.
            let r = unsafe { libc::kill(-1, libc::SIGKILL) };
            let e = if r < 0 { errno() } else { 0 };
            // kill(-1) returns 0 even when every target refused (EPERM), so
            // only the test can tell whether anything outside died.
            return json!({"attempt": case, "ret": r, "errno": e});
        }
        "cgroup_escape" => return cgroup_escape(),
        "ptrace" => {
            // SAFETY: PTRACE_ATTACH takes a pid and ignores addr/data.
            let r = unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0) };
            if r == 0 {
                // SAFETY: we are the tracer; wait for the stop and let go.
                unsafe {
                    libc::waitpid(pid, std::ptr::null_mut(), libc::__WALL);
                    libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
                }
            }
            ret(r)
        }
        "process_vm_readv" => {
            let mut buf = [0u8; 16];
            let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
            let addr = usize::try_from(num(args, "addr", 0)).unwrap_or(0);
            let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
            // SAFETY: `local` points at `buf` (16 writable bytes); `remote` is
            // only dereferenced by the kernel in the target process.
            let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
            if n < 0 {
                Err(errno())
            } else {
                Ok(json!({"read": String::from_utf8_lossy(&buf).into_owned()}))
            }
        }
        "cmdline_scan" => return scan_proc(param(args, "needle")),
        "interfere" => return interfere(pid),
        "interfere_self" => return interfere(0),
        "sysv_ipc" => return sysv_ipc(),
        "mq_create" | "mq_unlink" => posix_mq(case, param(args, "name")),
        _ => Err(-1),
    };
    outcome(case, r)
}

/// Sets the limits, niceness, CPUs, policy and I/O class of process `pid`
/// (0: itself, as libc's wrappers do), each to a harmless value: its core
/// limit to 0, nice 19, every CPU, `SCHED_OTHER`, best-effort I/O. Every
/// call that worked is in `done`, the errno of every other in `errnos`.
fn interfere(pid: libc::pid_t) -> Value {
    let core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it.
    let mut cpus: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in 0..libc::CPU_SETSIZE as usize {
        // SAFETY: c < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut cpus) };
    }
    let param = libc::sched_param { sched_priority: 0 };
    let be4 = (2 << 13) | 4;
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let mut done = Vec::new();
    let mut errnos = serde_json::Map::new();
    let mut record = |name: &str, r: libc::c_long| {
        if r >= 0 {
            done.push(name.to_owned());
        } else {
            errnos.insert(name.to_owned(), json!(errno()));
        }
    };
    // SAFETY: plain integers and a pointer to `core`, which outlives the call.
    let r = unsafe { libc::prlimit(pid, libc::RLIMIT_CORE, &core, std::ptr::null_mut()) };
    record("prlimit64", r.into());
    // SAFETY: plain integers.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid.unsigned_abs(), 19) };
    record("setpriority", r.into());
    // SAFETY: a pointer to `cpus` (`size` bytes), which outlives the call.
    let r = unsafe { libc::sched_setaffinity(pid, size, &cpus) };
    record("sched_setaffinity", r.into());
    // SAFETY: a pointer to `param`, which outlives the call.
    let r = unsafe { libc::sched_setscheduler(pid, libc::SCHED_OTHER, &param) };
    record("sched_setscheduler", r.into());
    // SAFETY: plain integers.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_set, 1, pid, be4) };
    record("ioprio_set", r);
    json!({"attempt": "interfere", "pid": pid, "succeeded": !done.is_empty(), "done": done,
           "errnos": errnos})
}

/// Creates a SysV shared memory segment, message queue and semaphore set
/// (private keys, removed again at once when made).
/// Creates (`mq_create`, left behind) or removes (`mq_unlink`) the POSIX
/// message queue `/name`.
fn posix_mq(case: &str, name: &str) -> Result<Value, i32> {
    let Ok(path) = std::ffi::CString::new(format!("/{name}")) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: `path` is a valid C string; a null attribute pointer asks
    // for the defaults; the queue descriptor returned closes at exit.
    let r = unsafe {
        if case == "mq_create" {
            libc::mq_open(
                path.as_ptr(),
                libc::O_CREAT | libc::O_RDWR,
                0o600 as libc::mode_t,
                std::ptr::null::<libc::mq_attr>(),
            )
        } else {
            libc::mq_unlink(path.as_ptr())
        }
    };
    ret(libc::c_long::from(r))
}

fn sysv_ipc() -> Value {
    let mut made = Vec::new();
    let mut errnos = serde_json::Map::new();
    let flags = libc::IPC_CREAT | 0o600;
    for name in ["shmget", "msgget", "semget"] {
        // SAFETY: the get calls take integers only.
        let id = unsafe {
            match name {
                "shmget" => libc::shmget(libc::IPC_PRIVATE, 4096, flags),
                "msgget" => libc::msgget(libc::IPC_PRIVATE, flags),
                _ => libc::semget(libc::IPC_PRIVATE, 1, flags),
            }
        };
        if id < 0 {
            errnos.insert(name.to_owned(), json!(errno()));
            continue;
        }
        made.push(name);
        // SAFETY: removing the object just made, by id; IPC_RMID ignores
        // the null buffer.
        unsafe {
            match name {
                "shmget" => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
                "msgget" => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
                _ => libc::semctl(id, 0, libc::IPC_RMID),
            };
        }
    }
    json!({"attempt": "sysv_ipc", "succeeded": !made.is_empty(), "made": made, "errnos": errnos})
}

/// Tries to loosen its own cgroup limits and to move itself to the root
/// cgroup of every hierarchy it is in.
fn cgroup_escape() -> Value {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut tries = Vec::new();
    for line in own.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrl, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or("/"));
        // The v2 hierarchy is at /sys/fs/cgroup/unified on a hybrid host,
        // at /sys/fs/cgroup itself on a pure v2 one: both are tried.
        let bases = match ctrl {
            "" => vec!["/sys/fs/cgroup/unified".to_owned(), "/sys/fs/cgroup".to_owned()],
            c => vec![format!("/sys/fs/cgroup/{}", c.trim_start_matches("name="))],
        };
        for base in bases {
            match ctrl {
                "pids" => tries.push((format!("{base}{path}/pids.max"), "max")),
                "memory" => tries.push((format!("{base}{path}/memory.limit_in_bytes"), "-1")),
                "" => tries.push((format!("{base}{path}/memory.max"), "max")),
                _ => {}
            }
            tries.push((format!("{base}/cgroup.procs"), "0"));
        }
    }
    let mut done = Vec::new();
    let mut errnos = serde_json::Map::new();
    for (path, value) in tries {
        match std::fs::write(&path, value) {
            Ok(()) => done.push(path),
            Err(e) => {
                errnos.insert(path, json!(e.raw_os_error()));
            }
        }
    }
    json!({"attempt": "cgroup_escape", "succeeded": !done.is_empty(), "done": done,
           "errnos": errnos, "cgroups": own})
}

/// Dies of SIGSEGV with the default action (Rust's own handler removed).
pub(crate) fn segv() -> Value {
    // SAFETY: resetting a handler to SIG_DFL and raising a signal at ourselves.
    unsafe {
        libc::signal(libc::SIGSEGV, libc::SIG_DFL);
        libc::raise(libc::SIGSEGV);
    }
    json!({"attempt": "segv", "error": "survived SIGSEGV"})
}
