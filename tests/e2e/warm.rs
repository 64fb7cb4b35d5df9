//! Warm runs through both daemons: a skill the executor grants warm runs
//! (`[skills.NAME] warm`) is served from processes made ahead once its
//! first run (a miss, cold) started its pool; `GET /v1/skills/{name}`
//! shows the pool's size, hits and misses, and `/metrics` the
//! `ongrid_warm_*` series.

use std::time::Duration;

use serde_json::json;

use crate::harness::{eventually, write_skill, Stack};

/// A labelled sample of skilld's `/metrics` (the executor's, appended).
fn sample(text: &str, name: &str, skill: &str) -> Option<f64> {
    let key = format!("{name}{{skill=\"{skill}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(key.as_str())).and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_granted_skill_runs_warm_and_shows_its_pool() {
    let s = Stack::start_with("[skills.strict]\nwarm = 2\n", "");
    let pool = |name: &str| s.get(&format!("/v1/skills/{name}")).json()["warm"].clone();
    assert_eq!(pool("fail"), json!(null), "a skill granted none");
    // `echo` writes to stderr before it reads its args: a warm run of it
    // would be discarded each time; `strict` is `exec cat`.
    assert_eq!(
        pool("strict"),
        json!({"size": 2, "idle": 0, "hits": 0, "misses": 0, "discarded": 0}),
        "before its first run"
    );
    let r = s.execute("strict", &json!({"path": "a"}));
    assert_eq!(r.status, 200, "{}", s.logs());
    let first = r.json();
    assert_eq!((first["outcome"].clone(), first["warm"].clone()), (json!("ok"), json!(false)));
    assert!(
        eventually(Duration::from_secs(10), || pool("strict")["idle"] == 2),
        "the pool never filled: {}\n{}",
        pool("strict"),
        s.logs()
    );
    let r = s.execute("strict", &json!({"path": "b"})).json();
    assert_eq!(r["outcome"], "ok", "{r}");
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(r["result"], json!({"path": "b"}));
    let p = pool("strict");
    assert_eq!(
        (p["size"].clone(), p["hits"].clone(), p["misses"].clone()),
        (json!(2), json!(1), json!(1)),
        "{p}"
    );
    // `ongrid-skill show` says the same.
    let out = std::process::Command::new(crate::harness::bin("ongrid-skill"))
        .args(["show", "strict", "--socket"])
        .arg(&s.socket)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = shown.lines().find(|l| l.starts_with("warm:")).unwrap_or_default();
    assert!(line.contains("2 granted") && line.contains("hits 1, misses 1"), "{shown}");
    let text = s.scrape();
    assert_eq!(sample(&text, "ongrid_warm_hits_total", "strict"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "ongrid_warm_misses_total", "strict"), Some(1.0));
    assert!(sample(&text, "ongrid_warm_idle", "strict").is_some());
}

/// skilld's reload discards the executor's idle warm runs: a file the entry
/// reads at start (not its manifest or entry, which the executor checks
/// itself) changed, and after `POST /v1/reload` the next warm run reads it
/// as it is now; the skill's pool counts the discarded ones.
#[test]
fn a_reload_discards_the_warm_pools() {
    let s = Stack::start_with("[skills.libbed]\nwarm = 2\n", "");
    let dir = write_skill(
        &s.skills,
        "libbed",
        "",
        ". \"${0%/*}/lib.sh\"\ncat >/dev/null\nprintf '{\"v\":%s}' \"$V\"",
    );
    let lib = |v: u32| std::fs::write(dir.join("lib.sh"), format!("V={v}\n")).unwrap();
    lib(1);
    assert_eq!(s.post("/v1/reload", &json!({})).status, 200, "{}", s.logs());
    let pool = || s.get("/v1/skills/libbed").json()["warm"].clone();
    let r = s.execute("libbed", &json!({})).json();
    assert_eq!((r["warm"].clone(), r["result"].clone()), (json!(false), json!({"v": 1})), "{r}");
    assert!(
        eventually(Duration::from_secs(10), || pool()["idle"] == 2),
        "the pool never filled: {}\n{}",
        pool(),
        s.logs()
    );
    // Past their start (a shell reads `lib.sh` in well under this).
    std::thread::sleep(Duration::from_millis(500));
    lib(2);
    let r = s.post("/v1/reload", &json!({}));
    assert_eq!(r.status, 200, "{}", s.logs());
    assert!(
        eventually(Duration::from_secs(10), || {
            let p = pool();
            p["idle"] == 2 && p["discarded"] == 2
        }),
        "not discarded and made again: {}\n{}",
        pool(),
        s.logs()
    );
    let r = s.execute("libbed", &json!({})).json();
    assert_eq!((r["warm"].clone(), r["result"].clone()), (json!(true), json!({"v": 2})), "{r}");
}
