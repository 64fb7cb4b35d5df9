//! A run's refusals, read back from the kernel's audit: Landlock's
//! (ABI 7, the domain made with `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`)
//! and the seccomp filter's (installed with `SECCOMP_FILTER_FLAG_LOG`).
//!
//! The engine holds one [`Denials`]: a socket subscribed to every audit
//! record and a reader thread that drains it as records come, so that a
//! flood never fills the socket nor waits on a run. A run is watched from
//! before its spawn ([`Denials::watch`]) by its cgroup leaves; a record is
//! its run's when its pid is in one of the leaves (`/proc/<pid>/cgroup`,
//! the answer kept per pid) or, for Landlock, when its domain's maker is
//! (the domain is made by the run's child: each run has its own). A
//! record whose process has already gone when it is read is held (at most
//! [`PENDING`]) until the run's thread registers the run's main pid
//! ([`Watch::pid`]); records of other processes are dropped once far
//! behind. Each run keeps at most [`MAX_DENIALS`] distinct entries and a
//! total.
//!
//! At a run's end ([`Watch::finish`]) the socket is drained once more
//! after the kernel's `kauditd` thread, which sends the records, has gone
//! back to sleep (its queue is then empty: every record the run's
//! processes made before they exited has been delivered), waited for at
//! most [`GRACE`]; a record that comes later is counted as late
//! (`late_records`), never waited for.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::socket::{recv, MsgFlags};
use policy::{Denial, DenialKind, MAX_DENIALS};

use crate::config::ReportDenials;
use crate::sandbox::audit::record::{self, Record};
use crate::sandbox::audit::{self, NLMSG_HDRLEN};
use crate::sandbox::seccomp;

mod enable;

/// Longest wait at a run's end for the kernel to deliver its records.
pub const GRACE: Duration = Duration::from_millis(5);
/// The socket's receive buffer: room for about 16,000 records while the
/// reader thread is off the CPU.
const SOCKET_BUFFER: usize = 8 << 20;
/// Records drained per hold of the lock (a run's end waits at most this).
const DRAIN_BATCH: usize = 256;
/// Records held until their process's run (or domain's maker) is known.
const PENDING: usize = 64;
/// How many events later a held access record is given up.
const PENDING_SERIALS: u64 = 4096;
/// Pids known not to be of a run, remembered until a run starts.
const STRANGERS: usize = 4096;
/// Pids and domains remembered as a run's, all runs together (past it a
/// pid is looked up again each time, a domain's later records lost): a
/// run forking or nesting domains without end keeps the map bounded.
const REMEMBERED: usize = 16_384;

/// What the engine's runs are watched with, or why they are not.
#[derive(Debug)]
pub struct Denials {
    /// Why refusals are not watched; `None` when they are.
    off: Option<String>,
    shared: Option<Arc<Shared>>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// Restores the audit status when this executor enabled it.
    _enabled: Option<enable::Enabled>,
}

#[derive(Debug)]
struct Shared {
    fd: OwnedFd,
    state: Mutex<State>,
    stop: AtomicBool,
    /// Records the socket could not hold (`ENOBUFS`).
    lost: AtomicU64,
    /// Records of a run that came after its report.
    late: AtomicU64,
    /// `/proc/<kauditd>/stat`, when found.
    kauditd: Option<PathBuf>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    runs: HashMap<u64, Run>,
    pids: HashMap<i32, u64>,
    strangers: HashSet<i32>,
    domains: HashMap<u64, u64>,
    /// Domains of runs already reported: a record of one is late.
    done_domains: HashSet<u64>,
    pending: Vec<Held>,
    buf: Vec<u8>,
}

/// A record whose run is not known yet ([`State::hold`]), with the serial
/// of its event (its last repeat's) and how many times it came.
#[derive(Debug)]
struct Held {
    serial: u64,
    record: Record,
    count: u64,
}

#[derive(Debug, Default)]
struct Run {
    leaves: Vec<PathBuf>,
    pids: Vec<i32>,
    domains: Vec<u64>,
    listed: Vec<Denial>,
    total: u64,
}

