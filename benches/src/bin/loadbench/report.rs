//! What loadbench prints of a set of runs: the latency and throughput
//! table, the daemons' figures and their VmRSS.

use ongrid_benches::{cpus, pct, settle, sorted, HostTime, Quiet, Samples};

use crate::opts::Variant;
use crate::run::Ctx;
use crate::scrape::{hist_delta, hist_quantile, parse_audit_waits, parse_hist, parse_slots};
use crate::scrape::{AUDIT_ROWS, SETUP_HIST};
use crate::stack::proc_cpu;
use crate::{mean, Mark};

/// The same wait as [`after_run`](crate::after_run)'s on the idle host, before anything
/// runs: what its CPU figure holds when no run left anything behind.
pub(crate) fn print_idle_settle() {
    let runs: Vec<_> = (0..10).filter_map(|_| settle(Quiet::default())).collect();
    if runs.is_empty() {
        println!("note: the host's CPU time cannot be read: no wait after bwrap and firejail");
        return;
    }
    let cpu = sorted(&runs.iter().map(|x| x.cpu.as_secs_f64() * 1e6).collect::<Vec<_>>());
    let waited = sorted(&runs.iter().map(|x| x.waited.as_secs_f64() * 1e3).collect::<Vec<_>>());
    println!(
        "untimed wait after each bwrap and firejail run until the host is quiet (5 ms under 5 % \
         busy, at least 60 ms); on the idle host: {:.0} ms, host CPU p50 {:.0} us",
        pct(&waited, 0.5),
        pct(&cpu, 0.5)
    );
}

pub(crate) fn print_table(variants: &[Variant], samples: &[Samples]) {
    println!(
        "{:<10} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10}",
        "variant",
        "n",
        "p50 us",
        "p90 us",
        "p99 us",
        "mean us",
        "runs/s",
        "x bare p50",
        "bare/x p50",
        "x bare run/s"
    );
    let bare = variants.iter().position(|v| *v == Variant::Bare);
    let stats = |s: &Samples| {
        let l = sorted(&s.lat_us);
        (pct(&l, 0.5), s.runs_per_s())
    };
    let (bare_p50, bare_rps) = bare.map_or((f64::NAN, f64::NAN), |b| stats(&samples[b]));
    for (v, s) in variants.iter().zip(samples) {
        let l = sorted(&s.lat_us);
        let (p50, rps) = stats(s);
        println!(
            "{:<10} {:>6} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>9.2} {:>9.2} {:>10.2}",
            v.name(),
            l.len(),
            p50,
            pct(&l, 0.9),
            pct(&l, 0.99),
            mean(&l),
            rps,
            p50 / bare_p50,
            bare_p50 / p50,
            rps / bare_rps
        );
    }
    // With clients at once: the whole host's CPU per run, every process and
    // the kernel included, and how busy the host was (near 100 %: the
    // throughput is bounded by CPU).
    let cpus = cpus();
    for (v, s) in variants.iter().zip(samples) {
        if !s.busy.is_zero() {
            println!(
                "{:<10} host CPU per run {:.0} us (all processes, /proc/stat, steal apart); host \
                 busy {:.0} % of {cpus} CPUs, stolen {:.0} %",
                v.name(),
                s.busy_per_run().as_secs_f64() * 1e6,
                HostTime::share(s.busy, s.wall, cpus),
                HostTime::share(s.steal, s.wall, cpus)
            );
        }
    }
    // The older measure: each round until its last client was done,
    // drain included.
    let bare_drained = bare.map_or(f64::NAN, |b| samples[b].drained_runs_per_s());
    for (v, s) in variants.iter().zip(samples) {
        if s.drained > s.wall {
            println!(
                "{:<10} rounds until their last client was done: {:.0} runs/s, x bare {:.2}",
                v.name(),
                s.drained_runs_per_s(),
                s.drained_runs_per_s() / bare_drained
            );
        }
    }
    // How many times per run one CPU had to wake another (or make it run
    // something): on a guest whose idle vCPUs halt, each is a wait for the
    // hypervisor to run that vCPU again.
    // What the untimed waits after `bwrap` and `firejail` saw: their
    // namespaces' teardown, a cost their callers do not wait for.
    for (v, s) in variants.iter().zip(samples) {
        if s.settled.is_empty() {
            continue;
        }
        let waited =
            sorted(&s.settled.iter().map(|x| x.waited.as_secs_f64() * 1e3).collect::<Vec<_>>());
        let cpu = sorted(&s.settled.iter().map(|x| x.cpu.as_secs_f64() * 1e6).collect::<Vec<_>>());
        let capped = s.settled.iter().filter(|x| x.capped).count();
        println!(
            "{:<10} after each run, untimed: host quiet again after p50 {:.0} ms (p90 {:.0}, \
             capped {capped}/{}), host CPU meanwhile p50 {:.0} us (p90 {:.0}; every task, idle \
             host included)",
            v.name(),
            pct(&waited, 0.5),
            pct(&waited, 0.9),
            s.settled.len(),
            pct(&cpu, 0.5),
            pct(&cpu, 0.9)
        );
    }
    for (v, s) in variants.iter().zip(samples) {
        if let Some(w) = s.wakeups_per_run() {
            println!(
                "{:<10} wake-ups of another CPU per run {w:.1} (RES + CAL interrupts, \
                 /proc/interrupts, whole host)",
                v.name()
            );
        }
    }
    for (v, s) in variants.iter().zip(samples) {
        if !s.setup_us.is_empty() {
            let st = sorted(&s.setup_us);
            println!(
                "{:<10} report setup_us: mean {:.0} p50 {:.0} p90 {:.0} p99 {:.0}",
                v.name(),
                mean(&st),
                pct(&st, 0.5),
                pct(&st, 0.9),
                pct(&st, 0.99)
            );
        }
    }
    // Ratios between sandboxes, from the same run.
    let p50_of = |want: Variant| {
        variants.iter().position(|v| *v == want).map(|i| pct(&sorted(&samples[i].lat_us), 0.5))
    };
    for ours in [Variant::Engine, Variant::Daemon] {
        for theirs in [Variant::Bwrap, Variant::Firejail] {
            if let (Some(a), Some(b)) = (p50_of(ours), p50_of(theirs)) {
                println!("{} p50 / {} p50 = {:.1}x faster", theirs.name(), ours.name(), b / a);
            }
        }
    }
    if let (Some(a), Some(b)) = (p50_of(Variant::Engine1g), p50_of(Variant::Engine)) {
        println!("engine1g p50 / engine p50 = {:.3}", a / b);
    }
    if let (Some(a), Some(b)) = (p50_of(Variant::Daemon10k), p50_of(Variant::Daemon)) {
        println!("daemon10k p50 / daemon p50 = {:.3}", a / b);
    }
}

