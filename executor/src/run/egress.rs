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

/// The addresses of the host's interfaces, and their broadcast addresses
/// (a subnet's broadcast reaches the host's own sockets too), refused
/// unless named.
#[must_use]
pub fn host_addrs() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out: Vec<IpAddr> = addrs
        .flat_map(|a| [a.address, a.broadcast])
        .flatten()
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

/// How a name's addresses are looked up.
pub type Lookup = fn(&str) -> std::io::Result<Vec<IpAddr>>;

/// The C library's resolver (`getaddrinfo`: `/etc/hosts`, then DNS, as
/// the host's `nsswitch.conf` says).
pub fn system_lookup(name: &str) -> std::io::Result<Vec<IpAddr>> {
    (name, 0u16).to_socket_addrs().map(|a| a.map(|s: SocketAddr| s.ip()).collect())
}

/// The addresses of a run's grant's names, by name.
pub type Resolved = HashMap<String, Vec<IpAddr>>;

/// The names a networked grant's `connect` entries look up, each once.
#[must_use]
pub fn grant_names(granted: &GrantedSandbox) -> Vec<String> {
    let mut names: Vec<String> = granted
        .connect
        .iter()
        .filter_map(|e| match &e.host {
            Host::Name(n) if granted.network => Some(n.as_str().to_owned()),
            _ => None,
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Answers to the lookups of some names, gathered as they come.
struct Answers<'a> {
    names: &'a [String],
    found: Vec<Option<Vec<IpAddr>>>,
}

impl<'a> Answers<'a> {
    /// Starts a thread per name, each sending `(index, answer)` with `send`.
    fn start(
        names: &'a [String],
        lookup: Lookup,
        send: impl Fn(usize, std::io::Result<Vec<IpAddr>>) + Clone + Send + 'static,
    ) -> Result<Self, RunEgressError> {
        for (i, name) in names.iter().enumerate() {
            let (send, query) = (send.clone(), name.clone());
            std::thread::Builder::new()
                .name("egress-resolve".into())
                .spawn(move || send(i, lookup(&query)))
                .map_err(|e| fail(name, format!("starting the lookup: {e}")))?;
        }
        Ok(Self { names, found: vec![None; names.len()] })
    }

    fn done(&self) -> bool {
        self.found.iter().all(Option::is_some)
    }

    fn take(
        &mut self,
        i: usize,
        answer: std::io::Result<Vec<IpAddr>>,
    ) -> Result<(), RunEgressError> {
        let name = &self.names[i];
        let mut addrs = answer.map_err(|e| fail(name, e.to_string()))?;
        addrs.sort_unstable();
        addrs.dedup();
        if addrs.is_empty() {
            return Err(fail(name, "no address".into()));
        }
        self.found[i] = Some(addrs);
        Ok(())
    }

    fn finish(self, timeout: Duration) -> Result<Resolved, RunEgressError> {
        let mut out = Resolved::new();
        for (name, addrs) in self.names.iter().zip(self.found) {
            let late = || fail(name, format!("no answer within {} ms", timeout.as_millis()));
            out.insert(name.clone(), addrs.ok_or_else(late)?);
        }
        Ok(out)
    }
}

fn fail(name: &str, reason: String) -> RunEgressError {
    RunEgressError::Resolve { name: name.to_owned(), reason }
}

/// The addresses of each of `names`, looked up all at once (a thread each)
/// and waited for together at most `timeout`: a run's start waits for its
/// slowest name, not for the sum of them. A lookup still going on then
/// goes on in its thread, its answer dropped.
///
/// # Errors
///
/// [`RunEgressError::Resolve`]: the first name without an answer in time,
/// with a failure, or with no address.
pub fn resolve_all(
    names: &[String],
    timeout: Duration,
    lookup: Lookup,
) -> Result<Resolved, RunEgressError> {
    let deadline = std::time::Instant::now() + timeout;
    let (tx, rx) = mpsc::channel();
    let send = move |i, answer| drop(tx.send((i, answer)));
    let mut answers = Answers::start(names, lookup, send)?;
    while !answers.done() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok((i, answer)) = rx.recv_timeout(left) else { break };
        answers.take(i, answer)?;
    }
    answers.finish(timeout)
}

/// [`resolve_all`] for a task: the wait is awaited, so the runtime's
/// worker serves other runs meanwhile.
///
/// # Errors
///
/// As [`resolve_all`].
pub async fn resolve_all_async(
    names: &[String],
    timeout: Duration,
    lookup: Lookup,
) -> Result<Resolved, RunEgressError> {
    if names.is_empty() {
        return Ok(Resolved::new());
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let send = move |i, answer| drop(tx.send((i, answer)));
    let mut answers = Answers::start(names, lookup, send)?;
    while !answers.done() {
        let Ok(Some((i, answer))) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            break;
        };
        answers.take(i, answer)?;
    }
    answers.finish(timeout)
}

/// The addresses of `granted`'s names, for a task (see
/// [`resolve_all_async`]); none to look up without a network grant.
///
/// # Errors
///
/// As [`resolve_all`].
pub async fn resolve_grant(granted: &GrantedSandbox) -> Result<Resolved, RunEgressError> {
    resolve_all_async(&grant_names(granted), RESOLVE_TIMEOUT, system_lookup).await
}

/// [`resolve_grant`] on a thread of its own (the warm pools').
///
/// # Errors
///
/// As [`resolve_all`].
pub fn resolve_grant_blocking(granted: &GrantedSandbox) -> Result<Resolved, RunEgressError> {
    let names = grant_names(granted);
    if names.is_empty() {
        return Ok(Resolved::new());
    }
    resolve_all(&names, RESOLVE_TIMEOUT, system_lookup)
}

/// The rules of a networked run's grant, names resolved, with the report's
/// `enforced` list (every allow rule, as `NET:PORT`).
///
/// # Errors
///
/// [`RunEgressError`]: a name that does not resolve, too many rules.
pub fn rules_for(
    granted: &GrantedSandbox,
    resolved: &Resolved,
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
                let addrs = resolved.get(n.as_str());
                let addrs = addrs.ok_or_else(|| fail(n.as_str(), "not looked up".into()))?;
                allow.extend(Rule::resolved(e, addrs));
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

    /// A lookup that takes 300 ms and answers by the name: `*.fails` fail,
    /// `*.empty` have no address, `*.never` answer after a minute.
    fn slow_lookup(name: &str) -> std::io::Result<Vec<IpAddr>> {
        if name.ends_with(".never") {
            std::thread::sleep(Duration::from_secs(60));
        }
        std::thread::sleep(Duration::from_millis(300));
        match name.rsplit('.').next() {
            Some("fails") => Err(std::io::Error::other("no such host")),
            Some("empty") => Ok(vec![]),
            _ => Ok(vec!["192.0.2.2".parse().unwrap(), "192.0.2.1".parse().unwrap()]),
        }
    }

    /// Names looked up for a task hold no worker: another task of a
    /// one-worker runtime goes on meanwhile.
    #[test]
    fn a_lookup_awaited_leaves_the_worker_to_the_other_tasks() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (ticked, looked_up) = rt.block_on(async {
            let names = vec!["a.test".to_owned()];
            let slow = tokio::spawn(async move {
                let t = std::time::Instant::now();
                resolve_all_async(&names, Duration::from_secs(2), slow_lookup).await.unwrap();
                t.elapsed()
            });
            let t = std::time::Instant::now();
            let tick = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                t.elapsed()
            });
            (tick.await.unwrap(), slow.await.unwrap())
        });
        assert!(looked_up >= Duration::from_millis(300), "{looked_up:?}");
        assert!(ticked < Duration::from_millis(250), "the other task waited {ticked:?}");
    }

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn names_resolve_together_within_the_wait() {
        let a = resolve_all(&strings(&["localhost"]), RESOLVE_TIMEOUT, system_lookup).unwrap();
        assert!(a["localhost"].iter().all(IpAddr::is_loopback), "{a:?}");
        let names = strings(&["a.test", "b.test", "c.test", "d.test", "e.test"]);
        let t = std::time::Instant::now();
        let a = resolve_all(&names, Duration::from_secs(1), slow_lookup).unwrap();
        assert!(t.elapsed() < Duration::from_millis(900), "one after another: {:?}", t.elapsed());
        assert_eq!(
            a["e.test"],
            ["192.0.2.1".parse::<IpAddr>().unwrap(), "192.0.2.2".parse().unwrap()]
        );
        for (name, reason) in [
            ("x.fails", "no such host"),
            ("x.empty", "no address"),
            ("x.never", "no answer within 1000 ms"),
        ] {
            let t = std::time::Instant::now();
            let e = resolve_all(&strings(&["a.test", name]), Duration::from_secs(1), slow_lookup)
                .unwrap_err();
            assert_eq!(e.to_string(), format!("egress: resolving {name}: {reason}"));
            assert!(t.elapsed() < Duration::from_millis(1500), "{name}: {:?}", t.elapsed());
        }
    }

    fn granted(connect: Vec<Entry>) -> GrantedSandbox {
        GrantedSandbox {
            fs_read: vec![],
            fs_write: vec![],
            network: true,
            connect,
            dns: false,
            run_as: None,
            capabilities: vec![],
            limits: policy::Limits::default(),
            proc: policy::sandbox::ProcView::Own,
        }
    }

    #[test]
    fn a_bare_grant_is_every_destination_but_the_refusals() {
        let g = granted(vec![]);
        let none = Resolved::new();
        let (r, enforced) = rules_for(&g, &none, Path::new("/nonexistent"), &[]).unwrap();
        assert_eq!(enforced, ["0.0.0.0/0:*", "[::]/0:*"]);
        let tcp = policy::egress::Protocol::Tcp;
        assert!(!r.decide("127.0.0.1".parse().unwrap(), 80, tcp));
        assert!(r.decide("192.0.2.1".parse().unwrap(), 80, tcp));
        let listed = GrantedSandbox {
            connect: vec!["127.0.0.1:8080".parse().unwrap(), "localhost:81".parse().unwrap()],
            ..g
        };
        let e = rules_for(&listed, &none, Path::new("/nonexistent"), &[]).unwrap_err();
        assert_eq!(e.to_string(), "egress: resolving localhost: not looked up");
        let names = grant_names(&listed);
        assert_eq!(names, ["localhost"]);
        let resolved = resolve_all(&names, RESOLVE_TIMEOUT, system_lookup).unwrap();
        let (r, enforced) = rules_for(&listed, &resolved, Path::new("/nonexistent"), &[]).unwrap();
        assert!(enforced.contains(&"127.0.0.1:8080".to_owned()), "{enforced:?}");
        assert!(enforced.contains(&"127.0.0.1:81".to_owned()), "localhost pinned: {enforced:?}");
        assert!(r.decide("127.0.0.1".parse().unwrap(), 8080, tcp));
        assert!(!r.decide("192.0.2.1".parse().unwrap(), 80, tcp));
    }
}
