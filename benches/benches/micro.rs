//! Per-request CPU costs on the daemon path, each in isolation: manifest parse and validation, args schema validation with the
//! registry's cached validator (and, for contrast, compiling it per call),
//! the executor wire's JSON-RPC encode and decode, the run report's
//! serialisation, and the executor's reuse of a cached Landlock ruleset.
//!
//! `cargo bench -p ongrid-benches --bench micro`

use std::path::PathBuf;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use loader::daemon::registry::Skill;
use loader::RegisteredSkill;
use policy::wire::{self, ExecuteParams, LineBuffer, Reply};
use policy::{Manifest, RunReport, ValidateOptions};
use serde_json::{json, Value};

/// A typical manifest (about 400 bytes, with a schema), as the scan bench
/// writes them.
fn manifest_bytes() -> Vec<u8> {
    json!({
        "name": "disk_usage",
        "description": "Reports disk usage of a path, with a realistic description length.",
        "entry": "run.sh",
        "class": "safe",
        "category": "storage",
        "timeout_seconds": 10,
        "env_allow": ["LANG"],
        "schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "maxLength": 4096},
                "depth": {"type": "integer", "minimum": 0, "maximum": 16},
                "human": {"type": "boolean"}
            },
            "required": ["path"],
            "additionalProperties": false
        }
    })
    .to_string()
    .into_bytes()
}

fn args() -> Value {
    json!({"path": "/var/lib/ongrid", "depth": 2, "human": true})
}

/// A report as a real sandboxed run produces it (loadbench's `daemon`
/// variant, sh-cat skill, as root).
fn report() -> RunReport {
    serde_json::from_value(json!({
        "skill": "disk_usage",
        "outcome": "ok",
        "result": {"path": "/var/lib/ongrid", "bytes": 123_456_789, "files": 4242,
                   "top": [{"name": "audit.db", "bytes": 100_000_000},
                           {"name": "cache", "bytes": 23_000_000}]},
        "error": null,
        "exit_code": 0,
        "signal": null,
        "limit": null,
        "duration_ms": 2,
        "setup_us": 612,
        "stderr": "scanning /var/lib/ongrid\n",
        "stderr_truncated_bytes": 0,
        "sandbox": {
            "uid": 999, "gid": 995, "no_new_privs": true, "capabilities": [],
            "landlock": {"abi": 7, "status": "full", "net": true, "scoped": true},
            "seccomp": true, "network": false,
            "cgroup": {"kill": "v2", "memory": "v1", "pids": "v1"},
            "rlimits": {"RLIMIT_AS": 1_073_741_824_u64, "RLIMIT_CORE": 0, "RLIMIT_CPU": 30,
                        "RLIMIT_FSIZE": 67_108_864, "RLIMIT_NOFILE": 256, "RLIMIT_NPROC": 64},
            "degraded": []
        }
    }))
    .expect("a report")
}

fn manifest(c: &mut Criterion) {
    let bytes = manifest_bytes();
    let opts = ValidateOptions::default();
    let mut g = c.benchmark_group("manifest");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("parse_and_validate", |b| {
        b.iter(|| Manifest::from_slice(black_box(&bytes), &opts).expect("valid"));
    });
    g.finish();
}

fn args_validation(c: &mut Criterion) {
    let m = Manifest::from_slice(&manifest_bytes(), &ValidateOptions::default()).unwrap();
    let schema = m.schema().to_value();
    let reg = RegisteredSkill::new(
        m,
        PathBuf::from("/s/disk/run.sh"),
        PathBuf::from("/s/disk/skill.json"),
        PathBuf::from("/s"),
    );
    // What the registry does once per scan: compile the schema.
    let skill = Skill::new(reg).expect("schema compiles");
    let good = args();
    let bad = json!({"depth": 99, "extra": 1});
    assert_eq!(skill.check_args(&good), Ok(()));
    assert!(skill.check_args(&bad).is_err());

    let mut g = c.benchmark_group("args_schema");
    g.bench_function("cached_valid", |b| {
        b.iter(|| skill.check_args(black_box(&good)));
    });
    g.bench_function("cached_invalid", |b| {
        b.iter(|| skill.check_args(black_box(&bad)));
    });
    // What skilld does to the body's args before the schema: keep the
    // text, check its keys are unique, build the parsed copy.
    let text = serde_json::to_vec(&good).unwrap();
    g.bench_function("args_as_sent", |b| {
        b.iter(|| policy::Args::from_slice(black_box(&text)).expect("args"));
    });
    // Contrast: what a per-request compile would cost.
    g.bench_function("compile_then_validate", |b| {
        b.iter(|| {
            let v = jsonschema::validator_for(black_box(&schema)).expect("compiles");
            v.is_valid(black_box(&good))
        });
    });
    g.finish();
}

