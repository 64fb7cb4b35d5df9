//! A process's own `process_*` metrics, for both daemons' `/metrics`: the
//! executor's unprefixed (skilld renames them when it appends the
//! executor's text), skilld's as `ongrid_skilld_process_*`.
//!
//! The prometheus crate's process collector gives open and max fds,
//! virtual and resident memory, threads and start time, but truncates
//! `process_cpu_seconds_total` to whole seconds: a daemon that used 0.7 s
//! of CPU would read 0. [`ProcessMetrics`] replaces that family with the
//! exact value, the `utime + stime` ticks of `/proc/<pid>/stat` over
//! `CLK_TCK`, as a float.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Opts};

/// A process's metrics, named `<namespace>_process_*` (plain `process_*`
/// with an empty namespace): those of the prometheus crate's process
/// collector, with its `process_cpu_seconds_total` replaced by the exact
/// value (see the module docs).
#[derive(Debug)]
pub struct ProcessMetrics {
    pid: i32,
    inner: prometheus::process_collector::ProcessCollector,
    /// The CPU counter's options: a counter made afresh at each collect,
    /// set to the kernel's total (which only grows), so collects at once
    /// cannot add the same time twice.
    cpu: Opts,
    /// The full name of `cpu`, the family of `inner` it replaces.
    cpu_name: String,
    descs: Vec<Desc>,
}

impl ProcessMetrics {
    /// The metrics of process `pid` under `namespace` (`""`: plain
    /// `process_*`).
    ///
    /// # Errors
    ///
    /// An invalid namespace. It is checked on the CPU counter first: the
    /// prometheus process collector panics on one.
    pub fn new(pid: i32, namespace: &str) -> Result<Self, prometheus::Error> {
        let cpu =
            Opts::new("process_cpu_seconds_total", "Total user and system CPU time in seconds.")
                .namespace(namespace);
        let cpu_desc: Vec<Desc> =
            Counter::with_opts(cpu.clone())?.desc().into_iter().cloned().collect();
        // Every other family's name is this prefix and a valid suffix.
        let inner = prometheus::process_collector::ProcessCollector::new(pid, namespace);
        let cpu_name = cpu_desc.iter().map(|d| d.fq_name.clone()).next().unwrap_or_default();
        let descs = inner
            .desc()
            .into_iter()
            .filter(|d| d.fq_name != cpu_name)
            .cloned()
            .chain(cpu_desc)
            .collect();
        Ok(Self { pid, inner, cpu, cpu_name, descs })
    }

    /// This process's metrics under `namespace`.
    ///
    /// # Errors
    ///
    /// An invalid namespace.
    pub fn for_self(namespace: &str) -> Result<Self, prometheus::Error> {
        Self::new(i32::try_from(std::process::id()).unwrap_or(i32::MAX), namespace)
    }
}

impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families: Vec<MetricFamily> =
            self.inner.collect().into_iter().filter(|f| f.name() != self.cpu_name).collect();
        if let (Some(total), Ok(cpu)) =
            (cpu_seconds(self.pid), Counter::with_opts(self.cpu.clone()))
        {
            cpu.inc_by(total);
            families.extend(cpu.collect());
        }
        families
    }
}

