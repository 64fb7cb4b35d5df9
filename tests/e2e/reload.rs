//! `POST /v1/reload` picks up a new pack and drops a removed one; the
//! executor re-reads manifests itself, so the new pack runs at once.

use serde_json::json;

use crate::harness::{write_skill, Stack};

#[test]
fn reload_picks_up_a_new_pack_and_drops_a_removed_one() {
    let s = Stack::start();
    assert_eq!(s.execute("fail", &json!({})).status, 200);
    assert_eq!(s.execute("fresh", &json!({})).status, 404);

    write_skill(&s.skills, "fresh", "", "echo '{\"fresh\":true}'");
    std::fs::remove_dir_all(s.skills.join("fail")).unwrap();
    // Before the reload the registry is unchanged.
    assert_eq!(s.get("/v1/skills/fresh").status, 404);

    let r = s.post("/v1/reload", &json!({}));
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["registered"], 6, "{}", r.json());

    let names: Vec<String> = s.get("/v1/skills").json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(names.contains(&"fresh".to_owned()), "{names:?}");
    assert!(!names.contains(&"fail".to_owned()), "{names:?}");

    let r = s.execute("fresh", &json!({}));
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["outcome"], "ok", "{}\n{}", r.json(), s.logs());
    assert_eq!(r.json()["result"], json!({"fresh": true}));
    let r = s.execute("fail", &json!({}));
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "not_found");
}