fn jsonrpc(c: &mut Criterion) {
    // From JSON, so fields added later with a default keep this compiling.
    let params: ExecuteParams = serde_json::from_value(json!({
        "manifest": "/usr/share/ongrid/skills/disk_usage/skill.json",
        "args": args(),
        "session_id": "session-0123456789",
        "class": "safe",
    }))
    .expect("execute params");
    let request = wire::encode_execute(7, &params);
    let rep = report();
    let id = json!(7);
    let reply = wire::encode_report(&id, &rep);
    let stderr = wire::encode_stderr(&id, "scanning /var/lib/ongrid");
    let strip = |l: &[u8]| l[..l.len() - 1].to_vec();
    let (request_line, reply_line) = (strip(&request), strip(&reply));
    assert!(matches!(wire::decode_line(&request_line), Ok(wire::Request::Execute { .. })));
    assert!(matches!(wire::decode_reply(&reply_line), Ok(Reply::Result { .. })));

    let mut g = c.benchmark_group("jsonrpc");
    g.bench_function("encode_execute", |b| b.iter(|| wire::encode_execute(7, black_box(&params))));
    g.bench_function("decode_execute", |b| b.iter(|| wire::decode_line(black_box(&request_line))));
    g.bench_function("encode_report", |b| b.iter(|| wire::encode_report(&id, black_box(&rep))));
    g.bench_function("decode_report", |b| {
        b.iter(|| {
            // As the loader does: the reply, then the report out of it.
            let Ok(Reply::Result { result, .. }) = wire::decode_reply(black_box(&reply_line))
            else {
                unreachable!()
            };
            serde_json::from_str::<RunReport>(result.get()).expect("a report")
        });
    });
    // One whole answer stream (a stderr line then the report), cut into
    // lines as it arrives in 4 KiB reads.
    let mut stream = stderr.clone();
    stream.extend_from_slice(&reply);
    g.throughput(Throughput::Bytes(stream.len() as u64));
    g.bench_function("line_buffer_split", |b| {
        b.iter(|| {
            let mut lb = LineBuffer::new(wire::MAX_LINE_BYTES);
            let mut n = 0;
            for chunk in black_box(&stream).chunks(4096) {
                n += lb.push(chunk).len();
            }
            n
        });
    });
    g.finish();
}

fn report_serialisation(c: &mut Criterion) {
    let rep = report();
    let text = serde_json::to_vec(&rep).unwrap();
    let mut g = c.benchmark_group("report");
    g.throughput(Throughput::Bytes(text.len() as u64));
    // skilld's 200 answer body (axum `Json(report)`).
    g.bench_function("serialise", |b| b.iter(|| serde_json::to_vec(black_box(&rep)).unwrap()));
    g.bench_function("deserialise", |b| {
        b.iter(|| serde_json::from_slice::<RunReport>(black_box(&text)).unwrap());
    });
    g.finish();
}

/// A run's Landlock ruleset taken from its slot's cache (`landlock::prepare`
/// on a hit: the system paths' freshness check, the identity of each of
/// the run's own paths, the ruleset's descriptor duplicated), as every
/// served run but a slot's first does.
fn landlock_cache_hit(c: &mut Criterion) {
    use executor::sandbox::landlock::{self, Cache, FsPolicy};
    let abi = executor::run::spawn::Host::detect().landlock_abi;
    if abi == 0 {
        println!("SKIP landlock/cache_hit: the kernel has no Landlock");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (skill, home) = (dir.path().join("skill"), dir.path().join("slot"));
    std::fs::create_dir(&skill).unwrap();
    std::fs::create_dir(&home).unwrap();
    let entry = skill.join("run");
    std::fs::write(&entry, "#!/bin/sh\n").unwrap();
    let policy = FsPolicy::new(&skill, &entry, &home, &[], &[], false);
    let mode = executor::LandlockMode::Required;
    let mut cache = Cache::default();
    let built = landlock::prepare(abi, mode, &policy, Some(&mut cache)).unwrap();
    assert!(!built.reused);
    let mut g = c.benchmark_group("landlock");
    g.bench_function("cache_hit", |b| {
        b.iter(|| {
            let p = landlock::prepare(abi, mode, black_box(&policy), Some(&mut cache)).unwrap();
            assert!(p.reused, "a hit");
            p
        });
    });
    g.finish();
}

criterion_group!(
    benches,
    manifest,
    args_validation,
    jsonrpc,
    report_serialisation,
    landlock_cache_hit
);
criterion_main!(benches);