impl Denials {
    /// Starts watching as `mode` says, on a kernel with Landlock ABI
    /// `landlock_abi`; never fails: a reason is kept instead.
    pub fn start(mode: ReportDenials, landlock_abi: u32) -> Self {
        match Self::try_start(mode, landlock_abi) {
            Ok(d) => d,
            Err(why) => {
                if mode != ReportDenials::Off {
                    tracing::info!("denials are not reported: {why}");
                }
                Denials { off: Some(why), shared: None, reader: None, _enabled: None }
            }
        }
    }

    fn try_start(mode: ReportDenials, landlock_abi: u32) -> Result<Self, String> {
        if mode == ReportDenials::Off {
            return Err("report_denials = \"off\"".into());
        }
        if landlock_abi < 7 {
            return Err(format!("Landlock ABI {landlock_abi} logs no refusal (7 needed)"));
        }
        if !in_host_network_namespace() {
            return Err("the executor is not in the host's network namespace, where the kernel \
                        sends audit records"
                .into());
        }
        let status = audit::status().map_err(|e| format!("kernel audit unavailable: {e}"))?;
        // "on" relies on the audit even when found on: an executor that
        // enabled it restores it only once no other relies on it.
        let enabled = match (status.enabled, mode) {
            (_, ReportDenials::On) => Some(enable::Enabled::take()?),
            (0, _) => {
                return Err("the kernel's audit is off (report_denials = \"auto\")".into());
            }
            _ => None,
        };
        let fd = audit::subscribe(SOCKET_BUFFER).map_err(|e| e.to_string())?;
        let shared = Arc::new(Shared {
            fd,
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
            lost: AtomicU64::new(0),
            late: AtomicU64::new(0),
            kauditd: find_kauditd(),
        });
        let s = Arc::clone(&shared);
        let reader = std::thread::Builder::new()
            .name("ongrid-denials".into())
            .spawn(move || read_loop(&s))
            .map_err(|e| format!("starting the reader: {e}"))?;
        Ok(Denials { off: None, shared: Some(shared), reader: Some(reader), _enabled: enabled })
    }

    /// Why refusals are not watched; `None` when they are.
    pub fn off(&self) -> Option<&str> {
        self.off.as_deref()
    }

    /// Records lost to a full socket, and records of runs already
    /// reported.
    pub fn lost_and_late(&self) -> (u64, u64) {
        self.shared
            .as_ref()
            .map_or((0, 0), |s| (s.lost.load(Ordering::Relaxed), s.late.load(Ordering::Relaxed)))
    }

    /// Watches a run whose processes live in the cgroup `leaves`; `None`
    /// when refusals are not watched.
    pub fn watch(&self, leaves: Vec<PathBuf>) -> Option<Watch> {
        let shared = Arc::clone(self.shared.as_ref()?);
        let key = {
            let mut st = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            st.next += 1;
            let key = st.next;
            // A pid seen as a stranger may be reused by this run.
            st.strangers.clear();
            st.runs.insert(key, Run { leaves, ..Run::default() });
            key
        };
        Some(Watch { shared, key })
    }
}

impl Drop for Denials {
    /// Tells the reader to stop, without waiting for it (it sees `stop`
    /// within its poll's timeout, or goes with the process): an exiting
    /// executor is not held up by it.
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.stop.store(true, Ordering::Relaxed);
        }
        drop(self.reader.take());
    }
}

/// One run's refusals, from before its spawn to its report.
#[derive(Debug)]
pub struct Watch {
    shared: Arc<Shared>,
    key: u64,
}

impl Watch {
    /// The run's main process (known before its cgroup is read).
    pub fn pid(&self, pid: i32) {
        let mut st = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.pids.insert(pid, self.key);
        if let Some(run) = st.runs.get_mut(&self.key) {
            run.pids.push(pid);
        }
        st.claim(pid, self.key, &self.shared.late);
    }

