//! `futex(2)` on a 32-bit word: wait while it holds a value, wake a waiter.
//!
//! Raw system calls only, so a `CLONE_VM` child may call them too.
//! `private`: `FUTEX_PRIVATE_FLAG`, for a word only this address space
//! waits on (a `CLONE_VM` child shares it); shared, for a clear-child-tid
//! word, which the kernel wakes with a shared wake-up.

use std::sync::atomic::AtomicU32;

fn op(base: libc::c_int, private: bool) -> libc::c_int {
    if private {
        base | libc::FUTEX_PRIVATE_FLAG
    } else {
        base
    }
}

/// Sleeps while `word` holds `expected` (returns at once if it does not;
/// may return early on a signal or spuriously: callers loop).
pub fn futex_wait(word: &AtomicU32, expected: u32, private: bool) {
    // SAFETY: FUTEX_WAIT on a live word the caller borrows, no timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op(libc::FUTEX_WAIT, private),
            expected,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// Wakes one [`futex_wait`] waiter on `word`, if any.
pub fn futex_wake(word: &AtomicU32, private: bool) {
    // SAFETY: FUTEX_WAKE on a live word the caller borrows.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), op(libc::FUTEX_WAKE, private), 1) };
}