/// The CPU time of process `pid` in seconds: `utime + stime` of
/// `/proc/<pid>/stat` over `CLK_TCK`.
fn cpu_seconds(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    if per_second <= 0 {
        return None;
    }
    Some(cpu_ticks(&stat)? as f64 / per_second as f64)
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line. The
/// command name (field 2) may hold spaces and parentheses: the fields are
/// counted from its last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    utime.checked_add(stime)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use prometheus::{Registry, TextEncoder};

    use super::*;

    /// Fields 14 and 15 of a stat line, counted from the command name's
    /// last `)` (a name may hold both spaces and parentheses).
    #[test]
    fn cpu_ticks_are_utime_plus_stime() {
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 23 2 0 0 20 0 1 0 9 0 0";
        assert_eq!(cpu_ticks(stat), Some(25));
        assert_eq!(cpu_ticks("42 (x) S 1"), None);
        assert_eq!(cpu_ticks("no parenthesis"), None);
        assert_eq!(cpu_ticks("42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 x 2"), None);
    }

    #[test]
    fn an_invalid_namespace_is_an_error() {
        assert!(ProcessMetrics::for_self("not a name").is_err());
        assert!(ProcessMetrics::for_self("").is_ok());
    }

    fn stat(pid: i32) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap()
    }

    /// A busy child, killed and reaped when dropped (an assertion that
    /// fails leaves no process behind).
    struct Burner(std::process::Child);

    impl Drop for Burner {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Starts a busy child and stops it once it has burnt at least 0.2 s
    /// of CPU time that is not a whole number of seconds (the truncated
    /// value would be off). Returns the child, its pid and its ticks.
    fn stopped_burner() -> (Burner, i32, u64) {
        use nix::sys::signal::{kill, Signal};
        let per_second = ticks_per_second();
        let child = Burner(
            std::process::Command::new("/bin/sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap(),
        );
        let pid = i32::try_from(child.0.id()).unwrap();
        let nix_pid = nix::unistd::Pid::from_raw(pid);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "the child burnt no CPU");
            std::thread::sleep(Duration::from_millis(20));
            if cpu_ticks(&stat(pid)).unwrap() < per_second / 5 {
                continue;
            }
            kill(nix_pid, Signal::SIGSTOP).unwrap();
            while !stat(pid).contains(") T ") {
                std::thread::sleep(Duration::from_millis(1));
            }
            let t = cpu_ticks(&stat(pid)).unwrap();
            if !t.is_multiple_of(per_second) {
                return (child, pid, t);
            }
            kill(nix_pid, Signal::SIGCONT).unwrap();
        }
    }

    fn ticks_per_second() -> u64 {
        let n = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap().unwrap();
        u64::try_from(n).unwrap()
    }

    /// The families are `<namespace>_process_*` (plain `process_*` with no
    /// namespace), and the CPU time is exact, not truncated to whole
    /// seconds: a stopped child's ticks over CLK_TCK, fraction included.
    #[test]
    fn process_metrics_are_named_and_cpu_seconds_fractional() {
        let (child, pid, burnt) = stopped_burner();
        let texts: Vec<(&str, String)> = ["", "ongrid_skilld"]
            .into_iter()
            .map(|namespace| {
                let r = Registry::new();
                r.register(Box::new(ProcessMetrics::new(pid, namespace).unwrap())).unwrap();
                (namespace, TextEncoder::new().encode_to_string(&r.gather()).unwrap())
            })
            .collect();
        drop(child);
        let want = burnt as f64 / ticks_per_second() as f64;
        for (namespace, text) in texts {
            let prefix = if namespace.is_empty() { String::new() } else { format!("{namespace}_") };
            let cpu: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{prefix}process_cpu_seconds_total ")))
                .unwrap_or_else(|| panic!("no cpu seconds in\n{text}"))
                .parse()
                .unwrap();
            assert!((cpu - want).abs() < 1e-9, "cpu {cpu}, ticks {burnt}\n{text}");
            assert!(cpu > 0.0 && cpu.fract() != 0.0, "{cpu}");
            for family in [
                "cpu_seconds_total counter",
                "open_fds gauge",
                "max_fds gauge",
                "resident_memory_bytes gauge",
                "virtual_memory_bytes gauge",
                "start_time_seconds gauge",
                "threads gauge",
            ] {
                let want = format!("# TYPE {prefix}process_{family}\n");
                assert!(text.contains(&want), "no {want:?} in\n{text}");
            }
            let ours = |l: &str| l.starts_with('#') || l.starts_with(&format!("{prefix}process_"));
            assert!(text.lines().all(ours), "{text}");
            assert_eq!(text.matches("# TYPE").count(), 7, "cpu seconds once\n{text}");
        }
    }
}
