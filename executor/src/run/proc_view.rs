//! One run's view of `/proc` (spawn sequence step 2): where its child
//! lives, which `/proc` its Landlock rule names, and what its report says.
//! The mechanism is `host::procview`'s.

use std::path::PathBuf;
use std::sync::Arc;

use policy::sandbox::ProcView;

use crate::host::procview::{ProcSetup, RunsNamespace};
use crate::sandbox::landlock::{FsPolicy, Rule};

/// Where a run's child goes.
#[derive(Debug, Default)]
pub struct ProcPlace {
    /// The runs' mount namespace, which the child joins (a spawner thread
    /// lives in it already).
    pub namespace: Option<Arc<RunsNamespace>>,
    /// Granted the host's `/proc` where the executor made a namespace for
    /// the others: the child stays in the executor's, never on a spawner
    /// thread.
    pub host_proc: bool,
}

impl ProcPlace {
    /// The place for a run granted `granted` on a host set up as `setup`.
    pub fn choose(granted: ProcView, setup: &ProcSetup) -> Self {
        match (granted, setup.namespace()) {
            (ProcView::Own, Some(ns)) => {
                ProcPlace { namespace: Some(Arc::clone(ns)), host_proc: false }
            }
            (ProcView::Host, Some(_)) => ProcPlace { namespace: None, host_proc: true },
            _ => ProcPlace::default(),
        }
    }

    /// The Landlock rule for `/proc` names the `/proc` the child will see:
    /// the runs' namespace's, reached through the executor's descriptor of
    /// it (rules follow inodes, and that procfs is not the executor's).
    /// Not a path of the process-wide snapshot of system paths, it is
    /// opened when a ruleset is built; pinned (the descriptor lives as long
    /// as the engine), it is not looked at again when one is reused.
    pub fn adjust(&self, fs: &mut FsPolicy) {
        if let Some(ns) = &self.namespace {
            let theirs = PathBuf::from(format!("/proc/self/fd/{}", ns.proc_dir_fd()));
            let system_proc = |r: &&mut Rule| !r.explicit && r.path.as_os_str() == "/proc";
            for rule in fs.rules.iter_mut().filter(system_proc) {
                rule.path.clone_from(&theirs);
                rule.explicit = true;
                rule.pinned = true;
            }
        }
    }

    /// The view the run gets, with what falls short in `degraded`.
    /// `landlocked`: the run enforces a Landlock domain, without which a
    /// `hidepid=invisible` procfs still shows it the other runs' processes
    /// (same user).
    pub fn view(
        &self,
        granted: ProcView,
        landlocked: bool,
        setup: &ProcSetup,
        degraded: &mut Vec<String>,
    ) -> ProcView {
        match (granted, setup) {
            (ProcView::Host, ProcSetup::Hidden) => {
                degraded.push(
                    "proc: the host's process table not given: the executor's own /proc hides \
                     other processes (ProtectProc=invisible)"
                        .to_owned(),
                );
                own_if(landlocked, degraded)
            }
            (ProcView::Host, _) => ProcView::Host,
            (ProcView::Own, ProcSetup::Unavailable(why)) => {
                degraded.push(format!(
                    "proc: own view not enforced: {why}; the run sees the host's process table"
                ));
                ProcView::Host
            }
            (ProcView::Own, _) => own_if(landlocked, degraded),
        }
    }
}

fn own_if(landlocked: bool, degraded: &mut Vec<String>) -> ProcView {
    if landlocked {
        return ProcView::Own;
    }
    degraded.push(
        "proc: own view not enforced: without a Landlock domain the run sees the processes of \
         its run-as user (other runs among them)"
            .to_owned(),
    );
    ProcView::Host
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_every_shortfall() {
        let unavailable = ProcSetup::Unavailable("no CAP_SYS_ADMIN".to_owned());
        let place = ProcPlace::choose(ProcView::Own, &unavailable);
        assert!(place.namespace.is_none() && !place.host_proc);
        let mut degraded = Vec::new();
        assert_eq!(place.view(ProcView::Own, true, &unavailable, &mut degraded), ProcView::Host);
        assert!(degraded[0].contains("no CAP_SYS_ADMIN"), "{degraded:?}");

        let mut degraded = Vec::new();
        let hidden = ProcSetup::Hidden;
        let place = ProcPlace::choose(ProcView::Host, &hidden);
        assert_eq!(place.view(ProcView::Host, true, &hidden, &mut degraded), ProcView::Own);
        assert!(degraded[0].contains("ProtectProc=invisible"), "{degraded:?}");

        let mut degraded = Vec::new();
        assert_eq!(place.view(ProcView::Own, false, &hidden, &mut degraded), ProcView::Host);
        assert!(degraded[0].contains("Landlock"), "{degraded:?}");

        let mut degraded = Vec::new();
        assert_eq!(place.view(ProcView::Own, true, &hidden, &mut degraded), ProcView::Own);
        assert!(degraded.is_empty(), "{degraded:?}");
    }
}
