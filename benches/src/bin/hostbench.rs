//! `hostbench`: what this machine charges for the primitives a run is made
//! of, so that `loadbench`'s ratios can be read against the machine kind.
//!
//! - a null system call (`getppid`, which glibc does not cache);
//! - the first write to an anonymous page (a page fault that maps a zeroed
//!   page: what an `exec`'d skill pays for every page it touches, bare or
//!   sandboxed);
//! - a one-byte round trip over a Unix socket pair between two threads,
//!   both pinned to CPU 0 or one on each CPU, back to back and after idle
//!   gaps (the sender sleeps first, so the other CPU may have gone idle):
//!   what one hand-off between two processes or threads costs, and what
//!   waking an idle CPU adds to it.
//!
//! ```sh
//! cargo build --release -p ongrid-benches
//! target/release/hostbench                      # defaults: --trips 2000 --gaps-us 0,200,1000,5000
//! target/release/hostbench --trips 500 --gaps-us 0,100
//! ```
//!
//! Nothing here needs root. Each figure is one process's measurement on a
//! shared machine: run it next to the `loadbench` invocation it explains.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use ongrid_benches::{first_line, kernel_release, pct, sorted};

struct Opts {
    trips: usize,
    gaps_us: Vec<u64>,
}

const USAGE: &str = "usage: hostbench [--trips N] [--gaps-us A,B,...]";

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2);
}

fn parse_opts() -> Opts {
    let mut o = Opts { trips: 2000, gaps_us: vec![0, 200, 1000, 5000] };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--trips" => o.trips = value().parse().unwrap_or_else(|_| usage()),
            "--gaps-us" => {
                o.gaps_us = value()
                    .split(',')
                    .map(|g| g.trim().parse().unwrap_or_else(|_| usage()))
                    .collect();
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => usage(),
        }
    }
    if o.trips == 0 {
        usage();
    }
    o
}

/// Pins the calling thread to `cpu`; false if the machine has no such CPU.
fn pin(cpu: usize) -> bool {
    let mut set = CpuSet::new();
    set.set(cpu).is_ok() && sched_setaffinity(Pid::from_raw(0), &set).is_ok()
}

/// Nanoseconds per `getppid` over `n` calls.
fn null_syscall_ns(n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(nix::unistd::getppid());
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// Microseconds per first write to a page of a fresh zeroed allocation of
/// `pages` pages (large enough that glibc maps it anew, untouched).
fn page_fault_us(pages: usize) -> f64 {
    const PAGE: usize = 4096;
    let mut v = vec![0u8; pages * PAGE];
    let t = Instant::now();
    for i in 0..pages {
        v[i * PAGE] = 1;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    std::hint::black_box(&v);
    us
}

/// Round-trip latencies (µs) of one byte between this thread on CPU 0 and
/// an echo thread on `cpu`, the sender idle for `gap` before each trip.
/// None if either thread cannot be pinned.
fn round_trips(cpu: usize, gap: Duration, trips: usize) -> Option<Vec<f64>> {
    let (mut near, mut far) = UnixStream::pair().ok()?;
    let echo = std::thread::spawn(move || {
        if !pin(cpu) {
            return false;
        }
        let mut b = [0u8; 1];
        while far.read_exact(&mut b).is_ok() {
            if far.write_all(&b).is_err() {
                break;
            }
        }
        true
    });
    let mut lat = Vec::with_capacity(trips);
    if pin(0) {
        let mut b = [0u8; 1];
        for _ in 0..trips {
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
            let t = Instant::now();
            if near.write_all(&b).is_err() || near.read_exact(&mut b).is_err() {
                break;
            }
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(near);
    let echoed = echo.join().unwrap_or(false);
    (echoed && lat.len() == trips).then_some(lat)
}

fn main() {
    let o = parse_opts();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!(
        "hostbench: {} | kernel {} | {} CPUs",
        std::env::args().collect::<Vec<_>>().join(" "),
        kernel_release(),
        cpus,
    );
    println!("loadavg at start: {}", first_line("/proc/loadavg"));

    // Warm the code paths once, then measure.
    null_syscall_ns(10_000);
    println!("null system call (getppid)            {:>8.0} ns", null_syscall_ns(1_000_000));
    page_fault_us(256);
    println!("first write to an anonymous page      {:>8.2} us", page_fault_us(20_000));

    println!();
    println!("one-byte round trip between two threads (Unix socket pair), {} trips each:", o.trips);
    println!("{:<14} {:>10} {:>9} {:>9} {:>9}", "peers", "idle gap", "p50 us", "p90 us", "p99 us");
    let placements: &[(&str, usize)] =
        if cpus > 1 { &[("same CPU", 0), ("other CPU", 1)] } else { &[("same CPU", 0)] };
    for &gap in &o.gaps_us {
        for &(name, cpu) in placements {
            match round_trips(cpu, Duration::from_micros(gap), o.trips) {
                Some(lat) => {
                    let s = sorted(&lat);
                    println!(
                        "{:<14} {:>7} us {:>9.1} {:>9.1} {:>9.1}",
                        name,
                        gap,
                        pct(&s, 0.5),
                        pct(&s, 0.9),
                        pct(&s, 0.99)
                    );
                }
                None => println!("{name:<14} {gap:>7} us   SKIP: cannot pin a thread to CPU {cpu}"),
            }
        }
    }
    if cpus < 2 {
        println!("SKIP other CPU: this machine has one CPU");
    }
    println!("loadavg at end: {}", first_line("/proc/loadavg"));
}
