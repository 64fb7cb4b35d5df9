//! A networked run's egress allowlist, from its grant to the kernel and
//! back: the grant's `connect` entries resolved (names by the executor,
//! with a bounded wait, pinned for the run), the host's addresses and
//! resolvers read, the programs loaded once per rule set
//! ([`EgressCache`]) and attached to the run's cgroup v2 leaf before the
//! child joins it; at the run's end, detached and their refusals taken.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use policy::egress::{resolver_rules, EgressRules, Entry, Host, Rule};
use policy::{DeniedReport, GrantedSandbox, NetworkReport};

use crate::sandbox::egress::{Attached, Egress, EgressError};

/// Longest wait for one name's addresses when a run starts.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Rule sets whose loaded programs are kept at once (past it the cache
/// starts again: loading is milliseconds, a run's own copy is kept alive
/// by its attachment).
const CACHE_ENTRIES: usize = 64;

/// Why a run's allowlist could not be made or put in place.
#[derive(Debug, thiserror::Error)]
pub enum RunEgressError {
    /// A name of the grant did not resolve in time, or to nothing.
    #[error("egress: resolving {name}: {reason}")]
    Resolve {
        /// The name.
        name: String,
        /// What went wrong.
        reason: String,
    },
    /// Too many rules.
    #[error("{0}")]
    Rules(#[from] policy::egress::rules::TooManyRules),
    /// No cgroup v2 leaf to attach the programs to.
    #[error("egress: no cgroup v2 hierarchy to attach the allowlist to")]
    NoCgroupV2,
    /// The leaf could not be opened.
    #[error("egress: opening the run's cgroup: {0}")]
    Open(#[source] std::io::Error),
    /// Loading or attaching failed.
    #[error("{0}")]
    Kernel(#[from] EgressError),
}

/// Loaded programs by rule set, shared by the engine's runs; an engine
/// (and so a configuration) has its own.
#[derive(Debug, Default)]
pub struct EgressCache {
    loaded: Mutex<HashMap<String, Arc<Egress>>>,
}

impl EgressCache {
    /// The programs of `rules`, loaded on first use.
    ///
    /// # Errors
    ///
    /// [`EgressError`] when the kernel refuses a map or program.
    pub fn get(&self, rules: &EgressRules) -> Result<Arc<Egress>, EgressError> {
        // The steps' text is the key: two rule sets with the same steps
        // load the same programs.
        let key = format!("{:?}", rules.steps());
        if let Some(e) = self.loaded.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(e);
        }
        let egress = Arc::new(Egress::load(rules)?);
        if let Ok(mut m) = self.loaded.lock() {
            if m.len() >= CACHE_ENTRIES {
                m.clear();
            }
            m.insert(key, Arc::clone(&egress));
        }
        Ok(egress)
    }
}

/// A run's attached allowlist: dropping it detaches the programs.
#[derive(Debug)]
pub struct RunEgress {
    egress: Arc<Egress>,
    attached: Attached,
}

impl RunEgress {
    /// Attaches `egress` to the cgroup v2 directory `leaf`.
    ///
    /// # Errors
    ///
    /// [`RunEgressError`] when the leaf cannot be opened or a program not
    /// attached.
    pub fn attach(egress: Arc<Egress>, leaf: &Path) -> Result<Self, RunEgressError> {
        let dir = std::fs::File::open(leaf).map_err(RunEgressError::Open)?;
        let attached = egress.attach(&dir)?;
        Ok(Self { egress, attached })
    }

    /// Detaches the programs (the run's processes are gone) and adds what
    /// they refused to `report`.
    pub fn finish(self, report: &mut NetworkReport) {
        let Self { egress, attached } = self;
        let id = attached.cgroup_id();
        drop(attached);
        match egress.take_denials(id) {
            Ok(d) => {
                report.denied = d
                    .listed
                    .into_iter()
                    .map(|x| DeniedReport {
                        destination: x.destination,
                        protocol: x.protocol,
                        count: x.count,
                    })
                    .collect();
                report.denied_total = d.total;
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }
}

/// The addresses of the `nameserver` lines of a resolv.conf text.
#[must_use]
pub fn nameservers(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next()).flatten()
        })
        // A scoped IPv6 resolver (`fe80::1%eth0`) is held by its address.
        .filter_map(|a| a.split('%').next().and_then(|a| a.parse().ok()))
        .collect()
}

/// The addresses of the host's interfaces (refused unless named).
#[must_use]
pub fn host_addrs() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out: Vec<IpAddr> = addrs
        .filter_map(|a| a.address)
        .filter_map(|s| {
            if let Some(v4) = s.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The addresses of `name`, waited for at most `timeout` (the lookup
/// goes on in its thread past it, its answer dropped).
///
/// # Errors
///
/// [`RunEgressError::Resolve`]: no answer in time, a failure, or none.
pub fn resolve(name: &str, timeout: Duration) -> Result<Vec<IpAddr>, RunEgressError> {
    let fail = |reason: String| RunEgressError::Resolve { name: name.to_owned(), reason };
    let (tx, rx) = mpsc::channel();
    let query = (name.to_owned(), 0u16);
    std::thread::Builder::new()
        .name("egress-resolve".into())
        .spawn(move || {
            let r = query.to_socket_addrs().map(|a| a.map(|s: SocketAddr| s.ip()).collect());
            let _ = tx.send(r);
        })
        .map_err(|e| fail(format!("starting the lookup: {e}")))?;
    let found: Vec<IpAddr> = match rx.recv_timeout(timeout) {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return Err(fail(e.to_string())),
        Err(_) => return Err(fail(format!("no answer within {} ms", timeout.as_millis()))),
    };
    let mut found = found;
    found.sort_unstable();
    found.dedup();
    if found.is_empty() {
        return Err(fail("no address".into()));
    }
    Ok(found)
}

/// The rules of a networked run's grant, names resolved, with the report's
/// `enforced` list (every allow rule, as `NET:PORT`).
///
/// # Errors
///
/// [`RunEgressError`]: a name that does not resolve, too many rules.
pub fn rules_for(
    granted: &GrantedSandbox,
    resolv_conf: &Path,
    host: &[IpAddr],
) -> Result<(EgressRules, Vec<String>), RunEgressError> {
    let mut allow: Vec<Rule> = Vec::new();
    if granted.connect.is_empty() {
        // Every destination but the default refusals.
        allow.extend(
            ["0.0.0.0/0:*", "[::]/0:*"]
                .iter()
                .filter_map(|s| s.parse::<Entry>().ok().as_ref().and_then(Rule::from_entry)),
        );
    }
    for e in &granted.connect {
        match &e.host {
            Host::Net(_) => allow.extend(Rule::from_entry(e)),
            Host::Name(n) => {
                allow.extend(Rule::resolved(e, &resolve(n.as_str(), RESOLVE_TIMEOUT)?))
            }
        }
    }
    if granted.dns {
        let text = std::fs::read_to_string(resolv_conf).unwrap_or_default();
        allow.extend(resolver_rules(&nameservers(&text)));
    }
    let rules = EgressRules::new(&allow, host)?;
    let enforced =
        rules.allowed().iter().map(|r| format!("{}:{}", r.net, r.port)).collect::<Vec<_>>();
    Ok((rules, enforced))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameserver_lines_are_read() {
        let text = "# c\nsearch x\nnameserver 127.0.0.53\nnameserver  fe80::1%eth0\n\
                    nameserver bogus\noptions edns0\n";
        let got: Vec<String> = nameservers(text).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["127.0.0.53", "fe80::1"]);
    }

    #[test]
    fn names_resolve_within_the_wait() {
        let a = resolve("localhost", RESOLVE_TIMEOUT).unwrap();
        assert!(a.iter().all(|a| a.is_loopback()), "{a:?}");
        assert!(matches!(
            resolve("no-such-name.invalid", RESOLVE_TIMEOUT),
            Err(RunEgressError::Resolve { .. })
        ));
    }

    #[test]
    fn a_bare_grant_is_every_destination_but_the_refusals() {
        let g = GrantedSandbox {
            fs_read: vec![],
            fs_write: vec![],
            network: true,
            connect: vec![],
            dns: false,
            run_as: None,
            capabilities: vec![],
            limits: policy::Limits::default(),
            proc: policy::sandbox::ProcView::Own,
        };
        let (r, enforced) = rules_for(&g, Path::new("/nonexistent"), &[]).unwrap();
        assert_eq!(enforced, ["0.0.0.0/0:*", "[::]/0:*"]);
        let tcp = policy::egress::Protocol::Tcp;
        assert!(!r.decide("127.0.0.1".parse().unwrap(), 80, tcp));
        assert!(r.decide("192.0.2.1".parse().unwrap(), 80, tcp));
        let listed = GrantedSandbox {
            connect: vec!["127.0.0.1:8080".parse().unwrap(), "localhost:81".parse().unwrap()],
            ..g
        };
        let (r, enforced) = rules_for(&listed, Path::new("/nonexistent"), &[]).unwrap();
        assert!(enforced.contains(&"127.0.0.1:8080".to_owned()), "{enforced:?}");
        assert!(enforced.contains(&"127.0.0.1:81".to_owned()), "localhost pinned: {enforced:?}");
        assert!(r.decide("127.0.0.1".parse().unwrap(), 8080, tcp));
        assert!(!r.decide("192.0.2.1".parse().unwrap(), 80, tcp));
    }
}
