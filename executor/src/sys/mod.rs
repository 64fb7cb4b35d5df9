//! The only unsafe code of the workspace: raw system calls.
//!
//! Every function here is a thin wrapper around one kernel interface, with a
//! `// SAFETY:` comment on each unsafe block; [`child`] is the child's
//! sequence of steps over [`call`]'s wrappers. [`berth`] keeps one type
//! with a rule rather than one call, because memory a `CLONE_VM` child
//! reads must stay valid until it exec'd or exited and only the code that
//! creates the child and hands it the spec can promise that (the run's side
//! is `run::lend`). Decisions (which rights, which syscalls, which user)
//! are made by the safe modules above; this module only applies them.
//!
//! # Async-signal-safety
//!
//! [`child`], [`berth`]'s parked child and `run::join`'s child side (taking the offer up,
//! the wait) run in a `CLONE_VM | CLONE_VFORK` child that
//! shares the executor's memory, through the wrappers of [`call`] and
//! [`futex`]. Code on that path only issues raw system calls on
//! values the parent built beforehand: no allocation, no locks, no glibc
//! wrappers that touch shared state (glibc's `setuid` would broadcast to the
//! parent's threads), no panics.
#![allow(unsafe_code)]

pub mod berth;
pub mod bpf;
pub mod call;
pub mod child;
pub mod fd;
pub mod futex;
pub mod landlock;
pub mod memory;
pub mod mount;
pub mod process;
pub mod reactor;
pub mod spec;
pub mod xattr;
