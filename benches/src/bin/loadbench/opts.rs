//! The command line: the variants it can run ([`Variant`]) and its
//! options ([`Opts`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::worker::engine_worker;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    Bare,
    BareWarm,
    Cli,
    Daemon,
    Daemon10k,
    DaemonShm,
    DaemonNormal,
    DaemonFull,
    DaemonB,
    DaemonWarm,
    DaemonWarmB,
    ExecutorRpc,
    Engine,
    Engine1g,
    Bwrap,
    Firejail,
}

const ALL: [Variant; 16] = [
    Variant::Bare,
    Variant::BareWarm,
    Variant::Cli,
    Variant::Daemon,
    Variant::Daemon10k,
    Variant::DaemonShm,
    Variant::DaemonNormal,
    Variant::DaemonFull,
    Variant::DaemonB,
    Variant::DaemonWarm,
    Variant::DaemonWarmB,
    Variant::ExecutorRpc,
    Variant::Engine,
    Variant::Engine1g,
    Variant::Bwrap,
    Variant::Firejail,
];

impl Variant {
    pub(crate) fn parse(s: &str) -> Option<Variant> {
        ALL.into_iter().find(|v| v.name() == s)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::BareWarm => "bare-warm",
            Variant::Cli => "cli",
            Variant::Daemon => "daemon",
            Variant::Daemon10k => "daemon10k",
            Variant::DaemonShm => "daemon-shm",
            Variant::DaemonNormal => "daemon-normal",
            Variant::DaemonFull => "daemon-full",
            Variant::DaemonB => "daemon-b",
            Variant::DaemonWarm => "daemon-warm",
            Variant::DaemonWarmB => "daemon-warm-b",
            Variant::ExecutorRpc => "executor-rpc",
            Variant::Engine => "engine",
            Variant::Engine1g => "engine1g",
            Variant::Bwrap => "bwrap",
            Variant::Firejail => "firejail",
        }
    }

    /// Its runs leave kernel work behind them (the teardown of their
    /// namespaces) that lands on the next variant's run; with `--settle`
    /// each is followed by an untimed [`settle`](ongrid_benches::settle).
    pub(crate) fn leaves_teardown(self) -> bool {
        matches!(self, Variant::Bwrap | Variant::Firejail)
    }

    /// Runs inside a single worker process, or waits untimed before its
    /// run: sequential only.
    pub(crate) fn sequential_only(self) -> bool {
        matches!(self, Variant::Engine | Variant::Engine1g | Variant::BareWarm)
    }
}

#[derive(Debug)]
pub(crate) struct Opts {
    pub(crate) iters: usize,
    pub(crate) warmup: usize,
    pub(crate) conc: Vec<usize>,
    pub(crate) ballast_mb: usize,
    pub(crate) loaded_skills: usize,
    pub(crate) skills: Vec<String>,
    pub(crate) variants: Vec<Variant>,
    pub(crate) bin_dir: PathBuf,
    /// The other build's daemons, for `daemon-b`.
    pub(crate) bin_dir_b: Option<PathBuf>,
    /// `daemon-b`'s executor grants every skill `proc = "host"`.
    pub(crate) host_proc_b: bool,
    pub(crate) audit_dir: Option<PathBuf>,
    /// `daemon-warm`'s warm runs per skill (`[skills.NAME] warm`).
    pub(crate) warm: u32,
    /// Idle time before each run, each client's with clients at once (0:
    /// back to back).
    pub(crate) gap: Duration,
    /// Wait untimed after each `bwrap` and `firejail` run (or round) until
    /// the host is quiet, and report what the wait saw.
    pub(crate) settle: bool,
    /// The daemons' `max_concurrent_runs` past their warm runs (`None`:
    /// the executor's default, or 8 past the warm runs).
    pub(crate) max_runs: Option<usize>,
}

fn usage() -> ! {
    eprintln!(
        "usage: loadbench [--iters N] [--warmup N] [--conc 1,8] [--ballast-mb M] \
         [--loaded-skills N] [--skills sh-cat,bin-cat,static-cat] \
         [--variants bare,bare-warm,cli,daemon,daemon10k,daemon-shm,daemon-normal,daemon-full,daemon-b,daemon-warm,daemon-warm-b,executor-rpc,engine,engine1g,bwrap,firejail] \
         [--warm N] [--bin-dir DIR] [--bin-dir-b DIR] [--host-proc-b] [--audit-dir DIR] [--gap-ms MS] [--max-runs N] [--settle]\n       loadbench --engine-worker MB"
    );
    std::process::exit(2)
}

pub(crate) fn parse_opts() -> Opts {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let mut o = Opts {
        iters: 500,
        warmup: 30,
        conc: vec![1, 8],
        ballast_mb: 1024,
        loaded_skills: 10_000,
        skills: vec!["bin-cat".into(), "sh-cat".into()],
        variants: ALL
            .into_iter()
            .filter(|v| {
                !matches!(
                    v,
                    Variant::DaemonShm
                        | Variant::DaemonNormal
                        | Variant::DaemonFull
                        | Variant::DaemonB
                        | Variant::DaemonWarm
                        | Variant::DaemonWarmB
                        | Variant::ExecutorRpc
                )
            })
            .collect(),
        bin_dir: exe_dir,
        bin_dir_b: None,
        host_proc_b: false,
        audit_dir: None,
        warm: 4,
        gap: Duration::ZERO,
        settle: false,
        max_runs: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<usize>().unwrap_or_else(|_| usage());
        match a.as_str() {
            "--engine-worker" => engine_worker(num(val())),
            "--iters" => o.iters = num(val()),
            "--warmup" => o.warmup = num(val()),
            "--conc" => o.conc = val().split(',').map(|c| num(c.to_owned()).max(1)).collect(),
            "--ballast-mb" => o.ballast_mb = num(val()),
            "--loaded-skills" => o.loaded_skills = num(val()),
            "--skills" => o.skills = val().split(',').map(str::to_owned).collect(),
            "--variants" => {
                o.variants = val()
                    .split(',')
                    .map(|v| Variant::parse(v).unwrap_or_else(|| usage()))
                    .collect();
            }
            "--bin-dir" => o.bin_dir = PathBuf::from(val()),
            "--bin-dir-b" => o.bin_dir_b = Some(PathBuf::from(val())),
            "--audit-dir" => o.audit_dir = Some(PathBuf::from(val())),
            "--settle" => o.settle = true,
            "--max-runs" => o.max_runs = Some(num(val()).max(1)),
            "--warm" => o.warm = u32::try_from(num(val())).unwrap_or_else(|_| usage()).max(1),
            "--host-proc-b" => o.host_proc_b = true,
            "--gap-ms" => {
                o.gap = Duration::from_millis(u64::try_from(num(val())).unwrap_or(u64::MAX))
            }
            _ => usage(),
        }
    }
    o
}
