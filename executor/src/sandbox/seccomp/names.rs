//! Names of the syscalls the filter refuses, for the report's
//! `sandbox.denials` (an audit record gives the number only).

/// Every call the filter may refuse, by number, with its name.
const NAMES: &[(libc::c_long, &str)] = &[
    (libc::SYS_ptrace, "ptrace"),
    (libc::SYS_process_vm_readv, "process_vm_readv"),
    (libc::SYS_process_vm_writev, "process_vm_writev"),
    (libc::SYS_io_uring_setup, "io_uring_setup"),
    (libc::SYS_io_uring_enter, "io_uring_enter"),
    (libc::SYS_io_uring_register, "io_uring_register"),
    (libc::SYS_keyctl, "keyctl"),
    (libc::SYS_add_key, "add_key"),
    (libc::SYS_request_key, "request_key"),
    (libc::SYS_unshare, "unshare"),
    (libc::SYS_setns, "setns"),
    (libc::SYS_mount, "mount"),
    (libc::SYS_umount2, "umount2"),
    (libc::SYS_pivot_root, "pivot_root"),
    (libc::SYS_fsopen, "fsopen"),
    (libc::SYS_fsconfig, "fsconfig"),
    (libc::SYS_fsmount, "fsmount"),
    (libc::SYS_fspick, "fspick"),
    (libc::SYS_move_mount, "move_mount"),
    (libc::SYS_open_tree, "open_tree"),
    (libc::SYS_mount_setattr, "mount_setattr"),
    (libc::SYS_bpf, "bpf"),
    (libc::SYS_perf_event_open, "perf_event_open"),
    (libc::SYS_kexec_load, "kexec_load"),
    (libc::SYS_kexec_file_load, "kexec_file_load"),
    (libc::SYS_init_module, "init_module"),
    (libc::SYS_finit_module, "finit_module"),
    (libc::SYS_delete_module, "delete_module"),
    (libc::SYS_userfaultfd, "userfaultfd"),
    (libc::SYS_chroot, "chroot"),
    (libc::SYS_acct, "acct"),
    (libc::SYS_swapon, "swapon"),
    (libc::SYS_swapoff, "swapoff"),
    (libc::SYS_reboot, "reboot"),
    (libc::SYS_open_by_handle_at, "open_by_handle_at"),
    (libc::SYS_kcmp, "kcmp"),
    (libc::SYS_syslog, "syslog"),
    (libc::SYS_fanotify_init, "fanotify_init"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_inotify_init, "inotify_init"),
    (libc::SYS_inotify_init1, "inotify_init1"),
    (libc::SYS_inotify_add_watch, "inotify_add_watch"),
    (libc::SYS_process_madvise, "process_madvise"),
    (libc::SYS_process_mrelease, "process_mrelease"),
    (libc::SYS_shmget, "shmget"),
    (libc::SYS_shmat, "shmat"),
    (libc::SYS_shmctl, "shmctl"),
    (libc::SYS_msgget, "msgget"),
    (libc::SYS_msgsnd, "msgsnd"),
    (libc::SYS_msgrcv, "msgrcv"),
    (libc::SYS_msgctl, "msgctl"),
    (libc::SYS_semget, "semget"),
    (libc::SYS_semop, "semop"),
    (libc::SYS_semtimedop, "semtimedop"),
    (libc::SYS_semctl, "semctl"),
    (libc::SYS_mq_open, "mq_open"),
    (libc::SYS_mq_unlink, "mq_unlink"),
    (libc::SYS_mq_timedsend, "mq_timedsend"),
    (libc::SYS_mq_timedreceive, "mq_timedreceive"),
    (libc::SYS_mq_notify, "mq_notify"),
    (libc::SYS_mq_getsetattr, "mq_getsetattr"),
    (libc::SYS_io_setup, "io_setup"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_iopl, "iopl"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_ioperm, "ioperm"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_modify_ldt, "modify_ldt"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_uselib, "uselib"),
    (libc::SYS_socket, "socket"),
    (libc::SYS_bind, "bind"),
    (libc::SYS_listen, "listen"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_chmod, "chmod"),
    (libc::SYS_fchmod, "fchmod"),
    (libc::SYS_fchmodat, "fchmodat"),
    (libc::SYS_fchmodat2, "fchmodat2"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_chown, "chown"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_lchown, "lchown"),
    (libc::SYS_fchown, "fchown"),
    (libc::SYS_fchownat, "fchownat"),
    (libc::SYS_setxattr, "setxattr"),
    (libc::SYS_lsetxattr, "lsetxattr"),
    (libc::SYS_fsetxattr, "fsetxattr"),
    (libc::SYS_removexattr, "removexattr"),
    (libc::SYS_lremovexattr, "lremovexattr"),
    (libc::SYS_fremovexattr, "fremovexattr"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_utime, "utime"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_utimes, "utimes"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_futimesat, "futimesat"),
    (libc::SYS_utimensat, "utimensat"),
    (libc::SYS_prlimit64, "prlimit64"),
    (libc::SYS_sched_setaffinity, "sched_setaffinity"),
    (libc::SYS_sched_setscheduler, "sched_setscheduler"),
    (libc::SYS_sched_setparam, "sched_setparam"),
    (libc::SYS_sched_setattr, "sched_setattr"),
    (libc::SYS_migrate_pages, "migrate_pages"),
    (libc::SYS_move_pages, "move_pages"),
    (libc::SYS_clone3, "clone3"),
    (libc::SYS_clone, "clone"),
    (libc::SYS_ioctl, "ioctl"),
    (libc::SYS_personality, "personality"),
    (libc::SYS_setpriority, "setpriority"),
    (libc::SYS_ioprio_set, "ioprio_set"),
    (libc::SYS_socketpair, "socketpair"),
    (libc::SYS_fcntl, "fcntl"),
    (libc::SYS_openat, "openat"),
    (libc::SYS_newfstatat, "newfstatat"),
    (libc::SYS_getpriority, "getpriority"),
    (libc::SYS_sched_getaffinity, "sched_getaffinity"),
    (super::SYS_SETXATTRAT, "setxattrat"),
    (super::SYS_REMOVEXATTRAT, "removexattrat"),
    (super::SYS_FILE_SETATTR, "file_setattr"),
];

/// The name of the native call `nr`; `syscall:N` for one not listed.
#[must_use]
pub fn name(nr: libc::c_long) -> String {
    NAMES
        .iter()
        .find(|(n, _)| *n == nr)
        .map_or_else(|| format!("syscall:{nr}"), |(_, name)| (*name).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refused_call_has_its_name() {
        for n in super::super::DENIED
            .iter()
            .chain(super::super::METADATA)
            .chain(super::super::NO_NETWORK)
        {
            assert!(!name(*n).starts_with("syscall:"), "{n}");
        }
        assert_eq!(name(libc::SYS_unshare), "unshare");
        assert_eq!(name(libc::SYS_io_uring_setup), "io_uring_setup");
        assert_eq!(name(100_000), "syscall:100000");
    }
}