    /// The run's refusals (its processes are gone): at most
    /// [`MAX_DENIALS`] entries, first seen first, and the total.
    pub fn finish(self) -> (Vec<Denial>, u64) {
        let deadline = Instant::now() + GRACE;
        drain(&self.shared);
        while !kauditd_idle(self.shared.kauditd.as_deref()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(50));
            drain(&self.shared);
        }
        drain(&self.shared);
        let mut st = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        let run = st.remove(self.key);
        (run.listed, run.total)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.remove(self.key);
    }
}

impl State {
    fn remove(&mut self, key: u64) -> Run {
        let run = self.runs.remove(&key).unwrap_or_default();
        for p in &run.pids {
            self.pids.remove(p);
        }
        if self.done_domains.len() >= STRANGERS {
            self.done_domains.clear();
        }
        for d in &run.domains {
            self.domains.remove(d);
            self.done_domains.insert(*d);
        }
        run
    }

    /// The run whose leaves hold `pid`, remembered.
    fn run_of(&mut self, pid: i32) -> Option<u64> {
        if let Some(k) = self.pids.get(&pid) {
            return Some(*k);
        }
        if self.runs.is_empty() || self.strangers.contains(&pid) {
            return None;
        }
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok();
        let found = text.as_deref().and_then(|t| {
            t.lines().filter_map(|l| l.splitn(3, ':').nth(2)).find_map(|path| {
                let rel = path.trim_start_matches('/');
                (!rel.is_empty())
                    .then(|| {
                        self.runs.iter().find(|(_, r)| r.leaves.iter().any(|l| l.ends_with(rel)))
                    })
                    .flatten()
                    .map(|(k, _)| *k)
            })
        });
        match found {
            Some(k) if self.pids.len() < REMEMBERED => {
                self.pids.insert(pid, k);
                if let Some(r) = self.runs.get_mut(&k) {
                    r.pids.push(pid);
                }
            }
            Some(_) => {}
            None => {
                if self.strangers.len() >= STRANGERS {
                    self.strangers.clear();
                }
                self.strangers.insert(pid);
            }
        }
        found
    }

    fn add(&mut self, key: u64, d: Denial, late: &AtomicU64) {
        self.add_n(key, d, 1, late);
    }

    /// [`State::add`] of `n` records alike (held ones, counted together).
    fn add_n(&mut self, key: u64, mut d: Denial, n: u64, late: &AtomicU64) {
        let Some(run) = self.runs.get_mut(&key) else {
            late.fetch_add(n, Ordering::Relaxed);
            return;
        };
        run.total += n;
        d.count = n;
        let same = |x: &Denial| {
            x.kind == d.kind
                && x.access == d.access
                && x.path == d.path
                && x.syscall == d.syscall
                && x.destination == d.destination
        };
        let room = run.listed.len() < MAX_DENIALS;
        match run.listed.iter_mut().find(|x| same(x)) {
            Some(x) => x.count += n,
            None if room => run.listed.push(d),
            None => {}
        }
    }

    fn bind_domain(&mut self, domain: u64, key: u64, late: &AtomicU64) {
        if self.domains.len() < REMEMBERED {
            self.domains.insert(domain, key);
            if let Some(r) = self.runs.get_mut(&key) {
                r.domains.push(domain);
            }
        }
        let held = std::mem::take(&mut self.pending);
        for h in held {
            match &h.record {
                Record::Access { domain: d, .. } if *d == domain => {
                    self.add_n(key, access_denial(&h.record), h.count, late);
                }
                _ => self.pending.push(h),
            }
        }
    }

