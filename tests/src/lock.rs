//! Serialises the resource-heavy cases.
//!
//! Ordinary cases take the lock shared and run in parallel. Fork bombs,
//! memory hogs, floods, process-tree and concurrency cases take it
//! exclusively: they need the machine quiet to count processes and cgroups,
//! and would starve their neighbours' deadlines on a 2-core host.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static LOCK: RwLock<()> = RwLock::new(());

/// Held by a case that may run next to others.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    LOCK.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Held by a case that must run alone.
pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
    LOCK.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}
