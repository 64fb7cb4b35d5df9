//! Loader scan throughput: 10,000 packs (a `skill.json` and an executable
//! entry each) in 100 folders of 100, walked by `loader::Scanner` with a
//! warm page cache. Target: at least 20,000 manifests per second.
//!
//! `cargo bench -p ongrid-benches --bench scan`

use std::fs;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use loader::Scanner;
use policy::ValidateOptions;

const PACKS: usize = 10_000;

fn scan(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(tmp.path()).unwrap();
    ongrid_benches::write_packs(&root, PACKS);
    let scanner = Scanner::new(ValidateOptions::default());
    let roots = [root];

    // Correctness first: every pack registers, nothing is skipped.
    let report = scanner.scan(&roots);
    assert_eq!(report.registered(), PACKS);
    assert!(report.events.iter().all(|e| !e.is_skip()));

    let mut group = c.benchmark_group("loader_scan");
    group.sample_size(10);
    group.throughput(Throughput::Elements(PACKS as u64));
    group.bench_function("10k_manifests", |b| {
        b.iter(|| {
            let report = scanner.scan(&roots);
            assert_eq!(report.registered(), PACKS);
            report
        });
    });
    group.finish();
}

criterion_group!(benches, scan);
criterion_main!(benches);