    fn take(&mut self, parsed: record::Parsed, late: &AtomicU64) {
        let record::Parsed { serial, record } = parsed;
        // Records of other events come between those of one event (each
        // record is queued on its own, the call's at its exit): held
        // records are dropped only once far behind, as another sandbox's.
        self.pending.retain(|h| h.serial.saturating_add(PENDING_SERIALS) >= serial);
        match record {
            Record::Access { domain, .. } => {
                if let Some(k) = self.domains.get(&domain).copied() {
                    self.add(k, access_denial(&record), late);
                } else if self.done_domains.contains(&domain) {
                    late.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.hold(serial, record);
                }
            }
            Record::Domain { domain, pid } => match self.run_of(pid) {
                Some(k) => self.bind_domain(domain, k, late),
                None => self.hold(serial, record),
            },
            Record::Syscall { pid } => {
                let held: Vec<u64> = self
                    .pending
                    .iter()
                    .filter(|h| h.serial == serial)
                    .filter_map(|h| match h.record {
                        Record::Access { domain, .. } => Some(domain),
                        _ => None,
                    })
                    .collect();
                if let (Some(domain), Some(k)) =
                    (held.first(), (!held.is_empty()).then(|| self.run_of(pid)).flatten())
                {
                    self.bind_domain(*domain, k, late);
                }
            }
            Record::Seccomp { pid, .. } => match self.run_of(pid) {
                Some(k) => self.add(k, seccomp_denial(&record), late),
                None => self.hold(serial, record),
            },
        }
    }

    /// Keeps a record whose run is not known yet: its process may have
    /// ended before its run's thread registered its pid
    /// ([`Watch::pid`], which takes it then). A repeat of a held access
    /// record (a short run's flood of one refusal) is counted with it, not
    /// kept apart; when [`PENDING`] records are held the oldest goes, a
    /// domain's record last: without it none of the domain's records could
    /// be tied to their run.
    fn hold(&mut self, serial: u64, record: Record) {
        if matches!(record, Record::Access { .. }) {
            if let Some(held) = self.pending.iter_mut().find(|h| h.record == record) {
                held.serial = serial;
                held.count += 1;
                return;
            }
        }
        if self.pending.len() >= PENDING {
            let other = |h: &Held| !matches!(h.record, Record::Domain { .. });
            let oldest = self.pending.iter().position(other).unwrap_or(0);
            self.pending.remove(oldest);
        }
        self.pending.push(Held { serial, record, count: 1 });
    }

    /// `pid` is now known as run `key`'s: the held records it made are.
    fn claim(&mut self, pid: i32, key: u64, late: &AtomicU64) {
        self.strangers.remove(&pid);
        let held = std::mem::take(&mut self.pending);
        let mut domains = Vec::new();
        for h in held {
            match h.record {
                Record::Seccomp { pid: p, .. } if p == pid => {
                    self.add_n(key, seccomp_denial(&h.record), h.count, late);
                }
                Record::Domain { domain, pid: p } if p == pid => domains.push(domain),
                _ => self.pending.push(h),
            }
        }
        for d in domains {
            self.bind_domain(d, key, late);
        }
    }
}

/// The report entry of a seccomp record: the call by name.
fn seccomp_denial(r: &Record) -> Denial {
    let (syscall, native, action) = match r {
        Record::Seccomp { syscall, native, action, .. } => (*syscall, *native, *action),
        _ => (-1, false, "errno"),
    };
    let name = if native { seccomp::name(syscall) } else { format!("syscall:{syscall}") };
    Denial {
        kind: DenialKind::Syscall,
        access: action.to_owned(),
        path: None,
        syscall: Some(name),
        destination: None,
        count: 1,
    }
}

/// The report entry of a Landlock access record: `fs.read_file` is
/// `fs`/`read_file`; `net.connect_tcp` is `network`; `scope.signal` a
/// refused `syscall` named by its scope.
fn access_denial(r: &Record) -> Denial {
    let Record::Access { blockers, path, destination, .. } = r else {
        return Denial {
            kind: DenialKind::Syscall,
            access: String::new(),
            path: None,
            syscall: None,
            destination: None,
            count: 1,
        };
    };
    let strip = |prefix: &str| {
        blockers
            .split(',')
            .map(|b| b.strip_prefix(prefix).unwrap_or(b))
            .collect::<Vec<_>>()
            .join(",")
    };
    if blockers.starts_with("net.") {
        return Denial {
            kind: DenialKind::Network,
            access: strip("net."),
            path: None,
            syscall: None,
            destination: destination.clone().or_else(|| Some("*".into())),
            count: 1,
        };
    }
    if blockers.starts_with("scope.") {
        return Denial {
            kind: DenialKind::Syscall,
            access: "scope".into(),
            path: None,
            syscall: Some(strip("scope.")),
            destination: None,
            count: 1,
        };
    }
    Denial {
        kind: DenialKind::Fs,
        access: strip("fs."),
        path: Some(path.clone().unwrap_or_else(|| "?".into())),
        syscall: None,
        destination: None,
        count: 1,
    }
}

