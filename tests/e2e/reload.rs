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

/// A reload whose client hangs up before the answer still applies: the
/// scan runs to its end and the registry is swapped (a dropped request
/// used to leave the scan running detached, its result thrown away and
/// the one-reload-at-a-time lock let go early).
#[test]
fn a_reload_whose_client_hangs_up_still_applies() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let s = Stack::start();
    // Enough packs that the scan is still going when the client leaves.
    let bulk: u64 = 3000;
    for i in 0..bulk {
        write_skill(&s.skills, &format!("bulk{i:04}"), "", "exec /bin/cat");
    }
    let requested = |logs: &str| logs.matches("reload requested").count();
    let before = requested(&s.logs());
    let mut c = std::os::unix::net::UnixStream::connect(&s.socket).unwrap();
    c.write_all(
        b"POST /v1/reload HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Content-Length: 2\r\n\r\n{}",
    )
    .unwrap();
    // Hang up once skilld has taken the request, before its answer.
    let until = Instant::now() + Duration::from_secs(10);
    while requested(&s.logs()) == before {
        assert!(Instant::now() < until, "the reload was not taken\n{}", s.logs());
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(c);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let n = s.get("/v1/health").json()["skills"].as_u64().unwrap_or(0);
        if n > bulk {
            break;
        }
        assert!(
            Instant::now() < until,
            "the reload its client left was not applied ({n} skills listed)\n{}",
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
