//! A run slot: its fresh directory, cgroup leaves and stdio pipes, made
//! for the run on the spot or ahead of it by the engine's janitor.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::OFlag;

use super::{Host, SpawnError};
use crate::config::Config;
use crate::run::rundir::RunDir;
use crate::sandbox::cgroup::{Hierarchies, RunCgroup};

/// A run's fresh directory and cgroup leaves, named after one random id.
/// Made for the run on the spot, or ahead of it by the engine's janitor.
/// The directory is always fresh; the janitor may give a new slot the
/// emptied and reset cgroup leaves of a finished run ([`Slot::reuse`]).
#[derive(Debug)]
pub struct Slot {
    /// The id naming the directory and the leaves.
    pub id: String,
    /// The per-run directory.
    pub run_dir: RunDir,
    /// The leaves; `None` without cgroups.
    pub cgroup: Option<RunCgroup>,
    /// The run's stdio pipes, made with the slot (ahead of the run when
    /// the janitor makes it: six system calls off the run's path); `None`
    /// when they could not be made then ([`spawn`](super::spawn) makes them).
    pub stdio: Option<Stdio>,
}

/// A run's three stdio pipes: the child's ends and the executor's.
#[derive(Debug)]
pub struct Stdio {
    pub(super) stdin: (OwnedFd, OwnedFd),
    pub(super) stdout: (OwnedFd, OwnedFd),
    pub(super) stderr: (OwnedFd, OwnedFd),
}

impl Stdio {
    /// Three fresh pipes: close-on-exec, numbered >= 3, the executor's
    /// ends non-blocking.
    ///
    /// # Errors
    ///
    /// [`SpawnError::Prepare`] naming `skill`.
    pub fn new(skill: &str) -> Result<Self, SpawnError> {
        Ok(Stdio {
            stdin: pipe(skill, Ours::Write)?,
            stdout: pipe(skill, Ours::Read)?,
            stderr: pipe(skill, Ours::Read)?,
        })
    }

    /// [`Stdio::new`] for a slot made ahead: `None` on an error (logged),
    /// which the run then meets itself.
    fn ahead() -> Option<Self> {
        Self::new("").map_err(|e| tracing::debug!("a slot's pipes are left to its run: {e}")).ok()
    }
}

impl Slot {
    /// Makes a slot: the directory first, then the leaves (the order the
    /// start-up sweep relies on), with these bounds and owner.
    ///
    /// # Errors
    ///
    /// [`SpawnError`]; what was made is removed.
    pub fn create(
        config: &Config,
        host: &Host,
        memory_bytes: u64,
        max_pids: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<Slot, SpawnError> {
        let (id, run_dir) = Self::fresh_dir(config, host, owner)?;
        let cgroup = if host.cgroups == Hierarchies::default() {
            None
        } else {
            Some(RunCgroup::create(&host.cgroups, &id, memory_bytes, max_pids)?)
        };
        Ok(Slot { id, run_dir, cgroup, stdio: Stdio::ahead() })
    }

    /// A slot made of the leaves of a finished run that
    /// [`RunCgroup::recycle`] found empty and reset and of its directory's
    /// home with a new run directory in it ([`RunDir::renew`]; a home that
    /// was changed is removed and a new one made), which keeps the
    /// Landlock rulesets built for it (the engine's janitor; the leaves
    /// keep their own name). On error the leaves are dropped, i.e.
    /// removed.
    ///
    /// # Errors
    ///
    /// [`SpawnError`] of making the directory.
    pub fn reuse(
        config: &Config,
        host: &Host,
        cgroup: RunCgroup,
        mut run_dir: RunDir,
    ) -> Result<Slot, SpawnError> {
        let owner = run_dir.owner();
        if let Err(e) = run_dir.renew() {
            tracing::debug!("janitor: a slot's directory is made anew: {e}");
            run_dir.remove();
            let (id, run_dir) = Self::fresh_dir(config, host, owner)?;
            return Ok(Slot { id, run_dir, cgroup: Some(cgroup), stdio: Stdio::ahead() });
        }
        let id = run_dir.home().file_name().map(|n| n.to_string_lossy().into_owned());
        let id = id.unwrap_or_default();
        Ok(Slot { id, run_dir, cgroup: Some(cgroup), stdio: Stdio::ahead() })
    }

    fn fresh_dir(
        config: &Config,
        host: &Host,
        owner: Option<(u32, u32)>,
    ) -> Result<(String, RunDir), SpawnError> {
        let id = crate::run::rundir::random_id().map_err(|e| SpawnError::Prepare {
            skill: String::new(),
            reason: format!("run id: {e}"),
        })?;
        let runs = if host.runs_dir.as_os_str().is_empty() {
            config.runtime_dir().join("runs")
        } else {
            host.runs_dir.clone()
        };
        let run_dir = RunDir::create(&runs, &id, owner)?;
        Ok((id, run_dir))
    }
}

/// Which end of a pipe the executor keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ours {
    Read,
    Write,
}

/// A pipe whose ends are close-on-exec and numbered >= 3 (so `dup3` onto
/// 0..2 in the child never meets its own source), the executor's end
/// non-blocking (set here with one `fcntl`, so the supervisor can take it
/// as it is), the child's end blocking.
pub(super) fn pipe(skill: &str, ours: Ours) -> Result<(OwnedFd, OwnedFd), SpawnError> {
    let err = |e: nix::Error| SpawnError::Prepare {
        skill: skill.to_owned(),
        reason: format!("pipe: {e}"),
    };
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(err)?;
    let mine = if ours == Ours::Read { &r } else { &w };
    nix::fcntl::fcntl(mine, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(err)?;
    // OwnedFd::try_clone duplicates with F_DUPFD_CLOEXEC starting at 3.
    let high = |fd: OwnedFd| -> Result<OwnedFd, SpawnError> {
        if fd.as_raw_fd() >= 3 {
            return Ok(fd);
        }
        fd.try_clone().map_err(|e| SpawnError::Prepare {
            skill: skill.to_owned(),
            reason: format!("dup: {e}"),
        })
    };
    Ok((high(r)?, high(w)?))
}
