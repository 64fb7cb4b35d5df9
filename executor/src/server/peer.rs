//! Who may talk to the executor, and which skill classes each peer may run.
//!
//! The kernel names the peer (SO_PEERCRED: uid, gid and pid as they were at
//! `connect()`); nothing the peer says about itself counts. The socket's
//! owner, group and mode are the first gate, this check the second: a peer
//! whose uid is not in `allowed_uids` and whose primary gid is not in
//! `allowed_gids` gets a `FORBIDDEN` error and the connection closes.
//!
//! `[[peers]]` entries then restrict the classes a given uid may run, as
//! the executor itself reads the class from the manifest (defence in depth
//! behind the loader's own permission check). A peer without an entry may
//! run every class.

use std::collections::BTreeMap;
use std::fmt;

use policy::SkillClass;

use crate::config::{Config, LOADER_USER};

/// The kernel's view of a connected peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Effective uid at `connect()`.
    pub uid: u32,
    /// Effective gid at `connect()`.
    pub gid: u32,
    /// Pid at `connect()` (for logs only: pids are recycled).
    pub pid: Option<i32>,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid={} gid={}", self.uid, self.gid)?;
        match self.pid {
            Some(pid) => write!(f, " pid={pid}"),
            None => Ok(()),
        }
    }
}

/// The peer rules, resolved once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPolicy {
    uids: Vec<u32>,
    gids: Vec<u32>,
    classes: BTreeMap<u32, Vec<SkillClass>>,
}

fn loader_user() -> Option<nix::unistd::User> {
    nix::unistd::User::from_name(LOADER_USER).ok().flatten()
}

impl PeerPolicy {
    /// Resolves `allowed_uids`, `allowed_gids` and `[[peers]]` (a `user`
    /// that does not exist is logged and matches nobody).
    pub fn from_config(config: &Config) -> Self {
        let uids = config.allowed_uids.clone().unwrap_or_else(|| {
            let mut uids = vec![0, nix::unistd::geteuid().as_raw()];
            uids.extend(loader_user().map(|u| u.uid.as_raw()));
            uids.sort_unstable();
            uids.dedup();
            uids
        });
        // No group is allowed by default: `ongrid` is also the API clients'
        // group, and a client whose primary group it is must not reach the
        // executor around skilld's permission checks.
        let gids = config.allowed_gids.clone().unwrap_or_default();
        let mut classes = BTreeMap::new();
        for p in &config.peers {
            let uid = match (p.uid, &p.user) {
                (Some(uid), _) => uid,
                (None, Some(user)) => match nix::unistd::User::from_name(user).ok().flatten() {
                    Some(u) => u.uid.as_raw(),
                    None => {
                        tracing::warn!("executor.toml: [[peers]] user {user:?} does not exist");
                        continue;
                    }
                },
                (None, None) => continue,
            };
            match classes.entry(uid) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(p.classes.clone());
                }
                // Named twice (by uid and by user): only what both allow.
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    tracing::warn!(
                        "executor.toml: [[peers]] names uid {uid} twice; it may run only the \
                         classes both entries list"
                    );
                    o.get_mut().retain(|c| p.classes.contains(c));
                }
            }
        }
        PeerPolicy { uids, gids, classes }
    }

    /// A policy from explicit lists (tests, embedding).
    pub fn new(uids: Vec<u32>, gids: Vec<u32>, classes: BTreeMap<u32, Vec<SkillClass>>) -> Self {
        PeerPolicy { uids, gids, classes }
    }

    /// Returns true if and only if `peer` may talk to the executor.
    pub fn admits(&self, peer: &Peer) -> bool {
        self.uids.contains(&peer.uid) || self.gids.contains(&peer.gid)
    }

    /// Returns true if and only if `uid` may run a skill of `class`.
    pub fn may_run(&self, uid: u32, class: SkillClass) -> bool {
        self.classes.get(&uid).is_none_or(|allowed| allowed.contains(&class))
    }
}

impl fmt::Display for PeerPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uids {:?}, gids {:?}", self.uids, self.gids)?;
        for (uid, classes) in &self.classes {
            let names: Vec<&str> = classes.iter().map(|c| c.as_str()).collect();
            write!(f, ", uid {uid} may run [{}]", names.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn uid_or_gid_admits_and_classes_restrict() {
        let text = r#"
            allowed_uids = [0, 998]
            allowed_gids = [500]
            [[peers]]
            uid = 998
            classes = ["safe"]
            [[peers]]
            user = "no-such-user-here"
            classes = []
        "#;
        let p = PeerPolicy::from_config(&Config::parse(text, Path::new("x")).unwrap());
        let peer = |uid, gid| Peer { uid, gid, pid: None };
        assert!(p.admits(&peer(0, 0)));
        assert!(p.admits(&peer(998, 1)));
        assert!(p.admits(&peer(1234, 500)));
        assert!(!p.admits(&peer(65534, 65534)));
        assert!(p.may_run(998, SkillClass::Safe));
        assert!(!p.may_run(998, SkillClass::Mutating));
        assert!(p.may_run(0, SkillClass::Dangerous), "no entry: every class");
        assert_eq!(p.to_string(), "uids [0, 998], gids [500], uid 998 may run [safe]");
    }

    /// A uid named twice, by uid and by user, gets only the classes both
    /// entries list, whichever comes first.
    #[test]
    fn a_peer_named_twice_gets_what_both_entries_allow() {
        let root = |first: &str, second: &str| {
            format!(
                "[[peers]]\n{first}\nclasses = [\"safe\", \"dangerous\"]\n\
                 [[peers]]\n{second}\nclasses = [\"safe\", \"mutating\"]\n"
            )
        };
        for text in [root("uid = 0", "user = \"root\""), root("user = \"root\"", "uid = 0")] {
            let p = PeerPolicy::from_config(&Config::parse(&text, Path::new("x")).unwrap());
            assert!(p.may_run(0, SkillClass::Safe), "{text}");
            assert!(!p.may_run(0, SkillClass::Mutating), "{text}");
            assert!(!p.may_run(0, SkillClass::Dangerous), "{text}");
        }
    }

    #[test]
    fn defaults_admit_root_and_self() {
        let p = PeerPolicy::from_config(&Config::default());
        let me = nix::unistd::geteuid().as_raw();
        assert!(p.admits(&Peer { uid: 0, gid: 0, pid: None }));
        assert!(p.admits(&Peer { uid: me, gid: 4242, pid: None }));
        assert!(!p.admits(&Peer { uid: 65534, gid: 65534, pid: None }));
    }
}
