//! A run's egress allowlist held by the kernel: cgroup-BPF programs on the
//! run's cgroup v2 leaf that let a socket of the run connect or send only
//! where the run's [`EgressRules`] allow, and count what they refused.
//!
//! The programs judge every `connect` (TCP, UDP) and every UDP `sendmsg`
//! with an address, in the kernel, before a packet leaves, and let the run
//! make no IP socket but TCP and UDP (no ping sockets); a refused call
//! fails at once with `EPERM`. A socket carries the cgroup it
//! was made in, so the rules follow it across `fork`, `exec`, `setsid` and
//! `SCM_RIGHTS`; the skill holds no `CAP_BPF` or `CAP_NET_ADMIN` and its
//! seccomp filter denies `bpf(2)`, so it can neither detach nor read them.
//!
//! Loading is the cost (about 2.5 ms for 32 entries: the verifier and the
//! JIT), attaching is not (tens of microseconds): an [`Egress`] is loaded
//! once per rule set and shared by the runs that have it, each attaching
//! it to its own cgroup ([`Egress::attach`]) through BPF links held by the
//! returned [`Attached`]: dropping it detaches them, leaving a reused slot
//! leaf clean for the next run. Refusals are counted per cgroup id and
//! taken back when the run ends ([`Egress::take_denials`]).

pub(crate) mod asm;
pub mod denied;
pub(crate) mod program;

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use policy::egress::EgressRules;

pub use denied::{Denials, Denied, MAX_LISTED};
use program::{Hook, Maps};

use crate::sys::bpf::{self, Insn, Map};

const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
const BPF_PROG_TYPE_CGROUP_SOCK: u32 = 9;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
/// Distinct refused destinations kept for all the runs sharing one
/// [`Egress`] (refusals past it still count in each run's total).
pub const DENIED_ENTRIES: u32 = 1024;
/// Cgroups with a refusal total at once (runs sharing one [`Egress`]).
const TOTAL_ENTRIES: u32 = 4096;
/// Bytes for the verifier's log when a program is refused.
const VERIFIER_LOG_BYTES: usize = 1 << 20;