pub(crate) fn print_metrics(ctx: &Ctx<'_>, variants: &[Variant], samples: &[Samples], mark: &Mark) {
    const NAME: &str = SETUP_HIST;
    // The bare skills are this process's only reaped children unless `cli`,
    // `bwrap` or `firejail` ran too: their CPU next to the sandboxed ones'.
    let own_children = [Variant::Cli, Variant::Bwrap, Variant::Firejail];
    if let Some(b) = variants.iter().position(|v| *v == Variant::Bare) {
        if !variants.iter().any(|v| own_children.contains(v)) {
            let cpu = proc_cpu(std::process::id())[1] - mark.children;
            println!(
                "bare: CPU per run: skill (loadbench's children) {:.0} us",
                cpu / samples[b].runs.max(1) as f64 * 1e6
            );
        }
    }
    let marks = mark.hist.iter().zip(&mark.slots).zip(&mark.cpu).zip(&mark.audit);
    for ((name, stack), (((before, slots0), cpu0), audit0)) in ctx.stacks.iter().zip(marks) {
        let text = stack.scrape();
        let audit = parse_audit_waits(&text);
        let h = hist_delta(&parse_hist(&text, NAME), before);
        let slots = parse_slots(&text);
        let slots: Vec<f64> = slots.iter().zip(slots0).map(|(a, b)| a - b).collect();
        // The runs this stack's executor served (`executor-rpc` uses the
        // `daemon` stack's executor, but not its skilld).
        let on_stack =
            |v: &Variant| v.name() == *name || (*name == "daemon" && *v == Variant::ExecutorRpc);
        let mut bench = Vec::new();
        let (mut runs, mut skilld_runs) = (0usize, 0usize);
        for (v, s) in variants.iter().zip(samples) {
            if on_stack(v) {
                bench.extend_from_slice(&s.setup_us);
                runs += s.runs;
                if v.name() == *name {
                    skilld_runs += s.runs;
                }
            }
        }
        let bench = sorted(&bench);
        let skilld_runs_seen = skilld_runs > 0;
        let (runs, skilld_runs) = (runs.max(1) as f64, skilld_runs.max(1) as f64);
        let cpu = stack.cpu();
        // No run went through skilld (`executor-rpc` alone): nothing to divide.
        let skilld = if skilld_runs_seen {
            format!("{:.0} us", (cpu[0] - cpu0[0]) / skilld_runs * 1e6)
        } else {
            "- (no run through it)".to_owned()
        };
        println!(
            "{name}: CPU per run: skilld {skilld}, executor {:.0} us, skill (executor's \
             children) {:.0} us",
            (cpu[1] - cpu0[1]) / runs * 1e6,
            (cpu[2] - cpu0[2]) / runs * 1e6,
        );
        println!(
            "{name}: {NAME} over the measured runs: count {:.0} mean {:.0} us, p50 ~{:.0} us, \
             p90 ~{:.0} us (bucket interpolation) | reports' setup_us: n {} mean {:.0} p50 {:.0} \
             p90 {:.0} us",
            h.count,
            h.sum / h.count.max(1.0) * 1e6,
            hist_quantile(&h, 0.5) * 1e6,
            hist_quantile(&h, 0.9) * 1e6,
            bench.len(),
            mean(&bench),
            pct(&bench, 0.5),
            pct(&bench, 0.9),
        );
        println!(
            "{name}: run slots over the measured runs: ready {:.0}, recycled on the run's path \
             {:.0}, made on the run's path {:.0}",
            slots[0], slots[1], slots[2]
        );
        if skilld_runs_seen {
            let rows: Vec<String> = AUDIT_ROWS
                .iter()
                .zip(audit.iter().zip(audit0))
                .map(|(row, (&(sum, n), &(sum0, n0)))| {
                    let n = n - n0;
                    format!("{row} n {n:.0} mean {:.0} us", (sum - sum0) / n.max(1.0) * 1e6)
                })
                .collect();
            println!(
                "{name}: ongrid_audit_wait_seconds over the measured runs: {}",
                rows.join(", ")
            );
        }
    }
}

pub(crate) fn print_rss(ctx: &Ctx<'_>, when: &str) {
    for (name, s) in &ctx.stacks {
        let (e, d) = s.rss_kb();
        println!(
            "VmRSS {when:<12} {name:<10} executor {:>6.1} MiB  skilld {:>6.1} MiB",
            e as f64 / 1024.0,
            d as f64 / 1024.0
        );
    }
}
