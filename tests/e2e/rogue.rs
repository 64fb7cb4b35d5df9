//! Defence in depth: a rogue local client that skips ongrid-skilld and
//! speaks JSON-RPC straight to `ongrid-executor serve` cannot run more than `executor.toml`'s `[[peers]]` grant its uid,
//! whatever class it claims.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{bin, temp_dir, write_skill};

/// A JSON-RPC client run as uid/gid 65534: sends each line, prints each
/// final answer (a line with an id) as one JSON line.
const ROGUE: &str = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
f = s.makefile("rwb")
for line in sys.stdin:
    f.write(line.encode()); f.flush()
    while True:
        v = json.loads(f.readline())
        if v.get("id") is not None:
            print(json.dumps(v)); sys.stdout.flush(); break
"#;

#[test]
fn a_rogue_client_cannot_exceed_its_peer_classes() {
    let root = nix::unistd::geteuid().is_root();
    if !root || !Path::new("/usr/bin/python3").exists() || !Path::new("/usr/bin/setpriv").exists() {
        println!("SKIP: needs root, python3 and setpriv to act as another uid");
        return;
    }
    ongrid_tests::host::skill_user();
    let (_tmp, base) = temp_dir("ongrid-e2e-rogue-");
    let skills = base.join("skills");
    fs::create_dir_all(&skills).unwrap();
    let safe = write_skill(&skills, "look", r#","class":"safe""#, "exec /bin/cat");
    let mutating = write_skill(&skills, "change", r#","class":"mutating""#, "exec /bin/cat");
    let dangerous = write_skill(&skills, "wipe", r#","class":"dangerous""#, "exec /bin/cat");
    let socket = base.join("executor.sock");
    let q = |p: &Path| Value::String(p.display().to_string()).to_string();
    fs::write(
        base.join("executor.toml"),
        format!(
            "roots = [{skills}]\nruntime_dir = {run}\nsocket = {sock}\nsocket_mode = \"0666\"\n\
             allowed_uids = [0, 65534]\nallowed_gids = []\nlandlock = \"best-effort\"\n\
             [[peers]]\nuid = 65534\nclasses = [\"safe\"]\n",
            skills = q(&skills),
            run = q(&base.join("run")),
            sock = q(&socket),
        ),
    )
    .unwrap();
    let log = base.join("executor.log");
    let mut executor = Command::new(bin("ongrid-executor"))
        .arg("serve")
        .arg("--config")
        .arg(base.join("executor.toml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(executor.try_wait().unwrap().is_none(), "{}", fs::read_to_string(&log).unwrap());
        assert!(Instant::now() < deadline, "executor not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let manifest = |dir: &Path| dir.join("skill.json").display().to_string();
    let call = |id: u32, m: &str, class: Option<&str>| {
        let mut params = serde_json::json!({"manifest": m, "args": {"id": id}});
        if let Some(c) = class {
            params["class"] = Value::from(c);
        }
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "execute", "params": params})
            .to_string()
    };
    let lines = [
        call(1, &manifest(&dangerous), None),
        call(2, &manifest(&dangerous), Some("safe")),
        call(3, &manifest(&mutating), Some("safe")),
        call(4, &manifest(&mutating), Some("mutating")),
        call(5, &manifest(&safe), None),
    ];
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "/usr/bin/python3", "-c"])
        .arg(ROGUE)
        .arg(&socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(format!("{}\n", lines.join("\n")).as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(executor.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = executor.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    let answers: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        answers.len(),
        5,
        "{text}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        fs::read_to_string(&log).unwrap_or_default()
    );
    for a in &answers[..4] {
        assert_eq!(a["result"]["outcome"], "denied", "{a}");
        let error = a["result"]["error"].as_str().unwrap();
        assert!(error.contains("65534") || error.contains("declares"), "{a}");
    }
    assert!(answers[0]["result"]["error"].as_str().unwrap().contains("may not run dangerous"));
    assert!(answers[2]["result"]["error"].as_str().unwrap().contains("may not run mutating"));
    assert_eq!(answers[4]["result"]["outcome"], "ok", "{}", answers[4]);
    assert_eq!(answers[4]["result"]["result"]["id"], 5);
}
