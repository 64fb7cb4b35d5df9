//! Reaping: the run's main process by pid, and orphans of any run.
//!
//! The executor is a child subreaper, so a skill's daemonised leftovers are
//! reparented to it (this machine's PID 1 does not reap). Reaping "any
//! child" could take a main process's status from under its run; such a
//! status is parked here and handed to its run.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::sys::process::{self, Exit};

/// Parked exit statuses of the main processes being supervised.
#[derive(Debug, Default)]
pub struct Reaper {
    mains: Mutex<HashMap<i32, Option<Exit>>>,
}

impl Reaper {
    /// The process-wide reaper: reaping "any child" is process-wide, so
    /// every engine of the process must share one.
    pub fn global() -> &'static Reaper {
        static GLOBAL: std::sync::OnceLock<Reaper> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(Reaper::default)
    }

    /// Tracks `pid` as a run's main process.
    pub fn track(&self, pid: i32) {
        self.lock().insert(pid, None);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Option<Exit>>> {
        // A poisoned map is still consistent (every update is one insert).
        self.mains.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The exit of `pid` if it has ended (reaping it), else `None`.
    pub fn collect(&self, pid: i32) -> Option<Exit> {
        let mut mains = self.lock();
        if let Some(Some(exit)) = mains.get(&pid) {
            let exit = *exit;
            mains.remove(&pid);
            return Some(exit);
        }
        match process::wait(pid, true) {
            Ok(Some((_, exit))) => {
                mains.remove(&pid);
                Some(exit)
            }
            Ok(None) => None,
            Err(_) => {
                // Not our child any more: nothing to wait for.
                mains.remove(&pid);
                Some(Exit { code: None, signal: None, cpu_us: 0 })
            }
        }
    }

    /// Reaps every exited child that is not a tracked main process (whose
    /// status is parked instead).
    pub fn reap_orphans(&self) {
        let mut mains = self.lock();
        while let Ok(Some((pid, exit))) = process::wait(-1, true) {
            if let Some(slot) = mains.get_mut(&pid) {
                *slot = Some(exit);
            }
        }
    }
}