/// Why the egress rules could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// A denial map could not be made (no BPF: old kernel, no `CAP_BPF`).
    #[error("egress: creating a BPF map: {0}")]
    Map(#[source] io::Error),
    /// A program could not be generated.
    #[error("egress: {0}")]
    Asm(#[from] asm::AsmError),
    /// The kernel refused a program; `log` ends with the verifier's reason.
    #[error("egress: loading {name}: {source}: {log}")]
    Load {
        /// The program's name.
        name: &'static str,
        /// The errno of `BPF_PROG_LOAD`.
        source: io::Error,
        /// The end of the verifier's log.
        log: String,
    },
    /// A program could not be attached to the cgroup (no cgroup v2
    /// directory, or a kernel without BPF links for cgroups).
    #[error("egress: attaching {name}: {source}")]
    Attach {
        /// The program's name.
        name: &'static str,
        /// The errno of `BPF_LINK_CREATE`.
        source: io::Error,
    },
    /// The denial maps could not be read.
    #[error("egress: reading the refusals: {0}")]
    Read(#[source] io::Error),
}

/// The loaded egress programs of one rule set and their count maps,
/// attached to any number of run cgroups.
#[derive(Debug)]
pub struct Egress {
    programs: Vec<(&'static str, u32, OwnedFd)>,
    denied: Map,
    total: Map,
}

/// One cgroup's attachment of an [`Egress`]: its BPF links, closed (the
/// programs detached) on drop.
#[derive(Debug)]
pub struct Attached {
    links: Vec<OwnedFd>,
    cgroup_id: u64,
}

impl Attached {
    /// The id of the cgroup the programs are attached to (its directory's
    /// inode number), which keys its refusal counts.
    #[must_use]
    pub fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }

    /// The number of programs attached.
    #[must_use]
    pub fn programs(&self) -> usize {
        self.links.len()
    }
}

impl Egress {
    /// Loads the programs enforcing `rules` (not yet attached): the four
    /// address hooks, the refusal of sockets other than TCP and UDP
    /// (ping sockets among them, whose `sendto` no hook judges:
    /// [`program::only_tcp_and_udp_sockets`]), and the drop of packets
    /// carrying a source route ([`program::no_source_routes`]).
    ///
    /// # Errors
    ///
    /// [`EgressError`] when a map or program cannot be made.
    pub fn load(rules: &EgressRules) -> Result<Self, EgressError> {
        let denied = bpf::map_create(
            BPF_MAP_TYPE_HASH,
            program::DENIED_KEY_SIZE,
            8,
            DENIED_ENTRIES,
            "ongrid_denied",
        )
        .map_err(EgressError::Map)?;
        let total = bpf::map_create(
            BPF_MAP_TYPE_HASH,
            program::TOTAL_KEY_SIZE,
            8,
            TOTAL_ENTRIES,
            "ongrid_total",
        )
        .map_err(EgressError::Map)?;
        let maps = Maps { denied: denied.fd().as_raw_fd(), total: total.fd().as_raw_fd() };
        let mut programs = Vec::with_capacity(Hook::ALL.len() + 1);
        for hook in Hook::ALL {
            let insns = program::sock_addr(rules, hook, maps)?;
            let fd = load(BPF_PROG_TYPE_CGROUP_SOCK_ADDR, hook.attach_type(), &insns, hook.name())?;
            programs.push((hook.name(), hook.attach_type(), fd));
        }
        let (name, at) = ("ongrid_tcpudp", program::ATTACH_SOCK_CREATE);
        let insns = program::only_tcp_and_udp_sockets(maps)?;
        let fd = load(BPF_PROG_TYPE_CGROUP_SOCK, at, &insns, name)?;
        programs.push((name, at, fd));
        let (name, at) = ("ongrid_noroute", program::ATTACH_INET_EGRESS);
        let insns = program::no_source_routes(maps)?;
        let fd = load(BPF_PROG_TYPE_CGROUP_SKB, at, &insns, name)?;
        programs.push((name, at, fd));
        Ok(Self { programs, denied, total })
    }

    /// The number of programs (the socket filter included).
    #[must_use]
    pub fn programs(&self) -> usize {
        self.programs.len()
    }

    /// Attaches every program to the cgroup v2 directory `cgroup` (all or
    /// none: on an error the ones attached are detached), after dropping
    /// counts an earlier run in that cgroup left.
    ///
    /// # Errors
    ///
    /// [`EgressError::Attach`]; [`EgressError::Read`] when the directory's
    /// metadata or the maps cannot be read.
    pub fn attach(&self, cgroup: &std::fs::File) -> Result<Attached, EgressError> {
        use std::os::unix::fs::MetadataExt;
        let cgroup_id = cgroup.metadata().map_err(EgressError::Read)?.ino();
        self.take_denials(cgroup_id)?;
        let mut links = Vec::with_capacity(self.programs.len());
        for (name, at, fd) in &self.programs {
            let link = bpf::link_create_cgroup(fd.as_fd(), cgroup.as_fd(), *at)
                .map_err(|source| EgressError::Attach { name, source })?;
            links.push(link);
        }
        Ok(Attached { links, cgroup_id })
    }

    /// What the programs refused in the cgroup `cgroup_id` since the last
    /// take, removed from the maps (take them once the run's [`Attached`]
    /// is dropped, so nothing counts in after).
    ///
    /// # Errors
    ///
    /// [`EgressError::Read`] when a map cannot be read.
    pub fn take_denials(&self, cgroup_id: u64) -> Result<Denials, EgressError> {
        let bound = usize::try_from(DENIED_ENTRIES).unwrap_or(usize::MAX);
        denied::take(&self.denied, &self.total, bound, cgroup_id).map_err(EgressError::Read)
    }
}

/// Loads one program; on a refusal loads it again with a verifier log and
/// keeps the log's end in the error.
fn load(
    prog_type: u32,
    attach_type: u32,
    insns: &[Insn],
    name: &'static str,
) -> Result<OwnedFd, EgressError> {
    bpf::prog_load(prog_type, attach_type, insns, name, None).or_else(|source| {
        let mut buf = vec![0u8; VERIFIER_LOG_BYTES];
        if let Ok(fd) = bpf::prog_load(prog_type, attach_type, insns, name, Some(&mut buf)) {
            return Ok(fd);
        }
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        let text = String::from_utf8_lossy(&buf[..end]);
        let tail: Vec<&str> = text.lines().rev().take(8).collect();
        let log = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
        Err(EgressError::Load { name, source, log })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use asm::{Asm, R0};

    #[test]
    fn a_refused_program_carries_the_verifiers_reason() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: needs root");
            return;
        }
        // Returns r0 without setting it.
        let mut a = Asm::new();
        a.exit();
        let insns = a.finish().unwrap();
        match load(BPF_PROG_TYPE_CGROUP_SOCK_ADDR, Hook::Connect4.attach_type(), &insns, "bad") {
            Err(EgressError::Load { name: "bad", log, .. }) => {
                assert!(log.contains("R0 !read_ok"), "{log}");
            }
            other => panic!("{other:?}"),
        }
        let mut a = Asm::new();
        a.mov64_imm(R0, 1);
        a.exit();
        let ok = load(BPF_PROG_TYPE_CGROUP_SOCK_ADDR, 10, &a.finish().unwrap(), "good");
        assert!(ok.is_ok(), "{ok:?}");
    }
}