/// Reads what the socket holds, at most [`DRAIN_BATCH`] records per hold
/// of the lock; false when the socket is empty.
fn drain_batch(s: &Shared) -> bool {
    let mut st = s.state.lock().unwrap_or_else(PoisonError::into_inner);
    let mut buf = std::mem::take(&mut st.buf);
    buf.resize(16 << 10, 0);
    let mut more = true;
    for _ in 0..DRAIN_BATCH {
        match recv(s.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(n) => {
                if let Some(p) = buf.get(..n).and_then(parse_datagram) {
                    st.take(p, &s.late);
                }
            }
            Err(nix::errno::Errno::ENOBUFS) => {
                s.lost.fetch_add(1, Ordering::Relaxed);
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => {
                more = false;
                break;
            }
        }
    }
    st.buf = buf;
    more
}

fn drain(s: &Shared) {
    while drain_batch(s) {}
}

/// The record of one datagram (one `nlmsghdr` and its text).
fn parse_datagram(d: &[u8]) -> Option<record::Parsed> {
    let len = usize::try_from(u32::from_ne_bytes(d.get(0..4)?.try_into().ok()?)).ok()?;
    let kind = u16::from_ne_bytes(d.get(4..6)?.try_into().ok()?);
    if !matches!(
        kind,
        record::SYSCALL | record::SECCOMP | record::LANDLOCK_ACCESS | record::LANDLOCK_DOMAIN
    ) {
        return None;
    }
    let text = d.get(NLMSG_HDRLEN..len.min(d.len()))?;
    record::parse(kind, std::str::from_utf8(text).ok()?)
}

/// The reader thread: drains as records come, until the engine goes.
fn read_loop(s: &Shared) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    while !s.stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(s.fd.as_fd(), PollFlags::POLLIN)];
        // The timeout only bounds how late the thread sees `stop`.
        match poll(&mut fds, PollTimeout::from(200u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => {}
            Ok(_) => drain(s),
            Err(e) => {
                tracing::warn!("denials: polling the audit socket: {e}");
                return;
            }
        }
    }
}

/// `/proc/<pid>/stat` of the kernel's `kauditd` thread: a child of
/// `kthreadd` (pid 2), looked for among those first (a scan of every
/// process costs milliseconds at start).
fn find_kauditd() -> Option<PathBuf> {
    let is_kauditd = |dir: &std::path::Path| {
        std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim_end() == "kauditd")
    };
    let kthreads = std::fs::read_to_string("/proc/2/task/2/children").unwrap_or_default();
    let found = kthreads
        .split_whitespace()
        .map(|pid| PathBuf::from("/proc").join(pid))
        .find(|d| is_kauditd(d));
    found
        .or_else(|| {
            std::fs::read_dir("/proc").ok()?.flatten().map(|e| e.path()).find(|d| is_kauditd(d))
        })
        .map(|d| d.join("stat"))
}

/// Whether `kauditd` sleeps (its queue empty: every record made so far
/// has been sent); false when it cannot be read, so the grace applies.
fn kauditd_idle(stat: Option<&std::path::Path>) -> bool {
    let Some(text) = stat.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return false;
    };
    // `pid (comm) S ...`: the state follows the last ')'.
    text.rsplit(')').next().and_then(|r| r.trim_start().chars().next()) == Some('S')
}

/// Whether this process shares the network namespace of pid 1 (true
/// when that cannot be read).
fn in_host_network_namespace() -> bool {
    match (std::fs::read_link("/proc/self/ns/net"), std::fs::read_link("/proc/1/ns/net")) {
        (Ok(a), Ok(b)) => a == b,
        _ => true,
    }
}

#[cfg(test)]
mod tests;
