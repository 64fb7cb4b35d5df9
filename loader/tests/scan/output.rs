//! What `scan` prints on stdout.

use serde_json::json;

use crate::support::{Cli, Tree};

#[test]
fn json_output_has_every_field() {
    let t = Tree::new();
    let entry = t.exe("root/disk/bin/du.sh");
    let m = t.manifest(
        "root/disk",
        r#"{"name":"disk_usage","description":"Disk usage of a path","entry":"bin/du.sh",
            "class":"safe","category":"storage","timeout_seconds":5,"env_allow":["LANG"],
            "schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}"#,
    );
    let root = t.base.join("root");
    let run = Cli::scan_json(&[&root]).run();
    assert_eq!(run.code, 0);
    assert_eq!(
        run.json(),
        json!([{
            "name": "disk_usage",
            "description": "Disk usage of a path",
            "class": "safe",
            "category": "storage",
            "schema": {"type":"object","properties":{"path":{"type":"string"}},"required":["path"]},
            "timeout_seconds": 5,
            "env_allow": ["LANG"],
            "entry": entry.to_str().unwrap(),
            "manifest": m.to_str().unwrap(),
            "root": root.to_str().unwrap(),
            "source": "skill.json",
        }])
    );
}

#[test]
fn json_defaults_are_filled_in() {
    let t = Tree::new();
    t.pack("root/p", "minimal");
    let run = Cli::scan_json(&[&t.base.join("root")]).run();
    let s = &run.json()[0];
    assert_eq!(s["class"], "safe");
    assert_eq!(s["category"], "external");
    assert_eq!(s["timeout_seconds"], 30);
    assert_eq!(s["env_allow"], json!([]));
    assert_eq!(s["schema"], json!({"type": "object", "properties": {}}));
}

#[test]
fn human_output_is_one_aligned_line_per_skill() {
    let t = Tree::new();
    let a = t.pack("root/a", "a");
    t.exe("root/b/run");
    t.manifest(
        "root/b",
        r#"{"name":"longer_name","description":"d","entry":"run","class":"dangerous","timeout_seconds":120}"#,
    );
    let run = Cli::new(&["scan"]).arg(t.base.join("root")).run();
    assert_eq!(run.code, 0);
    let a_entry = a.with_file_name("run");
    let b_entry = t.base.join("root/b/run");
    let want = format!(
        "NAME         CLASS      CATEGORY  TIMEOUT  ENTRY\n\
         a            safe       external  30s      {}\n\
         longer_name  dangerous  external  120s     {}\n",
        a_entry.display(),
        b_entry.display()
    );
    assert_eq!(run.stdout, want);
}

#[test]
fn human_output_is_empty_without_skills() {
    let t = Tree::new();
    let run = Cli::new(&["scan"]).arg(t.dir("root")).run();
    assert_eq!(run.code, 0);
    assert_eq!(run.stdout, "");
}
