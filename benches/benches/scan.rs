//! Loader scan throughput: 10,000 packs (a `skill.json` and an executable
//! entry each) in 100 folders of 100, walked by `loader::Scanner` with a
//! warm page cache. Target: at least 20,000 manifests per second.
//!
//! `cargo bench -p ongrid-benches --bench scan`

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use loader::Scanner;
use policy::ValidateOptions;

const PACKS: usize = 10_000;
const PER_FOLDER: usize = 100;

/// Writes `PACKS` valid packs under `root`.
fn build_tree(root: &Path) {
    for i in 0..PACKS {
        let dir = root.join(format!("group{:03}/pack{i:05}", i / PER_FOLDER));
        fs::create_dir_all(&dir).unwrap();
        let manifest = serde_json::json!({
            "name": format!("skill_{i:05}"),
            "description": "Reports disk usage of a path, with a realistic description length.",
            "entry": "run.sh",
            "class": "safe",
            "category": "storage",
            "timeout_seconds": 10,
            "env_allow": ["LANG"],
            "schema": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "depth": {"type": "integer"}},
                "required": ["path"]
            }
        });
        fs::write(dir.join("skill.json"), manifest.to_string()).unwrap();
        let entry = dir.join("run.sh");
        fs::write(&entry, "#!/bin/sh\necho '{}'\n").unwrap();
        fs::set_permissions(&entry, fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn scan(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(tmp.path()).unwrap();
    build_tree(&root);
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
