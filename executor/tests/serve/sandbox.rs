//! What a served run is boxed with: the spawner threads' seccomp filter,
//! cached Landlock rulesets, `favordynmods`, runs spawned off the
//! blocking pool.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use executor::Config;
use serde_json::{json, Value};

use crate::support::*;

/// What a served skill sees of its seccomp filter: the status fields, and
/// whether `socket(AF_UNIX)` and `unshare(CLONE_NEWUSER)` work (errno when
/// not). Served runs get the filter from the engine's spawner threads (a
/// child inherits it; `run::spawner`), so this checks that path from the
/// inside, where the sandbox suite goes through the one-shot `run`.
const FILTER_PROBE: &str = r#"exec /usr/bin/python3 -c '
import ctypes, json, socket
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
    sock = "ok"
except OSError as e:
    sock = e.errno
libc = ctypes.CDLL(None, use_errno=True)
un = "ok" if libc.unshare(0x10000000) == 0 else ctypes.get_errno()
print(json.dumps({"seccomp": st["Seccomp"].strip(), "filters": st["Seccomp_filters"].strip(),
                  "nnp": st["NoNewPrivs"].strip(), "socket": sock, "unshare": un,
                  "capbnd": st["CapBnd"].strip(), "capeff": st["CapEff"].strip()}))
'"#;

#[test]
fn served_runs_carry_the_filter_from_the_spawner_threads() {
    if !can_run() {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        println!("SKIP: served_runs_carry_the_filter_from_the_spawner_threads needs python3");
        return;
    }
    let server = Server::start(|c| {
        c.skills.insert(
            "netprobe".into(),
            policy::SkillGrant { network: true, ..policy::SkillGrant::default() },
        );
        c.skills.insert(
            "capprobe".into(),
            policy::SkillGrant {
                capabilities: vec!["CAP_NET_RAW".into()],
                ..policy::SkillGrant::default()
            },
        );
    });
    // The probe under `name`, its manifest asking for `sandbox`.
    let probe = |name: &str, sandbox: Value| {
        let m = skill(&server.root, name, "safe", 10, FILTER_PROBE);
        let mut manifest: Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
        manifest["sandbox"] = sandbox;
        std::fs::write(&m, manifest.to_string()).unwrap();
        m
    };
    let plain = skill(&server.root, "probe", "safe", 10, FILTER_PROBE);
    let net = probe("netprobe", json!({"network": true}));
    // Granted a capability: created without a spawner thread (whose
    // bounding set is empty), it keeps that one capability and no other.
    let cap = probe("capprobe", json!({"capabilities": ["CAP_NET_RAW"]}));
    let mut c = server.client();
    let eperm = json!(libc::EPERM);
    let none = json!("0000000000000000");
    let net_raw = json!(format!("{:016x}", 1u64 << 13)); // CAP_NET_RAW
    c.execute(200, &cap, json!({}));
    let report = c.run_result().1["result"].clone();
    assert_eq!(report["outcome"], "ok", "{report}");
    let seen = &report["result"];
    assert_eq!((&seen["capbnd"], &seen["capeff"]), (&net_raw, &net_raw), "{report}");
    assert_eq!((&seen["seccomp"], &seen["filters"]), (&json!("2"), &json!("1")), "{report}");
    // Several runs each, so more than one spawner thread serves them.
    for i in 0..4 {
        c.execute(i, &plain, json!({}));
        let report = c.run_result().1["result"].clone();
        assert_eq!(report["outcome"], "ok", "{report}");
        let seen = &report["result"];
        assert_eq!(seen["seccomp"], "2", "{report}");
        assert_eq!(seen["filters"], "1", "one filter, inherited, not two: {report}");
        assert_eq!(seen["nnp"], "1", "{report}");
        assert_eq!(seen["socket"], eperm, "socket(AF_UNIX) without the network grant: {report}");
        assert_eq!(seen["unshare"], eperm, "unshare(CLONE_NEWUSER): {report}");
        assert_eq!((&seen["capbnd"], &seen["capeff"]), (&none, &none), "{report}");

        c.execute(100 + i, &net, json!({}));
        let report = c.run_result().1["result"].clone();
        assert_eq!(report["outcome"], "ok", "{report}");
        let seen = &report["result"];
        assert_eq!((&seen["seccomp"], &seen["filters"]), (&json!("2"), &json!("1")), "{report}");
        assert_eq!(seen["socket"], "ok", "socket with the network grant: {report}");
        assert_eq!(seen["unshare"], eperm, "unshare with the network grant: {report}");
    }
}

