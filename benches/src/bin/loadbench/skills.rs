//! The skill packs the variants run (`bin-cat`, `sh-cat`, `static-cat`,
//! `py-json`)
//! and the generated ones `daemon10k`'s registry also holds.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A skill pack: folder 0755 owned by us (root), entry executable, class
/// `safe` (any caller may run it). Returns the manifest path.
pub(crate) fn make_skill(base: &Path, kind: &str) -> PathBuf {
    let dir = base.join(kind);
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let entry = dir.join("run");
    match kind {
        "sh-cat" => fs::write(&entry, "#!/bin/sh\nexec cat\n").unwrap(),
        "bin-cat" => {
            fs::copy("/bin/cat", &entry).unwrap();
        }
        "static-cat" => build_static_cat(&dir, &entry),
        // A script skill: the interpreter's start and an import before it
        // reads a byte of its args, which a warm run has done already.
        "py-json" => fs::write(
            &entry,
            "#!/usr/bin/python3\nimport json, sys\nargs = json.load(sys.stdin)\n\
             sys.stdout.write(json.dumps(args, separators=(',', ':')))\n",
        )
        .unwrap(),
        other => panic!("unknown skill {other} (sh-cat, bin-cat, static-cat, py-json)"),
    }
    fs::set_permissions(&entry, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(
        dir.join("skill.json"),
        format!(
            r#"{{"name":"{}","description":"load bench","entry":"run","class":"safe","timeout_seconds":10,"schema":{{"type":"object","properties":{{"bench":{{"type":"integer"}},"text":{{"type":"string"}}}}}}}}"#,
            skill_name(kind)
        ),
    )
    .unwrap();
    dir.join("skill.json")
}

/// `static-cat`: stdin to stdout with raw system calls, linked without a C
/// library, so its own start costs next to nothing. glibc's start-up probes
/// the CPU with ~100 `cpuid` instructions, each a trap to the hypervisor
/// in a guest (~10 µs each on some of this project's machines), which a
/// dynamically linked skill (`bin-cat`, `sh-cat`) pays on every run, bare
/// or boxed alike: with this skill the ratios show what the boxes
/// themselves cost. Built here with the C compiler cargo links with
/// (x86_64 only).
fn build_static_cat(dir: &Path, entry: &Path) {
    const SOURCE: &str = r#"
static long sys3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
static char buf[65536];
void _start(void) {
    for (;;) {
        long n = sys3(0 /* read */, 0, (long)buf, sizeof buf);
        if (n <= 0) break;
        for (long off = 0; off < n;) {
            long w = sys3(1 /* write */, 1, (long)buf + off, n - off);
            if (w <= 0) sys3(60 /* exit */, 1, 0, 0);
            off += w;
        }
    }
    sys3(60 /* exit */, 0, 0, 0);
    for (;;) {}
}
"#;
    let arch = std::env::consts::ARCH;
    if arch != "x86_64" {
        panic!("static-cat is written for x86_64, not {arch}");
    }
    let src = dir.join("static-cat.c");
    fs::write(&src, SOURCE).unwrap();
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-static", "-nostdlib", "-fno-stack-protector", "-o"])
        .arg(entry)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("static-cat: cannot run {}: {e}", cc.to_string_lossy()));
    assert!(status.success(), "static-cat: {} failed: {status}", cc.to_string_lossy());
    fs::remove_file(&src).unwrap();
}

pub(crate) fn skill_name(kind: &str) -> String {
    format!("bench_{}", kind.replace('-', "_"))
}

/// `n` valid packs under `root` ([`ongrid_benches::write_packs`]), every
/// folder traversable by the run-as user.
pub(crate) fn make_many(root: &Path, n: usize) {
    ongrid_benches::write_packs(root, n);
    for d in walk_dirs(root) {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn walk_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_owned()];
    let mut i = 0;
    while i < out.len() {
        if let Ok(rd) = fs::read_dir(&out[i]) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
        i += 1;
    }
    out
}
