//! The kernel's Landlock ABI version. Rulesets are built with the
//! `landlock` crate (`sandbox::landlock`), which keeps its own ABI probe
//! private on purpose; the run report names the kernel's ABI, so this one
//! query stays. `landlock_restrict_self` happens in the child (see `call`).

const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1 << 0;

/// The kernel's Landlock ABI version; 0 when Landlock is unavailable.
pub fn abi() -> u32 {
    // SAFETY: the VERSION query takes no attribute (NULL, 0).
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            0usize,
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(r).unwrap_or(0)
}