/// A run slot keeps the Landlock rulesets built in it, and a later run of
/// the same policy there takes one instead of building it; it still
/// confines (a directory every user may write stays out of reach, the run's
/// own directory in the slot is writable), and a skill granted that
/// directory in the same slots gets its own ruleset, whose grant the first
/// skill never gets. The counts are the metric's.
#[test]
fn cached_rulesets_confine_and_serve_only_their_own_policy() {
    if !can_run() {
        return;
    }
    if executor::run::spawn::Host::detect().landlock_abi == 0 {
        println!("SKIP: cached_rulesets_confine_and_serve_only_their_own_policy needs Landlock");
        return;
    }
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let target = open.path().to_owned();
    let server = Server::start({
        let target = target.clone();
        move |c| {
            c.skills.insert(
                "granted".into(),
                policy::SkillGrant { fs_write: vec![target], ..policy::SkillGrant::default() },
            );
        }
    });
    let script = format!(
        "cat >/dev/null\n\
         if echo x > {t}/f.$$ 2>/dev/null; then d=true; else d=false; fi\n\
         if echo x > ./mine 2>/dev/null; then c=true; else c=false; fi\n\
         printf '{{\"d\":%s,\"c\":%s,\"cwd\":\"%s\"}}\\n' \"$d\" \"$c\" \"$(pwd)\"",
        t = target.display()
    );
    let plain = skill(&server.root, "plain", "safe", 10, &script);
    let granted = skill(&server.root, "granted", "safe", 10, &script);
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&granted).unwrap()).unwrap();
    manifest["sandbox"] = json!({"fs_write": [target]});
    std::fs::write(&granted, manifest.to_string()).unwrap();
    let mut c = server.client();
    let mut id = 0;
    let mut run = |c: &mut Client, manifest: &Path| -> Value {
        id += 1;
        c.execute(id, manifest, json!({}));
        let report = c.run_result().1["result"].clone();
        assert_eq!(report["outcome"], "ok", "{report}");
        // The janitor has given the slot's directory a new run directory
        // (or removed it) before the next run takes a slot.
        let cwd = PathBuf::from(report["result"]["cwd"].as_str().unwrap());
        let home = cwd.parent().unwrap().to_owned();
        wait_for("the slot to be renewed", Duration::from_secs(10), || {
            !cwd.exists() && std::fs::read_dir(&home).map_or(true, |mut d| d.next().is_some())
        });
        report["result"].clone()
    };
    let rulesets = |c: &mut Client| {
        c.send(&json!({"jsonrpc": "2.0", "id": "m", "method": "metrics"}));
        let text = c.recv()["result"]["text"].as_str().unwrap().to_owned();
        let n =
            |how: &str| sample(&text, &format!("ongrid_landlock_rulesets_total{{how=\"{how}\"}}"));
        (n("built"), n("reused"))
    };
    assert_eq!(rulesets(&mut c), (0.0, 0.0));
    for _ in 0..6 {
        for (manifest, may_write) in [(&plain, false), (&granted, true), (&plain, false)] {
            let seen = run(&mut c, manifest);
            assert_eq!(seen["d"], json!(may_write), "{}: {seen}", manifest.display());
            assert_eq!(seen["c"], json!(true), "the run directory: {seen}");
        }
    }
    let (built, reused) = rulesets(&mut c);
    assert_eq!(built + reused, 18.0, "built {built}, reused {reused}");
    assert!(reused > 0.0, "no ruleset reused in 18 runs (built {built})");
    // Every run after the janitor started (the second) found a slot ready,
    // since each waited for its slot to be renewed.
    c.send(&json!({"jsonrpc": "2.0", "id": "m", "method": "metrics"}));
    let text = c.recv()["result"]["text"].as_str().unwrap().to_owned();
    let slots =
        |how: &str| sample(&text, &format!("ongrid_executor_run_slots_total{{how=\"{how}\"}}"));
    let (ready, recycled, made) = (slots("ready"), slots("recycled"), slots("made"));
    assert_eq!(ready + recycled + made, 18.0, "ready {ready}, recycled {recycled}, made {made}");
    assert!((1.0..=2.0).contains(&made) && recycled == 0.0, "{text}");
}

/// `dynmods::ensure` (what `serve` runs at start) turns `favordynmods` on
/// for a cgroup hierarchy that lacks it, keeping its other options, and
/// then finds it on. The option is first taken off every hierarchy here.
#[test]
fn favordynmods_is_turned_on_and_other_options_kept() {
    use executor::host::dynmods::{self, Favor};
    if !can_run() {
        return;
    }
    let mounts =
        || dynmods::cgroup_mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let before = mounts();
    if before.is_empty() {
        println!("SKIP: favordynmods_is_turned_on_and_other_options_kept: no cgroup mounted");
        return;
    }
    for m in before.iter().filter(|m| m.favors_dynmods()) {
        let data: Vec<&str> = m
            .super_opts
            .split(',')
            .filter(|o| !matches!(*o, "rw" | "ro" | dynmods::OPTION))
            .collect();
        nix::mount::mount(
            None::<&str>,
            &m.target,
            Some(m.fstype.as_str()),
            m.remount_flags(),
            Some(data.join(",").as_str()),
        )
        .unwrap();
    }
    let cleared = mounts();
    assert!(cleared.iter().all(|m| !m.favors_dynmods()), "{cleared:?}");
    let Favor::Enabled(at) = dynmods::ensure().unwrap() else { panic!("not enabled") };
    let after = mounts();
    let was = cleared.iter().find(|m| m.target == at).unwrap();
    let now = after.iter().find(|m| m.target == at).unwrap();
    assert!(now.favors_dynmods(), "{now:?}");
    assert_eq!(now.mount_opts, was.mount_opts);
    let options = |m: &dynmods::CgroupMount| {
        let mut v: Vec<String> =
            m.super_opts.split(',').filter(|o| *o != dynmods::OPTION).map(str::to_owned).collect();
        v.sort();
        v
    };
    assert_eq!(options(now), options(was));
    assert_eq!(dynmods::ensure().unwrap(), Favor::Already(at));
    assert!(Config::default().cgroup_favordynmods, "on by default");
}

/// A run longer than the blocking pool's keep-alive (100 ms here, 10 s by
/// default) is not killed by its parent-death signal: runs are spawned from
/// runtime worker threads, never from blocking-pool threads.
#[test]
fn runs_outlive_the_blocking_pool_keep_alive() {
    if !can_run() {
        return;
    }
    let server = Server::start(|_| {});
    // Give the blocking pool threads to retire while the run goes on.
    server.rt.block_on(async {
        for _ in 0..4 {
            let _ = tokio::task::spawn_blocking(|| ()).await;
        }
    });
    let m = skill(&server.root, "long", "safe", 10, "sleep 1.5\necho '{\"slept\":1.5}'");
    let mut c = server.client();
    c.execute(1, &m, json!({}));
    let (_, v) = c.run_result();
    assert_eq!(v["result"]["outcome"], "ok", "{v}");
}
